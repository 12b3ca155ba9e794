// Convert (kernels.cuh): dtype conversion, a byte copy when the dtypes match.

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include "models/llama/kernels.cuh"
#include "models/llama/kernels/common.cuh"
#include "runtime/dtype.h"

namespace zero::llm::kernels {

// ---- Conversion -------------------------------------------------------------------------------

namespace {
template <int V>
__global__ void ConvertKernel(const void* src, DType st, void* dst, DType dt, int64_t n) {
  for (int64_t i = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * V; i < n;
       i += int64_t(gridDim.x) * blockDim.x * V) {
    float v[V];
    LoadV<V>(src, st, i, v);
    StoreV<V>(dst, dt, i, v);
  }
}
}  // namespace

Status Convert(const void* src, DType src_t, void* dst, DType dst_t, int64_t n, cudaStream_t stream) {
  if (n <= 0) return OkStatus();
  if (src_t == dst_t) {
    if (src == dst) return OkStatus();
    const cudaError_t e = cudaMemcpyAsync(dst, src, n * SizeOf(src_t), cudaMemcpyDeviceToDevice, stream);
    if (e != cudaSuccess) {
      cudaGetLastError();  // consumed here: the next launch check names its own launch
      return InternalError(std::string("cudaMemcpyAsync (Convert) of ") + std::to_string(n) +
                           " elements: " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
    }
    return OkStatus();
  }
  if (n % 4 == 0 && VecOk(src, src_t) && VecOk(dst, dst_t)) {
    ConvertKernel<4><<<GridForVec(n, 4), kThreads, 0, stream>>>(src, src_t, dst, dst_t, n);
  } else {
    ConvertKernel<1><<<GridFor(n), kThreads, 0, stream>>>(src, src_t, dst, dst_t, n);
  }
  return LaunchStatus("ConvertKernel");
}

}  // namespace zero::llm::kernels
