// The non-cryptographic hashes of the project, one home for each: SplitMix64 (the keyed mix behind
// the examples' deterministic initial values and data sampling, and a generator), FNV-1a over a
// string (the examples' parameter-name key), and XXH64 with seed 0 (ValuesHash52: the 52-bit hash
// of a parameter's initial values that Engine::Initialize compares across ranks). Their outputs are
// pinned by hash_test.cc: initial values, sampled data and the cross-rank comparison depend on every
// bit, so none may change. None is a cryptographic hash: they tell honest differences apart.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace zero {

inline constexpr uint64_t kSplitMix64Gamma = 0x9e3779b97f4a7c15ull;

// The mix of `x`: the SplitMix64 generator's output from state `x`.
inline uint64_t SplitMix64(uint64_t x) {
  x += kSplitMix64Gamma;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The SplitMix64 generator: the next output, advancing `state`.
inline uint64_t SplitMix64Next(uint64_t* state) {
  const uint64_t x = *state;
  *state += kSplitMix64Gamma;
  return SplitMix64(x);
}

// 64-bit FNV-1a of the bytes of `s`.
uint64_t Fnv1a64(std::string_view s);

// XXH64 (seed 0) of `bytes` bytes at `data`: four lanes over 32-byte stripes, several GB/s on one
// core. `data` may be unaligned; null only with `bytes` == 0.
uint64_t XxHash64(const void* data, size_t bytes);

// The low 52 bits of XxHash64 over the bits of `n` floats, as a double (exact, so a max/min
// all-reduce of doubles compares it across ranks; Engine::Initialize does).
double ValuesHash52(const float* values, int64_t n);

}  // namespace zero
