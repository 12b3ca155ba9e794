#include "hf/bpe_tokenizer.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>

#include "runtime/atomic_file.h"
#include "runtime/file_system.h"
#include "runtime/json_input.h"

namespace zero::llm {
namespace {

using Json = nlohmann::ordered_json;

// The Split regexes of Llama-3 and of Qwen2 (and its successors) as their tokenizer.json files spell
// them; a file must match one exactly.
constexpr char kLlama3Regex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr char kQwen2Regex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

enum CharClass : uint8_t { kOther = 0, kLetter = 1, kNumber = 2, kSpace = 3 };

// Transitions of the character class over the code points, (first code point << 2) | class: a
// code point has the class of the last entry at or below it. Taken from tokenizers 0.23's ByteLevel
// pre-tokenizer (Oniguruma, Unicode 16) by probing every code point: a letter joins "a" (\p{L}+), a
// number joins "1" (\p{N}+), an "other" joins "!" ([^\s\p{L}\p{N}]+), the rest are \s (White_Space).
// Unassigned code points and surrogates are "other".
constexpr uint32_t kClassTable[] = {
#include "hf/bpe_unicode_classes.inc"
};

CharClass ClassOf(char32_t cp) {
  const uint32_t key = (static_cast<uint32_t>(cp) << 2) | 3u;
  const uint32_t* it = std::upper_bound(std::begin(kClassTable), std::end(kClassTable), key);
  return static_cast<CharClass>(it[-1] & 3u);
}

struct Char {
  CharClass cls;
  int len;  // bytes
};

// The character starting at text[i]. Bytes that do not start a valid UTF-8 sequence count as
// one-byte letters (the Python libraries never see them: their strings are valid UTF-8).
Char CharAt(std::string_view text, size_t i) {
  const auto b0 = static_cast<uint8_t>(text[i]);
  if (b0 < 0x80) {
    if ((b0 >= 'a' && b0 <= 'z') || (b0 >= 'A' && b0 <= 'Z')) return {kLetter, 1};
    if (b0 >= '0' && b0 <= '9') return {kNumber, 1};
    if (b0 == ' ' || (b0 >= '\t' && b0 <= '\r')) return {kSpace, 1};
    return {kOther, 1};
  }
  int len = 0;
  char32_t cp = 0;
  char32_t min = 0;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2, cp = b0 & 0x1F, min = 0x80;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3, cp = b0 & 0x0F, min = 0x800;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    return {kLetter, 1};
  }
  if (i + len > text.size()) return {kLetter, 1};
  for (int k = 1; k < len; ++k) {
    const auto b = static_cast<uint8_t>(text[i + k]);
    if ((b & 0xC0) != 0x80) return {kLetter, 1};
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {kLetter, 1};
  return {ClassOf(cp), len};
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {  // the byte-level alphabet stops at U+0143
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// The 256 bytes in the order of their byte-level characters' code points: ids 0..255.
std::array<uint8_t, 256> BaseTokenOrder() {
  std::array<uint8_t, 256> order;
  for (int b = 0; b < 256; ++b) order[b] = static_cast<uint8_t>(b);
  const auto& map = ByteToUnicode();
  std::sort(order.begin(), order.end(), [&](uint8_t x, uint8_t y) { return map[x] < map[y]; });
  return order;
}

// Calls f(segment, added_id) for the text between added tokens (added_id -1) and for each added
// token, in order. At one position the longest added token wins; `added` is sorted longest first.
template <typename F>
void SplitAdded(std::string_view text, const std::vector<std::pair<std::string_view, int32_t>>& added, F f) {
  size_t start = 0;
  size_t pos = 0;
  // Next occurrence of each added token at or after `pos` (npos: none left).
  std::vector<size_t> next(added.size());
  for (size_t k = 0; k < added.size(); ++k) next[k] = text.find(added[k].first);
  while (true) {
    size_t best = std::string_view::npos;
    size_t best_k = 0;
    for (size_t k = 0; k < added.size(); ++k) {
      if (next[k] != std::string_view::npos && next[k] < pos) next[k] = text.find(added[k].first, pos);
      if (next[k] < best) best = next[k], best_k = k;  // first longest (sorted) wins a tie
    }
    if (best == std::string_view::npos) break;
    if (best > start) f(text.substr(start, best - start), -1);
    f(added[best_k].first, added[best_k].second);
    pos = start = best + added[best_k].first.size();
  }
  if (start < text.size()) f(text.substr(start), -1);
}

std::string Shown(const Json& v) {
  std::string s = v.dump();
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

}  // namespace

const std::array<char32_t, 256>& ByteToUnicode() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      t[b] = printable ? static_cast<char32_t>(b) : next++;
    }
    return t;
  }();
  return table;
}

std::string BytesToByteLevel(std::string_view bytes) {
  const auto& map = ByteToUnicode();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) AppendUtf8(map[static_cast<uint8_t>(c)], &out);
  return out;
}

Result<std::string> ByteLevelToBytes(std::string_view text) {
  static const std::array<int, 0x144> inverse = [] {
    std::array<int, 0x144> inv;
    inv.fill(-1);
    const auto& map = ByteToUnicode();
    for (int b = 0; b < 256; ++b) inv[map[b]] = b;
    return inv;
  }();
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto b0 = static_cast<uint8_t>(text[i]);
    char32_t cp = 0x110000;
    int len = 1;
    if (b0 < 0x80) {
      cp = b0;
    } else if ((b0 & 0xE0) == 0xC0 && i + 1 < text.size() && (static_cast<uint8_t>(text[i + 1]) & 0xC0) == 0x80) {
      cp = ((b0 & 0x1F) << 6) | (static_cast<uint8_t>(text[i + 1]) & 0x3F);
      len = 2;
    }
    if (cp >= inverse.size() || inverse[cp] < 0 || (len == 2 && cp < 0x80)) {
      return InvalidArgumentError("byte " + std::to_string(i) + " of \"" + std::string(text) +
                                  "\": not one of the 256 byte-level characters");
    }
    out.push_back(static_cast<char>(inverse[cp]));
    i += len;
  }
  return out;
}

namespace {

// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
void SplitGpt2(std::string_view text, std::vector<std::string_view>* pieces) {
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const size_t start = i;
    // 's|'t|'re|'ve|'m|'ll|'d (case-sensitive in this pattern)
    if (text[i] == '\'' && i + 1 < n) {
      const char c1 = text[i + 1];
      const char c2 = i + 2 < n ? text[i + 2] : '\0';
      size_t len = 0;
      if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
        len = 2;
      } else if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
        len = 3;
      }
      if (len > 0) {
        pieces->push_back(text.substr(i, len));
        i += len;
        continue;
      }
    }
    //  ?\p{L}+ |  ?\p{N}+ |  ?[^\s\p{L}\p{N}]+ : a run of one class, after an optional space
    size_t j = (text[i] == ' ' && i + 1 < n) ? i + 1 : i;
    Char c = CharAt(text, j);
    if (c.cls != kSpace) {
      const CharClass cls = c.cls;
      while (j < n) {
        c = CharAt(text, j);
        if (c.cls != cls) break;
        j += c.len;
      }
      pieces->push_back(text.substr(start, j - start));
      i = j;
      continue;
    }
    // \s+(?!\S) | \s+ : a whitespace run, less its last character when text follows it
    size_t end = i;
    size_t last = i;  // start of the run's last character
    while (end < n) {
      c = CharAt(text, end);
      if (c.cls != kSpace) break;
      last = end;
      end += c.len;
    }
    if (end < n && last > start) end = last;
    pieces->push_back(text.substr(start, end - start));
    i = end;
  }
}

bool IsNewline(char c) { return c == '\r' || c == '\n'; }

// Length of a case-insensitive contraction ('s 't 're 've 'm 'll 'd) at text[i] == '\'', or 0. Case
// folding also makes U+017F (long s) an 's'.
size_t ContractionAt(std::string_view text, size_t i) {
  auto lower = [&](size_t k) -> char {
    if (k >= text.size()) return '\0';
    const char c = text[k];
    return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
  };
  const char c1 = lower(i + 1), c2 = lower(i + 2);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
  if (text.substr(i + 1, 2) == "\xC5\xBF") return 3;
  return 0;
}

// Llama-3 (max_digits 3) and Qwen2 (max_digits 1):
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max}| ?[^\s\p{L}\p{N}]+[\r\n]*|
// \s*[\r\n]+|\s+(?!\S)|\s+
void SplitTiktokenStyle(std::string_view text, int max_digits, std::vector<std::string_view>* pieces) {
  const size_t n = text.size();
  size_t i = 0;
  auto run = [&](size_t j, CharClass cls) {  // end of the run of `cls` starting at j
    while (j < n) {
      const Char c = CharAt(text, j);
      if (c.cls != cls) break;
      j += c.len;
    }
    return j;
  };
  while (i < n) {
    const size_t start = i;
    const Char c = CharAt(text, i);
    size_t end = 0;
    if (text[i] == '\'' && (end = ContractionAt(text, i)) > 0) {
      end += i;
    } else if (c.cls == kLetter) {
      end = run(i, kLetter);
    } else if (c.cls != kNumber && !IsNewline(text[i]) && i + c.len < n && CharAt(text, i + c.len).cls == kLetter) {
      end = run(i + c.len, kLetter);  // one leading non-letter, non-digit, non-newline character
    } else if (c.cls == kNumber) {
      end = i;
      for (int d = 0; d < max_digits && end < n; ++d) {
        const Char digit = CharAt(text, end);
        if (digit.cls != kNumber) break;
        end += digit.len;
      }
    } else if (c.cls == kOther || (text[i] == ' ' && i + 1 < n && CharAt(text, i + 1).cls == kOther)) {
      end = run(text[i] == ' ' ? i + 1 : i, kOther);
      while (end < n && IsNewline(text[end])) ++end;
    } else {  // white space
      size_t last = i, last_newline = std::string_view::npos;
      end = i;
      while (end < n) {
        const Char w = CharAt(text, end);
        if (w.cls != kSpace) break;
        if (IsNewline(text[end])) last_newline = end;
        last = end;
        end += w.len;
      }
      if (last_newline != std::string_view::npos) {
        end = last_newline + 1;  // \s*[\r\n]+ : through the run's last newline
      } else if (end < n && last > start) {
        end = last;  // \s+(?!\S)
      }
    }
    pieces->push_back(text.substr(start, end - start));
    i = end;
  }
}

}  // namespace

std::vector<std::string_view> PreTokenize(std::string_view text, SplitPattern pattern) {
  std::vector<std::string_view> pieces;
  switch (pattern) {
    case SplitPattern::kGpt2:
      SplitGpt2(text, &pieces);
      break;
    case SplitPattern::kLlama3:
      SplitTiktokenStyle(text, 3, &pieces);
      break;
    case SplitPattern::kQwen2:
      SplitTiktokenStyle(text, 1, &pieces);
      break;
  }
  return pieces;
}

// ---------------------------------------------------------------------------------------------
// Training

Result<BpeTokenizer> BpeTokenizer::Train(std::string_view text, int vocab_size, int64_t min_frequency) {
  return Train(std::vector<std::string_view>{text}, vocab_size, min_frequency);
}

Result<BpeTokenizer> BpeTokenizer::Train(const std::vector<std::string_view>& texts, int vocab_size,
                                         int64_t min_frequency) {
  if (vocab_size < 257) {
    return InvalidArgumentError("vocab_size must be >= 257 (256 bytes + \"" + std::string(kEndOfText) + "\"), got " +
                                std::to_string(vocab_size));
  }
  BpeTokenizer t;
  const std::array<uint8_t, 256> order = BaseTokenOrder();
  t.tokens_.resize(256);
  for (int id = 0; id < 256; ++id) {
    t.tokens_[id].bytes.assign(1, static_cast<char>(order[id]));
    t.tokens_[id].used = t.tokens_[id].in_model = true;
    t.model_ids_.emplace(t.tokens_[id].bytes, id);
  }
  std::array<int32_t, 256> byte_ids;
  for (int id = 0; id < 256; ++id) byte_ids[order[id]] = id;

  // The word table: each distinct piece, its count, as a sequence of token ids (sorted by bytes so
  // that nothing depends on hash order).
  std::unordered_map<std::string_view, int64_t> piece_counts;
  const std::vector<std::pair<std::string_view, int32_t>> special = {{kEndOfText, 0}};
  for (std::string_view text : texts) {
    SplitAdded(text, special, [&](std::string_view segment, int32_t added) {
      if (added >= 0) return;
      for (std::string_view piece : PreTokenize(segment)) ++piece_counts[piece];
    });
  }
  std::vector<std::pair<std::string_view, int64_t>> sorted(piece_counts.begin(), piece_counts.end());
  piece_counts.clear();
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::vector<int32_t>> words(sorted.size());
  std::vector<int64_t> freq(sorted.size());
  std::unordered_map<uint64_t, int64_t> pair_counts;
  // Words in which a pair occurs (or once occurred: entries are not removed, and may repeat).
  std::unordered_map<uint64_t, std::vector<int32_t>> where;
  for (size_t w = 0; w < sorted.size(); ++w) {
    freq[w] = sorted[w].second;
    for (char c : sorted[w].first) words[w].push_back(byte_ids[static_cast<uint8_t>(c)]);
    for (size_t i = 0; i + 1 < words[w].size(); ++i) {
      const uint64_t p = PairKey(words[w][i], words[w][i + 1]);
      pair_counts[p] += freq[w];
      where[p].push_back(static_cast<int32_t>(w));
    }
  }

  // Max-heap of (count, pair), lowest pair first among equal counts. Entries go stale when a count
  // drops; a popped stale entry is pushed back with the current count. Every count increase pushes
  // a fresh entry, so each pair's best entry is never below its count.
  struct Entry {
    int64_t count;
    uint64_t pair;
    bool operator<(const Entry& o) const { return count != o.count ? count < o.count : pair > o.pair; }
  };
  std::priority_queue<Entry> heap;
  {
    std::vector<Entry> entries;
    entries.reserve(pair_counts.size());
    for (const auto& [p, count] : pair_counts) entries.push_back({count, p});
    heap = std::priority_queue<Entry>(std::less<Entry>(), std::move(entries));
  }

  const size_t target = static_cast<size_t>(vocab_size) - 1;  // room for "<|endoftext|>"
  std::vector<int32_t> stamp(words.size(), -1);
  std::vector<uint64_t> increased;
  while (t.tokens_.size() < target && !heap.empty()) {
    const Entry top = heap.top();
    heap.pop();
    auto count_it = pair_counts.find(top.pair);
    const int64_t actual = count_it == pair_counts.end() ? 0 : count_it->second;
    if (actual != top.count) {
      if (actual > 0) heap.push({actual, top.pair});
      continue;
    }
    if (actual < min_frequency) break;
    const auto a = static_cast<int32_t>(top.pair >> 32);
    const auto b = static_cast<int32_t>(top.pair & 0xffffffffu);
    std::string merged = t.tokens_[a].bytes + t.tokens_[b].bytes;
    auto [id_it, inserted] = t.model_ids_.emplace(merged, static_cast<int32_t>(t.tokens_.size()));
    const int32_t id = id_it->second;
    if (inserted) {
      Token token;
      token.bytes = std::move(merged);
      token.used = token.in_model = true;
      t.tokens_.push_back(std::move(token));
    }
    const auto rank = static_cast<int32_t>(t.merges_.size());
    t.merges_.push_back({a, b});
    t.merge_map_[top.pair] = {rank, id};

    pair_counts.erase(count_it);
    std::vector<int32_t> affected = std::move(where[top.pair]);
    where.erase(top.pair);
    increased.clear();
    for (int32_t w : affected) {
      if (stamp[w] == rank) continue;
      stamp[w] = rank;
      const int64_t f = freq[w];
      auto change = [&](int32_t x, int32_t y, int64_t delta) {
        const uint64_t p = PairKey(x, y);
        if (p == top.pair) return;  // gone from every word after this merge
        auto it = pair_counts.try_emplace(p, 0).first;
        it->second += delta * f;
        if (delta > 0) {
          where[p].push_back(w);
          increased.push_back(p);
        } else if (it->second <= 0) {
          pair_counts.erase(it);
        }
      };
      std::vector<int32_t>& s = words[w];
      size_t out = 0;
      for (size_t i = 0; i < s.size();) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          if (out > 0) {
            change(s[out - 1], a, -1);
            change(s[out - 1], id, +1);
          }
          if (i + 2 < s.size()) {
            change(b, s[i + 2], -1);
            change(id, s[i + 2], +1);
          }
          s[out++] = id;
          i += 2;
        } else {
          s[out++] = s[i++];
        }
      }
      s.resize(out);
    }
    std::sort(increased.begin(), increased.end());
    increased.erase(std::unique(increased.begin(), increased.end()), increased.end());
    for (uint64_t p : increased) {
      auto it = pair_counts.find(p);
      if (it != pair_counts.end() && it->second > 0) heap.push({it->second, p});
    }
  }

  // Pieces never hold "<|" next to letters, so no merge can spell the special token.
  ZERO_CHECK(t.model_ids_.count(kEndOfText) == 0);
  Token eos;
  eos.bytes = kEndOfText;
  eos.used = eos.added = eos.special = eos.in_model = true;
  t.tokens_.push_back(std::move(eos));
  ZERO_RETURN_IF_ERROR(t.Finish("<trained>"));
  return t;
}

Status BpeTokenizer::Finish(const std::string& name) {
  for (int b = 0; b < 256; ++b) {
    auto it = model_ids_.find(std::string(1, static_cast<char>(b)));
    if (it == model_ids_.end()) {
      std::string ch;
      AppendUtf8(ByteToUnicode()[b], &ch);
      return InvalidArgumentError(name + ": model.vocab: no token for byte " + std::to_string(b) + " (\"" + ch +
                                  "\"); a byte-level BPE vocabulary holds all 256");
    }
    byte_ids_[b] = it->second;
  }
  added_ids_.clear();
  for (size_t id = 0; id < tokens_.size(); ++id) {
    if (tokens_[id].used && tokens_[id].added) added_ids_.push_back(static_cast<int32_t>(id));
  }
  std::stable_sort(added_ids_.begin(), added_ids_.end(),
                   [&](int32_t x, int32_t y) { return tokens_[x].bytes.size() > tokens_[y].bytes.size(); });
  eos_id_ = -1;
  for (const char* eos : {kEndOfText, "<|end_of_text|>", "</s>"}) {
    for (int32_t id : added_ids_) {
      if (tokens_[id].bytes == eos) {
        eos_id_ = id;
        break;
      }
    }
    if (eos_id_ >= 0) break;
  }
  return OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Encoding and decoding

void BpeTokenizer::EncodeWord(std::string_view word, std::vector<int32_t>* out) const {
  const size_t n = word.size();
  if (n == 0) return;
  if (ignore_merges_ || n == 1) {
    auto it = model_ids_.find(std::string(word));
    if (it != model_ids_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  // Symbols as a linked list over the bytes; a min-heap of (rank, left position) of the adjacent
  // pairs that have a merge. Popped entries whose pair changed since are skipped.
  std::vector<int32_t> ids(n), next(n), prev(n);
  for (size_t i = 0; i < n; ++i) {
    ids[i] = byte_ids_[static_cast<uint8_t>(word[i])];
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
    prev[i] = static_cast<int32_t>(i) - 1;
  }
  using Candidate = std::pair<int32_t, int32_t>;  // rank, position
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto consider = [&](int32_t pos) {
    if (pos < 0 || next[pos] < 0) return;
    auto it = merge_map_.find(PairKey(ids[pos], ids[next[pos]]));
    if (it != merge_map_.end()) heap.push({it->second.rank, pos});
  };
  for (size_t i = 0; i + 1 < n; ++i) consider(static_cast<int32_t>(i));
  while (!heap.empty()) {
    const auto [rank, pos] = heap.top();
    heap.pop();
    if (ids[pos] < 0 || next[pos] < 0) continue;
    auto it = merge_map_.find(PairKey(ids[pos], ids[next[pos]]));
    if (it == merge_map_.end() || it->second.rank != rank) continue;
    const int32_t right = next[pos];
    ids[pos] = it->second.id;
    ids[right] = -1;
    next[pos] = next[right];
    if (next[pos] >= 0) prev[next[pos]] = pos;
    consider(prev[pos]);
    consider(pos);
  }
  for (int32_t i = 0; i >= 0; i = next[i]) out->push_back(ids[i]);
}

void BpeTokenizer::EncodeSegment(std::string_view segment,
                                 std::unordered_map<std::string_view, std::vector<int32_t>>* cache,
                                 std::vector<int32_t>* out) const {
  for (std::string_view piece : PreTokenize(segment, pattern_)) {
    auto [it, inserted] = cache->try_emplace(piece);
    if (inserted) EncodeWord(piece, &it->second);
    out->insert(out->end(), it->second.begin(), it->second.end());
  }
}

std::vector<int32_t> BpeTokenizer::Encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  std::vector<std::pair<std::string_view, int32_t>> added;
  added.reserve(added_ids_.size());
  for (int32_t id : added_ids_) added.emplace_back(tokens_[id].bytes, id);
  std::unordered_map<std::string_view, std::vector<int32_t>> cache;
  std::string prefixed;  // a segment with the space add_prefix_space puts before it
  SplitAdded(text, added, [&](std::string_view segment, int32_t id) {
    if (id >= 0) {
      out.push_back(id);
    } else if (add_prefix_space_ && segment.front() != ' ') {
      prefixed.assign(" ").append(segment);
      std::unordered_map<std::string_view, std::vector<int32_t>> local;  // keys point into `prefixed`
      EncodeSegment(prefixed, &local, &out);
    } else {
      EncodeSegment(segment, &cache, &out);
    }
  });
  return out;
}

std::string BpeTokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size() || !tokens_[id].used) {
      out += "\xEF\xBF\xBD";  // U+FFFD
      continue;
    }
    if (skip_special && tokens_[id].special) continue;
    out += tokens_[id].bytes;
  }
  return out;
}

const std::string& BpeTokenizer::token_bytes(int32_t id) const {
  static const std::string kEmpty;
  if (id < 0 || id >= vocab_size()) return kEmpty;
  return tokens_[id].bytes;
}

std::string BpeTokenizer::token_string(int32_t id) const {
  if (id < 0 || id >= vocab_size() || !tokens_[id].used) return std::string();
  return tokens_[id].added ? tokens_[id].bytes : BytesToByteLevel(tokens_[id].bytes);
}

bool BpeTokenizer::is_special(int32_t id) const { return id >= 0 && id < vocab_size() && tokens_[id].special; }

int32_t BpeTokenizer::TokenId(std::string_view bytes) const {
  auto it = model_ids_.find(std::string(bytes));
  if (it != model_ids_.end()) return it->second;
  for (int32_t id : added_ids_) {
    if (tokens_[id].bytes == bytes) return id;
  }
  return -1;
}

// ---------------------------------------------------------------------------------------------
// tokenizer.json

std::string BpeTokenizer::ToJson() const {
  Json j = Json::object();
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  Json added = Json::array();
  for (size_t id = 0; id < tokens_.size(); ++id) {
    const Token& t = tokens_[id];
    if (!t.used || !t.added) continue;
    added.push_back(Json{{"id", id},
                         {"content", t.bytes},
                         {"single_word", false},
                         {"lstrip", false},
                         {"rstrip", false},
                         {"normalized", false},
                         {"special", t.special}});
  }
  j["added_tokens"] = std::move(added);
  j["normalizer"] = normalizer_json_.empty() ? Json() : Json::parse(normalizer_json_);
  j["pre_tokenizer"] = pre_tokenizer_json_.empty() ? Json{{"type", "ByteLevel"},
                                                          {"add_prefix_space", add_prefix_space_},
                                                          {"trim_offsets", true},
                                                          {"use_regex", true}}
                                                   : Json::parse(pre_tokenizer_json_);
  j["post_processor"] = post_processor_json_.empty() ? Json() : Json::parse(post_processor_json_);
  j["decoder"] =
      decoder_json_.empty()
          ? Json{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}
          : Json::parse(decoder_json_);
  Json model = Json::object();
  model["type"] = "BPE";
  model["dropout"] = nullptr;
  model["unk_token"] = nullptr;
  model["continuing_subword_prefix"] = nullptr;
  model["end_of_word_suffix"] = nullptr;
  model["fuse_unk"] = false;
  model["byte_fallback"] = false;
  if (!model_extras_json_.empty()) {
    const Json extras = Json::parse(model_extras_json_);
    for (const auto& [key, value] : extras.items()) model[key] = value;
  }
  model["ignore_merges"] = ignore_merges_;
  Json vocab = Json::object();
  for (size_t id = 0; id < tokens_.size(); ++id) {
    if (tokens_[id].used && tokens_[id].in_model) vocab[token_string(static_cast<int32_t>(id))] = id;
  }
  model["vocab"] = std::move(vocab);
  Json merges = Json::array();
  for (const auto& [a, b] : merges_) merges.push_back(token_string(a) + " " + token_string(b));
  model["merges"] = std::move(merges);
  j["model"] = std::move(model);
  return j.dump(2) + "\n";
}

Status BpeTokenizer::Save(const std::string& path) const {
  // Atomic and checked (a full disk is an error naming the file, never a truncated tokenizer.json):
  // written beside `path`, fsynced, renamed over it (runtime/atomic_file.h).
  return WriteFileAtomic(*DefaultFileSystem(), path, ToJson());
}

Result<BpeTokenizer> BpeTokenizer::Load(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoError("stat", path, errno);
  std::string file = path;
  if (S_ISDIR(st.st_mode)) {
    file = path + (path.back() == '/' ? "" : "/") + "tokenizer.json";
    if (::stat(file.c_str(), &st) != 0) return ErrnoError("stat", file, errno);
  }
  if (!S_ISREG(st.st_mode)) {
    return InvalidArgumentError(file + ": not a regular file (expected a tokenizer.json)");
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) return ErrnoError("open", file, errno);
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) return ErrnoError("read", file, errno);
  return FromJson(s.str(), file);
}

Result<BpeTokenizer> BpeTokenizer::FromJson(std::string_view json_text, const std::string& name) {
  // Nesting, numbers beyond double, duplicate keys and linear time: runtime/json_input.h.
  ZERO_ASSIGN_OR_RETURN(Json j, ParseJsonText<Json>(json_text, name));
  auto bad = [&](const std::string& key, const std::string& what) {
    return InvalidArgumentError(name + ": " + key + ": " + what);
  };
  try {
    if (!j.is_object()) return bad("(top level)", "expected an object, got " + Shown(j));
    if (!j.contains("model") || !j["model"].is_object()) return bad("model", "expected an object");
    const Json& model = j["model"];
    if (!model.contains("type")) return bad("model.type", "missing (expected \"BPE\")");
    if (model["type"] != "BPE") {
      return bad("model.type", "expected \"BPE\" (byte-level BPE), got " + Shown(model["type"]));
    }
    BpeTokenizer t;
    const Json normalizer = j.value("normalizer", Json());
    if (!normalizer.is_null()) {
      if (normalizer != Json{{"type", "NFC"}}) {
        return bad("normalizer", "expected null or {\"type\": \"NFC\"} (byte-level BPE), got " + Shown(normalizer));
      }
      t.normalizer_json_ = normalizer.dump();
    }
    const Json pre = j.value("pre_tokenizer", Json());
    const std::string supported =
        "expected ByteLevel with use_regex true, or a Sequence of a Split by Llama-3's or Qwen2's regex "
        "(behavior Isolated) and ByteLevel with use_regex false and add_prefix_space false; got ";
    if (pre.is_object() && pre.value("type", Json()) == "ByteLevel" && pre.value("use_regex", true) == true) {
      t.pattern_ = SplitPattern::kGpt2;
      t.add_prefix_space_ = pre.value("add_prefix_space", true);
    } else if (pre.is_object() && pre.value("type", Json()) == "Sequence" &&
               pre.value("pretokenizers", Json()).is_array() && pre["pretokenizers"].size() == 2) {
      const Json& split = pre["pretokenizers"][0];
      const Json& level = pre["pretokenizers"][1];
      const Json regex = split.is_object() ? split.value("pattern", Json()).value("Regex", Json()) : Json();
      if (split.value("type", Json()) != "Split" || split.value("behavior", Json()) != "Isolated" ||
          split.value("invert", false) || level.value("type", Json()) != "ByteLevel" ||
          level.value("use_regex", true) || level.value("add_prefix_space", true) ||
          (regex != kLlama3Regex && regex != kQwen2Regex)) {
        return bad("pre_tokenizer", supported + Shown(pre));
      }
      t.pattern_ = regex == kLlama3Regex ? SplitPattern::kLlama3 : SplitPattern::kQwen2;
    } else {
      return bad("pre_tokenizer", supported + Shown(pre));
    }
    t.pre_tokenizer_json_ = pre.dump();
    if (j.contains("post_processor") && !j["post_processor"].is_null())
      t.post_processor_json_ = j["post_processor"].dump();
    if (j.contains("decoder") && !j["decoder"].is_null()) t.decoder_json_ = j["decoder"].dump();
    Json extras = Json::object();
    for (const char* key : {"unk_token", "fuse_unk", "byte_fallback"}) {
      if (model.contains(key)) extras[key] = model[key];
    }
    t.model_extras_json_ = extras.dump();
    const Json dropout = model.value("dropout", Json());
    if (!dropout.is_null() && !(dropout.is_number() && dropout.get<double>() == 0.0)) {
      return bad("model.dropout", "expected null (deterministic encoding), got " + Shown(dropout));
    }
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      const Json v = model.value(key, Json());
      if (!v.is_null() && v != "") return bad(std::string("model.") + key, "expected null, got " + Shown(v));
    }
    t.ignore_merges_ = model.value("ignore_merges", false);

    // Added tokens first: their vocab keys are their text, not byte-level characters.
    constexpr int64_t kMaxId = 1 << 24;
    auto take_id = [&](const std::string& key, const Json& v, int32_t* id) -> Status {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= kMaxId) {
        return bad(key, "expected an id in [0, " + std::to_string(kMaxId) + "), got " + Shown(v));
      }
      *id = v.get<int32_t>();
      if (*id >= static_cast<int32_t>(t.tokens_.size())) t.tokens_.resize(*id + 1);
      return OkStatus();
    };
    if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
      if (!j["added_tokens"].is_array()) return bad("added_tokens", "expected a list");
      const Json& list = j["added_tokens"];
      for (size_t k = 0; k < list.size(); ++k) {
        const std::string key = "added_tokens[" + std::to_string(k) + "]";
        if (!list[k].is_object() || !list[k].contains("content") || !list[k]["content"].is_string() ||
            list[k]["content"].get<std::string>().empty()) {
          return bad(key, "expected {\"id\": ..., \"content\": \"...\"}, got " + Shown(list[k]));
        }
        for (const char* flag : {"single_word", "lstrip", "rstrip"}) {
          if (list[k].value(flag, false)) {
            return bad(key + "." + flag, "true is not supported (added tokens are matched exactly)");
          }
        }
        int32_t id;
        ZERO_RETURN_IF_ERROR(take_id(key + ".id", list[k].value("id", Json()), &id));
        Token& token = t.tokens_[id];
        if (token.used) return bad(key + ".id", "id " + std::to_string(id) + " given twice");
        token.bytes = list[k]["content"].get<std::string>();
        token.used = token.added = true;
        token.special = list[k].value("special", false);
      }
    }
    if (!model.contains("vocab") || !model["vocab"].is_object()) return bad("model.vocab", "expected an object");
    std::unordered_map<std::string, int32_t> key_ids;
    for (const auto& [key, value] : model["vocab"].items()) {
      int32_t id;
      ZERO_RETURN_IF_ERROR(take_id("model.vocab[\"" + key + "\"]", value, &id));
      key_ids[key] = id;
      Token& token = t.tokens_[id];
      if (token.added && token.bytes == key) {
        token.in_model = true;
        continue;
      }
      if (token.used) {
        return bad("model.vocab[\"" + key + "\"]",
                   "id " + std::to_string(id) + " is also \"" + t.token_string(id) + "\"");
      }
      Result<std::string> bytes = ByteLevelToBytes(key);
      if (!bytes.ok()) return bad("model.vocab", bytes.status().message() + " (not a byte-level vocabulary)");
      token.bytes = std::move(bytes).value();
      token.used = token.in_model = true;
      t.model_ids_.emplace(token.bytes, id);
    }
    if (!model.contains("merges") || !model["merges"].is_array()) return bad("model.merges", "expected a list");
    const Json& merges = model["merges"];
    for (size_t r = 0; r < merges.size(); ++r) {
      const std::string key = "model.merges[" + std::to_string(r) + "]";
      std::string left, right;
      const Json& m = merges[r];
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
          return bad(key, "expected \"left right\" (one space), got " + Shown(m));
        }
        left = s.substr(0, space);
        right = s.substr(space + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        left = m[0].get<std::string>();
        right = m[1].get<std::string>();
      } else {
        return bad(key, "expected \"left right\" or [\"left\", \"right\"], got " + Shown(m));
      }
      auto l = key_ids.find(left), rt = key_ids.find(right), res = key_ids.find(left + right);
      if (l == key_ids.end() || rt == key_ids.end() || res == key_ids.end()) {
        return bad(key, Shown(m) + ": \"" +
                            (l == key_ids.end()    ? left
                             : rt == key_ids.end() ? right
                                                   : left + right) +
                            "\" is not in model.vocab");
      }
      // A repeated pair takes its last rank, as the Python library's map of merges does.
      t.merge_map_[PairKey(l->second, rt->second)] = {static_cast<int32_t>(t.merges_.size()), res->second};
      t.merges_.push_back({l->second, rt->second});
    }
    ZERO_RETURN_IF_ERROR(t.Finish(name));
    return t;
  } catch (const Json::exception& e) {  // a type the checks above missed: an error, not a crash
    return InvalidArgumentError(name + ": unexpected value: " + e.what());
  }
}

}  // namespace zero::llm
