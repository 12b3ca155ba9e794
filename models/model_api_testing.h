// Test helpers for the example models (byte LM, LLM): parameters off their initial values and the
// bitwise comparison of two HostTensors sets. Header-only, test-only.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "models/model_api.h"
#include "runtime/dtype.h"
#include "testing/same_bits.h"

namespace zero::examples {

// The initializer's values (InitParam(spec, seed)) plus normal noise of std `noise_std` on every
// tensor, rounded to `dtype`: norm gains and biases are off their symmetric initial values (a
// gradient check at ones/zeros misses bugs) and the linears large enough that attention is far
// from uniform. The noise is InitParam of the spec renamed "<name>.noise", so it is deterministic.
inline HostTensors RandomParams(const std::vector<ModelParamSpec>& specs, DType dtype, uint64_t seed,
                                float noise_std = 0.3f) {
  HostTensors p(specs, dtype);
  for (int i = 0; i < static_cast<int>(specs.size()); ++i) {
    std::vector<float> v = InitParam(specs[i], seed);
    ModelParamSpec noise = specs[i];
    noise.init = InitKind::kNormal;
    noise.init_std = noise_std;
    noise.name += ".noise";
    const std::vector<float> n = InitParam(noise, seed);
    for (size_t j = 0; j < v.size(); ++j) v[j] += n[j];
    p.SetAll(i, v);
  }
  return p;
}

// Every tensor of `a` and `b` bit for bit (testing/same_bits.h); a failure names the tensor and
// its first differing byte. REQUIRES: both built from the same specs and dtype.
inline ::testing::AssertionResult SameBits(const HostTensors& a, const HostTensors& b) {
  for (int i = 0; i < a.size(); ++i) {
    ::testing::AssertionResult same =
        ::zero::testing::SameBits(static_cast<const uint8_t*>(a.data(i)), static_cast<const uint8_t*>(b.data(i)),
                                  static_cast<size_t>(a.numel(i)) * SizeOf(a.dtype()));
    if (!same) return same << " (byte offset, tensor " << i << ")";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace zero::examples
