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
  const double bytes = static_cast<double>(b) * model_.seq_len * model_.hidden * k_.activation_bytes;
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

// H2's runtime keeps the embedding and the head whole on every TP rank of their stage (model/gpt.h: no
// vocabulary-parallel head), so tensor parallelism divides neither their time nor their memory.
double CostModel::embedding_forward_s(int chip, int b) const {
  // A gather: memory-bound, (b, T, hidden) written once.
  const double bytes = static_cast<double>(b) * model_.seq_len * model_.hidden * k_.activation_bytes;
  return bytes / (cluster_.chips[static_cast<size_t>(chip)].memory_bandwidth_gbps * 1e9);
}

double CostModel::head_forward_s(int chip, int b) const {
  return compute_s(chip, b * head_forward_flops(model_, model_.seq_len));
}

double CostModel::head_backward_s(int chip, int b) const { return 2.0 * head_forward_s(chip, b); }

// Every TP rank of the receiving stage gets the whole activation from one sending rank (pipeline/runtime.h),
// so each sender sends it ceil(tp_to / tp_from) times, in parallel with the others; between chip types without
// device-direct RDMA it is copied to host memory and back on the way.
double CostModel::transfer_s(int from, int tp_from, int to, int tp_to, int b) const {
  const GroupLink l = cluster_.link(from, to);
  const double bytes =
      static_cast<double>(b) * model_.seq_len * model_.hidden * k_.activation_bytes * ((tp_to + tp_from - 1) / tp_from);
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
  return ring_allreduce_s(params_per_device * k_.grad_bytes, dp, one_node ? g.intra_node_gbps : g.nic_gbps,
                          one_node ? g.intra_node_latency_us : g.nic_latency_us);
}

double CostModel::tied_allreduce_s(int a, int b, double params) const {
  const GroupLink link = cluster_.link(a, b);
  return ring_allreduce_s(params * k_.grad_bytes, 2, link.bandwidth_gbps, link.latency_us);
}

double CostModel::optimizer_s(int chip, int dp, double params_per_device) const {
  const double sharded = train_.zero1 ? params_per_device / dp : params_per_device;
  return sharded * k_.optimizer_traffic_bytes / (cluster_.chips[static_cast<size_t>(chip)].memory_bandwidth_gbps * 1e9);
}

// Mixed precision (Rajbhandari et al. 2020): bf16 weights and gradients, fp32 master and Adam moments, the last
// sharded over the data-parallel ranks under ZeRO-1.
double CostModel::state_bytes_per_param(int dp) const {
  return k_.weight_bytes + k_.grad_bytes + (train_.zero1 ? k_.optimizer_bytes / dp : k_.optimizer_bytes);
}

double CostModel::layer_state_bytes(int tp, int dp) const {
  const double per_param = state_bytes_per_param(dp);
  return params_per_layer() / tp * per_param;
}

double CostModel::layer_activation_bytes(int tp, int b, Recompute r) const {
  // Tensor parallelism splits every activation but the layer input (Korthikanti et al. 2022, eq. 2);
  // dividing all of it by tp slightly undercounts the (b, T, hidden) inputs, which is why a workspace is kept.
  return h2::layer_activation_bytes(model_, b, model_.seq_len, k_.activation_bytes, r) / tp;
}

double CostModel::embedding_state_bytes(int dp) const {
  const double per_param = state_bytes_per_param(dp);
  return static_cast<double>(embedding_params(model_)) * per_param;
}

double CostModel::head_state_bytes(int dp, bool own_embedding_copy) const {
  const double per_param = state_bytes_per_param(dp);
  const double copy =
      own_embedding_copy && model_.tied_embeddings ? static_cast<double>(model_.vocab * model_.hidden) : 0;
  const double params = static_cast<double>(head_params(model_)) + copy;
  return params * per_param;
}

double CostModel::head_activation_bytes(int b) const {
  const double bt = static_cast<double>(b) * model_.seq_len;
  return bt * model_.hidden * k_.activation_bytes + bt * static_cast<double>(model_.vocab) * k_.logits_bytes;
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
