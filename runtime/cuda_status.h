// Conversion of CUDA runtime error codes to Status, at the edge where CUDA is called.
//
// CudaStatus turns a cudaError_t into OK or an InternalError naming the failed call, where it was
// made, cudaGetErrorString's text and the error's name; ZERO_CUDA_RETURN_IF_ERROR(call) is the one
// macro the CUDA code of zero uses to check runtime calls. Only built when the CUDA toolkit is
// present (//runtime:cuda_status exists only with HAS_CUDA). Owns nothing; thread-safe.
#pragma once

#include <cuda_runtime.h>

#include "runtime/status.h"

namespace zero {

// OK for cudaSuccess; otherwise InternalError("CUDA error: <call> at <file>:<line>: <text>
// (<name>)").
Status CudaStatus(cudaError_t err, const char* call, const char* file, int line);

}  // namespace zero

#define ZERO_CUDA_RETURN_IF_ERROR(call)                                     \
  do {                                                                      \
    cudaError_t _zero_cuda_err = (call);                                    \
    if (_zero_cuda_err != cudaSuccess) {                                    \
      return ::zero::CudaStatus(_zero_cuda_err, #call, __FILE__, __LINE__); \
    }                                                                       \
  } while (0)
