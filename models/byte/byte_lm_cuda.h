// ByteLmCuda: ByteLm (byte_lm.h) on one GPU: the same function, parameter list, module order,
// callbacks and scaling as ByteLmCpu, with cuBLAS matmuls and small kernels for the rest.
//
// All parameter and gradient views are device pointers on the model's CUDA device. Parameters in
// bf16/fp16 are converted to fp32 copies while their module runs and the math is fp32 throughout
// (cuBLAS with CUBLAS_COMPUTE_32F; TF32 only if allow_tf32). Gradients are computed in fp32 and
// converted into the sink's buffer dtype with round-to-nearest-even (dtype.h's conversions).
//
// Ordering: every copy and kernel is enqueued on the stream given at creation (a stream of the
// model's device), which must outlive the model. Forward/Backward return once the work is enqueued (except
// that Forward waits for the loss when asked for it). A ParamProvider must make a module's data
// ready for work enqueued on that stream after Acquire returns, and must keep it alive until the
// stream passes the point where Release was called (record an event there); GradReady(i) means the
// writes of gradient i are enqueued on the stream, so a sink records an event before reducing on
// another stream. The embedding backward sums in a fixed order (no atomics), so results are
// bitwise reproducible run to run on one GPU model.
//
// Owns: its cuBLAS handle and fp32 scratch for one module's parameters and gradients (a
// "workspace" DeviceArena); ByteLmCudaActivations owns the device activations ("activations" and
// "workspace" arenas). All device memory comes from the Device given at creation (a CudaDevice,
// reached through Device::AsCuda), so its memory_stats() count it. Not thread-safe; one model per
// stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "models/byte/byte_lm.h"
#include "models/model_api.h"
#include "runtime/device_arena.h"
#include "runtime/status.h"

struct cublasContext;

namespace zero::examples {

// Device memory for what Forward saves and Backward's scratch, grown on demand to the batch, from
// the Device of the model that fills it (which must outlive it).
class ByteLmCudaActivations {
 public:
  ByteLmCudaActivations();
  ~ByteLmCudaActivations();
  ByteLmCudaActivations(ByteLmCudaActivations&&) noexcept;
  ByteLmCudaActivations& operator=(ByteLmCudaActivations&&) noexcept;

  int batch() const;
  // Device bytes held now.
  int64_t bytes() const;

  struct State;  // defined in byte_lm_cuda.cu

 private:
  friend class ByteLmCuda;
  std::unique_ptr<State> state_;
};

struct ByteLmCudaOptions {
  // TF32 tensor-core matmuls: faster on large widths, ~1e-3 relative error instead of ~1e-6.
  bool allow_tf32 = false;
};

class ByteLmCuda {
 public:
  // Makes `device` current and creates the cuBLAS handle, bound to `stream`. `device` must be a
  // CudaDevice (Device::AsCuda; otherwise InvalidArgument) and outlive the model and every
  // ByteLmCudaActivations it fills; `stream` is one of its streams (null: its default stream;
  // REQUIRES a stream of this device).
  static Result<std::unique_ptr<ByteLmCuda>> Create(const ByteLmConfig& config, Device* device, Stream* stream,
                                                    ByteLmCudaOptions options = {});
  ~ByteLmCuda();
  ByteLmCuda(const ByteLmCuda&) = delete;
  ByteLmCuda& operator=(const ByteLmCuda&) = delete;

  const ByteLmConfig& config() const { return config_; }
  const std::vector<ModelParamSpec>& specs() const { return specs_; }
  const std::vector<ModuleSpec>& modules() const { return modules_; }
  Device* device() const { return device_; }
  cudaStream_t stream() const { return stream_; }

  // tokens: HOST memory, `batch` rows of context+1 bytes (copied before this returns). If `loss`
  // is not null, waits for the stream and writes the mean cross-entropy; otherwise the loss stays
  // on the device until ReadLoss.
  Status Forward(ParamProvider& params, const uint8_t* tokens, int batch, ByteLmCudaActivations* acts, double* loss);
  // Waits for the stream and returns the loss of the last Forward on `acts`.
  Result<double> ReadLoss(const ByteLmCudaActivations& acts);

  // As ByteLmCpu::Backward: gradients of loss_scale * loss, overwritten in the sink's buffers,
  // reported ready module by module in reverse order.
  Status Backward(ParamProvider& params, ByteLmCudaActivations* acts, float loss_scale, GradSink& grads);

 private:
  ByteLmCuda(const ByteLmConfig& config, Device* device, cudaStream_t stream, ByteLmCudaOptions options);
  Status Init();
  Status Load(ModuleScope& scope, int module, std::vector<const float*>* out);
  std::vector<float*> GradSlots(int module);
  Status Emit(GradSink& sink, int module, int j, const float* g);
  Status Gemm(bool trans_a, bool trans_b, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
              float* c, int ldc, float beta);

  ByteLmConfig config_;
  Device* device_;
  cudaStream_t stream_;
  ByteLmCudaOptions options_;
  std::vector<ModelParamSpec> specs_;
  std::vector<ModuleSpec> modules_;
  cublasContext* cublas_ = nullptr;
  DeviceArena workspace_{"workspace"};
  float* param_scratch_ = nullptr;  // in workspace_, max module numel
  float* grad_scratch_ = nullptr;   // in workspace_, max module numel
};

}  // namespace zero::examples
