// HostSlab on the CUDA backend (needs a GPU; skips without one): the slab is registered with
// cudaHostRegister, async copies to and from it round-trip, and 20 destroy/create cycles leave
// no slab bytes live.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "offload/host_slab.h"
#include "runtime/cuda_device.h"
#include "runtime/gpu_test_util.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

TEST(HostSlabCudaTest, PinnedSlabRoundTripsAndUnregisters) {
  ZERO_SKIP_WITHOUT_CUDA_DEVICES(1);
  Result<std::unique_ptr<CudaDevice>> dev = CudaDevice::Create(0);
  ASSERT_OK(dev);
  const size_t n = size_t{8} << 20;
  for (int cycle = 0; cycle < 20; ++cycle) {
    HostSlabOptions o;
    o.what = "test states";
    Result<HostSlab> slab = HostSlab::Create(dev->get(), 2 * n, o);
    ASSERT_OK(slab);
    ASSERT_TRUE(slab->pinned());
    cudaPointerAttributes attr{};
    ASSERT_EQ(cudaPointerGetAttributes(&attr, slab->data()), cudaSuccess);
    ASSERT_EQ(attr.type, cudaMemoryTypeHost) << "slab not registered with CUDA";
    Result<HostSpan> src = slab->Take(n, "src"), dst = slab->Take(n, "dst");
    ASSERT_TRUE(src.ok() && dst.ok());
    for (size_t i = 0; i < n; ++i) src->as<uint8_t>()[i] = static_cast<uint8_t>(i * 13 + cycle);
    Result<DeviceBuffer> buf = (*dev)->Allocate(n);
    ASSERT_OK(buf);
    ASSERT_OK((*dev)->Copy(buf->data(), src->data, n, CopyKind::kHostToDevice, nullptr));
    ASSERT_OK((*dev)->Copy(dst->data, buf->data(), n, CopyKind::kDeviceToHost, nullptr));
    ASSERT_OK((*dev)->Synchronize());
    ASSERT_EQ(std::memcmp(src->data, dst->data, n), 0) << "cycle " << cycle;
  }
  EXPECT_EQ(HostSlab::live_bytes(), 0u);
}

}  // namespace
}  // namespace zero
