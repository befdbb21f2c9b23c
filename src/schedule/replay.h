// The timing of a schedule (schedule.h), event by event: each rank runs its compute actions in its list's order,
// each starting once the rank is free and its inputs have arrived; a forward's output crosses to the next virtual
// stage, and a backward's input gradient back to the previous one, over one link per boundary and direction,
// where transfers queue behind one another. Communication and reduction actions in the list are ignored (the
// links stand for them). Pure: durations in, times out; the simulator (src/sim) adds memory, the end of the step
// and a trace, and the planner uses it for schedules without a closed form.
#pragma once

#include <functional>
#include <vector>

#include "schedule/schedule.h"

namespace h2 {

struct ReplayEvent {
  int rank = 0;
  Action action;  // a forward, backward or W
  double start = 0, end = 0;
};

struct LinkEvent {
  int boundary = 0;  // from virtual stage `boundary` to boundary + 1
  int micro_batch = 0;
  bool forward = true;  // the activation (true) or its gradient (false)
  double start = 0, end = 0;
};

struct ReplayResult {
  std::vector<ReplayEvent> compute;  // in the order they were replayed
  std::vector<LinkEvent> links;
  std::vector<double> finish;       // per rank: the end of its last compute action
  std::vector<double> busy;         // per rank: its compute time
  std::vector<int> peak_in_flight;  // per rank: the most micro-batches it held at once (forward done, backward — or W,
                                    // where the backward is split — not)
  double makespan = 0;  // the last compute action's end
};

// What a compute action computes: a forward, a whole backward, or one of a split backward's two parts (schedule.h:
// B of a stage with W actions is its input gradient, W its weight gradients).
enum class Work { kForward, kBackward, kInputGradient, kWeightGradient };

// `compute_s(virtual stage, work)`: an action's duration; `link_s(boundary)`: a transfer's, each direction.
// Throws Error(kInvalidArgument) with the dry run's grid when the schedule deadlocks.
ReplayResult replay(const Schedule& schedule, const std::function<double(int stage, Work work)>& compute_s,
                    const std::function<double(int boundary)>& link_s);

}  // namespace h2
