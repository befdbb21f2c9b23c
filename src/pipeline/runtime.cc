// The stage runner: action interpreter, gradient reduction (plain or ZeRO-1) and the optimizer step.
#include "pipeline/runtime.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/clock.h"
#include "ops/ops.h"
#include "train/optimizer.h"

namespace h2 {
namespace {

void check_rows(const StageShape& shape, int stage, int rows) {
  const std::string where = cat("pipeline stage ", stage, ": ");
  if (shape.rows.empty()) {
    if (rows <= 0 || rows % shape.dp != 0) {
      throw Error(ErrorCode::kInvalidArgument, cat(where, "its ", shape.dp, " replicas do not divide a micro-batch of ",
                                                   rows, " sequences; pick a micro-batch they divide"));
    }
    return;
  }
  int sum = 0;
  for (int r : shape.rows) {
    if (r <= 0) throw Error(ErrorCode::kInvalidArgument, cat(where, "every replica needs at least one sequence"));
    sum += r;
  }
  if (static_cast<int>(shape.rows.size()) != shape.dp || sum != rows) {
    throw Error(ErrorCode::kInvalidArgument,
                cat(where, "the shares of its ", shape.dp, " replicas (", shape.rows.size(), " given) add up to ", sum,
                    " sequences, not the micro-batch's ", rows));
  }
}

}  // namespace

StageLayout StageLayout::uniform(int stages, int dp, int tp) {
  return StageLayout{std::vector<StageShape>(static_cast<size_t>(stages), StageShape{dp, tp})};
}

int StageShape::rows_of(int replica, int micro_batch_rows) const {
  return rows.empty() ? micro_batch_rows / dp : rows[static_cast<size_t>(replica)];
}

int StageShape::first_row(int replica, int micro_batch_rows) const {
  int first = 0;
  for (int d = 0; d < replica; ++d) first += rows_of(d, micro_batch_rows);
  return first;
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

std::vector<Transfer> boundary_transfers(const StageLayout& layout, int rows, int64_t row_elements, int from, int to) {
  const StageShape &src = layout.stages[static_cast<size_t>(from)], &dst = layout.stages[static_cast<size_t>(to)];
  // With more sending than receiving TP ranks, each chunk comes in as many pieces, one from each of them.
  const int pieces = std::max(1, src.tp / dst.tp);
  std::vector<Transfer> out;
  for (int d = 0; d < dst.dp; ++d) {
    const int64_t base = dst.first_row(d, rows) * row_elements;
    const int64_t chunk = dst.rows_of(d, rows) * row_elements / dst.tp;  // C is divisible by TP: chunks are whole
    for (int t = 0; t < dst.tp; ++t) {
      for (int j = 0; j < pieces; ++j) {
        const int64_t lo = base + t * chunk + chunk * j / pieces, hi = base + t * chunk + chunk * (j + 1) / pieces;
        const int sender = (t + j * dst.tp) % src.tp;
        for (int e = 0; e < src.dp; ++e) {
          const int64_t e_lo = src.first_row(e, rows) * row_elements, e_hi = e_lo + src.rows_of(e, rows) * row_elements;
          const int64_t a = std::max(lo, e_lo), b = std::min(hi, e_hi);
          if (a < b) out.push_back({layout.rank_of(from, e, sender), layout.rank_of(to, d, t), a, b - a});
        }
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
  const int rank = world.rank();
  const StageLayout::Place p = layout.place(rank);
  Communicator all = world.split(0, rank);
  Communicator dp = world.split(layout.rank_of(p.stage, 0, p.t), p.replica);
  Communicator tp = world.split(layout.rank_of(p.stage, p.replica, 0), p.t);
  const int last = layout.num_stages() - 1;
  const StageShape &a = layout.stages.front(), &z = layout.stages.back();
  // The ends' replicas pair up when their DP is the same: rank by rank when their TP is too, else a replica's
  // ranks at both ends together.
  const bool ends = last > 0 && (p.stage == 0 || p.stage == last) && a.dp == z.dp;
  const int color = !ends ? layout.world_size() + rank : layout.rank_of(0, p.replica, a.tp == z.tp ? p.t : 0);
  Communicator tied = world.split(color, p.stage);
  return StageComms{std::move(all), std::move(dp), std::move(tp), std::move(tied)};
}

TiedExchange tied_exchange(const StageLayout& layout, int64_t vocab, int rank, bool summed_over_replicas) {
  TiedExchange out;
  const int last = layout.num_stages() - 1;
  const StageLayout::Place me = layout.place(rank);
  if (last == 0 || (me.stage != 0 && me.stage != last)) return out;
  const int other = me.stage == 0 ? last : 0;
  const StageShape mine = layout.stages[static_cast<size_t>(me.stage)],
                   theirs = layout.stages[static_cast<size_t>(other)];
  const RowShard rows = vocab_shard(vocab, me.t, mine.tp);
  // The other end's replicas this rank exchanges with: with summed gradients, it takes one replica's sum (its own
  // index modulo theirs) and gives its sum to every replica that takes it; with each replica's own gradient, the
  // other end's replica e reaches our replica e modulo ours, and ours reaches theirs modulo theirs.
  std::vector<int> recv_from, send_to;
  for (int e = 0; e < theirs.dp; ++e) {
    if (summed_over_replicas) {
      if (e == me.replica % theirs.dp) recv_from.push_back(e);
      if (e % mine.dp == me.replica) send_to.push_back(e);
    } else {
      if (e % mine.dp == me.replica) recv_from.push_back(e);
      if (e == me.replica % theirs.dp) send_to.push_back(e);
    }
  }
  // Within a replica, the TP ranks whose vocabulary rows overlap ours.
  const auto overlaps = [&](const std::vector<int>& replicas, std::vector<TiedRows>& list) {
    for (int e : replicas) {
      for (int t = 0; t < theirs.tp; ++t) {
        const RowShard r = vocab_shard(vocab, t, theirs.tp);
        const int64_t lo = std::max(rows.first, r.first), hi = std::min(rows.first + rows.count, r.first + r.count);
        if (lo < hi) list.push_back({layout.rank_of(other, e, t), lo, hi - lo});
      }
    }
  };
  overlaps(send_to, out.send);
  overlaps(recv_from, out.recv);
  return out;
}

StageRunner::StageRunner(const GptConfig& config, Device& device, GptRange range, const StageLayout& layout,
                         StageComms& comms, int rows, int T, RunnerOptions options, ActivationPolicy policy, int chunk)
    : config_(config),
      device_(device),
      range_(range),
      layout_(layout),
      place_(layout.place(comms.all.rank())),
      virtual_stage_(chunk * layout.num_stages() + place_.stage),
      comms_(comms),
      all_(comms.all),
      dp_(comms.dp),
      tp_(comms.tp),
      rows_(rows),
      T_(T),
      options_(options),
      first_(virtual_stage_ == 0),
      last_(virtual_stage_ == layout.num_virtual_stages() - 1) {
  const int stage = place_.stage, P = layout.num_stages();
  if (layout.chunks < 1 || chunk < 0 || chunk >= layout.chunks || (layout.chunks > 1 && P < 2)) {
    throw Error(ErrorCode::kInvalidArgument, cat("pipeline: chunk ", chunk, " of ", layout.chunks, " on ", P,
                                                 " stages; interleaving needs at least two stages"));
  }
  if (range.embedding != first_ || range.head != last_) {
    throw Error(ErrorCode::kInvalidArgument,
                cat("pipeline stage ", virtual_stage_, " of ", layout.num_virtual_stages(),
                    ": only the first stage holds the embedding and only the last the head"));
  }
  for (int s = 0; s < layout.num_stages(); ++s) check_rows(layout.stages[static_cast<size_t>(s)], s, rows);
  B_ = layout.stages[static_cast<size_t>(stage)].rows_of(place_.replica, rows);
  first_row_ = layout.stages[static_cast<size_t>(stage)].first_row(place_.replica, rows);
  const int me = comms.all.rank();
  const int64_t row_elements = int64_t{T} * config.n_embd;
  auto mine = [&](int from, int to, bool sending) {
    std::vector<Transfer> out;
    for (const Transfer& t : boundary_transfers(layout, rows, row_elements, from, to)) {
      if ((sending ? t.from : t.to) == me) out.push_back(t);
    }
    return out;
  };
  // Neighbouring virtual stages are on neighbouring stages (the last stage's chunk feeds the first's next one).
  const int prev = (stage + P - 1) % P, next = (stage + 1) % P;
  if (!first_) {
    from_prev_ = mine(prev, stage, false);
    to_prev_ = mine(stage, prev, true);
  }
  if (!last_) {
    to_next_ = mine(stage, next, true);
    from_next_ = mine(next, stage, false);
  }
  if (first_ || last_) tied_ = tied_exchange(layout, config.vocab_size, me, !options_.zero1);
  try {
    allocate(policy);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kOutOfMemory) throw;
    throw Error(ErrorCode::kOutOfMemory,
                cat("pipeline stage ", stage, layout.chunks > 1 ? cat(" (virtual stage ", virtual_stage_, ")") : "",
                    " (rank ", me, ", replica ", place_.replica, ", TP rank ", place_.t, "): ", e.what()));
  }
}

// Every device allocation of the stage, once (model/costs.h's stage_memory counts the same).
void StageRunner::allocate(ActivationPolicy policy) {
  const StageShape shape = layout_.stages[static_cast<size_t>(place_.stage)];
  TensorParallel tp{place_.t, shape.tp, [this](const Tensor& x) { tp_.all_reduce(x, ReduceOp::kSum); },
                    [this](const Tensor& x) { tp_.all_reduce(x, ReduceOp::kMax); }};
  model_ = std::make_unique<Gpt>(config_, device_, range_, B_, T_, std::move(tp), policy);
  allocated_ = model_->allocated();
  size_t used = device_.mem_used_bytes();
  const auto measured = [&] {
    const size_t now = device_.mem_used_bytes();
    const double delta = static_cast<double>(now - used);
    used = now;
    return delta;
  };
  const int64_t n = model_->num_params();
  const int64_t shard = options_.zero1 ? (n + shape.dp - 1) / shape.dp : n;
  optimizer_ = OptimizerState{device_.zeros(DType::kF32, {shard}), device_.zeros(DType::kF32, {shard})};
  allocated_.optimizer += measured();  // beside the model's f32 master copy in bf16
  slot_holds_.assign(static_cast<size_t>(policy.slots), -1);
  const Shape act{B_, T_, config_.n_embd};
  for (int i = 0; i < policy.slots; ++i) {
    if (first_) tokens_.push_back(device_.empty(DType::kI32, {B_, T_}));
    if (!first_) stash_.push_back(device_.empty(DType::kF32, act));
  }
  allocated_.inputs = measured() / policy.slots;
  norm_acc_ = device_.zeros(DType::kF32, {1});
  if (last_) targets_ = device_.empty(DType::kI32, {B_, T_});
  if (!last_) dout_ = device_.empty(DType::kF32, act);
  if (!first_) {
    for (int i = 0; i < kGradientBuffers; ++i) gout_.push_back(device_.empty(DType::kF32, act));
  }
  allocated_.comm += measured();
}

int StageRunner::slot_of(int m) {
  for (size_t i = 0; i < slot_holds_.size(); ++i) {
    if (slot_holds_[i] == m) return static_cast<int>(i);
  }
  for (size_t i = 0; i < slot_holds_.size(); ++i) {
    if (slot_holds_[i] < 0) {
      wait_sends(static_cast<int>(i));  // its last activation must have left before it is rewritten
      slot_holds_[i] = m;
      return static_cast<int>(i);
    }
  }
  throw Error(ErrorCode::kInvalidArgument,
              cat("pipeline stage ", virtual_stage_, ": the schedule keeps more than ", slot_holds_.size(),
                  " micro-batches in flight, the activation slots this stage was built with"));
}

// The loss is each replica's mean over its rows: weighted by its share, the sums are of the mean over every row.
float StageRunner::loss_scale() const {
  return static_cast<float>(B_) / static_cast<float>(int64_t{micro_batches_} * rows_);
}

void StageRunner::forward(int m, const Batch& batch) {
  const int slot = slot_of(m);
  model_->use_slot(slot);
  if (first_ || last_) {
    std::vector<int32_t> tokens, targets;
    batch(m, first_row_, B_, tokens, targets);
    if (first_) copy_from_host(tokens_[static_cast<size_t>(slot)], tokens.data());
    if (last_) copy_from_host(targets_, targets.data());
  }
  model_->forward(first_ ? tokens_[static_cast<size_t>(slot)] : stash_[static_cast<size_t>(slot)]);
}

void StageRunner::backward(int m) {
  const int slot = slot_of(m);
  model_->use_slot(slot);
  if (last_) {
    model_->backward();
  } else {
    model_->backward(dout_);
  }
  if (!first_) {
    // The input gradient goes out from one of the gradient buffers in turn, once its previous send has left.
    const int buffer = gout_next_++ % kGradientBuffers;
    wait_sends(kSlotOwners + buffer);
    copy(gout_[static_cast<size_t>(buffer)], model_->dinput());
    gout_of_[static_cast<size_t>(m)] = buffer;
  }
  // A whole backward consumed the activations; a split one's W still reads them.
  if (!model_->weights_pending()) slot_holds_[static_cast<size_t>(slot)] = -1;
}

void StageRunner::weight(int m) {
  const auto held = std::find(slot_holds_.begin(), slot_holds_.end(), m);
  if (held == slot_holds_.end() || model_->policy().pending_weights == 0) {
    throw Error(ErrorCode::kInvalidArgument,
                cat("pipeline stage ", virtual_stage_, ": ", virtual_stage_, "W", m, " without its split backward (",
                    model_->policy().pending_weights == 0
                        ? "this stage was built with whole backwards: ActivationPolicy::pending_weights 0"
                        : "no B of that micro-batch before it",
                    ")"));
  }
  model_->use_slot(static_cast<int>(held - slot_holds_.begin()));
  model_->backward_weights();
  *held = -1;  // now its activations are free
}

// A piece's elements within this replica's part of the micro-batch.
Tensor StageRunner::piece_of(const Tensor& t, const Transfer& piece) const {
  const int64_t lo = piece.first - int64_t{first_row_} * T_ * config_.n_embd;
  return t.reshape({t.numel()}).slice(lo, lo + piece.count);
}

void StageRunner::send(const std::vector<Transfer>& pieces, const Tensor& t, uint32_t tag, int owner) {
  for (const Transfer& p : pieces) {
    sends_.push_back({owner, p.to, all_.isend(piece_of(t, p), p.to, tag)});
    p2p_bytes_sent_ += p.count * static_cast<int64_t>(dtype_size(t.dtype()));
  }
}

void StageRunner::wait_sends(int owner) {
  for (PendingSend& s : sends_) {
    if ((owner < 0 || s.owner == owner) && s.request) {
      comms_.all.wait_request(*s.request, "pipeline send", s.peer);
      s.request.reset();
    }
  }
  std::erase_if(sends_, [](const PendingSend& s) { return !s.request; });
}

void StageRunner::receive(const std::vector<Transfer>& pieces, const Tensor& t, uint32_t tag) {
  for (const Transfer& p : pieces) all_.recv(piece_of(t, p), p.from, tag);
  if (comms_.tp.size() > 1) {  // the replica's TP ranks each received a chunk: put the whole together
    const int64_t chunk = t.numel() / comms_.tp.size();
    tp_.all_gather(t, t.reshape({t.numel()}).slice(place_.t * chunk, (place_.t + 1) * chunk));
  }
}

uint32_t StageRunner::tag(int boundary, int m, bool gradient) const {
  return static_cast<uint32_t>(2 * (int64_t{boundary} * micro_batches_ + m) + (gradient ? 1 : 0));
}

void StageRunner::begin_step(int micro_batches) {
  const int64_t tags = 2 * int64_t{layout_.num_virtual_stages()} * micro_batches;
  if (tags >= Communicator::kMaxUserTag - 1) {
    throw Error(ErrorCode::kInvalidArgument,
                cat("pipeline: ", layout_.num_virtual_stages(), " virtual stages x ", micro_batches,
                    " micro-batches need more message tags than the ", Communicator::kMaxUserTag - 1,
                    " a communicator has; use fewer micro-batches (a larger micro-batch)"));
  }
  micro_batches_ = micro_batches;
  gout_of_.assign(static_cast<size_t>(micro_batches_), -1);
  loss_sum_ = 0;
  std::fill(slot_holds_.begin(), slot_holds_.end(), -1);
}

void StageRunner::run(const Action& a, const Batch& batch) {
  const int m = a.micro_batch, vs = virtual_stage_;
  switch (a.type) {
    case ActionType::kRecvF:
      receive(from_prev_, stash_[static_cast<size_t>(slot_of(m))], tag(vs, m, false));
      break;
    case ActionType::kForward:
      forward(m, batch);
      if (last_) loss_sum_ += model_->loss(targets_, loss_scale());
      break;
    case ActionType::kSendF:  // straight from the model's output, which its slot keeps until its backward
      model_->use_slot(slot_of(m));
      send(to_next_, model_->output(), tag(vs + 1, m, false), slot_of(m));
      break;
    case ActionType::kRecvB:
      receive(from_next_, dout_, tag(vs + 1, m, true));
      break;
    case ActionType::kBackward:
      backward(m);
      break;
    case ActionType::kSendB:
      send(to_prev_, gout_[static_cast<size_t>(gout_of_[static_cast<size_t>(m)])], tag(vs, m, true),
           kSlotOwners + gout_of_[static_cast<size_t>(m)]);
      break;
    case ActionType::kWeight:
      weight(m);
      break;
    case ActionType::kReduceGrad:
    case ActionType::kOptim:
      H2_CHECK(false) << a.str() << " is the rank's, not a chunk's";
  }
}

float StageRunner::step(const Schedule& schedule, const Batch& batch, const AdamwParams& hp) {
  StageRunner* self = this;
  return step(std::span<StageRunner* const>(&self, 1), schedule, batch, hp);
}

namespace {

// The rank's chunk that runs virtual stage `stage`, or an error naming the action.
StageRunner& chunk_of(std::span<StageRunner* const> chunks, const Action& a) {
  for (StageRunner* c : chunks) {
    if (c->virtual_stage() == a.stage) return *c;
  }
  throw Error(ErrorCode::kInvalidArgument, cat("pipeline: action ", a.str(), " is for a stage this rank does not run"));
}

}  // namespace

float StageRunner::step(std::span<StageRunner* const> chunks, const Schedule& schedule, const Batch& batch,
                        const AdamwParams& hp) {
  StageRunner& head = *chunks.front();
  const StageLayout& layout = head.layout_;
  const int rank_stage = head.place_.stage;
  if (static_cast<int>(chunks.size()) != layout.chunks || schedule.ranks != layout.num_stages() ||
      schedule.stages != layout.num_virtual_stages()) {
    throw Error(ErrorCode::kInvalidArgument, cat("pipeline: the schedule has ", schedule.stages, " stages on ",
                                                 schedule.ranks, " ranks; this pipeline has ", layout.num_stages(),
                                                 " stages of ", layout.chunks, " chunks, this rank ", chunks.size()));
  }
  int optims = 0, reductions = 0;
  for (const Action& a : schedule.actions[static_cast<size_t>(rank_stage)]) {
    optims += a.type == ActionType::kOptim;
    reductions += a.type == ActionType::kReduceGrad;
  }
  for (StageRunner* c : chunks) {
    c->begin_step(schedule.micro_batches);
    c->model_->zero_grads();
  }
  double norm_sq = 0;  // the rank's chunks' squared norms, summed as their OPTIM actions come
  for (const Action& a : schedule.actions[static_cast<size_t>(rank_stage)]) {
    StageRunner& c = chunk_of(chunks, a);
    const double t0 = c.on_action ? monotonic_seconds() : 0;
    if (a.type == ActionType::kReduceGrad) {
      // At the rank's last REDUCE_GRAD, once every chunk's sends have left: a chunk's reductions earlier (an
      // interleaved rank's first chunks finish their backwards before its last) would wait for ranks that still
      // wait for this one's later sends. Each chunk sums over its replicas, then the ends exchange the tied
      // embedding's rows.
      if (--reductions == 0) {
        for (StageRunner* u : chunks) u->wait_sends(-1);
        for (StageRunner* u : chunks) u->reduce_gradients();
        for (StageRunner* u : chunks) u->reduce_tied_embedding();
      }
    } else if (a.type != ActionType::kOptim) {
      c.run(a, batch);
    } else {
      norm_sq += c.local_norm_squared();
      if (--optims == 0) {  // the rank's last OPTIM: one reduction over the ranks, then every chunk's update
        float total = static_cast<float>(norm_sq);
        head.comms_.all.all_reduce(&total, 1, DType::kF32, ReduceOp::kSum);
        const double norm = std::sqrt(static_cast<double>(total));
        for (StageRunner* u : chunks) u->update(hp, norm);
      }
    }
    if (c.on_action) {
      c.device_.synchronize();
      c.on_action(a, t0, monotonic_seconds());
    }
  }
  double loss_sum = 0;
  for (StageRunner* c : chunks) {
    c->wait_sends(-1);
    loss_sum += c->loss_sum_;
  }
  return chunks.back()->share_loss(loss_sum, schedule.micro_batches);
}

// The mean over micro-batches on the last stage, its replicas' means weighted by their rows, then sent to every rank.
float StageRunner::share_loss(double loss_sum, int micro_batches) {
  float loss = static_cast<float>(loss_sum / micro_batches * B_ / rows_);
  if (last_) comms_.dp.all_reduce(&loss, 1, DType::kF32, ReduceOp::kSum);
  comms_.all.broadcast(&loss, 1, DType::kF32, layout_.first_rank(layout_.num_stages() - 1));
  return loss;
}

void StageRunner::evaluate_forward(int m, const Batch& batch) {
  std::fill(slot_holds_.begin(), slot_holds_.end(), -1);
  if (!first_) receive(from_prev_, stash_[static_cast<size_t>(slot_of(m))], tag(virtual_stage_, m, false));
  forward(m, batch);
  if (last_) {
    loss_sum_ += model_->loss(targets_, 0.0f);  // no gradient wanted
  } else {
    for (const Transfer& p : to_next_)
      all_.send(piece_of(model_->output(), p), p.to, tag(virtual_stage_ + 1, m, false));
  }
  std::fill(slot_holds_.begin(), slot_holds_.end(), -1);
}

float StageRunner::evaluate(int micro_batches, const Batch& batch) {
  StageRunner* self = this;
  return evaluate(std::span<StageRunner* const>(&self, 1), micro_batches, batch);
}

// Micro-batch by micro-batch, each through the rank's chunks in order (a chain no two ranks wait on crosswise).
float StageRunner::evaluate(std::span<StageRunner* const> chunks, int micro_batches, const Batch& batch) {
  for (StageRunner* c : chunks) c->begin_step(micro_batches);
  for (int m = 0; m < micro_batches; ++m) {
    for (StageRunner* c : chunks) c->evaluate_forward(m, batch);
  }
  double loss_sum = 0;
  for (StageRunner* c : chunks) loss_sum += c->loss_sum_;
  return chunks.back()->share_loss(loss_sum, micro_batches);
}

// Called once the rank's pipeline sends have left (step): a collective may wait on the rendezvous store (a shared
// window) without progressing the transport, while the peer waits for a send of ours that needs that progress.
void StageRunner::reduce_gradients() {
  // Without ZeRO-1 the replicas sum first (a stage need not wait for the other end of the pipeline for that),
  // then the ends exchange their sums of the tied embedding's rows (reduce_tied_embedding). With ZeRO-1 the
  // replicas' reduce-scatter comes in OPTIM, so the ends exchange each replica's own gradient.
  if (!options_.zero1 && comms_.dp.size() > 1) dp_.all_reduce(model_->flat_grads(), ReduceOp::kSum);
}

// Each rank sends its rows of wte's gradient to the other end's ranks that hold them (tied_exchange) and adds
// what it receives (or, the ends alike, sums them with its counterpart in an all-reduce). Through host memory, all
// sends and receives posted before any wait: no device memory beyond the stage's own, and no order in which two ranks
// wait for each other.
void StageRunner::reduce_tied_embedding() {
  if (tied_.send.empty() && tied_.recv.empty()) return;
  Gpt::Param* wte = nullptr;
  for (Gpt::Param& p : model_->params()) {
    if (p.name == "wte.weight") wte = &p;
  }
  H2_CHECK(wte != nullptr) << "an end of the pipeline without the tied embedding";
  // The ends alike (same DP and TP): each rank and its counterpart hold the same rows and sum them in one
  // all-reduce (on one host, through shared memory), rather than point-to-point messages through host copies.
  if (comms_.tied.size() == 2) {
    TensorComm(comms_.tied).all_reduce(wte->grad, ReduceOp::kSum);
    return;
  }
  const int64_t C = config_.n_embd, first = model_->vocab().first;
  // The ends' DP alike, their TP not: each row has one holder at each end, so all-reducing the whole vocabulary's
  // rows (zeros but this rank's own) over the replica's ranks at both ends sums every row's two gradients — on the
  // host, piece by piece (options_.tied_piece_floats), in a buffer kept from step to step. Measured on the built-in
  // cluster (a slow TP-1 end, a fast TP-2 end, bf16; the trace of examples/layout_local.yaml's plan): 0.53 s a step
  // range by range over `all` below (point-to-point messages of 26 MB through this host's UCX), 21-25 ms so in one
  // piece on the night that was measured; 31-36 ms in the bench's rounds of 2026-12-06 (docs/pipeline.md, "Layouts
  // written by hand"), where one run in pieces of 16 MiB took 30.5 ms beside 31.5 ms in one piece.
  if (comms_.tied.size() > 2) {
    const int64_t total = config_.vocab_size * C, own_first = first * C, own_end = own_first + wte->grad.numel();
    const int64_t piece = std::min(total, std::max<int64_t>(1, options_.tied_piece_floats));
    const Tensor own = wte->grad.reshape({wte->grad.numel()});
    tied_rows_.resize(static_cast<size_t>(piece));
    for (int64_t at = 0; at < total; at += piece) {
      // This piece's floats [at, at + n); this rank's rows in it, [lo, hi).
      const int64_t n = std::min(piece, total - at), lo = std::max(at, own_first), hi = std::min(at + n, own_end);
      std::fill_n(tied_rows_.begin(), n, 0.0f);
      const Tensor mine = lo < hi ? own.slice(lo - own_first, hi - own_first) : Tensor();
      if (mine.defined()) copy_to_host(tied_rows_.data() + (lo - at), mine);
      comms_.tied.all_reduce(tied_rows_.data(), static_cast<size_t>(n), DType::kF32, ReduceOp::kSum);
      if (mine.defined()) copy_from_host(mine, tied_rows_.data() + (lo - at));
    }
    return;
  }
  std::vector<float> own(static_cast<size_t>(wte->grad.numel()));
  copy_to_host(own.data(), wte->grad);
  std::vector<std::vector<float>> received;
  std::vector<std::pair<int, std::unique_ptr<Request>>> requests;
  const uint32_t tag = Communicator::kMaxUserTag - 1;
  for (const TiedRows& r : tied_.recv) {
    received.emplace_back(static_cast<size_t>(r.count * C));
    requests.emplace_back(r.peer, comms_.all.irecv(received.back().data(), received.back().size() * 4, r.peer, tag));
  }
  const std::vector<float> snapshot = own;  // what is sent is this rank's gradient before it adds the others'
  for (const TiedRows& r : tied_.send) {
    requests.emplace_back(r.peer, comms_.all.isend(snapshot.data() + (r.first - first) * C,
                                                   static_cast<size_t>(r.count * C) * 4, r.peer, tag));
  }
  for (auto& [peer, request] : requests) comms_.all.wait_request(*request, "tied embedding", peer);
  for (size_t i = 0; i < tied_.recv.size(); ++i) {
    float* rows = own.data() + (tied_.recv[i].first - first) * C;
    for (size_t j = 0; j < received[i].size(); ++j) rows[j] += received[i][j];
  }
  copy_from_host(wte->grad, own.data());
}

double StageRunner::local_norm_squared() {
  // Each tensor once in the norm: the last stage's copy of the tied embedding is the first stage's, tensors that
  // tensor parallelism replicates count on TP rank 0 only, and without ZeRO-1 (every replica holds the same
  // sums) replica 0 counts for its stage.
  OptimizerStepOptions& o = optimizer_options_;
  o = OptimizerStepOptions{.max_norm = options_.grad_clip};
  o.counted = [this](const Gpt::Param& p) {
    return (options_.zero1 || place_.replica == 0) && !(last_ && !first_ && p.name == "wte.weight") &&
           (p.split != TpSplit::kNone || place_.t == 0);
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
  return h2::local_norm_squared(*model_, norm_acc_, o);
}

void StageRunner::update(const AdamwParams& hp, double norm) {
  const OptimizerStepOptions& o = optimizer_options_;
  try {
    clip_and_update(*model_, optimizer_, hp, norm, o);
  } catch (const Error& e) {
    throw Error(e.code(), cat("pipeline stage ", virtual_stage_, ": ", e.what()));
  }
  grad_norm_ = norm;
  if (!options_.zero1) return model_->refresh_bf16_weights();
  // Every replica takes the others' updated shards.
  const size_t s = static_cast<size_t>(optimizer_.m.numel());
  std::vector<float> mine(s, 0.0f), all(s * static_cast<size_t>(comms_.dp.size()));
  if (o.hi > o.lo) copy_to_host(mine.data(), model_->flat_params().slice(o.lo, o.hi));
  comms_.dp.all_gather(all.data(), mine.data(), s, DType::kF32);
  copy_from_host(model_->flat_params(), all.data());
  model_->parameters_changed();
  model_->refresh_bf16_weights();
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
