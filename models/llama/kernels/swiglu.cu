// SwiGluForward and SwiGluBackward (kernels.cuh).

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include "models/llama/kernels.cuh"
#include "models/llama/kernels/common.cuh"
#include "runtime/dtype.h"

namespace zero::llm::kernels {

// ---- SwiGLU -----------------------------------------------------------------------------------

namespace {
__device__ __forceinline__ float Sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

template <int V>
__global__ void SwiGluForwardKernel(const void* g, const void* u, DType t, int64_t n, void* a) {
  for (int64_t i = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * V; i < n;
       i += int64_t(gridDim.x) * blockDim.x * V) {
    float gv[V], uv[V], av[V];
    LoadV<V>(g, t, i, gv);
    LoadV<V>(u, t, i, uv);
    for (int k = 0; k < V; ++k) av[k] = (gv[k] / (1.0f + expf(-gv[k]))) * uv[k];  // LlmCpu's silu
    StoreV<V>(a, t, i, av);
  }
}

template <int V>
__global__ void SwiGluBackwardKernel(const void* g, const void* u, DType t, const float* da, int64_t n, void* dg,
                                     void* du) {
  for (int64_t i = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * V; i < n;
       i += int64_t(gridDim.x) * blockDim.x * V) {
    float gv[V], uv[V], d[V], dgv[V], duv[V];
    LoadV<V>(g, t, i, gv);
    LoadV<V>(u, t, i, uv);
    LoadV<V>(da, DType::kF32, i, d);
    for (int k = 0; k < V; ++k) {
      const float s = Sigmoid(gv[k]);
      dgv[k] = d[k] * uv[k] * s * (1.0f + gv[k] * (1.0f - s));
      duv[k] = d[k] * gv[k] * s;
    }
    StoreV<V>(dg, t, i, dgv);
    StoreV<V>(du, t, i, duv);
  }
}
}  // namespace

Status SwiGluForward(const void* g, const void* u, DType t, int64_t n, void* a, cudaStream_t stream) {
  if (n <= 0) return OkStatus();
  if (n % 4 == 0 && VecOk(g, t) && VecOk(u, t) && VecOk(a, t)) {
    SwiGluForwardKernel<4><<<GridForVec(n, 4), kThreads, 0, stream>>>(g, u, t, n, a);
  } else {
    SwiGluForwardKernel<1><<<GridFor(n), kThreads, 0, stream>>>(g, u, t, n, a);
  }
  return LaunchStatus("SwiGluForwardKernel");
}

Status SwiGluBackward(const void* g, const void* u, DType t, const float* da, int64_t n, void* dg, void* du,
                      cudaStream_t stream) {
  if (n <= 0) return OkStatus();
  if (n % 4 == 0 && VecOk(g, t) && VecOk(u, t) && VecOk(da, DType::kF32) && VecOk(dg, t) && VecOk(du, t)) {
    SwiGluBackwardKernel<4><<<GridForVec(n, 4), kThreads, 0, stream>>>(g, u, t, da, n, dg, du);
  } else {
    SwiGluBackwardKernel<1><<<GridFor(n), kThreads, 0, stream>>>(g, u, t, da, n, dg, du);
  }
  return LaunchStatus("SwiGluBackwardKernel");
}

}  // namespace zero::llm::kernels
