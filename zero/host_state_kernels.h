// Host-side elementwise passes shared by the host and NVMe optimizer states, spread over a
// ThreadPool in contiguous tiles (results do not depend on the tiling or the thread count).
#pragma once

#include <cstdint>
#include <vector>

#include "offload/cpu_adam.h"
#include "offload/thread_pool.h"
#include "runtime/dtype.h"
#include "runtime/status.h"

namespace zero {

// dst[i] = src[i] rounded to `t` (StoreFromFloat: round to nearest even).
void RoundToDType(ThreadPool* pool, const float* src, void* dst, DType t, int64_t n);
// dst[i] = 0.0f + src[i] widened from `t`, exactly as CpuDevice::AccumulateFirst (the engine's
// first contribution: -0 becomes +0, NaN canonical); src null: zeros.
void WidenToF32(ThreadPool* pool, const void* src, DType t, float* dst, int64_t n);
// dst[i] = 0.0f + src[i] (first) or dst[i] + src[i], src widened from `t`: exactly
// CpuDevice::AccumulateFirst / Accumulate with scale 1 (the host gradient partition's adds).
void AccumulateIntoF32(ThreadPool* pool, const void* src, DType t, float* dst, int64_t n, bool first);
// Bitwise WidenToF32(grad -> scratch) followed by CpuAdamW over the n elements, in one pass over
// the states: bf16 gradients are widened inside the AdamW kernel (CpuAdamWBf16Grad: scratch is
// not touched); fp16 and fp32 ones (and grad null: zeros) per tile, each pool task widening its
// tile into `scratch` and updating it at once, so the widened values come back from cache.
// Afterwards `scratch` holds nothing specified. Errors: CpuAdamW's.
Status WidenedAdamW(ThreadPool* pool, const void* grad, DType grad_t, float* scratch, float* param, float* exp_avg,
                    float* exp_avg_sq, int64_t n, const AdamWParams& h, void* model_out, DType model_t,
                    const CpuAdamWOptions& options = {});
// memcpy of n elements of `t` (byte for byte), split over the pool.
void CopyElements(ThreadPool* pool, const void* src, DType t, void* dst, int64_t n);
// The sum of squares of n fp32 values in double, in CpuDevice::SumOfSquares' order (single-threaded:
// the order is fixed), so a host-side norm is bitwise the CPU backend's device norm.
double SumOfSquaresF32(const float* x, int64_t n);
// The sums of squares of several fp32 spans, out[i] bitwise SumOfSquaresF32(spans[i]) (the same
// blocks and combining order), with the blocks of all spans computed on `pool`'s threads in tasks of
// about 4M elements, so one large span (an embedding's piece) no longer runs on one thread.
struct F32Span {
  const float* data = nullptr;
  int64_t n = 0;
};
void SumsOfSquaresF32(ThreadPool* pool, const std::vector<F32Span>& spans, double* out);

}  // namespace zero
