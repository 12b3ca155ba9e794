#include "engine/checkpoint/safetensors.h"

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "engine/checkpoint/io.h"
#include "engine/checkpoint/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

using ::testing::HasSubstr;
using zero::testing::SameBits;
using zero::testing::ScratchDir;

struct Sample {
  std::vector<float> a, scalar, empty;
  std::vector<int32_t> ints;
  std::vector<SafetensorsTensorRef> refs;
};

Sample MakeSample() {
  Sample s;
  for (int i = 0; i < 35; ++i) s.a.push_back(0.5f * i - 3.0f);
  s.scalar = {42.25f};
  s.ints = {1, -2, 3};
  s.refs = {
      {"embed.weight", "F32", {7, 5}, s.a.data(), s.a.size() * 4},
      {"scale", "F32", {}, s.scalar.data(), 4},
      {"empty", "F32", {0, 4}, nullptr, 0},
      {"ids", "I32", {3}, s.ints.data(), 12},
  };
  return s;
}

TEST(SafetensorsTest, WritesAlignedHeaderAndReadsBack) {
  const std::string dir = ScratchDir("st");
  const std::string path = dir + "/model.safetensors";
  Sample s = MakeSample();
  auto bytes = WriteSafetensors(path, s.refs, {{"format", "pt"}, {"global_steps", "120"}});
  ASSERT_OK(bytes);

  std::string raw = *ReadFile(path);
  EXPECT_EQ(raw.size(), *bytes);
  uint64_t n;
  std::memcpy(&n, raw.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
  EXPECT_EQ(raw[8], '{');
  EXPECT_EQ(raw.size(), 8 + n + 35 * 4 + 4 + 12);
  const std::string header = raw.substr(8, n);
  EXPECT_THAT(header, HasSubstr(R"("embed.weight":{"dtype":"F32","shape":[7,5],"data_offsets":[0,140]})"));
  EXPECT_THAT(header, HasSubstr(R"("__metadata__":{"format":"pt","global_steps":"120"})"));
  // The data right after the header is the first tensor's bytes.
  EXPECT_EQ(std::memcmp(raw.data() + 8 + n, s.a.data(), 140), 0);

  auto file = ReadSafetensors(path);
  ASSERT_OK(file);
  EXPECT_EQ(file->metadata.at("format"), "pt");
  EXPECT_EQ(file->metadata.at("global_steps"), "120");
  ASSERT_EQ(file->tensors.size(), 4u);
  const SafetensorsTensor* a = file->Find("embed.weight");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{7, 5}));
  EXPECT_TRUE(SameBits(a->AsFloats(), s.a));
  EXPECT_EQ(file->Find("scale")->shape, std::vector<int64_t>{});
  EXPECT_TRUE(SameBits(file->Find("scale")->AsFloats(), s.scalar));
  EXPECT_EQ(file->Find("empty")->data.size(), 0u);
  EXPECT_EQ(file->Find("ids")->dtype, "I32");
  EXPECT_EQ(std::memcmp(file->Find("ids")->data.data(), s.ints.data(), 12), 0);
}

TEST(SafetensorsTest, WriterRefusesBadTensors) {
  const std::string dir = ScratchDir("st");
  Sample s = MakeSample();
  auto refs = s.refs;
  refs[0].nbytes = 136;
  EXPECT_THAT(WriteSafetensors(dir + "/x", refs, {}).status().message(),
              HasSubstr("tensor 'embed.weight': 136 bytes do not hold"));
  refs = s.refs;
  refs[1].name = "embed.weight";
  EXPECT_THAT(WriteSafetensors(dir + "/x", refs, {}).status().message(), HasSubstr("used twice"));
  refs = s.refs;
  refs[1].dtype = "F8";
  EXPECT_THAT(WriteSafetensors(dir + "/x", refs, {}).status().message(), HasSubstr("unknown dtype 'F8'"));
  EXPECT_FALSE(PathExists(dir + "/x"));
}

TEST(SafetensorsTest, ReaderRejectsDamage) {
  const std::string dir = ScratchDir("st");
  const std::string path = dir + "/m.safetensors";
  Sample s = MakeSample();
  ASSERT_OK(WriteSafetensors(path, s.refs, {}));
  const std::string raw = *ReadFile(path);
  auto write = [&](const std::string& data) { std::ofstream(path, std::ios::binary | std::ios::trunc) << data; };

  write(raw.substr(0, raw.size() - 4));
  EXPECT_THAT(ReadSafetensors(path).status().message(), HasSubstr("data_offsets"));
  write(raw + "junk");
  EXPECT_THAT(ReadSafetensors(path).status().message(), HasSubstr("tensors cover"));
  std::string big = raw;
  big[7] = 0x7f;
  write(big);
  EXPECT_THAT(ReadSafetensors(path).status().message(), HasSubstr("header length"));
  write("abc");
  EXPECT_THAT(ReadSafetensors(path).status().message(), HasSubstr("truncated"));
}

// The reference reader, when this machine has it (python3 with safetensors and numpy).
TEST(SafetensorsTest, PythonSafetensorsReadsIt) {
  if (std::system("python3 -c 'import safetensors.numpy, numpy' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3 with safetensors and numpy is not installed here";
  }
  const std::string dir = ScratchDir("st");
  const std::string path = dir + "/py.safetensors";
  Sample s = MakeSample();
  ASSERT_OK(WriteSafetensors(path, s.refs, {{"format", "pt"}}));
  const std::string script =
      "import numpy as np, sys\n"
      "from safetensors.numpy import load_file\n"
      "from safetensors import safe_open\n"
      "t = load_file(sys.argv[1])\n"
      "assert t['embed.weight'].shape == (7, 5) and t['embed.weight'].dtype == np.float32\n"
      "assert np.array_equal(t['embed.weight'].ravel(), np.arange(35, dtype=np.float32) * 0.5 - "
      "3)\n"
      "assert t['scale'].shape == () and t['scale'] == np.float32(42.25)\n"
      "assert t['empty'].shape == (0, 4)\n"
      "assert list(t['ids']) == [1, -2, 3]\n"
      "with safe_open(sys.argv[1], 'np') as f: assert f.metadata() == {'format': 'pt'}\n";
  const std::string script_path = dir + "/check.py";
  std::ofstream(script_path) << script;
  EXPECT_EQ(std::system(("python3 " + script_path + " " + path).c_str()), 0);
}

}  // namespace
}  // namespace zero
