// DType names and the bf16 conversion, against hand-computed bit patterns.
#include "core/dtype.h"

#include <cmath>
#include <limits>

#include "test_util.h"

namespace h2 {
namespace {

TEST(DType, SizesAndNamesRoundTrip) {
  for (DType d : {DType::kF32, DType::kBF16, DType::kF64, DType::kI32}) EXPECT_EQ(parse_dtype(dtype_name(d)), d);
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kF64), 8u);
  EXPECT_THAT(testing_util::error_of([] { parse_dtype("fp8"); }, ErrorCode::kInvalidArgument),
              ::testing::HasSubstr("unknown dtype 'fp8'"));
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 lies exactly between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
  // 1 + 3 * 2^-8 lies between 1 + 2^-7 (odd) and 1 + 2^-6 (even): rounds up to even.
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
  // Just above the tie rounds up.
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
  EXPECT_EQ(f32_to_bf16(-2.0f), 0xc000);
  EXPECT_FLOAT_EQ(bf16_to_f32(0x3f81), 1.0f + 0x1p-7f);
}

TEST(DType, Bf16KeepsSpecialValues) {
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload is only in the low bits must not round to infinity.
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::bit_cast<float>(0x7f800001u)))));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::infinity())), std::numeric_limits<float>::infinity());
  // The largest float rounds up to infinity, as IEEE rounding demands.
  EXPECT_TRUE(std::isinf(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::max()))));
}

}  // namespace
}  // namespace h2
