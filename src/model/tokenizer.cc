// GPT-2 BPE: file loading, pre-tokenisation, merging, decoding.
#include "model/tokenizer.h"

#include <locale.h>
#include <wctype.h>

#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>

#include "core/error.h"
#include "core/file.h"

namespace h2 {
namespace {

// GPT-2's bytes_to_unicode(): printable bytes stand for themselves, the others for code points 256 + n, so
// that every byte is a visible character in encoder.json.
std::vector<uint32_t> byte_code_points() {
  std::vector<uint32_t> cp(256, 0);
  std::vector<bool> printable(256, false);
  for (int b = '!'; b <= '~'; ++b) printable[static_cast<size_t>(b)] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) printable[static_cast<size_t>(b)] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) printable[static_cast<size_t>(b)] = true;
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b)
    cp[static_cast<size_t>(b)] = printable[static_cast<size_t>(b)] ? static_cast<uint32_t>(b) : next++;
  return cp;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Decodes one UTF-8 code point at text[i]; an invalid or truncated sequence is one byte long with cp = -1.
struct CodePoint {
  int32_t cp;
  size_t len;
};
CodePoint decode_utf8(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = byte(i);
  if (c < 0x80) return {c, 1};
  size_t len = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 0;
  if (len == 0 || i + len > text.size()) return {-1, 1};
  int32_t cp = c & (0x7F >> len);
  for (size_t k = 1; k < len; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return {-1, 1};
    cp = (cp << 6) | (byte(i + k) & 0x3F);
  }
  // Overlong forms and surrogates are invalid.
  if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF)) {
    return {-1, 1};
  }
  return {cp, len};
}

enum class CharClass { kLetter, kNumber, kSpace, kOther };

locale_t utf8_locale() {
  static locale_t loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(0));
  return loc;
}

CharClass classify(int32_t cp) {
  if (cp < 0) return CharClass::kOther;
  if (cp < 0x80) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return CharClass::kLetter;
    if (cp >= '0' && cp <= '9') return CharClass::kNumber;
    if (cp == ' ' || (cp >= '\t' && cp <= '\r')) return CharClass::kSpace;
    return CharClass::kOther;
  }
  const locale_t loc = utf8_locale();
  if (loc == static_cast<locale_t>(0)) return CharClass::kLetter;  // no Unicode tables: a best guess
  const auto wc = static_cast<wint_t>(cp);
  if (iswspace_l(wc, loc)) return CharClass::kSpace;
  if (iswdigit_l(wc, loc)) return CharClass::kNumber;
  if (iswalpha_l(wc, loc)) return CharClass::kLetter;
  return CharClass::kOther;
}

}  // namespace

Gpt2Tokenizer Gpt2Tokenizer::load(const std::string& encoder_json_path, const std::string& vocab_bpe_path) {
  Gpt2Tokenizer tok;
  nlohmann::json encoder;
  try {
    encoder = nlohmann::json::parse(read_file(encoder_json_path));
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kConfig, cat(encoder_json_path, ": not valid JSON: ", e.what()));
  }
  if (!encoder.is_object() || encoder.empty()) {
    throw Error(ErrorCode::kConfig, cat(encoder_json_path, ": expected a JSON object mapping tokens to ids"));
  }
  std::unordered_map<std::string, int32_t> ids;
  tok.token_bytes_.resize(encoder.size());
  // Inverse of bytes_to_unicode, for turning a token's characters back into bytes.
  const std::vector<uint32_t> cps = byte_code_points();
  std::unordered_map<uint32_t, unsigned char> cp_byte;
  for (int b = 0; b < 256; ++b) cp_byte[cps[static_cast<size_t>(b)]] = static_cast<unsigned char>(b);
  for (const auto& [key, value] : encoder.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() >= static_cast<int64_t>(encoder.size())) {
      throw Error(ErrorCode::kConfig, cat(encoder_json_path, ": token '", key, "' has id ", value.dump(),
                                          "; ids must be 0 .. ", encoder.size() - 1));
    }
    const auto id = value.get<int32_t>();
    ids[key] = id;
    std::string bytes;
    for (size_t i = 0; i < key.size();) {
      const CodePoint c = decode_utf8(key, i);
      const auto it = cp_byte.find(static_cast<uint32_t>(c.cp));
      if (c.cp < 0 || it == cp_byte.end()) {
        if (key == "<|endoftext|>") break;  // a special token: its text stays as written
        throw Error(ErrorCode::kConfig,
                    cat(encoder_json_path, ": token '", key, "' has a character outside GPT-2's byte alphabet"));
      }
      bytes += static_cast<char>(it->second);
      i += c.len;
    }
    tok.token_bytes_[static_cast<size_t>(id)] = key == "<|endoftext|>" ? key : bytes;
  }
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    append_utf8(ch, cps[static_cast<size_t>(b)]);
    const auto it = ids.find(ch);
    if (it == ids.end()) {
      throw Error(ErrorCode::kConfig, cat(encoder_json_path, ": no token for byte ", b, "; not a GPT-2 encoder file"));
    }
    tok.byte_token_[b] = it->second;
  }
  if (const auto it = ids.find("<|endoftext|>"); it != ids.end()) tok.eot_ = it->second;

  std::istringstream merges(read_file(vocab_bpe_path));
  std::string line;
  int line_no = 0, rank = 0;
  while (std::getline(merges, line)) {
    ++line_no;
    if (line.empty() || line.starts_with("#version")) continue;
    const size_t space = line.find(' ');
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
      throw Error(ErrorCode::kConfig, cat(vocab_bpe_path, ":", line_no, ": expected two tokens separated by a space"));
    }
    const std::string left = line.substr(0, space), right = line.substr(space + 1);
    const auto l = ids.find(left), r = ids.find(right), m = ids.find(left + right);
    if (l == ids.end() || r == ids.end() || m == ids.end()) {
      throw Error(ErrorCode::kConfig, cat(vocab_bpe_path, ":", line_no, ": merge '", line,
                                          "' uses a token missing from ", encoder_json_path));
    }
    const uint64_t key = (static_cast<uint64_t>(l->second) << 32) | static_cast<uint32_t>(r->second);
    tok.merges_.try_emplace(key, Merge{rank++, m->second});
  }
  if (rank == 0) throw Error(ErrorCode::kConfig, cat(vocab_bpe_path, ": contains no merges"));
  return tok;
}

// Byte-pair merging of one piece: repeatedly merge the adjacent pair with the lowest rank.
void Gpt2Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  const auto cached = cache_.find(std::string(piece));
  if (cached != cache_.end()) {
    out.insert(out.end(), cached->second.begin(), cached->second.end());
    return;
  }
  // The lowest-ranked adjacent pair first, the leftmost of equal ranks (GPT-2's order), in O(n log n): symbols in
  // a linked list, candidate pairs in a heap, a popped pair skipped when either symbol has changed since.
  const int n = static_cast<int>(piece.size());
  std::vector<int32_t> sym(static_cast<size_t>(n));
  std::vector<int> next(static_cast<size_t>(n)), prev(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    sym[static_cast<size_t>(i)] = byte_token_[static_cast<unsigned char>(piece[static_cast<size_t>(i)])];
    next[static_cast<size_t>(i)] = i + 1 < n ? i + 1 : -1;
    prev[static_cast<size_t>(i)] = i - 1;
  }
  struct Candidate {
    int32_t rank;
    int left;      // the pair's left symbol's position
    int32_t a, b;  // the symbols it was found with
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  const auto push = [&](int left) {
    const int right = left >= 0 ? next[static_cast<size_t>(left)] : -1;
    if (right < 0) return;
    const int32_t a = sym[static_cast<size_t>(left)], b = sym[static_cast<size_t>(right)];
    const auto it = merges_.find((static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b));
    if (it != merges_.end()) heap.push({it->second.rank, left, a, b});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  std::vector<bool> gone(static_cast<size_t>(n), false);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const auto l = static_cast<size_t>(c.left);
    const int right = next[l];
    if (gone[l] || right < 0 || sym[l] != c.a || sym[static_cast<size_t>(right)] != c.b) continue;  // stale
    sym[l] = merges_.at((static_cast<uint64_t>(c.a) << 32) | static_cast<uint32_t>(c.b)).merged;
    gone[static_cast<size_t>(right)] = true;
    next[l] = next[static_cast<size_t>(right)];
    if (next[l] >= 0) prev[static_cast<size_t>(next[l])] = c.left;
    push(prev[l]);
    push(c.left);
  }
  std::vector<int32_t> syms;
  for (int i = n > 0 ? 0 : -1; i >= 0; i = next[static_cast<size_t>(i)]) syms.push_back(sym[static_cast<size_t>(i)]);
  if (cache_.size() > 200000) cache_.clear();  // bound the memory a long, varied text can take
  cache_.emplace(std::string(piece), syms);
  out.insert(out.end(), syms.begin(), syms.end());
}

// Pre-tokenisation, following GPT-2's pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// alternative by alternative, in order.
std::vector<int32_t> Gpt2Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3);
  auto cls_at = [&](size_t i) { return classify(decode_utf8(text, i).cp); };
  auto run_end = [&](size_t i, CharClass cls) {  // end of the run of `cls` characters starting at i
    while (i < text.size()) {
      const CodePoint c = decode_utf8(text, i);
      if (classify(c.cp) != cls) break;
      i += c.len;
    }
    return i;
  };
  size_t i = 0;
  while (i < text.size()) {
    size_t end = 0;
    if (text[i] == '\'') {
      for (std::string_view suffix : {"s", "t", "re", "ve", "m", "ll", "d"}) {
        if (text.substr(i + 1, suffix.size()) == suffix) {
          end = i + 1 + suffix.size();
          break;
        }
      }
    }
    if (end == 0) {
      const size_t start = text[i] == ' ' && i + 1 < text.size() ? i + 1 : i;
      const CharClass cls = cls_at(start);
      if (cls != CharClass::kSpace) {
        end = run_end(start, cls);
      } else {
        // Whitespace: the whole run at the end of the text; otherwise all but its last character, which
        // then leads the next piece (or stands alone when it is not a plain space).
        const size_t ws_end = run_end(i, CharClass::kSpace);
        if (ws_end == text.size()) {
          end = ws_end;
        } else {
          size_t last = i, k = i;
          while (k < ws_end) last = k, k += decode_utf8(text, k).len;
          end = last > i ? last : ws_end;
        }
      }
    }
    encode_piece(text.substr(i, end - i), out);
    i = end;
  }
  return out;
}

std::string Gpt2Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) {
      throw Error(ErrorCode::kInvalidArgument, cat("decode: token id ", id, " is outside [0, ", vocab_size(), ")"));
    }
    out += token_bytes_[static_cast<size_t>(id)];
  }
  return out;
}

}  // namespace h2
