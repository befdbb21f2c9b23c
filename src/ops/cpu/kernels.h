// The `cpu` backend: the fast CPU path. Matrix products go to OpenBLAS (sgemm); element-wise and row-wise
// kernels are loops written for the compiler's vectoriser (see vmath.h) and split over cores with OpenMP.
// Accumulation is in f32 except where a long sum needs more (global norm: double).
#pragma once

#include "ops/kernels.h"

namespace h2 {

const Kernels& cpu_kernels();

}  // namespace h2
