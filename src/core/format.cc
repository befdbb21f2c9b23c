// Printing byte counts.
#include "core/format.h"

#include <cmath>
#include <cstdio>

namespace h2 {

std::string format_seconds(double s) {
  const double a = std::abs(s);
  if (a >= 1.0 || a == 0.0) return format("%.4g s", s);
  if (a >= 1e-3) return format("%.4g ms", s * 1e3);
  return format("%.4g us", s * 1e6);
}

std::string format_bytes(double bytes) {
  char buf[64];
  const double a = std::abs(bytes);
  if (a >= kBytesPerGiB) {
    std::snprintf(buf, sizeof(buf), "%.2f GiB", bytes / kBytesPerGiB);
  } else if (a >= 1048576.0) {
    std::snprintf(buf, sizeof(buf), "%.1f MiB", bytes / 1048576.0);
  } else if (a >= 1024.0) {
    std::snprintf(buf, sizeof(buf), "%.1f KiB", bytes / 1024.0);
  } else {
    std::snprintf(buf, sizeof(buf), "%.0f B", bytes);
  }
  return buf;
}

}  // namespace h2
