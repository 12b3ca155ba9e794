// BpeTokenizer: the byte-level BPE tokenizer of the GPT-2 / Llama-3 / Qwen family, trained by the
// project itself and stored as a Hugging Face `tokenizer.json` that the Python `tokenizers` and
// `transformers` libraries load (PreTrainedTokenizerFast(tokenizer_file=...)) and that encode the
// same ids. It owns the vocabulary (token id -> bytes), the ranked merges and the added (special)
// tokens; it knows nothing of the model or of files other than tokenizer.json.
//
// Encoding, as the `tokenizers` library does it for this file: (1) the text is cut at occurrences of
// the added tokens ("<|endoftext|>"), which become their ids; (2) each remaining segment is split by
// GPT-2's pre-tokenizer regex
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// written here by hand (loaded files may instead name Llama-3's or Qwen2's regex, see SplitPattern);
// (3) each piece's bytes become the 256 base tokens and the merges are applied lowest rank first
// (leftmost first among equal ranks). No post-processing: Encode adds no BOS/EOS (the Python
// libraries' add_special_tokens=False for a file with a template). Character classes: \p{L}, \p{N}
// and \s are looked up, per code point, in a table taken from the behavior of tokenizers 0.23's
// ByteLevel pre-tokenizer (Oniguruma, Unicode 16; \s = Unicode White_Space), so the split agrees with
// the library for ASCII exactly and for other text up to that table (checked on megabytes of text and
// random Unicode). Caveats for non-ASCII text: a code point assigned after Unicode 16 may be classed
// differently by a later library; bytes that are not valid UTF-8 (which the Python libraries cannot
// be given at all) are each taken as a letter; a loaded file's NFC normalizer is not applied (text is
// taken as already NFC, which most text is).
//
// Token ids 0..255 are the bytes in the order of their GPT-2 byte-to-unicode characters' code points
// (the order of GPT-2's own vocabulary: '!' is 0, the space byte is 220), merges follow in creation
// order, then the special token "<|endoftext|>" (eos, also usable as bos and pad).
//
// A BpeTokenizer is immutable after Train/Load; its const methods are safe to call from several
// threads at once.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/status.h"

namespace zero::llm {

inline constexpr char kEndOfText[] = "<|endoftext|>";

// GPT-2's byte-to-unicode map: bytes that are printable Latin-1 ('!'..'~', U+00A1..U+00AC,
// U+00AE..U+00FF) map to themselves, the other 68 to U+0100, U+0101, ... in byte order.
const std::array<char32_t, 256>& ByteToUnicode();
// `bytes` with each byte replaced by its character above, as UTF-8 (a tokenizer.json vocab key).
std::string BytesToByteLevel(std::string_view bytes);
// The inverse; fails naming the first character outside the 256 and its byte offset.
Result<std::string> ByteLevelToBytes(std::string_view text);

// The pre-tokenizer regexes implemented (a loaded file must name one of them exactly).
enum class SplitPattern {
  kGpt2,    // ByteLevel's own (use_regex true): GPT-2, and the tokenizers trained here
  kLlama3,  // Split + ByteLevel(use_regex false): Llama-3's (tiktoken cl100k's), digits in 1..3
  kQwen2,   // the same with single digits: Qwen2, Qwen2.5, Qwen3
};

// The split of `text` by the pattern: consecutive pieces that concatenate to `text`.
std::vector<std::string_view> PreTokenize(std::string_view text, SplitPattern pattern = SplitPattern::kGpt2);

class BpeTokenizer {
 public:
  // Trains on the texts: words are the pre-tokenizer's pieces (special tokens in the text are cut
  // out first, never merged into), counted over all texts; then, until the vocabulary (256 bytes +
  // merged tokens + "<|endoftext|>") reaches vocab_size, the most frequent adjacent pair of tokens
  // over the word table is merged (ties: the lowest pair of ids (left, then right)). Stops early
  // when the best pair occurs fewer than min_frequency times. Deterministic. vocab_size >= 257.
  static Result<BpeTokenizer> Train(const std::vector<std::string_view>& texts, int vocab_size,
                                    int64_t min_frequency = 2);
  static Result<BpeTokenizer> Train(std::string_view text, int vocab_size, int64_t min_frequency = 2);

  // Reads a tokenizer.json (or the one in a directory): ours, or a Hugging Face byte-level BPE
  // file: GPT-2 style (pre_tokenizer ByteLevel with use_regex true), or Llama-3 / Qwen style
  // (Sequence of a Split by one of the SplitPattern regexes and ByteLevel with use_regex false);
  // normalizer null or NFC (see the caveat above). Every other kind is refused with an error naming
  // the file and the key (e.g. "model.type: expected \"BPE\", got \"WordPiece\""); the text goes
  // through runtime/json_input.h (nesting beyond 100 levels, a number beyond double and a duplicate
  // key are errors naming the file, line and column). The decoder,
  // post_processor and the model's unk/fuse/byte-fallback settings are kept as read for Save.
  static Result<BpeTokenizer> Load(const std::string& path);
  // The same from the file's text; `name` stands for the file in errors.
  static Result<BpeTokenizer> FromJson(std::string_view json_text, const std::string& name);

  // Writes tokenizer.json (Hugging Face format "1.0", merges as "a b" strings) atomically: a failed
  // write (a full disk) is an error naming `path` and leaves what was there before.
  Status Save(const std::string& path) const;
  std::string ToJson() const;

  std::vector<int32_t> Encode(std::string_view text) const;
  // The bytes of the tokens (special tokens as their text) concatenated; with skip_special,
  // special tokens are left out. An id outside [0, vocab_size()) or unused decodes as U+FFFD, like
  // the Python library's lossy decoding. The result may be invalid UTF-8 when `ids` cut a
  // multi-byte character.
  std::string Decode(const std::vector<int32_t>& ids, bool skip_special = false) const;

  // 1 + the largest id (ids are dense for a trained tokenizer).
  int vocab_size() const { return static_cast<int>(tokens_.size()); }
  // Id of "<|endoftext|>" (else "<|end_of_text|>", else "</s>" for a loaded file); -1 if none.
  int32_t eos_id() const { return eos_id_; }
  int num_merges() const { return static_cast<int>(merges_.size()); }
  // Merge of rank r: the pair of ids (left, right).
  const std::vector<std::pair<int32_t, int32_t>>& merges() const { return merges_; }
  // The token's bytes (a special token's text); empty for an id that is out of range or unused.
  const std::string& token_bytes(int32_t id) const;
  // The token as tokenizer.json spells it: byte-level characters, or a special token's text.
  std::string token_string(int32_t id) const;
  bool is_special(int32_t id) const;
  // Id of the vocabulary token with exactly these bytes, or of the added token with this text; -1.
  int32_t TokenId(std::string_view bytes) const;

 private:
  struct Token {
    std::string bytes;
    bool used = false;
    bool added = false;     // an added token: cut out of the text before pre-tokenization
    bool special = false;   // "special": true in added_tokens (skipped by Decode(skip_special))
    bool in_model = false;  // in model.vocab (else only in added_tokens)
  };
  struct MergeValue {
    int32_t rank;
    int32_t id;
  };

  BpeTokenizer() = default;
  Status Finish(const std::string& name);  // byte ids, eos, the added-token list
  void EncodeWord(std::string_view word, std::vector<int32_t>* out) const;
  void EncodeSegment(std::string_view segment, std::unordered_map<std::string_view, std::vector<int32_t>>* cache,
                     std::vector<int32_t>* out) const;

  std::vector<Token> tokens_;
  std::unordered_map<std::string, int32_t> model_ids_;  // bytes -> id, model.vocab tokens
  std::vector<std::pair<int32_t, int32_t>> merges_;
  std::unordered_map<uint64_t, MergeValue> merge_map_;  // (left << 32 | right) -> rank, result
  std::array<int32_t, 256> byte_ids_{};
  std::vector<int32_t> added_ids_;  // longest text first: the match taken at one position
  int32_t eos_id_ = -1;
  SplitPattern pattern_ = SplitPattern::kGpt2;
  bool add_prefix_space_ = false;  // pre_tokenizer.add_prefix_space
  bool ignore_merges_ = false;     // model.ignore_merges: a piece that is a token is taken whole
  // As read from a loaded file, written back by Save (JSON text; empty: our defaults). An NFC
  // normalizer is kept here but not applied.
  std::string normalizer_json_, pre_tokenizer_json_, decoder_json_, post_processor_json_, model_extras_json_;
};

}  // namespace zero::llm
