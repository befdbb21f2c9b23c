// HeteroAuto's search (docs/architecture.md, "planner"): which devices form which pipeline stages, and which layers
// each stage runs, so that one training step on a mixed cluster is as fast as possible.
//
// Stage 1 enumerates resource layouts: the data-parallel width (number of pipelines), the micro-batch size,
// and for each chip type its TP degree and its number of stages, with the chip types in some order along the
// pipeline. Layouts that cannot hold the model even with full recomputation are dropped before costing, and so
// are layouts whose lower bound (all work at the used devices' full rate) is no better than the best plan so
// far. The enumeration is anytime, in tiers of growing fineness (the "tier", reported): greedy, then coarse and
// then exhaustive, each when its space is small enough to finish (the time budget still cuts it off if it must) —
// so small clusters are enumerated completely, and very large ones keep the greedy tier's plan at once.
// Stage 2 splits the layers over a layout's stages: a binary search on the slowest stage's time, where each
// stage takes as many layers as its memory allows under its best recomputation choice — the exact minimum of
// the slowest stage — then the plan is scored with the 1F1B pipeline formula (cost_model.h).
// Devices may be left idle when that is faster; the plan says so.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "planner/cost_model.h"
#include "planner/plan.h"

namespace h2 {

struct PlannerOptions {
  double time_budget_s = 5.0;              // stop enumerating after this long and return the best plan found
  int threads = 0;                         // 0: one per core
  std::string finest_tier = "exhaustive";  // stop after this tier: "greedy", "coarse" or "exhaustive"
  bool mixed_stages = true;                // also stages whose replicas are of several chip types (uneven shares)
  bool interleave = true;                  // also interleaved 1F1B (h2 train runs 1F1B only: it plans without)
  bool split_blocks = true;                // 1F1B stages may begin or end inside a block (at its MLP half)
  // Each search thread keeps the memory terms of the stages it has costed, by what they depend on; false: every
  // stage's are computed afresh (slower; the reference the tests hold the cache to).
  bool memory_cache = true;
};

struct SearchStats {
  int64_t layouts = 0;        // resource layouts generated
  int64_t pruned_memory = 0;  // dropped before costing: the model cannot fit on them
  int64_t pruned_bound = 0;   // dropped before costing: cannot beat the best plan so far
  int64_t evaluated = 0;      // layouts whose layer split was computed and scored
  double seconds = 0;
  bool budget_exhausted = false;
  std::string tier;  // "exhaustive", "coarse" or "greedy"
};

// A resource layout: the pipeline's stages in order, each a chip type, a TP degree and a DP degree (its replicas
// share a micro-batch's dp x micro_batch sequences), and the schedule they run.
struct Layout {
  int dp = 1;           // pipelines: a micro-batch is dp x micro_batch sequences over a stage's replicas
  int micro_batch = 1;  // sequences per micro-batch and pipeline
  // Replicas of one chip type in a stage whose replicas mix types, each taking `rows` sequences of a micro-batch.
  struct Share {
    int chip = 0;
    int replicas = 1;
    int rows = 1;
  };
  struct Slot {
    int chip = 0;
    int tp = 1;
    int dp = 0;  // this stage's replicas; 0: the layout's dp
    // Replicas of several chip types with uneven shares (then chip is the first share's, dp their replicas and
    // their rows x replicas add up to the micro-batch's dp x micro_batch); empty: dp replicas of chip.
    std::vector<Share> mix = {};
    // The vocabulary as its own part: the first stage holds only the embedding, or the last only the head (and
    // loss), no layers, sharded over its TP ranks (vocabulary-parallel) on chips of its own.
    bool vocabulary_only = false;
  };
  std::vector<Slot> stages;
  ScheduleKind schedule = ScheduleKind::k1F1B;
  int chunks = 1;
  int stage_dp(size_t i) const { return stages[i].dp > 0 ? stages[i].dp : dp; }
  // The stage's replicas by chip type: its mix, or one share of stage_dp(i) replicas of its chip.
  std::vector<Share> shares(size_t i) const;
  // f(share) for each of them, without allocating (the search's inner loops).
  template <class F>
  void for_each_share(size_t i, F&& f) const {
    if (stages[i].mix.empty()) {
      f(Share{stages[i].chip, stage_dp(i), dp * micro_batch / stage_dp(i)});
    } else {
      for (const Share& s : stages[i].mix) f(s);
    }
  }
};

// Why a layout or a split did not give a plan.
struct FitFailure {
  std::string what;  // "stage 2 (A, TP 2) needs 41.3 GiB per device with full recomputation; it has 30.4"
  double shortfall_bytes = 0;
  // An end stage that cannot hold even one layer beside the embedding or the head but holds them alone (the search
  // then tries it as a vocabulary-only stage); -1 otherwise.
  int vocabulary_alone = -1;
};

// The best plan, or Error(kInvalidArgument) when nothing fits, naming the constraint that fails and by how much.
Plan plan_training(const CostModel& costs, const PlannerOptions& options, SearchStats* stats = nullptr);

// A stage's recomputation as a layout file or a plan gives it.
struct GivenRecompute {
  std::optional<Recompute> recompute;  // absent: the fastest allowed choice under which the stage fits
  int64_t blocks = -1;                 // on its first this many blocks; -1: all
  // A stage whose replicas mix chip types: each share's own, in the layout's order of its shares (a plan's groups);
  // empty, or a share's recompute absent: the stage's.
  std::vector<GivenRecompute> shares = {};
};

struct ScoreOptions {
  std::vector<GivenRecompute> recompute;  // per stage, or empty: each the fastest that fits
  bool require_fit = true;                // false: a layout over its devices' memory still gets a plan, with fits false
  // The layers per stage are half-blocks (a block's attention half, then its MLP half): a stage boundary may fall
  // inside a block (model/gpt.h's GptRange). One chunk per stage only.
  bool halves = false;
};
// Scores a layout with the given layers per stage. Without a fit (and with require_fit), nullopt and the failure.
std::optional<Plan> score_split(const CostModel& costs, const Layout& layout, const std::vector<int>& layers,
                                FitFailure* failure = nullptr, const ScoreOptions& options = {});
// A plan's step time, throughput, MFU, bubble and limits from when each stage finished its last backward; and
// the same from the replay of its schedule (schedule/replay.h), the simulator's timing, which the closed form
// of 1F1B the search uses only approximates when links or near-equal stages make stages wait.
void set_step(const CostModel& costs, Plan& plan, const std::vector<double>& finish, double pipeline_s,
              bool link_bound);
void score_by_replay(const CostModel& costs, Plan& plan);
// score_by_replay, then — where the training setup allows it (TrainSetup::zero_bubble) — the plan with ZB-H1 in
// place of 1F1B (as_zero_bubble), kept where its replay is faster: how the search and its baselines choose a schedule.
void score_with_zero_bubble(const CostModel& costs, Plan& plan);
// The uniform split on a layout (the baseline HeteroAuto is measured against): layers divided as evenly as possible
// over the stages (a stage that held only the vocabulary gets its share too), and the replicas of a stage that mixes
// chip types equal shares of a micro-batch's rows — a split blind to the chips' speeds and memories.
std::optional<Plan> plan_uniform(const CostModel& costs, const Layout& layout, FitFailure* failure = nullptr);

Layout layout_of(const Plan& plan, const Cluster& cluster);

// TP degrees a chip type may use: powers of two within a node that divide the head counts.
std::vector<int> tp_options(const CostModel& costs, int chip);

}  // namespace h2
