// HeteroPP's runtime (docs/architecture.md, "pipeline"): one rank's stage of a pipelined, data-parallel GPT and the
// interpreter of its action list (schedule/schedule.h).
//
// Ranks: stage s has dp_s replicas of tp_s tensor-parallel ranks each (StageLayout); stages may differ in both.
// A micro-batch is `rows` sequences; replica d of stage s holds its consecutive share of them (rows/dp_s each, or
// the uneven shares StageShape::rows gives replicas on chips of different speed), and every TP rank of a replica
// holds all of its rows. At a stage boundary each receiving rank gets, from every replica
// of the other stage whose rows overlap its own, that overlap - sent by the TP rank whose index is its own
// modulo the sender's TP degree - so activations (forward) and their gradients (backward) are resharded when
// neighbouring stages differ in DP or TP (tags encode direction and micro-batch).
// REDUCE_GRAD sums the stage's gradients over its replicas (all-reduce; with ZeRO-1 that is a reduce-scatter in
// OPTIM, whose shard the rank updates and all-gathers back) and the tied token embedding's gradient between the
// first and the last stage, row range by row range of their vocabulary-parallel shards; OPTIM takes the global
// gradient norm over every rank, counting replicated tensors once, clips, and runs AdamW - the same step as
// single-device training (train/optimizer.h). The loss gradient is scaled by 1 / (micro-batches x the last
// stage's replicas; with uneven shares, a replica's by its share of the rows), so these sums are the gradient of
// the mean loss over every sequence.
//
// Memory (model/costs.h's stage_memory counts exactly these device allocations): the model (parameters,
// gradients, activations of the micro-batches in flight by the stage's recomputation policy, gradient scratch);
// per micro-batch in flight its input (stash, not on the first stage) and tokens (first stage); one buffer for
// the received output gradient (not on the last stage), two for input gradients being sent (not on the first
// stage), the targets (last stage) and the AdamW moments (the stage's shard under ZeRO-1). Activations are sent
// straight from the model's output, which stays in its slot until that micro-batch's backward. The number of
// slots is the most micro-batches the stage's schedule keeps in flight (max_in_flight). A schedule that splits the
// stage's backward into B and W (zb-h1) needs the model built with pending_weights = max_pending_weights: each B
// keeps what its W reads, and the W frees the micro-batch's slot.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "comm/communicator.h"
#include "comm/tensor_comm.h"
#include "model/gpt.h"
#include "ops/kernels.h"
#include "schedule/schedule.h"
#include "train/checkpoint.h"
#include "train/optimizer.h"

namespace h2 {

struct StageShape {
  int dp = 1;  // replicas
  int tp = 1;  // tensor-parallel ranks per replica
  // Per replica, its sequences of a micro-batch (replicas on chips of different speed take uneven shares; they
  // add up to the micro-batch); empty: an equal share each.
  std::vector<int> rows;

  int rows_of(int replica, int micro_batch_rows) const;
  int first_row(int replica, int micro_batch_rows) const;  // replicas hold consecutive rows, in order
};

struct StageLayout {
  std::vector<StageShape> stages;
  // Virtual stages per stage (interleaved 1F1B, Narayanan et al. 2021): stage s's ranks also run virtual stages
  // s + P, s + 2P, ... (P stages), each a chunk of the model; the model's order runs through the virtual stages.
  int chunks = 1;

  static StageLayout uniform(int stages, int dp, int tp = 1);
  int num_stages() const { return static_cast<int>(stages.size()); }
  int num_virtual_stages() const { return num_stages() * chunks; }
  int world_size() const;
  // World ranks are stage-major, then replica, then TP rank: a replica's TP ranks are neighbours.
  int first_rank(int stage) const;
  int rank_of(int stage, int replica, int t) const;
  struct Place {
    int stage = 0, replica = 0, t = 0;
  };
  Place place(int rank) const;
};

// One piece of a micro-batch's activations (or their gradient) crossing a stage boundary: elements of the whole
// micro-batch's (rows, T, C) tensor, flattened.
struct Transfer {
  int from = 0, to = 0;          // world ranks
  int64_t first = 0, count = 0;  // elements of the micro-batch
};
// Every piece going from stage `from` to stage `to` (neighbours, or the last and the first when interleaved) for a
// micro-batch of `rows` sequences of `row_elements` (T x C) each. Partitioned (Megatron-LM's scatter-gather): each
// receiving TP rank gets its 1/tp of its replica's rows, from the sending replicas that hold them, sent by the TP rank
// whose index is its own modulo the sender's TP (in tp_from / tp_to pieces from as many sending ranks when those are
// more); the receiving TP group then all-gathers the whole. Each sending TP rank so sends 1 / max(tp_from, tp_to) of
// what crosses (ceil(tp_to / tp_from) / tp_to when TP degrees do not divide), not all of it.
std::vector<Transfer> boundary_transfers(const StageLayout& layout, int rows, int64_t row_elements, int from, int to);

// The communicators a stage needs, split from the world (a collective over every rank of the layout).
struct StageComms {
  Communicator all;  // every rank (a copy of the world): pipeline sends, the tied embedding's rows, norm, loss
  Communicator dp;   // this stage's replicas with this TP rank, rank = replica
  Communicator tp;   // this replica's TP ranks, rank = TP rank
  // When the first and the last stage have the same DP and TP: this rank and its counterpart at the other end
  // (same replica and TP rank, so the same vocabulary rows), whose tied embedding gradients one all-reduce sums;
  // the same DP but not TP: this replica's ranks at both ends (one all-reduce of the whole vocabulary's rows);
  // otherwise this rank alone (the rows are exchanged range by range over `all`).
  Communicator tied;
  static StageComms split(Communicator& world, const StageLayout& layout);
};

// The tied embedding between the first and the last stage: the rows of `wte`'s gradient a rank sends to and
// receives from ranks of the other end (world ranks; rows of the whole vocabulary), so that each end's copy ends
// with the sum of both ends' gradients. `summed_over_replicas`: the stage's replicas have already summed their
// gradients (plain data parallelism), so each rank takes one replica of the other end's sum; otherwise (ZeRO-1:
// the replicas sum later) each replica's own gradient reaches exactly one replica of the other end.
struct TiedRows {
  int peer = 0;                  // world rank
  int64_t first = 0, count = 0;  // rows of the vocabulary
};
struct TiedExchange {
  std::vector<TiedRows> send, recv;
};
TiedExchange tied_exchange(const StageLayout& layout, int64_t vocab, int rank, bool summed_over_replicas);

// How a StageRunner's step reduces and applies its gradients.
struct RunnerOptions {
  double grad_clip = 1.0;
  bool zero1 = false;  // shard the optimizer state over the stage's replicas
  // The tied embedding's sum between ends of unlike TP goes through host memory in pieces of at most this many
  // floats of the vocabulary's rows (16 MiB), not in one buffer of them all (reduce_tied_embedding).
  int64_t tied_piece_floats = int64_t{1} << 22;
};

class StageRunner {
 public:
  // Called with the micro-batch and the rows (of its `rows`) whose tokens this rank needs.
  using Batch = std::function<void(int micro_batch, int first_row, int rows, std::vector<int32_t>& tokens,
                                   std::vector<int32_t>& targets)>;

  // This rank's stage of `layout` (its place follows from comms.all's rank) - with interleaving its chunk `chunk`,
  // virtual stage chunk x P + its stage, whose blocks `range` holds - for micro-batches of `rows` sequences of
  // length T; every stage's dp must divide rows, or its uneven shares add up to rows. `policy`: the recomputation
  // and the micro-batches in flight (the schedule's max_in_flight for this virtual stage). An allocation past the
  // device's memory is an Error(kOutOfMemory) naming the stage, the rank and the device's sizes. A rank's chunks
  // share its device and its communicators.
  StageRunner(const GptConfig& config, Device& device, GptRange range, const StageLayout& layout, StageComms& comms,
              int rows, int T, RunnerOptions options, ActivationPolicy policy = {}, int chunk = 0);
  Gpt& model() { return *model_; }
  const StageLayout::Place& place() const { return place_; }
  int virtual_stage() const { return virtual_stage_; }
  int64_t recomputations() const { return model_->recomputed_blocks(); }  // blocks recomputed in backward, so far
  int64_t p2p_bytes_sent() const { return p2p_bytes_sent_; }  // activations and gradients sent to neighbours, so far
  // Everything the stage allocated on its device, measured by the allocator in costs.h's terms.
  const StageMemory& allocated() const { return allocated_; }

  // Runs one training step: this rank's actions of `schedule` (lowered, with gradient reduction). Returns the
  // step's mean loss, known on every rank (broadcast from the last stage).
  float step(const Schedule& schedule, const Batch& batch, const AdamwParams& hp);
  // The same for a rank's chunks (chunks[c] runs chunk c; an interleaved schedule's actions name virtual stages):
  // their squared gradient norms are summed before the one reduction over the ranks, so every chunk clips by the
  // global norm.
  static float step(std::span<StageRunner* const> chunks, const Schedule& schedule, const Batch& batch,
                    const AdamwParams& hp);
  // Held-out evaluation: `micro_batches` micro-batches forward only, one after another through the pipeline.
  // Returns their mean loss, known on every rank; parameters and gradients are left alone.
  float evaluate(int micro_batches, const Batch& batch);
  static float evaluate(std::span<StageRunner* const> chunks, int micro_batches, const Batch& batch);
  // Called after each action with its start and end (seconds, steady clock): for the measured trace.
  std::function<void(const Action&, double, double)> on_action;
  double last_grad_norm() const { return grad_norm_; }

  // The AdamW moments laid out like the flat parameters (with ZeRO-1 gathered from the stage's replicas: a
  // collective over them), and back (each replica takes its shard).
  void optimizer_state(std::vector<float>& m, std::vector<float>& v);
  void set_optimizer_state(const std::vector<float>& m, const std::vector<float>& v);

 private:
  void allocate(ActivationPolicy policy);
  void begin_step(int micro_batches);
  void run(const Action& a, const Batch& batch);  // a compute, communication or REDUCE_GRAD action
  void forward(int m, const Batch& batch);
  void evaluate_forward(int m, const Batch& batch);
  void backward(int m);  // split (the policy's pending_weights > 0): the input gradients, the slot kept for W
  void weight(int m);    // a split backward's weight gradients; frees the slot
  void reduce_gradients();
  void reduce_tied_embedding();
  // OPTIM in two halves around the norm's reduction over the ranks: this chunk's share of the squared norm
  // (ZeRO-1: after the reduce-scatter), then clipping and AdamW by the global norm.
  double local_norm_squared();
  void update(const AdamwParams& hp, double norm);
  float share_loss(double loss_sum, int micro_batches);
  // Tags of a boundary's messages: the boundary (the higher virtual stage of the two), micro-batch, direction.
  uint32_t tag(int boundary, int m, bool gradient) const;
  float loss_scale() const;
  static constexpr int kGradientBuffers = 2;   // input gradients being sent, in turn
  static constexpr int kSlotOwners = 1 << 20;  // send owners: slots below, gradient buffers from here
  int slot_of(int m);  // micro-batch m's activation slot, taken from the free ones at its first use
  Tensor piece_of(const Tensor& t, const Transfer& piece) const;  // the piece within this replica's rows
  // Sends owned by `owner` (a slot, or kSlots + a gradient buffer) must complete before its buffer is rewritten.
  void send(const std::vector<Transfer>& pieces, const Tensor& t, uint32_t tag, int owner);
  void wait_sends(int owner);  // -1: all
  // Receives this rank's pieces, then its TP group all-gathers the replica's whole tensor.
  void receive(const std::vector<Transfer>& pieces, const Tensor& t, uint32_t tag);

  GptConfig config_;
  Device& device_;
  GptRange range_;
  StageLayout layout_;
  StageLayout::Place place_;
  int virtual_stage_ = 0;
  StageComms& comms_;
  TensorComm all_, dp_, tp_;
  int rows_, B_, T_;   // the micro-batch's rows, and this replica's share of them
  int first_row_ = 0;  // where its share starts
  RunnerOptions options_;
  std::unique_ptr<Gpt> model_;
  OptimizerState optimizer_;
  bool first_, last_;
  int micro_batches_ = 0;
  std::vector<int> slot_holds_;  // per activation slot: the micro-batch it holds, or -1
  std::vector<Transfer> from_prev_, to_next_, from_next_, to_prev_;  // this rank's pieces at its boundaries
  int64_t p2p_bytes_sent_ = 0;
  TiedExchange tied_;             // and its rows of the tied embedding
  std::vector<float> tied_rows_;  // a piece of the vocabulary's rows, when the ends' TP differ (reduce_tied_embedding)
  std::vector<Tensor> stash_;     // per slot: the stage's input activations (not on the first stage)
  std::vector<Tensor> tokens_;    // per slot: the first stage's tokens (the embedding's backward reads them)
  std::vector<Tensor> gout_;      // input gradients being sent, used in turn (not on the first stage)
  int gout_next_ = 0;
  std::vector<int> gout_of_;  // per micro-batch of the step: its gradient buffer
  Tensor targets_, dout_, norm_acc_;
  struct PendingSend {
    int owner, peer;
    std::unique_ptr<Request> request;
  };
  std::vector<PendingSend> sends_;  // in flight this step
  StageMemory allocated_;
  OptimizerStepOptions optimizer_options_;  // this step's, from local_norm_squared to update
  double loss_sum_ = 0, grad_norm_ = 0;
};

}  // namespace h2
