// HeteroPP's runtime (docs/architecture.md, "pipeline"): one rank's stage of a pipelined, data-parallel GPT and the
// interpreter of its action list (schedule/schedule.h).
//
// Ranks: stage s has dp_s replicas of tp_s tensor-parallel ranks each (StageLayout); stages may differ in both.
// A micro-batch is `rows` sequences; replica d of stage s holds rows [d rows/dp_s, (d+1) rows/dp_s), and every
// TP rank of a replica holds all of its rows. At a stage boundary each receiving rank gets, from every replica
// of the other stage whose rows overlap its own, that overlap - sent by the TP rank whose index is its own
// modulo the sender's TP degree - so activations (forward) and their gradients (backward) are resharded when
// neighbouring stages differ in DP or TP (tags encode direction and micro-batch).
// REDUCE_GRAD sums the stage's gradients over its replicas (all-reduce, or with ZeRO-1 a reduce-scatter whose
// shard the rank updates and all-gathers back) after summing the tied token-embedding gradient between the first
// and the last stage; OPTIM takes the global gradient norm over every rank, counting replicated tensors once,
// clips, and runs AdamW - the same step as single-device training. The loss gradient is scaled by
// 1 / (micro-batches x the last stage's replicas), so these sums are the gradient of the mean loss.
//
// Activation memory: the model holds one micro-batch's activations (or k with keep_activations(k)). A stage
// stashes each in-flight micro-batch's input (rows x T x C) and, when a backward comes for a micro-batch whose
// activations it no longer holds, recomputes that forward first (Chen et al. 2016) - exact, since forward is
// deterministic. 1F1B's last stage runs each backward right after its forward and never recomputes; a stage
// keeping as many micro-batches as 1F1B has in flight there never does either.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "comm/tensor_comm.h"
#include "model/gpt.h"
#include "ops/kernels.h"
#include "schedule/schedule.h"
#include "train/checkpoint.h"

namespace h2 {

struct StageShape {
  int dp = 1;  // replicas
  int tp = 1;  // tensor-parallel ranks per replica
};

struct StageLayout {
  std::vector<StageShape> stages;

  static StageLayout uniform(int stages, int dp, int tp = 1);
  int num_stages() const { return static_cast<int>(stages.size()); }
  int world_size() const;
  // World ranks are stage-major, then replica, then TP rank: a replica's TP ranks are neighbours.
  int first_rank(int stage) const;
  int rank_of(int stage, int replica, int t) const;
  struct Place {
    int stage = 0, replica = 0, t = 0;
  };
  Place place(int rank) const;
};

// One piece of a micro-batch's activations (or their gradient) crossing a stage boundary.
struct Transfer {
  int from = 0, to = 0;         // world ranks
  int first_row = 0, rows = 0;  // of the micro-batch
};
// Every piece going from stage `from` to stage `to` (neighbours) for a micro-batch of `rows` sequences.
std::vector<Transfer> boundary_transfers(const StageLayout& layout, int rows, int from, int to);

// The communicators a stage needs, split from the world (a collective over every rank of the layout).
struct StageComms {
  Communicator all;   // every rank (a copy of the world): pipeline sends, the norm, the loss
  Communicator dp;    // this stage's replicas with this TP rank, rank = replica
  Communicator tp;    // this replica's TP ranks, rank = TP rank
  Communicator tied;  // ranks of the first and last stage that sum the tied embedding's gradient (or just this one)
  static StageComms split(Communicator& world, const StageLayout& layout);
};

struct OptimOptions {
  double grad_clip = 1.0;
  bool zero1 = false;  // shard the optimizer state over the stage's replicas
};

class StageRunner {
 public:
  // Called with the micro-batch and the rows (of its `rows`) whose tokens this rank needs.
  using Batch = std::function<void(int micro_batch, int first_row, int rows, std::vector<int32_t>& tokens,
                                   std::vector<int32_t>& targets)>;

  // This rank's stage of `layout` (its place follows from comms.all's rank), for micro-batches of `rows`
  // sequences of length T; every stage's dp must divide rows.
  StageRunner(const GptConfig& config, Device& device, GptRange range, const StageLayout& layout, StageComms& comms,
              int rows, int T, OptimOptions options);
  Gpt& model() { return *model_; }
  const StageLayout::Place& place() const { return place_; }
  // Keep the activations of up to `micro_batches` micro-batches (micro-batch m in slot m mod that) instead of
  // one: a backward then recomputes only when its slot was reused (the plan's "no recomputation" with that many
  // in flight), at that many times the activation memory.
  void keep_activations(int micro_batches);
  int64_t recomputations() const { return recomputed_; }  // forwards run again for a backward, so far

  // Runs one training step: this rank's actions of `schedule` (lowered, with gradient reduction). Returns the
  // step's mean loss, known on every rank (broadcast from the last stage).
  float step(const Schedule& schedule, const Batch& batch, const AdamwParams& hp);
  // Held-out evaluation: `micro_batches` micro-batches forward only, one after another through the pipeline.
  // Returns their mean loss, known on every rank; parameters and gradients are left alone.
  float evaluate(int micro_batches, const Batch& batch);
  // Called after each action with its start and end (seconds, steady clock): for the measured trace.
  std::function<void(const Action&, double, double)> on_action;
  double last_grad_norm() const { return grad_norm_; }

  // The AdamW moments laid out like the flat parameters (with ZeRO-1 gathered from the stage's replicas: a
  // collective over them), and back (each replica takes its shard).
  void optimizer_state(std::vector<float>& m, std::vector<float>& v);
  void set_optimizer_state(const std::vector<float>& m, const std::vector<float>& v);

 private:
  void forward(int m, const Batch& batch);
  void backward(int m, const Batch& batch);
  void reduce_gradients();
  void optimize(AdamwParams hp);
  void load_input(int m, const Batch& batch);
  void ensure_buffers(int micro_batches);
  float share_loss(double loss_sum, int micro_batches);
  float loss_scale() const;
  size_t slot_of(int m) const { return static_cast<size_t>(m) % holds_.size(); }  // its activation slot
  Tensor rows_of(const Tensor& t, const Transfer& piece) const;
  void send(const std::vector<Transfer>& pieces, const Tensor& t, uint32_t tag);
  void receive(const std::vector<Transfer>& pieces, const Tensor& t, uint32_t tag);

  GptConfig config_;
  Device& device_;
  GptRange range_;
  StageLayout layout_;
  StageLayout::Place place_;
  StageComms& comms_;
  TensorComm all_, dp_, tp_, tied_;
  int rows_, B_, T_;  // the micro-batch's rows, and this replica's share of them
  OptimOptions options_;
  std::unique_ptr<Gpt> model_;
  OptimizerState optimizer_;
  bool first_, last_;
  int micro_batches_ = 0;
  std::vector<int> holds_{-1};  // per activation slot: the micro-batch whose activations it holds, or -1
  int64_t recomputed_ = 0;
  std::vector<Transfer> from_prev_, to_next_, from_next_, to_prev_;  // this rank's pieces at its boundaries
  std::vector<Tensor> stash_;       // per micro-batch: the stage's input activations (not on the first stage)
  std::vector<Tensor> out_, gout_;  // per micro-batch: activations and input gradients being sent
  std::vector<Tensor> tokens_;  // the first stage's tokens, per activation slot (the embedding's backward reads them)
  Tensor targets_, dout_, norm_acc_;
  std::vector<std::pair<int, std::unique_ptr<Request>>> sends_;  // (rank, request) in flight this step
  double loss_sum_ = 0, grad_norm_ = 0;
};

}  // namespace h2
