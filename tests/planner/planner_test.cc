// HeteroAuto: spec errors, cost formulas against closed forms, the search against exhaustive enumeration,
// and plan.json.
#include "planner/planner.h"

#include <cmath>
#include <functional>

#include "planner/catalog.h"
#include "planner/fixtures.h"
#include "planner/layout.h"
#include "planner/report.h"
#include "test_util.h"

namespace h2 {
namespace {

using testing_util::cluster_of;
using testing_util::Hetero1024;
using testing_util::kSmallCluster;
using testing_util::small_model;

using ::testing::HasSubstr;
using testing_util::error_of;
using testing_util::Example;
using testing_util::load_example;

TEST(Spec, ShippedExamplesLoad) {
  const Example e = load_example("cluster_hetero1024.yaml", "model_100b.yaml", "train_100b.yaml");
  const Cluster& c = e.cluster;
  int total = 0;
  for (size_t k = 0; k < c.chips.size(); ++k) total += c.devices_of(static_cast<int>(k));
  EXPECT_EQ(total, 1024);
  EXPECT_EQ(c.chips.size(), 4u);
  EXPECT_NEAR(static_cast<double>(total_params(e.model)), 101.2e9, 0.1e9);
  EXPECT_EQ(e.train.global_batch, 1024);
}

TEST(Spec, BadInputNamesFileAndField) {
  EXPECT_THAT(error_of(
                  [] {
                    cluster_of(
                        "chips:\n  - {name: X, peak_tflops: 1, memory_gib: 1, memory_bandwidth_gbps: 1}\n"
                        "groups:\n  - {chip: Q, nodes: 1, chips_per_node: 1, nic_gbps: 1}\n");
                  },
                  ErrorCode::kConfig),
              HasSubstr("c.yaml:4:12: field 'groups[0].chip': unknown chip type 'Q'"));
  EXPECT_THAT(error_of(
                  [] {
                    cluster_of(
                        "chips:\n  - {name: X, peak_tflops: 0, memory_gib: 1, memory_bandwidth_gbps: 1}\n"
                        "groups: []\n");
                  },
                  ErrorCode::kConfig),
              HasSubstr("field 'chips[0].peak_tflops': must be a positive finite number, got 0"));
  EXPECT_THAT(error_of([] { cluster_of("chips: []\ngroups: []\n"); }, ErrorCode::kConfig),
              HasSubstr("lists no chip types"));
  EXPECT_THAT(
      error_of(
          [] {
            cluster_of(
                "chips:\n  - {name: X, peak_tflops: 1, memory_gib: 1, memory_bandwidth_gbps: 1, backend: tpu}\n"
                "groups: []\n");
          },
          ErrorCode::kConfig),
      HasSubstr("field 'chips[0].backend': 'tpu' is not a backend a chip type can run on; use emu, cpu or cuda"));
  EXPECT_THAT(error_of(
                  [] {
                    cluster_of(
                        "chips:\n  - {name: X, peak_tflops: 1, memory_gib: 1, memory_bandwidth_gbps: 1}\n"
                        "groups: []\n");
                  },
                  ErrorCode::kConfig),
              HasSubstr("the cluster has no devices"));
  EXPECT_THAT(error_of(
                  [] {
                    cluster_of(
                        "chips:\n  - {name: X, peak_tflops: 1, memory_gib: 1, memory_bandwidth_gbps: 1}\n"
                        "groups:\n  - {chip: X, nodes: -2, chips_per_node: 1, nic_gbps: 1}\n");
                  },
                  ErrorCode::kConfig),
              HasSubstr("field 'groups[0].nodes': must be a positive integer, got -2"));
  EXPECT_THAT(
      error_of(
          [] {
            load_model(ConfigNode::parse_string("layers: 2\nhidden: 100\nheads: 3\nvocab: 10\nseq_len: 8\n", "m.yaml"));
          },
          ErrorCode::kConfig),
      HasSubstr("m.yaml:3:8: field 'heads': 3 heads do not divide hidden = 100"));
  EXPECT_THAT(
      error_of([] { load_train_setup(ConfigNode::parse_string("global_batch: 0\n", "t.yaml")); }, ErrorCode::kConfig),
      HasSubstr("field 'global_batch': must be an integer in [1, 4294967296], got 0"));
  EXPECT_THAT(
      error_of([] { load_train_setup(ConfigNode::parse_string("global_batch: 4611686018427387904\n", "t.yaml")); },
               ErrorCode::kConfig),
      HasSubstr("got 4611686018427387904"));  // 2^62 used to plan nonsense
  EXPECT_TRUE(load_train_setup(ConfigNode::parse_string("global_batch: 8\n", "t.yaml")).partial_recompute);
  EXPECT_FALSE(load_train_setup(ConfigNode::parse_string("global_batch: 8\npartial_recompute: false\n", "t.yaml"))
                   .partial_recompute);
  EXPECT_THAT(
      error_of([] { load_train_setup(ConfigNode::parse_string("global_batch: 8\npartial_recompute: 3\n", "t.yaml")); },
               ErrorCode::kConfig),
      HasSubstr("field 'partial_recompute'"));
}

// The cluster file h2 profile writes loads back as the same cluster, whatever characters its names hold.
TEST(Spec, ClusterYamlRoundTripsAwkwardNames) {
  Cluster c = cluster_of(kSmallCluster);
  c.name = "lab: rack #3";
  c.chips[0].vendor = "Acme, Inc.";
  c.chips[1].name = "Y [v2]";
  c.chips[2].efficiency = 0.123456;
  c.chips[1].backend = "cuda";
  c.chips[2].emulation_tflops = 0.25;
  const Cluster back = load_cluster(ConfigNode::parse_string(cluster_to_yaml(c), "written.yaml"));
  EXPECT_EQ(back.name, c.name);
  ASSERT_EQ(back.chips.size(), 3u);
  EXPECT_EQ(back.chips[0].vendor, "Acme, Inc.");
  EXPECT_EQ(back.chips[1].name, "Y [v2]");
  EXPECT_DOUBLE_EQ(back.chips[2].efficiency, 0.123456);
  EXPECT_EQ(back.chips[0].backend, "emu");
  EXPECT_EQ(back.chips[1].backend, "cuda");
  EXPECT_DOUBLE_EQ(back.chips[2].emulation_tflops, 0.25);
  EXPECT_DOUBLE_EQ(back.chips[1].emulation_tflops, 0.0);
  ASSERT_EQ(back.links.size(), 3u);
  EXPECT_EQ(back.links[0].a, 0);
  EXPECT_EQ(back.links[0].b, 1);
  EXPECT_FALSE(back.links[0].device_direct);
  EXPECT_TRUE(back.links[1].device_direct);
  EXPECT_EQ(back.groups[1].nodes, 2);
  EXPECT_DOUBLE_EQ(back.groups[2].intra_node_gbps, 80);
  EXPECT_TRUE(back.chips[0].kernel_work.empty());
  EXPECT_EQ(cluster_to_yaml(back), cluster_to_yaml(c));
}

// h2 profile's kernel work, per chip type: 64-bit shape keys (the highest bit set too) and seconds load back as
// written; a chip type not in the file, one listed twice, a key that is not 16 hex digits, a pair of the wrong
// length or seconds <= 0 are errors naming the field.
TEST(Spec, ClusterYamlCarriesEachChipsKernelWork) {
  Cluster c = cluster_of(kSmallCluster);
  c.chips[0].kernel_work = {{0xfedcba9876543210ULL, 1.25e-5}, {7, 0.5}};
  c.chips[2].kernel_work = {{7, 0.25}};
  const std::string yaml = cluster_to_yaml(c);
  EXPECT_THAT(yaml, HasSubstr("[fedcba9876543210, 1.25e-05]"));
  const Cluster back = load_cluster(ConfigNode::parse_string(yaml, "written.yaml"));
  EXPECT_EQ(back.chips[0].kernel_work, c.chips[0].kernel_work);
  EXPECT_TRUE(back.chips[1].kernel_work.empty());
  EXPECT_EQ(back.chips[2].kernel_work, c.chips[2].kernel_work);
  const std::string base = cluster_to_yaml(cluster_of(kSmallCluster));
  const auto error = [&](const std::string& entries) {
    return error_of([&] { load_cluster(ConfigNode::parse_string(base + "kernel_work: " + entries, "k.yaml")); },
                    ErrorCode::kConfig);
  };
  EXPECT_THAT(error("[{chip: W, work: [[fedcba9876543210, 1]]}]"), HasSubstr("unknown chip type 'W'"));
  EXPECT_THAT(error("[{chip: X, work: [[fedcba9876543210, 1]]}, {chip: X, work: [[fedcba9876543210, 1]]}]"),
              HasSubstr("is listed twice"));
  EXPECT_THAT(error("[{chip: X, work: [[fedcba987654321, 1]]}]"), HasSubstr("'fedcba987654321' is not a shape key"));
  EXPECT_THAT(error("[{chip: X, work: [[fedcba987654321g, 1]]}]"), HasSubstr("is not a shape key"));
  EXPECT_THAT(error("[{chip: X, work: [[fedcba9876543210]]}]"), HasSubstr("kernel_work[0].work[0]"));
  EXPECT_THAT(error("[{chip: X, work: [[fedcba9876543210, 0]]}]"), HasSubstr("must be a positive number of seconds"));
}

// A forward GEMM runs matmul_forward_speedup s times the curve's rate, a backward 2 / (3 - 1/s) times it: with
// s = 1.5 a forward of 1 TFLOP at 50 TFLOP/s (X: 100 x 0.5) takes 1/75 s and its backward (2 TFLOP) 2/50 x 7/6 s
// — together 3/50 s, what one rate for both gives — plus 5 us each.
TEST(CostModel, SplitsAGemmsRateBetweenForwardAndBackward) {
  Cluster c = cluster_of(kSmallCluster);
  c.chips[0].matmul_forward_speedup = 1.5;
  const CostModel costs(c, small_model(4), TrainSetup{.global_batch = 8});
  const OpWork forward{"f", OpClass::kMatmul, 1e12, 0, 1}, backward{"b", OpClass::kMatmulBackward, 2e12, 0, 2};
  EXPECT_NEAR(costs.op_s(0, forward), 1.0 / 75 + 5e-6, 1e-12);
  EXPECT_NEAR(costs.op_s(0, backward), 2.0 / 50 * 7 / 6 + 5e-6, 1e-12);
  EXPECT_NEAR(costs.op_s(0, forward) + costs.op_s(0, backward), 3.0 / 50 + 10e-6, 1e-12);
  // The model's backward GEMMs are of that class (so they take the backward's rate), its forward ones are not.
  for (bool backward_ops : {false, true}) {
    for (const std::vector<OpWork>& ops : {block_ops(small_model(4), 1, 1024, 1, 2, 2, backward_ops),
                                           head_ops(small_model(4), 1, 1024, 1, 2, 2, backward_ops)}) {
      for (const OpWork& op : ops) {
        if (op.kind == OpClass::kMatmul || op.kind == OpClass::kMatmulBackward) {
          EXPECT_EQ(op.kind == OpClass::kMatmulBackward, backward_ops) << op.name;
          EXPECT_EQ(op.gemms, backward_ops ? 2 : 1) << op.name;
        }
      }
    }
  }
  // Written and read back; out of range is refused, naming the field.
  const Cluster back = load_cluster(ConfigNode::parse_string(cluster_to_yaml(c), "written.yaml"));
  EXPECT_DOUBLE_EQ(back.chips[0].matmul_forward_speedup, 1.5);
  EXPECT_DOUBLE_EQ(back.chips[1].matmul_forward_speedup, 1.0);
  EXPECT_THAT(error_of(
                  [] {
                    cluster_of(
                        "chips:\n  - {name: X, peak_tflops: 1, memory_gib: 1, memory_bandwidth_gbps: 1, "
                        "matmul_forward_speedup: 0.3}\ngroups: []\n");
                  },
                  ErrorCode::kConfig),
              HasSubstr("field 'chips[0].matmul_forward_speedup': must be in (1/3, 3], got 0.3"));
}

// A GEMM pays for its elements beside its FLOPs, each pass: on X (50 TFLOP/s) with 1, 2 and 3 ns per element of
// input, weight and output, a forward of 100 rows x 10 -> 20 columns takes 40,000 FLOP / 50 TFLOP/s = 0.8 ns plus
// 1 x 1,000 + 2 x 200 + 3 x 2,000 = 7,400 ns, plus 5 us; its backward (two GEMMs) twice both. With a forward
// speedup of 1.5 the forward's share is divided by 1.5 and the backward's by 2 / (3 - 1/1.5) = 6/7.
TEST(CostModel, AGemmPaysForItsElements) {
  Cluster c = cluster_of(kSmallCluster);
  c.chips[0].matmul_element_ns = {1, 2, 3};
  const CostModel costs(c, small_model(4), TrainSetup{.global_batch = 8});
  const OpWork forward{"f", OpClass::kMatmul, 40'000, 0, 1, 100, 10, 20};
  const OpWork backward{"b", OpClass::kMatmulBackward, 80'000, 0, 2, 100, 10, 20};
  EXPECT_NEAR(costs.op_s(0, forward), 0.8e-9 + 7'400e-9 + 5e-6, 1e-15);
  EXPECT_NEAR(costs.op_s(0, backward), 1.6e-9 + 14'800e-9 + 5e-6, 1e-15);
  c.chips[0].matmul_forward_speedup = 1.5;
  const CostModel split(c, small_model(4), TrainSetup{.global_batch = 8});
  EXPECT_NEAR(split.op_s(0, forward), (0.8e-9 + 7'400e-9) / 1.5 + 5e-6, 1e-15);
  EXPECT_NEAR(split.op_s(0, backward), (1.6e-9 + 14'800e-9) * 7 / 6 + 5e-6, 1e-15);
  // The model's GEMMs carry their shapes: a block's c_fc at TP 2 is T rows x C -> 4C / 2, the head's C -> V / 2.
  const TransformerShape m = small_model(4);
  const auto named = [](const std::vector<OpWork>& ops, const std::string& name) {
    for (const OpWork& op : ops) {
      if (op.name == name) return op;
    }
    ADD_FAILURE() << name;
    return OpWork{};
  };
  const OpWork fc = named(block_ops(m, 1, 1024, 2, 2, 2, false), "c_fc");
  EXPECT_EQ(fc.rows, 1024);
  EXPECT_EQ(fc.k, m.hidden);
  EXPECT_EQ(fc.n, m.ffn / 2);
  const OpWork logits = named(head_ops(m, 2, 1024, 2, 2, 2, true), "logits backward");
  EXPECT_EQ(logits.rows, 2048);
  EXPECT_EQ(logits.n, m.vocab / 2.0);
  // Written and read back; a cost below zero, or the size curve that came before, is refused naming the field.
  const Cluster back = load_cluster(ConfigNode::parse_string(cluster_to_yaml(c), "written.yaml"));
  EXPECT_EQ(back.chips[0].matmul_element_ns, (std::array<double, 3>{1, 2, 3}));
  EXPECT_EQ(back.chips[1].matmul_element_ns, (std::array<double, 3>{}));
  const std::string chip = "chips:\n  - {name: X, peak_tflops: 1, memory_gib: 1, memory_bandwidth_gbps: 1, ";
  EXPECT_THAT(error_of([&] { cluster_of(chip + "matmul_element_ns: [1, -2, 3]}\ngroups: []\n"); }, ErrorCode::kConfig),
              HasSubstr("must be a finite number >= 0, got -2"));
  EXPECT_THAT(error_of([&] { cluster_of(chip + "matmul_curve: [[1, 0.5]]}\ngroups: []\n"); }, ErrorCode::kConfig),
              HasSubstr("field 'chips[0].matmul_curve': GEMM efficiency by size was replaced by matmul_element_ns"));
}

// A profiled chip's GEMM of a timed shape takes its figures' time times the correction its profile kept, interpolated
// linearly in rows between the rows timed and held beyond them; other shapes the figures alone. X's forward of 100
// rows x 10 -> 20 takes 0.8 ns + 7,400 ns (above); with corrections 1.2 at 100 rows and 1.6 at 300, at 200 rows
// 1.4 (its FLOPs and its input's and output's elements twice, its weight's alike), at 400 rows 1.6, at 50 rows 1.2.
TEST(CostModel, AProfiledGemmTakesItsShapesCorrection) {
  Cluster c = cluster_of(kSmallCluster);
  c.chips[0].matmul_element_ns = {1, 2, 3};
  c.chips[0].matmul_corrections = {{300, 10, 20, 1.6}, {100, 10, 20, 1.2}, {100, 10, 40, 9}};
  const CostModel costs(c, small_model(4), TrainSetup{.global_batch = 8});
  const auto forward = [&](double rows, double n) {
    return costs.op_s(0, OpWork{"f", OpClass::kMatmul, 2 * rows * 10 * n, 0, 1, rows, 10, n}) - 5e-6;
  };
  EXPECT_NEAR(forward(100, 20), 1.2 * (0.8e-9 + 7'400e-9), 1e-15);
  EXPECT_NEAR(forward(200, 20), 1.4 * (1.6e-9 + 2'000e-9 + 400e-9 + 12'000e-9), 1e-15);
  EXPECT_NEAR(forward(400, 20), 1.6 * (3.2e-9 + 4'000e-9 + 400e-9 + 24'000e-9), 1e-15);
  EXPECT_NEAR(forward(50, 20), 1.2 * (0.4e-9 + 500e-9 + 400e-9 + 3'000e-9), 1e-15);
  EXPECT_NEAR(forward(100, 30), 1.2e-9 + 1'000e-9 + 600e-9 + 9'000e-9, 1e-15);  // a shape not timed
  // The cost model's V / tp need not be whole: a shape within one column of a timed one is that shape.
  EXPECT_NEAR(forward(100, 20.5), 1.2 * (0.82e-9 + 1'000e-9 + 410e-9 + 6'150e-9), 1e-15);
  // Written and read back; a ratio at or below zero, or an entry short of four numbers, is refused naming the field.
  const Cluster back = load_cluster(ConfigNode::parse_string(cluster_to_yaml(c), "written.yaml"));
  ASSERT_EQ(back.chips[0].matmul_corrections.size(), 3u);
  EXPECT_EQ(back.chips[0].matmul_corrections[0].rows, 300);
  EXPECT_EQ(back.chips[0].matmul_corrections[0].ratio, 1.6);
  EXPECT_TRUE(back.chips[1].matmul_corrections.empty());
  const std::string chip = "chips:\n  - {name: X, peak_tflops: 1, memory_gib: 1, memory_bandwidth_gbps: 1, ";
  EXPECT_THAT(
      error_of([&] { cluster_of(chip + "matmul_corrections: [[100, 10, 20, 0]]}\ngroups: []\n"); }, ErrorCode::kConfig),
      HasSubstr("must be a finite number > 0, got 0"));
  EXPECT_THAT(
      error_of([&] { cluster_of(chip + "matmul_corrections: [[100, 10, 20]]}\ngroups: []\n"); }, ErrorCode::kConfig),
      HasSubstr("field 'chips[0].matmul_corrections[0]': is [rows, k, n, ratio]"));
}

// A profiled chip's block and head take their kernels' composition times the correction its profile kept for that
// part and direction at that TP degree, interpolated linearly in rows (held beyond), and the all-reduces as before. X
// with corrections at TP 1: at 1,024 rows (one sequence) the block's forward 0.5 and backward 0.25, the head's forward
// 2 and backward 4; all 1 at 4,096. So at one sequence a block's forward is half the figures', its backward a quarter
// (selective recomputation's attention core is in the backward, so a quarter too; full recomputation's forward again
// takes the forward's half), the head's forward twice and backward four times; at two sequences (2,048 rows, a third
// of the way) the block's forward 2/3 and the head's backward 3; at 8 sequences all the figures'; at TP 2 (not timed)
// the figures' alone.
TEST(CostModel, AProfiledBlockAndHeadTakeTheirPartsCorrectionPerDirection) {
  const Cluster plain = cluster_of(kSmallCluster);
  Cluster c = plain;
  c.chips[0].part_corrections = {{1, 4096, 1.0, 1.0, 1.0, 1.0}, {1, 1024, 0.5, 0.25, 2.0, 4.0}};
  const TrainSetup setup{.global_batch = 8};
  const CostModel before(plain, small_model(4), setup), after(c, small_model(4), setup);
  EXPECT_DOUBLE_EQ(after.layer_forward_s(0, 1, 1), 0.5 * before.layer_forward_s(0, 1, 1));
  for (Recompute r : {Recompute::kNone, Recompute::kSelective}) {
    EXPECT_DOUBLE_EQ(after.layer_backward_s(0, 1, 1, r), 0.25 * before.layer_backward_s(0, 1, 1, r));
  }
  EXPECT_DOUBLE_EQ(after.layer_backward_s(0, 1, 1, Recompute::kFull),
                   0.25 * before.layer_backward_s(0, 1, 1, Recompute::kNone) + 0.5 * before.layer_forward_s(0, 1, 1));
  EXPECT_DOUBLE_EQ(after.head_forward_s(0, 1, 1), 2 * before.head_forward_s(0, 1, 1));
  EXPECT_DOUBLE_EQ(after.head_backward_s(0, 1, 1), 4 * before.head_backward_s(0, 1, 1));
  EXPECT_DOUBLE_EQ(after.layer_forward_s(0, 1, 2), 2.0 / 3 * before.layer_forward_s(0, 1, 2));
  EXPECT_DOUBLE_EQ(after.head_backward_s(0, 1, 2), 3 * before.head_backward_s(0, 1, 2));
  EXPECT_DOUBLE_EQ(after.layer_forward_s(0, 1, 8), before.layer_forward_s(0, 1, 8));
  EXPECT_DOUBLE_EQ(after.head_forward_s(0, 1, 8), before.head_forward_s(0, 1, 8));
  EXPECT_DOUBLE_EQ(after.layer_forward_s(0, 2, 1), before.layer_forward_s(0, 2, 1));
  EXPECT_DOUBLE_EQ(after.layer_forward_s(1, 1, 1), before.layer_forward_s(1, 1, 1));  // Y: none kept
  // At TP 2 the block's TP all-reduces (two per direction) are not corrected: a correction of 0.5 there halves the
  // kernels alone. Y's at TP 2: 1,024 x 2,048 bf16 activations, 4 MiB, ring of two over 50 GB/s: 2 x 1/2 x 4 MiB,
  // and two messages' latency (the default's).
  c.chips[1].part_corrections = {{2, 1024, 0.5, 1.0, 1.0, 1.0}};
  const CostModel tp2(c, small_model(4), setup);
  const double all_reduce = 4194304.0 / 50e9 + 2 * c.group_of(1).intra_node_latency_us * 1e-6;
  EXPECT_NEAR(tp2.layer_forward_s(1, 2, 1), 0.5 * (before.layer_forward_s(1, 2, 1) - 2 * all_reduce) + 2 * all_reduce,
              1e-12);
  // Written and read back; a profile's four numbers (before 2026-12-06: one ratio a part for both directions) read as
  // both directions alike; a TP degree that is not whole, or an entry of another length, is refused naming it.
  const Cluster back = load_cluster(ConfigNode::parse_string(cluster_to_yaml(c), "written.yaml"));
  ASSERT_EQ(back.chips[0].part_corrections.size(), 2u);
  EXPECT_EQ(back.chips[0].part_corrections[1].rows, 1024);
  EXPECT_EQ(back.chips[0].part_corrections[1].block_backward, 0.25);
  EXPECT_EQ(back.chips[0].part_corrections[1].head_forward, 2.0);
  EXPECT_EQ(back.chips[0].part_corrections[1].head_backward, 4.0);
  EXPECT_EQ(back.chips[1].part_corrections[0].tp, 2);
  EXPECT_TRUE(back.chips[2].part_corrections.empty());
  const std::string chip = "chips:\n  - {name: X, peak_tflops: 1, memory_gib: 1, memory_bandwidth_gbps: 1, ";
  const ChipType::PartCorrection old =
      cluster_of(chip +
                 "part_corrections: [[2, 256, 0.5, 3]]}\ngroups:\n  - {chip: X, nodes: 1, "
                 "chips_per_node: 2, intra_node_gbps: 1, nic_gbps: 1}\n")
          .chips[0]
          .part_corrections.at(0);
  EXPECT_EQ(std::vector<double>(
                {old.tp, old.rows, old.block_forward, old.block_backward, old.head_forward, old.head_backward}),
            std::vector<double>({2, 256, 0.5, 0.5, 3, 3}));
  EXPECT_THAT(
      error_of([&] { cluster_of(chip + "part_corrections: [[1.5, 256, 1, 1]]}\ngroups: []\n"); }, ErrorCode::kConfig),
      HasSubstr("field 'chips[0].part_corrections[0][0]': must be a whole TP degree, got 1.5"));
  for (const char* entry : {"[1, 256, 1]", "[1, 256, 1, 1, 1]"}) {
    EXPECT_THAT(
        error_of([&] { cluster_of(chip + "part_corrections: [" + entry + "]}\ngroups: []\n"); }, ErrorCode::kConfig),
        HasSubstr("field 'chips[0].part_corrections[0]': is [tp, rows, block forward, block backward, head "
                  "forward, head backward] (or [tp, rows, block, head])"))
        << entry;
  }
}

// What a run adds to each kernel (run_kernel_us, fitted by h2 calibrate) is charged once to every forward and backward
// kernel of a stage, beside the part's correction rather than scaled by it, and not to the optimizer. Counted by hand
// from gpt.cc: a block runs 10 kernels forward (ln_1, c_attn, attention, c_proj, residual, ln_2, c_fc, GELU, c_proj,
// residual) and 10 backward, 11 with selective recomputation (the attention core again), 20 with full (the forward
// again); the embedding one each way; the head ln_f, the logits and the loss forward, the logits' and ln_f's backward.
TEST(CostModel, ARunsPerKernelCostIsChargedToEachStageKernelNotTheOptimizers) {
  const Cluster plain = cluster_of(kSmallCluster);
  Cluster c = plain;
  c.chips[0].part_corrections = {{1, 1024, 0.5, 0.5, 2.0, 2.0}};
  Cluster with_run = c;
  with_run.chips[0].run_kernel_us = 100;
  const TrainSetup setup{.global_batch = 8};
  const CostModel before(c, small_model(4), setup), after(with_run, small_model(4), setup);
  const double us = 100e-6;
  EXPECT_NEAR(after.layer_forward_s(0, 1, 1), before.layer_forward_s(0, 1, 1) + 10 * us, 1e-12);
  EXPECT_NEAR(after.layer_backward_s(0, 1, 1, Recompute::kNone),
              before.layer_backward_s(0, 1, 1, Recompute::kNone) + 10 * us, 1e-12);
  EXPECT_NEAR(after.layer_backward_s(0, 1, 1, Recompute::kSelective),
              before.layer_backward_s(0, 1, 1, Recompute::kSelective) + 11 * us, 1e-12);
  EXPECT_NEAR(after.layer_backward_s(0, 1, 1, Recompute::kFull),
              before.layer_backward_s(0, 1, 1, Recompute::kFull) + 20 * us, 1e-12);
  EXPECT_NEAR(after.embedding_forward_s(0, 1, 1), before.embedding_forward_s(0, 1, 1) + us, 1e-12);
  EXPECT_NEAR(after.embedding_backward_s(0, 1, 1), before.embedding_backward_s(0, 1, 1) + us, 1e-12);
  EXPECT_NEAR(after.head_forward_s(0, 1, 1), before.head_forward_s(0, 1, 1) + 3 * us, 1e-12);
  EXPECT_NEAR(after.head_backward_s(0, 1, 1), before.head_backward_s(0, 1, 1) + 2 * us, 1e-12);
  EXPECT_DOUBLE_EQ(after.optimizer_s(0, 2, 1e6, 12), before.optimizer_s(0, 2, 1e6, 12));
  EXPECT_DOUBLE_EQ(after.layer_forward_s(1, 1, 1), before.layer_forward_s(1, 1, 1));  // Y: none
  EXPECT_DOUBLE_EQ(load_cluster(ConfigNode::parse_string(cluster_to_yaml(with_run), "w.yaml")).chips[0].run_kernel_us,
                   100);
  EXPECT_EQ(cluster_to_yaml(plain).find("run_kernel_us"), std::string::npos);  // written only where fitted
  EXPECT_THAT(error_of(
                  [&] {
                    cluster_of(
                        "chips:\n  - {name: X, peak_tflops: 1, memory_gib: 1, memory_bandwidth_gbps: 1, "
                        "run_kernel_us: -1}\ngroups: []\n");
                  },
                  ErrorCode::kConfig),
              HasSubstr("chips[0].run_kernel_us"));
}

// Element-wise and row-wise kernels run at elementwise_gbps where a profile measured it (a CPU's caches), else at
// the memory's achievable bandwidth (X: 1,000 GB/s x 0.8); the optimizer always streams at the latter.
TEST(CostModel, ElementwiseKernelsTakeTheirOwnBandwidth) {
  Cluster c = cluster_of(kSmallCluster);
  const OpWork gelu{"gelu", OpClass::kMemory, 0, 1e9};
  EXPECT_NEAR(CostModel(c, small_model(4), TrainSetup{.global_batch = 8}).op_s(0, gelu), 1.0 / 800 + 5e-6, 1e-15);
  c.chips[0].elementwise_gbps = 2000;
  const CostModel costs(c, small_model(4), TrainSetup{.global_batch = 8});
  EXPECT_NEAR(costs.op_s(0, gelu), 1.0 / 2000 + 5e-6, 1e-15);
  const OpWork gemm{"g", OpClass::kMatmul, 1, 1e9, 1, 1, 1, 1};  // memory-bound: the memory's bandwidth
  EXPECT_NEAR(costs.op_s(0, gemm), 1.0 / 800 + 5e-6, 1e-12);
  EXPECT_DOUBLE_EQ(load_cluster(ConfigNode::parse_string(cluster_to_yaml(c), "w.yaml")).chips[0].elementwise_gbps,
                   2000);
}

// The tied embedding's gradient, summed as the runtime sums it: ends of the same DP and TP, each rank with its
// counterpart (its 1/TP of the rows); the same DP but TP 1 and 2, one all-reduce of the whole vocabulary over the
// three ranks. On X (first) and Z (last): 10 GB/s, 10 us; 32,000 x 2,048 rows x 2 bytes (the setup's default
// precision: bf16 as the published systems hold it, bf16 gradients).
TEST(CostModel, TheTiedEmbeddingIsSummedAsTheRuntimeSumsIt) {
  const CostModel costs(cluster_of(kSmallCluster), small_model(2), TrainSetup{.global_batch = 8, .zero1 = false});
  const auto tied = [&](int tp_first, int tp_last) {
    LayoutSpec spec;
    spec.layout.micro_batch = 1;
    spec.layout.stages = {{.chip = 0, .tp = tp_first, .dp = 1}, {.chip = 2, .tp = tp_last, .dp = 1}};
    spec.layers = {1, 1};
    spec.recompute = {{Recompute::kFull}, {Recompute::kFull}};
    return cost_layout(costs, spec).stages.front().tied_allreduce_s;
  };
  const double bytes = 32'000.0 * 2'048 * 2;
  EXPECT_NEAR(tied(2, 2), 2 * 0.5 * bytes / 2 / 10e9 + 2 * 10e-6, 1e-12);  // 2 ranks, half the rows
  EXPECT_NEAR(tied(1, 2), 2 * 2.0 / 3 * bytes / 10e9 + 4 * 10e-6, 1e-12);  // 3 ranks, every row
}

// A stage boundary inside a block: the block's attention half is ln_1, c_attn, the attention core, attn.c_proj and
// a residual (MatchesClosedForms' kernels: 10.496 + 515.396 + 171.799 + 171.799 + 15.729 us + 5 x 5 us = 910.218 us
// on X at TP 1); the MLP half the other five; each half one of the block's two TP all-reduces per direction;
// selective recomputation repeats the attention core in the attention half's backward only, full recomputation each
// half's own forward. The halves add up to the block in every direction and recomputation.
TEST(CostModel, ABlocksHalvesAreItsAttentionAndItsMlp) {
  const CostModel costs(cluster_of(kSmallCluster), small_model(4), TrainSetup{.global_batch = 8, .zero1 = false});
  EXPECT_NEAR(costs.layer_forward_s(0, 1, 1, BlockPart::kAttention), 910.2180992e-6, 1e-12);
  for (int tp : {1, 2}) {
    EXPECT_NEAR(
        costs.layer_forward_s(0, tp, 1, BlockPart::kAttention) + costs.layer_forward_s(0, tp, 1, BlockPart::kMlp),
        costs.layer_forward_s(0, tp, 1), 1e-15);
    for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
      EXPECT_NEAR(costs.layer_backward_s(0, tp, 1, r, BlockPart::kAttention) +
                      costs.layer_backward_s(0, tp, 1, r, BlockPart::kMlp),
                  costs.layer_backward_s(0, tp, 1, r), 1e-15)
          << recompute_name(r);
    }
  }
  // One all-reduce of the (1, 1024, 2048) bf16 activation per half at TP 2 (MatchesClosedForms: two per block).
  EXPECT_NEAR(costs.layer_forward_s(0, 2, 1, BlockPart::kMlp) -
                  costs.ops_s(0, block_ops(small_model(4), 1, 1024, 2, 2, 2, false, BlockPart::kMlp)),
              4194304.0 / 100e9 + 4e-6, 1e-12);
  const auto names = [](BlockPart part, bool backward) {
    std::vector<std::string> n;
    for (const OpWork& op : block_ops(small_model(4), 1, 1024, 1, 2, 2, backward, part)) n.push_back(op.name);
    return n;
  };
  EXPECT_EQ(names(BlockPart::kAttention, false),
            (std::vector<std::string>{"ln_1", "c_attn", "attention", "attn.c_proj", "residual"}));
  EXPECT_EQ(names(BlockPart::kMlp, true), (std::vector<std::string>{"mlp.c_proj backward", "gelu backward",
                                                                    "c_fc backward", "ln_2 backward", "residual"}));
  // Selective recomputation: the attention core's forward again in the attention half, nothing in the MLP half.
  const double core = costs.op_s(0, block_ops(small_model(4), 1, 1024, 1, 2, 2, false)[2]);
  EXPECT_NEAR(costs.layer_backward_s(0, 1, 1, Recompute::kSelective, BlockPart::kAttention) -
                  costs.layer_backward_s(0, 1, 1, Recompute::kNone, BlockPart::kAttention),
              core, 1e-15);
  EXPECT_DOUBLE_EQ(costs.layer_backward_s(0, 1, 1, Recompute::kSelective, BlockPart::kMlp),
                   costs.layer_backward_s(0, 1, 1, Recompute::kNone, BlockPart::kMlp));
}

TEST(CostModel, MatchesClosedForms) {
  const Cluster c = cluster_of(kSmallCluster);
  TrainSetup t{.global_batch = 8, .zero1 = false};
  const CostModel costs(c, small_model(4), t);
  // Ring all-reduce of 1 GB over 4 ranks at 10 GB/s and 5 us: 2 * 3/4 * 0.1 s + 6 * 5 us.
  EXPECT_NEAR(costs.ring_allreduce_s(1e9, 4, 10, 5), 0.15 + 30e-6, 1e-12);
  // A layer at TP 2 without ZeRO: its LayerNorms and two row-parallel biases whole (6 x 2048), the rest halved
  // ((2048 x 6144 + 6144 + 2048^2 + 2 x 2048 x 8192 + 8192) / 2), at 2 + 2 + 12 bytes per parameter (bf16).
  EXPECT_DOUBLE_EQ(costs.stage_memory({.layers = 1, .tp = 2}).state(), 25'185'280.0 * 16);
  // A layer's forward on X at TP 1, b = 1 (T 1024, C 2048, F 8192, bf16), kernel by kernel as max(FLOPs / rate,
  // bytes / bandwidth) + 5 us, with rates 50 TFLOP/s (GEMMs: 100 x 0.5), 25 (attention: half of it) and 800 GB/s:
  //   ln_1 8,396,800 B -> 10.496 us;  c_attn 2 x 1024 x 2048 x 6144 = 25.77 GFLOP -> 515.40 us;
  //   attention 2 x 1024^2 x 2048 = 4.295 GFLOP -> 171.80 us;  attn.c_proj 8.590 GFLOP -> 171.80 us;
  //   residual 12,582,912 B -> 15.73 us;  ln_2 10.496 us;  c_fc 34.36 GFLOP -> 687.19 us;  gelu 33,554,432 B ->
  //   41.94 us;  mlp.c_proj 687.19 us;  residual 15.73 us;  plus 10 x 5 us: 2,377.78 us.
  EXPECT_NEAR(costs.layer_forward_s(0, 1, 1), 2377.77531392e-6, 1e-12);
  // The FLOPs of its kernels are the layer's (Narayanan et al. 2021's count, written once in costs.h).
  double flops = 0;
  for (const OpWork& op : block_ops(small_model(4), 1, 1024, 1, 2, 2, false)) flops += op.flops;
  EXPECT_DOUBLE_EQ(flops, layer_forward_flops(small_model(4), 1024));
  // The attention core: 2 b T^2 C / t FLOPs forward (Q K^T and P V over the causal half), twice that backward.
  for (bool backward : {false, true}) {
    for (const OpWork& op : block_ops(small_model(4), 3, 1024, 2, 2, 2, backward)) {
      if (op.kind == OpClass::kAttention) {
        EXPECT_DOUBLE_EQ(op.flops, (backward ? 2 : 1) * 2.0 * 3 * 1024.0 * 1024 * 2048 / 2);
      }
    }
  }
  // The vocabulary-parallel head at TP 2: the logits of 16,000 of the 32,000 rows, 2 x 1024 x 2048 x 16000 FLOPs.
  for (const OpWork& op : head_ops(small_model(4), 1, 1024, 2, 2, 2, false)) {
    if (op.kind == OpClass::kMatmul) {
      EXPECT_DOUBLE_EQ(op.flops, 67'108'864'000.0);
    }
  }
  // Megatron TP: the (1, 1024, 2048) bf16 activation (4 MiB) all-reduced by a ring of 2 over X's 100 GB/s NVLink
  // with 2 us latency: 2 x 1/2 x 4 MiB / 100 GB/s + 2 x 2 us, twice per layer on top of the kernels.
  EXPECT_NEAR(costs.layer_forward_s(0, 2, 1) - costs.ops_s(0, block_ops(small_model(4), 1, 1024, 2, 2, 2, false)),
              2 * (4194304.0 / 100e9 + 4e-6), 1e-12);
  // Data parallelism: the ring all-reduce of 1e9 bf16 gradients over 4 replicas of Y, 2 per node: the ring leaves
  // each node once, over both of its 10 GB/s NICs (20 GB/s, under the node's 50), with 5 us:
  // 2 x 3/4 x 2 GB / 20 GB/s + 6 x 5 us. At TP 2 each node holds one replica, and the node's two NICs serve two
  // rings (one per TP rank): 10 GB/s each, 2 x 1/2 x 2 GB / 10 GB/s + 2 x 5 us. Three replicas at TP 1 do not fill
  // whole nodes (one node holds one of them): one NIC, 2 x 2/3 x 2 GB / 10 GB/s + 4 x 5 us.
  EXPECT_NEAR(costs.dp_allreduce_s(1, 1, 4, 1e9), 0.15 + 30e-6, 1e-12);
  EXPECT_NEAR(costs.dp_allreduce_s(1, 2, 2, 1e9), 0.2 + 10e-6, 1e-12);
  EXPECT_NEAR(costs.dp_allreduce_s(1, 1, 3, 1e9), 0.8 / 3 + 20e-6, 1e-12);
  // The optimizer: 28 bytes per parameter (bf16, no ZeRO) at 500 x 0.8 GB/s, plus a norm and an AdamW kernel per
  // tensor and one clipping kernel at 5 us each: 1e9 x 28 / 400e9 + 25 x 5 us for 12 tensors.
  EXPECT_NEAR(costs.optimizer_s(1, 4, 1e9, 12), 0.07 + 125e-6, 1e-12);
  // Host-staged transfers pay two host-link copies on top of the link (X -> Y has no device-direct path).
  const double bytes = 1024.0 * 2048 * 2;
  EXPECT_NEAR(costs.transfer_s(0, 1, 1, 1, 1), 10e-6 + bytes / 5e9 + 2 * bytes / 25e9, 1e-12);
  EXPECT_NEAR(costs.transfer_s(0, 1, 2, 1, 1), 10e-6 + bytes / 10e9, 1e-12);
  // Partitioned at TP 2 -> TP 2 (X -> Z, device-direct): each sender sends half (2 MiB) over the 10 GB/s link, then
  // Z's pair all-gathers the 4 MiB over its 80 GB/s NVLink with 2 us: 1/2 x 4 MiB / 80 GB/s + 2 us.
  EXPECT_NEAR(costs.transfer_s(0, 2, 2, 2, 1), 10e-6 + bytes / 2 / 10e9 + bytes / 2 / 80e9 + 2e-6, 1e-12);
  // TP 1 -> TP 2: the one sender sends both halves.
  EXPECT_NEAR(costs.transfer_s(0, 1, 2, 2, 1), 10e-6 + bytes / 10e9 + bytes / 2 / 80e9 + 2e-6, 1e-12);
}

// A split backward's W (schedule.h) runs one of each GEMM backward's two products (dW = X^T dY, the FLOPs of dX):
// on X at TP 1, b = 1 (T 1024, C 2048, F 8192), the block's four GEMMs' forward FLOPs — c_attn 25,769,803,776,
// attn.c_proj 8,589,934,592, c_fc and mlp.c_proj 34,359,738,368 each: 103,079,215,104 — at 50 TFLOP/s, plus half of
// each backward kernel's 5 us; the head's logits 2 x 1024 x 2048 x 32000 the same way. The embedding's backward is
// all weight gradient, and a plan's stage carries the sum of its pieces'.
TEST(CostModel, AWeightGradientIsOneOfEachGemmBackwardsTwoProducts) {
  const CostModel costs(cluster_of(kSmallCluster), small_model(4), TrainSetup{.global_batch = 8, .zero1 = false});
  EXPECT_NEAR(costs.layer_weight_s(0, 1, 1), 103'079'215'104.0 / 50e12 + 4 * 2.5e-6, 1e-12);
  EXPECT_NEAR(costs.head_weight_s(0, 1, 1), 134'217'728'000.0 / 50e12 + 2.5e-6, 1e-12);
  EXPECT_NEAR(costs.layer_weight_s(0, 1, 1, BlockPart::kAttention) + costs.layer_weight_s(0, 1, 1, BlockPart::kMlp),
              costs.layer_weight_s(0, 1, 1), 1e-12);
  EXPECT_LT(costs.layer_weight_s(0, 1, 1), costs.layer_backward_s(0, 1, 1, Recompute::kNone) / 2);
  const CostModel::PieceTimes& t = costs.piece_times(1, 2, 1);
  EXPECT_DOUBLE_EQ(t.embedding_weight_s, t.embedding_backward_s);
  // What waits for a deferred W, per micro-batch (bf16, TP 2, one sequence of 1,024): each block's four GEMM output
  // gradients, 6144 / 2 + 2048 + 8192 / 2 + 2048 = 11,264 bf16 values a token (23,068,672 bytes a block), and the
  // embedding's input gradient in f32 (8,388,608); an MLP half its two, (4096 + 2048) x 2 x 1024.
  const StageMemorySpec spec{
      .shape = small_model(4), .embedding = true, .layers = 3, .tp = 2, .bytes = ElementBytes::h2_bf16()};
  EXPECT_DOUBLE_EQ(weight_pending_bytes(spec), 3 * 23'068'672.0 + 8'388'608);
  EXPECT_DOUBLE_EQ(
      weight_pending_bytes(
          {.shape = small_model(4), .layers = 1, .starts_at_mlp = true, .tp = 2, .bytes = ElementBytes::h2_bf16()}),
      12'582'912.0);
  const Plan plan = plan_training(costs, PlannerOptions{});
  for (const StagePlan& st : plan.stages) {
    ASSERT_TRUE(st.groups.empty());
    const CostModel::PieceTimes& p = costs.piece_times(st.chip_index, st.tp, plan.dp * plan.micro_batch / st.dp);
    const double whole = st.layers - st.starts_at_mlp - st.ends_at_attention;
    EXPECT_NEAR(st.weight_s,
                whole * p.layer_weight_s + st.starts_at_mlp * p.mlp_weight_s +
                    st.ends_at_attention * p.attention_weight_s + st.embedding * p.embedding_weight_s +
                    st.head * p.head_weight_s,
                1e-12)
        << st.chip;
    EXPECT_LT(st.weight_s, st.backward_s);
  }
}

// The head alone on chips too small to hold it beside a layer. The local emulated cluster as it was until 2026-12-04,
// in bf16 as H2's runtime holds it (18 bytes per parameter): the fast chips (0.15 GiB) hold half the 50,257 x 256 table
// and its logits (136.6 MiB of 145.9 usable) but not one block more, so every layout ending on them fails its split
// unless the search tries that end as a vocabulary-only stage itself — the vocabulary phase only takes apart layouts
// that fit. It did not, and planned the fast chips with the embedding and three blocks at 1.7x the step time.
TEST(Search, TriesTheHeadAloneWhereItFitsOnlyAlone) {
  const Cluster cluster = cluster_of(R"(
name: local
chips:
  - {name: fast, peak_tflops: 0.2, efficiency: 0.5, memory_gib: 0.15, memory_bandwidth_gbps: 8}
  - {name: slow, peak_tflops: 0.1, efficiency: 0.5, memory_gib: 1.0, memory_bandwidth_gbps: 4}
groups:
  - {chip: fast, nodes: 1, chips_per_node: 2, intra_node_gbps: 5, nic_gbps: 5}
  - {chip: slow, nodes: 1, chips_per_node: 2, intra_node_gbps: 5, nic_gbps: 5}
links:
  - {between: [fast, slow], bandwidth_gbps: 5, latency_us: 20, device_direct: false}
)");
  const TransformerShape model = load_model(
      ConfigNode::parse_string("layers: 4\nhidden: 256\nheads: 4\nvocab: 50257\nseq_len: 256\n", "model_small.yaml"));
  const CostModel costs(cluster, model,
                        TrainSetup{.global_batch = 8,
                                   .precision = Precision::kBf16,
                                   .h2_runtime = true,
                                   .zero1 = false,
                                   .micro_batches = {1, 2, 4}});
  const Plan plan = plan_training(costs, PlannerOptions{});
  const StagePlan& last = plan.stages.back();
  EXPECT_EQ(last.chip, "fast") << format_plan(plan);
  EXPECT_EQ(last.layers, 0) << format_plan(plan);
  EXPECT_TRUE(last.head);
  EXPECT_TRUE(plan.fits);
  // What a block beside the head would need there: more than the chip has (the reason the split failed).
  StageMemorySpec spec{.embedding = false,
                       .head = true,
                       .layers = 1,
                       .rows = 1,
                       .tp = last.tp,
                       .recompute = Recompute::kFull,
                       .in_flight = 1};
  EXPECT_GT(costs.stage_memory(spec).total(), last.capacity_bytes);
}

// The built-in example (h2 train with no arguments) is built so that heterogeneity pays and the plan has a baseline
// to be measured against (docs/pipeline.md): the fast chips cannot hold the model alone, the uniform split (2 + 2
// blocks) fits only by recomputing everything on the fast chips, and the plan, which keeps the blocks off them, is
// faster than that split.
TEST(BuiltInExample, UniformSplitFitsOnlyByRecomputingEverythingOnTheFastChips) {
  const Example example = load_example("cluster_local.yaml", "model_small.yaml", "train_local.yaml");
  const Cluster& cluster = example.cluster;
  const TransformerShape& model = example.model;
  TrainSetup setup = example.train;
  const int fast = cluster.chip_index("fast");
  EXPECT_THAT(
      error_of([&] { plan_training(CostModel(cluster.only(fast), model, setup), {}); }, ErrorCode::kInvalidArgument),
      HasSubstr("the model fits nowhere on cluster local-emu/fast: the 1 stage holds at most 2 of 4 layers in memory "
                "even with full recomputation. Hint: add devices, or devices with more memory (with zero1: true in "
                "the train file the search found no plan either)"));
  const CostModel costs(cluster, model, setup);
  const Plan plan = plan_training(costs, PlannerOptions{.interleave = false});
  const std::optional<Plan> uniform = plan_uniform(costs, layout_of(plan, cluster));
  ASSERT_TRUE(uniform.has_value()) << format_plan(plan);
  ASSERT_EQ(uniform->stages.size(), 2u);
  EXPECT_EQ(uniform->stages[1].chip, "fast");
  EXPECT_EQ(uniform->stages[1].layers, 2);
  EXPECT_EQ(uniform->stages[1].recompute, Recompute::kFull);
  EXPECT_EQ(uniform->stages[1].recompute_blocks, -1);  // both blocks, not only the first
  EXPECT_LT(plan.step_s, uniform->step_s);
  setup.allowed_recompute = {Recompute::kNone, Recompute::kSelective};
  EXPECT_FALSE(plan_uniform(CostModel(cluster, model, setup), layout_of(plan, cluster)).has_value());
}

// The hint names what the setup does not already do by its field in the train file, and says which of them the search
// then finds a plan with (it suggested allowing full recomputation beside "even with full recomputation", and ZeRO-1
// on the built-in example's fast chips, which does not make them fit); which of equally short layouts the error names
// does not depend on how the search's threads ran.
TEST(Search, FitsNowhereHintsAtWhatWouldMakeItFit) {
  const Example example = load_example("cluster_local.yaml", "model_small.yaml", "train_local.yaml");
  const Cluster fast = example.cluster.only(example.cluster.chip_index("fast"));
  TrainSetup setup = example.train;
  setup.allowed_recompute = {Recompute::kNone, Recompute::kSelective};
  setup.zero1 = true;
  setup.micro_batches = {2, 4};
  setup.max_tp = 1;
  // Four blocks: nothing the train file can change makes them fit on the fast chips (2 at most).
  const CostModel four(fast, example.model, setup);
  const std::string one = error_of([&] { plan_training(four, {.threads = 1}); }, ErrorCode::kInvalidArgument);
  EXPECT_THAT(one, HasSubstr(". Hint: add devices, or devices with more memory (with recompute: [none, selective, "
                             "full], micro_batches: [1, ...] or max_tp: 0 in the train file the search found no plan "
                             "either)"));
  for (int threads : {2, 8}) {
    EXPECT_EQ(error_of([&] { plan_training(four, {.threads = threads}); }, ErrorCode::kInvalidArgument), one);
  }
  // Fewer blocks fit with some of them: full recomputation alone, or only together with a micro-batch of 1 (each
  // alone is not enough), or a micro-batch of 1 and TP 2 but not full recomputation, which the hint leaves out; TP 2
  // is the most a node of two chips allows, so max_tp: 2 is no limit to lift.
  const auto hint = [&](int layers, std::vector<int> micro_batches, int max_tp) {
    TransformerShape model = example.model;
    model.layers = layers;
    TrainSetup s = setup;
    s.micro_batches = std::move(micro_batches);
    s.max_tp = max_tp;
    const std::string error =
        error_of([&] { plan_training(CostModel(fast, model, s), {}); }, ErrorCode::kInvalidArgument);
    return error.substr(error.find("Hint: "));
  };
  EXPECT_EQ(hint(2, {1, 2, 4}, 2), "Hint: it fits with recompute: [none, selective, full] in the train file");
  EXPECT_EQ(hint(2, {2, 4}, 2),
            "Hint: it fits with recompute: [none, selective, full] and micro_batches: [1, ...] in the train file");
  EXPECT_EQ(hint(1, {2, 4}, 1), "Hint: it fits with micro_batches: [1, ...] and max_tp: 0 in the train file");
  // The reference: the planner itself on the setups the hints speak of, edited by hand — each hint's fixes together
  // fit, and each without one of them (even with full recomputation, where that is not among them) does not.
  const auto fits = [&](int layers, std::vector<int> micro_batches, int max_tp, bool full) {
    TransformerShape model = example.model;
    model.layers = layers;
    TrainSetup s = setup;
    s.micro_batches = std::move(micro_batches);
    s.max_tp = max_tp;
    if (full) s.allowed_recompute.push_back(Recompute::kFull);
    try {
      plan_training(CostModel(fast, model, s), {});
      return true;
    } catch (const Error&) {
      return false;
    }
  };
  EXPECT_TRUE(fits(2, {1, 2, 4}, 2, true));
  EXPECT_FALSE(fits(2, {2, 4}, 2, true));
  EXPECT_FALSE(fits(2, {1, 2, 4}, 2, false));
  EXPECT_TRUE(fits(1, {1, 2, 4}, 0, false));
  EXPECT_FALSE(fits(1, {1, 2, 4}, 1, true));
  EXPECT_FALSE(fits(1, {2, 4}, 0, true));
  EXPECT_FALSE(fits(4, {1, 2, 4}, 0, true));
}

TEST(Search, FitsNowhereSaysWhyAndByHowMuch) {
  TransformerShape huge = small_model(40);
  huge.hidden = 16384;
  huge.heads = 16;
  huge.kv_heads = 16;
  huge.ffn = 65536;
  const CostModel costs(cluster_of(kSmallCluster), huge, TrainSetup{.global_batch = 8});
  const std::string msg = error_of([&] { plan_training(costs, PlannerOptions{}); }, ErrorCode::kInvalidArgument);
  EXPECT_THAT(msg, HasSubstr("the model fits nowhere on cluster small"));
  EXPECT_THAT(msg, ::testing::AnyOf(HasSubstr("short by"), HasSubstr("need more memory")));
}

// On the 1,024-chip example the uniform split of the plan's devices fits and is slower, and the mixed plan is at
// least as fast as each chip type alone (the search's space includes every single-type layout, so a mixed plan
// slower than one of them would be a search that missed it).
TEST_F(Hetero1024, UniformSplitIsSlowerAndNoTypeAloneIsFaster) {
  const CostModel costs(cluster_, model_, train_);
  const Plan plan = plan_training(costs, PlannerOptions{.finest_tier = "greedy"});
  const std::optional<Plan> uniform = plan_uniform(costs, layout_of(plan, cluster_));
  ASSERT_TRUE(uniform.has_value());
  EXPECT_GT(uniform->step_s, plan.step_s * 1.2);
  for (int k = 0; k < 4; ++k) {
    const Plan alone = plan_training(CostModel(cluster_.only(k), model_, train_), {.finest_tier = "greedy"});
    EXPECT_EQ(alone.devices_total, cluster_.devices_of(k));
    EXPECT_GE(plan.tokens_per_s, alone.tokens_per_s) << cluster_.chips[static_cast<size_t>(k)].name;
  }
}

// The search's threads reach the layouts in an order that changes from run to run; the plan must not. Each chip
// type of the 1,024-chip example alone, planned with 1, 2, 3 and 8 threads and with 8 again, gives one plan: the
// same plan.json but for its why (whose counts of layouts costed do vary). Pruned by the fastest plan found so far
// (before 2026-12-06), A alone came out at 43,177 or 43,422 tokens/s depending on the run.
TEST_F(Hetero1024, ThePlanDoesNotDependOnHowTheThreadsRan) {
  for (int k = 0; k < 4; ++k) {
    const CostModel costs(cluster_.only(k), model_, train_);
    std::string first;
    for (int threads : {1, 2, 3, 8, 8}) {
      Plan plan = plan_training(costs, PlannerOptions{.threads = threads});
      plan.why.clear();
      const std::string json = plan.to_json();
      if (first.empty()) first = json;
      EXPECT_EQ(json, first) << cluster_.chips[static_cast<size_t>(k)].name << " alone, " << threads << " threads";
    }
  }
}

// The search keeps each stage's memory terms by what they depend on (PlannerOptions::memory_cache); computed afresh
// for every stage, they give the same plans: the 1,024-chip examples (4 types; catalog chips) with whole blocks and
// interleaving, where stages of 2 chunks keep different micro-batches in flight per chunk, and with half-blocks. (A
// key without the chunks' micro-batches in flight gave the catalog example another interleaved plan, 2026-12-07.)
TEST_F(Hetero1024, TheSearchsMemoryCacheGivesThePlansOfFreshTerms) {
  const Cluster catalog = load_cluster_arg(std::string(H2_SOURCE_DIR) + "/examples/cluster_catalog1024.yaml");
  for (const Cluster* cluster : {static_cast<const Cluster*>(&cluster_), &catalog}) {
    for (const bool split : {false, true}) {
      std::string plans[2];
      for (const bool cached : {false, true}) {
        Plan plan = plan_training(CostModel(*cluster, model_, train_),
                                  PlannerOptions{.split_blocks = split, .memory_cache = cached});
        plan.why.clear();
        plans[cached] = plan.to_json();
      }
      EXPECT_EQ(plans[1], plans[0]) << cluster->name << (split ? ", half-blocks" : ", whole blocks");
    }
  }
}

// The search tries a tier only when it can finish it: on the 1,024-chip example (4 types) the coarse tier completes;
// on 1,024 chips of 8 types its 13 options per type (two TPs x six stage counts, or none) make 13^8 x 2 orders
// per (DP, micro-batch) pair, so the greedy tier's plan stands, at once and said so, instead of the coarse tier
// running into the time budget.
TEST_F(Hetero1024, LeavesOutATierTooLargeToFinish) {
  SearchStats four;
  plan_training(CostModel(cluster_, model_, train_), PlannerOptions{.time_budget_s = 60}, &four);
  EXPECT_EQ(four.tier, "coarse");
  EXPECT_FALSE(four.budget_exhausted);
  std::string yaml = "name: eight\nchips:\n", groups = "groups:\n", links = "links:\n";
  for (int i = 0; i < 8; ++i) {
    const std::string name = cat("T", i);
    yaml += cat("  - {name: ", name, ", peak_tflops: ", 150 + 100 * i, ", memory_gib: ", 24 + 16 * (i % 4),
                ", memory_bandwidth_gbps: 2000}\n");
    groups += cat("  - {chip: ", name, ", nodes: 16, chips_per_node: 8, intra_node_gbps: 200, nic_gbps: 25}\n");
    for (int j = i + 1; j < 8; ++j) links += cat("  - {between: [", name, ", T", j, "], bandwidth_gbps: 12.5}\n");
  }
  const Cluster eight = load_cluster(ConfigNode::parse_string(yaml + groups + links, "<eight>"));
  SearchStats stats;
  const Plan plan = plan_training(CostModel(eight, model_, train_), PlannerOptions{.time_budget_s = 60}, &stats);
  EXPECT_EQ(stats.tier, "greedy");
  EXPECT_FALSE(stats.budget_exhausted);
  EXPECT_THAT(plan.why, HasSubstr("the coarse tier's"));
  EXPECT_THAT(plan.why, HasSubstr("layouts were not enumerated (too many to finish)"));
}

// The baselines h2 plan --compare and h2 train print: each type alone planned by the same search, and the
// heterogeneous speed-up as the plan's throughput over their sum, worked out here from the parts.
TEST(Report, BaselinesAndTheHeterogeneousSpeedup) {
  const Cluster c = cluster_of(kSmallCluster);
  const CostModel costs(c, small_model(6), TrainSetup{.global_batch = 16});
  const Plan plan = plan_training(costs, PlannerOptions{});
  const Baselines b = plan_baselines(costs, plan, PlannerOptions{});
  ASSERT_EQ(b.alone.size(), 3u);
  // X alone (2 devices of 2 GiB) cannot hold the model; Y and Z can.
  EXPECT_FALSE(b.alone[0].plan.has_value());
  EXPECT_THAT(b.alone[0].failure, HasSubstr("fits nowhere on cluster small/X"));
  double sum = 0;
  for (int k = 1; k < 3; ++k) {
    const Plan alone = plan_training(CostModel(c.only(k), small_model(6), TrainSetup{.global_batch = 16}), {});
    ASSERT_TRUE(b.alone[static_cast<size_t>(k)].plan.has_value());
    EXPECT_DOUBLE_EQ(b.alone[static_cast<size_t>(k)].plan->tokens_per_s, alone.tokens_per_s);
    sum += alone.tokens_per_s;
  }
  EXPECT_DOUBLE_EQ(b.heterogeneous_speedup, plan.tokens_per_s / sum);
  ASSERT_TRUE(b.uniform.has_value());
  const std::string text = format_baselines(b, plan);
  EXPECT_THAT(text, HasSubstr("uniform layer split, same devices"));
  EXPECT_THAT(text, HasSubstr("Y alone (4 devices)"));
  // Where the mix gains: each type's part of the plan, counted here from the plan's stages.
  for (const char* chip : {"X", "Y", "Z"}) {
    int stages = 0, layers = 0, recomputing = 0, blocks = 0;
    for (const StagePlan& s : plan.stages) {
      if (s.chip != chip) continue;
      ++stages;
      layers += s.layers;
      recomputing += s.recompute != Recompute::kNone;
      if (s.recompute != Recompute::kNone) blocks += s.recompute_blocks >= 0 ? s.recompute_blocks : s.layers;
    }
    const std::string want = stages == 0 ? cat(chip, "        mixed: unused")
                                         : cat(chip, "        mixed: ", stages, " stage(s), ", layers, " layer(s)");
    EXPECT_THAT(text, HasSubstr(want));
    if (stages > 0) {
      EXPECT_THAT(text, HasSubstr(cat("recomputing on ", recomputing, " (", blocks, " block(s))")));
    }
  }
  EXPECT_THAT(text, HasSubstr("alone: does not fit"));  // X
  EXPECT_THAT(format_plan(plan), HasSubstr(cat(plan.stages.size(), " stages")));
}

// What does this layout cost? The search's own best layout, written out and costed as given, is the search's plan;
// costed again with a chip twice as fast, its compute halves (a plan is re-costed, not replayed from its times).
TEST(Layout, CostingTheSearchsLayoutGivesTheSearchsPlanAndFiguresChangeIt) {
  const Cluster c = cluster_of(kSmallCluster);
  const TrainSetup setup{.global_batch = 16, .micro_batches = {1, 2}};
  const CostModel costs(c, small_model(6), setup);
  const Plan plan = plan_training(costs, PlannerOptions{});
  const Plan again = cost_layout(costs, layout_spec_of(plan, costs));
  EXPECT_DOUBLE_EQ(again.step_s, plan.step_s);
  ASSERT_EQ(again.stages.size(), plan.stages.size());
  for (size_t i = 0; i < plan.stages.size(); ++i) {
    EXPECT_DOUBLE_EQ(again.stages[i].memory_bytes, plan.stages[i].memory_bytes) << i;
    EXPECT_EQ(again.stages[i].recompute, plan.stages[i].recompute) << i;
  }
  Cluster faster = c;
  for (ChipType& t : faster.chips) t.peak_tflops *= 2;
  const Plan recosted = cost_layout(CostModel(faster, small_model(6), setup), layout_spec_of(plan, costs));
  EXPECT_LT(recosted.step_s, 0.75 * plan.step_s);
}

TEST(Layout, FileErrorsNameTheFieldAndALayoutThatDoesNotFitSaysSo) {
  const CostModel costs(cluster_of(kSmallCluster), small_model(6), TrainSetup{.global_batch = 16});
  const auto load = [&](const std::string& yaml) {
    return load_layout(ConfigNode::parse_string(yaml, "layout.yaml"), costs);
  };
  const std::string two = "stages:\n  - {chip: Y, tp: 2, layers: 3}\n  - {chip: Z, tp: 2, layers: 3}\n";
  EXPECT_EQ(load(two).layers, (std::vector<int>{3, 3}));
  EXPECT_THAT(error_of([&] { load("stages:\n  - {chip: Q, layers: 6}\n"); }, ErrorCode::kConfig),
              HasSubstr("layout.yaml:2:12: field 'stages[0].chip': unknown chip type 'Q'"));
  EXPECT_THAT(error_of([&] { load("stages:\n  - {chip: Y, tp: 3, layers: 6}\n"); }, ErrorCode::kConfig),
              HasSubstr("field 'stages[0].tp': TP 3 does not divide the model's 16 heads"));
  EXPECT_THAT(error_of([&] { load("stages:\n  - {chip: Y, tp: 4, layers: 6}\n"); }, ErrorCode::kConfig),
              HasSubstr("TP 4 exceeds the 2 chips of a node of Y"));
  EXPECT_THAT(error_of([&] { load("stages:\n  - {chip: Y, layers: 5}\n"); }, ErrorCode::kConfig),
              HasSubstr("the stages hold 5 layers; the model has 6"));
  EXPECT_THAT(error_of([&] { load("dp: 3\nstages:\n  - {chip: Y, layers: 6}\n"); }, ErrorCode::kConfig),
              HasSubstr("3 pipelines x 1 sequences do not divide the global batch of 16"));
  EXPECT_THAT(error_of([&] { load("dp: 8\nstages:\n  - {chip: Y, layers: 6}\n"); }, ErrorCode::kConfig),
              HasSubstr("the stages use 8 devices of Y; the cluster has 4"));
  EXPECT_THAT(error_of([&] { load("schedule: interleaved\nchunks: 4\n" + two); }, ErrorCode::kConfig),
              HasSubstr("4 chunks, but a stage has 3 layers"));
  EXPECT_THAT(error_of([&] { load("schedule: zigzag\n" + two); }, ErrorCode::kConfig),
              HasSubstr("unknown schedule 'zigzag'"));
  EXPECT_THAT(error_of([&] { load("stages:\n  - {chip: Y, tp: 2, layers: 2.3}\n"); }, ErrorCode::kConfig),
              HasSubstr("field 'stages[0].layers': must be a whole or half number of layers in [0, 6], got 2.3"));
  EXPECT_THAT(error_of([&] { load("stages:\n  - {chip: Y, tp: 2, layers: 2.5}\n  - {chip: Z, tp: 2, layers: 3}\n"); },
                       ErrorCode::kConfig),
              HasSubstr("the stages hold 5.5 layers; the model has 6"));
  EXPECT_THAT(error_of(
                  [&] {
                    load(
                        "schedule: interleaved\nchunks: 2\nstages:\n  - {chip: Y, tp: 2, layers: 2.5}\n"
                        "  - {chip: Z, tp: 2, layers: 3.5}\n");
                  },
                  ErrorCode::kConfig),
              HasSubstr("interleaved stages hold whole blocks"));
  // zb-h1: costed as 1F1B, then each backward split where memory holds it — the same layout's 1F1B plan with ZB-H1
  // (as_zero_bubble, replayed); a stage that recomputes in full keeps its backward whole, 1F1B's plan with a note.
  const std::string zb_stages =
      "stages:\n  - {chip: Y, tp: 2, layers: 3, recompute: none}\n"
      "  - {chip: Z, tp: 2, layers: 3, recompute: none}\n";
  const Plan zb = cost_layout(costs, load("schedule: zb-h1\n" + zb_stages));
  Plan want = *as_zero_bubble(cost_layout(costs, load(zb_stages)));
  score_by_replay(costs, want);
  EXPECT_EQ(zb.schedule, ScheduleKind::kZeroBubbleH1);
  EXPECT_DOUBLE_EQ(zb.step_s, want.step_s);
  for (size_t i = 0; i < 2; ++i) EXPECT_DOUBLE_EQ(zb.stages[i].memory_bytes, want.stages[i].memory_bytes) << i;
  const Plan whole =
      cost_layout(costs, load("schedule: zb-h1\nstages:\n  - {chip: Y, tp: 2, layers: 6, recompute: full}\n"));
  EXPECT_EQ(whole.schedule, ScheduleKind::k1F1B);
  EXPECT_THAT(whole.why, HasSubstr("zb-h1 asked for, but no stage splits its backward"));
  // All six layers on the 2 GiB chip X: costed anyway, and said not to fit.
  const Plan over = cost_layout(costs, load("stages:\n  - {chip: X, tp: 2, layers: 6, recompute: none}\n"));
  EXPECT_FALSE(over.fits);
  EXPECT_THAT(over.limited_by, HasSubstr("DOES NOT FIT: stage 0 (X, TP 2) with 6 layers needs"));
  EXPECT_GT(over.stages[0].memory_bytes, over.stages[0].capacity_bytes);
  EXPECT_THAT(format_plan(over), HasSubstr("DOES NOT FIT"));
  // Stages meeting inside a block: 2.5 layers then 3.5 split block 2 — its attention half on the first stage, its
  // MLP half on the second; each stage's time lies between its whole blocks' and one block more's.
  const Plan halves = cost_layout(costs, load("stages:\n  - {chip: Y, tp: 2, layers: 2.5, recompute: none}\n"
                                              "  - {chip: Z, tp: 2, layers: 3.5, recompute: none}\n"));
  ASSERT_EQ(halves.stages.size(), 2u);
  const StagePlan &h0 = halves.stages[0], &h1 = halves.stages[1];
  EXPECT_EQ(h0.first_layer, 0);
  EXPECT_EQ(h0.layers, 3);
  EXPECT_TRUE(h0.ends_at_attention);
  EXPECT_FALSE(h0.starts_at_mlp);
  EXPECT_EQ(h1.first_layer, 2);
  EXPECT_EQ(h1.layers, 4);
  EXPECT_TRUE(h1.starts_at_mlp);
  EXPECT_FALSE(h1.ends_at_attention);
  EXPECT_NO_THROW(Plan::from_json(halves.to_json(), "p.json"));  // the plan checker takes it
  const Plan two_four = cost_layout(costs, load("stages:\n  - {chip: Y, tp: 2, layers: 2, recompute: none}\n"
                                                "  - {chip: Z, tp: 2, layers: 4, recompute: none}\n"));
  const Plan three_three = cost_layout(costs, load("stages:\n  - {chip: Y, tp: 2, layers: 3, recompute: none}\n"
                                                   "  - {chip: Z, tp: 2, layers: 3, recompute: none}\n"));
  EXPECT_GT(h0.forward_s, two_four.stages[0].forward_s);
  EXPECT_LT(h0.forward_s, three_three.stages[0].forward_s);
  EXPECT_GT(h1.forward_s, three_three.stages[1].forward_s);
  EXPECT_LT(h1.forward_s, two_four.stages[1].forward_s);
  // Full recomputation of the first 2 of a stage's 3 blocks only: by hand, the backward is none's plus 2/3 of what
  // recomputing all 3 adds (a recomputed block repeats its forward), and the plan goes to JSON and back with it.
  const auto three = [&](const std::string& recompute) {
    return cost_layout(costs, load("stages:\n  - {chip: Y, tp: 2, layers: 3, " + recompute +
                                   "}\n  - {chip: Z, tp: 2, layers: 3, recompute: none}\n"));
  };
  const Plan part = three("recompute: full, recompute_blocks: 2"), none = three("recompute: none"),
             full = three("recompute: full");
  EXPECT_EQ(part.stages[0].recompute_blocks, 2);
  EXPECT_NEAR(part.stages[0].backward_s,
              none.stages[0].backward_s + 2.0 / 3 * (full.stages[0].backward_s - none.stages[0].backward_s), 1e-12);
  EXPECT_LT(part.stages[0].memory_bytes, none.stages[0].memory_bytes);
  EXPECT_GT(part.stages[0].memory_bytes, full.stages[0].memory_bytes);
  EXPECT_THAT(format_plan(part), HasSubstr("full:2"));
  EXPECT_EQ(Plan::from_json(part.to_json(), "p.json").stages[0].recompute_blocks, 2);
  EXPECT_EQ(three("recompute: full, recompute_blocks: 3").stages[0].recompute_blocks, -1);  // all of them
  EXPECT_THAT(error_of([&] { three("recompute_blocks: 2"); }, ErrorCode::kConfig),
              HasSubstr("field 'stages[0].recompute_blocks': needs recompute: selective or full"));
  EXPECT_THAT(error_of([&] { three("recompute: full, recompute_blocks: 0"); }, ErrorCode::kConfig),
              HasSubstr("field 'stages[0].recompute_blocks': must be a positive integer, got 0"));
  EXPECT_THAT(error_of(
                  [&] {
                    load(
                        "schedule: interleaved\nchunks: 3\nstages:\n  - {chip: Y, tp: 2, layers: 3, "
                        "recompute: full, recompute_blocks: 1}\n  - {chip: Z, tp: 2, layers: 3}\n");
                  },
                  ErrorCode::kConfig),
              HasSubstr("recompute_blocks': is for stages of one chunk, not interleaved"));
  // Interleaved: the planner's step is the replay's.
  const Plan inter = cost_layout(costs, load("schedule: interleaved\nchunks: 3\n" + two));
  EXPECT_EQ(inter.schedule, ScheduleKind::kInterleaved);
  EXPECT_DOUBLE_EQ(inter.step_s, end_of_step(inter, replay_plan(inter).finish).step_s);
}

// The blocks each virtual stage holds, by hand: stages of 3 and 2 layers in 2 chunks split 1 + 2 and 1 + 1;
// virtual stages 0, 1, 2, 3 are stage 0's first chunk, stage 1's first, stage 0's second, stage 1's second.
TEST(Plan, VirtualStagesRunThroughTheBlocksChunkByChunk) {
  Plan plan;
  plan.chunks = 2;
  plan.stages = {StagePlan{.first_layer = 0, .layers = 3, .embedding = true},
                 StagePlan{.first_layer = 3, .layers = 2, .head = true}};
  const std::vector<ChunkLayers> v = virtual_stages(plan);
  ASSERT_EQ(v.size(), 4u);
  const int first[] = {0, 1, 2, 4}, layers[] = {1, 1, 2, 1};
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(v[k].first_layer, first[k]) << k;
    EXPECT_EQ(v[k].layers, layers[k]) << k;
    EXPECT_EQ(v[k].embedding, k == 0) << k;
    EXPECT_EQ(v[k].head, k == 3) << k;
  }
  plan.chunks = 1;  // without interleaving, the stages themselves
  const std::vector<ChunkLayers> s = virtual_stages(plan);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[1].first_layer, 3);
  EXPECT_EQ(s[1].layers, 2);
}

// A stage whose replicas mix chip types, written by hand: each group is costed on its own chip at its own rows (the
// same figures as a stage of that type alone with those rows), the stage takes the slowest group's time, the plan
// goes to JSON and back with its groups, and bad shares or too many devices are errors naming the field.
TEST(Layout, StagesOfMixedChipTypesCostEachGroupOnItsChip) {
  // Without ZeRO-1 a replica's memory depends only on its own chip, rows and layers.
  const CostModel costs(cluster_of(kSmallCluster), small_model(6), TrainSetup{.global_batch = 24, .zero1 = false});
  const auto load = [&](const std::string& yaml) {
    return load_layout(ConfigNode::parse_string(yaml, "layout.yaml"), costs);
  };
  const Plan mixed = cost_layout(costs, load("dp: 8\nstages:\n  - {tp: 1, layers: 6, mix: "
                                             "[{chip: Y, replicas: 2, rows: 1}, {chip: Z, replicas: 2, rows: 3}]}\n"));
  ASSERT_EQ(mixed.stages.size(), 1u);
  const StagePlan& s = mixed.stages[0];
  ASSERT_EQ(s.groups.size(), 2u);
  EXPECT_EQ(s.dp, 4);
  // Each group as the same stage of its type alone, at its rows (a micro-batch of dp x 1 rows over that many
  // replicas), would be costed: the same times, memory and recomputation (each its own: the fastest that fits).
  const Plan y = cost_layout(costs, load("dp: 2\nstages:\n  - {chip: Y, tp: 1, dp: 2, layers: 6}\n"));
  const Plan z = cost_layout(costs, load("dp: 6\nstages:\n  - {chip: Z, tp: 1, dp: 2, layers: 6}\n"));
  for (const auto& [group, alone] : {std::pair{s.groups[0], y.stages[0]}, {s.groups[1], z.stages[0]}}) {
    EXPECT_DOUBLE_EQ(group.forward_s, alone.forward_s) << group.chip;
    EXPECT_DOUBLE_EQ(group.backward_s, alone.backward_s) << group.chip;
    EXPECT_DOUBLE_EQ(group.memory_bytes, alone.memory_bytes) << group.chip;
    EXPECT_DOUBLE_EQ(group.capacity_bytes, alone.capacity_bytes) << group.chip;
    EXPECT_EQ(group.recompute, alone.recompute) << group.chip;
  }
  EXPECT_NE(s.groups[0].recompute, s.groups[1].recompute) << "the case should need different recomputation";
  EXPECT_DOUBLE_EQ(s.forward_s, std::max(y.stages[0].forward_s, z.stages[0].forward_s));
  EXPECT_EQ(s.chip, y.stages[0].forward_s > z.stages[0].forward_s ? "Y" : "Z");  // the group that bounds it
  EXPECT_THAT(format_plan(mixed), HasSubstr("3 rows each"));
  const Plan back = Plan::from_json(mixed.to_json(), "p.json");
  EXPECT_EQ(back.to_json(), mixed.to_json());
  // Costed again (h2 simulate --cluster, h2 calibrate), each group keeps its own recomputation, times and memory.
  const Plan again = cost_layout(costs, layout_spec_of(back, costs));
  EXPECT_DOUBLE_EQ(again.step_s, mixed.step_s);
  ASSERT_EQ(again.stages[0].groups.size(), 2u);
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_EQ(again.stages[0].groups[k].recompute, s.groups[k].recompute) << k;
    EXPECT_DOUBLE_EQ(again.stages[0].groups[k].backward_s, s.groups[k].backward_s) << k;
    EXPECT_DOUBLE_EQ(again.stages[0].groups[k].memory_bytes, s.groups[k].memory_bytes) << k;
  }
  // A layout file gives a share its own recomputation; a share without one gets the fastest that fits.
  ASSERT_EQ(s.groups[1].recompute, Recompute::kFull);
  const Plan given =
      cost_layout(costs, load("dp: 8\nstages:\n  - {tp: 1, layers: 6, mix: [{chip: Y, replicas: 2, rows: "
                              "1}, {chip: Z, replicas: 2, rows: 3, recompute: full, recompute_blocks: "
                              "3}]}\n"));
  EXPECT_EQ(given.stages[0].groups[0].recompute, s.groups[0].recompute);
  EXPECT_DOUBLE_EQ(given.stages[0].groups[0].backward_s, s.groups[0].backward_s);
  EXPECT_EQ(given.stages[0].groups[1].recompute_blocks, 3);
  EXPECT_LT(given.stages[0].groups[1].backward_s, s.groups[1].backward_s);  // 3 of 6 blocks recomputed, not 6
  EXPECT_THAT(format_plan(given), HasSubstr("full:3"));
  EXPECT_THAT(
      error_of([&] { load("dp: 8\nstages:\n  - {tp: 1, layers: 6, mix: [{chip: Y, replicas: 2, rows: 1}]}\n"); },
               ErrorCode::kConfig),
      HasSubstr("field 'stages[0].mix': its 2 replicas take 2 sequences; a micro-batch is 8"));
  EXPECT_THAT(error_of([&] { load("stages:\n  - {chip: Y, layers: 6, mix: [{chip: Y}]}\n"); }, ErrorCode::kConfig),
              HasSubstr("a stage gives either chip (and dp) or mix, not both"));
  EXPECT_THAT(error_of([&] { load("dp: 8\nstages:\n  - {layers: 6, mix: [{chip: Z, replicas: 4, rows: 2}]}\n"); },
                       ErrorCode::kConfig),
              HasSubstr("the stages use 4 devices of Z; the cluster has 2"));
  Plan wrong = mixed;
  wrong.stages[0].groups[1].chip = "TPU";
  EXPECT_THAT(error_of([&] { check_plan_on_cluster(wrong, costs.cluster(), "p.json"); }, ErrorCode::kConfig),
              HasSubstr("p.json: stage 0 runs on chip type 'TPU'"));
}

// A plan whose stages meet inside a block (version 5) comes back whole; a version-4 plan (whole blocks) still loads;
// stages that do not meet at the same half, a half on the embedding's or head's stage, a stage of no half-block, or
// interleaving with halves are refused naming the field.
TEST(Plan, AStageBoundaryInsideABlockRoundTripsAndIsChecked) {
  const CostModel costs(cluster_of(kSmallCluster), small_model(6), TrainSetup{.global_batch = 8});
  Plan plan = plan_training(costs, PlannerOptions{.split_blocks = false});
  ASSERT_GE(plan.stages.size(), 2u);
  StagePlan &a = plan.stages[0], &b = plan.stages[1];
  // The first stage's last block's MLP half to the second stage: the first ends after that block's attention half,
  // the second starts at its MLP half.
  a.ends_at_attention = true;
  b.first_layer -= 1;
  b.layers += 1;
  b.starts_at_mlp = true;
  EXPECT_EQ(a.halves(), 2 * a.layers - 1);
  EXPECT_EQ(b.start_half(), 2 * b.first_layer + 1);
  EXPECT_EQ(b.start_half() + b.halves(), 2 * (b.first_layer + b.layers));
  const Plan back = Plan::from_json(plan.to_json(), "p.json");
  EXPECT_EQ(back.to_json(), plan.to_json());
  EXPECT_TRUE(back.stages[0].ends_at_attention);
  EXPECT_TRUE(back.stages[1].starts_at_mlp);
  EXPECT_NE(plan.to_json().find("\"version\": 7"), std::string::npos);
  const Plan whole = plan_training(costs, PlannerOptions{.split_blocks = false});
  std::string v4 = whole.to_json();
  v4.replace(v4.find("\"version\": 7"), 12, "\"version\": 4");
  EXPECT_EQ(Plan::from_json(v4, "p.json").stages.size(), whole.stages.size());
  const auto refused = [](Plan p) { return error_of([&] { check_plan(p, "p.json"); }, ErrorCode::kConfig); };
  Plan gap = plan;
  gap.stages[1].starts_at_mlp = false;  // block b's MLP half in no stage
  EXPECT_THAT(refused(gap), HasSubstr("field 'stages[1].first_layer'"));
  EXPECT_THAT(refused(gap), HasSubstr("from the MLP half of the block the stage before ends in"));
  Plan embedding = plan;
  embedding.stages[0].starts_at_mlp = true;
  EXPECT_THAT(refused(embedding), HasSubstr("stages[0]."));
  Plan head = plan;
  head.stages.back().ends_at_attention = true;
  EXPECT_THAT(refused(head), HasSubstr("ends_at_attention': the head's stage ends with a whole block"));
  Plan interleaved = plan;
  interleaved.schedule = ScheduleKind::kInterleaved;
  interleaved.chunks = 2;
  EXPECT_THAT(refused(interleaved), HasSubstr("a stage boundary inside a block needs 1f1b"));
}

TEST(Plan, JsonRoundTripAndVersion) {
  // A 1F1B plan (a version 6 plan below could not be zb-h1).
  const CostModel costs(cluster_of(kSmallCluster), small_model(6), TrainSetup{.global_batch = 8, .zero_bubble = false});
  Plan plan = plan_training(costs, PlannerOptions{});
  plan.model = "small";
  const Plan back = Plan::from_json(plan.to_json(), "p.json");
  EXPECT_EQ(back.to_json(), plan.to_json());
  // Recomputation on a stage's first blocks only: 1..layers - 1 of them, with a recomputation, one chunk.
  const auto refused = [](Plan p) { return error_of([&] { check_plan(p, "p.json"); }, ErrorCode::kConfig); };
  Plan some = plan;
  some.stages[0].recompute = Recompute::kFull;
  some.stages[0].recompute_blocks = some.stages[0].layers - 1;
  ASSERT_GE(some.stages[0].recompute_blocks, 1);
  EXPECT_EQ(Plan::from_json(some.to_json(), "p.json").stages[0].recompute_blocks, some.stages[0].recompute_blocks);
  EXPECT_EQ(plan.to_json().find("recompute_blocks"), std::string::npos);  // absent when all blocks recompute
  some.stages[0].recompute_blocks = some.stages[0].layers;
  EXPECT_THAT(refused(some), HasSubstr("field 'stages[0].recompute_blocks': must be -1 (all) or 1.."));
  some.stages[0].recompute_blocks = 1;
  some.stages[0].recompute = Recompute::kNone;
  EXPECT_THAT(refused(some), HasSubstr("1 blocks recompute, but recompute is none"));
  some.stages[0].recompute = Recompute::kFull;
  some.chunks = 2;
  some.schedule = ScheduleKind::kInterleaved;
  EXPECT_THAT(refused(some), HasSubstr("recomputing only some blocks is for stages of one chunk"));
  // The weight gradients' part of each backward (version 7): back as written; a plan before it reads 0, which only
  // zb-h1, the schedule that splits a backward there, refuses.
  ASSERT_GT(plan.stages[0].weight_s, 0);
  EXPECT_DOUBLE_EQ(back.stages[0].weight_s, plan.stages[0].weight_s);
  std::string v6 = plan.to_json();
  v6.replace(v6.find("\"version\": 7"), 12, "\"version\": 6");
  for (size_t at; (at = v6.find("\"weight_s\": ")) != std::string::npos;) v6.erase(at, v6.find(',', at) + 1 - at);
  Plan older = Plan::from_json(v6, "p.json");
  EXPECT_EQ(older.stages[0].weight_s, 0);
  older.schedule = ScheduleKind::kZeroBubbleH1;
  EXPECT_THAT(refused(older), HasSubstr("field 'stages[0].weight_s': zb-h1 splits each backward at its weight "
                                        "gradients, and this plan (version 6) does not say how long they take"));
  Plan over = plan;
  over.stages[0].weight_s = over.stages[0].backward_s * 1.01;
  EXPECT_THAT(refused(over), HasSubstr("field 'stages[0].weight_s': must be in [0, backward_s = "));
  std::string text = plan.to_json();
  text.replace(text.find("\"version\": 7"), 12, "\"version\": 9");
  EXPECT_THAT(error_of([&] { Plan::from_json(text, "p.json"); }, ErrorCode::kConfig),
              HasSubstr("p.json: plan version 9"));
  EXPECT_THAT(error_of([&] { Plan::from_json("{\"format\": \"h2-plan\"}", "p.json"); }, ErrorCode::kConfig),
              HasSubstr("p.json: field 'version'"));
  // An unknown enum value or a wrong type is an error naming the field, never a silent default.
  std::string bad = plan.to_json();
  bad.replace(bad.find("\"recompute\": \""), 14, "\"recompute\": \"partial\", \"x\": \"");
  EXPECT_THAT(error_of([&] { Plan::from_json(bad, "p.json"); }, ErrorCode::kConfig),
              HasSubstr("p.json: field 'stages[0].recompute': \"partial\" is not a recomputation"));
  bad = plan.to_json();
  bad.replace(bad.find("\"tp\": "), 6, "\"tp\": \"two\", \"y\": ");
  EXPECT_THAT(error_of([&] { Plan::from_json(bad, "p.json"); }, ErrorCode::kConfig),
              HasSubstr("p.json: field 'stages[0].tp': expected an integer, got \"two\""));
  EXPECT_THAT(error_of([&] { Plan::from_json("[1]", "p.json"); }, ErrorCode::kConfig), HasSubstr("not an H2 plan"));
  bad = plan.to_json();
  bad.replace(bad.find("\"precision\": \""), 14, "\"precision\": \"fp8\", \"z\": \"");
  EXPECT_THAT(error_of([&] { Plan::from_json(bad, "p.json"); }, ErrorCode::kConfig),
              HasSubstr("p.json: field 'precision': \"fp8\" is not a precision"));
  // Whose bf16 memory a plan counts comes back; a plan written before the field counts the published systems'.
  Plan h2 = plan;
  h2.h2_runtime = true;
  EXPECT_TRUE(Plan::from_json(h2.to_json(), "p.json").h2_runtime);
  EXPECT_TRUE(setup_of(Plan::from_json(h2.to_json(), "p.json")).h2_runtime);
  std::string old = plan.to_json();
  old.replace(old.find("\"h2_runtime\": false,"), 20, "");
  EXPECT_FALSE(Plan::from_json(old, "p.json").h2_runtime);
  bad = plan.to_json();
  bad.replace(bad.find("\"h2_runtime\": false"), 19, "\"h2_runtime\": 3");
  EXPECT_THAT(error_of([&] { Plan::from_json(bad, "p.json"); }, ErrorCode::kConfig),
              HasSubstr("p.json: field 'h2_runtime': expected true or false, got 3"));
}

// What the simulator or the runtime could not run is refused when the plan is read (the simulator used to assert on
// a negative send time, and a huge time or micro-batch count grew without bound), and a plan's ranks must exist in
// the cluster (a DP-64 plan on a 4-device cluster started 128 processes).
TEST(Plan, LoaderRejectsWhatCannotRunAndTheClusterMustHoldItsRanks) {
  const Cluster cluster = cluster_of(kSmallCluster);
  const CostModel costs(cluster, small_model(6), TrainSetup{.global_batch = 8});
  const Plan plan = plan_training(costs, PlannerOptions{});
  const auto with = [&](const std::function<void(Plan&)>& change) {
    Plan p = plan;
    change(p);
    return error_of([&] { Plan::from_json(p.to_json(), "p.json"); }, ErrorCode::kConfig);
  };
  EXPECT_THAT(with([](Plan& p) { p.stages[0].send_s = -1; }),
              HasSubstr("field 'stages[0].send_s': must be in [0, 1e+06], got -1"));
  EXPECT_THAT(with([](Plan& p) { p.stages[0].forward_s = 1e308; }),
              HasSubstr("field 'stages[0].forward_s': must be in [0, 1e+06], got 1e+308"));
  EXPECT_THAT(with([](Plan& p) { p.stages[0].state_bytes = 1e300; }), HasSubstr("must be in [0, 1e+15]"));
  EXPECT_THAT(with([](Plan& p) {
                p.global_batch = int64_t{1} << 30;
                p.num_micro_batches = static_cast<int>((int64_t{1} << 30) / (int64_t{p.dp} * p.micro_batch));
              }),
              HasSubstr("at most 5e7"));
  check_plan_on_cluster(plan, cluster, "p.json");
  Plan wide = plan;
  wide.stages[0].dp *= 64;
  EXPECT_THAT(error_of([&] { check_plan_on_cluster(wide, cluster, "p.json"); }, ErrorCode::kConfig),
              HasSubstr("p.json: the plan runs "));
  wide.stages[0].chip = "TPU";
  EXPECT_THAT(error_of([&] { check_plan_on_cluster(wide, cluster, "p.json"); }, ErrorCode::kConfig),
              HasSubstr("p.json: stage 0 runs on chip type 'TPU', which cluster small does not have"));
}

// An error inside the search's worker threads reaches the caller as an error (it used to end the process).
TEST(Search, AnErrorInAWorkerThreadReachesTheCaller) {
  Cluster c = cluster_of(kSmallCluster);
  c.links.clear();  // built in code, not loaded: nothing checked that the types are linked
  const CostModel costs(c, small_model(6), TrainSetup{.global_batch = 8});
  EXPECT_THAT(error_of([&] { plan_training(costs, PlannerOptions{.threads = 2}); }, ErrorCode::kNotFound),
              HasSubstr("no link between chip types"));
}

}  // namespace
}  // namespace h2
