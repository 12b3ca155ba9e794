#include "runtime/crc32c.h"

#include <array>
#include <bit>
#include <cstdio>
#include <cstring>

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

namespace zero {
namespace {

static_assert(std::endian::native == std::endian::little,
              "Crc32cSoftware's slice-by-8 reads 8 bytes as two little-endian words");

constexpr uint32_t kCrc32cPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

using CrcTables = std::array<std::array<uint32_t, 256>, 8>;

constexpr CrcTables MakeCrcTables() {
  CrcTables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ kCrc32cPoly : c >> 1;
    t[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; ++i) {
    for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xffu];
  }
  return t;
}

constexpr CrcTables kCrcTables = MakeCrcTables();

}  // namespace

uint32_t Crc32cSoftware(const void* data, size_t size, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  while (size > 0 && (reinterpret_cast<uintptr_t>(p) & 7u) != 0) {
    c = kCrcTables[0][(c ^ *p++) & 0xffu] ^ (c >> 8);
    --size;
  }
  while (size >= 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = kCrcTables[7][lo & 0xffu] ^ kCrcTables[6][(lo >> 8) & 0xffu] ^ kCrcTables[5][(lo >> 16) & 0xffu] ^
        kCrcTables[4][lo >> 24] ^ kCrcTables[3][hi & 0xffu] ^ kCrcTables[2][(hi >> 8) & 0xffu] ^
        kCrcTables[1][(hi >> 16) & 0xffu] ^ kCrcTables[0][hi >> 24];
    p += 8;
    size -= 8;
  }
  while (size > 0) {
    c = kCrcTables[0][(c ^ *p++) & 0xffu] ^ (c >> 8);
    --size;
  }
  return ~c;
}

#if defined(__SSE4_2__)
uint32_t Crc32c(const void* data, size_t size, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t c = ~crc & 0xffffffffu;
  while (size > 0 && (reinterpret_cast<uintptr_t>(p) & 7u) != 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --size;
  }
  while (size >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    size -= 8;
  }
  while (size > 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --size;
  }
  return ~static_cast<uint32_t>(c);
}
#else
uint32_t Crc32c(const void* data, size_t size, uint32_t crc) { return Crc32cSoftware(data, size, crc); }
#endif

std::string Crc32cHex(uint32_t crc) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", crc);
  return buf;
}

}  // namespace zero
