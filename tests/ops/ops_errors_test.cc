// Bad arguments to ops: each gives an Error naming the op, the argument and the shapes.
#include "device/registry.h"
#include "ops/ops.h"
#include "test_util.h"

namespace h2 {
namespace {

using ::testing::HasSubstr;
using testing_util::error_of;

class OpsErrors : public ::testing::Test {
 protected:
  std::unique_ptr<Device> dev_ = create_device(DeviceSpec{.backend = "cpu"});
  Tensor f32(Shape s) { return dev_->zeros(DType::kF32, s); }
};

TEST_F(OpsErrors, MatmulWithMismatchedWeight) {
  const std::string msg = error_of(
      [&] {
        ops::matmul_forward(f32({4, 8}), f32({4, 6}), f32({8, 5}), Tensor());
      },
      ErrorCode::kInvalidArgument);
  EXPECT_THAT(msg, HasSubstr("matmul_forward: 'weight' has shape [8, 5] but 'inp' has shape [4, 6]"));
}

TEST_F(OpsErrors, MatmulWithWrongOutputSize) {
  EXPECT_THAT(error_of(
                  [&] {
                    ops::matmul_forward(f32({4, 7}), f32({4, 6}), f32({8, 6}), Tensor());
                  },
                  ErrorCode::kInvalidArgument),
              HasSubstr("argument 'out' has shape [4, 7] (28 elements) but needs 32 elements"));
}

// A bf16 product takes inp and weight both in bf16, into an f32 out.
TEST_F(OpsErrors, MatmulInBf16NeedsBothOperandsInBf16AndAnF32Output) {
  Tensor x = dev_->zeros(DType::kBF16, {4, 6}), w = dev_->zeros(DType::kBF16, {8, 6});
  EXPECT_THAT(error_of(
                  [&] {
                    ops::matmul_forward(f32({4, 8}), x, f32({8, 6}), Tensor());
                  },
                  ErrorCode::kInvalidArgument),
              HasSubstr("matmul_forward: argument 'weight' is f32 but must be bf16"));
  EXPECT_THAT(error_of(
                  [&] {
                    ops::matmul_forward(dev_->zeros(DType::kBF16, {4, 8}), x, w, Tensor());
                  },
                  ErrorCode::kInvalidArgument),
              HasSubstr("matmul_forward: argument 'out' is bf16 but must be f32"));
  ops::matmul_forward(f32({4, 8}), x, w, Tensor());  // and this one runs
  // Backward: inp and weight in one precision, dout and the gradients f32.
  EXPECT_THAT(error_of(
                  [&] {
                    ops::matmul_backward(f32({4, 6}), f32({8, 6}), Tensor(), f32({4, 8}), x, f32({8, 6}));
                  },
                  ErrorCode::kInvalidArgument),
              HasSubstr("matmul_backward: argument 'weight' is f32 but must be bf16"));
  EXPECT_THAT(error_of(
                  [&] {
                    ops::matmul_backward(f32({4, 6}), f32({8, 6}), Tensor(), dev_->zeros(DType::kBF16, {4, 8}), x, w);
                  },
                  ErrorCode::kInvalidArgument),
              HasSubstr("matmul_backward: argument 'dout' is bf16 but must be f32"));
  ops::matmul_backward(f32({4, 6}), f32({8, 6}), f32({8}), f32({4, 8}), x, w);
  // Either product may be skipped (a split backward), but not both.
  EXPECT_THAT(error_of(
                  [&] {
                    ops::matmul_backward(Tensor(), Tensor(), f32({8}), f32({4, 8}), x, w);
                  },
                  ErrorCode::kInvalidArgument),
              HasSubstr("matmul_backward: 'dinp' and 'dweight' are both undefined; pass at least one"));
  EXPECT_THAT(error_of(
                  [&] {
                    ops::matmul_backward(Tensor(), f32({8, 5}), Tensor(), f32({4, 8}), x, w);
                  },
                  ErrorCode::kInvalidArgument),
              HasSubstr("matmul_backward: argument 'dweight' has shape [8, 5] but 'weight' has shape [8, 6]"));
  ops::matmul_backward(Tensor(), f32({8, 6}), Tensor(), f32({4, 8}), x, w);
  ops::matmul_backward(f32({4, 6}), Tensor(), Tensor(), f32({4, 8}), x, w);
}

TEST_F(OpsErrors, ElementwiseShapesAndDtypesMustMatch) {
  EXPECT_THAT(error_of([&] { ops::gelu_forward(f32({3}), f32({4})); }, ErrorCode::kInvalidArgument),
              HasSubstr("gelu_forward: argument 'inp' has shape [4] but 'out' has shape [3]"));
  Tensor b = dev_->empty(DType::kBF16, {3});
  EXPECT_THAT(error_of([&] { ops::residual_forward(f32({3}), f32({3}), b); }, ErrorCode::kInvalidArgument),
              HasSubstr("'inp2' is bf16 but 'out' is f32"));
}

TEST_F(OpsErrors, AttentionHeadsMustDivideChannels) {
  EXPECT_THAT(error_of(
                  [&] {
                    ops::attention_forward(f32({1, 2, 10}), f32({1, 3, 2, 2}), f32({1, 2, 30}), 3);
                  },
                  ErrorCode::kInvalidArgument),
              HasSubstr("C = 10 is not divisible by num_heads = 3"));
}

TEST_F(OpsErrors, TokensOutOfRangeAreNamed) {
  Tensor tokens = dev_->zeros(DType::kI32, {1, 2});
  tokens.data_as<int32_t>()[1] = 9;
  EXPECT_THAT(error_of(
                  [&] {
                    ops::encoder_forward(f32({1, 2, 4}), tokens, f32({5, 4}), f32({2, 4}));
                  },
                  ErrorCode::kInvalidArgument),
              HasSubstr("'tokens' element 1 is 9, outside [0, 5)"));
  EXPECT_THAT(error_of(
                  [&] {
                    ops::crossentropy_forward_backward(f32({2}), f32({2, 5}), f32({2, 5}), tokens, 1.0f);
                  },
                  ErrorCode::kInvalidArgument),
              HasSubstr("and not -1 (ignore)"));
}

TEST_F(OpsErrors, WrongDtypeAndUndefinedTensors) {
  Tensor ints = dev_->zeros(DType::kI32, {4});
  EXPECT_THAT(error_of([&] { ops::scale(ints, 2.0f); }, ErrorCode::kInvalidArgument),
              HasSubstr("scale: argument 'x' is i32 but must be f32"));
  EXPECT_THAT(error_of([&] { ops::gelu_forward(Tensor(), f32({1})); }, ErrorCode::kInvalidArgument),
              HasSubstr("'out' is an undefined tensor"));
}

TEST_F(OpsErrors, TensorsOnDifferentDevices) {
  auto other = create_device(DeviceSpec{.backend = "ref"});
  Tensor x = other->zeros(DType::kF32, {3});
  EXPECT_THAT(error_of([&] { ops::gelu_forward(f32({3}), x); }, ErrorCode::kInvalidArgument),
              HasSubstr("on different devices (cpu:0 and ref:0)"));
}

TEST_F(OpsErrors, AdamwStepIsOneBased) {
  AdamwParams hp{.step = 0};
  EXPECT_THAT(
      error_of([&] { ops::adamw_update(f32({2}), f32({2}), f32({2}), f32({2}), hp); }, ErrorCode::kInvalidArgument),
      HasSubstr("step must be >= 1"));
}

TEST_F(OpsErrors, EmptyBatchesAreValid) {
  ops::matmul_forward(f32({0, 6}), f32({0, 6}), f32({8, 6}), Tensor());
  ops::gelu_forward(f32({0}), f32({0}));
  SUCCEED();
}

}  // namespace
}  // namespace h2
