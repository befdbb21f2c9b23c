// Training on one device: backends agree, loss falls, resume is bit-exact, checkpoints survive damage.
#include "train/trainer.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "checkpoint_damage.h"
#include "core/file.h"
#include "core/safetensors.h"
#include "device/key_recorder.h"
#include "model/test_data.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/optimizer.h"

namespace h2 {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing_util::error_of;
using testing_util::flip_bit;
using testing_util::flip_tensor_bit;

constexpr int kVocab = 32;

TrainConfig tiny_config(const std::string& name, const std::string& backend) {
  const std::string dir = testing_util::temp_dir(name);
  testing_util::write_pattern_shards(dir, kVocab);
  TrainConfig c;
  c.model = GptConfig{.n_layer = 2, .n_head = 2, .n_embd = 16, .vocab_size = kVocab, .seq_len = 16};
  c.train_data = dir + "/train_*.bin";
  c.val_data = dir + "/val_*.bin";
  c.lr = 1e-2;
  c.min_lr = 1e-3;
  c.warmup_steps = 3;
  c.batch_size = 4;
  c.seq_len = 16;
  c.steps = 20;
  c.eval_batches = 2;
  c.out_dir = dir + "/run";
  c.device.backend = backend;
  return c;
}

TEST(Trainer, RefAndCpuFollowTheSameLossCurve) {
  const TrainResult ref = train(tiny_config("curve_ref", "ref"), {.quiet = true});
  const TrainResult cpu = train(tiny_config("curve_cpu", "cpu"), {.quiet = true});
  ASSERT_EQ(ref.losses.size(), 20u);
  ASSERT_EQ(cpu.losses.size(), 20u);
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    EXPECT_NEAR(cpu.losses[i], ref.losses[i], 1e-4 * std::abs(ref.losses[i])) << "step " << i + 1;
  }
  // And the model learns the pattern: the loss falls well below its start (ln 32 = 3.47).
  EXPECT_LT(cpu.losses.back(), 0.8f * cpu.losses.front());
}

// Two optimizer steps of the trainer (its hyper-parameters for steps 1 and 2, then train/optimizer.h's step)
// against values worked out by hand from AdamW's definition: m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2,
// p -= lr ((m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + wd p), t = 1 then 2, with g = 0.2 then -0.4,
// lr 0.1, b1 0.9, b2 0.95, wd 0.1 on matrices (wte.weight from 0.5) and none on LayerNorm gains (from 1.0).
// A step number off by one gives 0.4215 for the first step instead of 0.3950.
TEST(Optimizer, TwoAdamwStepsMatchHandWorkedValues) {
  TrainConfig c = tiny_config("adamw_by_hand", "cpu");
  c.lr = c.min_lr = 0.1;
  c.warmup_steps = 0;
  c.beta1 = 0.9;
  c.beta2 = 0.95;
  c.eps = 1e-8;
  c.weight_decay = 0.1;
  auto dev = create_device(c.device);
  Gpt model(c.model, *dev, GptRange::whole(c.model), 1, 4);
  model.init(1);
  const OptimizerState state{dev->zeros(DType::kF32, {model.num_params()}),
                             dev->zeros(DType::kF32, {model.num_params()})};
  Tensor acc = dev->zeros(DType::kF32, {1});
  auto param = [&](const std::string& name) -> Gpt::Param& {
    for (Gpt::Param& p : model.params())
      if (p.name == name) return p;
    throw std::runtime_error(name);
  };
  param("wte.weight").value.data_as<float>()[0] = 0.5f;
  param("ln_f.weight").value.data_as<float>()[0] = 1.0f;
  const float expected[2][2] = {{0.395000005f, 0.900000005f}, {0.427387399f, 0.936337399f}};
  for (int step = 0; step < 2; ++step) {
    model.zero_grads();
    param("wte.weight").grad.data_as<float>()[0] = step == 0 ? 0.2f : -0.4f;
    param("ln_f.weight").grad.data_as<float>()[0] = step == 0 ? 0.2f : -0.4f;
    optimizer_step(model, state, adamw_params(c, step), acc, {.max_norm = 0});
    EXPECT_NEAR(param("wte.weight").value.data_as<float>()[0], expected[step][0], 1e-6) << "step " << step + 1;
    EXPECT_NEAR(param("ln_f.weight").value.data_as<float>()[0], expected[step][1], 1e-6) << "step " << step + 1;
  }
  // Clipping: gradients (3, 4) have norm 5; clipped to 1 they become (0.6, 0.8). The norm returned is 5.
  model.zero_grads();
  param("ln_f.bias").grad.data_as<float>()[0] = 3.0f;
  param("ln_f.bias").grad.data_as<float>()[1] = 4.0f;
  EXPECT_NEAR(optimizer_step(model, state, adamw_params(c, 2), acc, {.max_norm = 1.0}), 5.0, 1e-6);
  EXPECT_NEAR(param("ln_f.bias").grad.data_as<float>()[0], 0.6f, 1e-6);
  EXPECT_NEAR(param("ln_f.bias").grad.data_as<float>()[1], 0.8f, 1e-6);
}

// The kernels every rank launches at once — the gradient norm, clipping, AdamW and the bf16 refresh after them —
// are launched so (an emulated chip does not let them move its drift: device/emu/device.h); a forward, a backward
// and the loss are not, though in bf16 they convert too (the activations they keep), so an op's name cannot tell.
// A bf16 model refreshed after its init, one micro-batch, then a step and the refresh after it.
TEST(Optimizer, LaunchesItsKernelsAllRanksAtOnce) {
  const GptConfig config{.n_layer = 1, .n_head = 2, .n_embd = 16, .vocab_size = kVocab, .seq_len = 8};
  KeyRecorder dev(size_t{64} << 20);
  Gpt model(config, dev, GptRange::whole(config), 1, 8, {}, ActivationPolicy{.precision = Precision::kBf16});
  model.init(1);
  model.refresh_bf16_weights();
  const size_t first = dev.launches.size();
  const Tensor tokens = dev.zeros(DType::kI32, {1, 8});
  model.forward(tokens);
  model.loss(tokens);
  model.backward();
  const size_t step = dev.launches.size();
  const Tensor acc = dev.zeros(DType::kF32, {1});
  const OptimizerState moments{dev.zeros(DType::kF32, {model.num_params()}),
                               dev.zeros(DType::kF32, {model.num_params()})};
  optimizer_step(model, moments, AdamwParams{}, acc, {.max_norm = 1e-6});
  model.refresh_bf16_weights();
  std::set<std::string> before, training, after;
  for (size_t i = 0; i < dev.launches.size(); ++i) {
    const KeyRecorder::Launch& l = dev.launches[i];
    const bool at_once = i < first || i >= step;
    EXPECT_EQ(l.all_ranks_at_once, at_once) << l.op << " (launch " << i << ")";
    (i < first ? before : i < step ? training : after).insert(l.op);
  }
  EXPECT_EQ(before, (std::set<std::string>{"convert"}));
  EXPECT_TRUE(training.contains("convert"));
  EXPECT_EQ(after, (std::set<std::string>{"global_norm_squared", "scale", "adamw_update", "convert"}));
  EXPECT_FALSE(dev.all_ranks_at_once());
}

// One check serves single-device and cluster resumes: every field of the model, the sequence length too.
TEST(Checkpoint, AnotherModelIsNamedByItsField) {
  const GptConfig model{.n_layer = 2, .n_head = 2, .n_embd = 16, .vocab_size = 32, .seq_len = 16};
  CheckpointState state{.step = 3, .model = model};
  check_checkpoint_model(state, model, "ck");
  state.model.seq_len = 32;
  EXPECT_THAT(error_of([&] { check_checkpoint_model(state, model, "ck"); }, ErrorCode::kConfig),
              HasSubstr("ck: the checkpoint is of another model: its seq_len is 32, the configured model's 16"));
  state.model = model;
  state.model.n_head = 4;
  EXPECT_THAT(error_of([&] { check_checkpoint_model(state, model, "ck"); }, ErrorCode::kConfig),
              HasSubstr("its n_head is 4"));
}

// The device's measured peak beside the planned figure: equal to the byte (model/costs.h counts every
// allocation: model, optimizer, tokens, targets), in the result, in metrics.jsonl and in summary.json.
TEST(Trainer, ReportsMeasuredMemoryBesideThePlannedFigure) {
  TrainConfig low = tiny_config("memory_bf16", "cpu");
  low.steps = 1;
  low.precision = Precision::kBf16;
  const TrainResult r16 = train(low, {.quiet = true});
  EXPECT_EQ(r16.mem_peak_bytes, r16.mem_planned_bytes);  // the bf16 copy, the f32 master and bf16 activations
  TrainConfig c = tiny_config("memory", "cpu");
  c.steps = 2;
  const TrainResult r = train(c, {.quiet = true});
  EXPECT_NE(r.mem_planned_bytes, r16.mem_planned_bytes);
  EXPECT_GT(r.mem_peak_bytes, 0);
  EXPECT_EQ(r.mem_peak_bytes, r.mem_planned_bytes);
  EXPECT_EQ(r.mem_planned_bytes, planned_memory_bytes(c));
  const auto summary = nlohmann::json::parse(read_file(c.out_dir + "/summary.json"));
  EXPECT_EQ(summary.at("mem_peak_bytes").get<double>(), r.mem_peak_bytes);
  EXPECT_EQ(summary.at("mem_planned_bytes").get<double>(), r.mem_planned_bytes);
  std::istringstream lines(read_file(c.out_dir + "/metrics.jsonl"));
  std::string line;
  std::getline(lines, line);
  EXPECT_EQ(nlohmann::json::parse(line).at("mem_peak_bytes").get<double>(), r.mem_peak_bytes);
}

// bf16 training follows the f32 curve (it would not learn if the optimizer's updates never reached the bf16 copy
// of the weights), and its checkpoints say their precision and hold the f32 master weights.
TEST(Trainer, Bf16FollowsTheF32LossCurve) {
  TrainConfig c = tiny_config("bf16_curve", "cpu");
  const TrainResult f32 = train(c, {.quiet = true});
  c = tiny_config("bf16_curve_bf16", "cpu");
  c.precision = Precision::kBf16;
  const TrainResult bf16 = train(c, {.quiet = true});
  ASSERT_EQ(bf16.losses.size(), f32.losses.size());
  for (size_t i = 0; i < f32.losses.size(); ++i) {
    EXPECT_NEAR(bf16.losses[i], f32.losses[i], 0.02 * f32.losses[i]) << "step " << i + 1;
  }
  EXPECT_NE(bf16.losses.back(), f32.losses.back());  // it did compute in bf16
  const std::string last = latest_checkpoint(c.out_dir + "/checkpoints");
  EXPECT_EQ(read_checkpoint_state(last).precision, Precision::kBf16);
  EXPECT_EQ(SafetensorsFile(last + "/model.safetensors").at("wte.weight").dtype, DType::kF32);
}

void resume_continues_the_identical_curve(Precision precision) {
  const std::string p = precision_name(precision);
  TrainConfig straight = tiny_config("resume_straight_" + p, "cpu");
  straight.steps = 10;
  straight.precision = precision;
  const TrainResult full = train(straight, {.quiet = true});

  TrainConfig halves = tiny_config("resume_halves_" + p, "cpu");
  halves.steps = 10;
  halves.precision = precision;
  halves.checkpoint_every = 5;
  halves.keep_checkpoints = 0;
  std::vector<float> resumed;
  // Stop after step 5 by running a 10-step schedule that is interrupted: train to 5 with the same schedule,
  // which needs the same `steps` (the learning rate depends on it), so the run is cut with an exception.
  try {
    train(halves, {.quiet = true, .on_step = [](const StepMetrics& m) {
                     if (m.step == 6) throw std::runtime_error("interrupted");
                   }});
  } catch (const std::runtime_error&) {
  }
  const TrainResult second = train(halves, {.resume = true, .quiet = true});
  ASSERT_EQ(second.losses.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(second.losses[i], full.losses[5 + i]) << "step " << 6 + i;
  // The final checkpoints hold identical parameters.
  const SafetensorsFile a(straight.out_dir + "/checkpoints/step_000010/model.safetensors");
  const SafetensorsFile b(halves.out_dir + "/checkpoints/step_000010/model.safetensors");
  for (const SafetensorsEntry& e : a.entries()) {
    const SafetensorsEntry& f = b.at(e.name);
    size_t n = 1;
    for (int64_t d : e.shape) n *= static_cast<size_t>(d);
    EXPECT_EQ(std::memcmp(e.data, f.data, n * 4), 0) << e.name;
  }
}

TEST(Trainer, ResumeContinuesTheIdenticalCurve) {
  for (Precision precision : {Precision::kF32, Precision::kBf16}) {
    SCOPED_TRACE(precision_name(precision));
    resume_continues_the_identical_curve(precision);
  }
}

TEST(Trainer, AStopRequestCheckpointsAndResumes) {
  TrainConfig c = tiny_config("stop", "cpu");
  c.steps = 8;
  std::atomic<bool> stop{false};
  const TrainResult first =
      train(c, {.quiet = true, .on_step = [&](const StepMetrics& m) { stop = m.step == 3; }, .stop_requested = &stop});
  EXPECT_TRUE(first.interrupted);
  EXPECT_EQ(first.steps_done, 3);
  EXPECT_TRUE(latest_checkpoint(c.out_dir + "/checkpoints").ends_with("step_000003"));
  const TrainResult rest = train(c, {.resume = true, .quiet = true});
  EXPECT_FALSE(rest.interrupted);
  EXPECT_EQ(rest.losses.size(), 5u);
}

TEST(Checkpoint, SaveLoadRoundTripInHuggingFaceLayout) {
  TrainConfig c = tiny_config("ckpt_roundtrip", "cpu");
  c.steps = 2;
  train(c, {.quiet = true});
  const std::string ckpt = latest_checkpoint(c.out_dir + "/checkpoints");
  EXPECT_TRUE(ckpt.ends_with("step_000002"));
  auto dev = create_device(DeviceSpec{.backend = "cpu"});
  Gpt model(c.model, *dev, GptRange::whole(c.model), 1, 4);
  load_checkpoint(ckpt, model, nullptr);
  const SafetensorsFile file(ckpt + "/model.safetensors");
  for (const Gpt::Param& p : model.params()) {
    const SafetensorsEntry& e = file.at(p.name);
    const auto* stored = static_cast<const float*>(e.data);
    const float* loaded = p.value.data_as<float>();
    if (p.hf_transposed) {  // Conv1D layout: (in, out)
      const int64_t out = p.value.shape()[0], in = p.value.shape()[1];
      ASSERT_EQ(e.shape, (std::vector<int64_t>{in, out})) << p.name;
      for (int64_t o = 0; o < out; ++o) {
        for (int64_t i = 0; i < in; ++i) ASSERT_EQ(loaded[o * in + i], stored[i * out + o]) << p.name;
      }
    } else {
      ASSERT_EQ(std::memcmp(loaded, stored, static_cast<size_t>(p.value.numel()) * 4), 0) << p.name;
    }
  }
  EXPECT_TRUE(file.has("h.1.mlp.c_proj.weight"));
  EXPECT_EQ(read_checkpoint_state(ckpt).step, 2);
}

// Tensor-parallel shards hold their part of the whole model: initialised alike, sent to TP rank 0, which puts the
// whole tensors and moments together for a checkpoint (the others take nothing), and sliced back out of one (the
// reference: the whole model, unsplit).
// A vocabulary of 30 over TP 4: the vocabulary-parallel table's shards hold 7, 8, 7 and 8 rows.
TEST(Checkpoint, TensorParallelShardsSaveAndLoadAsTheWholeModel) {
  const GptConfig config{.n_layer = 2, .n_head = 4, .n_embd = 16, .vocab_size = 30, .seq_len = 8};
  auto dev = create_device(DeviceSpec{.backend = "cpu"});
  Gpt whole(config, *dev, GptRange::whole(config), 1, 4);
  whole.init(3);
  // Each model's moments are its own values, flat in its order, times 1 (m) and 2 (v): the whole model's saved moments
  // are then its values in H2's layout, and the shards' moments are put together under the same check.
  const auto flat = [](Gpt& m, float times) {
    std::vector<float> out;
    for (const Gpt::Param& p : m.params()) {
      std::vector<float> x(static_cast<size_t>(p.value.numel()));
      copy_to_host(x.data(), p.value);
      for (float e : x) out.push_back(times * e);
    }
    return out;
  };
  std::vector<SavedParam> want;
  const std::vector<float> whole_m = flat(whole, 1), whole_v = flat(whole, 2);
  for_each_saved_param(whole, whole_m.data(), whole_v.data(), nullptr, {},
                       [&](const SavedParam& p) { want.push_back(p); });
  // Ranks 1-3 send their shards (kept here in order, one queue a rank) and take nothing; rank 0 receives them.
  std::vector<std::unique_ptr<Gpt>> shards;
  std::vector<std::deque<std::vector<float>>> sent(4);
  for (int t = 0; t < 4; ++t) {
    shards.push_back(std::make_unique<Gpt>(config, *dev, GptRange::whole(config), 1, 4,
                                           TensorParallel{t, 4, [](const Tensor&) {}, [](const Tensor&) {}}));
    shards.back()->init(3);
    EXPECT_LT(shards.back()->num_params(), whole.num_params());
  }
  for (int t = 1; t < 4; ++t) {
    const std::vector<float> m = flat(*shards[static_cast<size_t>(t)], 1), v = flat(*shards[static_cast<size_t>(t)], 2);
    for_each_saved_param(
        *shards[static_cast<size_t>(t)], m.data(), v.data(), nullptr,
        {.send = [&](const float* x, size_t n) { sent[static_cast<size_t>(t)].emplace_back(x, x + n); }},
        [&](const SavedParam& p) { ADD_FAILURE() << "TP rank " << t << " took " << p.name; });
  }
  std::vector<SavedParam> got;
  const std::vector<float> first_m = flat(*shards[0], 1), first_v = flat(*shards[0], 2);
  for_each_saved_param(*shards[0], first_m.data(), first_v.data(), nullptr,
                       {.receive =
                            [&](int from, float* x, size_t n) {
                              std::deque<std::vector<float>>& q = sent[static_cast<size_t>(from)];
                              ASSERT_FALSE(q.empty()) << "rank " << from << " sent no more";
                              ASSERT_EQ(q.front().size(), n) << "rank " << from;
                              std::copy(q.front().begin(), q.front().end(), x);
                              q.pop_front();
                            }},
                       [&](const SavedParam& p) { got.push_back(p); });
  for (const auto& q : sent) EXPECT_TRUE(q.empty()) << q.size() << " shards sent and not received";
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].name, want[i].name);
    EXPECT_EQ(got[i].hf_shape, want[i].hf_shape) << want[i].name;
    EXPECT_EQ(got[i].value, want[i].value) << want[i].name;
    // The moments against the whole model's values themselves (H2's layout), not through the code under test.
    const Tensor& value = whole.params()[i].value;
    std::vector<float> m(static_cast<size_t>(value.numel())), v;
    copy_to_host(m.data(), value);
    for (float e : m) v.push_back(2 * e);
    EXPECT_EQ(got[i].m, m) << want[i].name;
    EXPECT_EQ(got[i].v, v) << want[i].name;
  }
  // Loading the whole model's checkpoint into shard 2 gives shard 2's initial values.
  const std::string dir = (fs::temp_directory_path() / cat("h2_tp_ckpt_", getpid())).string();
  fs::remove_all(dir);
  const std::vector<float> zeros(static_cast<size_t>(whole.num_params()), 0.0f);
  save_checkpoint(
      dir, whole,
      OptimizerState{dev->zeros(DType::kF32, {whole.num_params()}), dev->zeros(DType::kF32, {whole.num_params()})},
      CheckpointState{.step = 1, .model = config}, 1);
  Gpt fresh(config, *dev, GptRange::whole(config), 1, 4,
            TensorParallel{2, 4, [](const Tensor&) {}, [](const Tensor&) {}});
  Gpt expected(config, *dev, GptRange::whole(config), 1, 4,
               TensorParallel{2, 4, [](const Tensor&) {}, [](const Tensor&) {}});
  expected.init(3);
  std::vector<float> m, v;
  load_checkpoint_by_name(latest_checkpoint(dir), fresh, &m, &v);
  for (size_t i = 0; i < fresh.params().size(); ++i) {
    const Tensor& a = fresh.params()[i].value;
    const Tensor& b = expected.params()[i].value;
    ASSERT_EQ(std::memcmp(a.data(), b.data(), static_cast<size_t>(a.bytes())), 0) << fresh.params()[i].name;
  }
  fs::remove_all(dir);
}

// A checkpoint's files are written a tensor at a time, so that a rank holds one whole tensor in the host's memory and
// not its whole stage (which for a stage of a 100B model is tens of GB): when the writer receives the last shard, the
// ones before it are in the files already — and the files hold the whole model.
TEST(Checkpoint, FilesAreWrittenATensorAtATime) {
  const GptConfig config{.n_layer = 2, .n_head = 4, .n_embd = 16, .vocab_size = 30, .seq_len = 8};
  auto dev = create_device(DeviceSpec{.backend = "cpu"});
  Gpt shard(config, *dev, GptRange::whole(config), 1, 4,
            TensorParallel{0, 2, [](const Tensor&) {}, [](const Tensor&) {}});
  shard.init(1);
  const std::string folder = testing_util::temp_dir("ckpt_stream");
  const std::vector<float> zeros(static_cast<size_t>(shard.num_params()), 0.0f);
  std::vector<uintmax_t> on_disk;  // the folder's bytes at each shard received from the other TP rank
  const auto receive = [&](int, float* x, size_t n) {
    uintmax_t bytes = 0;
    for (const auto& e : fs::directory_iterator(folder)) bytes += e.file_size();
    on_disk.push_back(bytes);
    std::fill_n(x, n, 0.0f);
  };
  write_model_files(folder, "", shard, zeros.data(), zeros.data(), nullptr, {.receive = receive});
  ASSERT_GT(on_disk.size(), 3u);
  EXPECT_GT(on_disk.back(), on_disk.front() + 4 * 16 * 16);  // at least a 16 x 16 tensor's value and moments
  const SafetensorsFile model(folder + "/model.safetensors");
  EXPECT_EQ(model.entries().size(), shard.params().size());
  for (const Gpt::Param& p : shard.params()) EXPECT_TRUE(model.has(p.name)) << p.name;
  fs::remove_all(folder);
}

// A damaged checkpoint is never loaded silently: a truncated file, garbage in a header, one flipped bit (which
// used to resume with another loss and no warning) and a NaN weight are errors naming the file and the tensor;
// --resume falls back to the newest checkpoint that verifies and says which it skipped and why; a stray file the
// manifest does not name is not read.
TEST(Checkpoint, DamagedCheckpointsAreRefusedAndResumeFallsBack) {
  TrainConfig c = tiny_config("ckpt_damage", "cpu");
  c.steps = 6;
  c.checkpoint_every = 2;
  c.keep_checkpoints = 0;
  const TrainResult straight = train(c, {.quiet = true});
  const std::string dir = c.out_dir + "/checkpoints";
  const std::string newest = latest_checkpoint(dir);
  ASSERT_TRUE(newest.ends_with("step_000006"));
  verify_checkpoint(newest);
  auto dev = create_device(DeviceSpec{.backend = "cpu"});
  Gpt m(c.model, *dev, GptRange::whole(c.model), 1, 4);
  // One flipped bit in the last tensor of step 6's model file.
  const std::string model = newest + "/model.safetensors";
  flip_bit(model, 1);
  EXPECT_THAT(error_of([&] { load_checkpoint(newest, m, nullptr); }, ErrorCode::kIo),
              HasSubstr("model.safetensors: tensor '"));
  EXPECT_THAT(error_of([&] { verify_checkpoint(newest); }, ErrorCode::kIo), HasSubstr("does not match its checksum"));
  // Step 4's optimizer file truncated.
  const std::string optimizer = dir + "/step_000004/optimizer.safetensors";
  fs::resize_file(optimizer, fs::file_size(optimizer) / 2);
  EXPECT_THAT(
      error_of([&] { verify_checkpoint(dir + "/step_000004"); }, ErrorCode::kIo),
      HasSubstr("optimizer.safetensors: " + std::to_string(fs::file_size(optimizer)) + " bytes, the manifest says"));
  // A stray file beside step 2's holding other weights is not read.
  fs::copy_file(newest + "/model.safetensors", dir + "/step_000002/model-00.safetensors");
  verify_checkpoint(dir + "/step_000002");
  // --resume skips steps 6 and 4, names why, resumes from step 2 and ends where the straight run ended.
  std::vector<std::string> skipped;
  EXPECT_TRUE(resume_checkpoint(dir, &skipped).ends_with("step_000002"));
  ASSERT_EQ(skipped.size(), 2u);
  EXPECT_THAT(skipped[0], HasSubstr("step_000006: "));
  EXPECT_THAT(skipped[1], HasSubstr("step_000004: "));
  c.keep_checkpoints = 1;  // retention keeps the checkpoint it resumed from beside the newest
  const TrainResult resumed = train(c, {.resume = true, .quiet = true});
  EXPECT_EQ(resumed.losses.size(), 4u);
  EXPECT_EQ(resumed.last_loss, straight.last_loss);
  EXPECT_TRUE(fs::exists(dir + "/step_000002"));
  EXPECT_TRUE(fs::exists(dir + "/step_000006"));
  EXPECT_FALSE(fs::exists(dir + "/step_000004"));
  // A NaN weight is refused even when its checksum matches (the run had diverged when it saved).
  Gpt nan_model(c.model, *dev, GptRange::whole(c.model), 1, 4);
  nan_model.init(1);
  nan_model.params()[0].value.data_as<float>()[3] = std::nanf("");
  const std::string nan_dir = c.out_dir + "/nan";
  save_checkpoint(nan_dir, nan_model,
                  OptimizerState{dev->zeros(DType::kF32, {nan_model.num_params()}),
                                 dev->zeros(DType::kF32, {nan_model.num_params()})},
                  CheckpointState{.step = 1, .model = c.model}, 0);
  EXPECT_THAT(error_of([&] { load_checkpoint(latest_checkpoint(nan_dir), m, nullptr); }, ErrorCode::kIo),
              HasSubstr("tensor 'wte.weight' holds nan at element 3"));
  // Nothing verifies: the error lists every reason.
  EXPECT_THAT(error_of([&] { resume_checkpoint(c.out_dir + "/none", nullptr); }, ErrorCode::kNotFound),
              HasSubstr("no checkpoint to resume from verifies"));
}

// A load reads through and verifies only the tensors it takes: a stage's range does not read another stage's
// tensors, nor a load of the weights alone the optimizer's moments — each damaged, the loads that take it fail naming
// it, and verify_checkpoint (resume_checkpoint's check of a whole checkpoint) still finds both.
TEST(Checkpoint, ALoadVerifiesOnlyTheTensorsItTakes) {
  TrainConfig c = tiny_config("ckpt_partial", "cpu");
  c.steps = 2;
  train(c, {.quiet = true});
  const std::string newest = latest_checkpoint(c.out_dir + "/checkpoints");
  auto dev = create_device(DeviceSpec{.backend = "cpu"});
  Gpt whole(c.model, *dev, GptRange::whole(c.model), 1, 4);
  Gpt first(c.model, *dev, GptRange{true, 0, 1, false}, 1, 4);  // the embedding and block 0
  const OptimizerState moments{dev->zeros(DType::kF32, {whole.num_params()}),
                               dev->zeros(DType::kF32, {whole.num_params()})};
  flip_tensor_bit(newest + "/optimizer.safetensors", "m.wte.weight");
  load_checkpoint(newest, whole, nullptr);
  EXPECT_THAT(error_of([&] { load_checkpoint(newest, whole, &moments); }, ErrorCode::kIo),
              HasSubstr("optimizer.safetensors: tensor 'm.wte.weight' does not match its checksum"));
  flip_tensor_bit(newest + "/model.safetensors", "h.1.mlp.c_proj.weight");
  load_checkpoint(newest, first, nullptr);
  EXPECT_THAT(error_of([&] { load_checkpoint(newest, whole, nullptr); }, ErrorCode::kIo),
              HasSubstr("model.safetensors: tensor 'h.1.mlp.c_proj.weight' does not match its checksum"));
  EXPECT_THAT(error_of([&] { verify_checkpoint(newest); }, ErrorCode::kIo), HasSubstr("does not match its checksum"));
}

// Ranks verify a checkpoint together, each reading through every parts-th tensor: one damaged tensor fails exactly
// one share of three, naming it; a file of the wrong size fails every share (each checks every file's size and
// tensor names); with one share, verify_checkpoint reads everything.
TEST(Checkpoint, SharesOfAVerificationTogetherReadEveryTensorOnce) {
  TrainConfig c = tiny_config("ckpt_shares", "cpu");
  c.steps = 2;
  train(c, {.quiet = true});
  const std::string newest = latest_checkpoint(c.out_dir + "/checkpoints");
  for (int part = 0; part < 3; ++part) verify_checkpoint(newest, part, 3);
  flip_tensor_bit(newest + "/optimizer.safetensors", "v.h.1.attn.c_proj.weight");
  int failed = 0;
  for (int part = 0; part < 3; ++part) {
    try {
      verify_checkpoint(newest, part, 3);
    } catch (const Error& e) {
      ++failed;
      EXPECT_THAT(e.what(), HasSubstr("tensor 'v.h.1.attn.c_proj.weight' does not match its checksum"));
    }
  }
  EXPECT_EQ(failed, 1);
  EXPECT_THAT(error_of([&] { verify_checkpoint(newest); }, ErrorCode::kIo), HasSubstr("v.h.1.attn.c_proj.weight"));
  fs::resize_file(newest + "/model.safetensors", fs::file_size(newest + "/model.safetensors") - 4);
  for (int part = 0; part < 3; ++part) {
    EXPECT_THAT(error_of([&] { verify_checkpoint(newest, part, 3); }, ErrorCode::kIo),
                HasSubstr("model.safetensors: "));
  }
}

// CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320) bit by bit, as its definition gives it: the reference the
// manifest's checksums are held to.
uint32_t crc32_by_hand(const uint8_t* p, size_t n) {
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

// The manifest holds what the writer wrote, computed from the bytes in memory, not what the disk gave back: each
// file's size and each tensor's CRC-32 match the files (the checksum worked out bit by bit), and a bit flipped on
// the disk between the writing and the state — which a manifest read back from the disk would bless — fails the
// checkpoint's verification, naming the tensor.
TEST(Checkpoint, TheManifestHoldsTheChecksumsOfWhatWasWritten) {
  const GptConfig config{.n_layer = 1, .n_head = 2, .n_embd = 8, .vocab_size = 12, .seq_len = 4};
  auto dev = create_device(DeviceSpec{.backend = "cpu"});
  Gpt model(config, *dev, GptRange::whole(config), 1, 4);
  model.init(3);
  std::vector<float> m(static_cast<size_t>(model.num_params())), v(m.size());
  for (size_t i = 0; i < m.size(); ++i) m[i] = 0.001f * static_cast<float>(i), v[i] = 1e-6f * static_cast<float>(i);
  const std::string dir = testing_util::temp_dir("ckpt_manifest");
  const std::string folder = begin_checkpoint(dir, 7);
  const Manifest written = write_model_files(folder, "", model, m.data(), v.data(), nullptr, {});
  ASSERT_EQ(written.size(), 2u);
  for (const auto& [name, file] : written) {
    const std::string path = folder + "/" + name;
    EXPECT_EQ(file.bytes, fs::file_size(path)) << name;
    const SafetensorsFile on_disk(path);
    ASSERT_EQ(file.crc32.size(), on_disk.entries().size()) << name;
    for (const SafetensorsEntry& e : on_disk.entries()) {
      size_t bytes = 4;
      for (int64_t d : e.shape) bytes *= static_cast<size_t>(d);
      ASSERT_EQ(file.crc32.count(e.name), 1u) << name << " " << e.name;
      EXPECT_EQ(file.crc32.at(e.name), crc32_by_hand(static_cast<const uint8_t*>(e.data), bytes)) << e.name;
    }
  }
  EXPECT_EQ(written.at("optimizer.safetensors").crc32.size(), 2 * model.params().size());
  flip_tensor_bit(folder + "/model.safetensors", "h.0.attn.c_proj.weight");
  write_checkpoint_state(folder, CheckpointState{.step = 7, .model = config, .files = written});
  const std::string saved = commit_checkpoint(dir, 7, 0);
  EXPECT_THAT(error_of([&] { verify_checkpoint(saved); }, ErrorCode::kIo),
              HasSubstr("model.safetensors: tensor 'h.0.attn.c_proj.weight' does not match its checksum"));
  fs::remove_all(dir);
}

// The state is written only over the files its writers listed, as they listed them: a listed file missing or of
// another size, or a safetensors file nobody listed, is an error naming the file — and no state.json is written, so
// the folder never becomes a checkpoint.
TEST(Checkpoint, TheStateRefusesAFolderThatDiffersFromItsManifest) {
  const GptConfig config{.n_layer = 1, .n_head = 2, .n_embd = 8, .vocab_size = 12, .seq_len = 4};
  auto dev = create_device(DeviceSpec{.backend = "cpu"});
  Gpt model(config, *dev, GptRange::whole(config), 1, 4);
  model.init(3);
  const std::vector<float> zeros(static_cast<size_t>(model.num_params()), 0.0f);
  const std::string dir = testing_util::temp_dir("ckpt_manifest_folder");
  const std::string folder = begin_checkpoint(dir, 1);
  const Manifest written = write_model_files(folder, "", model, zeros.data(), zeros.data(), nullptr, {});
  const CheckpointState state{.step = 1, .model = config, .files = written};
  const std::string optimizer = folder + "/optimizer.safetensors";
  const uintmax_t bytes = fs::file_size(optimizer);
  fs::resize_file(optimizer, bytes - 4);
  EXPECT_THAT(error_of([&] { write_checkpoint_state(folder, state); }, ErrorCode::kIo),
              HasSubstr("optimizer.safetensors holds " + std::to_string(bytes - 4) + " bytes, its writer wrote " +
                        std::to_string(bytes)));
  fs::remove(optimizer);
  EXPECT_THAT(error_of([&] { write_checkpoint_state(folder, state); }, ErrorCode::kIo),
              HasSubstr("optimizer.safetensors was not written (its writer listed it)"));
  Manifest model_only = written;
  model_only.erase("optimizer.safetensors");
  fs::copy_file(folder + "/model.safetensors", folder + "/model.stage9.safetensors");
  EXPECT_THAT(error_of([&] { write_checkpoint_state(folder, CheckpointState{.step = 1, .files = model_only}); },
                       ErrorCode::kIo),
              HasSubstr("model.stage9.safetensors is in the folder but no writer listed it"));
  EXPECT_FALSE(fs::exists(folder + "/state.json"));
  fs::remove(folder + "/model.stage9.safetensors");
  write_checkpoint_state(folder, CheckpointState{.step = 1, .model = config, .files = model_only});
  EXPECT_EQ(read_checkpoint_state(folder).files.size(), 1u);
  EXPECT_THAT(error_of([] { parse_manifest("[1, 2]", "rank 3's checkpoint files"); }, ErrorCode::kIo),
              HasSubstr("rank 3's checkpoint files"));
  // A part whose files hold no tensor still lists both, and the state takes them.
  const std::string empty = begin_checkpoint(dir, 2);
  const Manifest none = write_model_files(empty, ".stage9", model, zeros.data(), zeros.data(),
                                          [](const Gpt::Param&) { return false; }, {});
  ASSERT_EQ(none.size(), 2u);
  EXPECT_TRUE(none.at("optimizer.stage9.safetensors").crc32.empty());
  write_checkpoint_state(empty, CheckpointState{.step = 2, .model = config, .files = none});
  fs::remove_all(dir);
}

// A token shard truncated in place while training (it used to kill the run with SIGBUS through the mapping, with
// no checkpoint) stops the run with an error naming the shard, after a checkpoint of the steps done.
TEST(Trainer, AShardTruncatedWhileTrainingIsAnErrorAfterACheckpoint) {
  TrainConfig c = tiny_config("shard_truncated", "cpu");
  c.steps = 6;
  const std::vector<std::string> shards = expand_glob(c.train_data);
  const std::string error = error_of(
      [&] {
        train(c, {.quiet = true, .on_step = [&](const StepMetrics& m) {
                    if (m.step == 2) {
                      for (const std::string& s : shards) fs::resize_file(s, 1024);  // the header only
                    }
                  }});
      },
      ErrorCode::kIo);
  EXPECT_THAT(error, HasSubstr("the shard changed while in use"));
  EXPECT_THAT(error, HasSubstr("train_"));
  EXPECT_TRUE(latest_checkpoint(c.out_dir + "/checkpoints").ends_with("step_000002"));
}

TEST(TrainConfig, ReadsYamlAndNamesBadFields) {
  const std::string yaml =
      "model: {n_layer: 2, n_head: 2, n_embd: 16, vocab_size: 32, seq_len: 16}\n"
      "data: {train: x.bin}\n"
      "train: {batch_size: 4, steps: 7}\n";
  ConfigNode root = ConfigNode::parse_string(yaml, "t.yaml");
  root.apply_override("train.steps=9");
  root.apply_override("optim.lr=0.5");
  const TrainConfig c = TrainConfig::from_config(root);
  EXPECT_EQ(c.steps, 9);
  EXPECT_DOUBLE_EQ(c.lr, 0.5);
  EXPECT_EQ(c.seq_len, 16);
  EXPECT_EQ(c.precision, Precision::kF32);  // the default
  root.apply_override("train.precision=bf16");
  EXPECT_EQ(TrainConfig::from_config(root).precision, Precision::kBf16);
  EXPECT_THAT(error_of(
                  [&] {
                    ConfigNode r = ConfigNode::parse_string(yaml + "trian: {}\n", "t.yaml");
                    TrainConfig::from_config(r);
                  },
                  ErrorCode::kConfig),
              HasSubstr("t.yaml:4:1: field 'trian': unknown field; did you mean 'train'?"));
  EXPECT_THAT(
      error_of(
          [&] {
            ConfigNode r = ConfigNode::parse_string(yaml, "t.yaml");
            r.apply_override("train.batch_size=0");
            TrainConfig::from_config(r);
          },
          ErrorCode::kConfig),
      HasSubstr("--set train.batch_size=0: field 'train.batch_size': must be an integer in [1, 1048576], got 0"));
  // Values that used to wrap into narrower types or pass unchecked.
  for (auto [set, want] :
       {std::pair{"train.batch_size=4294967298", "'train.batch_size': must be an integer in"},
        {"train.keep_checkpoints=4294967296", "'train.keep_checkpoints': must be an integer in"},
        {"optim.eps=0", "'optim.eps': must be in [1e-30, 1], got 0"},
        {"optim.lr=.inf", "'optim.lr': must be in"},
        {"optim.grad_clip=-1", "'optim.grad_clip': must be in [0, "},
        {"train.precision=fp8", "'train.precision': must be bf16 or f32"},
        // Located at the --set, not at a line of the file it was not in; a misspelt key too.
        {"train.btach_size=4", "--set train.btach_size=4: field 'train.btach_size': unknown field"}}) {
    EXPECT_THAT(error_of(
                    [&] {
                      ConfigNode r = ConfigNode::parse_string(yaml, "t.yaml");
                      r.apply_override(set);
                      TrainConfig::from_config(r);
                    },
                    ErrorCode::kConfig),
                HasSubstr(want))
        << set;
  }
  EXPECT_THAT(error_of(
                  [&] {
                    ConfigNode r = ConfigNode::parse_string(yaml, "t.yaml");
                    r.apply_override("nonsense");
                  },
                  ErrorCode::kInvalidArgument),
              HasSubstr("--set expects KEY=VALUE"));
}

TEST(LearningRate, WarmsUpThenFollowsACosine) {
  TrainConfig c;
  c.lr = 1.0;
  c.min_lr = 0.1;
  c.warmup_steps = 10;
  c.steps = 110;
  EXPECT_DOUBLE_EQ(learning_rate(c, 0), 0.1);
  EXPECT_DOUBLE_EQ(learning_rate(c, 9), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(c, 10), 1.0);
  EXPECT_NEAR(learning_rate(c, 60), 0.55, 1e-12);  // halfway down the cosine
  EXPECT_NEAR(learning_rate(c, 110), 0.1, 1e-12);
}

}  // namespace
}  // namespace h2
