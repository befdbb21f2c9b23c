// HeteroPP's runtime (DESIGN.md, "pipeline"): one rank's stage of a pipelined, data-parallel GPT and the
// interpreter of its action list (pipeline/schedule.h).
//
// Ranks: stage s, data-parallel replica d. Activations go to stage s + 1 and gradients to s - 1 of the same
// replica through DiComm (tags encode direction and micro-batch); REDUCE_GRAD averages the stage's gradients
// over its replicas (all-reduce, or with ZeRO-1 a reduce-scatter whose shard the rank updates and all-gathers
// back) and sums the tied token-embedding gradient between the first and the last stage; OPTIM takes the global
// gradient norm over the pipeline, clips, and runs AdamW - the same step as single-device training.
//
// Activation memory: the model holds one micro-batch's activations. A stage stashes only each in-flight
// micro-batch's input (B x T x C) and, when a backward comes for a micro-batch other than the one whose
// activations it holds, recomputes that forward first (Chen et al. 2016) - exact, since forward is
// deterministic. 1F1B's last stage runs each backward right after its forward and never recomputes.
//
// Deliberately not here yet: tensor parallelism, resharding between stages of different DP width.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "comm/tensor_comm.h"
#include "model/gpt.h"
#include "ops/kernels.h"
#include "pipeline/schedule.h"
#include "train/checkpoint.h"

namespace h2 {

struct StageLayout {
  int stages = 1;
  int dp = 1;
  // World rank of (stage, replica): stage-major, so a stage's replicas are neighbours.
  int rank_of(int stage, int replica) const { return stage * dp + replica; }
};

// The communicators a stage needs, split from the world (a collective over every rank of the layout).
struct StageComms {
  Communicator pipe;  // this replica's stages, rank = stage
  Communicator dp;    // this stage's replicas, rank = replica
  Communicator tied;  // first and last stage of this replica (when they differ), else a group of one
  static StageComms split(Communicator& world, const StageLayout& layout);
};

struct OptimOptions {
  double grad_clip = 1.0;
  bool zero1 = false;  // shard the optimizer state over the stage's replicas
};

class StageRunner {
 public:
  // One micro-batch of B x T tokens (host, i32): inputs and next-token targets.
  using Batch = std::function<void(int micro_batch, std::vector<int32_t>& tokens, std::vector<int32_t>& targets)>;

  StageRunner(const GptConfig& config, Device& device, GptRange range, int stage, const StageLayout& layout,
              StageComms& comms, int B, int T, OptimOptions options);
  Gpt& model() { return *model_; }
  int stage() const { return stage_; }

  // Runs one training step: this rank's actions of `schedule` (lowered, with gradient reduction). Returns the
  // step's mean loss, known on every rank (broadcast from the last stage).
  float step(const Schedule& schedule, const Batch& batch, const AdamwParams& hp);
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

  GptConfig config_;
  Device& device_;
  GptRange range_;
  int stage_;
  StageLayout layout_;
  StageComms& comms_;
  TensorComm pipe_, dp_, tied_;
  int B_, T_;
  OptimOptions options_;
  std::unique_ptr<Gpt> model_;
  OptimizerState optimizer_;
  bool first_, last_;
  int micro_batches_ = 0;
  int holds_ = -1;                  // the micro-batch whose activations the model holds
  std::vector<Tensor> stash_;       // per micro-batch: the stage's input activations (not on the first stage)
  std::vector<Tensor> out_, gout_;  // per micro-batch: activations and input gradients being sent
  Tensor tokens_, targets_, dout_, norm_acc_;
  std::vector<std::pair<int, std::unique_ptr<Request>>> sends_;  // (stage, request) in flight this step
  double loss_sum_ = 0, grad_norm_ = 0;
};

}  // namespace h2
