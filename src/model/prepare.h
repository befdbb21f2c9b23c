// `h2 data prepare`: text files tokenized with GPT-2's tokenizer into llm.c-style token shards (model/dataset.h),
// each document led by <|endoftext|>, the last `val_fraction` of the tokens held out as val_000.bin, and a
// meta.json that records what went in and the unigram entropy of the train tokens — the loss of the best
// model that ignores context, the bar any trained model must beat.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/tokenizer.h"

namespace h2 {

struct PrepareOptions {
  std::string out = "data/tokens";
  double val_fraction = 0.1;           // in [0, 1)
  int64_t shard_tokens = 100'000'000;  // tokens per train shard
};

struct PrepareResult {
  size_t bytes = 0, tokens = 0, train_tokens = 0, val_tokens = 0;
  int train_shards = 0;
  double unigram_entropy_nats = 0;
  double seconds = 0;  // tokenizing
};

// Errors: Error(kInvalidArgument) for no input or a fraction outside [0, 1); Error(kIo) naming an unreadable file.
PrepareResult prepare_dataset(const std::vector<std::string>& inputs, const Gpt2Tokenizer& tokenizer,
                              const PrepareOptions& options);

// Shannon entropy (nats) of the token frequencies.
double unigram_entropy(const std::vector<int32_t>& tokens);

}  // namespace h2
