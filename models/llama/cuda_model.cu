// LlmCuda (contract in cuda_model.h): the module protocol, the activation buffers (DeviceArenas of
// the model's Device), and the cuBLAS products; the other kernels are kernels.cu's.
#include "models/llama/cuda_model.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <utility>

#include "models/llama/attention_cudnn.h"
#include "models/llama/cpu_model.h"
#include "models/llama/kernels.cuh"
#include "models/llama/params.h"
#include "runtime/cuda_device.h"
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

namespace {

struct EventDestroy {
  void operator()(CUevent_st* e) const { cudaEventDestroy(e); }
};
using EventPtr = std::unique_ptr<CUevent_st, EventDestroy>;

size_t AlignUp(size_t bytes) {
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

cudaDataType_t CudaType(DType t) {
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

}  // namespace

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

LlmCudaActivations::LlmCudaActivations() : state_(std::make_unique<State>()) {}
LlmCudaActivations::~LlmCudaActivations() = default;
LlmCudaActivations::LlmCudaActivations(LlmCudaActivations&&) noexcept = default;
LlmCudaActivations& LlmCudaActivations::operator=(LlmCudaActivations&&) noexcept = default;
int LlmCudaActivations::batch() const { return state_ ? state_->batch : 0; }
int LlmCudaActivations::seq() const { return state_ ? state_->seq : 0; }
int64_t LlmCudaActivations::counted_targets() const { return state_ ? state_->counted : 0; }
int64_t LlmCudaActivations::bytes() const { return state_ ? state_->Bytes() : 0; }
int64_t LlmCudaActivations::activation_bytes() const {
  return state_ ? static_cast<int64_t>(state_->saved.bytes()) : 0;
}

// ---- The model. -----------------------------------------------------------------------------------

class LlmCuda::Impl {
 public:
  using State = LlmCudaActivations::State;

  Impl(const LlmConfig& c, const std::vector<ModelParamSpec>& specs, const std::vector<ModuleSpec>& modules,
       Device* device, cudaStream_t stream, const LlmCudaOptions& options)
      : c_(c),
        specs_(specs),
        modules_(modules),
        device_(device),
        stream_(stream),
        options_(options),
        H_(c.hidden_size),
        I_(c.intermediate_size),
        V_(c.vocab_size),
        L_(c.num_hidden_layers),
        nh_(c.num_attention_heads),
        nkv_(c.num_key_value_heads),
        hd_(c.head_dim),
        qd_(nh_ * hd_),
        kvd_(nkv_ * hd_),
        eps_(static_cast<float>(c.rms_norm_eps)),
        scale_(1.0f / std::sqrt(static_cast<float>(c.head_dim))) {
    head_module_ = static_cast<int>(L_) + 1;
    final_norm_ = FinalNormIndex(c);
    lm_head_ = LmHeadIndex(c);
    const LayerParamIndex x = LayerParams(c, 0);
    auto rel = [&](int i) { return i < 0 ? -1 : i - x.first; };
    local_ = Local{rel(x.input_norm), rel(x.q),         rel(x.k),    rel(x.v),  rel(x.o),   rel(x.q_norm),
                   rel(x.k_norm),     rel(x.post_norm), rel(x.gate), rel(x.up), rel(x.down)};
  }

  ~Impl() {
    if (cublas_ != nullptr) cublasDestroy(cublas_);
  }

  Status Init() {
    prof_.Init(options_.profile, stream_);
    if (options_.attention != LlmAttention::kKernel) {
      Result<std::unique_ptr<CudnnAttention>> a = CudnnAttention::Create(stream_);
      if (a.ok()) {
        cudnn_ = std::move(a).value();
      } else if (options_.attention == LlmAttention::kCudnn) {
        return a.status();
      } else {
        attention_note_ = a.status().message();
      }
    }
    ZERO_CUBLAS_RETURN_IF_ERROR(cublasCreate(&cublas_));
    ZERO_CUBLAS_RETURN_IF_ERROR(cublasSetStream(cublas_, stream_));
    // No TF32 for fp32 products; bf16 products reduce in fp32 (no reduced-precision split-K).
    ZERO_CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(
        cublas_, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    // The largest set of converted matrices one phase holds: a module's, plus the tied embedding
    // in the head phase; and the largest matrix gradient staged in fp32.
    for (size_t m = 0; m < modules_.size(); ++m) {
      size_t bytes = 0;
      for (int i : modules_[m].params) {
        if (specs_[i].shape.size() == 2) {
          bytes += AlignUp(specs_[i].numel() * 4);
          if (i != EmbedIndex() && i != lm_head_ && i < HfParamCount(c_))
            max_grad_stage_ = std::max(max_grad_stage_, specs_[i].numel());
        }
      }
      if (static_cast<int>(m) == head_module_ && (c_.tie_word_embeddings || c_.extra_heads > 0)) {
        bytes += AlignUp(specs_[EmbedIndex()].numel() * 4);  // the tied embedding or an extra head
      }
      max_convert_bytes_ = std::max(max_convert_bytes_, bytes);
    }
    return OkStatus();
  }

  Result<double> Forward(ParamProvider& params, const LlmBatch& batch, State& st, bool want_loss) {
    ZERO_RETURN_IF_ERROR(batch.Validate(V_, c_.max_position_embeddings));
    ZERO_ASSIGN_OR_RETURN(const OutputHead out, SelectOutputHead(c_, batch.head));
    prof_.Begin();
    st.has_forward = false;
    st.loss_ready = false;
    const int64_t N = int64_t(batch.batch) * batch.seq;
    {
      ModuleScope scope(params, kEmbedModule);
      ZERO_ASSIGN_OR_RETURN(std::vector<ParamView> views, scope.Acquire());
      ZERO_RETURN_IF_ERROR(CheckViews(0, views));
      DType compute = views[0].dtype == DType::kBF16 ? DType::kBF16 : DType::kF32;
      if (options_.compute) compute = *options_.compute;
      ZERO_RETURN_IF_ERROR(Prepare(st, batch, compute));
      prof_.Mark("prepare");
      ZERO_RETURN_IF_ERROR(kernels::EmbeddingForward(st.inputs, N, H_, views[0].data, views[0].dtype, st.hs, stream_));
      prof_.Mark("embedding_forward");
      ZERO_RETURN_IF_ERROR(scope.Close());
    }
    for (int64_t l = 0; l < L_; ++l) {
      ModuleScope scope(params, LayerModule(l));
      Weights w;
      int64_t used = 0;
      ZERO_RETURN_IF_ERROR(Load(scope, static_cast<int>(1 + l), st.compute, true, &used, &w));
      prof_.Mark("load");
      ZERO_RETURN_IF_ERROR(LayerForward(st, l, w, /*recompute=*/false));
      ZERO_RETURN_IF_ERROR(scope.Close());
    }
    st.out = out;
    {
      ModuleScope head(params, kHeadModule);
      ModuleScope out_scope(params, OutModuleName(out));
      Weights hw;
      const void* w_out = nullptr;
      ZERO_RETURN_IF_ERROR(LoadHead(head, out_scope, out, st.compute, &hw, &w_out));
      prof_.Mark("load");
      const DType T = st.compute;
      ZERO_RETURN_IF_ERROR(kernels::RmsNormForward(st.hs + L_ * N * H_, DType::kF32, hw.data[0], hw.dtype[0], N,
                                                   static_cast<int>(H_), eps_, st.xnF, T, st.rstdF, stream_));
      prof_.Mark("rms_norm_forward");
      if (want_loss) {
        for (int64_t r0 = 0; r0 < N; r0 += st.chunk_rows) {
          const int64_t rows = std::min(st.chunk_rows, N - r0);
          ZERO_RETURN_IF_ERROR(
              LinearForward(T, At(st.xnF, T, r0 * H_), w_out, rows, V_, H_, st.logits, DType::kF32, 0.0f));
          prof_.Mark("gemm_fwd");
          ZERO_RETURN_IF_ERROR(
              kernels::CrossEntropy(st.logits, st.targets + r0, rows, V_, 0.0f, st.row_loss + r0, nullptr, T, stream_));
          prof_.Mark("cross_entropy");
        }
        ZERO_RETURN_IF_ERROR(kernels::SumToDouble(st.row_loss, N, st.loss_sum, stream_));
        prof_.Mark("sum_to_double");
      }
      ZERO_RETURN_IF_ERROR(out_scope.Close());
      ZERO_RETURN_IF_ERROR(head.Close());
    }
    st.has_forward = true;
    if (!want_loss) return std::numeric_limits<double>::quiet_NaN();
    st.loss_ready = true;
    return ReadLoss(st);
  }

  Result<double> ReadLoss(const State& st) {
    if (!st.has_forward || !st.loss_ready) {
      return FailedPreconditionError(
          "llm_cuda: no loss on these activations (Forward with want_loss, or Backward, computes it)");
    }
    double sum = 0.0;
    ZERO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&sum, st.loss_sum, sizeof(double), cudaMemcpyDeviceToHost, stream_));
    ZERO_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return st.counted > 0 ? sum / static_cast<double>(st.counted) : 0.0;
  }

  Status Backward(ParamProvider& params, State& st, float loss_scale, GradSink& grads) {
    if (!st.has_forward || st.owner != this) {
      return FailedPreconditionError("llm_cuda backward: no forward of this model on these activations");
    }
    prof_.Begin();
    const int64_t N = int64_t(st.batch) * st.seq;
    const DType T = st.compute;
    // dL/dlogits of loss_scale * mean loss, as LlmCpu: (softmax - onehot) * (loss_scale / counted).
    const float coef = st.counted > 0 ? loss_scale / static_cast<float>(st.counted) : 0.0f;
    const OutputHead& out = st.out;
    {
      ModuleScope head(params, kHeadModule);
      ModuleScope out_scope(params, OutModuleName(out));
      Weights hw;
      const void* w_out = nullptr;
      ZERO_RETURN_IF_ERROR(LoadHead(head, out_scope, out, T, &hw, &w_out));
      prof_.Mark("load");
      const int64_t chunks = (N + st.chunk_rows - 1) / st.chunk_rows;
      // Where the output weight's gradient is summed over chunks.
      GradView head_view;
      void* dw_out = nullptr;
      DType dw_t = DType::kF32;
      if (out.tied) {
        ZERO_RETURN_IF_ERROR(EnsureVh(st));
        dw_out = st.vh;
      } else {
        ZERO_ASSIGN_OR_RETURN(head_view, GradBufferChecked(grads, out.weight));
        if (head_view.dtype == DType::kF32 || (chunks == 1 && head_view.dtype == T)) {
          dw_out = head_view.data;
          dw_t = head_view.dtype;
        } else {
          ZERO_RETURN_IF_ERROR(EnsureVh(st));
          dw_out = st.vh;
        }
      }
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t r0 = c * st.chunk_rows;
        const int64_t rows = std::min(st.chunk_rows, N - r0);
        const void* xn = At(st.xnF, T, r0 * H_);
        ZERO_RETURN_IF_ERROR(LinearForward(T, xn, w_out, rows, V_, H_, st.logits, DType::kF32, 0.0f));
        prof_.Mark("gemm_fwd");
        ZERO_RETURN_IF_ERROR(kernels::CrossEntropy(st.logits, st.targets + r0, rows, V_, coef, st.row_loss + r0,
                                                   st.dlogits, T, stream_));
        prof_.Mark("cross_entropy");
        ZERO_RETURN_IF_ERROR(LinearBackwardWeight(T, st.dlogits, xn, rows, V_, H_, dw_out, dw_t, c == 0 ? 0.0f : 1.0f));
        prof_.Mark("gemm_wgrad");
        ZERO_RETURN_IF_ERROR(
            LinearBackwardInput(T, st.dlogits, w_out, rows, V_, H_, st.dxn + r0 * H_, DType::kF32, 0.0f));
        prof_.Mark("gemm_dgrad");
      }
      ZERO_RETURN_IF_ERROR(kernels::SumToDouble(st.row_loss, N, st.loss_sum, stream_));
      prof_.Mark("sum_to_double");
      st.loss_ready = true;
      const float* h_final = st.hs + L_ * N * H_;
      ZERO_RETURN_IF_ERROR(
          NormWeightGrad(grads, final_norm_, h_final, DType::kF32, st.rstdF, st.dxn, DType::kF32, N, H_, st));
      prof_.Mark("rmsnorm_wgrad");
      // The last layer's backward reads dh in the compute dtype too (DhTCopy).
      ZERO_RETURN_IF_ERROR(kernels::RmsNormBackward(h_final, DType::kF32, st.rstdF, hw.data[0], hw.dtype[0], st.dxn,
                                                    DType::kF32, N, static_cast<int>(H_), false, st.dh, DType::kF32,
                                                    stream_, DhTCopy(st), st.compute));
      prof_.Mark("rms_norm_backward");
      if (!out.tied) {
        if (dw_out == st.vh) {
          ZERO_RETURN_IF_ERROR(kernels::Convert(st.vh, DType::kF32, head_view.data, head_view.dtype, V_ * H_, stream_));
          prof_.Mark("convert");
        }
        ZERO_RETURN_IF_ERROR(grads.GradReady(out.weight));
      }
      ZERO_RETURN_IF_ERROR(out_scope.Close());
      ZERO_RETURN_IF_ERROR(head.Close());
    }
    for (int64_t l = L_ - 1; l >= 0; --l) {
      ModuleScope scope(params, LayerModule(l));
      Weights w;
      int64_t used = 0;
      ZERO_RETURN_IF_ERROR(Load(scope, static_cast<int>(1 + l), T, true, &used, &w));
      prof_.Mark("load");
      if (st.checkpointing) ZERO_RETURN_IF_ERROR(LayerForward(st, l, w, /*recompute=*/true));
      ZERO_RETURN_IF_ERROR(LayerBackward(st, l, w, grads));
      ZERO_RETURN_IF_ERROR(scope.Close());
    }
    {
      ModuleScope scope(params, kEmbedModule);
      ZERO_ASSIGN_OR_RETURN(std::vector<ParamView> views, scope.Acquire());
      ZERO_RETURN_IF_ERROR(CheckViews(0, views));
      ZERO_ASSIGN_OR_RETURN(GradView g, GradBufferChecked(grads, EmbedIndex()));
      if (out.tied) {
        ZERO_RETURN_IF_ERROR(kernels::EmbeddingBackward(st.positions, st.unique_ids, st.starts, st.num_unique, H_,
                                                        st.dh, /*accumulate=*/true, st.vh, DType::kF32, stream_));
        prof_.Mark("embedding_backward");
        ZERO_RETURN_IF_ERROR(kernels::Convert(st.vh, DType::kF32, g.data, g.dtype, V_ * H_, stream_));
        prof_.Mark("convert");
      } else {
        ZERO_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(g.data, 0, V_ * H_ * SizeOf(g.dtype), stream_));
        prof_.Mark("memset");
        ZERO_RETURN_IF_ERROR(kernels::EmbeddingBackward(st.positions, st.unique_ids, st.starts, st.num_unique, H_,
                                                        st.dh, /*accumulate=*/false, g.data, g.dtype, stream_));
        prof_.Mark("embedding_backward");
      }
      ZERO_RETURN_IF_ERROR(grads.GradReady(EmbedIndex()));
      ZERO_RETURN_IF_ERROR(scope.Close());
    }
    return OkStatus();
  }

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
  Status Prepare(State& st, const LlmBatch& batch, DType compute) {
    if (compute != DType::kF32 && compute != DType::kBF16) {
      return InvalidArgumentError(std::string("llm_cuda: compute dtype ") + DTypeName(compute) +
                                  ", expected fp32 or bf16");
    }
    const int64_t B = batch.batch, S = batch.seq, N = B * S;
    if (N > INT32_MAX / 2) return InvalidArgumentError("llm_cuda: batch * seq = " + std::to_string(N) + " too large");
    const bool ckpt = options_.activation_checkpointing;
    if (!st.allocated || st.owner != this || st.batch != batch.batch || st.seq != batch.seq || st.compute != compute ||
        st.checkpointing != ckpt) {
      // The old buffers may still be read by enqueued work.
      ZERO_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
      st.allocated = false;
      st.saved.Clear();
      st.scratch.Clear();
      st.pinned.Reset();
      if (st.owner != this) {  // another model's [V, H] scratch: its shape and device may differ
        st.vh_arena.Clear();
        st.vh = nullptr;
      }
      st.owner = this;
      st.batch = batch.batch;
      st.seq = batch.seq;
      st.compute = compute;
      st.checkpointing = ckpt;
      st.chunk_rows = ChunkRows(N);
      ZERO_RETURN_IF_ERROR(Plan(st, B, S, compute, ckpt));
      const std::string what = "llm_cuda: batch " + std::to_string(B) + " x seq " + std::to_string(S);
      ZERO_RETURN_IF_ERROR(st.saved.Allocate(device_).WithContext(what));
      ZERO_RETURN_IF_ERROR(st.scratch.Allocate(device_).WithContext(what));
      Result<PinnedBuffer> pinned = device_->AllocatePinned((5 * N + 1) * sizeof(int32_t));
      if (!pinned.ok()) return pinned.status().WithContext(what + ": the pinned staging of the ids");
      st.pinned = std::move(pinned).value();
      if (!st.upload_done) {
        cudaEvent_t e = nullptr;
        ZERO_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        st.upload_done.reset(e);
      }
      RopeTables(hd_, c_.rope_theta, static_cast<int>(S), &st.rope_cos_host, &st.rope_sin_host, c_.rope_scaling);
      const size_t table = st.rope_cos_host.size() * sizeof(float);
      ZERO_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(st.rope_cos, st.rope_cos_host.data(), table, cudaMemcpyHostToDevice, stream_));
      ZERO_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(st.rope_sin, st.rope_sin_host.data(), table, cudaMemcpyHostToDevice, stream_));
      st.allocated = true;
    }
    // The previous batch's upload must have left the staging buffer.
    ZERO_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(st.upload_done.get()));
    int32_t* host = st.pinned.as<int32_t>();
    int32_t* h_inputs = host;
    int32_t* h_targets = host + N;
    int32_t* h_positions = host + 2 * N;
    int32_t* h_unique = host + 3 * N;
    int32_t* h_starts = host + 4 * N;
    std::copy(batch.inputs.begin(), batch.inputs.end(), h_inputs);
    std::copy(batch.targets.begin(), batch.targets.end(), h_targets);
    st.counted = 0;
    for (int64_t n = 0; n < N; ++n) st.counted += h_targets[n] != kIgnoreIndex ? 1 : 0;
    std::iota(h_positions, h_positions + N, 0);
    std::stable_sort(h_positions, h_positions + N, [&](int32_t a, int32_t b) { return h_inputs[a] < h_inputs[b]; });
    int64_t u = 0;
    for (int64_t p = 0; p < N; ++p) {
      if (p == 0 || h_inputs[h_positions[p]] != h_inputs[h_positions[p - 1]]) {
        h_unique[u] = h_inputs[h_positions[p]];
        h_starts[u] = static_cast<int32_t>(p);
        ++u;
      }
    }
    h_starts[u] = static_cast<int32_t>(N);
    st.num_unique = u;
    // inputs, targets and positions are contiguous in both buffers; unique ids and starts too.
    ZERO_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(st.inputs, h_inputs, N * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    ZERO_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(st.targets, h_targets, N * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    ZERO_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(st.positions, h_positions, N * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    ZERO_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(st.unique_ids, h_unique, u * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    ZERO_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(st.starts, h_starts, (u + 1) * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    ZERO_CUDA_RETURN_IF_ERROR(cudaEventRecord(st.upload_done.get(), stream_));
    return OkStatus();
  }

  // Lays out st.saved (what Forward leaves for Backward: the batch's ids and RoPE tables, the
  // layer inputs, each layer's buffers, the final norm's output, the loss) and st.scratch
  // (Backward's gradients, the column-reduction partials, one logits chunk and its gradient).
  Status Plan(State& st, int64_t B, int64_t S, DType T, bool ckpt) {
    const int64_t N = B * S;
    const size_t ts = SizeOf(T);
    const bool f32 = T == DType::kF32;
    const bool qk = c_.qk_norm();
    DeviceArena& a = st.saved;
    DeviceArena& w = st.scratch;
    // A buffer of `elems` elements in the compute dtype.
    auto act = [&](DeviceArena& arena, void** p, int64_t elems, std::string name) {
      arena.ReserveBytes(p, static_cast<size_t>(elems) * ts, std::move(name));
    };
    a.Reserve(&st.inputs, N, "inputs");
    a.Reserve(&st.targets, N, "targets");
    a.Reserve(&st.positions, N, "positions");
    a.Reserve(&st.unique_ids, N, "unique_ids");
    a.Reserve(&st.starts, N + 1, "starts");
    a.Reserve(&st.rope_cos, S * (hd_ / 2), "rope_cos");
    a.Reserve(&st.rope_sin, S * (hd_ / 2), "rope_sin");
    a.Reserve(&st.hs, (L_ + 1) * N * H_, "hidden_states");
    st.layers.assign(ckpt ? 1 : L_, LayerBuffers{});
    for (size_t l = 0; l < st.layers.size(); ++l) {
      LayerBuffers& lb = st.layers[l];
      const std::string p = "layer" + std::to_string(l) + ".";
      a.Reserve(&lb.rstd1, N, p + "rstd1");
      act(a, &lb.xn1, N * H_, p + "xn1");
      if (qk) {
        act(a, &lb.q_raw, N * qd_, p + "q_raw");
        act(a, &lb.k_raw, N * kvd_, p + "k_raw");
        a.Reserve(&lb.q_rstd, N * nh_, p + "q_rstd");
        a.Reserve(&lb.k_rstd, N * nkv_, p + "k_rstd");
      }
      act(a, &lb.q, N * qd_, p + "q");
      act(a, &lb.k, N * kvd_, p + "k");
      act(a, &lb.v, N * kvd_, p + "v");
      act(a, &lb.o, N * qd_, p + "o");
      a.Reserve(&lb.lse, N * nh_, p + "lse");
      a.Reserve(&lb.h_mid, N * H_, p + "h_mid");
      a.Reserve(&lb.rstd2, N, p + "rstd2");
      act(a, &lb.xn2, N * H_, p + "xn2");
      act(a, &lb.g, N * I_, p + "gate");
      act(a, &lb.u, N * I_, p + "up");
      act(a, &lb.act, N * I_, p + "act");
    }
    act(a, &st.xnF, N * H_, "final_norm");
    a.Reserve(&st.rstdF, N, "final_rstd");
    a.Reserve(&st.row_loss, N, "row_loss");
    a.Reserve(&st.loss_sum, 1, "loss_sum");

    w.Reserve(&st.dh, N * H_, "dh");
    if (!f32) act(w, &st.dh_t, N * H_, "dh_t");
    w.Reserve(&st.dxn, N * H_, "dxn");
    w.Reserve(&st.da, N * I_, "da");
    act(w, &st.dg, N * I_, "dg");
    act(w, &st.du, N * I_, "du");
    act(w, &st.dout, N * qd_, "dout");
    w.Reserve(&st.delta, N * nh_, "delta");
    w.Reserve(&st.dq, N * qd_, "dq");
    w.Reserve(&st.dk, N * kvd_, "dk");
    w.Reserve(&st.dv, N * kvd_, "dv");
    if (!f32) {
      act(w, &st.dq_t, N * qd_, "dq_t");
      act(w, &st.dk_t, N * kvd_, "dk_t");
      act(w, &st.dv_t, N * kvd_, "dv_t");
    }
    int64_t partial = kernels::RmsNormWeightGradScratch(N, static_cast<int>(H_));
    if (qk) {
      partial = std::max(partial, kernels::RmsNormWeightGradScratch(N * nh_, static_cast<int>(hd_)));
      partial = std::max(partial, kernels::RmsNormWeightGradScratch(N * nkv_, static_cast<int>(hd_)));
    }
    w.Reserve(&st.partial, partial, "norm_weight_partials");
    w.Reserve(&st.logits, st.chunk_rows * V_, "logits_chunk");
    act(w, &st.dlogits, st.chunk_rows * V_, "dlogits_chunk");
    if (f32) {
      // fp32 compute: the products read the fp32 gradients themselves; the qk-norm backward
      // may write its output over its input (llm_kernels.cuh).
      st.dh_t = nullptr;
      st.dq_t = nullptr;
      st.dk_t = nullptr;
      st.dv_t = nullptr;
    }
    return OkStatus();
  }

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

  Status CheckViews(int m, const std::vector<ParamView>& views) const {
    const ModuleSpec& mod = modules_[m];
    if (views.size() != mod.params.size()) {
      return InvalidArgumentError("module " + mod.name + ": provider returned " + std::to_string(views.size()) +
                                  " views, expected " + std::to_string(mod.params.size()));
    }
    for (size_t j = 0; j < views.size(); ++j) {
      if (views[j].data == nullptr) {
        return InvalidArgumentError("parameter " + specs_[mod.params[j]].name + ": null data");
      }
    }
    return OkStatus();
  }

  // Acquires module m through `scope`: linear weights (2-D) in the compute dtype (the provider's
  // memory, or converted copies in weight_scratch_ from byte *used on), others as provided.
  Status Load(ModuleScope& scope, int m, DType compute, bool convert, int64_t* used, Weights* out) {
    ZERO_ASSIGN_OR_RETURN(std::vector<ParamView> views, scope.Acquire());
    ZERO_RETURN_IF_ERROR(CheckViews(m, views));
    const ModuleSpec& mod = modules_[m];
    out->data.clear();
    out->dtype.clear();
    for (size_t j = 0; j < views.size(); ++j) {
      const ModelParamSpec& spec = specs_[mod.params[j]];
      const ParamView& v = views[j];
      if (convert && spec.shape.size() == 2 && v.dtype != compute) {
        ZERO_RETURN_IF_ERROR(EnsureWorkspace(device_, weight_scratch_arena_, &weight_scratch_,
                                             static_cast<int64_t>(max_convert_bytes_), "converted weights"));
        void* dst = weight_scratch_ + *used;
        ZERO_RETURN_IF_ERROR(kernels::Convert(v.data, v.dtype, dst, compute, spec.numel(), stream_));
        prof_.Mark("convert");
        *used += static_cast<int64_t>(AlignUp(spec.numel() * SizeOf(compute)));
        out->data.push_back(dst);
        out->dtype.push_back(compute);
      } else {
        out->data.push_back(v.data);
        out->dtype.push_back(v.dtype);
      }
    }
    return OkStatus();
  }

  // The module that holds the batch's output weight besides "head": "embed" when it is the tied
  // embedding, the extra head's, or "" (the untied lm_head sits in "head"; never acquired).
  static std::string OutModuleName(const OutputHead& out) { return out.tied ? kEmbedModule : out.module; }

  // The head's weights, and the batch's output weight when it is not the untied lm_head: the tied
  // embedding or an extra head, acquired through `out_scope` while the head is held. *w_out: the
  // output projection in the compute dtype.
  Status LoadHead(ModuleScope& head, ModuleScope& out_scope, const OutputHead& out, DType T, Weights* hw,
                  const void** w_out) {
    int64_t used = 0;
    ZERO_RETURN_IF_ERROR(Load(head, head_module_, T, true, &used, hw));
    prof_.Mark("load");
    if (out.tied || !out.module.empty()) {
      int m = 0;
      if (!out.tied) {
        while (m < static_cast<int>(modules_.size()) && modules_[m].name != out.module) ++m;
        if (m == static_cast<int>(modules_.size())) return InternalError("no module " + out.module);
      }
      Weights ow;
      ZERO_RETURN_IF_ERROR(Load(out_scope, m, T, true, &used, &ow));
      prof_.Mark("load");
      *w_out = ow.data[0];
    } else {
      *w_out = hw->data[1];
    }
    return OkStatus();
  }

  Result<GradView> GradBufferChecked(GradSink& sink, int index) {
    ZERO_ASSIGN_OR_RETURN(GradView view, sink.GradBuffer(index));
    if (view.data == nullptr) return InvalidArgumentError("gradient of " + specs_[index].name + ": null buffer");
    return view;
  }

  // dW = dy^T x for a linear weight [out, in], written into the sink's buffer directly when its
  // dtype is fp32 or the compute dtype, else through an fp32 stage; then GradReady.
  Status MatrixGrad(GradSink& sink, int index, DType T, const void* dy, const void* x, int64_t M, int64_t out,
                    int64_t in) {
    ZERO_ASSIGN_OR_RETURN(GradView view, GradBufferChecked(sink, index));
    if (view.dtype == DType::kF32 || view.dtype == T) {
      ZERO_RETURN_IF_ERROR(LinearBackwardWeight(T, dy, x, M, out, in, view.data, view.dtype, 0.0f));
      prof_.Mark("gemm_wgrad");
    } else {
      ZERO_RETURN_IF_ERROR(
          EnsureWorkspace(device_, grad_stage_arena_, &grad_stage_, max_grad_stage_, "the fp32 gradient stage"));
      ZERO_RETURN_IF_ERROR(LinearBackwardWeight(T, dy, x, M, out, in, grad_stage_, DType::kF32, 0.0f));
      prof_.Mark("gemm_wgrad");
      ZERO_RETURN_IF_ERROR(kernels::Convert(grad_stage_, DType::kF32, view.data, view.dtype, out * in, stream_));
      prof_.Mark("convert");
    }
    return sink.GradReady(index);
  }

  Status NormWeightGrad(GradSink& sink, int index, const void* x, DType xt, const float* rstd, const void* dy,
                        DType dyt, int64_t rows, int64_t cols, State& st) {
    ZERO_ASSIGN_OR_RETURN(GradView view, GradBufferChecked(sink, index));
    ZERO_RETURN_IF_ERROR(kernels::RmsNormWeightGrad(x, xt, rstd, dy, dyt, rows, static_cast<int>(cols), st.partial,
                                                    view.data, view.dtype, stream_));
    return sink.GradReady(index);
  }

  // ---- Attention. ----

  AttentionShape Shape(const State& st) const {
    return AttentionShape{st.batch, st.seq, static_cast<int>(nh_), static_cast<int>(nkv_), static_cast<int>(hd_),
                          scale_};
  }

  // Whether this batch's attention runs on cuDNN (LlmAttention's rule); builds its plans first.
  Result<bool> UseCudnn(const State& st) {
    bool use = false;
    if (st.compute == DType::kBF16 && cudnn_) {
      const Status prepared = cudnn_->Prepare(Shape(st));
      if (prepared.ok()) {
        use = true;
      } else if (options_.attention == LlmAttention::kCudnn) {
        return prepared;
      } else {
        attention_note_ = prepared.message();
      }
    } else if (options_.attention == LlmAttention::kCudnn) {
      return InvalidArgumentError(std::string("llm_cuda: cuDNN attention needs bf16 compute, the model computes in ") +
                                  DTypeName(st.compute));
    }
    attention_backend_ = use ? "cudnn" : "kernel";
    return use;
  }

  // ---- Products: row-major C[m, n] = op(A)[m, k] op(B)[k, n] + beta C. ----

  Status Gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void* a, DType at, int64_t lda, const void* b,
              DType bt, int64_t ldb, void* c, DType ct, int64_t ldc, float beta) {
    if (m <= 0 || n <= 0) return OkStatus();
    for (int64_t d : {m, n, k, lda, ldb, ldc}) {
      if (d > INT_MAX) {
        return InvalidArgumentError("llm_cuda: matrix product dimension " + std::to_string(d) + " above 2^31 - 1");
      }
    }
    const float one = 1.0f;
    // cuBLAS is column-major, where a row-major X is X^T: compute C^T = op(B)^T op(A)^T.
    ZERO_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(
        cublas_, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n),
        static_cast<int>(m), static_cast<int>(k), &one, b, CudaType(bt), static_cast<int>(ldb), a, CudaType(at),
        static_cast<int>(lda), &beta, c, CudaType(ct), static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return OkStatus();
  }

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
  Status LayerForward(State& st, int64_t l, const Weights& w, bool recompute) {
    const int64_t N = int64_t(st.batch) * st.seq;
    const DType T = st.compute;
    const Local& p = local_;
    LayerBuffers& b = st.layers[st.checkpointing ? 0 : l];
    const float* h_in = st.hs + l * N * H_;
    const int H = static_cast<int>(H_), hd = static_cast<int>(hd_);
    ZERO_RETURN_IF_ERROR(kernels::RmsNormForward(h_in, DType::kF32, w.data[p.in_norm], w.dtype[p.in_norm], N, H, eps_,
                                                 b.xn1, T, b.rstd1, stream_));
    prof_.Mark("rms_norm_forward");
    if (c_.qk_norm()) {
      ZERO_RETURN_IF_ERROR(LinearForward(T, b.xn1, w.data[p.q], N, qd_, H_, b.q_raw, T, 0.0f));
      prof_.Mark("gemm_fwd");
      ZERO_RETURN_IF_ERROR(LinearForward(T, b.xn1, w.data[p.k], N, kvd_, H_, b.k_raw, T, 0.0f));
      prof_.Mark("gemm_fwd");
      ZERO_RETURN_IF_ERROR(kernels::RmsNormForward(b.q_raw, T, w.data[p.q_norm], w.dtype[p.q_norm], N * nh_, hd, eps_,
                                                   b.q, T, b.q_rstd, stream_));
      prof_.Mark("rms_norm_forward");
      ZERO_RETURN_IF_ERROR(kernels::RmsNormForward(b.k_raw, T, w.data[p.k_norm], w.dtype[p.k_norm], N * nkv_, hd, eps_,
                                                   b.k, T, b.k_rstd, stream_));
      prof_.Mark("rms_norm_forward");
    } else {
      ZERO_RETURN_IF_ERROR(LinearForward(T, b.xn1, w.data[p.q], N, qd_, H_, b.q, T, 0.0f));
      prof_.Mark("gemm_fwd");
      ZERO_RETURN_IF_ERROR(LinearForward(T, b.xn1, w.data[p.k], N, kvd_, H_, b.k, T, 0.0f));
      prof_.Mark("gemm_fwd");
    }
    ZERO_RETURN_IF_ERROR(LinearForward(T, b.xn1, w.data[p.v], N, kvd_, H_, b.v, T, 0.0f));
    prof_.Mark("gemm_fwd");
    ZERO_RETURN_IF_ERROR(kernels::Rope(b.q, T, N, st.seq, static_cast<int>(nh_), hd, st.rope_cos, st.rope_sin,
                                       /*inverse=*/false, stream_));
    prof_.Mark("rope");
    ZERO_RETURN_IF_ERROR(kernels::Rope(b.k, T, N, st.seq, static_cast<int>(nkv_), hd, st.rope_cos, st.rope_sin,
                                       /*inverse=*/false, stream_));
    prof_.Mark("rope");
    ZERO_ASSIGN_OR_RETURN(const bool use_cudnn, UseCudnn(st));
    if (use_cudnn) {
      ZERO_RETURN_IF_ERROR(cudnn_->Forward(Shape(st), b.q, b.k, b.v, b.o, b.lse));
    } else {
      ZERO_RETURN_IF_ERROR(kernels::AttentionForward(b.q, b.k, b.v, T, st.batch, st.seq, static_cast<int>(nh_),
                                                     static_cast<int>(nkv_), hd, scale_, b.o, b.lse, stream_));
    }
    prof_.Mark("attention_forward");
    // h_mid = h_in + o Wo^T: the residual add is the product's beta = 1.
    ZERO_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(b.h_mid, h_in, N * H_ * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
    prof_.Mark("copy");
    ZERO_RETURN_IF_ERROR(LinearForward(T, b.o, w.data[p.o], N, H_, qd_, b.h_mid, DType::kF32, 1.0f));
    prof_.Mark("gemm_fwd");
    ZERO_RETURN_IF_ERROR(kernels::RmsNormForward(b.h_mid, DType::kF32, w.data[p.post_norm], w.dtype[p.post_norm], N, H,
                                                 eps_, b.xn2, T, b.rstd2, stream_));
    prof_.Mark("rms_norm_forward");
    ZERO_RETURN_IF_ERROR(LinearForward(T, b.xn2, w.data[p.gate], N, I_, H_, b.g, T, 0.0f));
    prof_.Mark("gemm_fwd");
    ZERO_RETURN_IF_ERROR(LinearForward(T, b.xn2, w.data[p.up], N, I_, H_, b.u, T, 0.0f));
    prof_.Mark("gemm_fwd");
    if (recompute) return OkStatus();
    ZERO_RETURN_IF_ERROR(kernels::SwiGluForward(b.g, b.u, T, N * I_, b.act, stream_));
    prof_.Mark("swi_glu_forward");
    float* h_out = st.hs + (l + 1) * N * H_;
    ZERO_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(h_out, b.h_mid, N * H_ * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
    prof_.Mark("copy");
    ZERO_RETURN_IF_ERROR(LinearForward(T, b.act, w.data[p.down], N, H_, I_, h_out, DType::kF32, 1.0f));
    prof_.Mark("gemm_fwd");
    return OkStatus();
  }

  // On entry st.dh holds dL/d(layer output) and DhT(st) the same in the compute dtype; on return
  // both hold dL/d(layer input) (RmsNormBackward stores the copy). Emits the layer's
  // gradients as they are finished.
  Status LayerBackward(State& st, int64_t l, const Weights& w, GradSink& grads) {
    const int64_t N = int64_t(st.batch) * st.seq;
    const DType T = st.compute;
    const DType F = DType::kF32;
    const Local& p = local_;
    const LayerParamIndex gi = LayerParams(c_, l);
    const LayerBuffers& b = st.layers[st.checkpointing ? 0 : l];
    const float* h_in = st.hs + l * N * H_;
    const int H = static_cast<int>(H_), hd = static_cast<int>(hd_);
    void* dh_t = DhT(st);

    // MLP: out = h_mid + act Wd^T, act = silu(g) * u.
    ZERO_RETURN_IF_ERROR(LinearBackwardInput(T, dh_t, w.data[p.down], N, H_, I_, st.da, F, 0.0f));
    prof_.Mark("gemm_dgrad");
    if (st.checkpointing) {  // the recomputed forward stopped before the product
      ZERO_RETURN_IF_ERROR(kernels::SwiGluForward(b.g, b.u, T, N * I_, b.act, stream_));
      prof_.Mark("swi_glu_forward");
    }
    ZERO_RETURN_IF_ERROR(MatrixGrad(grads, gi.down, T, dh_t, b.act, N, H_, I_));
    prof_.Mark("gemm_wgrad");
    ZERO_RETURN_IF_ERROR(kernels::SwiGluBackward(b.g, b.u, T, st.da, N * I_, st.dg, st.du, stream_));
    prof_.Mark("swi_glu_backward");
    ZERO_RETURN_IF_ERROR(MatrixGrad(grads, gi.gate, T, st.dg, b.xn2, N, I_, H_));
    prof_.Mark("gemm_wgrad");
    ZERO_RETURN_IF_ERROR(MatrixGrad(grads, gi.up, T, st.du, b.xn2, N, I_, H_));
    prof_.Mark("gemm_wgrad");
    ZERO_RETURN_IF_ERROR(LinearBackwardInput(T, st.dg, w.data[p.gate], N, I_, H_, st.dxn, F, 0.0f));
    prof_.Mark("gemm_dgrad");
    ZERO_RETURN_IF_ERROR(LinearBackwardInput(T, st.du, w.data[p.up], N, I_, H_, st.dxn, F, 1.0f));
    prof_.Mark("gemm_dgrad");
    ZERO_RETURN_IF_ERROR(NormWeightGrad(grads, gi.post_norm, b.h_mid, F, b.rstd2, st.dxn, F, N, H_, st));
    prof_.Mark("rmsnorm_wgrad");
    ZERO_RETURN_IF_ERROR(kernels::RmsNormBackward(b.h_mid, F, b.rstd2, w.data[p.post_norm], w.dtype[p.post_norm],
                                                  st.dxn, F, N, H, /*accumulate=*/true, st.dh, F, stream_, DhTCopy(st),
                                                  T));
    prof_.Mark("rms_norm_backward");

    // Attention: h_mid = h_in + o Wo^T.
    ZERO_RETURN_IF_ERROR(LinearBackwardInput(T, dh_t, w.data[p.o], N, H_, qd_, st.dout, T, 0.0f));
    prof_.Mark("gemm_dgrad");
    ZERO_RETURN_IF_ERROR(MatrixGrad(grads, gi.o, T, dh_t, b.o, N, H_, qd_));
    prof_.Mark("gemm_wgrad");
    ZERO_ASSIGN_OR_RETURN(const bool use_cudnn, UseCudnn(st));
    bool rotated_in_t = false;  // dq and dk rotated back in the compute dtype, in place
    if (use_cudnn) {
      // cuDNN writes bf16 gradients (dv is used as it is); with q/k norms, RoPE's inverse and the
      // norms' backward start from fp32 ones.
      ZERO_RETURN_IF_ERROR(cudnn_->Backward(Shape(st), b.q, b.k, b.v, b.o, st.dout, b.lse, DqT(st), DkT(st), DvT(st)));
      prof_.Mark("attention_backward");
      if (!c_.qk_norm()) {
        // No q/k norm: RoPE's inverse runs on the compute-dtype gradients in place. The kernel
        // computes in fp32 and rounds once, so these are the bits of converting to fp32, rotating
        // there and converting back (4 passes over dq and dk less per layer).
        ZERO_RETURN_IF_ERROR(kernels::Rope(DqT(st), T, N, st.seq, static_cast<int>(nh_), hd, st.rope_cos, st.rope_sin,
                                           /*inverse=*/true, stream_));
        prof_.Mark("rope");
        ZERO_RETURN_IF_ERROR(kernels::Rope(DkT(st), T, N, st.seq, static_cast<int>(nkv_), hd, st.rope_cos, st.rope_sin,
                                           /*inverse=*/true, stream_));
        prof_.Mark("rope");
        rotated_in_t = true;
      } else {
        ZERO_RETURN_IF_ERROR(kernels::Convert(DqT(st), T, st.dq, F, N * qd_, stream_));
        ZERO_RETURN_IF_ERROR(kernels::Convert(DkT(st), T, st.dk, F, N * kvd_, stream_));
        prof_.Mark("convert");
      }
    } else {
      ZERO_RETURN_IF_ERROR(kernels::AttentionBackward(b.q, b.k, b.v, b.o, st.dout, T, b.lse, st.batch, st.seq,
                                                      static_cast<int>(nh_), static_cast<int>(nkv_), hd, scale_,
                                                      st.delta, st.dq, st.dk, st.dv, stream_));
      prof_.Mark("attention_backward");
    }
    void* dv_t = DvT(st);
    if (!use_cudnn) {  // cuDNN wrote dv in the compute dtype already
      ZERO_RETURN_IF_ERROR(kernels::Convert(st.dv, F, dv_t, T, N * kvd_, stream_));
      prof_.Mark("convert");
    }
    ZERO_RETURN_IF_ERROR(MatrixGrad(grads, gi.v, T, dv_t, b.xn1, N, kvd_, H_));
    prof_.Mark("gemm_wgrad");
    if (!rotated_in_t) {
      ZERO_RETURN_IF_ERROR(kernels::Rope(st.dq, F, N, st.seq, static_cast<int>(nh_), hd, st.rope_cos, st.rope_sin,
                                         /*inverse=*/true, stream_));
      prof_.Mark("rope");
      ZERO_RETURN_IF_ERROR(kernels::Rope(st.dk, F, N, st.seq, static_cast<int>(nkv_), hd, st.rope_cos, st.rope_sin,
                                         /*inverse=*/true, stream_));
      prof_.Mark("rope");
    }
    void* dq_t = DqT(st);
    void* dk_t = DkT(st);
    if (c_.qk_norm()) {
      // The weight gradients read dq/dk before the input gradients may overwrite them (fp32).
      ZERO_RETURN_IF_ERROR(NormWeightGrad(grads, gi.q_norm, b.q_raw, T, b.q_rstd, st.dq, F, N * nh_, hd_, st));
      prof_.Mark("rmsnorm_wgrad");
      ZERO_RETURN_IF_ERROR(NormWeightGrad(grads, gi.k_norm, b.k_raw, T, b.k_rstd, st.dk, F, N * nkv_, hd_, st));
      prof_.Mark("rmsnorm_wgrad");
      ZERO_RETURN_IF_ERROR(kernels::RmsNormBackward(b.q_raw, T, b.q_rstd, w.data[p.q_norm], w.dtype[p.q_norm], st.dq, F,
                                                    N * nh_, hd, false, dq_t, T, stream_));
      prof_.Mark("rms_norm_backward");
      ZERO_RETURN_IF_ERROR(kernels::RmsNormBackward(b.k_raw, T, b.k_rstd, w.data[p.k_norm], w.dtype[p.k_norm], st.dk, F,
                                                    N * nkv_, hd, false, dk_t, T, stream_));
      prof_.Mark("rms_norm_backward");
    } else if (!rotated_in_t) {
      ZERO_RETURN_IF_ERROR(kernels::Convert(st.dq, F, dq_t, T, N * qd_, stream_));
      prof_.Mark("convert");
      ZERO_RETURN_IF_ERROR(kernels::Convert(st.dk, F, dk_t, T, N * kvd_, stream_));
      prof_.Mark("convert");
    }
    ZERO_RETURN_IF_ERROR(MatrixGrad(grads, gi.q, T, dq_t, b.xn1, N, qd_, H_));
    prof_.Mark("gemm_wgrad");
    ZERO_RETURN_IF_ERROR(MatrixGrad(grads, gi.k, T, dk_t, b.xn1, N, kvd_, H_));
    prof_.Mark("gemm_wgrad");
    ZERO_RETURN_IF_ERROR(LinearBackwardInput(T, dq_t, w.data[p.q], N, qd_, H_, st.dxn, F, 0.0f));
    prof_.Mark("gemm_dgrad");
    ZERO_RETURN_IF_ERROR(LinearBackwardInput(T, dk_t, w.data[p.k], N, kvd_, H_, st.dxn, F, 1.0f));
    prof_.Mark("gemm_dgrad");
    ZERO_RETURN_IF_ERROR(LinearBackwardInput(T, dv_t, w.data[p.v], N, kvd_, H_, st.dxn, F, 1.0f));
    prof_.Mark("gemm_dgrad");
    ZERO_RETURN_IF_ERROR(NormWeightGrad(grads, gi.input_norm, h_in, F, b.rstd1, st.dxn, F, N, H_, st));
    prof_.Mark("rmsnorm_wgrad");
    ZERO_RETURN_IF_ERROR(kernels::RmsNormBackward(h_in, F, b.rstd1, w.data[p.in_norm], w.dtype[p.in_norm], st.dxn, F, N,
                                                  H, /*accumulate=*/true, st.dh, F, stream_, DhTCopy(st), T));
    prof_.Mark("rms_norm_backward");
    return OkStatus();
  }

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

// ---- Public API. ----------------------------------------------------------------------------------

LlmCuda::LlmCuda(const LlmConfig& config, Device* device, cudaStream_t stream, LlmCudaOptions options)
    : config_(config),
      device_(device),
      stream_(stream),
      options_(std::move(options)),
      specs_(LlmParamSpecs(config)),
      modules_(examples::GroupByModule(specs_)) {}

LlmCuda::~LlmCuda() = default;

Result<std::unique_ptr<LlmCuda>> LlmCuda::Create(const LlmConfig& config, Device* device, Stream* stream,
                                                 LlmCudaOptions options) {
  CudaDevice* cuda = device == nullptr ? nullptr : device->AsCuda();
  if (cuda == nullptr) {
    return InvalidArgumentError("llm_cuda: device " + (device == nullptr ? std::string("null") : device->name()) +
                                " is not a CUDA device");
  }
  ZERO_RETURN_IF_ERROR(config.Validate());
  if (config.head_dim > kernels::kMaxHeadDim) {
    return UnimplementedError("llm_cuda: head_dim " + std::to_string(config.head_dim) +
                              " above the attention kernels' limit " + std::to_string(kernels::kMaxHeadDim));
  }
  if (config.num_attention_heads > 65535) {
    return UnimplementedError("llm_cuda: num_attention_heads " + std::to_string(config.num_attention_heads) +
                              " above 65535");
  }
  if (options.compute && *options.compute != DType::kF32 && *options.compute != DType::kBF16) {
    return InvalidArgumentError(std::string("llm_cuda options: compute dtype ") + DTypeName(*options.compute) +
                                ", expected fp32 or bf16");
  }
  if (options.logits_chunk_bytes < 1) {
    return InvalidArgumentError("llm_cuda options: logits_chunk_bytes must be >= 1, got " +
                                std::to_string(options.logits_chunk_bytes));
  }
  // cuBLAS and cuDNN bind their handles to the current device.
  ZERO_CUDA_RETURN_IF_ERROR(cudaSetDevice(cuda->ordinal()));
  const cudaStream_t native = cuda->native_stream(stream);
  std::unique_ptr<LlmCuda> model(new LlmCuda(config, device, native, std::move(options)));
  model->impl_ =
      std::make_unique<Impl>(model->config_, model->specs_, model->modules_, device, native, model->options_);
  ZERO_RETURN_IF_ERROR(model->impl_->Init());
  return std::move(model);
}

Result<double> LlmCuda::Forward(ParamProvider& params, const LlmBatch& batch, LlmCudaActivations* acts,
                                bool want_loss) {
  if (acts == nullptr) return InvalidArgumentError("llm_cuda forward: null activations");
  if (!acts->state_) acts->state_ = std::make_unique<LlmCudaActivations::State>();
  return impl_->Forward(params, batch, *acts->state_, want_loss);
}

Result<double> LlmCuda::ReadLoss(const LlmCudaActivations& acts) {
  if (!acts.state_) return FailedPreconditionError("llm_cuda: no forward on these activations");
  return impl_->ReadLoss(*acts.state_);
}

Result<std::vector<LlmOpTime>> LlmCuda::TakeProfile() { return impl_->TakeProfile(); }
std::string LlmCuda::attention_backend() const { return impl_->attention_backend(); }
std::string LlmCuda::attention_note() const { return impl_->attention_note(); }

Status LlmCuda::Backward(ParamProvider& params, LlmCudaActivations* acts, float loss_scale, GradSink& grads) {
  if (acts == nullptr || !acts->state_)
    return FailedPreconditionError("llm_cuda backward: no forward on these activations");
  return impl_->Backward(params, *acts->state_, loss_scale, grads);
}

}  // namespace zero::llm
