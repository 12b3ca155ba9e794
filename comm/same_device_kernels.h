// The CUDA launcher behind the same-device communicator's reductions (internal to comm/; use
// SameDeviceCommunicator). Only built with CUDA.
//
// One grid-stride kernel per dtype, one thread per element, size_t indices: element i reads the
// sources' element i in rank order and writes out[i] with rank_reduce.h's arithmetic (compiled by
// nvcc with --fmad=false and IEEE division), so the result equals RankReduceHost's bit for bit.
#pragma once

#include <cuda_runtime.h>

#include "comm/rank_reduce.h"

namespace zero {
namespace same_device_kernels {

// Enqueues the reduction on `stream` of the current CUDA device, at most `max_blocks` blocks; returns
// the launch error (cudaGetLastError), never waiting. count == 0 launches nothing.
cudaError_t RankReduce(const RankReduceArgs& args, cudaStream_t stream, int max_blocks);

}  // namespace same_device_kernels
}  // namespace zero
