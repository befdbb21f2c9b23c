// The GPT-2 tokenizer: merges and pre-tokenisation on a tiny hand-made vocabulary, exact round trips on
// arbitrary bytes, and known GPT-2 token ids when the real files are present (scripts/fetch_data.sh).
#include "model/tokenizer.h"

#include <filesystem>
#include <tuple>

#include "core/rng.h"
#include "test_data.h"
#include "test_util.h"

namespace h2 {
namespace {

using ::testing::HasSubstr;
using testing_util::error_of;

class TinyTokenizer : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing_util::temp_dir("tiny_tokenizer");
    testing_util::write_tiny_tokenizer(dir_);
  }
  Gpt2Tokenizer load() { return Gpt2Tokenizer::load(dir_ + "/encoder.json", dir_ + "/vocab.bpe"); }
  std::string dir_;
};

TEST_F(TinyTokenizer, MergesByRank) {
  const Gpt2Tokenizer tok = load();
  EXPECT_EQ(tok.vocab_size(), 260);
  EXPECT_EQ(tok.eot_token(), 259);
  // " the" -> Ġ t h e -> (rank 0: h e) Ġ t he -> (rank 1: Ġ t) Ġt he -> (rank 2) Ġthe
  EXPECT_EQ(tok.encode(" the"), (std::vector<int32_t>{258}));
  // "the": no leading space, so only "h e" merges.
  EXPECT_EQ(tok.encode("the"), (std::vector<int32_t>{'t', 256}));
}

TEST_F(TinyTokenizer, SplitsLikeGpt2sPattern) {
  const Gpt2Tokenizer tok = load();
  // Pieces: "a" " the" "," "  " (two spaces at the end stay together).
  EXPECT_EQ(tok.encode("a the,  "), (std::vector<int32_t>{'a', 258, ',', ' ', ' '}));
  // "x  the": the space run gives back its last space, which leads " the".
  EXPECT_EQ(tok.encode("x  the"), (std::vector<int32_t>{'x', ' ', 258}));
  // A newline before a word stands alone: " the" does not absorb it.
  EXPECT_EQ(tok.encode("\nthe"), (std::vector<int32_t>{'\n', 't', 256}));
  // Contractions split off; digits and letters do not merge across classes.
  EXPECT_EQ(tok.encode("he's 42"), (std::vector<int32_t>{256, '\'', 's', ' ', '4', '2'}));
}

// Merging follows GPT-2's order (lowest rank first, the leftmost of equal ranks) on words of any length — checked
// against a direct, quadratic transcription of that rule with the tiny table's merges (h e; Ġ t; Ġt he) — and a
// word of a million bytes takes linear-logarithmic time (it used to take over two minutes: each merge rescanned
// the word).
TEST_F(TinyTokenizer, MergesLongWordsInGpt2sOrder) {
  const Gpt2Tokenizer tok = load();
  const auto reference = [](const std::string& piece) {
    std::vector<int32_t> s;
    for (unsigned char c : piece) s.push_back(c);  // the tiny table's byte tokens are the bytes themselves
    const std::vector<std::tuple<int32_t, int32_t, int32_t>> merges = {
        {'h', 'e', 256}, {' ', 't', 257}, {257, 256, 258}};
    while (true) {
      size_t best = s.size(), rank = merges.size();
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        for (size_t r = 0; r < rank; ++r) {
          if (s[i] == std::get<0>(merges[r]) && s[i + 1] == std::get<1>(merges[r])) best = i, rank = r;
        }
      }
      if (best == s.size()) return s;
      s[best] = std::get<2>(merges[rank]);
      s.erase(s.begin() + static_cast<long>(best) + 1);
    }
  };
  Rng rng(3);
  for (int trial = 0; trial < 100; ++trial) {
    std::string word = rng.below(2) ? " " : "";  // one piece: an optional space, then letters
    for (uint64_t i = 0, n = 1 + rng.below(300); i < n; ++i) word += "het"[rng.below(3)];
    EXPECT_EQ(tok.encode(word), reference(word)) << word;
  }
  std::string million;
  for (int i = 0; i < 500000; ++i) million += "he";
  const std::vector<int32_t> ids = tok.encode(million);
  EXPECT_EQ(ids, std::vector<int32_t>(500000, 256));
}

TEST_F(TinyTokenizer, RoundTripsArbitraryBytes) {
  const Gpt2Tokenizer tok = load();
  Rng rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    std::string s(rng.below(64), '\0');
    for (char& c : s) c = static_cast<char>(rng.below(256));
    const std::vector<int32_t> ids = tok.encode(s);
    EXPECT_EQ(tok.decode(ids), s);
  }
  const std::string utf8 = "naïve café — 日本語 🙂 the end";
  EXPECT_EQ(tok.decode(tok.encode(utf8)), utf8);
}

TEST_F(TinyTokenizer, BadFilesAreNamed) {
  EXPECT_THAT(error_of([&] { Gpt2Tokenizer::load(dir_ + "/missing.json", dir_ + "/vocab.bpe"); }, ErrorCode::kIo),
              HasSubstr("missing.json"));
  std::ofstream(dir_ + "/bad.json") << "{\"a\": ";
  EXPECT_THAT(error_of([&] { Gpt2Tokenizer::load(dir_ + "/bad.json", dir_ + "/vocab.bpe"); }, ErrorCode::kConfig),
              HasSubstr("bad.json: not valid JSON"));
  std::ofstream(dir_ + "/bad.bpe") << "#version: 0.2\nh e\nq z y\n";
  EXPECT_THAT(error_of([&] { Gpt2Tokenizer::load(dir_ + "/encoder.json", dir_ + "/bad.bpe"); }, ErrorCode::kConfig),
              HasSubstr("bad.bpe:3: expected two tokens"));
  EXPECT_THAT(error_of([&] { load().decode(std::vector<int32_t>{999}); }, ErrorCode::kInvalidArgument),
              HasSubstr("token id 999"));
}

// The real GPT-2 files: ids checked against the reference tokenizer's output.
class Gpt2Files : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string root = H2_SOURCE_DIR;
    if (!std::filesystem::exists(root + "/data/gpt2/encoder.json")) {
      GTEST_SKIP() << "data/gpt2 is missing: run scripts/fetch_data.sh (scripts/setup.sh does) to test against the "
                      "real GPT-2 vocabulary";
    }
    tok_ = std::make_unique<Gpt2Tokenizer>(
        Gpt2Tokenizer::load(root + "/data/gpt2/encoder.json", root + "/data/gpt2/vocab.bpe"));
  }
  std::unique_ptr<Gpt2Tokenizer> tok_;
};

TEST_F(Gpt2Files, KnownIds) {
  EXPECT_EQ(tok_->vocab_size(), 50257);
  EXPECT_EQ(tok_->eot_token(), 50256);
  EXPECT_EQ(tok_->encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(tok_->encode("Hello, world!"), (std::vector<int32_t>{15496, 11, 995, 0}));
  EXPECT_EQ(tok_->encode(" "), (std::vector<int32_t>{220}));
  EXPECT_EQ(tok_->encode("\n"), (std::vector<int32_t>{198}));
  EXPECT_EQ(tok_->encode("it's"), (std::vector<int32_t>{270, 338}));
}

TEST_F(Gpt2Files, RoundTripsTheCorpus) {
  const std::string root = H2_SOURCE_DIR;
  if (!std::filesystem::exists(root + "/data/text/chapter_1.txt")) GTEST_SKIP() << "data/text is missing";
  std::ifstream in(root + "/data/text/chapter_1.txt");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::vector<int32_t> ids = tok_->encode(text);
  EXPECT_EQ(tok_->decode(ids), text);
  EXPECT_LT(ids.size(), text.size() / 3);  // English compresses to roughly 4 bytes per token
}

}  // namespace
}  // namespace h2
