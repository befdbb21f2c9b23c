// Text generation and dataset preparation, as `h2 sample` and `h2 data prepare` run them.
#include "model/sample.h"

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "core/file.h"
#include "device/registry.h"
#include "model/prepare.h"
#include "test_data.h"
#include "test_util.h"

namespace h2 {
namespace {

using testing_util::error_of;

TEST(PickToken, GreedyIsTheArgmaxAndTopKDrawsBySoftmax) {
  Rng rng(1);
  const std::vector<float> logits = {0.0f, 2.0f, std::log(3.0f) + 2.0f, -5.0f};
  EXPECT_EQ(pick_token(logits, 1, 1.0, rng), 2);
  EXPECT_EQ(pick_token(logits, 40, 0.0, rng), 2);  // temperature 0: greedy
  // Top 2 at temperature 1: tokens 2 and 1 with probabilities 3/4 and 1/4; never the others.
  std::map<int32_t, int> seen;
  for (int i = 0; i < 20000; ++i) ++seen[pick_token(logits, 2, 1.0, rng)];
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_NEAR(seen[2] / 20000.0, 0.75, 0.015);
  EXPECT_NEAR(seen[1] / 20000.0, 0.25, 0.015);
}

// Greedy generation against the model run by hand: each next token is the argmax of the last position's logits
// of a forward over the whole context so far (here shorter than the window, so no truncation).
TEST(Generate, GreedyContinuesWithTheArgmaxOfEachForward) {
  const GptConfig config{.n_layer = 2, .n_head = 2, .n_embd = 16, .vocab_size = 32, .seq_len = 16};
  auto dev = create_device(DeviceSpec{.backend = "cpu"});
  Gpt model(config, *dev, GptRange::whole(config), 1, config.seq_len);
  model.init(5);
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5};
  const std::vector<int32_t> got = generate(model, prompt, SampleOptions{.tokens = 6, .top_k = 1});
  ASSERT_EQ(got.size(), 6u);
  std::vector<int32_t> context = prompt;
  for (int32_t g : got) {
    Gpt fresh(config, *dev, GptRange::whole(config), 1, static_cast<int>(context.size()));
    fresh.init(5);
    Tensor tokens = dev->empty(DType::kI32, {1, static_cast<int64_t>(context.size())});
    copy_from_host(tokens, context.data());
    fresh.forward(tokens);
    std::vector<float> logits(static_cast<size_t>(fresh.logits().numel()));
    copy_to_host(logits.data(), fresh.logits());
    const float* last = logits.data() + (context.size() - 1) * config.vocab_size;
    const int32_t argmax = static_cast<int32_t>(std::max_element(last, last + config.vocab_size) - last);
    EXPECT_EQ(g, argmax);
    context.push_back(argmax);
  }
  EXPECT_THAT(error_of([&] { generate(model, {}, {}); }, ErrorCode::kInvalidArgument), ::testing::HasSubstr("empty"));
}

// Two documents "abab" and "ba" with the tiny tokenizer: <eot> a b a b <eot> b a, 8 tokens; a quarter held out.
TEST(Prepare, ShardsMetaAndEntropy) {
  const std::string dir = testing_util::temp_dir("prepare");
  testing_util::write_tiny_tokenizer(dir);
  const Gpt2Tokenizer tok = Gpt2Tokenizer::load(dir + "/encoder.json", dir + "/vocab.bpe");
  write_file_atomic(dir + "/one.txt", "abab");
  write_file_atomic(dir + "/two.txt", "ba");
  const PrepareResult r = prepare_dataset({dir + "/one.txt", dir + "/two.txt"}, tok,
                                          {.out = dir + "/tokens", .val_fraction = 0.25, .shard_tokens = 4});
  EXPECT_EQ(r.tokens, 8u);
  EXPECT_EQ(r.val_tokens, 2u);
  EXPECT_EQ(r.train_shards, 2);  // 6 train tokens in shards of 4
  EXPECT_EQ(TokenShard(dir + "/tokens/train_000.bin").size(), 4u);
  EXPECT_EQ(TokenShard(dir + "/tokens/train_001.bin").size(), 2u);
  const TokenShard val(dir + "/tokens/val_000.bin");
  ASSERT_EQ(val.size(), 2u);
  uint16_t first[2] = {};
  val.read(0, 2, first);
  EXPECT_EQ(first[0], 'b');
  EXPECT_EQ(first[1], 'a');
  // Train tokens <eot> a b a b <eot>: frequencies 2/6 each, entropy ln 3.
  EXPECT_NEAR(r.unigram_entropy_nats, std::log(3.0), 1e-12);
  const auto meta = nlohmann::json::parse(read_file(dir + "/tokens/meta.json"));
  EXPECT_EQ(meta["train_tokens"], 6);
  EXPECT_NEAR(meta["unigram_entropy_nats"].get<double>(), std::log(3.0), 1e-12);
  EXPECT_THAT(
      error_of([&] { prepare_dataset({dir + "/one.txt"}, tok, {.val_fraction = 1.0}); }, ErrorCode::kInvalidArgument),
      ::testing::HasSubstr("--val-fraction must be in [0, 1)"));
}

}  // namespace
}  // namespace h2
