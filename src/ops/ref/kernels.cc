// The `ref` backend's kernels: the formulas as written in the papers, accumulating in double.
#include "ops/ref/kernels.h"

#include <cmath>
#include <vector>

#include "core/error.h"

namespace h2 {
namespace ref {

template <typename F>
void encoder_forward(F* out, const int32_t* tokens, const F* wte, const F* wpe, int B, int T, int C, int vocab_start,
                     int V) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const int64_t bt = int64_t{b} * T + t, row = int64_t{tokens[bt]} - vocab_start;
      const bool mine = row >= 0 && row < V;  // else another shard's token: it adds nothing here
      for (int c = 0; c < C; ++c) {
        const double tok = mine ? double{wte[row * C + c]} : 0.0;
        const double pos = wpe != nullptr ? double{wpe[int64_t{t} * C + c]} : 0.0;
        out[bt * C + c] = static_cast<F>(tok + pos);
      }
    }
  }
}

template <typename F>
void encoder_backward(F* dwte, F* dwpe, const F* dout, const int32_t* tokens, int B, int T, int C, int vocab_start,
                      int V) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const int64_t bt = int64_t{b} * T + t, row = int64_t{tokens[bt]} - vocab_start;
      for (int c = 0; c < C; ++c) {
        if (row >= 0 && row < V)
          dwte[row * C + c] = static_cast<F>(double{dwte[row * C + c]} + double{dout[bt * C + c]});
        if (dwpe != nullptr)
          dwpe[int64_t{t} * C + c] = static_cast<F>(double{dwpe[int64_t{t} * C + c]} + double{dout[bt * C + c]});
      }
    }
  }
}

template <typename F>
void layernorm_forward(F* out, F* mean, F* rstd, const F* inp, const F* weight, const F* bias, int64_t N, int C) {
  for (int64_t n = 0; n < N; ++n) {
    const F* x = inp + n * C;
    double m = 0.0;
    for (int c = 0; c < C; ++c) m += x[c];
    m /= C;
    double var = 0.0;
    for (int c = 0; c < C; ++c) var += (x[c] - m) * (x[c] - m);
    var /= C;
    const double s = 1.0 / std::sqrt(var + kLayernormEps);
    for (int c = 0; c < C; ++c) out[n * C + c] = static_cast<F>((x[c] - m) * s * weight[c] + bias[c]);
    mean[n] = static_cast<F>(m);
    rstd[n] = static_cast<F>(s);
  }
}

// dinp = rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), with norm = (x - mean) * rstd and
// dnorm = dout * weight: the layernorm gradient as derived in llm.c's doc/layernorm.
template <typename F>
void layernorm_backward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp, const F* weight, const F* mean,
                        const F* rstd, int64_t N, int C) {
  std::vector<double> dw(static_cast<size_t>(C), 0.0), db(static_cast<size_t>(C), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    const F* x = inp + n * C;
    const F* dy = dout + n * C;
    double dnorm_mean = 0.0, dnorm_norm_mean = 0.0;
    for (int c = 0; c < C; ++c) {
      const double norm = (x[c] - double{mean[n]}) * rstd[n];
      const double dnorm = double{weight[c]} * dy[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    for (int c = 0; c < C; ++c) {
      const double norm = (x[c] - double{mean[n]}) * rstd[n];
      const double dnorm = double{weight[c]} * dy[c];
      db[static_cast<size_t>(c)] += dy[c];
      dw[static_cast<size_t>(c)] += norm * dy[c];
      dinp[n * C + c] = static_cast<F>((dnorm - dnorm_mean - norm * dnorm_norm_mean) * rstd[n]);
    }
  }
  for (int c = 0; c < C; ++c) {
    dweight[c] = static_cast<F>(dweight[c] + dw[static_cast<size_t>(c)]);
    dbias[c] = static_cast<F>(dbias[c] + db[static_cast<size_t>(c)]);
  }
}

template <typename F>
void matmul_forward(F* out, const F* inp, const F* weight, const F* bias, int64_t N, int C, int OC) {
  for (int64_t n = 0; n < N; ++n) {
    for (int o = 0; o < OC; ++o) {
      double acc = bias != nullptr ? double{bias[o]} : 0.0;
      for (int c = 0; c < C; ++c) acc += double{inp[n * C + c]} * weight[int64_t{o} * C + c];
      out[n * OC + o] = static_cast<F>(acc);
    }
  }
}

// dbias (OC) += the column sums of dout (N,OC).
template <typename F>
void bias_backward(F* dbias, const F* dout, int64_t N, int OC) {
  for (int o = 0; o < OC; ++o) {
    double acc = 0.0;
    for (int64_t n = 0; n < N; ++n) acc += dout[n * OC + o];
    dbias[o] = static_cast<F>(dbias[o] + acc);
  }
}

template <typename F>
void matmul_backward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp, const F* weight, int64_t N, int C,
                     int OC) {
  for (int64_t n = 0; dinp != nullptr && n < N; ++n) {
    for (int c = 0; c < C; ++c) {
      double acc = 0.0;
      for (int o = 0; o < OC; ++o) acc += double{dout[n * OC + o]} * weight[int64_t{o} * C + c];
      dinp[n * C + c] = static_cast<F>(acc);
    }
  }
  for (int o = 0; dweight != nullptr && o < OC; ++o) {
    for (int c = 0; c < C; ++c) {
      double acc = 0.0;
      for (int64_t n = 0; n < N; ++n) acc += double{dout[n * OC + o]} * inp[n * C + c];
      dweight[int64_t{o} * C + c] = static_cast<F>(dweight[int64_t{o} * C + c] + acc);
    }
  }
  if (dbias != nullptr) bias_backward(dbias, dout, N, OC);
}

// Scaled dot-product attention (Vaswani et al. 2017) with a causal mask: position t attends to t2 <= t.
template <typename F>
void attention_forward(F* out, F* att, const F* qkv, int B, int T, int C, int NH, bool round_probabilities) {
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  const int64_t C3 = int64_t{3} * C;
  std::vector<double> scores(static_cast<size_t>(T));
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int t = 0; t < T; ++t) {
        const F* q = qkv + (int64_t{b} * T + t) * C3 + int64_t{h} * hs;
        F* a = att + ((int64_t{b} * NH + h) * T + t) * T;
        double max = -INFINITY;
        for (int t2 = 0; t2 <= t; ++t2) {
          const F* k = qkv + (int64_t{b} * T + t2) * C3 + C + int64_t{h} * hs;
          double dot = 0.0;
          for (int i = 0; i < hs; ++i) dot += double{q[i]} * k[i];
          scores[static_cast<size_t>(t2)] = dot * scale;
          if (dot * scale > max) max = dot * scale;
        }
        double sum = 0.0;
        for (int t2 = 0; t2 <= t; ++t2) {
          scores[static_cast<size_t>(t2)] = std::exp(scores[static_cast<size_t>(t2)] - max);
          sum += scores[static_cast<size_t>(t2)];
        }
        for (int t2 = 0; t2 < T; ++t2) {
          const double p = t2 <= t ? scores[static_cast<size_t>(t2)] / sum : 0.0;
          a[t2] = static_cast<F>(round_probabilities ? bf16_to_f32(f32_to_bf16(static_cast<float>(p))) : p);
        }
        F* o = out + (int64_t{b} * T + t) * C + int64_t{h} * hs;
        for (int i = 0; i < hs; ++i) {
          double acc = 0.0;
          for (int t2 = 0; t2 <= t; ++t2) acc += double{a[t2]} * qkv[(int64_t{b} * T + t2) * C3 + 2 * C + h * hs + i];
          o[i] = static_cast<F>(acc);
        }
      }
    }
  }
}

// Backward of attention_forward. With P the probabilities and dP = dout V^T, the softmax gradient is
// dS = P * (dP - rowsum(P * dP)); then dQ = scale dS K, dK = scale dS^T Q, dV = P^T dout.
template <typename F>
void attention_backward(F* dqkv, const F* dout, const F* qkv, const F* att, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  const int64_t C3 = int64_t{3} * C;
  std::vector<double> acc(static_cast<size_t>(B) * T * C3, 0.0);
  std::vector<double> dp(static_cast<size_t>(T));
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int t = 0; t < T; ++t) {
        const F* a = att + ((int64_t{b} * NH + h) * T + t) * T;
        const F* dy = dout + (int64_t{b} * T + t) * C + int64_t{h} * hs;
        const int64_t qrow = (int64_t{b} * T + t) * C3 + int64_t{h} * hs;
        double row = 0.0;
        for (int t2 = 0; t2 <= t; ++t2) {
          const int64_t vrow = (int64_t{b} * T + t2) * C3 + 2 * C + int64_t{h} * hs;
          double d = 0.0;
          for (int i = 0; i < hs; ++i) {
            d += double{dy[i]} * qkv[vrow + i];
            acc[static_cast<size_t>(vrow + i)] += double{a[t2]} * dy[i];  // dV
          }
          dp[static_cast<size_t>(t2)] = d;
          row += double{a[t2]} * d;
        }
        for (int t2 = 0; t2 <= t; ++t2) {
          const double ds = double{a[t2]} * (dp[static_cast<size_t>(t2)] - row) * scale;
          const int64_t krow = (int64_t{b} * T + t2) * C3 + C + int64_t{h} * hs;
          for (int i = 0; i < hs; ++i) {
            acc[static_cast<size_t>(qrow + i)] += ds * qkv[krow + i];  // dQ
            acc[static_cast<size_t>(krow + i)] += ds * qkv[qrow + i];  // dK
          }
        }
      }
    }
  }
  for (size_t i = 0; i < acc.size(); ++i) dqkv[i] = static_cast<F>(acc[i]);
}

template <typename F>
void gelu_forward(F* out, const F* inp, int64_t N) {
  for (int64_t i = 0; i < N; ++i) {
    const double x = inp[i];
    out[i] = static_cast<F>(0.5 * x * (1.0 + std::tanh(kGeluScale * (x + kGeluCubic * x * x * x))));
  }
}

template <typename F>
void gelu_backward(F* dinp, const F* inp, const F* dout, int64_t N) {
  for (int64_t i = 0; i < N; ++i) {
    const double x = inp[i];
    const double th = std::tanh(kGeluScale * (x + kGeluCubic * x * x * x));
    const double sech2 = 1.0 - th * th;
    const double grad = 0.5 * (1.0 + th) + 0.5 * x * sech2 * kGeluScale * (1.0 + 3.0 * kGeluCubic * x * x);
    dinp[i] = static_cast<F>(grad * dout[i]);
  }
}

template <typename F>
void crossentropy_forward_backward(F* losses, F* dlogits, const F* logits, const int32_t* targets, F dloss, int64_t N,
                                   int V) {
  for (int64_t n = 0; n < N; ++n) {
    const F* x = logits + n * V;
    F* dx = dlogits + n * V;
    if (targets[n] < 0) {  // ignored position
      losses[n] = F{0};
      for (int v = 0; v < V; ++v) dx[v] = F{0};
      continue;
    }
    double max = -INFINITY;
    for (int v = 0; v < V; ++v) max = std::max(max, double{x[v]});
    double sum = 0.0;
    for (int v = 0; v < V; ++v) sum += std::exp(x[v] - max);
    losses[n] = static_cast<F>(std::log(sum) + max - x[targets[n]]);
    for (int v = 0; v < V; ++v) {
      const double p = std::exp(x[v] - max) / sum;
      dx[v] = static_cast<F>((p - (v == targets[n] ? 1.0 : 0.0)) * dloss);
    }
  }
}

template <typename F>
void crossentropy_stats(F* maxes, F* sums, F* target_logits, const F* logits, const int32_t* targets, int64_t N, int V,
                        int vocab_start) {
  for (int64_t n = 0; n < N; ++n) {
    const F* x = logits + n * V;
    if (targets[n] < 0) {  // ignored position
      maxes[n] = F{0};
      sums[n] = F{1};
      target_logits[n] = F{0};
      continue;
    }
    double max = -INFINITY;
    for (int v = 0; v < V; ++v) max = std::max(max, double{x[v]});
    double sum = 0.0;
    for (int v = 0; v < V; ++v) sum += std::exp(x[v] - max);
    const int64_t t = int64_t{targets[n]} - vocab_start;
    maxes[n] = static_cast<F>(max);
    sums[n] = static_cast<F>(sum);
    target_logits[n] = t >= 0 && t < V ? x[t] : F{0};
  }
}

template <typename F>
void crossentropy_backward(F* dlogits, const F* logits, const F* maxes, const F* sums, const int32_t* targets, F dloss,
                           int64_t N, int V, int vocab_start) {
  for (int64_t n = 0; n < N; ++n) {
    const F* x = logits + n * V;
    F* dx = dlogits + n * V;
    const int64_t t = int64_t{targets[n]} - vocab_start;
    for (int v = 0; v < V; ++v) {
      const double p = targets[n] < 0 ? 0.0 : std::exp(double{x[v]} - maxes[n]) / sums[n];
      dx[v] = static_cast<F>((p - (targets[n] >= 0 && v == t ? 1.0 : 0.0)) * dloss);
    }
  }
}

#define H2_REF_INSTANTIATE(F)                                                                                      \
  template void encoder_forward<F>(F*, const int32_t*, const F*, const F*, int, int, int, int, int);               \
  template void encoder_backward<F>(F*, F*, const F*, const int32_t*, int, int, int, int, int);                    \
  template void crossentropy_stats<F>(F*, F*, F*, const F*, const int32_t*, int64_t, int, int);                    \
  template void crossentropy_backward<F>(F*, const F*, const F*, const F*, const int32_t*, F, int64_t, int, int);  \
  template void layernorm_forward<F>(F*, F*, F*, const F*, const F*, const F*, int64_t, int);                      \
  template void layernorm_backward<F>(F*, F*, F*, const F*, const F*, const F*, const F*, const F*, int64_t, int); \
  template void matmul_forward<F>(F*, const F*, const F*, const F*, int64_t, int, int);                            \
  template void matmul_backward<F>(F*, F*, F*, const F*, const F*, const F*, int64_t, int, int);                   \
  template void attention_forward<F>(F*, F*, const F*, int, int, int, int, bool);                                  \
  template void attention_backward<F>(F*, const F*, const F*, const F*, int, int, int, int);                       \
  template void gelu_forward<F>(F*, const F*, int64_t);                                                            \
  template void gelu_backward<F>(F*, const F*, const F*, int64_t);                                                 \
  template void crossentropy_forward_backward<F>(F*, F*, const F*, const int32_t*, F, int64_t, int);
H2_REF_INSTANTIATE(float)
H2_REF_INSTANTIATE(double)
#undef H2_REF_INSTANTIATE

}  // namespace ref

namespace {

// bf16 element-wise ops run through f32 buffers: the reference rounds exactly once, on the way out.
template <typename Fn>
void map_bf16(bf16_t* out, int64_t N, Fn&& fn) {
  for (int64_t i = 0; i < N; ++i) out[i] = f32_to_bf16(static_cast<float>(fn(i)));
}
double load(const void* p, DType dtype, int64_t i) {
  return dtype == DType::kBF16 ? double{bf16_to_f32(static_cast<const bf16_t*>(p)[i])}
                               : static_cast<const float*>(p)[i];
}

class RefKernels final : public Kernels {
 public:
  const char* name() const override { return "ref"; }

  bool supports(Op op, DType dtype) const override { return interface_defines(op, dtype); }

  void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C,
                       int vocab_start, int V) const override {
    ref::encoder_forward(out, tokens, wte, wpe, B, T, C, vocab_start, V);
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C,
                        int vocab_start, int V) const override {
    ref::encoder_backward(dwte, dwpe, dout, tokens, B, T, C, vocab_start, V);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                         int64_t N, int C) const override {
    ref::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const float* weight, const float* mean, const float* rstd, int64_t N, int C) const override {
    ref::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t N, int C,
                      int OC) const override {
    ref::matmul_forward(out, inp, weight, bias, N, C, OC);
  }
  // bf16 widens to f32 exactly; the reference then sums the products in f64.
  void matmul_forward_bf16(float* out, const bf16_t* inp, const bf16_t* weight, const float* bias, int64_t N, int C,
                           int OC) const override {
    ref::matmul_forward(out, widen_bf16(inp, N * C).data(), widen_bf16(weight, int64_t{OC} * C).data(), bias, N, C, OC);
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                       const float* weight, int64_t N, int C, int OC) const override {
    ref::matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
  }
  void matmul_backward_bf16(float* dinp, float* dweight, float* dbias, const float* dout, const bf16_t* inp,
                            const bf16_t* weight, int64_t N, int C, int OC) const override {
    const std::vector<float> rounded = widen_bf16(round_to_bf16(dout, N * OC).data(), N * OC);
    ref::matmul_backward(dinp, dweight, static_cast<float*>(nullptr), rounded.data(), widen_bf16(inp, N * C).data(),
                         widen_bf16(weight, int64_t{OC} * C).data(), N, C, OC);
    if (dbias != nullptr) ref::bias_backward(dbias, dout, N, OC);  // from dout as it is, unrounded
  }
  void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) const override {
    ref::attention_forward(out, att, qkv, B, T, C, NH);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C,
                          int NH) const override {
    ref::attention_backward(dqkv, dout, qkv, att, B, T, C, NH);
  }
  // bf16 widens to f32 exactly; the reference sums in f64 (the probabilities rounded to bf16 as they are made)
  // and rounds each output to bf16 once, from f32.
  void attention_forward_bf16(bf16_t* out, bf16_t* att, const bf16_t* qkv, int B, int T, int C, int NH) const override {
    const int64_t n = int64_t{B} * T * C, na = int64_t{B} * NH * T * T;
    std::vector<float> o(static_cast<size_t>(n)), p(static_cast<size_t>(na));
    ref::attention_forward(o.data(), p.data(), widen_bf16(qkv, 3 * n).data(), B, T, C, NH, true);
    for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(o[static_cast<size_t>(i)]);
    for (int64_t i = 0; i < na; ++i) att[i] = f32_to_bf16(p[static_cast<size_t>(i)]);  // exact: already rounded
  }
  void attention_backward_bf16(float* dqkv, const float* dout, const bf16_t* qkv, const bf16_t* att, int B, int T,
                               int C, int NH) const override {
    const int64_t n = int64_t{B} * T * C;
    ref::attention_backward(dqkv, dout, widen_bf16(qkv, 3 * n).data(), widen_bf16(att, int64_t{B} * NH * T * T).data(),
                            B, T, C, NH);
  }
  void gelu_forward(void* out, const void* inp, DType dtype, int64_t N) const override {
    if (dtype == DType::kF32) return ref::gelu_forward(static_cast<float*>(out), static_cast<const float*>(inp), N);
    map_bf16(static_cast<bf16_t*>(out), N, [&](int64_t i) {
      double y;
      double x = load(inp, dtype, i);
      ref::gelu_forward(&y, &x, 1);
      return y;
    });
  }
  void gelu_backward(float* dinp, const void* inp, const float* dout, DType dtype, int64_t N) const override {
    if (dtype == DType::kF32) return ref::gelu_backward(dinp, static_cast<const float*>(inp), dout, N);
    ref::gelu_backward(dinp, widen_bf16(static_cast<const bf16_t*>(inp), N).data(), dout, N);
  }
  void residual_forward(void* out, const void* inp1, const void* inp2, DType dtype, int64_t N) const override {
    if (dtype == DType::kF32) {
      for (int64_t i = 0; i < N; ++i)
        static_cast<float*>(out)[i] = static_cast<float>(load(inp1, dtype, i) + load(inp2, dtype, i));
      return;
    }
    map_bf16(static_cast<bf16_t*>(out), N, [&](int64_t i) { return load(inp1, dtype, i) + load(inp2, dtype, i); });
  }
  void crossentropy_forward_backward(float* losses, float* dlogits, const float* logits, const int32_t* targets,
                                     float dloss, int64_t N, int V) const override {
    ref::crossentropy_forward_backward(losses, dlogits, logits, targets, dloss, N, V);
  }
  void crossentropy_stats(float* maxes, float* sums, float* target_logits, const float* logits, const int32_t* targets,
                          int64_t N, int V, int vocab_start) const override {
    ref::crossentropy_stats(maxes, sums, target_logits, logits, targets, N, V, vocab_start);
  }
  void crossentropy_backward(float* dlogits, const float* logits, const float* maxes, const float* sums,
                             const int32_t* targets, float dloss, int64_t N, int V, int vocab_start) const override {
    ref::crossentropy_backward(dlogits, logits, maxes, sums, targets, dloss, N, V, vocab_start);
  }
  void adamw_update(float* params, float* m, float* v, const float* grads, int64_t N,
                    const AdamwParams& hp) const override {
    const double c1 = 1.0 - std::pow(double{hp.beta1}, static_cast<double>(hp.step));
    const double c2 = 1.0 - std::pow(double{hp.beta2}, static_cast<double>(hp.step));
    for (int64_t i = 0; i < N; ++i) {
      const double g = grads[i];
      const double mi = hp.beta1 * double{m[i]} + (1.0 - hp.beta1) * g;
      const double vi = hp.beta2 * double{v[i]} + (1.0 - hp.beta2) * g * g;
      const double update = (mi / c1) / (std::sqrt(vi / c2) + hp.eps) + hp.weight_decay * double{params[i]};
      params[i] = static_cast<float>(params[i] - hp.lr * update);
      m[i] = static_cast<float>(mi);
      v[i] = static_cast<float>(vi);
    }
  }
  void global_norm_squared(float* out, const float* inp, int64_t N) const override {
    double acc = 0.0;
    for (int64_t i = 0; i < N; ++i) acc += double{inp[i]} * inp[i];
    out[0] = static_cast<float>(out[0] + acc);
  }
  void scale(float* x, float s, int64_t N) const override {
    for (int64_t i = 0; i < N; ++i) x[i] = static_cast<float>(double{x[i]} * s);
  }
  void convert(void* out, DType out_dtype, const void* inp, DType inp_dtype, int64_t N) const override {
    for (int64_t i = 0; i < N; ++i) {
      const double x = load(inp, inp_dtype, i);
      if (out_dtype == DType::kBF16) {
        static_cast<bf16_t*>(out)[i] = f32_to_bf16(static_cast<float>(x));
      } else {
        static_cast<float*>(out)[i] = static_cast<float>(x);
      }
    }
  }
};

}  // namespace

const Kernels& ref_kernels() {
  static const RefKernels kernels;
  return kernels;
}

}  // namespace h2
