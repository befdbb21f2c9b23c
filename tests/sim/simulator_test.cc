// The simulator against closed forms on uniform pipelines, and against the planner's plans.
#include "sim/simulator.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>

#include "planner/fixtures.h"
#include "planner/planner.h"
#include "planner/report.h"
#include "test_util.h"

namespace h2 {
namespace {

using ::testing::HasSubstr;
using testing_util::cluster_of;
using testing_util::Hetero1024;
using testing_util::kSmallCluster;
using testing_util::small_model;

// p identical stages, forward f and backward b per micro-batch, no links, no DP.
Plan uniform_plan(int p, int m, double f, double b) {
  Plan plan;
  plan.num_micro_batches = m;
  plan.micro_batch = 1;
  plan.global_batch = m;
  plan.shape.layers = 2 * p;
  for (int i = 0; i < p; ++i) {
    StagePlan s;
    s.chip = "X";
    s.first_layer = 2 * i;
    s.layers = 2;
    s.forward_s = f;
    s.backward_s = b;
    s.state_bytes = 100;
    s.activation_bytes = 10;
    s.in_flight = std::min(p - i, m);
    s.memory_bytes = s.state_bytes + s.in_flight * s.activation_bytes;
    s.capacity_bytes = 1000;
    plan.stages.push_back(s);
  }
  return plan;
}

TEST(Simulator, OneFOneBMatchesTheClosedForm) {
  // With equal stages the 1F1B makespan is (m + p - 1) (f + b) and the bubble (p - 1) / (m + p - 1).
  for (auto [p, m] : {std::pair{4, 8}, {3, 1}, {1, 5}, {5, 16}}) {
    const SimResult r = simulate(uniform_plan(p, m, 1.0, 2.0), SimOptions{});
    EXPECT_DOUBLE_EQ(r.pipeline_s, (m + p - 1) * 3.0) << p << " stages, " << m << " micro-batches";
    EXPECT_NEAR(r.bubble_fraction, static_cast<double>(p - 1) / (m + p - 1), 1e-12);
  }
}

// One stage is never idle, but its makespan, summed action by action, may round below m (f + b): the bubble is
// then 0, not "-0.0%" (these figures gave -4.4e-16), in the planner's figure as in the simulator's.
TEST(Simulator, OneStageHasNoBubbleNotANegativeOne) {
  Plan plan = uniform_plan(1, 23, 0.08550175858434987, 0.19384402054176791);
  const SimResult r = simulate(plan, SimOptions{});
  EXPECT_GE(r.bubble_fraction, 0.0);
  EXPECT_EQ(format_simulation(plan, r, "1f1b").find("bubble -"), std::string::npos);
  score_by_replay(CostModel(cluster_of(kSmallCluster), small_model(2), TrainSetup{.global_batch = 23}), plan);
  EXPECT_GE(plan.bubble_fraction, 0.0);
  EXPECT_EQ(format_plan(plan).find("bubble -"), std::string::npos) << format_plan(plan);
}

TEST(Simulator, GPipeHoldsEveryMicroBatch1F1BOnlyTheDepth) {
  const Plan plan = uniform_plan(4, 8, 1.0, 2.0);
  const SimResult gpipe = simulate(plan, SimOptions{.schedule = ScheduleKind::kGPipe});
  const SimResult one = simulate(plan, SimOptions{});
  EXPECT_DOUBLE_EQ(gpipe.peak_memory_bytes[0], 100 + 8 * 10);
  EXPECT_DOUBLE_EQ(one.peak_memory_bytes[0], 100 + 4 * 10);
  EXPECT_DOUBLE_EQ(one.peak_memory_bytes[3], 100 + 1 * 10);
  EXPECT_TRUE(one.fits());
}

TEST(Simulator, InterleavingShrinksTheBubble) {
  const Plan plan = uniform_plan(4, 8, 1.0, 2.0);
  const SimResult one = simulate(plan, SimOptions{});
  const SimResult inter = simulate(plan, SimOptions{.schedule = ScheduleKind::kInterleaved, .chunks = 2});
  EXPECT_LT(inter.bubble_fraction, one.bubble_fraction);
  EXPECT_LT(inter.pipeline_s, one.pipeline_s);
}

// ZB-H1 as a what-if (F 1, B 1, W 1 of a backward of 2; activations 10 and, between B and W, 5 bytes more per
// micro-batch): each stage defers as many W's as its memory holds beside 1F1B's, at most its index. With room
// everywhere it is the paper's schedule, 27 s against 1F1B's 33 for 4 stages and 8 micro-batches
// (Replay.ZeroBubbleH1IdlesAThirdOf1F1B), every stage holding 4 micro-batches and stage r up to r + 1 between B and
// W: 100 + 4 x 10 + (r + 1) x 5. Capacity 120 on the last stage (1F1B: 100 + 1 x 10) holds no deferral (1 x 10 +
// 2 x 5 = 20 > 10) but a split with none (5); 112 not even that; a recomputing stage does not split (its B
// recomputes block by block into one buffer, which a later W could not read).
TEST(Simulator, ZeroBubbleH1DefersWhatMemoryHolds) {
  Plan plan = uniform_plan(4, 8, 1.0, 2.0);
  for (StagePlan& s : plan.stages) s.weight_s = 1.0, s.weight_pending_bytes = 5;
  const SimOptions zb{.schedule = ScheduleKind::kZeroBubbleH1};
  const SimResult roomy = simulate(plan, zb);
  EXPECT_DOUBLE_EQ(roomy.pipeline_s, 27.0);
  EXPECT_DOUBLE_EQ(simulate(plan, SimOptions{}).pipeline_s, 33.0);
  for (size_t r = 0; r < 4; ++r) EXPECT_DOUBLE_EQ(roomy.peak_memory_bytes[r], 100 + 4 * 10 + (r + 1) * 5.0) << r;
  EXPECT_TRUE(roomy.fits());
  EXPECT_THAT(format_simulation(plan, roomy, "zb-h1"),
              HasSubstr("zb-h1: each backward split into B (the input gradients, sent at once) and W"));
  plan.stages[3].capacity_bytes = 120;
  plan.stages[2].recompute = Recompute::kSelective;
  EXPECT_EQ(zb_deferrals(plan), (std::vector<int>{0, 1, -1, 0}));
  const SimResult tight = simulate(plan, zb);
  EXPECT_DOUBLE_EQ(tight.peak_memory_bytes[3], 100 + 1 * 10 + 5);
  EXPECT_DOUBLE_EQ(tight.peak_memory_bytes[2], 100 + 2 * 10);  // 1F1B's 4 - 2, nothing pending
  EXPECT_DOUBLE_EQ(tight.peak_memory_bytes[1], 100 + 4 * 10 + 2 * 5);
  EXPECT_TRUE(tight.fits());
  EXPECT_THAT(format_simulation(plan, tight, "zb-h1"), HasSubstr("or has no room): 0 1 -1 0\n"));
  EXPECT_GT(tight.pipeline_s, roomy.pipeline_s);
  EXPECT_LT(tight.pipeline_s, 33.0);
  plan.stages[3].capacity_bytes = 112;
  EXPECT_EQ(zb_deferrals(plan).back(), -1);
  // An interleaved plan (2 chunks, 5 bytes a chunk's micro-batch, its own footprint filling its memory) replayed
  // as zb-h1: a stage's micro-batch holds both chunks' 10 bytes, and the room is beside its 1F1B footprint — not
  // beside the interleaved one, which left none.
  Plan inter = uniform_plan(4, 8, 1.0, 2.0);
  inter.schedule = ScheduleKind::kInterleaved;
  inter.chunks = 2;
  for (StagePlan& s : inter.stages) s.weight_s = 1.0, s.weight_pending_bytes = 5, s.activation_bytes = 5;
  for (StagePlan& s : inter.stages) s.memory_bytes = s.capacity_bytes;
  inter.stages[3].capacity_bytes = 120;
  const SimResult from_inter = simulate(inter, zb);
  EXPECT_THAT(format_simulation(inter, from_inter, "zb-h1"), HasSubstr("or has no room): 0 1 2 0\n"));
  EXPECT_DOUBLE_EQ(from_inter.peak_memory_bytes[3], 100 + 1 * 10 + 5);
  EXPECT_DOUBLE_EQ(from_inter.peak_memory_bytes[2], 100 + 4 * 10 + 3 * 5);
}

// What the planner returns when ZB-H1 replays faster (as_zero_bubble): the plan's in-flight micro-batches and memory
// per stage are what the replay holds — by hand as above, 4 micro-batches and (r + 1) x 5 bytes pending; stage 2,
// recomputing, unsplit with 1F1B's 2; stage 3 split with nothing deferred — and the step is the simulator's once the
// plan is scored by its replay. A plan where no stage splits, or of another schedule, has no zero-bubble form.
TEST(Simulator, AZeroBubblePlanHoldsWhatItsReplayHolds) {
  Plan plan = uniform_plan(4, 8, 1.0, 2.0);
  for (StagePlan& s : plan.stages) s.weight_s = 1.0, s.weight_pending_bytes = 5;
  plan.stages[2].recompute = Recompute::kSelective;
  plan.stages[3].capacity_bytes = 120;
  const std::optional<Plan> z = as_zero_bubble(plan);
  ASSERT_TRUE(z.has_value());
  EXPECT_EQ(z->schedule, ScheduleKind::kZeroBubbleH1);
  const SimResult r = simulate(*z, SimOptions{});
  const std::vector<double> want = {100 + 4 * 10 + 1 * 5, 100 + 4 * 10 + 2 * 5, 100 + 2 * 10, 100 + 1 * 10 + 5};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_DOUBLE_EQ(z->stages[i].memory_bytes, want[i]) << "stage " << i;
    EXPECT_DOUBLE_EQ(r.peak_memory_bytes[i], want[i]) << "stage " << i;
  }
  EXPECT_EQ(z->stages[0].in_flight, 4);
  EXPECT_EQ(z->stages[2].in_flight, 2);
  EXPECT_TRUE(z->fits);
  for (StagePlan& s : plan.stages) s.recompute = Recompute::kFull;
  EXPECT_FALSE(as_zero_bubble(plan).has_value());
  Plan inter = uniform_plan(4, 8, 1.0, 2.0);
  inter.schedule = ScheduleKind::kInterleaved;
  inter.chunks = 2;
  EXPECT_FALSE(as_zero_bubble(inter).has_value());
}

TEST(Simulator, LinksAndReductionsAddTheirTime) {
  Plan plan = uniform_plan(2, 1, 1.0, 2.0);
  plan.stages[0].send_s = 0.5;
  plan.stages[0].dp_allreduce_s = 0.25;
  plan.stages[0].optimizer_s = 0.125;
  const SimResult r = simulate(plan, SimOptions{});
  // F0 (1) -> link (0.5) -> F1 (1) -> B1 (2) -> link back (0.5) -> B0 (2), then stage 0 reduces and steps.
  EXPECT_DOUBLE_EQ(r.pipeline_s, 7.0);
  EXPECT_DOUBLE_EQ(r.step_s, 7.375);
}

TEST(Simulator, TraceIsChromeJson) {
  const SimResult r = simulate(uniform_plan(2, 3, 1.0, 2.0), SimOptions{});
  const nlohmann::json t = nlohmann::json::parse(r.trace_json);
  int compute = 0;
  for (const auto& e : t.at("traceEvents")) compute += e.value("cat", "") == "compute";
  EXPECT_EQ(compute, 2 * 2 * 3);
}

TEST_F(Hetero1024, SimulatorAgreesWithThePlannerAndMemoryHolds) {
  const CostModel costs(cluster_, model_, train_);
  const Plan plan = plan_training(costs, PlannerOptions{.finest_tier = "greedy"});
  const SimResult r = simulate(plan, SimOptions{});
  EXPECT_NEAR(plan.step_s / r.step_s, 1.0, 0.02);
  EXPECT_TRUE(r.fits());
}

TEST(Plan, EveryFittingPlanFitsInTheSimulator) {
  for (int layers : {4, 6, 12}) {
    const CostModel costs(cluster_of(kSmallCluster), small_model(layers), TrainSetup{.global_batch = 16});
    const Plan plan = plan_training(costs, PlannerOptions{});
    ASSERT_TRUE(plan.fits);
    const SimResult r = simulate(plan, SimOptions{});
    EXPECT_TRUE(r.fits()) << layers << " layers";
    for (size_t i = 0; i < plan.stages.size(); ++i)
      EXPECT_LE(r.peak_memory_bytes[i], plan.stages[i].memory_bytes * (1 + 1e-9));
  }
}

// A lower bound on a 1F1B plan's replayed step: every micro-batch passes each stage's forward and backward in turn,
// so the step is at least m times the slowest stage's. The brute forces replay only layouts below the best so far.
double replay_bound(const Plan& p) {
  double slowest = 0;
  for (const StagePlan& s : p.stages) slowest = std::max(slowest, s.forward_s + s.backward_s);
  return p.num_micro_batches * slowest;
}

// The reference: every layout (all DP widths, micro-batches, TP and stage counts per type, orders) and every
// split of the layers into stages — in whole blocks, and (`halves`) in half-blocks, a stage boundary between a
// block's attention and its MLP — each costed by the cost model and timed by the simulator's replay, not by the
// planner's own closed form, which the search uses to rank; with 1F1B, interleaved, and ZB-H1 on every 1F1B split.
double exhaustive_best(const CostModel& costs, int most_chunks = 1, bool vocabulary_apart = false, bool halves = true) {
  double best = INFINITY;
  const Cluster& c = costs.cluster();
  const int L = static_cast<int>(costs.model().layers);
  int devices = 0;
  for (size_t k = 0; k < c.chips.size(); ++k) devices += c.devices_of(static_cast<int>(k));
  for (int dp = 1; dp <= devices; ++dp) {
    if (costs.train().global_batch % dp != 0) continue;
    for (int b : costs.train().micro_batches) {
      if ((costs.train().global_batch / dp) % b != 0) continue;
      // (tp, stages, its stages' DP) per type: any DP that divides a micro-batch's dp x b rows; then every order
      // and every composition of L.
      struct Option {
        int tp, stages, dp;
      };
      std::vector<std::vector<Option>> per_type;
      for (size_t k = 0; k < c.chips.size(); ++k) {
        std::vector<Option> o = {{1, 0, dp}};
        const int n = c.devices_of(static_cast<int>(k));
        for (int d = 1; d <= dp * b && n > 0; ++d) {
          if ((dp * b) % d != 0) continue;
          for (int t : tp_options(costs, static_cast<int>(k))) {
            for (int s = 1; s * t * d <= n && s <= L; ++s) o.push_back({t, s, d});
          }
        }
        per_type.push_back(o);
      }
      std::vector<size_t> pick(per_type.size(), 0);
      while (true) {
        std::vector<int> used;
        int stages = 0;
        for (size_t k = 0; k < per_type.size(); ++k) {
          if (per_type[k][pick[k]].stages > 0) used.push_back(static_cast<int>(k));
          stages += per_type[k][pick[k]].stages;
        }
        if (stages >= 1 && stages <= L) {
          std::sort(used.begin(), used.end());
          do {
            Layout l{dp, b, {}};
            for (int k : used) {
              const Option& o = per_type[static_cast<size_t>(k)][pick[static_cast<size_t>(k)]];
              for (int s = 0; s < o.stages; ++s) l.stages.push_back({k, o.tp, o.dp});
            }
            // Every composition of L into `stages` positive parts; with vocabulary_apart also those whose first or
            // last part is empty, that stage holding only the embedding or the head; with `halves` also every
            // composition of the 2L half-blocks (a stage boundary inside a block), 1F1B.
            std::vector<int> split(static_cast<size_t>(stages)), fewest(static_cast<size_t>(stages), 1),
                most(static_cast<size_t>(stages), L);
            const int64_t m = costs.train().global_batch / (int64_t{dp} * b);
            bool in_halves = false;
            std::function<void(int, int)> compose = [&](int i, int left) {
              if (i == stages) {
                if (left != 0) return;
                // 1F1B, and interleaved with 2..most_chunks chunks where the schedule can run.
                for (int v = 1; v <= (in_halves ? 1 : most_chunks); ++v) {
                  if (v > 1 && (m % stages != 0 || *std::min_element(split.begin(), split.end()) < v)) continue;
                  l.schedule = v > 1 ? ScheduleKind::kInterleaved : ScheduleKind::k1F1B;
                  l.chunks = v;
                  const std::optional<Plan> p =
                      score_split(costs, l, split, nullptr, ScoreOptions{.halves = in_halves});
                  if (!p) continue;
                  if (v == 1 && replay_bound(*p) >= best) continue;  // cannot beat the best: not replayed
                  best = std::min(best, simulate(*p).step_s);
                  // ZB-H1 on the same split where the setup allows it (the bound holds for it too: a stage's W's
                  // are part of its backward).
                  if (!costs.train().zero_bubble) continue;
                  if (const std::optional<Plan> z = as_zero_bubble(*p)) best = std::min(best, simulate(*z).step_s);
                }
                return;
              }
              int later = 0;  // the fewest layers the stages after i take
              for (int j = i + 1; j < stages; ++j) later += fewest[static_cast<size_t>(j)];
              for (int n = fewest[static_cast<size_t>(i)]; n <= std::min(left - later, most[static_cast<size_t>(i)]);
                   ++n) {
                split[static_cast<size_t>(i)] = n;
                compose(i + 1, left - n);
              }
            };
            for (const bool h : {false, true}) {
              if (h && !halves) break;
              in_halves = h;
              const int units = h ? 2 * L : L;
              std::fill(most.begin(), most.end(), units);
              compose(0, units);
              for (int end : {0, stages - 1}) {
                if (!vocabulary_apart || stages < 2) break;
                fewest[static_cast<size_t>(end)] = most[static_cast<size_t>(end)] = 0;
                compose(0, units);
                fewest[static_cast<size_t>(end)] = 1;
                most[static_cast<size_t>(end)] = units;
              }
            }
          } while (std::next_permutation(used.begin(), used.end()));
        }
        size_t k = 0;
        while (k < pick.size() && ++pick[k] == per_type[k].size()) pick[k++] = 0;
        if (k == pick.size()) break;
      }
    }
  }
  return best;
}

// On kSmallCluster's types (6 layers) and two of them (8 layers): within 1% of the brute force over every layout and
// split, in whole blocks and in half-blocks; with 8 layers a stage boundary inside a block is what the optimum needs.
TEST(Search, WithinOnePercentOfExhaustiveOnSmallClusters) {
  for (int layers : {6, 8}) {
    Cluster c = cluster_of(kSmallCluster);
    if (layers == 8) c = c.only(0), c.groups.push_back(cluster_of(kSmallCluster).groups[1]);  // two types
    const CostModel costs(c, small_model(layers), TrainSetup{.global_batch = 16, .micro_batches = {1, 2}});
    SearchStats stats;
    const Plan plan = plan_training(costs, PlannerOptions{}, &stats);
    const double reference = exhaustive_best(costs, 4);
    ASSERT_TRUE(std::isfinite(reference));
    EXPECT_EQ(stats.tier, "exhaustive");
    const double simulated = simulate(plan).step_s;
    EXPECT_NEAR(plan.step_s / simulated, 1.0, 1e-9);  // the plan's step is the simulator's
    EXPECT_LE(simulated, reference * 1.01) << layers << " layers: search " << simulated << " s, optimum " << reference;
    EXPECT_GE(simulated, reference * (1 - 1e-9));  // and no plan beats the optimum
    // 8 layers: 0.436 s, against 0.481 s in whole blocks.
    if (layers == 8) {
      EXPECT_LT(reference, exhaustive_best(costs, 4, false, false) * 0.95);
    }
  }
}

// Four slow devices and one four times as fast, four layers: at one DP width for all stages, either the fast chip
// sits idle (DP 4) or a slow one does (DP 1: at most 4 stages; TP is not allowed). Stages of different widths use all
// five — the slow chips as one stage of 4 replicas, the fast one alone — and the search must find that optimum (in
// the space of stages of one chip type each, which the brute force enumerates).
// Four slow chips (chip 0) and `fast` chips four times as fast (chip 1), 8 GiB each.
Cluster slow_and_fast(int fast) {
  return cluster_of(cat(R"(
chips:
  - {name: slow, peak_tflops: 10, memory_gib: 8, memory_bandwidth_gbps: 200}
  - {name: fast, peak_tflops: 40, memory_gib: 8, memory_bandwidth_gbps: 800}
groups:
  - {chip: slow, nodes: 1, chips_per_node: 4, intra_node_gbps: 50, nic_gbps: 10}
  - {chip: fast, nodes: 1, chips_per_node: )",
                        fast, R"(, intra_node_gbps: 50, nic_gbps: 10}
links:
  - {between: [slow, fast], bandwidth_gbps: 10, latency_us: 10}
)"));
}

TEST(Search, FindsStagesOfDifferentWidths) {
  const Cluster c = slow_and_fast(1);
  const CostModel costs(c, small_model(4), TrainSetup{.global_batch = 16, .micro_batches = {1, 2, 4}, .max_tp = 1});
  SearchStats stats;
  const Plan plan = plan_training(costs, PlannerOptions{.mixed_stages = false}, &stats);
  const double reference = exhaustive_best(costs);
  EXPECT_EQ(stats.tier, "exhaustive");
  EXPECT_EQ(plan.devices_used, 5);
  std::set<int> widths;
  for (const StagePlan& s : plan.stages) widths.insert(s.dp);
  EXPECT_GT(widths.size(), 1u) << "every stage has the same DP";
  const double simulated = simulate(plan).step_s;
  EXPECT_LE(simulated, reference * 1.01) << "search " << simulated << " s, optimum " << reference;
  EXPECT_GE(simulated, reference * (1 - 1e-9));
  // The coarse tier, which enumerates one DP for all stages, reaches it through reshape().
  const Plan coarse = plan_training(costs, PlannerOptions{.finest_tier = "coarse", .mixed_stages = false});
  EXPECT_LE(simulate(coarse).step_s, reference * 1.01) << format_plan(coarse) << format_plan(plan);
}

// Four chips of 4 GiB.
constexpr const char* kFourSmallChips = R"(
chips:
  - {name: Y, peak_tflops: 40, memory_gib: 4, memory_bandwidth_gbps: 500}
groups:
  - {chip: Y, nodes: 1, chips_per_node: 4, intra_node_gbps: 50, nic_gbps: 10}
)";

// Four chips that hold the 8-layer model only as a pipeline: interleaving each stage's layers in chunks shrinks the
// bubble of its few micro-batches, and the search picks it — within 1 % of a brute force over every layout and split
// with 1 to 4 chunks, faster than the best plan with 1F1B.
TEST(Search, InterleavesWhenItShrinksTheBubble) {
  const Cluster c = cluster_of(kFourSmallChips);
  // Recomputing only some blocks beats interleaving here (Search.RecomputesOnlyTheFirstBlocksThatMustToFit), and so
  // does ZB-H1 (Search.SplitsBackwardsWhereZeroBubbleReplaysFaster): without either.
  const CostModel costs(
      c, small_model(8),
      TrainSetup{
          .global_batch = 8, .partial_recompute = false, .zero_bubble = false, .micro_batches = {1}, .max_tp = 1});
  const Plan plan = plan_training(costs, PlannerOptions{});
  EXPECT_EQ(plan.schedule, ScheduleKind::kInterleaved) << plan.to_json();
  const double simulated = simulate(plan).step_s, one_f_one_b = exhaustive_best(costs),
               reference = exhaustive_best(costs, 4);
  EXPECT_NEAR(plan.step_s / simulated, 1.0, 1e-9);
  EXPECT_LT(simulated, one_f_one_b * 0.97) << "1F1B's best " << one_f_one_b << " s";
  EXPECT_LE(simulated, reference * 1.01) << "search " << simulated << " s, optimum " << reference;
  EXPECT_GE(simulated, reference * (1 - 1e-9));
}

// The same four 4 GiB chips and 8 layers: ZB-H1's split backwards (the search trying it on each finalist, kept where
// its replay is faster) beat every 1F1B and interleaved plan (0.403 s) by 1.9%, and the plan is within 1% of a brute
// force over every layout and split with 1F1B, interleaving and ZB-H1, each timed by the replay; each stage's
// memory is what the replay holds. Without zero_bubble in the setup, no plan splits.
TEST(Search, SplitsBackwardsWhereZeroBubbleReplaysFaster) {
  const Cluster c = cluster_of(kFourSmallChips);
  const TrainSetup setup{.global_batch = 8, .micro_batches = {1}, .max_tp = 1};
  const CostModel costs(c, small_model(8), setup);
  const Plan plan = plan_training(costs, PlannerOptions{});
  EXPECT_EQ(plan.schedule, ScheduleKind::kZeroBubbleH1) << format_plan(plan);
  EXPECT_THAT(plan.why, HasSubstr("faster than 1F1B by the replay"));
  const SimResult sim = simulate(plan);
  EXPECT_NEAR(plan.step_s / sim.step_s, 1.0, 1e-9);
  for (size_t i = 0; i < plan.stages.size(); ++i) {
    EXPECT_DOUBLE_EQ(plan.stages[i].memory_bytes, sim.peak_memory_bytes[i]) << "stage " << i;
    // What a micro-batch holds between its B and its W, by hand: per token, 2 bytes (bf16) of each product's output
    // gradient — c_attn's 3 x 2048 / tp and attn.c_proj's 2048 per attention half, c_fc's 8192 / tp and
    // mlp.c_proj's 2048 per MLP half — and of the embedding's 2048.
    const StagePlan& st = plan.stages[i];
    const double tokens = 1024.0 * plan.dp * plan.micro_batch / st.dp;
    const double attention = st.layers - st.starts_at_mlp, mlp = st.layers - st.ends_at_attention;
    EXPECT_DOUBLE_EQ(
        st.weight_pending_bytes,
        tokens * 2 * (attention * (6144.0 / st.tp + 2048) + mlp * (8192.0 / st.tp + 2048) + (st.embedding ? 2048 : 0)))
        << "stage " << i;
  }
  TrainSetup without = setup;
  without.zero_bubble = false;
  const CostModel costs_without(c, small_model(8), without);
  const double reference = exhaustive_best(costs, 4), others = exhaustive_best(costs_without, 4);
  EXPECT_LT(sim.step_s, others * 0.99) << "the best 1F1B or interleaved plan: " << others << " s";
  EXPECT_LE(sim.step_s, reference * 1.01) << "search " << sim.step_s << " s, optimum " << reference;
  EXPECT_GE(sim.step_s, reference * (1 - 1e-9));
  EXPECT_NE(plan_training(costs_without, PlannerOptions{}).schedule, ScheduleKind::kZeroBubbleH1);
}

// The same four 4 GiB chips: the 8-layer model fits on one with full recomputation, not without; recomputing only
// its first 4 blocks fits, and 4 data-parallel replicas of that beat every plan that recomputes all or none of a
// stage's blocks (an interleaved pipeline, 0.427 s) by more than 5%. The search's choice of how many blocks is a brute
// force's over every recomputation of every count of first blocks for the same layout, each scored by the replay;
// one block fewer does not fit.
TEST(Search, RecomputesOnlyTheFirstBlocksThatMustToFit) {
  const Cluster c = cluster_of(kFourSmallChips);
  // Without ZB-H1, which splits a two-stage pipeline's backwards faster still (Search.SplitsBackwardsWhere...).
  const TrainSetup setup{.global_batch = 8, .zero_bubble = false, .micro_batches = {1}, .max_tp = 1};
  const CostModel costs(c, small_model(8), setup);
  const Plan plan = plan_training(costs, PlannerOptions{});
  ASSERT_EQ(plan.stages.size(), 1u) << format_plan(plan);
  const StagePlan& st = plan.stages[0];
  EXPECT_EQ(st.recompute, Recompute::kFull);
  EXPECT_EQ(st.recompute_blocks, 4) << format_plan(plan);
  EXPECT_THAT(format_plan(plan), testing::HasSubstr("full:4"));
  TrainSetup whole_only = setup;
  whole_only.partial_recompute = false;
  const Plan without = plan_training(CostModel(c, small_model(8), whole_only), PlannerOptions{});
  EXPECT_LT(simulate(plan).step_s, simulate(without).step_s * 0.95) << format_plan(without);
  const Layout layout = layout_of(plan, c);
  double best = INFINITY;
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    for (int64_t j = -1; j <= 8; ++j) {
      const std::optional<Plan> p =
          score_split(costs, layout, {8}, nullptr, ScoreOptions{.recompute = {{r, j}}, .require_fit = false});
      ASSERT_TRUE(p);
      if (p->fits) best = std::min(best, simulate(*p).step_s);
    }
  }
  EXPECT_NEAR(simulate(plan).step_s, best, 1e-9 * best);
  const std::optional<Plan> fewer = score_split(
      costs, layout, {8}, nullptr, ScoreOptions{.recompute = {{Recompute::kFull, 3}}, .require_fit = false});
  ASSERT_TRUE(fewer);
  EXPECT_FALSE(fewer->fits);
  EXPECT_LT(fewer->stages[0].backward_s, st.backward_s);  // a recomputed block costs its forward again
}

// A vocabulary of 256,000 beside 4 layers: the head is the work of about ten layers. Two 6 GiB chips hold the
// layers and the embedding (with full recomputation) and two 8 GiB chips only the head, sharded over TP 2 — faster
// than any split in which every stage holds layers, and within 1 % of a brute force over every layout and split,
// the first or the last stage also holding only the embedding or the head (stages of one chip type each). In whole
// blocks: with a stage boundary inside a block a split of layers comes within 1% of it (1.458 s against 1.466 s).
TEST(Search, PutsALargeVocabularyOnChipsOfItsOwn) {
  const Cluster c = cluster_of(R"(
chips:
  - {name: X, peak_tflops: 40, memory_gib: 8, memory_bandwidth_gbps: 800}
  - {name: Y, peak_tflops: 40, memory_gib: 6, memory_bandwidth_gbps: 400}
groups:
  - {chip: X, nodes: 1, chips_per_node: 2, intra_node_gbps: 50, nic_gbps: 10}
  - {chip: Y, nodes: 1, chips_per_node: 2, intra_node_gbps: 50, nic_gbps: 10}
links:
  - {between: [X, Y], bandwidth_gbps: 10, latency_us: 10}
)");
  TransformerShape model = small_model(4);
  model.vocab = 256000;
  const CostModel costs(c, model, TrainSetup{.global_batch = 16, .micro_batches = {1, 2}, .max_tp = 2});
  const Plan plan = plan_training(costs, PlannerOptions{.mixed_stages = false, .split_blocks = false});
  ASSERT_GE(plan.stages.size(), 2u);
  const StagePlan& last = plan.stages.back();
  EXPECT_TRUE(last.head && last.layers == 0) << format_plan(plan);
  EXPECT_EQ(last.chip, "X");
  const double simulated = simulate(plan).step_s, layered = exhaustive_best(costs, 1, false, false),
               reference = exhaustive_best(costs, 1, true, false);
  EXPECT_LT(simulated, layered * 0.95) << "every stage with layers: " << layered << " s";
  EXPECT_LE(simulated, reference * 1.01) << "search " << simulated << " s, optimum " << reference;
  EXPECT_GE(simulated, reference * (1 - 1e-9));
}

// The reference for stages whose replicas mix two chip types (`first` and `second`, in that order in each stage):
// every count of identical stages up to `most_stages`, every TP degree both types allow, every number of replicas of
// each type per stage and every number of rows per replica of each type (1..12) whose micro-batch divides the global
// batch, every split of the layers — scored by the simulator's replay (a layout whose m x slowest stage cannot beat
// the best so far is not replayed, as in exhaustive_best).
double mixed_best(const CostModel& costs, int first, int second, int most_stages, bool halves_too = true) {
  double best = INFINITY;
  const int L = static_cast<int>(costs.model().layers);
  const int n_first = costs.cluster().devices_of(first), n_second = costs.cluster().devices_of(second);
  const std::vector<int> tps = tp_options(costs, first), second_tps = tp_options(costs, second);
  for (int stages = 1; stages <= std::min(most_stages, L); ++stages) {
    // Every composition of L into `stages` positive parts, and of the 2L half-blocks (halves: true).
    std::vector<std::pair<std::vector<int>, bool>> splits;
    std::vector<int> split;
    bool halves = false;
    std::function<void(int)> compose = [&](int left) {
      if (static_cast<int>(split.size()) == stages - 1) {
        split.push_back(left);
        splits.push_back({split, halves});
        split.pop_back();
        return;
      }
      for (int n = 1; n <= left - (stages - 1 - static_cast<int>(split.size())); ++n) {
        split.push_back(n);
        compose(left - n);
        split.pop_back();
      }
    };
    compose(L);
    halves = true;
    if (halves_too) compose(2 * L);
    for (int tp : tps) {
      if (std::find(second_tps.begin(), second_tps.end(), tp) == second_tps.end()) continue;
      for (int k1 = 1; k1 * tp * stages <= n_first; ++k1) {
        for (int k2 = 1; k2 * tp * stages <= n_second; ++k2) {
          for (int r1 = 1; r1 <= 12; ++r1) {
            for (int r2 = 1; r2 <= 12; ++r2) {
              const int rows = k1 * r1 + k2 * r2;
              if (costs.train().global_batch % rows != 0) continue;
              Layout l{rows, 1, {}};
              l.stages.assign(static_cast<size_t>(stages),
                              Layout::Slot{first, tp, k1 + k2, {{first, k1, r1}, {second, k2, r2}}});
              for (const auto& [s, in_halves] : splits) {
                const std::optional<Plan> p = score_split(costs, l, s, nullptr, ScoreOptions{.halves = in_halves});
                if (!p) continue;
                if (replay_bound(*p) < best) best = std::min(best, simulate(*p).step_s);
              }
            }
          }
        }
      }
    }
  }
  return best;
}

// Four slow devices and two four times as fast, a 3-layer model every device can hold: one stage of all six replicas,
// the fast ones taking four times the rows of the slow (as Metis, Zorse and Poplar would plan it), beats every plan
// whose stages are each of one type. The search finds it, within 1 % of the optimum of both brute forces. In whole
// blocks: with a stage boundary inside a block (0.686 s) stages of one type each beat it (0.714 s).
TEST(Search, FindsReplicasOfMixedTypesWithUnevenShares) {
  const Cluster c = slow_and_fast(2);
  // Without ZB-H1, whose split backwards make pipelines of one type each faster here.
  const CostModel costs(c, small_model(3),
                        TrainSetup{.global_batch = 24, .zero_bubble = false, .micro_batches = {1, 2, 4}, .max_tp = 1});
  const Plan plan = plan_training(costs, PlannerOptions{.split_blocks = false});
  const double unmixed = exhaustive_best(costs, 3, false, false), mixed = mixed_best(costs, 1, 0, 2, false);
  const double reference = std::min(unmixed, mixed);
  EXPECT_LT(mixed, unmixed * 0.97) << "the case should need mixed replicas";
  ASSERT_FALSE(plan.stages.front().groups.empty()) << plan.to_json();
  EXPECT_EQ(plan.devices_used, 6);
  const double simulated = simulate(plan).step_s;
  EXPECT_NEAR(plan.step_s / simulated, 1.0, 1e-9);
  EXPECT_LE(simulated, reference * 1.01) << "search " << simulated << " s, optimum " << reference;
  EXPECT_GE(simulated, reference * (1 - 1e-9));
  // The fast replicas take four times the slow ones' rows.
  const std::vector<ReplicaGroup>& groups = plan.stages.front().groups;
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].chip, "fast");
  EXPECT_EQ(groups[0].rows, 4 * groups[1].rows);
}

// Sixteen devices, the most the issue's optimality bar names: kSmallCluster's chip types, four to a node, 8 X + 8 Y
// (two types) or 4 X + 8 Y + 4 Z (three), 6 layers. The search's plan is within 1% of the brute force over every
// layout of stages of one chip type each and every split — 1 to 4 chunks, the vocabulary on chips of its own or not
// — and, with two types, over every layout of stages whose replicas mix them (mixed_best; 0.262 s at best, against
// 0.197 s unmixed), each scored by the replay. (Three types' mixed stages have no brute force here.) In whole blocks:
// with stage boundaries inside blocks too (planner and brute forces) it passed once, in 325 s - too long for the
// suite; WithinOnePercentOfExhaustiveOnSmallClusters checks that space.
TEST(Search, WithinOnePercentOfExhaustiveOnSixteenDevices) {
  for (const bool three : {false, true}) {
    const Cluster c =
        cluster_of(cat(R"(
chips:
  - {name: X, peak_tflops: 100, efficiency: 0.5, memory_gib: 2, memory_bandwidth_gbps: 1000}
  - {name: Y, peak_tflops: 40, efficiency: 0.5, memory_gib: 8, memory_bandwidth_gbps: 500}
  - {name: Z, peak_tflops: 60, efficiency: 0.5, memory_gib: 4, memory_bandwidth_gbps: 800}
groups:
  - {chip: X, nodes: )",
                       three ? 1 : 2, R"(, chips_per_node: 4, intra_node_gbps: 100, nic_gbps: 10}
  - {chip: Y, nodes: 2, chips_per_node: 4, intra_node_gbps: 50, nic_gbps: 10}
)",
                       three ? "  - {chip: Z, nodes: 1, chips_per_node: 4, intra_node_gbps: 80, nic_gbps: 20}\n" : "",
                       R"(links:
  - {between: [X, Y], bandwidth_gbps: 5, latency_us: 10, device_direct: false}
  - {between: [X, Z], bandwidth_gbps: 10, latency_us: 10, device_direct: true}
  - {between: [Y, Z], bandwidth_gbps: 5, latency_us: 10, device_direct: false}
)"));
    const CostModel costs(c, small_model(6), TrainSetup{.global_batch = 32, .micro_batches = {1, 2}});
    SearchStats stats;
    const Plan plan = plan_training(costs, PlannerOptions{.split_blocks = false}, &stats);
    EXPECT_EQ(plan.devices_total, 16);
    EXPECT_EQ(stats.tier, "exhaustive");
    const double unmixed = exhaustive_best(costs, 4, true, false);
    const double mixed = three ? INFINITY : mixed_best(costs, 0, 1, 6, false);
    const double reference = std::min(unmixed, mixed);
    ASSERT_TRUE(std::isfinite(reference));
    const double simulated = simulate(plan).step_s;
    EXPECT_NEAR(plan.step_s / simulated, 1.0, 1e-9);
    EXPECT_LE(simulated, reference * 1.01)
        << (three ? 3 : 2) << " types: search " << simulated << " s, optimum " << reference << "\n"
        << format_plan(plan);
    EXPECT_GE(simulated, reference * (1 - 1e-9));
  }
}

}  // namespace
}  // namespace h2
