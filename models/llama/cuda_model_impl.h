// LlmCuda::Impl (cuda_model.h's LlmCuda): the class both of its source files define, and what
// the activations hold (LlmCudaActivations::State). cuda_model.cu has the model's driver: the
// module protocol, Forward/Backward over the layers, the loss head, the buffers and the parameter
// and gradient plumbing; cuda_model_layer.cu has one decoder layer's forward and backward, the
// cuBLAS products and the choice of attention. Internal to the cuda_model target: included only by
// those two files.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "models/llama/attention_cudnn.h"
#include "models/llama/cpu_model.h"
#include "models/llama/cuda_model.h"
#include "models/llama/kernels.cuh"
#include "models/llama/params.h"
#include "runtime/cuda_status.h"
#include "runtime/device.h"
#include "runtime/device_arena.h"

namespace zero::llm {

using examples::GradSink;
using examples::GradView;
using examples::ModelParamSpec;
using examples::ModuleScope;
using examples::ModuleSpec;
using examples::ParamProvider;
using examples::ParamView;

namespace cuda_model_internal {

struct EventDestroy {
  void operator()(CUevent_st* e) const { cudaEventDestroy(e); }
};
using EventPtr = std::unique_ptr<CUevent_st, EventDestroy>;

inline size_t AlignUp(size_t bytes) {
  return (bytes + DeviceArena::kAlignment - 1) / DeviceArena::kAlignment * DeviceArena::kAlignment;
}

// *ptr: `count` elements of device memory in `arena` (one region), allocated on first use.
template <typename T>
Status EnsureWorkspace(Device* device, DeviceArena& arena, T** ptr, int64_t count, const char* what) {
  if (*ptr != nullptr) return OkStatus();
  arena.Clear();
  arena.Reserve(ptr, count, what);
  return arena.Allocate(device).WithContext(std::string("llm_cuda: ") + what);
}

inline cudaDataType_t CudaType(DType t) {
  switch (t) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kBF16:
      return CUDA_R_16BF;
    default:
      return CUDA_R_16F;
  }
}

inline void* At(void* base, DType t, int64_t i) { return ElementPtr(base, t, i); }

// What one layer's forward saves (compute dtype unless fp32 is named).
struct LayerBuffers {
  float* rstd1 = nullptr;   // [N]
  void* xn1 = nullptr;      // [N, H] input_layernorm output
  void* q_raw = nullptr;    // [N, QD] qk_norm only: before the per-head norm
  void* k_raw = nullptr;    // [N, KVD]
  float* q_rstd = nullptr;  // [N * nh]
  float* k_rstd = nullptr;  // [N * nkv]
  void* q = nullptr;        // [N, QD] after norm and RoPE
  void* k = nullptr;        // [N, KVD]
  void* v = nullptr;        // [N, KVD]
  void* o = nullptr;        // [N, QD] attention output
  float* lse = nullptr;     // [B, nh, S]
  float* h_mid = nullptr;   // [N, H] fp32 residual after attention
  float* rstd2 = nullptr;   // [N]
  void* xn2 = nullptr;      // [N, H]
  void* g = nullptr;        // [N, I] gate projection
  void* u = nullptr;        // [N, I] up projection
  void* act = nullptr;      // [N, I] silu(g) * u (with checkpointing, refilled by the backward)
};

// A module's parameters as the kernels take them.
struct Weights {
  std::vector<const void*> data;
  std::vector<DType> dtype;
};

// The device time of each kind of operation (LlmCudaOptions::profile): Begin() records an event
// that starts a segment, each Mark(name) records one after the operation it names was enqueued, so
// on the one stream the time between an event and the one before it is that operation's. Disabled,
// each call is one branch.
class OpProfiler {
 public:
  void Init(bool enabled, cudaStream_t stream) {
    enabled_ = enabled;
    stream_ = stream;
  }
  void Begin() { Record(nullptr); }
  void Mark(const char* name) { Record(name); }

  // Waits for the stream and sums the marks since the last call by name (first-seen order).
  Result<std::vector<LlmOpTime>> Take() {
    std::vector<LlmOpTime> out;
    if (!enabled_) return out;
    ZERO_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    for (size_t i = 1; i < marks_.size(); ++i) {
      if (marks_[i].name == nullptr) continue;
      float ms = 0.0f;
      ZERO_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, events_[i - 1].get(), events_[i].get()));
      auto it = std::find_if(out.begin(), out.end(), [&](const LlmOpTime& t) { return t.name == marks_[i].name; });
      if (it == out.end()) it = out.insert(out.end(), LlmOpTime{marks_[i].name, 0.0, 0});
      it->ms += ms;
      ++it->count;
    }
    marks_.clear();
    return out;
  }

 private:
  struct MarkAt {
    const char* name;
  };
  void Record(const char* name) {
    if (!enabled_ || failed_) return;
    if (marks_.size() == events_.size()) {
      cudaEvent_t e = nullptr;
      if (cudaEventCreate(&e) != cudaSuccess) {
        cudaGetLastError();
        failed_ = true;  // profiling stops; the model goes on
        return;
      }
      events_.emplace_back(e);
    }
    if (cudaEventRecord(events_[marks_.size()].get(), stream_) != cudaSuccess) {
      cudaGetLastError();
      failed_ = true;
      return;
    }
    marks_.push_back({name});
  }

  bool enabled_ = false, failed_ = false;
  cudaStream_t stream_ = nullptr;
  std::vector<EventPtr> events_;  // reused: events_[i] belongs to marks_[i]
  std::vector<MarkAt> marks_;
};

}  // namespace cuda_model_internal

using cuda_model_internal::AlignUp;
using cuda_model_internal::At;
using cuda_model_internal::CudaType;
using cuda_model_internal::EnsureWorkspace;
using cuda_model_internal::EventPtr;
using cuda_model_internal::LayerBuffers;
using cuda_model_internal::OpProfiler;
using cuda_model_internal::Weights;

// ---- Activations. ---------------------------------------------------------------------------------

struct LlmCudaActivations::State {
  // The shape the buffers were made for.
  const void* owner = nullptr;
  int batch = 0, seq = 0;
  DType compute = DType::kF32;
  bool checkpointing = false;
  int64_t chunk_rows = 0;
  bool allocated = false;

  bool has_forward = false;
  bool loss_ready = false;
  OutputHead out;  // the last Forward's output head (LlmBatch::head)
  int64_t counted = 0;
  int64_t num_unique = 0;

  // What Forward saves for Backward (with the batch's ids and RoPE tables, and the loss), and
  // Backward's scratch (with the lm_head's logits chunk); both from the model's Device.
  DeviceArena saved{"activations"};
  DeviceArena scratch{"workspace"};
  PinnedBuffer pinned;  // staging of the ids: [inputs N][targets N][positions N][unique ids N][starts N+1]
  EventPtr upload_done;
  std::vector<float> rope_cos_host, rope_sin_host;

  int32_t *inputs = nullptr, *targets = nullptr, *positions = nullptr, *unique_ids = nullptr, *starts = nullptr;
  float *rope_cos = nullptr, *rope_sin = nullptr;
  float* hs = nullptr;               // [L + 1, N, H] fp32: each layer's input, then the final norm's input
  std::vector<LayerBuffers> layers;  // L, or 1 reused by every layer with checkpointing

  // Workspace.
  float* dh = nullptr;                                // [N, H] gradient of the residual stream
  void* dh_t = nullptr;                               // [N, H] dh in the compute dtype (= dh for fp32)
  float* dxn = nullptr;                               // [N, H] gradient of a norm's output
  float* da = nullptr;                                // [N, I]
  void* dg = nullptr;                                 // [N, I]
  void* du = nullptr;                                 // [N, I]
  void* dout = nullptr;                               // [N, QD] gradient of the attention output
  float* delta = nullptr;                             // [B, nh, S]
  float *dq = nullptr, *dk = nullptr, *dv = nullptr;  // [N, QD], [N, KVD], [N, KVD]
  void *dq_t = nullptr, *dk_t = nullptr, *dv_t = nullptr;
  float* partial = nullptr;  // column-reduction partial sums

  // Head.
  void* xnF = nullptr;        // [N, H] final norm output
  float* rstdF = nullptr;     // [N]
  float* logits = nullptr;    // [chunk_rows, V] fp32
  void* dlogits = nullptr;    // [chunk_rows, V]
  float* row_loss = nullptr;  // [N]
  double* loss_sum = nullptr;

  // [V, H] fp32: the tied embedding's gradient while it is assembled, or the lm_head's gradient
  // summed over chunks when its buffer is 16-bit (allocated on first use).
  DeviceArena vh_arena{"workspace"};
  float* vh = nullptr;

  int64_t Bytes() const { return static_cast<int64_t>(saved.bytes() + scratch.bytes() + vh_arena.bytes()); }
};

// ---- The model. -----------------------------------------------------------------------------------
class LlmCuda::Impl {
 public:
  using State = LlmCudaActivations::State;

  Impl(const LlmConfig& c, const std::vector<ModelParamSpec>& specs, const std::vector<ModuleSpec>& modules,
       Device* device, cudaStream_t stream, const LlmCudaOptions& options);

  ~Impl() {
    if (cublas_ != nullptr) cublasDestroy(cublas_);
  }

  Status Init();

  Result<double> Forward(ParamProvider& params, const LlmBatch& batch, State& st, bool want_loss);

  Result<double> ReadLoss(const State& st);

  Status Backward(ParamProvider& params, State& st, float loss_scale, GradSink& grads);

 private:
  // Positions of a layer's parameters in its module's views.
  struct Local {
    int in_norm, q, k, v, o, q_norm, k_norm, post_norm, gate, up, down;
  };

  // ---- Buffers. ----

  int64_t ChunkRows(int64_t N) const {
    const int64_t per_row = V_ * static_cast<int64_t>(sizeof(float));
    return std::clamp<int64_t>(options_.logits_chunk_bytes / per_row, 1, N);
  }

  // Sizes the buffers for the batch (reallocating only when the shape changes) and uploads its ids
  // and the embedding backward's order: positions sorted by input id (then by position), the
  // distinct ids and where each one's run starts.
  Status Prepare(State& st, const LlmBatch& batch, DType compute);

  // Lays out st.saved (what Forward leaves for Backward: the batch's ids and RoPE tables, the
  // layer inputs, each layer's buffers, the final norm's output, the loss) and st.scratch
  // (Backward's gradients, the column-reduction partials, one logits chunk and its gradient).
  Status Plan(State& st, int64_t B, int64_t S, DType T, bool ckpt);

  // Aliases set after allocation (Plan leaves the fp32 case's *_t pointers unset).
  void* DhT(State& st) const { return st.compute == DType::kF32 ? static_cast<void*>(st.dh) : st.dh_t; }
  // Where a kernel that writes st.dh also stores its compute-dtype copy (RmsNormBackward's
  // dx_copy); null where the compute dtype is fp32 (DhT is st.dh itself).
  void* DhTCopy(State& st) const { return st.compute == DType::kF32 ? nullptr : st.dh_t; }
  void* DqT(State& st) const { return st.compute == DType::kF32 ? static_cast<void*>(st.dq) : st.dq_t; }
  void* DkT(State& st) const { return st.compute == DType::kF32 ? static_cast<void*>(st.dk) : st.dk_t; }
  void* DvT(State& st) const { return st.compute == DType::kF32 ? static_cast<void*>(st.dv) : st.dv_t; }

  Status EnsureVh(State& st) {
    return EnsureWorkspace(device_, st.vh_arena, &st.vh, V_ * H_, "the fp32 [vocab, hidden] gradient scratch");
  }

  // ---- Parameters and gradients. ----

  Status CheckViews(int m, const std::vector<ParamView>& views) const;

  // Acquires module m through `scope`: linear weights (2-D) in the compute dtype (the provider's
  // memory, or converted copies in weight_scratch_ from byte *used on), others as provided.
  Status Load(ModuleScope& scope, int m, DType compute, bool convert, int64_t* used, Weights* out);

  // The module that holds the batch's output weight besides "head": "embed" when it is the tied
  // embedding, the extra head's, or "" (the untied lm_head sits in "head"; never acquired).
  static std::string OutModuleName(const OutputHead& out) { return out.tied ? kEmbedModule : out.module; }

  // The head's weights, and the batch's output weight when it is not the untied lm_head: the tied
  // embedding or an extra head, acquired through `out_scope` while the head is held. *w_out: the
  // output projection in the compute dtype.
  Status LoadHead(ModuleScope& head, ModuleScope& out_scope, const OutputHead& out, DType T, Weights* hw,
                  const void** w_out);

  Result<GradView> GradBufferChecked(GradSink& sink, int index);

  // dW = dy^T x for a linear weight [out, in], written into the sink's buffer directly when its
  // dtype is fp32 or the compute dtype, else through an fp32 stage; then GradReady.
  Status MatrixGrad(GradSink& sink, int index, DType T, const void* dy, const void* x, int64_t M, int64_t out,
                    int64_t in);

  Status NormWeightGrad(GradSink& sink, int index, const void* x, DType xt, const float* rstd, const void* dy,
                        DType dyt, int64_t rows, int64_t cols, State& st);

  // ---- Attention. ----

  AttentionShape Shape(const State& st) const {
    return AttentionShape{st.batch, st.seq, static_cast<int>(nh_), static_cast<int>(nkv_), static_cast<int>(hd_),
                          scale_};
  }

  // Whether this batch's attention runs on cuDNN (LlmAttention's rule); builds its plans first.
  Result<bool> UseCudnn(const State& st);

  // ---- Products: row-major C[m, n] = op(A)[m, k] op(B)[k, n] + beta C. ----

  Status Gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void* a, DType at, int64_t lda, const void* b,
              DType bt, int64_t ldb, void* c, DType ct, int64_t ldc, float beta);

  // y[M, out] = x[M, in] W^T (+ beta y), W [out, in].
  Status LinearForward(DType T, const void* x, const void* w, int64_t M, int64_t out, int64_t in, void* y, DType yt,
                       float beta) {
    return Gemm(false, true, M, out, in, x, T, in, w, T, in, y, yt, out, beta);
  }
  // dx[M, in] = dy[M, out] W (+ beta dx).
  Status LinearBackwardInput(DType T, const void* dy, const void* w, int64_t M, int64_t out, int64_t in, void* dx,
                             DType dxt, float beta) {
    return Gemm(false, false, M, in, out, dy, T, out, w, T, in, dx, dxt, in, beta);
  }
  // dW[out, in] = dy[M, out]^T x[M, in] (+ beta dW).
  Status LinearBackwardWeight(DType T, const void* dy, const void* x, int64_t M, int64_t out, int64_t in, void* dw,
                              DType dwt, float beta) {
    return Gemm(true, false, out, in, M, dy, T, out, x, T, in, dw, dwt, in, beta);
  }

  // ---- One decoder layer. ----

  // Forward of layer l from st.hs[l]. recompute (checkpointing's backward): refills the layer's
  // buffers only, leaving out the MLP's output (the backward needs its inputs, not its result).
  Status LayerForward(State& st, int64_t l, const Weights& w, bool recompute);

  // On entry st.dh holds dL/d(layer output) and DhT(st) the same in the compute dtype; on return
  // both hold dL/d(layer input) (RmsNormBackward stores the copy). Emits the layer's
  // gradients as they are finished.
  Status LayerBackward(State& st, int64_t l, const Weights& w, GradSink& grads);

  const LlmConfig c_;
  const std::vector<ModelParamSpec>& specs_;
  const std::vector<ModuleSpec>& modules_;
  Device* const device_;  // a CudaDevice: every buffer below and in the activations comes from it
  cudaStream_t stream_;
  const LlmCudaOptions options_;
  const int64_t H_, I_, V_, L_, nh_, nkv_, hd_, qd_, kvd_;
  const float eps_, scale_;
  int head_module_ = 0, final_norm_ = 0, lm_head_ = -1;
  Local local_{};
  cublasContext* cublas_ = nullptr;
  size_t max_convert_bytes_ = 0;
  int64_t max_grad_stage_ = 0;
  // Converted linear weights of the module(s) held, and one matrix gradient in fp32 before its
  // conversion; each allocated on first use.
  DeviceArena weight_scratch_arena_{"workspace"}, grad_stage_arena_{"workspace"};
  char* weight_scratch_ = nullptr;
  float* grad_stage_ = nullptr;
  OpProfiler prof_;
  std::unique_ptr<CudnnAttention> cudnn_;  // null: the model's own attention kernels only
  std::string attention_backend_, attention_note_;

 public:
  Result<std::vector<LlmOpTime>> TakeProfile() { return prof_.Take(); }
  const std::string& attention_backend() const { return attention_backend_; }
  const std::string& attention_note() const { return attention_note_; }
};

}  // namespace zero::llm
