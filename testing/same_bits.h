// SameBits: bitwise equality of two buffers of floats (or doubles, or 16-bit / integer elements) as
// a gtest AssertionResult, for the tests that require results to be bit-for-bit those of a
// reference. Equal bits, not equal values: -0 differs from +0, and a NaN equals the same NaN.
//
//   EXPECT_TRUE(SameBits(got, want)) << "rank " << r;
//
// A failure names the first differing index and both values with their bits ("element 17 of 64:
// 0.100000001 (0x3dcccccd) vs 0.100000009 (0x3dccccce)", the first argument's value first), or the
// two sizes. Test-only.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace zero::testing {

namespace internal {

// "0.100000001 (0x3dcccccd)" for a float, the integer and its bits for other element types.
template <typename T>
std::string ValueAndBits(const T& v) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8);
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  char buf[96];
  if constexpr (std::is_same_v<T, float>) {
    std::snprintf(buf, sizeof(buf), "%.9g (0x%08llx)", static_cast<double>(v), static_cast<unsigned long long>(bits));
  } else if constexpr (std::is_same_v<T, double>) {
    std::snprintf(buf, sizeof(buf), "%.17g (0x%016llx)", v, static_cast<unsigned long long>(bits));
  } else if constexpr (std::is_signed_v<T>) {
    std::snprintf(buf, sizeof(buf), "%lld (0x%0*llx)", static_cast<long long>(v), static_cast<int>(2 * sizeof(T)),
                  static_cast<unsigned long long>(bits));
  } else {
    std::snprintf(buf, sizeof(buf), "%llu (0x%0*llx)", static_cast<unsigned long long>(bits),
                  static_cast<int>(2 * sizeof(T)), static_cast<unsigned long long>(bits));
  }
  return buf;
}

}  // namespace internal

// The first `n` elements of `a` and `b`, bit for bit.
template <typename T>
::testing::AssertionResult SameBits(const T* a, const T* b, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) {
      return ::testing::AssertionFailure() << "element " << i << " of " << n << ": " << internal::ValueAndBits(a[i])
                                           << " vs " << internal::ValueAndBits(b[i]);
    }
  }
  return ::testing::AssertionSuccess();
}

// Same size and the same bits in every element.
template <typename T>
::testing::AssertionResult SameBits(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure() << "sizes differ: " << a.size() << " vs " << b.size();
  }
  return SameBits(a.data(), b.data(), a.size());
}

// Piece by piece (one vector per parameter, say); a failure names the piece too.
template <typename T>
::testing::AssertionResult SameBits(const std::vector<std::vector<T>>& a, const std::vector<std::vector<T>>& b) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure() << "piece counts differ: " << a.size() << " vs " << b.size();
  }
  for (size_t p = 0; p < a.size(); ++p) {
    ::testing::AssertionResult r = SameBits(a[p], b[p]);
    if (!r) return ::testing::AssertionFailure() << "piece " << p << ": " << r.message();
  }
  return ::testing::AssertionSuccess();
}

}  // namespace zero::testing
