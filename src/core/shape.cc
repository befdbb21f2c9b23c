// Shape: validation of sizes and printing.
#include "core/shape.h"

#include "core/error.h"

namespace h2 {

Shape::Shape(std::initializer_list<int64_t> dims) {
  if (dims.size() > kMaxDims) {
    throw Error(ErrorCode::kInvalidArgument, cat("a shape has at most ", kMaxDims, " dimensions, got ", dims.size()));
  }
  for (int64_t d : dims) {
    if (d < 0) throw Error(ErrorCode::kInvalidArgument, cat("shape sizes must be >= 0, got ", d));
    dims_[static_cast<size_t>(rank_++)] = d;
  }
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= dims_[static_cast<size_t>(i)];
  return n;
}

Shape Shape::with_dim(int i, int64_t size) const {
  H2_CHECK(i >= 0 && i < rank_ && size >= 0) << "dimension " << i << " of " << str();
  Shape out = *this;
  out.dims_[static_cast<size_t>(i)] = size;
  return out;
}

bool Shape::operator==(const Shape& other) const {
  if (rank_ != other.rank_) return false;
  for (int i = 0; i < rank_; ++i) {
    if (dims_[static_cast<size_t>(i)] != other.dims_[static_cast<size_t>(i)]) return false;
  }
  return true;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < rank_; ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(dims_[static_cast<size_t>(i)]);
  }
  return s + "]";
}

}  // namespace h2
