// The cuda backend's kernels (see kernels.h). Correct first, fast second: matmul is cuBLAS's (cuBLASLt with the bias
// in its epilogue); attention is cuBLAS batched GEMMs around a softmax kernel, not a fused flash kernel (the
// interface stores the probabilities); reductions use atomics. docs/devices.md says what has run on a GPU.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <optional>

#include "core/error.h"
#include "ops/cuda/attention_gemms.h"
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
cublasLtHandle_t blas_lt() {
  H2_CHECK(current_queue.blas_lt != nullptr) << "a cuda kernel was called outside its device's launch()";
  return static_cast<cublasLtHandle_t>(current_queue.blas_lt);
}

void check_blas(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw Error(ErrorCode::kInternal, cat(call, " failed: ", cublasGetStatusString(status)));
  }
}

constexpr int kThreads = 256;     // element-wise kernels and per-row kernels
constexpr int kRowThreads = 128;  // attention's softmax: one block per query row
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

// --- attention: cuBLAS batched GEMMs around a softmax kernel (row-major matrices are column-major to cuBLAS) ---

// The row's probabilities from its scores: att[t2] = softmax(scores[0..t])[t2] for t2 <= t, 0 after (the causal
// mask); one block per (query t, head h). `scores` may be `att` itself (f32): each thread reads and then writes
// the same elements.
template <typename T>
__global__ void softmax_rows_kernel(T* att, const float* scores, int T_) {
  const int t = blockIdx.x;
  const int64_t row = (int64_t{blockIdx.y} * T_ + t) * T_;
  const float* x = scores + row;
  float local_max = -INFINITY;
  for (int t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) local_max = fmaxf(local_max, x[t2]);
  const float max = block_reduce<true>(local_max);
  float local_sum = 0.0f;
  for (int t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) local_sum += expf(x[t2] - max);
  const float sum = block_reduce<false>(local_sum);
  for (int t2 = threadIdx.x; t2 < T_; t2 += blockDim.x) store(att + row, t2, t2 <= t ? expf(x[t2] - max) / sum : 0.0f);
}

// dS = P * (dP - rowsum(P * dP)) * scale in place of dP, 0 past the diagonal; one block per (query t, head h).
__global__ void softmax_backward_rows_kernel(float* dp, const float* att, int T_, float scale) {
  const int t = blockIdx.x;
  const int64_t row = (int64_t{blockIdx.y} * T_ + t) * T_;
  float local = 0.0f;
  for (int t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) local += att[row + t2] * dp[row + t2];
  const float sum = block_reduce<false>(local);
  for (int t2 = threadIdx.x; t2 < T_; t2 += blockDim.x)
    dp[row + t2] = t2 <= t ? att[row + t2] * (dp[row + t2] - sum) * scale : 0.0f;
}

// One sequence's buffers for attention_gemms' operands, with their element sizes.
struct SequenceBuffers {
  const void* qkv = nullptr;
  const void* out = nullptr;  // out, or in backward dout
  void* square = nullptr;     // scores or probabilities
  size_t qkv_size = 4, out_size = 4, square_size = 4;
  float* dqkv = nullptr;
  float* grad = nullptr;
  const char* at(const GemmOperand& o) const {
    const auto base = [&](const void* p, size_t size) { return static_cast<const char*>(p) + o.offset * size; };
    switch (o.buffer) {
      case AttentionBuffer::kQkv:
        return base(qkv, qkv_size);
      case AttentionBuffer::kOut:
        return base(out, out_size);
      case AttentionBuffer::kSquare:
        return base(square, square_size);
      case AttentionBuffer::kDqkv:
        return base(dqkv, 4);
      case AttentionBuffer::kGrad:
        return base(grad, 4);
    }
    return nullptr;
  }
};

// One of attention_gemms' products for every head of a sequence (inputs of ab_type, output of c_type).
void run_gemm(const HeadGemm& g, const SequenceBuffers& s, int heads, cudaDataType_t ab_type, cudaDataType_t c_type) {
  const float beta = 0.0f;
  check_blas(cublasGemmStridedBatchedEx(blas(), g.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                        g.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N, g.m, g.n, g.k, &g.alpha, s.at(g.a),
                                        ab_type, g.a.ld, g.a.stride, s.at(g.b), ab_type, g.b.ld, g.b.stride, &beta,
                                        const_cast<char*>(s.at(g.c)), c_type, g.c.ld, g.c.stride, heads,
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
             "cublasGemmStridedBatchedEx");
}

template <typename T>
constexpr cudaDataType_t cuda_type() {
  return sizeof(T) == 2 ? CUDA_R_16BF : CUDA_R_32F;
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

// The largest power of two up to 256 that divides the address: cuBLASLt assumes 256-byte aligned matrices unless
// told otherwise, and a weight may be a view into a flat parameter buffer.
uint32_t alignment(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && address % a != 0) a /= 2;
  return a;
}

// cuBLASLt's descriptors for one call, destroyed with it.
struct LtCall {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  LtCall() = default;
  LtCall(const LtCall&) = delete;
  LtCall& operator=(const LtCall&) = delete;
  ~LtCall() {
    if (preference != nullptr) cublasLtMatmulPreferenceDestroy(preference);
    if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

constexpr size_t kLtWorkspace = size_t{32} << 20;  // what cuBLAS recommends for Hopper

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

// out (N, OC) = inp W^T + bias in one cuBLASLt call, the bias added in the GEMM's epilogue (inp and weight of
// `dtype`, out and bias f32). False, having done nothing, when cuBLASLt has no algorithm for these shapes and
// alignments (the bias must be 16-byte aligned); the caller then adds the bias with a kernel. The algorithm cuBLASLt
// picks is kept per shape, alignment and thread (a thread drives one device at a time).
bool matmul_bias_lt(float* out, const void* inp, const void* weight, const float* bias, int64_t N, int C, int OC,
                    cudaDataType_t dtype) {
  if (alignment(bias) < 16 || N == 0) return false;
  const auto transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
  const auto epilogue = CUBLASLT_EPILOGUE_BIAS;
  const auto bias_type = CUDA_R_32F;
  LtCall call;
  check_blas(cublasLtMatmulDescCreate(&call.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const auto set = [&](cublasLtMatmulDescAttributes_t attribute, const void* value, size_t bytes) {
    check_blas(cublasLtMatmulDescSetAttribute(call.op, attribute, value, bytes), "cublasLtMatmulDescSetAttribute");
  };
  set(CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose));
  set(CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof(keep));
  set(CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue));
  set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias));
  set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type));
  // Column-major, as in gemm(): out^T (OC x N) = W (C x OC stored, transposed) inp^T (C x N stored).
  check_blas(cublasLtMatrixLayoutCreate(&call.a, dtype, C, OC, C), "cublasLtMatrixLayoutCreate");
  check_blas(cublasLtMatrixLayoutCreate(&call.b, dtype, C, static_cast<uint64_t>(N), C), "cublasLtMatrixLayoutCreate");
  check_blas(cublasLtMatrixLayoutCreate(&call.d, CUDA_R_32F, OC, static_cast<uint64_t>(N), OC),
             "cublasLtMatrixLayoutCreate");
  const std::array<int64_t, 8> key = {reinterpret_cast<int64_t>(blas_lt()),
                                      N,
                                      C,
                                      OC,
                                      static_cast<int64_t>(dtype),
                                      alignment(inp),
                                      alignment(weight),
                                      alignment(out)};
  thread_local std::map<std::array<int64_t, 8>, std::optional<cublasLtMatmulAlgo_t>> algorithms;
  auto found = algorithms.find(key);
  if (found == algorithms.end()) {
    check_blas(cublasLtMatmulPreferenceCreate(&call.preference), "cublasLtMatmulPreferenceCreate");
    const auto prefer = [&](cublasLtMatmulPreferenceAttributes_t attribute, const auto& value) {
      check_blas(cublasLtMatmulPreferenceSetAttribute(call.preference, attribute, &value, sizeof(value)),
                 "cublasLtMatmulPreferenceSetAttribute");
    };
    prefer(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(kLtWorkspace));
    prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment(weight));
    prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment(inp));
    prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment(out));
    prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment(out));
    cublasLtMatmulHeuristicResult_t result{};
    int count = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(blas_lt(), call.op, call.a, call.b, call.d, call.d,
                                                                 call.preference, 1, &result, &count);
    std::optional<cublasLtMatmulAlgo_t> algorithm;
    if (status == CUBLAS_STATUS_SUCCESS && count > 0) algorithm = result.algo;
    found = algorithms.emplace(key, algorithm).first;
  }
  if (!found->second) return false;
  const float alpha = 1.0f, beta = 0.0f;
  Scratch workspace(kLtWorkspace);
  check_blas(cublasLtMatmul(blas_lt(), call.op, &alpha, weight, call.a, inp, call.b, &beta, out, call.d, out, call.d,
                            &*found->second, workspace.as<void>(), kLtWorkspace, stream()),
             "cublasLtMatmul");
  return true;
}

template <typename T>
void convert_to(T* out, const float* inp, int64_t N) {
  elementwise("convert", N, [=] __device__(int64_t i) { store(out, i, inp[i]); });
}
void widen_to(float* out, const uint16_t* inp, int64_t N) {
  elementwise("convert", N, [=] __device__(int64_t i) { out[i] = widen(inp[i]); });
}

// attention_gemms' products per sequence, around the softmax kernels. Forward: the scores in f32 (in place of the
// probabilities in f32, in a scratch buffer in bf16), the probabilities stored as T (rounded in bf16) and used as
// stored for P V, so that backward uses what forward used. The GEMMs compute the masked half too (zeros of P).
template <typename T>
void attention_forward_impl(T* out, T* att, const T* qkv, int B, int T_, int C, int NH) {
  if (int64_t{B} * T_ == 0) return;
  const AttentionGemms g = attention_gemms(T_, C, NH);
  const int64_t square = int64_t{T_} * T_;
  std::optional<Scratch> scores;
  if constexpr (sizeof(T) == 2) scores.emplace(static_cast<size_t>(NH * square) * sizeof(float));
  for (int b = 0; b < B; ++b) {
    T* a = att + int64_t{b} * NH * square;
    SequenceBuffers s{.qkv = qkv + int64_t{b} * T_ * 3 * C,
                      .out = out + int64_t{b} * T_ * C,
                      .square = scores ? scores->as<void>() : a,
                      .qkv_size = sizeof(T),
                      .out_size = sizeof(T)};
    run_gemm(g.scores, s, NH, cuda_type<T>(), CUDA_R_32F);
    softmax_rows_kernel<T><<<dim3(T_, NH), kRowThreads, 0, stream()>>>(a, static_cast<const float*>(s.square), T_);
    check_cuda(cudaGetLastError(), "softmax_rows_kernel");
    s.square = a;
    s.square_size = sizeof(T);
    run_gemm(g.values, s, NH, cuda_type<T>(), cuda_type<T>());
  }
}

// Backward in f32: the gradients are f32, and with bf16 qkv and att both are widened to f32 first (the interface's
// bf16 backward keeps dout in f32, at f32 tolerance).
template <typename T>
void attention_backward_impl(float* dqkv, const float* dout, const T* qkv, const T* att, int B, int T_, int C, int NH) {
  if (int64_t{B} * T_ == 0) return;
  const AttentionGemms g = attention_gemms(T_, C, NH);
  const int64_t square = int64_t{T_} * T_, C3 = int64_t{3} * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(C / NH));
  std::optional<Scratch> wide_qkv, wide_att;
  const float* x = reinterpret_cast<const float*>(qkv);
  if constexpr (sizeof(T) == 2) {
    wide_qkv.emplace(static_cast<size_t>(B * T_ * C3) * sizeof(float));
    widen_to(wide_qkv->as<float>(), reinterpret_cast<const uint16_t*>(qkv), B * T_ * C3);
    wide_att.emplace(static_cast<size_t>(NH * square) * sizeof(float));
    x = wide_qkv->as<float>();
  }
  Scratch grad(static_cast<size_t>(NH * square) * sizeof(float));
  for (int b = 0; b < B; ++b) {
    const T* a = att + int64_t{b} * NH * square;
    float* p = const_cast<float*>(reinterpret_cast<const float*>(a));
    if constexpr (sizeof(T) == 2) {
      widen_to(wide_att->as<float>(), reinterpret_cast<const uint16_t*>(a), NH * square);
      p = wide_att->as<float>();
    }
    const SequenceBuffers s{.qkv = x + b * T_ * C3,
                            .out = dout + int64_t{b} * T_ * C,
                            .square = p,
                            .dqkv = dqkv + b * T_ * C3,
                            .grad = grad.as<float>()};
    run_gemm(g.grad_probs, s, NH, CUDA_R_32F, CUDA_R_32F);
    softmax_backward_rows_kernel<<<dim3(T_, NH), kRowThreads, 0, stream()>>>(s.grad, p, T_, scale);
    check_cuda(cudaGetLastError(), "softmax_backward_rows_kernel");
    for (const HeadGemm* product : {&g.grad_q, &g.grad_k, &g.grad_v}) run_gemm(*product, s, NH, CUDA_R_32F, CUDA_R_32F);
  }
}

// out (N,OC) = inp W^T + bias: the bias in cuBLASLt's epilogue where it can, else cuBLAS and a bias kernel.
void forward(float* out, const void* inp, const void* weight, const float* bias, int64_t N, int C, int OC,
             cudaDataType_t dtype) {
  if (bias != nullptr && matmul_bias_lt(out, inp, weight, bias, N, C, OC, dtype)) return;
  gemm(CUBLAS_OP_T, CUBLAS_OP_N, OC, static_cast<int>(N), C, weight, C, inp, C, 0.0f, out, OC, dtype);
  bias_add(out, bias, N, OC);
}

// dinp (N,C) = dout W: dinp^T = W^T dout^T; dweight (OC,C) += dout^T inp: dweight^T += inp^T dout.
void backward(float* dinp, float* dweight, const void* dout, const void* inp, const void* weight, int64_t N, int C,
              int OC, cudaDataType_t dtype) {
  if (dinp != nullptr) {
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, C, static_cast<int>(N), OC, weight, C, dout, OC, 0.0f, dinp, C, dtype);
  }
  if (dweight != nullptr) {
    gemm(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, static_cast<int>(N), inp, C, dout, OC, 1.0f, dweight, C, dtype);
  }
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
    forward(out, inp, weight, bias, N, C, OC, CUDA_R_32F);
  }
  void matmul_forward_bf16(float* out, const bf16_t* inp, const bf16_t* weight, const float* bias, int64_t N, int C,
                           int OC) const override {
    forward(out, inp, weight, bias, N, C, OC, CUDA_R_16BF);
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
      widen_to(static_cast<float*>(out), static_cast<const uint16_t*>(inp), N);
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
