// The size, FLOPs and memory of a decoder-only transformer: the one place these formulas live. The GPT model
// (gpt.cc) and a pipeline stage (pipeline/runtime.cc) allocate exactly what stage_memory() counts, and the
// planner (HeteroAuto) and the simulator cost plans with it, so a plan's predicted memory is the runtime's.
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
#include <span>
#include <string_view>
#include <vector>

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

// bf16: bf16 compute with fp32 master weights and Adam moments (mixed precision); f32: everything in f32. H2's
// runtime trains in either (model/gpt.h); ElementBytes says what each holds.
enum class Precision { kBf16, kF32 };
const char* precision_name(Precision p);                          // "bf16", "f32"
std::optional<Precision> parse_precision(std::string_view name);  // nullopt for any other name

// --- parameters (elements) ---
int64_t layer_params(const TransformerShape& s);      // one transformer block
int64_t embedding_params(const TransformerShape& s);  // token + position tables
int64_t head_params(const TransformerShape& s);       // final layernorm (+ output matrix when untied)
int64_t total_params(const TransformerShape& s);

// --- FLOPs of one sequence of length T through one piece, forward only (backward is 2x) ---
// Causal attention: the score and value products over the lower triangle count as half of the full T x T.
double layer_forward_flops(const TransformerShape& s, int64_t T);
double head_forward_flops(const TransformerShape& s, int64_t T);  // logits: 2 T C V

// --- the work of each kernel, as the GPT runs them (gpt.cc), per micro-batch of B sequences of length T on one
// of tp tensor-parallel ranks: what the cost model turns into time on a chip (a roofline per kernel) ---
enum class OpClass {
  kMatmul,            // a GEMM (and its bias): compute-bound when large
  kMatmulBackward,    // a GEMM's backward (two GEMMs): its own rate when a profile measured one
  kAttention,         // the attention core's backward: its own achievable rate
  kAttentionForward,  // its forward (Q K^T, softmax, P V; what selective recomputation repeats): its own rate
  kMemory,            // element-wise and row-wise ops: bound by memory bandwidth
};
struct OpWork {
  const char* name;
  OpClass kind;
  double flops;      // floating-point operations
  double bytes;      // bytes read and written
  double gemms = 1;  // GEMMs it runs (a GEMM's backward: 2), each of flops / gemms
  // A GEMM's shape: rows x k -> n columns (its backward's two GEMMs touch the same three matrices); 0 otherwise.
  double rows = 0, k = 0, n = 0;
};
// `e` bytes per activation element and `w` per weight; the loss and its statistics are f32. The TP all-reduces
// are communication, not listed here. A block's kernels, or one half's (a stage boundary inside a block: model/gpt.h's
// GptRange): the attention half's ln_1, c_attn, attention core, attn.c_proj and residual, the MLP half's the rest.
enum class BlockPart { kWhole, kAttention, kMlp };
std::vector<OpWork> block_ops(const TransformerShape& s, int64_t B, int64_t T, int tp, double e, double w,
                              bool backward, BlockPart part = BlockPart::kWhole);
std::vector<OpWork> embedding_ops(const TransformerShape& s, int64_t B, int64_t T, int tp, double e, double w,
                                  bool backward);
std::vector<OpWork> head_ops(const TransformerShape& s, int64_t B, int64_t T, int tp, double e, double w,
                             bool backward);

// --- memory of one device of a pipeline stage, every buffer the runtime allocates, term by term ---

// Bytes per element of each kind of tensor. f32() is H2's f32 runtime; mixed_bf16() bf16 compute with fp32
// master weights and Adam moments as the published systems count it (Rajbhandari et al. 2020: 2 + 2 + 12 bytes per
// parameter, every activation bf16); h2_bf16() H2's runtime in bf16 (gpt.h, precision): a bf16 copy of the
// weights for the matrix products, f32 gradients, f32 master weights beside Adam's moments (Megatron-LM's 18 bytes
// per parameter with gradients accumulated in fp32), the activations inside a block kept in bf16 and the residual
// stream in f32.
struct ElementBytes {
  double weight = 4;     // parameters used by compute
  double grad = 4;       // parameter gradients
  double optimizer = 8;  // per parameter, before ZeRO-1 sharding: Adam m and v (+ an fp32 master copy)
  double activation = 4;
  double logits = 4;            // the loss computes in fp32 over (B, T, V / TP)
  double master = 0;            // per parameter, not sharded by ZeRO-1: H2's f32 master copy beside a bf16 one
  double block_activation = 4;  // the activations inside a block and ln_f: the LayerNorms' outputs, qkv, the
                                // attention probabilities and output, the MLP's hidden and GELU outputs
  static ElementBytes f32() { return {}; }
  static ElementBytes mixed_bf16() {
    return {.weight = 2, .grad = 2, .optimizer = 12, .activation = 2, .logits = 4, .block_activation = 2};
  }
  static ElementBytes h2_bf16() {
    return {.weight = 2, .grad = 4, .optimizer = 8, .activation = 4, .logits = 4, .master = 4, .block_activation = 2};
  }
  static ElementBytes of(Precision p) { return p == Precision::kBf16 ? h2_bf16() : f32(); }  // what H2's runtime holds
};
// LayerNorm statistics and per-row loss statistics are f32; token ids are i32.
inline constexpr double kStatBytes = 4, kTokenBytes = 4;

struct StageMemorySpec {
  TransformerShape shape;
  bool embedding = false;  // holds the token and position embedding (the pipeline's first stage)
  bool head = false;       // holds the final LayerNorm, the (tied) output head and the loss (the last stage)
  int64_t layers = 0;      // transformer blocks, whole or half
  // The first block its MLP half alone, the last its attention half alone (a stage boundary inside a block:
  // model/gpt.h's GptRange).
  bool starts_at_mlp = false, ends_at_attention = false;
  int64_t rows = 1;          // sequences of a micro-batch on this device (its replica's share)
  int64_t seq = 0;           // their length; 0: the shape's seq_len
  int tp = 1;                // tensor-parallel degree; the embedding and head are vocabulary-parallel
  int tp_rank = -1;          // whose vocabulary rows; -1: the rank with the most (the last)
  int optimizer_shards = 1;  // ZeRO-1: the stage's replicas share the optimizer state; 1 without it
  Recompute recompute = Recompute::kNone;
  // The first this many of its blocks (a half counting as one, in order) recompute as `recompute` says and the rest
  // keep every activation (Megatron-LM's --recompute-method block); -1: all of them.
  int64_t recompute_blocks = -1;
  int in_flight = 1;  // micro-batches whose activations the stage holds at once
  // A split backward (zero-bubble schedules): micro-batches whose weight gradients may wait at once, each keeping
  // weight_pending_bytes(); 0: the backward is whole.
  int pending_weights = 0;
  ElementBytes bytes;
};

// A stage's blocks by what it holds of them: whole blocks, a lone attention half at its end, a lone MLP half at its
// start (a stage boundary inside a block).
struct BlockHalves {
  int64_t whole = 0, attention = 0, mlp = 0;
  int64_t blocks() const { return whole + attention + mlp; }  // a half counting as one
  BlockHalves operator-(const BlockHalves& o) const { return {whole - o.whole, attention - o.attention, mlp - o.mlp}; }
};
// The first `count` of them (-1: all) in the order the stage holds them — its MLP half, its whole blocks, its
// attention half: which recompute when only its first recompute_blocks do.
BlockHalves first_blocks(const BlockHalves& h, int64_t count);

// Every term in bytes; a device holds state() + buffers() + in_flight x per_micro_batch().
struct StageMemory {
  double weights = 0, grads = 0, optimizer = 0;  // parameters of its range (its TP shard)
  double activations = 0;   // per micro-batch in flight: what backward needs of the range, by the recomputation
  double inputs = 0;        // per micro-batch in flight: the received input (stash) or the tokens
  double recompute = 0;     // shared by blocks and micro-batches: what recomputation writes into
  double grad_scratch = 0;  // the model's activation-gradient buffers, shared by every block
  double comm = 0;          // the runtime's: received output gradient, two input-gradient send buffers, targets,
                            // loss statistics under TP, the norm accumulator
  double pending = 0;       // a split backward's: pending_weights x weight_pending_bytes()
  int in_flight = 1;
  double state() const { return weights + grads + optimizer; }
  double per_micro_batch() const { return activations + inputs; }
  double buffers() const { return recompute + grad_scratch + comm + pending; }
  double total() const { return state() + buffers() + in_flight * per_micro_batch(); }
};
StageMemory stage_memory(const StageMemorySpec& spec);
// Per micro-batch between a split backward's B and its W (schedule.h, zb-h1), beyond its activations (which it
// keeps until its W): the output gradients the W reads, one per GEMM of each block — c_attn's (C + 2 kv) / tp,
// attn.c_proj's C, c_fc's F / tp and mlp.c_proj's C per token, a half its own two — in the block activations' precision
// (the products read them rounded so), and the embedding's input gradient (f32). The head's W reads the logits'
// gradient, which its activations hold.
double weight_pending_bytes(const StageMemorySpec& spec);
// A rank's chunks (interleaved 1F1B: a model per virtual stage) as one: their state and buffers summed, the per
// micro-batch terms as the rank holds them (each chunk's times its own micro-batches in flight), in_flight 1.
StageMemory combine_chunks(const std::vector<StageMemory>& chunks);
// Interleaved 1F1B splits a stage's layers into near-equal chunks, the later ones the larger: chunk `chunk`'s share.
int chunk_layers(int stage_layers, int chunks, int chunk);
// What a device of a stage holds when it runs chunk_in_flight.size() chunks (a model per chunk, as the runtime
// allocates them): spec's layers split by chunk_layers, the embedding with the first chunk, the head with the
// last, the stage's first recompute_blocks in its first chunks, chunk k keeping chunk_in_flight[k] micro-batches in
// flight; combine_chunks of their stage_memory. With
// fewer than two chunks, stage_memory(spec).
StageMemory chunked_stage_memory(const StageMemorySpec& spec, std::span<const int> chunk_in_flight);

// The terms in a fixed order with their names (reports, and for sending as numbers).
inline constexpr const char* kStageMemoryTerms[] = {"weights",   "grads",        "optimizer", "activations", "inputs",
                                                    "recompute", "grad_scratch", "comm",      "pending"};
std::vector<double> stage_memory_terms(const StageMemory& m);

// Parameters of a stage's range on one TP rank (the shard of every split tensor, the replicated ones whole).
int64_t stage_params(const StageMemorySpec& spec);

}  // namespace h2
