// The `ref` backend: the golden reference every other backend is compared with.
// Plain loops in the obvious order, accumulating in double, no threads. Slow on purpose: it is written to be
// read and checked, not to be fast. The kernels are templates over the element type F so that the same code
// also runs in double, for the finite-difference gradient checks (tests/ops/gradcheck_test.cc).
#pragma once

#include <cstdint>

#include "ops/kernels.h"

namespace h2 {

const Kernels& ref_kernels();

namespace ref {

template <typename F>
void encoder_forward(F* out, const int32_t* tokens, const F* wte, const F* wpe, int B, int T, int C, int vocab_start,
                     int V);
template <typename F>
void encoder_backward(F* dwte, F* dwpe, const F* dout, const int32_t* tokens, int B, int T, int C, int vocab_start,
                      int V);
template <typename F>
void layernorm_forward(F* out, F* mean, F* rstd, const F* inp, const F* weight, const F* bias, int64_t N, int C);
template <typename F>
void layernorm_backward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp, const F* weight, const F* mean,
                        const F* rstd, int64_t N, int C);
template <typename F>
void matmul_forward(F* out, const F* inp, const F* weight, const F* bias, int64_t N, int C, int OC);
template <typename F>
void matmul_backward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp, const F* weight, int64_t N, int C,
                     int OC);
// round_probabilities: round each probability to bf16 before it is stored and weighs V (the bf16 variant).
template <typename F>
void attention_forward(F* out, F* att, const F* qkv, int B, int T, int C, int NH, bool round_probabilities = false);
template <typename F>
void attention_backward(F* dqkv, const F* dout, const F* qkv, const F* att, int B, int T, int C, int NH);
template <typename F>
void gelu_forward(F* out, const F* inp, int64_t N);
template <typename F>
void gelu_backward(F* dinp, const F* inp, const F* dout, int64_t N);
template <typename F>
void crossentropy_forward_backward(F* losses, F* dlogits, const F* logits, const int32_t* targets, F dloss, int64_t N,
                                   int V);
template <typename F>
void crossentropy_stats(F* maxes, F* sums, F* target_logits, const F* logits, const int32_t* targets, int64_t N, int V,
                        int vocab_start);
template <typename F>
void crossentropy_backward(F* dlogits, const F* logits, const F* maxes, const F* sums, const int32_t* targets, F dloss,
                           int64_t N, int V, int vocab_start);

}  // namespace ref
}  // namespace h2
