// Text for people: printf into a std::string, and byte counts (one definition of a GiB, one way to print one).
#pragma once

#include <cstdio>
#include <string>

namespace h2 {

inline constexpr double kBytesPerGiB = 1073741824.0;

// printf's formatting into a std::string.
template <typename... Args>
std::string format(const char* fmt, Args... args) {
  const int n = std::snprintf(nullptr, 0, fmt, args...);
  std::string out(static_cast<size_t>(n) + 1, '\0');
  std::snprintf(out.data(), out.size(), fmt, args...);
  out.pop_back();
  return out;
}

// A duration with four significant digits in a fitting unit: "24.65 s", "3.127 ms", "41.20 us".
std::string format_seconds(double seconds);

// "1.50 GiB", "12.0 MiB", "3.0 KiB", "512 B": sizes as people read them in messages and tables.
std::string format_bytes(double bytes);

}  // namespace h2
