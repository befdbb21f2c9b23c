// Greedy and top-k sampling (see sample.h).
#include "model/sample.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "device/device.h"

namespace h2 {

int32_t pick_token(const std::vector<float>& logits, int top_k, double temperature, Rng& rng) {
  std::vector<int32_t> idx(logits.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int32_t>(i);
  const size_t k = std::clamp<size_t>(static_cast<size_t>(std::max(1, top_k)), 1, idx.size());
  std::partial_sort(idx.begin(), idx.begin() + static_cast<long>(k), idx.end(), [&](int32_t a, int32_t b) {
    return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)];
  });
  if (k == 1 || temperature <= 0) return idx[0];
  std::vector<double> p(k);
  double sum = 0.0;
  for (size_t i = 0; i < k; ++i) {
    p[i] = std::exp((logits[static_cast<size_t>(idx[i])] - logits[static_cast<size_t>(idx[0])]) / temperature);
    sum += p[i];
  }
  double u = rng.uniform() * sum;
  for (size_t i = 0; i < k; ++i) {
    if ((u -= p[i]) <= 0) return idx[i];
  }
  return idx[k - 1];
}

std::vector<int32_t> generate(Gpt& model, std::vector<int32_t> context, const SampleOptions& options,
                              const std::function<void(int32_t)>& on_token) {
  const GptConfig& config = model.config();
  if (context.empty()) throw Error(ErrorCode::kInvalidArgument, "generate: the context is empty");
  if (model.batch() != 1 || !model.range().embedding || !model.range().head) {
    throw Error(ErrorCode::kInvalidArgument, "generate: needs the whole model with a batch of 1");
  }
  const int T = model.seq();
  Tensor tokens = model.device().zeros(DType::kI32, {1, T});
  std::vector<float> row(static_cast<size_t>(config.vocab_size));
  Rng rng(options.seed);
  std::vector<int32_t> out;
  for (int i = 0; i < options.tokens; ++i) {
    const size_t start = context.size() > static_cast<size_t>(T) ? context.size() - static_cast<size_t>(T) : 0;
    std::vector<int32_t> window(static_cast<size_t>(T), 0);
    std::copy(context.begin() + static_cast<long>(start), context.end(), window.begin());
    copy_from_host(tokens, window.data());
    model.forward(tokens);
    const int64_t last = static_cast<int64_t>(context.size() - start) - 1;
    copy_to_host(row.data(), model.logits().reshape({T, config.vocab_size}).slice(last, last + 1));
    const int32_t next = pick_token(row, options.top_k, options.temperature, rng);
    context.push_back(next);
    out.push_back(next);
    if (on_token) on_token(next);
  }
  return out;
}

}  // namespace h2
