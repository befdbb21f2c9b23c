// The operator API the model calls: the ops of kernels.h over tensors. Each function checks that shapes,
// dtypes and devices agree (an Error(kInvalidArgument) names the op, the argument and both shapes), picks
// the kernels of the output's device — or the cpu backend's, once logged, when that device's backend lacks
// the op — and launches the kernel on the device's queue.
// Shapes follow kernels.h; leading dimensions are flattened where a kernel works on rows (N = B*T).
// Empty batches (N = 0) are valid and do nothing; inner sizes (C, V, OC, heads) must be positive.
#pragma once

#include "core/tensor.h"
#include "ops/kernels.h"

namespace h2::ops {

// tokens (B,T) i32 in [0, vocab_size); wte (Vr,C): the vocabulary's rows [vocab_start, vocab_start + Vr) (a
// vocabulary-parallel shard; vocab_size = -1 means wte is the whole vocabulary); wpe (maxT,C) with T <= maxT, or
// undefined (no positions added); out (B,T,C).
void encoder_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                     int64_t vocab_start = 0, int64_t vocab_size = -1);
void encoder_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, const Tensor& tokens,
                      int64_t vocab_start = 0, int64_t vocab_size = -1);
// inp (...,C); weight, bias (C); out like inp; mean, rstd with one element per row.
void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                       const Tensor& weight, const Tensor& bias);
void layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                        const Tensor& inp, const Tensor& weight, const Tensor& mean, const Tensor& rstd);
// inp (...,C); weight (OC,C); bias (OC) or an undefined Tensor; out (...,OC). inp and weight both f32, or both
// bf16 (products summed in f32); out and bias f32.
void matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias);
// dinp like inp; dweight (OC,C) += dout^T inp; dbias (OC) += dout's column sums or undefined. Either dinp or dweight
// may be undefined, and that product is skipped: a backward split into its input and weight gradients (zero-bubble
// pipeline schedules) computes dinp now and dweight later, from the same dout.
void matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                     const Tensor& inp, const Tensor& weight);
// qkv (B,T,3C); out (B,T,C); att (B,NH,T,T): all f32, or all bf16. dqkv and dout are f32 in both.
void attention_forward(const Tensor& out, const Tensor& att, const Tensor& qkv, int num_heads);
void attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& att, int num_heads);
void gelu_forward(const Tensor& out, const Tensor& inp);
// inp f32 or bf16; dinp and dout f32.
void gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout);
void residual_forward(const Tensor& out, const Tensor& inp1, const Tensor& inp2);
// logits (...,V); targets with one i32 per row; losses with one f32 per row; dlogits like logits.
void crossentropy_forward_backward(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                                   const Tensor& targets, float dloss);
// Vocabulary-parallel cross-entropy (kernels.h): logits (...,Vr) of the vocabulary's rows [vocab_start,
// vocab_start + Vr); targets one i32 per row in [-1, vocab_size); maxes, sums, target_logits one f32 per row.
void crossentropy_stats(const Tensor& maxes, const Tensor& sums, const Tensor& target_logits, const Tensor& logits,
                        const Tensor& targets, int64_t vocab_start, int64_t vocab_size);
void crossentropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& maxes, const Tensor& sums,
                           const Tensor& targets, int64_t vocab_start, int64_t vocab_size, float dloss);
void adamw_update(const Tensor& params, const Tensor& m, const Tensor& v, const Tensor& grads, const AdamwParams& hp);
// out: one f32 element, to which sum(inp^2) is added.
void global_norm_squared(const Tensor& out, const Tensor& inp);
void scale(const Tensor& x, float s);
void convert(const Tensor& out, const Tensor& inp);

// The kernels that will run `op` in `dtype` on `device`: its own backend's, or the cpu backend's as a
// fallback (logged once per device, op and dtype). Throws Error(kUnsupported) when neither has it.
const Kernels& select_kernels(Device& device, Op op, DType dtype);

}  // namespace h2::ops
