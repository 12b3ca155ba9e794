// Launchers of the CUDA kernels of the transformer (LlmCuda, cuda_model.h): everything but the
// matrix products, which are cuBLAS calls in cuda_model.cu. One header for all of them (the model
// and the kernel tests use every operation); each operation's kernels and launchers live in
// kernels/<op>.cu, one file per section below.
//
// Plain C++ declarations, includable from host code (the kernel tests call them directly). Each
// launcher enqueues its kernel(s) on `stream` for the current CUDA device and returns the launch
// error as a Status, never waiting; a size of zero launches nothing. Pointers are device memory.
// Tensors named "activation" below are fp32 or bf16 (DType kF32 / kBF16); weights and gradient
// buffers may also be fp16. Every element is read as fp32 and written with dtype.h's
// round-to-nearest-even, every statistic (norm mean squares, softmax max and sum, dot products) is
// accumulated in fp32, and every reduction runs in a fixed order with no atomics, so the results
// are bitwise reproducible run to run on one GPU model. Index arithmetic is 64-bit where a product
// of sizes can pass 2^31.
//
// Shapes: N = batch * seq token rows, row n = b * seq + t (position t); q/o are [N, nh, hd],
// k/v [N, nkv, hd] (the projections' row-major outputs); lse/delta are [batch, nh, seq].
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "runtime/dtype.h"
#include "runtime/status.h"

namespace zero::llm::kernels {

// Largest head_dim the attention kernels take (their register and shared-memory tiles).
inline constexpr int kMaxHeadDim = 256;

// dst[i] = src[i] converted (a byte copy when the dtypes match, nothing when src == dst too), i < n.
// Otherwise src and dst must not overlap.
Status Convert(const void* src, DType src_t, void* dst, DType dst_t, int64_t n, cudaStream_t stream);

// ---- Embedding --------------------------------------------------------------------------------

// out[n, c] = table[ids[n], c] (fp32 out). REQUIRES: 0 <= ids[n] < vocab (checked by the caller).
Status EmbeddingForward(const int32_t* ids, int64_t rows, int64_t hidden, const void* table, DType table_t, float* out,
                        cudaStream_t stream);

// The lookup's gradient, summed per vocabulary row in a fixed order: for u < num_unique, row
// id = unique_ids[u] of `grad` becomes
//   (accumulate ? grad[id, :] : 0) + sum over p in [starts[u], starts[u+1]) of dh[positions[p], :]
// added in increasing p (positions sorted by id, then by position). Rows of `grad` whose id has
// no position are not touched (the caller zeroes them first when not accumulating).
Status EmbeddingBackward(const int32_t* positions, const int32_t* unique_ids, const int32_t* starts, int64_t num_unique,
                         int64_t hidden, const float* dh, bool accumulate, void* grad, DType grad_t,
                         cudaStream_t stream);

// ---- RMSNorm (also Qwen3's per-head q/k norm: rows = N * heads, cols = head_dim) ---------------

// rstd[r] = 1 / sqrt(sum_c x[r,c]^2 / cols + eps) (fp32); y[r,c] = (x[r,c] * rstd[r]) * w[c].
Status RmsNormForward(const void* x, DType x_t, const void* w, DType w_t, int64_t rows, int cols, float eps, void* y,
                      DType y_t, float* rstd, cudaStream_t stream);

// The input gradient: with g = dy * w and xhat = x * rstd,
//   dx[r,c] = (accumulate ? dx[r,c] : 0) + rstd[r] * (g[r,c] - xhat[r,c] * sum_c' g*xhat / cols).
// dx may alias dy only when !accumulate and both have the same dtype. With `dx_copy` (non-null, apart
// from the others) the new dx is also stored there in `dx_copy_t`: the bits Convert(dx) would give,
// without reading dx again.
Status RmsNormBackward(const void* x, DType x_t, const float* rstd, const void* w, DType w_t, const void* dy,
                       DType dy_t, int64_t rows, int cols, bool accumulate, void* dx, DType dx_t, cudaStream_t stream,
                       void* dx_copy = nullptr, DType dx_copy_t = DType::kF32);

// The weight gradient dw[c] = sum_r dy[r,c] * (x[r,c] * rstd[r]), summed in fixed row chunks whose
// partial sums are then added in chunk order. `partial` holds RmsNormWeightGradScratch(rows, cols)
// floats.
int64_t RmsNormWeightGradScratch(int64_t rows, int cols);
Status RmsNormWeightGrad(const void* x, DType x_t, const float* rstd, const void* dy, DType dy_t, int64_t rows,
                         int cols, float* partial, void* dw, DType dw_t, cudaStream_t stream);

// ---- RoPE (Hugging Face rotate-half) ----------------------------------------------------------

// In place on x [N, heads, head_dim], position t = n % seq, half = head_dim / 2, i < half,
// c = cos_table[t * half + i], s = sin_table[t * half + i]:
//   forward: x[i], x[i+half] = x[i]*c - x[i+half]*s, x[i+half]*c + x[i]*s
//   inverse (the backward: the transposed rotation): x[i]*c + x[i+half]*s, x[i+half]*c - x[i]*s
Status Rope(void* x, DType x_t, int64_t rows, int seq, int heads, int head_dim, const float* cos_table,
            const float* sin_table, bool inverse, cudaStream_t stream);

// ---- SwiGLU -----------------------------------------------------------------------------------

// a = silu(g) * u with silu(g) = g / (1 + exp(-g)), over n elements (g, u, a of dtype t).
Status SwiGluForward(const void* g, const void* u, DType t, int64_t n, void* a, cudaStream_t stream);
// dg = da * u * silu'(g), du = da * silu(g); silu'(g) = s * (1 + g * (1 - s)), s = sigmoid(g).
Status SwiGluBackward(const void* g, const void* u, DType t, const float* da, int64_t n, void* dg, void* du,
                      cudaStream_t stream);

// ---- Causal attention (flash style: the seq x seq scores never reach global memory) ------------

// o = softmax(q k^T * scale + causal mask) v per (batch, q head), kv head = head / (nh / nkv);
// lse[b, h, t] = the row's log-sum-exp of the scaled scores (fp32). q, k, v, o: activation dtype t.
// Online softmax over key tiles in fp32. REQUIRES: head_dim <= kMaxHeadDim, nh % nkv == 0.
Status AttentionForward(const void* q, const void* k, const void* v, DType t, int batch, int seq, int nh, int nkv,
                        int head_dim, float scale, void* o, float* lse, cudaStream_t stream);

// Gradients of AttentionForward given dout (dtype t), recomputing the scores tile by tile:
// delta[b,h,t] = sum_d dout * o (scratch, [batch, nh, seq] floats), then dq (fp32, [N, nh, hd]) by
// one kernel over query tiles, and dk, dv (fp32, [N, nkv, hd]) by one over key tiles that sums the
// q heads of a group in head order. No atomics.
Status AttentionBackward(const void* q, const void* k, const void* v, const void* o, const void* dout, DType t,
                         const float* lse, int batch, int seq, int nh, int nkv, int head_dim, float scale, float* delta,
                         float* dq, float* dk, float* dv, cudaStream_t stream);

// ---- Cross-entropy over the vocabulary --------------------------------------------------------

// Per row r < rows of fp32 logits [rows, vocab] (row stride vocab): lse = max + log(sum exp(x -
// max)), the max and the sum found in one pass (online softmax: each thread's partial sum is
// rescaled when its max grows, then to the row's max; the same value up to fp32 rounding);
// row_loss[r] = lse - x[target] for targets[r] != -100, else 0. If dlogits is not null it
// gets (softmax - onehot(target)) * coef in its dtype (a row of zeros for an ignored target).
// REQUIRES: targets are -100 or in [0, vocab) (checked by the caller).
Status CrossEntropy(const float* logits, const int32_t* targets, int64_t rows, int64_t vocab, float coef,
                    float* row_loss, void* dlogits, DType dlogits_t, cudaStream_t stream);

// *out = sum of x[0, n) in double, in a fixed order (one block).
Status SumToDouble(const float* x, int64_t n, double* out, cudaStream_t stream);

}  // namespace zero::llm::kernels
