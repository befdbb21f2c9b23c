// `h2 train --cluster`: the driver and a rank's entry (see cluster_job.h).
#include "pipeline/cluster_job.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "comm/job.h"
#include "comm/launch.h"
#include "core/config.h"
#include "core/file.h"
#include "core/signals.h"
#include "pipeline/profile.h"
#include "planner/catalog.h"
#include "planner/layout.h"
#include "planner/report.h"

namespace h2 {
namespace {

namespace fs = std::filesystem;

// The figures the plan was made with, beside it (h2 calibrate starts from them).
void write_cluster_file(const Cluster& cluster, const std::string& from, const std::string& out_dir) {
  write_file_atomic((fs::path(out_dir) / "cluster.yaml").string(),
                    cat("# The figures this run was planned on (from ", from, ")\n", cluster_to_yaml(cluster)));
}

}  // namespace

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
  if (!files.train.empty()) {
    in.setup = load_train_setup(ConfigNode::load_file(files.train));
  } else {
    in.setup.global_batch = in.run.config.batch_size;
    in.setup.zero1 = false;
  }
  in.setup.precision = Precision::kF32;  // the runtime trains in f32: plan what it runs
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
    const double ratio = finish_run(in.run, ranks);
    std::printf("done: measured step %.3f s; measured / simulated %.2f; traces in %s\n", r.step_seconds, ratio,
                in.run.config.out_dir.c_str());
  }
  return r.interrupted ? 130 : 0;
}

int drive_cluster_job(const ClusterJobFiles& files, bool resume, const DriverOptions& options) {
  ClusterJob in = load_cluster_job(files, resume);
  const std::string& out_dir = in.run.config.out_dir;
  make_directory(out_dir, "train.out_dir");
  // The ranks emulate the cluster file's chips; the planner may see the measured ones.
  Cluster planned_on = in.run.cluster;
  if (options.profile) {
    const std::string profiled = (fs::path(out_dir) / "cluster_profiled.yaml").string();
    profile_cluster(ProfileJob{files.cluster, in.shape, files.model.empty() ? files.config : files.model,
                               *std::min_element(in.setup.micro_batches.begin(), in.setup.micro_batches.end()),
                               profiled, options.profile_rank_command});
    planned_on = load_cluster(ConfigNode::load_file(profiled));
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
    in.run.plan = plan_training(costs, PlannerOptions{});
    in.run.plan.model = files.model.empty() ? files.config : files.model;
  } else {
    in.run.plan = load_plan(files.plan);
    check_plan_on_cluster(in.run.plan, in.run.cluster, files.plan);
  }
  std::fputs(format_plan(in.run.plan).c_str(), stdout);
  check_plan_runs(in.run.plan, in.run.config.model);
  const int ranks = stage_layout_of(in.run.plan).world_size();
  const std::string plan_path = (fs::path(out_dir) / "plan.json").string();
  save_plan(in.run.plan, plan_path);
  write_cluster_file(planned_on, files.cluster, out_dir);
  std::printf("launching %d ranks (one per device; emulated chips on this host); outputs in %s\n", ranks,
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
  const LaunchResult result = launch(options.rank_command(plan_path), launch_options);
  if (result.exit_code != 0) return result.exit_code;
  const double ratio = finish_run(in.run, ranks);
  const nlohmann::json summary = nlohmann::json::parse(read_file((fs::path(out_dir) / "summary.json").string()));
  std::printf(
      "done: measured step %.3f s, %.0f tokens/s; simulated %.3f s (measured / simulated %.2f); planned %.0f "
      "tokens/s\ntraces: %s/trace_measured.json beside trace_predicted.json\n",
      summary["measured_step_s"].get<double>(), summary["measured_tokens_per_s"].get<double>(),
      summary["simulated_step_s"].get<double>(), ratio, summary["planned_tokens_per_s"].get<double>(), out_dir.c_str());
  if (files.plan.empty()) {  // a given plan was made elsewhere: its baselines are not this planner's to state
    std::printf("predicted baselines:\n%s",
                format_baselines(plan_baselines(costs, in.run.plan, PlannerOptions{}), in.run.plan).c_str());
  }
  return 0;
}

}  // namespace h2
