#include "runtime/device_arena.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "runtime/cpu_device.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/faulty_device.h"
#include "runtime/status.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

uintptr_t Address(const void* p) { return reinterpret_cast<uintptr_t>(p); }

TEST(DeviceArenaTest, RegionsAreAlignedInOrderAndCountedInMemoryStats) {
  CpuDevice device;
  DeviceArena arena("activations");
  float* a = nullptr;
  int32_t* b = nullptr;
  double* c = nullptr;
  void* d = nullptr;
  uint16_t* e = nullptr;
  arena.Reserve(&a, 1000, "a");  // 4000 bytes -> 4096
  arena.Reserve(&b, 1, "b");     // 4 -> 256
  arena.Reserve(&c, 0, "c");     // empty: no space, the next region's address
  arena.ReserveBytes(&d, 257, "d");
  arena.Reserve(&e, -5, "e");  // negative counts as 0
  EXPECT_EQ(arena.planned_bytes(), 4096u + 256u + 512u);
  EXPECT_EQ(arena.bytes(), 0u);
  EXPECT_FALSE(arena.allocated());
  EXPECT_EQ(a, nullptr);  // planning sets nothing

  const size_t before = device.memory_stats().in_use;
  ASSERT_OK(arena.Allocate(&device));
  EXPECT_TRUE(arena.allocated());
  EXPECT_EQ(arena.device(), &device);
  EXPECT_EQ(arena.bytes(), 4864u);
  EXPECT_EQ(device.memory_stats().in_use, before + 4864u);
  ASSERT_NE(a, nullptr);
  const std::vector<const void*> all = {a, b, c, d, e};
  for (const void* p : all) EXPECT_EQ(Address(p) % DeviceArena::kAlignment, 0u);
  const uintptr_t base = Address(a);
  EXPECT_EQ(Address(b) - base, 4096u);
  EXPECT_EQ(Address(c) - base, 4352u);
  EXPECT_EQ(Address(d) - base, 4352u);
  EXPECT_EQ(Address(e) - base, 4864u);  // one past the end: a zero-byte region at the end

  const std::vector<DeviceArena::Region>& r = arena.regions();
  ASSERT_EQ(r.size(), 5u);
  EXPECT_EQ(r[0].name, "a");
  EXPECT_EQ(r[0].offset, 0u);
  EXPECT_EQ(r[0].bytes, 4000u);
  EXPECT_EQ(r[3].name, "d");
  EXPECT_EQ(r[3].offset, 4352u);
  EXPECT_EQ(r[3].bytes, 257u);

  // The memory is the device's: its kernels write it, and regions do not overlap.
  ASSERT_OK(device.Fill(a, DType::kF32, 1000, 1.5f, nullptr));
  ASSERT_OK(device.Fill(d, DType::kF32, 64, -2.0f, nullptr));
  EXPECT_EQ(a[999], 1.5f);
  float d0 = 0.0f;
  std::memcpy(&d0, d, sizeof(float));
  EXPECT_EQ(d0, -2.0f);
  *b = 7;
  EXPECT_EQ(a[999], 1.5f);

  arena.Clear();
  EXPECT_FALSE(arena.allocated());
  EXPECT_EQ(arena.bytes(), 0u);
  EXPECT_EQ(arena.planned_bytes(), 0u);
  EXPECT_TRUE(arena.regions().empty());
  EXPECT_EQ(arena.device(), nullptr);
  EXPECT_EQ(device.memory_stats().in_use, before);
  EXPECT_EQ(arena.label(), "activations");
}

TEST(DeviceArenaTest, TheSamePlanGivesTheSameLayoutAfterClear) {
  CpuDevice device;
  DeviceArena arena("workspace");
  std::vector<uintptr_t> offsets[2];
  for (int round = 0; round < 2; ++round) {
    float* x = nullptr;
    uint8_t* y = nullptr;
    double* z = nullptr;
    arena.Reserve(&x, 33, "x");
    arena.Reserve(&y, 3, "y");
    arena.Reserve(&z, 100, "z");
    ASSERT_OK(arena.Allocate(&device));
    offsets[round] = {Address(y) - Address(x), Address(z) - Address(x)};
    arena.Clear();
  }
  EXPECT_EQ(offsets[0], offsets[1]);
  EXPECT_EQ(offsets[0], (std::vector<uintptr_t>{256, 512}));
}

TEST(DeviceArenaTest, AnEmptyPlanAllocatesNothingAndSetsNull) {
  CpuDevice device;
  DeviceArena arena("workspace");
  float* x = reinterpret_cast<float*>(uintptr_t{16});
  arena.Reserve(&x, 0, "x");
  ASSERT_OK(arena.Allocate(&device));
  EXPECT_TRUE(arena.allocated());
  EXPECT_EQ(x, nullptr);
  EXPECT_EQ(arena.bytes(), 0u);
  EXPECT_EQ(device.memory_stats().in_use, 0u);
  EXPECT_EQ(DeviceArenaBytes(&device), 0u);
  EXPECT_TRUE(DeviceArenaUsage(&device).empty());
}

TEST(DeviceArenaTest, AllocatingTwiceIsAFailedPrecondition) {
  CpuDevice device;
  DeviceArena arena("activations");
  float* x = nullptr;
  arena.Reserve(&x, 10, "x");
  ASSERT_OK(arena.Allocate(&device));
  float* first = x;
  const Status again = arena.Allocate(&device);
  EXPECT_EQ(again.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(again.message().find("\"activations\""), std::string::npos) << again.ToString();
  EXPECT_EQ(x, first);
  EXPECT_EQ(arena.bytes(), 256u);
  EXPECT_EQ(device.memory_stats().in_use, 256u);
  EXPECT_EQ(arena.Allocate(nullptr).code(), StatusCode::kFailedPrecondition);
}

TEST(DeviceArenaTest, OutOfMemoryNamesTheArenaAndKeepsThePlan) {
  CpuDeviceOptions options;
  options.memory_limit = 4096;
  CpuDevice device(options);
  DeviceArena arena("activations");
  float* x = nullptr;
  float* y = nullptr;
  arena.Reserve(&x, 1000, "x");  // 4096
  arena.Reserve(&y, 1, "y");     // + 256: over the limit
  const Status st = arena.Allocate(&device);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("device arena \"activations\" (4352 bytes in 2 regions)"), std::string::npos)
      << st.ToString();
  EXPECT_NE(st.message().find("cpu: out of device memory"), std::string::npos) << st.ToString();
  EXPECT_EQ(x, nullptr);
  EXPECT_EQ(y, nullptr);
  EXPECT_FALSE(arena.allocated());
  EXPECT_EQ(arena.planned_bytes(), 4352u);
  EXPECT_EQ(DeviceArenaBytes(&device), 0u);
  EXPECT_EQ(device.memory_stats().in_use, 0u);

  // The same failure through a device that injects it (what the fault tests use).
  CpuDevice big;
  FaultyDevice faulty(&big);
  faulty.FailNthCall("Allocate", 1);
  EXPECT_EQ(arena.Allocate(&faulty).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(x, nullptr);
  // The plan was kept: a retry on a device with room succeeds.
  ASSERT_OK(arena.Allocate(&faulty));
  EXPECT_NE(x, nullptr);
  EXPECT_EQ(Address(y) - Address(x), 4096u);
  EXPECT_EQ(faulty.memory_stats().in_use, 4352u);
  EXPECT_EQ(DeviceArenaBytes(&faulty, "activations"), 4352u);
  arena.Clear();
  EXPECT_EQ(faulty.memory_stats().in_use, 0u);
}

TEST(DeviceArenaTest, TheTallyCountsArenasByDeviceAndLabel) {
  CpuDevice one, two;
  float* p = nullptr;
  DeviceArena acts1("activations"), acts2("activations"), work("workspace"), other("activations");
  acts1.Reserve(&p, 100, "p");  // 512
  acts2.Reserve(&p, 200, "p");  // 1024
  work.Reserve(&p, 10, "p");    // 256
  other.Reserve(&p, 1, "p");    // 256, on the other device
  ASSERT_OK(acts1.Allocate(&one));
  ASSERT_OK(acts2.Allocate(&one));
  ASSERT_OK(work.Allocate(&one));
  ASSERT_OK(other.Allocate(&two));
  EXPECT_EQ(DeviceArenaBytes(&one, "activations"), 1536u);
  EXPECT_EQ(DeviceArenaBytes(&one, "workspace"), 256u);
  EXPECT_EQ(DeviceArenaBytes(&one), 1792u);
  EXPECT_EQ(DeviceArenaBytes(&one, "logits"), 0u);
  EXPECT_EQ(DeviceArenaBytes(&two), 256u);
  EXPECT_EQ(DeviceArenaUsage(&one),
            (std::vector<std::pair<std::string, size_t>>{{"activations", 1536u}, {"workspace", 256u}}));
  EXPECT_EQ(one.memory_stats().in_use, 1792u);  // the tally is a breakdown of memory_stats()

  // A move keeps the allocation and its tally; the moved-from arena holds nothing.
  DeviceArena moved = std::move(acts2);
  EXPECT_EQ(moved.bytes(), 1024u);
  EXPECT_EQ(moved.label(), "activations");
  EXPECT_EQ(DeviceArenaBytes(&one, "activations"), 1536u);
  EXPECT_EQ(acts2.bytes(), 0u);  // NOLINT(bugprone-use-after-move): moved-from state is specified
  // Assigning over an allocated arena frees what it held.
  acts1 = std::move(moved);
  EXPECT_EQ(DeviceArenaBytes(&one, "activations"), 1024u);
  EXPECT_EQ(one.memory_stats().in_use, 1024u + 256u);
  work.Clear();
  acts1.Clear();
  EXPECT_TRUE(DeviceArenaUsage(&one).empty());
  EXPECT_EQ(one.memory_stats().in_use, 0u);
  EXPECT_EQ(DeviceArenaBytes(&two, "activations"), 256u);
}

TEST(DeviceArenaTest, DestroyingAnArenaFreesItsMemory) {
  CpuDevice device;
  {
    DeviceArena arena("activations");
    double* x = nullptr;
    arena.Reserve(&x, 1 << 10, "x");
    ASSERT_OK(arena.Allocate(&device));
    EXPECT_EQ(device.memory_stats().in_use, 8192u);
  }
  EXPECT_EQ(device.memory_stats().in_use, 0u);
  EXPECT_EQ(device.memory_stats().peak, 8192u);
  EXPECT_EQ(DeviceArenaBytes(&device), 0u);
}

}  // namespace
}  // namespace zero
