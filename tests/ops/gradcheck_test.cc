// Finite-difference checks of every backward op of the ref backend (run in double), and closed-form checks of
// the ops that are not gradients (AdamW, global norm). These anchor `ref`, which anchors every other backend.
//
// For an op y = f(x) and a fixed random R, L(x) = sum(R * f(x)); the backward op with dout = R must return
// dL/dx, which we compare with central differences (L(x + h e_i) - L(x - h e_i)) / 2h for every element.
#include <cmath>
#include <functional>
#include <vector>

#include "core/rng.h"
#include "ops/ref/kernels.h"
#include "test_util.h"

namespace h2 {
namespace {

using Vec = std::vector<double>;

Vec random_vec(size_t n, uint64_t seed, double lo = 0.0) {
  Rng rng(seed);
  Vec v(n);
  for (double& x : v) x = lo == 0.0 ? rng.normal() : lo + rng.uniform();
  return v;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Compares `analytic` with central differences of `loss` with respect to every element of `x`.
void expect_gradient(const char* what, Vec& x, const Vec& analytic, const std::function<double()>& loss) {
  constexpr double kStep = 1e-6;
  ASSERT_EQ(x.size(), analytic.size());
  double worst = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + kStep;
    const double up = loss();
    x[i] = saved - kStep;
    const double down = loss();
    x[i] = saved;
    const double numeric = (up - down) / (2 * kStep);
    worst = std::max(worst, std::abs(numeric - analytic[i]) / std::max(1.0, std::abs(numeric)));
  }
  EXPECT_LT(worst, 1e-6) << what;
}

TEST(GradCheck, Encoder) {
  const int B = 2, T = 3, C = 4, V = 5;
  const std::vector<int32_t> tokens = {1, 4, 1, 0, 2, 1};  // token 1 repeats: its gradient rows must add up
  Vec wte = random_vec(V * C, 1), wpe = random_vec(T * C, 2), r = random_vec(B * T * C, 3), out(B * T * C);
  auto loss = [&] {
    ref::encoder_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C, 0, V);
    return dot(r, out);
  };
  Vec dwte(V * C, 0.0), dwpe(T * C, 0.0);
  ref::encoder_backward(dwte.data(), dwpe.data(), r.data(), tokens.data(), B, T, C, 0, V);
  expect_gradient("dwte", wte, dwte, loss);
  expect_gradient("dwpe", wpe, dwpe, loss);
}

// Two vocabulary-parallel shards (rows [0, 2) and [2, 5)) without positions, then positions alone: their outputs
// add up to the whole table's, and each shard's gradient is its rows of the whole gradient.
TEST(ClosedForm, EncoderShardsSumToTheWholeTable) {
  const int B = 2, T = 3, C = 4, V = 5;
  const std::vector<int32_t> tokens = {1, 4, 1, 0, 2, 1};
  const Vec wte = random_vec(V * C, 1), wpe = random_vec(T * C, 2), dout = random_vec(B * T * C, 3);
  Vec whole(B * T * C), a(B * T * C), b(B * T * C), pos(B * T * C), zero(C * V, 0.0);
  ref::encoder_forward(whole.data(), tokens.data(), wte.data(), wpe.data(), B, T, C, 0, V);
  ref::encoder_forward(a.data(), tokens.data(), wte.data(), static_cast<const double*>(nullptr), B, T, C, 0, 2);
  ref::encoder_forward(b.data(), tokens.data(), wte.data() + 2 * C, static_cast<const double*>(nullptr), B, T, C, 2, 3);
  ref::encoder_forward(pos.data(), tokens.data(), zero.data(), wpe.data(), B, T, C, 0, V);
  for (size_t i = 0; i < whole.size(); ++i) EXPECT_NEAR(a[i] + b[i] + pos[i], whole[i], 1e-12) << i;
  Vec dwhole(V * C, 0.0), dwpe(T * C, 0.0), dshard(3 * C, 0.0);
  ref::encoder_backward(dwhole.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C, 0, V);
  ref::encoder_backward(dshard.data(), static_cast<double*>(nullptr), dout.data(), tokens.data(), B, T, C, 2, 3);
  for (int i = 0; i < 3 * C; ++i)
    EXPECT_DOUBLE_EQ(dshard[static_cast<size_t>(i)], dwhole[static_cast<size_t>(2 * C + i)]);
}

TEST(GradCheck, Layernorm) {
  const int N = 3, C = 7;
  Vec inp = random_vec(N * C, 1), w = random_vec(C, 2), b = random_vec(C, 3), r = random_vec(N * C, 4);
  Vec out(N * C), mean(N), rstd(N);
  auto loss = [&] {
    ref::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
    return dot(r, out);
  };
  loss();
  Vec dinp(N * C), dw(C, 0.0), db(C, 0.0);
  ref::layernorm_backward(dinp.data(), dw.data(), db.data(), r.data(), inp.data(), w.data(), mean.data(), rstd.data(),
                          N, C);
  expect_gradient("dinp", inp, dinp, loss);
  expect_gradient("dweight", w, dw, loss);
  expect_gradient("dbias", b, db, loss);
}

TEST(GradCheck, Matmul) {
  const int N = 4, C = 5, OC = 3;
  Vec inp = random_vec(N * C, 1), w = random_vec(OC * C, 2), b = random_vec(OC, 3), r = random_vec(N * OC, 4);
  Vec out(N * OC);
  auto loss = [&] {
    ref::matmul_forward(out.data(), inp.data(), w.data(), b.data(), N, C, OC);
    return dot(r, out);
  };
  Vec dinp(N * C), dw(OC * C, 0.0), db(OC, 0.0);
  ref::matmul_backward(dinp.data(), dw.data(), db.data(), r.data(), inp.data(), w.data(), N, C, OC);
  expect_gradient("dinp", inp, dinp, loss);
  expect_gradient("dweight", w, dw, loss);
  expect_gradient("dbias", b, db, loss);
}

TEST(GradCheck, Attention) {
  const int B = 2, T = 4, C = 6, NH = 2;
  Vec qkv = random_vec(B * T * 3 * C, 1), r = random_vec(B * T * C, 2), out(B * T * C), att(B * NH * T * T);
  auto loss = [&] {
    ref::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    return dot(r, out);
  };
  loss();
  Vec dqkv(qkv.size());
  ref::attention_backward(dqkv.data(), r.data(), qkv.data(), att.data(), B, T, C, NH);
  expect_gradient("dqkv", qkv, dqkv, loss);
}

TEST(GradCheck, Gelu) {
  const int N = 9;
  Vec inp = random_vec(N, 1), r = random_vec(N, 2), out(N);
  inp[0] = 0.0;  // the kink-free origin
  inp[1] = -4.0;
  auto loss = [&] {
    ref::gelu_forward(out.data(), inp.data(), N);
    return dot(r, out);
  };
  Vec dinp(N);
  ref::gelu_backward(dinp.data(), inp.data(), r.data(), N);
  expect_gradient("dinp", inp, dinp, loss);
}

TEST(GradCheck, CrossEntropy) {
  const int N = 4, V = 6;
  const std::vector<int32_t> targets = {2, -1, 5, 0};  // position 1 is ignored
  const double dloss = 1.0 / 3;                        // the mean over the three counted positions
  Vec logits = random_vec(N * V, 1), losses(N), dlogits(N * V);
  auto loss = [&] {
    Vec scratch(N * V);
    ref::crossentropy_forward_backward(losses.data(), scratch.data(), logits.data(), targets.data(), dloss, N, V);
    double sum = 0.0;
    for (double l : losses) sum += l;
    return sum * dloss;
  };
  ref::crossentropy_forward_backward(losses.data(), dlogits.data(), logits.data(), targets.data(), dloss, N, V);
  EXPECT_EQ(losses[1], 0.0);
  expect_gradient("dlogits", logits, dlogits, loss);
}

// The vocabulary-parallel cross-entropy over two shards of the vocabulary (rows [0, 2) and [2, 6)), their
// statistics combined as a tensor-parallel group would (the max of the maxes, the sums rescaled to it, the target
// logits summed): the loss equals the fused op's over the whole vocabulary, and each shard's backward is the
// finite-difference gradient of that loss with respect to its logits.
TEST(GradCheck, VocabularyParallelCrossEntropy) {
  const int N = 4, V = 6, split = 2;
  const std::vector<int32_t> targets = {2, -1, 5, 1};
  const double dloss = 1.0 / 3;
  Vec logits = random_vec(N * V, 1);
  // The shards' logits are columns of the whole (N, V) matrix.
  auto shard = [&](int lo, int rows) {
    Vec s(static_cast<size_t>(N * rows));
    for (int n = 0; n < N; ++n)
      for (int v = 0; v < rows; ++v) s[static_cast<size_t>(n * rows + v)] = logits[static_cast<size_t>(n * V + lo + v)];
    return s;
  };
  struct Stats {
    Vec max, sum, target;
  };
  auto combined = [&] {
    Vec a = shard(0, split), b = shard(split, V - split);
    Stats sa{Vec(N), Vec(N), Vec(N)}, sb = sa, all = sa;
    ref::crossentropy_stats(sa.max.data(), sa.sum.data(), sa.target.data(), a.data(), targets.data(), N, split, 0);
    ref::crossentropy_stats(sb.max.data(), sb.sum.data(), sb.target.data(), b.data(), targets.data(), N, V - split,
                            split);
    for (int n = 0; n < N; ++n) {
      all.max[n] = std::max(sa.max[n], sb.max[n]);
      all.sum[n] = sa.sum[n] * std::exp(sa.max[n] - all.max[n]) + sb.sum[n] * std::exp(sb.max[n] - all.max[n]);
      all.target[n] = sa.target[n] + sb.target[n];
    }
    return all;
  };
  auto loss = [&] {
    const Stats s = combined();
    double sum = 0;
    for (int n = 0; n < N; ++n)
      if (targets[n] >= 0) sum += std::log(s.sum[n]) + s.max[n] - s.target[n];
    return sum * dloss;
  };
  Vec losses(N), fused(N * V);
  ref::crossentropy_forward_backward(losses.data(), fused.data(), logits.data(), targets.data(), dloss, N, V);
  double fused_loss = 0;
  for (double l : losses) fused_loss += l;
  EXPECT_NEAR(loss(), fused_loss * dloss, 1e-12);
  // Each shard's gradient from the combined statistics, put back in its columns.
  const Stats s = combined();
  Vec grad(N * V);
  for (auto [lo, rows] : {std::pair{0, split}, {split, V - split}}) {
    const Vec x = shard(lo, rows);
    Vec dx(x.size());
    ref::crossentropy_backward(dx.data(), x.data(), s.max.data(), s.sum.data(), targets.data(), dloss, N, rows, lo);
    for (int n = 0; n < N; ++n)
      for (int v = 0; v < rows; ++v) grad[static_cast<size_t>(n * V + lo + v)] = dx[static_cast<size_t>(n * rows + v)];
  }
  expect_gradient("dlogits", logits, grad, loss);
  for (size_t i = 0; i < grad.size(); ++i) EXPECT_NEAR(grad[i], fused[i], 1e-12) << i;
}

TEST(ClosedForm, AttentionOverOnePositionReturnsItsValue) {
  const int C = 4;
  Vec qkv = random_vec(3 * C, 1), out(C), att(2);  // (B, NH, T, T) = (1, 2, 1, 1)
  ref::attention_forward(out.data(), att.data(), qkv.data(), 1, 1, C, 2);
  EXPECT_DOUBLE_EQ(att[0], 1.0);
  EXPECT_DOUBLE_EQ(att[1], 1.0);
  for (int i = 0; i < C; ++i) EXPECT_DOUBLE_EQ(out[i], qkv[2 * C + i]);
}

TEST(ClosedForm, AdamwFirstStepMovesBySignOfGradient) {
  // At step 1 the bias-corrected moments are g and g^2, so the update is lr * (g / (|g| + eps) + wd * p).
  std::vector<float> p = {1.0f, -2.0f}, m = {0.0f, 0.0f}, v = {0.0f, 0.0f}, g = {0.5f, -3.0f};
  AdamwParams hp{.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 0.0f, .weight_decay = 0.01f, .step = 1};
  ref_kernels().adamw_update(p.data(), m.data(), v.data(), g.data(), 2, hp);
  EXPECT_NEAR(p[0], 1.0 - 0.1 * (1.0 + 0.01 * 1.0), 1e-6);
  EXPECT_NEAR(p[1], -2.0 - 0.1 * (-1.0 + 0.01 * -2.0), 1e-6);
  EXPECT_NEAR(m[0], 0.1 * 0.5, 1e-7);
  EXPECT_NEAR(v[1], 0.05 * 9.0, 1e-6);
}

TEST(ClosedForm, GlobalNormAccumulatesSquares) {
  std::vector<float> a = {3.0f, 4.0f}, b = {12.0f};
  float acc = 0.0f;
  ref_kernels().global_norm_squared(&acc, a.data(), 2);
  ref_kernels().global_norm_squared(&acc, b.data(), 1);
  EXPECT_EQ(acc, 169.0f);  // |(3, 4, 12)| = 13
}

}  // namespace
}  // namespace h2
