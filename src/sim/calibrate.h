// `h2 calibrate` (docs/planner.md, "Calibration"): fits the cost model's per-chip and per-link figures to what a
// run measured (trace_measured.json of `h2 train --cluster`) so that the same figures predict that run and
// others on the cluster. Each coefficient is one scale found by bisection so that the cost model's prediction of
// an action class equals its measurement, in this order (each fit sees the ones before):
//   1. a chip type's memory bandwidth, from its stages' optimizer steps (OPTIM: streaming kernels);
//   2. a chip type's data-parallel links (its group's node and NIC bandwidth), from the gradient all-reduce of
//      its stages that are not at an end of the pipeline (REDUCE_GRAD without ZeRO-1);
//   3. the link between the pipeline's ends, from the tied embedding's exchange: the REDUCE_GRAD of the end that
//      reaches it last (the other end's includes waiting for it), with its DP part as step 2 predicts it;
//   4. a chip type's compute (its peak rates up, its fixed per-kernel cost down, by one factor), from its
//      stages' forward and backward per micro-batch, which include their tensor-parallel all-reduces — in a stage
//      whose replicas mix chip types, from its replicas of that type alone. A chip whose profile timed its block
//      and head whole (ChipType::part_corrections), measured slower than predicted: its fixed per-kernel cost
//      alone (what a run adds to kernels whose times the profile measured at every rows).
// A stage whose replicas mix chip types fits only compute: its optimizer steps and its ring are those of several
// types at once. A coefficient that no scale in [1e-3, 1e3] brings to the measurement (a floor the figure does not
// move: the fixed costs of the optimizer's kernels) is left as it was, and said so.
// Pipeline sends are not fitted: the runtime's sends are asynchronous and their receives include waiting.
#pragma once

#include <string>
#include <vector>

#include "planner/plan.h"
#include "planner/spec.h"

namespace h2 {

// What a run measured, per stage of its plan: means over the steps after the warm-up, micro-batches and the
// stage's devices.
struct MeasuredStage {
  double forward_s = 0, backward_s = 0;  // per micro-batch, all of the stage's chunks
  // Per entry of the stage's groups (replicas that mix chip types), its devices alone; empty without groups.
  struct Group {
    double forward_s = 0, backward_s = 0;
  };
  std::vector<Group> groups;
  // Per step: REDUCE_GRAD (at the ends with the tied exchange) from the stage's last device to reach it: the
  // devices before it wait there (a replica of a faster type, one the host slowed less).
  double reduce_s = 0;
  double optimizer_s = 0;  // per step: OPTIM
};
struct MeasuredRun {
  std::vector<MeasuredStage> stages;
  double step_s = 0;  // the run's measured step (summary.json)
  // With tied embeddings, the end of the pipeline that reaches the exchange last (its REDUCE_GRAD holds no
  // waiting for the other; -1 when there is no exchange).
  int tied_last_end = -1;
};

// Reads a measured trace (Chrome trace JSON whose events are named by schedule action, e.g. "1F3", as
// trace_measured.json) for the plan it ran. Error(kConfig) naming `source` when the trace is not JSON or a stage
// has no forward, backward or optimizer step in it (a trace of another plan).
MeasuredRun read_measured_run(const std::string& trace_json, const Plan& plan, double step_s,
                              const std::string& source);

// One action class: the cost model's time with the figures before, the measurement, with the figures after.
struct CalibrationRow {
  std::string what;  // "stage 0 (slow, TP 2) forward"
  double before_s = 0, measured_s = 0, after_s = 0;
};
struct Calibration {
  Cluster cluster;                   // the calibrated figures (figures: calibrated)
  std::vector<CalibrationRow> rows;  // per stage and class, then the step (the simulator's replay)
  std::vector<std::string> fitted;   // each coefficient: what it was, what it is, from what
};

// Fits `planned_on` (the cluster the plan was costed on) to `measured`. Error(kConfig) when the plan's layout
// does not fit the cluster (another cluster's plan).
Calibration calibrate(const Plan& plan, const Cluster& planned_on, const MeasuredRun& measured);

// A run directory of `h2 train --cluster` calibrated: its plan.json, summary.json (the measured step) and
// trace_measured.json, against `cluster_file` (default: the run's cluster.yaml, the figures it was planned on).
// Error(kConfig/kIo) naming the missing or broken file.
Calibration calibrate_run(const std::string& run_dir, const std::string& cluster_file = "");

// The fitted coefficients, then a table of the classes: predicted before, measured, predicted after.
std::string format_calibration(const Calibration& c);

}  // namespace h2
