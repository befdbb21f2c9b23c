// Test fixtures for the model and training tests: a tiny GPT-2-format tokenizer, token shards with a
// learnable pattern, and temporary folders.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/rng.h"
#include "model/dataset.h"

namespace h2::testing_util {

// A path under the test temp dir that no other test process uses: tests run in parallel (ctest -j), and
// several checkouts may test on one machine at once.
inline std::string temp_path(const std::string& name) {
  return (std::filesystem::path(::testing::TempDir()) / ("h2_" + std::to_string(getpid()) + "_" + name)).string();
}

// Removes this process's temporary files and folders (temp_path's prefix) when every test passed; a failed run
// keeps them to look at. Registered once per test program, before main (as gtest's documentation allows).
class TempCleanup final : public ::testing::Environment {
 public:
  void TearDown() override {
    if (!::testing::UnitTest::GetInstance()->Passed()) return;
    const std::string prefix = "h2_" + std::to_string(getpid()) + "_";
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(::testing::TempDir(), ec)) {
      if (entry.path().filename().string().rfind(prefix, 0) == 0) std::filesystem::remove_all(entry.path(), ec);
    }
  }
};
inline ::testing::Environment* const kTempCleanup = ::testing::AddGlobalTestEnvironment(new TempCleanup);

// A fresh empty folder under the test temp dir, private to this process.
inline std::string temp_dir(const std::string& name) {
  const std::filesystem::path p = temp_path(name);
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}

// Tokens from a noisy repeating pattern over `vocab` symbols: next-token prediction can learn it.
inline std::vector<int32_t> pattern_tokens(size_t n, int vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) {
    t[i] = rng.below(10) == 0 ? static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)))
                              : static_cast<int32_t>((i * 7 + i / 5) % static_cast<size_t>(vocab));
  }
  return t;
}

// Writes train and validation shards for a `vocab`-symbol pattern into `dir`; returns the dir.
inline std::string write_pattern_shards(const std::string& dir, int vocab) {
  write_token_shard(dir + "/train_000.bin", pattern_tokens(6000, vocab, 1));
  write_token_shard(dir + "/train_001.bin", pattern_tokens(3000, vocab, 2));
  write_token_shard(dir + "/val_000.bin", pattern_tokens(2000, vocab, 3));
  return dir;
}

// GPT-2's bytes_to_unicode(), written out again here as the tests' independent copy.
inline std::string byte_char(int b) {
  int cp;
  if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) {
    cp = b;
  } else {
    int n = 0;
    for (int x = 0; x < b; ++x) {
      if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF))) ++n;
    }
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// A GPT-2-format tokenizer with the 256 byte tokens (ids 0..255 in byte order), then the merges
// "h e" -> "he" (256), "Ġ t" -> "Ġt" (257), "Ġt he" -> "Ġthe" (258), and <|endoftext|> (259).
inline void write_tiny_tokenizer(const std::string& dir) {
  std::string json = "{";
  for (int b = 0; b < 256; ++b) {
    std::string key = byte_char(b);
    if (key == "\"" || key == "\\") key = "\\" + key;
    json += "\"" + key + "\": " + std::to_string(b) + ", ";
  }
  json += "\"he\": 256, \"" + byte_char(' ') + "t\": 257, \"" + byte_char(' ') + "the\": 258, \"<|endoftext|>\": 259}";
  std::ofstream(dir + "/encoder.json") << json;
  std::ofstream(dir + "/vocab.bpe") << "#version: 0.2\nh e\n" << byte_char(' ') << " t\n" << byte_char(' ') << "t he\n";
}

}  // namespace h2::testing_util
