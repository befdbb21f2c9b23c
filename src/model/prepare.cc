// Tokenizing text into shards (see prepare.h).
#include "model/prepare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "core/clock.h"
#include "core/error.h"
#include "core/file.h"
#include "model/dataset.h"

namespace h2 {

namespace fs = std::filesystem;

double unigram_entropy(const std::vector<int32_t>& tokens) {
  std::map<int32_t, int64_t> counts;
  for (int32_t t : tokens) ++counts[t];
  double h = 0.0;
  for (const auto& [t, n] : counts) {
    const double p = static_cast<double>(n) / static_cast<double>(tokens.size());
    h -= p * std::log(p);
  }
  return h;
}

PrepareResult prepare_dataset(const std::vector<std::string>& inputs, const Gpt2Tokenizer& tok,
                              const PrepareOptions& o) {
  if (inputs.empty()) throw Error(ErrorCode::kInvalidArgument, "data prepare: give at least one text file");
  if (!(o.val_fraction >= 0.0 && o.val_fraction < 1.0)) {
    throw Error(ErrorCode::kInvalidArgument, cat("--val-fraction must be in [0, 1), got ", o.val_fraction));
  }
  if (o.shard_tokens <= 0) {
    throw Error(ErrorCode::kInvalidArgument, cat("--shard-tokens must be positive, got ", o.shard_tokens));
  }
  PrepareResult r;
  std::vector<int32_t> tokens;
  const double t0 = monotonic_seconds();
  for (const std::string& path : inputs) {
    const std::string text = read_file(path);
    r.bytes += text.size();
    tokens.push_back(tok.eot_token());  // each document starts with <|endoftext|>, as in llm.c's shards
    const std::vector<int32_t> ids = tok.encode(text);
    tokens.insert(tokens.end(), ids.begin(), ids.end());
  }
  r.seconds = monotonic_seconds() - t0;
  r.tokens = tokens.size();
  r.val_tokens = static_cast<size_t>(static_cast<double>(tokens.size()) * o.val_fraction);
  r.train_tokens = tokens.size() - r.val_tokens;
  make_directory(o.out, "data prepare --out");
  for (size_t begin = 0; begin < r.train_tokens; begin += static_cast<size_t>(o.shard_tokens)) {
    const size_t end = std::min(r.train_tokens, begin + static_cast<size_t>(o.shard_tokens));
    char name[32];
    std::snprintf(name, sizeof(name), "train_%03d.bin", r.train_shards++);
    write_token_shard((fs::path(o.out) / name).string(), std::span(tokens).subspan(begin, end - begin));
  }
  if (r.val_tokens > 0) {
    write_token_shard((fs::path(o.out) / "val_000.bin").string(), std::span(tokens).subspan(r.train_tokens));
  }
  r.unigram_entropy_nats =
      unigram_entropy(std::vector<int32_t>(tokens.begin(), tokens.begin() + static_cast<long>(r.train_tokens)));
  const nlohmann::ordered_json meta = {{"inputs", inputs},
                                       {"bytes", r.bytes},
                                       {"train_tokens", r.train_tokens},
                                       {"val_tokens", r.val_tokens},
                                       {"train_shards", r.train_shards},
                                       {"unigram_entropy_nats", r.unigram_entropy_nats}};
  write_file_atomic((fs::path(o.out) / "meta.json").string(), meta.dump(2) + "\n");
  return r;
}

}  // namespace h2
