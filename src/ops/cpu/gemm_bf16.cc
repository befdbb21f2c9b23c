// The bf16 matrix products (gemm_bf16.h).
//
// Layout of the AVX512-BF16 path. vdpbf16ps multiplies 32 bf16 pairs and adds each lane's two products to one of
// 16 f32 lanes, so the reduction dimension K is taken two at a time ("pairs", packed as one 32-bit word):
//   - the rows of out go in chunks of kMc = 4096, the pairs in stretches of kKc = 384: the threads pack the
//     chunk's stretch of a once, in blocks of kMr = 8 rows ([pairs][8 rows] words, each row's pair broadcast to
//     all lanes; at most 6 MB), so a large a (the head's 50,257-column logits gradient) is never copied whole;
//   - for each stretch the columns of out go in blocks of kNc = 384, eight panels of kNr = 48: the threads pack a
//     block's panels of b, [pairs][48 columns] words each (0.6 MB, within a 1 MiB L2), so a pair step loads three
//     vectors of 16 columns, then split the row blocks, each tile adding the stretch's products onto what the
//     earlier stretches left in out;
//   - the kernel keeps an 8 x 48 tile of out in 24 registers, starting from the bias (or from out).
// Operands are read through their strides, so the backward pass's transposed products pack the same way.
#include "ops/cpu/gemm_bf16.h"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <type_traits>
#include <vector>

#include "core/error.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>
#else
#include <cblas.h>
#endif

namespace h2 {
namespace {

// out (M,N) = the bias in every row, or zero.
void fill_bias(float* out, const float* bias, int64_t M, int64_t N) {
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) out[m * N + n] = bias != nullptr ? bias[n] : 0.0f;
  }
}

inline bf16_t as_bf16(bf16_t x) { return x; }
inline bf16_t as_bf16(float x) { return f32_to_bf16(x); }

// Row i's pair (k = 2p, 2p + 1) of an operand as one word, zero past the end of the row of K elements.
template <typename T>
uint32_t pair_at(MatrixView<T> m, int64_t i, int64_t p, int64_t K) {
  const T* x = m.data + i * m.row + 2 * p * m.col;
  const uint32_t lo = as_bf16(x[0]), hi = 2 * p + 1 < K ? as_bf16(x[m.col]) : 0;
  return lo | (hi << 16);
}

#if defined(__AVX512BF16__)

constexpr int kMr = 8, kNr = 48, kVectors = kNr / 16, kNc = 384, kKc = 384;
constexpr int64_t kMc = 4096;

// The lanes of the tile's v-th vector of columns that hold one of its `cols` columns.
__mmask16 columns(int v, int cols) {
  const int n = std::clamp(cols - 16 * v, 0, 16);
  return static_cast<__mmask16>((1u << n) - 1);
}

// out[rows, cols] (leading dimension ldo) = the packed rows a times the packed panel b, over `pairs` pairs, plus
// what out holds (accumulate) or else the bias (kNr, or null).
void tile(int pairs, const uint32_t* a, const uint32_t* b, const float* bias, bool accumulate, float* out, int64_t ldo,
          int rows, int cols) {
  __m512 acc[kMr][kVectors];
  for (int v = 0; v < kVectors; ++v) {
    const __m512 start = bias != nullptr ? _mm512_loadu_ps(bias + 16 * v) : _mm512_setzero_ps();
    for (int r = 0; r < kMr; ++r) {
      if (!accumulate) {
        acc[r][v] = start;
      } else if (r < rows) {
        acc[r][v] = _mm512_maskz_loadu_ps(columns(v, cols), out + r * ldo + 16 * v);
      } else {
        acc[r][v] = _mm512_setzero_ps();  // a padding row, never stored
      }
    }
  }
  for (int p = 0; p < pairs; ++p) {
    __m512bh w[kVectors];
    for (int v = 0; v < kVectors; ++v) w[v] = (__m512bh)_mm512_load_si512(b + p * kNr + 16 * v);
    for (int r = 0; r < kMr; ++r) {
      const __m512bh x = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[p * kMr + r]));
      for (int v = 0; v < kVectors; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], x, w[v]);
    }
  }
  for (int r = 0; r < rows; ++r) {
    for (int v = 0; v < kVectors; ++v) _mm512_mask_storeu_ps(out + r * ldo + 16 * v, columns(v, cols), acc[r][v]);
  }
}

// 8 values at x as bf16 (nearest even; vcvtneps2bf16 flushes denormals to zero), or 8 bf16 loaded as they are.
__m128i eight_bf16(const float* x) { return (__m128i)_mm256_cvtneps_pbh(_mm256_loadu_ps(x)); }
__m128i eight_bf16(const bf16_t* x) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(x)); }

// The words of kMr rows [i0, i0 + kMr) of a for pairs [k0, k0 + kc), all inside a: words[p * kMr + r]. Two layouts
// are vectorised — a transposed operand (a.row == 1: a pair's 8 rows are 8 adjacent values of two rows of memory,
// interleaved) and a row-major f32 one (a.col == 1: 16 values of a row convert to 8 words at once) — and the
// rest packs word by word.
template <typename TA>
void pack_rows(uint32_t* words, MatrixView<TA> a, int64_t i0, int64_t k0, int kc, int64_t K) {
  if (a.row == 1) {
    for (int p = 0; p < kc; ++p) {
      const TA* lo = a.data + i0 + 2 * (k0 + p) * a.col;
      const __m128i l = eight_bf16(lo), h = eight_bf16(lo + a.col);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(words + p * kMr), _mm_unpacklo_epi16(l, h));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(words + p * kMr + 4), _mm_unpackhi_epi16(l, h));
    }
    return;
  }
  if constexpr (std::is_same_v<TA, float>) {
    if (a.col == 1) {
      for (int r = 0; r < kMr; ++r) {
        const float* x = a.data + (i0 + r) * a.row + 2 * k0;
        int p = 0;
        for (; p + 8 <= kc; p += 8) {
          alignas(32) uint32_t w[8];
          _mm256_store_si256(reinterpret_cast<__m256i*>(w),
                             _mm256_set_m128i(eight_bf16(x + 2 * p + 8), eight_bf16(x + 2 * p)));
          for (int q = 0; q < 8; ++q) words[(p + q) * kMr + r] = w[q];
        }
        for (; p < kc; ++p) words[p * kMr + r] = pair_at(a, i0 + r, k0 + p, K);
      }
      return;
    }
  }
  for (int p = 0; p < kc; ++p) {
    for (int r = 0; r < kMr; ++r) words[p * kMr + r] = pair_at(a, i0 + r, k0 + p, K);
  }
}

struct AlignedFree {
  void operator()(uint32_t* p) const { std::free(p); }
};
using Words = std::unique_ptr<uint32_t, AlignedFree>;

// At least n words on a 64-byte boundary (aligned_alloc wants a size that is a multiple of the alignment): the calling
// thread's buffer `which`, kept and reused by its later products, grown when too small. The packed operands are
// megabytes; allocated per product, glibc's malloc — whose mmap threshold rises to the largest block freed — served
// them from its heap, which the rank's other allocations fragmented: the built-in example's head ranks grew by 20 MB
// a step, to 1,000 MiB at step 40 against 442 MiB counted for them, and 362-386 MiB once these were reused (2026-12-08,
// docs/pipeline.md; no test in the suite reproduces the fragmentation, which needs a whole rank's traffic).
uint32_t* scratch_words(int which, size_t n, const char* what) {
  struct Scratch {
    Words words;
    size_t size = 0;
  };
  thread_local Scratch scratch[2];
  Scratch& s = scratch[which];
  if (s.size < n) {
    s.words.reset();
    s.words.reset(static_cast<uint32_t*>(std::aligned_alloc(64, (n * sizeof(uint32_t) + 63) / 64 * 64)));
    H2_CHECK(s.words != nullptr) << "out of memory packing " << what << " (" << n * sizeof(uint32_t) << " bytes)";
    s.size = n;
  }
  return s.words.get();
}

template <typename TA>
void gemm(float* out, MatrixView<TA> a, MatrixView<bf16_t> b, const float* bias, bool accumulate, int64_t M, int64_t K,
          int64_t N) {
  constexpr int kBlockPanels = kNc / kNr;
  const MatrixView<bf16_t> bt{b.data, b.col, b.row};  // b's columns as rows, for pair_at
  const int64_t pairs = (K + 1) / 2, panels = (N + kNr - 1) / kNr;
  const int64_t kc_max = std::min<int64_t>(pairs, kKc);
  uint32_t* const packed_b =
      scratch_words(0, static_cast<size_t>(kBlockPanels * kc_max * kNr), "a block of a bf16 operand");
  const int64_t blocks_max = (std::min(M, kMc) + kMr - 1) / kMr;
  uint32_t* const packed_a = scratch_words(1, static_cast<size_t>(blocks_max * kc_max * kMr), "rows of a bf16 operand");
  std::vector<float> padded_bias;  // the bias with the last panel's columns past N as zeros
  if (bias != nullptr && !accumulate) {
    padded_bias.assign(static_cast<size_t>(panels * kNr), 0.0f);
    std::copy(bias, bias + N, padded_bias.begin());
  }
#pragma omp parallel
  for (int64_t m0 = 0; m0 < M; m0 += kMc) {
    const int64_t chunk_rows = std::min(kMc, M - m0), blocks = (chunk_rows + kMr - 1) / kMr;
    for (int64_t k0 = 0; k0 < pairs; k0 += kKc) {
      const int kc = static_cast<int>(std::min<int64_t>(kKc, pairs - k0));
#pragma omp for schedule(static)
      for (int64_t i = 0; i < blocks; ++i) {
        uint32_t* words = packed_a + i * kc_max * kMr;
        const int64_t first = m0 + i * kMr;
        if (first + kMr <= M && 2 * (k0 + kc) <= K) {  // whole rows and pairs: the fast paths
          pack_rows(words, a, first, k0, kc, K);
          continue;
        }
        for (int p = 0; p < kc; ++p) {
          for (int r = 0; r < kMr; ++r) words[p * kMr + r] = first + r < M ? pair_at(a, first + r, k0 + p, K) : 0;
        }
      }  // the implicit barrier: the stretch of a is packed
      for (int64_t j0 = 0; j0 < panels; j0 += kBlockPanels) {
        const int block_panels = static_cast<int>(std::min<int64_t>(kBlockPanels, panels - j0));
#pragma omp for schedule(static)
        for (int j = 0; j < block_panels; ++j) {
          uint32_t* panel = packed_b + j * kc_max * kNr;
          const auto pack = [&](int p, int c) {
            const int64_t col = (j0 + j) * kNr + c;
            panel[p * kNr + c] = col < N ? pair_at(bt, col, k0 + p, K) : 0;
          };
          if (b.row == 1) {  // a column's pairs are adjacent in memory
            for (int c = 0; c < kNr; ++c) {
              for (int p = 0; p < kc; ++p) pack(p, c);
            }
          } else {  // a pair's columns are
            for (int p = 0; p < kc; ++p) {
              for (int c = 0; c < kNr; ++c) pack(p, c);
            }
          }
        }  // the implicit barrier: the block is packed
#pragma omp for schedule(static)
        for (int64_t i = 0; i < blocks; ++i) {
          const int rows = static_cast<int>(std::min<int64_t>(kMr, chunk_rows - i * kMr));
          for (int j = 0; j < block_panels; ++j) {
            const int64_t first = (j0 + j) * kNr;
            tile(kc, packed_a + i * kc_max * kMr, packed_b + j * kc_max * kNr,
                 padded_bias.empty() ? nullptr : padded_bias.data() + first, accumulate || k0 > 0,
                 out + (m0 + i * kMr) * N + first, N, rows, static_cast<int>(std::min<int64_t>(kNr, N - first)));
          }
        }  // the implicit barrier: no thread still reads the block
      }
    }
  }
}

#else  // no AVX512-BF16: the same products, by OpenBLAS's sgemm

// A stretch of kKc values of K at a time: both operands' stretch rounded to bf16 and widened back to f32 (a product
// of two bf16 values is exact in f32, so sgemm sums the same products, in its own order), then one sgemm adds their
// products onto out. The copies stay within (M + N) x kKc floats, however large the operands. A plain loop over the
// strided operands, as before 2026-12-07, took over 10 minutes to profile the built-in example's chips on an AVX2
// host, where the main job is meant to finish in 5.
constexpr int64_t kKc = 512;

template <typename TA>
void gemm(float* out, MatrixView<TA> a, MatrixView<bf16_t> b, const float* bias, bool accumulate, int64_t M, int64_t K,
          int64_t N) {
  if (!accumulate) fill_bias(out, bias, M, N);
  const int64_t kc_max = std::min(K, kKc);
  std::vector<float> wide_a(static_cast<size_t>(M * kc_max)), wide_b(static_cast<size_t>(kc_max * N));
  for (int64_t k0 = 0; k0 < K; k0 += kKc) {
    const int64_t kc = std::min(kKc, K - k0);
#pragma omp parallel for schedule(static)
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t k = 0; k < kc; ++k) wide_a[m * kc + k] = bf16_to_f32(as_bf16(a.data[m * a.row + (k0 + k) * a.col]));
    }
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < kc; ++k) {
      for (int64_t n = 0; n < N; ++n) wide_b[k * N + n] = bf16_to_f32(b.data[(k0 + k) * b.row + n * b.col]);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(M), static_cast<int>(N),
                static_cast<int>(kc), 1.0f, wide_a.data(), static_cast<int>(kc), wide_b.data(), static_cast<int>(N),
                1.0f, out, static_cast<int>(N));
  }
}

#endif

// With nothing to sum, out is the bias (or zero), or unchanged.
template <typename TA>
void gemm_or_fill(float* out, MatrixView<TA> a, MatrixView<bf16_t> b, const float* bias, bool accumulate, int64_t M,
                  int64_t K, int64_t N) {
  if (M == 0 || N == 0 || (K == 0 && accumulate)) return;
  if (K > 0) return gemm(out, a, b, bias, accumulate, M, K, N);
  fill_bias(out, bias, M, N);
}

}  // namespace

void gemm_bf16(float* out, MatrixView<bf16_t> a, MatrixView<bf16_t> b, const float* bias, bool accumulate, int64_t M,
               int64_t K, int64_t N) {
  gemm_or_fill(out, a, b, bias, accumulate, M, K, N);
}

void gemm_bf16(float* out, MatrixView<float> a, MatrixView<bf16_t> b, const float* bias, bool accumulate, int64_t M,
               int64_t K, int64_t N) {
  gemm_or_fill(out, a, b, bias, accumulate, M, K, N);
}

}  // namespace h2
