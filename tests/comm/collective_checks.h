// Every reduction of every collective, checked against closed forms: all_reduce and reduce_scatter with sum,
// average and max, in f32 and bf16, at counts that take every algorithm (small: tree / recursive doubling; large:
// shared windows, or by messages ring / halving-doubling when a group has no window). Rank r contributes
// (r + 1) x (i mod 7 + 1) at element i: sums are exact in f32 and bf16, the maximum is rank n - 1's, and the
// average is the sum / n. Shared by the in-process tests (threads) and comm_worker (processes over UCX), so every
// transport answers the same questions.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/error.h"

namespace h2::testing_util {

inline float rank_value(int rank, size_t i) { return static_cast<float>((rank + 1) * static_cast<int>(i % 7 + 1)); }

// The expected reduction over `n` ranks of element i.
inline float reduced(ReduceOp op, int n, size_t i) {
  const float unit = static_cast<float>(i % 7 + 1), ranks_sum = static_cast<float>(n * (n + 1) / 2);
  switch (op) {
    case ReduceOp::kSum:
      return ranks_sum * unit;
    case ReduceOp::kAvg:
      return ranks_sum * unit / static_cast<float>(n);
    case ReduceOp::kMax:
      return static_cast<float>(n) * unit;
  }
  return 0;
}

inline const char* op_label(ReduceOp op) { return op == ReduceOp::kSum ? "sum" : op == ReduceOp::kAvg ? "avg" : "max"; }

// "" when every collective gave the expected values, else the first mismatch.
inline std::string check_every_reduction(Communicator& c, const std::vector<size_t>& counts) {
  const int n = c.size();
  // bf16 holds the average of (n + 1) / 2 x unit only to 8 bits; the rest is exact or one f32 rounding.
  auto close = [](float got, float want, DType dtype) {
    return std::abs(got - want) <= (dtype == DType::kBF16 ? 4e-3f : 1e-6f) * std::abs(want);
  };
  for (size_t count : counts) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
        const auto where = [&](const std::string& what, size_t i, float got, float want) {
          return cat("rank ", c.rank(), " of ", n, ": ", what, " ", op_label(op), " ", dtype_name(dtype), " count ",
                     count, " element ", i, ": got ", got, ", want ", want);
        };
        const size_t width = dtype_size(dtype);
        auto store = [&](std::vector<char>& buf, size_t i, float x) {
          if (dtype == DType::kF32) {
            reinterpret_cast<float*>(buf.data())[i] = x;
          } else {
            reinterpret_cast<bf16_t*>(buf.data())[i] = f32_to_bf16(x);
          }
        };
        auto load = [&](const std::vector<char>& buf, size_t i) {
          return dtype == DType::kF32 ? reinterpret_cast<const float*>(buf.data())[i]
                                      : bf16_to_f32(reinterpret_cast<const bf16_t*>(buf.data())[i]);
        };
        // all_reduce, in place.
        std::vector<char> v(count * width);
        for (size_t i = 0; i < count; ++i) store(v, i, rank_value(c.rank(), i));
        c.all_reduce(v.data(), count, dtype, op);
        for (size_t i = 0; i < count; ++i) {
          if (!close(load(v, i), reduced(op, n, i), dtype)) {
            return where(cat("all_reduce (", c.last_algorithm(), ")"), i, load(v, i), reduced(op, n, i));
          }
        }
        // reduce_scatter: this rank's block of the n x count input, reduced over the ranks.
        std::vector<char> in(count * static_cast<size_t>(n) * width), out(count * width);
        for (size_t i = 0; i < count * static_cast<size_t>(n); ++i) store(in, i, rank_value(c.rank(), i));
        c.reduce_scatter(out.data(), in.data(), count, dtype, op);
        for (size_t i = 0; i < count; ++i) {
          const size_t global = static_cast<size_t>(c.rank()) * count + i;
          if (!close(load(out, i), reduced(op, n, global), dtype)) {
            return where("reduce_scatter", i, load(out, i), reduced(op, n, global));
          }
        }
      }
    }
  }
  return "";
}

}  // namespace h2::testing_util
