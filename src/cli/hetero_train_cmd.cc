// `h2 train --cluster C [--model M] [--train T] [--plan P]`: the driver plans (or loads P), writes plan.json into
// the run's out_dir, starts one rank per device (`h2 train ... --as-rank` under h2 launch's machinery, which
// names a failed rank and stops the others), then merges the measured trace, writes the simulator's prediction
// beside it and reports measured against predicted step time.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/commands.h"
#include "comm/job.h"
#include "comm/launch.h"
#include "core/config.h"
#include "core/file.h"
#include "pipeline/hetero_train.h"
#include "planner/planner.h"

namespace h2::cli {
namespace {

namespace fs = std::filesystem;

std::atomic<bool> g_stop{false};
void request_stop(int) { g_stop = true; }

// What driver and ranks both derive from the same files: the training config with the model of the model file
// and the batch of the train setup, the cluster, and the setup.
struct Inputs {
  HeteroRun run;
  TransformerShape shape;
  TrainSetup setup;
};

Inputs load(const HeteroTrainCmd& cmd) {
  Inputs in;
  ConfigNode root = ConfigNode::load_file(cmd.config);
  for (const std::string& o : cmd.overrides) root.apply_override(o);
  in.run.config = TrainConfig::from_config(root);
  in.run.cluster = load_cluster(ConfigNode::load_file(cmd.cluster));
  if (!cmd.model.empty()) {
    in.shape = load_model(ConfigNode::load_file(cmd.model));
    in.run.config.model = gpt_config_of(in.shape);
  } else {
    in.shape = in.run.config.model.shape();
  }
  in.run.config.seq_len = in.shape.seq_len;
  if (!cmd.train.empty()) {
    in.setup = load_train_setup(ConfigNode::load_file(cmd.train));
  } else {
    in.setup.global_batch = in.run.config.batch_size;
    in.setup.zero1 = false;
  }
  in.setup.precision = Precision::kF32;  // the runtime trains in f32: plan what it runs
  in.run.config.batch_size = static_cast<int>(in.setup.global_batch);
  in.run.zero1 = in.setup.zero1;
  in.run.resume = cmd.resume;
  return in;
}

std::vector<std::string> rank_command(const HeteroTrainCmd& cmd, const std::string& plan_path) {
  std::vector<std::string> out = {fs::read_symlink("/proc/self/exe").string(),
                                  "train",
                                  "--as-rank",
                                  "--config",
                                  cmd.config,
                                  "--cluster",
                                  cmd.cluster,
                                  "--plan",
                                  plan_path};
  if (!cmd.model.empty()) out.insert(out.end(), {"--model", cmd.model});
  if (!cmd.train.empty()) out.insert(out.end(), {"--train", cmd.train});
  for (const std::string& o : cmd.overrides) out.insert(out.end(), {"--set", o});
  if (cmd.quiet) out.push_back("--quiet");
  if (cmd.resume) out.push_back("--resume");
  return out;
}

// The planner's view of the alternatives: the uniform split of the same devices and each chip type alone
// (predicted; bench/run_hetero.sh measures them).
void print_baselines(const CostModel& costs, const Plan& plan, const Cluster& cluster) {
  FitFailure why;
  const std::optional<Plan> uniform = plan_uniform(costs, layout_of(plan, cluster), &why);
  std::printf("predicted baselines: uniform split %s",
              uniform ? cat(static_cast<int64_t>(uniform->tokens_per_s), " tokens/s (the plan is ",
                            plan.tokens_per_s / uniform->tokens_per_s, "x)")
                            .c_str()
                      : "does not fit");
  double alone = 0;
  for (size_t k = 0; k < cluster.chips.size(); ++k) {
    try {
      const Plan p =
          plan_training(CostModel(cluster.only(static_cast<int>(k)), costs.model(), costs.train()), PlannerOptions{});
      alone += p.tokens_per_s;
      std::printf("; %s alone %.0f tokens/s", cluster.chips[k].name.c_str(), p.tokens_per_s);
    } catch (const Error&) {
      std::printf("; %s alone does not fit", cluster.chips[k].name.c_str());
    }
  }
  if (alone > 0) {
    std::printf("\nheterogeneous speed-up (predicted): %.0f / %.0f = %.2f (mixed / sum of each type alone)",
                plan.tokens_per_s, alone, plan.tokens_per_s / alone);
  }
  std::printf("\n");
}

}  // namespace

int run_hetero_train(const HeteroTrainCmd& cmd) {
  Inputs in = load(cmd);
  const JobEnv env = job_env();
  // Started by mpirun or srun (across hosts): this process is one rank of a plan every rank must load from the
  // same file; rank 0 merges the traces afterwards.
  const bool external = !cmd.as_rank && (env.source == "mpirun" || env.source == "srun");
  if (cmd.as_rank || external) {
    if (cmd.plan.empty()) {
      throw Error(ErrorCode::kConfig,
                  cat("h2 train --cluster under ", env.source,
                      " needs --plan: every rank must run the same plan (write one with h2 plan ... --out "
                      "plan.json, or take the plan.json of an earlier h2 train --cluster)"));
    }
    in.run.plan = load_plan(cmd.plan);
    check_plan_runs(in.run.plan, in.run.config.model);
    const int ranks = stage_layout_of(in.run.plan).world_size();
    if (external && env.world_size != ranks) {
      throw Error(ErrorCode::kConfig, cat(cmd.plan, " needs ", ranks, " ranks (one per device); ", env.source,
                                          " started ", env.world_size));
    }
    std::signal(SIGINT, request_stop);
    std::signal(SIGTERM, request_stop);
    auto job = join_job(env);
    if (external && env.rank == 0) {
      fs::create_directories(in.run.config.out_dir);
      save_plan(in.run.plan, (fs::path(in.run.config.out_dir) / "plan.json").string());
    }
    const RankOutcome r = run_rank(in.run, *job, cmd.quiet, &g_stop);
    if (external && env.rank == 0 && !r.interrupted) {
      const double ratio = finish_run(in.run, ranks);
      std::printf("done: measured step %.3f s; measured / simulated %.2f; traces in %s\n", r.step_seconds, ratio,
                  in.run.config.out_dir.c_str());
    }
    return r.interrupted ? 130 : 0;
  }
  fs::create_directories(in.run.config.out_dir);
  Cluster planned_on = in.run.cluster;  // the ranks emulate the cluster file's chips; the planner may see measured ones
  if (cmd.profile) {
    const std::string profiled = (fs::path(in.run.config.out_dir) / "cluster_profiled.yaml").string();
    profile_to_file(cmd.cluster, in.shape, cmd.model.empty() ? cmd.config : cmd.model,
                    *std::min_element(in.setup.micro_batches.begin(), in.setup.micro_batches.end()), profiled);
    planned_on = load_cluster(ConfigNode::load_file(profiled));
  }
  const CostModel costs(planned_on, in.shape, in.setup);
  if (cmd.plan.empty()) {
    in.run.plan = plan_training(costs, PlannerOptions{});
    in.run.plan.model = cmd.model.empty() ? cmd.config : cmd.model;
  } else {
    in.run.plan = load_plan(cmd.plan);
  }
  print_plan(in.run.plan);
  check_plan_runs(in.run.plan, in.run.config.model);
  const int ranks = stage_layout_of(in.run.plan).world_size();
  const std::string plan_path = (fs::path(in.run.config.out_dir) / "plan.json").string();
  save_plan(in.run.plan, plan_path);
  std::printf("launching %d ranks (one per device; emulated chips on this host); outputs in %s\n", ranks,
              in.run.config.out_dir.c_str());
  std::fflush(stdout);
  // Emulated chips share this host's cores: give each rank its share, so that busy ranks do not slow each other
  // down beyond their profiles (device/emu/device.h, where emulation stops being faithful).
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    const int share = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / ranks);
    ::setenv("OMP_NUM_THREADS", std::to_string(share).c_str(), 1);
  }
  LaunchOptions options;
  options.ranks = ranks;
  const LaunchResult result = launch(rank_command(cmd, plan_path), options);
  if (result.exit_code != 0) return result.exit_code;
  const double ratio = finish_run(in.run, ranks);
  const nlohmann::json summary =
      nlohmann::json::parse(read_file((fs::path(in.run.config.out_dir) / "summary.json").string()));
  std::printf(
      "done: measured step %.3f s, %.0f tokens/s; simulated %.3f s (measured / simulated %.2f); planned %.0f "
      "tokens/s\ntraces: %s/trace_measured.json beside trace_predicted.json\n",
      summary["measured_step_s"].get<double>(), summary["measured_tokens_per_s"].get<double>(),
      summary["simulated_step_s"].get<double>(), ratio, summary["planned_tokens_per_s"].get<double>(),
      in.run.config.out_dir.c_str());
  if (cmd.plan.empty()) print_baselines(costs, in.run.plan, planned_on);  // a given plan was made elsewhere
  return 0;
}

}  // namespace h2::cli
