// Measuring chips and links for `h2 profile`.
#include "pipeline/profile.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
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
#include "core/format.h"
#include "device/registry.h"
#include "model/gpt.h"
#include "ops/ops.h"
#include "pipeline/hetero_train.h"
#include "planner/catalog.h"
#include "planner/cost_model.h"
#include "planner/planner.h"
#include "train/optimizer.h"

namespace h2 {
namespace {

// The speed of the chip's emulation relative to this host; 1 for a chip that runs on real hardware (cpu, cuda).
double emulated_speed(const Cluster& cluster, const std::string& chip) {
  const DeviceSpec spec = device_spec_of(cluster, chip, 0);
  return spec.emu ? spec.emu->speed : 1.0;
}

// Every rank's kernel work, on every rank, in rank order. Keys and seconds travel as raw 32-bit words in f32 slots
// (an all-gather copies them, it does not compute with them).
std::vector<KernelWork> gather_kernel_work(Communicator& world, const KernelWork& mine) {
  constexpr size_t kWords = 4;  // per entry: the key's 8 bytes, then the seconds' 8
  float count = static_cast<float>(mine.size());
  std::vector<float> counts(static_cast<size_t>(world.size()));
  world.all_gather(counts.data(), &count, 1, DType::kF32);
  const auto most = static_cast<size_t>(*std::max_element(counts.begin(), counts.end()));
  std::vector<KernelWork> all_work(counts.size());
  if (most == 0) return all_work;
  std::vector<float> words(most * kWords, 0.0f), all(words.size() * counts.size());
  size_t at = 0;
  for (const auto& [key, seconds] : mine) {
    std::memcpy(&words[at], &key, sizeof key);
    std::memcpy(&words[at + 2], &seconds, sizeof seconds);
    at += kWords;
  }
  world.all_gather(all.data(), words.data(), words.size(), DType::kF32);
  for (size_t r = 0; r < counts.size(); ++r) {
    for (size_t e = 0; e < static_cast<size_t>(counts[r]); ++e) {
      uint64_t key = 0;
      double seconds = 0;
      std::memcpy(&key, &all[(r * most + e) * kWords], sizeof key);
      std::memcpy(&seconds, &all[(r * most + e) * kWords + 2], sizeof seconds);
      all_work[r][key] = seconds;
    }
  }
  return all_work;
}

// A block's and the head's kernels, forward and backward, at a part timing's TP degree and rows, as the cost model
// composes them; without their all-reduces or the profile's part corrections.
struct ComposedParts {
  double block_forward = 0, block_backward = 0, head_forward = 0, head_backward = 0;
  double block() const { return block_forward + block_backward; }
  double head() const { return head_forward + head_backward; }
};
ComposedParts composed_parts(const CostModel& costs, int chip, const ChipMeasurement::PartTiming& p) {
  const TransformerShape& shape = costs.model();
  const double e = costs.constants().bytes.activation, w = costs.constants().bytes.weight;
  const int b = static_cast<int>(std::lround(p.rows / shape.seq_len)), tp = static_cast<int>(p.tp);
  const auto block = [&](bool backward) {
    return costs.ops_s(chip, block_ops(shape, b, shape.seq_len, tp, e, w, backward));
  };
  const auto head = [&](bool backward) {
    return costs.ops_s(chip, head_ops(shape, b, shape.seq_len, tp, e, w, backward));
  };
  return {block(false), block(true), head(false), head(true)};
}

// An emulated chip at this host's speed, without sleeping (MeasureOptions::unpaced, and measure_chip's unpaced copy).
void unpace(EmuProfile& chip) {
  chip.speed = 1.0;
  chip.mem_bandwidth_gbps = 0.0;
}

}  // namespace

ChipMeasurement measure_chip(const Cluster& cluster, const std::string& chip, const TransformerShape& shape,
                             int micro_batch, Precision precision, const MeasureOptions& options) {
  const KernelWork* reference = options.reference;
  DeviceSpec spec = device_spec_of(cluster, chip, 0);
  if (spec.emu) {
    spec.emu->announce = false;                       // profile_cluster's first line names the emulated chips
    spec.emu->mem_capacity_bytes = size_t{16} << 30;  // measuring, not fitting: the planner checks memory
    spec.emu->reference_work = reference ? std::make_shared<const KernelWork>(*reference) : nullptr;
    if (options.unpaced) unpace(*spec.emu);
  }
  spec.mem_capacity_bytes.reset();  // the device's own (a GPU's memory, this host's)
  auto device = create_device(spec);
  Device& dev = *device;
  const GptConfig config = gpt_config_of(shape);
  const int B = micro_batch, T = config.seq_len, C = config.n_embd, NH = config.n_head;
  const int64_t N = int64_t{B} * T;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto random_on = [&](Device& on, Shape s, float scale) {
    Tensor t = on.empty(DType::kF32, s);
    std::vector<float> host(static_cast<size_t>(t.numel()));
    for (float& v : host) v = scale * normal(rng);
    copy_from_host(t, host.data());
    return t;
  };
  const auto random = [&](Shape s, float scale) { return random_on(dev, s, scale); };
  const Tensor x = random({B, T, C}, 1.0f), dout = random({B, T, C}, 0.01f);
  std::vector<int32_t> ids(static_cast<size_t>(N));
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<int32_t>(i * 7919 % static_cast<size_t>(config.vocab_size));
  Tensor targets = dev.empty(DType::kI32, {B, T});
  copy_from_host(targets, ids.data());
  const ActivationPolicy policy{.precision = precision};
  Gpt selective(config, dev, GptRange{false, 0, 1, false}, B, T, {},
                ActivationPolicy{.recompute = Recompute::kSelective, .precision = precision});
  selective.init(1);
  Gpt head(config, dev, GptRange{false, config.n_layer, config.n_layer, true}, B, T, {}, policy);  // the optimizer's
  head.init(1);
  // The model's GEMMs (k -> n columns over N rows) at TP 1 and 2, and the attention core at both, in the precision
  // the model keeps their inputs in (bf16: q/k/v, the probabilities and the output too; gpt.h). The GEMMs also at
  // 4 times the micro-batch's rows: a plan may give a replica more rows than one micro-batch (pipelines folded onto
  // fewer replicas, larger micro-batches), and a GEMM's rate rises with its rows (on this CPU the head's by a quarter
  // from 1 to 4 sequences) — the elements' costs fit_matmul finds from them, and each shape's time over the fit's,
  // which the cost model interpolates (ChipType::matmul_corrections; measured: a slow-chip plan with 8 rows per
  // replica ran 0.83 of its prediction from one-row figures alone; docs/pipeline.md).
  struct Gemm {
    Tensor in, w, out, din, dw;
    double rows, k, n;
  };
  std::vector<Gemm> gemms;
  const int V = config.vocab_size;
  const auto operand = [&](Device& on, Shape s, float scale) {  // a product's input, in the precision they read
    const Tensor t = random_on(on, s, scale);
    if (precision == Precision::kF32) return t;
    Tensor low = on.empty(DType::kBF16, s);
    ops::convert(low, t);
    return low;
  };
  const auto make_gemm = [&](Device& on, int64_t rows, int k, int n) {
    return Gemm{.in = operand(on, {rows, k}, 1.0f),
                .w = operand(on, {n, k}, 0.02f),
                .out = on.empty(DType::kF32, {rows, n}),
                .din = on.empty(DType::kF32, {rows, k}),
                .dw = on.zeros(DType::kF32, {n, k}),
                .rows = static_cast<double>(rows),
                .k = static_cast<double>(k),
                .n = static_cast<double>(n)};
  };
  const auto shapes_at = [&](int tp) {  // (k, n) of the model's GEMMs at TP degree tp
    return std::vector<std::pair<int, int>>{
        {C, 3 * C / tp}, {C / tp, C}, {C, 4 * C / tp}, {4 * C / tp, C}, {C, V / tp}};
  };
  for (int tp : {1, 2}) {
    for (int64_t rows : {N, 4 * N}) {
      for (const auto& [k, n] : shapes_at(tp)) gemms.push_back(make_gemm(dev, rows, k, n));
    }
  }
  struct Attention {
    Tensor qkv, out, att, dqkv, dout;  // dqkv and dout f32: gradients
    int heads;
    double flops;  // forward: 2 B T^2 C / tp (Q K^T and P V over the causal half); the backward twice that
  };
  std::vector<Attention> attentions;
  const DType kept = precision == Precision::kBf16 ? DType::kBF16 : DType::kF32;
  for (int tp : {1, 2}) {
    attentions.push_back({operand(dev, {B, T, 3 * C / tp}, 1.0f), dev.empty(kept, {B, T, C / tp}),
                          dev.empty(kept, {B, NH / tp, T, T}), dev.empty(DType::kF32, {B, T, 3 * C / tp}),
                          random({B, T, C / tp}, 0.01f), NH / tp, 2.0 * N * T * C / tp});
  }
  Tensor tiny = dev.zeros(DType::kF32, {1});
  // The element-wise and row-wise kernels of a block and the head, in f32 (the cost model's kMemory ops, model/
  // costs.h): a block's two LayerNorms, two residuals, GELU, forward and backward, and the head's LayerNorm and
  // loss (fused with its gradient, in place). Their rate is the bytes the cost model counts for them over their time.
  const int64_t F = 4 * int64_t{C};
  const Tensor ln_w = random({C}, 1.0f), ln_b = random({C}, 0.1f), fch = random({N, F}, 1.0f);
  Tensor ln_out = dev.empty(DType::kF32, {N, C}), ln_mean = dev.empty(DType::kF32, {N}),
         ln_rstd = dev.empty(DType::kF32, {N}), ln_dx = dev.empty(DType::kF32, {N, C}),
         ln_dw = dev.zeros(DType::kF32, {C}), ln_db = dev.zeros(DType::kF32, {C}),
         gelu_out = dev.empty(DType::kF32, {N, F}), gelu_dx = dev.empty(DType::kF32, {N, F}),
         residual = dev.empty(DType::kF32, {N, C}), logits = random({N, V}, 1.0f), losses = dev.empty(DType::kF32, {N});
  const Tensor x2 = x.reshape({N, C}), dout2 = dout.reshape({N, C});
  const auto elementwise = [&] {
    for (int i = 0; i < 3; ++i) {  // the block's two and ln_f
      ops::layernorm_forward(ln_out, ln_mean, ln_rstd, x2, ln_w, ln_b);
      ops::layernorm_backward(ln_dx, ln_dw, ln_db, dout2, x2, ln_w, ln_mean, ln_rstd);
    }
    for (int i = 0; i < 4; ++i) ops::residual_forward(residual, x2, dout2);
    ops::gelu_forward(gelu_out, fch);
    ops::gelu_backward(gelu_dx, fch, gelu_out);
    ops::crossentropy_forward_backward(losses, logits, logits, targets.reshape({N}), 1.0f / static_cast<float>(N));
  };
  double elementwise_bytes = 0, elementwise_kernels = 0;
  for (bool backward : {false, true}) {
    for (const auto& list : {block_ops(shape, B, T, 1, 4, 4, backward), head_ops(shape, B, T, 1, 4, 4, backward)}) {
      for (const OpWork& op : list) {
        if (op.kind == OpClass::kMemory) elementwise_bytes += op.bytes, ++elementwise_kernels;
      }
    }
  }
  // The optimizer step as every trainer takes it (train/optimizer.h: norm, clipping, AdamW; in bf16 the refresh of
  // the weights' bf16 copy), over the head's parameters. The cost model charges it optimizer_traffic_bytes per
  // parameter of memory traffic (f32: 40, H2's bf16: 46), so the rate measured here is the memory bandwidth that
  // makes that formula true on this chip.
  const int64_t n = head.num_params();
  const OptimizerState state{dev.zeros(DType::kF32, {n}), dev.zeros(DType::kF32, {n})};
  Tensor acc = dev.zeros(DType::kF32, {1});
  const auto optimize = [&](Gpt& model, const OptimizerState& moments) {
    optimizer_step(model, moments, AdamwParams{}, acc, {.max_norm = 1e-6});
    model.refresh_bf16_weights();
  };
  // Each interval on its own (Device::start_interval): an emulated chip would otherwise give the next measurement
  // back what its last sleep overran, which made small kernels look up to twice as fast after large ones.
  const auto timed_on = [](Device& on, const std::function<void()>& fn) {
    on.start_interval();
    const double t0 = monotonic_seconds();
    fn();
    on.synchronize();
    return monotonic_seconds() - t0;
  };
  const auto timed = [&](const std::function<void()>& fn) { return timed_on(dev, fn); };
  constexpr int kTiny = 200;  // kernels per round of the overhead measurement
  // Rounds not kept before `rounds` timed ones: one, to warm up; none on an emulated chip paced to a reference when two
  // or more are timed (MeasureOptions).
  const auto warm_ups = [&](int rounds) { return spec.emu && reference != nullptr && rounds >= 2 ? 0 : 1; };
  // Rounds of every measurement until options.rounds are done after the warm-up and min_seconds have passed; the
  // least of each is the measurement.
  std::vector<double> overhead, attention_s, attention_forward_s, optim, elementwise_s;
  std::vector<std::vector<double>> gemm_s(gemms.size()), gemm_forward_s(gemms.size());
  const double start = monotonic_seconds();
  const int warm = warm_ups(options.rounds);
  for (int round = 0; round < warm + options.rounds || monotonic_seconds() - start < options.min_seconds; ++round) {
    const double o = timed([&] {
      for (int i = 0; i < kTiny; ++i) ops::scale(tiny, 1.0f);
    });
    std::vector<double> g, gf;  // per GEMM: forward and backward, the forward alone
    for (const Gemm& m : gemms) {
      gf.push_back(timed([&] { ops::matmul_forward(m.out, m.in, m.w, Tensor()); }));
      g.push_back(gf.back() + timed([&] { ops::matmul_backward(m.din, m.dw, Tensor(), m.out, m.in, m.w); }));
    }
    const double af = timed([&] {
      for (const Attention& m : attentions) ops::attention_forward(m.out, m.att, m.qkv, m.heads);
    });
    const double a = timed([&] {
      for (const Attention& m : attentions) ops::attention_backward(m.dqkv, m.dout, m.qkv, m.att, m.heads);
    });
    head.forward(x);  // gradients for the optimizer step to clip (a kernel over them all)
    head.loss(targets);
    head.backward();
    const double p = timed([&] { optimize(head, state); });
    const double e = timed(elementwise);
    options.progress();
    if (round < warm) continue;
    overhead.push_back(o / kTiny);
    for (size_t i = 0; i < g.size(); ++i) gemm_s[i].push_back(g[i]), gemm_forward_s[i].push_back(gf[i]);
    attention_s.push_back(a);
    attention_forward_s.push_back(af);
    optim.push_back(p);
    elementwise_s.push_back(e);
  }
  const auto least = [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); };
  ChipMeasurement m{.chip = chip, .speed = emulated_speed(cluster, chip)};
  m.kernel_overhead_s = least(overhead);
  // Times beyond the kernels' fixed costs (a forward and a backward kernel each; the backward runs two GEMMs), the
  // rate and elements' costs that explain them, and the forwards' share beside it: a forward runs s times the
  // pair's rate when the forwards take 1/(3 s) of the pairs' time.
  double all_seconds = 0, forward_seconds = 0;
  for (size_t i = 0; i < gemms.size(); ++i) {
    const Gemm& g = gemms[i];
    m.gemms.push_back({g.rows, g.k, g.n, std::max(1e-9, least(gemm_s[i]) - 2.0 * m.kernel_overhead_s)});
    all_seconds += m.gemms.back().seconds;
    forward_seconds += std::max(1e-9, least(gemm_forward_s[i]) - m.kernel_overhead_s);
  }
  const MatmulFit fit = fit_matmul(m.gemms);
  m.matmul_flops = fit.flops;
  m.matmul_element_s = fit.element_s;
  m.matmul_fit_error = fit.rms_error;
  m.matmul_forward_speedup = std::clamp(all_seconds / (3 * forward_seconds), 0.34, 3.0);
  double attention_flops = 0;
  for (const Attention& a : attentions) attention_flops += a.flops;
  const double fixed = static_cast<double>(attentions.size()) * m.kernel_overhead_s;
  m.attention_flops = 2 * attention_flops / std::max(1e-9, least(attention_s) - fixed);
  m.attention_forward_flops = attention_flops / std::max(1e-9, least(attention_forward_s) - fixed);
  const double traffic = CostConstants::of(precision, true).optimizer_traffic_bytes;  // as H2's runtime runs it
  m.memory_gbps = traffic * static_cast<double>(n) / least(optim) / 1e9;
  m.elementwise_gbps =
      elementwise_bytes / std::max(1e-9, least(elementwise_s) - elementwise_kernels * m.kernel_overhead_s) / 1e9;
  // Selective recomputation's cost as the model times it inside a selective block's backward (the least of
  // options.rounds, after the warm-up).
  std::vector<double> recompute;
  for (int round = 0; round < warm + options.rounds; ++round) {
    selective.forward(x);
    const double before = selective.recompute_seconds();
    selective.backward(dout);
    if (round >= warm) recompute.push_back(selective.recompute_seconds() - before);
    options.progress();
  }
  m.recompute_s = least(recompute);
  // The kernels a stage of this chip type runs at each TP degree the planner may give it, for their work only
  // (untimed, options.rounds + 1 times, as above), on each TP rank (the first adds the row-parallel biases;
  // vocabulary shards may be uneven): the embedding, a block and the head forward and backward (at TP 1 and the
  // micro-batch's rows the block's and the head's run timed below), then the optimizer step over each one's tensors as
  // training takes it (2026-12-05: a TP-2 head stage's optimizer, its kernels not listed, ran 3.3 times its
  // prediction, their least work learnt while the other ranks' optimizers streamed memory too). Their all-reduces
  // are left out: they launch no kernels. A reference lists them already (the measurement it came from ran them).
  const auto nothing = [](const Tensor&) {};
  const auto step = [&](Gpt& model) {
    const int64_t count = model.num_params();
    const OptimizerState moments{model.device().zeros(DType::kF32, {count}),
                                 model.device().zeros(DType::kF32, {count})};
    for (int round = 0; round <= options.rounds; ++round) optimize(model, moments);
  };
  const CostModel planning(cluster, shape, TrainSetup{.global_batch = micro_batch, .precision = precision});
  const std::vector<int> all_tps = tp_options(planning, cluster.chip_index(chip));
  const std::vector<int> tps = reference ? std::vector<int>{} : all_tps;
  const auto tokens_on = [&](Device& on, int rows) {
    Tensor tokens = on.empty(DType::kI32, {rows, T});
    std::vector<int32_t> token_ids(static_cast<size_t>(rows) * static_cast<size_t>(T));
    for (size_t i = 0; i < token_ids.size(); ++i) token_ids[i] = ids[i % ids.size()];
    copy_from_host(tokens, token_ids.data());
    return tokens;
  };
  const auto run_stage_kernels = [&](Device& on, int rows, bool optimizer) {
    const Tensor in = random_on(on, {rows, T, C}, 1.0f), grad = random_on(on, {rows, T, C}, 0.01f);
    const Tensor tokens = tokens_on(on, rows);
    for (const int tp : tps) {
      for (int rank = 0; rank < tp; ++rank) {
        const TensorParallel group{rank, tp, nothing, nothing};
        Gpt embedding(config, on, GptRange{true, 0, 0, false}, rows, T, group, policy);
        Gpt tp_block(config, on, GptRange{false, 0, 1, false}, rows, T, group, policy);
        Gpt tp_head(config, on, GptRange{false, config.n_layer, config.n_layer, true}, rows, T, group, policy);
        for (Gpt* part : {&embedding, &tp_block, &tp_head}) part->init(1);
        for (int round = 0; round <= options.rounds; ++round) {
          embedding.forward(tokens);
          embedding.backward(grad);
          if (tp == 1 && rows == B) continue;
          tp_block.forward(in);
          tp_block.backward(grad);
          tp_head.forward(in);
          tp_head.loss(tokens);
          tp_head.backward();
        }
        if (optimizer) {
          for (Gpt* part : {&embedding, &tp_block, &tp_head}) step(*part);
        }
        options.progress();
      }
    }
  };
  run_stage_kernels(dev, B, /*optimizer=*/true);
  // And at each multiple of the micro-batch by 2, 4, ... up to options.max_rows sequences: a replica may run more
  // rows than one micro-batch at once (larger micro-batches, pipelines folded onto fewer replicas). Their work does
  // not depend on the chip's speed, so an unpaced copy of the chip learns it (the chip itself when it runs unpaced
  // already, MeasureOptions::unpaced; the optimizer's does not depend on the rows). Without them listed, a run whose
  // replicas ran 4 or 8 rows paced its kernels by the host of the moment instead of the profile: 0.81-1.06 of its
  // simulation in four runs of bench/run_hetero.sh (2026-12-05).
  std::unique_ptr<Device> unpaced;
  if (spec.emu && !options.unpaced && options.max_rows >= 2 * B) {
    DeviceSpec at_host_speed = spec;
    unpace(*at_host_speed.emu);
    unpaced = create_device(at_host_speed);
  }
  if (spec.emu) {
    for (int rows = 2 * B; rows <= options.max_rows && !reference; rows *= 2) {
      run_stage_kernels(unpaced ? *unpaced : dev, rows, false);
    }
  }
  // The model's GEMMs at those rows too (but 4 times the micro-batch's, timed above), not fitted but kept for the
  // cost model's corrections (ChipType::matmul_corrections, which it otherwise holds beyond 4 times: on 2026-12-05 a
  // replica of 8 rows, its kernels paced as profiled, ran its forward in 0.75 of the time predicted from the
  // corrections at 1 and 4). An emulated chip's are timed on its unpaced copy, their time over its speed: what it
  // paces them to (options.rounds + 1 times, the least of all but the first).
  Device& at_host = unpaced ? *unpaced : dev;
  const double slowdown = unpaced ? 1.0 / spec.emu->speed : 1.0;
  for (int rows = 2 * B; rows <= options.max_rows; rows *= 2) {
    if (rows == 4 * B) continue;
    for (int tp : {1, 2}) {
      for (const auto& [k, n] : shapes_at(tp)) {
        const Gemm g = make_gemm(at_host, int64_t{rows} * T, k, n);
        std::vector<double> pair;
        for (int round = 0; round <= options.rounds; ++round) {
          const double t = timed_on(at_host, [&] {
            ops::matmul_forward(g.out, g.in, g.w, Tensor());
            ops::matmul_backward(g.din, g.dw, Tensor(), g.out, g.in, g.w);
          });
          if (round > 0) pair.push_back(t);
        }
        m.gemms.push_back({g.rows, g.k, g.n, std::max(1e-9, least(pair) * slowdown - 2.0 * m.kernel_overhead_s)});
        options.progress();
      }
    }
  }
  // A block and the head whole, forward and backward apart (a run's two actions; timed together, the forward's share
  // was the GEMMs' own, and a run's forwards came out 6-13% below their prediction on 2026-12-06), on each rank of a
  // TP group (no all-reduces: the cost model adds them apart) — the slowest's time in each direction, which the group
  // waits for at each all-reduce (2026-12-06: timed on the first rank alone, a fast
  // TP-2 head stage ran 1.10x its prediction, its second rank's kernels 13% more work, paced, than the first's, the
  // first waiting 35 ms a micro-batch for it inside the loss's all-reduces) —, at every TP degree the chip may run,
  // at the micro-batch's rows and at those the GEMMs were: what the cost model's composition of their kernels
  // misses, as a factor (ChipType::
  // part_corrections; on 2026-12-05 its composition put a slow chip's block at 1 sequence 13% above the block timed,
  // right at 8 sequences, and h2 calibrate's one factor per chip fitted at 1 then missed a run at 8 by 24%:
  // docs/pipeline.md). On the chip itself: an emulated one paced as training will pace them (timed unpaced, over its
  // speed, a slow chip's ran 4% above what the run then took), so only with the reference that lists their kernels
  // (without it, the chip is still learning their work), and after the warm-up one timed round (its pace does not
  // vary; the slow chip's head at 8 sequences takes 8 s).
  const auto time_parts = [&](int rows, int tp, int rounds) {
    const Tensor in = random({rows, T, C}, 1.0f), grad = random({rows, T, C}, 0.01f);
    const Tensor tokens = tokens_on(dev, rows);
    ChipMeasurement::PartTiming part{.tp = static_cast<double>(tp), .rows = static_cast<double>(rows) * T};
    std::array<double, 2> forwards{}, backwards{};  // block, head: the slowest rank's
    for (int rank = 0; rank < tp; ++rank) {
      const TensorParallel group{rank, tp, nothing, nothing};
      Gpt tp_block(config, dev, GptRange{false, 0, 1, false}, rows, T, group, policy);
      Gpt tp_head(config, dev, GptRange{false, config.n_layer, config.n_layer, true}, rows, T, group, policy);
      tp_block.init(1);
      tp_head.init(1);
      std::vector<double> block_f, block_b, head_f, head_b;
      const int warm_parts = warm_ups(rounds);
      for (int round = 0; round < warm_parts + rounds; ++round) {
        const double bf = timed([&] { tp_block.forward(in); });
        const double bb = timed([&] { tp_block.backward(grad); });
        const double hf = timed([&] {
          tp_head.forward(in);
          tp_head.loss(tokens);
        });
        const double hb = timed([&] { tp_head.backward(); });
        if (round >= warm_parts) {
          block_f.push_back(bf), block_b.push_back(bb), head_f.push_back(hf), head_b.push_back(hb);
        }
        options.progress();
      }
      forwards[0] = std::max(forwards[0], least(block_f));
      backwards[0] = std::max(backwards[0], least(block_b));
      forwards[1] = std::max(forwards[1], least(head_f));
      backwards[1] = std::max(backwards[1], least(head_b));
    }
    part.block_forward_s = forwards[0];
    part.block_backward_s = backwards[0];
    part.head_forward_s = forwards[1];
    part.head_backward_s = backwards[1];
    m.parts.push_back(part);
  };
  for (const int tp : all_tps) time_parts(B, tp, options.rounds);
  for (int rows = 2 * B; rows <= options.max_rows && (!spec.emu || reference); rows *= 2) {
    for (const int tp : all_tps) time_parts(rows, tp, spec.emu ? 1 : options.rounds);
  }
  dev.synchronize();
  m.kernel_work = emu_least_work(dev);
  if (unpaced) m.kernel_work.merge(emu_least_work(*unpaced));  // the paced chip's least work where both ran a key
  if (reference) {
    for (const auto& [key, seconds] : *reference) m.kernel_work[key] = seconds;
  }
  return m;
}

std::vector<double> measurement_figures(const ChipMeasurement& m) {
  std::vector<double> f = {m.kernel_overhead_s,
                           m.matmul_flops,
                           m.attention_flops,
                           m.memory_gbps,
                           static_cast<double>(m.parts.size()),
                           m.recompute_s,
                           m.attention_forward_flops,
                           m.matmul_forward_speedup,
                           m.matmul_element_s[0],
                           m.matmul_element_s[1],
                           m.matmul_element_s[2],
                           m.matmul_fit_error,
                           m.elementwise_gbps};
  for (const ChipMeasurement::PartTiming& p : m.parts) {
    f.insert(f.end(), {p.tp, p.rows, p.block_forward_s, p.block_backward_s, p.head_forward_s, p.head_backward_s});
  }
  for (const GemmTiming& g : m.gemms) f.insert(f.end(), {g.rows, g.k, g.n, g.seconds});
  return f;
}

ChipMeasurement measurement_of(const std::vector<double>& f) {
  ChipMeasurement m{.kernel_overhead_s = f[0],
                    .matmul_flops = f[1],
                    .matmul_element_s = {f[8], f[9], f[10]},
                    .matmul_fit_error = f[11],
                    .attention_flops = f[2],
                    .attention_forward_flops = f[6],
                    .memory_gbps = f[3],
                    .recompute_s = f[5],
                    .matmul_forward_speedup = f[7],
                    .elementwise_gbps = f[12]};
  size_t i = std::size(kMeasurementFigures);
  for (size_t p = 0; p < static_cast<size_t>(f[4]) && i + 5 < f.size(); ++p, i += 6)
    m.parts.push_back({f[i], f[i + 1], f[i + 2], f[i + 3], f[i + 4], f[i + 5]});
  for (; i + 3 < f.size(); i += 4) m.gemms.push_back({f[i], f[i + 1], f[i + 2], f[i + 3]});
  return m;
}

MatmulFit fit_matmul(const std::vector<GemmTiming>& gemms) {
  MatmulFit fit;
  double flops = 0, seconds = 0;
  for (const GemmTiming& g : gemms) flops += 6 * g.rows * g.k * g.n, seconds += g.seconds;
  fit.flops = seconds > 0 ? flops / seconds : 0;
  // Unknowns: 1 / rate and the three costs; each GEMM's equation divided by its time (relative error), each column
  // scaled to unit norm before the normal equations are solved (the FLOPs' column is ~1e5 times the others').
  const auto features = [](const GemmTiming& g) {
    return std::array<double, 4>{6 * g.rows * g.k * g.n, 3 * g.rows * g.k, 3 * g.k * g.n, 3 * g.rows * g.n};
  };
  std::array<bool, 4> used = {true, true, true, true};
  std::array<double, 4> x{};
  while (gemms.size() >= 4) {
    std::vector<int> cols;
    for (int j = 0; j < 4; ++j) {
      if (used[static_cast<size_t>(j)]) cols.push_back(j);
    }
    const size_t n = cols.size();
    std::vector<double> norm(n, 0.0);
    for (const GemmTiming& g : gemms) {
      const std::array<double, 4> f = features(g);
      for (size_t a = 0; a < n; ++a) norm[a] += std::pow(f[static_cast<size_t>(cols[a])] / g.seconds, 2);
    }
    for (double& v : norm) v = v > 0 ? std::sqrt(v) : 1.0;
    // Normal equations [A^T A | A^T 1], solved by Gaussian elimination with partial pivoting.
    std::vector<std::vector<double>> m(n, std::vector<double>(n + 1, 0.0));
    for (const GemmTiming& g : gemms) {
      const std::array<double, 4> f = features(g);
      for (size_t a = 0; a < n; ++a) {
        const double fa = f[static_cast<size_t>(cols[a])] / g.seconds / norm[a];
        for (size_t b = 0; b < n; ++b) m[a][b] += fa * f[static_cast<size_t>(cols[b])] / g.seconds / norm[b];
        m[a][n] += fa;
      }
    }
    bool singular = false;
    for (size_t c = 0; c < n && !singular; ++c) {
      size_t pivot = c;
      for (size_t r = c + 1; r < n; ++r) {
        if (std::abs(m[r][c]) > std::abs(m[pivot][c])) pivot = r;
      }
      std::swap(m[c], m[pivot]);
      if (std::abs(m[c][c]) < 1e-12) singular = true;
      for (size_t r = 0; r < n && !singular; ++r) {
        if (r == c) continue;
        const double k = m[r][c] / m[c][c];
        for (size_t j = c; j <= n; ++j) m[r][j] -= k * m[c][j];
      }
    }
    if (singular) break;
    x = {};
    for (size_t a = 0; a < n; ++a) x[static_cast<size_t>(cols[a])] = m[a][n] / m[a][a] / norm[a];
    if (x[0] <= 0) break;  // no positive rate: keep the rate of all of them together
    // The most negative cost leaves the fit; the others are fitted again.
    int worst = 0;
    for (int j = 1; j < 4; ++j) {
      if (used[static_cast<size_t>(j)] && x[static_cast<size_t>(j)] < std::min(0.0, x[static_cast<size_t>(worst)]))
        worst = j;
    }
    if (worst == 0) {
      fit.flops = 1 / x[0];
      fit.element_s = {x[1], x[2], x[3]};
      break;
    }
    used[static_cast<size_t>(worst)] = false;
  }
  double squares = 0;
  for (const GemmTiming& g : gemms) {
    const std::array<double, 4> f = features(g);
    const double predicted =
        f[0] / fit.flops + f[1] * fit.element_s[0] + f[2] * fit.element_s[1] + f[3] * fit.element_s[2];
    squares += std::pow(predicted / g.seconds - 1, 2);
  }
  fit.rms_error = gemms.empty() ? 0 : std::sqrt(squares / static_cast<double>(gemms.size()));
  return fit;
}

double latency_under_load_s(const std::vector<double>& alone_with) {
  double sum = 0;
  int pairs = 0;
  for (size_t r = 0; r + 3 < alone_with.size(); r += 4) {
    const double slower = std::max(alone_with[r], alone_with[r + 2]);
    sum += std::max(0.0, std::max(alone_with[r + 1], alone_with[r + 3]) - slower) / 2;
    ++pairs;
  }
  return pairs > 0 ? sum / pairs : 0;
}

LinkMeasurement measure_link(Communicator& world, const Cluster& cluster, const std::string& chip,
                             const TransformerShape& shape, int micro_batch) {
  float result[3] = {0, 0, 0};  // bandwidth GB/s, latency under load us, latency on an idle host us
  // Latency on an idle host: ranks 0 and 1 exchange 8 bytes while the others wait.
  if (world.rank() < 2 && world.size() >= 2) {
    const int peer = 1 - world.rank();
    std::vector<char> out(8), in(8);
    result[2] = static_cast<float>(1e6 * median_seconds(50, [&] {
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
  // Latency under load, as a tensor-parallel block meets it: every rank runs a GEMM of a TP-2 block's size on its
  // chip, alone and then followed by an 8-byte all-reduce with its pair, all ranks at once. With more processes than
  // cores, a rank that has finished waits for its partner to get a core back — on this host's 2 cores and 16
  // emulated chips 1.3-2.6 ms an all-reduce, against 2-23 us idle (bench/run_emulated.sh's 16-device cluster: its
  // simulated step was 19% short with the idle figure; docs/pipeline.md).
  {
    DeviceSpec spec = device_spec_of(cluster, chip, 0);
    if (spec.emu) spec.emu->announce = false;
    auto device = create_device(spec);
    const int64_t rows = int64_t{micro_batch} * shape.seq_len, C = shape.hidden;
    const Tensor in = device->zeros(DType::kF32, {rows, C}), w = device->zeros(DType::kF32, {2 * C, C});
    const Tensor out = device->empty(DType::kF32, {rows, 2 * C});
    const auto gemm = [&] {
      ops::matmul_forward(out, in, w, Tensor());
      device->synchronize();
    };
    gemm();
    float flag = 1;
    world.barrier();
    const double alone = median_seconds(20, gemm);
    world.barrier();
    const double with = median_seconds(20, [&] {
      gemm();
      if (pair.size() == 2) pair.all_reduce(&flag, 1, DType::kF32, ReduceOp::kSum);
    });
    const float mine[2] = {static_cast<float>(alone), static_cast<float>(with)};
    std::vector<float> all(2 * static_cast<size_t>(world.size()));
    world.all_gather(all.data(), mine, 2, DType::kF32);
    result[1] = static_cast<float>(1e6 * latency_under_load_s(std::vector<double>(all.begin(), all.end())));
  }
  world.broadcast(result, 3, DType::kF32, 0);
  return LinkMeasurement{result[0], std::max(result[1], result[2]), result[2]};
}

Cluster profiled_cluster(const Cluster& cluster, const std::vector<ChipMeasurement>& chips, const LinkMeasurement& link,
                         const TransformerShape& shape, Precision precision) {
  Cluster out = cluster.with_emulation_kept();
  out.name = cluster.name + "-profiled";
  out.figures = Figures::kProfiled;
  for (const ChipMeasurement& m : chips) {
    ChipType& t = out.chips[static_cast<size_t>(out.chip_index(m.chip))];
    t.kernel_work = m.kernel_work;
    // The GEMM rate measured in the profiled precision stands for the peak in both, reached in full beyond the
    // elements' costs.
    t.peak_tflops = t.peak_tflops_f32 = m.matmul_flops / 1e12;
    t.efficiency = 1.0;
    for (size_t i = 0; i < 3; ++i) t.matmul_element_ns[i] = m.matmul_element_s[i] * 1e9;
    t.matmul_forward_speedup = m.matmul_forward_speedup;
    t.matmul_corrections.clear();  // against the rate above, which both precisions now share
    for (const GemmTiming& g : m.gemms) {
      t.matmul_corrections.push_back({g.rows, g.k, g.n, g.seconds / t.gemm_pair_s(g.rows, g.k, g.n, false)});
    }
    t.attention_efficiency = std::min(1.0, m.attention_flops / (t.peak_tflops * 1e12));
    t.attention_forward_efficiency = std::min(1.0, m.attention_forward_flops / (t.peak_tflops * 1e12));
    t.memory_bandwidth_gbps = m.memory_gbps;
    t.memory_efficiency = 1.0;
    t.elementwise_gbps = m.elementwise_gbps;
    t.kernel_overhead_us = m.kernel_overhead_s * 1e6;
    t.run_kernel_us = 0;         // a run's, which h2 calibrate fits on top of this profile
    t.part_corrections.clear();  // set below, against the figures above
  }
  // Each part timed over its kernels as the cost model composes them from those figures (the parts' all-reduces
  // were not timed: ops_s leaves them out).
  const CostModel composing(out, shape, TrainSetup{.precision = precision, .h2_runtime = true});
  for (const ChipMeasurement& m : chips) {
    const int k = out.chip_index(m.chip);
    std::vector<ChipType::PartCorrection> corrections;
    for (const ChipMeasurement::PartTiming& p : m.parts) {
      const ComposedParts c = composed_parts(composing, k, p);
      corrections.push_back({p.tp, p.rows, p.block_forward_s / c.block_forward, p.block_backward_s / c.block_backward,
                             p.head_forward_s / c.head_forward, p.head_backward_s / c.head_backward});
    }
    std::sort(corrections.begin(), corrections.end(), [](const auto& a, const auto& b) {
      return std::pair{a.tp, a.rows} < std::pair{b.tp, b.rows};
    });
    out.chips[static_cast<size_t>(k)].part_corrections = std::move(corrections);
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
constexpr int kMaxRanks = 16;
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

std::vector<int> measuring_turns(const std::vector<std::string>& rank_chips, int passes) {
  std::vector<int> turns;
  for (int pass = 0; pass < passes; ++pass) {
    for (size_t r = 0; r < rank_chips.size(); ++r) {
      if (std::find(rank_chips.begin(), rank_chips.begin() + static_cast<std::ptrdiff_t>(r), rank_chips[r]) ==
          rank_chips.begin() + static_cast<std::ptrdiff_t>(r)) {
        turns.push_back(static_cast<int>(r));
      }
    }
  }
  return turns;
}

void take_turns(Communicator& world, const std::vector<int>& turns,
                const std::function<void(const std::function<void()>& progress)>& measure,
                std::chrono::milliseconds silence) {
  constexpr uint32_t kTag = 1;
  constexpr char kAtWork = 0, kDone = 1;
  const int me = world.rank();
  const auto tell_all = [&](char word) {
    for (int other = 0; other < world.size(); ++other) {
      if (other == me) continue;
      std::unique_ptr<Request> s = world.isend(&word, 1, other, kTag);
      world.wait_request(*s, "h2 profile: telling the others how its measurement goes", other);
    }
  };
  const double silence_s = std::chrono::duration<double>(silence).count(), every = silence_s / 10;
  for (size_t t = 0; t < turns.size(); ++t) {
    const int turn = turns[t];
    if (turn == me) {
      double told = monotonic_seconds();
      measure([&] {
        if (monotonic_seconds() - told < every) return;
        tell_all(kAtWork);
        told = monotonic_seconds();
      });
      tell_all(kDone);
      continue;
    }
    // The words of one rank arrive in the order sent (comm/transport/transport.h): its last is kDone.
    for (char word = kAtWork; word != kDone;) {
      const auto heard = std::chrono::steady_clock::now();
      std::unique_ptr<Request> r = world.irecv(&word, 1, turn, kTag);
      while (!r->test()) {
        if (std::chrono::steady_clock::now() - heard > silence) {
          throw Error(ErrorCode::kInternal,
                      cat("h2 profile: rank ", me, " heard nothing for ", format_seconds(silence_s), " from rank ",
                          turn, ", which measures its chip (turn ", t + 1, " of ", turns.size(),
                          "); is it stuck? (see its output above)"));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
  }
}

// One chip type at a time, on its first rank, while every other rank sleeps: the training ranks' emulated chips
// count a kernel's work as the least its shapes have done (device/emu/device.h), which is what it does without
// other ranks in the host's caches — what a rank measures alone. Then the link, every rank at once; rank 0 writes
// what the measuring ranks found.
void profile_rank(const std::string& cluster_file, const TransformerShape& shape, int micro_batch, int max_rows,
                  Precision precision, const std::string& out) {
  const Cluster cluster = load_cluster_arg(cluster_file);
  const std::vector<std::string> chips = rank_chips(cluster);
  auto job = join_job(job_env());
  Communicator& world = *job->world;
  omp_set_num_threads(threads_per_rank(cluster));
  world.barrier();
  const int me = world.rank();
  // The measuring ranks, in order, twice, each telling the others how it goes (take_turns). The first pass
  // finds each kernel's least work on this host, the chip unpaced (its times are not kept: two rounds, the first to
  // warm up; paced, as until 2026-12-07, it took 134 of the built-in example's 283 s on an AVX2-only host); the
  // second measures with the chip paced to it, as training will pace (the profiled cluster's kernel_work), and is
  // the one kept (two timed rounds and, paced, none to warm up: its rounds differ only by what the host adds;
  // measured 2026-12-05, the three timed rounds of the old four within 3.5% of each other but for one attention core
  // at twice its time).
  // (Before, each chip type kept the faster of two passes paced by their own least work: one profile in four put the
  // fast chips' block 35% slower than the others, and a run the host slowed since its profile ran up to 9% slower than
  // its simulation; docs/pipeline.md.)
  // Each turn says when it starts and how long it took (minutes on a slow host, where nothing else would show).
  ChipMeasurement m;
  bool measured = false;
  const std::string& chip = chips[static_cast<size_t>(me)];
  take_turns(
      world, measuring_turns(chips, /*passes=*/2),
      [&](const std::function<void()>& progress) {
        struct Pass {
          const char* label;
          MeasureOptions options;
        };
        const Pass pass =
            measured
                ? Pass{"pass 2 of 2, timed as training paces its kernels",
                       {.rounds = 2,
                        .min_seconds = 1.0,
                        .reference = &m.kernel_work,
                        .max_rows = max_rows,
                        .progress = progress}}
                : Pass{"pass 1 of 2, learning its kernels' work",
                       {.rounds = 1, .min_seconds = 2.0, .unpaced = true, .max_rows = max_rows, .progress = progress}};
        std::printf("h2 profile: rank %d measures chip type '%s' (%s)\n", me, chip.c_str(), pass.label);
        std::fflush(stdout);
        const double start = monotonic_seconds();
        m = measure_chip(cluster, chip, shape, micro_batch, precision, pass.options);
        std::printf("h2 profile: rank %d measured '%s' (%s) in %s\n", me, chip.c_str(), pass.label,
                    format_seconds(monotonic_seconds() - start).c_str());
        std::fflush(stdout);
        measured = true;
      },
      std::chrono::minutes(10));
  world.barrier();
  if (me == 0) {
    std::printf("h2 profile: the links, every rank at once\n");
    std::fflush(stdout);
  }
  const LinkMeasurement link = measure_link(world, cluster, chip, shape, micro_batch);
  const std::vector<double> figures = measurement_figures(m);
  const std::vector<KernelWork> work = gather_kernel_work(world, m.kernel_work);
  std::vector<float> mine(figures.begin(), figures.end());
  // Every measuring rank has as many figures as rank 0 (the first to measure); the others send as many zeros.
  float count = static_cast<float>(mine.size());
  world.broadcast(&count, 1, DType::kF32, 0);
  mine.resize(static_cast<size_t>(count), 0.0f);
  std::vector<float> all(mine.size() * static_cast<size_t>(world.size()));
  world.all_gather(all.data(), mine.data(), mine.size(), DType::kF32);
  if (world.rank() == 0) {
    nlohmann::json ranks = nlohmann::json::array();
    for (const int r : measuring_turns(chips, /*passes=*/1)) {
      std::vector<double> figures(all.begin() + static_cast<long>(static_cast<size_t>(r) * mine.size()),
                                  all.begin() + static_cast<long>((static_cast<size_t>(r) + 1) * mine.size()));
      nlohmann::json kernel_work = nlohmann::json::array();
      for (const auto& [key, seconds] : work[static_cast<size_t>(r)]) kernel_work.push_back({key, seconds});
      ranks.push_back({{"chip", chips[static_cast<size_t>(r)]}, {"figures", figures}, {"kernel_work", kernel_work}});
    }
    write_file_atomic(out, nlohmann::json{{"bandwidth_gbps", link.bandwidth_gbps},
                                          {"latency_us", link.latency_us},
                                          {"idle_latency_us", link.idle_latency_us},
                                          {"ranks", ranks}}
                               .dump());
  }
  world.barrier();
}

int profile_cluster(const ProfileJob& job) {
  const std::string &cluster_file = job.cluster_file, &model_label = job.model_label, &out = job.out;
  const TransformerShape& shape = job.shape;
  const int micro_batch = job.micro_batch;
  const Cluster cluster = load_cluster_arg(cluster_file);
  const std::vector<std::string> ranks = rank_chips(cluster);
  std::printf(
      "profiling %zu chip type(s) of %s at the shapes of %s, micro-batch %d, %s: one chip type at a time, on the "
      "first of %zu processes (one per device) that has it, %d thread(s) each\n",
      cluster.chips.size(), cluster_file.c_str(), model_label.c_str(), micro_batch, precision_name(job.precision),
      ranks.size(), threads_per_rank(cluster));
  std::string emulated;
  for (const ChipType& c : cluster.chips) {
    if (c.backend == "emu")
      emulated += cat(emulated.empty() ? "" : ", ", c.name, " ", emu_profile_of(cluster, c.name).speed, "x");
  }
  if (!emulated.empty()) {
    std::printf(
        "emulated on this host's CPU, their timings following this profile, not real hardware: %s the host "
        "(the first pass learns their kernels' work at the host's speed)\n",
        emulated.c_str());
  }
  std::fflush(stdout);  // before the ranks' lines
  // The ranks read the shape from a model file (the job's may come from a training config) and write raw results.
  const std::string part = out + ".ranks.json", model_file = out + ".model.yaml";
  write_file_atomic(model_file, cat("name: measured\nlayers: ", shape.layers, "\nhidden: ", shape.hidden,
                                    "\nheads: ", shape.heads, "\nkv_heads: ", shape.kv_heads, "\nffn: ", shape.ffn,
                                    "\nvocab: ", shape.vocab, "\nseq_len: ", shape.seq_len, "\n"));
  LaunchOptions options;
  options.ranks = std::max<int>(2, static_cast<int>(ranks.size()));
  const LaunchResult r =
      launch(job.rank_command(cluster_file, model_file, micro_batch, job.max_rows, job.precision, part), options);
  std::filesystem::remove(model_file);
  if (r.exit_code != 0) std::filesystem::remove(part);
  if (r.stopped_by != 0) {
    std::printf("h2 profile: stopped before the measurement was done; %s not written\n", out.c_str());
    return r.exit_code;
  }
  if (r.exit_code != 0) throw Error(ErrorCode::kInternal, cat("the measurement failed: ", r.message));
  const nlohmann::json j = nlohmann::json::parse(read_file(part));
  std::filesystem::remove(part);
  // Each chip type: the mean over its ranks; the kernel work of each, the least.
  std::vector<ChipMeasurement> chips;
  for (const ChipType& t : cluster.chips) {
    std::vector<double> sum;
    KernelWork work;
    int n = 0;
    for (const auto& x : j["ranks"]) {
      if (x["chip"] != t.name) continue;
      const std::vector<double> figures = x["figures"].get<std::vector<double>>();
      sum.resize(figures.size(), 0.0);
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += figures[i];
      for (const auto& entry : x["kernel_work"]) {
        const auto [at, first] = work.try_emplace(entry[0].get<uint64_t>(), entry[1].get<double>());
        if (!first) at->second = std::min(at->second, entry[1].get<double>());
      }
      ++n;
    }
    if (n == 0) continue;
    for (double& v : sum) v /= n;
    ChipMeasurement m = measurement_of(sum);
    m.chip = t.name;
    m.speed = emulated_speed(cluster, t.name);
    m.kernel_work = std::move(work);
    chips.push_back(m);
  }

  const LinkMeasurement link{j["bandwidth_gbps"].get<double>(), j["latency_us"].get<double>(),
                             j["idle_latency_us"].get<double>()};
  const Cluster profiled = profiled_cluster(cluster, chips, link, shape, job.precision);
  // The figures, and a block's, the head's and selective recomputation's time measured beside what the cost model
  // composes for their kernels from them (before the part corrections, which make up the difference); then each
  // part's correction at every TP degree and rows timed.
  const CostModel costs(profiled, shape,
                        TrainSetup{.global_batch = micro_batch, .precision = job.precision, .h2_runtime = true});
  std::printf("%-10s %6s %9s %10s %7s %10s %9s %9s %20s %20s %23s\n", "chip", "speed", "kernel us", "GEMM GF/s",
              "fwd x", "attn GF/s", "mem GB/s", "elem GB/s", "block ms (composed)", "head ms (composed)",
              "recompute ms (predicted)");
  for (const ChipMeasurement& m : chips) {
    const int k = profiled.chip_index(m.chip);
    const ChipMeasurement::PartTiming& first = m.parts.front();  // TP 1, the micro-batch's rows
    const ComposedParts c = composed_parts(costs, k, first);
    const double block = c.block(), head = c.head();
    const double none = costs.layer_backward_s(k, 1, micro_batch, Recompute::kNone);
    const double recompute = costs.layer_backward_s(k, 1, micro_batch, Recompute::kSelective) - none;
    std::printf("%-10s %6.2f %9.1f %10.2f %7.2f %10.2f %9.2f %9.2f %9.2f (%8.2f) %9.2f (%8.2f) %11.2f (%9.2f)\n",
                m.chip.c_str(), m.speed, m.kernel_overhead_s * 1e6, m.matmul_flops / 1e9, m.matmul_forward_speedup,
                m.attention_flops / 1e9, m.memory_gbps, m.elementwise_gbps, first.block_s() * 1e3, block * 1e3,
                first.head_s() * 1e3, head * 1e3, m.recompute_s * 1e3, recompute * 1e3);
  }
  for (const ChipType& t : profiled.chips) {
    if (t.part_corrections.empty()) continue;
    std::string line = t.name + " block, head measured / composed (forward/backward):";
    for (const ChipType::PartCorrection& p : t.part_corrections) {
      line += format(" TP %.0f at %.0f rows %.2f/%.2f, %.2f/%.2f;", p.tp, p.rows, p.block_forward, p.block_backward,
                     p.head_forward, p.head_backward);
    }
    line.back() = '\n';
    std::fputs(line.c_str(), stdout);
  }
  for (const ChipMeasurement& m : chips) {
    std::printf(
        "%-10s GEMM: %.2f GF/s beyond %.3f, %.3f, %.3f ns per element of input, weight, output (fitted to the "
        "GEMMs at %d and %d rows within %.1f%% rms; %zu GEMMs timed in all)\n",
        m.chip.c_str(), m.matmul_flops / 1e9, m.matmul_element_s[0] * 1e9, m.matmul_element_s[1] * 1e9,
        m.matmul_element_s[2] * 1e9, static_cast<int>(micro_batch * shape.seq_len),
        static_cast<int>(4 * micro_batch * shape.seq_len), 100 * m.matmul_fit_error, m.gemms.size());
  }
  std::printf(
      "link (DiComm over UCX, %d processes, pairs all-reducing at once): %.2f GB/s, %.1f us a message while every "
      "rank computes (%.1f us on an idle host)\n",
      options.ranks, link.bandwidth_gbps, link.latency_us, link.idle_latency_us);
  write_file_atomic(out, "# Measured by h2 profile from " + cluster_file + " at the shapes of " + model_label +
                             ", in " + precision_name(job.precision) + "\n" + cluster_to_yaml(profiled));
  return 0;
}

}  // namespace h2
