// The benchmark model of bench/mlp_bench on the GPU: a stack of residual MLP blocks in bf16,
//   x_{l+1} = x_l + fc2(relu(fc1(x_l))),  fc1: Linear(dim -> ffn), fc2: Linear(ffn -> dim)
// with loss = mean(x_L^2) (fp32), on synthetic input. The same model as bench/fsdp2_reference.py.
//
// Parameters are not owned here: the caller passes each block's bf16 device pointers (PyTorch's
// nn.Linear layout, weight [out, in] row-major, then bias [out]) to every call, so the Engine (or
// plain buffers, for the compute-only mode) owns them. Owns its cuBLAS handle and the workspace for
// column sums and the loss (a "workspace" DeviceArena of the Device given to Create); the
// activations live in device memory the caller allocates (ActivationBytes) and binds. Both count in
// the Device's memory statistics.
//
// Arithmetic: cuBLAS bf16 GEMMs with fp32 accumulation (CUBLAS_COMPUTE_32F); bias, ReLU, residual
// and the loss gradient in fp32 registers, rounded to bf16 once per stored tensor; bias gradients
// summed in fp32 in a fixed order. Everything runs on the stream given to Create (the Engine's
// compute stream) in issue order; no call synchronizes except ReadLoss.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "runtime/device.h"
#include "runtime/device_arena.h"
#include "runtime/dtype.h"  // ZERO_HD
#include "runtime/status.h"

namespace zero::bench {

struct MlpShape {
  int64_t tokens = 8192;  // rows of the batch
  int64_t dim = 4096;
  int64_t ffn = 16384;
  int blocks = 8;
};

// bf16 device pointers of one block's parameters.
struct MlpBlockParams {
  const void* w1 = nullptr;  // [ffn, dim]
  const void* b1 = nullptr;  // [ffn]
  const void* w2 = nullptr;  // [dim, ffn]
  const void* b2 = nullptr;  // [dim]
};

// The synthetic values both implementations use (bench/fsdp2_reference.py computes the same
// function bit for bit): element i of stream s is (2 u - 1) * bound with u = (Mix32(i ^ key) >> 8)
// / 2^24 and key = Mix32(s * 0x9E3779B9 + 0x632BE5AB) (32-bit wrap-around arithmetic).
ZERO_HD uint32_t Mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}
ZERO_HD uint32_t HashKey(uint32_t stream) { return Mix32(stream * 0x9E3779B9u + 0x632BE5ABu); }
// Every step is exact except the final product (one rounding), so host, device and PyTorch agree.
ZERO_HD float HashUniform(uint32_t key, uint32_t index, float bound) {
  const float u = static_cast<float>(Mix32(index ^ key) >> 8) * (1.0f / 16777216.0f);
  return (u * 2.0f - 1.0f) * bound;
}

class MlpCuda {
 public:
  // Validates the shape (dim and ffn multiples of 64, tokens >= 1), makes `device` current, creates
  // the cuBLAS handle on `stream` and the small workspaces (from `device`). `device` must be a
  // CudaDevice (Device::AsCuda; otherwise InvalidArgument) and outlive the model; `stream` is one of
  // its streams (null: its default stream; REQUIRES a stream of this device).
  static Result<std::unique_ptr<MlpCuda>> Create(const MlpShape& shape, Device* device, Stream* stream);
  ~MlpCuda();
  MlpCuda(const MlpCuda&) = delete;
  MlpCuda& operator=(const MlpCuda&) = delete;

  // Device bytes of the activations: x_0..x_L [tokens, dim], relu outputs a_0..a_{L-1}
  // [tokens, ffn], the running input gradient [tokens, dim] and one [tokens, ffn] scratch.
  static size_t ActivationBytes(const MlpShape& shape);
  // `activations`: at least ActivationBytes() of device memory, 256-byte aligned, alive while used.
  Status Bind(void* activations, size_t bytes);

  // x_0 = bf16(HashUniform(HashKey(stream_id), i, 1)).
  Status FillInput(uint32_t stream_id);
  // dst[i] = bf16(HashUniform(HashKey(stream_id), i, bound)) (engine-less parameters).
  Status FillUniform(void* dst_bf16, size_t n, uint32_t stream_id, float bound);

  // x_{l+1} from x_l (blocks in order 0..L-1).
  Status ForwardBlock(int l, const MlpBlockParams& p);
  // After block L-1: loss = mean(x_L^2) into device memory, and the gradient bf16(x_L * (2/n *
  // grad_scale)) (grad_scale: the engine's gradient_scale(), 1/GAS in managed accumulation).
  Status Loss(float grad_scale = 1.0f);
  // Copies the last Loss() out; synchronizes the stream.
  Result<double> ReadLoss();

  // Backward of block l (l = L-1 down to 0), in the order the gradients become final:
  //   BackwardFc2: db2 = colsum(g), dw2 = g^T a_l, then da = (g w2) * [a_l > 0]
  //   BackwardFc1: db1 = colsum(da), dw1 = da^T x_l
  //   BackwardInput (l > 0 only; the input needs no gradient): g += da w1 (the residual keeps g)
  // Gradient outputs are bf16 device buffers of the parameter's full shape, overwritten.
  Status BackwardFc2(int l, const MlpBlockParams& p, void* db2, void* dw2);
  Status BackwardFc1(int l, const MlpBlockParams& p, void* db1, void* dw1);
  Status BackwardInput(int l, const MlpBlockParams& p);

  const MlpShape& shape() const { return shape_; }

 private:
  MlpCuda(const MlpShape& shape, Device* device, cudaStream_t stream)
      : shape_(shape), device_(device), stream_(stream) {}
  Status Init();
  // Row-major C[m,n] = op(A) op(B) + beta C, bf16 in and out, fp32 accumulation.
  Status Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda, const void* b,
              int64_t ldb, void* c, int64_t ldc, float beta);
  Status ColumnSum(const void* x, int64_t rows, int64_t cols, void* out_bf16);

  MlpShape shape_;
  Device* device_;
  cudaStream_t stream_;
  void* cublas_ = nullptr;              // cublasHandle_t
  DeviceArena workspace_{"workspace"};  // the three below
  float* colsum_partial_ = nullptr;
  double* loss_partial_ = nullptr;
  double* loss_ = nullptr;
  // Views into the bound activations.
  uint16_t* x_ = nullptr;   // (L+1) x [tokens, dim]
  uint16_t* a_ = nullptr;   // L x [tokens, ffn]
  uint16_t* g_ = nullptr;   // [tokens, dim]
  uint16_t* da_ = nullptr;  // [tokens, ffn]
};

}  // namespace zero::bench
