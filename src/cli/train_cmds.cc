// `h2 data prepare`, `h2 train` and `h2 sample`: the single-device GPT workflow.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "core/file.h"
#include "core/rng.h"
#include "device/registry.h"
#include "model/dataset.h"
#include "model/gpt.h"
#include "model/tokenizer.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace h2::cli {
namespace fs = std::filesystem;
namespace {

// Set by SIGINT/SIGTERM while `h2 train` runs: the trainer finishes its step, checkpoints and returns.
std::atomic<bool> g_stop{false};
extern "C" void request_stop(int) { g_stop = true; }

constexpr const char* kDefaultEncoder = "data/gpt2/encoder.json";
constexpr const char* kDefaultVocab = "data/gpt2/vocab.bpe";

// Shannon entropy (nats) of the token frequencies: the loss of the best model that ignores context.
double unigram_entropy(const std::vector<int32_t>& tokens) {
  std::map<int32_t, int64_t> counts;
  for (int32_t t : tokens) ++counts[t];
  double h = 0.0;
  for (const auto& [t, n] : counts) {
    const double p = static_cast<double>(n) / static_cast<double>(tokens.size());
    h -= p * std::log(p);
  }
  return h;
}

int prepare(const std::vector<std::string>& inputs, const std::string& out, double val_fraction, int64_t shard_tokens,
            const std::string& encoder, const std::string& vocab) {
  if (inputs.empty()) throw Error(ErrorCode::kInvalidArgument, "data prepare: give at least one text file");
  if (!(val_fraction >= 0.0 && val_fraction < 1.0)) {
    throw Error(ErrorCode::kInvalidArgument, cat("--val-fraction must be in [0, 1), got ", val_fraction));
  }
  const Gpt2Tokenizer tok = Gpt2Tokenizer::load(encoder, vocab);
  std::vector<int32_t> tokens;
  size_t bytes = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (const std::string& path : inputs) {
    const std::string text = read_file(path);
    bytes += text.size();
    tokens.push_back(tok.eot_token());  // each document starts with <|endoftext|>, as in llm.c's shards
    const std::vector<int32_t> ids = tok.encode(text);
    tokens.insert(tokens.end(), ids.begin(), ids.end());
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto val_count = static_cast<size_t>(static_cast<double>(tokens.size()) * val_fraction);
  const size_t train_count = tokens.size() - val_count;
  fs::create_directories(out);
  int shards = 0;
  for (size_t begin = 0; begin < train_count; begin += static_cast<size_t>(shard_tokens)) {
    const size_t end = std::min(train_count, begin + static_cast<size_t>(shard_tokens));
    char name[32];
    std::snprintf(name, sizeof(name), "train_%03d.bin", shards++);
    write_token_shard((fs::path(out) / name).string(), std::span(tokens).subspan(begin, end - begin));
  }
  if (val_count > 0)
    write_token_shard((fs::path(out) / "val_000.bin").string(), std::span(tokens).subspan(train_count));
  const std::vector<int32_t> train_tokens(tokens.begin(), tokens.begin() + static_cast<long>(train_count));
  const double entropy = unigram_entropy(train_tokens);
  const nlohmann::ordered_json meta = {
      {"inputs", inputs},        {"bytes", bytes},         {"train_tokens", train_count},
      {"val_tokens", val_count}, {"train_shards", shards}, {"unigram_entropy_nats", entropy}};
  write_file_atomic((fs::path(out) / "meta.json").string(), meta.dump(2) + "\n");
  std::printf(
      "tokenized %zu bytes into %zu tokens at %.1f MB/s; %zu train tokens in %d shard(s), %zu validation "
      "tokens, in %s\nunigram entropy of the train tokens: %.3f nats (the loss of a model that ignores "
      "context)\n",
      bytes, tokens.size(), static_cast<double>(bytes) / seconds * 1e-6, train_count, shards, val_count, out.c_str(),
      entropy);
  return 0;
}

// Picks the next token from logits: greedy (top_k = 1) or sampled from the top k at a temperature.
int32_t pick(const std::vector<float>& logits, int top_k, double temperature, Rng& rng) {
  std::vector<int32_t> idx(logits.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int32_t>(i);
  const size_t k = std::clamp<size_t>(static_cast<size_t>(top_k), 1, idx.size());
  std::partial_sort(idx.begin(), idx.begin() + static_cast<long>(k), idx.end(), [&](int32_t a, int32_t b) {
    return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)];
  });
  if (k == 1 || temperature <= 0) return idx[0];
  std::vector<double> p(k);
  double sum = 0.0;
  for (size_t i = 0; i < k; ++i) {
    p[i] = std::exp((logits[static_cast<size_t>(idx[i])] - logits[static_cast<size_t>(idx[0])]) / temperature);
    sum += p[i];
  }
  double u = rng.uniform() * sum;
  for (size_t i = 0; i < k; ++i) {
    if ((u -= p[i]) <= 0) return idx[i];
  }
  return idx[k - 1];
}

}  // namespace

void register_train(CLI::App& app, Command& selected) {
  // --- h2 data prepare ---
  CLI::App* data = app.add_subcommand("data", "Token datasets");
  data->require_subcommand(1);
  CLI::App* prep = data->add_subcommand("prepare", "Tokenize text files into llm.c-style .bin token shards");
  struct PrepOptions {
    std::vector<std::string> inputs;
    std::string out = "data/tokens";
    double val_fraction = 0.1;
    int64_t shard_tokens = 100'000'000;
    std::string encoder = kDefaultEncoder, vocab = kDefaultVocab;
  };
  auto po = std::make_shared<PrepOptions>();
  prep->add_option("files", po->inputs, "text files, one document each")->required()->check(CLI::ExistingFile);
  prep->add_option("--out", po->out, "output folder")->capture_default_str();
  prep->add_option("--val-fraction", po->val_fraction, "share of tokens held out for validation")
      ->capture_default_str();
  prep->add_option("--shard-tokens", po->shard_tokens, "tokens per train shard")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  prep->add_option("--encoder", po->encoder, "GPT-2 encoder.json")->capture_default_str();
  prep->add_option("--vocab", po->vocab, "GPT-2 vocab.bpe")->capture_default_str();
  prep->callback([po, &selected] {
    selected = [po] {
      return prepare(po->inputs, po->out, po->val_fraction, po->shard_tokens, po->encoder, po->vocab);
    };
  });

  // --- h2 train ---
  CLI::App* tr = app.add_subcommand(
      "train",
      "Train the GPT: with no arguments the built-in heterogeneous example; --config F on one device; --cluster C "
      "across a cluster");
  struct TrainCmd {
    std::string config = "examples/train_moby.yaml";
    std::vector<std::string> overrides;
    bool resume = false, quiet = false;
    std::string resume_from;
  };
  auto to = std::make_shared<TrainCmd>();
  tr->add_option("--config", to->config, "training config (model, data, optim, train, device)")->capture_default_str();
  tr->add_option("--set", to->overrides, "override a config field, e.g. --set train.steps=20 (repeatable)");
  tr->add_flag("--resume", to->resume, "continue from the newest checkpoint in train.out_dir");
  tr->add_option("--resume-from", to->resume_from, "continue from this checkpoint folder");
  tr->add_flag("--quiet", to->quiet, "no progress lines");
  auto ho = std::make_shared<HeteroTrainCmd>();
  tr->add_option("--cluster", ho->cluster,
                 "train across this cluster's devices: plan, then one process per device (emulated chips here)");
  tr->add_option("--model", ho->model, "with --cluster: the planner's model file (replaces the config's model)");
  tr->add_option("--train", ho->train, "with --cluster: the planner's train setup (global batch, zero1, ...)");
  tr->add_option("--plan", ho->plan, "with --cluster: run this plan.json instead of planning");
  tr->add_flag("--profile", ho->profile,
               "with --cluster: measure the chips and links first (h2 profile), plan on that");
  tr->add_flag("--as-rank", ho->as_rank, "internal: run one rank of a --cluster job")->group("");
  tr->callback([tr, to, ho, &selected] {
    // No arguments: the built-in heterogeneous example (README's main job).
    if (tr->count("--config") == 0 && ho->cluster.empty() && to->resume_from.empty()) {
      to->config = "examples/train_cluster.yaml";
      ho->cluster = "examples/cluster_local.yaml";
      ho->model = "examples/model_small.yaml";
      ho->train = "examples/train_local.yaml";
      ho->profile = ho->plan.empty();
    }
    if (!ho->cluster.empty()) {
      ho->config = to->config;
      ho->overrides = to->overrides;
      ho->quiet = to->quiet;
      ho->resume = to->resume;
      if (!to->resume_from.empty()) throw CLI::ValidationError("--resume-from", "with --cluster, use --resume");
      selected = [ho] { return run_hetero_train(*ho); };
      return;
    }
    if (!ho->model.empty() || !ho->train.empty() || !ho->plan.empty() || ho->profile) {
      throw CLI::ValidationError("--model, --train and --plan", "need --cluster");
    }
    selected = [to] {
      ConfigNode root = ConfigNode::load_file(to->config);
      for (const std::string& o : to->overrides) root.apply_override(o);
      const TrainConfig config = TrainConfig::from_config(root);
      std::signal(SIGINT, request_stop);
      std::signal(SIGTERM, request_stop);
      const TrainResult r = train(
          config,
          TrainOptions{
              .resume = to->resume, .resume_from = to->resume_from, .quiet = to->quiet, .stop_requested = &g_stop});
      std::signal(SIGINT, SIG_DFL);
      std::signal(SIGTERM, SIG_DFL);
      if (r.interrupted) return 130;  // the shell's convention for a run ended by SIGINT
      std::printf("done: %lld steps, last loss %.4f", static_cast<long long>(r.steps_done), r.last_loss);
      if (r.val_loss >= 0) std::printf(", val loss %.4f", r.val_loss);
      std::printf(", %.0f tokens/s; metrics and checkpoints in %s\n", r.tokens_per_second, config.out_dir.c_str());
      return 0;
    };
  });

  // --- h2 sample ---
  CLI::App* sa = app.add_subcommand("sample", "Generate text from a checkpoint");
  struct SampleCmd {
    std::string run = "runs/moby", checkpoint, prompt = "\n", encoder = kDefaultEncoder, vocab = kDefaultVocab;
    int tokens = 100, top_k = 40;
    double temperature = 1.0;
    uint64_t seed = 1;
  };
  auto so = std::make_shared<SampleCmd>();
  sa->add_option("--run", so->run, "a training run's out_dir: sample from its newest checkpoint")
      ->capture_default_str();
  sa->add_option("--checkpoint", so->checkpoint, "or this checkpoint folder");
  sa->add_option("--prompt", so->prompt, "text to continue");
  sa->add_option("--tokens", so->tokens, "tokens to generate")->check(CLI::PositiveNumber)->capture_default_str();
  sa->add_option("--top-k", so->top_k, "sample among the k likeliest tokens; 1 = greedy")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sa->add_option("--temperature", so->temperature, "softmax temperature")->capture_default_str();
  sa->add_option("--seed", so->seed, "sampling seed")->capture_default_str();
  sa->add_option("--encoder", so->encoder, "GPT-2 encoder.json")->capture_default_str();
  sa->add_option("--vocab", so->vocab, "GPT-2 vocab.bpe")->capture_default_str();
  sa->callback([so, &selected] {
    selected = [so] {
      const std::string ckpt =
          so->checkpoint.empty() ? latest_checkpoint((fs::path(so->run) / "checkpoints").string()) : so->checkpoint;
      const CheckpointState state = read_checkpoint_state(ckpt);
      const Gpt2Tokenizer tok = Gpt2Tokenizer::load(so->encoder, so->vocab);
      auto device = create_device(DeviceSpec{.backend = "cpu"});
      const int T = state.model.seq_len;
      Gpt model(state.model, *device, GptRange::whole(state.model), 1, T);
      load_checkpoint(ckpt, model, nullptr);
      std::vector<int32_t> context = tok.encode(so->prompt);
      if (context.empty()) context.push_back(tok.eot_token());
      Tensor tokens = device->zeros(DType::kI32, {1, T});
      std::vector<float> row(static_cast<size_t>(state.model.vocab_size));
      Rng rng(so->seed);
      std::fputs(so->prompt.c_str(), stdout);
      for (int i = 0; i < so->tokens; ++i) {
        // The last T tokens; positions past the context hold zeros, which causal attention never lets the
        // context see.
        const size_t start = context.size() > static_cast<size_t>(T) ? context.size() - static_cast<size_t>(T) : 0;
        std::vector<int32_t> window(static_cast<size_t>(T), 0);
        std::copy(context.begin() + static_cast<long>(start), context.end(), window.begin());
        copy_from_host(tokens, window.data());
        model.forward(tokens);
        const int64_t last = static_cast<int64_t>(context.size() - start) - 1;
        copy_to_host(row.data(), model.logits().reshape({T, state.model.vocab_size}).slice(last, last + 1));
        const int32_t next = pick(row, so->top_k, so->temperature, rng);
        context.push_back(next);
        std::fputs(tok.decode(std::span(&next, 1)).c_str(), stdout);
        std::fflush(stdout);
      }
      std::fputs("\n", stdout);
      return 0;
    };
  });
}

}  // namespace h2::cli
