// Transformer size, FLOPs and activation formulas (see costs.h for the sources).
#include "model/costs.h"

#include <algorithm>
#include <cmath>

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

const char* precision_name(Precision p) { return p == Precision::kBf16 ? "bf16" : "f32"; }

std::optional<Precision> parse_precision(std::string_view name) {
  for (Precision p : {Precision::kBf16, Precision::kF32}) {
    if (name == precision_name(p)) return p;
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

std::vector<OpWork> block_ops(const TransformerShape& s, int64_t B, int64_t T, int tp, double e, double w,
                              bool backward, BlockPart part) {
  const double N = static_cast<double>(B) * static_cast<double>(T), t = tp, C = static_cast<double>(s.hidden);
  const double Q = C + 2.0 * static_cast<double>(s.kv_dim()), F = static_cast<double>(s.ffn);
  const double att = static_cast<double>(B) * static_cast<double>(s.heads) / t * static_cast<double>(T) * T;
  const double core = 2.0 * static_cast<double>(B) * static_cast<double>(T) * T * C / t;  // Q K^T and P V, causal
  // A GEMM of N rows from k to n columns: 2 N k n FLOPs; it reads its input and weight and writes its output.
  const auto gemm = [&](const char* name, double k, double n, double passes) {
    return OpWork{.name = name,
                  .kind = passes > 1 ? OpClass::kMatmulBackward : OpClass::kMatmul,
                  .flops = passes * 2.0 * N * k * n,
                  .bytes = passes * ((N * k + N * n) * e + k * n * w),
                  .gemms = passes,
                  .rows = N,
                  .k = k,
                  .n = n};
  };
  const double stats = 8 * N;  // a LayerNorm's mean and rstd, f32
  std::vector<OpWork> ops;
  if (!backward) {
    ops = {{"ln_1", OpClass::kMemory, 0, 2 * N * C * e + stats},
           gemm("c_attn", C, Q / t, 1),
           {"attention", OpClass::kAttentionForward, core, (N * Q / t + N * C / t) * e + 2 * att * e},
           gemm("attn.c_proj", C / t, C, 1),
           {"residual", OpClass::kMemory, 0, 3 * N * C * e},
           {"ln_2", OpClass::kMemory, 0, 2 * N * C * e + stats},
           gemm("c_fc", C, F / t, 1),
           {"gelu", OpClass::kMemory, 0, 2 * N * F / t * e},
           gemm("mlp.c_proj", F / t, C, 1),
           {"residual", OpClass::kMemory, 0, 3 * N * C * e}};
  } else {
    // Each GEMM's backward is two (the input's gradient and the weight's), read and written like the forward's.
    ops = {gemm("mlp.c_proj backward", F / t, C, 2),
           {"gelu backward", OpClass::kMemory, 0, 3 * N * F / t * e},
           gemm("c_fc backward", C, F / t, 2),
           {"ln_2 backward", OpClass::kMemory, 0, 3 * N * C * e + stats},
           {"residual", OpClass::kMemory, 0, 3 * N * C * e},
           gemm("attn.c_proj backward", C / t, C, 2),
           {"attention backward", OpClass::kAttention, 2 * core, (2 * N * Q / t + N * C / t) * e + 2 * att * e},
           gemm("c_attn backward", C, Q / t, 2),
           {"ln_1 backward", OpClass::kMemory, 0, 3 * N * C * e + stats},
           {"residual", OpClass::kMemory, 0, 3 * N * C * e}};
  }
  if (part == BlockPart::kWhole) return ops;
  // Five kernels each: forward the attention half's first, backward the MLP half's.
  const bool first = (part == BlockPart::kAttention) != backward;
  return first ? std::vector<OpWork>(ops.begin(), ops.begin() + 5) : std::vector<OpWork>(ops.begin() + 5, ops.end());
}

std::vector<OpWork> embedding_ops(const TransformerShape& s, int64_t B, int64_t T, int, double e, double w,
                                  bool backward) {
  const double N = static_cast<double>(B) * static_cast<double>(T), C = static_cast<double>(s.hidden);
  // A gather of the token and position rows (a scatter-add of their gradients).
  return {{backward ? "embedding backward" : "embedding", OpClass::kMemory, 0, N * C * (2 * w + e)}};
}

std::vector<OpWork> head_ops(const TransformerShape& s, int64_t B, int64_t T, int tp, double e, double w,
                             bool backward) {
  const double N = static_cast<double>(B) * static_cast<double>(T), C = static_cast<double>(s.hidden);
  const double V = static_cast<double>(s.vocab) / tp;  // this rank's vocabulary columns
  const double logits = N * V * 4;                     // f32
  const double passes = backward ? 2 : 1;
  const OpWork gemm{.name = backward ? "logits backward" : "logits",
                    .kind = backward ? OpClass::kMatmulBackward : OpClass::kMatmul,
                    .flops = passes * 2 * N * C * V,
                    .bytes = passes * (N * C * e + C * V * w + logits),
                    .gemms = passes,
                    .rows = N,
                    .k = C,
                    .n = V};
  if (!backward) {
    // The loss reads the logits for their maximum, again for the sum of exponentials and writes their gradient.
    return {{"ln_f", OpClass::kMemory, 0, 2 * N * C * e + 8 * N}, gemm, {"loss", OpClass::kMemory, 0, 3 * logits}};
  }
  return {gemm, {"ln_f backward", OpClass::kMemory, 0, 3 * N * C * e + 8 * N}};
}

double head_forward_flops(const TransformerShape& s, int64_t T) {
  return 2.0 * static_cast<double>(T) * static_cast<double>(s.hidden) * static_cast<double>(s.vocab);
}

namespace {

// The vocabulary rows a TP rank holds (vocabulary-parallel, uneven when TP does not divide V): model/gpt.h's
// vocab_shard, counted here without the model.
int64_t vocab_rows(const StageMemorySpec& m) {
  const int r = m.tp_rank < 0 ? m.tp - 1 : m.tp_rank;
  return m.shape.vocab * (r + 1) / m.tp - m.shape.vocab * r / m.tp;
}

// The blocks of a stage's range by what they hold: whole, the attention half alone, the MLP half alone.
BlockHalves halves(const StageMemorySpec& m) {
  if (m.layers == 1 && m.starts_at_mlp && m.ends_at_attention) return {};  // no half at all: refused by the model
  const int64_t attention = m.ends_at_attention ? 1 : 0, mlp = m.starts_at_mlp ? 1 : 0;
  return {m.layers - attention - mlp, attention, mlp};
}

// Which of the blocks in h recompute: none without recomputation, else the first m.recompute_blocks.
BlockHalves recomputed_halves(const StageMemorySpec& m, const BlockHalves& h) {
  return m.recompute == Recompute::kNone ? BlockHalves{} : first_blocks(h, m.recompute_blocks);
}

}  // namespace

BlockHalves first_blocks(const BlockHalves& h, int64_t count) {
  const int64_t n = h.blocks();
  const int64_t j = count < 0 ? n : std::min(count, n);
  const int64_t mlp = std::min(j, h.mlp);
  return {std::min(j - mlp, h.whole), j == n ? h.attention : 0, mlp};
}

int64_t stage_params(const StageMemorySpec& m) {
  const TransformerShape& s = m.shape;
  const int64_t C = s.hidden, qkv = C + 2 * s.kv_dim(), t = m.tp;
  // A block: LayerNorms and the row-parallel biases whole, the rest divided (gpt.h: column- and row-parallel); its
  // attention half ln_1, c_attn and attn.c_proj, its MLP half ln_2, c_fc and mlp.c_proj.
  const int64_t block = 4 * C + 2 * C + (C * qkv + qkv + C * C + 2 * C * s.ffn + s.ffn) / t;
  const BlockHalves h = halves(m);
  int64_t n = h.whole * block;
  if (h.attention > 0) n += h.attention * (3 * C + (C * qkv + qkv + C * C) / t);
  if (h.mlp > 0) n += h.mlp * (3 * C + (2 * C * s.ffn + s.ffn) / t);
  const int64_t wte = vocab_rows(m) * C;
  if (m.embedding) n += wte + s.seq_len * C;
  if (m.head) n += 2 * C + (!m.embedding || !s.tied_embeddings ? wte : 0);  // its own copy of the tied table
  return n;
}

StageMemory stage_memory(const StageMemorySpec& m) {
  const TransformerShape& s = m.shape;
  const ElementBytes& e = m.bytes;
  const double B = static_cast<double>(m.rows), T = static_cast<double>(m.seq > 0 ? m.seq : s.seq_len), bt = B * T;
  const double C = static_cast<double>(s.hidden), t = m.tp, qkv = C + 2.0 * static_cast<double>(s.kv_dim());
  const double ffn = static_cast<double>(s.ffn), att = B * static_cast<double>(s.heads) / t * T * T;
  const double V = static_cast<double>(vocab_rows(m));
  StageMemory r;
  r.in_flight = m.in_flight;
  // State: parameters, their gradients, and Adam's moments (ZeRO-1: this replica's share, rounded up).
  const double P = static_cast<double>(stage_params(m));
  r.weights = P * e.weight;
  r.grads = P * e.grad;
  r.optimizer = std::ceil(P / m.optimizer_shards) * e.optimizer + P * e.master;
  // A block's activations (gpt.h, BlockActs): the residual stream's attproj, res2, fcproj and res3 (whole on every
  // TP rank); ln1 and ln2 (whole), qkv, the attention output and both MLP activations (divided) and the attention
  // probabilities, in the block's activation precision; the LayerNorm statistics. Selective recomputation drops the
  // probabilities, full keeps the block's output (res3) only.
  const double split = (qkv + C + 2 * ffn) / t, stats = 4 * bt * kStatBytes;
  const double block_all =
      bt * (4 * C * e.activation + (2 * C + split) * e.block_activation) + stats + att * e.block_activation;
  // Under recomputation r: what a whole block, an attention half and an MLP half keep.
  const auto block_kept = [&](Recompute rc) {
    return rc == Recompute::kNone        ? block_all
           : rc == Recompute::kSelective ? block_all - att * e.block_activation
                                         : bt * C * e.activation;
  };
  // A half block keeps its half's tensors (attention: ln1 and its statistics, qkv, the attention output and
  // probabilities, attproj, res2; MLP: ln2 and its statistics, both MLP activations, fcproj, res3), or under full
  // recomputation its output alone.
  const double half_stats = 2 * bt * kStatBytes;
  const auto attention_kept = [&](Recompute rc) {
    return rc == Recompute::kFull ? bt * C * e.activation
                                  : bt * (2 * C * e.activation + (C + (qkv + C) / t) * e.block_activation) +
                                        half_stats + (rc == Recompute::kNone ? att * e.block_activation : 0);
  };
  const auto mlp_kept = [&](Recompute rc) {
    return rc == Recompute::kFull ? bt * C * e.activation
                                  : bt * (2 * C * e.activation + (C + 2 * ffn / t) * e.block_activation) + half_stats;
  };
  // The first recompute_blocks of the stage's blocks, in order (its MLP half, whole blocks, its attention half),
  // recompute; the rest keep everything.
  const BlockHalves h = halves(m);
  const BlockHalves redo = recomputed_halves(m, h);
  const auto rc = [&](bool redone) { return redone ? m.recompute : Recompute::kNone; };
  r.activations = static_cast<double>(redo.whole) * block_kept(m.recompute) +
                  static_cast<double>(h.whole - redo.whole) * block_kept(Recompute::kNone) +
                  static_cast<double>(h.attention) * attention_kept(rc(redo.attention > 0)) +
                  static_cast<double>(h.mlp) * mlp_kept(rc(redo.mlp > 0));
  if (m.embedding) r.activations += bt * C * e.activation;  // the embedding's output
  if (m.head)
    r.activations += bt * C * e.block_activation + 3 * bt * kStatBytes + bt * V * e.logits;  // ln_f, stats, logits
  r.inputs = m.embedding ? bt * kTokenBytes : bt * C * e.activation;
  // Recomputation writes into one block's worth, shared: the probabilities (selective) or all but res3 (full).
  if (redo.whole + redo.attention > 0 && m.recompute == Recompute::kSelective) r.recompute = att * e.block_activation;
  if (redo.whole + redo.attention + redo.mlp > 0 && m.recompute == Recompute::kFull) {
    r.recompute = block_all - bt * C * e.activation;
  }
  // The model's gradient buffers: two for the gradient flowing back, five more for a block's, one for the head.
  r.grad_scratch = 2 * bt * C * e.activation;
  if (m.layers > 0) r.grad_scratch += bt * (3 * C + split) * e.activation;
  if (m.head) r.grad_scratch += bt * C * e.activation;
  // The runtime's buffers around the model.
  r.comm = kStatBytes;                                                            // the norm accumulator
  if (!m.head) r.comm += bt * C * e.activation;                                   // the received gradient of the output
  if (!m.embedding) r.comm += 2 * bt * C * e.activation;                          // input gradients being sent
  if (m.head) r.comm += bt * kTokenBytes + (m.tp > 1 ? 3 * bt * kStatBytes : 0);  // targets, loss statistics
  r.pending = m.pending_weights * weight_pending_bytes(m);
  return r;
}

double weight_pending_bytes(const StageMemorySpec& m) {
  const TransformerShape& s = m.shape;
  const double bt = static_cast<double>(m.rows) * static_cast<double>(m.seq > 0 ? m.seq : s.seq_len);
  const double C = static_cast<double>(s.hidden), t = m.tp;
  const double attention = (C + 2.0 * static_cast<double>(s.kv_dim())) / t + C;
  const double mlp = static_cast<double>(s.ffn) / t + C;
  const BlockHalves h = halves(m);
  const double per_token = static_cast<double>(h.whole) * (attention + mlp) +
                           static_cast<double>(h.attention) * attention + static_cast<double>(h.mlp) * mlp;
  return bt * per_token * m.bytes.block_activation + (m.embedding ? bt * C * m.bytes.activation : 0);
}

StageMemory combine_chunks(const std::vector<StageMemory>& chunks) {
  StageMemory sum;
  for (const StageMemory& m : chunks) {
    sum.weights += m.weights;
    sum.grads += m.grads;
    sum.optimizer += m.optimizer;
    sum.activations += m.in_flight * m.activations;
    sum.inputs += m.in_flight * m.inputs;
    sum.recompute += m.recompute;
    sum.grad_scratch += m.grad_scratch;
    sum.comm += m.comm;
    sum.pending += m.pending;
  }
  return sum;
}

int chunk_layers(int stage_layers, int chunks, int chunk) {
  return stage_layers * (chunk + 1) / chunks - stage_layers * chunk / chunks;
}

StageMemory chunked_stage_memory(const StageMemorySpec& spec, std::span<const int> chunk_in_flight) {
  const int v = static_cast<int>(chunk_in_flight.size());
  if (v <= 1) return stage_memory(spec);
  std::vector<StageMemory> chunks;
  int64_t before = 0;  // the stage's blocks in the chunks before this one
  for (int k = 0; k < v; ++k) {
    StageMemorySpec s = spec;
    s.layers = chunk_layers(static_cast<int>(spec.layers), v, k);
    // The stage's first recompute_blocks are the first chunks'.
    if (spec.recompute_blocks >= 0)
      s.recompute_blocks = std::clamp<int64_t>(spec.recompute_blocks - before, 0, s.layers);
    before += s.layers;
    s.embedding = spec.embedding && k == 0;
    s.head = spec.head && k == v - 1;
    s.starts_at_mlp = spec.starts_at_mlp && k == 0;
    s.ends_at_attention = spec.ends_at_attention && k == v - 1;
    s.in_flight = chunk_in_flight[static_cast<size_t>(k)];
    chunks.push_back(stage_memory(s));
  }
  return combine_chunks(chunks);
}

std::vector<double> stage_memory_terms(const StageMemory& m) {
  return {m.weights, m.grads, m.optimizer, m.activations, m.inputs, m.recompute, m.grad_scratch, m.comm, m.pending};
}

}  // namespace h2
