// `h2 plan` and `h2 simulate`: HeteroAuto's search and the event-driven simulator.
#include <cstdio>

#include "cli/commands.h"
#include "core/error.h"
#include "core/file.h"
#include "core/units.h"
#include "planner/planner.h"
#include "sim/simulator.h"

namespace h2::cli {
void print_plan(const Plan& p) {
  std::printf("plan: model '%s' on cluster '%s': %d pipeline(s) x %zu stages, micro-batch %d x %d per pipeline\n",
              p.model.c_str(), p.cluster.c_str(), p.dp, p.stages.size(), p.micro_batch, p.num_micro_batches);
  std::printf("%5s %-6s %3s %4s %-12s %-9s %6s %9s %9s %8s %11s %8s\n", "stage", "chip", "tp", "dp", "layers",
              "recompute", "flight", "fwd ms", "bwd ms", "send ms", "mem/device", "headroom");
  for (size_t i = 0; i < p.stages.size(); ++i) {
    const StagePlan& s = p.stages[i];
    char layers[32];
    std::snprintf(layers, sizeof(layers), "%d-%d (%d)%s", s.first_layer, s.first_layer + s.layers - 1, s.layers,
                  s.embedding && s.head ? "E+H"
                  : s.embedding         ? "+E"
                  : s.head              ? "+H"
                                        : "");
    std::printf("%5zu %-6s %3d %4d %-12s %-9s %6d %9.2f %9.2f %8.2f %11s %7.0f%%\n", i, s.chip.c_str(), s.tp, s.dp,
                layers, recompute_name(s.recompute), s.in_flight, s.forward_s * 1e3, s.backward_s * 1e3, s.send_s * 1e3,
                format_bytes(s.memory_bytes).c_str(), 100.0 * (1.0 - s.memory_bytes / s.capacity_bytes));
  }
  std::printf("predicted: step %.3f s | %.0f tokens/s | MFU %.1f%% | bubble %.1f%% | devices %d of %d\n", p.step_s,
              p.tokens_per_s, 100 * p.mfu, 100 * p.bubble_fraction, p.devices_used, p.devices_total);
  std::printf("limited by: %s\nwhy: %s\n", p.limited_by.c_str(), p.why.c_str());
}

namespace {

struct Inputs {
  Cluster cluster;
  TransformerShape model;
  std::string model_name;
  TrainSetup train;
};

Inputs load_inputs(const std::string& cluster, const std::string& model, const std::string& train) {
  Inputs in;
  in.cluster = load_cluster(ConfigNode::load_file(cluster));
  const ConfigNode model_node = ConfigNode::load_file(model);
  in.model = load_model(model_node);
  in.model_name = model_node.get<std::string>("name", model);
  in.train = load_train_setup(ConfigNode::load_file(train));
  return in;
}

}  // namespace

void register_plan(CLI::App& app, Command& selected) {
  CLI::App* pl = app.add_subcommand("plan", "Find the fastest training plan for a model on a (mixed) cluster");
  struct PlanCmd {
    std::string cluster = "examples/cluster_hetero1024.yaml", model = "examples/model_100b.yaml",
                train = "examples/train_100b.yaml", out, baseline;
    bool compare = false;
    double budget = 5;
    int threads = 0;
  };
  auto o = std::make_shared<PlanCmd>();
  pl->add_option("--cluster", o->cluster, "cluster file (chip types, node groups, links)")->capture_default_str();
  pl->add_option("--model", o->model, "model file")->capture_default_str();
  pl->add_option("--train", o->train, "training setup file")->capture_default_str();
  pl->add_option("--out", o->out, "write the plan as JSON here (versioned; h2 simulate reads it)");
  pl->add_flag("--compare", o->compare, "also plan the baselines: uniform split, each chip type alone");
  pl->add_option("--baseline", o->baseline,
                 "print and write a baseline instead of the plan: 'uniform' (the plan's devices, layers split "
                 "evenly) or a chip type's name (that type alone)");
  pl->add_option("--budget", o->budget, "search time budget, seconds")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  pl->add_option("--search-threads", o->threads, "search threads (0: one per core)")->capture_default_str();
  pl->callback([o, &selected] {
    selected = [o] {
      const Inputs in = load_inputs(o->cluster, o->model, o->train);
      const CostModel costs(in.cluster, in.model, in.train);
      SearchStats stats;
      Plan plan = plan_training(costs, PlannerOptions{o->budget, o->threads}, &stats);
      plan.model = in.model_name;
      if (o->baseline == "uniform") {
        FitFailure why;
        std::optional<Plan> uniform = plan_uniform(costs, layout_of(plan, in.cluster), &why);
        if (!uniform) throw Error(ErrorCode::kInvalidArgument, cat("the uniform split does not fit: ", why.what));
        plan = *uniform;
        plan.model = in.model_name;
      } else if (!o->baseline.empty()) {
        const int chip = in.cluster.chip_index(o->baseline);
        if (chip < 0) {
          throw Error(ErrorCode::kNotFound,
                      cat("--baseline '", o->baseline, "' is neither 'uniform' nor a chip type of ", o->cluster));
        }
        plan =
            plan_training(CostModel(in.cluster.only(chip), in.model, in.train), PlannerOptions{o->budget, o->threads});
        plan.model = in.model_name;
      }
      print_plan(plan);
      std::printf(
          "search: %lld layouts generated, %lld pruned for memory, %lld pruned by the bound, %lld costed, in "
          "%.3f s (%s enumeration%s)\n",
          static_cast<long long>(stats.layouts), static_cast<long long>(stats.pruned_memory),
          static_cast<long long>(stats.pruned_bound), static_cast<long long>(stats.evaluated), stats.seconds,
          stats.tier.c_str(), stats.budget_exhausted ? ", budget exhausted" : "");
      if (o->compare) {
        std::printf("\n%-40s %14s %10s %9s\n", "baseline", "tokens/s", "step s", "vs plan");
        FitFailure why;
        const std::optional<Plan> uniform = plan_uniform(costs, layout_of(plan, in.cluster), &why);
        if (uniform) {
          std::printf("%-40s %14.0f %10.3f %8.2fx\n", "uniform layer split, same devices", uniform->tokens_per_s,
                      uniform->step_s, plan.tokens_per_s / uniform->tokens_per_s);
        } else {
          std::printf("%-40s does not fit: %s\n", "uniform layer split, same devices", why.what.c_str());
        }
        double sum_alone = 0;
        for (size_t k = 0; k < in.cluster.chips.size(); ++k) {
          if (in.cluster.devices_of(static_cast<int>(k)) == 0) continue;
          const std::string label =
              cat(in.cluster.chips[k].name, " alone (", in.cluster.devices_of(static_cast<int>(k)), " devices)");
          try {
            const CostModel alone(in.cluster.only(static_cast<int>(k)), in.model, in.train);
            const Plan p = plan_training(alone, PlannerOptions{o->budget, o->threads});
            sum_alone += p.tokens_per_s;
            std::printf("%-40s %14.0f %10.3f %8.2fx\n", label.c_str(), p.tokens_per_s, p.step_s,
                        plan.tokens_per_s / p.tokens_per_s);
          } catch (const Error& e) {
            std::printf("%-40s does not fit: %s\n", label.c_str(), e.what());
          }
        }
        if (sum_alone > 0) {
          std::printf(
              "heterogeneous speed-up ratio: %.0f / %.0f = %.3f (mixed throughput / sum of each type alone; "
              "above 1 is superlinear)\n",
              plan.tokens_per_s, sum_alone, plan.tokens_per_s / sum_alone);
        }
      }
      if (!o->out.empty()) {
        save_plan(plan, o->out);
        std::printf("wrote %s\n", o->out.c_str());
      }
      return 0;
    };
  });

  CLI::App* sim = app.add_subcommand("simulate", "Replay a plan's pipeline schedule event by event");
  struct SimCmd {
    std::string plan, schedule = "1f1b", trace;
    int chunks = 2;
  };
  auto s = std::make_shared<SimCmd>();
  sim->add_option("plan", s->plan, "plan.json from h2 plan --out")->required();
  sim->add_option("--schedule", s->schedule, "gpipe | 1f1b | interleaved")->capture_default_str();
  sim->add_option("--chunks", s->chunks, "virtual stages per rank (interleaved)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sim->add_option("--trace", s->trace, "write a Chrome/Perfetto trace JSON here");
  sim->callback([s, &selected] {
    selected = [s] {
      const Plan plan = load_plan(s->plan);
      const SimResult r = simulate(plan, SimOptions{parse_schedule_kind(s->schedule), s->chunks});
      std::printf("simulated %s: step %.3f s (pipeline %.3f s), bubble %.1f%%; planner predicted %.3f s (%+.2f%%)\n",
                  s->schedule.c_str(), r.step_s, r.pipeline_s, 100 * r.bubble_fraction, plan.step_s,
                  100 * (plan.step_s / r.step_s - 1));
      std::printf("%5s %-6s %10s %8s %12s %12s\n", "stage", "chip", "busy s", "busy %", "peak memory", "capacity");
      for (size_t i = 0; i < plan.stages.size(); ++i) {
        std::printf("%5zu %-6s %10.3f %7.1f%% %12s %12s%s\n", i, plan.stages[i].chip.c_str(), r.busy_s[i],
                    100 * r.busy_s[i] / r.step_s, format_bytes(r.peak_memory_bytes[i]).c_str(),
                    format_bytes(r.capacity_bytes[i]).c_str(),
                    r.peak_memory_bytes[i] > r.capacity_bytes[i] ? "  OVER CAPACITY" : "");
      }
      if (!s->trace.empty()) {
        write_file_atomic(s->trace, r.trace_json);
        std::printf("wrote %s (open in ui.perfetto.dev or chrome://tracing)\n", s->trace.c_str());
      }
      return r.fits() ? 0 : 1;
    };
  });
}

}  // namespace h2::cli
