// The transformer's data: token files, the built-in text corpus, the deterministic windows it trains
// and evaluates on, and the reverse-text fine-tuning task. Everything here is a pure function of its
// arguments (no state, no threads); it reads files only in ReadTokenBin, ReadTextData and
// LoadCorpusDocuments and writes only in WriteTokenBin.
//
// Sampling follows data/byte_data.h: sample g of the run is drawn by a keyed SplitMix64 of
// (seed, g), and rank r of W ranks with `batch` rows per rank takes, at step s, the samples
// g = (s W + r) batch + i, i in [0, batch). So every rank of every world size gets its own rows, the
// W ranks together see what one rank with W * batch rows sees, and a resumed run gets the same rows
// for the same step. Callers pass the sampler step (optimizer step * accumulation + micro step).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "hf/bpe_tokenizer.h"
#include "models/llama/batch.h"
#include "runtime/status.h"

namespace zero::llm {

// --- token files: flat little-endian uint32 ids, nothing else ---------------------------------

// Fails naming the position of a negative id, or the path on an I/O error.
Status WriteTokenBin(const std::string& path, const std::vector<int32_t>& tokens);
// Refuses, naming the path: anything but a regular file (a FIFO or directory is refused at once,
// never waited on), a size that is not a multiple of 4, and an id >= vocab_size (naming its
// position and value).
Result<std::vector<int32_t>> ReadTokenBin(const std::string& path, int64_t vocab_size);

// --- the corpus -----------------------------------------------------------------------------------

struct CorpusOptions {
  // Files or directories (all regular files under them); empty: the default corpus, present on every
  // Debian machine: the texts under /usr/share/common-licenses, then the Python standard library's
  // *.py files under /usr/lib/python3.*/ (not site-packages, dist-packages, test or tests folders).
  std::vector<std::string> paths;
  // The corpus is cut here (at a character boundary, so it stays valid UTF-8).
  int64_t max_bytes = int64_t{4} << 20;
};

// A text made of documents: the corpus's files, or the pieces of one text file (TextPieces).
struct CorpusDocument {
  std::string name;  // the file's path (a piece: "PATH[bytes B-E)")
  std::string text;
};
struct Corpus {
  std::vector<CorpusDocument> documents;  // in corpus order
  std::string separator = "\n\n";         // put between documents by Joined
  std::string Joined() const;
  int64_t bytes() const;  // of the documents' texts, without separators
};

// The files' texts, one document each, files in sorted path order within each root (roots in the
// order given), the last one cut so that Joined() holds at most max_bytes (at a character boundary).
// Files that are not valid UTF-8, empty, or symbolic links are skipped inside directories; a file
// named in paths that is not valid UTF-8 is an error naming it and the byte offset. Errors when a
// named path is missing, or when no text is found (naming the places searched).
Result<Corpus> LoadCorpusDocuments(const CorpusOptions& options);
// LoadCorpusDocuments(options).Joined(): the texts joined by "\n\n".
Result<std::string> LoadCorpus(const CorpusOptions& options);

// --- held-out documents ---------------------------------------------------------------------------

// Which documents of sizes `sizes` (bytes or tokens, in corpus order) are held out for evaluation:
// whole documents, about `share` of them and of the total size, spread over the corpus, and a
// function of (sizes, share, seed). A draw: the documents in corpus order, shuffled within
// consecutive blocks of 10, then every (1 / share)-th of them from a random start (systematic
// sampling), so that each document is held out with probability `share` whatever its size and the
// held-out ones come from every part of the corpus; of 8 draws from the seed, the one whose
// held-out size is closest to share times the total. Ascending indices; none when share <= 0 or
// fewer than 2 documents; never every document.
std::vector<size_t> HeldOutDocuments(const std::vector<int64_t>& sizes, double share, uint64_t seed);

struct CorpusSplit {
  Corpus train, held_out;  // the documents of each side, in corpus order; the separator kept
};
// `corpus` split by HeldOutDocuments over its documents' byte sizes.
CorpusSplit SplitCorpus(const Corpus& corpus, double share, uint64_t seed);

// One text cut into pieces of about max(min_piece_bytes, text.size() / 256) bytes, each ending at
// a line end where one is within the piece (else at a character boundary), named
// "NAME[bytes B-E)", joined back by "" (separator ""): so one text file splits as a corpus does.
Corpus TextPieces(const std::string& name, const std::string& text, int64_t min_piece_bytes = 4096);

// A token stream's pieces held out as HeldOutDocuments holds out documents: pieces of
// max(min_piece_tokens, tokens.size() / 256) consecutive tokens (the last one shorter).
struct TokenSplit {
  std::vector<int32_t> train, held_out;  // the pieces of each side, concatenated in order
  size_t pieces = 0, held_out_pieces = 0;
  int64_t piece_tokens = 0;
};
TokenSplit SplitTokens(const std::vector<int32_t>& tokens, int64_t min_piece_tokens, double share, uint64_t seed);

// --- data files -----------------------------------------------------------------------------------

// Whether --data PATH names a token file: its name ends in ".bin" in any case ("tokens.BIN").
bool IsTokenFileName(const std::string& path);
// --data PATH read as text: a regular file (data/data_file.h) with no NUL byte (a NUL is binary
// data, e.g. token ids in a file not named .bin: the error names its offset and says so).
Result<std::string> ReadTextData(const std::string& path);

// --- windows for language modelling ---------------------------------------------------------------

// The tokens cut into consecutive non-overlapping windows of seq + 1 tokens, one LlmBatch (batch 1)
// each: inputs the window's first seq tokens, targets its last seq. A final partial window is
// dropped, so there are n = tokens.size() / (seq + 1) windows; none when seq < 1. With max_windows
// in [1, n): only windows floor(i n / max_windows), i in [0, max_windows), spread over the whole
// stream rather than its start.
std::vector<LlmBatch> EvalWindows(const std::vector<int32_t>& tokens, int seq, int64_t max_windows = 0);
// How many windows EvalWindows(tokens, seq) has.
int64_t EvalWindowCount(size_t tokens, int seq);

// `batch` rows, each a window of seq + 1 tokens starting at a position drawn (see the top) from
// [0, tokens.size() - seq - 1]. REQUIRES: seq >= 1, batch >= 1, tokens.size() > seq,
// 0 <= rank < world, step >= 0; otherwise an empty batch (batch 0), which LlmBatch::Validate refuses.
LlmBatch TrainBatch(const std::vector<int32_t>& tokens, int seq, int batch, int64_t step, int rank, int world,
                    uint64_t seed);

// --- the reverse-text task (supervised fine-tuning) -----------------------------------------------

// One example: "Reverse: <snippet>\nAnswer: " then the snippet reversed code point by code point,
// then eos. The prompt and the answer are encoded separately (so the boundary is a token boundary).
struct ReverseTextExample {
  std::string snippet;
  std::vector<int32_t> tokens;  // prompt tokens, answer tokens, eos
  int prompt_tokens = 0;        // tokens[0, prompt_tokens) are the prompt
};

// `count` examples whose snippets are one line of the corpus each: a start drawn from the seed, moved
// to a character boundary, then up to max_snippet_chars code points (at least half of it where the
// line allows), stopping at a line end, trimmed of surrounding white space; snippets that are not
// valid UTF-8, shorter than 2 code points or that contain the eos token's text are drawn again.
// Deterministic in (corpus, tokenizer, seed). Fails on count < 1, max_snippet_chars < 2, a
// tokenizer without eos, or a corpus that yields no snippet.
Result<std::vector<ReverseTextExample>> ReverseTextExamples(std::string_view corpus, const BpeTokenizer& tokenizer,
                                                            int count, uint64_t seed, int max_snippet_chars);

// The example as a row of seq positions: inputs are its tokens (then its eos repeated as padding),
// the target at position j is tokens[j + 1] where that is an answer token or the eos, else -100
// (prompt and padding). An example longer than seq + 1 tokens is cut to seq + 1 (its answer's end
// then takes no loss).
void ReverseTextRow(const ReverseTextExample& example, int seq, int32_t* inputs, int32_t* targets);

// `batch` rows of examples drawn (see the top) from all of them. REQUIRES: examples non-empty,
// seq >= 1, batch >= 1, 0 <= rank < world, step >= 0; otherwise an empty batch (batch 0).
LlmBatch ReverseTextBatch(const std::vector<ReverseTextExample>& examples, int seq, int batch, int64_t step, int rank,
                          int world, uint64_t seed);

// Every example once, in order, one LlmBatch (batch 1) each: for evaluation. With max_windows in
// [1, examples.size()): examples spread as EvalWindows spreads its windows.
std::vector<LlmBatch> ReverseTextEvalWindows(const std::vector<ReverseTextExample>& examples, int seq,
                                             int64_t max_windows = 0);

}  // namespace zero::llm
