// The hashes' outputs pinned: the values below were computed by the implementations these functions
// replaced (engine.cc's Checksum, examples/hash.h, model_api.cc's Fnv1a) before they moved here, so
// initial values, sampled data and Initialize's cross-rank comparison keep every bit.
#include "runtime/hash.h"

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace zero {
namespace {

std::vector<float> Ramp(int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(i) * 0.37f - 5.0f;
  return v;
}

TEST(HashTest, ValuesHash52KeepsEngineChecksumValues) {
  const std::vector<float> v = Ramp(1000);
  const struct {
    int64_t n;
    double hash;
  } cases[] = {{0, 1929880503118233.0},  {1, 2963825761346311.0},   {2, 2549066610441022.0}, {3, 1550665892298857.0},
               {7, 2195009691861515.0},  {8, 3721971347362929.0},   {9, 27598043600358.0},   {16, 182691519402591.0},
               {33, 2157134870652733.0}, {1000, 3597979645425733.0}};
  for (const auto& c : cases) EXPECT_EQ(ValuesHash52(v.data(), c.n), c.hash) << "n=" << c.n;
}

TEST(HashTest, ValuesHash52IsTheLow52BitsOfXxHash64) {
  const std::vector<float> v = Ramp(33);
  const uint64_t h = XxHash64(v.data(), v.size() * sizeof(float));
  EXPECT_EQ(h, 0x4887a9e719b2a73dull);
  EXPECT_EQ(ValuesHash52(v.data(), 33), static_cast<double>(h & ((uint64_t{1} << 52) - 1)));
}

TEST(HashTest, XxHash64MatchesPublishedVectorsAndIgnoresAlignment) {
  EXPECT_EQ(XxHash64(nullptr, 0), 0xef46db3751d8e999ull);
  EXPECT_EQ(XxHash64("a", 1), 0xd24ec4f1a98c6e5bull);
  EXPECT_EQ(XxHash64("abc", 3), 0x44bc2cf5ad770999ull);
  const std::vector<float> v = Ramp(1000);
  std::vector<unsigned char> shifted(v.size() * sizeof(float) + 3);
  std::memcpy(shifted.data() + 3, v.data(), v.size() * sizeof(float));
  EXPECT_EQ(XxHash64(shifted.data() + 3, v.size() * sizeof(float)), 0x4e2cc857eaacb845ull);
}

TEST(HashTest, Fnv1a64KeepsValues) {
  EXPECT_EQ(Fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(Fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(Fnv1a64("embed.weight"), 0x9ac37bcac2dc8a00ull);
  EXPECT_EQ(Fnv1a64("layers.0.attn.q_proj.weight"), 0x60736549364a4ebfull);
}

TEST(HashTest, SplitMix64KeepsValues) {
  EXPECT_EQ(SplitMix64(0), 0xe220a8397b1dcdafull);
  EXPECT_EQ(SplitMix64(1), 0x910a2dec89025cc1ull);
  EXPECT_EQ(SplitMix64(0x5a45524f44415441ull), 0xc8cf99e06137c73dull);
  EXPECT_EQ(SplitMix64(~0ull), 0xe4d971771b652c20ull);
  uint64_t state = 42;
  EXPECT_EQ(SplitMix64Next(&state), 0xbdd732262feb6e95ull);
  EXPECT_EQ(SplitMix64Next(&state), 0x28efe333b266f103ull);
  EXPECT_EQ(SplitMix64Next(&state), 0x47526757130f9f52ull);
  EXPECT_EQ(state, 42 + 3 * kSplitMix64Gamma);
}

}  // namespace
}  // namespace zero
