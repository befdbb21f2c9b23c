// The GPT model: sizes against published numbers and against the cost formulas, gradients against finite
// differences, and ranges against the whole model.
#include "model/gpt.h"

#include <cmath>

#include "core/rng.h"
#include "device/emu/device.h"
#include "device/registry.h"
#include "model/align.h"
#include "model/costs.h"
#include "test_util.h"

namespace h2 {
namespace {

using ::testing::HasSubstr;
using testing_util::error_of;

const GptConfig kTiny{.n_layer = 2, .n_head = 2, .n_embd = 8, .vocab_size = 11, .seq_len = 6};

std::vector<float> host(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  copy_to_host(v.data(), t);
  return v;
}

Tensor random_tokens(Device& dev, int B, int T, int V, uint64_t seed) {
  Tensor t = dev.empty(DType::kI32, {B, T});
  Rng rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data_as<int32_t>()[i] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(V)));
  return t;
}

TEST(Costs, Gpt2SmallHasItsPublishedParameterCount) {
  // GPT-2 small (124M): 124,439,808 parameters in the Hugging Face checkpoint.
  const TransformerShape s = GptConfig{12, 12, 768, 50257, 1024}.shape();
  EXPECT_EQ(total_params(s), 124'439'808);
}

// Every range, recomputation policy, slot count and TP rank allocates exactly what costs.h's stage_memory counts
// for the model: parameters, gradients, each slot's activations, the shared recomputation buffers, the gradient
// scratch (and under TP, the head's loss statistics). The vocabulary 11 is not divisible by TP 2: the ranks hold
// 5 and 6 rows. In bf16 the model also holds the f32 master copy (the optimizer term's master part).
TEST(Gpt, AllocatesWhatStageMemoryCounts) {
  auto dev = create_device(DeviceSpec{.backend = "cpu"});
  const int B = 3, T = 5;
  const auto nothing = [](const Tensor&) {};
  // ... and ranges that begin or end inside a block: the embedding and block 0's attention half; block 0's MLP half
  // and block 1's attention half; block 1's MLP half and the head; a lone MLP half; a lone attention half.
  for (GptRange range :
       {GptRange::whole(kTiny), GptRange{true, 0, 1, false}, GptRange{false, 1, 2, false}, GptRange{false, 2, 2, true},
        GptRange{false, 0, 2, true}, GptRange{true, 0, 1, false, false, true}, GptRange{false, 0, 2, false, true, true},
        GptRange{false, 1, 2, true, true, false}, GptRange{false, 0, 1, false, true, false},
        GptRange{false, 1, 2, false, false, true}}) {
    for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
      // With 3 slots, the backward split (a zero-bubble schedule's) where it may: 2 micro-batches' pending gradients.
      for (auto [slots, precision] :
           {std::pair{1, Precision::kF32}, {3, Precision::kF32}, {1, Precision::kBf16}, {3, Precision::kBf16}}) {
        for (auto [rank, size, redo] :
             {std::tuple{0, 1, -1}, {0, 2, -1}, {1, 2, -1}, {0, 1, 0}, {0, 1, 1}, {1, 2, 1}}) {
          if (r == Recompute::kNone && redo >= 0) continue;
          const int pending = slots > 1 && (r != Recompute::kFull || redo == 0) ? 2 : 0;
          const size_t before = dev->mem_used_bytes();
          Gpt m(kTiny, *dev, range, B, T, TensorParallel{rank, size, nothing, nothing},
                ActivationPolicy{r, slots, precision, redo, pending});
          const ElementBytes bytes = ElementBytes::of(precision);
          const StageMemory want = stage_memory({.shape = kTiny.shape(),
                                                 .embedding = range.embedding,
                                                 .head = range.head,
                                                 .layers = range.end_block - range.first_block,
                                                 .starts_at_mlp = range.starts_at_mlp,
                                                 .ends_at_attention = range.ends_at_attention,
                                                 .rows = B,
                                                 .seq = T,
                                                 .tp = size,
                                                 .tp_rank = rank,
                                                 .recompute = r,
                                                 .recompute_blocks = redo,
                                                 .in_flight = slots,
                                                 .pending_weights = pending,
                                                 .bytes = bytes});
          const double model = want.weights + static_cast<double>(m.num_params()) * bytes.master + want.grads +
                               slots * want.activations + want.recompute + want.grad_scratch + want.pending +
                               (range.head && size > 1 ? 3.0 * B * T * 4 : 0);
          EXPECT_EQ(m.num_params(), stage_params({.shape = kTiny.shape(),
                                                  .embedding = range.embedding,
                                                  .head = range.head,
                                                  .layers = range.end_block - range.first_block,
                                                  .starts_at_mlp = range.starts_at_mlp,
                                                  .ends_at_attention = range.ends_at_attention,
                                                  .tp = size,
                                                  .tp_rank = rank}));
          EXPECT_DOUBLE_EQ(static_cast<double>(dev->mem_used_bytes() - before), model)
              << "blocks [" << range.first_block << ", " << range.end_block << ")" << (range.embedding ? " +E" : "")
              << (range.starts_at_mlp ? " from MLP" : "") << (range.ends_at_attention ? " to attention" : "")
              << (range.head ? " +H " : " ") << recompute_name(r) << " on " << redo << ", " << slots << " slots, "
              << pending << " pending, TP rank " << rank << " of " << size << ", " << precision_name(precision);
          EXPECT_DOUBLE_EQ(m.allocated().pending, want.pending);
        }
      }
    }
  }
  // The whole model at TP 1 is GPT-2's parameter count.
  EXPECT_EQ(stage_params({.shape = kTiny.shape(), .embedding = true, .head = true, .layers = kTiny.n_layer}),
            total_params(kTiny.shape()));
}

// Recomputing only the first blocks of a stage (Megatron-LM's block method): a middle stage's activations are its
// blocks' sums, so by hand those of a stage of the recomputed blocks alone plus those of a stage of the rest alone,
// each under its own policy; the shared buffer is the recomputing stage's. The order is the stage's: a first MLP
// half, whole blocks, a last attention half.
TEST(Costs, RecomputingTheFirstBlocksCostsThemAsRecomputedAndTheRestAsKept) {
  const TransformerShape s = GptConfig{4, 2, 8, 11, 6}.shape();
  const auto mem = [&](int64_t layers, Recompute r, int64_t redo, bool mlp_first = false, bool attention_last = false) {
    return stage_memory({.shape = s,
                         .layers = layers,
                         .starts_at_mlp = mlp_first,
                         .ends_at_attention = attention_last,
                         .rows = 2,
                         .recompute = r,
                         .recompute_blocks = redo});
  };
  for (Recompute r : {Recompute::kSelective, Recompute::kFull}) {
    // 4 whole blocks, the first 1 recomputed.
    const StageMemory part = mem(4, r, 1);
    EXPECT_DOUBLE_EQ(part.activations, mem(1, r, -1).activations + mem(3, Recompute::kNone, -1).activations);
    EXPECT_DOUBLE_EQ(part.recompute, mem(1, r, -1).recompute);
    EXPECT_GT(part.recompute, 0);
    EXPECT_DOUBLE_EQ(part.weights, mem(4, Recompute::kNone, -1).weights);
    // 0 recomputed is none at all, buffer included; 4 (or more) is every block.
    EXPECT_DOUBLE_EQ(mem(4, r, 0).total(), mem(4, Recompute::kNone, -1).total());
    EXPECT_DOUBLE_EQ(mem(4, r, 9).total(), mem(4, r, -1).total());
    // An MLP half, 2 blocks and an attention half, the first 3 recomputed: the MLP half and both blocks (by hand,
    // a stage of the MLP half and 2 blocks with an attention half kept).
    const StageMemory halves = mem(4, r, 3, true, true);
    EXPECT_DOUBLE_EQ(halves.activations, mem(3, r, -1, true).activations +
                                             mem(2, Recompute::kNone, -1, true, true).activations -
                                             mem(1, Recompute::kNone, -1, true).activations);
  }
}

// An interleaved stage of 5 blocks in 2 chunks is, by hand, a model of the embedding and blocks 0-1 keeping 3
// micro-batches in flight and one of blocks 2-4 and the head keeping 2: chunked_stage_memory counts what those two
// models allocate, in f32 and bf16, with and without recomputation, and recomputing the stage's first 3 blocks only.
TEST(Gpt, ChunkedStageMemoryIsWhatItsChunksModelsAllocate) {
  const GptConfig five{.n_layer = 5, .n_head = 2, .n_embd = 8, .vocab_size = 11, .seq_len = 6};
  auto dev = create_device(DeviceSpec{.backend = "cpu"});
  const int B = 2, T = 6;
  const int in_flight[] = {3, 2};
  for (Precision precision : {Precision::kF32, Precision::kBf16}) {
    // ... and the stage's first 3 blocks recomputed: the first chunk's 2, the second's first 1.
    for (auto [r, redo] : {std::pair{Recompute::kNone, -1}, {Recompute::kFull, -1}, {Recompute::kFull, 3}}) {
      const size_t before = dev->mem_used_bytes();
      Gpt first(five, *dev, GptRange{true, 0, 2, false}, B, T, {},
                ActivationPolicy{r, 3, precision, redo < 0 ? -1 : 2});
      Gpt second(five, *dev, GptRange{false, 2, 5, true}, B, T, {},
                 ActivationPolicy{r, 2, precision, redo < 0 ? -1 : redo - 2});
      const ElementBytes bytes = ElementBytes::of(precision);
      const StageMemory m = chunked_stage_memory({.shape = five.shape(),
                                                  .embedding = true,
                                                  .head = true,
                                                  .layers = 5,
                                                  .rows = B,
                                                  .seq = T,
                                                  .recompute = r,
                                                  .recompute_blocks = redo,
                                                  .bytes = bytes},
                                                 in_flight);
      const double params = static_cast<double>(first.num_params() + second.num_params());
      EXPECT_DOUBLE_EQ(static_cast<double>(dev->mem_used_bytes() - before),
                       m.weights + params * bytes.master + m.grads + m.activations + m.recompute + m.grad_scratch)
          << recompute_name(r) << " on " << redo << ", " << precision_name(precision);
      EXPECT_EQ(m.in_flight, 1);  // the chunks' in-flight counts are in the terms
    }
  }
}

// L(theta) along a random direction d: (L(theta + e d) - L(theta - e d)) / 2e must equal <grad, d>.
TEST(Gpt, GradientMatchesFiniteDifferences) {
  auto dev = create_device(DeviceSpec{.backend = "ref"});
  const int B = 2, T = 5;
  Gpt model(kTiny, *dev, GptRange::whole(kTiny), B, T);
  model.init(3);
  // Larger weights than GPT-2's init make the loss depend on every parameter visibly.
  std::vector<float> theta = host(model.flat_params());
  Rng rng(9);
  for (float& x : theta) x += static_cast<float>(rng.normal() * 0.3);
  copy_from_host(model.flat_params(), theta.data());
  Tensor tokens = random_tokens(*dev, B, T, kTiny.vocab_size, 1),
         targets = random_tokens(*dev, B, T, kTiny.vocab_size, 2);
  auto loss_at = [&](const std::vector<float>& p) {
    copy_from_host(model.flat_params(), p.data());
    model.forward(tokens);
    return static_cast<double>(model.loss(targets));
  };
  model.zero_grads();
  loss_at(theta);
  model.backward();
  const std::vector<float> grad = host(model.flat_grads());
  for (uint64_t trial = 0; trial < 3; ++trial) {
    Rng dr(100 + trial);
    std::vector<float> d(theta.size()), up(theta.size()), down(theta.size());
    double analytic = 0.0;
    const double eps = 1e-3;
    for (size_t i = 0; i < theta.size(); ++i) {
      d[i] = static_cast<float>(dr.normal());
      analytic += static_cast<double>(grad[i]) * d[i];
      up[i] = theta[i] + static_cast<float>(eps) * d[i];
      down[i] = theta[i] - static_cast<float>(eps) * d[i];
    }
    const double numeric = (loss_at(up) - loss_at(down)) / (2 * eps);
    EXPECT_NEAR(numeric, analytic, 1e-2 * std::max(1.0, std::abs(analytic))) << "direction " << trial;
  }
}

TEST(Gpt, RangesComputeWhatTheWholeModelComputes) {
  auto dev = create_device(DeviceSpec{.backend = "cpu"});
  const int B = 2, T = 6;
  GptConfig c = kTiny;
  c.n_layer = 3;
  Gpt whole(c, *dev, GptRange::whole(c), B, T);
  Gpt first(c, *dev, GptRange{true, 0, 1, false}, B, T);
  Gpt second(c, *dev, GptRange{false, 1, 3, true}, B, T);
  for (Gpt* m : {&whole, &first, &second}) m->init(7);
  Tensor tokens = random_tokens(*dev, B, T, c.vocab_size, 3), targets = random_tokens(*dev, B, T, c.vocab_size, 4);

  whole.zero_grads();
  whole.forward(tokens);
  const float loss_whole = whole.loss(targets);
  whole.backward();

  first.zero_grads();
  second.zero_grads();
  first.forward(tokens);
  second.forward(first.output());
  const float loss_split = second.loss(targets);
  second.backward();
  first.backward(second.dinput());
  EXPECT_FLOAT_EQ(loss_whole, loss_split);

  // Each parameter's gradient matches; wte's is split between the two ends (tied embedding).
  auto grad_of = [](Gpt& m, const std::string& name) {
    for (const Gpt::Param& p : m.params()) {
      if (p.name == name) return host(p.grad);
    }
    return std::vector<float>();
  };
  for (const Gpt::Param& p : whole.params()) {
    std::vector<float> want = host(p.grad), got = grad_of(first, p.name), tail = grad_of(second, p.name);
    if (got.empty())
      got = tail;
    else if (!tail.empty())
      for (size_t i = 0; i < got.size(); ++i) got[i] += tail[i];
    ASSERT_EQ(got.size(), want.size()) << p.name;
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6f) << p.name << "[" << i << "]";
  }
}

// Stages whose boundaries fall inside blocks compute what the whole model computes: the embedding, block 0 and
// block 1's attention half | block 1's MLP half and block 2's attention half | block 2's MLP half and the head,
// under each recomputation policy, chained through output() and dinput() as a pipeline chains them. The whole
// model is the reference: the same loss and, for every parameter, the same gradient (wte's summed over both ends).
TEST(Gpt, RangesSplitInsideBlocksComputeWhatTheWholeModelComputes) {
  auto dev = create_device(DeviceSpec{.backend = "cpu"});
  const int B = 2, T = 6;
  GptConfig c = kTiny;
  c.n_layer = 3;
  Tensor tokens = random_tokens(*dev, B, T, c.vocab_size, 3), targets = random_tokens(*dev, B, T, c.vocab_size, 4);
  // The stages recompute their every block, or only their first (Megatron-LM's block method); the reference keeps
  // every activation.
  for (auto [r, redo] : {std::pair{Recompute::kNone, -1},
                         {Recompute::kSelective, -1},
                         {Recompute::kFull, -1},
                         {Recompute::kSelective, 1},
                         {Recompute::kFull, 1}}) {
    const ActivationPolicy policy{r, 1, Precision::kF32, redo};
    Gpt whole(c, *dev, GptRange::whole(c), B, T, {}, ActivationPolicy{});
    std::vector<Gpt> stages;
    stages.reserve(3);
    stages.emplace_back(c, *dev, GptRange{true, 0, 2, false, false, true}, B, T, TensorParallel{}, policy);
    stages.emplace_back(c, *dev, GptRange{false, 1, 3, false, true, true}, B, T, TensorParallel{}, policy);
    stages.emplace_back(c, *dev, GptRange{false, 2, 3, true, true, false}, B, T, TensorParallel{}, policy);
    whole.init(7);
    whole.zero_grads();
    whole.forward(tokens);
    const float loss_whole = whole.loss(targets);
    whole.backward();
    for (Gpt& m : stages) {
      m.init(7);
      m.zero_grads();
    }
    stages[0].forward(tokens);
    stages[1].forward(stages[0].output());
    stages[2].forward(stages[1].output());
    const float loss_split = stages[2].loss(targets);
    stages[2].backward();
    stages[1].backward(stages[2].dinput());
    stages[0].backward(stages[1].dinput());
    EXPECT_FLOAT_EQ(loss_whole, loss_split) << recompute_name(r) << " on " << redo;
    size_t params = 0;
    for (const Gpt& m : stages) params += const_cast<Gpt&>(m).params().size();
    EXPECT_EQ(params, whole.params().size() + 1) << "every parameter in one stage, wte in two";
    for (const Gpt::Param& p : whole.params()) {
      const std::vector<float> want = host(p.grad);
      std::vector<float> got(want.size(), 0.0f);
      int holders = 0;
      for (Gpt& m : stages) {
        for (const Gpt::Param& q : m.params()) {
          if (q.name != p.name) continue;
          ++holders;
          const std::vector<float> g = host(q.grad);
          ASSERT_EQ(g.size(), want.size()) << p.name;
          for (size_t i = 0; i < g.size(); ++i) got[i] += g[i];
        }
      }
      EXPECT_EQ(holders, p.name == "wte.weight" ? 2 : 1) << p.name;
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_NEAR(got[i], want[i], 1e-6f) << p.name << "[" << i << "] " << recompute_name(r) << " on " << redo;
      }
    }
  }
}

// A range cannot split a block the embedding or the head must follow whole, nor hold no half of one.
// A backward split into input and weight gradients (ZB-H1's B and W): three micro-batches in the order of a
// zero-bubble stage — F0 F1 B0 F2 W0 B1 B2 W1 W2, two weight gradients pending at once — give every parameter's
// gradient and every input gradient bit for bit what whole backwards in 1F1B's order give (the reference, itself
// checked against finite differences above), in f32 and bf16, for the whole model and for stages that begin or end
// inside a block, with the embedding or the head; pending buffers are held from B to W and refused when full.
TEST(Gpt, SplitBackwardComputesWhatAWholeBackwardComputes) {
  auto dev = create_device(DeviceSpec{.backend = "cpu"});
  const int B = 2, T = 6;
  GptConfig c = kTiny;
  c.n_layer = 3;
  std::vector<Tensor> tokens, targets, douts;
  for (int i = 0; i < 3; ++i) {
    tokens.push_back(random_tokens(*dev, B, T, c.vocab_size, 10 + i));
    targets.push_back(random_tokens(*dev, B, T, c.vocab_size, 20 + i));
    Tensor d = dev->empty(DType::kF32, {B, T, c.n_embd});
    Rng rng(30 + i);
    for (int64_t j = 0; j < d.numel(); ++j) d.data_as<float>()[j] = static_cast<float>(rng.normal());
    douts.push_back(d);
  }
  for (Precision precision : {Precision::kF32, Precision::kBf16}) {
    for (GptRange range : {GptRange::whole(c), GptRange{true, 0, 2, false, false, true},
                           GptRange{false, 1, 3, false, true, true}, GptRange{false, 2, 3, true, true, false}}) {
      const std::string what = cat(precision_name(precision), " blocks [", range.first_block, ", ", range.end_block,
                                   ")", range.embedding ? " +E" : "", range.head ? " +H" : "");
      // A range without the embedding takes activations; one without the head a given output gradient.
      std::vector<Tensor> inputs = tokens;
      if (!range.embedding) {
        for (int i = 0; i < 3; ++i) inputs[static_cast<size_t>(i)] = douts[static_cast<size_t>(2 - i)];
      }
      Gpt whole(c, *dev, range, B, T, {}, ActivationPolicy{Recompute::kNone, 3, precision});
      Gpt split(c, *dev, range, B, T, {}, ActivationPolicy{Recompute::kNone, 3, precision, -1, 2});
      std::vector<float> losses_whole, losses_split;
      std::vector<std::vector<float>> dinputs_whole, dinputs_split;
      const auto forward = [&](Gpt& m, int i, std::vector<float>& losses) {
        m.use_slot(i);
        m.forward(inputs[static_cast<size_t>(i)]);
        if (range.head) losses.push_back(m.loss(targets[static_cast<size_t>(i)], 1.0f / 3));
      };
      const auto backward = [&](Gpt& m, int i, std::vector<std::vector<float>>& dinputs) {
        m.use_slot(i);
        m.backward(range.head ? Tensor() : douts[static_cast<size_t>(i)]);
        if (!range.embedding) dinputs.push_back(host(m.dinput()));
      };
      whole.init(7);
      whole.zero_grads();
      for (int i = 0; i < 3; ++i) {
        forward(whole, i, losses_whole);
        backward(whole, i, dinputs_whole);
      }
      split.init(7);
      split.zero_grads();
      forward(split, 0, losses_split);
      forward(split, 1, losses_split);
      if (!range.head) {  // a backward that fails holds no pending buffers
        split.use_slot(0);
        EXPECT_THAT(error_of([&] { split.backward(tokens[0]); }, ErrorCode::kInvalidArgument),
                    HasSubstr("expected the output gradient"));
        EXPECT_FALSE(split.weights_pending()) << what;
      }
      backward(split, 0, dinputs_split);
      EXPECT_TRUE(split.weights_pending()) << what;
      EXPECT_THAT(error_of([&] { split.forward(inputs[0]); }, ErrorCode::kInvalidArgument),
                  HasSubstr("activation slot 0 still holds a micro-batch whose weight gradients wait"))
          << what;
      forward(split, 2, losses_split);
      split.use_slot(0);
      split.backward_weights();
      EXPECT_FALSE(split.weights_pending()) << what;
      EXPECT_THAT(error_of([&] { split.backward_weights(); }, ErrorCode::kInvalidArgument),
                  HasSubstr("activation slot 0 has no weight gradients pending (backward() on this slot first)"))
          << what;
      backward(split, 1, dinputs_split);
      backward(split, 2, dinputs_split);
      // Two wait now, as many as the policy holds: a third micro-batch's B would have nowhere to keep its own.
      split.use_slot(0);
      split.forward(inputs[0]);
      if (range.head) split.loss(targets[0]);
      EXPECT_THAT(error_of([&] { split.backward(range.head ? Tensor() : douts[0]); }, ErrorCode::kInvalidArgument),
                  HasSubstr("2 micro-batches already wait for their weight gradients"))
          << what;
      for (int i = 1; i < 3; ++i) {
        split.use_slot(i);
        split.backward_weights();
      }
      EXPECT_EQ(losses_split, losses_whole) << what;
      EXPECT_EQ(dinputs_split, dinputs_whole) << what;
      for (size_t p = 0; p < whole.params().size(); ++p) {
        EXPECT_EQ(host(split.params()[p].grad), host(whole.params()[p].grad)) << whole.params()[p].name << ", " << what;
      }
    }
  }
  // Without pending buffers there is nothing to compute later; full recomputation cannot keep what W reads.
  Gpt plain(c, *dev, GptRange::whole(c), B, T);
  plain.init(1);
  EXPECT_THAT(error_of([&] { plain.backward_weights(); }, ErrorCode::kInvalidArgument),
              HasSubstr("policy.pending_weights is 0: backward() computed them"));
  EXPECT_THAT(
      error_of(
          [&] {
            Gpt(c, *dev, GptRange::whole(c), B, T, {}, ActivationPolicy{Recompute::kFull, 2, Precision::kF32, -1, 1});
          },
          ErrorCode::kInvalidArgument),
      HasSubstr("full recomputation rewrites them into one buffer"));
}

TEST(Gpt, ARangeSplittingABlockWrongIsRefused) {
  auto dev = create_device(DeviceSpec{.backend = "cpu"});
  for (GptRange bad : {GptRange{true, 0, 1, false, true, false}, GptRange{false, 1, 2, true, false, true},
                       GptRange{false, 0, 1, false, true, true}, GptRange{false, 1, 1, false, true, false}}) {
    EXPECT_THAT(testing_util::error_of([&] { Gpt(kTiny, *dev, bad, 2, 6); }, ErrorCode::kInvalidArgument),
                ::testing::HasSubstr("hold no half of a block or split one"));
  }
  EXPECT_EQ(dev->mem_used_bytes(), 0u);
}

// One forward and backward of a 3-layer model on `backend` in `precision`: the loss and every gradient.
struct Pass {
  float loss;
  std::vector<float> grads;
};
Pass one_pass(const std::string& backend, Precision precision, Recompute recompute = Recompute::kNone) {
  auto dev = create_device(DeviceSpec{.backend = backend});
  const int B = 2, T = 6;
  GptConfig c{.n_layer = 3, .n_head = 2, .n_embd = 32, .vocab_size = 40, .seq_len = 6};
  Gpt m(c, *dev, GptRange::whole(c), B, T, {}, ActivationPolicy{.recompute = recompute, .precision = precision});
  m.init(7);
  Tensor tokens = random_tokens(*dev, B, T, c.vocab_size, 3), targets = random_tokens(*dev, B, T, c.vocab_size, 4);
  m.zero_grads();
  m.forward(tokens);
  const float loss = m.loss(targets);
  m.backward();
  return {loss, host(m.flat_grads())};
}

double normalised_error(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
    norm += double{b[i]} * b[i];
  }
  return std::sqrt(diff / norm);
}

// bf16 training's numerics. The cpu backend's bf16 path against the ref backend's (which widens bf16 and sums in
// f64: the same rounding points, computed independently) agree but for the few bf16 activations whose f32 values
// (LayerNorm, the products, attention, GELU, which differ between the backends in their last bits) straddle a bf16
// rounding boundary: 1e-7 in the Release build, 2.6e-4 in the sanitizer build, where the cpu kernels compile
// differently. Rounding dout by truncation instead of to nearest gives 5.6e-3. Against f32, bf16 differs by the
// rounding of the block's activations to 8 bits of mantissa: visibly, so the bf16 path did run, but by well under
// a percent (2.8e-3).
// Recomputation in bf16 recomputes the same bf16 activations.
TEST(Gpt, Bf16MatchesTheReferenceAndStaysNearF32) {
  const Pass cpu = one_pass("cpu", Precision::kBf16), ref = one_pass("ref", Precision::kBf16);
  const Pass f32 = one_pass("cpu", Precision::kF32);
  EXPECT_NEAR(cpu.loss, ref.loss, 1e-5 * ref.loss);
  EXPECT_LT(normalised_error(cpu.grads, ref.grads), 1e-3);
  EXPECT_NEAR(cpu.loss, f32.loss, 1e-3 * f32.loss);
  const double from_f32 = normalised_error(cpu.grads, f32.grads);
  EXPECT_GT(from_f32, 1e-4);
  EXPECT_LT(from_f32, 2e-2);
  for (Recompute r : {Recompute::kSelective, Recompute::kFull}) {
    const Pass again = one_pass("cpu", Precision::kBf16, r);
    EXPECT_FLOAT_EQ(again.loss, cpu.loss) << recompute_name(r);
    EXPECT_LT(normalised_error(again.grads, cpu.grads), 1e-6) << recompute_name(r);
  }
}

// The runtimes refresh the products' bf16 copy of the weights at the end of their optimizer step (where the cost
// model charges it): once the master changed, refresh_bf16_weights() rounds it to nearest even into the copy,
// and before that the copy is the old one. In f32 there is no copy.
TEST(Gpt, RefreshingTheBf16WeightsRoundsTheChangedMaster) {
  auto dev = create_device(DeviceSpec{.backend = "cpu"});
  Gpt m(kTiny, *dev, GptRange::whole(kTiny), 2, 6, {}, ActivationPolicy{.precision = Precision::kBf16});
  m.init(3);
  m.refresh_bf16_weights();
  const int64_t n = m.num_params();
  std::vector<float> master = host(m.flat_params());
  for (float& x : master) x = x * 1.5f + 0.001f;  // what an optimizer step might do
  copy_from_host(m.flat_params(), master.data());
  m.parameters_changed();
  const auto copy = [&] {
    std::vector<bf16_t> v(static_cast<size_t>(n));
    copy_to_host(v.data(), m.bf16_weights());
    return v;
  };
  const std::vector<bf16_t> stale = copy();
  m.refresh_bf16_weights();
  const std::vector<bf16_t> fresh = copy();
  int64_t changed = 0, wrong = 0;
  for (size_t i = 0; i < fresh.size(); ++i) {
    changed += fresh[i] != stale[i];
    wrong += fresh[i] != f32_to_bf16(master[i]);
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_GT(changed, n / 2);
  Gpt f32(kTiny, *dev, GptRange::whole(kTiny), 2, 6);
  f32.init(3);
  f32.refresh_bf16_weights();
  EXPECT_FALSE(f32.bf16_weights().defined());
}

TEST(Gpt, InitDependsOnlyOnNameAndSeed) {
  auto dev = create_device(DeviceSpec{.backend = "cpu"});
  Gpt whole(kTiny, *dev, GptRange::whole(kTiny), 1, 2);
  Gpt tail(kTiny, *dev, GptRange{false, 1, 2, true}, 1, 2);
  whole.init(5);
  tail.init(5);
  for (const Gpt::Param& p : tail.params()) {
    for (const Gpt::Param& q : whole.params()) {
      if (q.name == p.name) {
        EXPECT_EQ(host(p.value), host(q.value)) << p.name;
      }
    }
  }
}

TEST(Gpt, BadConfigsAreErrors) {
  EXPECT_THAT(testing_util::error_of(
                  [] {
                    GptConfig{2, 3, 8, 11, 6}.validate();
                  },
                  ErrorCode::kInvalidArgument),
              ::testing::HasSubstr("n_head = 3 does not divide n_embd = 8"));
  const ConfigNode node =
      ConfigNode::parse_string("n_layer: 2\nn_head: 2\nn_embd: 8\nvocab_size: 0\nseq_len: 4\n", "m.yaml");
  EXPECT_THAT(testing_util::error_of([&] { GptConfig::from_config(node); }, ErrorCode::kConfig),
              ::testing::HasSubstr("m.yaml:4:13: field 'vocab_size': must be a positive integer"));
}

// A model far past the device's memory is refused before anything is allocated, naming the sizes (it used to grow
// the host's memory to 18 GB and end in bad_alloc).
TEST(Gpt, AModelPastTheDevicesMemoryIsRefusedBeforeAllocating) {
  auto dev = create_device(DeviceSpec{.backend = "cpu", .mem_capacity_bytes = size_t{64} << 20});
  GptConfig huge = kTiny;
  huge.n_layer = 1 << 30;
  EXPECT_THAT(testing_util::error_of([&] { Gpt(huge, *dev, GptRange::whole(huge), 2, 6); }, ErrorCode::kOutOfMemory),
              ::testing::HasSubstr("1073741824 blocks of n_embd 8"));
  EXPECT_EQ(dev->mem_used_bytes(), 0u);
}

// Recomputation runs once per block in backward, and only under a recomputing policy; the model times it (the
// figure bench_recompute sets beside the cost model's), so the time is zero exactly when nothing was recomputed.
TEST(Gpt, CountsAndTimesItsRecomputation) {
  auto dev = create_device(DeviceSpec{.backend = "cpu"});
  const int B = 2, T = 6;
  Tensor tokens = random_tokens(*dev, B, T, kTiny.vocab_size, 3),
         targets = random_tokens(*dev, B, T, kTiny.vocab_size, 4);
  // Of the 2 blocks: every one (-1), none (0) or the first (1).
  for (auto [r, redo] : {std::pair{Recompute::kNone, -1},
                         {Recompute::kSelective, -1},
                         {Recompute::kFull, -1},
                         {Recompute::kFull, 0},
                         {Recompute::kSelective, 1},
                         {Recompute::kFull, 1}}) {
    Gpt m(kTiny, *dev, GptRange::whole(kTiny), B, T, {}, ActivationPolicy{.recompute = r, .recompute_blocks = redo});
    m.init(1);
    for (int step = 1; step <= 2; ++step) {
      m.forward(tokens);
      m.loss(targets);
      m.backward();
      const int64_t want = r == Recompute::kNone ? 0 : int64_t{step} * (redo < 0 ? kTiny.n_layer : redo);
      EXPECT_EQ(m.recomputed_blocks(), want) << recompute_name(r) << " on " << redo;
      EXPECT_EQ(m.recompute_seconds() > 0, want > 0) << recompute_name(r) << " on " << redo;
    }
  }
}

// h2 align: two devices with the same kernels agree exactly; an emulated chip whose matrix products accumulate in
// bf16 is named at the first matrix product of the first layer; one with bf16-rounded matrix inputs too (its error
// is smaller but over the f32 tolerance); a chip with another backend's kernels (ref) stays within every tolerance.
TEST(Align, NamesTheFirstOperatorWhereTwoChipsDiverge) {
  const GptConfig config{.n_layer = 2, .n_head = 2, .n_embd = 16, .vocab_size = 24, .seq_len = 8};
  auto host = create_device(DeviceSpec{.backend = "cpu"});
  const auto emu = [](Numerics n) {
    return create_device(DeviceSpec{
        .backend = "emu",
        .emu =
            EmuProfile{.chip = numerics_name(n), .speed = 1.0, .mem_capacity_bytes = size_t{64} << 20, .numerics = n}});
  };
  auto same = emu(Numerics::kExact);
  const AlignReport exact = align_devices(config, *same, *host, 2, 8, 3);
  EXPECT_EQ(exact.first_divergence, -1);
  for (const AlignRow& row : exact.rows) EXPECT_EQ(row.error, 0.0) << row.name;
  EXPECT_THAT(format_alignment(exact, "emu", "cpu"), ::testing::HasSubstr("no divergence"));
  for (Numerics n : {Numerics::kBf16Accumulate, Numerics::kBf16Matmul}) {
    auto odd = emu(n);
    const AlignReport r = align_devices(config, *odd, *host, 2, 8, 3);
    ASSERT_GE(r.first_divergence, 0) << numerics_name(n);
    const AlignRow& first = r.rows[static_cast<size_t>(r.first_divergence)];
    EXPECT_EQ(first.name, "h.0.attn.c_attn (forward)") << numerics_name(n);
    EXPECT_EQ(first.op, "matmul_forward");
    EXPECT_EQ(r.rows[0].error, 0.0);  // the embedding before it is exact
    EXPECT_THAT(format_alignment(r, "emu", "cpu"),
                ::testing::HasSubstr("first divergence: h.0.attn.c_attn (forward) (matmul_forward)"));
  }
  auto reference = create_device(DeviceSpec{.backend = "ref"});
  EXPECT_EQ(align_devices(config, *reference, *host, 2, 8, 3).first_divergence, -1);
  // In bf16 training: the chip that keeps its sums in bf16 is named at the same product; a chip whose tensor cores
  // round to bf16 is what bf16 training does anyway, so it agrees; so do the two backends.
  const AlignReport low = align_devices(config, *emu(Numerics::kBf16Accumulate), *host, 2, 8, 3, Precision::kBf16);
  ASSERT_GE(low.first_divergence, 0);
  EXPECT_EQ(low.rows[static_cast<size_t>(low.first_divergence)].name, "h.0.attn.c_attn (forward)");
  EXPECT_EQ(align_devices(config, *emu(Numerics::kBf16Matmul), *host, 2, 8, 3, Precision::kBf16).first_divergence, -1);
  EXPECT_EQ(align_devices(config, *reference, *host, 2, 8, 3, Precision::kBf16).first_divergence, -1);
}

}  // namespace
}  // namespace h2
