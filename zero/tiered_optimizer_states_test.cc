#include "zero/tiered_optimizer_states.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/cpu_device.h"
#include "testing/status_matchers.h"
#include "zero/host_optimizer_states.h"
#include "zero/optimizer_states.h"
#include "zero/optimizer_states_testing.h"

namespace zero {
namespace {

constexpr int64_t kN = 1000;

AdamWParams Step(int step) {
  AdamWParams h;
  h.lr = 0.01f;
  h.weight_decay = 0.05f;
  h.bias_correction1 = static_cast<float>(1.0 - std::pow(0.9, step));
  h.bias_correction2 = static_cast<float>(1.0 - std::pow(0.999, step));
  return h;
}

std::unique_ptr<OptimizerStates> HostStates(Device* device, int64_t n, DType model_t) {
  HostOptimizerStatesOptions o;
  o.chunk_numel = 64;
  o.ring_slots = 2;
  o.cpu_threads = 2;
  o.model_dtype = model_t;
  o.slab.pin_memory = false;
  auto s = CreateHostOptimizerStates(device, n, device->default_stream(), o);
  EXPECT_OK(s);
  return s.ok() ? std::move(s).value() : nullptr;
}

std::unique_ptr<OptimizerStates> DeviceStates(Device* device, int64_t n) {
  auto s = CreateDeviceOptimizerStates(device, n, device->default_stream());
  EXPECT_OK(s);
  return s.ok() ? std::move(s).value() : nullptr;
}

// The GPU tier (offload_optimizer.ratio below 1): device states for the first `on_device`
// elements, host states (the CPU AdamW) for the rest, against device states over the whole range:
// the same bits after updates in backward (16-bit gradients, split across the tier boundary),
// updates from host gradients (the host gradient partition's path: the device part's share is
// uploaded) with the model copy written in the same pass, and CastMaster; for every split, the
// empty tiers included.
TEST(TieredOptimizerStatesTest, GpuTierBitwiseEqualToDeviceStates) {
  CpuDevice device;
  Stream* s = device.default_stream();
  const DType t = DType::kBF16;
  for (int64_t on_device : {int64_t{0}, int64_t{1}, int64_t{333}, kN - 1, kN}) {
    SCOPED_TRACE("on_device " + std::to_string(on_device));
    std::unique_ptr<OptimizerStates> tiered = CreateGpuTieredOptimizerStates(&device, DeviceStates(&device, on_device),
                                                                             HostStates(&device, kN - on_device, t));
    std::unique_ptr<OptimizerStates> whole = DeviceStates(&device, kN);
    ASSERT_NE(whole, nullptr);
    EXPECT_EQ(tiered->numel(), kN);
    EXPECT_TRUE(tiered->updates_from_host());
    EXPECT_NE(tiered->host_thread_pool(), nullptr);
    EXPECT_FALSE(tiered->casts_to_host());
    EXPECT_EQ(tiered->bytes().device, static_cast<size_t>(on_device) * 12);
    EXPECT_GE(tiered->bytes().host, static_cast<size_t>(kN - on_device) * 12);

    std::vector<float> init(kN);
    for (int64_t i = 0; i < kN; ++i) init[i] = 0.25f + 0.002f * static_cast<float>(i % 61);
    for (auto* st : {tiered.get(), whole.get()}) ASSERT_OK(st->Write(OptState::kMaster, 0, kN, init.data()));
    for (int step = 1; step <= 4; ++step) {
      std::vector<uint8_t> g(static_cast<size_t>(kN) * SizeOf(t));
      std::vector<float> g32(kN);
      for (int64_t i = 0; i < kN; ++i) {
        float x = 0.02f * static_cast<float>((i * 5 + step) % 31) - 0.3f;
        if (i == 3) x = -0.0f;
        StoreFromFloat(g.data(), t, static_cast<size_t>(i), x);
        g32[i] = x;
      }
      std::vector<uint8_t> a(g.size(), 0x11), b(g.size(), 0x22);
      if (step % 2 == 1) {
        // The update in backward, in two calls that cross the boundary, one with zero gradients.
        for (auto* st : {tiered.get(), whole.get()}) {
          ASSERT_OK(st->UpdateFromGradient(0, 500, g.data(), t, Step(step), s));
          ASSERT_OK(st->UpdateFromGradient(500, kN - 500, nullptr, t, Step(step), s));
        }
        ASSERT_OK(tiered->CastMaster(0, kN, a.data(), t, s));
        ASSERT_OK(whole->CastMaster(0, kN, b.data(), t, s));
      } else {
        // From host gradients, the model copy written in the same pass (device states: Update).
        ASSERT_OK(tiered->UpdateFromHost(0, kN, g32.data(), Step(step), a.data(), t, s));
        ASSERT_OK(whole->Update(0, kN, g32.data(), Step(step), b.data(), t, s));
      }
      EXPECT_EQ(a, b) << "model copy, step " << step;
    }
    ASSERT_NO_FATAL_FAILURE(testing::ExpectStatesBitwiseEqual(*tiered, *whole, kN));
  }
}

// Host and NVMe-style tiering (both parts updating from the host, or neither) keep their answers:
// updates_from_host() only where the offloaded part has it, and no upload without a device.
TEST(TieredOptimizerStatesTest, UpdatesFromHostFollowsTheOffloadedPart) {
  CpuDevice device;
  std::unique_ptr<OptimizerStates> both_host =
      CreateTieredOptimizerStates(HostStates(&device, 10, DType::kBF16), HostStates(&device, 10, DType::kBF16));
  EXPECT_TRUE(both_host->updates_from_host());
  std::unique_ptr<OptimizerStates> device_then_device =
      CreateGpuTieredOptimizerStates(&device, DeviceStates(&device, 10), DeviceStates(&device, 10));
  EXPECT_FALSE(device_then_device->updates_from_host());
  // Without a device the first part's host gradients have nowhere to go.
  std::unique_ptr<OptimizerStates> no_upload =
      CreateTieredOptimizerStates(DeviceStates(&device, 10), HostStates(&device, 10, DType::kBF16));
  EXPECT_FALSE(no_upload->updates_from_host());
  std::vector<float> g(20, 0.5f);
  EXPECT_EQ(no_upload->UpdateFromHost(0, 20, g.data(), Step(1), nullptr, DType::kBF16, device.default_stream()).code(),
            StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace zero
