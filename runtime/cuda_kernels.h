// Launchers of the CUDA elementwise kernels behind CudaDevice (internal to runtime/; use Device).
//
// Each launcher enqueues one kernel (SumOfSquares: two) on `stream` for the current CUDA device
// and returns the launch error (cudaGetLastError), never waiting for the kernel. n == 0 launches
// nothing. Kernels use grid-stride loops with size_t indices (correct for n >= 2^31) and load 4
// elements at a time when every pointer is aligned for that, one at a time otherwise; per-element
// arithmetic is dtype.h's conversions and AdamWReference, so results equal the CPU backend's
// bitwise. Same-dtype Cast is a byte copy and is not handled here (CudaDevice uses
// cudaMemcpyAsync).
//
// SumOfSquares is deterministic: always kSumOfSquaresBlocks blocks of kSumOfSquaresThreads
// threads, whatever n and the GPU; thread t of the grid owns the groups of 4 consecutive elements
// with group index = t mod (grid threads) and adds their exact double squares in increasing index
// order (the same order with vector or scalar loads); each block sums its threads' values with a
// fixed shared-memory tree into scratch[block]; then one block of kSumOfSquaresThreads threads sums
// the partials (thread j: partials j, j+256, ... in order; then the same tree) into *out.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "runtime/device.h"
#include "runtime/dtype.h"

namespace zero {
namespace cuda_kernels {

inline constexpr int kSumOfSquaresBlocks = 1024;
inline constexpr int kSumOfSquaresThreads = 256;

// Grid limit for the elementwise kernels: blocks of kThreadsPerBlock threads, at most max_blocks
// (CudaDevice passes 8 blocks per multiprocessor, a full GPU of resident threads).
inline constexpr int kThreadsPerBlock = 256;
struct Launch {
  cudaStream_t stream;
  int max_blocks;
};

cudaError_t Fill(void* dst, DType t, size_t n, float value, const Launch& l);
// src_t != dst_t.
cudaError_t Cast(const void* src, DType src_t, void* dst, DType dst_t, size_t n, const Launch& l);
cudaError_t Accumulate(float* acc, const void* src, DType src_t, size_t n, float scale, const Launch& l);
// acc[i] = 0.0f + scale * src[i] (acc not read).
cudaError_t AccumulateFirst(float* acc, const void* src, DType src_t, size_t n, float scale, const Launch& l);
cudaError_t Scale(void* x, DType t, size_t n, float s, const Launch& l);
cudaError_t FiniteCheck(const void* x, DType t, size_t n, int32_t* flag, const Launch& l);
cudaError_t AdamW(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, size_t n, const AdamWParams& h,
                  const Launch& l);
// AdamW from gradients of grad_t, each read as 0.0f + 1.0f * (float) grad[i] (AccumulateFirst's
// widening), in one kernel.
cudaError_t AdamWFromGradient(float* param, const void* grad, DType grad_t, float* exp_avg, float* exp_avg_sq, size_t n,
                              const AdamWParams& h, const Launch& l);
// AdamW plus model_out[i] = (model_t) new param[i], in one kernel (model_out non-null).
cudaError_t AdamWCast(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, size_t n,
                      const AdamWParams& h, void* model_out, DType model_t, const Launch& l);
// `scratch`: kSumOfSquaresBlocks doubles of device memory owned by the stream (no other kernel may
// use it concurrently). Writes *out even for n == 0 (0.0).
cudaError_t SumOfSquares(const void* x, DType t, size_t n, double* out, double* scratch, cudaStream_t stream);

}  // namespace cuda_kernels
}  // namespace zero
