// CudaDeviceCount and friends (gpu_test_util.h). Built with the CUDA runtime when the toolkit is
// present (ZERO_HAS_CUDA, set by //runtime:gpu_test_util); without it every count is 0.
#include "runtime/gpu_test_util.h"

#include <cstdlib>
#include <string>

#if defined(ZERO_HAS_CUDA) && ZERO_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

namespace zero {
namespace testing {

int CudaDeviceCount(std::string* why) {
#if defined(ZERO_HAS_CUDA) && ZERO_HAS_CUDA
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // Clear the sticky error so a later CUDA call does not report it.
    if (why != nullptr) {
      *why = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(err) + " (" + cudaGetErrorName(err) + ")";
    }
    return 0;
  }
  if (count == 0 && why != nullptr) *why = "cudaGetDeviceCount found none";
  return count;
#else
  if (why != nullptr) *why = "this build has no CUDA support (built without the CUDA toolkit)";
  return 0;
#endif
}

std::string MissingCudaDevices(int count) {
  std::string why;
  const int have = CudaDeviceCount(&why);
  if (have == 0) return "no CUDA device: " + why;
  if (have < count) return "needs " + std::to_string(count) + " CUDA devices, have " + std::to_string(have);
  return "";
}

bool GpuRequired() {
  const char* v = std::getenv("ZERO_REQUIRE_GPU");
  return v != nullptr && v[0] != '\0' && std::string(v) != "0";
}

}  // namespace testing
}  // namespace zero
