// Crc32c against published vectors and a bitwise reference, its software path against its
// hardware one on random buffers, at every alignment and chained.
#include "runtime/crc32c.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace zero {
namespace {

uint32_t Crc32cBitwise(const std::string& s) {
  uint32_t c = ~0u;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
  }
  return ~c;
}

TEST(Crc32cTest, KnownVectors) {
  for (auto* crc : {&Crc32c, &Crc32cSoftware}) {
    EXPECT_EQ(crc("123456789", 9, 0), 0xE3069283u);
    EXPECT_EQ(crc("", 0, 0), 0u);
    // RFC 3720 B.4.
    std::string zeros(32, '\0');
    EXPECT_EQ(crc(zeros.data(), zeros.size(), 0), 0x8A9136AAu);
    std::string ones(32, '\xff');
    EXPECT_EQ(crc(ones.data(), ones.size(), 0), 0x62A8AB43u);
    std::string up(32, '\0'), down(32, '\0');
    for (int i = 0; i < 32; ++i) {
      up[i] = static_cast<char>(i);
      down[i] = static_cast<char>(31 - i);
    }
    EXPECT_EQ(crc(up.data(), up.size(), 0), 0x46DD794Eu);
    EXPECT_EQ(crc(down.data(), down.size(), 0), 0x113FDB5Cu);
  }
  EXPECT_EQ(Crc32cHex(0xE3069283u), "0xe3069283");
  EXPECT_EQ(Crc32cHex(0x1u), "0x00000001");
}

TEST(Crc32cTest, MatchesBitwiseAtEveryAlignmentAndChains) {
  std::mt19937 gen(7);
  std::string data(1000, '\0');
  for (char& c : data) c = static_cast<char>(gen());
  for (auto* crc : {&Crc32c, &Crc32cSoftware}) {
    for (size_t off : {0, 1, 3, 7, 8, 13}) {
      for (size_t len : {0, 1, 7, 8, 9, 63, 64, 65, 500, 987}) {
        std::string s = data.substr(off, len);
        EXPECT_EQ(crc(data.data() + off, len, 0), Crc32cBitwise(s)) << off << " " << len;
        for (size_t split : {size_t{0}, len / 3, len}) {
          EXPECT_EQ(crc(s.data() + split, len - split, crc(s.data(), split, 0)), Crc32cBitwise(s));
        }
      }
    }
  }
}

// The two implementations this file replaced (engine/checkpoint/io.cc's slice-by-8, now
// Crc32cSoftware, and nvme/crc32c.cc's SSE4.2 one, now Crc32c) were checked equal the same way.
TEST(Crc32cTest, SoftwareEqualsHardwareOnRandomBuffers) {
  std::mt19937_64 gen(20261202);
  std::vector<uint8_t> buf((1 << 20) + 64);
  for (auto& c : buf) c = static_cast<uint8_t>(gen());
  for (int i = 0; i < 5000; ++i) {
    const size_t off = gen() % 64;
    const size_t n = (i % 50 == 0) ? gen() % (1 << 20) : gen() % 4096;
    const uint32_t seed = (i % 3 == 0) ? 0u : static_cast<uint32_t>(gen());
    for (size_t k = 0; k < 64 && k < n; ++k) buf[off + k] = static_cast<uint8_t>(gen());
    ASSERT_EQ(Crc32c(buf.data() + off, n, seed), Crc32cSoftware(buf.data() + off, n, seed))
        << "buffer " << i << ": offset " << off << ", " << n << " bytes, seed " << seed;
  }
}

}  // namespace
}  // namespace zero
