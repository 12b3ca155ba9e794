// LlmCuda::Impl (cuda_model_impl.h): one decoder layer's forward and backward, the cuBLAS matrix
// products they and the head run, and the choice between cuDNN's attention and the model's own.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <string>

#include "models/llama/attention_cudnn.h"
#include "models/llama/cuda_model_impl.h"
#include "models/llama/kernels.cuh"
#include "runtime/cuda_status.h"

namespace zero::llm {

Result<bool> LlmCuda::Impl::UseCudnn(const State& st) {
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

Status LlmCuda::Impl::Gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void* a, DType at, int64_t lda,
                           const void* b, DType bt, int64_t ldb, void* c, DType ct, int64_t ldc, float beta) {
  if (m <= 0 || n <= 0) return OkStatus();
  for (int64_t d : {m, n, k, lda, ldb, ldc}) {
    if (d > INT_MAX) {
      return InvalidArgumentError("llm_cuda: matrix product dimension " + std::to_string(d) + " above 2^31 - 1");
    }
  }
  const float one = 1.0f;
  // cuBLAS is column-major, where a row-major X is X^T: compute C^T = op(B)^T op(A)^T.
  ZERO_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(
      cublas_, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
      static_cast<int>(k), &one, b, CudaType(bt), static_cast<int>(ldb), a, CudaType(at), static_cast<int>(lda), &beta,
      c, CudaType(ct), static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return OkStatus();
}

Status LlmCuda::Impl::LayerForward(State& st, int64_t l, const Weights& w, bool recompute) {
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
  ZERO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b.h_mid, h_in, N * H_ * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
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
  ZERO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h_out, b.h_mid, N * H_ * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
  prof_.Mark("copy");
  ZERO_RETURN_IF_ERROR(LinearForward(T, b.act, w.data[p.down], N, H_, I_, h_out, DType::kF32, 1.0f));
  prof_.Mark("gemm_fwd");
  return OkStatus();
}

Status LlmCuda::Impl::LayerBackward(State& st, int64_t l, const Weights& w, GradSink& grads) {
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
  ZERO_RETURN_IF_ERROR(kernels::RmsNormBackward(b.h_mid, F, b.rstd2, w.data[p.post_norm], w.dtype[p.post_norm], st.dxn,
                                                F, N, H, /*accumulate=*/true, st.dh, F, stream_, DhTCopy(st), T));
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
                                                    static_cast<int>(nh_), static_cast<int>(nkv_), hd, scale_, st.delta,
                                                    st.dq, st.dk, st.dv, stream_));
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

}  // namespace zero::llm
