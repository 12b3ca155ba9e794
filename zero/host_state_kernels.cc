#include "zero/host_state_kernels.h"

#include <algorithm>
#include <cstring>

#include "runtime/cpu_device.h"

namespace zero {
namespace {

constexpr int64_t kTile = int64_t{1} << 16;

template <typename Fn>
void Tiles(ThreadPool* pool, int64_t n, Fn fn) {
  const size_t tiles = static_cast<size_t>((n + kTile - 1) / kTile);
  pool->ParallelFor(tiles, [&](size_t k) {
    const int64_t b = static_cast<int64_t>(k) * kTile;
    fn(b, std::min(n, b + kTile));
  });
}

}  // namespace

void RoundToDType(ThreadPool* pool, const float* src, void* dst, DType t, int64_t n) {
  Tiles(pool, n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) StoreFromFloat(dst, t, static_cast<size_t>(i), src[i]);
  });
}

void WidenToF32(ThreadPool* pool, const void* src, DType t, float* dst, int64_t n) {
  static CpuDevice* const cpu = new CpuDevice();  // the reference kernels, on host memory
  Tiles(pool, n, [&](int64_t b, int64_t e) {
    if (src == nullptr) {
      std::memset(dst + b, 0, static_cast<size_t>(e - b) * 4);
      return;
    }
    // Host memory and valid arguments: cannot fail.
    cpu->AccumulateFirst(dst + b, ElementPtr(src, t, b), t, static_cast<size_t>(e - b), 1.0f, nullptr).IgnoreError();
  });
}

}  // namespace zero
