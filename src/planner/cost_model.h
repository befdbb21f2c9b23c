// HeteroAuto's cost model: how long a piece of the model takes on a chip type and how much memory it needs.
// Every time and memory formula of the planner is here (one place); the simulator (src/sim) uses the same
// functions for the durations it replays, so the two differ only in how they schedule.
//
// Sources: FLOPs per layer and the 1F1B pipeline structure from Narayanan et al. 2021 ("Efficient Large-Scale
// Language Model Training on GPU Clusters Using Megatron-LM"); activation memory and recomputation from
// Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models"), via
// model/costs.h; mixed-precision optimizer state (2 + 2 + 12 bytes per parameter) and its ZeRO-1 sharding
// from Rajbhandari et al. 2020; ring all-reduce time 2 (n-1)/n * bytes / bandwidth + 2 (n-1) latency
// (Patarasuk & Yuan 2009), the same algorithm bandwidth nccl-tests reports.
#pragma once

#include <memory>

#include "model/costs.h"
#include "planner/spec.h"

namespace h2 {

// Constants of the model, with units. Changing one changes every plan; each row says why it has its value.
struct CostConstants {
  // bf16 weights, gradients and activations, fp32 master weights and Adam moments, the loss in fp32.
  ElementBytes bytes = ElementBytes::mixed_bf16();
  double optimizer_traffic_bytes = 28;  // per parameter and step: read+write master, m, v (24) + grad + weight
  double workspace_fraction = 0.05;     // memory kept free for allocator slack and library workspaces

  // All f32 (H2's runtime in f32): 4-byte weights, gradients and activations; Adam m and v (8) beside weights
  // that are their own master copy; traffic as the runtime's step moves it: the gradient norm (read, 4),
  // clipping (read + write, 8), AdamW (read+write of weight, m, v: 24, and the gradient: 4).
  static CostConstants f32() { return CostConstants{.bytes = ElementBytes::f32(), .optimizer_traffic_bytes = 40}; }
  // bf16 as H2's runtime runs it (gpt.h): the f32 step's traffic and the refresh of the bf16 copy of the weights
  // (read the f32 master, 4, write bf16, 2).
  static CostConstants h2_bf16() {
    return CostConstants{.bytes = ElementBytes::h2_bf16(), .optimizer_traffic_bytes = 46};
  }
  // What a setup costs: f32, H2's bf16 (h2_runtime), or bf16 as published systems hold it (the defaults).
  static CostConstants of(Precision p, bool h2_runtime) {
    return p == Precision::kF32 ? f32() : h2_runtime ? h2_bf16() : CostConstants{};
  }
};

class CostModel {
 public:
  // The constants follow train.precision (and train.h2_runtime).
  CostModel(const Cluster& cluster, const TransformerShape& model, const TrainSetup& train);

  const Cluster& cluster() const { return cluster_; }
  const TransformerShape& model() const { return model_; }
  const TrainSetup& train() const { return train_; }
  const CostConstants& constants() const { return k_; }

  // --- time, seconds, per micro-batch of b sequences on one device of a TP group of size tp ---
  // All the per-layer and per-piece times of one (chip, TP, b), computed once per cost model and kept (the search
  // asks for the same few combinations across thousands of layouts).
  struct PieceTimes {
    double layer_forward_s = 0, layer_backward_s[3] = {0, 0, 0};  // backward by Recompute
    // A block's halves alone (a stage boundary inside a block), the same way.
    double attention_forward_s = 0, attention_backward_s[3] = {0, 0, 0};
    double mlp_forward_s = 0, mlp_backward_s[3] = {0, 0, 0};
    double embedding_forward_s = 0, embedding_backward_s = 0, head_forward_s = 0, head_backward_s = 0;
    // Of each backward, the weight gradients' part (weight_s below); the same under every recomputation.
    double layer_weight_s = 0, attention_weight_s = 0, mlp_weight_s = 0, embedding_weight_s = 0, head_weight_s = 0;
  };
  const PieceTimes& piece_times(int chip, int tp, int b) const;
  // A block's, or one half's: compute + TP all-reduces (two a block, one a half); backward + recomputation (selective:
  // the attention half's core again; full: its forward again).
  double layer_forward_s(int chip, int tp, int b, BlockPart part = BlockPart::kWhole) const;
  double layer_backward_s(int chip, int tp, int b, Recompute r, BlockPart part = BlockPart::kWhole) const;
  // The vocabulary-parallel embedding and head: each TP rank its 1/tp of the vocabulary, then the group's sum.
  double embedding_forward_s(int chip, int tp, int b) const;
  double embedding_backward_s(int chip, int tp, int b) const;
  double head_forward_s(int chip, int tp, int b) const;  // final LayerNorm + logits + loss
  double head_backward_s(int chip, int tp, int b) const;
  // Of a block's (or half's) or the head's backward, the weight gradients' products: one of each GEMM's two backward
  // products (dW = X^T dY beside dX = dY W^T, the same FLOPs), what a split backward's W runs (schedule.h). The
  // embedding's backward, a scatter into its rows, is all weight gradient.
  double layer_weight_s(int chip, int tp, int b, BlockPart part = BlockPart::kWhole) const;
  double head_weight_s(int chip, int tp, int b) const;
  // One activation (or its gradient) of b sequences from a stage on chip `from` with TP tp_from to one on `to` with
  // tp_to: partitioned over the TP ranks, then all-gathered by the receiving group.
  double transfer_s(int from, int tp_from, int to, int tp_to, int b) const;
  // Gradient all-reduce over the stage's dp replicas of `params` parameters held per device; across nodes at the
  // NIC bandwidth of the group's replicas on one node.
  double dp_allreduce_s(int chip, int tp, int dp, double params_per_device) const;
  // The same over replicas of several chip types (a mixed stage): the ring crosses between the types, so it runs
  // at the slowest of their NICs and the links between them, staged through host memory where a link is not
  // device-direct.
  double dp_allreduce_s(const std::vector<int>& chips, int tp, int dp, double params_per_device) const;
  // The tied token embedding's gradient summed between the first stage (chip a) and the last (chip b), which
  // keep identical copies (Megatron-LM's embedding group): an all-reduce of `params` over `ranks` ranks (2: a rank
  // and its counterpart; the ends' TP unlike: a replica's ranks at both ends, the whole vocabulary) over the link.
  double tied_allreduce_s(int a, int b, double params, int ranks = 2) const;
  // The optimizer step over a device's parameters in `tensors` tensors (a kernel or two each).
  double optimizer_s(int chip, int dp, double params_per_device, int tensors) const;
  double flops_rate(int chip) const;  // the chip's achievable matmul rate in this setup's precision

  // --- memory, bytes per device: model/costs.h's stage_memory in this setup's element sizes; interleaved, the
  // sum over the device's chunks as the runtime allocates them (chunked_stage_memory) ---
  StageMemory stage_memory(StageMemorySpec spec, std::span<const int> chunk_in_flight = {}) const;
  // model/costs.h's weight_pending_bytes in this setup's element sizes.
  double weight_pending_bytes(StageMemorySpec spec) const;
  double usable_bytes(int chip) const;  // capacity less the workspace

  // --- helpers ---
  double op_s(int chip, const OpWork& op) const;  // one kernel on one device of the chip type: roofline + overhead
  double ops_s(int chip, const std::vector<OpWork>& ops) const;
  double ring_allreduce_s(double bytes, int ranks, double bandwidth_gbps, double latency_us) const;
  double params_per_layer() const { return static_cast<double>(layer_params(model_)); }
  // Model FLOPs of one optimizer step (forward + backward, no recomputation): the MFU numerator.
  double step_model_flops() const;

 private:
  double tp_allreduce_s(int chip, int tp, int b) const;  // one all-reduce of a (b, T, hidden) activation
  double part_factor(int chip, int tp, int b, bool head, bool backward) const;  // ChipType::part_correction at b
  // A stage's forward or backward kernels in a run: their roofline times `correction` (part_factor), plus what a
  // run adds to each (ChipType::run_kernel_us).
  double stage_kernels_s(int chip, const std::vector<OpWork>& ops, double correction = 1) const;

  Cluster cluster_;
  TransformerShape model_;
  TrainSetup train_;
  CostConstants k_;
  struct Cache;
  std::shared_ptr<Cache> cache_;  // piece_times, shared by copies; thread-safe
};

}  // namespace h2
