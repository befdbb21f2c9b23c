// The cuda backend's attention products (ops/cuda/attention_gemms.h) run here, on the CPU, through an emulation of
// cublasGemmStridedBatchedEx's column-major semantics (written from cuBLAS's documentation, in double), with the
// softmax steps between them written out below; the result must be the reference attention's (ops/ref), forward
// and backward. So the leading dimensions, strides, offsets and transposes the GPU gets are checked on any machine.
#include "ops/cuda/attention_gemms.h"

#include <cmath>
#include <vector>

#include "core/rng.h"
#include "ops/ref/kernels.h"
#include "test_util.h"

namespace h2 {
namespace {

// One sequence's buffers, indexed as attention_gemms' operands name them.
struct Buffers {
  std::vector<double> qkv, out, dqkv, square, grad;
  std::vector<double>& of(AttentionBuffer b) {
    switch (b) {
      case AttentionBuffer::kQkv:
        return qkv;
      case AttentionBuffer::kOut:
        return out;
      case AttentionBuffer::kDqkv:
        return dqkv;
      case AttentionBuffer::kSquare:
        return square;
      case AttentionBuffer::kGrad:
        return grad;
    }
    return qkv;
  }
};

// C_h = alpha op(A_h) op(B_h), column-major: element (i, j) of a matrix with leading dimension ld is at i + j ld.
void emulate(const HeadGemm& g, Buffers& s, int heads) {
  for (int h = 0; h < heads; ++h) {
    const std::vector<double>& a = s.of(g.a.buffer);
    const std::vector<double>& b = s.of(g.b.buffer);
    std::vector<double>& c = s.of(g.c.buffer);
    const int64_t oa = g.a.offset + h * g.a.stride, ob = g.b.offset + h * g.b.stride, oc = g.c.offset + h * g.c.stride;
    for (int i = 0; i < g.m; ++i) {
      for (int j = 0; j < g.n; ++j) {
        double sum = 0;
        for (int l = 0; l < g.k; ++l) {
          const double x =
              a.at(static_cast<size_t>(oa + (g.transpose_a ? l + int64_t{i} * g.a.ld : i + int64_t{l} * g.a.ld)));
          const double y =
              b.at(static_cast<size_t>(ob + (g.transpose_b ? j + int64_t{l} * g.b.ld : l + int64_t{j} * g.b.ld)));
          sum += x * y;
        }
        c.at(static_cast<size_t>(oc + i + int64_t{j} * g.c.ld)) = g.alpha * sum;
      }
    }
  }
}

// Shapes with one head and with several, a sequence of one and of several, odd head sizes.
TEST(AttentionGemms, ComputeTheReferenceAttention) {
  for (auto [B, T, C, NH] : {std::tuple{2, 5, 12, 3}, {1, 1, 4, 1}, {3, 7, 10, 2}}) {
    const int C3 = 3 * C, hs = C / NH;
    const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
    Rng rng(static_cast<uint64_t>(T));
    std::vector<double> qkv(static_cast<size_t>(B * T * C3)), dout(static_cast<size_t>(B * T * C));
    for (double& x : qkv) x = rng.normal();
    for (double& x : dout) x = rng.normal();
    std::vector<double> want_out(dout.size()), want_att(static_cast<size_t>(B * NH * T * T)), want_dqkv(qkv.size());
    ref::attention_forward(want_out.data(), want_att.data(), qkv.data(), B, T, C, NH);
    ref::attention_backward(want_dqkv.data(), dout.data(), qkv.data(), want_att.data(), B, T, C, NH);

    const AttentionGemms g = attention_gemms(T, C, NH);
    const size_t square = static_cast<size_t>(NH * T * T);
    for (int b = 0; b < B; ++b) {
      const auto part = [&](const std::vector<double>& v, int64_t n) {
        return std::vector<double>(v.begin() + b * n, v.begin() + (b + 1) * n);
      };
      // Forward: scores, the causal softmax of each row, then P V.
      Buffers s{.qkv = part(qkv, int64_t{T} * C3), .out = std::vector<double>(static_cast<size_t>(T * C), NAN)};
      s.square.assign(square, NAN);
      emulate(g.scores, s, NH);
      for (int row = 0; row < NH * T; ++row) {
        const int t = row % T;
        double* x = &s.square[static_cast<size_t>(row * T)];
        double max = -INFINITY, sum = 0;
        for (int t2 = 0; t2 <= t; ++t2) max = std::max(max, x[t2]);
        for (int t2 = 0; t2 <= t; ++t2) sum += std::exp(x[t2] - max);
        for (int t2 = 0; t2 < T; ++t2) x[t2] = t2 <= t ? std::exp(x[t2] - max) / sum : 0.0;
      }
      emulate(g.values, s, NH);
      const std::vector<double> att = part(want_att, static_cast<int64_t>(square)),
                                out = part(want_out, int64_t{T} * C);
      for (size_t i = 0; i < square; ++i) ASSERT_NEAR(s.square[i], att[i], 1e-6) << "att " << i;
      for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(s.out[i], out[i], 1e-6) << "out " << i;

      // Backward: dP, dS = P (dP - rowsum(P dP)) scale, then dQ, dK, dV.
      Buffers d{.qkv = s.qkv, .out = part(dout, int64_t{T} * C), .square = att};
      d.dqkv.assign(static_cast<size_t>(T * C3), NAN);
      d.grad.assign(square, NAN);
      emulate(g.grad_probs, d, NH);
      for (int row = 0; row < NH * T; ++row) {
        const int t = row % T;
        const double* p = &att[static_cast<size_t>(row * T)];
        double* dp = &d.grad[static_cast<size_t>(row * T)];
        double sum = 0;
        for (int t2 = 0; t2 <= t; ++t2) sum += p[t2] * dp[t2];
        for (int t2 = 0; t2 < T; ++t2) dp[t2] = t2 <= t ? p[t2] * (dp[t2] - sum) * scale : 0.0;
      }
      for (const HeadGemm* product : {&g.grad_q, &g.grad_k, &g.grad_v}) emulate(*product, d, NH);
      const std::vector<double> dqkv = part(want_dqkv, int64_t{T} * C3);
      for (size_t i = 0; i < dqkv.size(); ++i) ASSERT_NEAR(d.dqkv[i], dqkv[i], 1e-6) << "dqkv " << i;
    }
  }
}

}  // namespace
}  // namespace h2
