// AttentionForward and AttentionBackward (kernels.cuh): flash-style causal attention, templates
// on the element type; the backward recomputes the scores tile by tile.

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

bool ActivationDType(DType t) { return t == DType::kF32 || t == DType::kBF16; }

Status NeedActivationDType(DType t, const char* what) {
  if (ActivationDType(t)) return OkStatus();
  return InvalidArgumentError(std::string(what) + ": dtype " + DTypeName(t) + ", expected fp32 or bf16");
}

// Element types of the templated kernels.
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

}  // namespace

// ---- Causal attention -------------------------------------------------------------------------
//
// Tiles of kTile query rows and kTile keys. A block has kAttnWarps warps; each owns kRowsPerWarp
// rows of its tile (query rows in the forward and dq kernels, key rows in the dk/dv kernel). The
// scores of one row against a tile are computed one per lane; the weighted sums over the tile
// run with the lanes over head_dim (kChunks = ceil(head_dim / 32) registers per row), the
// per-lane weight broadcast by shuffles. Shared tiles are fp32 rows of head_dim + 1 floats: the
// padding puts lane j's row j in bank (j * (hd + 1) + d) % 32, conflict-free for an even hd.
// Scores are dot products over d in increasing d, times scale, identical in all three kernels, so
// the backward's recomputed probabilities match the forward's log-sum-exp.

namespace {
constexpr int kTile = 32;
constexpr int kAttnWarps = 4;
constexpr int kRowsPerWarp = kTile / kAttnWarps;

size_t AttnSharedBytes(int tiles, int head_dim, int extra_floats) {
  return (size_t(tiles) * kTile * (head_dim + 1) + extra_floats) * sizeof(float);
}

template <class E>
__device__ __forceinline__ void LoadTile(float* dst, const typename E::T* src, int64_t row0, int first, int seq,
                                         int64_t row_stride, int64_t col0, int hd) {
  const int ld = hd + 1;
  for (int i = threadIdx.x; i < kTile * hd; i += blockDim.x) {
    const int r = i / hd, d = i - r * hd;
    const int t = first + r;
    dst[r * ld + d] = t < seq ? E::Load(src[(row0 + t) * row_stride + col0 + d]) : 0.0f;
  }
}

template <class E, int kChunks>
__global__ void __launch_bounds__(kAttnWarps * 32)
    AttnForwardKernel(const typename E::T* q, const typename E::T* k, const typename E::T* v, int seq, int nh, int nkv,
                      int hd, float scale, typename E::T* o, float* lse) {
  extern __shared__ float smem[];
  const int ld = hd + 1;
  float* sq = smem;
  float* sk = sq + kTile * ld;
  float* sv = sk + kTile * ld;
  const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * kTile;
  const int kvh = h / (nh / nkv);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t qs = int64_t(nh) * hd, ks = int64_t(nkv) * hd;
  const int64_t row0 = int64_t(b) * seq;
  LoadTile<E>(sq, q, row0, q0, seq, qs, int64_t(h) * hd, hd);

  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kChunks];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) acc[rr][c] = 0.0f;
  }
  const int q_last = min(q0 + kTile, seq) - 1;
  // Tiles start at multiples of kTile, so every key tile visited holds key k0 <= q0 <= t for each
  // row t of this tile: every row's running max is finite after the first tile.
  for (int k0 = 0; k0 <= q_last; k0 += kTile) {
    __syncthreads();  // the previous tile's readers are done (and sq is written, first time)
    LoadTile<E>(sk, k, row0, k0, seq, ks, int64_t(kvh) * hd, hd);
    LoadTile<E>(sv, v, row0, k0, seq, ks, int64_t(kvh) * hd, hd);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr;
      const int t = q0 + r;
      if (t >= seq) continue;  // uniform across the warp
      const int key = k0 + lane;
      const bool valid = key <= t;
      float s = -INFINITY;
      if (valid) {
        float dot = 0.0f;
        for (int d = 0; d < hd; ++d) dot += sq[r * ld + d] * sk[lane * ld + d];
        s = dot * scale;
      }
      const float m_new = fmaxf(m[rr], WarpMax(s));
      const float p = valid ? expf(s - m_new) : 0.0f;
      const float alpha = expf(m[rr] - m_new);  // 0 on the first tile (m = -inf)
      l[rr] = l[rr] * alpha + WarpSum(p);
#pragma unroll
      for (int c = 0; c < kChunks; ++c) acc[rr][c] *= alpha;
        // Partly unrolled: full unrolling inside the unrolled row loop spills the accumulators.
#pragma unroll 4
      for (int j = 0; j < kTile; ++j) {
        const float pj = __shfl_sync(kFullMask, p, j);
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          const int d = c * 32 + lane;
          if (d < hd) acc[rr][c] += pj * sv[j * ld + d];
        }
      }
      m[rr] = m_new;
    }
  }
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int t = q0 + warp * kRowsPerWarp + rr;
    if (t >= seq) continue;
    const int64_t base = (row0 + t) * qs + int64_t(h) * hd;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int d = c * 32 + lane;
      if (d < hd) o[base + d] = E::Store(acc[rr][c] / l[rr]);
    }
    if (lane == 0) lse[(int64_t(b) * nh + h) * seq + t] = m[rr] + logf(l[rr]);
  }
}

// delta[b, h, t] = sum_d dout * o: one warp per (row, head).
template <class E>
__global__ void AttnDeltaKernel(const typename E::T* o, const typename E::T* dout, int64_t rows, int seq, int nh,
                                int hd, float* delta) {
  const int64_t idx = int64_t(blockIdx.x) * kRowWarps + threadIdx.y;  // = row * nh + head
  if (idx >= rows * nh) return;
  const int64_t base = idx * hd;
  float s = 0.0f;
  for (int d = threadIdx.x; d < hd; d += 32) s += E::Load(dout[base + d]) * E::Load(o[base + d]);
  s = WarpSum(s);
  if (threadIdx.x == 0) {
    const int64_t row = idx / nh;
    const int h = static_cast<int>(idx - row * nh);
    const int64_t b = row / seq, t = row - b * seq;
    delta[(b * nh + h) * seq + t] = s;
  }
}

// dq = scale * sum over keys of ds * k, ds = p * (dp - delta), p = exp(s - lse), dp = dout . v.
template <class E, int kChunks>
__global__ void __launch_bounds__(kAttnWarps * 32)
    AttnBackwardDqKernel(const typename E::T* q, const typename E::T* k, const typename E::T* v,
                         const typename E::T* dout, const float* lse, const float* delta, int seq, int nh, int nkv,
                         int hd, float scale, float* dq) {
  extern __shared__ float smem[];
  const int ld = hd + 1;
  float* sq = smem;
  float* sdo = sq + kTile * ld;
  float* sk = sdo + kTile * ld;
  float* sv = sk + kTile * ld;
  const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * kTile;
  const int kvh = h / (nh / nkv);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t qs = int64_t(nh) * hd, ks = int64_t(nkv) * hd;
  const int64_t row0 = int64_t(b) * seq;
  const int64_t stat0 = (int64_t(b) * nh + h) * seq;
  LoadTile<E>(sq, q, row0, q0, seq, qs, int64_t(h) * hd, hd);
  LoadTile<E>(sdo, dout, row0, q0, seq, qs, int64_t(h) * hd, hd);

  float row_lse[kRowsPerWarp], row_delta[kRowsPerWarp], acc[kRowsPerWarp][kChunks];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int t = q0 + warp * kRowsPerWarp + rr;
    row_lse[rr] = t < seq ? lse[stat0 + t] : 0.0f;
    row_delta[rr] = t < seq ? delta[stat0 + t] : 0.0f;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) acc[rr][c] = 0.0f;
  }
  const int q_last = min(q0 + kTile, seq) - 1;
  for (int k0 = 0; k0 <= q_last; k0 += kTile) {
    __syncthreads();
    LoadTile<E>(sk, k, row0, k0, seq, ks, int64_t(kvh) * hd, hd);
    LoadTile<E>(sv, v, row0, k0, seq, ks, int64_t(kvh) * hd, hd);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr;
      const int t = q0 + r;
      if (t >= seq) continue;
      const int key = k0 + lane;
      float ds = 0.0f;
      if (key <= t) {
        float dot = 0.0f, dp = 0.0f;
        for (int d = 0; d < hd; ++d) {
          dot += sq[r * ld + d] * sk[lane * ld + d];
          dp += sdo[r * ld + d] * sv[lane * ld + d];
        }
        const float p = expf(dot * scale - row_lse[rr]);
        ds = p * (dp - row_delta[rr]);
      }
      // Partly unrolled: full unrolling inside the unrolled row loop spills the accumulators.
#pragma unroll 4
      for (int j = 0; j < kTile; ++j) {
        const float dsj = __shfl_sync(kFullMask, ds, j);
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          const int d = c * 32 + lane;
          if (d < hd) acc[rr][c] += dsj * sk[j * ld + d];
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int t = q0 + warp * kRowsPerWarp + rr;
    if (t >= seq) continue;
    const int64_t base = (row0 + t) * qs + int64_t(h) * hd;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int d = c * 32 + lane;
      if (d < hd) dq[base + d] = acc[rr][c] * scale;
    }
  }
}

// Per key tile: dv = sum over (q head of the group, query) of p * dout, dk = scale * sum of ds * q;
// heads in increasing order, queries in increasing order, all in this block's registers.
template <class E, int kChunks>
__global__ void __launch_bounds__(kAttnWarps * 32)
    AttnBackwardDkvKernel(const typename E::T* q, const typename E::T* k, const typename E::T* v,
                          const typename E::T* dout, const float* lse, const float* delta, int seq, int nh, int nkv,
                          int hd, float scale, float* dk, float* dv) {
  extern __shared__ float smem[];
  const int ld = hd + 1;
  float* sk = smem;
  float* sv = sk + kTile * ld;
  float* sq = sv + kTile * ld;
  float* sdo = sq + kTile * ld;
  float* slse = sdo + kTile * ld;
  float* sdelta = slse + kTile;
  const int b = blockIdx.z, kvh = blockIdx.y, k0 = blockIdx.x * kTile;
  const int group = nh / nkv;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t qs = int64_t(nh) * hd, ks = int64_t(nkv) * hd;
  const int64_t row0 = int64_t(b) * seq;
  LoadTile<E>(sk, k, row0, k0, seq, ks, int64_t(kvh) * hd, hd);
  LoadTile<E>(sv, v, row0, k0, seq, ks, int64_t(kvh) * hd, hd);

  float acc_k[kRowsPerWarp][kChunks], acc_v[kRowsPerWarp][kChunks];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) acc_k[rr][c] = acc_v[rr][c] = 0.0f;
  }
  for (int g = 0; g < group; ++g) {
    const int h = kvh * group + g;
    const int64_t stat0 = (int64_t(b) * nh + h) * seq;
    // Queries before k0 see none of these keys (causal).
    for (int q0 = k0; q0 < seq; q0 += kTile) {
      __syncthreads();
      LoadTile<E>(sq, q, row0, q0, seq, qs, int64_t(h) * hd, hd);
      LoadTile<E>(sdo, dout, row0, q0, seq, qs, int64_t(h) * hd, hd);
      if (threadIdx.x < kTile) {
        const int t = q0 + threadIdx.x;
        slse[threadIdx.x] = t < seq ? lse[stat0 + t] : 0.0f;
        sdelta[threadIdx.x] = t < seq ? delta[stat0 + t] : 0.0f;
      }
      __syncthreads();
#pragma unroll
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        const int j = warp * kRowsPerWarp + rr;
        const int key = k0 + j;
        if (key >= seq) continue;
        const int t = q0 + lane;
        float p = 0.0f, ds = 0.0f;
        if (t < seq && t >= key) {
          float dot = 0.0f, dp = 0.0f;
          for (int d = 0; d < hd; ++d) {
            dot += sq[lane * ld + d] * sk[j * ld + d];
            dp += sdo[lane * ld + d] * sv[j * ld + d];
          }
          p = expf(dot * scale - slse[lane]);
          ds = p * (dp - sdelta[lane]);
        }
#pragma unroll 4
        for (int i = 0; i < kTile; ++i) {
          const float pi = __shfl_sync(kFullMask, p, i);
          const float dsi = __shfl_sync(kFullMask, ds, i);
#pragma unroll
          for (int c = 0; c < kChunks; ++c) {
            const int d = c * 32 + lane;
            if (d < hd) {
              acc_v[rr][c] += pi * sdo[i * ld + d];
              acc_k[rr][c] += dsi * sq[i * ld + d];
            }
          }
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int key = k0 + warp * kRowsPerWarp + rr;
    if (key >= seq) continue;
    const int64_t base = (row0 + key) * ks + int64_t(kvh) * hd;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int d = c * 32 + lane;
      if (d < hd) {
        dk[base + d] = acc_k[rr][c] * scale;
        dv[base + d] = acc_v[rr][c];
      }
    }
  }
}

Status CheckAttentionShape(const char* what, DType t, int batch, int seq, int nh, int nkv, int head_dim) {
  ZERO_RETURN_IF_ERROR(NeedActivationDType(t, what));
  if (batch < 1 || seq < 1 || nh < 1 || nkv < 1 || nh % nkv != 0 || head_dim < 1 || head_dim > kMaxHeadDim ||
      batch > 65535 || nh > 65535) {
    return InvalidArgumentError(
        std::string(what) + ": unsupported shape batch=" + std::to_string(batch) + " seq=" + std::to_string(seq) +
        " heads=" + std::to_string(nh) + "/" + std::to_string(nkv) + " head_dim=" + std::to_string(head_dim) +
        " (needs heads % kv_heads == 0, head_dim <= " + std::to_string(kMaxHeadDim) + ", batch and heads <= 65535)");
  }
  return OkStatus();
}

// Calls f(std::integral_constant<int, kChunks>{}) with kChunks = ceil(head_dim / 32) rounded up to
// a power of two (lanes past head_dim idle): four instantiations per kernel and dtype, not eight.
template <class F>
Status WithChunks(int head_dim, F&& f) {
  const int need = (head_dim + 31) / 32;
  if (need <= 1) return f(std::integral_constant<int, 1>{});
  if (need <= 2) return f(std::integral_constant<int, 2>{});
  if (need <= 4) return f(std::integral_constant<int, 4>{});
  return f(std::integral_constant<int, 8>{});
}

template <class Kernel>
Status SetSharedBytes(Kernel kernel, size_t bytes, const char* name) {
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (e != cudaSuccess) {
    cudaGetLastError();
    return InternalError(std::string("cudaFuncSetAttribute(") + name + ", " + std::to_string(bytes) +
                         " bytes of shared memory): " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
  }
  return OkStatus();
}

template <class E>
Status AttentionForwardT(const void* q, const void* k, const void* v, int batch, int seq, int nh, int nkv, int head_dim,
                         float scale, void* o, float* lse, cudaStream_t stream) {
  using T = typename E::T;
  return WithChunks(head_dim, [&](auto chunks) -> Status {
    auto kernel = AttnForwardKernel<E, decltype(chunks)::value>;
    const size_t bytes = AttnSharedBytes(3, head_dim, 0);
    ZERO_RETURN_IF_ERROR(SetSharedBytes(kernel, bytes, "AttnForwardKernel"));
    const dim3 grid((seq + kTile - 1) / kTile, nh, batch);
    kernel<<<grid, kAttnWarps * 32, bytes, stream>>>(static_cast<const T*>(q), static_cast<const T*>(k),
                                                     static_cast<const T*>(v), seq, nh, nkv, head_dim, scale,
                                                     static_cast<T*>(o), lse);
    return LaunchStatus("AttnForwardKernel");
  });
}

template <class E>
Status AttentionBackwardT(const void* q, const void* k, const void* v, const void* o, const void* dout,
                          const float* lse, int batch, int seq, int nh, int nkv, int head_dim, float scale,
                          float* delta, float* dq, float* dk, float* dv, cudaStream_t stream) {
  using T = typename E::T;
  const int64_t rows = int64_t(batch) * seq;
  const dim3 row_block(32, kRowWarps);
  AttnDeltaKernel<E><<<static_cast<unsigned>((rows * nh + kRowWarps - 1) / kRowWarps), row_block, 0, stream>>>(
      static_cast<const T*>(o), static_cast<const T*>(dout), rows, seq, nh, head_dim, delta);
  ZERO_RETURN_IF_ERROR(LaunchStatus("AttnDeltaKernel"));
  return WithChunks(head_dim, [&](auto chunks) -> Status {
    constexpr int kChunks = decltype(chunks)::value;
    auto dq_kernel = AttnBackwardDqKernel<E, kChunks>;
    const size_t dq_bytes = AttnSharedBytes(4, head_dim, 0);
    ZERO_RETURN_IF_ERROR(SetSharedBytes(dq_kernel, dq_bytes, "AttnBackwardDqKernel"));
    const unsigned tiles = (seq + kTile - 1) / kTile;
    dq_kernel<<<dim3(tiles, nh, batch), kAttnWarps * 32, dq_bytes, stream>>>(
        static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<const T*>(dout), lse,
        delta, seq, nh, nkv, head_dim, scale, dq);
    ZERO_RETURN_IF_ERROR(LaunchStatus("AttnBackwardDqKernel"));
    auto dkv_kernel = AttnBackwardDkvKernel<E, kChunks>;
    const size_t dkv_bytes = AttnSharedBytes(4, head_dim, 2 * kTile);
    ZERO_RETURN_IF_ERROR(SetSharedBytes(dkv_kernel, dkv_bytes, "AttnBackwardDkvKernel"));
    dkv_kernel<<<dim3(tiles, nkv, batch), kAttnWarps * 32, dkv_bytes, stream>>>(
        static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<const T*>(dout), lse,
        delta, seq, nh, nkv, head_dim, scale, dk, dv);
    return LaunchStatus("AttnBackwardDkvKernel");
  });
}
}  // namespace

Status AttentionForward(const void* q, const void* k, const void* v, DType t, int batch, int seq, int nh, int nkv,
                        int head_dim, float scale, void* o, float* lse, cudaStream_t stream) {
  ZERO_RETURN_IF_ERROR(CheckAttentionShape("AttentionForward", t, batch, seq, nh, nkv, head_dim));
  if (t == DType::kF32) return AttentionForwardT<F32>(q, k, v, batch, seq, nh, nkv, head_dim, scale, o, lse, stream);
  return AttentionForwardT<BF16>(q, k, v, batch, seq, nh, nkv, head_dim, scale, o, lse, stream);
}

Status AttentionBackward(const void* q, const void* k, const void* v, const void* o, const void* dout, DType t,
                         const float* lse, int batch, int seq, int nh, int nkv, int head_dim, float scale, float* delta,
                         float* dq, float* dk, float* dv, cudaStream_t stream) {
  ZERO_RETURN_IF_ERROR(CheckAttentionShape("AttentionBackward", t, batch, seq, nh, nkv, head_dim));
  if (t == DType::kF32) {
    return AttentionBackwardT<F32>(q, k, v, o, dout, lse, batch, seq, nh, nkv, head_dim, scale, delta, dq, dk, dv,
                                   stream);
  }
  return AttentionBackwardT<BF16>(q, k, v, o, dout, lse, batch, seq, nh, nkv, head_dim, scale, delta, dq, dk, dv,
                                  stream);
}

}  // namespace zero::llm::kernels
