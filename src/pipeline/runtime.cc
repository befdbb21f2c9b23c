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

StageLayout StageLayout::uniform(int stages, int dp, int tp) {
  return StageLayout{std::vector<StageShape>(static_cast<size_t>(stages), StageShape{dp, tp})};
}

int StageLayout::world_size() const { return first_rank(num_stages()); }

int StageLayout::first_rank(int stage) const {
  int r = 0;
  for (int s = 0; s < stage; ++s) r += stages[static_cast<size_t>(s)].dp * stages[static_cast<size_t>(s)].tp;
  return r;
}

int StageLayout::rank_of(int stage, int replica, int t) const {
  return first_rank(stage) + replica * stages[static_cast<size_t>(stage)].tp + t;
}

StageLayout::Place StageLayout::place(int rank) const {
  for (int s = 0; s < num_stages(); ++s) {
    const int tp = stages[static_cast<size_t>(s)].tp, local = rank - first_rank(s);
    if (local < stages[static_cast<size_t>(s)].dp * tp) return Place{s, local / tp, local % tp};
  }
  throw Error(ErrorCode::kInvalidArgument, cat("pipeline: rank ", rank, " is outside the layout's ", world_size()));
}

std::vector<Transfer> boundary_transfers(const StageLayout& layout, int rows, int from, int to) {
  const StageShape src = layout.stages[static_cast<size_t>(from)], dst = layout.stages[static_cast<size_t>(to)];
  const int src_rows = rows / src.dp, dst_rows = rows / dst.dp;
  std::vector<Transfer> out;
  for (int d = 0; d < dst.dp; ++d) {
    for (int t = 0; t < dst.tp; ++t) {
      const int lo = d * dst_rows, hi = lo + dst_rows;
      for (int e = lo / src_rows; e < src.dp && e * src_rows < hi; ++e) {
        const int a = std::max(lo, e * src_rows), b = std::min(hi, (e + 1) * src_rows);
        out.push_back({layout.rank_of(from, e, t % src.tp), layout.rank_of(to, d, t), a, b - a});
      }
    }
  }
  return out;
}

StageComms StageComms::split(Communicator& world, const StageLayout& layout) {
  if (world.size() != layout.world_size()) {
    throw Error(ErrorCode::kInvalidArgument, cat("pipeline: the layout's ", layout.num_stages(), " stages need ",
                                                 layout.world_size(), " ranks, the job has ", world.size()));
  }
  const int rank = world.rank(), last = layout.num_stages() - 1;
  const StageLayout::Place p = layout.place(rank);
  Communicator all = world.split(0, rank);
  Communicator dp = world.split(layout.rank_of(p.stage, 0, p.t), p.replica);
  Communicator tp = world.split(layout.rank_of(p.stage, p.replica, 0), p.t);
  // The tied embedding: pairs of the same (replica, TP rank) when the two ends have the same shape, else one
  // group of both ends' ranks.
  const StageShape first = layout.stages.front(), end = layout.stages.back();
  const bool ends = last > 0 && (p.stage == 0 || p.stage == last);
  const bool pairs = first.dp == end.dp && first.tp == end.tp;
  const int colour = !ends ? layout.world_size() + rank : pairs ? p.replica * first.tp + p.t : 0;
  Communicator tied = world.split(colour, rank);
  return StageComms{std::move(all), std::move(dp), std::move(tp), std::move(tied)};
}

StageRunner::StageRunner(const GptConfig& config, Device& device, GptRange range, const StageLayout& layout,
                         StageComms& comms, int rows, int T, OptimOptions options)
    : config_(config),
      device_(device),
      range_(range),
      layout_(layout),
      place_(layout.place(comms.all.rank())),
      comms_(comms),
      all_(comms.all),
      dp_(comms.dp),
      tp_(comms.tp),
      tied_(comms.tied),
      rows_(rows),
      T_(T),
      options_(options),
      first_(place_.stage == 0),
      last_(place_.stage == layout.num_stages() - 1) {
  const int stage = place_.stage;
  if (range.embedding != first_ || range.head != last_) {
    throw Error(ErrorCode::kInvalidArgument,
                cat("pipeline stage ", stage, " of ", layout.num_stages(),
                    ": only the first stage holds the embedding and only the last the head"));
  }
  for (int s = 0; s < layout.num_stages(); ++s) {
    if (rows <= 0 || rows % layout.stages[static_cast<size_t>(s)].dp != 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  cat("pipeline stage ", s, ": its ", layout.stages[static_cast<size_t>(s)].dp,
                      " replicas do not divide a micro-batch of ", rows, " sequences; pick a micro-batch they divide"));
    }
  }
  const StageShape shape = layout.stages[static_cast<size_t>(stage)];
  B_ = rows / shape.dp;
  const int me = comms.all.rank();
  auto mine = [&](int from, int to, bool sending) {
    std::vector<Transfer> out;
    for (const Transfer& t : boundary_transfers(layout, rows, from, to)) {
      if ((sending ? t.from : t.to) == me) out.push_back(t);
    }
    return out;
  };
  if (!first_) {
    from_prev_ = mine(stage - 1, stage, false);
    to_prev_ = mine(stage, stage - 1, true);
  }
  if (!last_) {
    to_next_ = mine(stage, stage + 1, true);
    from_next_ = mine(stage + 1, stage, false);
  }
  TensorParallel tp{place_.t, shape.tp, [this](const Tensor& x) { tp_.all_reduce(x, ReduceOp::kSum); }};
  model_ = std::make_unique<Gpt>(config, device, range, B_, T, std::move(tp));
  const int64_t n = model_->num_params();
  const int64_t shard = options_.zero1 ? (n + shape.dp - 1) / shape.dp : n;
  optimizer_ = OptimizerState{device.zeros(DType::kF32, {shard}), device.zeros(DType::kF32, {shard})};
  tokens_.push_back(device.empty(DType::kI32, {B_, T}));
  targets_ = device.empty(DType::kI32, {B_, T});
  if (!last_) dout_ = device.empty(DType::kF32, {B_, T, config.n_embd});
  norm_acc_ = device.zeros(DType::kF32, {1});
}

void StageRunner::load_input(int m, const Batch& batch) {
  if (!first_ && !last_) return;
  std::vector<int32_t> tokens, targets;
  batch(m, place_.replica * B_, B_, tokens, targets);
  if (first_) copy_from_host(tokens_[slot_of(m)], tokens.data());
  if (last_) copy_from_host(targets_, targets.data());
}

float StageRunner::loss_scale() const { return 1.0f / static_cast<float>(micro_batches_ * layout_.stages.back().dp); }

void StageRunner::keep_activations(int micro_batches) {
  model_->set_activation_slots(micro_batches);
  while (tokens_.size() < static_cast<size_t>(micro_batches)) tokens_.push_back(device_.empty(DType::kI32, {B_, T_}));
  holds_.assign(static_cast<size_t>(micro_batches), -1);
}

void StageRunner::forward(int m, const Batch& batch) {
  const size_t slot = slot_of(m);
  model_->use_slot(static_cast<int>(slot));
  load_input(m, batch);
  model_->forward(first_ ? tokens_[slot] : stash_[static_cast<size_t>(m)]);
  holds_[slot] = m;
}

void StageRunner::backward(int m, const Batch& batch) {
  const size_t slot = slot_of(m);
  model_->use_slot(static_cast<int>(slot));
  if (holds_[slot] != m) {  // recompute this micro-batch's activations from its stashed input
    ++recomputed_;
    forward(m, batch);
    if (last_) model_->loss(targets_, loss_scale());
  }
  if (last_) {
    model_->backward();
  } else {
    model_->backward(dout_);
  }
  if (!first_) copy(gout_[static_cast<size_t>(m)], model_->dinput());
  holds_[slot] = -1;  // backward consumed the activations
}

// Rows of a micro-batch's piece within this replica's part of it.
Tensor StageRunner::rows_of(const Tensor& t, const Transfer& piece) const {
  const int lo = piece.first_row - place_.replica * B_;
  return t.slice(lo, lo + piece.rows);
}

void StageRunner::send(const std::vector<Transfer>& pieces, const Tensor& t, uint32_t tag) {
  for (const Transfer& p : pieces) sends_.emplace_back(p.to, all_.isend(rows_of(t, p), p.to, tag));
}

void StageRunner::receive(const std::vector<Transfer>& pieces, const Tensor& t, uint32_t tag) {
  for (const Transfer& p : pieces) all_.recv(rows_of(t, p), p.from, tag);
}

float StageRunner::step(const Schedule& schedule, const Batch& batch, const AdamwParams& hp) {
  const int stage = place_.stage;
  if (schedule.ranks != layout_.num_stages() || schedule.stages != layout_.num_stages()) {
    throw Error(ErrorCode::kInvalidArgument, cat("pipeline: the schedule has ", schedule.stages, " stages on ",
                                                 schedule.ranks, " ranks; this pipeline has ", layout_.num_stages()));
  }
  micro_batches_ = schedule.micro_batches;
  ensure_buffers(micro_batches_);
  model_->zero_grads();
  loss_sum_ = 0;
  std::fill(holds_.begin(), holds_.end(), -1);
  for (const Action& a : schedule.actions[static_cast<size_t>(stage)]) {
    const size_t m = static_cast<size_t>(a.micro_batch);
    const double t0 = on_action ? monotonic_seconds() : 0;
    switch (a.type) {
      case ActionType::kRecvF:
        receive(from_prev_, stash_[m], activation_tag(a.micro_batch));
        break;
      case ActionType::kForward:
        forward(a.micro_batch, batch);
        if (last_) {
          loss_sum_ += model_->loss(targets_, loss_scale());
        } else {
          copy(out_[m], model_->output());
        }
        break;
      case ActionType::kSendF:
        send(to_next_, out_[m], activation_tag(a.micro_batch));
        break;
      case ActionType::kRecvB:
        receive(from_next_, dout_, gradient_tag(a.micro_batch));
        break;
      case ActionType::kBackward:
        backward(a.micro_batch, batch);
        break;
      case ActionType::kSendB:
        send(to_prev_, gout_[m], gradient_tag(a.micro_batch));
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
    if (request) comms_.all.wait_request(*request, "pipeline send", peer);
  }
  sends_.clear();
  return share_loss(loss_sum_, micro_batches_);
}

void StageRunner::ensure_buffers(int micro_batches) {
  const Shape act{B_, T_, config_.n_embd};
  while (stash_.size() < static_cast<size_t>(micro_batches)) {
    stash_.push_back(first_ ? Tensor() : device_.empty(DType::kF32, act));
    out_.push_back(last_ ? Tensor() : device_.empty(DType::kF32, act));
    gout_.push_back(first_ ? Tensor() : device_.empty(DType::kF32, act));
  }
}

// The mean over micro-batches on the last stage, averaged over its replicas, then sent to every rank.
float StageRunner::share_loss(double loss_sum, int micro_batches) {
  float loss = static_cast<float>(loss_sum / micro_batches);
  if (last_) comms_.dp.all_reduce(&loss, 1, DType::kF32, ReduceOp::kAvg);
  comms_.all.broadcast(&loss, 1, DType::kF32, layout_.first_rank(layout_.num_stages() - 1));
  return loss;
}

float StageRunner::evaluate(int micro_batches, const Batch& batch) {
  ensure_buffers(1);
  double loss_sum = 0;
  for (int m = 0; m < micro_batches; ++m) {
    if (!first_) receive(from_prev_, stash_[0], activation_tag(m));
    load_input(m, batch);
    const size_t slot = slot_of(m);  // where load_input put the tokens
    model_->use_slot(static_cast<int>(slot));
    model_->forward(first_ ? tokens_[slot] : stash_[0]);
    if (last_) {
      loss_sum += model_->loss(targets_, 0.0f);  // no gradient wanted
    } else {
      copy(out_[0], model_->output());
      for (const Transfer& p : to_next_) all_.send(rows_of(out_[0], p), p.to, activation_tag(m));
    }
  }
  std::fill(holds_.begin(), holds_.end(), -1);
  return share_loss(loss_sum, micro_batches);
}

void StageRunner::reduce_gradients() {
  // Without ZeRO-1 the replicas sum first (a stage need not wait for the other end of the pipeline for that),
  // then the ends sum the tied embedding. With ZeRO-1 the replicas' reduce-scatter comes in OPTIM, so the ends
  // sum their own gradients here first. Pairs (ends of the same DP and TP) add their gradients as they are; one
  // group of both ends' ranks scales each rank's part so that the sum counts each TP copy and (after the
  // replicas' sum) each replica once.
  const StageShape shape = layout_.stages[static_cast<size_t>(place_.stage)];
  const bool plain = !options_.zero1;
  if (plain && comms_.dp.size() > 1) dp_.all_reduce(model_->flat_grads(), ReduceOp::kSum);
  if (comms_.tied.size() <= 1) return;
  const bool pairs = comms_.tied.size() == 2;
  const float before = pairs ? 1.0f : 1.0f / static_cast<float>(plain ? shape.tp * shape.dp : shape.tp);
  const float after = pairs || plain ? 1.0f : 1.0f / static_cast<float>(shape.dp);
  for (Gpt::Param& p : model_->params()) {
    if (p.name != "wte.weight") continue;
    if (before != 1.0f) ops::scale(p.grad, before);
    tied_.all_reduce(p.grad, ReduceOp::kSum);
    if (after != 1.0f) ops::scale(p.grad, after);
  }
}

void StageRunner::optimize(AdamwParams hp) {
  // Each tensor once in the norm: the last stage's copy of the tied embedding is the first stage's, tensors that
  // tensor parallelism replicates count on TP rank 0 only, and without ZeRO-1 (every replica holds the same
  // sums) replica 0 counts for its stage.
  OptimizerStepOptions o{.max_norm = options_.grad_clip};
  o.counted = [&](const Gpt::Param& p) {
    return (options_.zero1 || place_.replica == 0) && !(last_ && !first_ && p.name == "wte.weight") &&
           (p.split != TpSplit::kNone || place_.t == 0);
  };
  o.sum_over_ranks = [&](double local) {
    float total = static_cast<float>(local);
    comms_.all.all_reduce(&total, 1, DType::kF32, ReduceOp::kSum);
    return static_cast<double>(total);
  };
  const Tensor& flat_grads = model_->flat_grads();
  const int64_t n = model_->num_params();
  if (options_.zero1) {
    // This replica's shard of the summed gradients: reduce-scatter over the stage's replicas (the last shard padded).
    const int D = comms_.dp.size();
    const int64_t s = optimizer_.m.numel();
    o.lo = std::min<int64_t>(n, comms_.dp.rank() * s);
    o.hi = std::min<int64_t>(n, o.lo + s);
    std::vector<float> padded(static_cast<size_t>(s * D), 0.0f), shard(static_cast<size_t>(s));
    copy_to_host(padded.data(), flat_grads);
    comms_.dp.reduce_scatter(shard.data(), padded.data(), static_cast<size_t>(s), DType::kF32, ReduceOp::kSum);
    if (o.hi > o.lo) copy_from_host(flat_grads.slice(o.lo, o.hi), shard.data());
  }
  try {
    grad_norm_ = optimizer_step(*model_, optimizer_, hp, norm_acc_, o);
  } catch (const Error& e) {
    throw Error(e.code(), cat("pipeline stage ", place_.stage, ": ", e.what()));
  }
  if (!options_.zero1) return;
  // Every replica takes the others' updated shards.
  const size_t s = static_cast<size_t>(optimizer_.m.numel());
  std::vector<float> mine(s, 0.0f), all(s * static_cast<size_t>(comms_.dp.size()));
  if (o.hi > o.lo) copy_to_host(mine.data(), model_->flat_params().slice(o.lo, o.hi));
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
