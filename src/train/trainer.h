// Single-device training of the GPT: the loop, its schedule and its outputs.
//
// Each step: a batch from the data loader, forward, loss, backward, global gradient norm and clipping, AdamW
// (weight decay on matrices only), with a learning rate that warms up linearly and then follows a cosine down
// to min_lr (Loshchilov & Hutter 2017). It prints a progress line, writes metrics as JSON lines, evaluates
// on held-out data and checkpoints (train/checkpoint.h). The device's measured memory peak is reported beside
// what model/costs.h predicts (after the first step, in metrics.jsonl and in summary.json). Resuming from a checkpoint
// continues the identical loss curve, bit for bit, on the same backend with the same thread count.
#pragma once

#include <atomic>
#include <cstdint>
#include <fstream>
#include <functional>
#include <string>

#include "core/config.h"
#include "device/registry.h"
#include "model/gpt.h"
#include "ops/kernels.h"
#include "train/checkpoint.h"

namespace h2 {

struct TrainConfig {
  GptConfig model;
  // data
  std::string train_data;  // glob of train shards
  std::string val_data;    // glob of validation shards; empty = no evaluation
  // optimisation
  double lr = 1e-3, min_lr = 1e-4;
  int64_t warmup_steps = 0;
  double weight_decay = 0.1, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, grad_clip = 1.0;
  // run
  int batch_size = 8;
  int seq_len = 256;
  // bf16: products in bf16 from a bf16 copy of the f32 master weights (gpt.h); f32: everything in f32.
  Precision precision = Precision::kF32;
  int64_t steps = 100;
  uint64_t seed = 1;
  int64_t log_every = 1;
  int64_t eval_every = 0;  // 0 = only at the end
  int eval_batches = 8;
  int64_t checkpoint_every = 0;  // 0 = only at the end
  int keep_checkpoints = 2;
  std::string out_dir = "runs/default";
  // device
  DeviceSpec device{.backend = "cpu"};

  // Reads the sections model, data, optim, train, device; unknown fields are errors naming file and line.
  static TrainConfig from_config(const ConfigNode& root);
};

double learning_rate(const TrainConfig& config, int64_t step);
// The AdamW hyperparameters of (0-based) step `step`: the config's, with that step's learning rate.
AdamwParams adamw_params(const TrainConfig& config, int64_t step);

// The memory one device needs to train `config`'s whole model: model/costs.h's stage_memory, in its precision.
double planned_memory_bytes(const TrainConfig& config);

// Keeps the metrics file's lines up to `keep_up_to_step` (a resumed run rewrites what follows) and returns a
// stream appending to it.
std::ofstream open_metrics(const std::string& path, int64_t keep_up_to_step);

struct StepMetrics {
  int64_t step;  // 1-based: the step just completed
  float loss;
  double grad_norm, lr, tokens_per_second, elapsed_seconds;
};

struct TrainResult {
  int64_t steps_done = 0;
  float last_loss = 0.0f;
  float val_loss = -1.0f;  // -1 when not evaluated
  double tokens_per_second = 0.0;
  std::vector<float> losses;     // per step run in this call
  bool interrupted = false;      // stopped early by stop_requested, after checkpointing
  double mem_planned_bytes = 0;  // what model/costs.h's stage_memory predicts for the run
  double mem_peak_bytes = 0;     // what the device's allocator measured at its peak
};

struct TrainOptions {
  bool resume = false;                              // continue from the newest checkpoint in out_dir/checkpoints
  std::string resume_from;                          // or from this checkpoint folder
  bool quiet = false;                               // no progress lines
  std::function<void(const StepMetrics&)> on_step;  // called after every step (tests, tools)
  // Checked after every step: when it becomes true the run saves a checkpoint and returns (the CLI sets it on
  // SIGINT/SIGTERM, so an interrupted run loses at most the step in progress).
  const std::atomic<bool>* stop_requested = nullptr;
};

TrainResult train(const TrainConfig& config, const TrainOptions& options);

}  // namespace h2
