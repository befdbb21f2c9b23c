// The stage runner: action interpreter, gradient reduction (plain or ZeRO-1) and the optimizer step.
#include "pipeline/runtime.h"

#include <chrono>
#include <cmath>

#include "core/clock.h"
#include "ops/ops.h"
#include "train/trainer.h"

namespace h2 {
namespace {

uint32_t activation_tag(int m) { return static_cast<uint32_t>(2 * m); }
uint32_t gradient_tag(int m) { return static_cast<uint32_t>(2 * m + 1); }

}  // namespace

StageComms StageComms::split(Communicator& world, const StageLayout& layout) {
  if (world.size() != layout.stages * layout.dp) {
    throw Error(ErrorCode::kInvalidArgument,
                cat("pipeline: ", layout.stages, " stages x ", layout.dp, " replicas need ", layout.stages * layout.dp,
                    " ranks, the job has ", world.size()));
  }
  const int stage = world.rank() / layout.dp, replica = world.rank() % layout.dp;
  Communicator pipe = world.split(replica, stage);
  Communicator dp = world.split(stage, replica);
  const bool ends = layout.stages > 1 && (stage == 0 || stage == layout.stages - 1);
  Communicator tied = world.split(ends ? replica : layout.dp + world.rank(), stage);
  return StageComms{std::move(pipe), std::move(dp), std::move(tied)};
}

StageRunner::StageRunner(const GptConfig& config, Device& device, GptRange range, int stage, const StageLayout& layout,
                         StageComms& comms, int B, int T, OptimOptions options)
    : config_(config),
      device_(device),
      range_(range),
      stage_(stage),
      layout_(layout),
      comms_(comms),
      pipe_(comms.pipe),
      dp_(comms.dp),
      tied_(comms.tied),
      B_(B),
      T_(T),
      options_(options),
      first_(stage == 0),
      last_(stage == layout.stages - 1) {
  if (range.embedding != first_ || range.head != last_) {
    throw Error(ErrorCode::kInvalidArgument,
                cat("pipeline stage ", stage, " of ", layout.stages,
                    ": only the first stage holds the embedding and only the last the head"));
  }
  model_ = std::make_unique<Gpt>(config, device, range, B, T);
  const int64_t n = model_->num_params();
  const int64_t shard = options_.zero1 ? (n + layout.dp - 1) / layout.dp : n;
  optimizer_ = OptimizerState{device.zeros(DType::kF32, {shard}), device.zeros(DType::kF32, {shard})};
  tokens_ = device.empty(DType::kI32, {B, T});
  targets_ = device.empty(DType::kI32, {B, T});
  if (!last_) dout_ = device.empty(DType::kF32, {B, T, config.n_embd});
  norm_acc_ = device.zeros(DType::kF32, {1});
}

void StageRunner::load_input(int m, const Batch& batch) {
  if (!first_ && !last_) return;
  std::vector<int32_t> tokens, targets;
  batch(m, tokens, targets);
  if (first_) copy_from_host(tokens_, tokens.data());
  if (last_) copy_from_host(targets_, targets.data());
}

void StageRunner::forward(int m, const Batch& batch) {
  load_input(m, batch);
  model_->forward(first_ ? tokens_ : stash_[static_cast<size_t>(m)]);
  holds_ = m;
}

void StageRunner::backward(int m, const Batch& batch) {
  if (holds_ != m) {  // recompute this micro-batch's activations from its stashed input
    forward(m, batch);
    if (last_) model_->loss(targets_, 1.0f / static_cast<float>(micro_batches_));
  }
  if (last_) {
    model_->backward();
  } else {
    model_->backward(dout_);
  }
  if (!first_) copy(gout_[static_cast<size_t>(m)], model_->dinput());
  holds_ = -1;  // backward consumed the activations
}

float StageRunner::step(const Schedule& schedule, const Batch& batch, const AdamwParams& hp) {
  const int rank = comms_.pipe.rank();
  if (schedule.ranks != layout_.stages || schedule.stages != layout_.stages) {
    throw Error(ErrorCode::kInvalidArgument, cat("pipeline: the schedule has ", schedule.stages, " stages on ",
                                                 schedule.ranks, " ranks; this pipeline has ", layout_.stages));
  }
  micro_batches_ = schedule.micro_batches;
  const Shape act{B_, T_, config_.n_embd};
  while (stash_.size() < static_cast<size_t>(micro_batches_)) {
    stash_.push_back(first_ ? Tensor() : device_.empty(DType::kF32, act));
    out_.push_back(last_ ? Tensor() : device_.empty(DType::kF32, act));
    gout_.push_back(first_ ? Tensor() : device_.empty(DType::kF32, act));
  }
  model_->zero_grads();
  loss_sum_ = 0;
  holds_ = -1;
  for (const Action& a : schedule.actions[static_cast<size_t>(rank)]) {
    const size_t m = static_cast<size_t>(a.micro_batch);
    const double t0 = on_action ? monotonic_seconds() : 0;
    switch (a.type) {
      case ActionType::kRecvF:
        pipe_.recv(stash_[m], stage_ - 1, activation_tag(a.micro_batch));
        break;
      case ActionType::kForward:
        forward(a.micro_batch, batch);
        if (last_) {
          loss_sum_ += model_->loss(targets_, 1.0f / static_cast<float>(micro_batches_));
        } else {
          copy(out_[m], model_->output());
        }
        break;
      case ActionType::kSendF:
        sends_.emplace_back(stage_ + 1, pipe_.isend(out_[m], stage_ + 1, activation_tag(a.micro_batch)));
        break;
      case ActionType::kRecvB:
        pipe_.recv(dout_, stage_ + 1, gradient_tag(a.micro_batch));
        break;
      case ActionType::kBackward:
        backward(a.micro_batch, batch);
        break;
      case ActionType::kSendB:
        sends_.emplace_back(stage_ - 1, pipe_.isend(gout_[m], stage_ - 1, gradient_tag(a.micro_batch)));
        break;
      case ActionType::kReduceGrad:
        reduce_gradients();
        break;
      case ActionType::kOptim:
        optimize(hp);
        break;
    }
    if (on_action) {
      device_.synchronize();
      on_action(a, t0, monotonic_seconds());
    }
  }
  for (auto& [peer, request] : sends_) {
    if (request) comms_.pipe.wait_request(*request, "pipeline send", peer);
  }
  sends_.clear();
  // The step's loss: the mean over micro-batches on the last stage, averaged over replicas, then sent along.
  float loss = static_cast<float>(loss_sum_ / micro_batches_);
  if (last_) comms_.dp.all_reduce(&loss, 1, DType::kF32, ReduceOp::kAvg);
  comms_.pipe.broadcast(&loss, 1, DType::kF32, layout_.stages - 1);
  return loss;
}

void StageRunner::reduce_gradients() {
  if (!options_.zero1 && comms_.dp.size() > 1) dp_.all_reduce(model_->flat_grads(), ReduceOp::kAvg);
  if (comms_.tied.size() > 1) {
    for (Gpt::Param& p : model_->params()) {
      if (p.name == "wte.weight") tied_.all_reduce(p.grad, ReduceOp::kSum);
    }
  }
}

void StageRunner::optimize(AdamwParams hp) {
  // The last stage's copy of the tied embedding is not counted in the norm: the first stage's already is.
  auto counted = [&](const Gpt::Param& p) { return !(last_ && !first_ && p.name == "wte.weight"); };
  const Tensor& flat_grads = model_->flat_grads();
  const int64_t n = model_->num_params();
  double norm_sq = 0;
  std::vector<float> shard;  // ZeRO-1: this replica's averaged gradient shard
  int64_t lo = 0, hi = n;
  if (options_.zero1) {
    const int d = comms_.dp.rank(), D = comms_.dp.size();
    const int64_t s = optimizer_.m.numel();
    lo = std::min<int64_t>(n, d * s);
    hi = std::min<int64_t>(n, lo + s);
    std::vector<float> padded(static_cast<size_t>(s * D), 0.0f);
    copy_to_host(padded.data(), flat_grads);
    shard.resize(static_cast<size_t>(s));
    comms_.dp.reduce_scatter(shard.data(), padded.data(), static_cast<size_t>(s), DType::kF32, ReduceOp::kAvg);
    int64_t offset = 0;
    for (const Gpt::Param& p : model_->params()) {
      const int64_t a = std::max(offset, lo), b = std::min(offset + p.value.numel(), hi);
      if (counted(p)) {
        for (int64_t i = a; i < b; ++i) norm_sq += double(shard[size_t(i - lo)]) * shard[size_t(i - lo)];
      }
      offset += p.value.numel();
    }
  } else {
    const float zero = 0.0f;
    copy_from_host(norm_acc_, &zero);
    for (const Gpt::Param& p : model_->params()) {
      if (counted(p)) ops::global_norm_squared(norm_acc_, p.grad);
    }
    float local = 0;
    copy_to_host(&local, norm_acc_);
    norm_sq = local;
  }
  float total = static_cast<float>(norm_sq);
  if (options_.zero1) comms_.dp.all_reduce(&total, 1, DType::kF32, ReduceOp::kSum);  // the shards' parts
  comms_.pipe.all_reduce(&total, 1, DType::kF32, ReduceOp::kSum);
  grad_norm_ = std::sqrt(static_cast<double>(total));
  if (!std::isfinite(grad_norm_)) {
    throw Error(ErrorCode::kInternal, cat("pipeline stage ", stage_,
                                          ": the gradient norm is not finite; lower "
                                          "optim.lr or set optim.grad_clip"));
  }
  const float clip = options_.grad_clip > 0 && grad_norm_ > options_.grad_clip
                         ? static_cast<float>(options_.grad_clip / grad_norm_)
                         : 1.0f;
  if (!options_.zero1) {
    if (clip != 1.0f) ops::scale(flat_grads, clip);
    adamw_step(*model_, optimizer_, hp);
    return;
  }
  for (float& g : shard) g *= clip;
  if (hi > lo) copy_from_host(flat_grads.slice(lo, hi), shard.data());
  int64_t offset = 0;
  for (const Gpt::Param& p : model_->params()) {
    const int64_t a = std::max(offset, lo), b = std::min(offset + p.value.numel(), hi);
    if (a < b) {
      AdamwParams param_hp = hp;
      if (!p.weight_decay) param_hp.weight_decay = 0.0f;
      ops::adamw_update(model_->flat_params().slice(a, b), optimizer_.m.slice(a - lo, b - lo),
                        optimizer_.v.slice(a - lo, b - lo), flat_grads.slice(a, b), param_hp);
    }
    offset += p.value.numel();
  }
  const size_t s = static_cast<size_t>(optimizer_.m.numel());
  std::vector<float> mine(s, 0.0f), all(s * static_cast<size_t>(comms_.dp.size()));
  if (hi > lo) copy_to_host(mine.data(), model_->flat_params().slice(lo, hi));
  comms_.dp.all_gather(all.data(), mine.data(), s, DType::kF32);
  copy_from_host(model_->flat_params(), all.data());
}

void StageRunner::optimizer_state(std::vector<float>& m, std::vector<float>& v) {
  const size_t n = static_cast<size_t>(model_->num_params()), s = static_cast<size_t>(optimizer_.m.numel());
  for (auto [flat, out] : {std::pair{&optimizer_.m, &m}, {&optimizer_.v, &v}}) {
    std::vector<float> mine(s);
    copy_to_host(mine.data(), *flat);
    if (!options_.zero1) {
      *out = std::move(mine);
      continue;
    }
    out->assign(s * static_cast<size_t>(comms_.dp.size()), 0.0f);
    comms_.dp.all_gather(out->data(), mine.data(), s, DType::kF32);
    out->resize(n);
  }
}

void StageRunner::set_optimizer_state(const std::vector<float>& m, const std::vector<float>& v) {
  const int64_t s = optimizer_.m.numel(), lo = options_.zero1 ? comms_.dp.rank() * s : 0;
  for (auto [flat, in] : {std::pair{&optimizer_.m, &m}, {&optimizer_.v, &v}}) {
    std::vector<float> mine(static_cast<size_t>(s), 0.0f);
    for (int64_t i = 0; i < s && lo + i < static_cast<int64_t>(in->size()); ++i)
      mine[size_t(i)] = (*in)[size_t(lo + i)];
    copy_from_host(*flat, mine.data());
  }
}

}  // namespace h2
