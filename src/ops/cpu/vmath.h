// Branch-free exp and tanh that the compiler can vectorise (libm's expf/tanhf are scalar calls, which would cap
// the element-wise ops far below memory bandwidth). Only the cpu backend uses these; `ref` uses libm in double.
//
// exp(x) = 2^n * exp(r), n = round(x / ln 2), r = x - n ln 2 in [-ln2/2, ln2/2], with exp(r) by its Taylor
// polynomial of degree 6: the truncation error |r|^7 / 7! < 1.3e-7 relative, about one float ulp
// (Cody & Waite range reduction; ln 2 split in two parts so that n ln 2 is exact).
#pragma once

#include <bit>
#include <cstdint>

namespace h2::cpu {

inline float vexp(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);  // keep 2^n a normal float
  // Round to nearest by adding and subtracting 1.5 * 2^23 (floorf would block vectorisation in GCC 12).
  const float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693145752f) - n * 1.42860677e-6f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  return p * std::bit_cast<float>(bits);
}

// tanh(u) = 1 - 2 / (exp(2u) + 1). |u| is clamped at 9, where tanh is 1 to within float precision.
inline float vtanh(float u) {
  u = u < -9.0f ? -9.0f : (u > 9.0f ? 9.0f : u);
  return 1.0f - 2.0f / (vexp(2.0f * u) + 1.0f);
}

// The logistic function 1 / (1 + exp(-x)); exp's clamp keeps the denominator finite.
inline float vsigmoid(float x) { return 1.0f / (1.0f + vexp(-x)); }

}  // namespace h2::cpu
