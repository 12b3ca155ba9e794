// CudnnAttention: LlmCuda's causal grouped-query attention on tensor cores, through cuDNN's fused
// scaled-dot-product attention (the graph API's flash-attention engines, built with cuDNN's C++
// frontend), forward and backward, in bf16 with fp32 softmax statistics and accumulation.
//
// Layout (LlmCuda's): q and o [batch, seq, heads, head_dim] row-major, k and v [batch, seq,
// kv_heads, head_dim]; the statistics [batch, heads, seq] fp32, the natural-log log-sum-exp of each
// row's scaled, causally masked scores (what the backward needs; the same quantity as
// kernels::AttentionForward's lse). The seq x seq scores never reach global memory.
//
// Plans are built per shape on first use (Prepare, or the first Forward/Backward of a shape) and
// kept: building takes tens to hundreds of milliseconds (cuDNN may compile kernels at run time),
// executing one enqueues kernels and nothing else. The workspace is owned here, taken from the
// Device given at creation as a DeviceArena labelled "workspace" (runtime/device_arena.h, so the
// Device's memory_stats() and the arena tally count it), and grows to the largest plan's need;
// growing it, and destroying this object while it holds one, synchronizes the stream (the old one
// may be in use). All work is enqueued on the stream given at creation, which the caller owns and
// which must outlive this.
//
// Determinism: with `deterministic` (the default) the backward uses cuDNN's deterministic
// algorithm (dQ without atomics), so two runs give the same bits on one GPU model and cuDNN
// version; a shape for which cuDNN has no such plan is Unimplemented (the caller falls back).
// Not thread-safe; one object per stream.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "runtime/status.h"

namespace zero {
class Device;
}  // namespace zero

namespace zero::llm {

struct AttentionShape {
  int batch = 0, seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
  float scale = 0.0f;
  bool operator==(const AttentionShape& o) const {
    return batch == o.batch && seq == o.seq && heads == o.heads && kv_heads == o.kv_heads && head_dim == o.head_dim &&
           scale == o.scale;
  }
  std::string ToString() const;
};

class CudnnAttention {
 public:
  // Creates the cuDNN handle on the current device, bound to `stream`. `device` must be a
  // CudaDevice (Device::AsCuda; the current device) and outlive this: the workspace comes from it.
  // `stream` is a CUDA stream of that device. InvalidArgument for a device that is not a CUDA
  // device; Unavailable when this build has no cuDNN (tools/setup.sh could not fetch the frontend
  // headers, or no cudnn.h/libcudnn) or the library cannot be loaded or initialized (the message
  // says which).
  static Result<std::unique_ptr<CudnnAttention>> Create(Device* device, cudaStream_t stream, bool deterministic = true);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Whether this build was made with cuDNN at all.
  static bool Built();
  // cuDNN's version at run time (e.g. 91400), 0 without cuDNN.
  static long RuntimeVersion();

  // Builds the forward and backward plans of `shape` if not built yet. Unimplemented (naming the
  // shape and cuDNN's reason) when cuDNN has no plan for it, e.g. a head_dim it does not support;
  // the failure is remembered, later calls return it at once.
  Status Prepare(const AttentionShape& shape);

  // o = softmax(scale * q k^T + causal mask) v per head (head h reads kv head h / (heads / kv_heads)),
  // stats = its log-sum-exp. Buffers as in the layout above, bf16 except stats.
  Status Forward(const AttentionShape& shape, const void* q, const void* k, const void* v, void* o, float* stats);

  // dq, dk, dv (bf16, q's and k's layouts) of Forward's o given dout (bf16, o's layout) and the
  // forward's o and stats. dk and dv sum the heads of each group.
  Status Backward(const AttentionShape& shape, const void* q, const void* k, const void* v, const void* o,
                  const void* dout, const float* stats, void* dq, void* dk, void* dv);

  struct Impl;

 private:
  explicit CudnnAttention(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zero::llm
