// What-if costing (`h2 plan --layout FILE`, `h2 simulate --cluster/--model/--train`): a layout written by hand —
// stages with their chip type, TP, DP, layers and recomputation; micro-batch size; schedule — costed exactly as
// given, into the same plan.json the search writes, whether or not it fits (the plan says so).
//
// File format (YAML; errors name the file, line and field):
//   dp: 8                # pipelines: a micro-batch is dp x micro_batch sequences over a stage's replicas
//   micro_batch: 1       # sequences per micro-batch and pipeline
//   schedule: 1f1b       # gpipe | 1f1b | interleaved | zb-h1 (default 1f1b; zb-h1: costed as 1f1b, then each
//                        # backward split where memory holds it, plan.h's as_zero_bubble)
//   chunks: 2            # virtual stages per stage, interleaved only (default 1)
//   stages:              # in pipeline order: the first holds the embedding, the last the head
//     - {chip: A100, tp: 8, layers: 12, recompute: full}   # dp: the stage's replicas (default: the top dp)
//     - {chip: H100, tp: 8, layers: 20}                   # recompute: absent = the fastest allowed that fits
//   with one chunk, a stage may also recompute only its first blocks:
//     - {chip: A100, tp: 8, layers: 12, recompute: full, recompute_blocks: 3}
//   and replicas of several chip types each take their rows of a micro-batch, each type with its own recompute:
//     - {tp: 8, layers: 8, mix: [{chip: A100, replicas: 4, rows: 1, recompute: full}, {chip: H100, rows: 2}]}
//   layers may end in .5 (1f1b and gpipe): the stages then meet inside a block, one ending after its attention half
//   and the next starting at its MLP half — {layers: 1.5} then {layers: 2.5} split block 1 between them.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/config.h"
#include "planner/planner.h"

namespace h2 {

struct LayoutSpec {
  Layout layout;
  std::vector<int> layers;  // per stage; half-blocks with `halves`
  bool halves = false;      // a stage boundary inside a block (ScoreOptions::halves): the layers are half-blocks
  std::vector<GivenRecompute> recompute;  // per stage
  bool zero_bubble = false;               // schedule zb-h1: `layout` is 1F1B's, its plan then as_zero_bubble's
};

// Reads and checks a layout against the cluster (chip types, devices enough for every stage, TP within a node),
// the model (TP dividing the heads, layers adding up) and the setup (the global batch a whole number of
// micro-batches, replicas dividing a micro-batch).
LayoutSpec load_layout(const ConfigNode& root, const CostModel& costs);

// The setup a plan was costed for: its global batch, precision, ZeRO-1 and micro-batch size (to cost it again
// without the training file).
TrainSetup setup_of(const Plan& plan);

// The layout a plan runs (to cost it again with other figures); Error(kConfig) when the plan's model is not the
// cost model's or its chip types are not in the cluster.
LayoutSpec layout_spec_of(const Plan& plan, const CostModel& costs);

// Whether the cluster has the devices a plan runs on: every stage's chip type, and per type at least the plan's
// ranks (TP x DP of each stage). Error(kConfig) naming the plan file, the stage or type and the counts.
void check_plan_on_cluster(const Plan& plan, const Cluster& cluster, const std::string& source);

// The plan of exactly this layout: times, memory, prediction; fits false (and why in limited_by) when a device's
// memory is exceeded.
Plan cost_layout(const CostModel& costs, const LayoutSpec& spec);

}  // namespace h2
