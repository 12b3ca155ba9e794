// Test helpers shared by the kernel tests of the Device backends: reproducible random inputs in
// any dtype (optionally salted with Inf, NaN, subnormals and values that overflow fp16) and
// straightforward per-element reference kernels written with dtype.h's LoadAsFloat/StoreFromFloat.
// Test-only (testonly = True); owns nothing beyond the vectors it returns.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "runtime/device.h"
#include "runtime/dtype.h"

namespace zero {
namespace testing {

// n elements of type t as raw bytes. Values are normal(0,1) times 10^uniform(-range, range); with
// `specials`, about 1 in 64 elements is one of +-0, +-Inf, NaN, an fp16/float subnormal, 1e6
// (fp16 overflow) or the largest finite float.
inline std::vector<uint8_t> RandomBytes(DType t, size_t n, uint64_t seed, bool specials, float range = 4.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> expo(-range, range);
  const float kSpecial[] = {0.0f,   -0.0f,  INFINITY, -INFINITY, NAN,           -NAN,     3e-6f,
                            -1e-7f, 1e-40f, 1e6f,     -1e6f,     3.4028235e38f, 65520.0f, 65504.0f};
  std::vector<uint8_t> out(n * SizeOf(t));
  for (size_t i = 0; i < n; ++i) {
    float v;
    if (specials && (rng() & 63) == 0) {
      v = kSpecial[rng() % (sizeof(kSpecial) / sizeof(kSpecial[0]))];
    } else {
      v = normal(rng) * std::pow(10.0f, expo(rng));
    }
    StoreFromFloat(out.data(), t, i, v);
  }
  return out;
}

inline std::vector<float> RandomFloats(size_t n, uint64_t seed, float range = 4.0f) {
  std::vector<uint8_t> bytes = RandomBytes(DType::kF32, n, seed, false, range);
  std::vector<float> out(n);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

// "" if a == b, else where the first differing element of `elem_size` bytes is and both values in
// hex (readable failure messages instead of byte dumps).
inline std::string FirstDifference(const std::vector<uint8_t>& got, const std::vector<uint8_t>& expect,
                                   size_t elem_size) {
  if (got.size() != expect.size()) {
    return "sizes differ: " + std::to_string(got.size()) + " vs " + std::to_string(expect.size());
  }
  for (size_t i = 0; i < got.size(); i += elem_size) {
    if (std::memcmp(got.data() + i, expect.data() + i, elem_size) != 0) {
      uint32_t a = 0, b = 0;
      std::memcpy(&a, got.data() + i, elem_size);
      std::memcpy(&b, expect.data() + i, elem_size);
      char buf[128];
      std::snprintf(buf, sizeof(buf), "element %zu: got 0x%x, expected 0x%x", i / elem_size, a, b);
      return buf;
    }
  }
  return "";
}

// --- references: one element at a time, dtype switched per element ---------------------------

// NaN results of arithmetic are canonical (device.h).
inline float Canon(float r) {
  if (!std::isnan(r)) return r;
  uint32_t u = 0x7fffffffu;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline void RefFill(void* dst, DType t, size_t n, float value) {
  for (size_t i = 0; i < n; ++i) StoreFromFloat(dst, t, i, value);
}

inline void RefCast(const void* src, DType st, void* dst, DType dt, size_t n) {
  if (st == dt) {
    std::memcpy(dst, src, n * SizeOf(st));
    return;
  }
  for (size_t i = 0; i < n; ++i) StoreFromFloat(dst, dt, i, LoadAsFloat(src, st, i));
}

inline void RefAccumulate(float* acc, const void* src, DType st, size_t n, float scale) {
  for (size_t i = 0; i < n; ++i) acc[i] = Canon(acc[i] + scale * LoadAsFloat(src, st, i));
}

inline void RefScale(void* x, DType t, size_t n, float s) {
  for (size_t i = 0; i < n; ++i) StoreFromFloat(x, t, i, Canon(LoadAsFloat(x, t, i) * s));
}

inline double RefSumOfSquaresLongDouble(const void* x, DType t, size_t n) {
  long double s = 0;
  for (size_t i = 0; i < n; ++i) {
    long double v = LoadAsFloat(x, t, i);
    s += v * v;
  }
  return static_cast<double>(s);
}

inline bool RefAnyNonFinite(const void* x, DType t, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(LoadAsFloat(x, t, i))) return true;
  }
  return false;
}

// AdamW transcribed from the comment in device.h (not by calling AdamWReference).
inline void RefAdamW(float* p, const float* grad, float* m, float* v, size_t n, const AdamWParams& h) {
  for (size_t i = 0; i < n; ++i) {
    float g = grad[i] * h.grad_scale;
    if (!h.adam_w_mode) g += h.weight_decay * p[i];
    m[i] = h.beta1 * m[i] + (1 - h.beta1) * g;
    v[i] = h.beta2 * v[i] + (1 - h.beta2) * (g * g);
    float denom = std::sqrt(v[i]) / std::sqrt(h.bias_correction2) + h.eps;
    if (h.adam_w_mode) p[i] = p[i] - h.lr * h.weight_decay * p[i];
    p[i] = Canon(p[i] - (h.lr / h.bias_correction1) * (m[i] / denom));
    m[i] = Canon(m[i]);
    v[i] = Canon(v[i]);
  }
}

// AdamW hyperparameters of step t (1-based).
inline AdamWParams AdamWStep(int t, bool adam_w_mode, float grad_scale) {
  AdamWParams h;
  h.lr = 3e-3f;
  h.beta1 = 0.9f;
  h.beta2 = 0.95f;
  h.eps = 1e-8f;
  h.weight_decay = 0.1f;
  h.adam_w_mode = adam_w_mode;
  h.grad_scale = grad_scale;
  h.bias_correction1 = 1.0f - std::pow(h.beta1, static_cast<float>(t));
  h.bias_correction2 = 1.0f - std::pow(h.beta2, static_cast<float>(t));
  return h;
}

}  // namespace testing
}  // namespace zero
