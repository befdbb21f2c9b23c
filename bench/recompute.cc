// bench_recompute: selective recomputation's measured cost beside the cost model's (issue: a measured recompute
// time within 10% of the cost model's). On the cpu backend, one thread, for blocks of the built-in example's width
// (C = 256, 4 heads) at several micro-batch sizes and sequence lengths:
//   measured  = the runtime's recomputation of the attention core inside a selective block's backward, as the
//               model times it (Gpt::recompute_seconds), the median of --reps backwards;
//   predicted = the cost model's layer_backward_s(selective) - layer_backward_s(none) on a chip whose figures are
//               measured here on other shapes: the attention core's forward rate at half the heads and width
//               (a TP 2 rank's shape), the fixed cost of a kernel, the bandwidth of a streaming kernel.
// Usage: bench_recompute [--reps N]
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/rng.h"
#include "device/registry.h"
#include "model/gpt.h"
#include "ops/ops.h"
#include "planner/cost_model.h"

namespace h2 {
namespace {

int g_reps = 30;

Tensor randn(Device& dev, Shape shape, uint64_t seed, float scale) {
  Tensor t = dev.empty(DType::kF32, shape);
  Rng rng(seed);
  float* p = t.data_as<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = scale * rng.normal();
  return t;
}

// The median of g_reps runs of fn (after `before`, untimed, each time).
double median_time(const std::function<void()>& before, const std::function<void()>& fn) {
  std::vector<double> times;
  for (int i = 0; i < g_reps; ++i) {
    before();
    const double t0 = monotonic_seconds();
    fn();
    times.push_back(monotonic_seconds() - t0);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

struct Sample {
  double measured, predicted;
};

// One measurement of a (B, T) block: the runtime's recomputation and the cost model's prediction of it.
Sample sample(Device& dev, int B, int T) {
  constexpr int C = 256, NH = 4;
  // The chip's figures, from other shapes than the block's.
  const Tensor tiny = dev.zeros(DType::kF32, {1});
  const double overhead = median_time([] {},
                                      [&] {
                                        for (int i = 0; i < 200; ++i) ops::scale(tiny, 1.0f);
                                      }) /
                          200;
  const Tensor big = randn(dev, {int64_t{1} << 24}, 3, 1.0f);
  const double bandwidth = 2.0 * 4 * big.numel() / median_time([] {}, [&] { ops::scale(big, 1.0f); });
  const Tensor qkv = randn(dev, {B, T, 3 * C / 2}, 1, 1.0f), out = dev.empty(DType::kF32, {B, T, C / 2}),
               att = dev.empty(DType::kF32, {B, NH / 2, T, T});
  const double half_flops = 2.0 * B * T * T * (C / 2);  // Q K^T and P V over the causal half
  const double rate = half_flops / std::max(1e-9, median_time([&] { ops::scale(big, 1.0f); },
                                                              [&] { ops::attention_forward(out, att, qkv, NH / 2); }) -
                                                      overhead);
  Cluster cluster;
  ChipType chip;
  chip.name = "cpu";
  chip.peak_tflops = chip.peak_tflops_f32 = rate / 1e12;
  chip.efficiency = chip.attention_efficiency = chip.attention_forward_efficiency = 1.0;
  chip.memory_gib = 64;
  chip.memory_bandwidth_gbps = bandwidth / 1e9;
  chip.memory_efficiency = 1.0;
  chip.kernel_overhead_us = overhead * 1e6;
  cluster.name = "this host";
  cluster.chips = {chip};
  cluster.groups = {NodeGroup{.chip = 0, .nodes = 1, .chips_per_node = 1, .intra_node_gbps = 1, .nic_gbps = 1}};
  const TransformerShape shape{.layers = 1,
                               .hidden = C,
                               .heads = NH,
                               .kv_heads = NH,
                               .ffn = 4 * C,
                               .vocab = 64,
                               .seq_len = T,
                               .tied_embeddings = true};
  const CostModel costs(cluster, shape, TrainSetup{.global_batch = B, .precision = Precision::kF32});
  const double predicted =
      costs.layer_backward_s(0, 1, B, Recompute::kSelective) - costs.layer_backward_s(0, 1, B, Recompute::kNone);
  // The runtime's.
  GptConfig config;
  config.n_layer = 1;
  config.n_head = NH;
  config.n_embd = C;
  config.vocab_size = 64;
  config.seq_len = T;
  Gpt selective(config, dev, GptRange{false, 0, 1, false}, B, T, {},
                ActivationPolicy{.recompute = Recompute::kSelective});
  selective.init(1);
  const Tensor x = randn(dev, {B, T, C}, 5, 1.0f), dout = randn(dev, {B, T, C}, 6, 0.01f);
  std::vector<double> times;
  for (int i = 0; i <= g_reps; ++i) {
    selective.forward(x);
    const double before = selective.recompute_seconds();
    selective.backward(dout);
    if (i > 0) times.push_back(selective.recompute_seconds() - before);  // the first warms up
  }
  std::sort(times.begin(), times.end());
  return {times[times.size() / 2], predicted};
}

int run(int argc, char** argv) {
  int rounds = 3;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) g_reps = std::max(3, std::atoi(argv[++i]));
    if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = std::max(1, std::atoi(argv[++i]));
  }
  auto device = create_device(DeviceSpec{.backend = "cpu"});
  const std::vector<std::pair<int, int>> shapes = {{1, 256}, {4, 256}, {1, 512}, {2, 512}};
  std::vector<std::vector<Sample>> samples(shapes.size());
  for (int r = 0; r < rounds; ++r) {  // rounds over all shapes, so that the host's drift touches every one
    for (size_t s = 0; s < shapes.size(); ++s) samples[s].push_back(sample(*device, shapes[s].first, shapes[s].second));
  }
  std::printf(
      "# bench_recompute: selective recomputation, cpu backend, C = 256, 4 heads; each figure the median of "
      "%d backwards, %d rounds\n",
      g_reps, rounds);
  std::printf("%4s %5s %22s %22s %18s %13s\n", "B", "T", "measured ms (min-max)", "predicted ms (min-max)",
              "ratio (min-max)", "median ratio");
  for (size_t s = 0; s < shapes.size(); ++s) {
    auto range = [&](auto figure) {
      double lo = 1e30, hi = 0;
      for (const Sample& x : samples[s]) lo = std::min(lo, figure(x)), hi = std::max(hi, figure(x));
      return std::pair{lo, hi};
    };
    const auto [m0, m1] = range([](const Sample& x) { return x.measured * 1e3; });
    const auto [p0, p1] = range([](const Sample& x) { return x.predicted * 1e3; });
    const auto [r0, r1] = range([](const Sample& x) { return x.measured / x.predicted; });
    std::vector<double> ratios;
    for (const Sample& x : samples[s]) ratios.push_back(x.measured / x.predicted);
    std::sort(ratios.begin(), ratios.end());
    std::printf("%4d %5d %10.3f-%-11.3f %10.3f-%-11.3f %8.3f-%-9.3f %13.3f\n", shapes[s].first, shapes[s].second, m0,
                m1, p0, p1, r0, r1, ratios[ratios.size() / 2]);
  }
  return 0;
}

}  // namespace
}  // namespace h2

int main(int argc, char** argv) { return h2::run(argc, argv); }
