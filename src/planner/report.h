// What `h2 plan` and `h2 train --cluster` print about a plan: its table, the search's statistics, and the
// baselines it is measured against — the uniform split of the same devices and each chip type alone (planned by
// the same search), with the heterogeneous speed-up ratio (mixed throughput / the sum of each type alone).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "planner/planner.h"

namespace h2 {

// The plan as a table: one row per stage, then the prediction, what limits it and why it was chosen.
std::string format_plan(const Plan& plan);
std::string format_search(const SearchStats& stats);

struct Baselines {
  std::optional<Plan> uniform;  // the uniform layer split of the plan's devices
  std::string uniform_failure;  // why it does not fit, when it does not
  struct Alone {
    std::string chip;
    int devices = 0;
    std::optional<Plan> plan;  // the fastest plan on this type's devices alone
    std::string failure;       // why none fits, when none does
  };
  std::vector<Alone> alone;  // chip types with devices, in the cluster's order
  double sum_alone_tokens_per_s = 0;
  // The plan's tokens/s over sum_alone_tokens_per_s; 0 when no type fits alone.
  double heterogeneous_speedup = 0;
};

Baselines plan_baselines(const CostModel& costs, const Plan& plan, const PlannerOptions& options);
// The table of baselines, the ratio, and explain_mix's lines.
std::string format_baselines(const Baselines& baselines, const Plan& plan);
// Where the mix gains or loses, per chip type: its stages, layers, the embedding and head, recomputation, fullest
// device and the bubble, in the mixed plan and in the type's own plan.
std::string explain_mix(const Baselines& baselines, const Plan& plan);

}  // namespace h2
