// Op names, and the default entries of Kernels: reaching one means the dispatcher called an op whose
// supports() said no, which is a bug in the dispatcher or the backend, not in the caller's input.
#include "ops/kernels.h"

#include "core/error.h"

namespace h2 {

const char* op_name(Op op) {
  switch (op) {
    case Op::kEncoderForward:
      return "encoder_forward";
    case Op::kEncoderBackward:
      return "encoder_backward";
    case Op::kLayernormForward:
      return "layernorm_forward";
    case Op::kLayernormBackward:
      return "layernorm_backward";
    case Op::kMatmulForward:
      return "matmul_forward";
    case Op::kMatmulBackward:
      return "matmul_backward";
    case Op::kAttentionForward:
      return "attention_forward";
    case Op::kAttentionBackward:
      return "attention_backward";
    case Op::kGeluForward:
      return "gelu_forward";
    case Op::kGeluBackward:
      return "gelu_backward";
    case Op::kResidualForward:
      return "residual_forward";
    case Op::kCrossentropyForwardBackward:
      return "crossentropy_forward_backward";
    case Op::kCrossentropyStats:
      return "crossentropy_stats";
    case Op::kCrossentropyBackward:
      return "crossentropy_backward";
    case Op::kAdamwUpdate:
      return "adamw_update";
    case Op::kGlobalNormSquared:
      return "global_norm_squared";
    case Op::kScale:
      return "scale";
    case Op::kConvert:
      return "convert";
  }
  return "?";
}

bool interface_defines(Op op, DType dtype) {
  switch (op) {
    case Op::kGeluForward:
    case Op::kGeluBackward:
    case Op::kResidualForward:
    case Op::kConvert:
    case Op::kMatmulForward:
    case Op::kMatmulBackward:
    case Op::kAttentionForward:
    case Op::kAttentionBackward:
      return dtype == DType::kF32 || dtype == DType::kBF16;
    default:
      return dtype == DType::kF32;
  }
}

#define H2_NOT_IMPLEMENTED(op) H2_CHECK(false) << "backend '" << name() << "' has no " << op_name(op)

void Kernels::encoder_forward(float*, const int32_t*, const float*, const float*, int, int, int, int, int) const {
  H2_NOT_IMPLEMENTED(Op::kEncoderForward);
}
void Kernels::encoder_backward(float*, float*, const float*, const int32_t*, int, int, int, int, int) const {
  H2_NOT_IMPLEMENTED(Op::kEncoderBackward);
}
void Kernels::crossentropy_stats(float*, float*, float*, const float*, const int32_t*, int64_t, int, int) const {
  H2_NOT_IMPLEMENTED(Op::kCrossentropyStats);
}
void Kernels::crossentropy_backward(float*, const float*, const float*, const float*, const int32_t*, float, int64_t,
                                    int, int) const {
  H2_NOT_IMPLEMENTED(Op::kCrossentropyBackward);
}
void Kernels::layernorm_forward(float*, float*, float*, const float*, const float*, const float*, int64_t, int) const {
  H2_NOT_IMPLEMENTED(Op::kLayernormForward);
}
void Kernels::layernorm_backward(float*, float*, float*, const float*, const float*, const float*, const float*,
                                 const float*, int64_t, int) const {
  H2_NOT_IMPLEMENTED(Op::kLayernormBackward);
}
void Kernels::matmul_forward(float*, const float*, const float*, const float*, int64_t, int, int) const {
  H2_NOT_IMPLEMENTED(Op::kMatmulForward);
}
void Kernels::matmul_forward_bf16(float*, const bf16_t*, const bf16_t*, const float*, int64_t, int, int) const {
  H2_NOT_IMPLEMENTED(Op::kMatmulForward);
}
void Kernels::matmul_backward(float*, float*, float*, const float*, const float*, const float*, int64_t, int,
                              int) const {
  H2_NOT_IMPLEMENTED(Op::kMatmulBackward);
}
void Kernels::matmul_backward_bf16(float*, float*, float*, const float*, const bf16_t*, const bf16_t*, int64_t, int,
                                   int) const {
  H2_NOT_IMPLEMENTED(Op::kMatmulBackward);
}
void Kernels::attention_forward(float*, float*, const float*, int, int, int, int) const {
  H2_NOT_IMPLEMENTED(Op::kAttentionForward);
}
void Kernels::attention_backward(float*, const float*, const float*, const float*, int, int, int, int) const {
  H2_NOT_IMPLEMENTED(Op::kAttentionBackward);
}
void Kernels::attention_forward_bf16(bf16_t*, bf16_t*, const bf16_t*, int, int, int, int) const {
  H2_NOT_IMPLEMENTED(Op::kAttentionForward);
}
void Kernels::attention_backward_bf16(float*, const float*, const bf16_t*, const bf16_t*, int, int, int, int) const {
  H2_NOT_IMPLEMENTED(Op::kAttentionBackward);
}
void Kernels::gelu_forward(void*, const void*, DType, int64_t) const { H2_NOT_IMPLEMENTED(Op::kGeluForward); }
void Kernels::gelu_backward(float*, const void*, const float*, DType, int64_t) const {
  H2_NOT_IMPLEMENTED(Op::kGeluBackward);
}
void Kernels::residual_forward(void*, const void*, const void*, DType, int64_t) const {
  H2_NOT_IMPLEMENTED(Op::kResidualForward);
}
void Kernels::crossentropy_forward_backward(float*, float*, const float*, const int32_t*, float, int64_t, int) const {
  H2_NOT_IMPLEMENTED(Op::kCrossentropyForwardBackward);
}
void Kernels::adamw_update(float*, float*, float*, const float*, int64_t, const AdamwParams&) const {
  H2_NOT_IMPLEMENTED(Op::kAdamwUpdate);
}
void Kernels::global_norm_squared(float*, const float*, int64_t) const { H2_NOT_IMPLEMENTED(Op::kGlobalNormSquared); }
void Kernels::scale(float*, float, int64_t) const { H2_NOT_IMPLEMENTED(Op::kScale); }
void Kernels::convert(void*, DType, const void*, DType, int64_t) const { H2_NOT_IMPLEMENTED(Op::kConvert); }

}  // namespace h2
