// Transformer size, FLOPs and activation formulas (see costs.h for the sources).
#include "model/costs.h"

namespace h2 {

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
  }
  return "?";
}

std::optional<Recompute> parse_recompute(std::string_view name) {
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    if (name == recompute_name(r)) return r;
  }
  return std::nullopt;
}

int64_t layer_params(const TransformerShape& s) {
  const int64_t C = s.hidden, qkv = C + 2 * s.kv_dim();
  const int64_t attention = C * qkv + qkv + C * C + C;    // c_attn and c_proj, weights and biases
  const int64_t mlp = C * s.ffn + s.ffn + s.ffn * C + C;  // c_fc and c_proj
  const int64_t norms = 4 * C;                            // ln_1 and ln_2, weight and bias
  return attention + mlp + norms;
}

int64_t embedding_params(const TransformerShape& s) { return s.vocab * s.hidden + s.seq_len * s.hidden; }

int64_t head_params(const TransformerShape& s) { return 2 * s.hidden + (s.tied_embeddings ? 0 : s.vocab * s.hidden); }

int64_t total_params(const TransformerShape& s) {
  return embedding_params(s) + s.layers * layer_params(s) + head_params(s);
}

double layer_forward_flops(const TransformerShape& s, int64_t T) {
  const double t = static_cast<double>(T), C = static_cast<double>(s.hidden);
  const double projections = 2.0 * t * (C * (C + 2.0 * s.kv_dim()) + C * C + 2.0 * C * s.ffn);
  const double attention = 2.0 * 2.0 * t * t * C / 2.0;  // Q K^T and P V, over the causal half
  return projections + attention;
}

double head_forward_flops(const TransformerShape& s, int64_t T) {
  return 2.0 * static_cast<double>(T) * static_cast<double>(s.hidden) * static_cast<double>(s.vocab);
}

double layer_activation_bytes(const TransformerShape& s, int64_t B, int64_t T, double bytes_per_element,
                              Recompute recompute) {
  const double bt = static_cast<double>(B) * static_cast<double>(T);
  const double C = static_cast<double>(s.hidden);
  if (recompute == Recompute::kFull) return bt * C * bytes_per_element;  // the layer's input only
  // ln_1 out, qkv, attention out, c_proj out, residual, ln_2 out, c_fc out, GELU out, mlp c_proj out, residual.
  const double per_token = C + (C + 2.0 * s.kv_dim()) + C + C + C + C + 2.0 * s.ffn + C + C;
  const double probabilities =
      recompute == Recompute::kSelective ? 0.0 : static_cast<double>(B) * s.heads * static_cast<double>(T) * T;
  const double norm_stats = 4.0 * bt * 4.0;  // mean and rstd of two LayerNorms, f32
  return (bt * per_token + probabilities) * bytes_per_element + norm_stats;
}

double head_activation_bytes(const TransformerShape& s, int64_t B, int64_t T, double bytes_per_element) {
  const double bt = static_cast<double>(B) * static_cast<double>(T);
  // ln_f out and the logits (their gradient is written in place), plus ln_f statistics and per-token losses.
  return bt * (static_cast<double>(s.hidden) + static_cast<double>(s.vocab)) * bytes_per_element + 3.0 * bt * 4.0;
}

}  // namespace h2
