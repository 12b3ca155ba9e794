#include "zero/optimizer_states.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "runtime/cpu_device.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

std::vector<float> Values(int64_t n, float base) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = base + 0.001f * static_cast<float>(i % 97) - 0.03f;
  return v;
}

// The device states are three device buffers: Update is Device::AdamWCast over the same range,
// bit for bit; Read/Write/Copy move exactly the elements asked for; ranges outside are errors.
TEST(DeviceOptimizerStatesTest, UpdateEqualsAdamWCastAndCopiesAreExact) {
  CpuDevice device;
  Stream* s = device.default_stream();
  constexpr int64_t kN = 1000;
  auto st = CreateDeviceOptimizerStates(&device, kN, s);
  ASSERT_OK(st);
  OptimizerStates& states = **st;
  EXPECT_EQ(states.numel(), kN);
  EXPECT_EQ(states.bytes().device, 3u * kN * 4);
  std::vector<float> zeros(kN), got(kN);
  ASSERT_OK(states.Read(OptState::kExpAvg, 0, kN, got.data()));
  EXPECT_EQ(got, zeros);

  std::vector<float> p = Values(kN, 0.5f), m = Values(kN, 0.01f), v = Values(kN, 0.02f);
  for (auto& x : v) x = x * x;
  ASSERT_OK(states.Write(OptState::kMaster, 0, kN, p.data()));
  ASSERT_OK(states.Write(OptState::kExpAvg, 0, kN, m.data()));
  ASSERT_OK(states.Write(OptState::kExpAvgSq, 0, kN, v.data()));
  const std::vector<float> g = Values(kN, -0.2f);
  AdamWParams h;
  h.lr = 0.01f;
  h.weight_decay = 0.1f;
  h.bias_correction1 = 0.1f;
  h.bias_correction2 = 0.001f;
  std::vector<uint16_t> model(kN), want_model(kN);
  // The reference: Device::AdamWCast on copies, over the same sub-range [100, 900).
  std::vector<float> rp = p, rm = m, rv = v;
  ASSERT_OK(device.AdamWCast(rp.data() + 100, g.data() + 100, rm.data() + 100, rv.data() + 100, 800, h,
                             want_model.data() + 100, DType::kBF16, s));
  ASSERT_OK(states.Update(100, 800, g.data() + 100, h, model.data() + 100, DType::kBF16, s));
  ASSERT_OK(states.Read(OptState::kMaster, 0, kN, got.data()));
  EXPECT_EQ(0, std::memcmp(got.data(), rp.data(), kN * 4));
  ASSERT_OK(states.Read(OptState::kExpAvg, 0, kN, got.data()));
  EXPECT_EQ(0, std::memcmp(got.data(), rm.data(), kN * 4));
  ASSERT_OK(states.Read(OptState::kExpAvgSq, 0, kN, got.data()));
  EXPECT_EQ(0, std::memcmp(got.data(), rv.data(), kN * 4));
  EXPECT_EQ(model, want_model);

  // CastMaster rounds the masters; CopyToDevice/CopyFromDevice move exactly [offset, offset + n).
  std::vector<uint16_t> cast(kN), want_cast(kN);
  ASSERT_OK(device.Cast(rp.data() + 3, DType::kF32, want_cast.data(), DType::kBF16, 7, s));
  ASSERT_OK(states.CastMaster(3, 7, cast.data(), DType::kBF16, s));
  EXPECT_EQ(cast, want_cast);
  std::vector<float> dev(5, -1.0f);
  ASSERT_OK(states.CopyToDevice(OptState::kExpAvg, 10, 3, dev.data() + 1, s));
  EXPECT_EQ(dev[0], -1.0f);
  EXPECT_EQ(dev[1], rm[10]);
  EXPECT_EQ(dev[3], rm[12]);
  EXPECT_EQ(dev[4], -1.0f);
  const float in[2] = {7.0f, 8.0f};
  ASSERT_OK(states.CopyFromDevice(OptState::kExpAvgSq, kN - 2, 2, in, s));
  ASSERT_OK(states.Read(OptState::kExpAvgSq, kN - 3, 3, got.data()));
  EXPECT_EQ(got[0], rv[kN - 3]);
  EXPECT_EQ(got[1], 7.0f);
  EXPECT_EQ(got[2], 8.0f);

  Status bad = states.Read(OptState::kMaster, kN - 1, 2, got.data());
  EXPECT_EQ(bad.code(), StatusCode::kOutOfRange) << bad.ToString();
  EXPECT_NE(bad.message().find("[999, 1001) outside [0, 1000)"), std::string::npos) << bad.ToString();
  EXPECT_FALSE(states.Update(-1, 2, g.data(), h, nullptr, DType::kF32, s).ok());
}

}  // namespace
}  // namespace zero
