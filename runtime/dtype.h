// Element types of parameters, gradients and communication buffers, and exact conversions between
// them. fp32 <-> bf16/fp16 use round-to-nearest-even; NaN stays NaN (quiet), overflow rounds to
// +-Inf, fp16 subnormals are produced and read exactly. The conversion functions are usable from
// host and CUDA device code (ZERO_HD) and are the single definition both backends use, so the CPU
// and CUDA kernels produce bit-identical 16-bit results.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#if defined(__CUDACC__)
#define ZERO_HD __host__ __device__ __forceinline__
#else
#define ZERO_HD inline
#endif

namespace zero {

enum class DType : uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2 };

constexpr size_t SizeOf(DType t) { return t == DType::kF32 ? 4 : 2; }
// False for a value outside the enumerators (an integer cast to DType): what an API checks first.
constexpr bool IsKnownDType(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }
const char* DTypeName(DType t);  // "fp32", "bf16", "fp16"
// Accepts "fp32"/"float32"/"float", "bf16"/"bfloat16", "fp16"/"float16"/"half". False if unknown.
bool ParseDType(std::string_view name, DType* out);

ZERO_HD uint32_t FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

ZERO_HD float BitsToFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// bf16 is the top 16 bits of an fp32.
ZERO_HD uint16_t FloatToBf16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN, sign and payload top kept
  }
  uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding_bias) >> 16);
}

ZERO_HD float Bf16ToFloat(uint16_t h) { return BitsToFloat(static_cast<uint32_t>(h) << 16); }

// IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
ZERO_HD uint16_t FloatToHalf(float f) {
  uint32_t u = FloatBits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // Inf or NaN
    if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: Inf
  if (abs < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25 rounds to zero (ties too)
    uint32_t exp = abs >> 23;                                   // 102..112
    uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exp;  // 14..24: value = mant * 2^(exp-150), unit 2^-24
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  // Normal: rebias exponent 127 -> 15 and round the 13 dropped mantissa bits to nearest even.
  uint32_t v = abs - 0x38000000u;  // (127-15) << 23
  uint32_t half = v >> 13;
  uint32_t rem = v & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;  // may carry into the exponent: fine
  return static_cast<uint16_t>(sign | half);
}

ZERO_HD float HalfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1fu) return BitsToFloat(sign | 0x7f800000u | (mant << 13));  // Inf / NaN
  if (exp == 0) {
    if (mant == 0) return BitsToFloat(sign);
    // Subnormal: mant * 2^-24, exact in fp32.
    float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return BitsToFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

// Reads element i of a buffer of type t as float.
ZERO_HD float LoadAsFloat(const void* p, DType t, size_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(p)[i];
    case DType::kBF16:
      return Bf16ToFloat(static_cast<const uint16_t*>(p)[i]);
    default:
      return HalfToFloat(static_cast<const uint16_t*>(p)[i]);
  }
}

// Writes v (rounded to nearest even) as element i of a buffer of type t.
ZERO_HD void StoreFromFloat(void* p, DType t, size_t i, float v) {
  switch (t) {
    case DType::kF32:
      static_cast<float*>(p)[i] = v;
      break;
    case DType::kBF16:
      static_cast<uint16_t*>(p)[i] = FloatToBf16(v);
      break;
    default:
      static_cast<uint16_t*>(p)[i] = FloatToHalf(v);
      break;
  }
}

// Element pointer arithmetic on untyped (device or host) memory of type t.
inline void* ElementPtr(void* base, DType t, int64_t i) {
  return static_cast<char*>(base) + static_cast<size_t>(i) * SizeOf(t);
}
inline const void* ElementPtr(const void* base, DType t, int64_t i) {
  return static_cast<const char*>(base) + static_cast<size_t>(i) * SizeOf(t);
}

}  // namespace zero
