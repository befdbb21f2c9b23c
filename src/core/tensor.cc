// Tensor views: slicing and reshaping with checked sizes.
#include "core/tensor.h"

#include "core/error.h"

namespace h2 {

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  if (shape_.rank() == 0 || begin < 0 || end < begin || end > shape_[0]) {
    throw Error(ErrorCode::kInvalidArgument,
                cat("slice [", begin, ", ", end, ") is out of range for a tensor of shape ", shape_.str()));
  }
  int64_t row = shape_[0] == 0 ? 0 : numel() / shape_[0];
  Shape sliced = shape_.with_dim(0, end - begin);
  size_t offset = offset_bytes_ + static_cast<size_t>(begin * row) * dtype_size(dtype_);
  return Tensor(storage_, device_, offset, dtype_, sliced);
}

Tensor Tensor::reshape(Shape shape) const {
  if (shape.numel() != numel()) {
    throw Error(ErrorCode::kInvalidArgument,
                cat("cannot reshape a tensor of shape ", shape_.str(), " to ", shape.str(), ": element counts differ"));
  }
  return Tensor(storage_, device_, offset_bytes_, dtype_, shape);
}

}  // namespace h2
