// CreateDevice (declared in device.h): picks the backend by name. The CUDA backend is linked only
// when the build has the CUDA toolkit; //runtime:cuda_device then defines ZERO_HAS_CUDA.
#include <cstdlib>
#include <memory>
#include <string>

#include "runtime/cpu_device.h"
#include "runtime/device.h"

#if defined(ZERO_HAS_CUDA) && ZERO_HAS_CUDA
#include "runtime/cuda_device.h"
#endif

namespace zero {
namespace {

// "cuda" -> 0, "cuda:N" -> N; -1 if the suffix is not a small decimal number.
int ParseCudaOrdinal(const std::string& name) {
  if (name == "cuda") return 0;
  std::string digits = name.substr(5);
  if (digits.empty() || digits.size() > 4) return -1;
  int ordinal = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return -1;
    ordinal = ordinal * 10 + (c - '0');
  }
  return ordinal;
}

}  // namespace

Result<std::unique_ptr<Device>> CreateDevice(const std::string& name) {
  if (name == "cpu") return std::unique_ptr<Device>(std::make_unique<CpuDevice>());
  if (name == "cuda" || name.rfind("cuda:", 0) == 0) {
    int ordinal = ParseCudaOrdinal(name);
    if (ordinal < 0) {
      return InvalidArgumentError("device \"" + name + "\": expected \"cuda\" or \"cuda:N\" with N a GPU ordinal");
    }
#if defined(ZERO_HAS_CUDA) && ZERO_HAS_CUDA
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<CudaDevice> device, CudaDevice::Create(ordinal));
    return std::unique_ptr<Device>(std::move(device));
#else
    return UnimplementedError("device \"" + name +
                              "\": this build of zero has no CUDA support (built without the CUDA "
                              "toolkit, or with ZERO_DISABLE_CUDA=1); use \"cpu\"");
#endif
  }
  return InvalidArgumentError("unknown device \"" + name + "\": expected \"cpu\", \"cuda\" or \"cuda:N\"");
}

}  // namespace zero
