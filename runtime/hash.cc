#include "runtime/hash.h"

#include <cstring>

namespace zero {
namespace {

constexpr uint64_t kP1 = 0x9E3779B185EBCA87ull;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4Full;
constexpr uint64_t kP3 = 0x165667B19E3779F9ull;
constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ull;
constexpr uint64_t kP5 = 0x27D4EB2F165667C5ull;

inline uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t Round(uint64_t acc, uint64_t w) { return Rotl(acc + w * kP2, 31) * kP1; }
inline uint64_t Merge(uint64_t h, uint64_t lane) { return (h ^ Round(0, lane)) * kP1 + kP4; }

}  // namespace

uint64_t Fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t XxHash64(const void* data, size_t bytes) {
  const unsigned char* b = static_cast<const unsigned char*>(data);
  auto word = [b](size_t at) {
    uint64_t w;
    std::memcpy(&w, b + at, 8);
    return w;
  };
  size_t i = 0;
  uint64_t h;
  if (bytes >= 32) {
    uint64_t l0 = kP1 + kP2, l1 = kP2, l2 = 0, l3 = 0 - kP1;
    for (; i + 32 <= bytes; i += 32) {
      l0 = Round(l0, word(i));
      l1 = Round(l1, word(i + 8));
      l2 = Round(l2, word(i + 16));
      l3 = Round(l3, word(i + 24));
    }
    h = Rotl(l0, 1) + Rotl(l1, 7) + Rotl(l2, 12) + Rotl(l3, 18);
    h = Merge(Merge(Merge(Merge(h, l0), l1), l2), l3);
  } else {
    h = kP5;
  }
  h += static_cast<uint64_t>(bytes);
  for (; i + 8 <= bytes; i += 8) h = Rotl(h ^ Round(0, word(i)), 27) * kP1 + kP4;
  if (i + 4 <= bytes) {
    uint32_t w;
    std::memcpy(&w, b + i, 4);
    h = Rotl(h ^ (static_cast<uint64_t>(w) * kP1), 23) * kP2 + kP3;
    i += 4;
  }
  for (; i < bytes; ++i) h = Rotl(h ^ (static_cast<uint64_t>(b[i]) * kP5), 11) * kP1;
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

double ValuesHash52(const float* values, int64_t n) {
  const uint64_t h = XxHash64(values, static_cast<size_t>(n) * sizeof(float));
  return static_cast<double>(h & ((uint64_t{1} << 52) - 1));
}

}  // namespace zero
