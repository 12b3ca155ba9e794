// The one gate every GPU test passes through: whether this process can use enough CUDA devices,
// and the gtest macro that skips a test (with the reason) where it cannot, so that a plain
// `bazel test //...` passes on a machine without a GPU. On the GPU machine, ZERO_REQUIRE_GPU=1
// turns a missing GPU into a failure, so a broken driver cannot pass as "all skipped".
// Test-only (testonly = True); owns nothing; thread-safe.
#pragma once

#include <string>

namespace zero {
namespace testing {

// The number of CUDA devices cudaGetDeviceCount reports, or 0 when it fails (no driver, no GPU,
// CUDA_VISIBLE_DEVICES empty) or the build has no CUDA. When it returns 0 and `why` is not null,
// *why says why ("cudaGetDeviceCount failed: <text> (<error name>)", "cudaGetDeviceCount found
// none" or "this build has no CUDA support").
int CudaDeviceCount(std::string* why = nullptr);

// "" when at least `count` (>= 1) CUDA devices are usable; otherwise the reason, for a skip
// message: "no CUDA device: <why>" when there is none, "needs <count> CUDA devices, have <n>" when
// there are some but too few.
std::string MissingCudaDevices(int count);

// True when the environment variable ZERO_REQUIRE_GPU is set to something other than "" or "0":
// then having no CUDA device at all is a failure rather than a skip (too few, but at least one,
// still skips: the one-GPU machine cannot run the multi-GPU cases).
bool GpuRequired();

}  // namespace testing
}  // namespace zero

// At the start of a TEST body or a fixture's SetUp(): returns from it with GTEST_SKIP() and the
// reason when fewer than `count` CUDA devices are usable (GTEST_FAIL() instead when there is none
// and GpuRequired()). The including file includes gtest.
#define ZERO_SKIP_WITHOUT_CUDA_DEVICES(count)                                                  \
  do {                                                                                         \
    const std::string zero_missing_gpus_ = ::zero::testing::MissingCudaDevices(count);         \
    if (!zero_missing_gpus_.empty()) {                                                         \
      if (::zero::testing::GpuRequired() && ::zero::testing::CudaDeviceCount() == 0) {         \
        GTEST_FAIL() << zero_missing_gpus_ << " (ZERO_REQUIRE_GPU is set: a GPU is required)"; \
      }                                                                                        \
      GTEST_SKIP() << zero_missing_gpus_;                                                      \
    }                                                                                          \
  } while (0)
