// Element types: f32 (training), bf16 (storage and communication), f64 (the reference's accumulation type),
// i32 (token ids). bf16 is stored as the upper 16 bits of an IEEE f32; conversion rounds to nearest even.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace h2 {

enum class DType { kF32, kBF16, kF64, kI32 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
// Parses "f32", "bf16", "f64", "i32"; throws Error(kInvalidArgument) naming the accepted values otherwise.
DType parse_dtype(std::string_view name);

using bf16_t = uint16_t;

inline float bf16_to_f32(bf16_t value) { return std::bit_cast<float>(static_cast<uint32_t>(value) << 16); }

// Round to nearest, ties to even; NaN stays NaN (a quiet NaN is forced so that rounding cannot turn it into inf).
// Branch-free (a select, not an early return) so that loops over it vectorise.
inline bf16_t f32_to_bf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x0040u;
  return static_cast<bf16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

// Copies of n values in the other type (widening is exact).
std::vector<float> widen_bf16(const bf16_t* x, int64_t n);
std::vector<bf16_t> round_to_bf16(const float* x, int64_t n);

}  // namespace h2
