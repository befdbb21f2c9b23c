// Kernel variants of emulated chips (variants.h): every entry forwards to the cpu backend but the replaced ones.
#include "ops/cpu/variants.h"

#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "ops/cpu/kernels.h"

namespace h2 {
namespace {

float round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

std::vector<float> rounded(const float* x, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = round_bf16(x[i]);
  return out;
}

// out = inp @ weight^T + bias with the running sum rounded to bf16 after every term.
void bf16_accumulated(float* out, const float* inp, const float* weight, const float* bias, int64_t N, int C, int OC) {
  for (int64_t r = 0; r < N; ++r) {
    for (int o = 0; o < OC; ++o) {
      float acc = bias ? round_bf16(bias[o]) : 0.0f;
      for (int c = 0; c < C; ++c) acc = round_bf16(acc + inp[r * C + c] * weight[int64_t{o} * C + c]);
      out[r * OC + o] = acc;
    }
  }
}

class VariantKernels final : public Kernels {
 public:
  explicit VariantKernels(Numerics n) : n_(n), base_(cpu_kernels()) {}
  const char* name() const override { return "cpu"; }
  bool supports(Op op, DType dtype) const override { return base_.supports(op, dtype); }
  void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C,
                       int vocab_start, int V) const override {
    base_.encoder_forward(out, tokens, wte, wpe, B, T, C, vocab_start, V);
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C,
                        int vocab_start, int V) const override {
    base_.encoder_backward(dwte, dwpe, dout, tokens, B, T, C, vocab_start, V);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                         int64_t N, int C) const override {
    base_.layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const float* weight, const float* mean, const float* rstd, int64_t N, int C) const override {
    base_.layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t N, int C,
                      int OC) const override {
    if (n_ == Numerics::kBf16Matmul) {
      base_.matmul_forward_bf16(out, round_to_bf16(inp, N * C).data(), round_to_bf16(weight, int64_t{OC} * C).data(),
                                bias, N, C, OC);
    } else if (n_ == Numerics::kBf16Accumulate) {
      bf16_accumulated(out, inp, weight, bias, N, C, OC);
    } else {
      base_.matmul_forward(out, inp, weight, bias, N, C, OC);
    }
  }
  void matmul_forward_bf16(float* out, const bf16_t* inp, const bf16_t* weight, const float* bias, int64_t N, int C,
                           int OC) const override {
    if (n_ == Numerics::kBf16Accumulate) {  // bf16 training on such a chip keeps its bf16 sums
      bf16_accumulated(out, widen_bf16(inp, N * C).data(), widen_bf16(weight, int64_t{OC} * C).data(), bias, N, C, OC);
    } else {
      base_.matmul_forward_bf16(out, inp, weight, bias, N, C, OC);
    }
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                       const float* weight, int64_t N, int C, int OC) const override {
    if (n_ == Numerics::kBf16Matmul) {
      base_.matmul_backward(dinp, dweight, dbias, rounded(dout, N * OC).data(), rounded(inp, N * C).data(),
                            rounded(weight, int64_t{OC} * C).data(), N, C, OC);
    } else {
      base_.matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
    }
  }
  void matmul_backward_bf16(float* dinp, float* dweight, float* dbias, const float* dout, const bf16_t* inp,
                            const bf16_t* weight, int64_t N, int C, int OC) const override {
    base_.matmul_backward_bf16(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
  }
  void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) const override {
    if (n_ != Numerics::kSoftmaxWithoutMax) return base_.attention_forward(out, att, qkv, B, T, C, NH);
    const int hs = C / NH;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    for (int b = 0; b < B; ++b) {
      for (int h = 0; h < NH; ++h) {
        for (int t = 0; t < T; ++t) {
          const float* q = qkv + (int64_t{b} * T + t) * 3 * C + h * hs;
          float* a = att + ((int64_t{b} * NH + h) * T + t) * T;
          float sum = 0.0f;
          for (int t2 = 0; t2 < T; ++t2) {
            float s = 0.0f;
            const float* k = qkv + (int64_t{b} * T + t2) * 3 * C + C + h * hs;
            for (int i = 0; i < hs; ++i) s += q[i] * k[i];
            a[t2] = t2 <= t ? std::exp(s * scale) : 0.0f;  // no max subtracted
            sum += a[t2];
          }
          float* o = out + (int64_t{b} * T + t) * C + h * hs;
          for (int i = 0; i < hs; ++i) o[i] = 0.0f;
          for (int t2 = 0; t2 <= t; ++t2) {
            a[t2] /= sum;
            const float* v = qkv + (int64_t{b} * T + t2) * 3 * C + 2 * C + h * hs;
            for (int i = 0; i < hs; ++i) o[i] += a[t2] * v[i];
          }
        }
      }
    }
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C,
                          int NH) const override {
    base_.attention_backward(dqkv, dout, qkv, att, B, T, C, NH);
  }
  // The faulty softmax in bf16 too: through f32 buffers, rounded on the way out.
  void attention_forward_bf16(bf16_t* out, bf16_t* att, const bf16_t* qkv, int B, int T, int C, int NH) const override {
    if (n_ != Numerics::kSoftmaxWithoutMax) return base_.attention_forward_bf16(out, att, qkv, B, T, C, NH);
    const int64_t n = int64_t{B} * T * C, na = int64_t{B} * NH * T * T;
    std::vector<float> o(static_cast<size_t>(n)), a(static_cast<size_t>(na));
    attention_forward(o.data(), a.data(), widen_bf16(qkv, 3 * n).data(), B, T, C, NH);
    for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(o[static_cast<size_t>(i)]);
    for (int64_t i = 0; i < na; ++i) att[i] = f32_to_bf16(a[static_cast<size_t>(i)]);
  }
  void attention_backward_bf16(float* dqkv, const float* dout, const bf16_t* qkv, const bf16_t* att, int B, int T,
                               int C, int NH) const override {
    base_.attention_backward_bf16(dqkv, dout, qkv, att, B, T, C, NH);
  }
  void gelu_forward(void* out, const void* inp, DType dtype, int64_t N) const override {
    base_.gelu_forward(out, inp, dtype, N);
  }
  void gelu_backward(float* dinp, const void* inp, const float* dout, DType dtype, int64_t N) const override {
    base_.gelu_backward(dinp, inp, dout, dtype, N);
  }
  void residual_forward(void* out, const void* inp1, const void* inp2, DType dtype, int64_t N) const override {
    base_.residual_forward(out, inp1, inp2, dtype, N);
  }
  void crossentropy_forward_backward(float* losses, float* dlogits, const float* logits, const int32_t* targets,
                                     float dloss, int64_t N, int V) const override {
    base_.crossentropy_forward_backward(losses, dlogits, logits, targets, dloss, N, V);
  }
  void crossentropy_stats(float* maxes, float* sums, float* target_logits, const float* logits, const int32_t* targets,
                          int64_t N, int V, int vocab_start) const override {
    base_.crossentropy_stats(maxes, sums, target_logits, logits, targets, N, V, vocab_start);
  }
  void crossentropy_backward(float* dlogits, const float* logits, const float* maxes, const float* sums,
                             const int32_t* targets, float dloss, int64_t N, int V, int vocab_start) const override {
    base_.crossentropy_backward(dlogits, logits, maxes, sums, targets, dloss, N, V, vocab_start);
  }
  void adamw_update(float* params, float* m, float* v, const float* grads, int64_t N,
                    const AdamwParams& hp) const override {
    base_.adamw_update(params, m, v, grads, N, hp);
  }
  void global_norm_squared(float* out, const float* inp, int64_t N) const override {
    base_.global_norm_squared(out, inp, N);
  }
  void scale(float* x, float s, int64_t N) const override { base_.scale(x, s, N); }
  void convert(void* out, DType out_dtype, const void* inp, DType inp_dtype, int64_t N) const override {
    base_.convert(out, out_dtype, inp, inp_dtype, N);
  }

 private:
  Numerics n_;
  const Kernels& base_;
};

constexpr Numerics kAll[] = {Numerics::kExact, Numerics::kBf16Matmul, Numerics::kBf16Accumulate,
                             Numerics::kSoftmaxWithoutMax};

}  // namespace

const char* numerics_name(Numerics n) {
  switch (n) {
    case Numerics::kExact:
      return "exact";
    case Numerics::kBf16Matmul:
      return "bf16_matmul";
    case Numerics::kBf16Accumulate:
      return "bf16_accumulate";
    case Numerics::kSoftmaxWithoutMax:
      return "softmax_without_max";
  }
  return "?";
}

std::optional<Numerics> parse_numerics(const std::string& name) {
  for (Numerics n : kAll) {
    if (name == numerics_name(n)) return n;
  }
  return std::nullopt;
}

const Kernels& cpu_kernels_with(Numerics numerics) {
  static const VariantKernels bf16_matmul(Numerics::kBf16Matmul), bf16_accumulate(Numerics::kBf16Accumulate),
      softmax(Numerics::kSoftmaxWithoutMax);
  switch (numerics) {
    case Numerics::kBf16Matmul:
      return bf16_matmul;
    case Numerics::kBf16Accumulate:
      return bf16_accumulate;
    case Numerics::kSoftmaxWithoutMax:
      return softmax;
    case Numerics::kExact:
      break;
  }
  return cpu_kernels();
}

}  // namespace h2
