// `h2 bench comm`: DiComm's collectives against Open MPI's, in the same run, on local ranks. The ranks are the
// bench_comm_h2 program (started with h2 launch's machinery) and bench_comm_mpi (started with mpirun, when Open
// MPI was found at build time); both time the same loop (bench/comm_loop.h) and append CSV rows
// (impl,op,ranks,bytes,seconds,algbw,busbw). The table keeps each size's best time over the repeats, for both
// sides alike; repeats alternate the two, so a noisy stretch of a shared machine hits both.
#pragma once

#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace h2 {

struct CommBenchOptions {
  std::string bench_dir;  // where bench_comm_h2 and bench_comm_mpi are
  std::vector<int> ranks = {2, 4};
  int repeats = 3;
};

// Runs the benchmark and returns the Markdown table.
std::string bench_comm(const CommBenchOptions& options);

// One CSV row's figures, and the best (fastest) row per (op, ranks, bytes) for each implementation.
struct CommBenchRow {
  double seconds = 0, algbw = 0, busbw = 0;
};
using CommBenchKey = std::tuple<std::string, int, size_t>;  // op, ranks, bytes
std::map<std::string, std::map<CommBenchKey, CommBenchRow>> best_comm_rows(const std::string& csv_text);
// The Markdown table of DiComm's rows beside Open MPI's ("n/a" where it has none).
std::string comm_bench_table(const std::map<std::string, std::map<CommBenchKey, CommBenchRow>>& rows);

}  // namespace h2
