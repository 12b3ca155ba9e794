#include "hf/safetensors.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "engine/checkpoint/io.h"
#include "engine/checkpoint/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/dtype.h"
#include "testing/same_bits.h"
#include "testing/status_matchers.h"

namespace zero::llm {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using zero::testing::SameBits;
using zero::testing::ScratchDir;

// Values of every kind a 16-bit type holds: signs, zero, fractions, large, small.
std::vector<float> Values(int64_t n, float scale) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) {
    v[i] = scale * (static_cast<float>(i % 97) - 48.0f) / 7.0f + (i % 5 == 0 ? 0.0f : 1e-3f * i);
  }
  return v;
}

// A buffer of `dtype` holding `values` rounded to it.
std::vector<uint8_t> Encode(const std::vector<float>& values, DType dtype) {
  std::vector<uint8_t> out(values.size() * SizeOf(dtype));
  for (size_t i = 0; i < values.size(); ++i) StoreFromFloat(out.data(), dtype, i, values[i]);
  return out;
}

// Writes raw bytes: the 8-byte length `n` (the header's size unless given), the header, the data.
void WriteRaw(const std::string& path, const std::string& header, size_t data_bytes, int64_t n = -1) {
  uint64_t len = n >= 0 ? static_cast<uint64_t>(n) : header.size();
  std::string bytes(reinterpret_cast<const char*>(&len), 8);
  bytes += header;
  bytes.append(data_bytes, '\x11');
  ASSERT_OK(WriteFileAtomic(path, bytes));
}

// Opens a hostile file and returns the error message (empty when it opened).
std::string OpenError(const std::string& path) {
  auto f = SafetensorsFile::Open(path);
  return f.ok() ? std::string() : f.status().ToString();
}

TEST(LlmSafetensorsTest, RoundTripsAllDtypes) {
  const std::string path = ScratchDir("llm_st") + "/model.safetensors";
  const std::vector<float> a = Values(35, 1.0f), b = Values(64, 300.0f), c = Values(6, 0.01f);
  const std::vector<uint8_t> ab = Encode(a, DType::kF32), bb = Encode(b, DType::kBF16), cb = Encode(c, DType::kF16);
  const float scalar = 42.25f;
  std::vector<TensorToWrite> tensors = {
      {"model.embed_tokens.weight", DType::kF32, {7, 5}, ab.data()},
      {"model.layers.0.mlp.up_proj.weight", DType::kBF16, {8, 8}, bb.data()},
      {"model.norm.weight", DType::kF16, {6}, cb.data()},
      {"scale", DType::kF32, {}, &scalar},
      {"empty", DType::kBF16, {0, 4}, nullptr},
  };
  Status st = WriteSafetensors(path, tensors, {{"format", "pt"}});
  ASSERT_OK(st);

  auto f = SafetensorsFile::Open(path);
  ASSERT_OK(f);
  EXPECT_EQ(f->metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  ASSERT_EQ(f->tensors().size(), tensors.size());
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo& t = f->tensors()[i];
    EXPECT_EQ(t.name, tensors[i].name);
    EXPECT_EQ(t.dtype, tensors[i].dtype);
    EXPECT_EQ(t.shape, tensors[i].shape);
    EXPECT_EQ(t.data_begin, offset) << t.name;
    offset += static_cast<uint64_t>(t.numel()) * SizeOf(t.dtype);
    EXPECT_EQ(t.data_end, offset) << t.name;
    EXPECT_EQ(f->Find(t.name), &t);
    std::vector<uint8_t> raw(t.data_end - t.data_begin);
    ASSERT_OK(f->ReadRaw(t, raw.data()));
    if (!raw.empty()) {
      EXPECT_EQ(std::memcmp(raw.data(), tensors[i].data, raw.size()), 0) << t.name;
    }
    std::vector<float> got(t.numel());
    ASSERT_OK(f->ReadAsFloat(t, 0, t.numel(), got.data()));
    for (int64_t j = 0; j < t.numel(); ++j) {
      EXPECT_EQ(got[j], LoadAsFloat(tensors[i].data, t.dtype, j)) << t.name << " " << j;
    }
    auto whole = f->ReadFloats(t);
    ASSERT_OK(whole);
    EXPECT_TRUE(SameBits(*whole, got)) << t.name;
  }
  EXPECT_EQ(f->Find("missing"), nullptr);
  // The file is exactly header + data, the data 8-byte aligned.
  auto size = FileSize(path);
  ASSERT_OK(size);
  EXPECT_EQ(f->data_start() % 8, 0u);
  EXPECT_EQ(*size, f->data_start() + offset);
  // The 16-bit values differ from the floats (they were rounded), so the test can tell them apart.
  EXPECT_NE(LoadAsFloat(bb.data(), DType::kBF16, 1), b[1]);
}

TEST(LlmSafetensorsTest, HeaderBytesFollowTheFormat) {
  const std::string path = ScratchDir("llm_st") + "/x.safetensors";
  const uint16_t h[3] = {0x3c00, 0x4000, 0xc000};  // 1, 2, -2 in fp16
  ASSERT_OK(WriteSafetensors(path, {{"w", DType::kF16, {3}, h}}, {{"format", "pt"}}));
  auto raw = ReadFile(path);
  ASSERT_OK(raw);
  uint64_t n;
  std::memcpy(&n, raw->data(), 8);
  const std::string expected =
      R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F16","shape":[3],"data_offsets":[0,6]}})";
  ASSERT_EQ(n % 8, 0u);
  ASSERT_GE(n, expected.size());
  EXPECT_EQ(raw->substr(8, expected.size()), expected);
  EXPECT_EQ(raw->substr(8 + expected.size(), n - expected.size()), std::string(n - expected.size(), ' '));
  ASSERT_EQ(raw->size(), 8 + n + 6);
  EXPECT_EQ(raw->substr(8 + n), std::string("\x00\x3c\x00\x40\x00\xc0", 6));  // little-endian
}

// What zero_to_fp32 writes (engine/checkpoint/consolidate.cc): F32 tensors, a scalar and an empty
// one among them, several metadata strings, through the streaming writer, whose file_bytes() is
// the summary's size.
TEST(LlmSafetensorsTest, WritesMetadataSortedFirstAndReadsBackScalarsAndEmptyTensors) {
  const std::string path = ScratchDir("llm_st") + "/model.safetensors";
  std::vector<float> a;
  for (int i = 0; i < 35; ++i) a.push_back(0.5f * i - 3.0f);
  const std::vector<float> scalar = {42.25f};
  const std::vector<TensorToWrite> layout = {
      {"embed.weight", DType::kF32, {7, 5}, a.data()},
      {"scale", DType::kF32, {}, scalar.data()},
      {"empty", DType::kF32, {0, 4}, nullptr},
  };
  auto w = SafetensorsWriter::Open(path, layout, {{"global_steps", "120"}, {"format", "pt"}});
  ASSERT_OK(w);
  ASSERT_OK(w->Append(a.data(), 140));
  ASSERT_OK(w->Append(scalar.data(), 4));
  ASSERT_OK(w->Commit());

  auto raw = ReadFile(path);
  ASSERT_OK(raw);
  EXPECT_EQ(raw->size(), w->file_bytes());
  uint64_t n;
  std::memcpy(&n, raw->data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
  EXPECT_EQ(raw->size(), 8 + n + 35 * 4 + 4);
  const std::string header = raw->substr(8, n);
  EXPECT_EQ(header.rfind(R"({"__metadata__":{"format":"pt","global_steps":"120"},)", 0), 0u) << header;
  EXPECT_THAT(header, HasSubstr(R"("embed.weight":{"dtype":"F32","shape":[7,5],"data_offsets":[0,140]})"));
  // The data right after the header is the first tensor's bytes.
  EXPECT_EQ(std::memcmp(raw->data() + 8 + n, a.data(), 140), 0);

  auto f = SafetensorsFile::Open(path);
  ASSERT_OK(f);
  EXPECT_EQ(f->metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"global_steps", "120"}}));
  ASSERT_EQ(f->tensors().size(), 3u);
  const TensorInfo* e = f->Find("embed.weight");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->shape, (std::vector<int64_t>{7, 5}));
  EXPECT_TRUE(SameBits(*f->ReadFloats(*e), a));
  EXPECT_EQ(f->Find("scale")->shape, std::vector<int64_t>{});
  EXPECT_TRUE(SameBits(*f->ReadFloats(*f->Find("scale")), scalar));
  EXPECT_EQ(f->Find("empty")->data_end - f->Find("empty")->data_begin, 0u);
  EXPECT_TRUE(f->ReadFloats(*f->Find("empty"))->empty());
}

TEST(LlmSafetensorsTest, ReadAsFloatReadsRanges) {
  const std::string path = ScratchDir("llm_st") + "/r.safetensors";
  // Longer than one conversion chunk (65536 elements), so a range crosses a chunk boundary.
  const int64_t n = 70000;
  const std::vector<float> v = Values(n, 10.0f);
  const std::vector<uint8_t> bf = Encode(v, DType::kBF16);
  const std::vector<float> small = {1.5f, -2.0f, 3.25f, 4.0f};
  ASSERT_OK(
      WriteSafetensors(path, {{"small", DType::kF32, {2, 2}, small.data()}, {"big", DType::kBF16, {n}, bf.data()}}));
  auto f = SafetensorsFile::Open(path);
  ASSERT_OK(f);
  const TensorInfo& big = *f->Find("big");
  for (auto [begin, count] : {std::pair<int64_t, int64_t>{0, 1}, {65000, 1500}, {n - 3, 3}, {12345, 0}, {0, n}}) {
    std::vector<float> got(count + 1, -7.0f);
    Status st = f->ReadAsFloat(big, begin, count, got.data());
    ASSERT_OK(st);
    for (int64_t i = 0; i < count; ++i) {
      ASSERT_EQ(got[i], Bf16ToFloat(FloatToBf16(v[begin + i]))) << begin << "+" << i;
    }
    EXPECT_EQ(got[count], -7.0f) << "wrote past count";
  }
  float two[2];
  ASSERT_OK(f->ReadAsFloat(*f->Find("small"), 2, 2, two));
  EXPECT_EQ(two[0], 3.25f);
  EXPECT_EQ(two[1], 4.0f);

  std::vector<float> out(10);
  for (auto [begin, count] : {std::pair<int64_t, int64_t>{n - 3, 4}, {-1, 2}, {0, -1}, {n + 1, 0}}) {
    Status st = f->ReadAsFloat(big, begin, count, out.data());
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << begin << " " << count;
    EXPECT_THAT(st.message(), AllOf(HasSubstr(path), HasSubstr("'big'")));
  }
  TensorInfo foreign = big;
  foreign.data_begin += 2;
  EXPECT_THAT(f->ReadAsFloat(foreign, 0, 1, out.data()).message(), HasSubstr("not a tensor of this file"));
  EXPECT_THAT(f->ReadFloats(foreign).status().message(), HasSubstr("not a tensor of this file"));
}

TEST(LlmSafetensorsTest, ShortReadAfterOpenNamesFileTensorAndOffsets) {
  const std::string path = ScratchDir("llm_st") + "/s.safetensors";
  const std::vector<float> v = Values(100, 1.0f);
  ASSERT_OK(WriteSafetensors(path, {{"a", DType::kF32, {100}, v.data()}}));
  auto f = SafetensorsFile::Open(path);
  ASSERT_OK(f);
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(f->data_start() + 40)), 0);
  std::vector<float> out(100);
  Status st = f->ReadAsFloat(*f->Find("a"), 5, 50, out.data());
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  const uint64_t begin = f->data_start() + 20, end = begin + 200;
  EXPECT_THAT(st.message(), AllOf(HasSubstr(path), HasSubstr("'a'"),
                                  HasSubstr("[" + std::to_string(begin) + ", " + std::to_string(end) + ")")));
  EXPECT_THAT(f->ReadRaw(*f->Find("a"), out.data()).message(), HasSubstr("shrank"));
}

struct Hostile {
  const char* what;
  std::string header;
  size_t data_bytes;
  int64_t n;           // the header length field, -1 for the header's size
  std::string expect;  // a substring of the error
  std::string tensor;  // the tensor the error must name ("" when none applies)
};

TEST(LlmSafetensorsTest, RefusesHostileHeaders) {
  const std::string dir = ScratchDir("llm_st");
  const std::string f32_2 = R"("dtype":"F32","shape":[2])";
  std::string deep = R"({"a":)" + std::string(5000, '[') + std::string(5000, ']') + "}";
  const std::vector<Hostile> cases = {
      {"length past the end", R"({})", 0, 1000, "runs past the end of the file", ""},
      {"absurd length", R"({})", 0, int64_t{1} << 40, "100 MB", ""},
      {"overlap", R"({"w1":{)" + f32_2 + R"(,"data_offsets":[0,8]},"w2":{)" + f32_2 + R"(,"data_offsets":[4,12]}})", 12,
       -1, "overlaps tensor 'w1'", "w2"},
      {"gap", R"({"w1":{)" + f32_2 + R"(,"data_offsets":[0,8]},"w2":{)" + f32_2 + R"(,"data_offsets":[12,20]}})", 20,
       -1, "data bytes [8, 12) belong to no tensor", "w2"},
      {"trailing bytes", R"({"w1":{)" + f32_2 + R"(,"data_offsets":[0,8]}})", 12, -1,
       "data bytes [8, 12) after the last tensor", ""},
      {"offsets past the end", R"({"w1":{)" + f32_2 + R"(,"data_offsets":[0,8]}})", 4, -1,
       "run past the end of the file", "w1"},
      {"wrong nbytes", R"({"w1":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, -1,
       "its shape [3] of F32 needs 12", "w1"},
      {"end before begin", R"({"w1":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8, -1, "end before they begin",
       "w1"},
      {"F64", R"({"w1":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8, -1,
       "F64 not supported, expected F32, BF16 or F16", "w1"},
      {"unknown dtype", R"({"w1":{"dtype":"Q7","shape":[1],"data_offsets":[0,8]}})", 8, -1, "Q7 not supported", "w1"},
      {"dtype not a string", R"({"w1":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", 4, -1, "dtype is not a string",
       "w1"},
      {"no data_offsets", R"({"w1":{"dtype":"F32","shape":[1]}})", 4, -1, "no 'data_offsets'", "w1"},
      {"no shape", R"({"w1":{"dtype":"F32","data_offsets":[0,4]}})", 4, -1, "no 'shape'", "w1"},
      {"shape not an array", R"({"w1":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", 8, -1,
       "shape is not an array", "w1"},
      {"fractional dim", R"({"w1":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4, -1,
       "shape[0] is not an integer", "w1"},
      {"negative dim", R"({"w1":{"dtype":"F32","shape":[2,-2],"data_offsets":[0,16]}})", 16, -1, "shape[1] is negative",
       "w1"},
      {"numel overflow", R"({"w1":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,4]}})", 4, -1,
       "more elements than a file can hold", "w1"},
      {"offsets not two", R"({"w1":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4, -1,
       "data_offsets is not [begin, end]", "w1"},
      {"entry not an object", R"({"w1":[1,2]})", 0, -1, "entry is not an object", "w1"},
      {"repeated name",
       R"({"w1":{)" + f32_2 + R"(,"data_offsets":[0,8]},"w1":{)" + f32_2 + R"(,"data_offsets":[8,16]}})", 16, -1,
       "header: duplicate key 'w1'", "w1"},
      {"repeated field", R"({"w1":{"dtype":"F32","dtype":"BF16","shape":[1],"data_offsets":[0,4]}})", 4, -1,
       "header: duplicate key 'w1.dtype'", ""},
      {"number beyond double", R"({"w1":{"dtype":"F32","shape":[1e400],"data_offsets":[0,4]}})", 4, -1,
       "(key 'w1.shape[0]') is outside the range of a double", ""},
      {"metadata value not a string", R"({"__metadata__":{"step":3}})", 0, -1,
       "__metadata__ key 'step' is not a string", ""},
      {"malformed JSON", R"({"w1":{"dtype":"F32",)", 0, -1, "header: malformed JSON at line 1", ""},
      {"array header", R"([1,2])", 0, -1, "not a JSON object", ""},
      {"deep JSON", deep, 0, -1, "header: JSON nested deeper than 64 levels", ""},
  };
  int i = 0;
  for (const Hostile& c : cases) {
    const std::string path = dir + "/hostile" + std::to_string(i++) + ".safetensors";
    WriteRaw(path, c.header, c.data_bytes, c.n);
    const std::string err = OpenError(path);
    EXPECT_THAT(err, AllOf(HasSubstr(path), HasSubstr(c.expect))) << c.what;
    if (!c.tensor.empty()) {
      EXPECT_THAT(err, HasSubstr("'" + c.tensor + "'")) << c.what;
    }
  }
}

TEST(LlmSafetensorsTest, RefusesTruncatedMissingAndNonRegularFiles) {
  const std::string dir = ScratchDir("llm_st");
  const std::string small = dir + "/small.safetensors";
  ASSERT_OK(WriteFileAtomic(small, std::string("\x08\x00\x00", 3)));
  EXPECT_THAT(OpenError(small), AllOf(HasSubstr(small), HasSubstr("truncated: 3 bytes")));

  // A real file cut short inside its data.
  const std::string cut = dir + "/cut.safetensors";
  const std::vector<float> v = Values(16, 1.0f);
  ASSERT_OK(WriteSafetensors(cut, {{"w", DType::kF32, {16}, v.data()}}));
  ASSERT_EQ(::truncate(cut.c_str(), static_cast<off_t>(*FileSize(cut) - 4)), 0);
  EXPECT_THAT(OpenError(cut), AllOf(HasSubstr(cut), HasSubstr("'w'"), HasSubstr("past the end")));

  auto missing = SafetensorsFile::Open(dir + "/nope.safetensors");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr(dir + "/nope.safetensors"));

  EXPECT_THAT(OpenError(dir), AllOf(HasSubstr(dir), HasSubstr("is a directory")));

  // A named pipe with no writer: a plain open() would block forever.
  const std::string fifo = dir + "/pipe.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THAT(OpenError(fifo), AllOf(HasSubstr(fifo), HasSubstr("FIFO")));
  auto text = ReadRegularFile(fifo, 1000);
  EXPECT_THAT(text.status().message(), HasSubstr("FIFO"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// A file the writer wrote, then damaged: cut inside its data, extended, an absurd header length,
// cut inside its length.
TEST(LlmSafetensorsTest, RefusesAWrittenFileDamagedAfterwards) {
  const std::string path = ScratchDir("llm_st") + "/m.safetensors";
  const std::vector<float> v = Values(35, 1.0f);
  const float scalar = 42.25f;
  ASSERT_OK(
      WriteSafetensors(path, {{"embed.weight", DType::kF32, {7, 5}, v.data()}, {"scale", DType::kF32, {}, &scalar}}));
  auto raw = ReadFile(path);
  ASSERT_OK(raw);
  auto write = [&](const std::string& data) { ASSERT_OK(WriteFileAtomic(path, data)); };

  write(raw->substr(0, raw->size() - 4));
  EXPECT_THAT(OpenError(path), AllOf(HasSubstr(path), HasSubstr("'scale'"), HasSubstr("run past the end")));
  write(*raw + "junk");
  EXPECT_THAT(OpenError(path), AllOf(HasSubstr(path), HasSubstr("after the last tensor belong to no tensor")));
  std::string big = *raw;
  big[7] = 0x7f;
  write(big);
  EXPECT_THAT(OpenError(path), AllOf(HasSubstr(path), HasSubstr("header length")));
  write("abc");
  EXPECT_THAT(OpenError(path), AllOf(HasSubstr(path), HasSubstr("truncated")));
}

TEST(LlmSafetensorsTest, WriterRefusesBadInputAndLeavesNoHalfFile) {
  const std::string dir = ScratchDir("llm_st");
  const std::string path = dir + "/w.safetensors";
  const float x[2] = {1.0f, 2.0f};
  EXPECT_THAT(WriteSafetensors(path, {{"a", DType::kF32, {2}, x}, {"a", DType::kF32, {2}, x}}).message(),
              AllOf(HasSubstr(path), HasSubstr("'a'"), HasSubstr("used twice")));
  EXPECT_THAT(WriteSafetensors(path, {{"__metadata__", DType::kF32, {2}, x}}).message(),
              HasSubstr("not a valid tensor name"));
  EXPECT_THAT(WriteSafetensors(path, {{"bad\xff", DType::kF32, {2}, x}}).message(), HasSubstr("not valid UTF-8"));
  EXPECT_THAT(WriteSafetensors(path, {{"neg", DType::kF32, {-2}, x}}).message(),
              AllOf(HasSubstr("'neg'"), HasSubstr("negative")));
  EXPECT_THAT(WriteSafetensors(path, {{"null", DType::kF32, {2}, nullptr}}).message(),
              AllOf(HasSubstr("'null'"), HasSubstr("no data")));
  EXPECT_THAT(WriteSafetensors(path, {{"q", static_cast<DType>(7), {2}, x}}).message(),
              AllOf(HasSubstr(path), HasSubstr("'q'"), HasSubstr("unknown dtype")));
  EXPECT_FALSE(PathExists(path));

  // An old file survives a writer that never completes.
  ASSERT_OK(WriteSafetensors(path, {{"old", DType::kF32, {2}, x}}));
  {
    auto w = SafetensorsWriter::Open(path, {{"a", DType::kF32, {2}, nullptr}, {"b", DType::kBF16, {3}, nullptr}});
    ASSERT_OK(w);
    EXPECT_EQ(w->data_bytes(), 14u);
    ASSERT_OK(w->Append(x, 8));
    ASSERT_OK(w->Append(x, 2));
    EXPECT_THAT(w->Append(x, 8).message(), HasSubstr("past the last tensor's end"));
    EXPECT_THAT(w->Commit().message(), HasSubstr("tensor 'b' got 2 of its 6 bytes"));
  }
  auto f = SafetensorsFile::Open(path);
  ASSERT_OK(f);
  ASSERT_EQ(f->tensors().size(), 1u);
  EXPECT_EQ(f->tensors()[0].name, "old");
  auto names = ListDirectory(dir);
  ASSERT_OK(names);
  EXPECT_EQ(*names, std::vector<std::string>{"w.safetensors"}) << "temporary files left behind";
}

// The reference reader, when this machine has it (python3 with safetensors and numpy).
TEST(LlmSafetensorsTest, PythonSafetensorsReadsIt) {
  if (std::system("python3 -c 'import safetensors.numpy, numpy' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3 with safetensors and numpy is not installed here";
  }
  const std::string dir = ScratchDir("llm_st");
  const std::string path = dir + "/py.safetensors";
  std::vector<float> a;
  for (int i = 0; i < 35; ++i) a.push_back(0.5f * i - 3.0f);
  const float scalar = 42.25f;
  const uint16_t h[3] = {0x3c00, 0x4000, 0xc000};  // 1, 2, -2 in fp16
  ASSERT_OK(WriteSafetensors(path,
                             {{"embed.weight", DType::kF32, {7, 5}, a.data()},
                              {"scale", DType::kF32, {}, &scalar},
                              {"empty", DType::kF32, {0, 4}, nullptr},
                              {"norm", DType::kF16, {3}, h}},
                             {{"format", "pt"}}));
  const std::string script =
      "import numpy as np, sys\n"
      "from safetensors.numpy import load_file\n"
      "from safetensors import safe_open\n"
      "t = load_file(sys.argv[1])\n"
      "assert t['embed.weight'].shape == (7, 5) and t['embed.weight'].dtype == np.float32\n"
      "assert np.array_equal(t['embed.weight'].ravel(), np.arange(35, dtype=np.float32) * 0.5 - 3)\n"
      "assert t['scale'].shape == () and t['scale'] == np.float32(42.25)\n"
      "assert t['empty'].shape == (0, 4)\n"
      "assert t['norm'].dtype == np.float16 and list(t['norm']) == [1, 2, -2]\n"
      "with safe_open(sys.argv[1], 'np') as f: assert f.metadata() == {'format': 'pt'}\n";
  const std::string script_path = dir + "/check.py";
  std::ofstream(script_path) << script;
  EXPECT_EQ(std::system(("python3 " + script_path + " " + path).c_str()), 0);
}

}  // namespace
}  // namespace zero::llm
