// Seconds on the monotonic clock, and the median timing of a repeated call. Monotonic seconds: (CLOCK_MONOTONIC on
// Linux: comparable across the processes of one host, which the measured pipeline traces rely on).
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace h2 {

inline double monotonic_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
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
  std::nth_element(times.begin(), times.begin() + static_cast<long>(times.size() / 2), times.end());
  return times[times.size() / 2];
}

}  // namespace h2
