// `h2 train --cluster`: the driver and a rank's entry (see cluster_job.h).
#include "pipeline/cluster_job.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "comm/job.h"
#include "comm/launch.h"
#include "core/clock.h"
#include "core/config.h"
#include "core/error.h"
#include "core/file.h"
#include "core/format.h"
#include "core/log.h"
#include "core/signals.h"
#include "device/registry.h"
#include "pipeline/profile.h"
#include "planner/catalog.h"
#include "planner/layout.h"
#include "planner/report.h"
#include "train/checkpoint.h"

namespace h2 {
namespace {

namespace fs = std::filesystem;

// The figures the plan was made with, beside it (h2 calibrate starts from them).
void write_cluster_file(const Cluster& cluster, const std::string& from, const std::string& out_dir) {
  write_file_atomic((fs::path(out_dir) / "cluster.yaml").string(),
                    cat("# The figures this run was planned on (from ", from, ")\n", cluster_to_yaml(cluster)));
}

// The last training step rank 0 logged in metrics.jsonl (0 when none).
int64_t last_logged_step(const std::string& metrics) {
  std::ifstream in(metrics);
  int64_t step = 0;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("loss") && j.contains("step")) step = j["step"].get<int64_t>();
  }
  return step;
}

void warn_if_costed_otherwise(const Plan& plan, const TrainSetup& runs, const std::string& path) {
  const std::string warning = costed_otherwise(plan, runs);
  if (!warning.empty()) log_warn(path, warning);
}

}  // namespace

PlannerOptions job_planner_options(const Cluster& cluster) {
  PlannerOptions options;
  for (const ChipType& c : cluster.chips) options.interleave = options.interleave && c.backend != "emu";
  return options;
}

std::string costed_otherwise(const Plan& plan, const TrainSetup& runs) {
  const auto costed = [](Precision p, bool h2) {
    return p == Precision::kF32 ? std::string("f32") : cat("bf16 (", h2 ? "H2's runtime" : "published systems'", ")");
  };
  if (plan.precision == runs.precision && (plan.precision == Precision::kF32 || plan.h2_runtime)) return "";
  return cat(" was costed for ", costed(plan.precision, plan.h2_runtime), "; this run trains in ",
             costed(runs.precision, true),
             " (train.precision), so its predicted memory and times are not this run's. Re-plan without --plan, or "
             "set train.precision");
}

std::string simulation_miss(double ratio, const std::string& out_dir) {
  if (!(std::abs(ratio - 1) > 0.10)) return "";
  return format(
      "note: the run took %.0f%% %s than simulated; h2 calibrate %s fits the cluster's figures to its "
      "trace and writes a cluster file to plan with (docs/planner.md)\n",
      100 * std::abs(ratio - 1), ratio > 1 ? "longer" : "less time", out_dir.c_str());
}

ClusterJob load_cluster_job(const ClusterJobFiles& files, bool resume) {
  ClusterJob in;
  ConfigNode root = ConfigNode::load_file(files.config);
  for (const std::string& o : files.overrides) root.apply_override(o);
  in.run.config = TrainConfig::from_config(root);
  in.run.cluster = load_cluster_arg(files.cluster);
  if (!files.model.empty()) {
    in.shape = load_model(ConfigNode::load_file(files.model));
    in.run.config.model = gpt_config_of(in.shape);
  } else {
    in.shape = in.run.config.model.shape();
  }
  in.run.config.seq_len = static_cast<int>(in.shape.seq_len);
  // The precision is the config's train.precision where it says one (a --set too), else the planner's train
  // file's where it says one, else f32 (TrainConfig's default); the plan counts the memory H2's runtime allocates
  // in it.
  const auto train = root.find("train");
  const bool config_says = train && train->has("precision");
  if (!files.train.empty()) {
    const ConfigNode setup = ConfigNode::load_file(files.train);
    in.setup = load_train_setup(setup);
    if (!config_says && setup.has("precision")) in.run.config.precision = in.setup.precision;
  } else {
    in.setup.global_batch = in.run.config.batch_size;
    in.setup.zero1 = false;
  }
  in.setup.precision = in.run.config.precision;
  in.setup.h2_runtime = true;
  in.run.config.batch_size = static_cast<int>(in.setup.global_batch);
  in.run.zero1 = in.setup.zero1;
  in.run.resume = resume;
  return in;
}

int run_cluster_rank(const ClusterJobFiles& files, bool resume, bool quiet, bool external) {
  ClusterJob in = load_cluster_job(files, resume);
  const JobEnv env = job_env();
  if (files.plan.empty()) {
    throw Error(ErrorCode::kConfig,
                cat("h2 train --cluster under ", env.source,
                    " needs --plan: every rank must run the same plan (write one with h2 plan ... --out "
                    "plan.json, or take the plan.json of an earlier h2 train --cluster)"));
  }
  in.run.plan = load_plan(files.plan);
  check_plan_on_cluster(in.run.plan, in.run.cluster, files.plan);
  check_plan_runs(in.run.plan, in.run.config.model);
  if (env.rank == 0) warn_if_costed_otherwise(in.run.plan, in.setup, files.plan);
  const int ranks = stage_layout_of(in.run.plan).world_size();
  if (external && env.world_size != ranks) {
    throw Error(ErrorCode::kConfig, cat(files.plan, " needs ", ranks, " ranks (one per device); ", env.source,
                                        " started ", env.world_size));
  }
  const std::atomic<bool>& stop = stop_on_signals();
  auto job = join_job(env);
  if (external && env.rank == 0) {
    make_directory(in.run.config.out_dir, "train.out_dir");
    save_plan(in.run.plan, (fs::path(in.run.config.out_dir) / "plan.json").string());
    write_cluster_file(in.run.cluster, files.cluster, in.run.config.out_dir);
  }
  const RankOutcome r = run_rank(in.run, *job, quiet, &stop);
  if (external && env.rank == 0 && !r.interrupted) {
    const FinishedRun done = finish_run(in.run, ranks);
    std::printf("done: measured step %.3f s; measured / simulated %.2f; traces in %s\n%s%s", r.step_seconds,
                done.measured_over_simulated, in.run.config.out_dir.c_str(),
                simulation_miss(done.measured_over_simulated, in.run.config.out_dir).c_str(), done.host_memory.c_str());
  }
  return r.interrupted ? 130 : 0;
}

HostBytes local_ranks_host_bytes(const Plan& plan, const Cluster& cluster, bool zero1) {
  HostBytes need;
  for (int k = 0; k < static_cast<int>(plan.stages.size()); ++k) {
    const StagePlan& stage = plan.stages[static_cast<size_t>(k)];
    int replica = 0;
    for (const ReplicaGroup& g : stage.replica_groups()) {
      const std::string& backend = cluster.chips[static_cast<size_t>(cluster.chip_index(g.chip))].backend;
      for (int end = replica + g.replicas; replica < end; ++replica) {
        for (int t = 0; t < stage.tp; ++t) {
          need += rank_host_bytes(backend, g.memory_bytes, checkpoint_host_bytes(plan, k, replica, t, zero1));
        }
      }
    }
  }
  return need;
}

void check_host_memory(const Plan& plan, const Cluster& cluster, bool zero1, double available) {
  const HostBytes need = local_ranks_host_bytes(plan, cluster, zero1);
  if (need.total() <= available) return;
  throw Error(ErrorCode::kConfig,
              cat("this plan starts ", need.ranks, " ranks on this host, which need about ", format_bytes(need.total()),
                  " of its memory (", format_bytes(need.devices), " for the devices whose memory is the host's, ",
                  format_bytes(need.checkpoints), " for writing checkpoints, ", format_bytes(kRankProcessBytes),
                  " for each rank's process) and it has ", format_bytes(available),
                  " available. Plan for fewer devices (a cluster file with fewer nodes, or --plan a plan.json that "
                  "uses fewer), or start the ranks across hosts with mpirun or srun and --plan (docs/pipeline.md)"));
}

int drive_cluster_job(const ClusterJobFiles& files, bool resume, const DriverOptions& options) {
  ClusterJob in = load_cluster_job(files, resume);
  const std::string& out_dir = in.run.config.out_dir;
  make_directory(out_dir, "train.out_dir");
  // The ranks emulate the cluster file's chips; the planner may see the measured ones.
  Cluster planned_on = in.run.cluster;
  std::string ranks_cluster = files.cluster;  // the file the ranks load
  if (options.profile) {
    ranks_cluster = (fs::path(out_dir) / "cluster_profiled.yaml").string();
    // At the least micro-batch's rows only: listing every rows a replica may take, up to the global batch
    // (ProfileJob::max_rows), took the built-in example past its 5 minutes (docs/pipeline.md, h2 profile).
    const int stopped =
        profile_cluster(ProfileJob{files.cluster, in.shape, files.model.empty() ? files.config : files.model,
                                   *std::min_element(in.setup.micro_batches.begin(), in.setup.micro_batches.end()),
                                   /*max_rows=*/0, in.setup.precision, ranks_cluster, options.profile_rank_command});
    if (stopped != 0) return stopped;
    planned_on = load_cluster(ConfigNode::load_file(ranks_cluster));
  }
  if (files.plan.empty() && planned_on.figures == Figures::kDatasheet) {
    std::printf(
        "warning: %s holds datasheet figures, which the emulated chips on this host do not follow (they run at "
        "speeds relative to this host's cores): the predicted times will not be the measured ones. Plan on measured "
        "figures with --profile, or calibrate afterwards: h2 calibrate %s\n",
        files.cluster.c_str(), out_dir.c_str());
  }
  const CostModel costs(planned_on, in.shape, in.setup);
  if (files.plan.empty()) {
    in.run.plan = plan_training(costs, job_planner_options(planned_on));
    in.run.plan.model = files.model.empty() ? files.config : files.model;
  } else {
    in.run.plan = load_plan(files.plan);
    check_plan_on_cluster(in.run.plan, in.run.cluster, files.plan);
    warn_if_costed_otherwise(in.run.plan, in.setup, files.plan);
  }
  std::fputs(format_plan(in.run.plan).c_str(), stdout);
  check_plan_runs(in.run.plan, in.run.config.model);
  const int ranks = stage_layout_of(in.run.plan).world_size();
  const std::string plan_path = (fs::path(out_dir) / "plan.json").string();
  save_plan(in.run.plan, plan_path);
  write_cluster_file(planned_on, files.cluster, out_dir);
  check_host_memory(in.run.plan, in.run.cluster, in.run.zero1, static_cast<double>(available_host_memory_bytes()));
  std::printf("launching %d ranks (one per device, on its chip type's backend); outputs in %s\n", ranks,
              out_dir.c_str());
  std::fflush(stdout);
  // Emulated chips share this host's cores: give each rank its share, so that busy ranks do not slow each other
  // down beyond their profiles (device/emu/device.h, where emulation stops being faithful).
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    const int share = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / ranks);
    ::setenv("OMP_NUM_THREADS", std::to_string(share).c_str(), 1);
  }
  LaunchOptions launch_options;
  launch_options.ranks = ranks;
  LaunchResult result = launch(options.rank_command(plan_path, ranks_cluster, resume), launch_options);
  std::optional<CostModel> left;  // under --elastic, the cost model of the devices left after failures
  for (int failure = 1; result.exit_code != 0 && options.elastic && result.failed_rank >= 0; ++failure) {
    const double failed_at = monotonic_seconds();
    const StageLayout::Place where = stage_layout_of(in.run.plan).place(result.failed_rank);
    const StagePlan& stage = in.run.plan.stages[static_cast<size_t>(where.stage)];
    const std::string dead = stage.group_of(where.replica).chip;
    planned_on = planned_on.without_device(planned_on.chip_index(dead));
    ::unsetenv("H2_FAULT_KILL");  // a fault injected for the first run is not injected again
    left.emplace(planned_on, in.shape, in.setup);
    Plan next = plan_training(*left, job_planner_options(planned_on));
    next.model = in.run.plan.model;
    // The checkpoint the ranks will try first, and its step for the steps to redo. Not read through here (at 100B
    // with its moments, over a terabyte): the ranks verify it in shares and fall back to an older one if it does not.
    std::string from;
    int64_t from_step = 0;
    for (const std::string& c : resume_candidates((fs::path(out_dir) / "checkpoints").string(), nullptr)) {
      try {
        from_step = read_checkpoint_state(c).step;
        from = c;
        break;
      } catch (const Error&) {  // its state unreadable: the next one (none: the new plan starts over)
      }
    }
    const int64_t reached = last_logged_step((fs::path(out_dir) / "metrics.jsonl").string());
    std::printf("elastic: %s; the %s device is taken out and the job re-planned on the %d devices left:\n",
                result.message.c_str(), dead.c_str(), stage_layout_of(next).world_size());
    std::fputs(format_plan(next).c_str(), stdout);
    save_plan(in.run.plan, (fs::path(out_dir) / cat("plan.before_failure_", failure, ".json")).string());
    in.run.plan = next;
    save_plan(in.run.plan, plan_path);
    launch_options.ranks = stage_layout_of(in.run.plan).world_size();
    std::printf("elastic: %s; %lld step(s) to redo (%lld reached); %.2f s to re-plan\n",
                from.empty() ? "no checkpoint yet, starting over"
                             : cat("resuming ", from, " (once the ranks verify it)").c_str(),
                static_cast<long long>(std::max<int64_t>(0, reached - from_step)), static_cast<long long>(reached),
                monotonic_seconds() - failed_at);
    std::fflush(stdout);
    result = launch(options.rank_command(plan_path, ranks_cluster, !from.empty()), launch_options);
  }
  if (result.exit_code != 0) return result.exit_code;
  const int ranks_run = stage_layout_of(in.run.plan).world_size();
  const FinishedRun done = finish_run(in.run, ranks_run);
  const double ratio = done.measured_over_simulated;
  const nlohmann::json summary = nlohmann::json::parse(read_file((fs::path(out_dir) / "summary.json").string()));
  std::printf(
      "done: measured step %.3f s, %.0f tokens/s; simulated %.3f s (measured / simulated %.2f); planned %.0f "
      "tokens/s\ntraces: %s/trace_measured.json beside trace_predicted.json\n%s",
      summary["measured_step_s"].get<double>(), summary["measured_tokens_per_s"].get<double>(),
      summary["simulated_step_s"].get<double>(), ratio, summary["planned_tokens_per_s"].get<double>(), out_dir.c_str(),
      simulation_miss(ratio, out_dir).c_str());
  std::fputs(done.host_memory.c_str(), stdout);
  if (files.plan.empty()) {  // a given plan was made elsewhere: its baselines are not this planner's to state
    std::printf("predicted baselines:\n%s",
                format_baselines(plan_baselines(left ? *left : costs, in.run.plan, job_planner_options(planned_on)),
                                 in.run.plan)
                    .c_str());
  }
  return 0;
}

}  // namespace h2
