// `h2 plan` and `h2 simulate`: HeteroAuto's search and the event-driven simulator.
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "core/config.h"
#include "core/error.h"
#include "core/file.h"
#include "pipeline/hetero_train.h"
#include "planner/catalog.h"
#include "planner/layout.h"
#include "planner/report.h"
#include "sim/calibrate.h"
#include "sim/simulator.h"

namespace h2::cli {
namespace {

struct PlanCmd {
  std::string cluster = "examples/cluster_hetero1024.yaml", model = "examples/model_100b.yaml",
              train = "examples/train_100b.yaml", out, baseline, layout;
  bool compare = false, no_interleave = false, whole_blocks = false;
  double budget = 5;
  int threads = 0;
};

// `h2 plan --layout F`: the given layout costed as it is.
int run_layout(const PlanCmd& o, const PlanningInputs& in, const CostModel& costs) {
  Plan plan = cost_layout(costs, load_layout(ConfigNode::load_file(o.layout), costs));
  plan.model = in.model_name;
  std::fputs(format_plan(plan).c_str(), stdout);
  if (!o.out.empty()) {
    save_plan(plan, o.out);
    std::printf("wrote %s\n", o.out.c_str());
  }
  return 0;
}

int run_plan(const PlanCmd& o) {
  const PlanningInputs in = load_planning_inputs(o.cluster, o.model, o.train);
  const CostModel costs(in.cluster, in.model, in.train);
  if (!o.layout.empty()) return run_layout(o, in, costs);
  PlannerOptions options;
  options.interleave = !o.no_interleave;
  options.split_blocks = !o.whole_blocks;
  options.time_budget_s = o.budget;
  options.threads = o.threads;
  SearchStats stats;
  Plan plan;
  if (!o.baseline.empty() && o.baseline != "uniform") {
    // A chip type alone: its own search, and its counts under it (the mixed plan is not needed).
    const int chip = in.cluster.chip_index(o.baseline);
    if (chip < 0) {
      throw Error(ErrorCode::kNotFound,
                  cat("--baseline '", o.baseline, "' is neither 'uniform' nor a chip type of ", o.cluster));
    }
    plan = plan_training(CostModel(in.cluster.only(chip), in.model, in.train), options, &stats);
  } else {
    plan = plan_training(costs, options, &stats);
  }
  if (o.baseline == "uniform") {  // the plan's devices, its layers split evenly
    FitFailure why;
    std::optional<Plan> uniform = plan_uniform(costs, layout_of(plan, in.cluster), &why);
    if (!uniform) throw Error(ErrorCode::kInvalidArgument, cat("the uniform split does not fit: ", why.what));
    plan = *uniform;
  }
  plan.model = in.model_name;
  std::fputs(format_plan(plan).c_str(), stdout);
  std::fputs(format_search(stats).c_str(), stdout);
  if (o.compare) std::printf("\n%s", format_baselines(plan_baselines(costs, plan, options), plan).c_str());
  if (!o.out.empty()) {
    save_plan(plan, o.out);
    std::printf("wrote %s\n", o.out.c_str());
  }
  return 0;
}

struct SimCmd {
  std::string plan, schedule, trace, cluster, model, train;
  int chunks = 0;
};

int run_simulate(const SimCmd& s) {
  Plan plan = load_plan(s.plan);
  if (!s.cluster.empty()) {  // re-cost the plan's layout with these figures (and its own model and setup)
    const Cluster cluster = load_cluster_arg(s.cluster);
    const TransformerShape model = s.model.empty() ? plan.shape : load_model(ConfigNode::load_file(s.model));
    const TrainSetup train = s.train.empty() ? setup_of(plan) : load_train_setup(ConfigNode::load_file(s.train));
    const CostModel costs(cluster, model, train);
    const std::string name = plan.model;
    plan = cost_layout(costs, layout_spec_of(plan, costs));
    plan.model = name;
    plan.why =
        cat("re-costed from ", s.cluster, s.model.empty() ? "" : ", " + s.model, s.train.empty() ? "" : ", " + s.train);
    std::printf("%s: the layout of %s re-costed with %s\n", s.plan.c_str(), s.plan.c_str(), s.cluster.c_str());
  }
  SimOptions options{.chunks = s.chunks};
  if (!s.schedule.empty()) options.schedule = parse_schedule_kind(s.schedule);
  const SimResult r = simulate(plan, options);
  std::fputs(format_simulation(plan, r, s.schedule.empty() ? schedule_name(plan.schedule) : s.schedule).c_str(),
             stdout);
  if (!s.trace.empty()) {
    write_file_atomic(s.trace, r.trace_json);
    std::printf("wrote %s (open in ui.perfetto.dev or chrome://tracing)\n", s.trace.c_str());
  }
  return r.fits() ? 0 : 1;
}

struct CalibrateCmd {
  std::string run_dir, cluster, out;
};

int run_calibrate(const CalibrateCmd& o) {
  const Calibration c = calibrate_run(o.run_dir, o.cluster);
  std::fputs(format_calibration(c).c_str(), stdout);
  const std::string out =
      o.out.empty() ? (std::filesystem::path(o.run_dir) / "cluster_calibrated.yaml").string() : o.out;
  write_file_atomic(out,
                    "# Calibrated by h2 calibrate from the run in " + o.run_dir + "\n" + cluster_to_yaml(c.cluster));
  std::printf("wrote %s (plan or cost a layout with it: h2 plan --cluster %s ...)\n", out.c_str(), out.c_str());
  return 0;
}

}  // namespace

void register_plan(CLI::App& app, Command& selected) {
  CLI::App* pl = app.add_subcommand("plan", "Find the fastest training plan for a model on a (mixed) cluster");
  auto o = std::make_shared<PlanCmd>();
  pl->add_option(
        "--cluster", o->cluster,
        "cluster file (chip types, node groups, links), or catalog chips: \"H100:64,MI300X:32\" (examples/chips.yaml)")
      ->capture_default_str();
  pl->add_option("--model", o->model, "model file")->capture_default_str();
  pl->add_option("--train", o->train, "training setup file")->capture_default_str();
  pl->add_option("--out", o->out, "write the plan as JSON here (versioned; h2 simulate reads it)");
  pl->add_flag("--compare", o->compare, "also plan the baselines: uniform split, each chip type alone");
  pl->add_option("--baseline", o->baseline,
                 "print and write a baseline instead of the plan: 'uniform' (the plan's devices, layers split "
                 "evenly) or a chip type's name (that type alone)");
  pl->add_option("--budget", o->budget, "search time budget, seconds")->check(kPositive)->capture_default_str();
  pl->add_option("--search-threads", o->threads, "search threads (0: one per core)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  pl->add_flag("--no-interleave", o->no_interleave,
               "leave interleaved 1F1B out of the search (h2 train --cluster does on emulated chips, which share the "
               "host's cores)");
  pl->add_flag("--whole-blocks", o->whole_blocks,
               "stages begin and end at whole blocks (no stage boundary between a block's attention and its MLP)");
  pl->add_option("--layout", o->layout,
                 "cost this layout as given instead of searching (stages, TP, DP, layers — 2.5: stages meeting "
                 "inside a block —, recomputation, micro-batch, schedule; docs/planner.md)")
      ->excludes("--compare")
      ->excludes("--baseline");
  pl->callback([o, &selected] { selected = [o] { return run_plan(*o); }; });

  CLI::App* sim = app.add_subcommand("simulate", "Replay a plan's pipeline schedule event by event");
  auto s = std::make_shared<SimCmd>();
  sim->add_option("plan", s->plan, "plan.json from h2 plan --out")->required();
  sim->add_option("--schedule", s->schedule,
                  "replay another schedule: gpipe | 1f1b | interleaved | zb-h1 (backwards split into B and W, each "
                  "stage deferring the W's its memory holds; default: the plan's)");
  sim->add_option("--chunks", s->chunks, "virtual stages per rank for interleaved (default: the plan's, or 2)")
      ->check(kPositive);
  sim->add_option("--trace", s->trace, "write a Chrome/Perfetto trace JSON here");
  sim->add_option("--cluster", s->cluster, "re-cost the plan's layout with this cluster file");
  sim->add_option("--model", s->model, "with --cluster: another model file (default: the plan's model)")
      ->needs("--cluster");
  sim->add_option("--train", s->train, "with --cluster: another training setup file (default: the plan's setup)")
      ->needs("--cluster");
  sim->callback([s, &selected] { selected = [s] { return run_simulate(*s); }; });

  CLI::App* cal = app.add_subcommand("calibrate", "Fit the cluster file's figures to what a run measured");
  auto c = std::make_shared<CalibrateCmd>();
  cal->add_option("run_dir", c->run_dir, "the out_dir of a finished h2 train --cluster")->required();
  cal->add_option("--cluster", c->cluster, "the figures to start from (default: the run's cluster.yaml)");
  cal->add_option("--out", c->out, "write the calibrated cluster file here (default: RUN_DIR/cluster_calibrated.yaml)");
  cal->callback([c, &selected] { selected = [c] { return run_calibrate(*c); }; });
}

}  // namespace h2::cli
