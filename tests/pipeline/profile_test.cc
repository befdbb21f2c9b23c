// What `h2 profile` makes of its measurements: the GEMM rate and elements' costs fitted to GEMMs' times.
#include "pipeline/profile.h"

#include <gtest/gtest.h>

namespace h2 {
namespace {

// The model's GEMMs of a 256-wide block and a 50,257-token head at TP 1 and 2, 256 and 1,024 rows (what h2 profile
// times for model_small.yaml), each timed as 6 r k n / rate + 3 (a r k + b k n + c r n): the cost model's own form,
// written here by hand.
std::vector<GemmTiming> timed(double rate, double a, double b, double c) {
  std::vector<GemmTiming> out;
  for (double tp : {1.0, 2.0}) {
    for (double rows : {256.0, 1024.0}) {
      for (auto [k, n] : {std::pair{256.0, 768 / tp},
                          {256 / tp, 256.0},
                          {256.0, 1024 / tp},
                          {1024 / tp, 256.0},
                          {256.0, std::floor(50257 / tp)}}) {
        out.push_back({rows, k, n, 6 * rows * k * n / rate + 3 * (a * rows * k + b * k * n + c * rows * n)});
      }
    }
  }
  return out;
}

TEST(MatmulFit, RecoversTheRateAndElementsCostsOfItsOwnForm) {
  const MatmulFit fit = fit_matmul(timed(240e9, 0.5e-9, 1.25e-9, 0.65e-9));
  EXPECT_NEAR(fit.flops, 240e9, 1e-6 * 240e9);
  EXPECT_NEAR(fit.element_s[0], 0.5e-9, 1e-6 * 0.5e-9);
  EXPECT_NEAR(fit.element_s[1], 1.25e-9, 1e-6 * 1.25e-9);
  EXPECT_NEAR(fit.element_s[2], 0.65e-9, 1e-6 * 0.65e-9);
  EXPECT_LT(fit.rms_error, 1e-9);
}

// Times no non-negative costs explain (the weight's "cost" below zero): that cost leaves the fit, the others stay
// at or above zero, and the error says the fit is not exact.
TEST(MatmulFit, DropsACostTheDataWouldMakeNegative) {
  const MatmulFit fit = fit_matmul(timed(240e9, 2e-9, -0.2e-9, 0.65e-9));
  EXPECT_GT(fit.flops, 0.0);
  EXPECT_EQ(fit.element_s[1], 0.0);
  EXPECT_GE(fit.element_s[0], 0.0);
  EXPECT_GE(fit.element_s[2], 0.0);
  EXPECT_GT(fit.rms_error, 1e-4);
}

// Too few GEMMs to fit four unknowns: the rate of them all together (6 r k n FLOPs over their time), no costs.
TEST(MatmulFit, FewerThanFourGemmsGiveTheirRateAlone) {
  const MatmulFit fit = fit_matmul({{100, 10, 20, 1e-6}, {200, 10, 20, 3e-6}});
  EXPECT_DOUBLE_EQ(fit.flops, (6.0 * 100 * 10 * 20 + 6.0 * 200 * 10 * 20) / 4e-6);
  EXPECT_EQ(fit.element_s, (std::array<double, 3>{}));
}

// h2 profile measures one rank of each chip type at a time, in rank order, each pass over all of them: ranks of
// chips {fast, fast, slow, slow, mid}, two passes -> 0, 2, 4, then 0, 2, 4 again.
TEST(ProfileTurns, TheFirstRankOfEachChipTypeOncePerPass) {
  EXPECT_EQ(measuring_turns({"fast", "fast", "slow", "slow", "mid"}, 2), (std::vector<int>{0, 2, 4, 0, 2, 4}));
  EXPECT_EQ(measuring_turns({"slow", "fast", "slow"}, 1), (std::vector<int>{0, 1}));
}

// Of two passes, the faster by block and head together: a pass with the faster block but a head slower by more is
// not kept.
TEST(ProfileTurns, KeepsThePassWhoseBlockAndHeadTogetherAreFaster) {
  ChipMeasurement first, second;
  first.layer_s = 1.0, first.head_s = 1.0;    // 2.0 s
  second.layer_s = 0.9, second.head_s = 1.2;  // 2.1 s: the faster block, the slower whole
  EXPECT_EQ(&faster_measurement(first, second), &first);
  second.head_s = 1.0;  // 1.9 s
  EXPECT_EQ(&faster_measurement(first, second), &second);
  EXPECT_EQ(&faster_measurement(second, first), &second);
}

// The latency under load, worked by hand. Pair (0, 1): GEMMs alone 10 and 12 ms, with the all-reduce 13 and 14 ms:
// the all-reduce ends 14 - 12 = 2 ms after the slower GEMM alone, two messages of 1 ms. Pair (2, 3): 20 and 20 ms,
// 23 and 22 ms: 3 ms, 1.5 ms a message. The mean: 1.25 ms. A fifth rank, alone, has no pair and does not count.
TEST(LatencyUnderLoad, APairsAllReduceBeyondItsSlowerGemmOverTwoMessages) {
  EXPECT_NEAR(latency_under_load_s({10e-3, 13e-3, 12e-3, 14e-3, 20e-3, 23e-3, 20e-3, 22e-3, 5e-3, 9e-3}), 1.25e-3,
              1e-12);
  // Noise that makes the all-reduce look faster than the GEMM counts as no latency, not a negative one.
  EXPECT_EQ(latency_under_load_s({10e-3, 9e-3, 10e-3, 9.5e-3}), 0.0);
  EXPECT_EQ(latency_under_load_s({10e-3, 11e-3}), 0.0);  // one rank: no pair
}

}  // namespace
}  // namespace h2
