// Rope (kernels.cuh): the rotate-half rotation and its inverse, in place.

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include "models/llama/kernels.cuh"
#include "models/llama/kernels/common.cuh"
#include "runtime/dtype.h"

namespace zero::llm::kernels {

// ---- RoPE -------------------------------------------------------------------------------------

namespace {
// Thread i rotates the V pairs (k, k + half) .. (k + V - 1, k + V - 1 + half) of one row and head.
template <int V>
__global__ void RopeKernel(void* x, DType xt, int64_t rows, int seq, int heads, int head_dim, const float* cos_table,
                           const float* sin_table, int inverse) {
  const int half = head_dim / 2;
  const int64_t n = rows * heads * half;
  for (int64_t i = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * V; i < n;
       i += int64_t(gridDim.x) * blockDim.x * V) {
    const int64_t row_head = i / half;
    const int k = static_cast<int>(i - row_head * half);
    const int64_t t = (row_head / heads) % seq;
    const int64_t a = row_head * head_dim + k, b = a + half;
    float c[V], s[V], x0[V], x1[V], y0[V], y1[V];
    LoadV<V>(cos_table, DType::kF32, t * half + k, c);
    LoadV<V>(sin_table, DType::kF32, t * half + k, s);
    LoadV<V>(x, xt, a, x0);
    LoadV<V>(x, xt, b, x1);
    for (int j = 0; j < V; ++j) {
      if (!inverse) {
        y0[j] = x0[j] * c[j] - x1[j] * s[j];
        y1[j] = x1[j] * c[j] + x0[j] * s[j];
      } else {
        y0[j] = x0[j] * c[j] + x1[j] * s[j];
        y1[j] = x1[j] * c[j] - x0[j] * s[j];
      }
    }
    StoreV<V>(x, xt, a, y0);
    StoreV<V>(x, xt, b, y1);
  }
}
}  // namespace

Status Rope(void* x, DType x_t, int64_t rows, int seq, int heads, int head_dim, const float* cos_table,
            const float* sin_table, bool inverse, cudaStream_t stream) {
  if (rows <= 0 || heads <= 0 || head_dim < 2) return OkStatus();
  if (seq <= 0) return InvalidArgumentError("Rope: seq must be positive");
  const int64_t n = rows * heads * (head_dim / 2);
  if ((head_dim / 2) % 4 == 0 && VecOk(x, x_t) && VecOk(cos_table, DType::kF32) && VecOk(sin_table, DType::kF32)) {
    RopeKernel<4><<<GridForVec(n, 4), kThreads, 0, stream>>>(x, x_t, rows, seq, heads, head_dim, cos_table, sin_table,
                                                             inverse ? 1 : 0);
  } else {
    RopeKernel<1><<<GridFor(n), kThreads, 0, stream>>>(x, x_t, rows, seq, heads, head_dim, cos_table, sin_table,
                                                       inverse ? 1 : 0);
  }
  return LaunchStatus("RopeKernel");
}

}  // namespace zero::llm::kernels
