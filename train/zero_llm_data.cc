#include "train/zero_llm_data.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <string>
#include <vector>

#include "data/data_file.h"
#include "hf/bpe_tokenizer.h"
#include "hf/model_dir.h"
#include "runtime/hash.h"

namespace zero::llm {
namespace {

// The reverse-text task's examples (training and held-out together).
constexpr int kTaskExamples = 4096;

bool TextData(const LlmTrainOptions& o) { return o.data.empty() || !IsTokenFileName(o.data); }

std::string ModelTokenizerPath(const LlmTrainOptions& o) {
  if (o.model_dir.empty()) return "";
  const std::string path = o.model_dir + "/tokenizer.json";
  return access(path.c_str(), F_OK) == 0 ? path : "";
}

Result<BpeTokenizer> TokenizerFor(const LlmTrainOptions& o, const LlmConfig& c, const std::string& text) {
  std::string path = o.tokenizer;
  if (path.empty()) path = ModelTokenizerPath(o);
  ZERO_RETURN_IF_ERROR(CheckTokenizerSource(o));
  if (!path.empty()) {
    ZERO_ASSIGN_OR_RETURN(BpeTokenizer t, BpeTokenizer::Load(path));
    if (t.vocab_size() > c.vocab_size) {
      return InvalidArgumentError("tokenizer " + path + " has " + std::to_string(t.vocab_size()) +
                                  " tokens, more than the model's vocab_size " + std::to_string(c.vocab_size));
    }
    return t;
  }
  const int vocab = o.tokenizer_vocab > 0 ? o.tokenizer_vocab : static_cast<int>(std::min<int64_t>(c.vocab_size, 4096));
  if (vocab > c.vocab_size) {
    return InvalidArgumentError("--tokenizer-vocab " + std::to_string(vocab) + " exceeds the model's vocab_size " +
                                std::to_string(c.vocab_size));
  }
  return BpeTokenizer::Train(text, vocab);
}

// "a, b, c and 4 more": the names' last path components, at most `show` of them.
std::string SomeNames(const std::vector<CorpusDocument>& docs, size_t show) {
  std::string out;
  for (size_t i = 0; i < docs.size() && i < show; ++i) {
    const std::string& n = docs[i].name;
    const size_t slash = n.rfind('/', n.find('['));
    out += (i > 0 ? ", " : "") + (slash == std::string::npos ? n : n.substr(slash + 1));
  }
  if (docs.size() > show) out += " and " + std::to_string(docs.size() - show) + " more";
  return out;
}

std::string Percent(double part, double whole) { return Printf("%.1f%%", whole > 0 ? 100 * part / whole : 0.0); }

}  // namespace

// printf into a string.
std::string Printf(const char* format, ...) {
  va_list args, copy;
  va_start(args, format);
  va_copy(copy, args);
  const int n = std::vsnprintf(nullptr, 0, format, copy);
  va_end(copy);
  std::string out(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, format, args);
  va_end(args);
  return out;
}

// --- model and data ----------------------------------------------------------------------------------

Result<LlmConfig> ModelConfig(const LlmTrainOptions& o) {
  LlmConfig c;
  if (!o.model_dir.empty()) {
    // --model names the directory (the weights, tokenizer and config beside each other); a file such
    // as DIR/config.json passed the config's read and failed only in the ranks, at the weights.
    struct stat st;
    if (::stat(o.model_dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
      const size_t slash = o.model_dir.rfind('/');
      const std::string dir = slash == std::string::npos ? "." : o.model_dir.substr(0, slash == 0 ? 1 : slash);
      return InvalidArgumentError("--model " + o.model_dir +
                                  ": a file; pass the Hugging Face directory that holds config.json and the "
                                  "safetensors (here perhaps --model " +
                                  dir + ")");
    }
    ZERO_ASSIGN_OR_RETURN(c, LoadHfConfig(o.model_dir));
  } else {
    auto p = Preset(o.preset);
    if (!p.ok()) return p.status().WithContext("--preset");
    c = *p;
  }
  c.extra_heads = o.extra_heads;
  return c;
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A pretrained model's text must go through its own tokenizer: one trained here on the text gives
// ids the model never saw, and a loss that means nothing. Refused unless asked for (--tokenizer-vocab).
Status CheckTokenizerSource(const LlmTrainOptions& o) {
  if (o.model_dir.empty() || !TextData(o) || !o.tokenizer.empty() || o.tokenizer_vocab > 0) return OkStatus();
  if (!ModelTokenizerPath(o).empty()) return OkStatus();
  const std::string text = !o.data.empty()   ? "--data " + o.data
                           : !o.task.empty() ? "the --task " + o.task + " text"
                                             : "the built-in corpus";
  return InvalidArgumentError(
      "--model " + o.model_dir + " has no tokenizer.json, and " + text +
      " is text to tokenize: a tokenizer trained on it would not be the model's, so its loss would mean nothing. "
      "Give the model's tokenizer (--tokenizer FILE), token ids (--data FILE.bin), or --tokenizer-vocab N to train "
      "a tokenizer on the text on purpose");
}

// The data, split (training runs with --holdout > 0) by whole documents (data/token_data.h,
// HeldOutDocuments): the built-in corpus's files, or pieces of one --data file; the tokenizer is
// trained on the training side only. An evaluation-only run evaluates all of it.
// With --sequential-data the rows are the file's windows in order from its start (an outside
// trainer is fed the same rows), so the held-out part is the stream's tail instead.
Result<Data> LoadData(const LlmTrainOptions& o, const LlmConfig& c) {
  Data d;
  const bool tail = !o.eval_only && o.holdout > 0 && o.sequential_data;
  const bool split = !o.eval_only && o.holdout > 0 && !o.sequential_data;
  const std::string held_intro = Printf("held out for evaluation (--holdout %g, --seed %llu): ", o.holdout,
                                        static_cast<unsigned long long>(o.seed));
  if (!TextData(o)) {
    ZERO_ASSIGN_OR_RETURN(std::vector<int32_t> ids, ReadTokenBin(o.data, c.vocab_size));
    d.source = o.data + " (" + std::to_string(ids.size()) + " token ids)";
    if (split) {
      TokenSplit ts = SplitTokens(ids, int64_t{16} * (o.seq + 1), o.holdout, o.seed);
      d.held_out = held_intro + std::to_string(ts.held_out_pieces) + " of " + std::to_string(ts.pieces) + " runs of " +
                   std::to_string(ts.piece_tokens) + " tokens (" + std::to_string(ts.held_out.size()) + " tokens, " +
                   Percent(ts.held_out.size(), ids.size()) + ")";
      d.train = std::move(ts.train);
      d.eval = std::move(ts.held_out);
    } else {
      (o.eval_only ? d.eval : d.train) = std::move(ids);
    }
  } else {
    Corpus corpus;
    std::string unit = "files";
    if (!o.data.empty()) {
      ZERO_ASSIGN_OR_RETURN(std::string text, ReadTextData(o.data));
      d.source = o.data + " (" + std::to_string(text.size()) + " bytes)";
      corpus = TextPieces(o.data, text);
      unit = "pieces";
    } else {
      CorpusOptions co;
      co.max_bytes = o.corpus_bytes;
      ZERO_ASSIGN_OR_RETURN(corpus, LoadCorpusDocuments(co));
      d.source = "the built-in corpus (" + std::to_string(corpus.documents.size()) + " files, " +
                 std::to_string(corpus.bytes()) + " bytes)";
    }
    CorpusSplit cs;
    if (split) {
      cs = SplitCorpus(corpus, o.holdout, o.seed);
    } else {
      cs.train = std::move(corpus);
    }
    const std::string train_text = cs.train.Joined(), held_text = cs.held_out.Joined();
    // Trained (when it is) on the training side only: the held-out text stays unseen.
    ZERO_ASSIGN_OR_RETURN(BpeTokenizer tok, TokenizerFor(o, c, train_text));
    d.tokenizer_json = tok.ToJson();
    const size_t documents = cs.train.documents.size() + cs.held_out.documents.size();
    if (!cs.held_out.documents.empty()) {
      d.held_out = held_intro + std::to_string(cs.held_out.documents.size()) + " of " + std::to_string(documents) +
                   " " + unit + ", " + std::to_string(cs.held_out.bytes()) + " bytes (" +
                   Percent(cs.held_out.bytes(), cs.held_out.bytes() + cs.train.bytes()) +
                   "): " + SomeNames(cs.held_out.documents, 6);
    }
    const int max_snippet = std::max(8, o.seq / 3);
    if (o.task == "reverse-text") {
      if (o.eval_only) {
        const int count = std::max(1, static_cast<int>(std::lround(kTaskExamples * o.holdout)));
        ZERO_ASSIGN_OR_RETURN(d.task_eval, ReverseTextExamples(train_text, tok, count, o.seed, max_snippet));
        d.source += ", reverse-text task: " + std::to_string(d.task_eval.size()) + " examples";
        return d;
      }
      const int held = held_text.empty() ? 0 : std::max(1, static_cast<int>(std::lround(kTaskExamples * o.holdout)));
      ZERO_ASSIGN_OR_RETURN(d.task_train,
                            ReverseTextExamples(train_text, tok, kTaskExamples - held, o.seed, max_snippet));
      if (held > 0) {
        auto ev = ReverseTextExamples(held_text, tok, held, o.seed, max_snippet);
        if (!ev.ok()) return ev.status().WithContext("the held-out documents");
        d.task_eval = std::move(ev).value();
        d.held_out += "; " + std::to_string(held) + " task examples from them";
      }
      d.source += ", reverse-text task: " + std::to_string(d.task_train.size()) + " examples";
      return d;
    }
    d.train = tok.Encode(train_text);
    d.eval = tok.Encode(held_text);
    if (o.eval_only) std::swap(d.train, d.eval);
    if (!d.held_out.empty()) d.held_out += Printf(" (%zu tokens)", d.eval.size());
    d.source += ", " + std::to_string(d.train.size() + d.eval.size()) + " tokens (vocabulary " +
                std::to_string(tok.vocab_size()) + ")";
  }
  if (tail) {
    const size_t hold = static_cast<size_t>(d.train.size() * o.holdout);
    d.eval.assign(d.train.end() - hold, d.train.end());
    d.train.resize(d.train.size() - hold);
    d.held_out = Printf(
        "held out for evaluation (--holdout %g): the last %zu tokens (--sequential-data keeps the "
        "file's order)",
        o.holdout, hold);
  }
  if (split && d.eval.empty() && d.task_eval.empty()) {
    d.held_out = held_intro + "nothing: the data is too small for whole pieces of it to make that share";
  }
  const std::string what = o.data.empty() ? std::string("the built-in corpus") : "--data " + o.data;
  if (o.eval_only && EvalWindowCount(d.eval.size(), o.seq) < 1) {
    return InvalidArgumentError("--eval-only: " + what + " holds " + std::to_string(d.eval.size()) +
                                " tokens, fewer than one window of --seq + 1 = " + std::to_string(o.seq + 1) +
                                ": nothing to evaluate");
  }
  if (!o.eval_only && d.train.size() < static_cast<size_t>(o.seq) + 1) {
    return InvalidArgumentError(what + ": the training data holds " + std::to_string(d.train.size()) + " tokens" +
                                (split ? " after the held-out split" : "") +
                                ", fewer than --seq + 1 = " + std::to_string(o.seq + 1));
  }
  return d;
}

LlmBatch TrainRows(const Data& d, const LlmTrainOptions& o, int batch, int64_t micro_index, int rank, int world) {
  if (!d.task_train.empty()) return ReverseTextBatch(d.task_train, o.seq, batch, micro_index, rank, world, o.seed);
  if (!o.sequential_data) return TrainBatch(d.train, o.seq, batch, micro_index, rank, world, o.seed);
  LlmBatch b;
  b.batch = batch;
  b.seq = o.seq;
  const int64_t windows = static_cast<int64_t>(d.train.size()) / (o.seq + 1);
  for (int i = 0; i < batch; ++i) {
    const int64_t w = ((micro_index * world + rank) * batch + i) % windows;
    const int32_t* p = d.train.data() + w * (o.seq + 1);
    b.inputs.insert(b.inputs.end(), p, p + o.seq);
    b.targets.insert(b.targets.end(), p + 1, p + o.seq + 1);
  }
  return b;
}

// --- what the ranks must agree on ----------------------------------------------------------------------

// The data's identity: the token streams (and task examples) this rank trains and evaluates on,
// counted and hashed, so that different files (or the same file's different tokenization) differ
// while one file at different paths agrees.
std::string DataIdentity(const Data& d) {
  uint64_t h = 0;
  auto mix = [&h](const void* p, size_t bytes) { h = SplitMix64(h ^ XxHash64(p, bytes)); };
  mix(d.train.data(), d.train.size() * sizeof(int32_t));
  mix(d.eval.data(), d.eval.size() * sizeof(int32_t));
  for (const auto* examples : {&d.task_train, &d.task_eval}) {
    for (const ReverseTextExample& e : *examples) {
      mix(e.tokens.data(), e.tokens.size() * sizeof(int32_t));
      mix(&e.prompt_tokens, sizeof(e.prompt_tokens));
    }
  }
  char out[160];
  std::snprintf(out, sizeof(out), "%zu training + %zu held-out tokens, %zu + %zu task examples, xxh64 %016llx",
                d.train.size(), d.eval.size(), d.task_train.size(), d.task_eval.size(),
                static_cast<unsigned long long>(h));
  return std::string(out);
}

// The initial weights' identity for --model DIR: every *.safetensors and *.json file in DIR (in name
// order) with its size and the XXH64 of its content, read in 4 MiB pieces. The engine compares the
// initial values across ranks itself only when every rank reads every value (not at stage 3 with
// several ranks, where each reads its own shard), so the files are compared here.
Result<std::string> ModelDirIdentity(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (EndsWith(n, ".safetensors") || EndsWith(n, ".json")) names.push_back(n);
    }
    closedir(d);
  } else {
    return ErrnoError("--model: cannot list", dir, errno);
  }
  std::sort(names.begin(), names.end());
  uint64_t h = 0, total = 0;
  std::vector<char> buf(size_t{4} << 20);
  for (const std::string& n : names) {
    FILE* f = std::fopen((dir + "/" + n).c_str(), "rb");
    if (f == nullptr) return ErrnoError("--model: cannot open", dir + "/" + n, errno);
    h = SplitMix64(h ^ Fnv1a64(n));
    size_t got;
    while ((got = std::fread(buf.data(), 1, buf.size(), f)) > 0) {
      h = SplitMix64(h ^ XxHash64(buf.data(), got));
      total += got;
    }
    const bool bad = std::ferror(f) != 0;
    std::fclose(f);
    if (bad) return DataLossError("--model: read error in " + dir + "/" + n);
  }
  char out[120];
  std::snprintf(out, sizeof(out), "%zu files (*.safetensors, *.json), %llu bytes, xxh64 %016llx", names.size(),
                static_cast<unsigned long long>(total), static_cast<unsigned long long>(h));
  return std::string(out);
}

}  // namespace zero::llm
