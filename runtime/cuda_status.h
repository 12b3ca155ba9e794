// Conversion of CUDA runtime and cuBLAS error codes to Status, at the edge where CUDA is called.
//
// CudaStatus turns a cudaError_t into OK or an InternalError naming the failed call, where it was
// made, cudaGetErrorString's text and the error's name, and consumes the error (cudaGetLastError),
// so the next launch check names its own launch rather than this call (a sticky error, which
// corrupts the context, stays). ZERO_CUDA_RETURN_IF_ERROR(call) is the one macro the CUDA code of
// zero uses to check runtime calls; ZERO_CUDA_RETURN_IF_LAUNCH_FAILED(kernel) checks a kernel
// launch; ZERO_CUBLAS_RETURN_IF_ERROR(call) checks a cuBLAS call. Only built when the CUDA toolkit
// is present (//runtime:cuda_status exists only with HAS_CUDA). Owns nothing; thread-safe (CUDA's
// last error is per host thread: check on the thread that made the call).
#pragma once

#include <cuda_runtime.h>

#include "runtime/status.h"

namespace zero {

// OK for cudaSuccess; otherwise InternalError("CUDA error: <call> at <file>:<line>: <text>
// (<name>)"), after clearing CUDA's last error of this thread.
Status CudaStatus(cudaError_t err, const char* call, const char* file, int line);

// InternalError("cuBLAS error: <call> at <file>:<line>: <text> (<name>)") for a cuBLAS status
// other than CUBLAS_STATUS_SUCCESS (0; OK for it). `name` and `text` are cublasGetStatusName's and
// cublasGetStatusString's, supplied by ZERO_CUBLAS_RETURN_IF_ERROR at the call site, whose target
// links cuBLAS (this one does not).
Status CublasStatus(int status, const char* name, const char* text, const char* call, const char* file, int line);

}  // namespace zero

#define ZERO_CUDA_RETURN_IF_ERROR(call)                                     \
  do {                                                                      \
    cudaError_t _zero_cuda_err = (call);                                    \
    if (_zero_cuda_err != cudaSuccess) {                                    \
      return ::zero::CudaStatus(_zero_cuda_err, #call, __FILE__, __LINE__); \
    }                                                                       \
  } while (0)

// Right after `kernel<<<...>>>(...)`: returns the launch's error, naming the kernel.
#define ZERO_CUDA_RETURN_IF_LAUNCH_FAILED(kernel)                                          \
  do {                                                                                     \
    cudaError_t _zero_cuda_err = cudaGetLastError();                                       \
    if (_zero_cuda_err != cudaSuccess) {                                                   \
      return ::zero::CudaStatus(_zero_cuda_err, "launch of " #kernel, __FILE__, __LINE__); \
    }                                                                                      \
  } while (0)

// For a file that includes <cublas_v2.h> and links cuBLAS.
#define ZERO_CUBLAS_RETURN_IF_ERROR(call)                                                                  \
  do {                                                                                                     \
    cublasStatus_t _zero_cublas_st = (call);                                                               \
    if (_zero_cublas_st != CUBLAS_STATUS_SUCCESS) {                                                        \
      return ::zero::CublasStatus(static_cast<int>(_zero_cublas_st), cublasGetStatusName(_zero_cublas_st), \
                                  cublasGetStatusString(_zero_cublas_st), #call, __FILE__, __LINE__);      \
    }                                                                                                      \
  } while (0)
