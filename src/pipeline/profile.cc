// Measuring chips and links for `h2 profile`.
#include "pipeline/profile.h"

#include <chrono>
#include <cstring>
#include <random>

#include "core/clock.h"
#include "device/registry.h"
#include "model/gpt.h"
#include "ops/ops.h"
#include "pipeline/hetero_train.h"
#include "planner/cost_model.h"
#include "train/optimizer.h"

namespace h2 {

double achieved_flops_per_second(const TransformerShape& shape, int micro_batch, double layer_s, double head_s) {
  const int64_t T = shape.seq_len;
  const double flops =
      3.0 * micro_batch *
      (static_cast<double>(shape.layers) * layer_forward_flops(shape, T) + head_forward_flops(shape, T));
  return flops / (static_cast<double>(shape.layers) * layer_s + head_s);
}

ChipMeasurement measure_chip(const Cluster& cluster, const std::string& chip, const TransformerShape& shape,
                             int micro_batch, double min_seconds) {
  EmuProfile profile = emu_profile_of(cluster, chip);
  profile.mem_capacity_bytes = size_t{16} << 30;  // measuring, not fitting: the planner checks memory
  auto device = create_device(DeviceSpec{.backend = "emu", .index = 0, .emu = profile});
  const GptConfig config = gpt_config_of(shape);
  const int B = micro_batch, T = config.seq_len, C = config.n_embd;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> host(static_cast<size_t>(B) * T * C);
  for (float& x : host) x = normal(rng);
  Tensor x = device->empty(DType::kF32, {B, T, C}), dout = device->empty(DType::kF32, {B, T, C});
  copy_from_host(x, host.data());
  for (float& v : host) v = 0.01f * normal(rng);
  copy_from_host(dout, host.data());
  std::vector<int32_t> ids(static_cast<size_t>(B) * T);
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<int32_t>(i * 7919 % static_cast<size_t>(config.vocab_size));
  Tensor targets = device->empty(DType::kI32, {B, T});
  copy_from_host(targets, ids.data());

  ChipMeasurement m{.chip = chip, .speed = profile.speed};
  Gpt block(config, *device, GptRange{false, 0, 1, false}, B, T);
  block.init(1);
  Gpt head(config, *device, GptRange{false, config.n_layer, config.n_layer, true}, B, T);
  head.init(1);
  // The optimizer step as every trainer takes it (train/optimizer.h: norm, clipping, AdamW), over the head's
  // parameters. The cost model charges it optimizer_traffic_bytes per parameter of memory traffic (f32: 40), so
  // the rate measured here is the memory bandwidth that makes that formula true on this chip.
  const int64_t n = head.num_params();
  const OptimizerState state{device->zeros(DType::kF32, {n}), device->zeros(DType::kF32, {n})};
  Tensor acc = device->zeros(DType::kF32, {1});
  const auto timed = [&](const std::function<void()>& fn) {
    const double t0 = monotonic_seconds();
    fn();
    device->synchronize();
    return monotonic_seconds() - t0;
  };
  // Rounds of block, head and optimizer until both kRounds are done and min_seconds have passed (the first
  // round warms up); the medians are the measurements.
  constexpr int kRounds = 5;
  std::vector<double> layer, head_s, optim;
  const double start = monotonic_seconds();
  for (int round = 0; round <= kRounds || monotonic_seconds() - start < min_seconds; ++round) {
    const double l = timed([&] {
      block.forward(x);
      block.backward(dout);
    });
    const double h = timed([&] {
      head.forward(x);
      head.loss(targets);
      head.backward();
    });
    const double o = timed([&] { optimizer_step(head, state, AdamwParams{}, acc, {.max_norm = 1e-6}); });
    if (round == 0) continue;
    layer.push_back(l);
    head_s.push_back(h);
    optim.push_back(o);
  }
  m.layer_s = median(layer);
  m.head_s = median(head_s);
  m.flops_per_second = achieved_flops_per_second(shape, B, m.layer_s, m.head_s);
  m.optimizer_gbps = CostConstants::f32().optimizer_traffic_bytes * static_cast<double>(n) / median(optim) / 1e9;
  return m;
}

LinkMeasurement measure_link(Communicator& world) {
  float result[2] = {0, 0};  // bandwidth GB/s, latency us
  // Latency: ranks 0 and 1 exchange 8 bytes while the others wait.
  if (world.rank() < 2 && world.size() >= 2) {
    const int peer = 1 - world.rank();
    std::vector<char> out(8), in(8);
    result[1] = static_cast<float>(1e6 * median_seconds(50, [&] {
                                     auto r = world.irecv(in.data(), in.size(), peer, 1);
                                     auto s = world.isend(out.data(), out.size(), peer, 1);
                                     world.wait_request(*r, "profile", peer);
                                     world.wait_request(*s, "profile", peer);
                                   }));
  }
  // Bandwidth under load, as training's gradient all-reduces meet it: every pair of ranks all-reduces a 32 MiB
  // f32 buffer at the same time; for two ranks the ring's 2 (n-1)/n bytes / bandwidth is bytes / bandwidth.
  Communicator pair = world.split(world.rank() / 2, world.rank());
  if (pair.size() == 2) {
    std::vector<float> grads(size_t{8} << 20, 1.0f);
    const double t =
        median_seconds(3, [&] { pair.all_reduce(grads.data(), grads.size(), DType::kF32, ReduceOp::kSum); });
    result[0] = static_cast<float>(static_cast<double>(grads.size() * 4) / t / 1e9);
  }
  world.broadcast(result, 2, DType::kF32, 0);
  return LinkMeasurement{result[0], result[1]};
}

Cluster profiled_cluster(const Cluster& cluster, const std::vector<ChipMeasurement>& chips,
                         const LinkMeasurement& link) {
  Cluster out = cluster;
  out.name = cluster.name + "-profiled";
  for (const ChipMeasurement& m : chips) {
    ChipType& t = out.chips[static_cast<size_t>(out.chip_index(m.chip))];
    t.peak_tflops = m.flops_per_second / 1e12;
    t.efficiency = 1.0;
    t.memory_bandwidth_gbps = m.optimizer_gbps;
  }
  if (link.bandwidth_gbps > 0) {
    for (NodeGroup& g : out.groups) {
      if (g.chips_per_node > 1) g.intra_node_gbps = link.bandwidth_gbps;
      g.intra_node_latency_us = link.latency_us;
      g.nic_gbps = link.bandwidth_gbps;
      g.nic_latency_us = link.latency_us;
    }
    for (GroupLink& l : out.links) {
      l.bandwidth_gbps = link.bandwidth_gbps;
      l.latency_us = link.latency_us;
    }
  }
  return out;
}

}  // namespace h2
