// The single-device training loop.
#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <numbers>
#include <sstream>

#include "core/clock.h"
#include "core/error.h"
#include "core/file.h"
#include "core/format.h"
#include "core/log.h"
#include "model/dataset.h"
#include "ops/ops.h"
#include "train/checkpoint.h"

namespace h2 {
namespace fs = std::filesystem;
namespace {

std::string format_duration(double seconds) {
  const auto s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%lldm%02llds", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  }
  return buf;
}

}  // namespace

std::ofstream open_metrics(const std::string& path, int64_t keep_up_to_step) {
  if (fs::exists(path)) {
    std::istringstream in(read_file(path));
    std::string line, kept;
    while (std::getline(in, line)) {
      try {
        if (nlohmann::json::parse(line).at("step").get<int64_t>() <= keep_up_to_step) kept += line + "\n";
      } catch (const nlohmann::json::exception&) {
        // A torn last line from a crash: drop it.
      }
    }
    write_file_atomic(path, kept);
  }
  std::ofstream out(path, std::ios::app);
  if (!out) throw Error(ErrorCode::kIo, cat(path, ": cannot open the metrics file for appending"));
  return out;
}

TrainConfig TrainConfig::from_config(const ConfigNode& root) {
  root.allow_only({"model", "data", "optim", "train", "device"});
  TrainConfig c;
  c.model = GptConfig::from_config(root.at("model"));
  const ConfigNode data = root.at("data");
  data.allow_only({"train", "val"});
  c.train_data = data.get<std::string>("train");
  c.val_data = data.get<std::string>("val", "");
  if (auto optim = root.find("optim")) {
    optim->allow_only({"lr", "min_lr", "warmup_steps", "weight_decay", "beta1", "beta2", "eps", "grad_clip"});
    c.lr = optim->number_in("lr", c.lr, 1e-12, 100);
    c.min_lr = optim->number_in("min_lr", c.min_lr, 0, c.lr);
    c.warmup_steps = optim->int_in("warmup_steps", c.warmup_steps, 0, int64_t{1} << 40);
    c.weight_decay = optim->number_in("weight_decay", c.weight_decay, 0, 100);
    c.beta1 = optim->number_in("beta1", c.beta1, 0, 0.999999);
    c.beta2 = optim->number_in("beta2", c.beta2, 0, 0.999999999);
    c.eps = optim->number_in("eps", c.eps, 1e-30, 1);
    c.grad_clip = optim->number_in("grad_clip", c.grad_clip, 0, 1e30);  // 0 = no clipping
  }
  const ConfigNode train = root.at("train");
  train.allow_only({"batch_size", "seq_len", "precision", "steps", "seed", "log_every", "eval_every", "eval_batches",
                    "checkpoint_every", "keep_checkpoints", "out_dir"});
  // Every count within what one host could run, so nothing wraps into the narrower types it is stored in.
  constexpr int64_t kMost = int64_t{1} << 40;
  c.batch_size = static_cast<int>(train.int_in("batch_size", c.batch_size, 1, 1 << 20));
  c.seq_len = static_cast<int>(train.int_in("seq_len", c.model.seq_len, 1, c.model.seq_len));
  if (train.has("precision")) {
    const auto p = parse_precision(train.get<std::string>("precision"));
    if (!p) train.at("precision").fail("must be bf16 or f32");
    c.precision = *p;
  }
  c.steps = train.int_in("steps", c.steps, 1, kMost);
  c.seed =
      static_cast<uint64_t>(train.int_in("seed", static_cast<int64_t>(c.seed), 0, std::numeric_limits<int64_t>::max()));
  c.log_every = train.int_in("log_every", c.log_every, 1, kMost);
  c.eval_every = train.int_in("eval_every", c.eval_every, 0, kMost);
  c.eval_batches = static_cast<int>(train.int_in("eval_batches", c.eval_batches, 1, 1 << 20));
  c.checkpoint_every = train.int_in("checkpoint_every", c.checkpoint_every, 0, kMost);
  c.keep_checkpoints = static_cast<int>(train.int_in("keep_checkpoints", c.keep_checkpoints, 0, 1 << 20));
  c.out_dir = train.get<std::string>("out_dir", c.out_dir);
  if (auto device = root.find("device")) {
    device->allow_only({"backend", "chips", "chip", "memory_mib"});
    c.device.backend = device->get<std::string>("backend", "cpu");
    if (device->has("chips")) {
      const std::string chips = device->get<std::string>("chips");
      const auto profiles = load_emu_profiles(ConfigNode::load_file(chips));
      c.device.emu =
          device->has("chip") ? find_emu_profile(profiles, device->get<std::string>("chip"), chips) : profiles.front();
    }
    if (device->has("memory_mib")) {
      c.device.mem_capacity_bytes = static_cast<size_t>(device->int_in("memory_mib", 0, 1, int64_t{1} << 30)) << 20;
    }
  }
  return c;
}

double learning_rate(const TrainConfig& c, int64_t step) {
  if (step < c.warmup_steps) return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup_steps);
  const double span = static_cast<double>(std::max<int64_t>(1, c.steps - c.warmup_steps));
  const double progress = std::min(1.0, static_cast<double>(step - c.warmup_steps) / span);
  return c.min_lr + 0.5 * (c.lr - c.min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
}

AdamwParams adamw_params(const TrainConfig& c, int64_t step) {
  return AdamwParams{.lr = static_cast<float>(learning_rate(c, step)),
                     .beta1 = static_cast<float>(c.beta1),
                     .beta2 = static_cast<float>(c.beta2),
                     .eps = static_cast<float>(c.eps),
                     .weight_decay = static_cast<float>(c.weight_decay),
                     .step = step + 1};
}

double planned_memory_bytes(const TrainConfig& c) {
  return stage_memory({.shape = c.model.shape(),
                       .embedding = true,
                       .head = true,
                       .layers = c.model.n_layer,
                       .rows = c.batch_size,
                       .seq = c.seq_len,
                       .bytes = ElementBytes::of(c.precision)})
      .total();
}

TrainResult train(const TrainConfig& c, const TrainOptions& options) {
  auto device = create_device(c.device);
  Gpt model(c.model, *device, GptRange::whole(c.model), c.batch_size, c.seq_len, {},
            ActivationPolicy{.precision = c.precision});
  OptimizerState optimizer{device->zeros(DType::kF32, {model.num_params()}),
                           device->zeros(DType::kF32, {model.num_params()})};
  TokenLoader train_loader(expand_glob(c.train_data), c.batch_size, c.seq_len, c.seed, true);
  std::unique_ptr<TokenLoader> val_loader;
  if (!c.val_data.empty()) {
    val_loader = std::make_unique<TokenLoader>(expand_glob(c.val_data), c.batch_size, c.seq_len, c.seed, false);
  }
  const std::string checkpoint_dir = (fs::path(c.out_dir) / "checkpoints").string();
  make_directory(c.out_dir, "train.out_dir");

  int64_t step = 0;
  std::string from;  // the checkpoint resumed from, which retention keeps
  if (options.resume || !options.resume_from.empty()) {
    std::vector<std::string> skipped;
    from = options.resume_from.empty() ? resume_checkpoint(checkpoint_dir, &skipped) : options.resume_from;
    for (const std::string& s : skipped) log_warn("not resuming from ", s);
    const CheckpointState state = read_checkpoint_state(from);
    check_checkpoint_model(state, c.model, from);
    if (state.data_seed != c.seed) {
      log_warn("resuming with seed ", c.seed, " but the checkpoint's data order used seed ", state.data_seed);
    }
    if (state.precision != c.precision) {
      log_warn("resuming in ", precision_name(c.precision), " a run that computed in ", precision_name(state.precision),
               " (its f32 master weights carry over; the loss curve will not be the one an uninterrupted run follows)");
    }
    load_checkpoint(from, model, &optimizer);
    train_loader.seek(state.data);
    step = state.step;
    log_info("resumed from ", from, " at step ", step);
  } else {
    model.init(c.seed);
  }
  if (step >= c.steps) {
    log_info("nothing to do: the run is at step ", step, " of ", c.steps);
    return TrainResult{.steps_done = step};
  }
  std::ofstream metrics = open_metrics((fs::path(c.out_dir) / "metrics.jsonl").string(), step);
  log_info("training ", model.num_params(), " parameters in ", precision_name(c.precision), " on ", device->name(),
           " (", device->props().chip, "): ", c.batch_size, " x ", c.seq_len, " tokens per step, steps ", step + 1,
           "..", c.steps, ", ", train_loader.batches_per_epoch(), " batches per epoch");

  Tensor tokens = device->empty(DType::kI32, {c.batch_size, c.seq_len});
  Tensor targets = device->empty(DType::kI32, {c.batch_size, c.seq_len});
  Tensor norm_acc = device->empty(DType::kF32, {1});
  std::vector<int32_t> host_in, host_tgt;
  TrainResult result;
  result.mem_planned_bytes = planned_memory_bytes(c);

  auto evaluate = [&]() -> float {
    if (!val_loader) return -1.0f;
    val_loader->seek({0, 0});
    const int batches =
        static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(c.eval_batches), val_loader->batches_per_epoch()));
    double sum = 0.0;
    for (int i = 0; i < batches; ++i) {
      val_loader->next(host_in, host_tgt);
      copy_from_host(tokens, host_in.data());
      copy_from_host(targets, host_tgt.data());
      model.forward(tokens);
      sum += model.loss(targets);
    }
    return static_cast<float>(sum / batches);
  };
  auto checkpoint = [&] {
    save_checkpoint(checkpoint_dir, model, optimizer,
                    CheckpointState{.step = step,
                                    .model = c.model,
                                    .data = train_loader.position(),
                                    .data_seed = c.seed,
                                    .precision = c.precision},
                    c.keep_checkpoints, from);
  };

  const double t_start = monotonic_seconds();
  const int64_t first_step = step;
  const double tokens_per_step = static_cast<double>(c.batch_size) * c.seq_len;
  while (step < c.steps) {
    const double t0 = monotonic_seconds();
    const double lr = learning_rate(c, step);
    try {
      train_loader.next(host_in, host_tgt);
    } catch (const Error&) {  // the data changed under the run: keep what it has done, then report
      if (step > first_step) {
        checkpoint();
        log_warn("saved a checkpoint at step ", step, " before stopping");
      }
      throw;
    }
    copy_from_host(tokens, host_in.data());
    copy_from_host(targets, host_tgt.data());
    model.zero_grads();
    model.forward(tokens);
    const float loss = model.loss(targets);
    model.backward();
    if (!std::isfinite(loss)) {
      throw Error(ErrorCode::kInternal, cat("step ", step + 1, ": the loss is not finite (", loss,
                                            "); lower optim.lr or set optim.grad_clip"));
    }
    double norm = 0;
    try {
      norm = optimizer_step(model, optimizer, adamw_params(c, step), norm_acc, {.max_norm = c.grad_clip});
      model.refresh_bf16_weights();
    } catch (const Error& e) {
      throw Error(e.code(), cat("step ", step + 1, ": ", e.what()));
    }
    device->synchronize();
    ++step;
    const double t1 = monotonic_seconds();
    const double tok_s = tokens_per_step / (t1 - t0);
    result.losses.push_back(loss);
    result.last_loss = loss;
    result.mem_peak_bytes = static_cast<double>(device->mem_peak_bytes());
    const StepMetrics sm{step, loss, norm, lr, tok_s, t1 - t_start};
    metrics << nlohmann::json{{"step", step},
                              {"loss", loss},
                              {"grad_norm", norm},
                              {"lr", lr},
                              {"tokens_per_s", tok_s},
                              {"time_s", t1 - t_start},
                              {"mem_peak_bytes", result.mem_peak_bytes},
                              {"mem_planned_bytes", result.mem_planned_bytes}}
                   .dump()
            << "\n";
    if (!options.quiet && step == first_step + 1) {
      std::printf("memory on %s: peak %s, planned %s (measured / planned %.3f)\n", device->name().c_str(),
                  format_bytes(result.mem_peak_bytes).c_str(), format_bytes(result.mem_planned_bytes).c_str(),
                  result.mem_peak_bytes / result.mem_planned_bytes);
    }
    if (options.on_step) options.on_step(sm);
    if (!options.quiet && (step % c.log_every == 0 || step == c.steps)) {
      const double per_step = (t1 - t_start) / static_cast<double>(step - first_step);
      std::printf("step %5lld/%lld | loss %.4f | lr %.2e | norm %6.3f | %7.0f tok/s | ETA %s\n",
                  static_cast<long long>(step), static_cast<long long>(c.steps), loss, lr, norm, tok_s,
                  format_duration(per_step * static_cast<double>(c.steps - step)).c_str());
      std::fflush(stdout);
    }
    const bool last = step == c.steps;
    if (val_loader && ((c.eval_every > 0 && step % c.eval_every == 0) || last)) {
      result.val_loss = evaluate();
      metrics << nlohmann::json{{"step", step}, {"val_loss", result.val_loss}}.dump() << "\n";
      if (!options.quiet) std::printf("step %5lld | val loss %.4f\n", static_cast<long long>(step), result.val_loss);
    }
    metrics.flush();
    const bool stop = options.stop_requested != nullptr && options.stop_requested->load();
    if ((c.checkpoint_every > 0 && step % c.checkpoint_every == 0) || last || stop) checkpoint();
    if (stop && !last) {
      log_warn("interrupted after step ", step, " of ", c.steps, "; checkpoint saved in ", checkpoint_dir,
               ". Continue with --resume");
      result.interrupted = true;
      break;
    }
  }
  result.steps_done = step;
  result.tokens_per_second = tokens_per_step * static_cast<double>(step - first_step) / (monotonic_seconds() - t_start);
  write_file_atomic((fs::path(c.out_dir) / "summary.json").string(),
                    nlohmann::json{{"steps", result.steps_done},
                                   {"last_loss", result.last_loss},
                                   {"val_loss", result.val_loss},
                                   {"tokens_per_s", result.tokens_per_second},
                                   {"device", device->name()},
                                   {"precision", precision_name(c.precision)},
                                   {"mem_planned_bytes", result.mem_planned_bytes},
                                   {"mem_peak_bytes", result.mem_peak_bytes}}
                            .dump(2) +
                        "\n");
  return result;
}

}  // namespace h2
