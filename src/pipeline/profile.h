// `h2 profile` (docs/architecture.md, "pipeline"): measures, on the devices at hand, what the planner and the simulator
// otherwise take from a datasheet, and writes a cluster file with the measured figures - so that predictions are
// about this cluster.
//
// Per chip type (an emulated chip of that type here), with the cores each rank will get, the figures of the cost
// model's kernel roofline (planner/cost_model.h): the fixed cost of a kernel (tiny kernels); the GEMM rate and its
// elements' costs, fitted to the forward and backward of the model's GEMMs at the micro-batch's rows and 4 times
// them, at TP 1 and 2 (their times less their fixed costs; fit_matmul); the attention core's rate likewise; the
// element-wise kernels' rate (the bytes the cost model counts for a block's and the head's over their time); and
// the optimizer step's rate (norm, clipping, AdamW) as the memory bandwidth that makes the cost model's optimizer
// formula (40 bytes of traffic per f32 parameter) true. A block's forward + backward and the head's are measured whole
// too, at every TP degree the chip may run (and, as the GEMMs, at more rows), printed beside what the cost model
// composes for their kernels from those figures, and kept as its corrections (ChipType::part_corrections). Per link:
// DiComm latency from 8-byte all-reduces of every pair of ranks at once after a GEMM each (a message under the job's
// load: with more processes than cores, the wait for a partner to get a core back) and bandwidth from 32 MiB
// all-reduces likewise, applied to every link and NIC of the cluster (on one host they are all the same path). `h2
// profile` runs one process per device; each chip type is measured on the first of them that has it while the others
// sleep (an emulated chip counts a kernel's work as the least its shapes have done, without other ranks in the host's
// caches: device/emu/device.h), and the links with every process at once.
#pragma once

#include <array>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "device/emu/device.h"
#include "planner/spec.h"

namespace h2 {

// A GEMM timed: rows x k -> n columns, its forward and backward's time beyond their kernels' fixed costs.
struct GemmTiming {
  double rows = 0, k = 0, n = 0, seconds = 0;
};

struct ChipMeasurement {
  std::string chip;
  double speed = 1;              // the emulated chip's speed (relative to this host)
  double kernel_overhead_s = 0;  // the fixed cost of one kernel
  double matmul_flops = 0;       // GEMMs' rate beyond their fixed costs and their elements' (fit_matmul), FLOP/s
  std::array<double, 3> matmul_element_s{};  // and those (ChipType::matmul_element_ns, in seconds)
  double matmul_fit_error = 0;               // the fit's root-mean-square relative error over the GEMMs fitted
  // The model's GEMMs at TP 1 and 2, the micro-batch's rows and 4x (fitted), then those at MeasureOptions::max_rows's.
  std::vector<GemmTiming> gemms;
  double attention_flops = 0;          // the attention core's backward
  double attention_forward_flops = 0;  // its forward
  double memory_gbps = 0;  // the optimizer step's rate as the memory bandwidth the cost model's formula needs
  // Measured whole: a block's forward and backward and the head's forward (with the loss) and backward at TP degree
  // tp over rows rows, each the slowest of the TP group's ranks; the first at TP 1 and the micro-batch's rows.
  struct PartTiming {
    double tp = 1, rows = 0, block_forward_s = 0, block_backward_s = 0, head_forward_s = 0, head_backward_s = 0;
    double block_s() const { return block_forward_s + block_backward_s; }
    double head_s() const { return head_forward_s + head_backward_s; }
  };
  std::vector<PartTiming> parts;
  // What selective recomputation adds to a block's backward: the attention core's forward as the model times it.
  double recompute_s = 0;
  // The GEMMs' forwards' rate over forward and backward's together (planner/spec.h's matmul_forward_speedup).
  double matmul_forward_speedup = 1;
  double elementwise_gbps = 0;  // a block's and the head's element-wise and row-wise kernels (ChipType's)
  KernelWork kernel_work;       // an emulated chip's: the least work each kernel shape did (device/emu/device.h)
};

// The figures in a fixed order (for sending them between ranks): these, then each part's tp, rows, block forward and
// backward and head forward and backward seconds, then each GEMM's rows, k, n and seconds.
inline constexpr const char* kMeasurementFigures[] = {"kernel_overhead_s",
                                                      "matmul_flops",
                                                      "attention_flops",
                                                      "memory_gbps",
                                                      "part_count",
                                                      "recompute_s",
                                                      "attention_forward_flops",
                                                      "matmul_forward_speedup",
                                                      "matmul_element_input_s",
                                                      "matmul_element_weight_s",
                                                      "matmul_element_output_s",
                                                      "matmul_fit_error",
                                                      "elementwise_gbps"};
std::vector<double> measurement_figures(const ChipMeasurement& m);
ChipMeasurement measurement_of(const std::vector<double>& figures);
// The GEMM rate and elements' costs that best explain the GEMMs' times as 6 rows k n / flops + 3 (a rows k + b k n +
// c rows n) — forward and backward: three passes over the same three matrices — by least squares of the relative
// error, each cost >= 0 (one the data would make negative is dropped and the rest fitted again). Fewer than four
// GEMMs, or a fit without a positive rate: the rate of all of them together and no elements' costs.
struct MatmulFit {
  double flops = 0;
  std::array<double, 3> element_s{};
  double rms_error = 0;  // relative, over the GEMMs
};
MatmulFit fit_matmul(const std::vector<GemmTiming>& gemms);

struct LinkMeasurement {
  double bandwidth_gbps = 0;
  double latency_us = 0;       // a message's, while every rank computes (what the profiled cluster gets)
  double idle_latency_us = 0;  // a message's, the other ranks idle
};

// How measure_chip measures: `rounds` timed rounds after one that warms up, more while `min_seconds` have not
// passed; each figure is the least of its rounds (what the host adds - a late wake-up, another process - only
// lengthens a round). With `reference`, an emulated chip paces the kernels it lists to that work (device/emu/
// device.h): the figures are then those of the kernels as training paces them after this profile, and kernel_work
// is the reference, with the least work of each kernel it does not list; with two rounds or more, none warms up
// (a paced kernel takes its reference's time, cold or warm, and the least of the rounds leaves out the first one's
// page faults; on the built-in example h2 profile's timed pass took 135 s of its 167 s on an AVX2-only host).
// With `max_rows`, the model's GEMMs are also timed at twice, 8 times, ... the micro-batch's rows up to `max_rows`
// sequences (an emulated chip's on an unpaced copy of it, over its speed; kept in gemms, not fitted) and, without a
// reference, an emulated chip learns the work of a stage's kernels at twice, 4 times, ... them; a block and the
// head are timed whole at those rows on the chip (an emulated one's only with a reference: paced as training paces
// them).
// `progress` runs after each measurement (a round, a shape, a part at a TP degree; seconds each, at most tens on a
// slow host): for a caller to tell others it is still at work (take_turns).
// With `unpaced`, an emulated chip runs at the host's speed, without sleeping: for learning its kernels' work, which
// does not depend on its speed (its times are then the host's).
struct MeasureOptions {
  int rounds = 3;
  double min_seconds = 0;
  const KernelWork* reference = nullptr;
  bool unpaced = false;
  int max_rows = 0;
  std::function<void()> progress = [] {};
};
// The GEMMs, a block and the head run in `precision` as training will (bf16: the products from bf16 inputs, model/
// gpt.h). Without a reference, also the kernels the embedding, a block and the head run on each TP rank at every TP
// degree the planner may give the chip, forward, backward and the optimizer step (their work only, untimed): a
// reference a measurement made lists them already.
ChipMeasurement measure_chip(const Cluster& cluster, const std::string& chip, const TransformerShape& shape,
                             int micro_batch, Precision precision, const MeasureOptions& options = {});
// A collective over `world`, each rank on a device of its `chip`; every rank gets the result. The latency under load
// times a GEMM of the shape's TP-2 block size (micro-batch rows) with and without an all-reduce after it.
LinkMeasurement measure_link(Communicator& world, const Cluster& cluster, const std::string& chip,
                             const TransformerShape& shape, int micro_batch);
// The latency under load from each rank's GEMM alone and followed by its pair's all-reduce, {alone, with} per rank
// in rank order, pairs (0, 1), (2, 3), ...: what a pair's all-reduce adds beyond its slower rank's GEMM, over the
// two messages the cost model's ring counts for two ranks, averaged over the pairs (an odd last rank has none).
double latency_under_load_s(const std::vector<double>& alone_with);

// The cluster with the measured figures in place of the datasheet's. The GEMM rate measured (in the precision
// profiled) stands for the chip's peak in both precisions: a profile is for training in its own precision. Each
// chip type's kernel_work is its measurement's, and its part_corrections each part's time over what the cost model
// composes for its kernels from those figures (`shape` in `precision`).
Cluster profiled_cluster(const Cluster& cluster, const std::vector<ChipMeasurement>& chips, const LinkMeasurement& link,
                         const TransformerShape& shape, Precision precision);

// The whole measurement, as `h2 profile` runs it: one process per device (at most 16; each chip type keeps its
// share), started with h2 launch's machinery by `rank_command` (the arguments that make a process call
// profile_rank with the same files), each measuring its chip type while the others measure theirs; then the
// link. Prints a table per chip type and writes the profiled cluster file `out` (atomically), each emulated chip
// type with its kernel work: the reference the training ranks' emulated chips then pace those kernels to
// (device/emu/device.h).
struct ProfileJob {
  std::string cluster_file;
  TransformerShape shape;   // the model whose shapes are measured
  std::string model_label;  // where it came from, for the file's header
  int micro_batch = 1;
  // The most sequences a replica may run at once in training (the global batch): the GEMMs are timed and an
  // emulated chip's kernel work lists a stage's kernels up to them (MeasureOptions::max_rows); 0: at the
  // micro-batch's rows only.
  int max_rows = 0;
  Precision precision = Precision::kF32;  // the precision training will run in
  std::string out;
  // argv of one measuring rank, given the files it reads and the file rank 0 writes its raw results to.
  std::function<std::vector<std::string>(const std::string& cluster_file, const std::string& model_file,
                                         int micro_batch, int max_rows, Precision precision,
                                         const std::string& raw_out)>
      rank_command;
};
// Returns 0, or 128 + the signal when a user's SIGINT or SIGTERM stopped it (then `out` is not written); throws
// Error(kInternal) naming the rank when a measuring rank failed.
int profile_cluster(const ProfileJob& job);

// The order in which profile_rank's ranks measure, one at a time: the first rank of each chip type (`rank_chips`
// names each rank's), in rank order, `passes` times over.
std::vector<int> measuring_turns(const std::vector<std::string>& rank_chips, int passes);

// One turn after another (`turns`: ranks of `world`, as measuring_turns gives them): at each of its turns this rank
// runs `measure(progress)` while the others sleep; `progress()` tells every other rank that it is still at work (at
// most ten times per `silence`) and the turn's end that it is done. A waiting rank gives up, naming the rank and the
// turn it waited for, only after `silence` without a word from it, however long the whole chain takes (a fixed wait
// for the chain stopped bench/run_hetero.sh's profile on a slow host, 2026-12-07).
void take_turns(Communicator& world, const std::vector<int>& turns,
                const std::function<void(const std::function<void()>& progress)>& measure,
                std::chrono::milliseconds silence);

// One measuring rank (a process started by profile_cluster): joins the job, measures, and rank 0 writes what
// every rank found to `raw_out` (JSON).
void profile_rank(const std::string& cluster_file, const TransformerShape& shape, int micro_batch, int max_rows,
                  Precision precision, const std::string& raw_out);

}  // namespace h2
