#include "hf/bpe_tokenizer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
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
  static ScratchDir dir = std::move(ScratchDir::Create("bpe_tokenizer_test")).value();
  return dir.File(name);
}

// English-like text with repeated words, so that merges have pairs to count.
std::string SmallCorpus() {
  std::string s;
  const char* lines[] = {
      "The quick brown fox jumps over the lazy dog.\n",
      "the dog's bone isn't where the fox left it; 12 foxes, 345 dogs.\n",
      "\tdef jump(self, height=3):\n\t\treturn self.height + height  # jump!\n",
      "Les na\xc3\xafves caf\xc3\xa9s \xe2\x80\x94 \xe2\x80\x9cquoted\xe2\x80\x9d text \xc2\xbd, 3\xc2\xb2.\n",
  };
  for (int i = 0; i < 40; ++i) s += lines[i % 4];
  return s;
}

std::vector<std::string> Samples() {
  return {"",
          "hello world",
          "The quick brown fox jumps over the lazy dog.",
          "  leading and trailing spaces  ",
          "tabs\tand\nnewlines\r\n\n\nand digits 0123456789 3.14159",
          "punctuation!? (a, b) [c] {d} <e> @#$%^&*_-+=~`|\\/'\"",
          "I'll don't you're we've he's she'd it'm 'S",
          "caf\xc3\xa9 na\xc3\xafve \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x98\x80 \xe2\x80\x94",
          "before<|endoftext|>after<|endoftext|><|endoftext|>",
          "<|endoftext|>",
          "<|endoftext",
          "bytes \xff\xfe invalid \xc3"};
}

TEST(ByteLevelTest, TableIsGpt2s) {
  const auto& map = ByteToUnicode();
  std::set<char32_t> seen(map.begin(), map.end());
  EXPECT_EQ(seen.size(), 256u);
  char32_t next = 0x100;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    if (printable) {
      EXPECT_EQ(map[b], static_cast<char32_t>(b)) << "byte " << b;
    } else {
      EXPECT_EQ(map[b], next++) << "byte " << b;
    }
  }
  EXPECT_EQ(next, 0x144u);                                           // 68 non-printable bytes
  EXPECT_EQ(BytesToByteLevel(" hello\n"), "\xc4\xa0hello\xc4\x8a");  // "Ġhello Ċ"
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  auto back = ByteLevelToBytes(BytesToByteLevel(all));
  ASSERT_OK(back);
  EXPECT_EQ(*back, all);
  auto bad = ByteLevelToBytes("ab c");  // a plain space is not a byte-level character
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("byte 2"), std::string::npos) << bad.status().message();
}

TEST(PreTokenizeTest, SplitsLikeGpt2sRegex) {
  // Expected pieces are what tokenizers 0.23's ByteLevel(use_regex=True) pre-tokenizer gives.
  struct Case {
    std::string text;
    std::vector<std::string> pieces;
  };
  const std::vector<Case> cases = {
      {"Hello world's 123 foo!!  bar\n\nbaz  ",
       {"Hello", " world", "'s", " 123", " foo", "!!", " ", " bar", "\n", "\n", "baz", "  "}},
      {"I'll\tdon't'S x  \n y", {"I", "'ll", "\t", "don", "'t", "'", "S", " x", "  \n", " y"}},
      {"na\xc3\xafve caf\xc3\xa9 \xe2\x80\x94 \xe2\x80\x9cquoted\xe2\x80\x9d \xc2\xbd 3\xc2\xb2\xc2\xa0x\xe3\x80\x80"
       "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e",
       {"na\xc3\xafve", " caf\xc3\xa9", " \xe2\x80\x94", " \xe2\x80\x9c", "quoted", "\xe2\x80\x9d", " \xc2\xbd",
        " 3\xc2\xb2", "\xc2\xa0", "x", "\xe3\x80\x80", "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e"}},
      {" ", {" "}},
      {"  a", {" ", " a"}},
      {"a\r\n\r\n", {"a", "\r\n\r\n"}},
  };
  for (const Case& c : cases) {
    std::vector<std::string> got;
    for (std::string_view p : PreTokenize(c.text)) got.emplace_back(p);
    EXPECT_EQ(got, c.pieces) << "text: " << c.text;
  }
}

TEST(PreTokenizeTest, SplitsLikeLlama3AndQwen2Regexes) {
  // Expected pieces are what tokenizers 0.23's Split(Regex(pattern), "isolated") gives.
  const std::string text = "'S 'LL x'\xc5\xbf 'hello \"quoted\" 12345 a1b  \n\n  x \t\nfoo\r\n\r\n  \tbar!!\n\n end  ";
  const std::vector<std::string> head = {"'S",    " '",  "LL",     " x", "'\xc5\xbf", " '",
                                         "hello", " \"", "quoted", "\"", " "};
  const std::vector<std::string> tail = {" a",  "1",        "b",  "  \n\n", " ",      " x",   " \t\n",
                                         "foo", "\r\n\r\n", "  ", "\tbar",  "!!\n\n", " end", "  "};
  auto expect = [&](std::vector<std::string> digits) {
    std::vector<std::string> v = head;
    v.insert(v.end(), digits.begin(), digits.end());
    v.insert(v.end(), tail.begin(), tail.end());
    return v;
  };
  auto split = [&](SplitPattern p) {
    std::vector<std::string> got;
    for (std::string_view piece : PreTokenize(text, p)) got.emplace_back(piece);
    return got;
  };
  EXPECT_EQ(split(SplitPattern::kLlama3), expect({"123", "45"}));
  EXPECT_EQ(split(SplitPattern::kQwen2), expect({"1", "2", "3", "4", "5"}));
  std::vector<std::string> nbsp;
  for (std::string_view piece : PreTokenize(" \xc2\xa0word\tword\n word 1234567", SplitPattern::kLlama3)) {
    nbsp.emplace_back(piece);
  }
  EXPECT_EQ(nbsp, (std::vector<std::string>{" ", "\xc2\xa0word", "\tword", "\n", " word", " ", "123", "456", "7"}));
}

TEST(BpeTokenizerTest, MergesMostFrequentPairLowestIdsOnTies) {
  // One word "aaabdaaabac": aa (4) first; then ab and (aa, a) tie at 2 and ab has the lower ids;
  // then aaab (2); every pair left occurs once, below min_frequency 2.
  auto t = BpeTokenizer::Train("aaabdaaabac", 1000);
  ASSERT_OK(t);
  ASSERT_EQ(t->num_merges(), 3);
  EXPECT_EQ(t->token_bytes(256), "aa");
  EXPECT_EQ(t->token_bytes(257), "ab");
  EXPECT_EQ(t->token_bytes(258), "aaab");
  EXPECT_EQ(t->vocab_size(), 260);
  EXPECT_EQ(t->eos_id(), 259);
  EXPECT_EQ(t->token_bytes(259), kEndOfText);
  EXPECT_TRUE(t->is_special(259));
  EXPECT_EQ(t->Encode("aaabdaaabac"),
            (std::vector<int32_t>{258, t->TokenId("d"), 258, t->TokenId("a"), t->TokenId("c")}));
  // Base ids follow GPT-2's vocabulary: '!' is 0, the space byte is 220.
  EXPECT_EQ(t->TokenId("!"), 0);
  EXPECT_EQ(t->TokenId(" "), 220);
  EXPECT_FALSE(BpeTokenizer::Train("abc", 256).ok());
}

TEST(BpeTokenizerTest, TrainedMergesShortenTextAndDecodeInverts) {
  const std::string corpus = SmallCorpus();
  auto t = BpeTokenizer::Train(corpus, 340);
  ASSERT_OK(t);
  EXPECT_EQ(t->vocab_size(), 340);
  EXPECT_EQ(t->num_merges(), 340 - 257);
  const std::vector<int32_t> ids = t->Encode(corpus);
  EXPECT_LT(ids.size() * 2, corpus.size()) << "merges should compress the training text";
  for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < t->vocab_size());
  for (const std::string& s : Samples()) EXPECT_EQ(t->Decode(t->Encode(s)), s) << s;
  // Special tokens in the text are single ids; Decode(skip_special) drops them.
  const std::vector<int32_t> e = t->Encode("x<|endoftext|>y");
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[1], t->eos_id());
  EXPECT_EQ(t->Decode(e, /*skip_special=*/true), "xy");
  EXPECT_EQ(t->Decode({-1, 1 << 20}), "\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(BpeTokenizerTest, TrainingIsDeterministic) {
  const std::string corpus = SmallCorpus();
  auto a = BpeTokenizer::Train(corpus, 330);
  auto b = BpeTokenizer::Train(std::vector<std::string_view>{corpus}, 330);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->merges(), b->merges());
  EXPECT_EQ(a->ToJson(), b->ToJson());
  auto c = BpeTokenizer::Train(corpus + "zzzz zzzz zzzz zzzz", 330);
  ASSERT_OK(c);
  EXPECT_NE(a->merges(), c->merges());
}

TEST(BpeTokenizerTest, SaveLoadRoundTrip) {
  auto t = BpeTokenizer::Train(SmallCorpus(), 380);
  ASSERT_OK(t);
  const std::string path = TempPath("tokenizer.json");
  ASSERT_OK(t->Save(path));
  auto u = BpeTokenizer::Load(path);
  ASSERT_OK(u);
  EXPECT_EQ(u->vocab_size(), t->vocab_size());
  EXPECT_EQ(u->eos_id(), t->eos_id());
  EXPECT_EQ(u->merges(), t->merges());
  EXPECT_EQ(u->ToJson(), t->ToJson());
  for (const std::string& s : Samples()) EXPECT_EQ(u->Encode(s), t->Encode(s)) << s;
  EXPECT_EQ(u->Encode(SmallCorpus()), t->Encode(SmallCorpus()));
  // A directory holding tokenizer.json loads too.
  auto dir = BpeTokenizer::Load(TempPath(""));
  ASSERT_OK(dir);
  EXPECT_EQ(dir->vocab_size(), t->vocab_size());
}

// A GPT-2-style file written by hand: merges as [left, right] pairs, a special token only in
// added_tokens, add_prefix_space true.
TEST(BpeTokenizerTest, LoadsHuggingFaceStyleFile) {
  std::string vocab;
  for (int b = 0; b < 256; ++b) {
    std::string key = BytesToByteLevel(std::string(1, static_cast<char>(b)));
    if (key == "\"" || key == "\\") key = "\\" + key;
    vocab += "\"" + key + "\": " + std::to_string(b) + ", ";
  }
  vocab += "\"\xc4\xa0h\": 256, \"\xc4\xa0hi\": 257";
  const std::string json = R"({"version": "1.0", "added_tokens": [{"id": 258, "content": "<|im_end|>",
      "special": true}], "normalizer": null,
      "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": true, "use_regex": true},
      "model": {"type": "BPE", "vocab": {)" +
                           vocab + R"(}, "merges": [["Ġ", "h"], "Ġh i"]}})";
  auto t = BpeTokenizer::FromJson(json, "hf.json");
  ASSERT_OK(t);
  EXPECT_EQ(t->vocab_size(), 259);
  EXPECT_EQ(t->eos_id(), -1);
  EXPECT_EQ(t->Encode("hi<|im_end|>hi"), (std::vector<int32_t>{257, 258, 257}));
  EXPECT_EQ(t->Decode({257, 258}), " hi<|im_end|>");
}

// Qwen2-style: NFC normalizer (kept, not applied), Split + ByteLevel(use_regex false), a template
// post-processor kept for Save.
TEST(BpeTokenizerTest, LoadsQwenStyleFileAndKeepsItsSettings) {
  std::string vocab;
  for (int b = 0; b < 256; ++b) {
    std::string key = BytesToByteLevel(std::string(1, static_cast<char>(b)));
    if (key == "\"" || key == "\\") key = "\\" + key;
    vocab += "\"" + key + "\": " + std::to_string(b) + ", ";
  }
  vocab += "\"12\": 256";
  const std::string regex =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|)"
      R"(\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+)";
  auto make = [&](const std::string& re) {
    return R"({"version": "1.0", "added_tokens": [{"id": 257, "content": "<|endoftext|>", "special": true}],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
          {"type": "Split", "pattern": {"Regex": ")" +
           re + R"("}, "behavior": "Isolated", "invert": false},
          {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]},
        "post_processor": {"type": "TemplateProcessing", "single": []},
        "model": {"type": "BPE", "vocab": {)" +
           vocab + R"(}, "merges": ["1 2"]}})";
  };
  auto t = BpeTokenizer::FromJson(make(regex), "qwen.json");
  ASSERT_OK(t);
  // Single digits: "12" is never a piece, so its merge never applies.
  EXPECT_EQ(t->Encode("x12"), (std::vector<int32_t>{t->TokenId("x"), t->TokenId("1"), t->TokenId("2")}));
  EXPECT_EQ(t->eos_id(), 257);
  const std::string saved = t->ToJson();
  EXPECT_NE(saved.find("\"NFC\""), std::string::npos);
  EXPECT_NE(saved.find("TemplateProcessing"), std::string::npos);
  auto again = BpeTokenizer::FromJson(saved, "saved.json");
  ASSERT_OK(again);
  EXPECT_EQ(again->ToJson(), saved);
  // Any other regex is refused, naming the key.
  std::string other = regex;
  other.replace(other.find("\\\\p{N}|"), 7, "\\\\p{N}{1,2}|");
  auto refused = BpeTokenizer::FromJson(make(other), "other.json");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("other.json: pre_tokenizer"), std::string::npos)
      << refused.status().message();
}

// The 256 byte tokens as tokenizer.json's model.vocab entries (ids 0..255 in byte order).
std::string ByteVocabEntries() {
  std::string vocab;
  for (int b = 0; b < 256; ++b) {
    std::string key = BytesToByteLevel(std::string(1, static_cast<char>(b)));
    if (key == "\"" || key == "\\") key = "\\" + key;
    vocab += (b ? ", \"" : "\"") + key + "\": " + std::to_string(b);
  }
  return vocab;
}

// Issue 35: hostile tokenizer.json text is an error naming the file, never a crash or an exception.
TEST(BpeTokenizerTest, HostileJsonIsAnErrorNamingTheFile) {
  const std::string model = R"("model": {"type": "BPE", "vocab": {)" + ByteVocabEntries() + R"(}, "merges": []})";
  const std::string pre = R"("pre_tokenizer": {"type": "ByteLevel", "use_regex": true})";
  ASSERT_OK(BpeTokenizer::FromJson("{" + pre + ", " + model + "}", "plain.json"));  // the base is valid
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  struct Case {
    const char* what;
    std::string text, expect;
  };
  const std::vector<Case> cases = {
      // An unsupported pre_tokenizer is shown in the error; a post_processor is kept as its dump.
      {"100k-deep pre_tokenizer", "{\"pre_tokenizer\": " + deep + ", " + model + "}",
       "t.json: JSON nested deeper than 100 levels at line 1, column 118"},
      {"100k-deep post_processor", "{" + pre + ", \"post_processor\": {\"x\": " + deep + "}, " + model + "}",
       "t.json: JSON nested deeper than 100 levels at line 1"},
      {"1e400 under a known key",
       "{" + pre + ", \"truncation\": null, " + model.substr(0, 10) + "\"dropout\": 1e400, " + model.substr(10) + "}",
       "(key 'model.dropout') is outside the range of a double"},
      {"1e400 under an unknown key", "{\"unknown\": [1, 1e400], " + pre + ", " + model + "}",
       "t.json: number 1e400 at line 1, column 17 (key 'unknown[1]') is outside the range of a double"},
      {"a key given twice",
       "{\"normalizer\": {\"type\": \"Lowercase\"}, \"normalizer\": null, " + pre + ", " + model + "}",
       "t.json: duplicate key 'normalizer'"},
  };
  for (const Case& c : cases) {
    auto t = BpeTokenizer::FromJson(c.text, "t.json");
    if (t.ok()) {
      ADD_FAILURE() << c.what << ": loaded";
      continue;
    }
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(t.status().message().find(c.expect), std::string::npos) << c.what << ": " << t.status().message();
  }
  // Through Load the message names the file's path.
  const std::string path = TempPath("deep_tokenizer.json");
  {
    std::ofstream out(path);
    out << cases[0].text;
  }
  auto loaded = BpeTokenizer::Load(path);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().message().rfind(path + ": JSON nested deeper than 100 levels", 0), 0u)
      << loaded.status().message();
}

TEST(BpeTokenizerTest, RefusesOtherKindsNamingFileAndKey) {
  const std::string path = TempPath("wordpiece.json");
  {
    std::ofstream out(path);
    out << R"({"version": "1.0", "normalizer": null, "pre_tokenizer": {"type": "BertPreTokenizer"},
              "model": {"type": "WordPiece", "vocab": {"a": 0}}})";
  }
  auto t = BpeTokenizer::Load(path);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find(path), std::string::npos) << t.status().message();
  EXPECT_NE(t.status().message().find("model.type"), std::string::npos) << t.status().message();
  EXPECT_NE(t.status().message().find("WordPiece"), std::string::npos) << t.status().message();

  auto m = BpeTokenizer::FromJson(R"({"model": {"type": "BPE", "vocab": {}, "merges": []},
      "pre_tokenizer": {"type": "Metaspace"}})",
                                  "x.json");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("x.json: pre_tokenizer"), std::string::npos) << m.status().message();

  auto n = BpeTokenizer::FromJson(R"({"model": {"type": "BPE", "vocab": {}, "merges": []},
      "normalizer": {"type": "Lowercase"}, "pre_tokenizer": {"type": "ByteLevel"}})",
                                  "y.json");
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.status().message().find("y.json: normalizer"), std::string::npos) << n.status().message();

  auto v = BpeTokenizer::FromJson(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
      "pre_tokenizer": {"type": "ByteLevel"}})",
                                  "z.json");
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("z.json: model.vocab"), std::string::npos) << v.status().message();

  auto j = BpeTokenizer::FromJson("{not json", "w.json");
  ASSERT_FALSE(j.ok());
  EXPECT_NE(j.status().message().find("w.json"), std::string::npos);

  const std::string fifo = TempPath("tokenizer_fifo");
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto f = BpeTokenizer::Load(fifo);  // refused at stat, never opened
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("not a regular file"), std::string::npos) << f.status().message();
}

}  // namespace
}  // namespace zero::llm
