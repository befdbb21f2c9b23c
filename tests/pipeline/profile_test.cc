// What `h2 profile` makes of its measurements: the GEMM rate and elements' costs fitted to GEMMs' times.
#include "pipeline/profile.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <mutex>
#include <thread>

#include "comm/run_ranks.h"
#include "core/clock.h"
#include "core/format.h"
#include "device/key_recorder.h"
#include "model/gpt.h"
#include "ops/ops.h"
#include "pipeline/hetero_train.h"
#include "planner/cost_model.h"
#include "train/optimizer.h"

namespace h2 {
namespace {

// The model's GEMMs of a 256-wide block and a 50,257-token head at TP 1 and 2, 256 and 1,024 rows (what h2 profile
// times for model_small.yaml), each timed as 6 r k n / rate + 3 (a r k + b k n + c r n): the cost model's own form,
// written here by hand.
std::vector<GemmTiming> timed(double rate, double a, double b, double c) {
  std::vector<GemmTiming> out;
  for (double tp : {1.0, 2.0}) {
    for (double rows : {256.0, 1024.0}) {
      for (auto [k, n] : {std::pair{256.0, 768 / tp},
                          {256 / tp, 256.0},
                          {256.0, 1024 / tp},
                          {1024 / tp, 256.0},
                          {256.0, std::floor(50257 / tp)}}) {
        out.push_back({rows, k, n, 6 * rows * k * n / rate + 3 * (a * rows * k + b * k * n + c * rows * n)});
      }
    }
  }
  return out;
}

TransformerShape small() {
  return TransformerShape{
      .layers = 4, .hidden = 256, .heads = 4, .kv_heads = 4, .ffn = 1024, .vocab = 50257, .seq_len = 256};
}

TEST(MatmulFit, RecoversTheRateAndElementsCostsOfItsOwnForm) {
  const MatmulFit fit = fit_matmul(timed(240e9, 0.5e-9, 1.25e-9, 0.65e-9));
  EXPECT_NEAR(fit.flops, 240e9, 1e-6 * 240e9);
  EXPECT_NEAR(fit.element_s[0], 0.5e-9, 1e-6 * 0.5e-9);
  EXPECT_NEAR(fit.element_s[1], 1.25e-9, 1e-6 * 1.25e-9);
  EXPECT_NEAR(fit.element_s[2], 0.65e-9, 1e-6 * 0.65e-9);
  EXPECT_LT(fit.rms_error, 1e-9);
}

// Times no non-negative costs explain (the weight's "cost" below zero): that cost leaves the fit, the others stay
// at or above zero, and the error says the fit is not exact.
TEST(MatmulFit, DropsACostTheDataWouldMakeNegative) {
  const MatmulFit fit = fit_matmul(timed(240e9, 2e-9, -0.2e-9, 0.65e-9));
  EXPECT_GT(fit.flops, 0.0);
  EXPECT_EQ(fit.element_s[1], 0.0);
  EXPECT_GE(fit.element_s[0], 0.0);
  EXPECT_GE(fit.element_s[2], 0.0);
  EXPECT_GT(fit.rms_error, 1e-4);
}

// Too few GEMMs to fit four unknowns: the rate of them all together (6 r k n FLOPs over their time), no costs.
TEST(MatmulFit, FewerThanFourGemmsGiveTheirRateAlone) {
  const MatmulFit fit = fit_matmul({{100, 10, 20, 1e-6}, {200, 10, 20, 3e-6}});
  EXPECT_DOUBLE_EQ(fit.flops, (6.0 * 100 * 10 * 20 + 6.0 * 200 * 10 * 20) / 4e-6);
  EXPECT_EQ(fit.element_s, (std::array<double, 3>{}));
}

// One chip type c, `per_node` devices on one node (5 GB/s links without latency), and a measurement of it whose
// GEMMs took exactly the fit's form (`timed`).
Cluster one_chip(int per_node) {
  return load_cluster(ConfigNode::parse_string(
      cat("name: one\nchips:\n  - {name: c, peak_tflops: 0.2, efficiency: 0.5, memory_gib: 1, memory_bandwidth_gbps: "
          "8}\ngroups:\n  - {chip: c, nodes: 1, chips_per_node: ",
          per_node, ", intra_node_gbps: 5, intra_node_latency_us: 0, nic_gbps: 5}\n"),
      "one.yaml"));
}
ChipMeasurement measured_c() {
  ChipMeasurement m{
      .chip = "c", .matmul_flops = 240e9, .matmul_element_s = {0.5e-9, 1.25e-9, 0.65e-9}, .memory_gbps = 8};
  m.gemms = timed(240e9, 0.5e-9, 1.25e-9, 0.65e-9);
  return m;
}

// The profiled cluster keeps each GEMM's time over what the fitted rate and elements' costs give it: GEMMs of the
// fit's own form but for the TP-2 head at 1,024 rows, which took 1.3 times its form — its correction 1.3 there
// (the file rounds to 6 digits), 1 at 256 rows, 1.15 halfway; every other shape 1.
TEST(ProfiledCluster, KeepsEachGemmsTimeOverTheFits) {
  const Cluster cluster = one_chip(1);
  ChipMeasurement m = measured_c();
  for (GemmTiming& g : m.gemms) {
    if (g.rows == 1024 && g.n == 25128) g.seconds *= 1.3;
  }
  const Cluster out = load_cluster(ConfigNode::parse_string(
      cluster_to_yaml(profiled_cluster(cluster, {m}, LinkMeasurement{}, small(), Precision::kF32)), "out.yaml"));
  const ChipType& c = out.chips.front();
  ASSERT_EQ(c.matmul_corrections.size(), m.gemms.size());
  EXPECT_NEAR(c.gemm_correction(1024, 256, 25128), 1.3, 1e-5);
  EXPECT_NEAR(c.gemm_correction(640, 256, 25128), 1.15, 1e-5);
  EXPECT_NEAR(c.gemm_correction(256, 256, 25128), 1.0, 1e-5);
  EXPECT_NEAR(c.gemm_correction(1024, 256, 50257), 1.0, 1e-5);
  EXPECT_NEAR(c.gemm_correction(2048, 128, 256), 1.0, 1e-5);
}

// The profiled cluster's cost model predicts each part as the profile timed it: a block's forward and backward and
// the head's at each TP degree and rows timed (at TP 1 without all-reduces: one device), whatever its kernel figures
// compose; between the rows timed, between the two.
TEST(ProfiledCluster, PredictsTheBlockAndHeadAsTimedInEachDirection) {
  const Cluster cluster = one_chip(2);
  ChipMeasurement m = measured_c();
  m.elementwise_gbps = 20;
  m.attention_flops = m.attention_forward_flops = 50e9;
  m.kernel_overhead_s = 20e-6;
  m.parts = {{1, 256, 0.030, 0.050, 0.100, 0.150},
             {1, 2048, 0.200, 0.300, 0.600, 1.000},
             {2, 256, 0.020, 0.030, 0.040, 0.100}};
  const Cluster out = load_cluster(ConfigNode::parse_string(
      cluster_to_yaml(profiled_cluster(cluster, {m}, LinkMeasurement{}, small(), Precision::kF32)), "out.yaml"));
  const CostModel costs(out, small(), TrainSetup{.global_batch = 8, .precision = Precision::kF32});
  const auto block = [&](int tp, int b) {
    return costs.layer_forward_s(0, tp, b) + costs.layer_backward_s(0, tp, b, Recompute::kNone);
  };
  EXPECT_NEAR(costs.layer_forward_s(0, 1, 1), 0.030, 1e-6);
  EXPECT_NEAR(costs.layer_backward_s(0, 1, 1, Recompute::kNone), 0.050, 1e-6);
  EXPECT_NEAR(costs.head_forward_s(0, 1, 1), 0.100, 1e-6);
  EXPECT_NEAR(costs.head_backward_s(0, 1, 1), 0.150, 1e-6);
  // (the file keeps a ratio to 6 significant digits)
  EXPECT_NEAR(costs.layer_forward_s(0, 1, 8), 0.200, 1e-5);
  EXPECT_NEAR(costs.layer_backward_s(0, 1, 8, Recompute::kNone), 0.300, 1e-5);
  EXPECT_NEAR(costs.head_forward_s(0, 1, 8), 0.600, 1e-5);
  EXPECT_NEAR(costs.head_backward_s(0, 1, 8), 1.000, 1e-5);
  const double between = block(1, 4);
  EXPECT_GT(between, 0.080);
  EXPECT_LT(between, 0.500);
  // TP 2: what was timed and its all-reduces (a block's two of 256 x 256 f32 over 5 GB/s each way; the head's three
  // of the loss's 256 x 3 f32 statistics forward and its input gradient backward), which the cost model adds to the
  // kernels.
  const double activation = 256.0 * 256 * 4 / 5e9, stats = 256.0 * 4 / 5e9;
  EXPECT_NEAR(costs.layer_forward_s(0, 2, 1), 0.020 + 2 * activation, 1e-6);
  EXPECT_NEAR(costs.layer_backward_s(0, 2, 1, Recompute::kNone), 0.030 + 2 * activation, 1e-6);
  EXPECT_NEAR(costs.head_forward_s(0, 2, 1), 0.040 + 3 * stats, 1e-6);
  EXPECT_NEAR(costs.head_backward_s(0, 2, 1), 0.100 + activation, 1e-6);
}

// What one rank measured crosses to the others as a list of figures and comes back whole: every figure, each part's
// six numbers and each GEMM's four in their places (distinct values, so a figure read from another's place shows).
TEST(ProfileFigures, AMeasurementCrossesBetweenRanksWhole) {
  ChipMeasurement m{.kernel_overhead_s = 1,
                    .matmul_flops = 2,
                    .matmul_element_s = {3, 4, 5},
                    .matmul_fit_error = 6,
                    .attention_flops = 7,
                    .attention_forward_flops = 8,
                    .memory_gbps = 9,
                    .recompute_s = 10,
                    .matmul_forward_speedup = 11,
                    .elementwise_gbps = 12};
  m.parts = {{1, 13, 14, 15, 16, 17}, {2, 18, 19, 20, 21, 22}};
  m.gemms = {{23, 24, 25, 26}, {27, 28, 29, 30}};
  const ChipMeasurement back = measurement_of(measurement_figures(m));
  EXPECT_EQ(back.kernel_overhead_s, 1);
  EXPECT_EQ(back.matmul_flops, 2);
  EXPECT_EQ(back.matmul_element_s, (std::array<double, 3>{3, 4, 5}));
  EXPECT_EQ(back.matmul_fit_error, 6);
  EXPECT_EQ(back.attention_flops, 7);
  EXPECT_EQ(back.attention_forward_flops, 8);
  EXPECT_EQ(back.memory_gbps, 9);
  EXPECT_EQ(back.recompute_s, 10);
  EXPECT_EQ(back.matmul_forward_speedup, 11);
  EXPECT_EQ(back.elementwise_gbps, 12);
  ASSERT_EQ(back.parts.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const ChipMeasurement::PartTiming &a = m.parts[i], &b = back.parts[i];
    EXPECT_EQ(
        std::vector<double>({b.tp, b.rows, b.block_forward_s, b.block_backward_s, b.head_forward_s, b.head_backward_s}),
        std::vector<double>(
            {a.tp, a.rows, a.block_forward_s, a.block_backward_s, a.head_forward_s, a.head_backward_s}));
  }
  ASSERT_EQ(back.gemms.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(std::vector<double>({back.gemms[i].rows, back.gemms[i].k, back.gemms[i].n, back.gemms[i].seconds}),
              std::vector<double>({m.gemms[i].rows, m.gemms[i].k, m.gemms[i].n, m.gemms[i].seconds}));
  }
}

// h2 profile measures one rank of each chip type at a time, in rank order, each pass over all of them: ranks of
// chips {fast, fast, slow, slow, mid}, two passes -> 0, 2, 4, then 0, 2, 4 again.
TEST(ProfileTurns, TheFirstRankOfEachChipTypeOncePerPass) {
  EXPECT_EQ(measuring_turns({"fast", "fast", "slow", "slow", "mid"}, 2), (std::vector<int>{0, 2, 4, 0, 2, 4}));
  EXPECT_EQ(measuring_turns({"slow", "fast", "slow"}, 1), (std::vector<int>{0, 1}));
}

// Three ranks take turns {2, 0}, each measuring 1.5 s while it tells the others it is at work every 50 ms; a
// waiting rank gives up after 1 s without a word. Every rank waits longer than that in all (rank 1 for both turns,
// 3 s), yet none gives up, and the turns run one after another in the order given.
TEST(ProfileTurns, ARankAtWorkIsWaitedForHoweverLongTheChain) {
  using namespace std::chrono_literals;
  const std::vector<int> turns = {2, 0};
  std::mutex mu;
  std::vector<std::array<double, 3>> ran;  // rank, start, end
  const auto errors = testing_util::run_ranks(3, [&](Communicator& world) {
    take_turns(
        world, turns,
        [&](const std::function<void()>& progress) {
          const double start = monotonic_seconds();
          for (int i = 0; i < 30; ++i) {
            std::this_thread::sleep_for(50ms);
            progress();
          }
          const std::lock_guard lock(mu);
          ran.push_back({static_cast<double>(world.rank()), start, monotonic_seconds()});
        },
        1s);
  });
  EXPECT_EQ(errors, (std::vector<std::string>(3)));
  ASSERT_EQ(ran.size(), 2u);
  EXPECT_EQ(ran[0][0], 2);
  EXPECT_EQ(ran[1][0], 0);
  EXPECT_LE(ran[0][2], ran[1][1]);  // the second turn began after the first ended
}

// Rank 0 measures for 1.2 s without a word; the others give up after 0.3 s of silence, each naming rank 0 and its
// turn.
TEST(ProfileTurns, ASilentRankIsNamedAfterTheSilenceLimit) {
  using namespace std::chrono_literals;
  const auto errors = testing_util::run_ranks(3, [&](Communicator& world) {
    take_turns(
        world, {0, 1}, [](const std::function<void()>&) { std::this_thread::sleep_for(1200ms); }, 300ms);
  });
  for (int r : {1, 2}) {
    EXPECT_THAT(errors[static_cast<size_t>(r)],
                ::testing::HasSubstr(cat("rank ", r, " heard nothing for 300 ms from rank 0")));
    EXPECT_THAT(errors[static_cast<size_t>(r)], ::testing::HasSubstr("(turn 1 of 2)"));
  }
}

// A node of two chips, and a one-block model whose 101 tokens make uneven vocabulary shards at TP 2 (50 and 51 rows).
Cluster pair_cluster() {
  return load_cluster(ConfigNode::parse_string(
      "name: pair\nchips:\n  - {name: c, peak_tflops: 0.2, efficiency: 0.5, memory_gib: 1, memory_bandwidth_gbps: 8}\n"
      "groups:\n  - {chip: c, nodes: 1, chips_per_node: 2, intra_node_gbps: 5, nic_gbps: 5}\n",
      "pair.yaml"));
}

TransformerShape one_block() {
  return TransformerShape{.layers = 1, .hidden = 32, .heads = 2, .kv_heads = 2, .ffn = 128, .vocab = 101, .seq_len = 8};
}

// The kernels a stage runs at `rows` sequences, one per launch, on each TP rank of `ranks` ({rank, size}; by default
// either rank at TP 1 and 2: the first adds the row-parallel biases): the embedding, a block and the head forward and
// backward (`parts`: or the head alone, or the head's forward and loss alone), and with `optimizer` the optimizer step
// over their tensors.
enum class Parts { kStage, kHead, kHeadForward };
std::vector<uint64_t> stage_kernels(const TransformerShape& shape, int rows, bool optimizer,
                                    const std::vector<std::pair<int, int>>& ranks = {{0, 1}, {0, 2}, {1, 2}},
                                    Parts parts = Parts::kStage) {
  const GptConfig config = gpt_config_of(shape);
  const int T = config.seq_len, C = config.n_embd;
  KeyRecorder dev(size_t{64} << 20);
  const Tensor x = dev.zeros(DType::kF32, {rows, T, C}), dout = dev.zeros(DType::kF32, {rows, T, C});
  const Tensor targets = dev.zeros(DType::kI32, {rows, T});
  const auto nothing = [](const Tensor&) {};
  const Tensor acc = dev.zeros(DType::kF32, {1});
  for (const auto& [rank, size] : ranks) {
    const TensorParallel tp{rank, size, nothing, nothing};
    Gpt embedding(config, dev, GptRange{true, 0, 0, false}, rows, T, tp);
    Gpt block(config, dev, GptRange{false, 0, 1, false}, rows, T, tp);
    Gpt head(config, dev, GptRange{false, 1, 1, true}, rows, T, tp);
    for (Gpt* part : {&embedding, &block, &head}) part->init(1);
    if (parts == Parts::kStage) {
      embedding.forward(targets);
      embedding.backward(dout);
      block.forward(x);
      block.backward(dout);
    }
    head.forward(x);
    head.loss(targets);
    if (parts != Parts::kHeadForward) head.backward();
    for (Gpt* part : optimizer ? std::vector<Gpt*>{&embedding, &block, &head} : std::vector<Gpt*>{}) {
      const int64_t n = part->num_params();
      const OptimizerState moments{dev.zeros(DType::kF32, {n}), dev.zeros(DType::kF32, {n})};
      optimizer_step(*part, moments, AdamwParams{}, acc, {.max_norm = 1e-6});
    }
  }
  return dev.keys();
}

// h2 profile lists the work of the kernels a stage runs at every tensor-parallel degree its chip type's devices
// allow, so that a run paces them as profiled: every kernel of stage_kernels at the micro-batch's rows (one
// sequence), the optimizer step's included, is in the measurement's kernel_work with positive work; with max_rows 4,
// also those at 2 and 4 sequences (not 3: the rows double), which without it it does not list.
TEST(ProfileKernelWork, ListsTheKernelsOfATensorParallelStageAtEachRowsUpToMaxRows) {
  const Cluster cluster = pair_cluster();
  const TransformerShape shape = one_block();
  const ChipMeasurement one = measure_chip(cluster, "c", shape, /*micro_batch=*/1, Precision::kF32),
                        upto4 = measure_chip(cluster, "c", shape, 1, Precision::kF32, {.max_rows = 4});
  const auto expect_listed = [](const ChipMeasurement& m, const std::vector<uint64_t>& keys, const char* what) {
    ASSERT_FALSE(keys.empty());
    for (const uint64_t key : keys) {
      const auto listed = m.kernel_work.find(key);
      ASSERT_NE(listed, m.kernel_work.end()) << what << ": kernel " << key << " is not in the profile's kernel work";
      EXPECT_GT(listed->second, 0.0) << what;
    }
  };
  expect_listed(one, stage_kernels(shape, 1, true), "one sequence");
  expect_listed(upto4, stage_kernels(shape, 1, true), "one sequence, max_rows 4");
  expect_listed(upto4, stage_kernels(shape, 2, false), "two sequences");
  expect_listed(upto4, stage_kernels(shape, 4, false), "four sequences");
  const auto listed = [](const ChipMeasurement& m, const std::vector<uint64_t>& keys) {
    return std::count_if(keys.begin(), keys.end(), [&](uint64_t k) { return m.kernel_work.contains(k); });
  };
  const std::vector<uint64_t> two = stage_kernels(shape, 2, false), three = stage_kernels(shape, 3, false);
  EXPECT_LT(listed(one, two), static_cast<long>(two.size())) << "without max_rows, two sequences' kernels listed";
  EXPECT_LT(listed(upto4, three), static_cast<long>(three.size())) << "three sequences' kernels listed";
  // And it times a block and the head whole at TP 1 and 2 (two devices a node), at one sequence (8 rows) and, with
  // max_rows 4 and a reference that lists their kernels (paced as training paces them), at 2 and 4 sequences too.
  const auto timed_at = [](const ChipMeasurement& m) {
    std::vector<std::pair<double, double>> at;
    for (const ChipMeasurement::PartTiming& p : m.parts) {
      EXPECT_GT(p.block_s(), 0.0);
      EXPECT_GT(p.head_s(), 0.0);
      at.emplace_back(p.tp, p.rows);
    }
    std::sort(at.begin(), at.end());
    return at;
  };
  using At = std::vector<std::pair<double, double>>;
  EXPECT_EQ(timed_at(one), (At{{1, 8}, {2, 8}}));
  EXPECT_EQ(timed_at(upto4), (At{{1, 8}, {2, 8}}));
  const ChipMeasurement paced =
      measure_chip(cluster, "c", shape, 1, Precision::kF32, {.reference = &upto4.kernel_work, .max_rows = 4});
  EXPECT_EQ(timed_at(paced), (At{{1, 8}, {1, 16}, {1, 32}, {2, 8}, {2, 16}, {2, 32}}));
}

// h2 profile's first pass learns a chip type's kernel work on the chip unpaced (MeasureOptions::unpaced): the same
// kernels as paced, those at 2 and 4 sequences with max_rows 4 included, at the host's speed — the paced chip's
// times are the host's over its speed (0.4 here: 2.5 times them; the test asks for more than 1.4 in the GEMMs, each
// with its two kernels' fixed costs).
TEST(ProfileKernelWork, AnUnpacedChipLearnsTheSameKernelsAtTheHostsSpeed) {
  const Cluster cluster = pair_cluster();
  const TransformerShape shape = one_block();
  const ChipMeasurement paced = measure_chip(cluster, "c", shape, 1, Precision::kF32, {.rounds = 1, .max_rows = 4}),
                        unpaced = measure_chip(cluster, "c", shape, 1, Precision::kF32,
                                               {.rounds = 1, .unpaced = true, .max_rows = 4});
  for (const uint64_t key : stage_kernels(shape, 4, false)) EXPECT_TRUE(unpaced.kernel_work.contains(key)) << key;
  ASSERT_EQ(paced.kernel_work.size(), unpaced.kernel_work.size());
  for (const auto& [key, seconds] : paced.kernel_work) EXPECT_TRUE(unpaced.kernel_work.contains(key)) << key;
  const auto gemms_s = [](const ChipMeasurement& m) {
    double sum = 0;
    for (const GemmTiming& g : m.gemms) sum += g.seconds + 2 * m.kernel_overhead_s;
    return sum;
  };
  EXPECT_GT(gemms_s(paced), 1.4 * gemms_s(unpaced));
}

// On an emulated chip paced to a reference, with two rounds or more, measure_chip runs no round to warm up (a paced
// kernel takes its reference's time, cold or warm; h2 profile's timed pass): two timed rounds run as many rounds as
// one after a warm-up. Learning its kernels' work, or not emulated (a GPU's first kernels load and tune), a chip
// still warms up: two take more than one.
TEST(ProfileRounds, APacedChipTimesTwoRoundsWithoutAWarmUp) {
  const TransformerShape shape = one_block();
  const auto rounds_run = [&](const Cluster& cluster, int rounds, bool paced) {
    const ChipMeasurement learnt = measure_chip(cluster, "c", shape, 1, Precision::kF32, {.rounds = 1});
    int progress = 0;  // one per round of each measurement
    measure_chip(
        cluster, "c", shape, 1, Precision::kF32,
        {.rounds = rounds, .reference = paced ? &learnt.kernel_work : nullptr, .progress = [&] { ++progress; }});
    return progress;
  };
  const Cluster emulated = pair_cluster();
  EXPECT_EQ(rounds_run(emulated, 2, true), rounds_run(emulated, 1, true));
  EXPECT_GT(rounds_run(emulated, 2, false), rounds_run(emulated, 1, false));
  Cluster cores = emulated;
  cores.chips[0].backend = "cpu";
  EXPECT_GT(rounds_run(cores, 2, true), rounds_run(cores, 1, true));
}

// A TP group waits at each all-reduce for its slowest rank, so h2 profile times a block and the head on every rank
// and keeps the slowest, forward and backward apart (a run's forward and backward actions). Here the second TP rank's
// own head forward kernels (101 tokens: its vocabulary shard is 51 rows to the first's 50; the logits and the loss)
// are listed at 100 ms of work each, paced at the chip's speed (0.4): its head's forward takes at least 100 ms a
// launch, where the first rank's, and either's backward, at the small model's listed work, take a fraction of a
// millisecond. Until 2026-12-06 only the first rank was timed, and forward and backward together.
TEST(ProfileParts, TimesEveryTensorParallelRankAndKeepsTheSlowestForwardAndBackward) {
  const Cluster cluster = pair_cluster();
  const TransformerShape shape = one_block();
  const ChipMeasurement learnt = measure_chip(cluster, "c", shape, /*micro_batch=*/1, Precision::kF32);
  const std::vector<uint64_t> first = stage_kernels(shape, 1, false, {{0, 2}}, Parts::kHead),
                              second = stage_kernels(shape, 1, false, {{1, 2}}, Parts::kHeadForward);
  KernelWork reference = learnt.kernel_work;
  double slowest = 0;  // the second rank's head forward at the least its pacing allows
  for (const uint64_t key : second) {
    if (std::find(first.begin(), first.end(), key) != first.end()) continue;
    reference[key] = 100e-3;
    slowest += 100e-3;
  }
  ASSERT_GE(slowest, 200e-3) << "the second rank's head forward has too few kernels of its own";
  const ChipMeasurement paced = measure_chip(cluster, "c", shape, 1, Precision::kF32, {.reference = &reference});
  const auto part = [&](double tp) {
    for (const ChipMeasurement::PartTiming& p : paced.parts) {
      if (p.tp == tp) return p;
    }
    ADD_FAILURE() << "no part timed at TP " << tp;
    return ChipMeasurement::PartTiming{};
  };
  EXPECT_GE(part(2).head_forward_s, slowest);  // paced at the chip's speed (below 1): at least the listed work
  // Its backward: none of the planted kernels, timed apart, on the ranks' slower backward.
  EXPECT_GT(part(2).head_backward_s, 0.0);
  EXPECT_LT(part(2).head_backward_s, slowest / 2);
  // TP 1: the whole vocabulary's kernels, none of them the second rank's; the block's neither (both under the host's
  // load in a parallel test run took up to 49 ms where the TP-2 head forward sleeps at least 200: two kernels of its
  // own).
  EXPECT_LT(part(1).head_s(), part(2).head_s());
  EXPECT_LT(part(2).block_s(), part(2).head_s());
  for (double tp : {1.0, 2.0}) {
    EXPECT_GT(part(tp).block_forward_s, 0.0);
    EXPECT_GT(part(tp).block_backward_s, 0.0);
  }
}

// The latency under load, worked by hand. Pair (0, 1): GEMMs alone 10 and 12 ms, with the all-reduce 13 and 14 ms:
// the all-reduce ends 14 - 12 = 2 ms after the slower GEMM alone, two messages of 1 ms. Pair (2, 3): 20 and 20 ms,
// 23 and 22 ms: 3 ms, 1.5 ms a message. The mean: 1.25 ms. A fifth rank, alone, has no pair and does not count.
TEST(LatencyUnderLoad, APairsAllReduceBeyondItsSlowerGemmOverTwoMessages) {
  EXPECT_NEAR(latency_under_load_s({10e-3, 13e-3, 12e-3, 14e-3, 20e-3, 23e-3, 20e-3, 22e-3, 5e-3, 9e-3}), 1.25e-3,
              1e-12);
  // Noise that makes the all-reduce look faster than the GEMM counts as no latency, not a negative one.
  EXPECT_EQ(latency_under_load_s({10e-3, 9e-3, 10e-3, 9.5e-3}), 0.0);
  EXPECT_EQ(latency_under_load_s({10e-3, 11e-3}), 0.0);  // one rank: no pair
}

}  // namespace
}  // namespace h2
