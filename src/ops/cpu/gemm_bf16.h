// The cpu backend's bf16 matrix products, every product exact in f32 and summed in f32. Debian's OpenBLAS exports
// no bf16 GEMM, so this is H2's own: on CPUs with AVX512-BF16 (vdpbf16ps: two bf16 products summed into each f32
// lane) a packed, register-blocked kernel in the manner of Goto & van de Geijn 2008, split over cores with OpenMP;
// elsewhere the operands rounded to bf16 and widened to f32, a stretch of K at a time, through OpenBLAS's sgemm.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace h2 {

// A matrix operand by its strides: element (i, k) at data[i * row + k * col], so that a transposed matrix is the
// same memory with the strides swapped. An f32 operand is rounded to bf16 (nearest even) as it is read.
template <typename T>
struct MatrixView {
  const T* data;
  int64_t row, col;
};

// out (M,N) (rows of N floats) = a (M,K) @ b (K,N) + bias (N), or += a @ b with `accumulate` (bias ignored).
// bias may be null. Works for any sizes (tails padded with zeros in the packed copies).
void gemm_bf16(float* out, MatrixView<bf16_t> a, MatrixView<bf16_t> b, const float* bias, bool accumulate, int64_t M,
               int64_t K, int64_t N);
void gemm_bf16(float* out, MatrixView<float> a, MatrixView<bf16_t> b, const float* bias, bool accumulate, int64_t M,
               int64_t K, int64_t N);

}  // namespace h2
