// HeteroPP's runtime against single-device training: pipelined (1F1B, GPipe, interleaved, ZB-H1), data-parallel (plain
// and ZeRO-1) runs on uniform and non-uniform splits and mixed backends (ref / cpu / emu), ranks as threads over the
// in-process transport, follow the single-device loss curve within 1e-4 relative over 20 steps, and their gradients
// match the unpipelined model's. The reference is the single-device step written out here: forward, loss, backward,
// global norm, clipping, AdamW over the whole batch.
#include "pipeline/runtime.h"

#include <cmath>
#include <map>
#include <mutex>
#include <thread>

#include "comm/transport/inproc/transport.h"
#include "device/registry.h"
#include "ops/ops.h"
#include "test_util.h"
#include "train/trainer.h"

namespace h2 {
namespace {

const GptConfig kConfig{.n_layer = 4, .n_head = 2, .n_embd = 32, .vocab_size = 64, .seq_len = 16};
constexpr int kBatch = 8, kSeq = 16, kSteps = 20;

// Row r of step s: an arithmetic sequence mod V with a per-row stride, so there is something to learn.
void batch_rows(int step, int first_row, int rows, std::vector<int32_t>& tokens, std::vector<int32_t>& targets,
                int vocab = 64) {
  tokens.resize(static_cast<size_t>(rows * kSeq));
  targets.resize(tokens.size());
  for (int r = 0; r < rows; ++r) {
    const int row = first_row + r, stride = 1 + (row * 7 + step * 3) % 5, start = (row * 13 + step * 11) % vocab;
    for (int t = 0; t < kSeq; ++t) {
      tokens[static_cast<size_t>(r * kSeq + t)] = (start + stride * t) % vocab;
      targets[static_cast<size_t>(r * kSeq + t)] = (start + stride * (t + 1)) % vocab;
    }
  }
}

AdamwParams hyper(int step) { return AdamwParams{.lr = 3e-3f, .weight_decay = 0.1f, .step = step + 1}; }

struct Curve {
  std::vector<float> losses;
  std::map<int, int64_t> p2p_bytes;                       // by world rank, over all steps
  std::map<int, int64_t> recomputations;                  // by stage, over all steps (replica 0, TP rank 0)
  std::map<std::string, std::vector<float>> first_grads;  // by name, after step 1's reduction (no clipping)
};

Curve reference(double grad_clip, const GptConfig& config = kConfig) {
  auto device = create_device(DeviceSpec{.backend = "cpu"});
  Gpt model(config, *device, GptRange::whole(config), kBatch, kSeq);
  model.init(7);
  OptimizerState opt{device->zeros(DType::kF32, {model.num_params()}),
                     device->zeros(DType::kF32, {model.num_params()})};
  Tensor tokens = device->empty(DType::kI32, {kBatch, kSeq}), targets = device->empty(DType::kI32, {kBatch, kSeq});
  Tensor acc = device->zeros(DType::kF32, {1});
  Curve run;
  std::vector<int32_t> tok, tgt;
  for (int s = 0; s < kSteps; ++s) {
    batch_rows(s, 0, kBatch, tok, tgt, config.vocab_size);
    copy_from_host(tokens, tok.data());
    copy_from_host(targets, tgt.data());
    model.zero_grads();
    model.forward(tokens);
    run.losses.push_back(model.loss(targets));
    model.backward();
    if (s == 0) {
      for (const Gpt::Param& p : model.params()) {
        std::vector<float> g(static_cast<size_t>(p.grad.numel()));
        copy_to_host(g.data(), p.grad);
        run.first_grads[p.name] = g;
      }
    }
    const float zero = 0;
    copy_from_host(acc, &zero);
    ops::global_norm_squared(acc, model.flat_grads());
    float norm_sq;
    copy_to_host(&norm_sq, acc);
    const double norm = std::sqrt(static_cast<double>(norm_sq));
    if (grad_clip > 0 && norm > grad_clip) ops::scale(model.flat_grads(), static_cast<float>(grad_clip / norm));
    // AdamW per tensor, decaying matrices only.
    int64_t offset = 0;
    for (const Gpt::Param& p : model.params()) {
      AdamwParams hp = hyper(s);
      if (!p.weight_decay) hp.weight_decay = 0;
      const int64_t n = p.value.numel();
      ops::adamw_update(model.flat_params().slice(offset, offset + n), opt.m.slice(offset, offset + n),
                        opt.v.slice(offset, offset + n), model.flat_grads().slice(offset, offset + n), hp);
      offset += n;
    }
  }
  return run;
}

struct PipelineCase {
  std::vector<GptRange> stages;       // per virtual stage (chunk-major when interleaved)
  std::vector<std::string> backends;  // per stage
  std::vector<StageShape> shapes;     // per stage; empty = one replica of one rank each
  int micro_batches = 2;
  bool gpipe = false;
  // ZB-H1 (schedule_zb_h1, each rank's deferral: empty = its index): backwards split into B and W.
  bool zero_bubble = false;
  std::vector<int> deferred;
  bool zero1 = false;
  std::vector<Recompute> recompute;  // per stage (empty: none); activation slots follow the schedule
  GptConfig config = kConfig;
  int chunks = 1;  // > 1: interleaved 1F1B
  int64_t tied_piece_floats = RunnerOptions{}.tied_piece_floats;
};

Curve pipelined(const PipelineCase& pc, double grad_clip) {
  StageLayout layout{pc.shapes};
  if (layout.stages.empty()) layout = StageLayout::uniform(static_cast<int>(pc.stages.size()) / pc.chunks, 1);
  layout.chunks = pc.chunks;
  const int ranks = layout.world_size(), stages = layout.num_stages();
  const int rows = kBatch / pc.micro_batches;  // a micro-batch's sequences
  Schedule base = pc.chunks > 1    ? schedule_interleaved(stages, pc.chunks, pc.micro_batches)
                  : pc.gpipe       ? schedule_gpipe(stages, pc.micro_batches)
                  : pc.zero_bubble ? schedule_zb_h1(stages, pc.micro_batches, pc.deferred)
                                   : schedule_1f1b(stages, pc.micro_batches);
  const Schedule schedule = add_gradient_reduction(lower_communication(base));
  auto transports = make_inproc_transports(ranks);
  std::vector<std::string> errors(static_cast<size_t>(ranks));
  Curve run;
  std::mutex mu;
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        const StageLayout::Place place = layout.place(r);
        Communicator world(transports[static_cast<size_t>(r)]);
        StageComms comms = StageComms::split(world, layout);
        auto device = create_device(DeviceSpec{.backend = pc.backends[static_cast<size_t>(place.stage)], .index = r});
        const Recompute recompute =
            pc.recompute.empty() ? Recompute::kNone : pc.recompute[static_cast<size_t>(place.stage)];
        std::vector<std::unique_ptr<StageRunner>> runners;
        std::vector<StageRunner*> chunks;
        for (int c = 0; c < pc.chunks; ++c) {
          const int vs = c * stages + place.stage;
          runners.push_back(std::make_unique<StageRunner>(
              pc.config, *device, pc.stages[static_cast<size_t>(vs)], layout, comms, rows, kSeq,
              RunnerOptions{.grad_clip = grad_clip, .zero1 = pc.zero1, .tied_piece_floats = pc.tied_piece_floats},
              ActivationPolicy{recompute, max_in_flight(schedule, place.stage, vs), Precision::kF32, -1,
                               max_pending_weights(schedule, place.stage, vs)},
              c));
          runners.back()->model().init(7);
          chunks.push_back(runners.back().get());
        }
        for (int s = 0; s < kSteps; ++s) {
          const StageRunner::Batch batch = [&](int m, int first, int n, std::vector<int32_t>& tok,
                                               std::vector<int32_t>& tgt) {
            batch_rows(s, m * rows + first, n, tok, tgt, pc.config.vocab_size);
          };
          const float loss = StageRunner::step(chunks, schedule, batch, hyper(s));
          if (r == 0) run.losses.push_back(loss);
          if (s == 0 && place.replica == 0 && !pc.zero1) {
            // Gradients after reduction (before the update; clipping is off in the gradient test), each TP
            // rank's shard put in its place of the whole tensor.
            std::lock_guard<std::mutex> lock(mu);
            for (StageRunner* runner : chunks) {
              for (const Gpt::Param& p : runner->model().params()) {
                // The first stage's copy of the tied embedding stands for both.
                if (p.name == "wte.weight" && runner->virtual_stage() != 0) continue;
                std::vector<float> g(static_cast<size_t>(p.grad.numel()));
                copy_to_host(g.data(), p.grad);
                std::vector<float>& whole = run.first_grads[p.name];
                whole.resize(static_cast<size_t>(p.full_shape.numel()));
                tp_runs(p.split, p.full_shape, place.t, runner->model().tp().size,
                        [&](int64_t full, int64_t mine, int64_t count) {
                          std::copy_n(g.begin() + mine, count, whole.begin() + full);
                        });
              }
            }
          }
        }
        std::lock_guard<std::mutex> lock(mu);
        for (StageRunner* runner : chunks) {
          run.p2p_bytes[r] += runner->p2p_bytes_sent();
          if (place.replica == 0 && place.t == 0) run.recomputations[place.stage] += runner->recomputations();
        }
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < ranks; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  return run;
}

// One step's gradients, TP shards put together, against the unpipelined model's, per tensor within 1e-5 of its largest.
void expect_same_grads(const Curve& ref, const Curve& got) {
  ASSERT_EQ(got.first_grads.size(), ref.first_grads.size());
  for (const auto& [name, g] : ref.first_grads) {
    const auto& h = got.first_grads.at(name);
    ASSERT_EQ(h.size(), g.size()) << name;
    float scale = 0;
    for (float x : g) scale = std::max(scale, std::abs(x));
    for (size_t i = 0; i < g.size(); ++i) ASSERT_NEAR(h[i], g[i], 1e-5f * scale + 1e-9f) << name << "[" << i << "]";
  }
}

void expect_same_curve(const Curve& ref, const Curve& got) {
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  for (size_t s = 0; s < ref.losses.size(); ++s) {
    EXPECT_NEAR(got.losses[s], ref.losses[s], 1e-4 * std::abs(ref.losses[s])) << "step " << s + 1;
  }
  EXPECT_LT(ref.losses.back(), ref.losses.front() - 0.5f);  // the model learned something: a meaningful curve
}

constexpr GptRange kFirst2{true, 0, 2, false}, kLast2{false, 2, 4, true};

TEST(PipelineRuntime, UniformTwoStages1F1BFollowsTheSingleDeviceCurve) {
  const Curve ref = reference(1.0);
  expect_same_curve(ref, pipelined({.stages = {kFirst2, kLast2}, .backends = {"cpu", "cpu"}, .micro_batches = 4}, 1.0));
}

TEST(PipelineRuntime, NonUniformThreeStagesWithDataParallelMixedBackends) {
  const Curve ref = reference(1.0);
  const PipelineCase pc{.stages = {{true, 0, 1, false}, {false, 1, 3, false}, {false, 3, 4, true}},
                        .backends = {"ref", "cpu", "emu"},
                        .shapes = {{2, 1}, {2, 1}, {2, 1}},
                        .micro_batches = 2};
  expect_same_curve(ref, pipelined(pc, 1.0));
}

TEST(PipelineRuntime, GPipeRecomputesAndZero1ShardsTheOptimizer) {
  const Curve ref = reference(1.0);
  expect_same_curve(
      ref,
      pipelined({.stages = {kFirst2, kLast2}, .backends = {"cpu", "cpu"}, .micro_batches = 4, .gpipe = true}, 1.0));
  expect_same_curve(
      ref,
      pipelined({.stages = {kFirst2, kLast2}, .backends = {"cpu", "emu"}, .shapes = {{2, 1}, {2, 1}}, .zero1 = true},
                1.0));
}

// Recomputation is the model's, per block: without it nothing is recomputed; selective recomputes each block's
// attention probabilities in backward, full each block's forward — once per block and micro-batch — and the
// curve is the same (1e-5: recomputing is exact, forward is deterministic).
TEST(PipelineRuntime, RecomputationPoliciesRecomputeWhatTheySayAndFollowTheSameCurve) {
  const Curve ref = reference(1.0);
  PipelineCase pc{.stages = {{true, 0, 1, false}, {false, 1, 3, false}, {false, 3, 4, true}},
                  .backends = {"cpu", "emu", "cpu"},
                  .micro_batches = 4};
  const Curve none = pipelined(pc, 1.0);
  expect_same_curve(ref, none);
  for (int s = 0; s < 3; ++s) EXPECT_EQ(none.recomputations.at(s), 0) << s;
  for (Recompute r : {Recompute::kSelective, Recompute::kFull}) {
    pc.recompute = {r, r, r};
    const Curve got = pipelined(pc, 1.0);
    ASSERT_EQ(got.losses.size(), none.losses.size());
    for (size_t i = 0; i < none.losses.size(); ++i) {
      EXPECT_NEAR(got.losses[i], none.losses[i], 1e-5 * std::abs(none.losses[i])) << recompute_name(r) << " step " << i;
    }
    // blocks x micro-batches x steps
    EXPECT_EQ(got.recomputations.at(0), 1 * 4 * kSteps) << recompute_name(r);
    EXPECT_EQ(got.recomputations.at(1), 2 * 4 * kSteps) << recompute_name(r);
    EXPECT_EQ(got.recomputations.at(2), 1 * 4 * kSteps) << recompute_name(r);
  }
}

TEST(PipelineRuntime, TensorParallelStagesFollowTheSingleDeviceCurve) {
  const Curve ref = reference(1.0);
  expect_same_curve(
      ref,
      pipelined(
          {.stages = {kFirst2, kLast2}, .backends = {"cpu", "emu"}, .shapes = {{1, 2}, {1, 2}}, .micro_batches = 4},
          1.0));
  // Data and tensor parallel together, with the optimizer state sharded.
  expect_same_curve(
      ref,
      pipelined({.stages = {kFirst2, kLast2}, .backends = {"cpu", "ref"}, .shapes = {{2, 2}, {2, 2}}, .zero1 = true},
                1.0));
}

TEST(PipelineRuntime, StagesOfDifferentDataAndTensorParallelismReshardAtTheirBoundaries) {
  const Curve ref = reference(1.0);
  // DP 2 -> TP 2 -> DP 1 x TP 1 -> DP 2 x TP 2 over four stages of 1 block, the first holding the embedding.
  const PipelineCase pc{
      .stages = {{true, 0, 1, false}, {false, 1, 2, false}, {false, 2, 3, false}, {false, 3, 4, true}},
      .backends = {"cpu", "emu", "ref", "cpu"},
      .shapes = {{2, 1}, {1, 2}, {1, 1}, {2, 2}},
      .micro_batches = 2};
  expect_same_curve(ref, pipelined(pc, 1.0));
  expect_same_curve(ref, pipelined({.stages = {{true, 0, 1, false}, {false, 1, 4, true}},
                                    .backends = {"emu", "emu"},
                                    .shapes = {{1, 2}, {2, 1}}},
                                   1.0));
  PipelineCase zero = pc;
  zero.zero1 = true;
  zero.gpipe = true;
  expect_same_curve(ref, pipelined(zero, 1.0));
}

// The vocabulary-parallel embedding and head at TP 2 and TP 4, with a vocabulary of 61 that neither divides (rows
// 30 + 31, and 15 + 15 + 15 + 16): both ends' shards differ in size from each other's TP ranks when the ends differ
// in TP (TP 4 | TP 2, DP 2), so the tied embedding's rows are exchanged range by range; ends of one DP but
// unlike TP (TP 2 | TP 4, TP 1 | TP 2) sum the whole vocabulary's rows over both ends' ranks, here in pieces of 100
// floats that split rows of 32 (a piece then holds parts of two ranks' rows, or none of a rank's). The loss follows
// the single-device curve within 1e-4, and the gradients of one step, shards put together, match the unpipelined
// model's.
TEST(PipelineRuntime, VocabularyParallelEmbeddingAndHeadAtTp2AndTp4) {
  const GptConfig config{.n_layer = 4, .n_head = 4, .n_embd = 32, .vocab_size = 61, .seq_len = 16};
  const Curve ref = reference(1.0, config);
  for (const std::vector<StageShape>& shapes : std::vector<std::vector<StageShape>>{{{1, 2}, {1, 2}},
                                                                                    {{1, 4}, {1, 4}},
                                                                                    {{1, 4}, {2, 2}},
                                                                                    {{2, 1}, {1, 4}},
                                                                                    {{1, 2}, {1, 4}},
                                                                                    {{1, 1}, {1, 2}}}) {
    const PipelineCase pc{.stages = {kFirst2, kLast2},
                          .backends = {"cpu", "emu"},
                          .shapes = shapes,
                          .micro_batches = 2,
                          .config = config,
                          .tied_piece_floats = 100};
    expect_same_curve(ref, pipelined(pc, 1.0));
  }
  const Curve ref_grads = reference(0.0, config);
  const Curve got = pipelined({.stages = {kFirst2, kLast2},
                               .backends = {"cpu", "ref"},
                               .shapes = {{1, 4}, {2, 2}},
                               .micro_batches = 2,
                               .config = config},
                              0.0);
  expect_same_grads(ref_grads, got);
  expect_same_grads(ref_grads, pipelined({.stages = {kFirst2, kLast2},
                                          .backends = {"cpu", "ref"},
                                          .shapes = {{1, 1}, {1, 2}},
                                          .micro_batches = 2,
                                          .config = config,
                                          .tied_piece_floats = 100},
                                         0.0));
}

// Partitioned pipeline sends (Megatron-LM's scatter-gather): at TP 2 -> TP 2 each sending rank sends half of a
// micro-batch's activation — 4 rows x 16 positions x 32 channels x 4 B / 2 = 4 KiB per micro-batch — and the
// receiving pair all-gathers; at TP 1 -> TP 2 the one sender sends both halves (8 KiB), and back (TP 2 -> TP 1) each
// of the two senders half. Counted over 2 micro-batches x 20 steps, activations forward and gradients backward.
TEST(PipelineRuntime, EachTensorParallelRankSendsItsShareOfABoundary) {
  const Curve ref = reference(1.0);
  const int64_t half = 4 * 16 * 32 * 4 / 2, total = 2 * kSteps;
  const Curve tp2 = pipelined(
      {.stages = {kFirst2, kLast2}, .backends = {"cpu", "cpu"}, .shapes = {{1, 2}, {1, 2}}, .micro_batches = 2}, 1.0);
  expect_same_curve(ref, tp2);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(tp2.p2p_bytes.at(r), half * total) << "rank " << r;
  const Curve mixed = pipelined(
      {.stages = {kFirst2, kLast2}, .backends = {"cpu", "cpu"}, .shapes = {{1, 1}, {1, 2}}, .micro_batches = 2}, 1.0);
  expect_same_curve(ref, mixed);
  EXPECT_EQ(mixed.p2p_bytes.at(0), 2 * half * total);  // both halves of every activation
  // Backward, TP 2 -> TP 1: the one receiver's chunk comes in two pieces, one from each sending rank.
  EXPECT_EQ(mixed.p2p_bytes.at(1), half * total);
  EXPECT_EQ(mixed.p2p_bytes.at(2), half * total);
}

// The vocabulary as its own part: a first stage holding only the embedding (TP 2), or a last stage only the head
// and loss (TP 2, its vocabulary sharded), the layers elsewhere — the single-device curve.
TEST(PipelineRuntime, TheEmbeddingOrTheHeadAloneOnAStage) {
  const Curve ref = reference(1.0);
  expect_same_curve(ref, pipelined({.stages = {{true, 0, 4, false}, {false, 4, 4, true}},
                                    .backends = {"cpu", "emu"},
                                    .shapes = {{2, 1}, {1, 2}},
                                    .micro_batches = 2},
                                   1.0));
  expect_same_curve(ref, pipelined({.stages = {{true, 0, 0, false}, {false, 0, 2, false}, {false, 2, 4, true}},
                                    .backends = {"emu", "cpu", "ref"},
                                    .shapes = {{1, 2}, {1, 1}, {2, 1}},
                                    .micro_batches = 2},
                                   1.0));
}

// Replicas on chips of different speed take uneven shares of a micro-batch's 4 rows (3 + 1, 1 + 2 + 1, 1 + 3):
// the boundaries reshard row ranges of different sizes, the loss is weighted by each replica's rows, and the curve
// and one step's gradients are the single-device ones (plain data parallelism and ZeRO-1).
TEST(PipelineRuntime, ReplicasTakeUnevenSharesOfAMicroBatch) {
  const Curve ref = reference(1.0);
  const PipelineCase pc{.stages = {kFirst2, kLast2},
                        .backends = {"cpu", "emu"},
                        .shapes = {{2, 1, {3, 1}}, {3, 1, {1, 2, 1}}},
                        .micro_batches = 2};
  expect_same_curve(ref, pipelined(pc, 1.0));
  expect_same_curve(ref, pipelined({.stages = {kFirst2, kLast2},
                                    .backends = {"emu", "cpu"},
                                    .shapes = {{1, 2}, {2, 2, {1, 3}}},
                                    .micro_batches = 2,
                                    .gpipe = true,
                                    .zero1 = true},
                                   1.0));
  const Curve ref_grads = reference(0.0);
  const Curve got = pipelined(pc, 0.0);
  expect_same_grads(ref_grads, got);
}

// Interleaved 1F1B: two stages of two chunks each (virtual stages 0 and 2 on the first, 1 and 3 on the second;
// the second stage's first chunk feeds the first stage's second), one step's gradients and the curve with
// clipping by the norm over every chunk of every rank are the single-device ones; each rank sends, per
// micro-batch, three pieces of a whole (2 x 16 x 32) f32 activation (the first: F of 0 and 2, B of 2; the second:
// F of 1, B of 1 and 3). Then with stages of different DP and TP, and ZeRO-1; and with uneven shares of the rows.
TEST(PipelineRuntime, InterleavedChunksFollowTheSingleDeviceCurve) {
  const PipelineCase pc{
      .stages = {{true, 0, 1, false}, {false, 1, 2, false}, {false, 2, 3, false}, {false, 3, 4, true}},
      .backends = {"cpu", "emu"},
      .micro_batches = 4,
      .chunks = 2};
  const Curve ref = reference(1.0);
  const Curve got = pipelined(pc, 1.0);
  expect_same_curve(ref, got);
  const int64_t activation = 2 * kSeq * 32 * 4;
  for (int r = 0; r < 2; ++r) EXPECT_EQ(got.p2p_bytes.at(r), 3 * activation * 4 * kSteps) << "rank " << r;
  expect_same_grads(reference(0.0), pipelined(pc, 0.0));
  PipelineCase wide = pc;
  wide.shapes = {{2, 1}, {1, 2}};
  wide.zero1 = true;
  expect_same_curve(ref, pipelined(wide, 1.0));
  // Replicas of different speeds with uneven shares of a micro-batch's 4 rows (3 + 1, then 1 + 2 + 1), across the
  // boundary from the second stage's first chunk back to the first stage's second too.
  PipelineCase uneven = pc;
  uneven.shapes = {{2, 1, {3, 1}}, {3, 1, {1, 2, 1}}};
  uneven.micro_batches = 2;
  expect_same_curve(ref, pipelined(uneven, 1.0));
  expect_same_grads(reference(0.0), pipelined(uneven, 0.0));
}

// ZB-H1 (Qi et al. 2024): each rank splits its backwards into B (input gradients, sent at once) and W (weight
// gradients, rank r deferring up to r of them), its W's freeing the activation slots, on stages with data and tensor
// parallelism, the embedding and the head; rank 1 keeping its backward whole beside split ones (-1), and selective
// recomputation on a split stage. The curve and the gradients are the single-device model's.
TEST(PipelineRuntime, ZeroBubbleH1SplitsBackwardsAndFollowsTheSingleDeviceCurve) {
  const Curve ref = reference(1.0);
  const PipelineCase pc{.stages = {{true, 0, 1, false}, {false, 1, 3, false}, {false, 3, 4, true}},
                        .backends = {"cpu", "emu", "ref"},
                        .shapes = {{2, 1}, {1, 2}, {1, 1}},
                        .micro_batches = 4,
                        .zero_bubble = true};
  expect_same_curve(ref, pipelined(pc, 1.0));
  expect_same_grads(reference(0.0), pipelined(pc, 0.0));
  PipelineCase mixed = pc;
  mixed.deferred = {0, -1, 2};
  mixed.recompute = {Recompute::kNone, Recompute::kFull, Recompute::kSelective};
  expect_same_curve(ref, pipelined(mixed, 1.0));
}

TEST(PipelineRuntime, GradientsMatchTheUnpipelinedModel) {
  const Curve ref = reference(0.0);
  const Curve got = pipelined({.stages = {{true, 0, 1, false}, {false, 1, 4, true}},
                               .backends = {"cpu", "ref"},
                               .shapes = {{2, 2}, {1, 2}},
                               .micro_batches = 2},
                              0.0);
  expect_same_grads(ref, got);
}

}  // namespace
}  // namespace h2
