// CrossEntropy and SumToDouble (kernels.cuh): the loss over the vocabulary with its logit gradient,
// and the fixed-order sum of the per-row losses.

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include "models/llama/kernels.cuh"
#include "models/llama/kernels/common.cuh"
#include "runtime/dtype.h"

namespace zero::llm::kernels {

namespace {

// Sum / max over a block of kThreads threads; every thread gets the result, added in warp order.
// `sh` holds kThreads / 32 floats; the trailing barrier lets the caller reuse it at once.
__device__ float BlockSum(float v, float* sh) {
  v = WarpSum(v);
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) s += sh[w];
  __syncthreads();
  return s;
}

__device__ float BlockMax(float v, float* sh) {
  v = WarpMax(v);
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  float m = sh[0];
  for (int w = 1; w < kThreads / 32; ++w) m = fmaxf(m, sh[w]);
  __syncthreads();
  return m;
}

}  // namespace

// ---- Cross-entropy ----------------------------------------------------------------------------

namespace {
// One block of kThreads per row.
__global__ void __launch_bounds__(kThreads)
    CrossEntropyKernel(const float* logits, const int32_t* targets, int64_t vocab, float coef, float* row_loss,
                       void* dlogits, DType dt) {
  __shared__ float sh[kThreads / 32];
  const int64_t row = blockIdx.x;
  const float* x = logits + row * vocab;
  const int32_t target = targets[row];
  if (target < 0) {  // ignored: no loss, no gradient (uniform across the block)
    if (threadIdx.x == 0) row_loss[row] = 0.0f;
    if (dlogits != nullptr) {
      for (int64_t i = threadIdx.x; i < vocab; i += kThreads) StoreFromFloat(dlogits, dt, row * vocab + i, 0.0f);
    }
    return;
  }
  // One pass for the max and the sum of exponentials (online softmax): each thread keeps its
  // running max m and sum s of exp(x - m), rescaling s when m grows; the block then rescales every
  // thread's s to the row's max and sums them. The row is read twice in all (here and for dlogits)
  // instead of three times: the logits of a 151,936-entry vocabulary are 0.6 MB a row in fp32.
  float m = -INFINITY, sum = 0.0f;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float v = x[i];
    if (v > m) {
      sum = sum * expf(m - v) + 1.0f;
      m = v;
    } else {
      sum += expf(v - m);
    }
  }
  const float mx = BlockMax(m, sh);
  sum = BlockSum(m == -INFINITY ? 0.0f : sum * expf(m - mx), sh);
  const float lse = mx + logf(sum);
  if (threadIdx.x == 0) row_loss[row] = lse - x[target];
  if (dlogits != nullptr) {
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      // LlmCpu's order: p * coef, then coef subtracted at the target.
      const float g = expf(x[i] - lse) * coef;
      StoreFromFloat(dlogits, dt, row * vocab + i, i == target ? g - coef : g);
    }
  }
}

__global__ void SumToDoubleKernel(const float* x, int64_t n, double* out) {
  __shared__ double sh[kThreads];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) s += double(x[i]);
  sh[threadIdx.x] = s;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = sh[0];
}
}  // namespace

Status CrossEntropy(const float* logits, const int32_t* targets, int64_t rows, int64_t vocab, float coef,
                    float* row_loss, void* dlogits, DType dlogits_t, cudaStream_t stream) {
  if (rows <= 0) return OkStatus();
  if (rows > 0x7fffffff) return InvalidArgumentError("CrossEntropy: too many rows: " + std::to_string(rows));
  CrossEntropyKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, targets, vocab, coef, row_loss,
                                                                           dlogits, dlogits_t);
  return LaunchStatus("CrossEntropyKernel");
}

Status SumToDouble(const float* x, int64_t n, double* out, cudaStream_t stream) {
  SumToDoubleKernel<<<1, kThreads, 0, stream>>>(x, std::max<int64_t>(n, 0), out);
  return LaunchStatus("SumToDoubleKernel");
}

}  // namespace zero::llm::kernels
