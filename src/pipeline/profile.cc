// Measuring chips and links for `h2 profile`.
#include "pipeline/profile.h"

#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "comm/job.h"
#include "comm/launch.h"
#include "core/clock.h"
#include "core/file.h"
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

namespace {

// The chip type of each measuring rank: one per device of the cluster, at most kMaxRanks (then every type
// keeps its share of them, at least one).
constexpr int kMaxRanks = 8;
std::vector<std::string> rank_chips(const Cluster& cluster) {
  int devices = 0;
  for (const NodeGroup& g : cluster.groups) devices += g.devices();
  std::vector<std::string> out;
  for (const NodeGroup& g : cluster.groups) {
    const int n = devices <= kMaxRanks ? g.devices() : std::max(1, g.devices() * kMaxRanks / devices);
    for (int i = 0; i < n; ++i) out.push_back(cluster.chips[static_cast<size_t>(g.chip)].name);
  }
  return out;
}

// The cores each rank of `h2 train --cluster` gets on this host.
int threads_per_rank(const Cluster& cluster) {
  int devices = 0;
  for (const NodeGroup& g : cluster.groups) devices += g.devices();
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / std::max(1, devices));
}

}  // namespace

// Its chip type's measurements while every other rank measures its own (emulated chips share this host's cores
// and memory as the training ranks will), then the link; rank 0 writes what all found.
void profile_rank(const std::string& cluster_file, const TransformerShape& shape, int micro_batch,
                  const std::string& out) {
  const Cluster cluster = load_cluster(ConfigNode::load_file(cluster_file));
  const std::vector<std::string> chips = rank_chips(cluster);
  auto job = join_job(job_env());
  Communicator& world = *job->world;
  omp_set_num_threads(threads_per_rank(cluster));
  world.barrier();
  // Every rank measures for the same few seconds at least, so the host stays as loaded as in training until the
  // slowest chip's rounds are done.
  const ChipMeasurement m =
      measure_chip(cluster, chips[static_cast<size_t>(world.rank())], shape, micro_batch, /*min_seconds=*/8.0);
  world.barrier();
  const LinkMeasurement link = measure_link(world);
  const float mine[3] = {static_cast<float>(m.layer_s), static_cast<float>(m.head_s),
                         static_cast<float>(m.optimizer_gbps)};
  std::vector<float> all(3 * static_cast<size_t>(world.size()));
  world.all_gather(all.data(), mine, 3, DType::kF32);
  if (world.rank() == 0) {
    nlohmann::json ranks = nlohmann::json::array();
    for (int r = 0; r < world.size(); ++r) {
      const float* x = &all[3 * static_cast<size_t>(r)];
      ranks.push_back(
          {{"chip", chips[static_cast<size_t>(r)]}, {"layer_s", x[0]}, {"head_s", x[1]}, {"optimizer_gbps", x[2]}});
    }
    write_file_atomic(
        out, nlohmann::json{{"bandwidth_gbps", link.bandwidth_gbps}, {"latency_us", link.latency_us}, {"ranks", ranks}}
                 .dump());
  }
  world.barrier();
}

void profile_cluster(const ProfileJob& job) {
  const std::string &cluster_file = job.cluster_file, &model_label = job.model_label, &out = job.out;
  const TransformerShape& shape = job.shape;
  const int micro_batch = job.micro_batch;
  const Cluster cluster = load_cluster(ConfigNode::load_file(cluster_file));
  const std::vector<std::string> ranks = rank_chips(cluster);
  std::printf(
      "profiling %zu chip type(s) of %s at the shapes of %s, micro-batch %d: %zu processes at once (one per "
      "device), %d thread(s) each\n",
      cluster.chips.size(), cluster_file.c_str(), model_label.c_str(), micro_batch, ranks.size(),
      threads_per_rank(cluster));
  // The ranks read the shape from a model file (the job's may come from a training config) and write raw results.
  const std::string part = out + ".ranks.json", model_file = out + ".model.yaml";
  write_file_atomic(model_file, cat("name: measured\nlayers: ", shape.layers, "\nhidden: ", shape.hidden,
                                    "\nheads: ", shape.heads, "\nkv_heads: ", shape.kv_heads, "\nffn: ", shape.ffn,
                                    "\nvocab: ", shape.vocab, "\nseq_len: ", shape.seq_len, "\n"));
  LaunchOptions options;
  options.ranks = std::max<int>(2, static_cast<int>(ranks.size()));
  const LaunchResult r = launch(job.rank_command(cluster_file, model_file, micro_batch, part), options);
  std::filesystem::remove(model_file);
  if (r.exit_code != 0) throw Error(ErrorCode::kInternal, cat("the measurement failed: ", r.message));
  const nlohmann::json j = nlohmann::json::parse(read_file(part));
  std::filesystem::remove(part);
  // Each chip type: the mean over its ranks.
  std::printf("%-10s %6s %12s %12s %14s %10s\n", "chip", "speed", "block ms", "head ms", "achieved GF/s", "optim GB/s");
  std::vector<ChipMeasurement> chips;
  for (const ChipType& t : cluster.chips) {
    ChipMeasurement m{.chip = t.name, .speed = emu_profile_of(cluster, t.name).speed};
    int n = 0;
    for (const auto& x : j["ranks"]) {
      if (x["chip"] != t.name) continue;
      m.layer_s += x["layer_s"].get<double>();
      m.head_s += x["head_s"].get<double>();
      m.optimizer_gbps += x["optimizer_gbps"].get<double>();
      ++n;
    }
    if (n == 0) continue;
    m.layer_s /= n;
    m.head_s /= n;
    m.optimizer_gbps /= n;
    m.flops_per_second = achieved_flops_per_second(shape, micro_batch, m.layer_s, m.head_s);
    chips.push_back(m);
    std::printf("%-10s %6.2f %12.2f %12.2f %14.2f %10.2f\n", m.chip.c_str(), m.speed, m.layer_s * 1e3, m.head_s * 1e3,
                m.flops_per_second / 1e9, m.optimizer_gbps);
  }
  const LinkMeasurement link{j["bandwidth_gbps"].get<double>(), j["latency_us"].get<double>()};
  std::printf("link (DiComm over UCX, %d processes, pairs all-reducing at once): %.2f GB/s, %.1f us\n", options.ranks,
              link.bandwidth_gbps, link.latency_us);
  write_file_atomic(out, "# Measured by h2 profile from " + cluster_file + " at the shapes of " + model_label + "\n" +
                             cluster_to_yaml(profiled_cluster(cluster, chips, link)));
}

}  // namespace h2
