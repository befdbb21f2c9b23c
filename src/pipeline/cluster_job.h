// `h2 train --cluster`'s two roles (docs/pipeline.md). The driver plans (or loads a plan), writes plan.json into
// the run's out_dir, starts one rank per device with h2 launch's machinery (which names a failed rank and stops
// the others), then merges the measured trace, writes the simulator's prediction beside it and reports measured
// against predicted step time and the planner's baselines. A rank — started by the driver, or by mpirun / srun
// across hosts with a given plan — joins the job and trains its stage (pipeline/hetero_train.h).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "pipeline/hetero_train.h"
#include "pipeline/profile.h"

namespace h2 {

// The files a cluster job is made of; driver and ranks read the same ones.
struct ClusterJobFiles {
  std::string config;   // training config: data, optimizer, run length (its model unless `model` is given)
  std::string cluster;  // the cluster file
  std::string model;    // optional: the planner's model file, replacing the config's model
  std::string train;    // optional: the planner's setup (global batch, recomputation, micro-batches, zero1, max_tp)
  std::string plan;     // optional for the driver: run this plan.json instead of planning
  std::vector<std::string> overrides;  // --set KEY=VALUE on the config
};

// What driver and ranks derive from the files: the run (config with the model file's model and the setup's batch,
// the cluster), the model's shape and the planner's setup (planned in the precision the runtime trains,
// train.precision, with the memory H2's runtime allocates in it).
struct ClusterJob {
  HeteroRun run;
  TransformerShape shape;
  TrainSetup setup;
};
ClusterJob load_cluster_job(const ClusterJobFiles& files, bool resume);

// The search `h2 train --cluster` plans with: everything, except interleaved 1F1B where a chip type is emulated.
// Emulated chips share this host's cores, so filling the pipeline's bubble does not make them faster: on 16
// emulated devices (bench/run_emulated.sh, 2026-12-04) an interleaved plan predicted 3.65 s and measured 5.01 s,
// where the 1F1B plan predicted 4.72 s and measured 5.03 s. An interleaved plan given with --plan runs.
PlannerOptions job_planner_options(const Cluster& cluster);

// A given plan (--plan) costed for another precision than the run's, or for bf16 as published systems hold it,
// still runs, in the run's precision; its predicted memory and times are not the run's. What to tell the user,
// after the plan file's name; empty when the plan was costed for what runs.
std::string costed_otherwise(const Plan& plan, const TrainSetup& runs);

// What to tell the user when a run's measured step misses its simulation by more than 10% (measured / simulated
// `ratio`): by how much, and that `h2 calibrate` fits the cluster's figures to the run in `out_dir`; empty within 10%.
std::string simulation_miss(double ratio, const std::string& out_dir);

// The host memory a plan's ranks take when all of them run on this host, as h2 train --cluster's driver starts them:
// rank_host_bytes (pipeline/hetero_train.h) summed over them. Error(kConfig) from check_host_memory when
// that is more than `available` bytes, with the figures and what to do instead: on a 2-core host with 24 GiB, the
// 1,024-chip example's plan for the small GPT started 100 ranks, which the kernel's OOM killer stopped.
HostBytes local_ranks_host_bytes(const Plan& plan, const Cluster& cluster, bool zero1);
void check_host_memory(const Plan& plan, const Cluster& cluster, bool zero1, double available);

struct DriverOptions {
  bool profile = false;  // measure the chips and links first (h2 profile) and plan on the measured cluster
  bool quiet = false;    // no progress lines from rank 0
  // When a rank dies: re-plan on the devices left (that device out), resume the newest verified checkpoint under
  // the new plan and go on, reporting the time lost; without it the job ends with the rank's status.
  bool elastic = false;
  // argv of one rank of this job for the plan at `plan_path` on the cluster file `cluster_path` (the job's, or with
  // `profile` the profiled one: its kernel_work paces the emulated chips as profiled, device/emu/device.h) — the h2
  // binary with --as-rank and the job's other files —, resuming the newest checkpoint when `resume`.
  std::function<std::vector<std::string>(const std::string& plan_path, const std::string& cluster_path, bool resume)>
      rank_command;
  // argv of one measuring rank, for `profile` (pipeline/profile.h).
  decltype(ProfileJob::rank_command) profile_rank_command;
};

// The driver: returns the job's exit status (a failed rank's, or 0).
int drive_cluster_job(const ClusterJobFiles& files, bool resume, const DriverOptions& options);

// One rank: `external` when started by mpirun or srun (then rank 0 also writes plan.json and, at the end, the
// merged trace and summary). Needs files.plan. Returns 0, or 130 when interrupted (SIGINT/SIGTERM).
int run_cluster_rank(const ClusterJobFiles& files, bool resume, bool quiet, bool external);

}  // namespace h2
