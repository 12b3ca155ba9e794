// RankReduce: the per-element arithmetic of the same-device communicator's reductions, one
// definition for the CPU loop (RankReduceHost) and the CUDA kernel (same_device_kernels.cu).
//
// out[i] = the ranks' element i combined in rank order 0, 1, ..., n-1 in fp32 (16-bit inputs
// converted exactly), rounded once to the buffer's dtype; kAvg divides the fp32 sum by n first;
// kMax keeps the larger value, a NaN wins, a tie keeps the lower rank's value. That is
// communicator.h's reduction contract and GlooCommunicator's arithmetic, so for every result that
// is not a NaN the bits equal Gloo's. A NaN produced by the arithmetic (a sum, the kAvg division)
// is stored as the canonical NaN 0x7fffffff, as runtime/device.h's kernels do, so the CPU and CUDA
// backends agree bit for bit; Gloo keeps the host's NaN payload instead (NaN either way). kMax and
// a lone rank's sum do no arithmetic and pass a NaN's bits through (16-bit: quieted by dtype.h's
// conversion). Header-only; owns nothing.
#pragma once

#include <cstddef>

#include "runtime/dtype.h"

namespace zero {

enum class RankReduceOp : int { kSum = 0, kAvg = 1, kMax = 2 };

// The most ranks one reduction reads (the same-device communicator's largest world size): the
// source pointers travel by value in the kernel's parameters.
inline constexpr int kMaxRankReduceSources = 64;

// One reduction over `n_srcs` buffers of `count` elements of `dtype`. `out` may be one of `srcs`
// (in place: every element is read from all sources before it is written); it must not overlap
// any source at another offset.
struct RankReduceArgs {
  const void* srcs[kMaxRankReduceSources] = {};
  int n_srcs = 0;
  void* out = nullptr;
  size_t count = 0;
  DType dtype = DType::kF32;
  RankReduceOp op = RankReduceOp::kSum;
};

// acc combined with the next rank's value v.
ZERO_HD float RankCombine(float acc, float v, RankReduceOp op) {
  if (op == RankReduceOp::kMax) return (v > acc || v != v) ? v : acc;
  const float s = acc + v;
  return s != s ? BitsToFloat(0x7fffffffu) : s;
}

// The combined value of n ranks before rounding to the dtype.
ZERO_HD float RankFinish(float acc, RankReduceOp op, int n) {
  if (op != RankReduceOp::kAvg || n == 1) return acc;
  const float q = acc / static_cast<float>(n);
  return q != q ? BitsToFloat(0x7fffffffu) : q;
}

// Runs the reduction on the calling thread (host memory). Defined in rank_reduce.cc.
void RankReduceHost(const RankReduceArgs& args);

}  // namespace zero
