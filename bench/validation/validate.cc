// validate_costs: HeteroAuto's cost model against published measurements of real GPU clusters
// (bench/validation/cases.yaml; docs/validation.md). Each case is written as the layout it ran (stages, TP, DP,
// micro-batch, recomputation, schedule) and costed exactly as `h2 plan --layout` costs a layout file; the
// predicted step is compared with the measured iteration. Twice: with the datasheet figures alone (the cost
// model's default efficiencies), then with each chip type's two efficiencies fitted on at most two of its cases
// (marked `fit` in the file): the matmul efficiency on the case with the smaller attention share (s / 6h), the
// attention core's on the other, solved so that both are predicted as measured (one case: the matmul efficiency,
// the attention core at half of it, the cost model's default).
//
//   validate_costs [--cases FILE] [--out FILE.md] [--check]
// --check: exit 1 when the whole table (its top-level `goal`) or a set with a `goal` misses it in the fitted mode
// (mean and max |error|).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "bench_main.h"
#include "core/config.h"
#include "core/error.h"
#include "core/file.h"
#include "core/format.h"
#include "planner/layout.h"

namespace h2 {
namespace {

struct System {
  std::string name, source;
  ChipType chip;
  int chips_per_node = 8;
  double intra_gbps = 0, intra_latency_us = 0, nic_gbps = 0, nic_latency_us = 0;
};

struct Case {
  std::string set, name, assumed;
  const System* system = nullptr;
  TransformerShape model;
  int tp = 1, pp = 1, gpus = 1, micro_batch = 1;
  int64_t batch = 0;
  Recompute recompute = Recompute::kFull;
  ScheduleKind schedule = ScheduleKind::k1F1B;
  int chunks = 1;  // model chunks per stage under the interleaved schedule
  double measured_s = 0;
  std::string measured_as;  // what the source gives
  bool fit = false;
  int dp() const { return gpus / (tp * pp); }
};

struct Goal {
  double mean = 0, max = 0;  // 0: reported only
  bool checked() const { return max > 0; }
};

Goal goal_of(const std::optional<ConfigNode>& n) {
  if (!n) return {};
  return {n->get<double>("mean"), n->get<double>("max")};
}

struct Set {
  std::string name, source, assumed, note;  // note: what the report should say about the set's errors
  Goal goal;                                // what --check holds the set's fitted errors to
};

// Narayanan et al. 2021, eq. 3: the FLOPs of one iteration with activation recomputation.
double iteration_flops(const TransformerShape& m, int64_t batch) {
  const double B = static_cast<double>(batch), s = static_cast<double>(m.seq_len), l = static_cast<double>(m.layers),
               h = static_cast<double>(m.hidden), V = static_cast<double>(m.vocab);
  return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
}

ChipType chip_of(const ConfigNode& n) {
  ChipType c;
  c.name = n.get<std::string>("name");
  c.vendor = n.get<std::string>("vendor", "");
  c.peak_tflops = n.get<double>("peak_tflops");
  c.peak_tflops_f32 = n.get<double>("peak_tflops_f32", 0.0);
  c.memory_gib = n.get<double>("memory_gib");
  c.memory_bandwidth_gbps = n.get<double>("memory_bandwidth_gbps");
  return c;
}

struct Cases {
  Goal goal;  // the whole table's, fitted
  std::vector<System> systems;
  std::vector<Set> sets;
  std::vector<Case> cases;
};

Cases load_cases(const std::string& path) {
  const ConfigNode root = ConfigNode::load_file(path);
  Cases out;
  out.goal = goal_of(root.find("goal"));
  const std::vector<ConfigNode> systems = root.at("systems").items();
  out.systems.reserve(systems.size());  // cases point into it
  for (const ConfigNode& s : systems) {
    System sys;
    sys.name = s.get<std::string>("name");
    sys.source = s.get<std::string>("source");
    sys.chip = chip_of(s.at("chip"));
    sys.chips_per_node = static_cast<int>(s.get<int64_t>("chips_per_node"));
    sys.intra_gbps = s.get<double>("intra_node_gbps");
    sys.intra_latency_us = s.get<double>("intra_node_latency_us");
    sys.nic_gbps = s.get<double>("nic_gbps");
    sys.nic_latency_us = s.get<double>("nic_latency_us");
    out.systems.push_back(sys);
  }
  for (const ConfigNode& s : root.at("sets").items()) {
    Set set{s.get<std::string>("name"), s.get<std::string>("source"), s.get<std::string>("assumed", ""),
            s.get<std::string>("note", "")};
    set.goal = goal_of(s.find("goal"));
    const std::string system = s.get<std::string>("system");
    const System* sys = nullptr;
    for (const System& x : out.systems) {
      if (x.name == system) sys = &x;
    }
    if (sys == nullptr) s.at("system").fail(cat("no system '", system, "' in systems"));
    const std::optional<ConfigNode> defaults = s.find("defaults");
    for (const ConfigNode& n : s.at("cases").items()) {
      // A case's field, else the set's default.
      auto field = [&](const char* key) {
        if (auto v = n.find(key)) return *v;
        if (defaults) {
          if (auto v = defaults->find(key)) return *v;
        }
        return n.at(key);  // the error names the case and the key
      };
      Case c;
      c.set = set.name;
      c.assumed = set.assumed;
      c.system = sys;
      c.name = n.get<std::string>("name");
      c.model.layers = field("layers").as_int();
      c.model.hidden = field("hidden").as_int();
      c.model.heads = field("heads").as_int();
      c.model.kv_heads = c.model.heads;
      c.model.ffn = 4 * c.model.hidden;
      c.model.vocab = field("vocab").as_int();
      c.model.seq_len = field("seq_len").as_int();
      c.model.tied_embeddings = true;  // Megatron-LM's GPT shares the embedding with the output layer
      c.tp = static_cast<int>(field("tp").as_int());
      c.pp = static_cast<int>(field("pp").as_int());
      c.gpus = static_cast<int>(field("gpus").as_int());
      c.batch = field("batch").as_int();
      c.micro_batch = static_cast<int>(field("micro_batch").as_int());
      const std::optional<Recompute> r = parse_recompute(field("recompute").as_string());
      if (!r) field("recompute").fail("expected none, selective or full");
      c.recompute = *r;
      c.schedule = parse_schedule_kind(field("schedule").as_string());
      if (auto v = n.find("chunks")) c.chunks = static_cast<int>(v->as_int());
      c.fit = n.get<bool>("fit", false);
      if (c.gpus % (c.tp * c.pp) != 0) n.fail(cat(c.gpus, " GPUs are not a multiple of TP x PP"));
      const double flops = iteration_flops(c.model, c.batch);
      if (auto v = n.find("iteration_s")) {
        c.measured_s = v->as_double();
        c.measured_as = format("%.1f s per iteration", c.measured_s);
      } else if (auto v = n.find("tflops_per_gpu")) {
        c.measured_s = flops / (c.gpus * v->as_double() * 1e12);
        c.measured_as = format("%.0f TFLOP/s per GPU", v->as_double());
      } else if (auto v = n.find("pflops_total")) {
        c.measured_s = flops / (v->as_double() * 1e15);
        c.measured_as = format("%.1f PFLOP/s in all", v->as_double());
      } else {
        n.fail("needs iteration_s, tflops_per_gpu or pflops_total");
      }
      out.cases.push_back(c);
    }
    out.sets.push_back(set);
  }
  return out;
}

// The case's layout costed as `h2 plan --layout` costs it, on a cluster of the case's GPUs of `chip`.
double predict(const Case& c, const ChipType& chip) {
  const System& s = *c.system;
  Cluster cluster;
  cluster.name = s.name;
  cluster.chips = {chip};
  cluster.groups = {NodeGroup{.chip = 0,
                              .nodes = (c.gpus + s.chips_per_node - 1) / s.chips_per_node,
                              .chips_per_node = s.chips_per_node,
                              .intra_node_gbps = s.intra_gbps,
                              .intra_node_latency_us = s.intra_latency_us,
                              .nic_gbps = s.nic_gbps,
                              .nic_latency_us = s.nic_latency_us}};
  const TrainSetup setup{.global_batch = c.batch,
                         .precision = Precision::kBf16,
                         .allowed_recompute = {c.recompute},
                         .zero1 = false,
                         .micro_batches = {c.micro_batch}};
  const CostModel costs(cluster, c.model, setup);
  std::string yaml = cat("dp: ", c.dp(), "\nmicro_batch: ", c.micro_batch, "\nschedule: ", schedule_name(c.schedule),
                         "\nchunks: ", c.chunks, "\nstages:\n");
  for (int i = 0; i < c.pp; ++i) {
    yaml += cat("  - {chip: ", chip.name, ", tp: ", c.tp, ", layers: ", c.model.layers / c.pp,
                ", recompute: ", recompute_name(c.recompute), "}\n");
  }
  const Plan plan = cost_layout(costs, load_layout(ConfigNode::parse_string(yaml, c.name), costs));
  return plan.step_s;
}

// x in [lo, hi] where f(x) (decreasing) equals target.
double bisect(const std::function<double(double)>& f, double target, double lo, double hi) {
  for (int i = 0; i < 24; ++i) {  // to 1e-7 of the bracket
    const double mid = 0.5 * (lo + hi);
    (f(mid) > target ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

// The value in [lo, 1] of one of chip's efficiencies under which case c is predicted as measured, the rest held.
double solve(const ChipType& chip, double ChipType::*efficiency, const Case& c, double lo) {
  return bisect(
      [&](double e) {
        ChipType t = chip;
        t.*efficiency = e;
        return predict(c, t);
      },
      c.measured_s, lo, 1.0);
}

// The chip with its efficiencies fitted on `fit` (one or two cases of this chip).
ChipType fitted(const ChipType& datasheet, std::vector<const Case*> fit) {
  ChipType chip = datasheet;
  if (fit.empty()) return chip;
  if (fit.size() == 1) {
    chip.efficiency = solve(chip, &ChipType::efficiency, *fit[0], 0.02);
    return chip;
  }
  // Two parameters, each from the case whose time it weighs in the most: the attention core's share of a
  // layer's FLOPs is s / 6h (Narayanan et al. 2021, eq. 3), so the case with the larger one fits the attention
  // core. Alternate, the other held; they couple weakly.
  std::sort(fit.begin(), fit.end(), [](const Case* a, const Case* b) {
    return a->model.seq_len * b->model.hidden < b->model.seq_len * a->model.hidden;
  });
  chip.attention_efficiency = chip.efficiency / 2;
  double moved = 1;
  for (int round = 0; round < 20 && moved > 1e-4; ++round) {  // until neither moves
    const ChipType before = chip;
    chip.efficiency = solve(chip, &ChipType::efficiency, *fit[0], 0.02);
    chip.attention_efficiency = solve(chip, &ChipType::attention_efficiency, *fit[1], 0.01);
    moved = std::max(std::abs(chip.efficiency - before.efficiency),
                     std::abs(chip.attention_efficiency - before.attention_efficiency));
  }
  return chip;
}

struct Stats {
  double mean = 0, max = 0;
  int n = 0;
  void add(double e) {
    mean += (std::abs(e) - mean) / ++n;
    max = std::max(max, std::abs(e));
  }
};

int run(int argc, char** argv) {
  std::string cases_path = H2_SOURCE_DIR "/bench/validation/cases.yaml", out;
  bool check = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--cases") && i + 1 < argc) {
      cases_path = argv[++i];
    } else if (!std::strcmp(argv[i], "--out") && i + 1 < argc) {
      out = argv[++i];
    } else if (!std::strcmp(argv[i], "--check")) {
      check = true;
    } else {
      std::fprintf(stderr, "usage: validate_costs [--cases FILE] [--out FILE.md] [--check]\n");
      return 2;
    }
  }
  const Cases in = load_cases(cases_path);
  std::map<std::string, ChipType> fit_chip;
  for (const System& s : in.systems) {
    std::vector<const Case*> fit;
    for (const Case& c : in.cases) {
      if (c.fit && c.system == &s) fit.push_back(&c);
    }
    if (fit.size() > 2) throw Error(ErrorCode::kConfig, cat(s.name, ": more than two cases marked fit"));
    fit_chip[s.name] = fitted(s.chip, fit);
  }
  std::string rows;
  Stats datasheet_all, fitted_all, fitted_out;
  std::map<std::string, std::pair<Stats, Stats>> per_set;
  for (const Case& c : in.cases) {
    const double d = predict(c, c.system->chip), f = predict(c, fit_chip[c.system->name]);
    const double de = d / c.measured_s - 1, fe = f / c.measured_s - 1;
    datasheet_all.add(de);
    fitted_all.add(fe);
    if (!c.fit) fitted_out.add(fe);
    per_set[c.set].first.add(de);
    per_set[c.set].second.add(fe);
    rows += format(
        "| %s | %s%s | %s | %d | %d | %d | %d | %d | %lld | %lld | %s | %s | %.2f | %.2f | %+.1f%% | %.2f | %+.1f%% "
        "|\n",
        c.set.c_str(), c.name.c_str(), c.fit ? " (fit)" : "", c.system->chip.name.c_str(), c.gpus, c.tp, c.pp, c.dp(),
        c.micro_batch, static_cast<long long>(c.batch), static_cast<long long>(c.model.seq_len),
        recompute_name(c.recompute), c.measured_as.c_str(), c.measured_s, d, 100 * de, f, 100 * fe);
  }
  std::string md = "# The cost model against published measurements\n\n";
  md +=
      "Generated by `build/bench/validate_costs --out docs/validation.md` from `bench/validation/cases.yaml` (each "
      "row's source and assumptions are there and below). Each case is the layout the source ran — TP, PP, DP, "
      "micro-batch, recomputation, schedule — costed as `h2 plan --layout` costs a layout file; the predicted "
      "step is compared with the measured iteration. `ctest -R validation` fails when the fitted mode misses "
      "the table's or a set's goal.\n\n";
  md += "| mode | cases | mean abs. error | max abs. error |\n|---|---|---|---|\n";
  md += format("| datasheet figures, the cost model's default efficiencies | %d | %.1f%% | %.1f%% |\n", datasheet_all.n,
               100 * datasheet_all.mean, 100 * datasheet_all.max);
  md += format(
      "| efficiencies per chip type (matmul, attention core) fitted on <= 2 cases (fit) | %d | %.1f%% | %.1f%% |\n",
      fitted_all.n, 100 * fitted_all.mean, 100 * fitted_all.max);
  md += format("| the same, cases not fitted on | %d | %.1f%% | %.1f%% |\n\n", fitted_out.n, 100 * fitted_out.mean,
               100 * fitted_out.max);
  md += "| set | cases | datasheet: mean / max | fitted: mean / max | goal (checked) |\n|---|---|---|---|---|\n";
  std::string missed;
  const auto check_goal = [&](const std::string& what, const Goal& g, const Stats& f) {
    if (g.checked() && (f.mean > g.mean || f.max > g.max)) {
      missed += format("%s: fitted mean %.1f%% (goal %.0f%%), max %.1f%% (goal %.0f%%)\n", what.c_str(), 100 * f.mean,
                       100 * g.mean, 100 * f.max, 100 * g.max);
    }
    return g.checked() ? format("%.0f%% / %.0f%%", 100 * g.mean, 100 * g.max) : std::string("-");
  };
  for (const Set& s : in.sets) {
    const auto& [d, f] = per_set[s.name];
    md += format("| %s | %d | %.1f%% / %.1f%% | %.1f%% / %.1f%% | %s |\n", s.name.c_str(), d.n, 100 * d.mean,
                 100 * d.max, 100 * f.mean, 100 * f.max, check_goal(s.name, s.goal, f).c_str());
  }
  md += format("| all | %d | %.1f%% / %.1f%% | %.1f%% / %.1f%% | %s |\n", datasheet_all.n, 100 * datasheet_all.mean,
               100 * datasheet_all.max, 100 * fitted_all.mean, 100 * fitted_all.max,
               check_goal("all cases", in.goal, fitted_all).c_str());
  md +=
      "\n## Cases\n\nSeconds per iteration: measured (converted from what the source gives), predicted with the "
      "datasheet figures, predicted with the fitted efficiencies.\n\n";
  md +=
      "| set | case | GPU | GPUs | TP | PP | DP | micro-batch | batch | seq | recompute | published | measured s | "
      "datasheet s | error | fitted s | error "
      "|\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  md += rows;
  md += "\n## Fitted efficiencies\n\n";
  for (const System& s : in.systems) {
    const ChipType& c = fit_chip[s.name];
    md += format("- %s: matmul efficiency %.3f of %.0f TFLOP/s, attention core %.3f\n", c.name.c_str(), c.efficiency,
                 c.peak_tflops, c.attention_efficiency > 0 ? c.attention_efficiency : c.efficiency / 2);
  }
  md += "\n## Sources\n\n";
  for (const Set& s : in.sets) {
    md += "- **" + s.name + "**: " + s.source + (s.assumed.empty() ? "" : " Assumed: " + s.assumed + ".") +
          (s.note.empty() ? "" : " " + s.note) + "\n";
  }
  for (const System& s : in.systems) md += "- **" + s.name + "**: " + s.source + "\n";
  if (out.empty()) {
    std::fputs(md.c_str(), stdout);
  } else {
    write_file_atomic(out, md);
    std::printf("wrote %s: datasheet mean %.1f%% max %.1f%%; fitted mean %.1f%% max %.1f%%\n", out.c_str(),
                100 * datasheet_all.mean, 100 * datasheet_all.max, 100 * fitted_all.mean, 100 * fitted_all.max);
  }
  if (check && !missed.empty()) {
    std::fprintf(stderr, "validate_costs: %s", missed.c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace h2

int main(int argc, char** argv) { return h2::bench_main("validate_costs", argc, argv, h2::run); }
