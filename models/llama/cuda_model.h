// LlmCuda: the transformer of models/llama (Hugging Face LlamaForCausalLM / Qwen3ForCausalLM) on
// one GPU, computing what LlmCpu (llm_cpu.h) computes, with the same parameter list, module
// protocol, gradient protocol and loss scaling.
//
// Numerics. Parameter and gradient views are device pointers on the current device, each in its
// own dtype (bf16, the main case, fp32 or fp16). The model computes in a compute dtype, bf16 or
// fp32 (LlmCudaOptions::compute; by default the embedding's dtype, fp32 for fp16): matrix-product
// inputs (normalized activations, q/k/v, attention output, SwiGLU product, gradients fed to the
// products) are stored in it, and every product runs on cuBLAS with fp32 accumulation
// (CUBLAS_COMPUTE_32F, reduced-precision reductions disallowed; plain fp32 arithmetic, no TF32, in
// fp32). A linear weight whose dtype is not the compute dtype is converted into a scratch copy
// while its module is held. The residual stream and its gradient stay in fp32 (unlike Hugging
// Face's bf16 stream: one rounding fewer per layer, 4 bytes per element of each saved layer
// input); the residual adds are fused into the products (beta = 1). Norm statistics, softmax
// statistics, attention scores and accumulators are fp32; RMSNorm, RoPE (LlmCpu's tables), SwiGLU
// and cross-entropy follow LlmCpu's formulas operation by operation, so with fp32 compute the two
// differ only by summation order, libm ulps and the cross-entropy's online rescaling of its sum. Gradients are computed
// with fp32 accumulation and rounded once into the sink's dtype (round to nearest even).
//
// Memory and work. Attention is flash style: the seq x seq scores never reach global memory (the
// forward saves each row's log-sum-exp; the backward recomputes scores tile by tile). The lm_head
// and cross-entropy run over row chunks whose fp32 logits stay under
// LlmCudaOptions::logits_chunk_bytes; the forward keeps no logits (the backward recomputes them,
// fused with dlogits), and Forward(want_loss = false) skips them altogether (the loss is then
// available through ReadLoss after Backward). With activation_checkpointing each layer keeps only
// its input and the backward recomputes the layer's forward from it.
//
// Protocol (models/llama's contract): Forward acquires "embed", "layer0".."layer<L-1>", "head"
// (plus "embed" while "head" is held when tie_word_embeddings, released embed then head);
// Backward acquires "head" (+ "embed" when tied), the layers in reverse, "embed". When tied, the
// lm_head's part of the embedding gradient is kept in an fp32 [V, H] scratch owned by the
// activations, the lookup's part is added to it in a fixed order, and it is converted into
// GradBuffer(0) with one GradReady(0) at the end. A batch with LlmBatch::head k >= 1 takes its logits from extra
// head k-1 ("extra_head<k-1>" acquired while "head" is held, in place of "embed" when tied), as
// LlmCpu does. Every gradient's GradReady comes after its writes
// are enqueued and before its module is released.
//
// Memory: every device buffer comes from the Device given at creation (a CudaDevice, reached
// through Device::AsCuda), as DeviceArenas (runtime/device_arena.h), so its memory_stats() count
// it: the activations' arenas are labelled "activations" (what Forward saves for Backward) and
// "workspace" (Backward's scratch, the logits chunk), the model's own scratch (converted weights,
// the fp32 gradient stage) "workspace". The ids' staging is the Device's pinned memory.
//
// Ordering and determinism: all work is enqueued on the stream given at creation (a stream of the
// device, which must outlive the model); nothing waits for the device except Forward with
// want_loss and ReadLoss. Every reduction has a fixed order (no float atomics; the embedding
// gradient sums token positions sorted by id on the host), so two runs give identical bits on one
// GPU model and toolkit. Not thread-safe; one model per stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/llama/batch.h"
#include "models/llama/config.h"
#include "models/model_api.h"
#include "runtime/dtype.h"
#include "runtime/status.h"

struct cublasContext;

namespace zero {
class Device;
class Stream;
}  // namespace zero

namespace zero::llm {

// Which attention kernels run: kAuto takes cuDNN's fused attention (llm_attention_cudnn.h) for bf16
// compute when this build has cuDNN and cuDNN has a deterministic plan for the shape, else the
// model's own kernels (llm_kernels.cuh); kCudnn insists (an error where it cannot); kKernel never
// uses cuDNN. fp32 compute always runs the model's own kernels.
enum class LlmAttention { kAuto, kKernel, kCudnn };

struct LlmCudaOptions {
  // Keep only each layer's input in Forward; Backward recomputes the layer's forward.
  bool activation_checkpointing = false;
  // The compute dtype (kF32 or kBF16); unset: bf16 when the embedding parameter is bf16, else fp32.
  std::optional<DType> compute;
  // Upper bound of the fp32 logits of one lm_head/cross-entropy chunk (at least one row a chunk).
  int64_t logits_chunk_bytes = int64_t{1} << 30;
  // Time every operation on the device (one event after each; TakeProfile reports them).
  bool profile = false;
  LlmAttention attention = LlmAttention::kAuto;
};

// The device time of one kind of operation (LlmCuda::TakeProfile).
struct LlmOpTime {
  std::string name;  // "gemm_fwd", "attention_backward", "load" (acquire + convert), ...
  double ms = 0.0;
  int64_t count = 0;
};

// Device memory for what Forward saves for Backward and Backward's scratch, sized by Forward for
// its batch and reused while the shape stays the same; also the tied embedding's gradient scratch.
// Allocated from the Device of the LlmCuda that fills it (which must outlive it). Belongs to one
// LlmCuda at a time.
class LlmCudaActivations {
 public:
  LlmCudaActivations();
  ~LlmCudaActivations();
  LlmCudaActivations(LlmCudaActivations&&) noexcept;
  LlmCudaActivations& operator=(LlmCudaActivations&&) noexcept;

  int batch() const;
  int seq() const;
  // The number of targets that are not kIgnoreIndex in the last Forward's batch.
  int64_t counted_targets() const;
  // Device bytes held now: activation_bytes() and the workspace (Backward's scratch, the [V, H]
  // scratch).
  int64_t bytes() const;
  // Of bytes(): what Forward saves for Backward (the "activations" arena).
  int64_t activation_bytes() const;

  struct State;  // defined in cuda_model.cu

 private:
  friend class LlmCuda;
  std::unique_ptr<State> state_;
};

class LlmCuda {
 public:
  // Validates the config and options, makes `device` current and creates the cuBLAS handle bound
  // to `stream`. `device` must be a CudaDevice (Device::AsCuda) and outlive the model and every
  // LlmCudaActivations it fills; `stream` is one of its streams (null: its default stream; REQUIRES
  // a stream of this device). Errors: a device that is not a CUDA device (InvalidArgument), an
  // invalid config, options (compute not fp32/bf16, chunk bytes < 1), a head_dim above the
  // attention kernels' limit (256), a CUDA or cuBLAS failure.
  static Result<std::unique_ptr<LlmCuda>> Create(const LlmConfig& config, Device* device, Stream* stream,
                                                 LlmCudaOptions options = {});
  ~LlmCuda();
  LlmCuda(const LlmCuda&) = delete;
  LlmCuda& operator=(const LlmCuda&) = delete;

  const LlmConfig& config() const { return config_; }
  const LlmCudaOptions& options() const { return options_; }
  const std::vector<examples::ModelParamSpec>& specs() const { return specs_; }
  const std::vector<examples::ModuleSpec>& modules() const { return modules_; }
  Device* device() const { return device_; }
  cudaStream_t stream() const { return stream_; }

  // Runs the forward of `batch` (host memory, copied before this returns), saving what Backward
  // needs in `acts`. With want_loss, computes the mean cross-entropy (nats) over the targets that
  // are not kIgnoreIndex (0 when none is), waits for the stream and returns it. Without, it leaves
  // out the logits, does not wait, and returns NaN; Backward then computes the loss, which ReadLoss
  // returns. Errors: a batch that fails batch.Validate(vocab_size, max_position_embeddings)
  // (naming row and position), provider errors, views that do not match their module (count,
  // null data), CUDA/cuBLAS errors (naming the call), device memory exhausted.
  Result<double> Forward(examples::ParamProvider& params, const LlmBatch& batch, LlmCudaActivations* acts,
                         bool want_loss = true);

  // Waits for the stream and returns the loss of the last Forward(want_loss) or Backward on
  // `acts`. FailedPrecondition when neither has run since the last Forward.
  Result<double> ReadLoss(const LlmCudaActivations& acts);

  // Gradients of loss_scale * loss for the batch of the last Forward on `acts` (not consumed:
  // calling it twice gives the same gradients). Each gradient buffer is overwritten (never
  // accumulated) and reported ready once. Returns once the work is enqueued. On error some
  // gradients may have been written and reported ready. REQUIRES: Forward on `acts` by this model
  // (checked: FailedPrecondition).
  Status Backward(examples::ParamProvider& params, LlmCudaActivations* acts, float loss_scale,
                  examples::GradSink& grads);

  // With LlmCudaOptions::profile: waits for the stream and returns the device time of each kind of
  // operation since the last call, summed (the time from one operation's end to the next one's,
  // so gaps while the stream idles count to the operation after them). Empty without profile.
  Result<std::vector<LlmOpTime>> TakeProfile();

  // "cudnn" or "kernel": the attention the last Forward ran ("" before any); with kAuto, why cuDNN
  // was not used is in attention_note().
  std::string attention_backend() const;
  std::string attention_note() const;

  class Impl;  // cuda_model.cu

 private:
  LlmCuda(const LlmConfig& config, Device* device, cudaStream_t stream, LlmCudaOptions options);

  LlmConfig config_;
  Device* device_;
  cudaStream_t stream_;
  LlmCudaOptions options_;
  std::vector<examples::ModelParamSpec> specs_;
  std::vector<examples::ModuleSpec> modules_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zero::llm
