// A GPT-2-style decoder (learned positions, pre-LayerNorm, GELU MLP, tied token embedding and output head)
// over the op interface, on one device.
//
// The model is a sequence of pieces — embedding | block 0 | ... | block L-1 | head (final LayerNorm, logits,
// loss) — and a Gpt object holds any contiguous range of them: the whole model for single-device training,
// or one pipeline stage's range. A range without the embedding takes activations (B,T,C) as input and
// returns the gradient of its input; a range without the head returns activations and takes their gradient.
// A range with the head but not the embedding keeps its own copy of the tied `wte.weight` (Megatron's
// approach: the first and last stage then sum that gradient between them).
//
// Parameters live in one flat f32 buffer (and gradients in another, same layout) with one named view per
// tensor, in Hugging Face GPT-2 order and with its names.
//
// Memory (model/costs.h counts exactly what is allocated here): parameters and gradients; for each of `slots`
// micro-batches in flight the activations the backward pass needs, by the recomputation policy (Korthikanti et
// al. 2022): kNone keeps every block tensor; kSelective keeps all but the attention probabilities (B,NH,T,T),
// which backward recomputes per block into one shared buffer; kFull keeps each block's output only and recomputes
// each block's forward, one at a time, into one shared set of block buffers; plus gradient scratch shared by every
// block and slot. The policy may cover only the first blocks of the range (recompute_blocks, Megatron-LM's block
// method), the rest keeping everything.
//
// Tensor parallelism (Shoeybi et al. 2019, "Megatron-LM", section 3): with TensorParallel{rank, size > 1} a
// Gpt holds its TP rank's shard of every block. c_attn and c_fc are split by output rows (column-parallel; for
// c_attn, each of q, k and v by heads), attn.c_proj and mlp.c_proj by input columns (row-parallel), so the
// attention heads and the MLP's hidden units are divided over the ranks. Each row-parallel output is summed over
// the ranks (`all_reduce`, forward), and so is the gradient of each column-parallel input (backward). The
// row-parallel biases are added once, after the sum. The embedding and the head are vocabulary-parallel: rank r
// holds rows [V r / size, V (r + 1) / size) of `wte` (uneven when size does not divide V); the embedding's lookup
// adds only its own rows (rank 0 adds the positions) and the group sums the outputs; the head's logits are the
// rank's vocabulary columns, the loss combines per-row maxima and sums of exponentials over the group
// (`all_reduce_max`, `all_reduce`) without gathering the logits, and the head's input gradient is summed over the
// group. LayerNorms and the position table are replicated on every TP rank, and so are their gradients.
// Parameter names stay those of the whole model; Param::full_shape and tp_runs() map a shard to its place in the
// whole tensor (checkpoints and initialisation use them).
// Mixed precision (ActivationPolicy::precision = kBf16; Micikevicius et al. 2018, with bf16 as Kalamkar et al. 2019):
// the f32 parameters are the master copy the optimizer updates; the matrix products read a bf16 copy of them,
// refreshed after the optimizer step (refresh_bf16_weights()), else at the first forward after a change. The
// activations inside a block are kept in bf16: the LayerNorms' outputs, qkv, the attention probabilities and
// output, the MLP's hidden activation and the GELU's output (the LayerNorms and the products whose outputs they
// are write f32 into a gradient buffer that is free at that moment, then rounded; attention and GELU have bf16
// kernels that compute in f32). The residual stream (the
// embedding, the projections' outputs, res2, res3: what stages send each other), the LayerNorm statistics, the
// logits, every gradient, the loss and every reduction stay f32; backward rounds each product's output gradient to
// bf16 as the kernel reads it.
// Deliberately not here: dropout, KV caching for generation, sequence parallelism.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/tensor.h"
#include "device/device.h"
#include "model/costs.h"
#include "ops/kernels.h"

namespace h2 {

struct GptConfig {
  int n_layer = 0;
  int n_head = 0;
  int n_embd = 0;
  int vocab_size = 0;
  int seq_len = 0;  // the longest sequence: rows of the position table

  TransformerShape shape() const;
  // Reads n_layer, n_head, n_embd, vocab_size, seq_len; errors name the file and field.
  static GptConfig from_config(const ConfigNode& node);
  // Throws Error(kInvalidArgument) when a size is not positive or heads do not divide n_embd.
  void validate() const;
};

// How a parameter is divided over tensor-parallel ranks.
enum class TpSplit {
  kNone,       // replicated
  kRows,       // by the first dimension, in one equal block per rank (c_fc)
  kQkvRows,    // by the first dimension within each of its three q, k, v thirds (c_attn)
  kCols,       // by the second dimension (the row-parallel c_proj weights)
  kVocabRows,  // by the first dimension, rank r taking rows [n r / size, n (r + 1) / size) (wte: vocabulary-parallel)
};

// The rows [first, first + count) of n that rank `rank` of `size` holds under kVocabRows.
struct RowShard {
  int64_t first = 0, count = 0;
};
RowShard vocab_shard(int64_t n, int rank, int size);

// The tensor-parallel group a Gpt belongs to: `all_reduce` sums a device tensor in place over the group's ranks,
// `all_reduce_max` takes its element-wise maximum; both are needed only when size > 1.
struct TensorParallel {
  int rank = 0;
  int size = 1;
  std::function<void(const Tensor&)> all_reduce;
  std::function<void(const Tensor&)> all_reduce_max;
};

// What the model keeps between forward and backward, and in which precision it computes.
struct ActivationPolicy {
  Recompute recompute = Recompute::kNone;
  int slots = 1;  // micro-batches whose activations it holds at once (a pipeline stage: those in flight)
  Precision precision = Precision::kF32;
  // The first this many of the range's blocks (a half counting as one) recompute as `recompute` says; the rest keep
  // every activation (Megatron-LM's --recompute-method block --recompute-num-layers). -1: every block.
  int recompute_blocks = -1;
  // A backward split into its input and weight gradients (zero-bubble schedules, Qi et al. 2024): above 0,
  // backward() computes only what the stage before needs (the input gradients, the LayerNorms' and biases'
  // gradients) and keeps each matrix product's output gradient for backward_weights(), for up to this many
  // micro-batches at once. 0: backward() is whole. Blocks that recompute in full cannot split (their activations
  // share one buffer, which a later backward_weights() could no longer read).
  int pending_weights = 0;
};

// Calls fn(full_offset, shard_offset, count) for each contiguous run of elements that rank `rank` of `size`
// holds of a tensor of shape `full` split as `split`, in the shard's order.
void tp_runs(TpSplit split, const Shape& full, int rank, int size,
             const std::function<void(int64_t, int64_t, int64_t)>& fn);

// A contiguous range of the model's pieces. A range may begin or end inside a block, between its attention half
// (ln_1, attention, attn.c_proj, the first residual: out = x + attn(ln_1(x))) and its MLP half (ln_2, the MLP,
// mlp.c_proj, the second residual): the residual stream between them is the only tensor that crosses, as between
// blocks. Its first block may then be that block's MLP half alone (starts_at_mlp; not with the embedding) and its
// last block its attention half alone (ends_at_attention; not with the head).
struct GptRange {
  bool embedding = true;
  int first_block = 0;
  int end_block = 0;  // one past the last block
  bool head = true;
  bool starts_at_mlp = false;
  bool ends_at_attention = false;
  static GptRange whole(const GptConfig& config) { return GptRange{true, 0, config.n_layer, true}; }
};

class Gpt {
 public:
  struct Param {
    std::string name;    // Hugging Face GPT-2 name, e.g. "h.0.attn.c_attn.weight"
    Tensor value;        // view into the flat parameter buffer
    Tensor grad;         // view into the flat gradient buffer
    bool weight_decay;   // matrices decay; biases and LayerNorm parameters do not (GPT-2 / nanoGPT)
    bool hf_transposed;  // stored (in, out) in Hugging Face checkpoints, (out, in) here
    TpSplit split;       // how tensor parallelism divides it
    Shape full_shape;    // its shape in the whole model (= value's shape without tensor parallelism)
  };

  // Allocates parameters, gradients and activations for micro-batches of B sequences of length T on `device`,
  // for rank tp.rank of tp.size tensor-parallel ranks (tp.size must divide n_head), keeping what `policy` says.
  Gpt(const GptConfig& config, Device& device, GptRange range, int B, int T, TensorParallel tp = {},
      ActivationPolicy policy = {});

  const GptConfig& config() const { return config_; }
  const GptRange& range() const { return range_; }
  const TensorParallel& tp() const { return tp_; }
  const ActivationPolicy& policy() const { return policy_; }
  RowShard vocab() const { return vocab_; }  // this rank's rows of the vocabulary
  Device& device() const { return *device_; }
  int batch() const { return B_; }
  int seq() const { return T_; }
  std::vector<Param>& params() { return params_; }
  const Tensor& flat_params() const { return flat_params_; }
  const Tensor& flat_grads() const { return flat_grads_; }
  int64_t num_params() const { return flat_params_.numel(); }

  // GPT-2 initialisation: N(0, 0.02) matrices, output projections scaled by 1/sqrt(2 n_layer), zero biases,
  // unit LayerNorm gains. A parameter's values depend only on the seed and its name, so any range (and any
  // tensor-parallel shard) holds the same numbers as the whole model.
  void init(uint64_t seed);
  void zero_grads();
  // Whoever writes flat_params() other than init() (the optimizer step, a checkpoint's load, ZeRO-1's gather)
  // says so: in bf16 the copy of the weights the products read is then refreshed by refresh_bf16_weights(), or
  // else by the next forward.
  void parameters_changed() { low_current_ = false; }
  // In bf16, rounds the master weights into the products' copy if they changed since (a no-op otherwise). The
  // runtimes call it at the end of their optimizer step, where the cost model charges it (planner/cost_model.h).
  void refresh_bf16_weights();
  const Tensor& bf16_weights() const { return flat_low_; }  // that copy (undefined in f32)

  // Runs the range forward. `input` is tokens (B,T) i32 with the embedding, else activations (B,T,C).
  // Without the head, the result is output(). With the head, the logits are logits() and nothing else.
  void forward(const Tensor& input);
  // With the head: the mean cross-entropy of the logits against `targets` (B,T) i32 (-1 = ignored), and the
  // logits' gradient, scaled by grad_scale / (number of counted targets), written over the logits.
  // grad_scale = 1 / micro-batches accumulates a mean over micro-batches. Returns the mean loss.
  float loss(const Tensor& targets, float grad_scale = 1.0f);
  // Back through the range. Without the head, `dout` (B,T,C) is the gradient of output(); with it, the
  // gradient comes from loss(). Parameter gradients accumulate; without the embedding, dinput() is set.
  void backward(const Tensor& dout = Tensor());
  // With policy().pending_weights > 0: the weight gradients of the current slot's micro-batch, whose backward()
  // left them, from what it kept; frees that. The slot's activations must be unchanged since (forward() on a slot
  // whose weight gradients wait is an error). Per parameter, the same sums in the same order as a whole backward
  // when micro-batches compute theirs in the order of their backward().
  void backward_weights();
  bool weights_pending() const;  // of the current slot

  // Makes slot i (of policy().slots) the one forward() fills and backward() reads; switching moves no data.
  void use_slot(int i);
  int activation_slots() const { return policy_.slots; }
  // Blocks whose forward (kFull) or attention core (kSelective) backward has recomputed so far.
  int64_t recomputed_blocks() const { return recomputed_; }
  // Seconds those recomputations took, the device synchronized before and after each (the figure the cost model's
  // recomputation term predicts).
  double recompute_seconds() const { return recompute_s_; }
  // What the constructor allocated on the device, measured by the allocator in costs.h's terms (weights, grads,
  // activations per slot, recompute, grad_scratch, and the head's loss statistics under TP as comm).
  const StageMemory& allocated() const { return allocated_; }

  // Every operator's output of the current slot's forward, in the order it ran, with the operator that computed it
  // (for h2 align: model/align.h). Before loss(), which overwrites the logits with their gradient.
  struct NamedOutput {
    std::string name;  // "encoder", "h.0.ln_1", "h.0.attn.c_attn", "h.0.attn.core", ..., "ln_f", "lm_head"
    Op op;
    Tensor value;
  };
  std::vector<NamedOutput> forward_outputs();
  const Tensor& output() const;  // (B,T,C), without the head
  const Tensor& logits() const;  // (B,T,Vr), this rank's vocabulary columns, with the head, before loss()
  const Tensor& dinput() const;  // (B,T,C), without the embedding, after backward()

 private:
  struct BlockParams {
    Tensor ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w, fcproj_b;
  };
  // A block's activations. Under recomputation some of them alias buffers shared by every block and slot.
  struct BlockActs {
    Tensor ln1, ln1_mean, ln1_rstd, qkv, atty, att, attproj, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu, fcproj, res3;
  };
  // One micro-batch's activations (a slot).
  struct Activations {
    Tensor tokens, input;  // views of the caller's tensors, kept for backward
    Tensor encoded;
    std::vector<BlockActs> blocks;
    Tensor lnf, lnf_mean, lnf_rstd, logits, losses;
  };
  // What a split backward keeps of one micro-batch for its weight gradients (costs.h's weight_pending_bytes): each
  // product's output gradient, in the block activations' precision (the bf16 products read it rounded so), and the
  // embedding's (f32). The head's weight gradient reads the logits' gradient, which the slot holds.
  struct PendingBlock {
    Tensor qkv, proj, fc, fcproj;  // the output gradients of c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj
  };
  struct Pending {
    int slot = -1;  // whose they are; -1: free
    std::vector<PendingBlock> blocks;
    Tensor embedding;
  };
  Activations allocate_activations();
  Pending allocate_pending();
  Pending* pending_of(int slot);
  int64_t param_offset(const Tensor& value) const;  // where a parameter sits in the flat buffers; checked
  Tensor grad_of(const Tensor& value) const;
  Tensor low(const Tensor& value) const;  // what a product reads of a parameter: its bf16 copy, or itself in f32
  bool bf16() const { return policy_.precision == Precision::kBf16; }
  // Writes an activation kept in bf16 with a kernel that writes f32: `make` writes it into `stage` (f32, free at
  // the moment), then it is rounded into `act`; in f32, `make` writes into `act` itself.
  void produce(const Tensor& act, const Tensor& stage, const std::function<void(const Tensor&)>& make);
  // Whether the range holds block i's (its i-th, from first_block) attention half, its MLP half.
  bool has_attention(size_t i) const { return i > 0 || !range_.starts_at_mlp; }
  bool has_mlp(size_t i) const {
    return static_cast<int>(i) + 1 < range_.end_block - range_.first_block || !range_.ends_at_attention;
  }
  // Block i's recomputation: the policy's for the first recompute_blocks, none after.
  Recompute recompute_of(size_t i) const {
    return policy_.recompute_blocks < 0 || static_cast<int64_t>(i) < policy_.recompute_blocks ? policy_.recompute
                                                                                              : Recompute::kNone;
  }
  const Tensor& block_output(size_t i) const;  // of the current slot: res3, or res2 without the MLP half
  void block_forward(int b, const Tensor& x);
  // `keep` (a split backward): where the products' output gradients go, their weight gradients left.
  void block_backward(int b, const Tensor& x, const Tensor& dout, const Tensor& dx, PendingBlock* keep);
  // One product's backward: its input gradient (when dinp is defined) and bias gradient, and its weight gradient
  // now, or, with `keep`, dout kept in it for backward_weights().
  void product_backward(const Tensor& dinp, const Tensor& weight, const Tensor& bias, const Tensor& dout,
                        const Tensor& inp, const Tensor* keep);
  // A kept output gradient as the products read it: f32 (in bf16, widened into `scratch`, of its shape).
  const Tensor& widened(const Tensor& kept, const Tensor& scratch);
  float parallel_loss(const Tensor& targets, const std::vector<int32_t>& host_targets, float dloss);
  Activations& acts() { return slots_[static_cast<size_t>(slot_)]; }

  GptConfig config_;
  GptRange range_;
  TensorParallel tp_;
  ActivationPolicy policy_;
  Device* device_;
  int B_, T_;
  RowShard vocab_;
  std::vector<Param> params_;
  Tensor flat_params_, flat_grads_;
  Tensor flat_low_;  // bf16: the copy of flat_params_ the products read
  bool low_current_ = false;
  Tensor wte_, wpe_, lnf_w_, lnf_b_;
  std::vector<BlockParams> blocks_;
  std::vector<Activations> slots_;
  std::vector<Pending> pending_;  // policy_.pending_weights of them
  int slot_ = 0;
  int64_t recomputed_ = 0;
  double recompute_s_ = 0;
  StageMemory allocated_;
  BlockActs shared_;  // what kSelective (att) and kFull (all but res3) recompute into, shared by blocks and slots
  // Gradient scratch, reused by every block; the vocabulary-parallel loss's per-row statistics.
  Tensor g_a_, g_b_, g_ln_, g_tmp_, g_res2_, g_atty_, g_qkv_, g_fch_, g_fch_gelu_, g_lnf_;
  Tensor ce_max_, ce_sum_, ce_target_;
};

}  // namespace h2
