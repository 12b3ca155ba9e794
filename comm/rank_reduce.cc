#include "comm/rank_reduce.h"

#include <cstdint>

namespace zero {
namespace {

// Loads and stores of one dtype, so the loop below has no per-element switch.
struct F32 {
  using T = float;
  static float Load(float x) { return x; }
  static float Store(float v) { return v; }
};
struct BF16 {
  using T = uint16_t;
  static float Load(uint16_t h) { return Bf16ToFloat(h); }
  static uint16_t Store(float v) { return FloatToBf16(v); }
};
struct F16 {
  using T = uint16_t;
  static float Load(uint16_t h) { return HalfToFloat(h); }
  static uint16_t Store(float v) { return FloatToHalf(v); }
};

template <typename D>
void Reduce(const RankReduceArgs& a) {
  using T = typename D::T;
  const T* srcs[kMaxRankReduceSources];
  for (int k = 0; k < a.n_srcs; ++k) srcs[k] = static_cast<const T*>(a.srcs[k]);
  T* out = static_cast<T*>(a.out);
  // Element by element: `out` may be one of the sources (in place), so every source's element i
  // is read before out[i] is written.
  for (size_t i = 0; i < a.count; ++i) {
    float acc = D::Load(srcs[0][i]);
    for (int k = 1; k < a.n_srcs; ++k) acc = RankCombine(acc, D::Load(srcs[k][i]), a.op);
    out[i] = D::Store(RankFinish(acc, a.op, a.n_srcs));
  }
}

}  // namespace

void RankReduceHost(const RankReduceArgs& args) {
  if (args.count == 0 || args.n_srcs < 1) return;
  switch (args.dtype) {
    case DType::kF32:
      return Reduce<F32>(args);
    case DType::kBF16:
      return Reduce<BF16>(args);
    case DType::kF16:
      return Reduce<F16>(args);
  }
}

}  // namespace zero
