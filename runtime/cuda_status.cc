#include "runtime/cuda_status.h"

#include <string>

namespace zero {

Status CudaStatus(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return OkStatus();
  cudaGetLastError();  // consumed: a later launch check must not report this call's error
  return InternalError(std::string("CUDA error: ") + call + " at " + file + ":" + std::to_string(line) + ": " +
                       cudaGetErrorString(err) + " (" + cudaGetErrorName(err) + ")");
}

Status CublasStatus(int status, const char* name, const char* text, const char* call, const char* file, int line) {
  if (status == 0) return OkStatus();
  return InternalError(std::string("cuBLAS error: ") + call + " at " + file + ":" + std::to_string(line) + ": " + text +
                       " (" + name + ")");
}

}  // namespace zero
