// Token shards and the loader: format checks, determinism, coverage, data-parallel sharding.
#include "model/dataset.h"

#include <fstream>
#include <set>

#include "test_data.h"
#include "test_util.h"

namespace h2 {
namespace {

using ::testing::HasSubstr;
using testing_util::error_of;

TEST(Shards, RoundTrip) {
  const std::string dir = testing_util::temp_dir("shards");
  const std::vector<int32_t> tokens = {0, 1, 65535, 42, 7};
  write_token_shard(dir + "/a.bin", tokens);
  const TokenShard shard(dir + "/a.bin");
  ASSERT_EQ(shard.size(), 5u);
  uint16_t third = 0;
  shard.read(2, 1, &third);
  EXPECT_EQ(third, 65535);
  EXPECT_THAT(
      error_of([&] { write_token_shard(dir + "/b.bin", std::vector<int32_t>{70000}); }, ErrorCode::kInvalidArgument),
      HasSubstr("does not fit uint16"));
}

TEST(Shards, BadFilesAreRejected) {
  const std::string dir = testing_util::temp_dir("bad_shards");
  write_token_shard(dir + "/good.bin", std::vector<int32_t>(100, 3));
  std::string bytes;
  {
    std::ifstream in(dir + "/good.bin", std::ios::binary);
    bytes.assign((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  auto write = [&](const std::string& name, const std::string& content) {
    std::ofstream(dir + "/" + name, std::ios::binary) << content;
    return dir + "/" + name;
  };
  std::string magic = bytes;
  magic[0] = 1;
  EXPECT_THAT(error_of([&] { TokenShard s(write("magic.bin", magic)); }, ErrorCode::kIo), HasSubstr("wrong magic"));
  std::string version = bytes;
  version[4] = 7;
  EXPECT_THAT(error_of([&] { TokenShard s(write("version.bin", version)); }, ErrorCode::kIo),
              HasSubstr("shard version 7"));
  EXPECT_THAT(error_of([&] { TokenShard s(write("short.bin", bytes.substr(0, bytes.size() - 2))); }, ErrorCode::kIo),
              HasSubstr("truncated"));
  EXPECT_THAT(error_of([&] { TokenShard s(write("tiny.bin", "abc")); }, ErrorCode::kIo), HasSubstr("shorter than"));
}

TEST(Loader, EveryWindowOncePerEpochAndDeterministic) {
  const std::string dir = testing_util::temp_dir("loader");
  std::vector<int32_t> tokens(1 + 10 * 8);  // exactly ten windows of 8 + 1 tokens
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i);
  write_token_shard(dir + "/t.bin", tokens);
  TokenLoader a({dir + "/t.bin"}, 2, 8, 11, true), b({dir + "/t.bin"}, 2, 8, 11, true);
  EXPECT_EQ(a.batches_per_epoch(), 5u);
  std::vector<int32_t> in, tgt, in_b, tgt_b;
  std::set<int32_t> starts;
  for (int i = 0; i < 5; ++i) {
    a.next(in, tgt);
    b.next(in_b, tgt_b);
    EXPECT_EQ(in, in_b);
    for (int r = 0; r < 2; ++r) {
      starts.insert(in[static_cast<size_t>(r) * 8]);
      for (int t = 0; t < 8; ++t)
        EXPECT_EQ(tgt[static_cast<size_t>(r) * 8 + t], in[static_cast<size_t>(r) * 8 + t] + 1);
    }
  }
  EXPECT_EQ(starts.size(), 10u);  // every window exactly once
  EXPECT_EQ(a.position().epoch, 1u);
  // Seeking reproduces a batch.
  TokenLoader c({dir + "/t.bin"}, 2, 8, 11, true);
  c.seek({0, 3});
  b.seek({0, 3});
  c.next(in, tgt);
  b.next(in_b, tgt_b);
  EXPECT_EQ(in, in_b);
}

TEST(Loader, DataParallelRanksTakeDisjointWindows) {
  const std::string dir = testing_util::temp_dir("loader_dp");
  std::vector<int32_t> tokens(1 + 12 * 4);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i);
  write_token_shard(dir + "/t.bin", tokens);
  std::set<int32_t> seen;
  for (int rank = 0; rank < 3; ++rank) {
    TokenLoader l({dir + "/t.bin"}, 2, 4, 5, true, rank, 3);
    std::vector<int32_t> in, tgt;
    for (uint64_t i = 0; i < l.batches_per_epoch(); ++i) {
      l.next(in, tgt);
      for (int r = 0; r < 2; ++r) EXPECT_TRUE(seen.insert(in[static_cast<size_t>(r) * 4]).second);
    }
  }
  EXPECT_EQ(seen.size(), 12u);
}

TEST(Loader, TooLittleDataIsAClearError) {
  const std::string dir = testing_util::temp_dir("loader_small");
  write_token_shard(dir + "/t.bin", std::vector<int32_t>(20, 1));
  EXPECT_THAT(error_of([&] { TokenLoader l({dir + "/t.bin"}, 4, 16, 1, true); }, ErrorCode::kInvalidArgument),
              HasSubstr("too few for one batch"));
  EXPECT_THAT(error_of([&] { expand_glob(dir + "/nothing_*.bin"); }, ErrorCode::kNotFound),
              HasSubstr("no file matches"));
}

}  // namespace
}  // namespace h2
