// Helpers shared by the transformer's kernel files (models/llama/kernels/*.cu): the launch check,
// grid sizes, warp reductions and the vectorized loads and stores. Internal to the kernels target:
// included only by those .cu files, never by kernels.cuh's callers.
//
// Memory-bound kernels read and write through dtype.h's LoadAsFloat/StoreFromFloat (a switch on a
// uniform dtype, negligible beside the memory traffic) so the 16-bit roundings are the CPU
// model's bit for bit; LoadV/StoreV below give the same values 4 elements at a time.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "runtime/dtype.h"
#include "runtime/status.h"

namespace zero::llm::kernels {

constexpr int kThreads = 256;
constexpr unsigned kFullMask = 0xffffffffu;
// Rows per block of the one-warp-per-row kernels (RMSNorm, the attention backward's delta).
constexpr int kRowWarps = 8;

inline Status LaunchStatus(const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return OkStatus();
  return InternalError(std::string("CUDA launch of ") + kernel + ": " + cudaGetErrorName(e) + ": " +
                       cudaGetErrorString(e));
}

// Grid-stride loops cover any n; more blocks than this only adds scheduling.
inline unsigned GridFor(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(blocks, 1), 65535 * 8));
}

__device__ __forceinline__ float WarpSum(float v) {
  // Butterfly: every lane adds the same pairs (a + b == b + a), so all lanes end with one value.
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// V consecutive elements i .. i+V-1 of a buffer of dtype t, as floats (V = 1, or 4 with one 16-byte
// fp32 or 8-byte bf16 access). REQUIRES for V = 4: i % 4 == 0 and the buffer aligned to 4 elements
// (VecOk). fp16 goes element by element. The values and roundings are LoadAsFloat/StoreFromFloat's.
template <int V>
__device__ __forceinline__ void LoadV(const void* p, DType t, int64_t i, float* v) {
  if constexpr (V == 4) {
    if (t == DType::kF32) {
      const float4 x = *reinterpret_cast<const float4*>(static_cast<const float*>(p) + i);
      v[0] = x.x;
      v[1] = x.y;
      v[2] = x.z;
      v[3] = x.w;
      return;
    }
    if (t == DType::kBF16) {
      const uint2 x = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(p) + i);
      v[0] = Bf16ToFloat(static_cast<uint16_t>(x.x & 0xffffu));
      v[1] = Bf16ToFloat(static_cast<uint16_t>(x.x >> 16));
      v[2] = Bf16ToFloat(static_cast<uint16_t>(x.y & 0xffffu));
      v[3] = Bf16ToFloat(static_cast<uint16_t>(x.y >> 16));
      return;
    }
  }
  for (int k = 0; k < V; ++k) v[k] = LoadAsFloat(p, t, i + k);
}

template <int V>
__device__ __forceinline__ void StoreV(void* p, DType t, int64_t i, const float* v) {
  if constexpr (V == 4) {
    if (t == DType::kF32) {
      *reinterpret_cast<float4*>(static_cast<float*>(p) + i) = make_float4(v[0], v[1], v[2], v[3]);
      return;
    }
    if (t == DType::kBF16) {
      uint2 x;
      x.x = uint32_t(FloatToBf16(v[0])) | (uint32_t(FloatToBf16(v[1])) << 16);
      x.y = uint32_t(FloatToBf16(v[2])) | (uint32_t(FloatToBf16(v[3])) << 16);
      *reinterpret_cast<uint2*>(static_cast<uint16_t*>(p) + i) = x;
      return;
    }
  }
  for (int k = 0; k < V; ++k) StoreFromFloat(p, t, i + k, v[k]);
}

// Whether a buffer of dtype t can be accessed 4 elements at a time.
inline bool VecOk(const void* p, DType t) { return reinterpret_cast<uintptr_t>(p) % (4 * SizeOf(t)) == 0; }

// Grid for n / V vectors.
inline unsigned GridForVec(int64_t n, int v) { return GridFor((n + v - 1) / v); }

}  // namespace zero::llm::kernels
