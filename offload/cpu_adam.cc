#include "offload/cpu_adam.h"

// GCC 12 warns "'__Y' may be used uninitialized" inside _mm512_cvtps_ph (its own
// _mm256_undefined_si256 idiom): a false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>

// The SIMD paths are bitwise equal to the scalar reference only if the compiler never fuses a
// multiply and an add: GCC contracts vector intrinsics (they are plain vector arithmetic in GCC)
// into FMA inside a target("avx512f"/"avx2") function unless contraction is off. offload/BUILD
// passes -ffp-contract=off; refuse to build without it.
#if !defined(ZERO_FP_CONTRACT_OFF)
#error "offload/cpu_adam.cc must be compiled with -ffp-contract=off -DZERO_FP_CONTRACT_OFF (see offload/BUILD)"
#endif

namespace zero {
namespace {

enum class Out { kNone, kF32, kBF16, kF16 };

// The reference's per-call constants, computed with the same float operations it performs per
// element (device.h: (1 - beta1), sqrtf(bias_correction2), lr * weight_decay, lr / bc1).
struct Consts {
  float grad_scale, weight_decay, beta1, one_minus_beta1, beta2, one_minus_beta2, sqrt_bc2, eps, lr_wd, step;
};

Consts MakeConsts(const AdamWParams& h) {
  Consts c;
  c.grad_scale = h.grad_scale;
  c.weight_decay = h.weight_decay;
  c.beta1 = h.beta1;
  c.one_minus_beta1 = 1.0f - h.beta1;
  c.beta2 = h.beta2;
  c.one_minus_beta2 = 1.0f - h.beta2;
  c.sqrt_bc2 = std::sqrt(h.bias_correction2);
  c.eps = h.eps;
  c.lr_wd = h.lr * h.weight_decay;
  c.step = h.lr / h.bias_correction1;
  return c;
}

inline float CanonicalNaN(float r) { return r != r ? BitsToFloat(0x7fffffffu) : r; }

// g: fp32 gradients, or bf16 ones (kBf16G) widened in the kernel as 0.0f + g (WidenToF32's value:
// -0 becomes +0; a NaN's payload is irrelevant, every NaN result is stored canonical).
using RangeFn = void (*)(float* p, const void* g, float* m, float* v, void* out, const AdamWParams& h, const Consts& c,
                         size_t b, size_t e);

// The scalar path and the SIMD paths' tails: AdamWReference itself, exactly as CpuDevice's
// AdamWCastRange runs it.
template <bool kAdamW, Out kOut, bool kBf16G = false>
void ScalarRange(float* __restrict p, const void* __restrict graw, float* __restrict m, float* __restrict v, void* out,
                 const AdamWParams& params, const Consts&, size_t b, size_t e) {
  AdamWParams h = params;
  h.adam_w_mode = kAdamW;  // a constant, so the branch leaves the loop
  for (size_t i = b; i < e; ++i) {
    float pi = p[i], mi = m[i], vi = v[i];
    float gi;
    if constexpr (kBf16G) {
      gi = 0.0f + Bf16ToFloat(static_cast<const uint16_t*>(graw)[i]);
    } else {
      gi = static_cast<const float*>(graw)[i];
    }
    AdamWReference(&pi, gi, &mi, &vi, h);
    pi = CanonicalNaN(pi);
    p[i] = pi;
    m[i] = CanonicalNaN(mi);
    v[i] = CanonicalNaN(vi);
    if constexpr (kOut == Out::kF32) static_cast<float*>(out)[i] = pi;
    if constexpr (kOut == Out::kBF16) static_cast<uint16_t*>(out)[i] = FloatToBf16(pi);
    if constexpr (kOut == Out::kF16) static_cast<uint16_t*>(out)[i] = FloatToHalf(pi);
  }
}

template <bool kStream>
__attribute__((target("avx2"))) inline void Store256(uint16_t* dst, __m256i x) {
  if constexpr (kStream) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst), x);
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), x);
  }
}

template <bool kStream>
inline void Store128(uint16_t* dst, __m128i x) {
  if constexpr (kStream) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst), x);
  } else {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), x);
  }
}

// --- AVX-512F: 16 lanes --------------------------------------------------------------------------

// kStream: model_out is written with non-temporal stores (REQUIRES: out + b 64-byte aligned).
template <bool kAdamW, Out kOut, bool kStream, bool kBf16G>
__attribute__((target("avx512f"))) void Avx512Range(float* p, const void* graw, float* m, float* v, void* out,
                                                    const AdamWParams& h, const Consts& c, size_t b, size_t e) {
  const float* g = static_cast<const float*>(graw);
  const uint16_t* g16 = static_cast<const uint16_t*>(graw);
  const __m512 zero = _mm512_setzero_ps();
  const __m512 grad_scale = _mm512_set1_ps(c.grad_scale);
  const __m512 weight_decay = _mm512_set1_ps(c.weight_decay);
  const __m512 beta1 = _mm512_set1_ps(c.beta1);
  const __m512 one_minus_beta1 = _mm512_set1_ps(c.one_minus_beta1);
  const __m512 beta2 = _mm512_set1_ps(c.beta2);
  const __m512 one_minus_beta2 = _mm512_set1_ps(c.one_minus_beta2);
  const __m512 sqrt_bc2 = _mm512_set1_ps(c.sqrt_bc2);
  const __m512 eps = _mm512_set1_ps(c.eps);
  const __m512 lr_wd = _mm512_set1_ps(c.lr_wd);
  const __m512 step = _mm512_set1_ps(c.step);
  const __m512i nan_bits = _mm512_set1_epi32(0x7fffffff);
  const __m512 nan = _mm512_castsi512_ps(nan_bits);
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i bf16_bias = _mm512_set1_epi32(0x7fff);
  size_t i = b;
  for (; i + 16 <= e; i += 16) {
    __m512 pi = _mm512_loadu_ps(p + i);
    __m512 gi;
    if constexpr (kBf16G) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g16 + i));
      gi = _mm512_add_ps(zero, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16)));
    } else {
      gi = _mm512_loadu_ps(g + i);
    }
    __m512 mi = _mm512_loadu_ps(m + i);
    __m512 vi = _mm512_loadu_ps(v + i);
    gi = _mm512_mul_ps(gi, grad_scale);
    if constexpr (!kAdamW) gi = _mm512_add_ps(gi, _mm512_mul_ps(weight_decay, pi));
    mi = _mm512_add_ps(_mm512_mul_ps(beta1, mi), _mm512_mul_ps(one_minus_beta1, gi));
    vi = _mm512_add_ps(_mm512_mul_ps(beta2, vi), _mm512_mul_ps(one_minus_beta2, _mm512_mul_ps(gi, gi)));
    __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), sqrt_bc2), eps);
    if constexpr (kAdamW) pi = _mm512_sub_ps(pi, _mm512_mul_ps(lr_wd, pi));
    pi = _mm512_sub_ps(pi, _mm512_mul_ps(step, _mm512_div_ps(mi, denom)));
    const __mmask16 p_nan = _mm512_cmp_ps_mask(pi, pi, _CMP_UNORD_Q);
    pi = _mm512_mask_blend_ps(p_nan, pi, nan);
    mi = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(mi, mi, _CMP_UNORD_Q), mi, nan);
    vi = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(vi, vi, _CMP_UNORD_Q), vi, nan);
    _mm512_storeu_ps(p + i, pi);
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    if constexpr (kOut == Out::kF32) {
      if constexpr (kStream) {
        _mm512_stream_ps(static_cast<float*>(out) + i, pi);
      } else {
        _mm512_storeu_ps(static_cast<float*>(out) + i, pi);
      }
    }
    if constexpr (kOut == Out::kBF16) {
      // FloatToBf16: (u + 0x7fff + ((u >> 16) & 1)) >> 16; the canonical NaN becomes 0x7fff.
      const __m512i u = _mm512_castps_si512(pi);
      const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
      __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, bf16_bias)), 16);
      r = _mm512_mask_blend_epi32(p_nan, r, bf16_bias);
      Store256<kStream>(static_cast<uint16_t*>(out) + i, _mm512_cvtepi32_epi16(r));
    }
    if constexpr (kOut == Out::kF16) {
      // vcvtps2ph rounds to nearest even with subnormals and overflow to Inf as FloatToHalf does;
      // the canonical NaN becomes 0x7fff in both.
      Store256<kStream>(static_cast<uint16_t*>(out) + i,
                        _mm512_cvtps_ph(pi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
  }
  // Non-temporal stores are weakly ordered: make them visible before the tile counts as done.
  if constexpr (kStream) _mm_sfence();
  ScalarRange<kAdamW, kOut, kBf16G>(p, graw, m, v, out, h, c, i, e);
}

// --- AVX2 (+F16C): 8 lanes -----------------------------------------------------------------------

template <bool kAdamW, Out kOut, bool kStream, bool kBf16G>
__attribute__((target("avx2,f16c"))) void Avx2Range(float* p, const void* graw, float* m, float* v, void* out,
                                                    const AdamWParams& h, const Consts& c, size_t b, size_t e) {
  const float* g = static_cast<const float*>(graw);
  const uint16_t* g16 = static_cast<const uint16_t*>(graw);
  const __m256 zero = _mm256_setzero_ps();
  const __m256 grad_scale = _mm256_set1_ps(c.grad_scale);
  const __m256 weight_decay = _mm256_set1_ps(c.weight_decay);
  const __m256 beta1 = _mm256_set1_ps(c.beta1);
  const __m256 one_minus_beta1 = _mm256_set1_ps(c.one_minus_beta1);
  const __m256 beta2 = _mm256_set1_ps(c.beta2);
  const __m256 one_minus_beta2 = _mm256_set1_ps(c.one_minus_beta2);
  const __m256 sqrt_bc2 = _mm256_set1_ps(c.sqrt_bc2);
  const __m256 eps = _mm256_set1_ps(c.eps);
  const __m256 lr_wd = _mm256_set1_ps(c.lr_wd);
  const __m256 step = _mm256_set1_ps(c.step);
  const __m256 nan = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i bf16_bias = _mm256_set1_epi32(0x7fff);
  size_t i = b;
  for (; i + 8 <= e; i += 8) {
    __m256 pi = _mm256_loadu_ps(p + i);
    __m256 gi;
    if constexpr (kBf16G) {
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(g16 + i));
      gi = _mm256_add_ps(zero, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16)));
    } else {
      gi = _mm256_loadu_ps(g + i);
    }
    __m256 mi = _mm256_loadu_ps(m + i);
    __m256 vi = _mm256_loadu_ps(v + i);
    gi = _mm256_mul_ps(gi, grad_scale);
    if constexpr (!kAdamW) gi = _mm256_add_ps(gi, _mm256_mul_ps(weight_decay, pi));
    mi = _mm256_add_ps(_mm256_mul_ps(beta1, mi), _mm256_mul_ps(one_minus_beta1, gi));
    vi = _mm256_add_ps(_mm256_mul_ps(beta2, vi), _mm256_mul_ps(one_minus_beta2, _mm256_mul_ps(gi, gi)));
    __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), sqrt_bc2), eps);
    if constexpr (kAdamW) pi = _mm256_sub_ps(pi, _mm256_mul_ps(lr_wd, pi));
    pi = _mm256_sub_ps(pi, _mm256_mul_ps(step, _mm256_div_ps(mi, denom)));
    const __m256 p_nan = _mm256_cmp_ps(pi, pi, _CMP_UNORD_Q);
    pi = _mm256_blendv_ps(pi, nan, p_nan);
    mi = _mm256_blendv_ps(mi, nan, _mm256_cmp_ps(mi, mi, _CMP_UNORD_Q));
    vi = _mm256_blendv_ps(vi, nan, _mm256_cmp_ps(vi, vi, _CMP_UNORD_Q));
    _mm256_storeu_ps(p + i, pi);
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    if constexpr (kOut == Out::kF32) {
      if constexpr (kStream) {
        _mm256_stream_ps(static_cast<float*>(out) + i, pi);
      } else {
        _mm256_storeu_ps(static_cast<float*>(out) + i, pi);
      }
    }
    if constexpr (kOut == Out::kBF16) {
      const __m256i u = _mm256_castps_si256(pi);
      const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
      __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, bf16_bias)), 16);
      r = _mm256_blendv_epi8(r, bf16_bias, _mm256_castps_si256(p_nan));
      // packus works per 128-bit lane: [r0..r3 r0..r3 | r4..r7 r4..r7]; qwords 0 and 2 hold r0..r7.
      const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
      Store128<kStream>(static_cast<uint16_t*>(out) + i, _mm256_castsi256_si128(packed));
    }
    if constexpr (kOut == Out::kF16) {
      Store128<kStream>(static_cast<uint16_t*>(out) + i,
                        _mm256_cvtps_ph(pi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
  }
  // Non-temporal stores are weakly ordered: make them visible before the tile counts as done.
  if constexpr (kStream) _mm_sfence();
  ScalarRange<kAdamW, kOut, kBf16G>(p, graw, m, v, out, h, c, i, e);
}

template <bool kAdamW, Out kOut, bool kBf16G>
RangeFn SelectFor(CpuAdamPath path, bool stream) {
  stream = stream && kOut != Out::kNone;
  switch (path) {
    case CpuAdamPath::kAvx512:
      return stream ? &Avx512Range<kAdamW, kOut, true, kBf16G> : &Avx512Range<kAdamW, kOut, false, kBf16G>;
    case CpuAdamPath::kAvx2:
      return stream ? &Avx2Range<kAdamW, kOut, true, kBf16G> : &Avx2Range<kAdamW, kOut, false, kBf16G>;
    default:
      return &ScalarRange<kAdamW, kOut, kBf16G>;
  }
}

template <bool kAdamW, bool kBf16G>
RangeFn SelectOut(CpuAdamPath path, void* model_out, DType model_t, bool stream) {
  if (model_out == nullptr) return SelectFor<kAdamW, Out::kNone, kBf16G>(path, false);
  switch (model_t) {
    case DType::kF32:
      return SelectFor<kAdamW, Out::kF32, kBf16G>(path, stream);
    case DType::kBF16:
      return SelectFor<kAdamW, Out::kBF16, kBf16G>(path, stream);
    case DType::kF16:
      break;
  }
  return SelectFor<kAdamW, Out::kF16, kBf16G>(path, stream);
}

struct CpuFeatures {
  bool avx512 = false;
  bool avx2 = false;
};

const CpuFeatures& Features() {
  static const CpuFeatures features = [] {
    __builtin_cpu_init();  // needed before constructors have run (static binaries)
    CpuFeatures f;
    // libgcc sets these only when the OS saves the ZMM/YMM state (XGETBV).
    f.avx512 = __builtin_cpu_supports("avx512f");
    f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    return f;
  }();
  return features;
}

// Tests lower it to pretend the CPU lacks a path (SetCpuAdamPathCeilingForTesting).
std::atomic<int> path_ceiling{static_cast<int>(CpuAdamPath::kAvx512)};

bool Allowed(CpuAdamPath path) { return static_cast<int>(path) <= path_ceiling.load(std::memory_order_relaxed); }

}  // namespace

const char* CpuAdamPathName(CpuAdamPath path) {
  switch (path) {
    case CpuAdamPath::kAuto:
      return "auto";
    case CpuAdamPath::kScalar:
      return "scalar";
    case CpuAdamPath::kAvx2:
      return "avx2";
    case CpuAdamPath::kAvx512:
      return "avx512";
  }
  return "unknown";
}

bool ParseCpuAdamPath(std::string_view name, CpuAdamPath* out) {
  for (CpuAdamPath p : {CpuAdamPath::kAuto, CpuAdamPath::kScalar, CpuAdamPath::kAvx2, CpuAdamPath::kAvx512}) {
    if (name == CpuAdamPathName(p)) {
      *out = p;
      return true;
    }
  }
  return false;
}

bool CpuAdamPathAvailable(CpuAdamPath path) {
  switch (path) {
    case CpuAdamPath::kAvx512:
      return Features().avx512 && Allowed(path);
    case CpuAdamPath::kAvx2:
      return Features().avx2 && Allowed(path);
    default:
      return true;
  }
}

CpuAdamPath BestCpuAdamPath() {
  if (CpuAdamPathAvailable(CpuAdamPath::kAvx512)) return CpuAdamPath::kAvx512;
  if (CpuAdamPathAvailable(CpuAdamPath::kAvx2)) return CpuAdamPath::kAvx2;
  return CpuAdamPath::kScalar;
}

void SetCpuAdamPathCeilingForTesting(CpuAdamPath ceiling) {
  path_ceiling.store(static_cast<int>(ceiling == CpuAdamPath::kAuto ? CpuAdamPath::kAvx512 : ceiling),
                     std::memory_order_relaxed);
}

namespace {

Status RunCpuAdamW(float* param, const void* grad, bool bf16_grad, float* exp_avg, float* exp_avg_sq, size_t n,
                   const AdamWParams& h, void* model_out, DType model_t, ThreadPool* pool,
                   const CpuAdamWOptions& options) {
  CpuAdamPath path = options.path;
  if (path == CpuAdamPath::kAuto) path = BestCpuAdamPath();
  if (!CpuAdamPathAvailable(path)) {
    return FailedPreconditionError(std::string("CpuAdamW: path '") + CpuAdamPathName(path) +
                                   "' is not available on this CPU (best available: '" +
                                   CpuAdamPathName(BestCpuAdamPath()) + "')");
  }
  if (model_out != nullptr && model_t != DType::kF32 && model_t != DType::kBF16 && model_t != DType::kF16) {
    return InvalidArgumentError("CpuAdamW: model_t " + std::to_string(static_cast<int>(model_t)) +
                                " is not a dtype (expected fp32, bf16 or fp16)");
  }
  if (n == 0) return OkStatus();
  if (param == nullptr || grad == nullptr || exp_avg == nullptr || exp_avg_sq == nullptr) {
    return InvalidArgumentError("CpuAdamW: null " +
                                std::string(param == nullptr     ? "param"
                                            : grad == nullptr    ? "grad"
                                            : exp_avg == nullptr ? "exp_avg"
                                                                 : "exp_avg_sq") +
                                " with n = " + std::to_string(n) + " elements");
  }
  // Tiles start at multiples of 64 elements, so an aligned buffer keeps every tile's SIMD stores
  // aligned, as the non-temporal stores require.
  const bool stream =
      options.stream_model_out && model_out != nullptr && reinterpret_cast<uintptr_t>(model_out) % 64 == 0;
  const RangeFn fn = bf16_grad ? (h.adam_w_mode ? SelectOut<true, true>(path, model_out, model_t, stream)
                                                : SelectOut<false, true>(path, model_out, model_t, stream))
                               : (h.adam_w_mode ? SelectOut<true, false>(path, model_out, model_t, stream)
                                                : SelectOut<false, false>(path, model_out, model_t, stream));
  const Consts c = MakeConsts(h);
  const size_t tile = std::max<size_t>(64, (options.tile_elements + 63) & ~size_t{63});
  const size_t num_tiles = (n + tile - 1) / tile;
  if (pool == nullptr || num_tiles == 1) {
    fn(param, grad, exp_avg, exp_avg_sq, model_out, h, c, 0, n);
    return OkStatus();
  }
  pool->ParallelFor(num_tiles, [&](size_t t) {
    const size_t b = t * tile;
    fn(param, grad, exp_avg, exp_avg_sq, model_out, h, c, b, std::min(n, b + tile));
  });
  return OkStatus();
}

}  // namespace

Status CpuAdamW(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, size_t n, const AdamWParams& h,
                void* model_out, DType model_t, ThreadPool* pool, const CpuAdamWOptions& options) {
  return RunCpuAdamW(param, grad, false, exp_avg, exp_avg_sq, n, h, model_out, model_t, pool, options);
}

Status CpuAdamWBf16Grad(float* param, const uint16_t* grad, float* exp_avg, float* exp_avg_sq, size_t n,
                        const AdamWParams& h, void* model_out, DType model_t, ThreadPool* pool,
                        const CpuAdamWOptions& options) {
  return RunCpuAdamW(param, grad, true, exp_avg, exp_avg_sq, n, h, model_out, model_t, pool, options);
}

}  // namespace zero
