// The same-device communicator's reduction kernel (contract in same_device_kernels.h).
#include <algorithm>
#include <cstdint>

#include "comm/same_device_kernels.h"

namespace zero {
namespace same_device_kernels {
namespace {

constexpr int kThreads = 256;

struct F32 {
  using T = float;
  static __device__ __forceinline__ float Load(float x) { return x; }
  static __device__ __forceinline__ float Store(float v) { return v; }
};
struct BF16 {
  using T = uint16_t;
  static __device__ __forceinline__ float Load(uint16_t h) { return Bf16ToFloat(h); }
  static __device__ __forceinline__ uint16_t Store(float v) { return FloatToBf16(v); }
};
struct F16 {
  using T = uint16_t;
  static __device__ __forceinline__ float Load(uint16_t h) { return HalfToFloat(h); }
  static __device__ __forceinline__ uint16_t Store(float v) { return FloatToHalf(v); }
};

// The arguments travel by value (the source pointers are a fixed array in them).
template <typename D>
__global__ void __launch_bounds__(kThreads) RankReduceKernel(RankReduceArgs a) {
  using T = typename D::T;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  T* out = static_cast<T*>(a.out);
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < a.count; i += stride) {
    float acc = D::Load(static_cast<const T*>(a.srcs[0])[i]);
    for (int k = 1; k < a.n_srcs; ++k) acc = RankCombine(acc, D::Load(static_cast<const T*>(a.srcs[k])[i]), a.op);
    out[i] = D::Store(RankFinish(acc, a.op, a.n_srcs));
  }
}

template <typename D>
cudaError_t Launch(const RankReduceArgs& a, cudaStream_t stream, int max_blocks) {
  const size_t want = (a.count + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(std::min<size_t>(want, static_cast<size_t>(std::max(max_blocks, 1))));
  RankReduceKernel<D><<<blocks, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t RankReduce(const RankReduceArgs& args, cudaStream_t stream, int max_blocks) {
  if (args.count == 0 || args.n_srcs < 1) return cudaSuccess;
  switch (args.dtype) {
    case DType::kF32:
      return Launch<F32>(args, stream, max_blocks);
    case DType::kBF16:
      return Launch<BF16>(args, stream, max_blocks);
    case DType::kF16:
      return Launch<F16>(args, stream, max_blocks);
  }
  return cudaErrorInvalidValue;
}

}  // namespace same_device_kernels
}  // namespace zero
