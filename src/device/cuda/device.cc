// The `cuda` device: one CUDA stream per device as its in-order queue (device.h's synchronisation model), a cuBLAS
// handle on that stream and a cuBLASLt handle, stream-ordered memory (cudaMallocAsync from the GPU's pool, which
// keeps what is freed for reuse) counted against the GPU's capacity, pinned staging buffers from a pool.
#include "device/cuda/device.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>

#include "core/error.h"
#include "device/staging_pool.h"
#include "ops/cuda/kernels.h"

namespace h2 {
namespace {

class CudaDevice final : public Device {
 public:
  CudaDevice(DeviceProps props, int ordinal) : Device(std::move(props)), ordinal_(ordinal) {
    select();
    // Freed memory stays in the GPU's pool for the next allocation instead of going back to the driver at each
    // synchronisation (the pool's default), so that allocating a step's temporaries costs no driver call.
    cudaMemPool_t pool = nullptr;
    check(cudaDeviceGetDefaultMemPool(&pool, ordinal_), "cudaDeviceGetDefaultMemPool");
    uint64_t keep_all = UINT64_MAX;
    check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all), "cudaMemPoolSetAttribute");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    if (cublasCreate(&blas_) != CUBLAS_STATUS_SUCCESS || cublasSetStream(blas_, stream_) != CUBLAS_STATUS_SUCCESS ||
        cublasLtCreate(&blas_lt_) != CUBLAS_STATUS_SUCCESS) {
      if (blas_ != nullptr) cublasDestroy(blas_);
      cudaStreamDestroy(stream_);
      throw Error(ErrorCode::kInternal, cat("cuBLAS could not start on ", name()));
    }
  }
  ~CudaDevice() override {
    cudaSetDevice(ordinal_);
    cudaStreamSynchronize(stream_);
    release_staged(/*all=*/true);
    cublasLtDestroy(blas_lt_);
    cublasDestroy(blas_);
    cudaStreamDestroy(stream_);
  }

  const Kernels& kernels() const override { return cuda_kernels(); }

  void launch(const char* op_name, uint64_t /*shape_key*/, const std::function<void()>& kernel) override {
    select();
    CudaQueueScope scope(CudaQueue{.stream = stream_, .blas = blas_, .blas_lt = blas_lt_});
    try {
      kernel();
    } catch (const Error& e) {
      throw Error(e.code(), cat(name(), ": ", op_name, ": ", e.what()));
    }
  }

  // Host memory handed to a copy may be reused as soon as the call returns. To the device, up to kStagedCopy
  // bytes go first into a pinned staging buffer and then by DMA in stream order, so the host does not wait for the
  // kernels queued before the copy; an event recorded after it tells when the buffer may serve again. Larger copies
  // (checkpoints), and copies from the device (the host reads the result), wait for the stream. Device-to-device
  // copies and fills are ordered on it like kernels.
  void copy_h2d(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    select();
    release_staged(/*all=*/false);
    if (bytes > kStagedCopy) {
      check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (host to device)");
      check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
      return;
    }
    std::shared_ptr<char> staging = staging_.take(bytes);
    std::memcpy(staging.get(), src, bytes);
    check(cudaMemcpyAsync(dst, staging.get(), bytes, cudaMemcpyHostToDevice, stream_),
          "cudaMemcpyAsync (host to device)");
    cudaEvent_t passed = nullptr;
    check(cudaEventCreateWithFlags(&passed, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    check(cudaEventRecord(passed, stream_), "cudaEventRecord");
    std::lock_guard<std::mutex> lock(staged_mutex_);
    staged_.push_back({passed, std::move(staging)});
  }
  void copy_d2h(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    select();
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync (device to host)");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }
  void copy_d2d(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    select();
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync (device to device)");
  }
  void fill_zero(void* dst, size_t bytes) override {
    if (bytes == 0) return;
    select();
    check(cudaMemsetAsync(dst, 0, bytes, stream_), "cudaMemsetAsync");
  }
  void synchronize() override {
    select();
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    release_staged(/*all=*/true);
  }
  std::shared_ptr<char> host_staging(size_t bytes) override { return staging_.take(bytes); }

 protected:
  // Stream-ordered: the memory is usable by work queued after the allocation, and a free takes effect once the
  // work queued before it has run, so neither waits for the GPU.
  void* raw_allocate(size_t bytes) override {
    select();
    void* ptr = nullptr;
    const cudaError_t status = cudaMallocAsync(&ptr, std::max<size_t>(bytes, 1), stream_);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear it
      throw Error(ErrorCode::kOutOfMemory,
                  cat("out of memory on device ", name(), ": cudaMallocAsync refused ", format_bytes(bytes),
                      " although the device's capacity allowed it "
                      "(another process may be using the GPU; see nvidia-smi)"));
    }
    check(status, "cudaMallocAsync");
    return ptr;
  }
  void raw_free(void* ptr) override {
    cudaSetDevice(ordinal_);
    cudaFreeAsync(ptr, stream_);
  }

 private:
  void select() { check(cudaSetDevice(ordinal_), "cudaSetDevice"); }

  // Returns to the pool the staging buffers of copies the stream has passed (all of them after a synchronisation);
  // the stream runs in order, so the first copy not yet passed ends the search.
  void release_staged(bool all) {
    std::lock_guard<std::mutex> lock(staged_mutex_);
    while (!staged_.empty()) {
      const cudaError_t status = all ? cudaSuccess : cudaEventQuery(staged_.front().passed);
      if (status == cudaErrorNotReady) return;
      cudaEventDestroy(staged_.front().passed);
      staged_.pop_front();
      if (status != cudaSuccess) check(status, "cudaEventQuery");
    }
  }
  void check(cudaError_t status, const char* call) const { check_cuda(status, call, name()); }

  // Pinned memory takes milliseconds to allocate and free, and every staged pipeline send needs a buffer of its
  // own: freed buffers are kept for reuse, up to kStagingReserve.
  static constexpr size_t kStagingReserve = size_t{512} << 20;
  static constexpr size_t kStagedCopy = size_t{64} << 20;
  char* pinned(size_t bytes) const {
    void* ptr = nullptr;
    // Portable: pinned for every GPU of the process, since a staging buffer may serve tensors of several.
    check(cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable), "cudaHostAlloc");
    return static_cast<char*>(ptr);
  }

  int ordinal_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  cublasLtHandle_t blas_lt_ = nullptr;
  StagingPool staging_{[this](size_t bytes) { return pinned(bytes); }, [](char* p) { cudaFreeHost(p); },
                       kStagingReserve};
  // Copies to the device in flight: the event the stream reaches after each, and its staging buffer (declared
  // after the pool, so destroyed before it).
  struct Staged {
    cudaEvent_t passed;
    std::shared_ptr<char> buffer;
  };
  std::mutex staged_mutex_;
  std::deque<Staged> staged_;
};

}  // namespace

std::vector<CudaDeviceInfo> cuda_devices(std::string* why_none) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  std::vector<CudaDeviceInfo> out;
  if (status != cudaSuccess) {
    cudaGetLastError();
    if (why_none != nullptr) *why_none = cat("cudaGetDeviceCount: ", cudaGetErrorString(status));
    return out;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    out.push_back({.ordinal = i,
                   .name = p.name,
                   .memory_bytes = p.totalGlobalMem,
                   .compute_major = p.major,
                   .compute_minor = p.minor});
  }
  if (out.empty() && why_none != nullptr) *why_none = "the CUDA runtime reports no GPU";
  return out;
}

std::unique_ptr<Device> make_cuda_device(int ordinal, size_t mem_capacity_bytes) {
  std::string why;
  const std::vector<CudaDeviceInfo> gpus = cuda_devices(&why);
  if (ordinal < 0 || ordinal >= static_cast<int>(gpus.size())) {
    throw Error(ErrorCode::kNotFound, gpus.empty() ? cat("no CUDA device: ", why,
                                                         ". The cuda backend needs an NVIDIA GPU and its driver; "
                                                         "use --backend cpu here")
                                                   : cat("no CUDA device cuda:", ordinal, "; this machine has ",
                                                         gpus.size(), " (cuda:0 to cuda:", gpus.size() - 1, ")"));
  }
  const CudaDeviceInfo& g = gpus[static_cast<size_t>(ordinal)];
  DeviceProps props{.name = cat("cuda:", ordinal),
                    .backend = "cuda",
                    .chip = g.name,
                    .mem_capacity_bytes = std::min(mem_capacity_bytes, g.memory_bytes),
                    .host_addressable = false};
  return std::make_unique<CudaDevice>(std::move(props), ordinal);
}

}  // namespace h2
