// The size, FLOPs and activation memory of a decoder-only transformer: the one place these formulas live.
// The GPT model (gpt.cc) allocates exactly what these functions count, and the planner (HeteroAuto) costs
// plans with them, so a plan's predicted memory is the trainer's real memory.
//
// The block is GPT-2's (Radford et al. 2019): pre-LayerNorm, multi-head attention with a qkv projection
// (grouped-query when kv_heads < heads: k and v have kv_heads * head_dim columns each), an output projection,
// and a two-matrix MLP of width `ffn` with GELU. All linear layers have biases. Positions are learned.
// FLOP counts follow Narayanan et al. 2021 (2 m n k per matmul; backward = 2 x forward); the activation
// count follows the method of Korthikanti et al. 2022, section 4.1, applied to the tensors this
// implementation keeps (it has no dropout, so no masks).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace h2 {

struct TransformerShape {
  int64_t layers = 0;
  int64_t hidden = 0;           // C
  int64_t heads = 0;            // NH
  int64_t kv_heads = 0;         // = heads for multi-head attention
  int64_t ffn = 0;              // MLP width, 4 * hidden in GPT-2
  int64_t vocab = 0;            // V
  int64_t seq_len = 0;          // the longest sequence (rows of the position table)
  bool tied_embeddings = true;  // the output head reuses the token embedding

  int64_t head_dim() const { return hidden / heads; }
  int64_t kv_dim() const { return kv_heads * head_dim(); }
};

// What recomputation keeps between forward and backward (Korthikanti et al. 2022):
//   kNone: every activation; kSelective: all but the attention probabilities (the T^2 term), which the
//   backward pass recomputes; kFull: only each layer's input, the layer is recomputed in backward.
enum class Recompute { kNone, kSelective, kFull };
const char* recompute_name(Recompute r);                          // "none", "selective", "full"
std::optional<Recompute> parse_recompute(std::string_view name);  // nullopt for any other name

// --- parameters (elements) ---
int64_t layer_params(const TransformerShape& s);      // one transformer block
int64_t embedding_params(const TransformerShape& s);  // token + position tables
int64_t head_params(const TransformerShape& s);       // final layernorm (+ output matrix when untied)
int64_t total_params(const TransformerShape& s);

// --- FLOPs of one sequence of length T through one piece, forward only (backward is 2x) ---
// Causal attention: the score and value products over the lower triangle count as half of the full T x T.
double layer_forward_flops(const TransformerShape& s, int64_t T);
double head_forward_flops(const TransformerShape& s, int64_t T);  // logits: 2 T C V

// --- activation memory kept for backward, per micro-batch of B sequences of length T ---
// `bytes_per_element`: 4 for this implementation's f32, 2 for bf16 training. LayerNorm statistics are f32.
double layer_activation_bytes(const TransformerShape& s, int64_t B, int64_t T, double bytes_per_element,
                              Recompute recompute);
double head_activation_bytes(const TransformerShape& s, int64_t B, int64_t T, double bytes_per_element);

}  // namespace h2
