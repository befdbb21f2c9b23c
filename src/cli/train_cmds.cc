// `h2 data prepare`, `h2 train` and `h2 sample`: the single-device GPT workflow (and `h2 train --cluster`'s flags).
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "core/signals.h"
#include "device/registry.h"
#include "model/prepare.h"
#include "model/sample.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace h2::cli {
namespace fs = std::filesystem;
namespace {

constexpr const char* kDefaultEncoder = "data/gpt2/encoder.json";
constexpr const char* kDefaultVocab = "data/gpt2/vocab.bpe";

struct PrepareCmd {
  std::vector<std::string> inputs;
  PrepareOptions options;
  std::string encoder = kDefaultEncoder, vocab = kDefaultVocab;
};

int run_prepare(const PrepareCmd& o) {
  const PrepareResult r = prepare_dataset(o.inputs, Gpt2Tokenizer::load(o.encoder, o.vocab), o.options);
  std::printf(
      "tokenized %zu bytes into %zu tokens at %.1f MB/s; %zu train tokens in %d shard(s), %zu validation "
      "tokens, in %s\nunigram entropy of the train tokens: %.3f nats (the loss of a model that ignores "
      "context)\n",
      r.bytes, r.tokens, static_cast<double>(r.bytes) / r.seconds * 1e-6, r.train_tokens, r.train_shards, r.val_tokens,
      o.options.out.c_str(), r.unigram_entropy_nats);
  return 0;
}

struct TrainCmd {
  std::string config = "examples/train_moby.yaml";
  std::vector<std::string> overrides;
  bool resume = false, quiet = false;
  std::string resume_from;
};

int run_train(const TrainCmd& o) {
  ConfigNode root = ConfigNode::load_file(o.config);
  for (const std::string& a : o.overrides) root.apply_override(a);
  const TrainConfig config = TrainConfig::from_config(root);
  const TrainResult r = train(
      config,
      TrainOptions{
          .resume = o.resume, .resume_from = o.resume_from, .quiet = o.quiet, .stop_requested = &stop_on_signals()});
  default_signals();
  if (r.interrupted) return 130;  // the shell's convention for a run ended by SIGINT
  std::printf("done: %lld steps, last loss %.4f", static_cast<long long>(r.steps_done), r.last_loss);
  if (r.val_loss >= 0) std::printf(", val loss %.4f", r.val_loss);
  std::printf(", %.0f tokens/s; metrics and checkpoints in %s\n", r.tokens_per_second, config.out_dir.c_str());
  return 0;
}

struct SampleCmd {
  std::string run = "runs/moby", checkpoint, prompt = "\n", encoder = kDefaultEncoder, vocab = kDefaultVocab;
  SampleOptions options;
};

int run_sample(const SampleCmd& o) {
  std::vector<std::string> skipped;
  const std::string ckpt =
      o.checkpoint.empty() ? resume_checkpoint((fs::path(o.run) / "checkpoints").string(), &skipped) : o.checkpoint;
  for (const std::string& s : skipped) std::fprintf(stderr, "warning: not sampling from %s\n", s.c_str());
  const CheckpointState state = read_checkpoint_state(ckpt);
  const Gpt2Tokenizer tok = Gpt2Tokenizer::load(o.encoder, o.vocab);
  auto device = create_device(DeviceSpec{.backend = "cpu"});
  Gpt model(state.model, *device, GptRange::whole(state.model), 1, state.model.seq_len);
  load_checkpoint(ckpt, model, nullptr);
  std::vector<int32_t> context = tok.encode(o.prompt);
  if (context.empty()) context.push_back(tok.eot_token());
  std::fputs(o.prompt.c_str(), stdout);
  generate(model, context, o.options, [&](int32_t next) {
    std::fputs(tok.decode(std::span(&next, 1)).c_str(), stdout);
    std::fflush(stdout);
  });
  std::fputs("\n", stdout);
  return 0;
}

void register_data(CLI::App& app, Command& selected) {
  CLI::App* data = app.add_subcommand("data", "Token datasets");
  data->require_subcommand(1);
  CLI::App* prep = data->add_subcommand("prepare", "Tokenize text files into llm.c-style .bin token shards");
  auto o = std::make_shared<PrepareCmd>();
  prep->add_option("files", o->inputs, "text files, one document each")->required()->check(CLI::ExistingFile);
  prep->add_option("--out", o->options.out, "output folder")->capture_default_str();
  prep->add_option("--val-fraction", o->options.val_fraction, "share of tokens held out for validation")
      ->capture_default_str();
  prep->add_option("--shard-tokens", o->options.shard_tokens, "tokens per train shard")
      ->check(kPositive)
      ->capture_default_str();
  prep->add_option("--encoder", o->encoder, "GPT-2 encoder.json")->capture_default_str();
  prep->add_option("--vocab", o->vocab, "GPT-2 vocab.bpe")->capture_default_str();
  prep->callback([o, &selected] { selected = [o] { return run_prepare(*o); }; });
}

void register_sample(CLI::App& app, Command& selected) {
  CLI::App* sa = app.add_subcommand("sample", "Generate text from a checkpoint");
  auto o = std::make_shared<SampleCmd>();
  sa->add_option("--run", o->run, "a training run's out_dir: sample from its newest checkpoint")->capture_default_str();
  sa->add_option("--checkpoint", o->checkpoint, "or this checkpoint folder");
  sa->add_option("--prompt", o->prompt, "text to continue");
  sa->add_option("--tokens", o->options.tokens, "tokens to generate")->check(kPositive)->capture_default_str();
  sa->add_option("--top-k", o->options.top_k, "sample among the k likeliest tokens; 1 = greedy")
      ->check(kPositive)
      ->capture_default_str();
  sa->add_option("--temperature", o->options.temperature, "softmax temperature")->capture_default_str();
  sa->add_option("--seed", o->options.seed, "sampling seed")->capture_default_str();
  sa->add_option("--encoder", o->encoder, "GPT-2 encoder.json")->capture_default_str();
  sa->add_option("--vocab", o->vocab, "GPT-2 vocab.bpe")->capture_default_str();
  sa->callback([o, &selected] { selected = [o] { return run_sample(*o); }; });
}

}  // namespace

void register_train(CLI::App& app, Command& selected) {
  register_data(app, selected);
  register_sample(app, selected);
  CLI::App* tr = app.add_subcommand(
      "train",
      "Train the GPT: with no arguments the built-in heterogeneous example; --config F on one device; --cluster C "
      "across a cluster");
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
  tr->add_flag("--elastic", ho->elastic,
               "with --cluster: when a rank dies, re-plan on the devices left, resume the newest checkpoint, go on");
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
    if (!ho->model.empty() || !ho->train.empty() || !ho->plan.empty() || ho->profile || ho->elastic) {
      throw CLI::ValidationError("--model, --train, --plan, --profile and --elastic", "need --cluster");
    }
    selected = [to] { return run_train(*to); };
  });
}

}  // namespace h2::cli
