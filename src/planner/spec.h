// The planner's inputs (docs/architecture.md, "planner"): a cluster, a model and a training setup, each from a YAML
// file documented in docs/planner.md. Every loader checks what it reads and its errors name the file, the line and the
// field (an unknown chip type, a size that is zero or negative, heads that do not divide hidden, an empty cluster,
// ...).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/format.h"
#include "model/costs.h"

namespace h2 {

// A chip type's figures, from its datasheet or measured by `h2 profile`. A kernel takes
// max(FLOPs / rate, bytes / bandwidth) + kernel_overhead_us: a roofline per kernel plus a fixed cost — a GEMM also its
// elements' costs (matmul_element_ns) —, which is what makes small problems (small micro-batches, small models, wide
// TP) slower per FLOP than large ones.
struct ChipType {
  std::string name;
  std::string vendor;
  double peak_tflops = 0;      // dense bf16 (tensor cores) TFLOP/s
  double peak_tflops_f32 = 0;  // dense f32 matmuls (TF32 tensor cores on GPUs); 0 = peak_tflops / 2
  double efficiency = 0.5;     // achievable fraction of peak on large matmuls
  // A GEMM's ramp: nanoseconds per element of its input (rows x k), its weight (k x n) and its output (rows x n),
  // each pass, beside its FLOPs at the achievable rate — what makes a GEMM with few rows or a narrow weight slower
  // per FLOP than a large one (the operands' packing and traffic; `h2 profile` fits them). Zeros: the rate alone.
  std::array<double, 3> matmul_element_ns{};
  // A GEMM's forward runs this many times the rate above, its backward (two GEMMs) so much slower that forward and
  // backward together take what the rate says (a CPU's bf16 forward kernel gains more over f32 than its backward;
  // `h2 profile` measures it). 1 = alike; in (1/3, 3].
  double matmul_forward_speedup = 1;
  // A CPU GEMM's time is not linear in its rows (on this host the head's TP-2 GEMM ran 1.07–1.35x the rate and
  // elements' costs above at 2,048 rows when they were fitted at 256 and 1,024: docs/pipeline.md). `h2 profile`
  // keeps, for each GEMM shape it timed, its measured time (forward and backward) over what those figures give it;
  // a GEMM of a timed (k, n) takes the figures' time times its corrections interpolated linearly in rows (held
  // beyond the rows timed). Empty (datasheet chips): the figures alone. In the file: [rows, k, n, ratio] each.
  struct GemmCorrection {
    double rows = 0, k = 0, n = 0, ratio = 1;
  };
  std::vector<GemmCorrection> matmul_corrections;
  // What the kernel-by-kernel figures still miss of a whole part: `h2 profile` times a block's forward and backward
  // and the head's forward (with the loss) and backward at each TP degree the chip may run, at the micro-batch's rows
  // and (with --max-rows) 2, 4, ... times them, and keeps each one's time over what the figures above compose for its
  // kernels (on this host at 1 sequence the composition was 12-18% above the measured block, right at 8; the
  // forward's share of a part, from the GEMMs' alone, missed a run's forwards by 6-13% and its backwards by 8-13%:
  // docs/pipeline.md). The cost model multiplies a
  // block's and the head's forward and backward kernels by them, interpolated linearly in rows (held beyond the rows
  // timed); a TP degree not timed: 1. In the file: [tp, rows, block forward, block backward, head forward, head
  // backward] ratios each, or [tp, rows, block, head] for both directions alike (profiles before 2026-12-06).
  struct PartCorrection {
    double tp = 1, rows = 0, block_forward = 1, block_backward = 1, head_forward = 1, head_backward = 1;
  };
  std::vector<PartCorrection> part_corrections;
  double attention_efficiency = 0;  // the attention core's achievable fraction of peak; 0 = efficiency / 2
  // Its forward alone, when it differs (a CPU's softmax exponentials make the forward slower per FLOP than the
  // backward); 0 = attention_efficiency.
  double attention_forward_efficiency = 0;
  double memory_gib = 0;             // device memory
  double memory_bandwidth_gbps = 0;  // device memory bandwidth, GB/s (element-wise ops, the optimizer)
  double memory_efficiency = 0.8;    // achievable fraction of it on streaming kernels
  // The element-wise and row-wise kernels' rate (LayerNorm, GELU, residuals, the loss), GB/s as the cost model counts
  // their bytes; 0: memory_bandwidth_gbps x memory_efficiency, as the optimizer's stream. A CPU's caches hold a
  // block's tensors where the optimizer streams from memory (`h2 profile` measures both).
  double elementwise_gbps = 0;
  double kernel_overhead_us = 5;  // the fixed cost of each kernel (launch and dispatch), microseconds
  // What a pipeline run adds to each forward and backward kernel of a stage beyond what the profile timed (a
  // tensor-parallel partner's late wake-up, dispatch under load), microseconds: `h2 calibrate` fits it for a chip
  // whose profile timed its parts (part_corrections) and whose run was slower. Not the optimizer's kernels, which every
  // rank runs at once, nor scaled by a part's correction.
  double run_kernel_us = 0;
  double host_link_gbps = 25;  // device <-> host (PCIe), GB/s: the path of host-staged transfers
  // What runs this chip type in `h2 train --cluster` and `h2 profile` on the host that runs the job: "emu" (the
  // default: an emulation paced to its figures), "cpu" (this host's cores, unpaced) or "cuda" (the host's GPU).
  std::string backend = "emu";
  // The rate an emulated chip of this type is paced to, beside the cluster's other types (pipeline/hetero_train.h,
  // emu_profile_of), TFLOP/s; 0: its f32 GEMM rate (matmul_flops). `h2 profile` and `h2 calibrate` write the file
  // they measured here, so that training on their figures emulates the same chips: measured on 2026-12-04, a
  // calibrated file that set the emulation by its fitted rates ran a 4-device example's chips at 0.47 and 0.13 of
  // the host where the run it was fitted on had 0.4 and 0.2 — another cluster than the one it predicts.
  double emulation_tflops = 0;
  // h2 profile's measurement of this host's kernels on this chip's emulation: the host seconds of work a kernel of
  // each shape key did (device/emu/device.h's KernelWork). The emulated chip paces the kernels it lists to it, so a
  // run made after the profile paces them as the profile measured them; empty in a file not profiled here.
  std::map<uint64_t, double> kernel_work;

  // Achievable rates, FLOP/s and bytes/s.
  double peak_flops(bool bf16) const {
    return (bf16 ? peak_tflops : peak_tflops_f32 > 0 ? peak_tflops_f32 : peak_tflops / 2) * 1e12;
  }
  // The achievable GEMM rate, forward and backward together: a large GEMM's (its elements' costs amortised).
  double matmul_flops(bool bf16) const { return peak_flops(bf16) * efficiency; }
  // What one pass of a GEMM of rows x k -> n pays for its elements beside its FLOPs (matmul_element_ns).
  double gemm_element_s(double rows, double k, double n) const {
    return 1e-9 * (matmul_element_ns[0] * rows * k + matmul_element_ns[1] * k * n + matmul_element_ns[2] * rows * n);
  }
  // A GEMM of rows x k -> n, forward and backward (three passes of 2 rows k n FLOPs), at the GEMM rate and with its
  // elements' costs, before matmul_corrections: what the cost model's forward and backward of it sum to.
  double gemm_pair_s(double rows, double k, double n, bool bf16) const {
    return 6 * rows * k * n / matmul_flops(bf16) + 3 * gemm_element_s(rows, k, n);
  }
  // The factor on a GEMM of rows x k -> n from matmul_corrections; 1 for a shape they do not hold.
  double gemm_correction(double rows, double k, double n) const;
  // The factor on a block's forward or backward kernels (head: the head's) at TP tp over `rows` rows, from
  // part_corrections.
  double part_correction(int tp, double rows, bool head, bool backward) const;
  // The factors on it for a forward and a backward GEMM: the backward's keeps 1/3 forward + 2/3 backward at 1.
  double matmul_forward_factor() const { return matmul_forward_speedup; }
  double matmul_backward_factor() const { return 2.0 / (3.0 - 1.0 / matmul_forward_speedup); }
  double attention_flops(bool bf16) const {
    return peak_flops(bf16) * (attention_efficiency > 0 ? attention_efficiency : efficiency / 2);
  }
  double attention_forward_flops(bool bf16) const {
    return attention_forward_efficiency > 0 ? peak_flops(bf16) * attention_forward_efficiency : attention_flops(bf16);
  }
  double bytes_per_second() const { return memory_bandwidth_gbps * 1e9 * memory_efficiency; }
  double elementwise_bytes_per_second() const {
    return elementwise_gbps > 0 ? elementwise_gbps * 1e9 : bytes_per_second();
  }
  double memory_bytes() const { return memory_gib * kBytesPerGiB; }
  double emulation_flops() const { return emulation_tflops > 0 ? emulation_tflops * 1e12 : matmul_flops(false); }
};

struct NodeGroup {
  int chip = 0;  // index into Cluster::chips
  int nodes = 0;
  int chips_per_node = 0;
  double intra_node_gbps = 0;  // per chip, between chips of one node (NVLink-like), GB/s
  double intra_node_latency_us = 0;
  double nic_gbps = 0;  // per chip, to other nodes, GB/s
  double nic_latency_us = 5;

  int devices() const { return nodes * chips_per_node; }
};

// A link between two node groups of different chip types (within one type, the NICs are used).
struct GroupLink {
  int a = 0, b = 0;  // chip indices
  double bandwidth_gbps = 0;
  double latency_us = 0;
  bool device_direct = false;  // RDMA straight from device memory; false: staged through host memory
};

// Where a cluster file's figures come from: a datasheet (the default), `h2 profile` on the chips themselves, or
// `h2 calibrate` from a measured run. Emulated chips follow only measured figures (pipeline/cluster_job.h).
enum class Figures { kDatasheet, kProfiled, kCalibrated };
const char* figures_name(Figures f);  // "datasheet", "profiled", "calibrated"

struct Cluster {
  std::string name;
  Figures figures = Figures::kDatasheet;
  std::vector<ChipType> chips;
  std::vector<NodeGroup> groups;  // one per chip type, in chip order
  std::vector<GroupLink> links;
  int devices_of(int chip) const;
  const NodeGroup& group_of(int chip) const;
  // The link between two chip types; for a == b the group's NIC. Throws if the cluster defines none.
  GroupLink link(int a, int b) const;
  int chip_index(const std::string& name) const;  // -1 when absent
  // A cluster of only the devices of chip `chip` (for the per-type baselines).
  Cluster only(int chip) const;
  // The cluster with each chip type's emulation fixed at the rate it has now (ChipType::emulation_tflops): for a
  // file of measured figures, which must not change the chips that emulate it.
  Cluster with_emulation_kept() const;
  // The cluster less one device of chip `chip` (a failed one): one chip fewer in a single-node group, else one
  // node fewer (the node of a failed chip is taken out whole); a type with no device left has no group.
  Cluster without_device(int chip) const;
};

struct TrainSetup {
  int64_t global_batch = 0;  // sequences per optimizer step
  Precision precision = Precision::kBf16;
  // Cost the memory H2's own runtime allocates in bf16 (model/costs.h, ElementBytes::h2_bf16: f32 gradients and
  // master weights, the residual stream in f32) rather than the published systems' mixed precision
  // (ElementBytes::mixed_bf16). h2 train --cluster sets it; f32 is the same either way.
  bool h2_runtime = false;
  std::vector<Recompute> allowed_recompute = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};
  // A stage may recompute only its first blocks and keep the rest (Megatron-LM's --recompute-method block), when
  // none and a recomputation are both allowed.
  bool partial_recompute = true;
  // The search may return ZB-H1 (backwards split into B and W, Qi et al. 2024) where its replay is faster than
  // 1F1B's for the same layout and its memory holds the deferred W's (plan.h's as_zero_bubble).
  bool zero_bubble = true;
  bool zero1 = true;  // shard the fp32 master weights and Adam moments across data-parallel ranks
  std::vector<int> micro_batches = {1, 2, 4, 8};  // micro-batch sizes the search may use
  int max_tp = 0;                                 // the largest tensor-parallel degree allowed; 0 = any
};

// Checked readers of the planner's files (errors name the file, line and field): a positive finite number — the
// fallback when the key is absent, required when there is none — and a finite number >= 0.
double positive_number(const ConfigNode& node, const char* key, std::optional<double> fallback = std::nullopt);
double non_negative_number(const ConfigNode& node, const char* key, double fallback);

// The figures of one `chips:` entry; a field the entry leaves out is `base`'s (a catalog chip) or its default.
ChipType load_chip(const ConfigNode& n, const ChipType* base = nullptr);
// A cluster file's tree (planner/catalog.h: chips may come from a catalog; load_cluster_arg takes a file or a spec).
Cluster load_cluster(const ConfigNode& root);
// The YAML load_cluster reads (h2 profile writes measured clusters with it).
std::string cluster_to_yaml(const Cluster& cluster);
TransformerShape load_model(const ConfigNode& root);
TrainSetup load_train_setup(const ConfigNode& root);

// The three planner files at once; the model's name is its file's `name`, else the file name.
struct PlanningInputs {
  Cluster cluster;
  TransformerShape model;
  std::string model_name;
  TrainSetup train;
};
PlanningInputs load_planning_inputs(const std::string& cluster_file, const std::string& model_file,
                                    const std::string& train_file);

}  // namespace h2
