#include "runtime/cuda_status.h"

#include <string>

namespace zero {

Status CudaStatus(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return OkStatus();
  return InternalError(std::string("CUDA error: ") + call + " at " + file + ":" + std::to_string(line) + ": " +
                       cudaGetErrorString(err) + " (" + cudaGetErrorName(err) + ")");
}

}  // namespace zero
