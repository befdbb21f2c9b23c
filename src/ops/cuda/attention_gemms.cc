#include "ops/cuda/attention_gemms.h"

#include <cmath>

namespace h2 {

// A row-major (rows, cols) block with row stride ld is, column-major, its transpose (cols x rows, leading
// dimension ld): so each product below is written for the transposes, e.g. Sᵀ = K Qᵀ.
AttentionGemms attention_gemms(int T, int C, int NH) {
  using B = AttentionBuffer;
  const int hs = C / NH, C3 = 3 * C;
  const int64_t square = int64_t{T} * T;
  const GemmOperand q{B::kQkv, 0, C3, hs}, k{B::kQkv, C, C3, hs}, v{B::kQkv, 2 * C, C3, hs};
  const GemmOperand out{B::kOut, 0, C, hs}, probs{B::kSquare, 0, T, square}, grad{B::kGrad, 0, T, square};
  const GemmOperand dq{B::kDqkv, 0, C3, hs}, dk{B::kDqkv, C, C3, hs}, dv{B::kDqkv, 2 * C, C3, hs};
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  AttentionGemms g;
  // Sᵀ (T x T) = K (stored hs x T, transposed) · Qᵀ (stored hs x T).
  g.scores = {true, false, T, T, hs, scale, k, q, probs};
  // outᵀ (hs x T) = Vᵀ (stored) · Pᵀ (P stored, read as its transpose).
  g.values = {false, false, hs, T, T, 1.0f, v, probs, out};
  // dPᵀ (T x T) = V (stored, transposed) · doutᵀ (stored).
  g.grad_probs = {true, false, T, T, hs, 1.0f, v, out, grad};
  // dQᵀ (hs x T) = Kᵀ · dSᵀ; dKᵀ = Qᵀ · dS (dSᵀ stored, transposed); dVᵀ = doutᵀ · P (Pᵀ stored, transposed).
  g.grad_q = {false, false, hs, T, T, 1.0f, k, grad, dq};
  g.grad_k = {false, true, hs, T, T, 1.0f, q, grad, dk};
  g.grad_v = {false, true, hs, T, T, 1.0f, out, probs, dv};
  return g;
}

}  // namespace h2
