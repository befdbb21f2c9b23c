// DType names and sizes.
#include "core/dtype.h"

#include "core/error.h"

namespace h2 {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
      return 2;
    case DType::kF64:
      return 8;
    case DType::kI32:
      return 4;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF64:
      return "f64";
    case DType::kI32:
      return "i32";
  }
  return "?";
}

std::vector<float> widen_bf16(const bf16_t* x, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = bf16_to_f32(x[i]);
  return out;
}

std::vector<bf16_t> round_to_bf16(const float* x, int64_t n) {
  std::vector<bf16_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = f32_to_bf16(x[i]);
  return out;
}

DType parse_dtype(std::string_view name) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF64, DType::kI32}) {
    if (name == dtype_name(dtype)) return dtype;
  }
  throw Error(ErrorCode::kInvalidArgument, cat("unknown dtype '", name, "'; expected one of f32, bf16, f64, i32"));
}

}  // namespace h2
