// bench_cuda_matmul: H2's matmul on the cuda backend (ops::matmul_forward / matmul_backward in bf16 and f32, bias
// included) beside bare cublasGemmEx calls on the same buffers and shapes, measured in the same run: GPT-2-small's
// four projections and its head at B=4, T=1024. Goal (issue #18): >= 90% of bare cuBLAS. Built only with the cuda
// backend; scripts/gpu_check.sh runs it on a GPU. Usage: bench_cuda_matmul [--reps N]
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bench_main.h"
#include "core/clock.h"
#include "core/error.h"
#include "device/registry.h"
#include "ops/ops.h"

namespace h2 {
namespace {

struct Shape3 {
  const char* name;
  int C, OC;
};

int run(int argc, char** argv) {
  int reps = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--reps") reps = std::atoi(argv[i + 1]);
  }
  auto dev = create_device(DeviceSpec{.backend = "cuda"});
  cublasHandle_t handle;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) throw Error(ErrorCode::kInternal, "cublasCreate failed");
  const int64_t N = 4 * 1024;
  const Shape3 shapes[] = {
      {"qkv", 768, 2304}, {"attn proj", 768, 768}, {"fc", 768, 3072}, {"mlp proj", 3072, 768}, {"head", 768, 50257}};
  // Median seconds of fn over reps runs after a warm-up, each run waited for (H2's stream and cuBLAS's default one).
  auto time = [&](const std::function<void()>& fn) {
    return median_seconds(reps, [&] {
      fn();
      cudaDeviceSynchronize();
    });
  };
  std::printf("%-10s %-5s %-8s %10s %10s %8s\n", "shape", "dtype", "pass", "h2 TF/s", "cuBLAS", "ratio");
  double worst = 1e9;
  for (const Shape3& s : shapes) {
    for (DType dtype : {DType::kBF16, DType::kF32}) {
      const cudaDataType_t ct = dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
      Tensor inp = dev->zeros(dtype, {N, s.C}), w = dev->zeros(dtype, {s.OC, s.C});
      Tensor bias = dev->zeros(DType::kF32, {s.OC}), out = dev->zeros(DType::kF32, {N, s.OC});
      Tensor dout = dev->zeros(DType::kF32, {N, s.OC}), dinp = dev->zeros(DType::kF32, {N, s.C});
      Tensor dw = dev->zeros(DType::kF32, {s.OC, s.C}), dbias = dev->zeros(DType::kF32, {s.OC});
      Tensor dout_narrow = dev->zeros(dtype, {N, s.OC});
      const float one = 1.0f, zero = 0.0f;
      const double flops = 2.0 * N * s.C * s.OC;
      const double h2_fwd = time([&] { ops::matmul_forward(out, inp, w, bias); });
      const double blas_fwd = time([&] {
        cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, s.OC, static_cast<int>(N), s.C, &one, w.data(), ct, s.C,
                     inp.data(), ct, s.C, &zero, out.data(), CUDA_R_32F, s.OC, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      });
      const double h2_bwd = time([&] { ops::matmul_backward(dinp, dw, dbias, dout, inp, w); });
      const double blas_bwd = time([&] {
        cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, s.C, static_cast<int>(N), s.OC, &one, w.data(), ct, s.C,
                     dout_narrow.data(), ct, s.OC, &zero, dinp.data(), CUDA_R_32F, s.C, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT);
        cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_T, s.C, s.OC, static_cast<int>(N), &one, inp.data(), ct, s.C,
                     dout_narrow.data(), ct, s.OC, &one, dw.data(), CUDA_R_32F, s.C, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT);
      });
      for (auto [pass, h2_s, blas_s, f] :
           {std::tuple{"forward", h2_fwd, blas_fwd, flops}, std::tuple{"backward", h2_bwd, blas_bwd, 2 * flops}}) {
        const double ratio = blas_s / h2_s;
        worst = std::min(worst, ratio);
        std::printf("%-10s %-5s %-8s %10.1f %10.1f %7.2fx\n", s.name, dtype_name(dtype), pass, f / h2_s * 1e-12,
                    f / blas_s * 1e-12, ratio);
      }
    }
  }
  std::printf("worst h2 / bare cuBLAS: %.2f (goal >= 0.90)\n", worst);
  cublasDestroy(handle);
  return 0;
}

}  // namespace
}  // namespace h2

int main(int argc, char** argv) { return h2::bench_main("bench_cuda_matmul", argc, argv, h2::run); }
