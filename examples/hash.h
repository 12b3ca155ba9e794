// SplitMix64: a 64-bit mix, the keyed hash behind the examples' deterministic initial values
// (model_api.cc) and data sampling (data.cc), and the generator of byte_lm's text sampling.
#pragma once

#include <cstdint>

namespace zero::examples {

inline constexpr uint64_t kSplitMix64Gamma = 0x9e3779b97f4a7c15ull;

// The mix of `x`: the generator's output from state `x`.
inline uint64_t SplitMix64(uint64_t x) {
  x += kSplitMix64Gamma;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The generator: the next output, advancing `state`.
inline uint64_t SplitMix64Next(uint64_t* state) {
  const uint64_t x = *state;
  *state += kSplitMix64Gamma;
  return SplitMix64(x);
}

}  // namespace zero::examples
