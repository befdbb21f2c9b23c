// Shard writing and reading, and the deterministic batch loader.
#include "model/dataset.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "core/rng.h"

namespace h2 {

void write_token_shard(const std::string& path, std::span<const int32_t> tokens) {
  std::string bytes(kShardHeaderInts * 4 + tokens.size() * 2, '\0');
  int32_t header[kShardHeaderInts] = {kShardMagic, kShardVersion, static_cast<int32_t>(tokens.size())};
  if (tokens.size() > static_cast<size_t>(INT32_MAX)) {
    throw Error(ErrorCode::kInvalidArgument, cat(path, ": ", tokens.size(), " tokens do not fit one shard"));
  }
  std::memcpy(bytes.data(), header, sizeof(header));
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] > 65535) {
      throw Error(ErrorCode::kInvalidArgument, cat(path, ": token ", tokens[i], " at ", i, " does not fit uint16"));
    }
    const auto t = static_cast<uint16_t>(tokens[i]);
    std::memcpy(bytes.data() + kShardHeaderInts * 4 + i * 2, &t, 2);
  }
  write_file_atomic(path, bytes);
}

TokenShard::TokenShard(const std::string& path) : path_(path), fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
  if (fd_.get() < 0) throw Error(ErrorCode::kIo, cat(path, ": cannot open: ", std::strerror(errno)));
  struct stat st {};
  ::fstat(fd_.get(), &st);
  const auto bytes = static_cast<size_t>(st.st_size);
  if (bytes < kShardHeaderInts * 4) {
    throw Error(ErrorCode::kIo, cat(path, ": ", bytes, " bytes is shorter than the 1024-byte shard header"));
  }
  int32_t header[3];
  if (::pread(fd_.get(), header, sizeof(header), 0) != static_cast<ssize_t>(sizeof(header))) {
    throw Error(ErrorCode::kIo, cat(path, ": cannot read the header"));
  }
  if (header[0] != kShardMagic) {
    throw Error(ErrorCode::kIo, cat(path, ": wrong magic ", header[0], " (expected ", kShardMagic,
                                    "); not a token shard — make one with `h2 data prepare`"));
  }
  if (header[1] != kShardVersion) {
    throw Error(ErrorCode::kIo, cat(path, ": shard version ", header[1], " is not supported (expected ", kShardVersion,
                                    ": uint16 tokens)"));
  }
  if (header[2] < 0) throw Error(ErrorCode::kIo, cat(path, ": negative token count ", header[2]));
  count_ = static_cast<size_t>(header[2]);
  const size_t expected = kShardHeaderInts * 4 + count_ * 2;
  if (bytes != expected) {
    throw Error(ErrorCode::kIo, cat(path, ": the header promises ", count_, " tokens (", expected,
                                    " bytes) but the file has ", bytes, " bytes; it is truncated or corrupt"));
  }
}

void TokenShard::read(uint64_t first, size_t count, uint16_t* out) const {
  const auto want = static_cast<ssize_t>(count * 2);
  if (::pread(fd_.get(), out, count * 2, static_cast<off_t>(kShardHeaderInts * 4 + first * 2)) != want) {
    struct stat st {};
    ::fstat(fd_.get(), &st);
    throw Error(ErrorCode::kIo,
                cat(path_, ": the shard changed while in use: tokens ", first, "..", first + count,
                    " are past its end (it is ", st.st_size, " bytes, ", kShardHeaderInts * 4 + count_ * 2,
                    " when opened). Restore it and resume from the last checkpoint"));
  }
}

TokenLoader::TokenLoader(const std::vector<std::string>& paths, int B, int T, uint64_t seed, bool shuffle, int dp_rank,
                         int dp_size)
    : B_(B), T_(T), seed_(seed), shuffle_(shuffle), dp_rank_(dp_rank), dp_size_(dp_size) {
  if (B <= 0 || T <= 0 || dp_size <= 0 || dp_rank < 0 || dp_rank >= dp_size) {
    throw Error(ErrorCode::kInvalidArgument,
                cat("data loader: batch ", B, ", sequence ", T, ", rank ", dp_rank, " of ", dp_size, " are not valid"));
  }
  if (paths.empty()) throw Error(ErrorCode::kInvalidArgument, "data loader: no shard files given");
  for (const std::string& p : paths) {
    shards_.push_back(std::make_unique<TokenShard>(p));
    const size_t n = shards_.back()->size();
    for (uint64_t off = 0; off + static_cast<uint64_t>(T) + 1 <= n; off += static_cast<uint64_t>(T)) {
      windows_.push_back({static_cast<uint32_t>(shards_.size() - 1), off});
    }
  }
  batches_per_epoch_ = windows_.size() / (static_cast<size_t>(B) * static_cast<size_t>(dp_size));
  if (batches_per_epoch_ == 0) {
    throw Error(ErrorCode::kInvalidArgument,
                cat("data loader: ", paths.front(), paths.size() > 1 ? " and the other shards" : "", " hold ",
                    total_tokens(), " tokens, too few for one batch of ", B, " x ", T + 1, " tokens on each of ",
                    dp_size, " data-parallel ranks; use a smaller batch or sequence, or more data"));
  }
  shuffle_epoch();
}

size_t TokenLoader::total_tokens() const {
  size_t n = 0;
  for (const auto& s : shards_) n += s->size();
  return n;
}

void TokenLoader::shuffle_epoch() {
  order_.resize(windows_.size());
  for (size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<uint32_t>(i);
  if (!shuffle_) return;
  Rng rng(seed_ * 0x9e3779b97f4a7c15ull + position_.epoch);
  for (size_t i = order_.size(); i > 1; --i) std::swap(order_[i - 1], order_[rng.below(i)]);  // Fisher-Yates
}

void TokenLoader::seek(LoaderPosition position) {
  if (position.batch >= batches_per_epoch_) {
    throw Error(ErrorCode::kInvalidArgument, cat("data loader: position ", position.batch, " is past the ",
                                                 batches_per_epoch_, " batches of an epoch; was the data changed?"));
  }
  position_ = position;
  shuffle_epoch();
}

void TokenLoader::next(std::vector<int32_t>& inputs, std::vector<int32_t>& targets) {
  inputs.resize(static_cast<size_t>(B_) * T_);
  targets.resize(static_cast<size_t>(B_) * T_);
  const uint64_t first =
      (position_.batch * static_cast<uint64_t>(dp_size_) + static_cast<uint64_t>(dp_rank_)) * static_cast<uint64_t>(B_);
  std::vector<uint16_t> src(static_cast<size_t>(T_) + 1);
  for (int b = 0; b < B_; ++b) {
    const Window& w = windows_[order_[first + static_cast<uint64_t>(b)]];
    shards_[w.shard]->read(w.offset, src.size(), src.data());
    for (int t = 0; t < T_; ++t) {
      inputs[static_cast<size_t>(b) * T_ + t] = src[t];
      targets[static_cast<size_t>(b) * T_ + t] = src[t + 1];
    }
  }
  if (++position_.batch == batches_per_epoch_) {
    position_ = {position_.epoch + 1, 0};
    shuffle_epoch();
  }
}

std::vector<std::string> expand_glob(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  }
  globfree(&g);
  if (out.empty()) {
    throw Error(ErrorCode::kNotFound,
                cat("no file matches '", pattern, "' (prepare data with `h2 data prepare` or scripts/fetch_data.sh)"));
  }
  return out;
}

}  // namespace h2
