// The `cuda` backend's kernels (docs/devices.md, "The cuda backend"): every op of the operator interface in f32 and
// bf16, matmul on cuBLAS and cuBLASLt, attention's products on cuBLAS, the rest as CUDA kernels. Built only when
// CMake finds the CUDA toolkit (H2_CUDA).
//
// The kernels run on the queue of the device that launches them: a CUDA stream, a cuBLAS handle bound to it and a
// cuBLASLt handle (whose calls name the stream).
// One Kernels instance serves every device, so the cuda device sets its queue for the calling thread around each
// launch (CudaQueueScope); a kernel called outside a launch is a bug (checked).
#pragma once

#include <string>

#include "ops/kernels.h"

namespace h2 {

// Opaque here (cudaStream_t, cublasHandle_t) so that this header needs no CUDA header.
struct CudaQueue {
  void* stream = nullptr;
  void* blas = nullptr;
  void* blas_lt = nullptr;  // cublasLtHandle_t
};

class CudaQueueScope {
 public:
  explicit CudaQueueScope(CudaQueue queue);
  ~CudaQueueScope();
  CudaQueueScope(const CudaQueueScope&) = delete;
  CudaQueueScope& operator=(const CudaQueueScope&) = delete;

 private:
  CudaQueue previous_;
};

const Kernels& cuda_kernels();

// Throws Error(kInternal) naming the CUDA call and the error when `status` (a cudaError_t) is not success, after
// `where` (a device's name) when given.
void check_cuda(int status, const char* call, const std::string& where = "");

}  // namespace h2
