// Test helpers for the communicator tests: the per-rank assertions, deterministic per-rank inputs and the reference
// reduction that communicator.h specifies (sequential rank-order fp32 sum, rounded once), against
// which results are compared bitwise. Header-only; owns nothing.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "runtime/dtype.h"

// For the body of a rank (RunThreadRanks, thread_ranks.h: a function returning Status, where gtest's
// fatal assertions cannot stop the other ranks): the first failure becomes the rank's error, and
// RunThreadRanks then aborts its communicator. RANK_EXPECT_OK returns `expr`'s error with the
// expression as context; RANK_CHECK returns InternalError("<cond>: <msg>").
#define RANK_EXPECT_OK(expr)                    \
  do {                                          \
    ::zero::Status _s = (expr);                 \
    if (!_s.ok()) return _s.WithContext(#expr); \
  } while (0)

#define RANK_CHECK(cond, msg)                                                              \
  do {                                                                                     \
    if (!(cond)) return ::zero::InternalError(std::string(#cond ": ") + std::string(msg)); \
  } while (0)

namespace zero {
namespace testing {

// A value of varied magnitude (2^-8 .. 2^8, both signs) for element i of rank r, so sums of
// several ranks round differently depending on order; small enough that fp16 sums of up to 64
// ranks never overflow.
inline float TestValue(int rank, size_t i, uint32_t seed) {
  uint64_t h = (static_cast<uint64_t>(seed) << 40) ^ (static_cast<uint64_t>(rank) << 32) ^ i;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  float mant = static_cast<float>(static_cast<int64_t>(h & 0xffffff) - 0x800000) / 8388608.0f;
  int exp = static_cast<int>((h >> 24) % 17) - 8;
  return std::ldexp(mant, exp);
}

// n elements of type t holding TestValue(rank, i, seed) rounded to t.
inline std::vector<uint8_t> MakeInput(DType t, size_t n, int rank, uint32_t seed) {
  std::vector<uint8_t> buf(n * SizeOf(t));
  for (size_t i = 0; i < n; ++i) StoreFromFloat(buf.data(), t, i, TestValue(rank, i, seed));
  return buf;
}

// The contract's reduction of element `i` over ranks 0..n_ranks-1 of inputs produced by
// MakeInput(t, *, rank, seed), shifted by `offset` elements: fp32 accumulation in rank order
// (starting from rank 0's value), kAvg divides by n_ranks, kMax keeps the larger (NaN wins),
// rounded once to t.
inline void ReferenceReduce(DType t, size_t offset, size_t n, int n_ranks, ReduceOp op, uint32_t seed, void* out) {
  for (size_t i = 0; i < n; ++i) {
    float acc = 0.0f;
    for (int r = 0; r < n_ranks; ++r) {
      uint8_t tmp[4];
      StoreFromFloat(tmp, t, 0, TestValue(r, offset + i, seed));
      float v = LoadAsFloat(tmp, t, 0);
      if (r == 0) {
        acc = v;
      } else if (op == ReduceOp::kMax) {
        if (v > acc || v != v) acc = v;
      } else {
        acc = acc + v;
      }
    }
    if (op == ReduceOp::kAvg) acc = acc / static_cast<float>(n_ranks);
    StoreFromFloat(out, t, i, acc);
  }
}

// Index of the first element whose bytes differ, or -1.
inline long FirstMismatch(const void* a, const void* b, size_t n, DType t) {
  const size_t es = SizeOf(t);
  const uint8_t* pa = static_cast<const uint8_t*>(a);
  const uint8_t* pb = static_cast<const uint8_t*>(b);
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(pa + i * es, pb + i * es, es) != 0) return static_cast<long>(i);
  }
  return -1;
}

}  // namespace testing
}  // namespace zero
