#include "zero/host_optimizer_states.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "runtime/cpu_device.h"
#include "testing/status_matchers.h"
#include "zero/optimizer_states.h"
#include "zero/optimizer_states_testing.h"

namespace zero {
namespace {

// Host states (CPU AdamW, chunked transfers) against device states (Device::AdamWCast): the same
// bits after several updates over ragged ranges, for chunk sizes that do and do not divide them.
TEST(HostOptimizerStatesTest, BitwiseEqualToDeviceStates) {
  CpuDevice device;
  Stream* s = device.default_stream();
  constexpr int64_t kN = 1031;
  for (int64_t chunk : {int64_t{1}, int64_t{7}, int64_t{256}, int64_t{1} << 20}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    HostOptimizerStatesOptions o;
    o.chunk_numel = chunk;
    o.cpu_threads = 2;
    o.slab.pin_memory = false;
    auto host = CreateHostOptimizerStates(&device, kN, s, o);
    ASSERT_OK(host);
    auto dev = CreateDeviceOptimizerStates(&device, kN, s);
    ASSERT_OK(dev);
    EXPECT_EQ((*host)->bytes().device, 0u);
    EXPECT_GE((*host)->bytes().host, 3u * kN * 4);
    std::vector<float> init(kN);
    for (int64_t i = 0; i < kN; ++i) init[i] = 0.5f - 0.001f * static_cast<float>(i % 113);
    for (auto* st : {host->get(), dev->get()}) ASSERT_OK(st->Write(OptState::kMaster, 0, kN, init.data()));
    for (int step = 1; step <= 3; ++step) {
      std::vector<float> g(kN);
      for (int64_t i = 0; i < kN; ++i) g[i] = 0.01f * static_cast<float>((i * 7 + step) % 29) - 0.1f;
      AdamWParams h;
      h.lr = 0.01f;
      h.weight_decay = 0.1f;
      h.bias_correction1 = static_cast<float>(1.0 - std::pow(0.9, step));
      h.bias_correction2 = static_cast<float>(1.0 - std::pow(0.999, step));
      std::vector<uint16_t> a(kN, 0), b(kN, 0);
      // Two ranges, the second not starting at a chunk boundary; bf16 copy on the first only.
      ASSERT_OK((*host)->Update(0, 600, g.data(), h, a.data(), DType::kBF16, s));
      ASSERT_OK((*dev)->Update(0, 600, g.data(), h, b.data(), DType::kBF16, s));
      ASSERT_OK((*host)->Update(600, kN - 600, g.data() + 600, h, nullptr, DType::kBF16, s));
      ASSERT_OK((*dev)->Update(600, kN - 600, g.data() + 600, h, nullptr, DType::kBF16, s));
      EXPECT_EQ(a, b) << "step " << step;
    }
    ASSERT_NO_FATAL_FAILURE(testing::ExpectStatesBitwiseEqual(**host, **dev, kN));
    std::vector<uint16_t> c1(kN), c2(kN);
    ASSERT_OK((*host)->CastMaster(5, kN - 5, c1.data(), DType::kBF16, s));
    ASSERT_OK((*dev)->CastMaster(5, kN - 5, c2.data(), DType::kBF16, s));
    EXPECT_EQ(c1, c2);
    std::vector<float> d1(10, -1), d2(10, -1);
    ASSERT_OK((*host)->CopyToDevice(OptState::kExpAvg, 100, 10, d1.data(), s));
    ASSERT_OK((*dev)->CopyToDevice(OptState::kExpAvg, 100, 10, d2.data(), s));
    EXPECT_EQ(d1, d2);
    EXPECT_EQ((*host)->Read(OptState::kMaster, kN, 1, d1.data()).code(), StatusCode::kOutOfRange);
  }
}

// The update in backward: 16-bit gradients queued to the worker (few slots, small chunks: the
// caller waits for slots) and zero gradients, against the device states (AdamWFromGradient); then the
// published model copy and every state, bitwise.
TEST(HostOptimizerStatesTest, UpdateFromGradientEqualsDeviceStates) {
  CpuDevice device;
  Stream* s = device.default_stream();
  constexpr int64_t kN = 777;
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    SCOPED_TRACE(DTypeName(t));
    HostOptimizerStatesOptions o;
    o.chunk_numel = 50;
    o.ring_slots = 2;
    o.cpu_threads = 3;
    o.model_dtype = t;
    o.slab.pin_memory = false;
    auto host = CreateHostOptimizerStates(&device, kN, s, o);
    ASSERT_OK(host);
    auto dev = CreateDeviceOptimizerStates(&device, kN, s);
    ASSERT_OK(dev);
    std::vector<float> init(kN);
    for (int64_t i = 0; i < kN; ++i) init[i] = 0.25f + 0.002f * static_cast<float>(i % 61);
    for (auto* st : {host->get(), dev->get()}) ASSERT_OK(st->Write(OptState::kMaster, 0, kN, init.data()));
    for (int step = 1; step <= 3; ++step) {
      std::vector<uint8_t> g(static_cast<size_t>(kN) * SizeOf(t));
      for (int64_t i = 0; i < kN; ++i) {
        float x = 0.02f * static_cast<float>((i * 5 + step) % 31) - 0.3f;
        if (i == 3) x = -0.0f;  // widened to +0, as the partition would hold it
        StoreFromFloat(g.data(), t, static_cast<size_t>(i), x);
      }
      AdamWParams h;
      h.lr = 0.01f;
      h.weight_decay = 0.05f;
      h.bias_correction1 = static_cast<float>(1.0 - std::pow(0.9, step));
      h.bias_correction2 = static_cast<float>(1.0 - std::pow(0.999, step));
      for (auto* st : {host->get(), dev->get()}) {
        ASSERT_OK(st->UpdateFromGradient(0, 500, g.data(), t, h, s));
        ASSERT_OK(st->UpdateFromGradient(500, kN - 500, nullptr, t, h, s));
      }
      std::vector<uint8_t> a(g.size()), b(g.size());
      ASSERT_OK((*host)->CastMaster(0, kN, a.data(), t, s));
      ASSERT_OK((*dev)->CastMaster(0, kN, b.data(), t, s));
      EXPECT_EQ(a, b) << "step " << step;
    }
    ASSERT_NO_FATAL_FAILURE(testing::ExpectStatesBitwiseEqual(**host, **dev, kN));
  }
}

}  // namespace
}  // namespace zero
