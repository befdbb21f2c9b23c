// The cost model's formulas (sources in cost_model.h).
#include "planner/cost_model.h"

#include <algorithm>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>

namespace h2 {

struct CostModel::Cache {
  std::mutex mu;
  std::map<std::tuple<int, int, int>, PieceTimes> times;
};

CostModel::CostModel(const Cluster& cluster, const TransformerShape& model, const TrainSetup& train)
    : cluster_(cluster),
      model_(model),
      train_(train),
      k_(CostConstants::of(train.precision, train.h2_runtime)),
      cache_(std::make_shared<Cache>()) {}

const CostModel::PieceTimes& CostModel::piece_times(int chip, int tp, int b) const {
  std::lock_guard<std::mutex> lock(cache_->mu);
  auto [it, fresh] = cache_->times.try_emplace({chip, tp, b});
  if (fresh) {
    PieceTimes& t = it->second;
    t.layer_forward_s = layer_forward_s(chip, tp, b);
    t.attention_forward_s = layer_forward_s(chip, tp, b, BlockPart::kAttention);
    t.mlp_forward_s = layer_forward_s(chip, tp, b, BlockPart::kMlp);
    for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
      t.layer_backward_s[static_cast<int>(r)] = layer_backward_s(chip, tp, b, r);
      t.attention_backward_s[static_cast<int>(r)] = layer_backward_s(chip, tp, b, r, BlockPart::kAttention);
      t.mlp_backward_s[static_cast<int>(r)] = layer_backward_s(chip, tp, b, r, BlockPart::kMlp);
    }
    t.embedding_forward_s = embedding_forward_s(chip, tp, b);
    t.embedding_backward_s = embedding_backward_s(chip, tp, b);
    t.head_forward_s = head_forward_s(chip, tp, b);
    t.head_backward_s = head_backward_s(chip, tp, b);
    t.layer_weight_s = layer_weight_s(chip, tp, b);
    t.attention_weight_s = layer_weight_s(chip, tp, b, BlockPart::kAttention);
    t.mlp_weight_s = layer_weight_s(chip, tp, b, BlockPart::kMlp);
    t.embedding_weight_s = t.embedding_backward_s;
    t.head_weight_s = head_weight_s(chip, tp, b);
  }
  return it->second;  // std::map: references stay valid as it grows
}

// A roofline per kernel (Williams et al. 2009) plus its fixed cost: the larger of its compute time at the chip's
// achievable rate for its class and its memory traffic at the achievable bandwidth, plus the launch overhead. A
// GEMM's compute time holds its elements' costs (the ramp, ChipType::matmul_element_ns) and the profile's correction
// for its shape (matmul_corrections); its forward and its backward take their shares of the pair's time
// (matmul_forward_speedup).
double CostModel::op_s(int chip, const OpWork& op) const {
  const ChipType& c = cluster_.chips[static_cast<size_t>(chip)];
  const bool bf16 = train_.precision == Precision::kBf16;
  const bool gemm = op.kind == OpClass::kMatmul || op.kind == OpClass::kMatmulBackward;
  const double rate = gemm                                    ? c.matmul_flops(bf16)
                      : op.kind == OpClass::kAttention        ? c.attention_flops(bf16)
                      : op.kind == OpClass::kAttentionForward ? c.attention_forward_flops(bf16)
                                                              : 0;
  double compute = rate > 0 ? op.flops / rate : 0;
  if (gemm) {
    compute += op.gemms * c.gemm_element_s(op.rows, op.k, op.n);
    compute *= c.gemm_correction(op.rows, op.k, op.n);
    compute /= op.kind == OpClass::kMatmul ? c.matmul_forward_factor() : c.matmul_backward_factor();
  }
  const double bandwidth = op.kind == OpClass::kMemory ? c.elementwise_bytes_per_second() : c.bytes_per_second();
  return std::max(compute, op.bytes / bandwidth) + c.kernel_overhead_us * 1e-6;
}

double CostModel::flops_rate(int chip) const {
  return cluster_.chips[static_cast<size_t>(chip)].matmul_flops(train_.precision == Precision::kBf16);
}

double CostModel::ops_s(int chip, const std::vector<OpWork>& ops) const {
  double s = 0;
  for (const OpWork& op : ops) s += op_s(chip, op);
  return s;
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

// A block's and the head's forward and backward kernels take the profile's correction for that part and direction
// (ChipType::part_corrections); their all-reduces do not (the profile timed the parts without them).
double CostModel::part_factor(int chip, int tp, int b, bool head, bool backward) const {
  return cluster_.chips[static_cast<size_t>(chip)].part_correction(tp, static_cast<double>(b) * model_.seq_len, head,
                                                                   backward);
}

double CostModel::stage_kernels_s(int chip, const std::vector<OpWork>& ops, double correction) const {
  return ops_s(chip, ops) * correction +
         static_cast<double>(ops.size()) * cluster_.chips[static_cast<size_t>(chip)].run_kernel_us * 1e-6;
}

// A half's kernels take the block's part correction (the profile timed whole blocks) and one of its two all-reduces.
double CostModel::layer_forward_s(int chip, int tp, int b, BlockPart part) const {
  const double e = k_.bytes.activation, w = k_.bytes.weight;
  const double all_reduces = part == BlockPart::kWhole ? 2 : 1;
  return stage_kernels_s(chip, block_ops(model_, b, model_.seq_len, tp, e, w, false, part),
                         part_factor(chip, tp, b, false, false)) +
         all_reduces * tp_allreduce_s(chip, tp, b);
}

double CostModel::layer_backward_s(int chip, int tp, int b, Recompute r, BlockPart part) const {
  const double e = k_.bytes.activation, w = k_.bytes.weight;
  const double all_reduces = part == BlockPart::kWhole ? 2 : 1;
  std::vector<OpWork> kernels = block_ops(model_, b, model_.seq_len, tp, e, w, true, part);
  if (r == Recompute::kSelective) {
    // Only the attention core again (Korthikanti et al. 2022): the forward's attention kernel.
    for (const OpWork& op : block_ops(model_, b, model_.seq_len, tp, e, w, false, part)) {
      if (op.kind == OpClass::kAttentionForward) kernels.push_back(op);
    }
  }
  double s =
      stage_kernels_s(chip, kernels, part_factor(chip, tp, b, false, true)) + all_reduces * tp_allreduce_s(chip, tp, b);
  if (r == Recompute::kFull) s += layer_forward_s(chip, tp, b, part);  // the forward again, its all-reduces too
  return s;
}

// The vocabulary-parallel embedding (model/gpt.h): each TP rank gathers its rows (memory-bound: the (b, T, hidden)
// output written once), then the group sums the outputs. Its backward scatters the gradient into the rows.
double CostModel::embedding_forward_s(int chip, int tp, int b) const {
  return stage_kernels_s(chip,
                         embedding_ops(model_, b, model_.seq_len, tp, k_.bytes.activation, k_.bytes.weight, false)) +
         tp_allreduce_s(chip, tp, b);
}

double CostModel::embedding_backward_s(int chip, int tp, int b) const {
  return stage_kernels_s(chip,
                         embedding_ops(model_, b, model_.seq_len, tp, k_.bytes.activation, k_.bytes.weight, true));
}

// The head's logits over this rank's vocabulary columns; under TP the loss's per-row statistics (three f32 per
// sequence position) are all-reduced over the group.
double CostModel::head_forward_s(int chip, int tp, int b) const {
  const NodeGroup& g = cluster_.group_of(chip);
  const double stats = 3 * ring_allreduce_s(4.0 * b * model_.seq_len, tp, g.intra_node_gbps, g.intra_node_latency_us);
  return stage_kernels_s(chip, head_ops(model_, b, model_.seq_len, tp, k_.bytes.activation, k_.bytes.weight, false),
                         part_factor(chip, tp, b, true, false)) +
         stats;
}

// Twice the forward's matmul work, then the head's input gradient summed over the TP group.
double CostModel::head_backward_s(int chip, int tp, int b) const {
  return stage_kernels_s(chip, head_ops(model_, b, model_.seq_len, tp, k_.bytes.activation, k_.bytes.weight, true),
                         part_factor(chip, tp, b, true, true)) +
         tp_allreduce_s(chip, tp, b);
}

namespace {

std::vector<OpWork> gemm_backwards(std::vector<OpWork> ops) {
  std::erase_if(ops, [](const OpWork& op) { return op.kind != OpClass::kMatmulBackward; });
  return ops;
}

}  // namespace

// Half of each GEMM backward's time, as the backward costs it (its part correction; no all-reduce: dW needs none).
double CostModel::layer_weight_s(int chip, int tp, int b, BlockPart part) const {
  const std::vector<OpWork> ops =
      gemm_backwards(block_ops(model_, b, model_.seq_len, tp, k_.bytes.activation, k_.bytes.weight, true, part));
  return stage_kernels_s(chip, ops, part_factor(chip, tp, b, false, true)) / 2;
}

double CostModel::head_weight_s(int chip, int tp, int b) const {
  const std::vector<OpWork> ops =
      gemm_backwards(head_ops(model_, b, model_.seq_len, tp, k_.bytes.activation, k_.bytes.weight, true));
  return stage_kernels_s(chip, ops, part_factor(chip, tp, b, true, true)) / 2;
}

// Partitioned (Megatron-LM's scatter-gather; pipeline/runtime.h's boundary_transfers): each receiving TP rank gets
// its 1/tp_to of the activation, so each sending rank sends ceil(tp_to / tp_from) such chunks, all senders in
// parallel over their own links; between chip types without device-direct RDMA each chunk is copied to host memory
// and back on the way; then the receiving TP group all-gathers the whole over its node's links.
double CostModel::transfer_s(int from, int tp_from, int to, int tp_to, int b) const {
  const GroupLink l = cluster_.link(from, to);
  const double whole = static_cast<double>(b) * model_.seq_len * model_.hidden * k_.bytes.activation;
  // One sending rank's share (pipeline/runtime.h's boundary_transfers).
  const double bytes =
      tp_from > tp_to ? whole / (tp_from / tp_to * tp_to) : whole / tp_to * ((tp_to + tp_from - 1) / tp_from);
  double s = l.latency_us * 1e-6 + bytes / (l.bandwidth_gbps * 1e9);
  if (!l.device_direct) {
    s += bytes / (cluster_.chips[static_cast<size_t>(from)].host_link_gbps * 1e9) +
         bytes / (cluster_.chips[static_cast<size_t>(to)].host_link_gbps * 1e9);
  }
  if (tp_to > 1) {  // ring all-gather: (n - 1) / n of the whole in n - 1 steps
    const NodeGroup& g = cluster_.group_of(to);
    const double n = tp_to;
    s += (n - 1) / n * whole / (g.intra_node_gbps * 1e9) + (n - 1) * g.intra_node_latency_us * 1e-6;
  }
  return s;
}

// A DP group is the same TP rank in every replica; it stays inside a node only if all replicas fit in one.
// Across nodes the ring is topology-aware, as NCCL builds it: a stage's devices fill nodes in turn, so each node
// holds `per_node` = chips_per_node / tp replicas of the group, linked over the node's own links, and the ring
// leaves a node once. The node's NICs are shared by the tp rings of its TP ranks, each running at once, so each
// ring has per_node NICs' worth of bandwidth, at most the node's links. When the replicas do not fill whole nodes
// some node may hold only one of them: then one NIC's worth.
double CostModel::dp_allreduce_s(int chip, int tp, int dp, double params_per_device) const {
  const NodeGroup& g = cluster_.group_of(chip);
  const double bytes = params_per_device * k_.bytes.grad;
  if (tp * dp <= g.chips_per_node) return ring_allreduce_s(bytes, dp, g.intra_node_gbps, g.intra_node_latency_us);
  int per_node = std::clamp(g.chips_per_node / tp, 1, dp);
  if (dp % per_node != 0) per_node = 1;
  return ring_allreduce_s(bytes, dp, std::min(g.intra_node_gbps, per_node * g.nic_gbps), g.nic_latency_us);
}

double CostModel::dp_allreduce_s(const std::vector<int>& chips, int tp, int dp, double params_per_device) const {
  if (chips.size() == 1) return dp_allreduce_s(chips.front(), tp, dp, params_per_device);
  double gbps = std::numeric_limits<double>::infinity(), latency_us = 0, host_gbps = gbps;
  bool staged = false;
  for (size_t i = 0; i < chips.size(); ++i) {
    const NodeGroup& g = cluster_.group_of(chips[i]);
    gbps = std::min(gbps, g.nic_gbps);
    latency_us = std::max(latency_us, g.nic_latency_us);
    host_gbps = std::min(host_gbps, cluster_.chips[static_cast<size_t>(chips[i])].host_link_gbps);
    for (size_t j = i + 1; j < chips.size(); ++j) {
      const GroupLink l = cluster_.link(chips[i], chips[j]);
      gbps = std::min(gbps, l.bandwidth_gbps);
      latency_us = std::max(latency_us, l.latency_us);
      staged = staged || !l.device_direct;
    }
  }
  // Staged: each ring step's bytes also go device -> host and host -> device.
  if (staged) gbps = 1.0 / (1.0 / gbps + 2.0 / host_gbps);
  return ring_allreduce_s(params_per_device * k_.bytes.grad, dp, gbps, latency_us);
}

double CostModel::tied_allreduce_s(int a, int b, double params, int ranks) const {
  const GroupLink link = cluster_.link(a, b);
  return ring_allreduce_s(params * k_.bytes.grad, ranks, link.bandwidth_gbps, link.latency_us);
}

double CostModel::optimizer_s(int chip, int dp, double params_per_device, int tensors) const {
  const ChipType& c = cluster_.chips[static_cast<size_t>(chip)];
  const double sharded = train_.zero1 ? params_per_device / dp : params_per_device;
  // train/optimizer.h: per tensor a squared norm and an AdamW kernel, and one clipping kernel.
  return sharded * k_.optimizer_traffic_bytes / c.bytes_per_second() +
         (2.0 * tensors + 1) * c.kernel_overhead_us * 1e-6;
}

StageMemory CostModel::stage_memory(StageMemorySpec spec, std::span<const int> chunk_in_flight) const {
  spec.shape = model_;
  spec.bytes = k_.bytes;
  return chunked_stage_memory(spec, chunk_in_flight);
}

double CostModel::weight_pending_bytes(StageMemorySpec spec) const {
  spec.shape = model_;  // in this setup, as stage_memory
  spec.bytes = k_.bytes;
  return h2::weight_pending_bytes(spec);
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
