// NvmeParamStore with real O_DIRECT swap I/O under a scratch directory: writes and reads back
// bitwise, module by module, through few buffers (every Load re-reads), read-ahead, the LRU cache
// of max_in_cpu elements, the sizing error, a stale file, and corruption caught by the CRC.
#include "zero/nvme_param_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/cpu_device.h"
#include "testing/scratch_dir.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

// Four modules: 0 = params {0, 3} (interleaved with the others in the partition), 1 = {1},
// 2 = {2} (small), 3 = {4} (empty shard).
constexpr int64_t kNumel = 6000;
std::vector<StoredShard> Shards() {
  return {{"a", 0, 1000, 0}, {"b", 1024, 1500, 1}, {"c", 2560, 100, 2}, {"d", 2688, 900, 0}, {"e", 3600, 0, 3}};
}
const std::vector<std::string> kModules = {"m0", "m1", "m2", "m3"};

float Value(int64_t i, float step) { return static_cast<float>(i) * 0.25f + step; }

NvmeParamStoreOptions Options(const std::string& dir, int buffers, int64_t cache) {
  NvmeParamStoreOptions o;
  o.dir = dir;
  o.buffer_count = buffers;
  o.buffer_numel = 4000;
  o.cache_numel = cache;
  o.slab.pin_memory = false;
  o.aio.block_size = 4096;
  o.scratch_numel = 300;  // writes go through several scratch chunks
  return o;
}

// Writes every shard element i = Value(i, step) through the device scratch (Write), in one call.
void WriteAll(NvmeParamStore* s, CpuDevice* d, float step) {
  std::vector<float> src(kNumel);
  for (int64_t i = 0; i < kNumel; ++i) src[i] = Value(i, step);
  ASSERT_OK(s->Write(0, kNumel, [&](void* dst, int64_t at, int64_t len) {
    return d->Copy(dst, src.data() + at, static_cast<size_t>(len) * 4, CopyKind::kHostToDevice, d->default_stream());
  }));
}

// Every shard element through Load (module layout) and through CopyToDevice (partition layout).
void ExpectAll(NvmeParamStore* s, float step) {
  for (int m = 0; m < 3; ++m) {
    auto base = s->Load(m);
    ASSERT_OK(base);
    const float* f = static_cast<const float*>(*base);
    int64_t at = 0;
    for (const StoredShard& sh : Shards()) {
      if (sh.module != m) continue;
      for (int64_t k = 0; k < sh.shard; ++k) ASSERT_EQ(f[at + k], Value(sh.offset + k, step)) << sh.name << " " << k;
      at += sh.shard;
    }
  }
  for (const StoredShard& sh : Shards()) {
    std::vector<float> out(sh.shard + 1, -1.0f);
    ASSERT_OK(s->CopyToDevice(sh.offset, sh.shard, out.data()));
    for (int64_t k = 0; k < sh.shard; ++k) ASSERT_EQ(out[k], Value(sh.offset + k, step)) << sh.name;
    EXPECT_EQ(out[sh.shard], -1.0f) << "CopyToDevice wrote past its range";
  }
}

TEST(NvmeParamStoreTest, RoundTripsThroughOneBufferAndTheFile) {
  ASSERT_OK_AND_ASSIGN(ScratchDir dir, ScratchDir::CreateWithDirectIo("param_store"));
  CpuDevice device;
  const std::string rank_dir = dir.path() + "/zero_swap/rank0";
  {
    ASSERT_OK_AND_ASSIGN(auto s, NvmeParamStore::Create(&device, device.default_stream(), DType::kF32, kNumel, Shards(),
                                                        kModules, Options(rank_dir, 1, 0)));
    EXPECT_TRUE(std::filesystem::exists(rank_dir + "/params.swp"));
    EXPECT_EQ(s->host_address(0), nullptr);
    EXPECT_EQ(s->module_store(), s.get());
    WriteAll(s.get(), &device, 1.0f);
    ASSERT_OK(s->AfterWrites());
    EXPECT_EQ(s->stats().reads, 0) << "a write covering every module reads nothing";
    ExpectAll(s.get(), 1.0f);
    EXPECT_GT(s->stats().reads, 3) << "one buffer: modules are read again";
    // A partial write (part of 'b' only) reads the module first and keeps the rest.
    std::vector<float> two = {-7.0f, -8.0f};
    ASSERT_OK(s->Write(1024 + 10, 2, [&](void* dst, int64_t at, int64_t len) {
      return device.Copy(dst, two.data() + at, len * 4, CopyKind::kHostToDevice, device.default_stream());
    }));
    ASSERT_OK(s->Load(0).status());  // evicts module 1: written back
    ASSERT_OK_AND_ASSIGN(const void* b, s->Load(1));
    const float* f = static_cast<const float*>(b);
    EXPECT_EQ(f[10], -7.0f);
    EXPECT_EQ(f[11], -8.0f);
    EXPECT_EQ(f[9], Value(1024 + 9, 1.0f));
    EXPECT_EQ(f[12], Value(1024 + 12, 1.0f));
  }
  EXPECT_FALSE(std::filesystem::exists(rank_dir)) << "the store removes its file and folder";
}

TEST(NvmeParamStoreTest, PrefetchReadsAheadWithinTheBuffers) {
  ASSERT_OK_AND_ASSIGN(ScratchDir dir, ScratchDir::CreateWithDirectIo("param_store_prefetch"));
  CpuDevice device;
  ASSERT_OK_AND_ASSIGN(auto s, NvmeParamStore::Create(&device, device.default_stream(), DType::kF32, kNumel, Shards(),
                                                      kModules, Options(dir.path(), 2, 0)));
  WriteAll(s.get(), &device, 2.0f);
  ASSERT_OK(s->AfterWrites());
  // The writes left module 1 (then 2) in the buffers, their write-backs in flight; Load(0) takes
  // module 1's buffer (least recently used), module 2 stays with its write-back in flight.
  ASSERT_OK(s->Load(0).status());
  ASSERT_OK(s->Uploaded(0, device.default_stream()));
  ASSERT_OK(s->Load(2).status());
  EXPECT_FALSE(s->resident(1));
  // Prefetch takes only idle buffers (no I/O in flight, nothing read ahead): module 0's.
  ASSERT_OK_AND_ASSIGN(bool one, s->Prefetch(1));
  EXPECT_TRUE(one);
  EXPECT_TRUE(s->resident(1));
  EXPECT_FALSE(s->resident(0));
  ASSERT_OK_AND_ASSIGN(bool two, s->Prefetch(0));
  EXPECT_FALSE(two) << "no idle buffer: one holds module 1 read ahead, the other writes module 2 back";
  EXPECT_EQ(s->stats().read_aheads, 1);
  const int64_t reads = s->stats().reads;
  ASSERT_OK_AND_ASSIGN(const void* b, s->Load(1));  // finishes the read ahead: no new read
  EXPECT_EQ(static_cast<const float*>(b)[0], Value(1024, 2.0f));
  ASSERT_OK_AND_ASSIGN(const void* c, s->Load(2));
  EXPECT_EQ(static_cast<const float*>(c)[99], Value(2560 + 99, 2.0f));
  EXPECT_EQ(s->stats().reads, reads) << "Load used the read started by Prefetch";
  ASSERT_OK_AND_ASSIGN(bool three, s->Prefetch(0));
  EXPECT_TRUE(three) << "module 1 was used: its buffer is idle again";
  EXPECT_EQ(s->stats().read_aheads, 2);
  ExpectAll(s.get(), 2.0f);
}

TEST(NvmeParamStoreTest, CacheKeepsModulesInHostMemoryLeastRecentlyUsedFirst) {
  ASSERT_OK_AND_ASSIGN(ScratchDir dir, ScratchDir::CreateWithDirectIo("param_store_cache"));
  CpuDevice device;
  // A cache of 1024 elements (4096 bytes): module 2 (100 elements, 4096 bytes padded) lives
  // there; modules 0 (1900) and 1 (1500) do not fit and go through the one buffer.
  ASSERT_OK_AND_ASSIGN(auto s, NvmeParamStore::Create(&device, device.default_stream(), DType::kF32, kNumel, Shards(),
                                                      kModules, Options(dir.path(), 1, 1024)));
  WriteAll(s.get(), &device, 3.0f);
  ASSERT_OK(s->AfterWrites());
  ASSERT_OK(s->Load(2).status());
  const int64_t reads = s->stats().reads;
  for (int k = 0; k < 3; ++k) {
    ASSERT_OK(s->Load(0).status());
    ASSERT_OK(s->Load(1).status());
    ASSERT_OK(s->Load(2).status());
  }
  EXPECT_EQ(s->stats().reads - reads, 6) << "modules 0 and 1 re-read through the buffer, module 2 cached";
  EXPECT_TRUE(s->resident(2));
  EXPECT_GE(s->stats().cache_hits, 3);
  ExpectAll(s.get(), 3.0f);
}

TEST(NvmeParamStoreTest, ModuleLargerThanBufferSizeIsRefusedNamingTheKey) {
  ASSERT_OK_AND_ASSIGN(ScratchDir dir, ScratchDir::CreateWithDirectIo("param_store_size"));
  CpuDevice device;
  NvmeParamStoreOptions o = Options(dir.path(), 2, 0);
  o.buffer_numel = 1500;
  auto s = NvmeParamStore::Create(&device, device.default_stream(), DType::kF32, kNumel, Shards(), kModules, o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("module 'm0' has 1900 elements"), std::string::npos) << s.status().ToString();
  EXPECT_NE(s.status().message().find("raise zero_optimization.offload_param.buffer_size to at least 1900"),
            std::string::npos)
      << s.status().ToString();
}

TEST(NvmeParamStoreTest, StaleSwapFileIsRefused) {
  ASSERT_OK_AND_ASSIGN(ScratchDir dir, ScratchDir::CreateWithDirectIo("param_store_stale"));
  CpuDevice device;
  {
    std::FILE* f = std::fopen((dir.path() + "/params.swp").c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fclose(f);
  }
  auto s = NvmeParamStore::Create(&device, device.default_stream(), DType::kF32, kNumel, Shards(), kModules,
                                  Options(dir.path(), 2, 0));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition) << s.status().ToString();
  EXPECT_NE(s.status().message().find("params.swp"), std::string::npos) << s.status().ToString();
}

TEST(NvmeParamStoreTest, CorruptionIsCaughtByTheChecksumAndEndsTheStore) {
  ASSERT_OK_AND_ASSIGN(ScratchDir dir, ScratchDir::CreateWithDirectIo("param_store_crc"));
  CpuDevice device;
  ASSERT_OK_AND_ASSIGN(auto s, NvmeParamStore::Create(&device, device.default_stream(), DType::kF32, kNumel, Shards(),
                                                      kModules, Options(dir.path(), 1, 0)));
  WriteAll(s.get(), &device, 4.0f);
  ASSERT_OK(s->AfterWrites());
  ASSERT_OK(s->Load(2).status());  // module 1 is on disk only now
  {
    // Module 1's region starts after module 0's (1900 floats, padded to 8192 bytes).
    const int fd = ::open(s->path().c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    const char x = 0x5a;
    ASSERT_EQ(::pwrite(fd, &x, 1, 8192 + 17), 1);
    ::close(fd);
  }
  auto bad = s->Load(1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find("params.swp"), std::string::npos) << bad.status().ToString();
  EXPECT_NE(bad.status().message().find("offload_param.nvme_path"), std::string::npos) << bad.status().ToString();
  auto after = s->Load(2);
  ASSERT_FALSE(after.ok());
  EXPECT_EQ(after.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(after.status().message().find("refused"), std::string::npos) << after.status().ToString();
}

}  // namespace
}  // namespace zero
