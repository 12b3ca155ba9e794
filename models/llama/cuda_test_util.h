// Host helpers the CUDA model's tests share (cuda_model_test.cc, cuda_kernels_test.cc): seeded
// random values, rounding to a dtype, and the relative L2 error the bounds are stated in.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "runtime/dtype.h"

namespace zero::llm::cuda_test {

inline uint64_t Next(uint64_t* s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return *s >> 11;
}

// Normal(0, std) values from a seed (Box-Muller).
inline std::vector<float> RandomNormal(int64_t n, float std, uint64_t seed) {
  std::vector<float> v(n);
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (int64_t i = 0; i < n; ++i) {
    const double u1 = (static_cast<double>(Next(&s)) + 1.0) / 9007199254740993.0;
    const double u2 = static_cast<double>(Next(&s)) / 9007199254740992.0;
    v[i] = static_cast<float>(std * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  return v;
}

// The values as the dtype stores them.
inline std::vector<float> Rounded(std::vector<float> v, DType t) {
  for (float& x : v) {
    uint8_t buf[4];
    StoreFromFloat(buf, t, 0, x);
    x = LoadAsFloat(buf, t, 0);
  }
  return v;
}

inline double RelL2(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

inline double RelL2(const std::vector<float>& got, const std::vector<float>& want) {
  return RelL2(got, std::vector<double>(want.begin(), want.end()));
}

}  // namespace zero::llm::cuda_test
