// `h2 train --cluster`: training a plan for real (docs/architecture.md, "pipeline"). The driver plans (or loads a
// plan), starts one process per device with h2 launch's machinery, and each process - one rank - runs its stage: its
// layer range of the GPT on an emulated chip of its stage's type (speed and memory from the cluster file), the 1F1B
// schedule over DiComm, gradient reduction over its stage's replicas.
//
// Outputs in the run's out_dir: plan.json (what ran), metrics.jsonl (rank 0: loss, norm, lr, step time,
// tokens/s), trace_measured.json (every rank's compute and communication actions, Chrome trace format, one
// process row per rank) beside trace_predicted.json (the simulator's trace of the same plan), summary.json
// (measured and predicted step time), checkpoints/ (train/checkpoint.h: one file pair per stage, parameters by
// name, so a checkpoint does not depend on the plan that wrote it: a resumed run may use another plan, and
// single-device `h2 train` and `h2 sample` read it too).
//
// Fault injection for tests: H2_FAULT_KILL=RANK:STEP makes that rank kill itself (SIGKILL) in the middle of
// that 1-based step, after its first action.
#pragma once

#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "comm/job.h"
#include "pipeline/runtime.h"
#include "planner/plan.h"
#include "planner/planner.h"
#include "planner/spec.h"
#include "train/trainer.h"

namespace h2 {

struct HeteroRun {
  TrainConfig config;  // model, data, optimizer, steps, out_dir (config.device is ignored: the plan decides)
  Cluster cluster;
  Plan plan;
  bool zero1 = false;
  bool resume = false;  // continue from the newest checkpoint in out_dir/checkpoints
};

// The ranks a plan runs on: each stage's replicas and tensor-parallel degree, and its chunks per stage.
StageLayout stage_layout_of(const Plan& plan);

// Error(kConfig) naming the stage and field when the runtime cannot run `plan` on `model`: what check_plan refuses
// (stages that do not cover the blocks in order, replicas that do not divide a micro-batch, fewer layers than
// chunks on a stage, ...), a plan made for another model, the embedding not first or the head not last, a TP
// degree that does not divide the heads, GPipe (1F1B and interleaved 1F1B run: a rank runs one range of blocks
// per chunk), interleaving on one stage.
void check_plan_runs(const Plan& plan, const GptConfig& model);

// The GPT configuration the planner's model file describes (layers, hidden, heads, vocab, seq_len).
GptConfig gpt_config_of(const TransformerShape& shape);

// The emulated chip a cluster's chip type becomes on a host with `host_cores` cores (0: this host's): its memory,
// and its speed relative to the fastest type in the cluster (by ChipType::emulation_flops: a file of measured figures
// keeps the emulation of the file it measured), times one factor for the whole cluster. A paced
// chip of speed s keeps s of a core busy, so the factor slows every chip alike until the cluster's devices,
// all busy, need at most 40% of the cores (the rest for communication, the system, the time slices a rank
// waits for a core and the slowdown ranks sharing caches and memory bandwidth give each other's kernels): emulation is
// faithful only then (device/emu/device.h). The fastest type runs at this host's speed when the cores suffice.
// The chip type's kernel_work (h2 profile's, in a profiled file) is the emulation's reference of kernel work.
EmuProfile emu_profile_of(const Cluster& cluster, const std::string& chip, int host_cores = 0);

// The device a rank of chip type `chip` runs on, by the type's backend: its emulation (emu_profile_of), this
// host's cores (cpu), or a GPU of this host (cuda), each with the chip's memory as its capacity. `index` numbers
// it: the rank, or for cuda the GPU (gpu_ordinals).
DeviceSpec device_spec_of(const Cluster& cluster, const std::string& chip, int index);

// The GPU of each rank whose device is one (gpu[r]): such ranks take their host's GPUs in rank order, the k-th of
// them on a host GPU k; -1 for the other ranks. hosts: each rank's host, as any id equal on one host only.
std::vector<int> gpu_ordinals(const std::vector<uint64_t>& hosts, const std::vector<bool>& gpu);

struct RankOutcome {
  int64_t steps_done = 0;
  float last_loss = 0;
  float val_loss = -1;      // the last held-out evaluation's mean loss; -1 without one
  double step_seconds = 0;  // measured: mean after two warm-up steps (over all steps in shorter runs)
  bool interrupted = false;
};

// Runs this rank's part of the plan for config.steps steps. Rank 0 prints progress (unless quiet) and writes
// metrics; every rank writes its trace part; the caller merges them. Throws CommError naming a failed peer.
RankOutcome run_rank(const HeteroRun& run, Job& job, bool quiet, const std::atomic<bool>* stop_requested);

// The host memory a rank takes: its process (kRankProcessBytes), its device where the device's memory is the host's
// (an emulated or cpu chip's: `device_bytes`, the plan's memory per device; a GPU's is not) and what its checkpoints
// hold in the host's memory while they are written (`checkpoint_bytes`, checkpoint_host_bytes). h2 train --cluster
// counts it for every rank before it starts them on one host (check_host_memory, pipeline/cluster_job.h), and every
// rank measures its peak resident memory beside it (summary.json's memory[]: host_peak_bytes beside
// host_counted_bytes).
inline constexpr double kRankProcessBytes = 256.0 * (1 << 20);  // measured 174-180 MiB besides the rest, 2026-12-07
struct HostBytes {
  int ranks = 0;
  double processes = 0, devices = 0, checkpoints = 0;
  double total() const { return processes + devices + checkpoints; }
  HostBytes& operator+=(const HostBytes& o);
};
HostBytes rank_host_bytes(const std::string& backend, double device_bytes, double checkpoint_bytes);

// The host buffers of a checkpoint at its peak on TP rank `t` of `stage`'s replica `replica` (RankTraining::save):
// every rank copies its Adam moments out (two f32 per parameter of its shard; with `zero1`, gathered over the
// replicas beside its own share), and the ranks of a stage's first replica send the shards of its tensors, one at a
// time, to their TP rank 0, which puts each together and writes it (checkpoint.h's write_model_files): for the
// largest tensor the stage writes, each rank's shard, and on the writer its value and both moments whole in f32, a
// block's matrix transposed to Hugging Face's layout besides, and the shard it is receiving. Measured: the built-in
// example's first-stage ranks took 426 MiB besides their devices, 2026-12-07, where 256 MiB had been counted
// without it (the whole stage was put together then, on every TP rank).
double checkpoint_host_bytes(const Plan& plan, int stage, int replica, int t, bool zero1);

// How long ranks wait on each other around a checkpoint (RankTraining::save and restore): `base`, the communicator's
// timeout, plus the time to move the whole checkpoint — every stage's parameters whole, their value and both Adam
// moments in f32 — at kCheckpointFloorBytesPerSecond, the slowest storage a run is expected to write to or read from:
// a save waits for its slowest writer, a resume for the slowest rank's share of each candidate's verification and
// for each rank's load. (With the communicator's 30 s alone, the other ranks would give up on the writer of a stage of
// a 100B model, over 100 GB.)
inline constexpr double kCheckpointFloorBytesPerSecond = 50e6;
std::chrono::milliseconds checkpoint_timeout(const Plan& plan, std::chrono::milliseconds base);

struct RankHostMemory {
  double peak = 0;     // measured: the rank's peak resident memory
  double counted = 0;  // rank_host_bytes for it, in all
};
// What h2 train prints after a run: the ranks' peak resident memory beside what was counted for them, together and
// for the rank highest against its count, and a warning naming the rank when one took more — saying, when the run
// `resumed`, that a rank's peak then holds what it read of the checkpoint's files through a mapping (page cache).
std::string host_memory_line(const std::vector<RankHostMemory>& ranks, bool resumed);

struct FinishedRun {
  double measured_over_simulated = 0;  // step time
  std::string host_memory;             // host_memory_line
};
// After all ranks ended: merges the per-rank trace parts into trace_measured.json, writes the simulator's
// prediction as trace_predicted.json and summary.json.
FinishedRun finish_run(const HeteroRun& run, int ranks);

}  // namespace h2
