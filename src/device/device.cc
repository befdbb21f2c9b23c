// Device base: capacity-checked allocation, byte copies over host memory, tensor copies.
#include "device/device.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/format.h"

namespace h2 {
namespace {
constexpr size_t kAlignmentBytes = 64;  // a cache line, and enough for AVX-512 loads
}

Device::~Device() {
  H2_CHECK(mem_used_bytes_ == 0) << "device " << props_.name << " destroyed while " << format_bytes(mem_used_bytes_)
                                 << " of its tensors are still alive";
}

Tensor Device::empty(DType dtype, Shape shape) {
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  {
    std::lock_guard<std::mutex> lock(mem_mutex_);
    if (bytes > props_.mem_capacity_bytes - mem_used_bytes_) {
      throw Error(ErrorCode::kOutOfMemory,
                  cat("out of memory on device ", props_.name, " (chip '", props_.chip, "'): requested ",
                      format_bytes(bytes), " for a ", dtype_name(dtype), " tensor of shape ", shape.str(), ", ",
                      format_bytes(mem_used_bytes_), " of ", format_bytes(props_.mem_capacity_bytes),
                      " already in use. Hint: use a smaller micro-batch, recompute activations, or give this "
                      "device fewer layers."));
    }
    mem_used_bytes_ += bytes;
    if (mem_used_bytes_ > mem_peak_bytes_) mem_peak_bytes_ = mem_used_bytes_;
  }
  void* ptr = nullptr;
  try {
    ptr = raw_allocate(bytes);
  } catch (...) {
    release(nullptr, bytes);
    throw;
  }
  std::shared_ptr<void> storage(ptr, [this, bytes](void* p) { release(p, bytes); });
  return Tensor(std::move(storage), this, 0, dtype, shape);
}

Tensor Device::zeros(DType dtype, Shape shape) {
  Tensor t = empty(dtype, shape);
  fill_zero(t.data(), t.bytes());
  return t;
}

void Device::release(void* ptr, size_t bytes) {
  if (ptr != nullptr) raw_free(ptr);
  std::lock_guard<std::mutex> lock(mem_mutex_);
  mem_used_bytes_ -= bytes;
}

size_t Device::mem_used_bytes() const {
  std::lock_guard<std::mutex> lock(mem_mutex_);
  return mem_used_bytes_;
}

size_t Device::mem_peak_bytes() const {
  std::lock_guard<std::mutex> lock(mem_mutex_);
  return mem_peak_bytes_;
}

void Device::reset_mem_peak() {
  std::lock_guard<std::mutex> lock(mem_mutex_);
  mem_peak_bytes_ = mem_used_bytes_;
}

void* Device::raw_allocate(size_t bytes) {
  // aligned_alloc wants a multiple of the alignment, and a zero-byte tensor still needs a unique address.
  const size_t rounded = (bytes + kAlignmentBytes - 1) / kAlignmentBytes * kAlignmentBytes;
  void* ptr = std::aligned_alloc(kAlignmentBytes, rounded == 0 ? kAlignmentBytes : rounded);
  if (ptr == nullptr) {
    throw Error(ErrorCode::kOutOfMemory,
                cat("out of host memory on device ", props_.name, ": the host could not provide ", format_bytes(bytes),
                    " although the device's capacity allowed it"));
  }
  return ptr;
}

void Device::raw_free(void* ptr) { std::free(ptr); }

void Device::copy_h2d(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}
void Device::copy_d2h(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}
void Device::copy_d2d(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memmove(dst, src, bytes);
}

void Device::fill_zero(void* dst, size_t bytes) {
  if (bytes > 0) std::memset(dst, 0, bytes);
}

std::shared_ptr<char> Device::host_staging(size_t bytes) {
  return std::shared_ptr<char>(new char[std::max<size_t>(bytes, 1)], std::default_delete<char[]>());
}

void Device::launch(const char* /*op_name*/, uint64_t /*shape_key*/, const std::function<void()>& kernel) { kernel(); }

namespace {
void check_copy(const Tensor& dst, const Tensor& src) {
  if (!dst.defined() || !src.defined()) throw Error(ErrorCode::kInvalidArgument, "copy: a tensor is undefined");
  if (dst.dtype() != src.dtype() || dst.numel() != src.numel()) {
    throw Error(ErrorCode::kInvalidArgument,
                cat("copy: destination is ", dtype_name(dst.dtype()), " ", dst.shape().str(), " on ",
                    dst.device().name(), " but source is ", dtype_name(src.dtype()), " ", src.shape().str(), " on ",
                    src.device().name(), "; dtype and element count must match"));
  }
}
}  // namespace

void copy(const Tensor& dst, const Tensor& src) {
  check_copy(dst, src);
  Device& d = dst.device();
  Device& s = src.device();
  if (&d == &s) {
    d.copy_d2d(dst.data(), src.data(), dst.bytes());
  } else if (d.props().host_addressable && s.props().host_addressable) {
    // Both sides are host memory: the destination device paces the transfer as its own write.
    d.copy_h2d(dst.data(), src.data(), dst.bytes());
  } else {
    // Stage through host memory: no backend here can reach another's memory directly.
    std::vector<char> staging(dst.bytes());
    s.copy_d2h(staging.data(), src.data(), staging.size());
    d.copy_h2d(dst.data(), staging.data(), staging.size());
  }
}

void copy_from_host(const Tensor& dst, const void* src) { dst.device().copy_h2d(dst.data(), src, dst.bytes()); }

void copy_to_host(void* dst, const Tensor& src) { src.device().copy_d2h(dst, src.data(), src.bytes()); }

}  // namespace h2
