// A tensor: a view (dtype, shape, offset) into storage that lives on one device.
// Storage is reference-counted; the last view to go returns the memory to its device (the deleter is supplied
// by the device that allocated it, so core does not depend on the device runtime). Views are always
// contiguous and row-major; slicing along the first dimension is the only view operation training needs.
// Deliberately not here: strides, broadcasting, autograd. Ops take sizes from shapes and check them.
#pragma once

#include <cstddef>
#include <memory>

#include "core/dtype.h"
#include "core/shape.h"

namespace h2 {

class Device;

class Tensor {
 public:
  Tensor() = default;
  // `storage` must hold at least offset_bytes + shape.numel() * dtype_size(dtype) bytes.
  Tensor(std::shared_ptr<void> storage, Device* device, size_t offset_bytes, DType dtype, Shape shape)
      : storage_(std::move(storage)), device_(device), offset_bytes_(offset_bytes), dtype_(dtype), shape_(shape) {}

  bool defined() const { return storage_ != nullptr; }
  Device& device() const { return *device_; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t numel() const { return shape_.numel(); }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

  void* data() const { return static_cast<char*>(storage_.get()) + offset_bytes_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data());
  }

  // Rows [begin, end) of the first dimension, sharing storage.
  Tensor slice(int64_t begin, int64_t end) const;
  // The same elements under another shape with the same element count.
  Tensor reshape(Shape shape) const;

 private:
  std::shared_ptr<void> storage_;
  Device* device_ = nullptr;
  size_t offset_bytes_ = 0;
  DType dtype_ = DType::kF32;
  Shape shape_;
};

}  // namespace h2
