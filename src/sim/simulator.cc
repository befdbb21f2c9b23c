// The event loop of the simulator.
#include "sim/simulator.h"

#include <algorithm>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/format.h"

namespace h2 {

ScheduleKind parse_schedule_kind(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::kGPipe;
  if (name == "1f1b") return ScheduleKind::k1F1B;
  if (name == "interleaved") return ScheduleKind::kInterleaved;
  throw Error(ErrorCode::kInvalidArgument, cat("unknown schedule '", name, "'; use gpipe, 1f1b or interleaved"));
}

bool SimResult::fits() const {
  for (size_t i = 0; i < peak_memory_bytes.size(); ++i) {
    if (peak_memory_bytes[i] > capacity_bytes[i] * (1 + 1e-9)) return false;
  }
  return true;
}

SimResult simulate(const Plan& plan, const SimOptions& options) {
  const int p = static_cast<int>(plan.stages.size());
  const int m = plan.num_micro_batches;
  const int v = options.schedule == ScheduleKind::kInterleaved ? options.chunks : 1;
  const Schedule schedule = options.schedule == ScheduleKind::kGPipe  ? schedule_gpipe(p, m)
                            : options.schedule == ScheduleKind::k1F1B ? schedule_1f1b(p, m)
                                                                      : schedule_interleaved(p, v, m);
  if (const std::string deadlock = dry_run(schedule); !deadlock.empty()) {
    throw Error(ErrorCode::kInvalidArgument, deadlock);
  }
  const int V = schedule.stages;
  // Durations per virtual stage: a rank's stage time split evenly over its chunks.
  auto fwd = [&](int vs) { return plan.stages[static_cast<size_t>(vs % p)].forward_s / v; };
  auto bwd = [&](int vs) { return plan.stages[static_cast<size_t>(vs % p)].backward_s / v; };
  double slowest_link = 0;
  for (const StagePlan& s : plan.stages) slowest_link = std::max(slowest_link, s.send_s);
  auto link_s = [&](int vs) {  // from virtual stage vs to vs + 1
    const int r = vs % p;
    return r == p - 1 ? slowest_link : plan.stages[static_cast<size_t>(r)].send_s;
  };

  nlohmann::json events = nlohmann::json::array();
  auto trace = [&](const std::string& name, const char* cat_name, int pid, int tid, double start, double dur) {
    events.push_back({{"name", name},
                      {"cat", cat_name},
                      {"ph", "X"},
                      {"pid", pid},
                      {"tid", tid},
                      {"ts", start * 1e6},
                      {"dur", dur * 1e6}});
  };

  constexpr double kUnknown = -1;
  // Arrival time at virtual stage vs of micro-batch j's activation (fwd) or gradient (bwd).
  std::vector<std::vector<double>> arrive_f(static_cast<size_t>(V),
                                            std::vector<double>(static_cast<size_t>(m), kUnknown));
  std::vector<std::vector<double>> arrive_b = arrive_f, done_f = arrive_f;
  for (int j = 0; j < m; ++j) arrive_f[0][static_cast<size_t>(j)] = 0;
  std::vector<double> link_free_f(static_cast<size_t>(V), 0), link_free_b(static_cast<size_t>(V), 0);
  std::vector<size_t> pos(static_cast<size_t>(p), 0);
  std::vector<double> rank_free(static_cast<size_t>(p), 0);
  SimResult result;
  result.busy_s.assign(static_cast<size_t>(p), 0);
  std::vector<int> in_flight(static_cast<size_t>(p), 0), peak_in_flight(static_cast<size_t>(p), 0);

  size_t remaining = 0;
  for (const auto& list : schedule.actions) remaining += list.size();
  while (remaining > 0) {
    // The rank whose next action can start earliest.
    int pick = -1;
    double pick_start = std::numeric_limits<double>::infinity();
    for (int r = 0; r < p; ++r) {
      const auto& list = schedule.actions[static_cast<size_t>(r)];
      if (pos[static_cast<size_t>(r)] >= list.size()) continue;
      const Action& a = list[pos[static_cast<size_t>(r)]];
      double ready;
      if (a.type == ActionType::kForward) {
        ready = arrive_f[static_cast<size_t>(a.stage)][static_cast<size_t>(a.micro_batch)];
      } else {
        const double own = done_f[static_cast<size_t>(a.stage)][static_cast<size_t>(a.micro_batch)];
        const double grad =
            a.stage == V - 1 ? own : arrive_b[static_cast<size_t>(a.stage)][static_cast<size_t>(a.micro_batch)];
        ready = own < 0 || grad < 0 ? kUnknown : std::max(own, grad);
      }
      if (ready < 0) continue;
      const double start = std::max(ready, rank_free[static_cast<size_t>(r)]);
      if (start < pick_start) pick_start = start, pick = r;
    }
    H2_CHECK(pick >= 0) << "the dry run passed but the simulation stalled";
    const Action a = schedule.actions[static_cast<size_t>(pick)][pos[static_cast<size_t>(pick)]++];
    --remaining;
    const size_t vs = static_cast<size_t>(a.stage), j = static_cast<size_t>(a.micro_batch);
    const bool forward = a.type == ActionType::kForward;
    const double dur = forward ? fwd(a.stage) : bwd(a.stage);
    const double end = pick_start + dur;
    rank_free[static_cast<size_t>(pick)] = end;
    result.busy_s[static_cast<size_t>(pick)] += dur;
    trace(a.str(), "compute", 0, pick, pick_start, dur);
    int& live = in_flight[static_cast<size_t>(pick)];
    live += forward ? 1 : -1;
    peak_in_flight[static_cast<size_t>(pick)] = std::max(peak_in_flight[static_cast<size_t>(pick)], live);
    if (forward) {
      done_f[vs][j] = end;
      if (a.stage + 1 < V) {  // the activation goes to the next virtual stage over its link
        const double start = std::max(end, link_free_f[vs]);
        const double t = link_s(a.stage);
        link_free_f[vs] = start + t;
        arrive_f[vs + 1][j] = start + t;
        if (t > 0) trace(cat(a.stage, "SEND_F", j), "link", 1, a.stage, start, t);
      }
    } else if (a.stage > 0) {  // the gradient goes back to the previous virtual stage
      const double start = std::max(end, link_free_b[vs - 1]);
      const double t = link_s(a.stage - 1);
      link_free_b[vs - 1] = start + t;
      arrive_b[vs - 1][j] = start + t;
      if (t > 0) trace(cat(a.stage, "SEND_B", j), "link", 1, a.stage - 1, start, t);
    }
  }
  // Each stage reduces its gradients once its last backward is done, then the tied embedding's, then the
  // optimizer steps after the global norm (plan.h, end_of_step).
  const StepEnd end = end_of_step(plan, std::vector<double>(rank_free.begin(), rank_free.begin() + p));
  result.step_s = end.step_s;
  for (int r = 0; r < p; ++r) {
    const StagePlan& s = plan.stages[static_cast<size_t>(r)];
    const size_t i = static_cast<size_t>(r);
    result.pipeline_s = std::max(result.pipeline_s, rank_free[i]);
    if (s.dp_allreduce_s > 0) trace(cat(r, "REDUCE_GRAD"), "dp", 0, r, end.reduce_start[i], s.dp_allreduce_s);
    if (end.tied_start[i] >= 0) trace(cat(r, "REDUCE_TIED"), "dp", 0, r, end.tied_start[i], s.tied_allreduce_s);
    trace(cat(r, "OPTIM"), "optimizer", 0, r, end.optim_start[i], s.optimizer_s);
    // Memory from this replay, not from the plan's totals: the state and buffers, allocated for the whole step,
    // plus a micro-batch's activations from its forward to its backward (a chunk's share when interleaved), at
    // the most the replay held at once.
    result.peak_memory_bytes.push_back(s.state_bytes + s.buffer_bytes +
                                       peak_in_flight[static_cast<size_t>(r)] * s.activation_bytes / v);
    result.capacity_bytes.push_back(s.capacity_bytes);
  }
  double busy = 0;
  for (double b : result.busy_s) busy += b;
  result.bubble_fraction = 1.0 - busy / (p * result.pipeline_s);
  nlohmann::json doc = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  for (int r = 0; r < p; ++r) {
    const StagePlan& s = plan.stages[static_cast<size_t>(r)];
    doc["traceEvents"].push_back(
        {{"name", "thread_name"},
         {"ph", "M"},
         {"pid", 0},
         {"tid", r},
         {"args", {{"name", cat("stage ", r, " (", s.chip, ", TP ", s.tp, " x DP ", s.dp, ")")}}}});
  }
  result.trace_json = doc.dump();
  return result;
}

std::string format_simulation(const Plan& plan, const SimResult& r, const std::string& schedule) {
  std::string out =
      format("simulated %s: step %.3f s (pipeline %.3f s), bubble %.1f%%; planner predicted %.3f s (%+.2f%%)\n",
             schedule.c_str(), r.step_s, r.pipeline_s, 100 * r.bubble_fraction, plan.step_s,
             100 * (plan.step_s / r.step_s - 1));
  out += format("%5s %-6s %10s %8s %12s %12s\n", "stage", "chip", "busy s", "busy %", "peak memory", "capacity");
  for (size_t i = 0; i < plan.stages.size(); ++i) {
    out += format("%5zu %-6s %10.3f %7.1f%% %12s %12s%s\n", i, plan.stages[i].chip.c_str(), r.busy_s[i],
                  100 * r.busy_s[i] / r.step_s, format_bytes(r.peak_memory_bytes[i]).c_str(),
                  format_bytes(r.capacity_bytes[i]).c_str(),
                  r.peak_memory_bytes[i] > r.capacity_bytes[i] ? "  OVER CAPACITY" : "");
  }
  return out;
}

}  // namespace h2
