// RmsNormForward, RmsNormBackward and RmsNormWeightGrad (kernels.cuh): one warp per row, and the
// weight gradient's fixed-order column reduction.

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include "models/llama/kernels.cuh"
#include "models/llama/kernels/common.cuh"
#include "runtime/dtype.h"

namespace zero::llm::kernels {

// ---- RMSNorm: one warp per row ----------------------------------------------------------------

namespace {

template <int V>
__global__ void RmsNormForwardKernel(const void* x, DType xt, const void* w, DType wt, int64_t rows, int cols,
                                     float eps, void* y, DType yt, float* rstd) {
  const int64_t row = int64_t(blockIdx.x) * kRowWarps + threadIdx.y;
  if (row >= rows) return;
  const int64_t base = row * cols;
  float ss = 0.0f;
  for (int c = threadIdx.x * V; c < cols; c += 32 * V) {
    float v[V];
    LoadV<V>(x, xt, base + c, v);
    for (int k = 0; k < V; ++k) ss += v[k] * v[k];
  }
  ss = WarpSum(ss);
  const float r = 1.0f / sqrtf(ss / float(cols) + eps);
  for (int c = threadIdx.x * V; c < cols; c += 32 * V) {
    float v[V], wv[V], out[V];
    LoadV<V>(x, xt, base + c, v);
    LoadV<V>(w, wt, c, wv);
    for (int k = 0; k < V; ++k) out[k] = (v[k] * r) * wv[k];
    StoreV<V>(y, yt, base + c, out);
  }
  if (threadIdx.x == 0) rstd[row] = r;
}

template <int V>
__global__ void RmsNormBackwardKernel(const void* x, DType xt, const float* rstd, const void* w, DType wt,
                                      const void* dy, DType dyt, int64_t rows, int cols, int accumulate, void* dx,
                                      DType dxt, void* dx_copy, DType dx_copy_t) {
  const int64_t row = int64_t(blockIdx.x) * kRowWarps + threadIdx.y;
  if (row >= rows) return;
  const int64_t base = row * cols;
  const float r = rstd[row];
  float dot = 0.0f;
  for (int c = threadIdx.x * V; c < cols; c += 32 * V) {
    float dv[V], wv[V], xv[V];
    LoadV<V>(dy, dyt, base + c, dv);
    LoadV<V>(w, wt, c, wv);
    LoadV<V>(x, xt, base + c, xv);
    for (int k = 0; k < V; ++k) dot += (dv[k] * wv[k]) * (xv[k] * r);
  }
  const float mean = WarpSum(dot) / float(cols);
  for (int c = threadIdx.x * V; c < cols; c += 32 * V) {
    float dv[V], wv[V], xv[V], out[V];
    LoadV<V>(dy, dyt, base + c, dv);
    LoadV<V>(w, wt, c, wv);
    LoadV<V>(x, xt, base + c, xv);
    if (accumulate) LoadV<V>(dx, dxt, base + c, out);
    for (int k = 0; k < V; ++k) {
      const float g = dv[k] * wv[k];
      const float xhat = xv[k] * r;
      const float v = r * (g - xhat * mean);
      out[k] = accumulate ? out[k] + v : v;
    }
    StoreV<V>(dx, dxt, base + c, out);
    if (dx_copy != nullptr) StoreV<V>(dx_copy, dx_copy_t, base + c, out);
  }
}

// Column reductions: blocks of 32 columns x 8 row groups over a chunk of rows.
constexpr int kColTile = 32, kRowGroups = 8;

int64_t ChunkRows(int64_t rows) {
  // At least 256 rows a chunk, and few enough chunks for gridDim.y (65535).
  int64_t chunk = std::max<int64_t>(256, (rows + 65534) / 65535);
  return (chunk + kRowGroups - 1) / kRowGroups * kRowGroups;
}

// Thread x of a block owns columns (blockIdx.x * kColTile + x) * V .. + V - 1.
template <int V>
__global__ void RmsNormWeightPartialKernel(const void* x, DType xt, const float* rstd, const void* dy, DType dyt,
                                           int64_t rows, int cols, int64_t chunk_rows, float* partial) {
  __shared__ float part[kRowGroups][kColTile * V];
  const int c = (blockIdx.x * kColTile + threadIdx.x) * V;
  const int64_t r0 = int64_t(blockIdx.y) * chunk_rows;
  const int64_t r1 = std::min(rows, r0 + chunk_rows);
  float acc[V];
  for (int k = 0; k < V; ++k) acc[k] = 0.0f;
  if (c < cols) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowGroups) {
      const int64_t at = r * cols + c;
      float dv[V], xv[V];
      LoadV<V>(dy, dyt, at, dv);
      LoadV<V>(x, xt, at, xv);
      const float rr = rstd[r];
      for (int k = 0; k < V; ++k) acc[k] += dv[k] * (xv[k] * rr);
    }
  }
  for (int k = 0; k < V; ++k) part[threadIdx.y][threadIdx.x * V + k] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    for (int k = 0; k < V; ++k) {
      float s = 0.0f;
      for (int g = 0; g < kRowGroups; ++g) s += part[g][threadIdx.x * V + k];
      partial[int64_t(blockIdx.y) * cols + c + k] = s;
    }
  }
}

__global__ void ColumnFinishKernel(const float* partial, int64_t chunks, int cols, void* out, DType ot) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float s = 0.0f;
  for (int64_t k = 0; k < chunks; ++k) s += partial[k * cols + c];
  StoreFromFloat(out, ot, c, s);
}
}  // namespace

Status RmsNormForward(const void* x, DType x_t, const void* w, DType w_t, int64_t rows, int cols, float eps, void* y,
                      DType y_t, float* rstd, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return OkStatus();
  const dim3 block(32, kRowWarps);
  const unsigned grid = static_cast<unsigned>((rows + kRowWarps - 1) / kRowWarps);
  if (cols % 4 == 0 && VecOk(x, x_t) && VecOk(w, w_t) && VecOk(y, y_t)) {
    RmsNormForwardKernel<4><<<grid, block, 0, stream>>>(x, x_t, w, w_t, rows, cols, eps, y, y_t, rstd);
  } else {
    RmsNormForwardKernel<1><<<grid, block, 0, stream>>>(x, x_t, w, w_t, rows, cols, eps, y, y_t, rstd);
  }
  return LaunchStatus("RmsNormForwardKernel");
}

Status RmsNormBackward(const void* x, DType x_t, const float* rstd, const void* w, DType w_t, const void* dy,
                       DType dy_t, int64_t rows, int cols, bool accumulate, void* dx, DType dx_t, cudaStream_t stream,
                       void* dx_copy, DType dx_copy_t) {
  if (rows <= 0 || cols <= 0) return OkStatus();
  const dim3 block(32, kRowWarps);
  const unsigned grid = static_cast<unsigned>((rows + kRowWarps - 1) / kRowWarps);
  if (cols % 4 == 0 && VecOk(x, x_t) && VecOk(w, w_t) && VecOk(dy, dy_t) && VecOk(dx, dx_t) &&
      (dx_copy == nullptr || VecOk(dx_copy, dx_copy_t))) {
    RmsNormBackwardKernel<4><<<grid, block, 0, stream>>>(x, x_t, rstd, w, w_t, dy, dy_t, rows, cols, accumulate ? 1 : 0,
                                                         dx, dx_t, dx_copy, dx_copy_t);
  } else {
    RmsNormBackwardKernel<1><<<grid, block, 0, stream>>>(x, x_t, rstd, w, w_t, dy, dy_t, rows, cols, accumulate ? 1 : 0,
                                                         dx, dx_t, dx_copy, dx_copy_t);
  }
  return LaunchStatus("RmsNormBackwardKernel");
}

int64_t RmsNormWeightGradScratch(int64_t rows, int cols) {
  const int64_t chunk = ChunkRows(rows);
  return std::max<int64_t>(1, (rows + chunk - 1) / chunk) * cols;
}

Status RmsNormWeightGrad(const void* x, DType x_t, const float* rstd, const void* dy, DType dy_t, int64_t rows,
                         int cols, float* partial, void* dw, DType dw_t, cudaStream_t stream) {
  if (cols <= 0) return OkStatus();
  const int64_t chunk = ChunkRows(rows);
  const int64_t chunks = std::max<int64_t>(1, (rows + chunk - 1) / chunk);
  const dim3 block(kColTile, kRowGroups);
  if (cols % 4 == 0 && VecOk(x, x_t) && VecOk(dy, dy_t)) {
    const dim3 grid((cols + 4 * kColTile - 1) / (4 * kColTile), static_cast<unsigned>(chunks));
    RmsNormWeightPartialKernel<4>
        <<<grid, block, 0, stream>>>(x, x_t, rstd, dy, dy_t, std::max<int64_t>(rows, 0), cols, chunk, partial);
  } else {
    const dim3 grid((cols + kColTile - 1) / kColTile, static_cast<unsigned>(chunks));
    RmsNormWeightPartialKernel<1>
        <<<grid, block, 0, stream>>>(x, x_t, rstd, dy, dy_t, std::max<int64_t>(rows, 0), cols, chunk, partial);
  }
  ZERO_RETURN_IF_ERROR(LaunchStatus("RmsNormWeightPartialKernel"));
  ColumnFinishKernel<<<(cols + kThreads - 1) / kThreads, kThreads, 0, stream>>>(partial, chunks, cols, dw, dw_t);
  return LaunchStatus("ColumnFinishKernel");
}

}  // namespace zero::llm::kernels
