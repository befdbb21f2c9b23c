// bench_train_step: tokens/s of one full training step (forward, loss, backward, AdamW) of a GPT-2-shaped
// model on one device, in f32 and in bf16 (the two steps alternate, so both see the same machine). On the cpu
// backend, the f32 step's model FLOP utilisation against bare cblas_sgemm measured in the same run; on another
// backend (cuda), the bf16 step's against --peak-tflops when given. bench/run_train_step.sh runs it beside the
// same model and batch in PyTorch (train_step_torch.py, f32); scripts/gpu_check.sh does on a GPU (bf16).
// Usage: bench_train_step [--backend cpu|cuda] [--peak-tflops P] [--layers L] [--embd C] [--heads NH] [--batch B]
//                         [--seq T] [--steps N]
// Prints a human line on stderr and one JSON line on stdout.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench_main.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/rng.h"
#include "device/registry.h"
#include "model/costs.h"
#include "model/gpt.h"
#include "train/trainer.h"

extern "C" char* openblas_get_corename(void);

namespace {

// The sgemm rate on the model's MLP shape: what a step's FLOPs could run at if every op were a large GEMM.
double sgemm_gflops(int n, int c) {
  std::vector<float> a(static_cast<size_t>(n) * c, 0.5f), b(static_cast<size_t>(4) * c * c, 0.25f),
      out(static_cast<size_t>(n) * 4 * c);
  std::vector<double> times;
  for (int i = 0; i < 6; ++i) {
    const double t0 = h2::monotonic_seconds();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, 4 * c, c, 1.0f, a.data(), c, b.data(), c, 0.0f, out.data(),
                4 * c);
    times.push_back(h2::monotonic_seconds() - t0);
  }
  return 2.0 * n * c * 4.0 * c / h2::median(times) * 1e-9;
}

}  // namespace

int run(int argc, char** argv) {
  int layers = 12, embd = 768, heads = 12, B = 4, T = 256, steps = 5;
  std::string backend = "cpu";
  double peak_tflops = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (k == "--backend")
      backend = argv[i + 1];
    else if (k == "--peak-tflops")
      peak_tflops = std::atof(argv[i + 1]);
    else if (k == "--layers")
      layers = v;
    else if (k == "--embd")
      embd = v;
    else if (k == "--heads")
      heads = v;
    else if (k == "--batch")
      B = v;
    else if (k == "--seq")
      T = v;
    else if (k == "--steps")
      steps = v;
  }
  using namespace h2;
  const GptConfig config{layers, heads, embd, 50257, 1024};
  auto dev = create_device(DeviceSpec{.backend = backend});
  const bool cpu = backend == "cpu";
  struct Run {
    Gpt model;
    OptimizerState optimizer;
    std::vector<double> times;
  };
  std::vector<std::unique_ptr<Run>> runs;
  for (Precision p : {Precision::kF32, Precision::kBf16}) {
    runs.push_back(std::make_unique<Run>(Gpt(config, *dev, GptRange::whole(config), B, T, {}, {.precision = p}),
                                         OptimizerState{}, std::vector<double>{}));
    Run& r = *runs.back();
    r.model.init(1);
    r.optimizer = {dev->zeros(DType::kF32, {r.model.num_params()}), dev->zeros(DType::kF32, {r.model.num_params()})};
  }
  Gpt& model = runs[0]->model;
  Tensor tokens = dev->empty(DType::kI32, {B, T}), targets = dev->empty(DType::kI32, {B, T});
  Tensor acc = dev->zeros(DType::kF32, {1});
  Rng rng(3);
  std::vector<int32_t> host_tokens(static_cast<size_t>(B) * T), host_targets(host_tokens.size());
  for (size_t i = 0; i < host_tokens.size(); ++i) {
    host_tokens[i] = static_cast<int32_t>(rng.below(50257));
    host_targets[i] = static_cast<int32_t>(rng.below(50257));
  }
  copy_from_host(tokens, host_tokens.data());
  copy_from_host(targets, host_targets.data());
  auto step = [&](Run& r, int64_t t) {
    r.model.zero_grads();
    r.model.forward(tokens);
    r.model.loss(targets);
    r.model.backward();
    optimizer_step(r.model, r.optimizer, AdamwParams{.lr = 1e-4f, .weight_decay = 0.1f, .step = t}, acc,
                   {.max_norm = 0});
    dev->synchronize();  // a GPU's queue runs behind the host
  };
  for (auto& r : runs) step(*r, 1);  // warm-up
  for (int i = 0; i < steps; ++i) {
    for (auto& r : runs) {
      const double t0 = h2::monotonic_seconds();
      step(*r, i + 2);
      r->times.push_back(h2::monotonic_seconds() - t0);
    }
  }
  const double t_step = h2::median(runs[0]->times), t_bf16 = h2::median(runs[1]->times);
  const TransformerShape s = config.shape();
  // Training FLOPs: forward + backward (2x forward) of every layer and of the head.
  const double flops = 3.0 * B * (static_cast<double>(layers) * layer_forward_flops(s, T) + head_forward_flops(s, T));
  const double tok_s = B * T / t_step, achieved = flops / t_step * 1e-9, bf16_achieved = flops / t_bf16 * 1e-9;
  if (cpu) {
    const double peak = sgemm_gflops(B * T, embd);
    std::fprintf(stderr,
                 "h2 cpu: %d layers x %d, B=%d T=%d, %lld params: %.3f s/step, %.0f tok/s, %.1f GFLOP/s, "
                 "sgemm %.1f GFLOP/s, MFU %.1f%% (OpenBLAS kernel %s, %d threads)\n",
                 layers, embd, B, T, static_cast<long long>(model.num_params()), t_step, tok_s, achieved, peak,
                 100.0 * achieved / peak, openblas_get_corename(), omp_get_max_threads());
    std::fprintf(stderr, "h2 cpu bf16: %.3f s/step, %.0f tok/s, %.2fx the f32 step\n", t_bf16, B * T / t_bf16,
                 t_step / t_bf16);
    std::printf(
        "{\"system\": \"h2\", \"seconds_per_step\": %.6f, \"tokens_per_s\": %.2f, \"gflops\": %.2f, "
        "\"sgemm_gflops\": %.2f, \"params\": %lld, \"bf16_seconds_per_step\": %.6f, \"bf16_tokens_per_s\": %.2f}\n",
        t_step, tok_s, achieved, peak, static_cast<long long>(model.num_params()), t_bf16, B * T / t_bf16);
    return 0;
  }
  // Another backend: its MFU is the bf16 step's FLOP rate over the chip's dense bf16 peak, when given.
  const double mfu = peak_tflops > 0 ? bf16_achieved * 1e-3 / peak_tflops : 0;
  std::fprintf(stderr,
               "h2 %s (%s): %d layers x %d, B=%d T=%d, %lld params: f32 %.4f s/step, %.0f tok/s; bf16 %.4f s/step, "
               "%.0f tok/s, %.1f TFLOP/s, MFU %.1f%% of %.0f TFLOP/s\n",
               dev->name().c_str(), dev->props().chip.c_str(), layers, embd, B, T,
               static_cast<long long>(model.num_params()), t_step, tok_s, t_bf16, B * T / t_bf16, bf16_achieved * 1e-3,
               100.0 * mfu, peak_tflops);
  std::printf(
      "{\"system\": \"h2 %s\", \"seconds_per_step\": %.6f, \"tokens_per_s\": %.2f, \"bf16_seconds_per_step\": "
      "%.6f, \"bf16_tokens_per_s\": %.2f, \"bf16_tflops\": %.3f, \"bf16_mfu\": %.4f, \"params\": %lld}\n",
      backend.c_str(), t_step, tok_s, t_bf16, B * T / t_bf16, bf16_achieved * 1e-3, mfu,
      static_cast<long long>(model.num_params()));
  return 0;
}

int main(int argc, char** argv) { return h2::bench_main("bench_train_step", argc, argv, run); }
