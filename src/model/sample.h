// Text generation from a GPT on one device (`h2 sample`): the model sees the last T tokens of the context
// (positions past the context hold zeros, which causal attention never lets the context see), and each next
// token is the argmax (top_k = 1) or drawn from the top k at a temperature. No KV cache: every token runs the
// whole window forward, which is fine for a demonstration and a test, not for serving.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/rng.h"
#include "model/gpt.h"

namespace h2 {

struct SampleOptions {
  int tokens = 100;          // tokens to generate
  int top_k = 40;            // sample among the k likeliest; 1 = greedy
  double temperature = 1.0;  // <= 0: greedy
  uint64_t seed = 1;
};

// The next token from one position's logits.
int32_t pick_token(const std::vector<float>& logits, int top_k, double temperature, Rng& rng);

// Continues `context` (token ids; must not be empty) by options.tokens tokens with `model` (a whole-model Gpt of
// batch 1), calling on_token with each as it is chosen. Returns the generated ids.
std::vector<int32_t> generate(Gpt& model, std::vector<int32_t> context, const SampleOptions& options,
                              const std::function<void(int32_t)>& on_token = nullptr);

}  // namespace h2
