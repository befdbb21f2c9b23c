// Seconds on the monotonic clock (CLOCK_MONOTONIC on Linux: comparable across the processes of one host, which
// the measured pipeline traces rely on).
#pragma once

#include <chrono>

namespace h2 {

inline double monotonic_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace h2
