// Numerics of emulated chips that differ from this host's, as vendors' kernels do (docs/devices.md, "Numerics"):
// the cpu backend's kernels with one family replaced. `h2 align` finds where such a chip drifts from another.
//   exact               the cpu backend's kernels
//   bf16_matmul         matrix products take bf16-rounded inputs and accumulate in f32 (bf16 tensor cores)
//   bf16_accumulate     matrix products accumulate in bf16, rounding the running sum after every term (a wrong
//                       kernel: what h2 align should catch)
//   softmax_without_max the attention softmax exponentiates the raw scores, without subtracting the row's maximum
//                       (a wrong kernel: exact until the scores are large, then inf / NaN)
#pragma once

#include <optional>
#include <string>

#include "ops/kernels.h"

namespace h2 {

enum class Numerics { kExact, kBf16Matmul, kBf16Accumulate, kSoftmaxWithoutMax };
const char* numerics_name(Numerics n);
std::optional<Numerics> parse_numerics(const std::string& name);

// The kernels of a chip with these numerics (one instance per variant, shared).
const Kernels& cpu_kernels_with(Numerics numerics);

}  // namespace h2
