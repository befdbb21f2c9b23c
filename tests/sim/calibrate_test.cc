// h2 calibrate: reading a measured trace (against values worked out by hand) and recovering figures planted in a
// synthetic run (the reference is the planted figures, not the fit).
#include "sim/calibrate.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "planner/fixtures.h"
#include "planner/layout.h"
#include "sim/simulator.h"

namespace h2 {
namespace {

using ::testing::HasSubstr;
using testing_util::cluster_of;

// One complete event as the runtime writes it (microseconds).
nlohmann::json event(const std::string& name, int rank, double start_ms, double dur_ms) {
  return {{"name", name}, {"ph", "X"}, {"pid", rank}, {"tid", 0}, {"ts", start_ms * 1e3}, {"dur", dur_ms * 1e3}};
}

Plan two_stage_plan() {
  Plan plan;
  plan.num_micro_batches = 2;
  plan.shape.tied_embeddings = true;
  plan.stages.resize(2);
  return plan;
}

TEST(Calibrate, ReadsEachClassAsTrainMeasuresItsStep) {
  // Stage 0 on rank 0, stage 1 on ranks 1 and 2; 2 micro-batches, 4 steps, the first two of them warm-up.
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}});  // metadata: skipped
  const double f0[4][2] = {{100, 100}, {100, 100}, {4, 6}, {8, 10}};
  const double optim0[4] = {50, 50, 30, 34};
  const double reduce0[4] = {10, 30, 12, 14}, reduce1[4] = {20, 11, 25, 13};
  for (int k = 0; k < 4; ++k) {
    const double t = 1000.0 * k;
    for (int j = 0; j < 2; ++j) {
      events.push_back(event(cat("0F", j), 0, t + j, f0[k][j]));
      events.push_back(event(cat("0B", j), 0, t + 10 + j, 20));
      events.push_back(event(cat("1F", j), 1, t + j, 40));
      events.push_back(event(cat("1F", j), 2, t + j, 44));
      events.push_back(event(cat("1SEND_B", j), 1, t + j, 999));  // not a fitted class
      for (int r : {1, 2}) events.push_back(event(cat("1B", j), r, t + 20 + j, 60));
    }
    // Stage 0 reaches the exchange later in steps 2 and 3 (after the warm-up), stage 1 in steps 0 and 1.
    const bool first_later = k >= 2;
    events.push_back(event("0REDUCE_GRAD", 0, t + (first_later ? 500 : 400), reduce0[k]));
    for (int r : {1, 2}) events.push_back(event("1REDUCE_GRAD", r, t + (first_later ? 400 : 500), reduce1[k]));
    events.push_back(event("0OPTIM", 0, t + 600, optim0[k]));
    for (int r : {1, 2}) events.push_back(event("1OPTIM", r, t + 600, 7));
  }
  const MeasuredRun m =
      read_measured_run(nlohmann::json{{"traceEvents", events}}.dump(), two_stage_plan(), 2.5, "trace.json");
  ASSERT_EQ(m.stages.size(), 2u);
  // Steps 2 and 3: per-step means over micro-batches 5 and 9 ms, their mean 7 ms.
  EXPECT_NEAR(m.stages[0].forward_s, 7e-3, 1e-12);
  EXPECT_NEAR(m.stages[0].backward_s, 20e-3, 1e-12);
  EXPECT_NEAR(m.stages[0].optimizer_s, 32e-3, 1e-12);  // (30 + 34) / 2
  EXPECT_NEAR(m.stages[0].reduce_s, 13e-3, 1e-12);     // (12 + 14) / 2
  EXPECT_NEAR(m.stages[1].forward_s, 42e-3, 1e-12);    // the mean of ranks 1 (40) and 2 (44)
  EXPECT_NEAR(m.stages[1].backward_s, 60e-3, 1e-12);
  EXPECT_NEAR(m.stages[1].reduce_s, 19e-3, 1e-12);  // (25 + 13) / 2: includes waiting for stage 0
  EXPECT_EQ(m.tied_last_end, 0);
  EXPECT_DOUBLE_EQ(m.step_s, 2.5);
}

// The devices of a stage that reach its REDUCE_GRAD first wait there for the last: the all-reduce is timed from
// the last arrival. Rank 0 starts at 100 ms, rank 1 at 130; both end at 140: 10 ms each, not (40 + 10) / 2.
TEST(Calibrate, AStagesReduceIsTimedFromItsLastDevice) {
  Plan plan;
  plan.num_micro_batches = 1;
  plan.stages.resize(1);
  plan.stages[0].dp = 2;
  nlohmann::json events = nlohmann::json::array();
  for (int r : {0, 1}) {
    events.push_back(event("0F0", r, 0, 10));
    events.push_back(event("0B0", r, 10, 20));
    events.push_back(event("0OPTIM", r, 150, 5));
  }
  events.push_back(event("0REDUCE_GRAD", 0, 100, 40));
  events.push_back(event("0REDUCE_GRAD", 1, 130, 10));
  const MeasuredRun m = read_measured_run(nlohmann::json{{"traceEvents", events}}.dump(), plan, 1, "trace.json");
  EXPECT_NEAR(m.stages[0].reduce_s, 10e-3, 1e-12);
}

TEST(Calibrate, RejectsATraceOfAnotherPlan) {
  nlohmann::json events = {event("5F0", 0, 0, 1)};
  try {
    read_measured_run(nlohmann::json{{"traceEvents", events}}.dump(), two_stage_plan(), 1, "run/trace.json");
    FAIL() << "a trace naming stage 5 of a 2-stage plan was accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("run/trace.json"));
    EXPECT_THAT(e.what(), HasSubstr("names stage 5; the plan has 2"));
  }
  try {
    read_measured_run(R"({"traceEvents": [)", two_stage_plan(), 1, "run/trace.json");
    FAIL() << "a broken trace was accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("run/trace.json: not a JSON trace"));
  }
  events = {event("0F0", 0, 0, 1), event("0F1", 0, 1, 1), event("0B0", 0, 2, 1), event("0B1", 0, 3, 1),
            event("0OPTIM", 0, 4, 1)};
  try {
    read_measured_run(nlohmann::json{{"traceEvents", events}}.dump(), two_stage_plan(), 1, "run/trace.json");
    FAIL() << "a trace without stage 1 was accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("stage 1 has no forward"));
  }
}

// Three chip types, no fixed per-kernel cost (so that a chip's compute and its memory bandwidth act on separate
// kernels and each planted factor has one answer).
constexpr const char* kCluster = R"(
name: three
chips:
  - {name: X, peak_tflops: 100, efficiency: 0.5, memory_gib: 16, memory_bandwidth_gbps: 1000, kernel_overhead_us: 0}
  - {name: Y, peak_tflops: 40, efficiency: 0.5, memory_gib: 32, memory_bandwidth_gbps: 500, kernel_overhead_us: 0}
  - {name: Z, peak_tflops: 60, efficiency: 0.5, memory_gib: 32, memory_bandwidth_gbps: 800, kernel_overhead_us: 0}
groups:
  - {chip: X, nodes: 1, chips_per_node: 2, intra_node_gbps: 100, nic_gbps: 10}
  - {chip: Y, nodes: 1, chips_per_node: 2, intra_node_gbps: 50, nic_gbps: 10}
  - {chip: Z, nodes: 2, chips_per_node: 1, intra_node_gbps: 80, nic_gbps: 20}
links:
  - {between: [X, Y], bandwidth_gbps: 5, latency_us: 10}
  - {between: [X, Z], bandwidth_gbps: 10, latency_us: 10}
  - {between: [Y, Z], bandwidth_gbps: 5, latency_us: 10}
)";

// The trace a run of `truth` (a plan costed with the true figures) writes: every rank of every stage, 3 steps,
// the forward and backward of each micro-batch (a replica of a stage that mixes chip types: its group's), then
// REDUCE_GRAD (DP all-reduce and tied exchange; the first stage reaches the exchange 5 ms early and waits, and in a
// stage that mixes types every group but the first arrives 7 ms early and waits for it) and OPTIM (the last stage 3
// ms early, waiting for the norm).
std::string synthetic_trace(const Plan& truth) {
  nlohmann::json events = nlohmann::json::array();
  int rank = 0;
  for (size_t i = 0; i < truth.stages.size(); ++i) {
    const StagePlan& s = truth.stages[i];
    for (int d = 0; d < s.devices(); ++d, ++rank) {
      const int replica = d / s.tp;
      const ReplicaGroup g = s.group_of(replica);
      const bool early = !s.groups.empty() && replica >= s.groups.front().replicas;
      for (int k = 0; k < 3; ++k) {
        double t = 1e5 * k;
        for (int j = 0; j < truth.num_micro_batches; ++j) {
          events.push_back(event(cat(i, "F", j), rank, t, g.forward_s * 1e3));
          t += g.forward_s * 1e3;
          events.push_back(event(cat(i, "B", j), rank, t, g.backward_s * 1e3));
          t += g.backward_s * 1e3;
        }
        const double wait = (i == 0 ? 5 : 0) + (early ? 7 : 0);
        const double reduce = (s.dp_allreduce_s + s.tied_allreduce_s) * 1e3;
        events.push_back(event(cat(i, "REDUCE_GRAD"), rank, 1e5 * k + 5e4 - wait, reduce + wait));
        // The last stage reaches the optimizer 3 ms early and waits there for the global gradient norm.
        const double early = i + 1 == truth.stages.size() ? 3 : 0;
        events.push_back(event(cat(i, "OPTIM"), rank, 1e5 * k + 6e4 - early, s.optimizer_s * 1e3 + early));
      }
    }
  }
  return nlohmann::json{{"traceEvents", events}}.dump();
}

// `stages` holding `layers` of a 4-layer model without recomputation, costed on `cluster` for a batch of 8 in
// micro-batches of 2.
Plan costed(const Cluster& cluster, const std::vector<Layout::Slot>& stages, const std::vector<int>& layers) {
  LayoutSpec spec;
  spec.layout.micro_batch = 2;
  spec.layout.stages = stages;
  spec.layers = layers;
  spec.recompute.assign(stages.size(), {Recompute::kNone});
  const TrainSetup setup{.global_batch = 8, .zero1 = false, .micro_batches = {2}};
  return cost_layout(CostModel(cluster, testing_util::small_model(4), setup), spec);
}

TEST(Calibrate, RecoversFiguresPlantedInASyntheticRun) {
  const Cluster start = cluster_of(kCluster);
  // Y (first stage, DP 2 with the embedding), Z (middle, DP 2 across its two nodes), X (last, TP 2 with the head).
  const std::vector<Layout::Slot> stages = {
      {.chip = 1, .tp = 1, .dp = 2}, {.chip = 2, .tp = 1, .dp = 2}, {.chip = 0, .tp = 2, .dp = 1}};
  const Plan plan = costed(start, stages, {1, 2, 1});
  ASSERT_EQ(plan.stages.size(), 3u);
  ASSERT_GT(plan.stages[1].dp_allreduce_s, 0);
  ASSERT_GT(plan.stages[0].tied_allreduce_s, 0);

  // The truth: Y computes at 0.6 of its figure, X's memory streams at half, Z's network at a quarter, the X-Y link
  // (the tied exchange's) at a tenth.
  Cluster truth = start;
  truth.chips[1].peak_tflops *= 0.6;
  truth.chips[0].memory_bandwidth_gbps *= 0.5;
  truth.groups[2].intra_node_gbps *= 0.25;
  truth.groups[2].nic_gbps *= 0.25;
  truth.links[0].bandwidth_gbps *= 0.1;
  const Plan truth_plan = costed(truth, stages, {1, 2, 1});
  const double truth_step = simulate(truth_plan).step_s;

  const MeasuredRun measured = read_measured_run(synthetic_trace(truth_plan), plan, truth_step, "synthetic");
  EXPECT_EQ(measured.tied_last_end, 2);
  const Calibration c = calibrate(plan, start, measured);
  EXPECT_EQ(c.cluster.figures, Figures::kCalibrated);
  const double tol = 1e-3;
  EXPECT_NEAR(c.cluster.chips[1].peak_tflops / truth.chips[1].peak_tflops, 1, tol);
  // Y's emulated chips stay the ones the run had: its f32 GEMM rate as the file that was calibrated gave it.
  EXPECT_DOUBLE_EQ(c.cluster.chips[1].emulation_flops(), start.chips[1].matmul_flops(false));
  EXPECT_NEAR(c.cluster.chips[0].memory_bandwidth_gbps / truth.chips[0].memory_bandwidth_gbps, 1, tol);
  EXPECT_NEAR(c.cluster.groups[2].nic_gbps / truth.groups[2].nic_gbps, 1, tol);
  EXPECT_NEAR(c.cluster.links[0].bandwidth_gbps / truth.links[0].bandwidth_gbps, 1, tol);
  // What was right stays right.
  EXPECT_NEAR(c.cluster.chips[0].peak_tflops / start.chips[0].peak_tflops, 1, tol);
  EXPECT_NEAR(c.cluster.chips[2].memory_bandwidth_gbps / start.chips[2].memory_bandwidth_gbps, 1, tol);
  EXPECT_NEAR(c.cluster.links[1].bandwidth_gbps / start.links[1].bandwidth_gbps, 1, tol);
  // Every class and the step predicted as measured afterwards; the step was off before.
  for (const CalibrationRow& r : c.rows) {
    if (r.what.find("wait") != std::string::npos) continue;  // includes the 5 ms wait, which the replay places
    EXPECT_NEAR(r.after_s / r.measured_s, 1, tol) << r.what;
  }
  EXPECT_EQ(c.rows.back().what, "step (simulated)");
  EXPECT_LT(c.rows.back().before_s / truth_step, 0.8);
  EXPECT_THAT(format_calibration(c), HasSubstr("Y compute (forward + backward): x0.6"));
}

// A stage that holds the embedding alone (no blocks) says nothing about its chip's blocks: its forward and
// backward, measured twice as fast as predicted, leave that chip's compute alone (fitted from them, the figure
// went to the clamp, x1000, and the next plan put every block on that chip).
TEST(Calibrate, AStageWithoutBlocksDoesNotFitItsChipsCompute) {
  const Cluster start = cluster_of(kCluster);
  const Plan plan = costed(start, {{.chip = 1, .tp = 1, .dp = 2}, {.chip = 2, .tp = 1, .dp = 2}}, {0, 4});
  Plan faster = plan;
  faster.stages[0].forward_s *= 0.5;
  faster.stages[0].backward_s *= 0.5;
  faster.stages[0].weight_s *= 0.5;
  const MeasuredRun measured = read_measured_run(synthetic_trace(faster), plan, simulate(faster).step_s, "synthetic");
  const Calibration c = calibrate(plan, start, measured);
  EXPECT_EQ(c.cluster.chips[1].peak_tflops, start.chips[1].peak_tflops);
  EXPECT_THAT(format_calibration(c), Not(HasSubstr("Y compute")));
  EXPECT_NEAR(c.cluster.chips[2].peak_tflops / start.chips[2].peak_tflops, 1, 1e-3);  // Z's blocks ran as predicted
}

// The head alone is the vocabulary's GEMM — compute, unlike the embedding's gather: a head-only stage whose chip
// truly computes at twice its figure fits that chip's compute x2, and leaves the other chip's alone (until
// 2026-12-04 only stages with blocks fitted it, and the built-in example's fast chips, which hold the head alone,
// kept their profiled figure whatever the run measured).
TEST(Calibrate, TheHeadAloneFitsItsChipsCompute) {
  const Cluster start = cluster_of(kCluster);
  const std::vector<Layout::Slot> stages = {{.chip = 1, .tp = 1, .dp = 2}, {.chip = 2, .tp = 1, .dp = 2}};
  const Plan plan = costed(start, stages, {4, 0});
  ASSERT_TRUE(plan.stages[1].head);
  ASSERT_EQ(plan.stages[1].layers, 0);
  Cluster truth = start;
  truth.chips[2].peak_tflops *= 2;
  const Plan truth_plan = costed(truth, stages, {4, 0});
  const MeasuredRun measured =
      read_measured_run(synthetic_trace(truth_plan), plan, simulate(truth_plan).step_s, "synthetic");
  const Calibration c = calibrate(plan, start, measured);
  EXPECT_NEAR(c.cluster.chips[2].peak_tflops / start.chips[2].peak_tflops, 2, 1e-3);
  EXPECT_NEAR(c.cluster.chips[1].peak_tflops / start.chips[1].peak_tflops, 1, 1e-3);
}

// A chip whose profile timed its parts whole (part_corrections): a run slower than predicted raises its fixed
// per-kernel cost and leaves its rates (a run whose kernels paid three times Y's 20 us fits 60 us, peak unchanged);
// a run faster than predicted scales its rates as any chip's (Y at twice its peak fits x2).
TEST(Calibrate, AProfiledChipsSlowerRunIsItsPerKernelCost) {
  std::string text = kCluster;
  text.replace(text.find("memory_bandwidth_gbps: 500, kernel_overhead_us: 0"),
               std::string("memory_bandwidth_gbps: 500, kernel_overhead_us: 0").size(),
               "memory_bandwidth_gbps: 500, elementwise_gbps: 400, kernel_overhead_us: 20, "
               "part_corrections: [[1, 2048, 1, 1]]");
  const Cluster start = cluster_of(text);
  const std::vector<Layout::Slot> stages = {{.chip = 1, .tp = 1, .dp = 2}, {.chip = 2, .tp = 1, .dp = 2}};
  const Plan plan = costed(start, stages, {2, 2});
  // The truth's forward and backward on Y; everything else as planned.
  const auto run_of = [&](const Cluster& truth) {
    Plan run = plan;
    const Plan truth_plan = costed(truth, stages, {2, 2});
    run.stages[0].forward_s = truth_plan.stages[0].forward_s;
    run.stages[0].backward_s = truth_plan.stages[0].backward_s;
    run.stages[0].weight_s = truth_plan.stages[0].weight_s;
    return read_measured_run(synthetic_trace(run), plan, simulate(run).step_s, "synthetic");
  };
  Cluster slower = start;
  slower.chips[1].run_kernel_us = 40;
  const Calibration c = calibrate(plan, start, run_of(slower));
  EXPECT_NEAR(c.cluster.chips[1].run_kernel_us, 40, 0.06);
  EXPECT_THAT(format_calibration(c), HasSubstr("40 us a run adds to each forward and backward kernel (run_kernel_us)"));
  EXPECT_EQ(c.cluster.chips[1].kernel_overhead_us, 20);
  EXPECT_EQ(c.cluster.chips[1].peak_tflops, start.chips[1].peak_tflops);
  EXPECT_EQ(c.cluster.chips[1].elementwise_gbps, start.chips[1].elementwise_gbps);
  // The optimizer's kernels, which the run measured as planned, keep their prediction (until 2026-12-06 the fit
  // raised the fixed cost of every kernel, the optimizer's too).
  for (const CalibrationRow& r : c.rows) {
    if (r.what.find("optimizer") != std::string::npos) {
      EXPECT_NEAR(r.after_s, r.measured_s, 1e-9) << r.what;
    }
  }
  Cluster faster = start;
  faster.chips[1].peak_tflops *= 2;
  faster.chips[1].kernel_overhead_us /= 2;
  faster.chips[1].elementwise_gbps *= 2;
  const Calibration f = calibrate(plan, start, run_of(faster));
  EXPECT_NEAR(f.cluster.chips[1].peak_tflops / start.chips[1].peak_tflops, 2, 2e-3);
  EXPECT_NEAR(f.cluster.chips[1].kernel_overhead_us, 10, 0.01);
}

// A stage whose replicas mix chip types: each type's compute is fitted from its own replicas (X's planted at half
// its figure, Y's right), not from the stage's mean over all of them, and the all-reduce from the last to arrive
// (Y's replicas wait 7 ms for X's in the trace). Before 2026-12-04 a 16-device run's mixed stage fitted one chip's
// compute from every type's replicas and its links at x0.03 from the fast replicas' waiting.
TEST(Calibrate, AStageOfMixedTypesFitsEachTypeFromItsOwnReplicas) {
  const Cluster start = cluster_of(kCluster);
  const std::vector<Layout::Slot> stages = {
      {.chip = 0,
       .tp = 1,
       .dp = 2,
       .mix = {{.chip = 0, .replicas = 1, .rows = 1}, {.chip = 1, .replicas = 1, .rows = 1}}},
      {.chip = 2, .tp = 1, .dp = 2}};
  const Plan plan = costed(start, stages, {2, 2});
  ASSERT_EQ(plan.stages[0].groups.size(), 2u);
  Cluster truth = start;
  truth.chips[0].peak_tflops *= 0.5;
  const Plan truth_plan = costed(truth, stages, {2, 2});
  const MeasuredRun measured =
      read_measured_run(synthetic_trace(truth_plan), plan, simulate(truth_plan).step_s, "synthetic");
  ASSERT_EQ(measured.stages[0].groups.size(), 2u);
  EXPECT_NEAR(measured.stages[0].groups[0].forward_s, truth_plan.stages[0].groups[0].forward_s, 1e-9);
  EXPECT_NEAR(measured.stages[0].groups[1].backward_s, truth_plan.stages[0].groups[1].backward_s, 1e-9);
  // From X's arrival, which includes the first end's 5 ms wait for the tied exchange.
  EXPECT_NEAR(measured.stages[0].reduce_s,
              truth_plan.stages[0].dp_allreduce_s + truth_plan.stages[0].tied_allreduce_s + 5e-3, 1e-9);
  const Calibration c = calibrate(plan, start, measured);
  EXPECT_NEAR(c.cluster.chips[0].peak_tflops / start.chips[0].peak_tflops, 0.5, 1e-3);
  EXPECT_NEAR(c.cluster.chips[1].peak_tflops / start.chips[1].peak_tflops, 1, 1e-3);
  EXPECT_NEAR(c.cluster.chips[2].peak_tflops / start.chips[2].peak_tflops, 1, 1e-3);
  const std::string table = format_calibration(c);
  EXPECT_THAT(table, HasSubstr("stage 0 (Y, TP 1 x DP 2) X x1 forward"));  // the stage's chip: its bounding group's
  EXPECT_THAT(table, HasSubstr("stage 0 (Y, TP 1 x DP 2) Y x1 backward"));
  EXPECT_THAT(table, Not(HasSubstr("tied embedding exchange")));  // its ends' replicas are of several types
}

// A figure no scale brings to its measurement is left alone and said so: Y's optimizer step has a floor of fixed
// per-kernel costs that its memory bandwidth does not move, and the run measured it at a hundredth of its
// prediction (before 2026-12-04 the bandwidth went to the clamp, x1000, and stayed there).
TEST(Calibrate, AFigureNoScaleBringsToItsMeasurementIsLeftAlone) {
  std::string text = kCluster;
  text.replace(text.find("memory_bandwidth_gbps: 500, kernel_overhead_us: 0"),
               std::string("memory_bandwidth_gbps: 500, kernel_overhead_us: 0").size(),
               "memory_bandwidth_gbps: 500, kernel_overhead_us: 20");
  const Cluster start = cluster_of(text);
  const Plan plan = costed(start, {{.chip = 1, .tp = 1, .dp = 2}, {.chip = 2, .tp = 1, .dp = 2}}, {2, 2});
  Plan faster = plan;
  faster.stages[0].optimizer_s *= 0.01;
  const MeasuredRun measured = read_measured_run(synthetic_trace(faster), plan, simulate(faster).step_s, "synthetic");
  const Calibration c = calibrate(plan, start, measured);
  EXPECT_EQ(c.cluster.chips[1].memory_bandwidth_gbps, start.chips[1].memory_bandwidth_gbps);
  EXPECT_THAT(format_calibration(c), HasSubstr("Y memory bandwidth (optimizer): not fitted"));
}

}  // namespace
}  // namespace h2
