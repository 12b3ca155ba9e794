// The CUDA kernels behind CudaDevice and their launchers (contract in cuda_kernels.h).
// Compiled by nvcc with --fmad=false and the default IEEE division/sqrt, so each element's
// arithmetic is the CPU backend's.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "runtime/cuda_kernels.h"

namespace zero {
namespace cuda_kernels {
namespace {

// Element types as traits, one kernel per dtype (no per-element switch).
struct F32 {
  using T = float;
  static __device__ __forceinline__ float Load(float x) { return x; }
  static __device__ __forceinline__ float Store(float v) { return v; }
  static __device__ __forceinline__ bool NonFinite(float x) {
    return (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u;
  }
};
struct BF16 {
  using T = uint16_t;
  static __device__ __forceinline__ float Load(uint16_t h) { return Bf16ToFloat(h); }
  static __device__ __forceinline__ uint16_t Store(float v) { return FloatToBf16(v); }
  static __device__ __forceinline__ bool NonFinite(uint16_t h) { return (h & 0x7f80u) == 0x7f80u; }
};
struct F16 {
  using T = uint16_t;
  static __device__ __forceinline__ float Load(uint16_t h) { return HalfToFloat(h); }
  static __device__ __forceinline__ uint16_t Store(float v) { return FloatToHalf(v); }
  static __device__ __forceinline__ bool NonFinite(uint16_t h) { return (h & 0x7c00u) == 0x7c00u; }
};

template <typename F>
cudaError_t Dispatch(DType t, F&& f) {
  switch (t) {
    case DType::kF32:
      return f(F32{});
    case DType::kBF16:
      return f(BF16{});
    case DType::kF16:
      return f(F16{});
  }
  return cudaErrorInvalidValue;
}

// N consecutive elements moved by one load/store instruction (N = 1 or 4).
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

template <int N, typename T>
__device__ __forceinline__ Pack<T, N> LoadPack(const T* p, size_t group) {
  return reinterpret_cast<const Pack<T, N>*>(p)[group];
}
template <int N, typename T>
__device__ __forceinline__ void StorePack(T* p, size_t group, const Pack<T, N>& v) {
  reinterpret_cast<Pack<T, N>*>(p)[group] = v;
}

__device__ __forceinline__ size_t GlobalThread() { return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ size_t GridThreads() { return static_cast<size_t>(gridDim.x) * blockDim.x; }

// Runs op.template Apply<N>(g) for every group g of N elements below n / N, then
// op.template Apply<1>(i) for the tail elements i >= (n / N) * N.
template <int N, typename Op>
__global__ void __launch_bounds__(kThreadsPerBlock) ForEach(size_t n, Op op) {
  const size_t stride = GridThreads();
  const size_t groups = n / N;
  for (size_t g = GlobalThread(); g < groups; g += stride) op.template Apply<N>(g);
  if constexpr (N > 1) {
    for (size_t i = groups * N + GlobalThread(); i < n; i += stride) op.template Apply<1>(i);
  }
}

bool Aligned(const void* p, size_t bytes) { return (reinterpret_cast<uintptr_t>(p) % bytes) == 0; }

template <typename Op>
cudaError_t LaunchForEach(size_t n, bool vector, const Op& op, const Launch& l) {
  if (n == 0) return cudaSuccess;
  const size_t work = vector ? std::max<size_t>(n / 4, 1) : n;
  const size_t want = (work + kThreadsPerBlock - 1) / kThreadsPerBlock;
  const int blocks = static_cast<int>(std::min<size_t>(want, static_cast<size_t>(l.max_blocks)));
  if (vector) {
    ForEach<4><<<blocks, kThreadsPerBlock, 0, l.stream>>>(n, op);
  } else {
    ForEach<1><<<blocks, kThreadsPerBlock, 0, l.stream>>>(n, op);
  }
  return cudaGetLastError();
}

// --- ops -------------------------------------------------------------------------------------

template <typename D>
struct FillOp {
  typename D::T* dst;
  typename D::T value;
  template <int N>
  __device__ __forceinline__ void Apply(size_t g) const {
    Pack<typename D::T, N> p;
#pragma unroll
    for (int j = 0; j < N; ++j) p.v[j] = value;
    StorePack<N>(dst, g, p);
  }
};

template <typename S, typename D>
struct CastOp {
  const typename S::T* src;
  typename D::T* dst;
  template <int N>
  __device__ __forceinline__ void Apply(size_t g) const {
    Pack<typename S::T, N> in = LoadPack<N>(src, g);
    Pack<typename D::T, N> out;
#pragma unroll
    for (int j = 0; j < N; ++j) out.v[j] = D::Store(S::Load(in.v[j]));
    StorePack<N>(dst, g, out);
  }
};

template <typename S>
struct AccumulateOp {
  float* acc;
  const typename S::T* src;
  float scale;
  template <int N>
  __device__ __forceinline__ void Apply(size_t g) const {
    Pack<float, N> a = LoadPack<N>(acc, g);
    Pack<typename S::T, N> in = LoadPack<N>(src, g);
#pragma unroll
    for (int j = 0; j < N; ++j) a.v[j] = a.v[j] + scale * S::Load(in.v[j]);
    StorePack<N>(acc, g, a);
  }
};

// 0.0f + x: +0 for x = -0, x otherwise; an IEEE addition nvcc does not drop (no fast math), so
// the result is bitwise Accumulate into a zero-filled accumulator (as on the CPU backend).
template <typename S>
struct AccumulateFirstOp {
  float* acc;
  const typename S::T* src;
  float scale;
  template <int N>
  __device__ __forceinline__ void Apply(size_t g) const {
    Pack<typename S::T, N> in = LoadPack<N>(src, g);
    Pack<float, N> a;
#pragma unroll
    for (int j = 0; j < N; ++j) a.v[j] = 0.0f + scale * S::Load(in.v[j]);
    StorePack<N>(acc, g, a);
  }
};

template <typename D>
struct ScaleOp {
  typename D::T* x;
  float s;
  template <int N>
  __device__ __forceinline__ void Apply(size_t g) const {
    Pack<typename D::T, N> p = LoadPack<N>(x, g);
#pragma unroll
    for (int j = 0; j < N; ++j) p.v[j] = D::Store(D::Load(p.v[j]) * s);
    StorePack<N>(x, g, p);
  }
};

struct AdamWOp {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  AdamWParams h;
  template <int N>
  __device__ __forceinline__ void Apply(size_t g) const {
    Pack<float, N> p = LoadPack<N>(param, g);
    Pack<float, N> gr = LoadPack<N>(grad, g);
    Pack<float, N> m = LoadPack<N>(exp_avg, g);
    Pack<float, N> v = LoadPack<N>(exp_avg_sq, g);
#pragma unroll
    for (int j = 0; j < N; ++j) AdamWReference(&p.v[j], gr.v[j], &m.v[j], &v.v[j], h);
    StorePack<N>(param, g, p);
    StorePack<N>(exp_avg, g, m);
    StorePack<N>(exp_avg_sq, g, v);
  }
};

// AdamW from gradients of dtype S, each widened as AccumulateFirstOp writes it.
template <typename S>
struct AdamWFromGradientOp {
  float* param;
  const typename S::T* grad;
  float* exp_avg;
  float* exp_avg_sq;
  AdamWParams h;
  float scale;  // 1.0f: the same expression as AccumulateFirstOp's
  template <int N>
  __device__ __forceinline__ void Apply(size_t g) const {
    Pack<float, N> p = LoadPack<N>(param, g);
    Pack<typename S::T, N> in = LoadPack<N>(grad, g);
    Pack<float, N> m = LoadPack<N>(exp_avg, g);
    Pack<float, N> v = LoadPack<N>(exp_avg_sq, g);
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float gr = 0.0f + scale * S::Load(in.v[j]);
      AdamWReference(&p.v[j], gr, &m.v[j], &v.v[j], h);
    }
    StorePack<N>(param, g, p);
    StorePack<N>(exp_avg, g, m);
    StorePack<N>(exp_avg_sq, g, v);
  }
};

// AdamW that also stores the new weight rounded to the model dtype D (what Cast would write).
template <typename D>
struct AdamWCastOp {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  typename D::T* model;
  AdamWParams h;
  template <int N>
  __device__ __forceinline__ void Apply(size_t g) const {
    Pack<float, N> p = LoadPack<N>(param, g);
    Pack<float, N> gr = LoadPack<N>(grad, g);
    Pack<float, N> m = LoadPack<N>(exp_avg, g);
    Pack<float, N> v = LoadPack<N>(exp_avg_sq, g);
    Pack<typename D::T, N> out;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      AdamWReference(&p.v[j], gr.v[j], &m.v[j], &v.v[j], h);
      out.v[j] = D::Store(p.v[j]);
    }
    StorePack<N>(param, g, p);
    StorePack<N>(exp_avg, g, m);
    StorePack<N>(exp_avg_sq, g, v);
    StorePack<N>(model, g, out);
  }
};

// --- reductions ------------------------------------------------------------------------------

template <int N, typename D>
__global__ void __launch_bounds__(kThreadsPerBlock) FiniteCheckKernel(const typename D::T* x, size_t n, int32_t* flag) {
  const size_t stride = GridThreads();
  const size_t groups = n / N;
  bool bad = false;
  for (size_t g = GlobalThread(); g < groups; g += stride) {
    Pack<typename D::T, N> p = LoadPack<N>(x, g);
#pragma unroll
    for (int j = 0; j < N; ++j) bad |= D::NonFinite(p.v[j]);
  }
  for (size_t i = groups * N + GlobalThread(); i < n; i += stride) bad |= D::NonFinite(x[i]);
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicExch(flag, 1);
}

// Fixed-shape tree over kSumOfSquaresThreads values in shared memory; returns the sum in thread 0.
__device__ __forceinline__ double BlockSum(double v, double* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
#pragma unroll
  for (int offset = kSumOfSquaresThreads / 2; offset > 0; offset /= 2) {
    if (threadIdx.x < offset) shared[threadIdx.x] += shared[threadIdx.x + offset];
    __syncthreads();
  }
  return shared[0];
}

// Group size of the documented order is 4 whatever the load width.
template <bool kVector, typename D>
__global__ void __launch_bounds__(kSumOfSquaresThreads)
    SumOfSquaresPartial(const typename D::T* x, size_t n, double* partials) {
  __shared__ double shared[kSumOfSquaresThreads];
  const size_t stride = GridThreads();
  const size_t groups = n / 4;
  double s = 0.0;
  for (size_t g = GlobalThread(); g < groups; g += stride) {
    Pack<typename D::T, 4> p;
    if constexpr (kVector) {
      p = LoadPack<4>(x, g);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) p.v[j] = x[g * 4 + j];
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      double v = D::Load(p.v[j]);
      s += v * v;
    }
  }
  // The tail (< 4 elements) is the last group: its owner is thread `groups % stride`.
  if (GlobalThread() == groups % stride) {
    for (size_t i = groups * 4; i < n; ++i) {
      double v = D::Load(x[i]);
      s += v * v;
    }
  }
  double total = BlockSum(s, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void __launch_bounds__(kSumOfSquaresThreads) SumOfSquaresFinal(const double* partials, double* out) {
  __shared__ double shared[kSumOfSquaresThreads];
  double s = 0.0;
  for (int i = threadIdx.x; i < kSumOfSquaresBlocks; i += kSumOfSquaresThreads) s += partials[i];
  double total = BlockSum(s, shared);
  if (threadIdx.x == 0) *out = total;
}

}  // namespace

// --- launchers -------------------------------------------------------------------------------

cudaError_t Fill(void* dst, DType t, size_t n, float value, const Launch& l) {
  return Dispatch(t, [&](auto d) {
    using D = decltype(d);
    using T = typename D::T;
    // The value is rounded on the host with the same dtype.h function the CPU backend uses.
    T v;
    if constexpr (sizeof(T) == 4) {
      v = value;
    } else if constexpr (std::is_same_v<D, BF16>) {
      v = FloatToBf16(value);
    } else {
      v = FloatToHalf(value);
    }
    FillOp<D> op{static_cast<T*>(dst), v};
    return LaunchForEach(n, Aligned(dst, 4 * sizeof(T)), op, l);
  });
}

cudaError_t Cast(const void* src, DType src_t, void* dst, DType dst_t, size_t n, const Launch& l) {
  return Dispatch(src_t, [&](auto s) {
    using S = decltype(s);
    return Dispatch(dst_t, [&](auto d) {
      using D = decltype(d);
      if constexpr (std::is_same_v<S, D>) {
        return cudaErrorInvalidValue;  // same dtype: a byte copy, done by the caller
      } else {
        CastOp<S, D> op{static_cast<const typename S::T*>(src), static_cast<typename D::T*>(dst)};
        bool vector = Aligned(src, 4 * sizeof(typename S::T)) && Aligned(dst, 4 * sizeof(typename D::T));
        return LaunchForEach(n, vector, op, l);
      }
    });
  });
}

cudaError_t Accumulate(float* acc, const void* src, DType src_t, size_t n, float scale, const Launch& l) {
  return Dispatch(src_t, [&](auto s) {
    using S = decltype(s);
    AccumulateOp<S> op{acc, static_cast<const typename S::T*>(src), scale};
    bool vector = Aligned(acc, 16) && Aligned(src, 4 * sizeof(typename S::T));
    return LaunchForEach(n, vector, op, l);
  });
}

cudaError_t AccumulateFirst(float* acc, const void* src, DType src_t, size_t n, float scale, const Launch& l) {
  return Dispatch(src_t, [&](auto s) {
    using S = decltype(s);
    AccumulateFirstOp<S> op{acc, static_cast<const typename S::T*>(src), scale};
    bool vector = Aligned(acc, 16) && Aligned(src, 4 * sizeof(typename S::T));
    return LaunchForEach(n, vector, op, l);
  });
}

cudaError_t Scale(void* x, DType t, size_t n, float s, const Launch& l) {
  return Dispatch(t, [&](auto d) {
    using D = decltype(d);
    ScaleOp<D> op{static_cast<typename D::T*>(x), s};
    return LaunchForEach(n, Aligned(x, 4 * sizeof(typename D::T)), op, l);
  });
}

cudaError_t FiniteCheck(const void* x, DType t, size_t n, int32_t* flag, const Launch& l) {
  if (n == 0) return cudaSuccess;
  return Dispatch(t, [&](auto d) {
    using D = decltype(d);
    using T = typename D::T;
    const T* p = static_cast<const T*>(x);
    const bool vector = Aligned(x, 4 * sizeof(T));
    const size_t work = vector ? std::max<size_t>(n / 4, 1) : n;
    const size_t want = (work + kThreadsPerBlock - 1) / kThreadsPerBlock;
    const int blocks = static_cast<int>(std::min<size_t>(want, static_cast<size_t>(l.max_blocks)));
    if (vector) {
      FiniteCheckKernel<4, D><<<blocks, kThreadsPerBlock, 0, l.stream>>>(p, n, flag);
    } else {
      FiniteCheckKernel<1, D><<<blocks, kThreadsPerBlock, 0, l.stream>>>(p, n, flag);
    }
    return cudaGetLastError();
  });
}

cudaError_t AdamW(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, size_t n, const AdamWParams& h,
                  const Launch& l) {
  AdamWOp op{param, grad, exp_avg, exp_avg_sq, h};
  bool vector = Aligned(param, 16) && Aligned(grad, 16) && Aligned(exp_avg, 16) && Aligned(exp_avg_sq, 16);
  return LaunchForEach(n, vector, op, l);
}

cudaError_t AdamWFromGradient(float* param, const void* grad, DType grad_t, float* exp_avg, float* exp_avg_sq, size_t n,
                              const AdamWParams& h, const Launch& l) {
  return Dispatch(grad_t, [&](auto s) {
    using S = decltype(s);
    using T = typename S::T;
    AdamWFromGradientOp<S> op{param, static_cast<const T*>(grad), exp_avg, exp_avg_sq, h, 1.0f};
    bool vector = Aligned(param, 16) && Aligned(grad, 4 * sizeof(T)) && Aligned(exp_avg, 16) && Aligned(exp_avg_sq, 16);
    return LaunchForEach(n, vector, op, l);
  });
}

cudaError_t AdamWCast(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, size_t n,
                      const AdamWParams& h, void* model_out, DType model_t, const Launch& l) {
  return Dispatch(model_t, [&](auto d) {
    using D = decltype(d);
    using T = typename D::T;
    AdamWCastOp<D> op{param, grad, exp_avg, exp_avg_sq, static_cast<T*>(model_out), h};
    bool vector = Aligned(param, 16) && Aligned(grad, 16) && Aligned(exp_avg, 16) && Aligned(exp_avg_sq, 16) &&
                  Aligned(model_out, 4 * sizeof(T));
    return LaunchForEach(n, vector, op, l);
  });
}

cudaError_t SumOfSquares(const void* x, DType t, size_t n, double* out, double* scratch, cudaStream_t stream) {
  return Dispatch(t, [&](auto d) {
    using D = decltype(d);
    using T = typename D::T;
    const T* p = static_cast<const T*>(x);
    if (Aligned(x, 4 * sizeof(T))) {
      SumOfSquaresPartial<true, D><<<kSumOfSquaresBlocks, kSumOfSquaresThreads, 0, stream>>>(p, n, scratch);
    } else {
      SumOfSquaresPartial<false, D><<<kSumOfSquaresBlocks, kSumOfSquaresThreads, 0, stream>>>(p, n, scratch);
    }
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    SumOfSquaresFinal<<<1, kSumOfSquaresThreads, 0, stream>>>(scratch, out);
    return cudaGetLastError();
  });
}

}  // namespace cuda_kernels
}  // namespace zero
