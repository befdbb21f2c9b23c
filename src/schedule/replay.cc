// The event loop of a schedule's replay (see replay.h).
#include "schedule/replay.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace h2 {

ReplayResult replay(const Schedule& schedule, const std::function<double(int, Work)>& compute_s,
                    const std::function<double(int)>& link_s) {
  if (const std::string deadlock = dry_run(schedule); !deadlock.empty()) {
    throw Error(ErrorCode::kInvalidArgument, deadlock);
  }
  const int p = schedule.ranks, V = schedule.stages, m = schedule.micro_batches;
  constexpr double kUnknown = -1;
  // Arrival time at virtual stage vs of micro-batch j's activation (fwd) or gradient (bwd).
  std::vector<std::vector<double>> arrive_f(static_cast<size_t>(V),
                                            std::vector<double>(static_cast<size_t>(m), kUnknown));
  std::vector<std::vector<double>> arrive_b = arrive_f, done_f = arrive_f, done_b = arrive_f;
  for (int j = 0; j < m; ++j) arrive_f[0][static_cast<size_t>(j)] = 0;
  std::vector<double> link_free_f(static_cast<size_t>(V), 0), link_free_b(static_cast<size_t>(V), 0);
  std::vector<size_t> pos(static_cast<size_t>(p), 0);
  ReplayResult out;
  out.finish.assign(static_cast<size_t>(p), 0);
  out.busy.assign(static_cast<size_t>(p), 0);
  out.peak_in_flight.assign(static_cast<size_t>(p), 0);
  std::vector<int> in_flight(static_cast<size_t>(p), 0);
  const auto is_compute = [](const Action& a) {
    return a.type == ActionType::kForward || a.type == ActionType::kBackward || a.type == ActionType::kWeight;
  };
  size_t remaining = 0;
  std::vector<bool> split(static_cast<size_t>(V), false);  // virtual stages whose backward is split into B and W
  for (const auto& list : schedule.actions) {
    for (const Action& a : list) {
      remaining += is_compute(a);
      if (a.type == ActionType::kWeight) split[static_cast<size_t>(a.stage)] = true;
    }
  }
  while (remaining > 0) {
    // The rank whose next compute action can start earliest.
    int pick = -1;
    double pick_start = std::numeric_limits<double>::infinity();
    for (int r = 0; r < p; ++r) {
      const auto& list = schedule.actions[static_cast<size_t>(r)];
      size_t& i = pos[static_cast<size_t>(r)];
      while (i < list.size() && !is_compute(list[i])) ++i;
      if (i >= list.size()) continue;
      const Action& a = list[i];
      double ready;
      if (a.type == ActionType::kForward) {
        ready = arrive_f[static_cast<size_t>(a.stage)][static_cast<size_t>(a.micro_batch)];
      } else if (a.type == ActionType::kWeight) {
        ready = done_b[static_cast<size_t>(a.stage)][static_cast<size_t>(a.micro_batch)];
      } else {
        const double own = done_f[static_cast<size_t>(a.stage)][static_cast<size_t>(a.micro_batch)];
        const double grad =
            a.stage == V - 1 ? own : arrive_b[static_cast<size_t>(a.stage)][static_cast<size_t>(a.micro_batch)];
        ready = own < 0 || grad < 0 ? kUnknown : std::max(own, grad);
      }
      if (ready < 0) continue;
      const double start = std::max(ready, out.finish[static_cast<size_t>(r)]);
      if (start < pick_start) pick_start = start, pick = r;
    }
    H2_CHECK(pick >= 0) << "the dry run passed but the replay stalled";
    const Action a = schedule.actions[static_cast<size_t>(pick)][pos[static_cast<size_t>(pick)]++];
    --remaining;
    const size_t vs = static_cast<size_t>(a.stage), j = static_cast<size_t>(a.micro_batch);
    const bool forward = a.type == ActionType::kForward;
    const Work work = forward                         ? Work::kForward
                      : a.type == ActionType::kWeight ? Work::kWeightGradient
                      : split[vs]                     ? Work::kInputGradient
                                                      : Work::kBackward;
    const double end = pick_start + compute_s(a.stage, work);
    out.finish[static_cast<size_t>(pick)] = end;
    out.busy[static_cast<size_t>(pick)] += end - pick_start;
    out.makespan = std::max(out.makespan, end);
    out.compute.push_back({pick, a, pick_start, end});
    int& live = in_flight[static_cast<size_t>(pick)];
    live += forward ? 1 : work == Work::kBackward || work == Work::kWeightGradient ? -1 : 0;
    out.peak_in_flight[static_cast<size_t>(pick)] = std::max(out.peak_in_flight[static_cast<size_t>(pick)], live);
    if (forward) {
      done_f[vs][j] = end;
      if (a.stage + 1 < V) {  // the activation goes to the next virtual stage over its link
        const double start = std::max(end, link_free_f[vs]);
        link_free_f[vs] = arrive_f[vs + 1][j] = start + link_s(a.stage);
        out.links.push_back({a.stage, a.micro_batch, true, start, link_free_f[vs]});
      }
    } else if (work != Work::kWeightGradient) {  // a W sends nothing
      done_b[vs][j] = end;
      if (a.stage > 0) {  // the gradient goes back to the previous virtual stage
        const double start = std::max(end, link_free_b[vs - 1]);
        link_free_b[vs - 1] = arrive_b[vs - 1][j] = start + link_s(a.stage - 1);
        out.links.push_back({a.stage - 1, a.micro_batch, false, start, link_free_b[vs - 1]});
      }
    }
  }
  return out;
}

}  // namespace h2
