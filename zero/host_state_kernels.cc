#include "zero/host_state_kernels.h"

#include <algorithm>
#include <cstring>
#include <mutex>

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

CpuDevice* ReferenceKernels() {
  static CpuDevice* const cpu = new CpuDevice();  // the reference kernels, on host memory
  return cpu;
}

}  // namespace

void RoundToDType(ThreadPool* pool, const float* src, void* dst, DType t, int64_t n) {
  Tiles(pool, n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) StoreFromFloat(dst, t, static_cast<size_t>(i), src[i]);
  });
}

void CopyElements(ThreadPool* pool, const void* src, DType t, void* dst, int64_t n) {
  const size_t w = SizeOf(t);
  Tiles(pool, n, [&](int64_t b, int64_t e) {
    std::memcpy(static_cast<char*>(dst) + b * w, static_cast<const char*>(src) + b * w, static_cast<size_t>(e - b) * w);
  });
}

void WidenToF32(ThreadPool* pool, const void* src, DType t, float* dst, int64_t n) {
  CpuDevice* const cpu = ReferenceKernels();
  Tiles(pool, n, [&](int64_t b, int64_t e) {
    if (src == nullptr) {
      std::memset(dst + b, 0, static_cast<size_t>(e - b) * 4);
      return;
    }
    // Host memory and valid arguments: cannot fail.
    cpu->AccumulateFirst(dst + b, ElementPtr(src, t, b), t, static_cast<size_t>(e - b), 1.0f, nullptr).IgnoreError();
  });
}

Status WidenedAdamW(ThreadPool* pool, const void* grad, DType grad_t, float* scratch, float* param, float* exp_avg,
                    float* exp_avg_sq, int64_t n, const AdamWParams& h, void* model_out, DType model_t,
                    const CpuAdamWOptions& options) {
  if (grad != nullptr && grad_t == DType::kBF16) {
    return CpuAdamWBf16Grad(param, static_cast<const uint16_t*>(grad), exp_avg, exp_avg_sq, static_cast<size_t>(n), h,
                            model_out, model_t, pool, options);
  }
  CpuDevice* const cpu = ReferenceKernels();
  std::mutex mu;
  Status first_error;
  Tiles(pool, n, [&](int64_t b, int64_t e) {
    const size_t len = static_cast<size_t>(e - b);
    if (grad == nullptr) {
      std::memset(scratch + b, 0, len * 4);
    } else {
      // Host memory and valid arguments: cannot fail.
      cpu->AccumulateFirst(scratch + b, ElementPtr(grad, grad_t, b), grad_t, len, 1.0f, nullptr).IgnoreError();
    }
    // This tile on this thread (the pool is busy with the other tiles).
    Status s = CpuAdamW(param + b, scratch + b, exp_avg + b, exp_avg_sq + b, len, h,
                        model_out != nullptr ? ElementPtr(model_out, model_t, b) : nullptr, model_t, nullptr, options);
    if (!s.ok()) {
      std::lock_guard<std::mutex> l(mu);
      if (first_error.ok()) first_error = s;
    }
  });
  return first_error;
}

void AccumulateIntoF32(ThreadPool* pool, const void* src, DType t, float* dst, int64_t n, bool first) {
  CpuDevice* const cpu = ReferenceKernels();
  Tiles(pool, n, [&](int64_t b, int64_t e) {
    // Host memory and valid arguments: cannot fail. Tiles are below the CpuDevice's threading
    // threshold, so each runs on the pool thread that took it.
    const void* in = ElementPtr(src, t, b);
    const size_t len = static_cast<size_t>(e - b);
    if (first) {
      cpu->AccumulateFirst(dst + b, in, t, len, 1.0f, nullptr).IgnoreError();
    } else {
      cpu->Accumulate(dst + b, in, t, len, 1.0f, nullptr).IgnoreError();
    }
  });
}

double SumOfSquaresF32(const float* x, int64_t n) {
  double out = 0.0;
  if (n > 0) ReferenceKernels()->SumOfSquares(x, DType::kF32, static_cast<size_t>(n), &out, nullptr).IgnoreError();
  return out;
}

void SumsOfSquaresF32(ThreadPool* pool, const std::vector<F32Span>& spans, double* out) {
  constexpr size_t kBlocksPerTask = 4096;
  struct Task {
    size_t span, first_block, blocks;
  };
  std::vector<size_t> offset(spans.size() + 1, 0);  // the first block sum of each span in `sums`
  std::vector<Task> tasks;
  for (size_t i = 0; i < spans.size(); ++i) {
    const size_t n = spans[i].n > 0 ? static_cast<size_t>(spans[i].n) : 0;
    const size_t blocks = (n + kSumOfSquaresBlock - 1) / kSumOfSquaresBlock;
    for (size_t b = 0; b < blocks; b += kBlocksPerTask) tasks.push_back({i, b, std::min(kBlocksPerTask, blocks - b)});
    offset[i + 1] = offset[i] + blocks;
  }
  std::vector<double> sums(offset.back());
  pool->ParallelFor(tasks.size(), [&](size_t t) {
    const Task& task = tasks[t];
    const F32Span& span = spans[task.span];
    for (size_t k = task.first_block; k < task.first_block + task.blocks; ++k) {
      const size_t b = k * kSumOfSquaresBlock;
      sums[offset[task.span] + k] =
          BlockSumOfSquaresF32(span.data + b, std::min(kSumOfSquaresBlock, static_cast<size_t>(span.n) - b));
    }
  });
  for (size_t i = 0; i < spans.size(); ++i) {
    out[i] = CombineBlockSumsOfSquares(sums.data() + offset[i], offset[i + 1] - offset[i]);
  }
}

}  // namespace zero
