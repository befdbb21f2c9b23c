// Calibration from a measured trace (see calibrate.h).
#include "sim/calibrate.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "core/clock.h"
#include "core/config.h"
#include "core/error.h"
#include "core/file.h"
#include "core/format.h"
#include "planner/catalog.h"
#include "planner/layout.h"
#include "schedule/schedule.h"
#include "sim/simulator.h"

namespace h2 {
namespace {

// The scale k in [1e-3, 1e3] at which predicted(k) (decreasing in k: k speeds something up) equals target;
// the nearer bound when the target is out of reach.
double fit_scale(const std::function<double(double)>& predicted, double target) {
  double lo = std::log(1e-3), hi = std::log(1e3);
  for (int i = 0; i < 60; ++i) {
    const double mid = 0.5 * (lo + hi);
    (predicted(std::exp(mid)) > target ? lo : hi) = mid;
  }
  return std::exp(0.5 * (lo + hi));
}

// An event of the trace: start and duration, in seconds.
using Event = std::pair<double, double>;

// Events that a group's ranks end together (a collective), per rank (its events, `per_step` of them a step): each
// becomes what follows the last rank's arrival in its step — the ranks before it wait there.
void time_from_last_arrival(std::map<int, std::vector<Event*>>& ranks, size_t per_step) {
  std::vector<double> arrival;  // per step
  for (auto& [rank, list] : ranks) {
    std::sort(list.begin(), list.end(), [](const Event* a, const Event* b) { return a->first < b->first; });
    for (size_t k = 0; k < list.size() / per_step; ++k) {
      if (arrival.size() <= k) arrival.push_back(0);
      arrival[k] = std::max(arrival[k], list[k * per_step]->first);
    }
  }
  for (auto& [rank, list] : ranks) {
    for (size_t i = 0; i < list.size(); ++i) {
      const size_t k = i / per_step;
      if (k >= arrival.size()) continue;
      auto& [start, dur] = *list[i];
      const double end = start + dur, from = std::max(start, arrival[k]);
      dur = std::max(0.0, end - from);
      start = from;
    }
  }
}

// What the cost model predicts for each measured class of a stage. The runtime's REDUCE_GRAD holds the DP
// all-reduce (without ZeRO-1; with it the reduce-scatter comes in OPTIM) and the tied embedding's exchange.
struct Classes {
  double forward_s, backward_s, reduce_s, optimizer_s;
};
Classes classes_of(const Plan& p, size_t i) {
  const StagePlan& s = p.stages[i];
  const bool in_optim = p.zero1 && s.dp > 1;
  return Classes{s.forward_s, s.backward_s, (in_optim ? 0 : s.dp_allreduce_s) + s.tied_allreduce_s,
                 s.optimizer_s + (in_optim ? s.dp_allreduce_s : 0)};
}

}  // namespace

MeasuredRun read_measured_run(const std::string& trace_json, const Plan& plan, double step_s,
                              const std::string& source) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(trace_json);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kConfig, cat(source, ": not a JSON trace (", e.what(), ")"));
  }
  const nlohmann::json& events = doc.is_object() && doc.contains("traceEvents") ? doc.at("traceEvents") : doc;
  if (!events.is_array()) throw Error(ErrorCode::kConfig, cat(source, ": no 'traceEvents' array"));
  const int p = static_cast<int>(plan.stages.size());
  enum Class { kForward, kBackward, kReduce, kOptim, kClasses };
  // (class, virtual stage, rank) -> the events, as (start, duration in seconds).
  std::map<std::tuple<int, int, int>, std::vector<std::pair<double, double>>> by;
  for (const nlohmann::json& e : events) {
    if (!e.is_object() || e.value("ph", "") != "X" || !e.contains("name") || !e.at("name").is_string()) continue;
    Action a{};
    try {
      a = Action::parse(e.at("name").get<std::string>());
    } catch (const Error&) {
      continue;  // not a schedule action (metadata, another tool's events)
    }
    if (a.stage < 0 || a.stage >= p * plan.chunks) {
      throw Error(ErrorCode::kConfig, cat(source, ": event ", a.str(), " names stage ", a.stage, "; the plan has ",
                                          p * plan.chunks, " (a trace of another plan?)"));
    }
    const int cls = a.type == ActionType::kForward      ? kForward
                    : a.type == ActionType::kBackward   ? kBackward
                    : a.type == ActionType::kReduceGrad ? kReduce
                    : a.type == ActionType::kOptim      ? kOptim
                                                        : -1;
    if (cls < 0) continue;
    by[{cls, a.stage, e.value("pid", 0)}].emplace_back(e.value("ts", 0.0) * 1e-6, e.value("dur", 0.0) * 1e-6);
  }
  // An optimizer step begins with the global gradient norm, which every rank agrees on: a rank that reaches OPTIM
  // early waits there for the last. Its work is what follows the last rank's arrival (plan.h, end_of_step).
  std::map<int, std::vector<Event*>> optim_of_rank;  // rank -> its OPTIM events
  // A stage's gradient all-reduce begins when its last device reaches it: the devices before it wait there (a
  // replica of a faster chip type, or one the host slowed less). Its time is what follows that arrival.
  std::map<int, std::map<int, std::vector<Event*>>> reduce_of_stage;  // virtual stage -> rank -> its events
  for (auto& [key, list] : by) {
    const auto [cls, stage, rank] = key;
    if (cls != kOptim && cls != kReduce) continue;
    for (Event& ev : list) (cls == kOptim ? optim_of_rank[rank] : reduce_of_stage[stage][rank]).push_back(&ev);
  }
  time_from_last_arrival(optim_of_rank, static_cast<size_t>(plan.chunks));
  for (auto& [stage, ranks] : reduce_of_stage) time_from_last_arrival(ranks, 1);
  // Per class and physical stage, one value per step: per rank its chunks' actions of the step summed (forward and
  // backward: averaged over the step's micro-batches), then the mean over the stage's ranks (those `keep` keeps).
  // `start`: per step, when the stage's first chunk began it (the latest of its ranks).
  auto per_step = [&](int cls, int stage, std::vector<double>* start = nullptr,
                      const std::function<bool(int)>& keep = nullptr) {
    const size_t per = cls == kForward || cls == kBackward ? static_cast<size_t>(plan.num_micro_batches) : 1;
    std::map<int, std::vector<double>> by_rank, start_by_rank;  // rank -> per step
    for (int c = 0; c < plan.chunks; ++c) {
      for (auto [key, list] : by) {
        if (std::get<0>(key) != cls || std::get<1>(key) != stage + c * p) continue;
        if (keep && !keep(std::get<2>(key))) continue;
        std::sort(list.begin(), list.end());
        std::vector<double>& d = by_rank[std::get<2>(key)];
        d.resize(std::max(d.size(), list.size() / per), 0.0);
        for (size_t k = 0; k < list.size() / per * per; ++k) d[k / per] += list[k].second / static_cast<double>(per);
        if (c == 0) {
          for (size_t k = 0; k < list.size() / per; ++k) start_by_rank[std::get<2>(key)].push_back(list[k * per].first);
        }
      }
    }
    size_t steps = SIZE_MAX;
    for (const auto& [rank, d] : by_rank) steps = std::min(steps, d.size());
    std::vector<double> out;
    for (size_t k = 0; k < (by_rank.empty() ? 0 : steps); ++k) {
      double sum = 0, latest = 0;
      for (const auto& [rank, d] : by_rank) {
        sum += d[k];
        latest = std::max(latest, start_by_rank[rank].size() > k ? start_by_rank[rank][k] : 0.0);
      }
      out.push_back(sum / static_cast<double>(by_rank.size()));
      if (start != nullptr) start->push_back(latest);
    }
    return out;
  };
  // As `h2 train` measures its step: the mean after two warm-up steps, when there are more than two.
  auto mean_after_warm_up = [](const std::vector<double>& v) {
    const size_t skip = v.size() > 2 ? 2 : 0;
    double sum = 0;
    for (size_t k = skip; k < v.size(); ++k) sum += v[k];
    return v.empty() ? 0.0 : sum / static_cast<double>(v.size() - skip);
  };
  MeasuredRun run;
  run.step_s = step_s;
  run.stages.resize(static_cast<size_t>(p));
  std::vector<std::vector<double>> reduce_start(static_cast<size_t>(p));
  int first_rank = 0;  // world ranks are stage-major, then replica, then TP rank (as the runtime lays them out)
  for (int i = 0; i < p; ++i) {
    MeasuredStage& m = run.stages[static_cast<size_t>(i)];
    const StagePlan& s = plan.stages[static_cast<size_t>(i)];
    int replica = 0;
    for (const ReplicaGroup& g : s.groups) {
      const int from = first_rank + replica * s.tp, to = from + g.replicas * s.tp;
      const auto in_group = [from, to](int rank) { return rank >= from && rank < to; };
      const std::vector<double> f = per_step(kForward, i, nullptr, in_group),
                                b = per_step(kBackward, i, nullptr, in_group);
      if (f.empty() || b.empty()) {
        throw Error(ErrorCode::kConfig,
                    cat(source, ": stage ", i, "'s ", g.chip, " replicas (ranks ", from, "-", to - 1,
                        ") have no forward or backward in a whole step (a trace of another plan?)"));
      }
      m.groups.push_back({mean_after_warm_up(f), mean_after_warm_up(b)});
      replica += g.replicas;
    }
    first_rank += s.devices();
    const std::pair<int, const char*> needed[] = {
        {kForward, "forward"}, {kBackward, "backward"}, {kOptim, "optimizer step"}};
    double* into[] = {&m.forward_s, &m.backward_s, &m.optimizer_s};
    for (size_t n = 0; n < 3; ++n) {
      const std::vector<double> steps = per_step(needed[n].first, i);
      if (steps.empty()) {
        throw Error(ErrorCode::kConfig, cat(source, ": stage ", i, " has no ", needed[n].second,
                                            " in a whole step (a "
                                            "trace of another plan, or of a run that did not finish a step?)"));
      }
      *into[n] = mean_after_warm_up(steps);
    }
    m.reduce_s = mean_after_warm_up(per_step(kReduce, i, &reduce_start[static_cast<size_t>(i)]));
  }
  // The ends exchange the tied embedding's gradient: the end that starts its REDUCE_GRAD first waits there for the
  // other, so the exchange is timed by the end that starts last (in most steps after the warm-up).
  if (p > 1 && plan.shape.tied_embeddings) {
    const std::vector<double>&first = reduce_start.front(), &last = reduce_start.back();
    const size_t steps = std::min(first.size(), last.size());
    size_t last_later = 0;
    for (size_t k = steps > 2 ? 2 : 0; k < steps; ++k) last_later += last[k] >= first[k] ? 1 : 0;
    run.tied_last_end = 2 * last_later >= steps - (steps > 2 ? 2 : 0) ? p - 1 : 0;
  }
  return run;
}

Calibration calibrate(const Plan& plan, const Cluster& planned_on, const MeasuredRun& measured) {
  H2_CHECK(measured.stages.size() == plan.stages.size()) << "a measurement of another plan";
  const TrainSetup setup = setup_of(plan);
  auto recost = [&](const Cluster& cluster) {
    const CostModel costs(cluster, plan.shape, setup);
    return cost_layout(costs, layout_spec_of(plan, costs));
  };
  const size_t p = plan.stages.size();
  const Plan before = recost(planned_on);
  Calibration out;
  out.cluster = planned_on.with_emulation_kept();
  out.cluster.name = planned_on.name + "-calibrated";
  out.cluster.figures = Figures::kCalibrated;
  Cluster& c = out.cluster;
  // One coefficient: the scale of the figures `apply` changes at which the predicted sum of some terms (a class of
  // a stage, or of a stage's group) equals the measured sum; applied to the calibrated cluster and said in
  // `fitted` — unless no scale reaches the measurement (then left alone, and that said).
  struct Term {
    std::function<double(const Plan&)> predicted;
    double measured_s;
  };
  auto fit = [&](const std::string& what, const std::vector<Term>& terms,
                 const std::function<void(Cluster&, double)>& apply) {
    double target = 0;
    for (const Term& t : terms) target += t.measured_s;
    if (terms.empty() || target <= 0) return;
    auto predicted = [&](double k) {
      Cluster scaled = c;
      apply(scaled, k);
      const Plan q = recost(scaled);
      double sum = 0;
      for (const Term& t : terms) sum += t.predicted(q);
      return sum;
    };
    const double was = predicted(1.0);
    if (std::abs(predicted(1e-3) / predicted(1e3) - 1) < 1e-9) {
      out.fitted.push_back(cat(what, ": not fitted (this run's prediction does not depend on it)"));
      return;
    }
    const double k = fit_scale(predicted, target), reached = predicted(k);
    if (std::abs(reached / target - 1) > 0.01) {
      out.fitted.push_back(cat(what, ": not fitted (predicted ", format_seconds(was), ", measured ",
                               format_seconds(target), "; ", format_seconds(reached), " at x", format("%.3g", k),
                               ", the nearest any scale comes: what remains is not this figure's)"));
      return;
    }
    apply(c, k);
    out.fitted.push_back(cat(what, ": x", format("%.3g", k), " (predicted ", format_seconds(was), " -> ",
                             format_seconds(predicted(1.0)), ", measured ", format_seconds(target), ")"));
  };
  // A class of the stages on `chip` whose replicas are all of it, that `keep` keeps.
  using Of = double (*)(const Classes&);
  using Measured = double (*)(const MeasuredStage&);
  auto terms_on = [&](int chip, const std::function<bool(const StagePlan&, size_t)>& keep, Of cls, Measured meas) {
    std::vector<Term> terms;
    for (size_t i = 0; i < p; ++i) {
      const StagePlan& s = before.stages[i];
      if (s.groups.empty() && s.chip_index == chip && keep(s, i)) {
        terms.push_back({[cls, i](const Plan& q) { return cls(classes_of(q, i)); }, meas(measured.stages[i])});
      }
    }
    return terms;
  };
  const Of optimizer = [](const Classes& k) { return k.optimizer_s; };
  const Of reduce = [](const Classes& k) { return k.reduce_s; };
  const Measured measured_optimizer = [](const MeasuredStage& m) { return m.optimizer_s; };
  const Measured measured_reduce = [](const MeasuredStage& m) { return m.reduce_s; };
  const bool tied = p > 1 && plan.shape.tied_embeddings;
  auto at_end = [&](size_t i) { return tied && (i == 0 || i + 1 == p); };
  const auto all = [](const StagePlan&, size_t) { return true; };
  for (size_t ci = 0; ci < c.chips.size(); ++ci) {
    const int chip = static_cast<int>(ci);
    const std::string& name = c.chips[ci].name;
    fit(cat(name, " memory bandwidth (optimizer)"), terms_on(chip, all, optimizer, measured_optimizer),
        [ci](Cluster& x, double k) { x.chips[ci].memory_bandwidth_gbps *= k; });
    fit(cat(name, " data-parallel links (gradient all-reduce)"),
        terms_on(
            chip, [&](const StagePlan& s, size_t i) { return s.dp > 1 && !plan.zero1 && !at_end(i); }, reduce,
            measured_reduce),
        [ci](Cluster& x, double k) {
          x.groups[ci].intra_node_gbps *= k;
          x.groups[ci].nic_gbps *= k;
        });
  }
  if (tied && measured.tied_last_end >= 0 && before.stages.front().groups.empty() &&
      before.stages.back().groups.empty()) {
    const int a = before.stages.front().chip_index, b = before.stages.back().chip_index;
    fit(cat("link ", c.chips[static_cast<size_t>(a)].name, " - ", c.chips[static_cast<size_t>(b)].name,
            " (tied embedding exchange)"),
        {Term{
            [end = static_cast<size_t>(measured.tied_last_end)](const Plan& q) { return classes_of(q, end).reduce_s; },
            measured.stages[static_cast<size_t>(measured.tied_last_end)].reduce_s}},
        [a, b](Cluster& x, double k) {
          if (a == b) {
            x.groups[static_cast<size_t>(a)].nic_gbps *= k;
            return;
          }
          for (GroupLink& l : x.links) {
            if ((l.a == a && l.b == b) || (l.a == b && l.b == a)) l.bandwidth_gbps *= k;
          }
        });
  }
  // Last, a chip's kernels (forward and backward, one factor): what remains of those times once the memory-bound
  // kernels and the links are fitted - on stages that hold blocks or the head (the vocabulary's GEMM); the embedding
  // alone, a gather, says little of them.
  const auto with_blocks_or_head = [](const StagePlan& s, size_t) { return s.layers > 0 || s.head; };
  for (size_t ci = 0; ci < c.chips.size(); ++ci) {
    std::vector<Term> terms = terms_on(
        static_cast<int>(ci), with_blocks_or_head, [](const Classes& k) { return k.forward_s + k.backward_s; },
        [](const MeasuredStage& m) { return m.forward_s + m.backward_s; });
    for (size_t i = 0; i < p; ++i) {  // the replicas of this type in stages that mix types
      const StagePlan& s = before.stages[i];
      for (size_t g = 0; g < s.groups.size(); ++g) {
        if (s.groups[g].chip_index != static_cast<int>(ci) || !with_blocks_or_head(s, i)) continue;
        const MeasuredStage::Group& m = measured.stages[i].groups[g];
        terms.push_back(
            {[i, g](const Plan& q) { return q.stages[i].groups[g].forward_s + q.stages[i].groups[g].backward_s; },
             m.forward_s + m.backward_s});
      }
    }
    // A chip whose profile timed its blocks and head whole (part_corrections) has its kernels' time at each TP
    // degree and rows measured: what a run adds to them, slower, is per kernel (dispatch, a TP partner's late
    // wake-up), which does not grow with the rows, so it is fitted as what a run adds to each forward and backward
    // kernel (run_kernel_us: the fixed cost per kernel, with it, scaled by 1/k) — not the optimizer's, which the run
    // measured as its profile (until 2026-12-06 the fixed cost itself grew, and with it the optimizer's prediction:
    // 1.47x its measurement on the built-in example's fast stage). (On 2026-12-05 the rates scaled by the uniform
    // split's one-sequence stages, 0.89-0.94, put the slow chips alone at two sequences a micro-batch 4-8% above
    // what they then measured; docs/pipeline.md.) A run faster than the profile had a faster host: every rate.
    const bool parts_timed = !c.chips[ci].part_corrections.empty();
    const double run_before = c.chips[ci].run_kernel_us;
    fit(cat(c.chips[ci].name, " compute (forward + backward)"), terms, [ci, parts_timed](Cluster& x, double k) {
      ChipType& t = x.chips[ci];
      if (parts_timed && k < 1) {
        t.run_kernel_us += (t.kernel_overhead_us + t.run_kernel_us) * (1 / k - 1);
        return;
      }
      t.kernel_overhead_us /= k;
      t.run_kernel_us /= k;
      t.peak_tflops *= k;
      t.peak_tflops_f32 *= k;
      for (double& ns : t.matmul_element_ns) ns /= k;
      t.elementwise_gbps *= k;
    });
    if (c.chips[ci].run_kernel_us != run_before) {  // say what the factor became
      out.fitted.back() += cat(": ", format("%.3g", c.chips[ci].run_kernel_us),
                               " us a run adds to each forward and backward kernel (run_kernel_us)");
    }
  }
  const Plan after = recost(c);
  for (size_t i = 0; i < p; ++i) {
    const StagePlan& s = plan.stages[i];
    const std::string stage = cat("stage ", i, " (", s.chip, ", TP ", s.tp, " x DP ", s.dp, ") ");
    const Classes b = classes_of(before, i), a = classes_of(after, i);
    const MeasuredStage& m = measured.stages[i];
    if (s.groups.empty()) {
      out.rows.push_back({stage + "forward", b.forward_s, m.forward_s, a.forward_s});
      out.rows.push_back({stage + "backward", b.backward_s, m.backward_s, a.backward_s});
    }
    for (size_t g = 0; g < s.groups.size(); ++g) {  // replicas of several types: each type's own
      const std::string group = cat(stage, s.groups[g].chip, " x", s.groups[g].replicas, " ");
      const ReplicaGroup &gb = before.stages[i].groups[g], &ga = after.stages[i].groups[g];
      out.rows.push_back({group + "forward", gb.forward_s, m.groups[g].forward_s, ga.forward_s});
      out.rows.push_back({group + "backward", gb.backward_s, m.groups[g].backward_s, ga.backward_s});
    }
    if (b.reduce_s > 0 || m.reduce_s > 0) {
      const bool waits = at_end(i) && measured.tied_last_end >= 0 && i != static_cast<size_t>(measured.tied_last_end);
      out.rows.push_back({stage + (waits ? "reduce + wait" : "reduce"), b.reduce_s, m.reduce_s, a.reduce_s});
    }
    out.rows.push_back({stage + "optimizer", b.optimizer_s, m.optimizer_s, a.optimizer_s});
  }
  out.rows.push_back({"step (simulated)", simulate(before).step_s, measured.step_s, simulate(after).step_s});
  return out;
}

Calibration calibrate_run(const std::string& run_dir, const std::string& cluster_file) {
  const std::filesystem::path dir(run_dir);
  auto need = [&](const char* name) {
    const std::filesystem::path f = dir / name;
    if (!std::filesystem::exists(f)) {
      throw Error(ErrorCode::kIo, cat(f.string(), " does not exist: h2 calibrate reads the run directory (out_dir) of ",
                                      "a finished h2 train --cluster"));
    }
    return f.string();
  };
  const Plan plan = load_plan(need("plan.json"));
  const std::string cluster_path = cluster_file.empty() ? need("cluster.yaml") : cluster_file;
  const Cluster cluster = load_cluster_arg(cluster_path);
  const std::string summary_path = need("summary.json");
  double step_s = 0;
  try {
    step_s = nlohmann::json::parse(read_file(summary_path)).at("measured_step_s").get<double>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kConfig, cat(summary_path, ": no measured step (", e.what(), ")"));
  }
  const std::string trace_path = need("trace_measured.json");
  return calibrate(plan, cluster, read_measured_run(read_file(trace_path), plan, step_s, trace_path));
}

std::string format_calibration(const Calibration& c) {
  std::string s = "fitted:\n";
  for (const std::string& f : c.fitted) s += "  " + f + "\n";
  s += format("%-42s %11s %11s %11s %8s\n", "action class", "before", "measured", "after", "after/m");
  for (const CalibrationRow& r : c.rows) {
    s += format("%-42s %11s %11s %11s %8s\n", r.what.c_str(), format_seconds(r.before_s).c_str(),
                format_seconds(r.measured_s).c_str(), format_seconds(r.after_s).c_str(),
                r.measured_s > 0 ? format("%.3f", r.after_s / r.measured_s).c_str() : "-");
  }
  return s;
}

}  // namespace h2
