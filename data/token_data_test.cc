#include "data/token_data.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "testing/scratch_dir.h"
#include "testing/status_matchers.h"

namespace zero::llm {
namespace {

// A path in this test binary's scratch directory (testing/scratch_dir.h), removed at exit.
std::string TempPath(const std::string& name) {
  static ScratchDir dir = std::move(ScratchDir::Create("token_data_test")).value();
  return dir.File(name);
}

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::vector<int32_t> Iota(int n) {
  std::vector<int32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

TEST(TokenBinTest, RoundTripAndRefusals) {
  const std::string path = TempPath("tokens.bin");
  const std::vector<int32_t> ids = {0, 5, 70000, 3, 4095};
  ASSERT_OK(WriteTokenBin(path, ids));
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 20);
  auto back = ReadTokenBin(path, 70001);
  ASSERT_OK(back);
  EXPECT_EQ(*back, ids);

  auto big = ReadTokenBin(path, 4096);  // 70000 at position 2 is out of range
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("70000 at position 2"), std::string::npos) << big.status().message();
  EXPECT_NE(big.status().message().find(path), std::string::npos);

  EXPECT_FALSE(WriteTokenBin(path, {1, -2}).ok());

  const std::string odd = TempPath("odd.bin");
  std::ofstream(odd, std::ios::binary) << "abcdef";
  auto o = ReadTokenBin(odd, 100);
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("not a multiple of 4"), std::string::npos) << o.status().message();

  auto missing = ReadTokenBin(TempPath("no_such.bin"), 100);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("no_such.bin"), std::string::npos);

  auto dir = ReadTokenBin(TempPath(""), 100);
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.status().message().find("directory"), std::string::npos) << dir.status().message();
}

TEST(TokenBinTest, FifoRefusedWithoutHanging) {
  const std::string fifo = TempPath("tokens_fifo");
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = ReadTokenBin(fifo, 100);  // no writer: a blocking open would wait forever
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("named pipe"), std::string::npos) << r.status().message();
  EXPECT_FALSE(WriteTokenBin(fifo, {1, 2}).ok());  // no reader: refused, not waited on
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
}

TEST(WindowsTest, EvalWindowsAreConsecutiveNonOverlappingChunks) {
  const int seq = 8;
  for (int n : {0, 8, 9, 17, 18, 19, 100}) {
    const std::vector<int32_t> t = Iota(n);
    const std::vector<LlmBatch> w = EvalWindows(t, seq);
    ASSERT_EQ(w.size(), static_cast<size_t>(n / (seq + 1))) << n;
    for (size_t k = 0; k < w.size(); ++k) {
      ASSERT_EQ(w[k].batch, 1);
      ASSERT_EQ(w[k].seq, seq);
      ASSERT_OK(w[k].Validate(1000, seq));
      for (int j = 0; j < seq; ++j) {
        EXPECT_EQ(w[k].inputs[j], static_cast<int32_t>(k * (seq + 1) + j));
        EXPECT_EQ(w[k].targets[j], static_cast<int32_t>(k * (seq + 1) + j + 1));
      }
    }
  }
  EXPECT_TRUE(EvalWindows(Iota(100), 0).empty());
}

// A cap on the windows takes them from across the stream, not its start.
TEST(WindowsTest, CappedEvalWindowsAreSpreadOverTheStream) {
  const int seq = 9;  // windows of 10 tokens
  const std::vector<int32_t> t = Iota(1000);
  EXPECT_EQ(EvalWindowCount(t.size(), seq), 100);
  const std::vector<LlmBatch> all = EvalWindows(t, seq, 0), capped = EvalWindows(t, seq, 4);
  ASSERT_EQ(all.size(), 100u);
  ASSERT_EQ(capped.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(capped[i].inputs[0], 250 * i) << i;  // windows 0, 25, 50, 75
  EXPECT_EQ(EvalWindows(t, seq, 100).size(), 100u);
  EXPECT_EQ(EvalWindows(t, seq, 1000).size(), 100u);
}

TEST(WindowsTest, TrainBatchIsDeterministicPerRankAndSplitsAGlobalBatch) {
  const std::vector<int32_t> t = Iota(5000);
  const int seq = 16;
  const LlmBatch a = TrainBatch(t, seq, 4, 7, 1, 2, 42);
  ASSERT_OK(a.Validate(5000, seq));
  for (int i = 0; i < 4; ++i) {  // rows are windows of the data
    const int32_t start = a.inputs[i * seq];
    for (int j = 0; j < seq; ++j) {
      EXPECT_EQ(a.inputs[i * seq + j], start + j);
      EXPECT_EQ(a.targets[i * seq + j], start + j + 1);
    }
  }
  const LlmBatch again = TrainBatch(t, seq, 4, 7, 1, 2, 42);
  EXPECT_EQ(again.inputs, a.inputs);
  EXPECT_NE(TrainBatch(t, seq, 4, 7, 0, 2, 42).inputs, a.inputs);  // other rank
  EXPECT_NE(TrainBatch(t, seq, 4, 8, 1, 2, 42).inputs, a.inputs);  // other step
  EXPECT_NE(TrainBatch(t, seq, 4, 7, 1, 2, 43).inputs, a.inputs);  // other seed
  // Ranks 0 and 1 of 2 with 4 rows = one rank with 8 rows.
  const LlmBatch whole = TrainBatch(t, seq, 8, 7, 0, 1, 42);
  const LlmBatch r0 = TrainBatch(t, seq, 4, 7, 0, 2, 42);
  std::vector<int32_t> joined = r0.inputs;
  joined.insert(joined.end(), a.inputs.begin(), a.inputs.end());
  EXPECT_EQ(joined, whole.inputs);
  // Starts cover the whole range, the last window included.
  std::set<int32_t> starts;
  const std::vector<int32_t> small = Iota(seq + 3);  // 3 possible windows
  for (int s = 0; s < 64; ++s) starts.insert(TrainBatch(small, seq, 1, s, 0, 1, 1).inputs[0]);
  EXPECT_EQ(starts, (std::set<int32_t>{0, 1, 2}));
  // Bad arguments: an empty batch that Validate refuses.
  EXPECT_EQ(TrainBatch(Iota(seq), seq, 1, 0, 0, 1, 1).batch, 0);
  EXPECT_EQ(TrainBatch(t, seq, 1, 0, 2, 2, 1).batch, 0);
  EXPECT_FALSE(TrainBatch(t, 0, 1, 0, 0, 1, 1).Validate(5000, 16).ok());
}

BpeTokenizer SmallTokenizer(const std::string& text) {
  auto t = BpeTokenizer::Train(text, 600);
  EXPECT_OK(t);
  return std::move(t).value();
}

std::string ReverseCodePoints(const std::string& s) {
  std::vector<std::string> chars;
  for (size_t i = 0; i < s.size();) {
    size_t len = 1;
    while (i + len < s.size() && (static_cast<unsigned char>(s[i + len]) & 0xC0) == 0x80) ++len;
    chars.push_back(s.substr(i, len));
    i += len;
  }
  std::string r;
  for (auto it = chars.rbegin(); it != chars.rend(); ++it) r += *it;
  return r;
}

TEST(ReverseTextTest, ExamplesMaskExactlyThePrompt) {
  std::string corpus;
  for (int i = 0; i < 30; ++i) {
    corpus += "line " + std::to_string(i) + ": the caf\xc3\xa9 serves na\xc3\xafve \xe6\x97\xa5\xe6\x9c\xac tea\n";
  }
  const BpeTokenizer tok = SmallTokenizer(corpus);
  auto ex = ReverseTextExamples(corpus, tok, 50, 7, 20);
  ASSERT_OK(ex);
  ASSERT_EQ(ex->size(), 50u);
  const int seq = 64;
  for (const ReverseTextExample& e : *ex) {
    ASSERT_GE(e.snippet.size(), 2u);
    EXPECT_EQ(e.snippet.find('\n'), std::string::npos);
    const std::vector<int32_t> prompt = tok.Encode("Reverse: " + e.snippet + "\nAnswer: ");
    const std::vector<int32_t> answer = tok.Encode(ReverseCodePoints(e.snippet));
    ASSERT_EQ(e.prompt_tokens, static_cast<int>(prompt.size()));
    std::vector<int32_t> expect = prompt;
    expect.insert(expect.end(), answer.begin(), answer.end());
    expect.push_back(tok.eos_id());
    ASSERT_EQ(e.tokens, expect);
    EXPECT_EQ(tok.Decode(answer), ReverseCodePoints(e.snippet));
    ASSERT_LE(e.tokens.size(), static_cast<size_t>(seq + 1));

    std::vector<int32_t> in(seq), tg(seq);
    ReverseTextRow(e, seq, in.data(), tg.data());
    const int n = static_cast<int>(e.tokens.size());
    for (int j = 0; j < seq; ++j) {
      EXPECT_EQ(in[j], j < n ? e.tokens[j] : tok.eos_id()) << j;
      if (j + 1 < e.prompt_tokens || j + 1 >= n) {
        EXPECT_EQ(tg[j], kIgnoreIndex) << j;
      } else {
        EXPECT_EQ(tg[j], e.tokens[j + 1]) << j;
      }
    }
    // The counted targets are exactly the answer and the eos.
    int counted = 0;
    for (int32_t t : tg) counted += t != kIgnoreIndex;
    EXPECT_EQ(counted, static_cast<int>(answer.size()) + 1);
  }
  // Deterministic in the seed; another seed draws other snippets.
  auto again = ReverseTextExamples(corpus, tok, 50, 7, 20);
  auto other = ReverseTextExamples(corpus, tok, 50, 8, 20);
  ASSERT_TRUE(again.ok() && other.ok());
  EXPECT_EQ((*again)[13].tokens, (*ex)[13].tokens);
  int differ = 0;
  for (int i = 0; i < 50; ++i) differ += (*other)[i].snippet != (*ex)[i].snippet;
  EXPECT_GT(differ, 0);

  const LlmBatch b = ReverseTextBatch(*ex, seq, 6, 3, 1, 4, 9);
  ASSERT_OK(b.Validate(tok.vocab_size(), seq));
  EXPECT_EQ(ReverseTextBatch(*ex, seq, 6, 3, 1, 4, 9).inputs, b.inputs);
  const std::vector<LlmBatch> eval = ReverseTextEvalWindows(*ex, seq);
  ASSERT_EQ(eval.size(), 50u);
  EXPECT_EQ(eval[5].inputs[0], (*ex)[5].tokens[0]);

  EXPECT_FALSE(ReverseTextExamples("\n\n\n \n", tok, 3, 1, 10).ok());
  EXPECT_FALSE(ReverseTextExamples(corpus, tok, 0, 1, 10).ok());
}

TEST(CorpusTest, DefaultCorpusIsOnThisMachineAndCapped) {
  CorpusOptions small;
  small.max_bytes = 100000;
  auto text = LoadCorpus(small);
  ASSERT_OK(text);
  EXPECT_EQ(text->size(), 100000u);  // the licenses alone hold more
  EXPECT_NE(text->find("License"), std::string::npos);

  CorpusOptions two;
  two.max_bytes = 2 << 20;
  const auto t0 = std::chrono::steady_clock::now();
  auto corpus = LoadCorpus(two);
  const auto t1 = std::chrono::steady_clock::now();
  ASSERT_OK(corpus);
  EXPECT_GT(corpus->size(), (2u << 20) - 8);  // the Python sources fill it up
  EXPECT_LE(corpus->size(), 2u << 20);
  EXPECT_NE(corpus->find("def "), std::string::npos);
  EXPECT_EQ(corpus->compare(0, 100000, *text), 0);  // the same files in the same order
  auto tok = BpeTokenizer::Train(*corpus, 4096);
  const auto t2 = std::chrono::steady_clock::now();
  ASSERT_OK(tok);
  const std::vector<int32_t> ids = tok->Encode(*corpus);
  const auto t3 = std::chrono::steady_clock::now();
  EXPECT_EQ(tok->vocab_size(), 4096);
  EXPECT_EQ(tok->Decode(ids), *corpus);
  auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  std::printf(
      "corpus: %zu bytes loaded in %.3f s; BPE training to %d tokens: %.3f s; encoding: %.3f s, "
      "%zu tokens (%.2f bytes/token)\n",
      corpus->size(), secs(t0, t1), tok->vocab_size(), secs(t1, t2), secs(t2, t3), ids.size(),
      static_cast<double>(corpus->size()) / ids.size());
}

TEST(CorpusTest, ExplicitPathsAndErrors) {
  const std::string dir = TempPath("corpus_dir");
  ::mkdir(dir.c_str(), 0755);
  std::ofstream(dir + "/b.txt") << "second";
  std::ofstream(dir + "/a.txt") << "first";
  std::ofstream(dir + "/c.bin", std::ios::binary) << "bad \xff utf8";
  const std::string file = TempPath("corpus_file.txt");
  std::ofstream(file) << "caf\xc3\xa9 au lait";
  CorpusOptions o;
  o.paths = {dir, file};
  auto t = LoadCorpus(o);
  ASSERT_OK(t);
  EXPECT_EQ(*t, "first\n\nsecond\n\ncaf\xc3\xa9 au lait");
  o.max_bytes = 18;  // cut inside "é" (bytes 18-19): the character is left out
  auto cut = LoadCorpus(o);
  ASSERT_OK(cut);
  EXPECT_EQ(*cut, "first\n\nsecond\n\ncaf");

  o = CorpusOptions();
  o.paths = {dir + "/c.bin"};
  auto bad = LoadCorpus(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("c.bin: not valid UTF-8 at byte 4"), std::string::npos)
      << bad.status().message();
  o.paths = {TempPath("nowhere")};
  EXPECT_FALSE(LoadCorpus(o).ok());
  const std::string empty = TempPath("empty_dir");
  ::mkdir(empty.c_str(), 0755);
  o.paths = {empty};
  auto none = LoadCorpus(o);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find(empty), std::string::npos) << none.status().message();
}

// Writes `count` files of distinct text under DIR/NAME (sizes vary from 200 to 3000 bytes; each line
// names its file, so a file's text is found nowhere else) and returns the directory.
std::string WriteFiles(const std::string& name, int count) {
  const std::string dir = TempPath(name);
  ::mkdir(dir.c_str(), 0755);
  for (int i = 0; i < count; ++i) {
    char file[32];
    std::snprintf(file, sizeof(file), "/f%03d.txt", i);
    std::ofstream out(dir + file);
    const int lines = 5 + (i * 37) % 70;
    for (int l = 0; l < lines; ++l) out << "line " << l << " of " << name << file << "\n";
  }
  return dir;
}

// The held-out set is whole documents, none of them in the training text, about the share asked
// for, taken from every part of the corpus (not its tail), and a function of the seed.
TEST(HeldOutTest, WholeDocumentsFromAcrossTheCorpusReproducibleFromTheSeed) {
  CorpusOptions o;
  o.paths = {WriteFiles("root_a", 30), WriteFiles("root_b", 30), WriteFiles("root_c", 30)};
  o.max_bytes = int64_t{1} << 30;
  auto corpus = LoadCorpusDocuments(o);
  ASSERT_OK(corpus);
  ASSERT_EQ(corpus->documents.size(), 90u);
  const double share = 0.1;
  const CorpusSplit split = SplitCorpus(*corpus, share, /*seed=*/7);
  ASSERT_FALSE(split.held_out.documents.empty());
  EXPECT_EQ(split.train.documents.size() + split.held_out.documents.size(), 90u);
  const std::string train = split.train.Joined();
  std::set<std::string> roots;
  for (const CorpusDocument& d : split.held_out.documents) {
    EXPECT_EQ(d.text, ReadWholeFile(d.name)) << d.name << " is held out whole";
    EXPECT_EQ(train.find(d.name.substr(d.name.size() - 15)), std::string::npos) << d.name << " is not trained on";
    roots.insert(d.name.substr(0, d.name.size() - 9));
  }
  EXPECT_EQ(roots.size(), 3u) << "every part of the corpus gives some of the held-out set";
  const double held = static_cast<double>(split.held_out.bytes()), total = static_cast<double>(corpus->bytes());
  EXPECT_NEAR(held, share * total, 0.02 * total) << held / total;
  EXPECT_NEAR(static_cast<double>(split.held_out.documents.size()), share * 90, 2);
  std::printf("held out %zu of 90 documents, %.0f of %.0f bytes (%.1f%%)\n", split.held_out.documents.size(), held,
              total, 100 * held / total);

  // The same seed gives the same split, another seed another; no share, nothing held out.
  std::vector<int64_t> sizes;
  for (const CorpusDocument& d : corpus->documents) sizes.push_back(static_cast<int64_t>(d.text.size()));
  EXPECT_EQ(HeldOutDocuments(sizes, share, 7), HeldOutDocuments(sizes, share, 7));
  EXPECT_NE(HeldOutDocuments(sizes, share, 7), HeldOutDocuments(sizes, share, 8));
  EXPECT_TRUE(HeldOutDocuments(sizes, 0.0, 7).empty());
  EXPECT_TRUE(HeldOutDocuments({100}, 0.5, 7).empty()) << "one document: nothing to hold out";
  EXPECT_EQ(HeldOutDocuments({100, 100}, 0.5, 7).size(), 1u) << "never every document";
}

// The default corpus (4 MiB, as tools/run.sh trains on): the held-out files are not the corpus's
// tail (issue 35: that was Python's encodings/cp860-cp866.py, codec tables like others trained on)
// but files from its start to its end, about 5% of it.
TEST(HeldOutTest, DefaultCorpusHoldsOutFilesFromItsWholeLength) {
  auto corpus = LoadCorpusDocuments(CorpusOptions());
  ASSERT_OK(corpus);
  const size_t n = corpus->documents.size();
  ASSERT_GT(n, 40u);
  std::vector<int64_t> sizes;
  for (const CorpusDocument& d : corpus->documents) sizes.push_back(static_cast<int64_t>(d.text.size()));
  const std::vector<size_t> held = HeldOutDocuments(sizes, 0.05, 1);
  ASSERT_GT(held.size(), 3u);
  EXPECT_LT(held.front(), n / 4) << "from the first quarter";
  EXPECT_GE(held.back(), 3 * n / 4) << "to the last quarter";
  int64_t bytes = 0;
  std::string names;
  for (size_t i : held) {
    bytes += sizes[i];
    names += " " + corpus->documents[i].name.substr(corpus->documents[i].name.rfind('/') + 1);
  }
  const double share = static_cast<double>(bytes) / static_cast<double>(corpus->bytes());
  EXPECT_GT(share, 0.03);
  EXPECT_LT(share, 0.07);
  std::printf("default corpus: %zu documents; held out %zu (%.2f%% of the bytes):%s\n", n, held.size(), 100 * share,
              names.c_str());
}

TEST(HeldOutTest, OneTextFileSplitsIntoLinePiecesAndATokenStreamIntoRuns) {
  std::string text;
  for (int l = 0; l < 3000; ++l) text += "line number " + std::to_string(l) + " \xc3\xa9t\xc3\xa9\n";
  const Corpus pieces = TextPieces("notes.txt", text, 1000);
  ASSERT_GT(pieces.documents.size(), 20u);
  EXPECT_EQ(pieces.Joined(), text);
  for (size_t i = 0; i + 1 < pieces.documents.size(); ++i) {
    EXPECT_EQ(pieces.documents[i].text.back(), '\n') << pieces.documents[i].name;
  }
  EXPECT_EQ(pieces.documents[0].name.rfind("notes.txt[bytes 0-", 0), 0u) << pieces.documents[0].name;
  const CorpusSplit split = SplitCorpus(pieces, 0.1, 3);
  EXPECT_NEAR(static_cast<double>(split.held_out.bytes()), 0.1 * text.size(), 1000);

  const std::vector<int32_t> t = Iota(100000);
  const TokenSplit ts = SplitTokens(t, 1000, 0.05, 3);
  EXPECT_EQ(ts.pieces, 100u);
  EXPECT_EQ(ts.held_out_pieces, 5u);
  EXPECT_EQ(ts.held_out.size(), 5000u);
  EXPECT_EQ(ts.train.size() + ts.held_out.size(), t.size());
  for (size_t i = 0; i < ts.held_out.size(); i += 1000) {  // whole runs of 1000
    EXPECT_EQ(ts.held_out[i] % 1000, 0) << i;
    for (size_t j = 1; j < 1000; ++j) ASSERT_EQ(ts.held_out[i + j], ts.held_out[i] + static_cast<int32_t>(j));
  }
  EXPECT_EQ(SplitTokens(t, 1000, 0.05, 3).held_out, ts.held_out);
}

TEST(DataFileTest, TokenFileNamesAndBinaryTextRefused) {
  EXPECT_TRUE(IsTokenFileName("a/tokens.bin"));
  EXPECT_TRUE(IsTokenFileName("tokens.BIN"));
  EXPECT_TRUE(IsTokenFileName("tokens.Bin"));
  EXPECT_FALSE(IsTokenFileName("tokens.dat"));
  EXPECT_FALSE(IsTokenFileName("bin"));
  const std::string ids = TempPath("ids.dat");
  ASSERT_OK(WriteTokenBin(ids, {1, 2, 3}));
  auto r = ReadTextData(ids);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--data " + ids + ": byte 1 is NUL"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("*.bin"), std::string::npos) << r.status().message();
  auto dir = ReadTextData(TempPath(""));
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.status().message().find("not a regular file (it is a directory)"), std::string::npos)
      << dir.status().message();
  const std::string text = TempPath("plain.txt");
  std::ofstream(text) << "plain text";
  auto ok = ReadTextData(text);
  ASSERT_OK(ok);
  EXPECT_EQ(*ok, "plain text");
}

}  // namespace
}  // namespace zero::llm
