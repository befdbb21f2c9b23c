// The discrete-event simulator (docs/architecture.md, "planner and simulator"): replays a plan's pipeline schedule
// event by event — each stage's compute in its schedule's order, each activation and gradient over its link, the
// gradient all-reduce and the optimizer step — and returns the step time, the bubble, each device's busy time
// and peak memory, and a Chrome/Perfetto trace. It judges the planner, whose 1F1B step time is a closed form.
//
// Durations and each stage's memory terms (state, buffers, activations per micro-batch) come from the plan (which
// the cost model wrote); the schedule, and so the micro-batches each device holds at once, is the simulator's own.
// Links: each stage boundary is a resource per direction, so transfers over it queue behind one another (contention);
// under interleaving the boundary from the last rank back to the first uses the slowest boundary's time.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "planner/plan.h"
#include "schedule/replay.h"

namespace h2 {

// Replay another schedule than the plan's (what-if).
struct SimOptions {
  std::optional<ScheduleKind> schedule;  // the plan's when absent
  int chunks = 0;                        // virtual stages per rank for interleaved 1F1B; 0: the plan's, or 2
};

struct SimResult {
  double step_s = 0;      // to the last optimizer step
  double pipeline_s = 0;  // to the last backward
  double bubble_fraction = 0;
  std::vector<double> busy_s;             // compute time per stage
  std::vector<double> peak_memory_bytes;  // per device of each stage
  std::vector<double> capacity_bytes;
  std::vector<int> deferred_w;  // zb-h1: the W's each stage deferred (zb_deferrals of the plan replayed); else empty
  std::string trace_json;       // Chrome trace format: load in chrome://tracing or ui.perfetto.dev

  bool fits() const;
};

// Throws Error(kInvalidArgument) when the schedule deadlocks (with the dry run's grid), Error(kConfig) naming the
// field when the plan cannot run the schedule (check_plan).
SimResult simulate(const Plan& plan, const SimOptions& options = {});

// The step against the planner's, and per stage its busy time and peak memory against capacity ("OVER
// CAPACITY" where it does not fit); `schedule` names the schedule replayed.
std::string format_simulation(const Plan& plan, const SimResult& result, const std::string& schedule);

}  // namespace h2
