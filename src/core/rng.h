// A deterministic random number generator whose stream is the same on every compiler and standard library
// (std::normal_distribution is not), so that a seed gives the same data and weights everywhere.
// SplitMix64 (Steele, Lea, Flood 2014) for the bits; Box-Muller for normals.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>

namespace h2 {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}

  uint64_t next_u64() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  // Uniform integer in [0, n).
  uint64_t below(uint64_t n) { return next_u64() % n; }
  double normal() {
    double u1 = 1.0 - uniform();  // in (0, 1], so log() is finite
    double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }

 private:
  uint64_t state_;
};

}  // namespace h2
