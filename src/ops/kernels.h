// The operator interface a backend implements (docs/architecture.md, "device + ops"; ggml-backend's function table).
//
// One shape for every op (llm.c): outputs first, then inputs, then sizes. Shape letters, used throughout ops/:
//   B batch, T time (sequence), C channels, NH heads, V vocabulary, N = B*T rows, OC output channels.
// Gradients carry a `d` prefix. The gradient rule: parameter gradients (dwte, dwpe, dweight, dbias) are
// accumulated with +=; activation gradients (dinp, dqkv, dlogits) are assigned with =.
// What a backward pass needs from its forward pass (mean, rstd, att) is an explicit argument.
//
// A backend implements what it can and says so in supports(op, dtype); every entry has a default that aborts,
// so a partial backend compiles, and the dispatcher (ops.cc) never calls an entry whose supports() is false —
// it falls back to the cpu backend instead. Kernels are const: one instance serves every device of a backend.
//
// Deliberately not here: residual_backward. The gradient of a sum passes unchanged to both summands, so the
// model reuses the incoming gradient and sums gradient paths with residual_forward; a kernel would only copy.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace h2 {

enum class Op {
  kEncoderForward,
  kEncoderBackward,
  kLayernormForward,
  kLayernormBackward,
  kMatmulForward,
  kMatmulBackward,
  kAttentionForward,
  kAttentionBackward,
  kGeluForward,
  kGeluBackward,
  kResidualForward,
  kCrossentropyForwardBackward,
  kCrossentropyStats,
  kCrossentropyBackward,
  kAdamwUpdate,
  kGlobalNormSquared,
  kScale,
  kConvert,
};
inline constexpr Op kAllOps[] = {
    Op::kEncoderForward,
    Op::kEncoderBackward,
    Op::kLayernormForward,
    Op::kLayernormBackward,
    Op::kMatmulForward,
    Op::kMatmulBackward,
    Op::kAttentionForward,
    Op::kAttentionBackward,
    Op::kGeluForward,
    Op::kGeluBackward,
    Op::kResidualForward,
    Op::kCrossentropyForwardBackward,
    Op::kCrossentropyStats,
    Op::kCrossentropyBackward,
    Op::kAdamwUpdate,
    Op::kGlobalNormSquared,
    Op::kScale,
    Op::kConvert,
};
const char* op_name(Op op);

// The dtypes the interface defines each op in: f32 for all; bf16 too for matmul, attention, GELU, residual and
// conversion (the ops bf16 training runs in bf16). A backend that implements them all returns this from supports().
bool interface_defines(Op op, DType dtype);

// Hyper-parameters of one AdamW step (Loshchilov & Hutter 2019, Algorithm 2; bias correction of Kingma & Ba 2015).
struct AdamwParams {
  float lr = 3e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  int64_t step = 1;  // 1-based step number t, for the bias corrections 1 - beta^t
};

// The GELU's tanh form (Hendrycks & Gimpel 2016): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
inline constexpr double kGeluScale = 0.7978845608028654;  // sqrt(2/pi)
inline constexpr double kGeluCubic = 0.044715;
inline constexpr double kLayernormEps = 1e-5;  // GPT-2's epsilon

class Kernels {
 public:
  virtual ~Kernels() = default;
  virtual const char* name() const = 0;
  virtual bool supports(Op op, DType dtype) const = 0;

  // out (B,T,C) = wte[token - vocab_start] (V,C) + wpe[t] (maxT,C). wte holds the vocabulary's rows
  // [vocab_start, vocab_start + V) — all of them, or a vocabulary-parallel shard (Megatron-LM): a token outside
  // them adds nothing, and the tensor-parallel group sums its shards' outputs. wpe may be null: no positions.
  virtual void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                               int C, int vocab_start, int V) const;
  // dwte rows of tokens in the shard += dout; dwpe (when not null) += dout summed over the batch.
  virtual void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C,
                                int vocab_start, int V) const;
  // out (N,C) = (inp - mean) * rstd * weight + bias; mean, rstd (N) saved for the backward pass.
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                                 const float* bias, int64_t N, int C) const;
  virtual void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                                  const float* weight, const float* mean, const float* rstd, int64_t N, int C) const;
  // out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias (OC); bias may be null.
  virtual void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t N, int C,
                              int OC) const;
  // The same with inp and weight in bf16 (supports(kMatmulForward, kBF16)): products exact, summed in f32 or
  // better, out and bias in f32.
  virtual void matmul_forward_bf16(float* out, const bf16_t* inp, const bf16_t* weight, const float* bias, int64_t N,
                                   int C, int OC) const;
  // dinp (N,C) = dout @ weight; dweight (OC,C) += dout^T @ inp; dbias (OC) += column sums of dout. Any of the three
  // may be null (not both dinp and dweight), and its product is skipped.
  virtual void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                               const float* weight, int64_t N, int C, int OC) const;
  // The same with inp and weight in bf16 (supports(kMatmulBackward, kBF16)) and dout in f32, rounded to bf16 (nearest
  // even) for both products; products exact, summed in f32 or better. dbias sums dout as it is, in f32 or better.
  virtual void matmul_backward_bf16(float* dinp, float* dweight, float* dbias, const float* dout, const bf16_t* inp,
                                    const bf16_t* weight, int64_t N, int C, int OC) const;
  // Causal self-attention. qkv (B,T,3C) holds q, k, v side by side; out (B,T,C); att (B,NH,T,T) the softmax
  // probabilities, zero above the diagonal, saved for the backward pass.
  virtual void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) const;
  virtual void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T,
                                  int C, int NH) const;
  // The same with qkv, att and out in bf16 (supports(kAttentionForward, kBF16)), computed in f32 or better. The
  // probabilities are rounded to bf16 before they weigh V, so that forward and backward use the same ones.
  virtual void attention_forward_bf16(bf16_t* out, bf16_t* att, const bf16_t* qkv, int B, int T, int C, int NH) const;
  // qkv and att in bf16, the gradients dout and dqkv in f32 (supports(kAttentionBackward, kBF16)).
  virtual void attention_backward_bf16(float* dqkv, const float* dout, const bf16_t* qkv, const bf16_t* att, int B,
                                       int T, int C, int NH) const;
  // Element-wise; f32 or bf16 (computed in f32 or better). gelu_backward's dtype is inp's: its gradients dinp and
  // dout are f32 in both (bf16 training keeps gradients in f32).
  virtual void gelu_forward(void* out, const void* inp, DType dtype, int64_t N) const;
  virtual void gelu_backward(float* dinp, const void* inp, const float* dout, DType dtype, int64_t N) const;
  virtual void residual_forward(void* out, const void* inp1, const void* inp2, DType dtype, int64_t N) const;
  // Fused softmax + cross-entropy and its gradient. logits (N,V); targets (N) in [0, V) or -1 (ignored: loss 0,
  // gradient 0). losses (N) = -log softmax(logits)[target]; dlogits (N,V) = (softmax - onehot) * dloss.
  // dlogits may be the logits buffer itself (the model overwrites its logits with their gradient).
  virtual void crossentropy_forward_backward(float* losses, float* dlogits, const float* logits, const int32_t* targets,
                                             float dloss, int64_t N, int V) const;
  // Vocabulary-parallel cross-entropy (Megatron-LM's parallel cross-entropy, Shoeybi et al. 2019), in two halves
  // around the tensor-parallel group's reductions, so that no rank gathers the whole (N, vocabulary) logits.
  // Stats of this shard's logits (N,V), vocabulary rows [vocab_start, vocab_start + V): per row maxes = max x,
  // sums = sum exp(x - max), target_logits = x[target - vocab_start] when the target is in the shard, else 0.
  // Rows with target -1 (ignored) get max 0, sum 1, target logit 0.
  virtual void crossentropy_stats(float* maxes, float* sums, float* target_logits, const float* logits,
                                  const int32_t* targets, int64_t N, int V, int vocab_start) const;
  // With maxes and sums of the whole vocabulary (the group's max, and its sum rescaled to it):
  // dlogits = (exp(x - max) / sum - onehot(target - vocab_start)) * dloss; rows with target -1 get 0.
  // dlogits may be the logits buffer itself.
  virtual void crossentropy_backward(float* dlogits, const float* logits, const float* maxes, const float* sums,
                                     const int32_t* targets, float dloss, int64_t N, int V, int vocab_start) const;
  // One AdamW step over N parameters, in place on params, m, v.
  virtual void adamw_update(float* params, float* m, float* v, const float* grads, int64_t N,
                            const AdamwParams& hp) const;
  // out[0] += sum(inp^2), so the squared global norm accumulates over many gradient tensors.
  virtual void global_norm_squared(float* out, const float* inp, int64_t N) const;
  // x *= s in place (gradient clipping).
  virtual void scale(float* x, float s, int64_t N) const;
  // out = inp converted between f32 and bf16 (bf16 rounds to nearest even).
  virtual void convert(void* out, DType out_dtype, const void* inp, DType inp_dtype, int64_t N) const;
};

}  // namespace h2
