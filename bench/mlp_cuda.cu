// MlpCuda: cuBLAS GEMMs plus the small kernels below, all on the caller's stream. Each launcher
// checks its launch; cuBLAS errors come back as Status.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "bench/mlp_cuda.h"
#include "runtime/cuda_device.h"
#include "runtime/cuda_status.h"
#include "runtime/device.h"

namespace zero::bench {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 132 * 16;  // grid-stride loops: a few waves of an H200's 132 SMs
constexpr int kColChunks = 64;        // row chunks of the column sums
constexpr int kLossBlocks = 1024;

unsigned Grid(size_t n) {
  return static_cast<unsigned>(std::max<size_t>(1, std::min<size_t>((n + kThreads - 1) / kThreads, kMaxBlocks)));
}

// 8 bf16 in one 16-byte word.
__device__ __forceinline__ void Unpack8(const uint4& v, float f[8]) {
  const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 t = __bfloat1622float2(p[k]);
    f[2 * k] = t.x;
    f[2 * k + 1] = t.y;
  }
}

__device__ __forceinline__ uint4 Pack8(const float f[8]) {
  uint4 v;
  __nv_bfloat162* p = reinterpret_cast<__nv_bfloat162*>(&v);
#pragma unroll
  for (int k = 0; k < 4; ++k) p[k] = __floats2bfloat162_rn(f[2 * k], f[2 * k + 1]);
  return v;
}

// h = relu(h + b), rows of `cols8` 16-byte words.
__global__ void BiasReluKernel(uint4* h, const uint4* bias, size_t n8, size_t cols8) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n8; i += size_t(gridDim.x) * blockDim.x) {
    float v[8], b[8];
    Unpack8(h[i], v);
    Unpack8(bias[i % cols8], b);
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = fmaxf(v[k] + b[k], 0.0f);
    h[i] = Pack8(v);
  }
}

// y = y + b + x (fc2's output, its bias and the residual).
__global__ void BiasResidualKernel(uint4* y, const uint4* bias, const uint4* x, size_t n8, size_t cols8) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n8; i += size_t(gridDim.x) * blockDim.x) {
    float v[8], b[8], r[8];
    Unpack8(y[i], v);
    Unpack8(bias[i % cols8], b);
    Unpack8(x[i], r);
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = (v[k] + b[k]) + r[k];
    y[i] = Pack8(v);
  }
}

// da = a > 0 ? da : 0 (ReLU's gradient through its output).
__global__ void ReluMaskKernel(uint4* da, const uint4* a, size_t n8) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n8; i += size_t(gridDim.x) * blockDim.x) {
    float v[8], m[8];
    Unpack8(da[i], v);
    Unpack8(a[i], m);
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = m[k] > 0.0f ? v[k] : 0.0f;
    da[i] = Pack8(v);
  }
}

__global__ void HashFillKernel(__nv_bfloat16* dst, size_t n, uint32_t key, float bound) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    dst[i] = __float2bfloat16_rn(HashUniform(key, static_cast<uint32_t>(i), bound));
  }
}

// Column sums of a bf16 [rows, cols] matrix (cols % 64 == 0): block (32, 8) covers 64 columns
// (two per thread) and one chunk of rows; partial[chunk, col] in fp32. Then the chunks are added in
// order. Fixed order throughout: deterministic.
__global__ void ColumnSumPartialKernel(const __nv_bfloat162* x, int64_t rows, int64_t cols, int64_t rows_per_chunk,
                                       float* partial) {
  __shared__ float2 part[8][32];
  const int64_t col2 = blockIdx.x * 32 + threadIdx.x;  // index of the column pair
  const int64_t begin = blockIdx.y * rows_per_chunk;
  const int64_t end = min(rows, begin + rows_per_chunk);
  const int64_t pairs = cols / 2;
  float2 acc = make_float2(0.0f, 0.0f);
  for (int64_t r = begin + threadIdx.y; r < end; r += 8) {
    const float2 v = __bfloat1622float2(x[r * pairs + col2]);
    acc.x += v.x;
    acc.y += v.y;
  }
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0) {
    float2 s = part[0][threadIdx.x];
    for (int g = 1; g < 8; ++g) {
      s.x += part[g][threadIdx.x].x;
      s.y += part[g][threadIdx.x].y;
    }
    partial[blockIdx.y * cols + 2 * col2] = s.x;
    partial[blockIdx.y * cols + 2 * col2 + 1] = s.y;
  }
}

__global__ void ColumnSumFinalKernel(const float* partial, int chunks, int64_t cols, __nv_bfloat16* out) {
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < cols; c += int64_t(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (int k = 0; k < chunks; ++k) s += partial[k * cols + c];
    out[c] = __float2bfloat16_rn(s);
  }
}

// Loss = mean(x^2): per-block partial sums (fp32 per thread, double per block), and the gradient
// g = bf16(x * 2/n).
__global__ void LossPartialKernel(const uint4* x, size_t n8, float grad_scale, uint4* g, double* partial) {
  __shared__ double part[kThreads];
  float acc = 0.0f;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n8; i += size_t(gridDim.x) * blockDim.x) {
    float v[8];
    Unpack8(x[i], v);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      acc += v[k] * v[k];
      v[k] = v[k] * grad_scale;
    }
    g[i] = Pack8(v);
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = part[0];
}

__global__ void LossFinalKernel(const double* partial, int blocks, double inv_n, double* loss) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    double s = 0.0;
    for (int b = 0; b < blocks; ++b) s += partial[b];
    *loss = s * inv_n;
  }
}

}  // namespace

// ---- MlpCuda --------------------------------------------------------------------------------------

size_t MlpCuda::ActivationBytes(const MlpShape& s) {
  const size_t xd = size_t(s.tokens) * s.dim, xf = size_t(s.tokens) * s.ffn;
  return 2 * ((s.blocks + 1) * xd + s.blocks * xf + xd + xf);
}

Result<std::unique_ptr<MlpCuda>> MlpCuda::Create(const MlpShape& shape, Device* device, Stream* stream) {
  CudaDevice* cuda = device == nullptr ? nullptr : device->AsCuda();
  if (cuda == nullptr) {
    return InvalidArgumentError("MlpCuda: device " + (device == nullptr ? std::string("null") : device->name()) +
                                " is not a CUDA device");
  }
  if (shape.tokens < 1 || shape.blocks < 1 || shape.dim < 64 || shape.ffn < 64 || shape.dim % 64 != 0 ||
      shape.ffn % 64 != 0) {
    return InvalidArgumentError("MlpCuda: need tokens >= 1, blocks >= 1, dim and ffn multiples of 64; got tokens " +
                                std::to_string(shape.tokens) + ", blocks " + std::to_string(shape.blocks) + ", dim " +
                                std::to_string(shape.dim) + ", ffn " + std::to_string(shape.ffn));
  }
  if (size_t(shape.tokens) * std::max(shape.dim, shape.ffn) >= (size_t{1} << 32)) {
    return InvalidArgumentError("MlpCuda: tokens x ffn must stay below 2^32 (32-bit hash index)");
  }
  ZERO_CUDA_RETURN_IF_ERROR(cudaSetDevice(cuda->ordinal()));  // cuBLAS binds its handle to it
  std::unique_ptr<MlpCuda> m(new MlpCuda(shape, device, cuda->native_stream(stream)));
  ZERO_RETURN_IF_ERROR(m->Init());
  return std::move(m);
}

Status MlpCuda::Init() {
  cublasHandle_t h = nullptr;
  ZERO_CUBLAS_RETURN_IF_ERROR(cublasCreate(&h));
  cublas_ = h;
  ZERO_CUBLAS_RETURN_IF_ERROR(cublasSetStream(h, stream_));
  ZERO_CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
  workspace_.Reserve(&colsum_partial_, kColChunks * std::max(shape_.dim, shape_.ffn), "column sum partials");
  workspace_.Reserve(&loss_partial_, kLossBlocks, "loss partials");
  workspace_.Reserve(&loss_, 1, "loss");
  return workspace_.Allocate(device_).WithContext("MlpCuda");
}

MlpCuda::~MlpCuda() {
  if (cublas_ != nullptr) cublasDestroy(static_cast<cublasHandle_t>(cublas_));
}

Status MlpCuda::Bind(void* activations, size_t bytes) {
  if (activations == nullptr || bytes < ActivationBytes(shape_)) {
    return InvalidArgumentError("MlpCuda::Bind: need " + std::to_string(ActivationBytes(shape_)) +
                                " bytes of activations, got " + std::to_string(bytes));
  }
  const size_t xd = size_t(shape_.tokens) * shape_.dim, xf = size_t(shape_.tokens) * shape_.ffn;
  uint16_t* p = static_cast<uint16_t*>(activations);
  x_ = p;
  p += (shape_.blocks + 1) * xd;
  a_ = p;
  p += shape_.blocks * xf;
  g_ = p;
  p += xd;
  da_ = p;
  return OkStatus();
}

Status MlpCuda::FillUniform(void* dst, size_t n, uint32_t stream_id, float bound) {
  if (n == 0) return OkStatus();
  HashFillKernel<<<Grid(n), kThreads, 0, stream_>>>(static_cast<__nv_bfloat16*>(dst), n, HashKey(stream_id), bound);
  ZERO_CUDA_RETURN_IF_LAUNCH_FAILED(HashFill);
  return OkStatus();
}

Status MlpCuda::FillInput(uint32_t stream_id) {
  if (x_ == nullptr) return FailedPreconditionError("MlpCuda: no activations bound");
  return FillUniform(x_, size_t(shape_.tokens) * shape_.dim, stream_id, 1.0f);
}

Status MlpCuda::Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda,
                     const void* b, int64_t ldb, void* c, int64_t ldc, float beta) {
  // cuBLAS is column-major, where a row-major X reads as X^T: C^T = op(B)^T op(A)^T.
  const float one = 1.0f;
  ZERO_CUBLAS_RETURN_IF_ERROR(
      cublasGemmEx(static_cast<cublasHandle_t>(cublas_), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                   trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
                   &one, b, CUDA_R_16BF, static_cast<int>(ldb), a, CUDA_R_16BF, static_cast<int>(lda), &beta, c,
                   CUDA_R_16BF, static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return OkStatus();
}

Status MlpCuda::ColumnSum(const void* x, int64_t rows, int64_t cols, void* out) {
  const int64_t rows_per_chunk = (rows + kColChunks - 1) / kColChunks;
  const int chunks = static_cast<int>((rows + rows_per_chunk - 1) / rows_per_chunk);
  ColumnSumPartialKernel<<<dim3(static_cast<unsigned>(cols / 64), chunks), dim3(32, 8), 0, stream_>>>(
      static_cast<const __nv_bfloat162*>(x), rows, cols, rows_per_chunk, colsum_partial_);
  ZERO_CUDA_RETURN_IF_LAUNCH_FAILED(ColumnSumPartial);
  ColumnSumFinalKernel<<<Grid(cols), kThreads, 0, stream_>>>(colsum_partial_, chunks, cols,
                                                             static_cast<__nv_bfloat16*>(out));
  ZERO_CUDA_RETURN_IF_LAUNCH_FAILED(ColumnSumFinal);
  return OkStatus();
}

Status MlpCuda::ForwardBlock(int l, const MlpBlockParams& p) {
  if (x_ == nullptr) return FailedPreconditionError("MlpCuda: no activations bound");
  if (l < 0 || l >= shape_.blocks) return InvalidArgumentError("MlpCuda::ForwardBlock: block out of range");
  const int64_t B = shape_.tokens, D = shape_.dim, F = shape_.ffn;
  const size_t xd = size_t(B) * D, xf = size_t(B) * F;
  const uint16_t* x = x_ + l * xd;
  uint16_t* xn = x_ + (l + 1) * xd;
  uint16_t* a = a_ + l * xf;
  // h = x w1^T; a = relu(h + b1)
  ZERO_RETURN_IF_ERROR(Gemm(false, true, B, F, D, x, D, p.w1, D, a, F, 0.0f));
  BiasReluKernel<<<Grid(xf / 8), kThreads, 0, stream_>>>(reinterpret_cast<uint4*>(a), static_cast<const uint4*>(p.b1),
                                                         xf / 8, F / 8);
  ZERO_CUDA_RETURN_IF_LAUNCH_FAILED(BiasRelu);
  // x' = a w2^T + b2 + x
  ZERO_RETURN_IF_ERROR(Gemm(false, true, B, D, F, a, F, p.w2, F, xn, D, 0.0f));
  BiasResidualKernel<<<Grid(xd / 8), kThreads, 0, stream_>>>(
      reinterpret_cast<uint4*>(xn), static_cast<const uint4*>(p.b2), reinterpret_cast<const uint4*>(x), xd / 8, D / 8);
  ZERO_CUDA_RETURN_IF_LAUNCH_FAILED(BiasResidual);
  return OkStatus();
}

Status MlpCuda::Loss(float grad_scale) {
  if (x_ == nullptr) return FailedPreconditionError("MlpCuda: no activations bound");
  const size_t n = size_t(shape_.tokens) * shape_.dim;
  const uint16_t* x = x_ + shape_.blocks * n;
  LossPartialKernel<<<kLossBlocks, kThreads, 0, stream_>>>(reinterpret_cast<const uint4*>(x), n / 8,
                                                           static_cast<float>(2.0 / double(n) * grad_scale),
                                                           reinterpret_cast<uint4*>(g_), loss_partial_);
  ZERO_CUDA_RETURN_IF_LAUNCH_FAILED(LossPartial);
  LossFinalKernel<<<1, 32, 0, stream_>>>(loss_partial_, kLossBlocks, 1.0 / double(n), loss_);
  ZERO_CUDA_RETURN_IF_LAUNCH_FAILED(LossFinal);
  return OkStatus();
}

Result<double> MlpCuda::ReadLoss() {
  double v = 0.0;
  ZERO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&v, loss_, sizeof(double), cudaMemcpyDeviceToHost, stream_));
  ZERO_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return v;
}

Status MlpCuda::BackwardFc2(int l, const MlpBlockParams& p, void* db2, void* dw2) {
  if (x_ == nullptr) return FailedPreconditionError("MlpCuda: no activations bound");
  if (l < 0 || l >= shape_.blocks) return InvalidArgumentError("MlpCuda::BackwardFc2: block out of range");
  const int64_t B = shape_.tokens, D = shape_.dim, F = shape_.ffn;
  const size_t xf = size_t(B) * F;
  const uint16_t* a = a_ + l * xf;
  ZERO_RETURN_IF_ERROR(ColumnSum(g_, B, D, db2));
  // dw2 [D, F] = g^T a
  ZERO_RETURN_IF_ERROR(Gemm(true, false, D, F, B, g_, D, a, F, dw2, F, 0.0f));
  // da [B, F] = g w2, masked by relu
  ZERO_RETURN_IF_ERROR(Gemm(false, false, B, F, D, g_, D, p.w2, F, da_, F, 0.0f));
  ReluMaskKernel<<<Grid(xf / 8), kThreads, 0, stream_>>>(reinterpret_cast<uint4*>(da_),
                                                         reinterpret_cast<const uint4*>(a), xf / 8);
  ZERO_CUDA_RETURN_IF_LAUNCH_FAILED(ReluMask);
  return OkStatus();
}

Status MlpCuda::BackwardFc1(int l, const MlpBlockParams& p, void* db1, void* dw1) {
  if (x_ == nullptr) return FailedPreconditionError("MlpCuda: no activations bound");
  if (l < 0 || l >= shape_.blocks) return InvalidArgumentError("MlpCuda::BackwardFc1: block out of range");
  const int64_t B = shape_.tokens, D = shape_.dim, F = shape_.ffn;
  const uint16_t* x = x_ + l * size_t(B) * D;
  ZERO_RETURN_IF_ERROR(ColumnSum(da_, B, F, db1));
  // dw1 [F, D] = da^T x
  ZERO_RETURN_IF_ERROR(Gemm(true, false, F, D, B, da_, F, x, D, dw1, D, 0.0f));
  return OkStatus();
}

Status MlpCuda::BackwardInput(int l, const MlpBlockParams& p) {
  if (x_ == nullptr) return FailedPreconditionError("MlpCuda: no activations bound");
  if (l < 1 || l >= shape_.blocks) return InvalidArgumentError("MlpCuda::BackwardInput: block out of range");
  const int64_t B = shape_.tokens, D = shape_.dim, F = shape_.ffn;
  // g = da w1 + g: the residual branch passes g through unchanged.
  return Gemm(false, false, B, D, F, da_, F, p.w1, D, g_, D, 1.0f);
}

}  // namespace zero::bench
