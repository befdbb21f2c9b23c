// The bf16 matrix product (gemm_bf16.h).
//
// Layout of the AVX512-BF16 path. vdpbf16ps multiplies 32 bf16 pairs and adds each lane's two products to one of
// 16 f32 lanes, so the reduction dimension C is taken two at a time ("pairs", packed as one 32-bit word):
//   - the output channels go in blocks of kNc = 384 (eight panels of kNr = 48) and the pairs in stretches of
//     kKc = 384 (0.6 MB of packed weight, within a 1 MiB L2): the threads pack a block's panels, [pairs][48
//     channels] words each, so a pair step loads three vectors of 16 channels, then split its row blocks, each
//     tile adding the stretch's products onto what the earlier stretches left in out;
//   - inp is packed once, in blocks of kMr = 8 rows: [C/2 pairs][8 rows] words, each row's pair broadcast to all
//     lanes;
//   - the kernel keeps an 8 x 48 tile of out in 24 registers, starting from the bias.
// Only one block of the weight is packed at a time, so a large one (the 50,257-row head) costs no copy of itself.
#include "ops/cpu/gemm_bf16.h"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <vector>

#include "core/error.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace h2 {

#if defined(__AVX512BF16__)
namespace {

constexpr int kMr = 8, kNr = 48, kVectors = kNr / 16, kNc = 384, kKc = 384;

// The pair (x[2p], x[2p + 1]) as one word, zero past the end of a row of n elements.
uint32_t pair_of(const bf16_t* x, int p, int n) {
  const uint32_t lo = x[2 * p], hi = 2 * p + 1 < n ? x[2 * p + 1] : 0;
  return lo | (hi << 16);
}

// The lanes of the tile's v-th vector of columns that hold one of its `cols` columns.
__mmask16 columns(int v, int cols) {
  const int n = std::clamp(cols - 16 * v, 0, 16);
  return static_cast<__mmask16>((1u << n) - 1);
}

// out[rows, cols] (leading dimension ldo) = the packed rows a times the packed panel b, over `pairs` pairs, plus
// what out holds (accumulate: a later stretch of pairs) or else the bias (kNr, or null).
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

struct AlignedFree {
  void operator()(uint32_t* p) const { std::free(p); }
};
using Words = std::unique_ptr<uint32_t, AlignedFree>;

// n words on a 64-byte boundary (aligned_alloc wants a size that is a multiple of the alignment).
Words aligned_words(size_t n, const char* what) {
  Words w(static_cast<uint32_t*>(std::aligned_alloc(64, (n * sizeof(uint32_t) + 63) / 64 * 64)));
  H2_CHECK(w != nullptr) << "out of memory packing " << what << " (" << n * sizeof(uint32_t) << " bytes)";
  return w;
}

}  // namespace

void gemm_bf16(float* out, const bf16_t* inp, const bf16_t* weight, const float* bias, int64_t N, int C, int OC) {
  if (N == 0 || OC == 0) return;
  constexpr int kBlockPanels = kNc / kNr;
  const int pairs = (C + 1) / 2, panels = (OC + kNr - 1) / kNr;
  const size_t panel_words = static_cast<size_t>(std::min(pairs, kKc)) * kNr;
  const Words packed = aligned_words(kBlockPanels * panel_words, "a block of a bf16 weight");
  uint32_t* b = packed.get();
  std::vector<float> padded_bias;  // the bias with the last panel's channels past OC as zeros
  if (bias != nullptr) {
    padded_bias.assign(static_cast<size_t>(panels) * kNr, 0.0f);
    std::copy(bias, bias + OC, padded_bias.begin());
  }
  const int64_t blocks = (N + kMr - 1) / kMr;
  const size_t block_words = static_cast<size_t>(pairs) * kMr;
  const Words packed_inp = aligned_words(static_cast<size_t>(blocks) * block_words, "a bf16 input");
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < blocks; ++i) {
      uint32_t* a = packed_inp.get() + i * block_words;
      const int rows = static_cast<int>(std::min<int64_t>(kMr, N - i * kMr));
      for (int r = 0; r < kMr; ++r) {
        const bf16_t* x = inp + (i * kMr + r) * C;
        for (int p = 0; p < pairs; ++p) a[p * kMr + r] = r < rows ? pair_of(x, p, C) : 0;
      }
    }
    for (int j0 = 0; j0 < panels; j0 += kBlockPanels) {
      const int block_panels = std::min(kBlockPanels, panels - j0);
      for (int k0 = 0; k0 < pairs; k0 += kKc) {
        const int kc = std::min(kKc, pairs - k0);
#pragma omp for schedule(static)
        for (int j = 0; j < block_panels; ++j) {
          uint32_t* panel = b + j * panel_words;
          for (int c = 0; c < kNr; ++c) {
            const int o = (j0 + j) * kNr + c;
            for (int p = 0; p < kc; ++p) {
              panel[p * kNr + c] = o < OC ? pair_of(weight + int64_t{o} * C, k0 + p, C) : 0;
            }
          }
        }  // the implicit barrier: the block is packed
#pragma omp for schedule(static)
        for (int64_t i = 0; i < blocks; ++i) {
          const int rows = static_cast<int>(std::min<int64_t>(kMr, N - i * kMr));
          for (int j = 0; j < block_panels; ++j) {
            const int first = (j0 + j) * kNr;
            tile(kc, packed_inp.get() + i * block_words + k0 * kMr, b + j * panel_words,
                 bias != nullptr ? padded_bias.data() + first : nullptr, k0 > 0, out + i * kMr * OC + first, OC, rows,
                 std::min(kNr, OC - first));
          }
        }  // the implicit barrier: no thread still reads the block
      }
    }
  }
}

#else  // no AVX512-BF16: the same sums, in a plain loop

void gemm_bf16(float* out, const bf16_t* inp, const bf16_t* weight, const float* bias, int64_t N, int C, int OC) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    for (int o = 0; o < OC; ++o) {
      float acc = bias != nullptr ? bias[o] : 0.0f;
      for (int c = 0; c < C; ++c) acc += bf16_to_f32(inp[n * C + c]) * bf16_to_f32(weight[int64_t{o} * C + c]);
      out[n * OC + o] = acc;
    }
  }
}

#endif

}  // namespace h2
