// The matrix products of the cuda backend's attention (kernels.cu), as data: which buffers, offsets, leading
// dimensions, strides and transposes each cuBLAS strided-batched GEMM gets. cuBLAS sees row-major matrices as
// column-major ones (their transposes), which makes these numbers easy to get wrong and impossible to check without
// a GPU — so they live here, in plain C++, where a test runs them through an emulation of cuBLAS's semantics
// against the reference attention on any machine (tests/ops/attention_gemms_test.cc).
//
// Per sequence b and head h, Q_h, K_h and V_h are (T, hs) blocks of qkv (B, T, 3C) — rows 3C apart, heads hs apart
// — and the probabilities P_h (T, T) one of att (B, NH, T, T). Forward: S = scale Q Kᵀ; P = causal softmax(S);
// out = P V. Backward: dP = dout Vᵀ; dS = P ∘ (dP − rowsum(P ∘ dP)) ∘ scale; dQ = dS K; dK = dSᵀ Q; dV = Pᵀ dout.
#pragma once

#include <cstdint>

namespace h2 {

// A sequence's part of each tensor; offsets, leading dimensions and strides count elements of that buffer.
enum class AttentionBuffer {
  kQkv,     // (T, 3C): the sequence's q, k, v
  kOut,     // (T, C): its attention output, or in backward dout
  kDqkv,    // (T, 3C): its gradient
  kSquare,  // (NH, T, T): its scores / probabilities
  kGrad,    // (NH, T, T): dP, then dS
};

struct GemmOperand {
  AttentionBuffer buffer;
  int64_t offset = 0;  // the first head's matrix
  int ld = 0;          // column-major leading dimension
  int64_t stride = 0;  // from one head's matrix to the next
};

// C_h = alpha op(A_h) op(B_h) for each head h, column-major (cublasGemmStridedBatchedEx with beta 0).
struct HeadGemm {
  bool transpose_a = false, transpose_b = false;
  int m = 0, n = 0, k = 0;
  float alpha = 1.0f;
  GemmOperand a, b, c;
};

struct AttentionGemms {
  HeadGemm scores;                              // kSquare = scale Q Kᵀ
  HeadGemm values;                              // kOut = P V (P in kSquare)
  HeadGemm grad_probs, grad_q, grad_k, grad_v;  // kGrad = dout Vᵀ; then, with dS in kGrad, into kDqkv
};

// The products for sequences of length T, C channels and NH heads (C divisible by NH).
AttentionGemms attention_gemms(int T, int C, int NH);

}  // namespace h2
