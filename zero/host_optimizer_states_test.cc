#include "zero/host_optimizer_states.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "runtime/cpu_device.h"
#include "zero/optimizer_states.h"

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
    ASSERT_TRUE(host.ok()) << host.status().ToString();
    auto dev = CreateDeviceOptimizerStates(&device, kN, s);
    ASSERT_TRUE(dev.ok());
    EXPECT_EQ((*host)->bytes().device, 0u);
    EXPECT_GE((*host)->bytes().host, 3u * kN * 4);
    std::vector<float> init(kN);
    for (int64_t i = 0; i < kN; ++i) init[i] = 0.5f - 0.001f * static_cast<float>(i % 113);
    for (auto* st : {host->get(), dev->get()}) ASSERT_TRUE(st->Write(OptState::kMaster, 0, kN, init.data()).ok());
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
      ASSERT_TRUE((*host)->Update(0, 600, g.data(), h, a.data(), DType::kBF16, s).ok());
      ASSERT_TRUE((*dev)->Update(0, 600, g.data(), h, b.data(), DType::kBF16, s).ok());
      ASSERT_TRUE((*host)->Update(600, kN - 600, g.data() + 600, h, nullptr, DType::kBF16, s).ok());
      ASSERT_TRUE((*dev)->Update(600, kN - 600, g.data() + 600, h, nullptr, DType::kBF16, s).ok());
      EXPECT_EQ(a, b) << "step " << step;
    }
    for (OptState w : {OptState::kMaster, OptState::kExpAvg, OptState::kExpAvgSq}) {
      std::vector<float> x(kN), y(kN);
      ASSERT_TRUE((*host)->Read(w, 0, kN, x.data()).ok());
      ASSERT_TRUE((*dev)->Read(w, 0, kN, y.data()).ok());
      EXPECT_EQ(0, std::memcmp(x.data(), y.data(), kN * 4)) << OptStateName(w);
    }
    std::vector<uint16_t> c1(kN), c2(kN);
    ASSERT_TRUE((*host)->CastMaster(5, kN - 5, c1.data(), DType::kBF16, s).ok());
    ASSERT_TRUE((*dev)->CastMaster(5, kN - 5, c2.data(), DType::kBF16, s).ok());
    EXPECT_EQ(c1, c2);
    std::vector<float> d1(10, -1), d2(10, -1);
    ASSERT_TRUE((*host)->CopyToDevice(OptState::kExpAvg, 100, 10, d1.data(), s).ok());
    ASSERT_TRUE((*dev)->CopyToDevice(OptState::kExpAvg, 100, 10, d2.data(), s).ok());
    EXPECT_EQ(d1, d2);
    EXPECT_EQ((*host)->Read(OptState::kMaster, kN, 1, d1.data()).code(), StatusCode::kOutOfRange);
  }
}

}  // namespace
}  // namespace zero
