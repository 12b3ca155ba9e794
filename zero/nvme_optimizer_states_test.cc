#include "zero/nvme_optimizer_states.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <vector>

#include "runtime/cpu_device.h"
#include "testing/scratch_dir.h"
#include "testing/status_matchers.h"
#include "zero/host_optimizer_states.h"
#include "zero/optimizer_states.h"
#include "zero/optimizer_states_testing.h"
#include "zero/tiered_optimizer_states.h"

namespace zero {
namespace {

// NVMe states (real O_DIRECT I/O on a swap file, groups smaller than the updates and not dividing
// them, two group buffers) against device states: the same bits after several updates of both
// kinds, reads and writes across group boundaries; the swap file and folder go with the states.
TEST(NvmeOptimizerStatesTest, BitwiseEqualToDeviceStatesWithRealSwapIo) {
  auto scratch = ScratchDir::CreateWithDirectIo("nvme_states");
  ASSERT_OK(scratch);
  CpuDevice device;
  Stream* s = device.default_stream();
  constexpr int64_t kN = 2500;
  NvmeOptimizerStatesOptions o;
  o.dir = scratch->File("rank0");
  o.group_numel = 700;
  o.buffer_count = 2;
  o.cpu_threads = 2;
  o.model_dtype = DType::kBF16;
  o.chunk_numel = 900;
  o.aio.block_size = 4096;
  o.aio.queue_depth = 4;
  o.slab.pin_memory = false;
  {
    auto nv = CreateNvmeOptimizerStates(&device, kN, s, o);
    ASSERT_OK(nv);
    EXPECT_TRUE(std::filesystem::exists(o.dir + "/optimizer_states.swp"));
    EXPECT_GE((*nv)->bytes().nvme, static_cast<size_t>(kN) * 12);
    // A second set of states on the same folder finds the first one's file: refused, never reused.
    auto again = CreateNvmeOptimizerStates(&device, kN, s, o);
    EXPECT_FALSE(again.ok());
    auto dev = CreateDeviceOptimizerStates(&device, kN, s);
    ASSERT_OK(dev);
    std::vector<float> init(kN);
    for (int64_t i = 0; i < kN; ++i) init[i] = 0.3f - 0.0007f * static_cast<float>(i % 211);
    for (auto* st : {nv->get(), dev->get()}) ASSERT_OK(st->Write(OptState::kMaster, 0, kN, init.data()));
    for (int step = 1; step <= 3; ++step) {
      AdamWParams h;
      h.lr = 0.02f;
      h.weight_decay = 0.1f;
      h.bias_correction1 = static_cast<float>(1.0 - std::pow(0.9, step));
      h.bias_correction2 = static_cast<float>(1.0 - std::pow(0.999, step));
      std::vector<float> g(kN);
      for (int64_t i = 0; i < kN; ++i) g[i] = 0.01f * static_cast<float>((i * 3 + step) % 37) - 0.18f;
      std::vector<uint16_t> g16(kN);
      for (int64_t i = 0; i < kN; ++i) g16[i] = FloatToBf16(g[i]);
      std::vector<uint16_t> a(kN), b(kN);
      for (auto* st : {nv->get(), dev->get()}) {
        ASSERT_OK(st->Update(100, 1700, g.data() + 100, h, (st == nv->get() ? a : b).data() + 100, DType::kBF16, s));
        ASSERT_OK(st->UpdateFromGradient(1800, kN - 1800, g16.data() + 1800, DType::kBF16, h, s));
        ASSERT_OK(st->UpdateFromGradient(0, 100, nullptr, DType::kBF16, h, s));
      }
      EXPECT_EQ(a, b) << "step " << step;
    }
    ASSERT_NO_FATAL_FAILURE(testing::ExpectStatesBitwiseEqual(**nv, **dev, kN));
    std::vector<uint16_t> c1(kN), c2(kN);
    ASSERT_OK((*nv)->CastMaster(0, kN, c1.data(), DType::kBF16, s));
    ASSERT_OK((*dev)->CastMaster(0, kN, c2.data(), DType::kBF16, s));
    EXPECT_EQ(c1, c2);
  }
  EXPECT_FALSE(std::filesystem::exists(o.dir)) << "the swap file and its folder are removed with the states";
}

// Tiered: the first 1234 elements in host states, the rest on NVMe; calls that straddle the split
// give the same bits as device states.
TEST(TieredOptimizerStatesTest, HostThenNvmeEqualsDeviceStates) {
  auto scratch = ScratchDir::CreateWithDirectIo("tiered_states");
  ASSERT_OK(scratch);
  CpuDevice device;
  Stream* s = device.default_stream();
  constexpr int64_t kN = 3001, kSplit = 1234;
  HostOptimizerStatesOptions ho;
  ho.slab.pin_memory = false;
  ho.model_dtype = DType::kBF16;
  ho.chunk_numel = 500;
  NvmeOptimizerStatesOptions no;
  no.dir = scratch->File("rank0");
  no.group_numel = 600;
  no.buffer_count = 2;
  no.model_dtype = DType::kBF16;
  no.aio.block_size = 4096;
  no.slab.pin_memory = false;
  auto host = CreateHostOptimizerStates(&device, kSplit, s, ho);
  auto nv = CreateNvmeOptimizerStates(&device, kN - kSplit, s, no);
  ASSERT_TRUE(host.ok() && nv.ok());
  std::unique_ptr<OptimizerStates> tiered = CreateTieredOptimizerStates(std::move(*host), std::move(*nv));
  auto dev = CreateDeviceOptimizerStates(&device, kN, s);
  ASSERT_OK(dev);
  EXPECT_EQ(tiered->numel(), kN);
  EXPECT_GT(tiered->bytes().host, 0u);
  EXPECT_GT(tiered->bytes().nvme, 0u);
  std::vector<float> init(kN);
  for (int64_t i = 0; i < kN; ++i) init[i] = -0.2f + 0.0003f * static_cast<float>(i % 501);
  for (OptimizerStates* st : {tiered.get(), dev->get()}) ASSERT_OK(st->Write(OptState::kMaster, 0, kN, init.data()));
  for (int step = 1; step <= 2; ++step) {
    AdamWParams h;
    h.lr = 0.01f;
    h.bias_correction1 = static_cast<float>(1.0 - std::pow(0.9, step));
    h.bias_correction2 = static_cast<float>(1.0 - std::pow(0.999, step));
    std::vector<float> g(kN);
    for (int64_t i = 0; i < kN; ++i) g[i] = 0.02f * static_cast<float>((i + 3 * step) % 23) - 0.2f;
    std::vector<uint16_t> g16(kN), a(kN), b(kN);
    for (int64_t i = 0; i < kN; ++i) g16[i] = FloatToBf16(g[i]);
    for (OptimizerStates* st : {tiered.get(), dev->get()}) {
      ASSERT_OK(
          st->Update(1000, 1000, g.data() + 1000, h, (st == tiered.get() ? a : b).data() + 1000, DType::kBF16, s));
      ASSERT_OK(st->UpdateFromGradient(0, 1000, g16.data(), DType::kBF16, h, s));
      ASSERT_OK(st->UpdateFromGradient(2000, kN - 2000, g16.data() + 2000, DType::kBF16, h, s));
    }
    EXPECT_EQ(a, b) << "step " << step;
  }
  ASSERT_NO_FATAL_FAILURE(testing::ExpectStatesBitwiseEqual(*tiered, **dev, kN));
  std::vector<uint16_t> c1(kN), c2(kN);
  ASSERT_OK(tiered->CastMaster(1, kN - 1, c1.data(), DType::kBF16, s));
  ASSERT_OK((*dev)->CastMaster(1, kN - 1, c2.data(), DType::kBF16, s));
  EXPECT_EQ(c1, c2);
  std::vector<float> two(2);
  EXPECT_EQ(tiered->Read(OptState::kMaster, kN - 1, 2, two.data()).code(), StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace zero
