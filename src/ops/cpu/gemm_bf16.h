// The cpu backend's bf16 matrix product: out (N,OC) f32 = inp (N,C) bf16 @ weight (OC,C)^T bf16 + bias (OC) f32,
// every product exact in f32 and summed in f32. Debian's OpenBLAS exports no bf16 GEMM, so this is H2's own: on
// CPUs with AVX512-BF16 (vdpbf16ps: two bf16 products summed into each f32 lane) a packed, register-blocked
// kernel in the manner of Goto & van de Geijn 2008, split over cores with OpenMP; elsewhere a plain loop.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace h2 {

// bias may be null. Works for any N, C, OC (tails padded with zeros in the packed copies).
void gemm_bf16(float* out, const bf16_t* inp, const bf16_t* weight, const float* bias, int64_t N, int C, int OC);

}  // namespace h2
