// LlmCuda (contract in cuda_model.h): the module protocol, the loss head, the activation buffers
// (DeviceArenas of the model's Device) and the parameter and gradient plumbing; one layer's
// forward and backward and the cuBLAS products are cuda_model_layer.cu's, the other kernels
// kernels/*.cu's. The class they share is in cuda_model_impl.h.
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
#include "models/llama/cuda_model_impl.h"
#include "models/llama/kernels.cuh"
#include "models/llama/params.h"
#include "runtime/cuda_device.h"
#include "runtime/cuda_status.h"
#include "runtime/device.h"
#include "runtime/device_arena.h"

namespace zero::llm {

// ---- Activations. ---------------------------------------------------------------------------------

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

LlmCuda::Impl::Impl(const LlmConfig& c, const std::vector<ModelParamSpec>& specs,
                    const std::vector<ModuleSpec>& modules, Device* device, cudaStream_t stream,
                    const LlmCudaOptions& options)
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

Status LlmCuda::Impl::Init() {
  prof_.Init(options_.profile, stream_);
  if (options_.attention != LlmAttention::kKernel) {
    Result<std::unique_ptr<CudnnAttention>> a = CudnnAttention::Create(device_, stream_);
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

Result<double> LlmCuda::Impl::Forward(ParamProvider& params, const LlmBatch& batch, State& st, bool want_loss) {
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

Result<double> LlmCuda::Impl::ReadLoss(const State& st) {
  if (!st.has_forward || !st.loss_ready) {
    return FailedPreconditionError(
        "llm_cuda: no loss on these activations (Forward with want_loss, or Backward, computes it)");
  }
  double sum = 0.0;
  ZERO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&sum, st.loss_sum, sizeof(double), cudaMemcpyDeviceToHost, stream_));
  ZERO_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return st.counted > 0 ? sum / static_cast<double>(st.counted) : 0.0;
}

Status LlmCuda::Impl::Backward(ParamProvider& params, State& st, float loss_scale, GradSink& grads) {
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
      ZERO_RETURN_IF_ERROR(
          kernels::CrossEntropy(st.logits, st.targets + r0, rows, V_, coef, st.row_loss + r0, st.dlogits, T, stream_));
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
      ZERO_RETURN_IF_ERROR(kernels::EmbeddingBackward(st.positions, st.unique_ids, st.starts, st.num_unique, H_, st.dh,
                                                      /*accumulate=*/true, st.vh, DType::kF32, stream_));
      prof_.Mark("embedding_backward");
      ZERO_RETURN_IF_ERROR(kernels::Convert(st.vh, DType::kF32, g.data, g.dtype, V_ * H_, stream_));
      prof_.Mark("convert");
    } else {
      ZERO_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(g.data, 0, V_ * H_ * SizeOf(g.dtype), stream_));
      prof_.Mark("memset");
      ZERO_RETURN_IF_ERROR(kernels::EmbeddingBackward(st.positions, st.unique_ids, st.starts, st.num_unique, H_, st.dh,
                                                      /*accumulate=*/false, g.data, g.dtype, stream_));
      prof_.Mark("embedding_backward");
    }
    ZERO_RETURN_IF_ERROR(grads.GradReady(EmbedIndex()));
    ZERO_RETURN_IF_ERROR(scope.Close());
  }
  return OkStatus();
}

Status LlmCuda::Impl::Prepare(State& st, const LlmBatch& batch, DType compute) {
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
  ZERO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(st.inputs, h_inputs, N * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
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

Status LlmCuda::Impl::Plan(State& st, int64_t B, int64_t S, DType T, bool ckpt) {
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

Status LlmCuda::Impl::CheckViews(int m, const std::vector<ParamView>& views) const {
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

Status LlmCuda::Impl::Load(ModuleScope& scope, int m, DType compute, bool convert, int64_t* used, Weights* out) {
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

Status LlmCuda::Impl::LoadHead(ModuleScope& head, ModuleScope& out_scope, const OutputHead& out, DType T, Weights* hw,
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

Result<GradView> LlmCuda::Impl::GradBufferChecked(GradSink& sink, int index) {
  ZERO_ASSIGN_OR_RETURN(GradView view, sink.GradBuffer(index));
  if (view.data == nullptr) return InvalidArgumentError("gradient of " + specs_[index].name + ": null buffer");
  return view;
}

Status LlmCuda::Impl::MatrixGrad(GradSink& sink, int index, DType T, const void* dy, const void* x, int64_t M,
                                 int64_t out, int64_t in) {
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

Status LlmCuda::Impl::NormWeightGrad(GradSink& sink, int index, const void* x, DType xt, const float* rstd,
                                     const void* dy, DType dyt, int64_t rows, int64_t cols, State& st) {
  ZERO_ASSIGN_OR_RETURN(GradView view, GradBufferChecked(sink, index));
  ZERO_RETURN_IF_ERROR(kernels::RmsNormWeightGrad(x, xt, rstd, dy, dyt, rows, static_cast<int>(cols), st.partial,
                                                  view.data, view.dtype, stream_));
  return sink.GradReady(index);
}

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
