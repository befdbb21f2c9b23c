// The `cpu` backend's kernels. Each one computes what its ref twin computes (ops/ref/kernels.cc); the
// conformance suite holds them to that within the tolerances of ops/conformance.cc.
#include "ops/cpu/kernels.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "ops/cpu/gemm_bf16.h"
#include "ops/cpu/vmath.h"

namespace h2 {
namespace {

using cpu::vexp;
using cpu::vsigmoid;
using cpu::vtanh;

// Rows per tile of the causal attention: a tile of queries only needs the keys up to its last row, so tiling
// skips most of the masked upper triangle (about half the work at large T).
constexpr int kAttentionTile = 64;

// Loads and stores for the element-wise kernels, so one loop body serves f32 and bf16.
struct F32 {
  using T = float;
  static float load(const float* p, int64_t i) { return p[i]; }
  static void store(float* p, int64_t i, float x) { p[i] = x; }
};
struct BF16 {
  using T = bf16_t;
  static float load(const bf16_t* p, int64_t i) { return bf16_to_f32(p[i]); }
  static void store(bf16_t* p, int64_t i, float x) { p[i] = f32_to_bf16(x); }
};

template <typename IO>
void gelu_forward_impl(void* out_, const void* inp_, int64_t N) {
  auto* out = static_cast<typename IO::T*>(out_);
  const auto* inp = static_cast<const typename IO::T*>(inp_);
  const float s = static_cast<float>(kGeluScale), k = static_cast<float>(kGeluCubic);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const float x = IO::load(inp, i);
    // 0.5 (1 + tanh(u)) = sigmoid(2u): one exponential and one division per element.
    IO::store(out, i, x * vsigmoid(2.0f * s * (x + k * x * x * x)));
  }
}

// inp in IO's type; the gradients f32.
template <typename IO>
void gelu_backward_impl(float* dinp, const void* inp_, const float* dout, int64_t N) {
  const auto* inp = static_cast<const typename IO::T*>(inp_);
  const float s = static_cast<float>(kGeluScale), k = static_cast<float>(kGeluCubic);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const float x = IO::load(inp, i);
    const float th = vtanh(s * (x + k * x * x * x));
    const float grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * s * (1.0f + 3.0f * k * x * x);
    dinp[i] = grad * dout[i];
  }
}

template <typename IO>
void residual_forward_impl(void* out_, const void* a_, const void* b_, int64_t N) {
  auto* out = static_cast<typename IO::T*>(out_);
  const auto* a = static_cast<const typename IO::T*>(a_);
  const auto* b = static_cast<const typename IO::T*>(b_);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < N; ++i) IO::store(out, i, IO::load(a, i) + IO::load(b, i));
}

// One head's q, k, v (T rows of hs at stride ld, k at +C and v at +2C) widened from bf16 into dst: q, k, v one after
// the other, each T x hs.
void widen_head(float* dst, const bf16_t* src, int ld, int C, int T, int hs) {
  for (int part = 0; part < 3; ++part) {
    for (int t = 0; t < T; ++t) {
      const bf16_t* row = src + int64_t{t} * ld + int64_t{part} * C;
      float* d = dst + (int64_t{part} * T + t) * hs;
      for (int i = 0; i < hs; ++i) d[i] = bf16_to_f32(row[i]);
    }
  }
}

// One (batch, head) of the causal attention forward, tile by tile (kAttentionTile query rows, which only need the
// keys up to their last row): S = scale Q K^T into probs(r0) (the tile's rows, stride T), a masked softmax per
// row, done(r0, r1, S) (the bf16 variant rounds the probabilities there), then o = P V. q, k, v: T rows of hs at
// stride ld; o: stride ldo.
template <typename Probs, typename Done>
void attention_head_forward(const float* q, const float* k, const float* v, int ld, float* o, int ldo, int T, int hs,
                            Probs&& probs, Done&& done) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int r0 = 0; r0 < T; r0 += kAttentionTile) {
    const int r1 = std::min(T, r0 + kAttentionTile), rows = r1 - r0;
    float* s = probs(r0);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, r1, hs, scale, q + int64_t{r0} * ld, ld, k, ld, 0.0f, s,
                T);
    for (int t = r0; t < r1; ++t) {
      float* row = s + int64_t{t - r0} * T;
      float max = -INFINITY;
#pragma omp simd reduction(max : max)
      for (int t2 = 0; t2 <= t; ++t2) max = row[t2] > max ? row[t2] : max;
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int t2 = 0; t2 <= t; ++t2) {
        row[t2] = vexp(row[t2] - max);
        sum += row[t2];
      }
      const float inv = 1.0f / sum;
#pragma omp simd
      for (int t2 = 0; t2 <= t; ++t2) row[t2] *= inv;
      std::fill(row + t + 1, row + T, 0.0f);
    }
    done(r0, r1, s);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, r1, 1.0f, s, T, v, ld, 0.0f, o + int64_t{r0} * ldo,
                ldo);
  }
}

// Its backward, tile by tile: dP = dout V^T, dS = P (dP - rowsum(P dP)) scale, dQ = dS K, dK += dS^T Q,
// dV += P^T dout. dy: stride lddy; dq, with dk at +dkv and dv at +2 dkv: stride ldd; ds: kAttentionTile x T floats;
// probs(r0, r1): the tile's probabilities (rows [r0, r1), columns [0, r1)) and their row stride.
template <typename Probs>
void attention_head_backward(const float* q, const float* k, const float* v, int ld, const float* dy, int lddy,
                             float* dq, int dkv, int ldd, int T, int hs, float* ds, Probs&& probs) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  float* dk = dq + dkv;
  float* dv = dq + 2 * dkv;
  for (int t = 0; t < T; ++t) {  // dK and dV accumulate over tiles: clear this head's slice first
    std::fill(dk + int64_t{t} * ldd, dk + int64_t{t} * ldd + hs, 0.0f);
    std::fill(dv + int64_t{t} * ldd, dv + int64_t{t} * ldd + hs, 0.0f);
  }
  for (int r0 = 0; r0 < T; r0 += kAttentionTile) {
    const int r1 = std::min(T, r0 + kAttentionTile), rows = r1 - r0;
    const auto [p, ldp] = probs(r0, r1);
    // dP (rows, r1) = dout[r0:r1] V[0:r1]^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, r1, hs, 1.0f, dy + int64_t{r0} * lddy, lddy, v, ld, 0.0f,
                ds, r1);
    for (int i = 0; i < rows; ++i) {
      const float* pr = p + int64_t{i} * ldp;
      float* dr = ds + int64_t{i} * r1;
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int t2 = 0; t2 < r1; ++t2) dot += pr[t2] * dr[t2];
#pragma omp simd
      for (int t2 = 0; t2 < r1; ++t2) dr[t2] = pr[t2] * (dr[t2] - dot) * scale;
    }
    // dQ[r0:r1] = dS K[0:r1]
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, r1, 1.0f, ds, r1, k, ld, 0.0f,
                dq + int64_t{r0} * ldd, ldd);
    // dK[0:r1] += dS^T Q[r0:r1]
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, hs, rows, 1.0f, ds, r1, q + int64_t{r0} * ld, ld, 1.0f, dk,
                ldd);
    // dV[0:r1] += P[r0:r1, 0:r1]^T dout[r0:r1]
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, hs, rows, 1.0f, p, ldp, dy + int64_t{r0} * lddy, lddy,
                1.0f, dv, ldd);
  }
}

class CpuKernels final : public Kernels {
 public:
  const char* name() const override { return "cpu"; }

  bool supports(Op op, DType dtype) const override { return interface_defines(op, dtype); }

  void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C,
                       int vocab_start, int V) const override {
#pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < int64_t{B} * T; ++bt) {
      const int64_t row = int64_t{tokens[bt]} - vocab_start;
      float* o = out + bt * C;
      if (row >= 0 && row < V) {
        std::copy_n(wte + row * C, C, o);
      } else {
        std::fill_n(o, C, 0.0f);  // another shard's token
      }
      if (wpe == nullptr) continue;
      const float* pos = wpe + (bt % T) * C;
#pragma omp simd
      for (int c = 0; c < C; ++c) o[c] += pos[c];
    }
  }

  // Parameter rows are shared between positions (a token repeats), so threads split the channels, not the
  // positions: every thread owns a slice of every row and no two threads write the same element.
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C,
                        int vocab_start, int V) const override {
#pragma omp parallel
    {
      const int threads = omp_get_num_threads(), id = omp_get_thread_num();
      const int c0 = static_cast<int>(int64_t{C} * id / threads),
                c1 = static_cast<int>(int64_t{C} * (id + 1) / threads);
      for (int64_t bt = 0; bt < int64_t{B} * T; ++bt) {
        const int64_t row = int64_t{tokens[bt]} - vocab_start;
        const float* d = dout + bt * C;
        if (row >= 0 && row < V) {
          float* dtok = dwte + row * C;
#pragma omp simd
          for (int c = c0; c < c1; ++c) dtok[c] += d[c];
        }
        if (dwpe == nullptr) continue;
        float* dpos = dwpe + (bt % T) * C;
#pragma omp simd
        for (int c = c0; c < c1; ++c) dpos[c] += d[c];
      }
    }
  }

  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                         int64_t N, int C) const override {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* x = inp + n * C;
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int c = 0; c < C; ++c) sum += x[c];
      const float m = sum / static_cast<float>(C);
      float var = 0.0f;
#pragma omp simd reduction(+ : var)
      for (int c = 0; c < C; ++c) var += (x[c] - m) * (x[c] - m);
      const float s = 1.0f / std::sqrt(var / static_cast<float>(C) + static_cast<float>(kLayernormEps));
      float* o = out + n * C;
#pragma omp simd
      for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * s * weight[c] + bias[c];
      mean[n] = m;
      rstd[n] = s;
    }
  }

  // dweight and dbias are sums over all rows: each thread sums its rows into a private buffer, then the
  // buffers are added in thread order (deterministic for a fixed thread count).
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const float* weight, const float* mean, const float* rstd, int64_t N, int C) const override {
    const int threads = omp_get_max_threads();
    std::vector<float> partial(static_cast<size_t>(threads) * 2 * C, 0.0f);
#pragma omp parallel num_threads(threads)
    {
      float* dw = partial.data() + static_cast<size_t>(omp_get_thread_num()) * 2 * C;
      float* db = dw + C;
#pragma omp for schedule(static)
      for (int64_t n = 0; n < N; ++n) {
        const float* x = inp + n * C;
        const float* dy = dout + n * C;
        const float m = mean[n], s = rstd[n];
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
        for (int c = 0; c < C; ++c) {
          const float dnorm = weight[c] * dy[c];
          dnorm_mean += dnorm;
          dnorm_norm_mean += dnorm * (x[c] - m) * s;
        }
        dnorm_mean /= static_cast<float>(C);
        dnorm_norm_mean /= static_cast<float>(C);
        float* dx = dinp + n * C;
#pragma omp simd
        for (int c = 0; c < C; ++c) {
          const float norm = (x[c] - m) * s;
          db[c] += dy[c];
          dw[c] += norm * dy[c];
          dx[c] = (weight[c] * dy[c] - dnorm_mean - norm * dnorm_norm_mean) * s;
        }
      }
    }
    for (int t = 0; t < threads; ++t) {
      const float* dw = partial.data() + static_cast<size_t>(t) * 2 * C;
      for (int c = 0; c < C; ++c) {
        dweight[c] += dw[c];
        dbias[c] += dw[C + c];
      }
    }
  }

  // The bias is written into `out` first and sgemm adds the product onto it (beta = 1): one pass over `out`
  // instead of a second pass after the product.
  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t N, int C,
                      int OC) const override {
    if (N == 0 || OC == 0) return;
    if (bias != nullptr) {
#pragma omp parallel for schedule(static)
      for (int64_t n = 0; n < N; ++n) std::memcpy(out + n * OC, bias, sizeof(float) * static_cast<size_t>(OC));
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(N), OC, C, 1.0f, inp, C, weight, C,
                bias != nullptr ? 1.0f : 0.0f, out, OC);
  }

  // out (N,OC) = inp (N,C) @ weight^T: weight read as (C,OC) through its strides.
  void matmul_forward_bf16(float* out, const bf16_t* inp, const bf16_t* weight, const float* bias, int64_t N, int C,
                           int OC) const override {
    gemm_bf16(out, {inp, C, 1}, {weight, 1, C}, bias, false, N, C, OC);
  }

  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                       const float* weight, int64_t N, int C, int OC) const override {
    if (N == 0) return;
    const int n = static_cast<int>(N);
    if (dinp != nullptr) {  // dinp (N,C) = dout (N,OC) @ weight (OC,C)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, C, OC, 1.0f, dout, OC, weight, C, 0.0f, dinp, C);
    }
    if (dweight != nullptr) {  // dweight (OC,C) += dout^T (OC,N) @ inp (N,C)
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, n, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
    }
    if (dbias != nullptr) column_sums(dbias, dout, N, OC);
  }

  void matmul_backward_bf16(float* dinp, float* dweight, float* dbias, const float* dout, const bf16_t* inp,
                            const bf16_t* weight, int64_t N, int C, int OC) const override {
    if (N == 0) return;
    if (dinp != nullptr) gemm_bf16(dinp, {dout, OC, 1}, {weight, C, 1}, nullptr, false, N, OC, C);    // dout @ weight
    if (dweight != nullptr) gemm_bf16(dweight, {dout, 1, OC}, {inp, C, 1}, nullptr, true, OC, N, C);  // += dout^T inp
    if (dbias != nullptr) column_sums(dbias, dout, N, OC);
  }

  // dbias (OC) += the column sums of dout (N,OC). The threads split the columns so each owns its slice of dbias.
  static void column_sums(float* dbias, const float* dout, int64_t N, int OC) {
#pragma omp parallel
    {
      const int threads = omp_get_num_threads(), id = omp_get_thread_num();
      const int o0 = static_cast<int>(int64_t{OC} * id / threads),
                o1 = static_cast<int>(int64_t{OC} * (id + 1) / threads);
      for (int64_t r = 0; r < N; ++r) {
        const float* d = dout + r * OC;
#pragma omp simd
        for (int o = o0; o < o1; ++o) dbias[o] += d[o];
      }
    }
  }

  // The (batch, head) pairs are split over threads; sgemm inside runs single-threaded (OpenBLAS's OpenMP build does
  // not nest parallel regions). f32 reads q, k, v in place and makes the probabilities in `att` itself.
  void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) const override {
    const int hs = C / NH, C3 = 3 * C;
#pragma omp parallel for schedule(dynamic)
    for (int64_t bh = 0; bh < int64_t{B} * NH; ++bh) {
      const int64_t b = bh / NH, h = bh % NH;
      const float* q = qkv + b * T * C3 + h * hs;
      float* a = att + bh * T * T;
      attention_head_forward(
          q, q + C, q + 2 * C, C3, out + b * T * C + h * hs, C, T, hs, [&](int r0) { return a + int64_t{r0} * T; },
          [](int, int, float*) {});
    }
  }
  // bf16: each head's q, k, v widened to f32 once; each tile's probabilities rounded to bf16 into `att` and used
  // rounded; the output made in f32 and rounded once.
  void attention_forward_bf16(bf16_t* out, bf16_t* att, const bf16_t* qkv, int B, int T, int C, int NH) const override {
    const int hs = C / NH, C3 = 3 * C;
    const int64_t head = int64_t{T} * hs;
#pragma omp parallel
    {
      std::vector<float> qkv_h(static_cast<size_t>(3 * head)), o(static_cast<size_t>(head));
      std::vector<float> tile(static_cast<size_t>(kAttentionTile) * T);
#pragma omp for schedule(dynamic)
      for (int64_t bh = 0; bh < int64_t{B} * NH; ++bh) {
        const int64_t b = bh / NH, h = bh % NH;
        widen_head(qkv_h.data(), qkv + b * T * C3 + h * hs, C3, C, T, hs);
        bf16_t* a = att + bh * T * T;
        attention_head_forward(
            qkv_h.data(), qkv_h.data() + head, qkv_h.data() + 2 * head, hs, o.data(), hs, T, hs,
            [&](int) { return tile.data(); },
            [&](int r0, int r1, float* s) {
              for (int64_t i = 0; i < int64_t{r1 - r0} * T; ++i) {
                const bf16_t p = f32_to_bf16(s[i]);
                a[int64_t{r0} * T + i] = p;
                s[i] = bf16_to_f32(p);
              }
            });
        bf16_t* y = out + b * T * C + h * hs;
        for (int t = 0; t < T; ++t) {
          for (int i = 0; i < hs; ++i) y[int64_t{t} * C + i] = f32_to_bf16(o[static_cast<size_t>(int64_t{t} * hs + i)]);
        }
      }
    }
  }

  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C,
                          int NH) const override {
    const int hs = C / NH, C3 = 3 * C;
#pragma omp parallel
    {
      std::vector<float> ds(static_cast<size_t>(kAttentionTile) * T);
#pragma omp for schedule(dynamic)
      for (int64_t bh = 0; bh < int64_t{B} * NH; ++bh) {
        const int64_t b = bh / NH, h = bh % NH;
        const float* q = qkv + b * T * C3 + h * hs;
        const float* a = att + bh * T * T;
        attention_head_backward(q, q + C, q + 2 * C, C3, dout + b * T * C + h * hs, C, dqkv + b * T * C3 + h * hs, C,
                                C3, T, hs, ds.data(), [&](int r0, int) {
                                  return std::pair{a + int64_t{r0} * T, T};
                                });
      }
    }
  }
  // bf16: each head's q, k, v widened once, each tile's probabilities as the tile needs them.
  void attention_backward_bf16(float* dqkv, const float* dout, const bf16_t* qkv, const bf16_t* att, int B, int T,
                               int C, int NH) const override {
    const int hs = C / NH, C3 = 3 * C;
    const int64_t head = int64_t{T} * hs;
#pragma omp parallel
    {
      std::vector<float> qkv_h(static_cast<size_t>(3 * head));
      std::vector<float> ds(static_cast<size_t>(kAttentionTile) * T), p(static_cast<size_t>(kAttentionTile) * T);
#pragma omp for schedule(dynamic)
      for (int64_t bh = 0; bh < int64_t{B} * NH; ++bh) {
        const int64_t b = bh / NH, h = bh % NH;
        widen_head(qkv_h.data(), qkv + b * T * C3 + h * hs, C3, C, T, hs);
        const bf16_t* a = att + bh * T * T;
        attention_head_backward(
            qkv_h.data(), qkv_h.data() + head, qkv_h.data() + 2 * head, hs, dout + b * T * C + h * hs, C,
            dqkv + b * T * C3 + h * hs, C, C3, T, hs, ds.data(), [&](int r0, int r1) {
              for (int i = 0; i < r1 - r0; ++i) {
                for (int t2 = 0; t2 < r1; ++t2) {
                  p[static_cast<size_t>(int64_t{i} * r1 + t2)] = bf16_to_f32(a[int64_t{r0 + i} * T + t2]);
                }
              }
              return std::pair{static_cast<const float*>(p.data()), r1};
            });
      }
    }
  }

  void gelu_forward(void* out, const void* inp, DType dtype, int64_t N) const override {
    dtype == DType::kBF16 ? gelu_forward_impl<BF16>(out, inp, N) : gelu_forward_impl<F32>(out, inp, N);
  }
  void gelu_backward(float* dinp, const void* inp, const float* dout, DType dtype, int64_t N) const override {
    dtype == DType::kBF16 ? gelu_backward_impl<BF16>(dinp, inp, dout, N) : gelu_backward_impl<F32>(dinp, inp, dout, N);
  }
  void residual_forward(void* out, const void* inp1, const void* inp2, DType dtype, int64_t N) const override {
    dtype == DType::kBF16 ? residual_forward_impl<BF16>(out, inp1, inp2, N)
                          : residual_forward_impl<F32>(out, inp1, inp2, N);
  }

  // Three passes over each row: max, exponentials (kept in dlogits) and their sum, then normalise.
  void crossentropy_forward_backward(float* losses, float* dlogits, const float* logits, const int32_t* targets,
                                     float dloss, int64_t N, int V) const override {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* x = logits + n * V;
      float* dx = dlogits + n * V;
      const int32_t target = targets[n];
      if (target < 0) {
        losses[n] = 0.0f;
        std::fill(dx, dx + V, 0.0f);
        continue;
      }
      const float target_logit = x[target];  // read before dx is written: dx may alias x
      float max = -INFINITY;
#pragma omp simd reduction(max : max)
      for (int v = 0; v < V; ++v) max = x[v] > max ? x[v] : max;
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int v = 0; v < V; ++v) {
        dx[v] = vexp(x[v] - max);
        sum += dx[v];
      }
      losses[n] = std::log(sum) + max - target_logit;
      const float inv = dloss / sum;
#pragma omp simd
      for (int v = 0; v < V; ++v) dx[v] *= inv;
      dx[target] -= dloss;
    }
  }

  void crossentropy_stats(float* maxes, float* sums, float* target_logits, const float* logits, const int32_t* targets,
                          int64_t N, int V, int vocab_start) const override {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* x = logits + n * V;
      if (targets[n] < 0) {  // ignored position
        maxes[n] = 0.0f;
        sums[n] = 1.0f;
        target_logits[n] = 0.0f;
        continue;
      }
      float max = -INFINITY;
#pragma omp simd reduction(max : max)
      for (int v = 0; v < V; ++v) max = x[v] > max ? x[v] : max;
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int v = 0; v < V; ++v) sum += vexp(x[v] - max);
      const int64_t t = int64_t{targets[n]} - vocab_start;
      maxes[n] = max;
      sums[n] = sum;
      target_logits[n] = t >= 0 && t < V ? x[t] : 0.0f;
    }
  }

  void crossentropy_backward(float* dlogits, const float* logits, const float* maxes, const float* sums,
                             const int32_t* targets, float dloss, int64_t N, int V, int vocab_start) const override {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* x = logits + n * V;
      float* dx = dlogits + n * V;
      if (targets[n] < 0) {
        std::fill(dx, dx + V, 0.0f);
        continue;
      }
      const float max = maxes[n], inv = dloss / sums[n];
#pragma omp simd
      for (int v = 0; v < V; ++v) dx[v] = vexp(x[v] - max) * inv;
      const int64_t t = int64_t{targets[n]} - vocab_start;
      if (t >= 0 && t < V) dx[t] -= dloss;
    }
  }

  void adamw_update(float* params, float* m, float* v, const float* grads, int64_t N,
                    const AdamwParams& hp) const override {
    const float c1 = 1.0f / (1.0f - std::pow(hp.beta1, static_cast<float>(hp.step)));
    const float c2 = 1.0f / (1.0f - std::pow(hp.beta2, static_cast<float>(hp.step)));
    const float b1 = hp.beta1, b2 = hp.beta2, lr = hp.lr, eps = hp.eps, wd = hp.weight_decay;
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < N; ++i) {
      const float g = grads[i];
      const float mi = b1 * m[i] + (1.0f - b1) * g;
      const float vi = b2 * v[i] + (1.0f - b2) * g * g;
      params[i] -= lr * ((mi * c1) / (std::sqrt(vi * c2) + eps) + wd * params[i]);
      m[i] = mi;
      v[i] = vi;
    }
  }

  void global_norm_squared(float* out, const float* inp, int64_t N) const override {
    double acc = 0.0;
#pragma omp parallel for simd reduction(+ : acc) schedule(static)
    for (int64_t i = 0; i < N; ++i) acc += static_cast<double>(inp[i] * inp[i]);
    out[0] += static_cast<float>(acc);
  }

  void scale(float* x, float s, int64_t N) const override {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < N; ++i) x[i] *= s;
  }

  void convert(void* out, DType out_dtype, const void* inp, DType inp_dtype, int64_t N) const override {
    if (out_dtype == inp_dtype) {
      std::memcpy(out, inp, static_cast<size_t>(N) * dtype_size(out_dtype));
    } else if (out_dtype == DType::kBF16) {
      auto* o = static_cast<bf16_t*>(out);
      const auto* x = static_cast<const float*>(inp);
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < N; ++i) o[i] = f32_to_bf16(x[i]);
    } else {
      auto* o = static_cast<float*>(out);
      const auto* x = static_cast<const bf16_t*>(inp);
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < N; ++i) o[i] = bf16_to_f32(x[i]);
    }
  }
};

}  // namespace

const Kernels& cpu_kernels() {
  static const CpuKernels kernels;
  return kernels;
}

}  // namespace h2
