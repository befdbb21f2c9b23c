// The cuda backend's kernels (see kernels.h). Correct first, fast second: matmul is cuBLAS's; attention is one
// thread block per query row (scores, softmax and P·V in shared memory), not a fused flash kernel; reductions use
// atomics. docs/devices.md says what has been run on a GPU and what has not.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "ops/cuda/kernels.h"

namespace h2 {
namespace {

thread_local CudaQueue current_queue;

cudaStream_t stream() {
  H2_CHECK(current_queue.stream != nullptr) << "a cuda kernel was called outside its device's launch()";
  return static_cast<cudaStream_t>(current_queue.stream);
}
cublasHandle_t blas() {
  H2_CHECK(current_queue.blas != nullptr) << "a cuda kernel was called outside its device's launch()";
  return static_cast<cublasHandle_t>(current_queue.blas);
}

void check_blas(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw Error(ErrorCode::kInternal, cat(call, " failed: ", cublasGetStatusString(status)));
  }
}

constexpr int kThreads = 256;     // element-wise kernels and per-row kernels
constexpr int kRowThreads = 128;  // attention: one block per query row
constexpr int64_t kMaxBlocks = 65535;

// bf16 storage is bf16_t (uint16_t), as on the host; the same rounding as core/dtype.h's f32_to_bf16.
__device__ __forceinline__ float widen(uint16_t v) { return __uint_as_float(static_cast<uint32_t>(v) << 16); }
__device__ __forceinline__ uint16_t narrow(float value) {
  const uint32_t bits = __float_as_uint(value);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x0040u;
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}
__device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load(const uint16_t* p, int64_t i) { return widen(p[i]); }
__device__ __forceinline__ void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store(uint16_t* p, int64_t i, float v) { p[i] = narrow(v); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}
// The sum (or max) over the block, returned to every thread. blockDim.x is a multiple of 32.
template <bool kMax>
__device__ float block_reduce(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = kMax ? warp_max(v) : warp_sum(v);
  __syncthreads();  // a previous call may still be reading partial
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : (kMax ? -INFINITY : 0.0f);
  return kMax ? warp_max(v) : warp_sum(v);
}

template <typename Fn>
__global__ void elementwise_kernel(int64_t n, Fn fn) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) fn(i);
}
template <typename Fn>
void elementwise(const char* name, int64_t n, Fn fn) {
  if (n <= 0) return;
  const int64_t blocks = std::min((n + kThreads - 1) / kThreads, kMaxBlocks);
  elementwise_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream()>>>(n, fn);
  check_cuda(cudaGetLastError(), name);
}

// --- layernorm ---

__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                                         const float* bias, int C) {
  const int64_t n = blockIdx.x;
  const float* x = inp + n * C;
  float s = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) s += x[c];
  const float m = block_reduce<false>(s) / C;
  float v = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) v += (x[c] - m) * (x[c] - m);
  const float r = rsqrtf(block_reduce<false>(v) / C + static_cast<float>(kLayernormEps));
  for (int c = threadIdx.x; c < C; c += blockDim.x) out[n * C + c] = (x[c] - m) * r * weight[c] + bias[c];
  if (threadIdx.x == 0) {
    mean[n] = m;
    rstd[n] = r;
  }
}

__global__ void layernorm_backward_kernel(float* dinp, float* dweight, float* dbias, const float* dout,
                                          const float* inp, const float* weight, const float* mean, const float* rstd,
                                          int C) {
  const int64_t n = blockIdx.x;
  const float* x = inp + n * C;
  const float* dy = dout + n * C;
  const float m = mean[n], r = rstd[n];
  float a = 0.0f, b = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float dnorm = weight[c] * dy[c];
    a += dnorm;
    b += dnorm * (x[c] - m) * r;
  }
  const float dnorm_mean = block_reduce<false>(a) / C, dnorm_norm_mean = block_reduce<false>(b) / C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float norm = (x[c] - m) * r, dnorm = weight[c] * dy[c];
    atomicAdd(&dbias[c], dy[c]);
    atomicAdd(&dweight[c], norm * dy[c]);
    dinp[n * C + c] = (dnorm - dnorm_mean - norm * dnorm_norm_mean) * r;
  }
}

// --- attention: one block per (query t, head h, batch b) ---

template <typename T>
__global__ void attention_forward_kernel(T* out, T* att, const T* qkv, int T_, int C, int NH) {
  extern __shared__ float p[];  // the row's scores, then probabilities, [0, t]
  const int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, hs = C / NH;
  const int64_t C3 = int64_t{3} * C;
  const float scale = rsqrtf(static_cast<float>(hs));
  const int64_t q = (int64_t{b} * T_ + t) * C3 + int64_t{h} * hs;
  float local_max = -INFINITY;
  for (int t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
    const int64_t k = (int64_t{b} * T_ + t2) * C3 + C + int64_t{h} * hs;
    float dot = 0.0f;
    for (int i = 0; i < hs; ++i) dot += load(qkv, q + i) * load(qkv, k + i);
    p[t2] = dot * scale;
    local_max = fmaxf(local_max, dot * scale);
  }
  const float max = block_reduce<true>(local_max);
  float local_sum = 0.0f;
  for (int t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
    p[t2] = expf(p[t2] - max);
    local_sum += p[t2];
  }
  const float sum = block_reduce<false>(local_sum);
  T* a = att + ((int64_t{b} * NH + h) * T_ + t) * T_;
  for (int t2 = threadIdx.x; t2 < T_; t2 += blockDim.x) {
    if (t2 > t) {
      store(a, t2, 0.0f);
      continue;
    }
    store(a, t2, p[t2] / sum);
    p[t2] = load(a, t2);  // P as stored (rounded in bf16) weighs V, so that backward uses what forward used
  }
  __syncthreads();
  for (int i = threadIdx.x; i < hs; i += blockDim.x) {
    float acc = 0.0f;
    for (int t2 = 0; t2 <= t; ++t2) acc += p[t2] * load(qkv, (int64_t{b} * T_ + t2) * C3 + 2 * C + int64_t{h} * hs + i);
    store(out, (int64_t{b} * T_ + t) * C + int64_t{h} * hs + i, acc);
  }
}

// dqkv must be zero: dK and dV accumulate over the query rows with atomics; each block owns its row of dQ.
template <typename T>
__global__ void attention_backward_kernel(float* dqkv, const float* dout, const T* qkv, const T* att, int T_, int C,
                                          int NH) {
  extern __shared__ float ds[];  // dP, then dS, [0, t]
  const int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, hs = C / NH;
  const int64_t C3 = int64_t{3} * C;
  const float scale = rsqrtf(static_cast<float>(hs));
  const T* a = att + ((int64_t{b} * NH + h) * T_ + t) * T_;
  const float* dy = dout + (int64_t{b} * T_ + t) * C + int64_t{h} * hs;
  const int64_t q = (int64_t{b} * T_ + t) * C3 + int64_t{h} * hs;
  auto row = [&](int t2, int part) { return (int64_t{b} * T_ + t2) * C3 + int64_t{part} * C + int64_t{h} * hs; };
  float local = 0.0f;
  for (int t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
    float d = 0.0f;
    for (int i = 0; i < hs; ++i) d += dy[i] * load(qkv, row(t2, 2) + i);
    ds[t2] = d;
    local += load(a, t2) * d;
  }
  const float sum = block_reduce<false>(local);
  for (int t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) ds[t2] = load(a, t2) * (ds[t2] - sum) * scale;
  __syncthreads();
  const int64_t pairs = int64_t{t + 1} * hs;
  for (int64_t j = threadIdx.x; j < pairs; j += blockDim.x) {
    const int t2 = static_cast<int>(j / hs), i = static_cast<int>(j % hs);
    atomicAdd(&dqkv[row(t2, 2) + i], load(a, t2) * dy[i]);        // dV
    atomicAdd(&dqkv[row(t2, 1) + i], ds[t2] * load(qkv, q + i));  // dK
  }
  for (int i = threadIdx.x; i < hs; i += blockDim.x) {
    float acc = 0.0f;
    for (int t2 = 0; t2 <= t; ++t2) acc += ds[t2] * load(qkv, row(t2, 1) + i);
    dqkv[q + i] = acc;  // dQ
  }
}

void check_shared(int T, const char* op) {
  if (static_cast<size_t>(T) * sizeof(float) > 48 * 1024) {
    throw Error(ErrorCode::kUnsupported, cat(op, ": sequence length ", T,
                                             " needs more than 48 KiB of shared memory per row in the cuda backend's "
                                             "attention kernel; use T <= 12288"));
  }
}

template <typename T>
void attention_forward_impl(T* out, T* att, const T* qkv, int B, int T_, int C, int NH) {
  if (int64_t{B} * T_ == 0) return;
  check_shared(T_, "attention_forward");
  attention_forward_kernel<T><<<dim3(T_, NH, B), kRowThreads, T_ * sizeof(float), stream()>>>(out, att, qkv, T_, C, NH);
  check_cuda(cudaGetLastError(), "attention_forward_kernel");
}

template <typename T>
void attention_backward_impl(float* dqkv, const float* dout, const T* qkv, const T* att, int B, int T_, int C, int NH) {
  if (int64_t{B} * T_ == 0) return;
  check_shared(T_, "attention_backward");
  check_cuda(cudaMemsetAsync(dqkv, 0, int64_t{B} * T_ * 3 * C * sizeof(float), stream()), "cudaMemsetAsync");
  attention_backward_kernel<T>
      <<<dim3(T_, NH, B), kRowThreads, T_ * sizeof(float), stream()>>>(dqkv, dout, qkv, att, T_, C, NH);
  check_cuda(cudaGetLastError(), "attention_backward_kernel");
}

// --- cross-entropy: one block per row ---

// The row's max and its sum of exp(x - max), to every thread of the block.
__device__ void row_max_sum(const float* x, int V, float& max, float& sum) {
  float m = -INFINITY;
  for (int v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, x[v]);
  max = block_reduce<true>(m);
  float s = 0.0f;
  for (int v = threadIdx.x; v < V; v += blockDim.x) s += expf(x[v] - max);
  sum = block_reduce<false>(s);
}

__global__ void crossentropy_forward_backward_kernel(float* losses, float* dlogits, const float* logits,
                                                     const int32_t* targets, float dloss, int V) {
  const int64_t n = blockIdx.x;
  const float* x = logits + n * V;
  float* dx = dlogits + n * V;
  const int target = targets[n];
  if (target < 0 || target >= V) {  // ignored; or out of range, which the host does not check here: NaN, not a crash
    const float fill = target < 0 ? 0.0f : NAN;
    for (int v = threadIdx.x; v < V; v += blockDim.x) dx[v] = fill;
    if (threadIdx.x == 0) losses[n] = fill;
    return;
  }
  float max, sum;
  row_max_sum(x, V, max, sum);
  const float target_logit = x[target];
  __syncthreads();  // dlogits may be the logits: every read above happens before the first write
  if (threadIdx.x == 0) losses[n] = logf(sum) + max - target_logit;
  for (int v = threadIdx.x; v < V; v += blockDim.x)
    dx[v] = (expf(x[v] - max) / sum - (v == target ? 1.0f : 0.0f)) * dloss;
}

__global__ void crossentropy_stats_kernel(float* maxes, float* sums, float* target_logits, const float* logits,
                                          const int32_t* targets, int V, int vocab_start) {
  const int64_t n = blockIdx.x;
  const float* x = logits + n * V;
  if (targets[n] < 0) {
    if (threadIdx.x == 0) {
      maxes[n] = 0.0f;
      sums[n] = 1.0f;
      target_logits[n] = 0.0f;
    }
    return;
  }
  float max, sum;
  row_max_sum(x, V, max, sum);
  if (threadIdx.x == 0) {
    const int64_t t = int64_t{targets[n]} - vocab_start;
    maxes[n] = max;
    sums[n] = sum;
    target_logits[n] = t >= 0 && t < V ? x[t] : 0.0f;
  }
}

__global__ void bias_add_kernel(float* out, const float* bias, int64_t N, int OC) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < N * OC; i += int64_t{gridDim.x} * blockDim.x)
    out[i] += bias[i % OC];
}

// dbias[o] += the column sum of dout: one thread per column, rows in order (coalesced across the warp).
__global__ void bias_backward_kernel(float* dbias, const float* dout, int64_t N, int OC) {
  const int o = blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= OC) return;
  float acc = 0.0f;
  for (int64_t n = 0; n < N; ++n) acc += dout[n * OC + o];
  dbias[o] += acc;
}

__global__ void global_norm_squared_kernel(float* out, const float* inp, int64_t N) {
  float s = 0.0f;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < N; i += int64_t{gridDim.x} * blockDim.x)
    s += inp[i] * inp[i];
  s = block_reduce<false>(s);
  if (threadIdx.x == 0) atomicAdd(out, s);
}

void bias_add(float* out, const float* bias, int64_t N, int OC) {
  if (bias == nullptr || N * OC == 0) return;
  const int64_t blocks = std::min((N * OC + kThreads - 1) / kThreads, kMaxBlocks);
  bias_add_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream()>>>(out, bias, N, OC);
  check_cuda(cudaGetLastError(), "bias_add_kernel");
}
void bias_backward(float* dbias, const float* dout, int64_t N, int OC) {
  if (dbias == nullptr || OC == 0) return;
  bias_backward_kernel<<<(OC + kThreads - 1) / kThreads, kThreads, 0, stream()>>>(dbias, dout, N, OC);
  check_cuda(cudaGetLastError(), "bias_backward_kernel");
}

// Row-major (rows, cols) matrices are column-major (cols, rows) to cuBLAS: out = inp W^T is out^T = W inp^T.
// dtype: CUDA_R_32F or CUDA_R_16BF for the two inputs; the output and the sums are f32.
void gemm(cublasOperation_t op_a, cublasOperation_t op_b, int m, int n, int k, const void* A, int lda, const void* B,
          int ldb, float beta, float* out, int ldc, cudaDataType_t dtype) {
  if (m == 0 || n == 0) return;
  const float alpha = 1.0f;
  check_blas(cublasGemmEx(blas(), op_a, op_b, m, n, k, &alpha, A, dtype, lda, B, dtype, ldb, &beta, out, CUDA_R_32F,
                          ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
             "cublasGemmEx");
}

// A stream-ordered scratch buffer, freed when the stream reaches the free.
class Scratch {
 public:
  explicit Scratch(size_t bytes) {
    check_cuda(cudaMallocAsync(&ptr_, std::max<size_t>(bytes, 1), stream()), "cudaMallocAsync");
  }
  ~Scratch() { cudaFreeAsync(ptr_, stream()); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
};

template <typename T>
void convert_to(T* out, const float* inp, int64_t N) {
  elementwise("convert", N, [=] __device__(int64_t i) { store(out, i, inp[i]); });
}

// dinp (N,C) = dout W: dinp^T = W^T dout^T; dweight (OC,C) += dout^T inp: dweight^T += inp^T dout.
void backward(float* dinp, float* dweight, const void* dout, const void* inp, const void* weight, int64_t N, int C,
              int OC, cudaDataType_t dtype) {
  gemm(CUBLAS_OP_N, CUBLAS_OP_N, C, static_cast<int>(N), OC, weight, C, dout, OC, 0.0f, dinp, C, dtype);
  gemm(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, static_cast<int>(N), inp, C, dout, OC, 1.0f, dweight, C, dtype);
}
template <typename T>
void gelu_forward_as(T* out, const T* inp, int64_t N) {
  elementwise("gelu_forward", N, [=] __device__(int64_t i) {
    const float x = load(inp, i);
    const float k = static_cast<float>(kGeluScale), cubic = static_cast<float>(kGeluCubic);
    store(out, i, 0.5f * x * (1.0f + tanhf(k * (x + cubic * x * x * x))));
  });
}
template <typename T>
void gelu_backward_as(float* dinp, const T* inp, const float* dout, int64_t N) {
  elementwise("gelu_backward", N, [=] __device__(int64_t i) {
    const float x = load(inp, i);
    const float k = static_cast<float>(kGeluScale), cubic = static_cast<float>(kGeluCubic);
    const float th = tanhf(k * (x + cubic * x * x * x));
    const float grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * k * (1.0f + 3.0f * cubic * x * x);
    dinp[i] = grad * dout[i];
  });
}
template <typename T>
void residual_as(T* out, const T* a, const T* b, int64_t N) {
  elementwise("residual_forward", N, [=] __device__(int64_t i) { store(out, i, load(a, i) + load(b, i)); });
}

class CudaKernels final : public Kernels {
 public:
  const char* name() const override { return "cuda"; }

  bool supports(Op op, DType dtype) const override { return interface_defines(op, dtype); }

  void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C,
                       int vocab_start, int V) const override {
    elementwise("encoder_forward", int64_t{B} * T * C, [=] __device__(int64_t i) {
      const int64_t bt = i / C, c = i % C, t = bt % T, row = int64_t{tokens[bt]} - vocab_start;
      const float tok = row >= 0 && row < V ? wte[row * C + c] : 0.0f;
      out[i] = tok + (wpe != nullptr ? wpe[t * C + c] : 0.0f);
    });
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C,
                        int vocab_start, int V) const override {
    elementwise("encoder_backward", int64_t{B} * T * C, [=] __device__(int64_t i) {
      const int64_t bt = i / C, c = i % C, t = bt % T, row = int64_t{tokens[bt]} - vocab_start;
      if (row >= 0 && row < V) atomicAdd(&dwte[row * C + c], dout[i]);
      if (dwpe != nullptr) atomicAdd(&dwpe[t * C + c], dout[i]);
    });
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                         int64_t N, int C) const override {
    if (N == 0) return;
    layernorm_forward_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream()>>>(out, mean, rstd, inp, weight, bias,
                                                                                  C);
    check_cuda(cudaGetLastError(), "layernorm_forward_kernel");
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const float* weight, const float* mean, const float* rstd, int64_t N, int C) const override {
    if (N == 0) return;
    layernorm_backward_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream()>>>(dinp, dweight, dbias, dout, inp,
                                                                                   weight, mean, rstd, C);
    check_cuda(cudaGetLastError(), "layernorm_backward_kernel");
  }
  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t N, int C,
                      int OC) const override {
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, OC, static_cast<int>(N), C, weight, C, inp, C, 0.0f, out, OC, CUDA_R_32F);
    bias_add(out, bias, N, OC);
  }
  void matmul_forward_bf16(float* out, const bf16_t* inp, const bf16_t* weight, const float* bias, int64_t N, int C,
                           int OC) const override {
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, OC, static_cast<int>(N), C, weight, C, inp, C, 0.0f, out, OC, CUDA_R_16BF);
    bias_add(out, bias, N, OC);
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                       const float* weight, int64_t N, int C, int OC) const override {
    backward(dinp, dweight, dout, inp, weight, N, C, OC, CUDA_R_32F);
    bias_backward(dbias, dout, N, OC);
  }
  void matmul_backward_bf16(float* dinp, float* dweight, float* dbias, const float* dout, const bf16_t* inp,
                            const bf16_t* weight, int64_t N, int C, int OC) const override {
    Scratch rounded(static_cast<size_t>(N) * OC * sizeof(bf16_t));
    convert_to(rounded.as<uint16_t>(), dout, N * OC);
    backward(dinp, dweight, rounded.as<uint16_t>(), inp, weight, N, C, OC, CUDA_R_16BF);
    bias_backward(dbias, dout, N, OC);  // from dout as it is, unrounded
  }
  void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) const override {
    attention_forward_impl(out, att, qkv, B, T, C, NH);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C,
                          int NH) const override {
    attention_backward_impl(dqkv, dout, qkv, att, B, T, C, NH);
  }
  void attention_forward_bf16(bf16_t* out, bf16_t* att, const bf16_t* qkv, int B, int T, int C, int NH) const override {
    attention_forward_impl(out, att, qkv, B, T, C, NH);
  }
  void attention_backward_bf16(float* dqkv, const float* dout, const bf16_t* qkv, const bf16_t* att, int B, int T,
                               int C, int NH) const override {
    attention_backward_impl(dqkv, dout, qkv, att, B, T, C, NH);
  }
  void gelu_forward(void* out, const void* inp, DType dtype, int64_t N) const override {
    if (dtype == DType::kF32) return gelu_forward_as(static_cast<float*>(out), static_cast<const float*>(inp), N);
    gelu_forward_as(static_cast<uint16_t*>(out), static_cast<const uint16_t*>(inp), N);
  }
  void gelu_backward(float* dinp, const void* inp, const float* dout, DType dtype, int64_t N) const override {
    if (dtype == DType::kF32) return gelu_backward_as(dinp, static_cast<const float*>(inp), dout, N);
    gelu_backward_as(dinp, static_cast<const uint16_t*>(inp), dout, N);
  }
  void residual_forward(void* out, const void* inp1, const void* inp2, DType dtype, int64_t N) const override {
    if (dtype == DType::kF32) {
      return residual_as(static_cast<float*>(out), static_cast<const float*>(inp1), static_cast<const float*>(inp2), N);
    }
    residual_as(static_cast<uint16_t*>(out), static_cast<const uint16_t*>(inp1), static_cast<const uint16_t*>(inp2), N);
  }
  void crossentropy_forward_backward(float* losses, float* dlogits, const float* logits, const int32_t* targets,
                                     float dloss, int64_t N, int V) const override {
    if (N == 0) return;
    crossentropy_forward_backward_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream()>>>(losses, dlogits, logits,
                                                                                              targets, dloss, V);
    check_cuda(cudaGetLastError(), "crossentropy_forward_backward_kernel");
  }
  void crossentropy_stats(float* maxes, float* sums, float* target_logits, const float* logits, const int32_t* targets,
                          int64_t N, int V, int vocab_start) const override {
    if (N == 0) return;
    crossentropy_stats_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream()>>>(maxes, sums, target_logits, logits,
                                                                                   targets, V, vocab_start);
    check_cuda(cudaGetLastError(), "crossentropy_stats_kernel");
  }
  void crossentropy_backward(float* dlogits, const float* logits, const float* maxes, const float* sums,
                             const int32_t* targets, float dloss, int64_t N, int V, int vocab_start) const override {
    elementwise("crossentropy_backward", N * V, [=] __device__(int64_t i) {
      const int64_t n = i / V, v = i % V, target = targets[n];
      const float p = target < 0 ? 0.0f : expf(logits[i] - maxes[n]) / sums[n];
      dlogits[i] = (p - (target >= 0 && v == target - vocab_start ? 1.0f : 0.0f)) * dloss;
    });
  }
  void adamw_update(float* params, float* m, float* v, const float* grads, int64_t N,
                    const AdamwParams& hp) const override {
    const float c1 = static_cast<float>(1.0 - std::pow(double{hp.beta1}, static_cast<double>(hp.step)));
    const float c2 = static_cast<float>(1.0 - std::pow(double{hp.beta2}, static_cast<double>(hp.step)));
    const AdamwParams p = hp;
    elementwise("adamw_update", N, [=] __device__(int64_t i) {
      const float g = grads[i];
      const float mi = p.beta1 * m[i] + (1.0f - p.beta1) * g;
      const float vi = p.beta2 * v[i] + (1.0f - p.beta2) * g * g;
      params[i] -= p.lr * ((mi / c1) / (sqrtf(vi / c2) + p.eps) + p.weight_decay * params[i]);
      m[i] = mi;
      v[i] = vi;
    });
  }
  void global_norm_squared(float* out, const float* inp, int64_t N) const override {
    if (N == 0) return;
    const int64_t blocks = std::min((N + kThreads - 1) / kThreads, int64_t{1024});
    global_norm_squared_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream()>>>(out, inp, N);
    check_cuda(cudaGetLastError(), "global_norm_squared_kernel");
  }
  void scale(float* x, float s, int64_t N) const override {
    elementwise("scale", N, [=] __device__(int64_t i) { x[i] *= s; });
  }
  void convert(void* out, DType out_dtype, const void* inp, DType inp_dtype, int64_t N) const override {
    if (out_dtype == inp_dtype) {
      check_cuda(cudaMemcpyAsync(out, inp, N * dtype_size(out_dtype), cudaMemcpyDeviceToDevice, stream()),
                 "cudaMemcpyAsync");
    } else if (out_dtype == DType::kBF16) {
      convert_to(static_cast<uint16_t*>(out), static_cast<const float*>(inp), N);
    } else {
      const uint16_t* in = static_cast<const uint16_t*>(inp);
      float* o = static_cast<float*>(out);
      elementwise("convert", N, [=] __device__(int64_t i) { o[i] = widen(in[i]); });
    }
  }
};

}  // namespace

CudaQueueScope::CudaQueueScope(CudaQueue queue) : previous_(current_queue) { current_queue = queue; }
CudaQueueScope::~CudaQueueScope() { current_queue = previous_; }

void check_cuda(int status, const char* call, const std::string& where) {
  if (status != cudaSuccess) {
    const auto e = static_cast<cudaError_t>(status);
    throw Error(ErrorCode::kInternal, cat(where.empty() ? "" : where + ": ", call, " failed: ", cudaGetErrorName(e),
                                          " (", cudaGetErrorString(e), ")"));
  }
}

const Kernels& cuda_kernels() {
  static const CudaKernels kernels;
  return kernels;
}

}  // namespace h2
