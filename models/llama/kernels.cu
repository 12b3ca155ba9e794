// The transformer's CUDA kernels (contracts in llm_kernels.cuh). Each launcher sits beside its
// kernel, the backward next to the forward; every launch is checked.
//
// Memory-bound kernels read and write through dtype.h's LoadAsFloat/StoreFromFloat (a switch on a
// uniform dtype, negligible beside the memory traffic) so the 16-bit roundings are the CPU
// model's bit for bit; the attention kernels are templates on the element type.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include "models/llama/kernels.cuh"
#include "runtime/dtype.h"

namespace zero::llm::kernels {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kFullMask = 0xffffffffu;

Status LaunchStatus(const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return OkStatus();
  return InternalError(std::string("CUDA launch of ") + kernel + ": " + cudaGetErrorName(e) + ": " +
                       cudaGetErrorString(e));
}

// Grid-stride loops cover any n; more blocks than this only adds scheduling.
unsigned GridFor(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(blocks, 1), 65535 * 8));
}

bool ActivationDType(DType t) { return t == DType::kF32 || t == DType::kBF16; }

Status NeedActivationDType(DType t, const char* what) {
  if (ActivationDType(t)) return OkStatus();
  return InvalidArgumentError(std::string(what) + ": dtype " + DTypeName(t) + ", expected fp32 or bf16");
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
bool VecOk(const void* p, DType t) { return reinterpret_cast<uintptr_t>(p) % (4 * SizeOf(t)) == 0; }

// Grid for n / V vectors.
unsigned GridForVec(int64_t n, int v) { return GridFor((n + v - 1) / v); }

}  // namespace

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

// ---- RMSNorm: one warp per row ----------------------------------------------------------------

namespace {
constexpr int kRowWarps = 8;

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
