// Seconds on the monotonic clock, medians, and the median timing of a repeated call. Monotonic seconds:
// (CLOCK_MONOTONIC on Linux: comparable across the processes of one host, which the measured pipeline traces rely on).
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace h2 {

inline double monotonic_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The median of timings (the upper middle one for an even count); 0 for none.
inline double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::nth_element(values.begin(), values.begin() + static_cast<long>(values.size() / 2), values.end());
  return values[values.size() / 2];
}

// The median wall time of `reps` runs of fn() after one warm-up run (benchmarks and h2 profile).
inline double median_seconds(int reps, const std::function<void()>& fn) {
  fn();
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    const double t0 = monotonic_seconds();
    fn();
    times.push_back(monotonic_seconds() - t0);
  }
  return median(std::move(times));
}

}  // namespace h2
