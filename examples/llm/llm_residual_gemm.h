// LtResidualGemm: a decoder layer's residual add in its output product's epilogue. The layer
// computes out[M, n] = res[M, n] + x[M, k] W[n, k]^T with fp32 res and out in different buffers
// (the layer keeps both: the next layer reads out, the backward reads res). cublasGemmEx reads
// and writes one C, so the caller had to copy res into out first (56 copies of [tokens, hidden]
// fp32 per llama-3.2-3b step); cuBLASLt takes C and D apart, so the copy goes.
//
// Owns a cuBLASLt handle and one cached plan (layouts, descriptor, algorithm) per shape, all on
// one stream; the workspace is the caller's (it may share it with cuBLAS on the same stream).
// Algorithms that reduce split-K partials in place (atomics: not bitwise reproducible run to run)
// are excluded. Not thread-safe.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "runtime/dtype.h"
#include "runtime/status.h"

namespace zero::llm {

class LtResidualGemm {
 public:
  // `workspace` (device memory, `workspace_bytes`) must outlive this object and be used by nothing
  // else that runs concurrently with it on other streams.
  static Result<std::unique_ptr<LtResidualGemm>> Create(cudaStream_t stream, void* workspace, size_t workspace_bytes);
  ~LtResidualGemm();
  LtResidualGemm(const LtResidualGemm&) = delete;
  LtResidualGemm& operator=(const LtResidualGemm&) = delete;

  // out[M, n] = res[M, n] + x[M, k] W[n, k]^T, row-major; x and W of `t` (16-bit or fp32), res and
  // out fp32 (apart, same shape, dense). fp32 accumulation. Unavailable when cuBLASLt offers no
  // algorithm for the shape (the caller copies res into out and uses beta = 1 instead); other
  // errors are cuBLAS's, naming the call.
  Status Run(DType t, const void* x, const void* w, int64_t M, int64_t n, int64_t k, const float* res, float* out);

 private:
  struct Impl;
  explicit LtResidualGemm(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zero::llm
