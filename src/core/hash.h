// FNV-1a (Fowler, Noll, Vo): a small, stable 64-bit hash of a string — the same on every host and build, so it
// may seed random numbers or name groups that several processes must agree on. Not for security.
#pragma once

#include <cstdint>
#include <string_view>

namespace h2 {

inline uint64_t fnv1a(std::string_view text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace h2
