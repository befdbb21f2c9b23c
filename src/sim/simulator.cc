// The event loop of the simulator.
#include "sim/simulator.h"

#include <algorithm>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/format.h"

namespace h2 {

bool SimResult::fits() const {
  for (size_t i = 0; i < peak_memory_bytes.size(); ++i) {
    if (peak_memory_bytes[i] > capacity_bytes[i] * (1 + 1e-9)) return false;
  }
  return true;
}

SimResult simulate(const Plan& given, const SimOptions& options) {
  Plan plan = given;
  if (options.schedule) {
    plan.schedule = *options.schedule;
    plan.chunks = plan.schedule != ScheduleKind::kInterleaved ? 1 : options.chunks > 0 ? options.chunks : 2;
    // A micro-batch's activations per chunk (interleaved: the chunks' average): a chunk's share of the stage's when
    // replayed with more chunks than the plan was costed for, the whole stage's with one.
    for (StagePlan& s : plan.stages) s.activation_bytes *= static_cast<double>(given.chunks) / plan.chunks;
  }
  check_plan(plan, "the plan to simulate");
  const int p = static_cast<int>(plan.stages.size());
  const ReplayResult r = replay_plan(plan);

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
  for (const ReplayEvent& e : r.compute) trace(e.action.str(), "compute", 0, e.rank, e.start, e.end - e.start);
  for (const LinkEvent& l : r.links) {
    if (l.end > l.start) {
      trace(cat(l.forward ? l.boundary : l.boundary + 1, l.forward ? "SEND_F" : "SEND_B", l.micro_batch), "link", 1,
            l.boundary, l.start, l.end - l.start);
    }
  }
  SimResult result;
  if (plan.schedule == ScheduleKind::kZeroBubbleH1) result.deferred_w = zb_deferrals(plan);
  const std::vector<int>& deferred = result.deferred_w;
  result.busy_s = r.busy;
  result.pipeline_s = r.makespan;
  // Each stage reduces its gradients once its last backward is done, then the tied embedding's, then the
  // optimizer steps after the global norm (plan.h, end_of_step).
  const StepEnd end = end_of_step(plan, r.finish);
  result.step_s = end.step_s;
  for (int i = 0; i < p; ++i) {
    const StagePlan& s = plan.stages[static_cast<size_t>(i)];
    const size_t k = static_cast<size_t>(i);
    if (s.dp_allreduce_s > 0) trace(cat(i, "REDUCE_GRAD"), "dp", 0, i, end.reduce_start[k], s.dp_allreduce_s);
    if (end.tied_start[k] >= 0) trace(cat(i, "REDUCE_TIED"), "dp", 0, i, end.tied_start[k], s.tied_allreduce_s);
    trace(cat(i, "OPTIM"), "optimizer", 0, i, end.optim_start[k], s.optimizer_s);
    // Memory from this replay, not from the plan's totals: the state and buffers, allocated for the whole step,
    // plus a micro-batch's activations from its forward to its backward (above: per chunk), at the most the replay
    // held at once. Split (zb-h1), a micro-batch is held from its F to its W, and up to deferred + 1 of them
    // (zb_deferrals) also hold what their W reads.
    const double pending = deferred.empty() || deferred[k] < 0 ? 0 : (deferred[k] + 1) * s.weight_pending_bytes;
    result.peak_memory_bytes.push_back(s.state_bytes + s.buffer_bytes + r.peak_in_flight[k] * s.activation_bytes +
                                       pending);
    result.capacity_bytes.push_back(s.capacity_bytes);
  }
  double busy = 0;
  for (double b : result.busy_s) busy += b;
  result.bubble_fraction = 1.0 - busy / (p * result.pipeline_s);
  nlohmann::json doc = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  for (int i = 0; i < p; ++i) {
    const StagePlan& s = plan.stages[static_cast<size_t>(i)];
    doc["traceEvents"].push_back(
        {{"name", "thread_name"},
         {"ph", "M"},
         {"pid", 0},
         {"tid", i},
         {"args", {{"name", cat("stage ", i, " (", s.chip, ", TP ", s.tp, " x DP ", s.dp, ")")}}}});
  }
  result.trace_json = doc.dump();
  return result;
}

std::string format_simulation(const Plan& plan, const SimResult& r, const std::string& schedule) {
  std::string out =
      format("simulated %s: step %s (pipeline %s), bubble %.1f%%; planner predicted %s (%+.2f%%)\n", schedule.c_str(),
             format_seconds(r.step_s).c_str(), format_seconds(r.pipeline_s).c_str(), 100 * r.bubble_fraction,
             format_seconds(plan.step_s).c_str(), 100 * (plan.step_s / r.step_s - 1));
  out += format("%5s %-6s %12s %8s %12s %12s\n", "stage", "chip", "busy", "busy %", "peak memory", "capacity");
  for (size_t i = 0; i < plan.stages.size(); ++i) {
    out += format("%5zu %-6s %12s %7.1f%% %12s %12s%s\n", i, plan.stages[i].chip.c_str(),
                  format_seconds(r.busy_s[i]).c_str(), 100 * r.busy_s[i] / r.step_s,
                  format_bytes(r.peak_memory_bytes[i]).c_str(), format_bytes(r.capacity_bytes[i]).c_str(),
                  r.peak_memory_bytes[i] > r.capacity_bytes[i] ? "  OVER CAPACITY" : "");
  }
  if (!r.deferred_w.empty()) {
    out +=
        "W's deferred per stage (ZB-H1's own: its index; fewer where its memory holds fewer micro-batches beside "
        "1F1B's; -1: not split, it recomputes, mixes chip types or has no room):";
    for (int d : r.deferred_w) out += cat(" ", d);
    out += "\n";
    out +=
        "zb-h1: each backward split into B (the input gradients, sent at once) and W (the weight gradients, "
        "weight_s of it: the cost model's share, not profiled apart)\n";
  }
  return out;
}

}  // namespace h2
