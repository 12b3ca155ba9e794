// Tests of HostSlab on the CPU backend with real memory: mmap/libnuma, mlock as the CPU pin,
// RLIMIT_MEMLOCK and RLIMIT_AS to provoke the failure paths, /proc/self/status to see leaks.
#include "offload/host_slab.h"

#include <linux/capability.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/cpu_device.h"
#include "testing/scratch_dir.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

using ::testing::HasSubstr;

// A /proc/self/status field in bytes ("VmRSS:  1234 kB").
size_t StatusBytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) {
      return std::strtoull(line.c_str() + field.size() + 1, nullptr, 10) * 1024;
    }
  }
  ADD_FAILURE() << "no " << field << " in /proc/self/status";
  return 0;
}

HostSlabOptions Opts(bool pin) {
  HostSlabOptions o;
  o.pin_memory = pin;
  o.what = "test states";
  return o;
}

// Whether this process may mlock `bytes` more (raising RLIMIT_MEMLOCK's soft limit to the hard one
// first). Root has CAP_IPC_LOCK; a CI container's default limit (often 64 KiB or 8 MiB) may not
// cover a test's pinned slab, which then runs pageable (the meters below still apply).
bool CanLock(size_t bytes) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0) return false;
  if (rl.rlim_cur != rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_MEMLOCK, &rl);
    getrlimit(RLIMIT_MEMLOCK, &rl);
  }
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct caps[2]{};
  bool cap = syscall(SYS_capget, &hdr, caps) == 0 && ((caps[0].effective >> CAP_IPC_LOCK) & 1);
  return CheckMemlockLimit(bytes, rl.rlim_cur, StatusBytes("VmLck"), cap, "test", "test").ok();
}

// Drops CAP_IPC_LOCK from this thread's effective set (root ignores RLIMIT_MEMLOCK otherwise)
// and lowers RLIMIT_MEMLOCK's soft limit; restores both when it dies.
class MemlockLimit {
 public:
  explicit MemlockLimit(rlim_t soft) {
    hdr_.version = _LINUX_CAPABILITY_VERSION_3;
    hdr_.pid = 0;
    if (syscall(SYS_capget, &hdr_, caps_) != 0) return;
    had_cap_ = (caps_[0].effective >> CAP_IPC_LOCK) & 1;
    if (had_cap_) {
      __user_cap_data_struct dropped[2] = {caps_[0], caps_[1]};
      dropped[0].effective &= ~(1u << CAP_IPC_LOCK);
      if (syscall(SYS_capset, &hdr_, dropped) != 0) return;
    }
    if (getrlimit(RLIMIT_MEMLOCK, &old_) != 0) return;
    struct rlimit lowered = old_;
    lowered.rlim_cur = std::min(soft, old_.rlim_max);
    ok_ = setrlimit(RLIMIT_MEMLOCK, &lowered) == 0;
    limit_ = lowered.rlim_cur;
  }
  ~MemlockLimit() {
    if (ok_) setrlimit(RLIMIT_MEMLOCK, &old_);
    if (had_cap_) syscall(SYS_capset, &hdr_, caps_);
  }
  bool ok() const { return ok_; }
  rlim_t limit() const { return limit_; }  // the soft limit in force

 private:
  __user_cap_header_struct hdr_{};
  __user_cap_data_struct caps_[2]{};
  struct rlimit old_ {};
  bool had_cap_ = false;
  bool ok_ = false;
  rlim_t limit_ = 0;
};

TEST(HostSlabTest, EverySubAllocationHoldsItsOwnBytesAndIsAligned) {
  CpuDevice dev;
  const std::vector<size_t> sizes = {1, 7, 63, 64, 65, 4096, 4097, (size_t{1} << 20) + 3, 0, 5};
  size_t total = 0;
  for (size_t n : sizes) total += HostSlab::AlignedSize(n);
  for (bool pin : {false, true}) {
    SCOPED_TRACE(pin ? "pinned" : "pageable");
    if (pin && !CanLock(total)) {
      std::printf("RLIMIT_MEMLOCK too low to pin %zu bytes: pinned case not run\n", total);
      continue;
    }
    Result<HostSlab> r = HostSlab::Create(&dev, total, Opts(pin));
    ASSERT_OK(r);
    HostSlab slab = std::move(r).value();
    EXPECT_EQ(slab.bytes(), total);
    EXPECT_EQ(slab.pinned(), pin);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(slab.data()) % sysconf(_SC_PAGESIZE), 0u);
    std::vector<HostSpan> spans;
    size_t expect_offset = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      Result<HostSpan> s = slab.Take(sizes[i], "tensor " + std::to_string(i));
      ASSERT_OK(s);
      EXPECT_EQ(s->offset, expect_offset);
      EXPECT_EQ(s->offset % kHostSlabAlignment, 0u);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(s->data) % kHostSlabAlignment, 0u);
      EXPECT_EQ(s->data, static_cast<char*>(slab.data()) + s->offset);
      EXPECT_EQ(s->bytes, sizes[i]);
      expect_offset += HostSlab::AlignedSize(sizes[i]);
      spans.push_back(*s);
    }
    EXPECT_EQ(slab.used(), total);
    // Write every byte of every span, then read all back: an overlap would clobber a neighbour.
    for (size_t i = 0; i < spans.size(); ++i) {
      auto* b = spans[i].as<uint8_t>();
      for (size_t j = 0; j < spans[i].bytes; ++j) b[j] = static_cast<uint8_t>(i * 31 + j * 7);
    }
    for (size_t i = 0; i < spans.size(); ++i) {
      auto* b = spans[i].as<uint8_t>();
      size_t bad = 0;
      for (size_t j = 0; j < spans[i].bytes; ++j) bad += b[j] != static_cast<uint8_t>(i * 31 + j * 7);
      EXPECT_EQ(bad, 0u) << "span " << i;
    }
    // Full: the next Take fails, naming the tensor and sizes, and leaves the slab unchanged.
    Result<HostSpan> over = slab.Take(1, "layers.3.mlp.w1 exp_avg");
    ASSERT_FALSE(over.ok());
    EXPECT_EQ(over.status().code(), StatusCode::kOutOfRange);
    EXPECT_THAT(over.status().message(), HasSubstr("layers.3.mlp.w1 exp_avg"));
    EXPECT_THAT(over.status().message(), HasSubstr("(64 bytes)"));
    EXPECT_EQ(slab.used(), total);
  }
}

TEST(HostSlabTest, EmptySlab) {
  CpuDevice dev;
  Result<HostSlab> r = HostSlab::Create(&dev, 0, Opts(true));
  ASSERT_OK(r);
  EXPECT_EQ(r->data(), nullptr);
  EXPECT_OK(r->Take(0, "empty"));
  EXPECT_FALSE(r->Take(1, "one byte").ok());
}

TEST(HostSlabTest, MoveTransfersOwnership) {
  CpuDevice dev;
  const size_t base = HostSlab::live_bytes();
  const bool pin = CanLock(1 << 16);
  Result<HostSlab> r = HostSlab::Create(&dev, 1 << 16, Opts(pin));
  ASSERT_OK(r);
  HostSlab a = std::move(r).value();
  ASSERT_OK(a.Take(100, "x"));
  std::memset(a.data(), 0x5a, a.bytes());
  void* p = a.data();

  HostSlab b(std::move(a));
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(a.bytes(), 0u);
  EXPECT_FALSE(a.pinned());
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.bytes(), size_t{1} << 16);
  EXPECT_EQ(b.used(), 128u);
  EXPECT_EQ(b.pinned(), pin);
  EXPECT_EQ(static_cast<uint8_t*>(b.data())[65535], 0x5a);
  EXPECT_EQ(HostSlab::live_bytes(), base + (1 << 16));

  // Move-assigning over a live slab frees the old one.
  Result<HostSlab> r2 = HostSlab::Create(&dev, 1 << 12, Opts(false));
  ASSERT_OK(r2);
  EXPECT_EQ(HostSlab::live_bytes(), base + (1 << 16) + (1 << 12));
  b = std::move(r2).value();
  EXPECT_EQ(b.bytes(), size_t{1} << 12);
  EXPECT_FALSE(b.pinned());
  EXPECT_EQ(HostSlab::live_bytes(), base + (1 << 12));
  b = HostSlab();
  EXPECT_EQ(HostSlab::live_bytes(), base);
}

// 200 create/write/destroy cycles of a 4 MiB pinned (mlocked) slab leave no mapped, resident or
// locked memory behind. The same meters are shown to catch a deliberately leaked slab first.
TEST(HostSlabTest, NoLeakAcrossCreateDestroyCycles) {
  CpuDevice dev;
  constexpr size_t kSlab = size_t{4} << 20;
  constexpr int kCycles = 200;
  // Pinned where the memlock limit allows (then VmLck must also come back); pageable otherwise.
  const bool pin = CanLock(2 * kSlab);
  if (!pin) std::printf("RLIMIT_MEMLOCK too low to pin 8 MiB: cycling pageable slabs\n");

  // The meters see a leak: one slab released without being freed.
  {
    const size_t live0 = HostSlab::live_bytes(), lck0 = StatusBytes("VmLck");
    Result<HostSlab> r = HostSlab::Create(&dev, kSlab, Opts(pin));
    ASSERT_OK(r);
    std::memset(r->data(), 1, kSlab);
    auto* leaked = new HostSlab(std::move(r).value());
    EXPECT_EQ(HostSlab::live_bytes(), live0 + kSlab) << "live_bytes misses a leaked slab";
    if (pin) {
      EXPECT_GE(StatusBytes("VmLck"), lck0 + kSlab) << "VmLck misses a leaked pinned slab";
    }
    const size_t rss_leaked = StatusBytes("VmRSS");
    delete leaked;
    EXPECT_LE(StatusBytes("VmRSS") + kSlab, rss_leaked) << "VmRSS misses a freed slab";
    EXPECT_EQ(HostSlab::live_bytes(), live0);
    EXPECT_EQ(StatusBytes("VmLck"), lck0);
  }

  const size_t live0 = HostSlab::live_bytes();
  const size_t lck0 = StatusBytes("VmLck");
  const size_t rss0 = StatusBytes("VmRSS");
  for (int i = 0; i < kCycles; ++i) {
    Result<HostSlab> r = HostSlab::Create(&dev, kSlab, Opts(pin));
    ASSERT_OK(r) << "cycle " << i;
    ASSERT_EQ(r->pinned(), pin);
    std::memset(r->data(), i & 0xff, kSlab);  // make every page resident
  }
  EXPECT_EQ(HostSlab::live_bytes(), live0);
  EXPECT_EQ(StatusBytes("VmLck"), lck0);
  // A leak of even a tenth of the cycles would add 80 MiB; allow 8 MiB of allocator noise.
  const size_t rss1 = StatusBytes("VmRSS");
  EXPECT_LT(rss1, rss0 + (size_t{8} << 20)) << "VmRSS grew from " << rss0 << " to " << rss1;
}

TEST(HostSlabTest, MoreThanTheMachineHasIsAClearError) {
  CpuDevice dev;
  const size_t live0 = HostSlab::live_bytes();
  const size_t kPiB = size_t{1} << 50;
  for (bool pin : {false, true}) {
    Result<HostSlab> r = HostSlab::Create(&dev, kPiB, Opts(pin));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
    const std::string& m = r.status().message();
    EXPECT_THAT(m, HasSubstr("test states"));
    EXPECT_THAT(m, HasSubstr("1048576.00 GiB"));
    EXPECT_THAT(m, HasSubstr("of RAM"));
    EXPECT_THAT(m, HasSubstr("fewer ranks per host"));
    EXPECT_THAT(m, ::testing::AnyOf(HasSubstr("NUMA node"), HasSubstr("no NUMA placement")));
  }
  EXPECT_EQ(HostSlab::live_bytes(), live0);
}

// A mapping that fits in RAM but not in the address-space limit: mmap's ENOMEM reaches the user.
TEST(HostSlabTest, MappingFailureCarriesErrno) {
  CpuDevice dev;
  struct rlimit old;
  ASSERT_EQ(getrlimit(RLIMIT_AS, &old), 0);
  const size_t vm = StatusBytes("VmSize");
  struct rlimit tight = old;
  tight.rlim_cur = vm + (size_t{64} << 20);
  if (old.rlim_cur != RLIM_INFINITY && old.rlim_cur < tight.rlim_cur) GTEST_SKIP() << "RLIMIT_AS low";
  ASSERT_EQ(setrlimit(RLIMIT_AS, &tight), 0);
  Result<HostSlab> r = HostSlab::Create(&dev, size_t{1} << 30, Opts(false));
  ASSERT_EQ(setrlimit(RLIMIT_AS, &old), 0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  const std::string& m = r.status().message();
  EXPECT_THAT(m, HasSubstr("1.00 GiB (1073741824 bytes)"));
  EXPECT_THAT(m, HasSubstr("(errno 12)"));
  EXPECT_THAT(m, HasSubstr("fewer ranks per host"));
}

TEST(HostSlabTest, CheckMemlockLimit) {
  const size_t MiB = size_t{1} << 20;
  EXPECT_OK(CheckMemlockLimit(MiB, MiB, 0, false, "s", "k"));     // exactly fits
  EXPECT_OK(CheckMemlockLimit(4 * MiB, MiB, 0, true, "s", "k"));  // CAP_IPC_LOCK
  EXPECT_OK(CheckMemlockLimit(4 * MiB, RLIM_INFINITY, 0, false, "s", "k"));
  Status st =
      CheckMemlockLimit(MiB, 2 * MiB, MiB + 1, false, "optimizer states", "zero_optimization.offload_optimizer");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(st.message(), HasSubstr("RLIMIT_MEMLOCK (ulimit -l) is 0.00 GiB (2097152 bytes)"));
  EXPECT_THAT(st.message(), HasSubstr("(1048577 bytes) locked already"));
  EXPECT_THAT(st.message(), HasSubstr("optimizer states: cannot page-lock 0.00 GiB (1048576 bytes)"));
  EXPECT_THAT(st.message(), HasSubstr("zero_optimization.offload_optimizer.pin_memory false"));
  EXPECT_THAT(st.message(), HasSubstr("zero_optimization.offload_optimizer.pin_memory_fallback true"));
  EXPECT_FALSE(CheckMemlockLimit(0, 1, 2, false, "s", "k").ok());  // over the limit already
}

// Pinning beyond RLIMIT_MEMLOCK: an error by default, pageable memory with the fallback.
TEST(HostSlabTest, PinFailureIsAnErrorOrAWarnedFallback) {
  CpuDevice dev;
  const size_t live0 = HostSlab::live_bytes();
  MemlockLimit limit(size_t{1} << 20);
  if (!limit.ok()) GTEST_SKIP() << "cannot lower RLIMIT_MEMLOCK / drop CAP_IPC_LOCK here";
  HostSlabOptions o = Opts(true);
  o.config_key = "zero_optimization.offload_param";
  Result<HostSlab> r = HostSlab::Create(&dev, size_t{8} << 20, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(), HasSubstr("RLIMIT_MEMLOCK"));
  EXPECT_THAT(r.status().message(), HasSubstr("0.01 GiB (8388608 bytes)"));
  EXPECT_THAT(r.status().message(), HasSubstr("RLIMIT_MEMLOCK (ulimit -l) is " + FormatGiB(limit.limit())));
  EXPECT_THAT(r.status().message(), HasSubstr("zero_optimization.offload_param.pin_memory false"));
  EXPECT_EQ(HostSlab::live_bytes(), live0);

  o.fallback_to_pageable = true;
  Result<HostSlab> f = HostSlab::Create(&dev, size_t{8} << 20, o);
  ASSERT_OK(f);
  EXPECT_FALSE(f->pinned());
  std::memset(f->data(), 3, f->bytes());
  EXPECT_EQ(static_cast<uint8_t*>(f->data())[(size_t{8} << 20) - 1], 3);

  Result<HostSlab> pageable = HostSlab::Create(&dev, size_t{8} << 20, Opts(false));
  ASSERT_OK(pageable);
  EXPECT_FALSE(pageable->pinned());
}

// The node each page of [p, p + bytes) lives on (move_pages with no target nodes only queries).
std::vector<int> PageNodes(void* p, size_t bytes) {
  const size_t page = sysconf(_SC_PAGESIZE);
  std::vector<void*> pages;
  for (size_t off = 0; off < bytes; off += page) pages.push_back(static_cast<char*>(p) + off);
  std::vector<int> status(pages.size(), -100);
  long rc = syscall(SYS_move_pages, 0, pages.size(), pages.data(), nullptr, status.data(), 0);
  EXPECT_EQ(rc, 0) << "move_pages: " << std::strerror(errno);
  return status;
}

TEST(HostSlabTest, SingleNodeAndExplicitNode) {
  CpuDevice dev;
  const int max_node = NumaMaxNode();
  if (max_node < 0) GTEST_SKIP() << "libnuma.so.1 is not available: nothing to place";
  if (max_node > 0) GTEST_SKIP() << "several NUMA nodes: see MultiNodePlacement";
  for (int node : {kNumaNodeAuto, kNumaNodeNone, 0}) {
    SCOPED_TRACE(node);
    HostSlabOptions o = Opts(false);
    o.numa_node = node;
    Result<HostSlab> r = HostSlab::Create(&dev, size_t{1} << 20, o);
    ASSERT_OK(r);
    EXPECT_EQ(r->numa_node(), 0);  // one node: everything is on node 0
    std::memset(r->data(), 1, r->bytes());
    for (int n : PageNodes(r->data(), r->bytes())) ASSERT_EQ(n, 0);
  }
  HostSlabOptions o = Opts(false);
  o.numa_node = 1;
  Result<HostSlab> r = HostSlab::Create(&dev, size_t{1} << 20, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("NUMA node 1 does not exist; this machine has nodes 0..0"));
  o.numa_node = -7;
  EXPECT_EQ(HostSlab::Create(&dev, 4096, o).status().code(), StatusCode::kInvalidArgument);
}

TEST(HostSlabTest, MultiNodePlacement) {
  CpuDevice dev;
  const int max_node = NumaMaxNode();
  if (max_node < 1) {
    GTEST_SKIP() << "this machine has " << (max_node < 0 ? "no libnuma" : "one NUMA node")
                 << ": the multi-node placement check needs two or more nodes";
  }
  for (int node = 0; node <= max_node; ++node) {
    HostSlabOptions o = Opts(CanLock(size_t{2} << 20));
    o.numa_node = node;
    Result<HostSlab> r = HostSlab::Create(&dev, size_t{2} << 20, o);
    ASSERT_OK(r);
    EXPECT_EQ(r->numa_node(), node);
    std::memset(r->data(), 1, r->bytes());
    for (int n : PageNodes(r->data(), r->bytes())) ASSERT_EQ(n, node) << "slab for node " << node;
  }
}

TEST(HostSlabTest, NumaNodeOfPciDeviceReadsSysfs) {
  namespace fs = std::filesystem;
  ASSERT_OK_AND_ASSIGN(ScratchDir scratch, ScratchDir::Create("host_slab_sysfs"));
  const fs::path root = scratch.path();
  auto write = [&](const std::string& id, const std::string& text) {
    fs::create_directories(root / "bus/pci/devices" / id);
    std::ofstream(root / "bus/pci/devices" / id / "numa_node") << text;
  };
  write("0000:3b:00.0", "1\n");
  write("0000:5e:00.0", "-1\n");
  Result<int> a = NumaNodeOfPciDevice("0000:3B:00.0", root.string());
  ASSERT_OK(a);
  EXPECT_EQ(*a, 1);
  Result<int> b = NumaNodeOfPciDevice("00000000:3b:00.0", root.string());
  ASSERT_OK(b);
  EXPECT_EQ(*b, 1);
  Result<int> c = NumaNodeOfPciDevice("0000:5e:00.0", root.string());
  ASSERT_OK(c);
  EXPECT_EQ(*c, -1);
  Result<int> d = NumaNodeOfPciDevice("0000:af:00.0", root.string());
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(d.status().message(), HasSubstr("0000:af:00.0/numa_node"));
}

}  // namespace
}  // namespace zero
