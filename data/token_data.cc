#include "data/token_data.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <utility>

#include "data/data_file.h"
#include "runtime/hash.h"

namespace zero::llm {
namespace {

namespace fs = std::filesystem;

static_assert(std::endian::native == std::endian::little, "token files are little-endian uint32, copied as is");

constexpr uint64_t kWindowKey = 0x5a45524f4c4c4d57ull;   // "ZEROLLMW"
constexpr uint64_t kExampleKey = 0x5a45524f4c4c4d45ull;  // "ZEROLLME"
constexpr uint64_t kSnippetKey = 0x5a45524f4c4c4d53ull;  // "ZEROLLMS"
constexpr uint64_t kHoldoutKey = 0x5a45524f4c4c4d48ull;  // "ZEROLLMH"

// Reads a whole regular file (data/data_file.h: a named pipe or directory is refused at once,
// never waited on).
Result<std::string> ReadRegularFile(const std::string& path) { return data::ReadDataFile("", path, "a regular file"); }

// Length of the valid UTF-8 character at s[i], or 0 when none starts there.
int Utf8Length(std::string_view s, size_t i) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) return 1;
  int len;
  uint32_t cp, min;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2, cp = b0 & 0x1F, min = 0x80;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3, cp = b0 & 0x0F, min = 0x800;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  for (int k = 1; k < len; ++k) {
    const auto b = static_cast<uint8_t>(s[i + k]);
    if ((b & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

// Byte offset of the first invalid UTF-8 sequence, or npos.
size_t FirstInvalidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const int len = Utf8Length(s, i);
    if (len == 0) return i;
    i += len;
  }
  return std::string_view::npos;
}

bool ExcludedPythonDir(const std::string& name) {
  return name == "site-packages" || name == "dist-packages" || name == "test" || name == "tests" ||
         name == "idle_test" || name == "__pycache__";
}

// Regular files (not symbolic links) under `root`, sorted; with python_only, *.py files outside
// the excluded folders.
std::vector<std::string> FilesUnder(const std::string& root, bool python_only) {
  std::vector<std::string> files;
  std::error_code ec;
  fs::recursive_directory_iterator it(root, fs::directory_options::skip_permission_denied, ec);
  for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const fs::file_status st = it->symlink_status(ec);
    if (ec) break;
    if (fs::is_directory(st)) {
      if (python_only && ExcludedPythonDir(it->path().filename().string())) it.disable_recursion_pending();
      continue;
    }
    if (!fs::is_regular_file(st)) continue;
    if (python_only && it->path().extension() != ".py") continue;
    files.push_back(it->path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// The part of `text` that fits in `room` bytes of a corpus (after its "\n\n" separator when not
// `first`), cut at a character boundary, into *out. Returns false once the corpus is full.
bool AppendCapped(std::string_view text, int64_t room, bool first, std::string* out) {
  if (!first) {
    if (room <= 2) return false;
    room -= 2;
  }
  if (static_cast<int64_t>(text.size()) <= room) {
    out->assign(text);
    return static_cast<int64_t>(text.size()) < room;
  }
  size_t cut = static_cast<size_t>(room);
  while (cut > 0 && (static_cast<uint8_t>(text[cut]) & 0xC0) == 0x80) --cut;  // not inside a character
  out->assign(text.substr(0, cut));
  return false;
}

void FillWindow(const std::vector<int32_t>& tokens, size_t start, int seq, int32_t* inputs, int32_t* targets) {
  std::memcpy(inputs, tokens.data() + start, sizeof(int32_t) * seq);
  std::memcpy(targets, tokens.data() + start + 1, sizeof(int32_t) * seq);
}

bool SamplerArgsOk(int seq, int batch, int64_t step, int rank, int world) {
  return seq >= 1 && batch >= 1 && step >= 0 && world >= 1 && rank >= 0 && rank < world;
}

// Global sample index of row i (see the header).
uint64_t SampleIndex(int64_t step, int rank, int world, int batch, int i) {
  return (static_cast<uint64_t>(step) * world + rank) * batch + i;
}

// [0, n), or with max in [1, n) the indices floor(i n / max) for i in [0, max).
std::vector<int64_t> SpreadIndices(int64_t n, int64_t max) {
  std::vector<int64_t> out;
  const int64_t count = max > 0 && max < n ? max : n;
  out.reserve(static_cast<size_t>(std::max<int64_t>(count, 0)));
  for (int64_t i = 0; i < count; ++i) {
    out.push_back(count == n ? i : static_cast<int64_t>(static_cast<__int128>(i) * n / count));
  }
  return out;
}

LlmBatch EmptyRows(int batch, int seq) {
  LlmBatch b;
  b.batch = batch;
  b.seq = seq;
  b.inputs.resize(static_cast<size_t>(batch) * seq);
  b.targets.resize(static_cast<size_t>(batch) * seq);
  return b;
}

}  // namespace

// --- token files -------------------------------------------------------------------------------

Status WriteTokenBin(const std::string& path, const std::vector<int32_t>& tokens) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0) {
      return InvalidArgumentError(path + ": token id " + std::to_string(tokens[i]) + " at position " +
                                  std::to_string(i) + " is negative (the file holds uint32 ids)");
    }
  }
  // O_NONBLOCK: a FIFO without a reader fails at once (ENXIO) instead of waiting for one.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("open", path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgumentError(path + ": not a regular file, refusing to write token ids to it");
  }
  const char* data = reinterpret_cast<const char*>(tokens.data());
  size_t left = tokens.size() * sizeof(int32_t);
  while (left > 0) {
    const ssize_t n = ::write(fd, data, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return ErrnoError("write", path, err);
    }
    data += n;
    left -= static_cast<size_t>(n);
  }
  if (::close(fd) != 0) return ErrnoError("close", path, errno);
  return OkStatus();
}

Result<std::vector<int32_t>> ReadTokenBin(const std::string& path, int64_t vocab_size) {
  if (vocab_size < 1)
    return InvalidArgumentError(path + ": vocab_size must be >= 1, got " + std::to_string(vocab_size));
  ZERO_ASSIGN_OR_RETURN(std::string bytes,
                        data::ReadDataFile("", path, "a .bin file of little-endian uint32 token ids"));
  if (bytes.size() % 4 != 0) {
    return DataLossError(path + ": " + std::to_string(bytes.size()) +
                         " bytes, not a multiple of 4 (a token file holds little-endian uint32 ids)");
  }
  std::vector<int32_t> tokens(bytes.size() / 4);
  for (size_t i = 0; i < tokens.size(); ++i) {
    uint32_t id;
    std::memcpy(&id, bytes.data() + 4 * i, 4);
    if (id >= static_cast<uint64_t>(vocab_size)) {
      return InvalidArgumentError(path + ": token id " + std::to_string(id) + " at position " + std::to_string(i) +
                                  " is out of range: expected 0.." + std::to_string(vocab_size - 1) + " (vocab_size " +
                                  std::to_string(vocab_size) + ")");
    }
    tokens[i] = static_cast<int32_t>(id);
  }
  return tokens;
}

// --- corpus ------------------------------------------------------------------------------------

Result<Corpus> LoadCorpusDocuments(const CorpusOptions& options) {
  if (options.max_bytes < 1) {
    return InvalidArgumentError("corpus max_bytes must be >= 1, got " + std::to_string(options.max_bytes));
  }
  Corpus corpus;
  int64_t joined = 0;  // bytes of corpus.Joined()
  std::vector<std::string> searched;
  auto add_text = [&](const std::string& name, std::string_view text) -> bool {
    std::string capped;
    const bool more = AppendCapped(text, options.max_bytes - joined, corpus.documents.empty(), &capped);
    if (!capped.empty()) {
      joined += static_cast<int64_t>(capped.size()) + (corpus.documents.empty() ? 0 : 2);
      corpus.documents.push_back({name, std::move(capped)});
    }
    return more;
  };
  auto add_files = [&](const std::vector<std::string>& files) -> bool {
    for (const std::string& file : files) {
      Result<std::string> text = ReadRegularFile(file);
      if (!text.ok() || text->empty() || FirstInvalidUtf8(*text) != std::string::npos) continue;
      if (!add_text(file, *text)) return false;
    }
    return true;
  };
  if (options.paths.empty()) {
    const std::string licenses = "/usr/share/common-licenses";
    searched.push_back(licenses);
    std::vector<std::string> pythons;
    std::error_code ec;
    for (fs::directory_iterator it("/usr/lib", ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.rfind("python3.", 0) == 0 && it->is_directory(ec)) pythons.push_back(it->path().string());
    }
    std::sort(pythons.begin(), pythons.end());
    if (pythons.empty()) pythons.push_back("/usr/lib/python3.*");
    searched.insert(searched.end(), pythons.begin(), pythons.end());
    if (add_files(FilesUnder(licenses, false))) {
      for (const std::string& dir : pythons) {
        if (!add_files(FilesUnder(dir, true))) break;
      }
    }
  } else {
    for (const std::string& path : options.paths) {
      searched.push_back(path);
      std::error_code ec;
      const fs::file_status st = fs::status(path, ec);
      if (!fs::exists(st)) return NotFoundError("corpus path " + path + ": no such file or directory");
      if (fs::is_directory(st)) {
        if (!add_files(FilesUnder(path, false))) break;
        continue;
      }
      ZERO_ASSIGN_OR_RETURN(std::string text, ReadRegularFile(path));
      const size_t bad = FirstInvalidUtf8(text);
      if (bad != std::string::npos) {
        return InvalidArgumentError("corpus file " + path + ": not valid UTF-8 at byte " + std::to_string(bad));
      }
      if (!text.empty() && !add_text(path, text)) break;
    }
  }
  if (corpus.documents.empty()) {
    std::string where;
    for (const std::string& s : searched) where += (where.empty() ? "" : ", ") + s;
    return NotFoundError("no UTF-8 text found for the corpus in " + where);
  }
  return corpus;
}

Result<std::string> LoadCorpus(const CorpusOptions& options) {
  ZERO_ASSIGN_OR_RETURN(Corpus corpus, LoadCorpusDocuments(options));
  return corpus.Joined();
}

std::string Corpus::Joined() const {
  std::string out;
  out.reserve(static_cast<size_t>(bytes()) + separator.size() * documents.size());
  for (size_t i = 0; i < documents.size(); ++i) {
    if (i > 0) out += separator;
    out += documents[i].text;
  }
  return out;
}

int64_t Corpus::bytes() const {
  int64_t n = 0;
  for (const CorpusDocument& d : documents) n += static_cast<int64_t>(d.text.size());
  return n;
}

// --- held-out documents ----------------------------------------------------------------------------

std::vector<size_t> HeldOutDocuments(const std::vector<int64_t>& sizes, double share, uint64_t seed) {
  const size_t n = sizes.size();
  if (n < 2 || !(share > 0)) return {};
  share = std::min(share, 1.0);
  auto size_of = [&](size_t i) { return static_cast<double>(std::max<int64_t>(sizes[i], 0)); };
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += size_of(i);
  constexpr size_t kBlock = 10;  // documents shuffled among themselves
  constexpr int kDraws = 8;
  uint64_t state = SplitMix64(seed ^ kHoldoutKey);
  std::vector<size_t> best;
  double best_gap = 0;
  for (int draw = 0; draw < kDraws; ++draw) {
    // The documents in corpus order, shuffled within consecutive blocks, then every (1 / share)-th
    // from a drawn start: each is held out with probability `share` whatever its size, and the
    // held-out ones are spread over the corpus.
    std::vector<size_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = i;
    for (size_t begin = 0; begin < n; begin += kBlock) {
      const size_t end = std::min(n, begin + kBlock);
      for (size_t i = end - 1; i > begin; --i) {
        std::swap(order[i], order[begin + SplitMix64Next(&state) % (i - begin + 1)]);
      }
    }
    const double start = static_cast<double>(SplitMix64Next(&state) >> 11) * 0x1.0p-53;
    std::vector<size_t> held;
    double bytes = 0;
    for (size_t k = 0; k < n; ++k) {
      if (std::floor(start + (k + 1) * share) > std::floor(start + k * share)) {
        held.push_back(order[k]);
        bytes += size_of(order[k]);
      }
    }
    if (held.size() == n) {  // never every document
      bytes -= size_of(held.back());
      held.pop_back();
    }
    const double gap = std::abs(bytes - share * total);
    if (draw == 0 || gap < best_gap) best = std::move(held), best_gap = gap;
  }
  std::sort(best.begin(), best.end());
  return best;
}

CorpusSplit SplitCorpus(const Corpus& corpus, double share, uint64_t seed) {
  std::vector<int64_t> sizes;
  for (const CorpusDocument& d : corpus.documents) sizes.push_back(static_cast<int64_t>(d.text.size()));
  const std::vector<size_t> held = HeldOutDocuments(sizes, share, seed);
  CorpusSplit split;
  split.train.separator = split.held_out.separator = corpus.separator;
  size_t next = 0;
  for (size_t i = 0; i < corpus.documents.size(); ++i) {
    const bool out = next < held.size() && held[next] == i;
    if (out) ++next;
    (out ? split.held_out : split.train).documents.push_back(corpus.documents[i]);
  }
  return split;
}

Corpus TextPieces(const std::string& name, const std::string& text, int64_t min_piece_bytes) {
  Corpus c;
  c.separator = "";
  const size_t piece =
      static_cast<size_t>(std::max<int64_t>({min_piece_bytes, 1, static_cast<int64_t>(text.size() / 256)}));
  for (size_t start = 0; start < text.size();) {
    size_t end = std::min(text.size(), start + piece);
    if (end < text.size()) {
      const size_t nl = text.rfind('\n', end - 1);
      if (nl != std::string::npos && nl >= start) {
        end = nl + 1;
      } else {
        while (end > start + 1 && (static_cast<uint8_t>(text[end]) & 0xC0) == 0x80) --end;
      }
    }
    c.documents.push_back(
        {name + "[bytes " + std::to_string(start) + "-" + std::to_string(end) + ")", text.substr(start, end - start)});
    start = end;
  }
  return c;
}

TokenSplit SplitTokens(const std::vector<int32_t>& tokens, int64_t min_piece_tokens, double share, uint64_t seed) {
  TokenSplit split;
  split.piece_tokens = std::max<int64_t>({min_piece_tokens, 1, static_cast<int64_t>(tokens.size() / 256)});
  const size_t piece = static_cast<size_t>(split.piece_tokens);
  std::vector<int64_t> sizes;
  for (size_t start = 0; start < tokens.size(); start += piece) {
    sizes.push_back(static_cast<int64_t>(std::min(piece, tokens.size() - start)));
  }
  split.pieces = sizes.size();
  const std::vector<size_t> held = HeldOutDocuments(sizes, share, seed);
  split.held_out_pieces = held.size();
  size_t next = 0;
  for (size_t p = 0; p < sizes.size(); ++p) {
    const bool out = next < held.size() && held[next] == p;
    if (out) ++next;
    std::vector<int32_t>& to = out ? split.held_out : split.train;
    to.insert(to.end(), tokens.begin() + p * piece, tokens.begin() + p * piece + sizes[p]);
  }
  return split;
}

// --- data files ----------------------------------------------------------------------------------

bool IsTokenFileName(const std::string& path) {
  if (path.size() < 4) return false;
  std::string ext = path.substr(path.size() - 4);
  for (char& ch : ext) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return ext == ".bin";
}

Result<std::string> ReadTextData(const std::string& path) {
  ZERO_ASSIGN_OR_RETURN(std::string text,
                        data::ReadDataFile("--data", path, "a text file, or token ids in a file named *.bin"));
  const size_t nul = text.find('\0');
  if (nul != std::string::npos) {
    return InvalidArgumentError("--data " + path + ": byte " + std::to_string(nul) +
                                " is NUL, so this is binary data, not text; a file of token ids (little-endian "
                                "uint32) must be named *.bin");
  }
  return text;
}

// --- windows -----------------------------------------------------------------------------------

int64_t EvalWindowCount(size_t tokens, int seq) {
  return seq < 1 ? 0 : static_cast<int64_t>(tokens / (static_cast<size_t>(seq) + 1));
}

std::vector<LlmBatch> EvalWindows(const std::vector<int32_t>& tokens, int seq, int64_t max_windows) {
  std::vector<LlmBatch> windows;
  const int64_t n = EvalWindowCount(tokens.size(), seq);
  for (int64_t w : SpreadIndices(n, max_windows)) {
    LlmBatch b = EmptyRows(1, seq);
    FillWindow(tokens, static_cast<size_t>(w) * (seq + 1), seq, b.inputs.data(), b.targets.data());
    windows.push_back(std::move(b));
  }
  return windows;
}

LlmBatch TrainBatch(const std::vector<int32_t>& tokens, int seq, int batch, int64_t step, int rank, int world,
                    uint64_t seed) {
  if (!SamplerArgsOk(seq, batch, step, rank, world) || tokens.size() <= static_cast<size_t>(seq)) return LlmBatch();
  LlmBatch b = EmptyRows(batch, seq);
  const uint64_t starts = tokens.size() - seq;  // windows [start, start + seq]
  const uint64_t key = SplitMix64(seed ^ kWindowKey);
  for (int i = 0; i < batch; ++i) {
    const uint64_t start = SplitMix64(key ^ SplitMix64(SampleIndex(step, rank, world, batch, i))) % starts;
    FillWindow(tokens, start, seq, b.inputs.data() + static_cast<size_t>(i) * seq,
               b.targets.data() + static_cast<size_t>(i) * seq);
  }
  return b;
}

// --- reverse-text task -----------------------------------------------------------------------------

Result<std::vector<ReverseTextExample>> ReverseTextExamples(std::string_view corpus, const BpeTokenizer& tokenizer,
                                                            int count, uint64_t seed, int max_snippet_chars) {
  if (count < 1) return InvalidArgumentError("reverse-text: count must be >= 1, got " + std::to_string(count));
  if (max_snippet_chars < 2) {
    return InvalidArgumentError("reverse-text: max_snippet_chars must be >= 2, got " +
                                std::to_string(max_snippet_chars));
  }
  const int32_t eos = tokenizer.eos_id();
  if (eos < 0) return InvalidArgumentError("reverse-text: the tokenizer has no end-of-text token");
  const std::string& eos_text = tokenizer.token_bytes(eos);
  if (corpus.empty()) return InvalidArgumentError("reverse-text: the corpus is empty");

  constexpr int kAttempts = 64;
  std::vector<ReverseTextExample> examples;
  examples.reserve(count);
  uint64_t state = SplitMix64(seed ^ kSnippetKey);
  for (int e = 0; e < count; ++e) {
    std::string snippet;
    for (int attempt = 0; attempt < kAttempts && snippet.empty(); ++attempt) {
      size_t pos = SplitMix64Next(&state) % corpus.size();
      const int want = max_snippet_chars -
                       static_cast<int>(SplitMix64Next(&state) % static_cast<uint64_t>(max_snippet_chars / 2 + 1));
      while (pos < corpus.size() && (static_cast<uint8_t>(corpus[pos]) & 0xC0) == 0x80) ++pos;
      // Characters of one line, at most `want`.
      std::vector<std::string_view> chars;
      bool valid = true;
      while (pos < corpus.size() && static_cast<int>(chars.size()) < want) {
        if (corpus[pos] == '\n' || corpus[pos] == '\r') break;
        const int len = Utf8Length(corpus, pos);
        if (len == 0) {
          valid = false;
          break;
        }
        chars.push_back(corpus.substr(pos, len));
        pos += len;
      }
      auto blank = [](std::string_view c) { return c == " " || c == "\t" || c == "\f" || c == "\v"; };
      while (!chars.empty() && blank(chars.back())) chars.pop_back();
      size_t first = 0;
      while (first < chars.size() && blank(chars[first])) ++first;
      if (!valid || chars.size() - first < 2) continue;
      std::string s, reversed;
      for (size_t k = first; k < chars.size(); ++k) s.append(chars[k]);
      for (size_t k = chars.size(); k > first; --k) reversed.append(chars[k - 1]);
      if (s.find(eos_text) != std::string::npos || reversed.find(eos_text) != std::string::npos) continue;
      snippet = std::move(s);
      ReverseTextExample ex;
      ex.tokens = tokenizer.Encode("Reverse: " + snippet + "\nAnswer: ");
      ex.prompt_tokens = static_cast<int>(ex.tokens.size());
      const std::vector<int32_t> answer = tokenizer.Encode(reversed);
      ex.tokens.insert(ex.tokens.end(), answer.begin(), answer.end());
      ex.tokens.push_back(eos);
      ex.snippet = snippet;
      examples.push_back(std::move(ex));
    }
    if (snippet.empty()) {
      return InvalidArgumentError("reverse-text: no usable snippet (a line with 2+ characters of valid UTF-8) in " +
                                  std::to_string(kAttempts) + " draws from a corpus of " +
                                  std::to_string(corpus.size()) + " bytes");
    }
  }
  return examples;
}

void ReverseTextRow(const ReverseTextExample& example, int seq, int32_t* inputs, int32_t* targets) {
  const std::vector<int32_t>& t = example.tokens;
  const int n = static_cast<int>(t.size());
  const int32_t pad = t.empty() ? 0 : t.back();
  for (int j = 0; j < seq; ++j) {
    inputs[j] = j < n ? t[j] : pad;
    targets[j] = (j + 1 < n && j + 1 >= example.prompt_tokens) ? t[j + 1] : kIgnoreIndex;
  }
}

LlmBatch ReverseTextBatch(const std::vector<ReverseTextExample>& examples, int seq, int batch, int64_t step, int rank,
                          int world, uint64_t seed) {
  if (!SamplerArgsOk(seq, batch, step, rank, world) || examples.empty()) return LlmBatch();
  LlmBatch b = EmptyRows(batch, seq);
  const uint64_t key = SplitMix64(seed ^ kExampleKey);
  for (int i = 0; i < batch; ++i) {
    const uint64_t e = SplitMix64(key ^ SplitMix64(SampleIndex(step, rank, world, batch, i))) % examples.size();
    ReverseTextRow(examples[e], seq, b.inputs.data() + static_cast<size_t>(i) * seq,
                   b.targets.data() + static_cast<size_t>(i) * seq);
  }
  return b;
}

std::vector<LlmBatch> ReverseTextEvalWindows(const std::vector<ReverseTextExample>& examples, int seq,
                                             int64_t max_windows) {
  std::vector<LlmBatch> windows;
  if (seq < 1) return windows;
  for (int64_t e : SpreadIndices(static_cast<int64_t>(examples.size()), max_windows)) {
    LlmBatch b = EmptyRows(1, seq);
    ReverseTextRow(examples[e], seq, b.inputs.data(), b.targets.data());
    windows.push_back(std::move(b));
  }
  return windows;
}

}  // namespace zero::llm
