// The comm benchmark's table: each size's best time over the repeats, DiComm beside Open MPI.
#include "comm/bench.h"

#include "test_util.h"

namespace h2 {
namespace {

using ::testing::HasSubstr;

TEST(CommBench, KeepsTheBestOfTheRepeatsAndMarksWhatIsMissing) {
  const std::string csv =
      "h2,all_reduce,2,1048576,0.002,0.5,0.5\n"
      "openmpi,all_reduce,2,1048576,0.004,0.25,0.25\n"
      "h2,all_reduce,2,1048576,0.001,1.0,1.0\n"  // a faster repeat wins
      "h2,all_gather,4,4096,0.00001,0.4,0.3\n"   // no Open MPI row
      "a torn line\n";
  const auto rows = best_comm_rows(csv);
  ASSERT_EQ(rows.at("h2").size(), 2u);
  EXPECT_DOUBLE_EQ(rows.at("h2").at({"all_reduce", 2, 1048576}).seconds, 0.001);
  const std::string table = comm_bench_table(rows);
  EXPECT_THAT(table, HasSubstr("| all_reduce | 2 | 1 MiB | 1000 | 1 | 1 | 4000 | 0.25 | 4 |"));
  EXPECT_THAT(table, HasSubstr("| all_gather | 4 | 4 KiB | 10 | 0.4 | 0.3 | n/a | n/a | n/a |"));
}

}  // namespace
}  // namespace h2
