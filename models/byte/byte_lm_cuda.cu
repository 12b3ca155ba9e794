// ByteLm on the GPU: cuBLAS for the matmuls, the kernels below for everything else. Each kernel's
// launcher sits beside it, takes the stream, and checks the launch.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <utility>

#include "models/byte/byte_lm_cuda.h"
#include "runtime/cuda_device.h"
#include "runtime/cuda_status.h"
#include "runtime/device.h"
#include "runtime/device_arena.h"
#include "runtime/dtype.h"

namespace zero::examples {
namespace {

constexpr int kThreads = 256;

inline unsigned Blocks(size_t n, int threads = kThreads) { return static_cast<unsigned>((n + threads - 1) / threads); }

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// ---- Conversions. ---------------------------------------------------------------------------------

__global__ void ToFloatKernel(const void* src, DType dtype, size_t n, float* dst) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    dst[i] = LoadAsFloat(src, dtype, i);
  }
}

Status ToFloat(const void* src, DType dtype, size_t n, float* dst, cudaStream_t s) {
  if (n == 0) return OkStatus();
  ToFloatKernel<<<std::min(Blocks(n), 65535u), kThreads, 0, s>>>(src, dtype, n, dst);
  ZERO_CUDA_RETURN_IF_LAUNCH_FAILED(ToFloat);
  return OkStatus();
}

__global__ void FromFloatKernel(const float* src, size_t n, void* dst, DType dtype) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    StoreFromFloat(dst, dtype, i, src[i]);
  }
}

Status FromFloat(const float* src, size_t n, void* dst, DType dtype, cudaStream_t s) {
  if (n == 0) return OkStatus();
  FromFloatKernel<<<std::min(Blocks(n), 65535u), kThreads, 0, s>>>(src, n, dst, dtype);
  ZERO_CUDA_RETURN_IF_LAUNCH_FAILED(FromFloat);
  return OkStatus();
}

// ---- Embedding. -----------------------------------------------------------------------------------

// x0[b, j*d + c] = table[tokens[b, j], c]
__global__ void EmbedGatherKernel(const uint8_t* tokens, int batch, int k, int d, const float* table, float* x0) {
  const size_t n = size_t(batch) * k * d;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const size_t b = i / (size_t(k) * d);
    const int r = static_cast<int>(i % (size_t(k) * d));
    const int j = r / d, c = r % d;
    x0[i] = table[size_t(tokens[b * (k + 1) + j]) * d + c];
  }
}

Status EmbedGather(const uint8_t* tokens, int batch, int k, int d, const float* table, float* x0, cudaStream_t s) {
  EmbedGatherKernel<<<std::min(Blocks(size_t(batch) * k * d), 65535u), kThreads, 0, s>>>(tokens, batch, k, d, table,
                                                                                         x0);
  ZERO_CUDA_RETURN_IF_LAUNCH_FAILED(EmbedGather);
  return OkStatus();
}

// dtable[v, c] = sum over (b, j) with tokens[b, j] == v of dx0[b, j*d + c]: one block per byte
// value, threads over c, rows in the CPU's order. No atomics, so the sum order is fixed.
__global__ void EmbedScatterKernel(const uint8_t* tokens, int batch, int k, int d, const float* dx0, float* dtable) {
  const int v = blockIdx.x;
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    float acc = 0.0f;
    for (int b = 0; b < batch; ++b) {
      for (int j = 0; j < k; ++j) {
        if (tokens[size_t(b) * (k + 1) + j] == v) acc += dx0[size_t(b) * k * d + size_t(j) * d + c];
      }
    }
    dtable[size_t(v) * d + c] = acc;
  }
}

Status EmbedScatter(const uint8_t* tokens, int batch, int k, int d, const float* dx0, float* dtable, cudaStream_t s) {
  EmbedScatterKernel<<<kByteVocab, std::min(d, 256), 0, s>>>(tokens, batch, k, d, dx0, dtable);
  ZERO_CUDA_RETURN_IF_LAUNCH_FAILED(EmbedScatter);
  return OkStatus();
}

// ---- Elementwise. ---------------------------------------------------------------------------------

// c[i, j] += bias[j]; then, if residual, c[i, j] += residual[i, j] (the CPU's order).
__global__ void BiasResidualKernel(float* c, const float* bias, const float* residual, int m, int n) {
  const size_t total = size_t(m) * n;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total; i += size_t(gridDim.x) * blockDim.x) {
    float v = c[i] + bias[i % n];
    if (residual != nullptr) v += residual[i];
    c[i] = v;
  }
}

Status BiasResidual(float* c, const float* bias, const float* residual, int m, int n, cudaStream_t s) {
  BiasResidualKernel<<<std::min(Blocks(size_t(m) * n), 65535u), kThreads, 0, s>>>(c, bias, residual, m, n);
  ZERO_CUDA_RETURN_IF_LAUNCH_FAILED(BiasResidual);
  return OkStatus();
}

__device__ __forceinline__ float GeluF(float u) { return 0.5f * u * (1.0f + erff(u * 0.70710678118654752440f)); }

__device__ __forceinline__ float GeluGradF(float u) {
  const float cdf = 0.5f * (1.0f + erff(u * 0.70710678118654752440f));
  const float pdf = expf(-0.5f * u * u) * 0.39894228040143267794f;
  return cdf + u * pdf;
}

__global__ void GeluForwardKernel(const float* pre, size_t n, float* act) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    act[i] = GeluF(pre[i]);
  }
}

Status GeluForward(const float* pre, size_t n, float* act, cudaStream_t s) {
  GeluForwardKernel<<<std::min(Blocks(n), 65535u), kThreads, 0, s>>>(pre, n, act);
  ZERO_CUDA_RETURN_IF_LAUNCH_FAILED(GeluForward);
  return OkStatus();
}

__global__ void GeluBackwardKernel(const float* pre, size_t n, float* dact) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    dact[i] *= GeluGradF(pre[i]);
  }
}

Status GeluBackward(const float* pre, size_t n, float* dact, cudaStream_t s) {
  GeluBackwardKernel<<<std::min(Blocks(n), 65535u), kThreads, 0, s>>>(pre, n, dact);
  ZERO_CUDA_RETURN_IF_LAUNCH_FAILED(GeluBackward);
  return OkStatus();
}

// ---- Column reductions (bias and LayerNorm parameter gradients). ------------------------------------

// 32 columns per block, 8 row groups; partial sums combined in shared memory in a fixed order.
constexpr int kColTile = 32, kRowGroups = 8;

// out[j] = sum_i x[i, j]
__global__ void ColumnSumKernel(const float* x, int m, int n, float* out) {
  __shared__ float part[kRowGroups][kColTile];
  const int j = blockIdx.x * kColTile + threadIdx.x;
  float acc = 0.0f;
  if (j < n) {
    for (int i = threadIdx.y; i < m; i += kRowGroups) acc += x[size_t(i) * n + j];
  }
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && j < n) {
    float s = 0.0f;
    for (int g = 0; g < kRowGroups; ++g) s += part[g][threadIdx.x];
    out[j] = s;
  }
}

Status ColumnSum(const float* x, int m, int n, float* out, cudaStream_t s) {
  ColumnSumKernel<<<(n + kColTile - 1) / kColTile, dim3(kColTile, kRowGroups), 0, s>>>(x, m, n, out);
  ZERO_CUDA_RETURN_IF_LAUNCH_FAILED(ColumnSum);
  return OkStatus();
}

// dgain[j] = sum_i dy[i, j] * xhat[i, j], dbias[j] = sum_i dy[i, j]
__global__ void LayerNormParamGradKernel(const float* x, const float* mean, const float* rstd, const float* dy, int m,
                                         int n, float* dgain, float* dbias) {
  __shared__ float pg[kRowGroups][kColTile];
  __shared__ float pb[kRowGroups][kColTile];
  const int j = blockIdx.x * kColTile + threadIdx.x;
  float ag = 0.0f, ab = 0.0f;
  if (j < n) {
    for (int i = threadIdx.y; i < m; i += kRowGroups) {
      const size_t at = size_t(i) * n + j;
      const float xhat = (x[at] - mean[i]) * rstd[i];
      ag += dy[at] * xhat;
      ab += dy[at];
    }
  }
  pg[threadIdx.y][threadIdx.x] = ag;
  pb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && j < n) {
    float sg = 0.0f, sb = 0.0f;
    for (int g = 0; g < kRowGroups; ++g) {
      sg += pg[g][threadIdx.x];
      sb += pb[g][threadIdx.x];
    }
    dgain[j] = sg;
    dbias[j] = sb;
  }
}

// ---- LayerNorm rows: one warp per row. ------------------------------------------------------------

constexpr int kRowsPerBlock = 4;

__global__ void LayerNormForwardKernel(const float* x, const float* gain, const float* bias, int m, int n, float eps,
                                       float* y, float* mean, float* rstd) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.y;
  if (row >= m) return;
  const float* xr = x + size_t(row) * n;
  float s = 0.0f;
  for (int j = threadIdx.x; j < n; j += 32) s += xr[j];
  const float mu = WarpSum(s) / float(n);
  float v = 0.0f;
  for (int j = threadIdx.x; j < n; j += 32) v += (xr[j] - mu) * (xr[j] - mu);
  const float r = 1.0f / sqrtf(WarpSum(v) / float(n) + eps);
  float* yr = y + size_t(row) * n;
  for (int j = threadIdx.x; j < n; j += 32) yr[j] = (xr[j] - mu) * r * gain[j] + bias[j];
  if (threadIdx.x == 0) {
    mean[row] = mu;
    rstd[row] = r;
  }
}

__global__ void LayerNormBackwardKernel(const float* x, const float* mean, const float* rstd, const float* gain,
                                        const float* dy, int m, int n, int accumulate, float* dx) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.y;
  if (row >= m) return;
  const size_t base = size_t(row) * n;
  const float mu = mean[row], r = rstd[row];
  float m1 = 0.0f, m2 = 0.0f;
  for (int j = threadIdx.x; j < n; j += 32) {
    const float xhat = (x[base + j] - mu) * r;
    const float dxhat = dy[base + j] * gain[j];
    m1 += dxhat;
    m2 += dxhat * xhat;
  }
  m1 = WarpSum(m1) / float(n);
  m2 = WarpSum(m2) / float(n);
  for (int j = threadIdx.x; j < n; j += 32) {
    const float xhat = (x[base + j] - mu) * r;
    const float g = r * (dy[base + j] * gain[j] - m1 - xhat * m2);
    dx[base + j] = accumulate ? dx[base + j] + g : g;
  }
}

Status LayerNormForward(const float* x, const float* gain, const float* bias, int m, int n, float eps, float* y,
                        float* mean, float* rstd, cudaStream_t s) {
  LayerNormForwardKernel<<<(m + kRowsPerBlock - 1) / kRowsPerBlock, dim3(32, kRowsPerBlock), 0, s>>>(
      x, gain, bias, m, n, eps, y, mean, rstd);
  ZERO_CUDA_RETURN_IF_LAUNCH_FAILED(LayerNormForward);
  return OkStatus();
}

// dx (= or +=) the input gradient; dgain, dbias overwritten.
Status LayerNormBackward(const float* x, const float* mean, const float* rstd, const float* gain, const float* dy,
                         int m, int n, bool accumulate, float* dx, float* dgain, float* dbias, cudaStream_t s) {
  LayerNormParamGradKernel<<<(n + kColTile - 1) / kColTile, dim3(kColTile, kRowGroups), 0, s>>>(x, mean, rstd, dy, m, n,
                                                                                                dgain, dbias);
  ZERO_CUDA_RETURN_IF_LAUNCH_FAILED(LayerNormParamGrad);
  LayerNormBackwardKernel<<<(m + kRowsPerBlock - 1) / kRowsPerBlock, dim3(32, kRowsPerBlock), 0, s>>>(
      x, mean, rstd, gain, dy, m, n, accumulate ? 1 : 0, dx);
  ZERO_CUDA_RETURN_IF_LAUNCH_FAILED(LayerNormBackward);
  return OkStatus();
}

// ---- Softmax cross-entropy: one block of 256 threads per row (one per byte value). ---------------

static_assert(kByteVocab == 256, "the softmax kernels use one thread per byte value");

__device__ float BlockReduce(float v, bool is_max, float* shared) {
  // 8 warps: reduce in each warp, then warp 0 combines the 8 partials in order.
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, other) : v + other;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float r = shared[0];
  for (int w = 1; w < kByteVocab / 32; ++w) r = is_max ? fmaxf(r, shared[w]) : r + shared[w];
  __syncthreads();
  return r;
}

// lse[b] = log sum_v exp(z[b, v]); row_loss[b] = lse[b] - z[b, target[b]].
__global__ void SoftmaxLossKernel(const float* logits, const uint8_t* tokens, int k, float* lse, float* row_loss) {
  __shared__ float shared[kByteVocab / 32];
  const int b = blockIdx.x, v = threadIdx.x;
  const float z = logits[size_t(b) * kByteVocab + v];
  const float mx = BlockReduce(z, true, shared);
  const float sum = BlockReduce(expf(z - mx), false, shared);
  const float l = mx + logf(sum);
  if (v == 0) {
    lse[b] = l;
    row_loss[b] = l - logits[size_t(b) * kByteVocab + tokens[size_t(b) * (k + 1) + k]];
  }
}

// loss = mean of row_loss, summed in double in a fixed order.
__global__ void MeanLossKernel(const float* row_loss, int batch, double* loss) {
  __shared__ double part[kThreads];
  double acc = 0.0;
  for (int b = threadIdx.x; b < batch; b += kThreads) acc += double(row_loss[b]);
  part[threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double s = 0.0;
    for (int t = 0; t < kThreads; ++t) s += part[t];
    *loss = s / batch;
  }
}

// dz[b, v] = (softmax(z)[b, v] - [v == target]) * coef
__global__ void SoftmaxBackwardKernel(const float* logits, const float* lse, const uint8_t* tokens, int k, float coef,
                                      float* dlogits) {
  const int b = blockIdx.x, v = threadIdx.x;
  const size_t at = size_t(b) * kByteVocab + v;
  const int target = tokens[size_t(b) * (k + 1) + k];
  dlogits[at] = (expf(logits[at] - lse[b]) - (v == target ? 1.0f : 0.0f)) * coef;
}

}  // namespace

// ---- Activations. ---------------------------------------------------------------------------------

struct ByteLmCudaActivations::State {
  int batch = 0;
  int capacity = 0;
  bool has_forward = false;
  const Device* device = nullptr;  // of the arenas
  // What Forward saves for Backward (with the batch's bytes and the loss), and Backward's scratch.
  DeviceArena saved{"activations"};
  DeviceArena scratch{"workspace"};
  uint8_t* tokens = nullptr;  // [B, k+1]
  double* loss = nullptr;
  float *x0, *resid, *ln, *mean, *rstd, *pre, *act, *logits, *lse, *row_loss;
  float *dresid, *dln, *dact, *dlogits, *dx0;

  // Grows the buffers to batch b on `dev` (they are kept for smaller batches); work on `stream` may
  // still read the old ones.
  Status Reserve(const ByteLmConfig& c, int b, Device* dev, cudaStream_t stream) {
    batch = b;
    if (b <= capacity && dev == device) return OkStatus();
    const int64_t B = b, k = c.context, K0 = k * c.embed_dim, h = c.hidden, f = c.ffn, L = c.layers;
    const int64_t V = kByteVocab;
    ZERO_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    saved.Clear();  // freed before the new ones are allocated
    scratch.Clear();
    device = nullptr;
    capacity = 0;
    saved.Reserve(&x0, B * K0, "x0");
    saved.Reserve(&resid, (L + 1) * B * h, "resid");
    saved.Reserve(&ln, (L + 1) * B * h, "ln");
    saved.Reserve(&mean, (L + 1) * B, "mean");
    saved.Reserve(&rstd, (L + 1) * B, "rstd");
    saved.Reserve(&pre, L * B * f, "pre");
    saved.Reserve(&act, L * B * f, "act");
    saved.Reserve(&logits, B * V, "logits");
    saved.Reserve(&lse, B, "lse");
    saved.Reserve(&row_loss, B, "row_loss");
    saved.Reserve(&tokens, B * (k + 1), "tokens");
    saved.Reserve(&loss, 1, "loss");
    scratch.Reserve(&dresid, B * h, "dresid");
    scratch.Reserve(&dln, B * h, "dln");
    scratch.Reserve(&dact, B * f, "dact");
    scratch.Reserve(&dlogits, B * V, "dlogits");
    scratch.Reserve(&dx0, B * K0, "dx0");
    const std::string what = "byte_lm_cuda: batch " + std::to_string(b);
    ZERO_RETURN_IF_ERROR(saved.Allocate(dev).WithContext(what));
    ZERO_RETURN_IF_ERROR(scratch.Allocate(dev).WithContext(what));
    device = dev;
    capacity = b;
    return OkStatus();
  }
};

ByteLmCudaActivations::ByteLmCudaActivations() : state_(std::make_unique<State>()) {}
ByteLmCudaActivations::~ByteLmCudaActivations() = default;
ByteLmCudaActivations::ByteLmCudaActivations(ByteLmCudaActivations&&) noexcept = default;
ByteLmCudaActivations& ByteLmCudaActivations::operator=(ByteLmCudaActivations&&) noexcept = default;
int ByteLmCudaActivations::batch() const { return state_ ? state_->batch : 0; }
int64_t ByteLmCudaActivations::bytes() const {
  return state_ ? static_cast<int64_t>(state_->saved.bytes() + state_->scratch.bytes()) : 0;
}

// ---- Model. ---------------------------------------------------------------------------------------

ByteLmCuda::ByteLmCuda(const ByteLmConfig& config, Device* device, cudaStream_t stream, ByteLmCudaOptions options)
    : config_(config),
      device_(device),
      stream_(stream),
      options_(options),
      specs_(ByteLmParamSpecs(config)),
      modules_(GroupByModule(specs_)) {}

ByteLmCuda::~ByteLmCuda() {
  if (cublas_ != nullptr) cublasDestroy(cublas_);
}

Result<std::unique_ptr<ByteLmCuda>> ByteLmCuda::Create(const ByteLmConfig& config, Device* device, Stream* stream,
                                                       ByteLmCudaOptions options) {
  CudaDevice* cuda = device == nullptr ? nullptr : device->AsCuda();
  if (cuda == nullptr) {
    return InvalidArgumentError("byte_lm_cuda: device " + (device == nullptr ? std::string("null") : device->name()) +
                                " is not a CUDA device");
  }
  ZERO_RETURN_IF_ERROR(config.Validate());
  ZERO_CUDA_RETURN_IF_ERROR(cudaSetDevice(cuda->ordinal()));  // cuBLAS binds its handle to it
  std::unique_ptr<ByteLmCuda> model(new ByteLmCuda(config, device, cuda->native_stream(stream), options));
  ZERO_RETURN_IF_ERROR(model->Init());
  return std::move(model);
}

Status ByteLmCuda::Init() {
  ZERO_CUBLAS_RETURN_IF_ERROR(cublasCreate(&cublas_));
  ZERO_CUBLAS_RETURN_IF_ERROR(cublasSetStream(cublas_, stream_));
  ZERO_CUBLAS_RETURN_IF_ERROR(
      cublasSetMathMode(cublas_, options_.allow_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  int64_t max_module = 0;
  for (const ModuleSpec& m : modules_) {
    int64_t n = 0;
    for (int i : m.params) n += (specs_[i].numel() + 63) / 64 * 64;
    max_module = std::max(max_module, n);
  }
  workspace_.Reserve(&param_scratch_, max_module, "fp32 parameters of one module");
  workspace_.Reserve(&grad_scratch_, max_module, "fp32 gradients of one module");
  return workspace_.Allocate(device_).WithContext("byte_lm_cuda");
}

// C[m,n] = op(A)[m,k] op(B)[k,n] + beta C, all row-major. cuBLAS is column-major, where a row-major
// X is X^T, so it computes C^T = op(B)^T op(A)^T with the operands swapped.
Status ByteLmCuda::Gemm(bool trans_a, bool trans_b, int m, int n, int k, const float* a, int lda, const float* b,
                        int ldb, float* c, int ldc, float beta) {
  const float one = 1.0f;
  const cublasComputeType_t compute = options_.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  ZERO_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(cublas_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                           trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &one, b, CUDA_R_32F, ldb, a,
                                           CUDA_R_32F, lda, &beta, c, CUDA_R_32F, ldc, compute, CUBLAS_GEMM_DEFAULT));
  return OkStatus();
}

Status ByteLmCuda::Load(ModuleScope& scope, int m, std::vector<const float*>* out) {
  const ModuleSpec& mod = modules_[m];
  ZERO_ASSIGN_OR_RETURN(std::vector<ParamView> views, scope.Acquire());
  if (views.size() != mod.params.size()) {
    return InvalidArgumentError("module " + mod.name + ": provider returned " + std::to_string(views.size()) +
                                " views, expected " + std::to_string(mod.params.size()));
  }
  out->clear();
  size_t offset = 0;
  for (size_t j = 0; j < views.size(); ++j) {
    const ModelParamSpec& spec = specs_[mod.params[j]];
    const ParamView& v = views[j];
    if (v.data == nullptr) return InvalidArgumentError("parameter " + spec.name + ": null data");
    if (v.dtype == DType::kF32) {
      out->push_back(static_cast<const float*>(v.data));
      continue;
    }
    float* dst = param_scratch_ + offset;
    ZERO_RETURN_IF_ERROR(ToFloat(v.data, v.dtype, spec.numel(), dst, stream_));
    out->push_back(dst);
    offset += (spec.numel() + 63) / 64 * 64;
  }
  return OkStatus();
}

std::vector<float*> ByteLmCuda::GradSlots(int m) {
  std::vector<float*> slots;
  size_t offset = 0;
  for (int i : modules_[m].params) {
    slots.push_back(grad_scratch_ + offset);
    offset += (specs_[i].numel() + 63) / 64 * 64;
  }
  return slots;
}

Status ByteLmCuda::Emit(GradSink& sink, int m, int j, const float* g) {
  const int index = modules_[m].params[j];
  ZERO_ASSIGN_OR_RETURN(GradView view, sink.GradBuffer(index));
  if (view.data == nullptr) return InvalidArgumentError("gradient of " + specs_[index].name + ": null buffer");
  const size_t n = specs_[index].numel();
  if (view.dtype == DType::kF32) {
    ZERO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(view.data, g, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
  } else {
    ZERO_RETURN_IF_ERROR(FromFloat(g, n, view.data, view.dtype, stream_));
  }
  return sink.GradReady(index);
}

Status ByteLmCuda::Forward(ParamProvider& params, const uint8_t* tokens, int B, ByteLmCudaActivations* acts,
                           double* loss) {
  if (B < 1) return InvalidArgumentError("byte_lm forward: batch must be >= 1");
  if (tokens == nullptr || acts == nullptr) return InvalidArgumentError("byte_lm forward: null argument");
  const ByteLmConfig& c = config_;
  const int k = c.context, d = c.embed_dim, h = c.hidden, f = c.ffn, L = c.layers;
  const int K0 = k * d, V = kByteVocab;
  const size_t Bh = size_t(B) * h, Bf = size_t(B) * f;
  if (!acts->state_) acts->state_ = std::make_unique<ByteLmCudaActivations::State>();
  ByteLmCudaActivations::State& a = *acts->state_;
  a.has_forward = false;
  ZERO_RETURN_IF_ERROR(a.Reserve(c, B, device_, stream_));
  ZERO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(a.tokens, tokens, size_t(B) * (k + 1), cudaMemcpyHostToDevice, stream_));

  {
    ModuleScope scope(params, modules_[0].name);
    std::vector<const float*> p;
    ZERO_RETURN_IF_ERROR(Load(scope, 0, &p));
    ZERO_RETURN_IF_ERROR(EmbedGather(a.tokens, B, k, d, p[0], a.x0, stream_));
    ZERO_RETURN_IF_ERROR(scope.Close());
  }
  {
    ModuleScope scope(params, modules_[1].name);
    std::vector<const float*> p;
    ZERO_RETURN_IF_ERROR(Load(scope, 1, &p));
    ZERO_RETURN_IF_ERROR(Gemm(false, false, B, h, K0, a.x0, K0, p[0], h, a.resid, h, 0.0f));
    ZERO_RETURN_IF_ERROR(BiasResidual(a.resid, p[1], nullptr, B, h, stream_));
    ZERO_RETURN_IF_ERROR(scope.Close());
  }
  for (int l = 0; l < L; ++l) {
    ModuleScope scope(params, modules_[2 + l].name);
    std::vector<const float*> p;
    ZERO_RETURN_IF_ERROR(Load(scope, 2 + l, &p));
    const float* r = a.resid + l * Bh;
    float* rn = a.resid + (l + 1) * Bh;
    float* n = a.ln + l * Bh;
    float* pre = a.pre + l * Bf;
    float* act = a.act + l * Bf;
    ZERO_RETURN_IF_ERROR(
        LayerNormForward(r, p[0], p[1], B, h, c.layer_norm_eps, n, a.mean + l * B, a.rstd + l * B, stream_));
    ZERO_RETURN_IF_ERROR(Gemm(false, false, B, f, h, n, h, p[2], f, pre, f, 0.0f));
    ZERO_RETURN_IF_ERROR(BiasResidual(pre, p[3], nullptr, B, f, stream_));
    ZERO_RETURN_IF_ERROR(GeluForward(pre, Bf, act, stream_));
    ZERO_RETURN_IF_ERROR(Gemm(false, false, B, h, f, act, f, p[4], h, rn, h, 0.0f));
    ZERO_RETURN_IF_ERROR(BiasResidual(rn, p[5], r, B, h, stream_));
    ZERO_RETURN_IF_ERROR(scope.Close());
  }
  {
    ModuleScope scope(params, modules_[2 + L].name);
    std::vector<const float*> p;
    ZERO_RETURN_IF_ERROR(Load(scope, 2 + L, &p));
    float* n = a.ln + L * Bh;
    ZERO_RETURN_IF_ERROR(LayerNormForward(a.resid + L * Bh, p[0], p[1], B, h, c.layer_norm_eps, n, a.mean + L * B,
                                          a.rstd + L * B, stream_));
    ZERO_RETURN_IF_ERROR(Gemm(false, false, B, V, h, n, h, p[2], V, a.logits, V, 0.0f));
    ZERO_RETURN_IF_ERROR(BiasResidual(a.logits, p[3], nullptr, B, V, stream_));
    ZERO_RETURN_IF_ERROR(scope.Close());
  }
  SoftmaxLossKernel<<<B, kByteVocab, 0, stream_>>>(a.logits, a.tokens, k, a.lse, a.row_loss);
  ZERO_CUDA_RETURN_IF_LAUNCH_FAILED(SoftmaxLoss);
  MeanLossKernel<<<1, kThreads, 0, stream_>>>(a.row_loss, B, a.loss);
  ZERO_CUDA_RETURN_IF_LAUNCH_FAILED(MeanLoss);
  a.has_forward = true;
  if (loss != nullptr) {
    ZERO_ASSIGN_OR_RETURN(*loss, ReadLoss(*acts));
  }
  return OkStatus();
}

Result<double> ByteLmCuda::ReadLoss(const ByteLmCudaActivations& acts) {
  if (!acts.state_ || !acts.state_->has_forward) {
    return FailedPreconditionError("byte_lm: no forward on these activations");
  }
  double loss = 0.0;
  ZERO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&loss, acts.state_->loss, sizeof(double), cudaMemcpyDeviceToHost, stream_));
  ZERO_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return loss;
}

Status ByteLmCuda::Backward(ParamProvider& params, ByteLmCudaActivations* acts, float loss_scale, GradSink& grads) {
  if (acts == nullptr || !acts->state_ || !acts->state_->has_forward) {
    return FailedPreconditionError("byte_lm backward: no forward on these activations");
  }
  const ByteLmConfig& c = config_;
  const int k = c.context, d = c.embed_dim, h = c.hidden, f = c.ffn, L = c.layers;
  const int K0 = k * d, V = kByteVocab;
  ByteLmCudaActivations::State& a = *acts->state_;
  const int B = a.batch;
  const size_t Bh = size_t(B) * h, Bf = size_t(B) * f;

  const float coef = loss_scale / float(B);
  SoftmaxBackwardKernel<<<B, kByteVocab, 0, stream_>>>(a.logits, a.lse, a.tokens, k, coef, a.dlogits);
  ZERO_CUDA_RETURN_IF_LAUNCH_FAILED(SoftmaxBackward);

  {
    const int m = 2 + L;
    ModuleScope scope(params, modules_[m].name);
    std::vector<const float*> p;
    ZERO_RETURN_IF_ERROR(Load(scope, m, &p));
    std::vector<float*> g = GradSlots(m);
    ZERO_RETURN_IF_ERROR(Gemm(true, false, h, V, B, a.ln + L * Bh, h, a.dlogits, V, g[2], V, 0.0f));
    ZERO_RETURN_IF_ERROR(Emit(grads, m, 2, g[2]));
    ZERO_RETURN_IF_ERROR(ColumnSum(a.dlogits, B, V, g[3], stream_));
    ZERO_RETURN_IF_ERROR(Emit(grads, m, 3, g[3]));
    ZERO_RETURN_IF_ERROR(Gemm(false, true, B, h, V, a.dlogits, V, p[2], V, a.dln, h, 0.0f));
    ZERO_RETURN_IF_ERROR(LayerNormBackward(a.resid + L * Bh, a.mean + L * B, a.rstd + L * B, p[0], a.dln, B, h,
                                           /*accumulate=*/false, a.dresid, g[0], g[1], stream_));
    ZERO_RETURN_IF_ERROR(Emit(grads, m, 0, g[0]));
    ZERO_RETURN_IF_ERROR(Emit(grads, m, 1, g[1]));
    ZERO_RETURN_IF_ERROR(scope.Close());
  }
  for (int l = L - 1; l >= 0; --l) {
    const int m = 2 + l;
    ModuleScope scope(params, modules_[m].name);
    std::vector<const float*> p;
    ZERO_RETURN_IF_ERROR(Load(scope, m, &p));
    std::vector<float*> g = GradSlots(m);
    const float* pre = a.pre + l * Bf;
    const float* act = a.act + l * Bf;
    ZERO_RETURN_IF_ERROR(Gemm(true, false, f, h, B, act, f, a.dresid, h, g[4], h, 0.0f));
    ZERO_RETURN_IF_ERROR(Emit(grads, m, 4, g[4]));
    ZERO_RETURN_IF_ERROR(ColumnSum(a.dresid, B, h, g[5], stream_));
    ZERO_RETURN_IF_ERROR(Emit(grads, m, 5, g[5]));
    ZERO_RETURN_IF_ERROR(Gemm(false, true, B, f, h, a.dresid, h, p[4], h, a.dact, f, 0.0f));
    ZERO_RETURN_IF_ERROR(GeluBackward(pre, Bf, a.dact, stream_));
    ZERO_RETURN_IF_ERROR(Gemm(true, false, h, f, B, a.ln + l * Bh, h, a.dact, f, g[2], f, 0.0f));
    ZERO_RETURN_IF_ERROR(Emit(grads, m, 2, g[2]));
    ZERO_RETURN_IF_ERROR(ColumnSum(a.dact, B, f, g[3], stream_));
    ZERO_RETURN_IF_ERROR(Emit(grads, m, 3, g[3]));
    ZERO_RETURN_IF_ERROR(Gemm(false, true, B, h, f, a.dact, f, p[2], f, a.dln, h, 0.0f));
    ZERO_RETURN_IF_ERROR(LayerNormBackward(a.resid + l * Bh, a.mean + l * B, a.rstd + l * B, p[0], a.dln, B, h,
                                           /*accumulate=*/true, a.dresid, g[0], g[1], stream_));
    ZERO_RETURN_IF_ERROR(Emit(grads, m, 0, g[0]));
    ZERO_RETURN_IF_ERROR(Emit(grads, m, 1, g[1]));
    ZERO_RETURN_IF_ERROR(scope.Close());
  }
  {
    ModuleScope scope(params, modules_[1].name);
    std::vector<const float*> p;
    ZERO_RETURN_IF_ERROR(Load(scope, 1, &p));
    std::vector<float*> g = GradSlots(1);
    ZERO_RETURN_IF_ERROR(Gemm(true, false, K0, h, B, a.x0, K0, a.dresid, h, g[0], h, 0.0f));
    ZERO_RETURN_IF_ERROR(Emit(grads, 1, 0, g[0]));
    ZERO_RETURN_IF_ERROR(ColumnSum(a.dresid, B, h, g[1], stream_));
    ZERO_RETURN_IF_ERROR(Emit(grads, 1, 1, g[1]));
    ZERO_RETURN_IF_ERROR(Gemm(false, true, B, K0, h, a.dresid, h, p[0], h, a.dx0, K0, 0.0f));
    ZERO_RETURN_IF_ERROR(scope.Close());
  }
  {
    ModuleScope scope(params, modules_[0].name);
    std::vector<const float*> p;
    ZERO_RETURN_IF_ERROR(Load(scope, 0, &p));
    std::vector<float*> g = GradSlots(0);
    ZERO_RETURN_IF_ERROR(EmbedScatter(a.tokens, B, k, d, a.dx0, g[0], stream_));
    ZERO_RETURN_IF_ERROR(Emit(grads, 0, 0, g[0]));
    ZERO_RETURN_IF_ERROR(scope.Close());
  }
  return OkStatus();
}

}  // namespace zero::examples
