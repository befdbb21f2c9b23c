// A tensor shape: up to kMaxDims sizes, row-major (the last dimension is contiguous).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace h2 {

class Shape {
 public:
  static constexpr int kMaxDims = 6;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);

  int rank() const { return rank_; }
  int64_t operator[](int i) const { return dims_[static_cast<size_t>(i)]; }
  int64_t numel() const;
  // A copy with dimension `i` set to `size`.
  Shape with_dim(int i, int64_t size) const;
  bool operator==(const Shape& other) const;
  std::string str() const;  // "[4, 256, 768]"

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int rank_ = 0;
};

}  // namespace h2
