// The cost model's formulas (sources in cost_model.h).
#include "planner/cost_model.h"

namespace h2 {

CostModel::CostModel(const Cluster& cluster, const TransformerShape& model, const TrainSetup& train)
    : cluster_(cluster),
      model_(model),
      train_(train),
      k_(train.precision == Precision::kF32 ? CostConstants::f32() : CostConstants{}) {}

double CostModel::compute_s(int chip, double flops) const {
  return flops / cluster_.chips[static_cast<size_t>(chip)].flops_per_second();
}

double CostModel::ring_allreduce_s(double bytes, int ranks, double bandwidth_gbps, double latency_us) const {
  if (ranks <= 1) return 0.0;
  const double n = ranks;
  return 2.0 * (n - 1) / n * bytes / (bandwidth_gbps * 1e9) + 2.0 * (n - 1) * latency_us * 1e-6;
}

// Megatron tensor parallelism all-reduces the (b, T, hidden) activation twice per layer and direction, over the
// node's own links (TP never leaves a node).
double CostModel::tp_allreduce_s(int chip, int tp, int b) const {
  const NodeGroup& g = cluster_.group_of(chip);
  const double bytes = static_cast<double>(b) * model_.seq_len * model_.hidden * k_.bytes.activation;
  return ring_allreduce_s(bytes, tp, g.intra_node_gbps, g.intra_node_latency_us);
}

double CostModel::layer_forward_s(int chip, int tp, int b) const {
  return compute_s(chip, b * layer_forward_flops(model_, model_.seq_len) / tp) + 2 * tp_allreduce_s(chip, tp, b);
}

double CostModel::layer_backward_s(int chip, int tp, int b, Recompute r) const {
  // The backward pass does twice the forward's matmul work.
  double s =
      compute_s(chip, 2.0 * b * layer_forward_flops(model_, model_.seq_len) / tp) + 2 * tp_allreduce_s(chip, tp, b);
  if (r == Recompute::kFull) {
    s += layer_forward_s(chip, tp, b);  // the whole forward again
  } else if (r == Recompute::kSelective) {
    // Only the attention core (Q K^T, softmax, P V) again: 2 * 2 * T^2 * hidden / 2 FLOPs per sequence (causal).
    const double T = static_cast<double>(model_.seq_len);
    s += compute_s(chip, b * 2.0 * T * T * model_.hidden / tp);
  }
  return s;
}

// The vocabulary-parallel embedding (model/gpt.h): each TP rank gathers its rows (memory-bound: the (b, T, hidden)
// output written once), then the group sums the outputs. Its backward scatters the gradient into the rows.
double CostModel::embedding_forward_s(int chip, int tp, int b) const {
  const double bytes = static_cast<double>(b) * model_.seq_len * model_.hidden * k_.bytes.activation;
  return bytes / (cluster_.chips[static_cast<size_t>(chip)].memory_bandwidth_gbps * 1e9) + tp_allreduce_s(chip, tp, b);
}

double CostModel::embedding_backward_s(int chip, int, int b) const {
  const double bytes = static_cast<double>(b) * model_.seq_len * model_.hidden * k_.bytes.activation;
  return bytes / (cluster_.chips[static_cast<size_t>(chip)].memory_bandwidth_gbps * 1e9);
}

// The head's logits over this rank's vocabulary columns; the loss's per-row statistics are all-reduced (small).
double CostModel::head_forward_s(int chip, int tp, int b) const {
  return compute_s(chip, b * head_forward_flops(model_, model_.seq_len) / tp);
}

// Twice the forward's matmul work, then the head's input gradient summed over the TP group.
double CostModel::head_backward_s(int chip, int tp, int b) const {
  return 2.0 * head_forward_s(chip, tp, b) + tp_allreduce_s(chip, tp, b);
}

// Every TP rank of the receiving stage gets the whole activation from one sending rank (pipeline/runtime.h),
// so each sender sends it ceil(tp_to / tp_from) times, in parallel with the others; between chip types without
// device-direct RDMA it is copied to host memory and back on the way.
double CostModel::transfer_s(int from, int tp_from, int to, int tp_to, int b) const {
  const GroupLink l = cluster_.link(from, to);
  const double bytes =
      static_cast<double>(b) * model_.seq_len * model_.hidden * k_.bytes.activation * ((tp_to + tp_from - 1) / tp_from);
  double s = l.latency_us * 1e-6 + bytes / (l.bandwidth_gbps * 1e9);
  if (!l.device_direct) {
    s += bytes / (cluster_.chips[static_cast<size_t>(from)].host_link_gbps * 1e9) +
         bytes / (cluster_.chips[static_cast<size_t>(to)].host_link_gbps * 1e9);
  }
  return s;
}

// A DP group is the same TP rank in every replica; it stays inside a node only if all replicas fit in one.
double CostModel::dp_allreduce_s(int chip, int tp, int dp, double params_per_device) const {
  const NodeGroup& g = cluster_.group_of(chip);
  const bool one_node = tp * dp <= g.chips_per_node;
  return ring_allreduce_s(params_per_device * k_.bytes.grad, dp, one_node ? g.intra_node_gbps : g.nic_gbps,
                          one_node ? g.intra_node_latency_us : g.nic_latency_us);
}

double CostModel::tied_allreduce_s(int a, int b, double params) const {
  const GroupLink link = cluster_.link(a, b);
  return ring_allreduce_s(params * k_.bytes.grad, 2, link.bandwidth_gbps, link.latency_us);
}

double CostModel::optimizer_s(int chip, int dp, double params_per_device) const {
  const double sharded = train_.zero1 ? params_per_device / dp : params_per_device;
  return sharded * k_.optimizer_traffic_bytes / (cluster_.chips[static_cast<size_t>(chip)].memory_bandwidth_gbps * 1e9);
}

StageMemory CostModel::stage_memory(StageMemorySpec spec) const {
  spec.shape = model_;
  spec.bytes = k_.bytes;
  return h2::stage_memory(spec);
}

double CostModel::usable_bytes(int chip) const {
  return cluster_.chips[static_cast<size_t>(chip)].memory_bytes() * (1.0 - k_.workspace_fraction);
}

double CostModel::step_model_flops() const {
  const double per_sequence = static_cast<double>(model_.layers) * layer_forward_flops(model_, model_.seq_len) +
                              head_forward_flops(model_, model_.seq_len);
  return 3.0 * per_sequence * static_cast<double>(train_.global_batch);
}

}  // namespace h2
