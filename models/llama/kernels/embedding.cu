// EmbeddingForward and EmbeddingBackward (kernels.cuh): the token-table lookup and its per-row
// gradient sum.

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include "models/llama/kernels.cuh"
#include "models/llama/kernels/common.cuh"
#include "runtime/dtype.h"

namespace zero::llm::kernels {

// ---- Embedding --------------------------------------------------------------------------------

namespace {
__global__ void EmbeddingForwardKernel(const int32_t* ids, int64_t rows, int64_t hidden, const void* table, DType tt,
                                       float* out) {
  const int64_t n = rows * hidden;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / hidden, c = i - row * hidden;
    out[i] = LoadAsFloat(table, tt, int64_t(ids[row]) * hidden + c);
  }
}

// Block u owns vocabulary row unique_ids[u]; thread c of block column y owns column y * 256 + c.
__global__ void EmbeddingBackwardKernel(const int32_t* positions, const int32_t* unique_ids, const int32_t* starts,
                                        int64_t hidden, const float* dh, int accumulate, void* grad, DType gt) {
  const int64_t u = blockIdx.x;
  const int64_t c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= hidden) return;
  const int64_t at = int64_t(unique_ids[u]) * hidden + c;
  float acc = accumulate ? LoadAsFloat(grad, gt, at) : 0.0f;
  const int32_t end = starts[u + 1];
  for (int32_t p = starts[u]; p < end; ++p) acc += dh[int64_t(positions[p]) * hidden + c];
  StoreFromFloat(grad, gt, at, acc);
}
}  // namespace

Status EmbeddingForward(const int32_t* ids, int64_t rows, int64_t hidden, const void* table, DType table_t, float* out,
                        cudaStream_t stream) {
  if (rows <= 0 || hidden <= 0) return OkStatus();
  EmbeddingForwardKernel<<<GridFor(rows * hidden), kThreads, 0, stream>>>(ids, rows, hidden, table, table_t, out);
  return LaunchStatus("EmbeddingForwardKernel");
}

Status EmbeddingBackward(const int32_t* positions, const int32_t* unique_ids, const int32_t* starts, int64_t num_unique,
                         int64_t hidden, const float* dh, bool accumulate, void* grad, DType grad_t,
                         cudaStream_t stream) {
  if (num_unique <= 0 || hidden <= 0) return OkStatus();
  if (num_unique > 0x7fffffff || (hidden + kThreads - 1) / kThreads > 65535) {
    return InvalidArgumentError("EmbeddingBackward: " + std::to_string(num_unique) + " rows of width " +
                                std::to_string(hidden) + " exceed the grid");
  }
  const dim3 grid(static_cast<unsigned>(num_unique), static_cast<unsigned>((hidden + kThreads - 1) / kThreads));
  EmbeddingBackwardKernel<<<grid, kThreads, 0, stream>>>(positions, unique_ids, starts, hidden, dh, accumulate ? 1 : 0,
                                                         grad, grad_t);
  return LaunchStatus("EmbeddingBackwardKernel");
}

}  // namespace zero::llm::kernels
