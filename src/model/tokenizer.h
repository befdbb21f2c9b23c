// GPT-2's byte-level BPE tokenizer (Radford et al. 2019), loading the standard `encoder.json` (token -> id) and
// `vocab.bpe` (merges in priority order) files.
//
// Text is first split into pieces as GPT-2's pattern does — contractions ('s 't 're 've 'm 'll 'd), an
// optional space followed by a run of letters, of digits, or of other symbols, and runs of whitespace — then
// each piece's bytes are merged pair by pair, lowest merge rank first. Every byte has a token, so any byte
// string encodes, and decode(encode(x)) == x exactly, for UTF-8 and for arbitrary bytes alike.
//
// Where this differs from the reference implementation: letters, digits and whitespace outside ASCII are
// classified by the C library's C.UTF-8 tables rather than Unicode's L/N/White_Space properties. They agree
// on nearly all text; where they differ (e.g. non-ASCII digits, which glibc counts as letters) a piece may be
// split differently, which changes token ids but never the round trip. Bytes that are not valid UTF-8 count as
// symbols. "<|endoftext|>" in the text is encoded as ordinary text; use eot_token() to insert the separator.
// Not thread-safe: encode() keeps a cache of pieces it has seen.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace h2 {

class Gpt2Tokenizer {
 public:
  // Throws Error(kIo) for a missing file and Error(kConfig) for malformed content, naming the file and line.
  static Gpt2Tokenizer load(const std::string& encoder_json_path, const std::string& vocab_bpe_path);

  std::vector<int32_t> encode(std::string_view text) const;
  std::string decode(std::span<const int32_t> ids) const;
  int vocab_size() const { return static_cast<int>(token_bytes_.size()); }
  int32_t eot_token() const { return eot_; }

 private:
  Gpt2Tokenizer() = default;
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

  std::vector<std::string> token_bytes_;  // id -> the bytes it stands for
  int32_t byte_token_[256] = {};          // byte -> its single-byte token
  struct Merge {
    int32_t rank;
    int32_t merged;
  };
  std::unordered_map<uint64_t, Merge> merges_;  // (left << 32 | right) -> merge
  int32_t eot_ = -1;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace h2
