// Token datasets in llm.c's `.bin` shard layout: a header of 256 little-endian int32 (magic 20240520,
// version 1, token count, the rest zero) followed by the tokens as uint16.
//
// TokenLoader reads shards and yields (B, T) batches of inputs and next-token targets. The shards are
// cut into windows of T+1 tokens (consecutive windows share one token); each epoch visits every window once,
// in an order shuffled from the seed and the epoch number, so a (seed, position) pair names a batch exactly
// and a resumed run sees the same data. Data-parallel rank r of R takes every R-th batch of the sequence.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/file.h"

namespace h2 {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderInts = 256;

// Writes a shard atomically. Throws Error(kInvalidArgument) for a token that does not fit in uint16.
void write_token_shard(const std::string& path, std::span<const int32_t> tokens);

// A validated shard, read with pread (not mapped: a shard truncated in place while training would kill the
// process with SIGBUS through a mapping; here it is an error naming the shard). Throws Error(kIo) naming the file
// for a wrong magic, a wrong version or a size that does not match the header's token count.
class TokenShard {
 public:
  explicit TokenShard(const std::string& path);
  size_t size() const { return count_; }
  // Tokens [first, first + count) into out; Error(kIo) naming the shard when the file no longer holds them.
  void read(uint64_t first, size_t count, uint16_t* out) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  FileDescriptor fd_;
  size_t count_ = 0;
};

struct LoaderPosition {
  uint64_t epoch = 0;
  uint64_t batch = 0;  // batches of this rank already taken in the epoch
};

class TokenLoader {
 public:
  // `shuffle` false visits windows in file order (for validation).
  TokenLoader(const std::vector<std::string>& paths, int B, int T, uint64_t seed, bool shuffle, int dp_rank = 0,
              int dp_size = 1);

  // Fills inputs and targets (B*T each, row-major) and advances.
  void next(std::vector<int32_t>& inputs, std::vector<int32_t>& targets);
  uint64_t batches_per_epoch() const { return batches_per_epoch_; }
  LoaderPosition position() const { return position_; }
  void seek(LoaderPosition position);
  size_t total_tokens() const;

 private:
  void shuffle_epoch();

  std::vector<std::unique_ptr<TokenShard>> shards_;
  struct Window {
    uint32_t shard;
    uint64_t offset;
  };
  std::vector<Window> windows_;
  std::vector<uint32_t> order_;
  int B_, T_;
  uint64_t seed_;
  bool shuffle_;
  int dp_rank_, dp_size_;
  uint64_t batches_per_epoch_ = 0;
  LoaderPosition position_;
};

// Expands a shell glob ("data/moby/train_*.bin") into sorted paths; a plain path is returned as is.
// Throws Error(kNotFound) when nothing matches.
std::vector<std::string> expand_glob(const std::string& pattern);

}  // namespace h2
