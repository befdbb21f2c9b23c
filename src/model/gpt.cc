// The GPT model: parameter layout, GPT-2 initialisation, and the forward and backward passes of a range.
#include "model/gpt.h"

#include <cmath>
#include <tuple>

#include "core/clock.h"
#include "core/error.h"
#include "core/format.h"
#include "core/hash.h"
#include "core/rng.h"
#include "ops/ops.h"

namespace h2 {
namespace {

struct ParamSpec {
  std::string name;
  Shape shape;  // in the whole model
  bool decay;
  bool transposed;
  TpSplit split = TpSplit::kNone;
};

// A parameter's shard shape on rank `rank` of `size` tensor-parallel ranks.
Shape shard_shape(const ParamSpec& s, int rank, int size) {
  if (s.split == TpSplit::kNone || size == 1) return s.shape;
  if (s.split == TpSplit::kVocabRows) return s.shape.with_dim(0, vocab_shard(s.shape[0], rank, size).count);
  const int dim = s.split == TpSplit::kCols ? 1 : 0;
  return s.shape.with_dim(dim, s.shape[dim] / size);
}

}  // namespace

RowShard vocab_shard(int64_t n, int rank, int size) {
  const int64_t first = n * rank / size;
  return {first, n * (rank + 1) / size - first};
}

void tp_runs(TpSplit split, const Shape& full, int rank, int size,
             const std::function<void(int64_t, int64_t, int64_t)>& fn) {
  if (split == TpSplit::kNone || size == 1) {
    fn(0, 0, full.numel());
    return;
  }
  const int64_t rows = full[0], inner = full.numel() / rows;
  if (split == TpSplit::kVocabRows) {
    const RowShard mine = vocab_shard(rows, rank, size);
    if (mine.count > 0) fn(mine.first * inner, 0, mine.count * inner);
    return;
  }
  if (split == TpSplit::kCols) {  // each row's block of columns
    const int64_t cols = inner / size;
    for (int64_t r = 0; r < rows; ++r) fn(r * inner + rank * cols, r * cols, cols);
    return;
  }
  const int64_t groups = split == TpSplit::kQkvRows ? 3 : 1, group_rows = rows / groups, mine = group_rows / size;
  for (int64_t g = 0; g < groups; ++g) {
    fn((g * group_rows + rank * mine) * inner, g * mine * inner, mine * inner);
  }
}

TransformerShape GptConfig::shape() const {
  return TransformerShape{.layers = n_layer,
                          .hidden = n_embd,
                          .heads = n_head,
                          .kv_heads = n_head,
                          .ffn = 4 * int64_t{n_embd},
                          .vocab = vocab_size,
                          .seq_len = seq_len,
                          .tied_embeddings = true};
}

void GptConfig::validate() const {
  for (auto [value, name] : {std::pair{n_layer, "n_layer"},
                             {n_head, "n_head"},
                             {n_embd, "n_embd"},
                             {vocab_size, "vocab_size"},
                             {seq_len, "seq_len"}}) {
    if (value <= 0) throw Error(ErrorCode::kInvalidArgument, cat("model: ", name, " must be positive, got ", value));
  }
  if (n_embd % n_head != 0) {
    throw Error(ErrorCode::kInvalidArgument,
                cat("model: n_head = ", n_head, " does not divide n_embd = ", n_embd, "; pick heads that divide it"));
  }
}

GptConfig GptConfig::from_config(const ConfigNode& node) {
  node.allow_only({"n_layer", "n_head", "n_embd", "vocab_size", "seq_len"});
  GptConfig c;
  auto positive = [&](const char* key) {
    const int64_t v = node.get<int64_t>(key);
    if (v <= 0 || v > (int64_t{1} << 30)) node.at(key).fail(cat("must be a positive integer, got ", v));
    return static_cast<int>(v);
  };
  c.n_layer = positive("n_layer");
  c.n_head = positive("n_head");
  c.n_embd = positive("n_embd");
  c.vocab_size = positive("vocab_size");
  c.seq_len = positive("seq_len");
  if (c.n_embd % c.n_head != 0) {
    node.at("n_head").fail(cat("n_head = ", c.n_head, " does not divide n_embd = ", c.n_embd));
  }
  return c;
}

Gpt::Gpt(const GptConfig& config, Device& device, GptRange range, int B, int T, TensorParallel tp,
         ActivationPolicy policy)
    : config_(config), range_(range), tp_(std::move(tp)), policy_(policy), device_(&device), B_(B), T_(T) {
  config_.validate();
  if (tp_.size < 1 || tp_.rank < 0 || tp_.rank >= tp_.size || config.n_head % tp_.size != 0) {
    throw Error(ErrorCode::kInvalidArgument, cat("model: tensor-parallel rank ", tp_.rank, " of ", tp_.size,
                                                 " does not divide n_head = ", config.n_head,
                                                 "; pick a TP degree that divides the number of heads"));
  }
  if (tp_.size > 1 && (!tp_.all_reduce || !tp_.all_reduce_max)) {
    throw Error(ErrorCode::kInvalidArgument, "model: tensor parallelism needs the group's all-reduces (sum and max)");
  }
  if (range.first_block < 0 || range.end_block > config.n_layer || range.first_block > range.end_block) {
    throw Error(ErrorCode::kInvalidArgument, cat("model range: blocks [", range.first_block, ", ", range.end_block,
                                                 ") are outside the model's ", config.n_layer, " blocks"));
  }
  const int n_blocks = range.end_block - range.first_block;
  if ((range.starts_at_mlp || range.ends_at_attention) &&
      (n_blocks - range.starts_at_mlp - range.ends_at_attention < 0 || n_blocks == 0 ||
       (range.starts_at_mlp && range.embedding) || (range.ends_at_attention && range.head))) {
    throw Error(ErrorCode::kInvalidArgument,
                cat("model range: blocks [", range.first_block, ", ", range.end_block, ")",
                    range.starts_at_mlp ? " from the first block's MLP half" : "",
                    range.ends_at_attention ? " to the last block's attention half" : "",
                    range.embedding ? " with the embedding" : "", range.head ? " with the head" : "",
                    " hold no half of a block or split one the embedding or head must follow whole"));
  }
  if (B <= 0 || T <= 0 || T > config.seq_len) {
    throw Error(ErrorCode::kInvalidArgument,
                cat("model: batch ", B, " x sequence ", T,
                    " must be positive with the sequence at most seq_len = ", config.seq_len));
  }
  if (policy_.slots < 1) throw Error(ErrorCode::kInvalidArgument, cat("model: ", policy_.slots, " activation slots"));
  if (policy_.recompute_blocks < -1) {
    throw Error(ErrorCode::kInvalidArgument,
                cat("model: recomputation of the first ", policy_.recompute_blocks, " blocks (-1: all, or 0 or more)"));
  }
  if (policy_.pending_weights < 0) {
    throw Error(ErrorCode::kInvalidArgument,
                cat("model: ", policy_.pending_weights, " micro-batches with pending weight gradients (0 or more)"));
  }
  if (policy_.pending_weights > 0 && policy_.recompute == Recompute::kFull && policy_.recompute_blocks != 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "model: a backward split into input and weight gradients (pending_weights > 0) needs every block's "
                "activations until its weight gradients, but full recomputation rewrites them into one buffer; "
                "recompute selectively, or none");
  }
  // What the model will allocate (costs.h counts it exactly), checked before any of it is: a model far past the
  // device's memory is an error naming the sizes, not an allocation that exhausts the host on the way.
  const StageMemorySpec spec{.shape = config.shape(),
                             .embedding = range.embedding,
                             .head = range.head,
                             .layers = n_blocks,
                             .starts_at_mlp = range.starts_at_mlp,
                             .ends_at_attention = range.ends_at_attention,
                             .rows = B,
                             .seq = T,
                             .tp = tp_.size,
                             .tp_rank = tp_.rank,
                             .recompute = policy_.recompute,
                             .recompute_blocks = policy_.recompute_blocks,
                             .in_flight = policy_.slots,
                             .pending_weights = policy_.pending_weights,
                             .bytes = ElementBytes::of(policy_.precision)};
  const StageMemory need = stage_memory(spec);
  const double master = static_cast<double>(stage_params(spec)) * spec.bytes.master;  // the optimizer's, held here
  const double bytes = need.weights + master + need.grads + policy_.slots * need.activations + need.recompute +
                       need.grad_scratch + need.pending;
  const double free =
      static_cast<double>(device.props().mem_capacity_bytes) - static_cast<double>(device.mem_used_bytes());
  if (device.props().mem_capacity_bytes > 0 && bytes > free) {
    throw Error(ErrorCode::kOutOfMemory,
                cat("model: ", n_blocks, " blocks of n_embd ", config.n_embd, " (", format_bytes(need.weights),
                    " of weights, as much again of gradients, ", format_bytes(policy_.slots * need.activations),
                    " of activations for batch ", B, " x ", T, ") need ", format_bytes(bytes), " on device ",
                    device.name(), ", which has ", format_bytes(free),
                    " free. Hint: fewer layers (model.n_layer), a narrower model, a smaller batch, or recomputation"));
  }
  const int64_t C = config.n_embd, V = config.vocab_size;
  vocab_ = vocab_shard(V, tp_.rank, tp_.size);

  // Parameters, in Hugging Face GPT-2 order.
  std::vector<ParamSpec> specs;
  if (range.embedding || range.head) specs.push_back({"wte.weight", {V, C}, true, false, TpSplit::kVocabRows});
  if (range.embedding) specs.push_back({"wpe.weight", {config.seq_len, C}, true, false});
  for (int b = range.first_block; b < range.end_block; ++b) {
    const std::string p = cat("h.", b, ".");
    if (has_attention(static_cast<size_t>(b - range.first_block))) {
      specs.push_back({p + "ln_1.weight", {C}, false, false});
      specs.push_back({p + "ln_1.bias", {C}, false, false});
      specs.push_back({p + "attn.c_attn.weight", {3 * C, C}, true, true, TpSplit::kQkvRows});
      specs.push_back({p + "attn.c_attn.bias", {3 * C}, false, false, TpSplit::kQkvRows});
      specs.push_back({p + "attn.c_proj.weight", {C, C}, true, true, TpSplit::kCols});
      specs.push_back({p + "attn.c_proj.bias", {C}, false, false});
    }
    if (!has_mlp(static_cast<size_t>(b - range.first_block))) continue;
    specs.push_back({p + "ln_2.weight", {C}, false, false});
    specs.push_back({p + "ln_2.bias", {C}, false, false});
    specs.push_back({p + "mlp.c_fc.weight", {4 * C, C}, true, true, TpSplit::kRows});
    specs.push_back({p + "mlp.c_fc.bias", {4 * C}, false, false, TpSplit::kRows});
    specs.push_back({p + "mlp.c_proj.weight", {C, 4 * C}, true, true, TpSplit::kCols});
    specs.push_back({p + "mlp.c_proj.bias", {C}, false, false});
  }
  if (range.head) {
    specs.push_back({"ln_f.weight", {C}, false, false});
    specs.push_back({"ln_f.bias", {C}, false, false});
  }
  int64_t total = 0;
  for (const ParamSpec& s : specs) total += shard_shape(s, tp_.rank, tp_.size).numel();
  // Each group of allocations is measured by the allocator, for allocated().
  size_t used = device.mem_used_bytes();
  const auto measured = [&] {
    const size_t now = device.mem_used_bytes();
    const double delta = static_cast<double>(now - used);
    used = now;
    return delta;
  };
  flat_params_ = device.empty(DType::kF32, {total});
  if (bf16()) {  // the f32 parameters are the optimizer's master copy; the weights the products read are bf16
    allocated_.optimizer = measured();
    flat_low_ = device.empty(DType::kBF16, {total});
  }
  allocated_.weights = measured();
  flat_grads_ = device.zeros(DType::kF32, {total});
  allocated_.grads = measured();
  int64_t offset = 0;
  for (const ParamSpec& s : specs) {
    const Shape shape = shard_shape(s, tp_.rank, tp_.size);
    const int64_t n = shape.numel();
    params_.push_back({s.name, flat_params_.slice(offset, offset + n).reshape(shape),
                       flat_grads_.slice(offset, offset + n).reshape(shape), s.decay, s.transposed, s.split, s.shape});
    offset += n;
  }
  auto find = [&](const std::string& name, bool here = true) {
    if (!here) return Tensor();
    for (const Param& p : params_) {
      if (p.name == name) return p.value;
    }
    H2_CHECK(false) << "no parameter " << name;
    return Tensor();
  };
  if (range.embedding || range.head) wte_ = find("wte.weight");
  if (range.embedding) wpe_ = find("wpe.weight");
  if (range.head) {
    lnf_w_ = find("ln_f.weight");
    lnf_b_ = find("ln_f.bias");
  }
  for (int b = range.first_block; b < range.end_block; ++b) {
    const std::string p = cat("h.", b, ".");
    const bool a = has_attention(static_cast<size_t>(b - range.first_block)),
               m = has_mlp(static_cast<size_t>(b - range.first_block));
    blocks_.push_back({find(p + "ln_1.weight", a), find(p + "ln_1.bias", a), find(p + "attn.c_attn.weight", a),
                       find(p + "attn.c_attn.bias", a), find(p + "attn.c_proj.weight", a),
                       find(p + "attn.c_proj.bias", a), find(p + "ln_2.weight", m), find(p + "ln_2.bias", m),
                       find(p + "mlp.c_fc.weight", m), find(p + "mlp.c_fc.bias", m), find(p + "mlp.c_proj.weight", m),
                       find(p + "mlp.c_proj.bias", m)});
  }

  // What recomputation writes into, shared by every block and slot (model/costs.h counts the same tensors).
  auto f32 = [&](Shape s) { return device.empty(DType::kF32, s); };
  auto lowp = [&](Shape s) { return device.empty(bf16() ? DType::kBF16 : DType::kF32, s); };  // kept in bf16
  const int64_t NH = config_.n_head / tp_.size, Cs = C / tp_.size, bt = int64_t{B} * T;
  const bool redo_first = !blocks_.empty() && recompute_of(0) != Recompute::kNone;
  if (redo_first && (has_attention(0) || (blocks_.size() > 1 && recompute_of(1) != Recompute::kNone)) &&
      policy_.recompute == Recompute::kSelective) {
    shared_.att = lowp({B, NH, T, T});
  }
  if (redo_first && policy_.recompute == Recompute::kFull) {
    shared_ = BlockActs{lowp({B, T, C}),      f32({bt}),           f32({bt}),      lowp({B, T, 3 * Cs}),
                        lowp({B, T, Cs}),     lowp({B, NH, T, T}), f32({B, T, C}), f32({B, T, C}),
                        lowp({B, T, C}),      f32({bt}),           f32({bt}),      lowp({B, T, 4 * Cs}),
                        lowp({B, T, 4 * Cs}), f32({B, T, C}),      Tensor()};
  }
  allocated_.recompute = measured();
  for (int i = 0; i < policy_.slots; ++i) slots_.push_back(allocate_activations());
  allocated_.in_flight = policy_.slots;
  allocated_.activations = measured() / policy_.slots;
  // Gradient scratch.
  if (range.head) g_lnf_ = f32({B, T, C});
  g_a_ = f32({B, T, C});
  g_b_ = f32({B, T, C});
  if (!blocks_.empty()) {
    g_ln_ = f32({B, T, C});
    g_tmp_ = f32({B, T, C});
    g_res2_ = f32({B, T, C});
    g_atty_ = f32({B, T, Cs});
    g_qkv_ = f32({B, T, 3 * Cs});
    g_fch_ = f32({B, T, 4 * Cs});
    g_fch_gelu_ = f32({B, T, 4 * Cs});
  }
  allocated_.grad_scratch = measured();
  if (range.head && tp_.size > 1) {
    ce_max_ = f32({bt});
    ce_sum_ = f32({bt});
    ce_target_ = f32({bt});
  }
  allocated_.comm = measured();
  for (int i = 0; i < policy_.pending_weights; ++i) pending_.push_back(allocate_pending());
  allocated_.pending = measured();
}

Gpt::Pending Gpt::allocate_pending() {
  const int64_t C = config_.n_embd, Cs = C / tp_.size;
  auto lowp = [&](Shape s) { return device_->empty(bf16() ? DType::kBF16 : DType::kF32, s); };
  Pending p;
  for (size_t b = 0; b < blocks_.size(); ++b) {
    PendingBlock k;
    if (has_attention(b)) {
      k.qkv = lowp({B_, T_, 3 * Cs});
      k.proj = lowp({B_, T_, C});
    }
    if (has_mlp(b)) {
      k.fc = lowp({B_, T_, 4 * Cs});
      k.fcproj = lowp({B_, T_, C});
    }
    p.blocks.push_back(k);
  }
  if (range_.embedding) p.embedding = device_->empty(DType::kF32, {B_, T_, C});
  return p;
}

Gpt::Pending* Gpt::pending_of(int slot) {
  for (Pending& p : pending_) {
    if (p.slot == slot) return &p;
  }
  return nullptr;
}

bool Gpt::weights_pending() const {
  return std::any_of(pending_.begin(), pending_.end(), [&](const Pending& p) { return p.slot == slot_; });
}

Gpt::Activations Gpt::allocate_activations() {
  const int64_t B = B_, T = T_, C = config_.n_embd;
  const int64_t NH = config_.n_head / tp_.size, Cs = C / tp_.size, bt = B * T;
  auto f32 = [&](Shape s) { return device_->empty(DType::kF32, s); };
  auto lowp = [&](Shape s) { return device_->empty(bf16() ? DType::kBF16 : DType::kF32, s); };  // kept in bf16
  Activations a;
  if (range_.embedding) a.encoded = f32({B, T, C});
  for (size_t b = 0; b < blocks_.size(); ++b) {
    if (recompute_of(b) == Recompute::kFull) {  // the block's output; the rest is recomputed into shared_
      BlockActs acts = shared_;
      (has_mlp(b) ? acts.res3 : acts.res2) = f32({B, T, C});
      a.blocks.push_back(acts);
      continue;
    }
    BlockActs acts;
    if (has_attention(b)) {
      acts.ln1 = lowp({B, T, C});
      acts.ln1_mean = f32({bt});
      acts.ln1_rstd = f32({bt});
      acts.qkv = lowp({B, T, 3 * Cs});
      acts.atty = lowp({B, T, Cs});
      acts.att = recompute_of(b) == Recompute::kSelective ? shared_.att : lowp({B, NH, T, T});
      acts.attproj = f32({B, T, C});
      acts.res2 = f32({B, T, C});
    }
    if (has_mlp(b)) {
      acts.ln2 = lowp({B, T, C});
      acts.ln2_mean = f32({bt});
      acts.ln2_rstd = f32({bt});
      acts.fch = lowp({B, T, 4 * Cs});
      acts.fch_gelu = lowp({B, T, 4 * Cs});
      acts.fcproj = f32({B, T, C});
      acts.res3 = f32({B, T, C});
    }
    a.blocks.push_back(acts);
  }
  if (range_.head) {
    a.lnf = lowp({B, T, C});
    a.lnf_mean = f32({bt});
    a.lnf_rstd = f32({bt});
    a.logits = f32({B, T, vocab_.count});
    a.losses = f32({bt});
  }
  return a;
}

void Gpt::use_slot(int i) {
  H2_CHECK(i >= 0 && i < policy_.slots) << "activation slot " << i << " of " << policy_.slots;
  slot_ = i;
}

void Gpt::init(uint64_t seed) {
  const double std = 0.02, proj_std = 0.02 / std::sqrt(2.0 * config_.n_layer);
  for (const Param& p : params_) {
    std::vector<float> host(static_cast<size_t>(p.full_shape.numel())), shard(static_cast<size_t>(p.value.numel()));
    const bool is_bias = p.name.ends_with(".bias");
    const bool is_norm_gain = p.name.find("ln_") != std::string::npos && p.name.ends_with(".weight");
    if (is_norm_gain) {
      std::fill(host.begin(), host.end(), 1.0f);
    } else if (!is_bias) {
      const double s = p.name.ends_with("c_proj.weight") ? proj_std : std;
      Rng rng(seed ^ fnv1a(p.name));  // its values depend on its name alone
      for (float& x : host) x = static_cast<float>(rng.normal() * s);
    }
    tp_runs(p.split, p.full_shape, tp_.rank, tp_.size,
            [&](int64_t full, int64_t mine, int64_t n) { std::copy_n(host.begin() + full, n, shard.begin() + mine); });
    copy_from_host(p.value, shard.data());
  }
  parameters_changed();
}

void Gpt::zero_grads() { device_->fill_zero(flat_grads_.data(), flat_grads_.bytes()); }

const Tensor& Gpt::output() const {
  H2_CHECK(!range_.head) << "a range with the head has logits, not an output activation";
  const Activations& a = slots_[static_cast<size_t>(slot_)];
  return a.blocks.empty() ? (range_.embedding ? a.encoded : a.input) : block_output(a.blocks.size() - 1);
}

const Tensor& Gpt::block_output(size_t i) const {
  const BlockActs& a = slots_[static_cast<size_t>(slot_)].blocks[i];
  return has_mlp(i) ? a.res3 : a.res2;
}

const Tensor& Gpt::logits() const {
  H2_CHECK(range_.head);
  return slots_[static_cast<size_t>(slot_)].logits;
}

const Tensor& Gpt::dinput() const {
  H2_CHECK(!range_.embedding) << "a range with the embedding has no input activation";
  return g_a_;
}

void Gpt::block_forward(int b, const Tensor& x) {
  const BlockParams& w = blocks_[static_cast<size_t>(b)];
  const BlockActs& a = acts().blocks[static_cast<size_t>(b)];
  // Row-parallel: each rank's partial product, summed over the ranks; one of them adds the bias.
  const bool bias_here = tp_.rank == 0;
  // In bf16 what LayerNorms and products write is made in the gradient buffers of its shape, unused until backward
  // (and free at the start of a block's backward, where kFull recomputes this).
  if (has_attention(static_cast<size_t>(b))) {
    produce(a.ln1, g_tmp_,
            [&](const Tensor& o) { ops::layernorm_forward(o, a.ln1_mean, a.ln1_rstd, x, w.ln1_w, w.ln1_b); });
    produce(a.qkv, g_qkv_, [&](const Tensor& o) { ops::matmul_forward(o, a.ln1, low(w.qkv_w), w.qkv_b); });
    ops::attention_forward(a.atty, a.att, a.qkv, config_.n_head / tp_.size);
    ops::matmul_forward(a.attproj, a.atty, low(w.proj_w), bias_here ? w.proj_b : Tensor());
    if (tp_.size > 1) tp_.all_reduce(a.attproj);
    ops::residual_forward(a.res2, x, a.attproj);
  }
  if (!has_mlp(static_cast<size_t>(b))) return;
  const Tensor& mid = has_attention(static_cast<size_t>(b)) ? a.res2 : x;  // the MLP half's input
  produce(a.ln2, g_tmp_,
          [&](const Tensor& o) { ops::layernorm_forward(o, a.ln2_mean, a.ln2_rstd, mid, w.ln2_w, w.ln2_b); });
  produce(a.fch, g_fch_, [&](const Tensor& o) { ops::matmul_forward(o, a.ln2, low(w.fc_w), w.fc_b); });
  ops::gelu_forward(a.fch_gelu, a.fch);
  ops::matmul_forward(a.fcproj, a.fch_gelu, low(w.fcproj_w), bias_here ? w.fcproj_b : Tensor());
  if (tp_.size > 1) tp_.all_reduce(a.fcproj);
  ops::residual_forward(a.res3, mid, a.fcproj);
}

void Gpt::refresh_bf16_weights() {
  if (!bf16() || low_current_) return;
  const Device::AllRanksAtOnce together(*device_);
  ops::convert(flat_low_, flat_params_);
  low_current_ = true;
}

void Gpt::forward(const Tensor& input) {
  if (weights_pending()) {
    throw Error(ErrorCode::kInvalidArgument,
                cat("model forward: activation slot ", slot_,
                    " still holds a micro-batch whose weight gradients wait (backward_weights() first)"));
  }
  Activations& a = acts();
  refresh_bf16_weights();
  const Tensor* x = nullptr;
  if (range_.embedding) {
    if (input.dtype() != DType::kI32 || !(input.shape() == Shape{B_, T_})) {
      throw Error(ErrorCode::kInvalidArgument, cat("model forward: expected tokens i32 [", B_, ", ", T_, "], got ",
                                                   dtype_name(input.dtype()), " ", input.shape().str()));
    }
    a.tokens = input;
    // Vocabulary-parallel: this rank's rows of the table, the positions once (rank 0), summed over the group.
    ops::encoder_forward(a.encoded, input, wte_, tp_.rank == 0 ? wpe_ : Tensor(), vocab_.first, config_.vocab_size);
    if (tp_.size > 1) tp_.all_reduce(a.encoded);
    x = &a.encoded;
  } else {
    if (input.dtype() != DType::kF32 || input.numel() != int64_t{B_} * T_ * config_.n_embd) {
      throw Error(ErrorCode::kInvalidArgument,
                  cat("model forward: expected activations f32 [", B_, ", ", T_, ", ", config_.n_embd, "], got ",
                      dtype_name(input.dtype()), " ", input.shape().str()));
    }
    a.input = input;
    x = &a.input;
  }
  for (size_t b = 0; b < blocks_.size(); ++b) {
    block_forward(static_cast<int>(b), *x);
    x = &block_output(b);
  }
  if (range_.head) {
    produce(a.lnf, g_lnf_,
            [&](const Tensor& o) { ops::layernorm_forward(o, a.lnf_mean, a.lnf_rstd, *x, lnf_w_, lnf_b_); });
    ops::matmul_forward(a.logits, a.lnf, low(wte_), Tensor());  // tied head: logits = ln_f(x) @ wte^T, this rank's rows
  }
}

float Gpt::loss(const Tensor& targets, float grad_scale) {
  H2_CHECK(range_.head) << "loss() needs the head";
  if (targets.dtype() != DType::kI32 || targets.numel() != int64_t{B_} * T_) {
    throw Error(ErrorCode::kInvalidArgument, cat("model loss: expected targets i32 [", B_, ", ", T_, "], got ",
                                                 dtype_name(targets.dtype()), " ", targets.shape().str()));
  }
  Activations& a = acts();
  std::vector<int32_t> host(static_cast<size_t>(targets.numel()));
  copy_to_host(host.data(), targets);
  int64_t counted = 0;
  for (int32_t t : host) counted += t >= 0;
  const float dloss = counted > 0 ? grad_scale / static_cast<float>(counted) : 0.0f;
  const Tensor rows = targets.reshape({int64_t{B_} * T_});
  double sum = 0.0;
  if (tp_.size > 1) {
    sum = parallel_loss(rows, host, dloss);
  } else {
    // The gradient is written over the logits: they are not needed again, and this saves a (B,T,V) buffer.
    ops::crossentropy_forward_backward(a.losses, a.logits, a.logits, rows, dloss);
    std::vector<float> losses(static_cast<size_t>(a.losses.numel()));
    copy_to_host(losses.data(), a.losses);
    for (float l : losses) sum += l;
  }
  return counted > 0 ? static_cast<float>(sum / static_cast<double>(counted)) : 0.0f;
}

// Megatron-LM's parallel cross-entropy: each rank's per-row maximum and sum of exponentials over its vocabulary
// columns, the group's maximum, the sums rescaled to it and summed, and the target's logit from the rank that
// holds it (the others contribute 0); then each rank's gradient of its columns. Returns the sum of the counted
// rows' losses.
float Gpt::parallel_loss(const Tensor& targets, const std::vector<int32_t>& host_targets, float dloss) {
  Activations& a = acts();
  const size_t n = host_targets.size();
  ops::crossentropy_stats(ce_max_, ce_sum_, ce_target_, a.logits, targets, vocab_.first, config_.vocab_size);
  std::vector<float> local_max(n), global_max(n), sums(n);
  copy_to_host(local_max.data(), ce_max_);
  tp_.all_reduce_max(ce_max_);
  copy_to_host(global_max.data(), ce_max_);
  copy_to_host(sums.data(), ce_sum_);
  for (size_t i = 0; i < n; ++i) sums[i] *= std::exp(local_max[i] - global_max[i]);
  copy_from_host(ce_sum_, sums.data());
  tp_.all_reduce(ce_sum_);
  tp_.all_reduce(ce_target_);
  ops::crossentropy_backward(a.logits, a.logits, ce_max_, ce_sum_, targets, vocab_.first, config_.vocab_size, dloss);
  std::vector<float> target_logit(n);
  copy_to_host(sums.data(), ce_sum_);
  copy_to_host(target_logit.data(), ce_target_);
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    if (host_targets[i] >= 0) sum += std::log(double{sums[i]}) + global_max[i] - target_logit[i];
  }
  return static_cast<float>(sum);
}

std::vector<Gpt::NamedOutput> Gpt::forward_outputs() {
  const Activations& a = acts();
  std::vector<NamedOutput> out;
  if (range_.embedding) out.push_back({"encoder", Op::kEncoderForward, a.encoded});
  for (size_t i = 0; i < a.blocks.size(); ++i) {
    const BlockActs& b = a.blocks[i];
    const std::string p = cat("h.", range_.first_block + static_cast<int>(i), ".");
    int k = 0;  // the first five are the attention half's
    for (auto [suffix, op, value] : {std::tuple{"ln_1", Op::kLayernormForward, b.ln1},
                                     {"attn.c_attn", Op::kMatmulForward, b.qkv},
                                     {"attn.core", Op::kAttentionForward, b.atty},
                                     {"attn.c_proj", Op::kMatmulForward, b.attproj},
                                     {"residual_1", Op::kResidualForward, b.res2},
                                     {"ln_2", Op::kLayernormForward, b.ln2},
                                     {"mlp.c_fc", Op::kMatmulForward, b.fch},
                                     {"mlp.gelu", Op::kGeluForward, b.fch_gelu},
                                     {"mlp.c_proj", Op::kMatmulForward, b.fcproj},
                                     {"residual_2", Op::kResidualForward, b.res3}}) {
      if (k++ < 5 ? has_attention(i) : has_mlp(i)) out.push_back({p + suffix, op, value});
    }
  }
  if (range_.head) {
    out.push_back({"ln_f", Op::kLayernormForward, a.lnf});
    out.push_back({"lm_head", Op::kMatmulForward, a.logits});
  }
  return out;
}

void Gpt::product_backward(const Tensor& dinp, const Tensor& weight, const Tensor& bias, const Tensor& dout,
                           const Tensor& inp, const Tensor* keep) {
  ops::matmul_backward(dinp, keep != nullptr ? Tensor() : grad_of(weight), grad_of(bias), dout, inp, low(weight));
  if (keep != nullptr) ops::convert(*keep, dout);  // in bf16 rounded as the product reads it
}

const Tensor& Gpt::widened(const Tensor& kept, const Tensor& scratch) {
  if (kept.dtype() == DType::kF32) return kept;
  ops::convert(scratch, kept);  // exact: rounding it again, as the product does, gives it back
  return scratch;
}

// Gradient of one block. `dout` is the gradient of the block's output; `dx` receives its input's gradient.
void Gpt::block_backward(int b, const Tensor& x, const Tensor& dout, const Tensor& dx, PendingBlock* keep) {
  const BlockParams& w = blocks_[static_cast<size_t>(b)];
  const BlockActs& a = acts().blocks[static_cast<size_t>(b)];
  // Recomputation: the whole block's forward (kFull, into the shared buffers; the row-parallel all-reduces run
  // again), or only its attention probabilities (kSelective), from what the slot kept.
  const bool attention = has_attention(static_cast<size_t>(b)), mlp = has_mlp(static_cast<size_t>(b));
  const Recompute recompute = recompute_of(static_cast<size_t>(b));
  if (recompute == Recompute::kFull || (recompute == Recompute::kSelective && attention)) {
    device_->synchronize();
    const double start = monotonic_seconds();
    if (recompute == Recompute::kFull) {
      block_forward(b, x);
    } else {
      ops::attention_forward(a.atty, a.att, a.qkv, config_.n_head / tp_.size);
    }
    device_->synchronize();
    recompute_s_ += monotonic_seconds() - start;
    ++recomputed_;
  }
  auto g = [&](const Tensor& value) { return grad_of(value); };
  auto kept = [&](const Tensor PendingBlock::*t) { return keep != nullptr ? &(keep->*t) : nullptr; };
  // MLP: res3 = res2 + c_proj(gelu(c_fc(ln_2(res2)))); res2 is the block's input x without the attention half.
  if (mlp) {
    const Tensor& mid = attention ? a.res2 : x;
    product_backward(g_fch_gelu_, w.fcproj_w, w.fcproj_b, dout, a.fch_gelu, kept(&PendingBlock::fcproj));
    ops::gelu_backward(g_fch_, a.fch, g_fch_gelu_);
    product_backward(g_ln_, w.fc_w, w.fc_b, g_fch_, a.ln2, kept(&PendingBlock::fc));
    if (tp_.size > 1) tp_.all_reduce(g_ln_);  // column-parallel: each rank's part of the input gradient
    ops::layernorm_backward(g_tmp_, g(w.ln2_w), g(w.ln2_b), g_ln_, mid, w.ln2_w, a.ln2_mean, a.ln2_rstd);
    // The residual path and the MLP path both reach res2.
    ops::residual_forward(attention ? g_res2_ : dx, dout, g_tmp_);
  }
  if (!attention) return;
  // Attention: res2 = x + c_proj(attention(c_attn(ln_1(x)))).
  const Tensor& dres2 = mlp ? g_res2_ : dout;
  product_backward(g_atty_, w.proj_w, w.proj_b, dres2, a.atty, kept(&PendingBlock::proj));
  ops::attention_backward(g_qkv_, g_atty_, a.qkv, a.att, config_.n_head / tp_.size);
  product_backward(g_ln_, w.qkv_w, w.qkv_b, g_qkv_, a.ln1, kept(&PendingBlock::qkv));
  if (tp_.size > 1) tp_.all_reduce(g_ln_);
  ops::layernorm_backward(g_tmp_, g(w.ln1_w), g(w.ln1_b), g_ln_, x, w.ln1_w, a.ln1_mean, a.ln1_rstd);
  ops::residual_forward(dx, dres2, g_tmp_);
}

void Gpt::backward(const Tensor& dout) {
  Activations& a = acts();
  // A split backward keeps what the weight gradients need in a free set of pending buffers.
  Pending* keep = nullptr;
  if (!pending_.empty()) {
    if (weights_pending()) {
      throw Error(ErrorCode::kInvalidArgument,
                  cat("model backward: activation slot ", slot_, "'s weight gradients are still pending"));
    }
    keep = pending_of(-1);
    if (keep == nullptr) {
      throw Error(ErrorCode::kInvalidArgument,
                  cat("model backward: ", pending_.size(),
                      " micro-batches already wait for their weight gradients, as many as policy.pending_weights "
                      "holds; call backward_weights() for one first"));
    }
  }
  // The gradient flowing backwards alternates between the two (B,T,C) buffers g_a_ and g_b_, ending in g_a_.
  const size_t n = blocks_.size();
  Tensor cur = n % 2 == 0 ? g_a_ : g_b_, next = n % 2 == 0 ? g_b_ : g_a_;
  const Tensor& input = range_.embedding ? a.encoded : a.input;
  const Tensor& last_out = n > 0 ? block_output(n - 1) : input;
  if (range_.head) {
    // Vocabulary-parallel: each rank's columns give part of the input gradient; the group sums them.
    // Split: the weight gradient's output gradient is the slot's logits', where the loss wrote it.
    ops::matmul_backward(g_lnf_, keep != nullptr ? Tensor() : grad_of(wte_), Tensor(), a.logits, a.lnf, low(wte_));
    if (tp_.size > 1) tp_.all_reduce(g_lnf_);
    ops::layernorm_backward(cur, grad_of(lnf_w_), grad_of(lnf_b_), g_lnf_, last_out, lnf_w_, a.lnf_mean, a.lnf_rstd);
  } else {
    if (!dout.defined() || dout.numel() != cur.numel()) {
      throw Error(ErrorCode::kInvalidArgument,
                  cat("model backward: expected the output gradient f32 [", B_, ", ", T_, ", ", config_.n_embd, "]"));
    }
    copy(cur, dout);
  }
  for (size_t i = n; i-- > 0;) {
    const Tensor& x = i > 0 ? block_output(i - 1) : input;
    block_backward(static_cast<int>(i), x, cur, next, keep != nullptr ? &keep->blocks[i] : nullptr);
    std::swap(cur, next);
  }
  // `cur` is now g_a_ and holds the gradient of the range's input. Every TP rank holds all of it, so each adds
  // its vocabulary rows' part and the whole position table's (a replicated parameter) gradient.
  if (range_.embedding && keep != nullptr) {
    ops::convert(keep->embedding, cur);  // the embedding's backward is all weight gradient
  } else if (range_.embedding) {
    ops::encoder_backward(grad_of(wte_), grad_of(wpe_), cur, a.tokens, vocab_.first, config_.vocab_size);
  }
  if (keep != nullptr) keep->slot = slot_;  // held once the backward has run (not by one that threw)
}

void Gpt::backward_weights() {
  Pending* p = pending_of(slot_);
  if (p == nullptr) {
    throw Error(ErrorCode::kInvalidArgument,
                cat("model backward_weights: activation slot ", slot_, " has no weight gradients pending (",
                    pending_.empty() ? "policy.pending_weights is 0: backward() computed them"
                                     : "backward() on this slot first",
                    ")"));
  }
  const Activations& a = acts();
  // The products' order is a whole backward's; each parameter's sum is its own, so only the micro-batches' order
  // matters to the result.
  auto weight = [&](const Tensor& w, const Tensor& dout, const Tensor& inp) {
    ops::matmul_backward(Tensor(), grad_of(w), Tensor(), dout, inp, low(w));
  };
  if (range_.head) weight(wte_, a.logits, a.lnf);  // the slot holds the logits' gradient
  for (size_t i = blocks_.size(); i-- > 0;) {
    const BlockParams& w = blocks_[i];
    const BlockActs& b = a.blocks[i];
    const PendingBlock& k = p->blocks[i];
    if (has_mlp(i)) {
      weight(w.fcproj_w, widened(k.fcproj, g_res2_), b.fch_gelu);
      weight(w.fc_w, widened(k.fc, g_fch_), b.ln2);
    }
    if (has_attention(i)) {
      weight(w.proj_w, widened(k.proj, g_res2_), b.atty);
      weight(w.qkv_w, widened(k.qkv, g_qkv_), b.ln1);
    }
  }
  if (range_.embedding) {
    ops::encoder_backward(grad_of(wte_), grad_of(wpe_), p->embedding, a.tokens, vocab_.first, config_.vocab_size);
  }
  p->slot = -1;
}

// Gradients share the parameters' layout, so a parameter's gradient sits at the same offset of flat_grads_.
int64_t Gpt::param_offset(const Tensor& value) const {
  const int64_t offset = (value.data_as<float>() - flat_params_.data_as<float>());
  H2_CHECK(offset >= 0 && offset + value.numel() <= flat_params_.numel()) << "not a parameter of this model";
  return offset;
}

Tensor Gpt::grad_of(const Tensor& value) const {
  const int64_t offset = param_offset(value);
  return flat_grads_.slice(offset, offset + value.numel()).reshape(value.shape());
}

Tensor Gpt::low(const Tensor& value) const {
  if (!bf16()) return value;
  const int64_t offset = param_offset(value);
  return flat_low_.slice(offset, offset + value.numel()).reshape(value.shape());
}

void Gpt::produce(const Tensor& act, const Tensor& stage, const std::function<void(const Tensor&)>& make) {
  if (!bf16()) return make(act);
  make(stage);
  ops::convert(act, stage);
}

}  // namespace h2
