// What `h2 train --cluster` derives from its inputs before any rank starts: the emulated chips a cluster becomes
// on this host, and whether the runtime can run a plan.
#include "pipeline/hetero_train.h"

#include <fstream>

#include "model/test_data.h"
#include "pipeline/cluster_job.h"
#include "test_util.h"

namespace h2 {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing_util::error_of;

Cluster two_types(int fast, int slow) {
  return load_cluster(ConfigNode::parse_string(
      cat("name: t\nchips:\n"
          "  - {name: fast, peak_tflops: 0.2, efficiency: 0.5, memory_gib: 0.25, memory_bandwidth_gbps: 8}\n"
          "  - {name: slow, peak_tflops: 0.1, efficiency: 0.5, memory_gib: 1, memory_bandwidth_gbps: 4}\n"
          "groups:\n"
          "  - {chip: fast, nodes: 1, chips_per_node: ",
          fast,
          ", intra_node_gbps: 5, nic_gbps: 5}\n"
          "  - {chip: slow, nodes: 1, chips_per_node: ",
          slow,
          ", intra_node_gbps: 5, nic_gbps: 5}\n"
          "links:\n  - {between: [fast, slow], bandwidth_gbps: 5, latency_us: 20}\n"),
      "cluster.yaml"));
}

// The precision a cluster job trains and plans in: the config's train.precision where it sets one (a --set too),
// else the planner file's where it sets one, else f32; the plan always counts H2's runtime's memory.
TEST(ClusterJobPrecision, TheConfigThenThePlannersFileThenF32) {
  const std::string dir = testing_util::temp_dir("job_precision");
  const auto file = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir + "/" + name) << text;
    return dir + "/" + name;
  };
  const std::string config = file("train.yaml",
                                  "model: {n_layer: 2, n_head: 2, n_embd: 16, vocab_size: 32, seq_len: 8}\n"
                                  "data: {train: none}\ntrain: {batch_size: 2}\n");
  const std::string cluster = file("cluster.yaml",
                                   "name: c\nchips:\n  - {name: X, peak_tflops: 1, memory_gib: 1, "
                                   "memory_bandwidth_gbps: 1}\ngroups:\n  - {chip: X, nodes: 1, chips_per_node: 2, "
                                   "intra_node_gbps: 1, nic_gbps: 1}\n");
  const std::string says_bf16 = file("bf16.yaml", "global_batch: 2\nprecision: bf16\n");
  const std::string says_nothing = file("none.yaml", "global_batch: 2\n");
  const auto job = [&](const std::string& train, std::vector<std::string> overrides) {
    const ClusterJob j = load_cluster_job(
        ClusterJobFiles{.config = config, .cluster = cluster, .train = train, .overrides = std::move(overrides)},
        false);
    EXPECT_EQ(j.setup.precision, j.run.config.precision);  // what is planned is what runs
    EXPECT_TRUE(j.setup.h2_runtime);
    return j.run.config.precision;
  };
  EXPECT_EQ(job("", {}), Precision::kF32);
  EXPECT_EQ(job(says_nothing, {}), Precision::kF32);  // not the planner's own default, bf16
  EXPECT_EQ(job(says_bf16, {}), Precision::kBf16);
  EXPECT_EQ(job(says_bf16, {"train.precision=f32"}), Precision::kF32);
  EXPECT_EQ(job("", {"train.precision=bf16"}), Precision::kBf16);
}

TEST(ClusterJobPrecision, APlanCostedForAnotherPrecisionIsSaidSo) {
  const auto warning = [](Precision planned, bool h2_runtime, Precision runs) {
    Plan plan;
    plan.precision = planned;
    plan.h2_runtime = h2_runtime;
    TrainSetup setup;
    setup.precision = runs;
    return costed_otherwise(plan, setup);
  };
  EXPECT_EQ(warning(Precision::kF32, false, Precision::kF32), "");
  EXPECT_EQ(warning(Precision::kF32, true, Precision::kF32), "");  // f32's memory is the same either way
  EXPECT_EQ(warning(Precision::kBf16, true, Precision::kBf16), "");
  EXPECT_THAT(warning(Precision::kF32, false, Precision::kBf16),
              HasSubstr("was costed for f32; this run trains in bf16 (H2's runtime)"));
  EXPECT_THAT(warning(Precision::kBf16, true, Precision::kF32),
              HasSubstr("was costed for bf16 (H2's runtime); this run trains in f32"));
  // Costed as published systems hold bf16 (16 bytes a parameter), run by H2 (18).
  EXPECT_THAT(warning(Precision::kBf16, false, Precision::kBf16),
              HasSubstr("was costed for bf16 (published systems'); this run trains in bf16 (H2's runtime)"));
}

// Beyond 10% either way, the run's summary says by how much and names the fix with the run's directory.
TEST(ClusterJobReport, ARunMissingItsSimulationByMoreThanTenPercentNamesTheFix) {
  EXPECT_EQ(simulation_miss(1.0, "runs/x"), "");
  EXPECT_EQ(simulation_miss(1.09, "runs/x"), "");
  EXPECT_EQ(simulation_miss(0.91, "runs/x"), "");
  EXPECT_THAT(simulation_miss(1.16, "runs/x"),
              HasSubstr("the run took 16% longer than simulated; h2 calibrate runs/x"));
  EXPECT_THAT(simulation_miss(0.8, "runs/y"),
              HasSubstr("the run took 20% less time than simulated; h2 calibrate runs/y"));
}

// Every rank the driver starts takes its process's memory from this host, and an emulated or cpu chip's also its
// device's (the plan's memory per device); a GPU's device memory is not the host's. More than the host has
// available is refused before any rank starts, with the figures (on a 24 GiB host, 100 ranks were killed by the
// kernel's OOM killer instead).
TEST(ClusterJobHostMemory, RanksNeedTheirProcessesAndTheirHostMemoryDevices) {
  const Cluster cluster = load_cluster(ConfigNode::parse_string(
      "name: t\nchips:\n"
      "  - {name: emu, peak_tflops: 1, memory_gib: 1, memory_bandwidth_gbps: 1}\n"
      "  - {name: gpu, peak_tflops: 1, memory_gib: 1, memory_bandwidth_gbps: 1, backend: cuda}\n"
      "groups:\n"
      "  - {chip: emu, nodes: 1, chips_per_node: 4, intra_node_gbps: 1, nic_gbps: 1}\n"
      "  - {chip: gpu, nodes: 1, chips_per_node: 4, intra_node_gbps: 1, nic_gbps: 1}\n"
      "links:\n  - {between: [emu, gpu], bandwidth_gbps: 1, latency_us: 1}\n",
      "cluster.yaml"));
  constexpr double MiB = 1 << 20;
  Plan plan;
  plan.shape = {.heads = 1,
                .kv_heads = 1};  // a model of no parameters: its checkpoints take nothing (below, one that does)
  plan.stages.resize(3);
  plan.stages[0] = StagePlan{.chip = "emu", .chip_index = 0, .tp = 2, .dp = 1, .layers = 1, .embedding = true};
  plan.stages[0].memory_bytes = 100 * MiB;
  plan.stages[1] = StagePlan{.chip = "gpu", .chip_index = 1, .tp = 1, .dp = 2, .first_layer = 1, .layers = 1};
  plan.stages[1].memory_bytes = 700 * MiB;
  // Replicas of both types: one emulated (300 MiB a device) and one GPU replica, TP 1.
  plan.stages[2] = StagePlan{.chip = "emu", .chip_index = 0, .tp = 1, .dp = 2, .first_layer = 2, .layers = 1};
  plan.stages[2].head = true;
  plan.stages[2].groups = {ReplicaGroup{.chip = "emu", .chip_index = 0, .replicas = 1, .rows = 1},
                           ReplicaGroup{.chip = "gpu", .chip_index = 1, .replicas = 1, .rows = 1}};
  plan.stages[2].groups[0].memory_bytes = 300 * MiB;
  plan.stages[2].groups[1].memory_bytes = 500 * MiB;
  // By hand: 6 processes of 256 MiB, 2 x 100 MiB and 300 MiB of emulated devices (2,036 MiB, 1.99 GiB); the GPUs'
  // 700 and 500 MiB not.
  const double need = (6 * 256 + 2 * 100 + 300) * MiB;
  const HostBytes counted = local_ranks_host_bytes(plan, cluster, false);
  EXPECT_EQ(counted.ranks, 6);
  EXPECT_DOUBLE_EQ(counted.total(), need);
  check_host_memory(plan, cluster, false, need);
  EXPECT_THAT(
      error_of([&] { check_host_memory(plan, cluster, false, need - 1); }, ErrorCode::kConfig),
      HasSubstr("this plan starts 6 ranks on this host, which need about 1.99 GiB of its memory (500.0 MiB for "
                "the devices whose memory is the host's, 0 B for writing checkpoints, 256.0 MiB for each rank's "
                "process) and it has 1.99 GiB available. Plan for fewer devices"));
}

// A plan of two stages of one block each over a two-block model (`shape`), the embedding on the first and the head on
// the second, each stage's {tp, dp}.
Plan block_a_stage(const TransformerShape& shape, std::pair<int, int> first, std::pair<int, int> second) {
  Plan plan;
  plan.shape = shape;
  plan.stages.resize(2);
  plan.stages[0] = StagePlan{.chip = "a", .tp = first.first, .dp = first.second, .layers = 1, .embedding = true};
  plan.stages[1] = StagePlan{.chip = "a", .tp = second.first, .dp = second.second, .first_layer = 1, .layers = 1};
  plan.stages[1].head = true;
  return plan;
}

// A checkpoint's host buffers on each rank (RankTraining::save): its Adam moments copied out (two f32 per parameter of
// its shard, and under ZeRO-1 its share beside them), and on the first replica's ranks the largest tensor the stage
// writes: every TP rank's shard of it, and on the writer (TP rank 0) its value and two moments whole, a block
// matrix's transposed value and the other rank's shard as it arrives besides (4 bytes each). Counted by hand for a GPT
// of width C = 8, a 32-wide MLP, 10 tokens, 4 positions: parameters of a block 12 C^2 + 13 C = 872, its TP-2 shard
// 48 + 824 / 2 = 460 (LayerNorms and the row-parallel biases whole); the embedding 10 x 8 + 4 x 8 = 112, on the TP
// rank with the most vocabulary rows 5 x 8 + 32 = 72; the head's LayerNorm 16, beside its copy of the tied table
// (80). The largest block matrix 8 x 32 = 256 (a TP-2 shard of 128), the table 80 (not transposed; shards of 40).
TEST(ClusterJobHostMemory, CheckpointsTakeTheMomentsAndTheLargestTensorWrittenWhole) {
  Plan plan = block_a_stage({.layers = 2, .hidden = 8, .heads = 2, .kv_heads = 2, .ffn = 32, .vocab = 10, .seq_len = 4},
                            {2, 2}, {1, 1});
  // Stage 0, a shard of 72 + 460 = 532: the block matrix (4 x 256 + 128 + 128) outweighs the table (3 x 80 + 40 + 40)
  // on the writer; its other TP rank holds only its shard of it (128 against the table's 40).
  EXPECT_EQ(checkpoint_host_bytes(plan, 0, 0, 0, false), 2 * 4 * 532 + 4 * (4 * 256 + 128 + 128));
  EXPECT_EQ(checkpoint_host_bytes(plan, 0, 0, 1, false), 2 * 4 * 532 + 4 * 128);
  EXPECT_EQ(checkpoint_host_bytes(plan, 0, 1, 0, false), 2 * 4 * 532);
  EXPECT_EQ(checkpoint_host_bytes(plan, 0, 1, 1, true), 2 * 4 * (532 + 266));  // ZeRO-1: half of the moments its own
  // Stage 1 (TP 1: nothing to receive) holds 872 + 16 + 80 and writes no table (the first stage writes the tied one).
  EXPECT_EQ(checkpoint_host_bytes(plan, 1, 0, 0, false), 2 * 4 * 968 + 4 * (4 * 256 + 256));
  // Untied, with 1,000 tokens: its own output matrix of 8,000, written by it and the largest (3 x 8,000 + 8,000).
  plan.shape.tied_embeddings = false;
  plan.shape.vocab = 1000;
  EXPECT_EQ(checkpoint_host_bytes(plan, 1, 0, 0, false), 2 * 4 * (872 + 16 + 8000) + 4 * (3 * 8000 + 8000));
}

// Around a checkpoint ranks wait the communicator's timeout plus the whole checkpoint at 50 MB/s. Counted by hand for
// a two-stage GPT of C = 1,024, a 4,096-wide MLP, 50,000 tokens and 1,024 positions, a block each: a block
// 12 C^2 + 13 C = 12,596,224; the first stage adds the embedding (50,000 + 1,024) x 1,024 = 52,248,576, the second the
// final LayerNorm 2,048 and its copy of the tied table, 51,200,000: 128,643,072 parameters, 12 bytes each (the value
// and two moments in f32), 1,543,716,864 bytes: 30.874 s.
TEST(CheckpointTimeout, IsTheCommunicatorsPlusTheWholeCheckpointAtTheSlowestStorage) {
  const Plan plan = block_a_stage(
      {.layers = 2, .hidden = 1024, .heads = 8, .kv_heads = 8, .ffn = 4096, .vocab = 50000, .seq_len = 1024}, {4, 2},
      {2, 1});
  EXPECT_EQ(checkpoint_timeout(plan, std::chrono::milliseconds(30000)), std::chrono::milliseconds(30000 + 30875));
}

// After a run, the ranks' measured peak resident memory beside what was counted for them: together, and the rank
// highest against its count — past it, with a warning naming it.
TEST(ClusterJobHostMemory, TheRanksMeasuredPeaksArePrintedBesideTheirCounts) {
  constexpr double MiB = 1 << 20;
  EXPECT_EQ(rank_host_bytes("emu", 10 * MiB, 5 * MiB).total(), 271 * MiB);
  EXPECT_EQ(rank_host_bytes("cpu", 10 * MiB, 5 * MiB).total(), 271 * MiB);
  EXPECT_EQ(rank_host_bytes("cuda", 10 * MiB, 5 * MiB).total(), 261 * MiB);  // the GPU's memory is not the host's
  // By hand: 600 of 800 MiB together (0.75); rank 1 at 350 of 400 (0.88) is nearer its count than rank 0 (0.63).
  EXPECT_EQ(host_memory_line({{250 * MiB, 400 * MiB}, {350 * MiB, 400 * MiB}}, false),
            "host memory, each rank's measured peak resident beside h2's count for it: 2 rank(s) together 600.0 "
            "MiB of 800.0 MiB (0.75); highest against its count: rank 1, 350.0 MiB of 400.0 MiB (0.88)\n");
  // Rank 2 took 40 MiB more than its count (1.10), rank 0 more in bytes but less than its count (0.90).
  const std::vector<RankHostMemory> ranks = {{900 * MiB, 1000 * MiB}, {100 * MiB, 400 * MiB}, {440 * MiB, 400 * MiB}};
  const std::string past = host_memory_line(ranks, false);
  EXPECT_THAT(past, HasSubstr("3 rank(s) together 1.41 GiB of 1.76 GiB (0.80); highest against its count: rank 2, "
                              "440.0 MiB of 400.0 MiB (1.10)\n"));
  EXPECT_THAT(past, HasSubstr("warning: rank 2 took 40.0 MiB more of this host's memory than h2 counted for it"));
  EXPECT_THAT(past, Not(HasSubstr("resumed")));
  EXPECT_THAT(host_memory_line(ranks, true), HasSubstr("as this run resumed, what it read of the checkpoint's files"));
  EXPECT_EQ(host_memory_line({}, false), "");
}

TEST(EmulatedCluster, ChipsKeepTheirRatioAndTogetherFitTheHostsCores) {
  // Enough cores: the fastest type runs at the host's speed.
  EXPECT_DOUBLE_EQ(emu_profile_of(two_types(2, 2), "fast", 8).speed, 1.0);
  EXPECT_DOUBLE_EQ(emu_profile_of(two_types(2, 2), "slow", 8).speed, 0.5);
  // Two cores for 2 x 1.0 + 2 x 0.5 busy cores: all slowed by 0.4 x 2 / 3, the ratio kept.
  EXPECT_NEAR(emu_profile_of(two_types(2, 2), "fast", 2).speed, 0.266667, 1e-6);
  EXPECT_NEAR(emu_profile_of(two_types(2, 2), "slow", 2).speed, 0.133333, 1e-6);
  EXPECT_EQ(emu_profile_of(two_types(2, 2), "slow", 2).mem_capacity_bytes, size_t{1} << 30);
  // Without a profile's kernel work, no reference; with it, the emulation paces to it.
  EXPECT_EQ(emu_profile_of(two_types(2, 2), "slow", 2).reference_work, nullptr);
  Cluster profiled = two_types(2, 2);
  profiled.chips[0].kernel_work = {{3, 0.25}};
  const EmuProfile paced = emu_profile_of(profiled, "fast", 2);
  ASSERT_NE(paced.reference_work, nullptr);
  EXPECT_EQ(*paced.reference_work, profiled.chips[0].kernel_work);
  EXPECT_EQ(emu_profile_of(profiled, "slow", 2).reference_work, nullptr);
  EXPECT_THAT(error_of([] { emu_profile_of(two_types(1, 1), "tpu", 2); }, ErrorCode::kNotFound),
              HasSubstr("chip type 'tpu' is not in cluster t"));
}

// A file of measured figures emulates the chips of the file it measured. Measured: fast 0.02 TFLOP/s peak (its f32
// GEMMs at 0.005), slow at efficiency 1 (0.05). Kept, the emulation is the datasheet's (f32 GEMMs at 0.05 and
// 0.025): on two cores 0.267 and 0.133, as above. Not kept, the slow type would be the fastest: 2 x 0.1 + 2 x 1
// busy cores, slowed by 0.4 x 2 / 2.2 — slow at 0.364, fast at 0.0364.
TEST(EmulatedCluster, MeasuredFiguresKeepTheChipsTheyMeasured) {
  Cluster measured = two_types(2, 2).with_emulation_kept();
  EXPECT_DOUBLE_EQ(measured.chips[0].emulation_tflops, 0.05);
  measured.chips[0].peak_tflops = 0.02;
  measured.chips[1].efficiency = 1.0;
  EXPECT_NEAR(emu_profile_of(measured, "fast", 2).speed, 0.266667, 1e-6);
  EXPECT_NEAR(emu_profile_of(measured, "slow", 2).speed, 0.133333, 1e-6);
  for (ChipType& c : measured.chips) c.emulation_tflops = 0;
  EXPECT_NEAR(emu_profile_of(measured, "slow", 2).speed, 0.363636, 1e-6);
  EXPECT_NEAR(emu_profile_of(measured, "fast", 2).speed, 0.0363636, 1e-7);
}

// h2 train --cluster's own search leaves interleaving out while any chip type is emulated (the emulated chips
// share the host's cores, so a fuller pipeline does not run faster on them), and tries it otherwise.
// Ranks 0-4 on hosts a, a, b, a, b; ranks 0, 2, 3 and 4 on GPUs: host a's GPU ranks 0 and 3 take its GPUs 0 and 1,
// host b's 2 and 4 its GPUs 0 and 1, rank 1 (on the CPU) none.
TEST(ClusterJobDevices, GpuRanksTakeTheirHostsGpusInRankOrder) {
  EXPECT_EQ(gpu_ordinals({7, 7, 9, 7, 9}, {true, false, true, true, true}), (std::vector<int>{0, -1, 0, 1, 1}));
  EXPECT_EQ(gpu_ordinals({7, 7}, {false, false}), (std::vector<int>{-1, -1}));
  // A cuda chip type's device is the GPU it is given, the others numbered by the rank.
  EXPECT_EQ(device_spec_of(two_types(1, 1), "slow", 3).index, 3);
}

TEST(ClusterJobPlanner, InterleavesOnlyWithoutEmulatedChips) {
  Cluster cluster = two_types(1, 1);
  EXPECT_FALSE(job_planner_options(cluster).interleave);
  cluster.chips[0].backend = "cpu";
  EXPECT_FALSE(job_planner_options(cluster).interleave);
  cluster.chips[1].backend = "cuda";
  EXPECT_TRUE(job_planner_options(cluster).interleave);
}

TEST(PlanCheck, NamesTheStageAndFieldTheRuntimeCannotRun) {
  const GptConfig model{.n_layer = 4, .n_head = 2, .n_embd = 32, .vocab_size = 64, .seq_len = 16};
  Plan plan;
  plan.shape = {.layers = 4, .hidden = 32, .heads = 2, .kv_heads = 2, .ffn = 128, .vocab = 64, .seq_len = 16};
  plan.global_batch = 8;
  plan.micro_batch = 4;
  plan.num_micro_batches = 2;
  plan.stages = {StagePlan{.chip = "fast", .tp = 2, .dp = 1, .first_layer = 0, .layers = 1, .embedding = true},
                 StagePlan{.chip = "slow", .tp = 1, .dp = 4, .first_layer = 1, .layers = 3, .head = true}};
  check_plan_runs(plan, model);  // 4 sequences per micro-batch: DP 4 takes one each
  EXPECT_EQ(stage_layout_of(plan).world_size(), 6);
  // What a plan file's reader refuses too (check_plan), in its words.
  plan.stages[1].dp = 3;
  EXPECT_THAT(error_of([&] { check_plan_runs(plan, model); }, ErrorCode::kConfig),
              HasSubstr("field 'stages[1].dp': 3 replicas do not divide a micro-batch's 4 sequences"));
  plan.stages[1].dp = 2;
  plan.stages[1].layers = 2;
  EXPECT_THAT(error_of([&] { check_plan_runs(plan, model); }, ErrorCode::kConfig),
              HasSubstr("the stages hold 3 of the model's 4 layers"));
  plan.stages[1].layers = 3;
  // A plan made for another model than the run's.
  GptConfig deeper = model;
  deeper.n_layer = 6;
  EXPECT_THAT(
      error_of([&] { check_plan_runs(plan, deeper); }, ErrorCode::kConfig),
      HasSubstr("made for a model of 4 blocks x 32 (2 heads, vocabulary 64, 16 tokens); the run's model has 6"));
  GptConfig wider = model;
  wider.n_embd = 64;
  EXPECT_THAT(error_of([&] { check_plan_runs(plan, wider); }, ErrorCode::kConfig), HasSubstr("plan again"));
  plan.stages[0].embedding = false;
  EXPECT_THAT(error_of([&] { check_plan_runs(plan, model); }, ErrorCode::kConfig),
              HasSubstr("stage 0 (fast): only the first stage may hold the embedding"));
  plan.stages[0].embedding = true;
  plan.stages[0].tp = 4;
  EXPECT_THAT(error_of([&] { check_plan_runs(plan, model); }, ErrorCode::kConfig),
              HasSubstr("stage 0 (fast): tp 4 does not divide the model's 2 heads"));
  plan.stages[0].tp = 2;
  Plan vocabulary = plan;  // the head alone on the last stage, no blocks: runs without interleaving
  vocabulary.stages[0].layers = 4;
  vocabulary.stages[1].first_layer = 4;
  vocabulary.stages[1].layers = 0;
  check_plan_runs(vocabulary, model);
  plan.schedule = ScheduleKind::kGPipe;
  EXPECT_THAT(error_of([&] { check_plan_runs(plan, model); }, ErrorCode::kConfig),
              HasSubstr("schedule gpipe: h2 train runs 1F1B, interleaved 1F1B and ZB-H1"));
  plan.schedule = ScheduleKind::kZeroBubbleH1;  // runs, once the plan says how long its W's take
  EXPECT_THAT(error_of([&] { check_plan_runs(plan, model); }, ErrorCode::kConfig),
              HasSubstr("field 'stages[0].weight_s': zb-h1 splits each backward at its weight gradients"));
  for (StagePlan& s : plan.stages) s.backward_s = 2, s.weight_s = 1;
  check_plan_runs(plan, model);
  plan.schedule = ScheduleKind::kInterleaved;
  plan.chunks = 2;
  EXPECT_THAT(error_of([&] { check_plan_runs(plan, model); }, ErrorCode::kConfig),
              HasSubstr("2 chunks per stage, but a stage has only 1 layers"));
  plan.stages[0].layers = 2;
  plan.stages[1].first_layer = 2;
  plan.stages[1].layers = 2;
  check_plan_runs(plan, model);
  EXPECT_EQ(stage_layout_of(plan).chunks, 2);
  Plan one = plan;
  one.stages = {plan.stages[0]};
  one.stages[0].layers = 4;
  one.stages[0].head = true;
  EXPECT_THAT(error_of([&] { check_plan_runs(one, model); }, ErrorCode::kConfig),
              HasSubstr("chunks 2: interleaving needs at least two stages"));
}

}  // namespace
}  // namespace h2
