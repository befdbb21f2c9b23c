// bench_ops: every op of the cpu backend at GPT-2-small shapes (B=4, T=256, C=768, 12 heads, V=50257), each
// beside a named alternative measured in the same run:
//   - matmul (forward and backward) beside bare cblas_sgemm calls on the same shapes: GFLOP/s and ratio;
//   - matmul forward and backward with bf16 inputs (H2's own kernel: Debian's OpenBLAS has no bf16 GEMM) beside
//     the same bare f32 sgemm (goal: 1.6x);
//   - element-wise and row-wise ops beside memcpy moving the same number of bytes (read + written): GB/s, ratio;
//   - two emu devices (speed 1.0 and 0.5) running the same op one at a time: their time ratio, target 2.0.
// Times are medians over repetitions; ratios, not absolute times, are the result (the machine is shared).
// Usage: bench_ops [--reps N]   (bench/run_ops.sh runs it with OpenBLAS free to pick its kernel)
#include "ops/ops.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/format.h"
#include "core/rng.h"
#include "device/registry.h"

extern "C" char* openblas_get_corename(void);

namespace h2 {
namespace {

constexpr int B = 4, T = 256, C = 768, NH = 12, V = 50257;
constexpr int64_t N = int64_t{B} * T;
int g_reps = 7;

// Median wall time of fn() over g_reps runs after one warm-up run.
double time_median(const std::function<void()>& fn) { return median_seconds(g_reps, fn); }

Tensor randn(Device& dev, Shape shape, uint64_t seed, float scale = 1.0f) {
  Tensor t = dev.empty(DType::kF32, shape);
  Rng rng(seed);
  float* p = t.data_as<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(rng.normal()) * scale;
  return t;
}

Tensor tokens(Device& dev, Shape shape, int limit) {
  Tensor t = dev.empty(DType::kI32, shape);
  Rng rng(7);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data_as<int32_t>()[i] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(limit)));
  return t;
}

// GPT-2-small's matrix products: N x c -> oc, the head without a bias.
struct MatmulShape {
  const char* name;
  int c, oc;
};
constexpr MatmulShape kMatmulShapes[] = {{"attn.c_attn (qkv)", C, 3 * C},
                                         {"attn.c_proj", C, C},
                                         {"mlp.c_fc", C, 4 * C},
                                         {"mlp.c_proj", 4 * C, C},
                                         {"lm_head (no bias)", C, V}};

// The f32 op and its backward against bare sgemm; then the forward with bf16 inp and weight (out f32) against the
// same sgemm: what bf16 training would gain per matrix product on this CPU.
void matmul_table(Device& dev) {
  std::printf("\n## matmul: op vs bare cblas_sgemm (same shapes, same run)\n");
  std::printf("%-26s %16s %10s %10s %8s\n", "layer", "N x C -> OC", "op GF/s", "sgemm GF/s", "ratio");
  std::string bf16_rows;
  for (const MatmulShape& s : kMatmulShapes) {
    const bool bias = s.oc != V;
    Tensor inp = randn(dev, {N, s.c}, 1), w = randn(dev, {s.oc, s.c}, 2, 0.02f), b = randn(dev, {s.oc}, 3);
    Tensor out = dev.empty(DType::kF32, {N, s.oc});
    const double flops = 2.0 * static_cast<double>(N) * s.c * s.oc;
    const double t_op = time_median([&] { ops::matmul_forward(out, inp, w, bias ? b : Tensor()); });
    const double t_bare = time_median([&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(N), s.oc, s.c, 1.0f, inp.data_as<float>(),
                  s.c, w.data_as<float>(), s.c, 0.0f, out.data_as<float>(), s.oc);
    });
    char dims[32];
    std::snprintf(dims, sizeof(dims), "%lldx%d->%d", static_cast<long long>(N), s.c, s.oc);
    std::printf("%-26s %16s %10.1f %10.1f %8.3f\n", s.name, dims, flops / t_op * 1e-9, flops / t_bare * 1e-9,
                t_bare / t_op);
    Tensor inp16 = dev.empty(DType::kBF16, {N, s.c}), w16 = dev.empty(DType::kBF16, {s.oc, s.c});
    ops::convert(inp16, inp);
    ops::convert(w16, w);
    const double t_bf16 = time_median([&] { ops::matmul_forward(out, inp16, w16, bias ? b : Tensor()); });
    bf16_rows += format("%-26s %16s %10.1f %10.1f %8.3f\n", s.name, dims, flops / t_bf16 * 1e-9, flops / t_bare * 1e-9,
                        t_bare / t_bf16);
    if (!bias) continue;
    // Backward: the op does two products and a column sum; the alternative is the same two bare sgemms.
    Tensor dout = randn(dev, {N, s.oc}, 4), dinp = dev.empty(DType::kF32, {N, s.c});
    Tensor dw = dev.zeros(DType::kF32, {s.oc, s.c}), db = dev.zeros(DType::kF32, {s.oc});
    const double t_bop = time_median([&] { ops::matmul_backward(dinp, dw, db, dout, inp, w); });
    const double t_bbare = time_median([&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(N), s.c, s.oc, 1.0f,
                  dout.data_as<float>(), s.oc, w.data_as<float>(), s.c, 0.0f, dinp.data_as<float>(), s.c);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, s.oc, s.c, static_cast<int>(N), 1.0f, dout.data_as<float>(),
                  s.oc, inp.data_as<float>(), s.c, 1.0f, dw.data_as<float>(), s.c);
    });
    std::printf("%-26s %16s %10.1f %10.1f %8.3f\n", (std::string(s.name) + " backward").c_str(), dims,
                2 * flops / t_bop * 1e-9, 2 * flops / t_bbare * 1e-9, t_bbare / t_bop);
    const double t_b16 = time_median([&] { ops::matmul_backward(dinp, dw, db, dout, inp16, w16); });
    bf16_rows += format("%-26s %16s %10.1f %10.1f %8.3f\n", (std::string(s.name) + " backward").c_str(), dims,
                        2 * flops / t_b16 * 1e-9, 2 * flops / t_bbare * 1e-9, t_bbare / t_b16);
  }
  std::printf(
      "\n## matmul in bf16 (bf16 inp and weight; out, dout and the gradients f32) vs the bare f32 "
      "cblas_sgemm above\n");
  std::printf("%-26s %16s %10s %10s %8s\n%s", "layer", "N x C -> OC", "bf16 GF/s", "sgemm GF/s", "ratio",
              bf16_rows.c_str());
}

struct BandwidthRow {
  const char* name;
  double bytes;  // read + written
  std::function<void()> run;
};

void bandwidth_table(Device& dev) {
  std::printf("\n## element-wise and row-wise ops: op vs memcpy of the same bytes (read + written)\n");
  std::printf("%-30s %10s %10s %12s %8s\n", "op", "MB moved", "op GB/s", "memcpy GB/s", "ratio");
  const int64_t n4 = N * 4 * C, nc = N * C;
  Tensor x4 = randn(dev, {n4}, 1), y4 = randn(dev, {n4}, 2), z4 = dev.empty(DType::kF32, {n4});
  Tensor a = randn(dev, {N, C}, 3), b = randn(dev, {N, C}, 4), o = dev.empty(DType::kF32, {N, C});
  Tensor mean = dev.empty(DType::kF32, {N}), rstd = dev.empty(DType::kF32, {N});
  Tensor lw = randn(dev, {C}, 5), lb = randn(dev, {C}, 6), dlw = dev.zeros(DType::kF32, {C}),
         dlb = dev.zeros(DType::kF32, {C});
  Tensor h4 = dev.empty(DType::kBF16, {n4}), h4_out = dev.empty(DType::kBF16, {n4});
  ops::convert(h4, x4);  // real values: uninitialised bf16 could hold denormals, which are slow to compute with
  Tensor wte = randn(dev, {V, C}, 7, 0.02f), wpe = randn(dev, {1024, C}, 8, 0.02f), tok = tokens(dev, {B, T}, V);
  Tensor dwte = dev.zeros(DType::kF32, {V, C}), dwpe = dev.zeros(DType::kF32, {1024, C});
  Tensor logits = randn(dev, {N, V}, 9), dlogits = dev.empty(DType::kF32, {N, V}), losses = dev.empty(DType::kF32, {N});
  const int64_t np = 4 * C * C;  // an mlp.c_fc weight: AdamW's working set per tensor
  Tensor p = randn(dev, {np}, 10), m = dev.zeros(DType::kF32, {np}), v = dev.zeros(DType::kF32, {np}),
         g = randn(dev, {np}, 11);
  Tensor acc = dev.zeros(DType::kF32, {1});
  ops::layernorm_forward(o, mean, rstd, a, lw, lb);
  const double f = 4.0;  // bytes per f32
  const std::vector<BandwidthRow> rows = {
      {"gelu_forward (N x 4C)", 2 * f * n4, [&] { ops::gelu_forward(z4, x4); }},
      {"gelu_backward (N x 4C)", 3 * f * n4, [&] { ops::gelu_backward(z4, x4, y4); }},
      {"gelu_forward bf16 (N x 4C)", 2 * 2.0 * n4, [&] { ops::gelu_forward(h4_out, h4); }},
      {"gelu_backward bf16 inp (N x 4C)", (2 + 2 * f) * n4, [&] { ops::gelu_backward(z4, h4, y4); }},
      {"residual_forward (N x C)", 3 * f * nc, [&] { ops::residual_forward(o, a, b); }},
      {"convert f32->bf16 (N x 4C)", (f + 2) * n4, [&] { ops::convert(h4, x4); }},
      {"convert bf16->f32 (N x 4C)", (f + 2) * n4, [&] { ops::convert(z4, h4); }},
      {"layernorm_forward (N x C)", 2 * f * nc, [&] { ops::layernorm_forward(o, mean, rstd, a, lw, lb); }},
      {"layernorm_backward (N x C)", 3 * f * nc, [&] { ops::layernorm_backward(o, dlw, dlb, b, a, lw, mean, rstd); }},
      {"encoder_forward (N x C)", 3 * f * nc, [&] { ops::encoder_forward(o, tok, wte, wpe); }},
      {"encoder_backward (N x C)", 5 * f * nc, [&] { ops::encoder_backward(dwte, dwpe, a, tok); }},
      {"crossentropy fwd+bwd (N x V)", 2 * f * static_cast<double>(N) * V,
       [&] { ops::crossentropy_forward_backward(losses, dlogits, logits, tok.reshape({N}), 1.0f / N); }},
      {"adamw_update (4C x C)", 7 * f * np, [&] { ops::adamw_update(p, m, v, g, AdamwParams{}); }},
      {"global_norm_squared (4C x C)", f * np, [&] { ops::global_norm_squared(acc, g); }},
      {"scale (4C x C)", 2 * f * np, [&] { ops::scale(g, 1.0f); }},
  };
  std::vector<char> src(static_cast<size_t>(2 * f * static_cast<double>(N) * V / 2 + 64)), dst(src.size());
  std::memset(src.data(), 1, src.size());
  std::memset(dst.data(), 2, dst.size());
  for (const BandwidthRow& r : rows) {
    const double t_op = time_median(r.run);
    const size_t half = static_cast<size_t>(r.bytes / 2);  // memcpy reads `half` and writes `half`
    const double t_copy = time_median([&] { std::memcpy(dst.data(), src.data(), half); });
    std::printf("%-30s %10.1f %10.2f %12.2f %8.3f\n", r.name, r.bytes * 1e-6, r.bytes / t_op * 1e-9,
                r.bytes / t_copy * 1e-9, t_copy / t_op);
  }
  // Attention is neither a GEMM nor bandwidth-bound; report its FLOP rate (causal: about half of 4*B*NH*T*T*hs).
  Tensor qkv = randn(dev, {B, T, 3 * C}, 12), att = dev.empty(DType::kF32, {B, NH, T, T});
  Tensor aout = dev.empty(DType::kF32, {B, T, C}), dqkv = dev.empty(DType::kF32, {B, T, 3 * C});
  const double aflops = 4.0 * B * NH * static_cast<double>(T) * T * (C / NH) / 2;
  const double t_af = time_median([&] { ops::attention_forward(aout, att, qkv, NH); });
  const double t_ab = time_median([&] { ops::attention_backward(dqkv, a.reshape({B, T, C}), qkv, att, NH); });
  // bf16: q/k/v, the probabilities and the output in bf16 (what bf16 training keeps), beside f32 in the same run.
  Tensor qkv16 = dev.empty(DType::kBF16, {B, T, 3 * C}), att16 = dev.empty(DType::kBF16, {B, NH, T, T});
  Tensor aout16 = dev.empty(DType::kBF16, {B, T, C});
  ops::convert(qkv16, qkv);
  const double t_af16 = time_median([&] { ops::attention_forward(aout16, att16, qkv16, NH); });
  const double t_ab16 = time_median([&] { ops::attention_backward(dqkv, a.reshape({B, T, C}), qkv16, att16, NH); });
  std::printf("\n## attention (causal FLOPs)\n%-30s %10s %10s %8s\n", "op", "f32 GF/s", "bf16 GF/s", "bf16/f32");
  std::printf("%-30s %10.1f %10.1f %8.2f\n", "attention_forward", aflops / t_af * 1e-9, aflops / t_af16 * 1e-9,
              t_af / t_af16);
  std::printf("%-30s %10.1f %10.1f %8.2f\n", "attention_backward", 2 * aflops / t_ab * 1e-9, 2 * aflops / t_ab16 * 1e-9,
              t_ab / t_ab16);
}

void emu_table() {
  std::printf("\n## emu pacing: two emulated chips, speeds 1.0 and 0.5, run one at a time (target ratio 2.0)\n");
  std::printf("%-30s %12s %12s %8s\n", "op", "speed 1.0 ms", "speed 0.5 ms", "ratio");
  auto fast =
      create_device(DeviceSpec{.backend = "emu",
                               .index = 0,
                               .emu = EmuProfile{.chip = "fast", .speed = 1.0, .mem_capacity_bytes = size_t{1} << 30}});
  auto slow =
      create_device(DeviceSpec{.backend = "emu",
                               .index = 1,
                               .emu = EmuProfile{.chip = "slow", .speed = 0.5, .mem_capacity_bytes = size_t{1} << 30}});
  struct Row {
    const char* name;
    std::function<std::function<void()>(Device&)> make;
  };
  const std::vector<Row> rows = {
      {"matmul_forward x10 (N x C -> 3C)",
       [](Device& d) {
         auto inp = std::make_shared<Tensor>(randn(d, {N, C}, 1));
         auto w = std::make_shared<Tensor>(randn(d, {3 * C, C}, 2));
         auto out = std::make_shared<Tensor>(d.empty(DType::kF32, {N, 3 * C}));
         return std::function<void()>([inp, w, out, &d] {
           for (int i = 0; i < 10; ++i) ops::matmul_forward(*out, *inp, *w, Tensor());
           d.synchronize();
         });
       }},
      {"gelu_forward x10 (N x 4C)",
       [](Device& d) {
         auto x = std::make_shared<Tensor>(randn(d, {N * 4 * C}, 1));
         auto y = std::make_shared<Tensor>(d.empty(DType::kF32, {N * 4 * C}));
         return std::function<void()>([x, y, &d] {
           for (int i = 0; i < 10; ++i) ops::gelu_forward(*y, *x);
           d.synchronize();
         });
       }},
  };
  for (const Row& r : rows) {
    // Interleave the two devices rep by rep and take the median of the per-rep ratios, so that a change in
    // the machine's load between the two measurements does not show up as a pacing error.
    auto run_fast = r.make(*fast), run_slow = r.make(*slow);
    run_fast();
    run_slow();
    std::vector<double> fast_times, slow_times, ratios;
    for (int i = 0; i < g_reps; ++i) {
      double t0 = monotonic_seconds();
      run_fast();
      fast_times.push_back(monotonic_seconds() - t0);
      t0 = monotonic_seconds();
      run_slow();
      slow_times.push_back(monotonic_seconds() - t0);
      ratios.push_back(slow_times.back() / fast_times.back());
    }
    const double ratio = median(ratios);
    std::printf("%-30s %12.2f %12.2f %8.3f %s\n", r.name, median(fast_times) * 1e3, median(slow_times) * 1e3, ratio,
                std::abs(ratio - 2.0) <= 0.2 ? "(within 10% of 2.0)" : "(OUTSIDE 10% of 2.0)");
  }
}

}  // namespace
}  // namespace h2

int main(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--reps") h2::g_reps = std::max(1, std::atoi(argv[i + 1]));
  }
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  std::printf("# bench_ops: cpu backend at GPT-2-small shapes B=%d T=%d C=%d NH=%d V=%d\n", h2::B, h2::T, h2::C, h2::NH,
              h2::V);
  std::printf("OpenBLAS kernel: %s (OPENBLAS_CORETYPE=%s), OpenMP threads: %d, median of %d runs\n",
              openblas_get_corename(), coretype ? coretype : "unset", omp_get_max_threads(), h2::g_reps);
  auto dev = h2::create_device(h2::DeviceSpec{.backend = "cpu"});
  h2::matmul_table(*dev);
  h2::bandwidth_table(*dev);
  h2::emu_table();
  return 0;
}
