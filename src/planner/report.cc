// Plan tables and baselines (see report.h).
#include "planner/report.h"

#include <algorithm>
#include <cstdio>
#include <optional>

#include "core/error.h"
#include "core/format.h"

namespace h2 {
std::string format_plan(const Plan& p) {
  std::string out =
      format("plan: model '%s' on cluster '%s': %d pipeline(s) x %zu stages, micro-batch %d x %d per pipeline, %s%s\n",
             p.model.c_str(), p.cluster.c_str(), p.dp, p.stages.size(), p.micro_batch, p.num_micro_batches,
             schedule_name(p.schedule), p.chunks > 1 ? format(" (%d chunks per stage)", p.chunks).c_str() : "");
  out += format("%5s %-6s %3s %4s %-14s %-11s %6s %10s %10s %9s %11s %8s\n", "stage", "chip", "tp", "dp", "layers",
                "recompute", "flight", "fwd ms", "bwd ms", "send ms", "mem/device", "headroom");
  for (size_t i = 0; i < p.stages.size(); ++i) {
    const StagePlan& s = p.stages[i];
    // "4m-9a (5)": block 4's MLP half through block 9's attention half (a stage boundary inside a block).
    const std::string layers = format("%d%s-%d%s (%g)%s", s.first_layer, s.starts_at_mlp ? "m" : "",
                                      s.first_layer + s.layers - 1, s.ends_at_attention ? "a" : "", s.halves() / 2.0,
                                      s.embedding && s.head ? "E+H"
                                      : s.embedding         ? "+E"
                                      : s.head              ? "+H"
                                                            : "");
    out += format("%5zu %-6s %3d %4d %-14s %-11s %6d %10.3f %10.3f %9.3f %11s %7.0f%%\n", i, s.chip.c_str(), s.tp, s.dp,
                  layers.c_str(), recompute_label(s.recompute, s.recompute_blocks).c_str(), s.in_flight,
                  s.forward_s * 1e3, s.backward_s * 1e3, s.send_s * 1e3, format_bytes(s.memory_bytes).c_str(),
                  100.0 * (1.0 - s.memory_bytes / s.capacity_bytes));
    for (const ReplicaGroup& g : s.groups) {  // replicas of several chip types, with uneven shares
      out += format("%5s %-6s %3s %4d %-14s %-11s %6s %10.3f %10.3f %9s %11s %7.0f%%\n", "", g.chip.c_str(), "",
                    g.replicas, format("%d rows each", g.rows).c_str(),
                    recompute_label(g.recompute, g.recompute_blocks).c_str(), "", g.forward_s * 1e3, g.backward_s * 1e3,
                    "", format_bytes(g.memory_bytes).c_str(), 100.0 * (1.0 - g.memory_bytes / g.capacity_bytes));
    }
  }
  out += format("predicted: step %s | %.0f tokens/s | MFU %.1f%% | bubble %.1f%% | devices %d of %d%s\n",
                format_seconds(p.step_s).c_str(), p.tokens_per_s, 100 * p.mfu, 100 * p.bubble_fraction, p.devices_used,
                p.devices_total, p.fits ? "" : " | DOES NOT FIT");
  out += format("limited by: %s\nwhy: %s\n", p.limited_by.c_str(), p.why.c_str());
  return out;
}

std::string format_search(const SearchStats& s) {
  return format(
      "search: %lld layouts generated, %lld pruned for memory, %lld pruned by the bound, %lld costed, in %.3f s (%s "
      "enumeration%s)\n",
      static_cast<long long>(s.layouts), static_cast<long long>(s.pruned_memory),
      static_cast<long long>(s.pruned_bound), static_cast<long long>(s.evaluated), s.seconds, s.tier.c_str(),
      s.budget_exhausted ? ", budget exhausted" : "");
}

Baselines plan_baselines(const CostModel& costs, const Plan& plan, const PlannerOptions& options) {
  Baselines b;
  const Cluster& cluster = costs.cluster();
  FitFailure why;
  b.uniform = plan_uniform(costs, layout_of(plan, cluster), &why);
  if (!b.uniform) b.uniform_failure = why.what;
  for (size_t k = 0; k < cluster.chips.size(); ++k) {
    const int devices = cluster.devices_of(static_cast<int>(k));
    if (devices == 0) continue;
    Baselines::Alone a{cluster.chips[k].name, devices, std::nullopt, ""};
    try {
      a.plan = plan_training(CostModel(cluster.only(static_cast<int>(k)), costs.model(), costs.train()), options);
      b.sum_alone_tokens_per_s += a.plan->tokens_per_s;
    } catch (const Error& e) {
      a.failure = e.what();
    }
    b.alone.push_back(std::move(a));
  }
  if (b.sum_alone_tokens_per_s > 0) b.heterogeneous_speedup = plan.tokens_per_s / b.sum_alone_tokens_per_s;
  return b;
}

std::string format_baselines(const Baselines& b, const Plan& plan) {
  std::string out = format("%-40s %14s %10s %9s\n", "baseline", "tokens/s", "step s", "vs plan");
  const auto row = [&](const std::string& label, const Plan& p) {
    out += format("%-40s %14.0f %10.3f %8.2fx\n", label.c_str(), p.tokens_per_s, p.step_s,
                  plan.tokens_per_s / p.tokens_per_s);
  };
  const std::string uniform = "uniform layer split, same devices";
  if (b.uniform) {
    row(uniform, *b.uniform);
  } else {
    out += format("%-40s does not fit: %s\n", uniform.c_str(), b.uniform_failure.c_str());
  }
  for (const Baselines::Alone& a : b.alone) {
    const std::string label = cat(a.chip, " alone (", a.devices, " devices)");
    if (a.plan) {
      row(label, *a.plan);
    } else {
      out += format("%-40s does not fit: %s\n", label.c_str(), a.failure.c_str());
    }
  }
  if (b.heterogeneous_speedup > 0) {
    out += format(
        "heterogeneous speed-up ratio: %.0f / %.0f = %.3f (mixed throughput / sum of each type alone; above 1 is "
        "superlinear)\n",
        plan.tokens_per_s, b.sum_alone_tokens_per_s, b.heterogeneous_speedup);
  }
  out += explain_mix(b, plan);
  return out;
}

// Per chip type: what it does in the mixed plan beside what it does alone (stages, layers, the embedding and head,
// recomputation, memory used, bubble), which is where a mixed plan gains or loses against the types apart.
std::string explain_mix(const Baselines& b, const Plan& plan) {
  struct Role {
    int stages = 0, halves = 0, recomputing = 0, recomputed_blocks = 0, devices = 0;
    bool embedding = false, head = false;
    double memory = 0, capacity = 0;
  };
  const auto role_of = [](const Plan& p, const std::string& chip) {
    Role r;
    for (const StagePlan& s : p.stages) {
      // The stage's replicas of this type: all of them, or its group of that type in a mixed stage.
      std::optional<ReplicaGroup> mine;
      for (const ReplicaGroup& g : s.replica_groups()) {
        if (g.chip == chip) mine = g;
      }
      if (!mine) continue;
      const ReplicaGroup& group = *mine;
      ++r.stages;
      r.halves += s.halves();
      // The group's own recomputation, on all of the stage's blocks (a half counting as one) or its first ones.
      if (group.recompute != Recompute::kNone) {
        ++r.recomputing;
        r.recomputed_blocks += group.recompute_blocks >= 0 ? group.recompute_blocks : s.layers;
      }
      r.devices += s.tp * group.replicas;
      r.embedding = r.embedding || s.embedding;
      r.head = r.head || s.head;
      r.memory = std::max(r.memory, group.memory_bytes / group.capacity_bytes);
    }
    return r;
  };
  const auto describe = [](const Role& r) {
    return format("%d stage(s), %g layer(s)%s%s, %d device(s), recomputing on %d (%d block(s)), fullest device %.0f%%",
                  r.stages, r.halves / 2.0, r.embedding ? " + embedding" : "", r.head ? " + head" : "", r.devices,
                  r.recomputing, r.recomputed_blocks, 100 * r.memory);
  };
  std::string out = format("why (each chip type in the mixed plan, bubble %.0f%%, beside the type alone):\n",
                           100 * plan.bubble_fraction);
  for (const Baselines::Alone& a : b.alone) {
    const Role mixed = role_of(plan, a.chip);
    out += format("  %-8s mixed: %s\n", a.chip.c_str(),
                  mixed.stages > 0 ? describe(mixed).c_str() : "unused (no plan using it was faster)");
    if (a.plan) {
      out += format("  %-8s alone: %s; bubble %.0f%%, %.0f tokens/s\n", "", describe(role_of(*a.plan, a.chip)).c_str(),
                    100 * a.plan->bubble_fraction, a.plan->tokens_per_s);
    } else {
      out += format("  %-8s alone: does not fit\n", "");
    }
  }
  return out;
}

}  // namespace h2
