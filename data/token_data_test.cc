#include "data/token_data.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
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
  EXPECT_NE(r.status().message().find("FIFO"), std::string::npos) << r.status().message();
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

}  // namespace
}  // namespace zero::llm
