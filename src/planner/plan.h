// A training plan: what HeteroAuto returns and what the simulator and the trainer read. Plain data, saved as
// versioned JSON (plan.json) and loaded back.
#pragma once

#include <string>
#include <vector>

#include "model/costs.h"
#include "schedule/replay.h"

namespace h2 {

// 7: the weight gradients' part of each backward and what waits for it (weight_s, weight_pending_bytes); 6:
// recomputation of a stage's first blocks only (recompute_blocks); 5: stage boundaries inside blocks (starts_at_mlp,
// ends_at_attention); 4: stages whose replicas mix chip types (groups); 3 to 6 still load.
inline constexpr int kPlanVersion = 7;

// The replicas of one chip type in a stage whose replicas are of several types: each takes `rows` sequences of a
// micro-batch (uneven shares, in proportion to the chips' speed), so the stage's replicas finish together.
struct ReplicaGroup {
  std::string chip;
  int chip_index = 0;
  int replicas = 1;
  int rows = 1;
  Recompute recompute = Recompute::kNone;  // its own: the fastest under which the stage's layers fit on its chip
  int recompute_blocks = -1;               // on its first this many blocks (a half counting as one); -1: all
  // Predictions for one replica of the group: seconds per micro-batch, bytes per device.
  double forward_s = 0, backward_s = 0;
  double weight_s = 0;  // of backward_s, the weight gradients' products (a split backward's W)
  double memory_bytes = 0, capacity_bytes = 0;
};

struct StagePlan {
  std::string chip;  // chip type name
  int chip_index = 0;
  int tp = 1;           // tensor-parallel degree: devices per stage replica
  int dp = 1;           // data-parallel degree: replicas of the stage
  int first_layer = 0;  // transformer blocks [first_layer, first_layer + layers)
  int layers = 0;
  // A boundary inside a block (model/gpt.h's GptRange): the first block is its MLP half alone (the stage before
  // ends after its attention half), the last block its attention half alone. Not with the embedding (first) or the
  // head (last), nor interleaved.
  bool starts_at_mlp = false, ends_at_attention = false;
  bool embedding = false;  // holds the token/position embedding (first stage)
  bool head = false;       // holds the final LayerNorm, output head and loss (last stage)
  Recompute recompute = Recompute::kNone;
  // Only the first this many of its blocks (a half counting as one) recompute, the rest keep every activation
  // (Megatron-LM's --recompute-method block); -1: all of them.
  int recompute_blocks = -1;
  int in_flight = 1;  // micro-batches whose activations it holds at once under 1F1B
  // Predictions, seconds per micro-batch unless noted.
  double forward_s = 0, backward_s = 0;
  // Of backward_s, the weight gradients' products (the group whose backward is slowest): what a split backward's W
  // takes (schedule.h), its B the rest.
  double weight_s = 0;
  double send_s = 0;  // activation to the next stage (and its gradient back); 0 on the last stage
  double dp_allreduce_s = 0, optimizer_s = 0;  // per step
  double tied_allreduce_s = 0;                 // per step, first and last stage: the tied embedding's gradient
  // Memory per device, as model/costs.h's stage_memory counts it: weights, gradients and optimizer state; per
  // micro-batch in flight, what backward needs and the stage's input; buffers (recomputation, gradient scratch,
  // communication); the total state + buffers + in_flight x activations, against the usable capacity.
  double state_bytes = 0, activation_bytes = 0, buffer_bytes = 0;
  double memory_bytes = 0, capacity_bytes = 0;
  // Per micro-batch between a split backward's B and W, beyond its activations: what the W reads (model/costs.h's
  // weight_pending_bytes; zb-h1 only).
  double weight_pending_bytes = 0;
  // Replicas of several chip types, in this order (their replicas add up to dp, their rows x replicas to a
  // micro-batch's dp x micro_batch sequences); the stage's own chip, recomputation and times are then those of the
  // group that bounds its time, its memory the group's with the least headroom. Empty: dp replicas of `chip`, an
  // equal share each.
  std::vector<ReplicaGroup> groups;

  int devices() const { return tp * dp; }
  // Its blocks in half-blocks (a whole block 2, a half 1), and its first half-block (64-bit: checks run it on
  // unchecked input); the stages cover the model when each starts where the one before ends.
  int halves() const { return 2 * layers - starts_at_mlp - ends_at_attention; }
  int64_t start_half() const { return 2 * int64_t{first_layer} + starts_at_mlp; }
  // The replicas of each chip type: its groups, or else all dp replicas of its own chip as one group (rows 0: an
  // equal share each) with the stage's own recomputation, times and memory.
  std::vector<ReplicaGroup> replica_groups() const;
  ReplicaGroup group_of(int replica) const;  // the entry of replica_groups() that replica `replica` belongs to
  std::vector<int> replica_rows() const;     // per replica, its sequences; empty without groups
};

// A recomputation as plan tables print it: "full", or "full:2" on only the first 2 blocks.
std::string recompute_label(Recompute r, int blocks);

struct Plan {
  int version = kPlanVersion;
  std::string cluster, model;  // names, for the reader
  TransformerShape shape;
  int64_t global_batch = 0;
  int micro_batch = 1;        // sequences per micro-batch
  int num_micro_batches = 1;  // per pipeline per step
  int dp = 1;                 // pipelines (a stage's own dp may differ: its replicas share the micro-batch's rows)
  ScheduleKind schedule = ScheduleKind::k1F1B;
  int chunks = 1;                          // virtual stages per rank (interleaved)
  Precision precision = Precision::kBf16;  // the setup it was costed for (model/costs.h)
  bool h2_runtime = false;                 // ... and whose memory: H2's runtime's (TrainSetup::h2_runtime)
  bool zero1 = true;                       // optimizer state sharded over each stage's replicas
  std::vector<StagePlan> stages;
  // Predictions.
  double step_s = 0, tokens_per_s = 0, mfu = 0, bubble_fraction = 0;
  int devices_used = 0, devices_total = 0;
  std::string limited_by;  // what bounds the step time
  std::string why;         // why this plan was chosen over the others
  bool fits = true;        // every device's memory_bytes within its capacity_bytes

  std::string to_json() const;
  static Plan from_json(const std::string& text, const std::string& source);  // Error(kConfig) names the field
};

// The end of a step, given when each stage finished its last backward, in H2's runtime order: each stage sums
// its gradients over its replicas (dp_allreduce_s); the first and the last stage then sum the tied embedding's
// gradient once both are ready (tied_allreduce_s); every rank then agrees on the global gradient norm, so the
// optimizer steps (optimizer_s) start together. Start times per stage (tied_start -1 where there is none).
struct StepEnd {
  double step_s = 0;
  std::vector<double> reduce_start, tied_start, optim_start;
};
StepEnd end_of_step(const Plan& plan, const std::vector<double>& finish);

// What one virtual stage holds (interleaved 1F1B; without it, the stages themselves): stage i's layers are split
// into `chunks` near-equal chunks (the later ones the larger), virtual stage c x P + i holds chunk c of stage i,
// and the virtual stages in order cover the blocks; the first holds the embedding, the last the head.
struct ChunkLayers {
  int first_layer = 0, layers = 0;
  bool embedding = false, head = false;
  bool starts_at_mlp = false, ends_at_attention = false;  // the stage's (one chunk only)
};
std::vector<ChunkLayers> virtual_stages(const Plan& plan);  // per virtual stage

// The plan's schedule replayed with its stages' times (schedule/replay.h): a rank's stage time split evenly over
// its chunks, the boundary from the last rank back to the first (interleaving) at the slowest boundary's time.
Schedule schedule_of(const Plan& plan);
// Under zb-h1 (schedule.h), the W's each stage defers: ZB-H1's own (its index) where its memory holds it, fewer where
// not. Deferring d, a stage holds d micro-batches' activations more than under 1F1B, and up to d + 1 micro-batches
// between B and W (weight_pending_bytes each) — what must fit beside its 1F1B footprint in its capacity. -1, not split,
// where not even d = 0 fits, where its replicas are of several chip types (their memory differs; the stage's figures
// are one group's), or where it recomputes: its backward recomputes block after block into one buffer
// (model/gpt.h), which a later W could no longer read. The footprint is the stage's terms under 1F1B (state, buffers,
// min(p - i, m) micro-batches' activations), whatever the plan's own schedule.
std::vector<int> zb_deferrals(const Plan& plan);
// A 1F1B plan of one chunk with ZB-H1 in place of 1F1B: its stages defer the W's zb_deferrals gives them, and each
// split stage's in_flight and memory_bytes are what the schedule holds — micro-batches from F to W, and up to
// max_pending_weights of them between B and W (weight_pending_bytes each). Nothing where no stage splits (1F1B
// itself) or the plan is of another schedule. Its step is still 1F1B's: replay it (score_by_replay).
std::optional<Plan> as_zero_bubble(const Plan& plan);
ReplayResult replay_plan(const Plan& plan);

// Error(kConfig) naming the field when a plan contradicts itself: micro-batches that do not make the global batch,
// a stage's replicas that do not divide a micro-batch's sequences, stages that do not cover the layers, a schedule
// the stages cannot run (interleaving needs at least `chunks` layers per stage and micro-batches a multiple of
// the stages).
void check_plan(const Plan& plan, const std::string& source);

// Error(kConfig) when `plan` was made for another model than `model` (blocks, width, heads, MLP width, vocabulary,
// sequence length): its costs are not that model's. `whose` names the other model ("the model file").
void check_plan_model(const Plan& plan, const TransformerShape& model, const std::string& whose);

void save_plan(const Plan& plan, const std::string& path);  // atomic
Plan load_plan(const std::string& path);

}  // namespace h2
