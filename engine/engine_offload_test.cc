// Offload set-up faults through the Engine: what a user gets when the NVMe path is missing,
// unwritable, already holds a swap file of a killed run, or is too small, and that creating and
// destroying offloading engines returns every byte of pinned host memory; and that offloading
// engines train without memlock privileges (the suite's configs say pin_memory_fallback).
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "comm/thread_ranks.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "nvme/nvme_test_util.h"
#include "offload/host_slab.h"
#include "testing/same_bits.h"
#include "testing/scratch_dir.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

using namespace ::zero::testing;  // NOLINT: the engine test helpers

std::string NvmeJson(const std::string& path, const std::string& extra = "") {
  return "\"sub_group_size\": 64, \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"" + path +
         "\", \"buffer_count\": 2" + extra + "}";
}

// Initialize's error on one rank (world 1), or OK; `zero_extra` goes inside zero_optimization, `extra`
// at the top level.
Status InitializeWith(const std::string& zero_extra, const std::string& extra = "",
                      const TestModel& model = SmallModel()) {
  return RunThreadRanks(1, [&](int, Communicator* comm, Device* device) -> Status {
    ZERO_ASSIGN_OR_RETURN(Config config, MakeConfig(ConfigJson(2, 1, 0.0, extra, zero_extra), 1));
    return MakeEngine(config, model, device, comm).status();
  });
}

TEST(EngineOffloadFaultsTest, NvmePathProblemsAreClearErrorsAtInitialize) {
  auto scratch = ::zero::ScratchDir::CreateWithDirectIo("offload_faults");
  ASSERT_OK(scratch);
  const std::string dir = scratch->path();
  // A path under a regular file cannot be created.
  const std::string file = dir + "/a_file";
  std::ofstream(file) << "x";
  Status s = InitializeWith(NvmeJson(file + "/below"));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("nvme_path"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find(file), std::string::npos) << s.ToString();

  // A swap file left by a killed run is refused with its path, never reused.
  const std::string stale = dir + "/stale";
  std::filesystem::create_directories(stale + "/zero_swap/rank0");
  std::ofstream(stale + "/zero_swap/rank0/optimizer_states.swp") << "old";
  s = InitializeWith(NvmeJson(stale));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("optimizer_states.swp"), std::string::npos) << s.ToString();
  EXPECT_TRUE(std::filesystem::exists(stale + "/zero_swap/rank0/optimizer_states.swp"))
      << "the stale file is left for the user";

  // buffer_count below 2 names the key.
  s = InitializeWith("\"sub_group_size\": 64, \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"" + dir +
                     "/one\", \"buffer_count\": 1}");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("buffer_count"), std::string::npos) << s.ToString();

  // A disk too small for the swap file (a 64 KiB tmpfs; skipped where mounting is not permitted).
  auto small = ScopedMount::Create(dir + "/small", "tmpfs", "size=4k");  // one page: two regions do not fit
  if (small.ok()) {
    s = InitializeWith(NvmeJson(small->dir(), ""), "\"aio\": {\"allow_buffered_fallback\": true}");
    // tmpfs may refuse O_DIRECT on older kernels: either way a clear error at Initialize.
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find(small->dir()), std::string::npos) << s.ToString();
  } else {
    std::printf("skipped the disk-full case: %s\n", small.status().ToString().c_str());
  }
}

TEST(EngineOffloadFaultsTest, OffloadingEnginesReturnTheirPinnedMemory) {
  auto scratch = ::zero::ScratchDir::CreateWithDirectIo("offload_leaks");
  ASSERT_OK(scratch);
  const std::string dir = scratch->path();
  const size_t before = HostSlab::live_bytes();
  // Every slab pinned where the memlock limit allows, pageable otherwise (the fallback).
  const std::string pin = ", \"pin_memory\": true, \"pin_memory_fallback\": true";
  const std::string cpu_opt = "\"offload_optimizer\": {\"device\": \"cpu\"" + pin + "}";
  for (int cycle = 0; cycle < 20; ++cycle) {
    // Optimizer states on the CPU, on NVMe; then with the parameters offloaded too, to the CPU
    // and to NVMe (their own slab and swap file).
    const std::string c = dir + "/c" + std::to_string(cycle);
    const std::string extra = cycle % 4 == 0   ? cpu_opt
                              : cycle % 4 == 1 ? NvmeJson(c, pin)
                              : cycle % 4 == 2
                                  ? cpu_opt + ", \"offload_param\": {\"device\": \"cpu\"" + pin + "}"
                                  : cpu_opt + ", \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"" + c +
                                        "\", \"buffer_count\": 2, \"max_in_cpu\": 0" + pin + "}";
    Status s = RunThreadRanks(2, [&](int rank, Communicator* comm, Device* device) -> Status {
      ZERO_ASSIGN_OR_RETURN(Config config, MakeConfig(ConfigJson(3, 1, 0.0, "", extra), 2));
      ZERO_ASSIGN_OR_RETURN(auto e, MakeEngine(config, SmallModel(), device, comm));
      if (e->memory().host_states == 0) return InternalError("no host states");
      TrainOptions o;
      o.steps = 1;
      TrainResult r;
      return TrainSteps(e.get(), device, SmallModel(), rank, o, &r);
    });
    ASSERT_OK(s) << "cycle " << cycle;
    ASSERT_EQ(HostSlab::live_bytes(), before) << "cycle " << cycle << ": pinned host memory left behind";
  }
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    EXPECT_NE(entry.path().filename(), "zero_swap") << "left behind: " << entry.path();
  }
}

// What a tiny offloading engine (4040 parameters, one rank, fp32 model) keeps in host slabs (pinned
// where the memlock limit allows): its states and transfer buffers sized by what its partition
// needs, never by a default bound the model does not reach (the CPU AdamW's transfer chunks of
// 2^22 elements each, eleven of them, pinned 176 MiB; NVMe states' two chunks 32 MiB). Each mode's
// slab bytes (HostSlab::live_bytes while the engine lives) are at most four times what its states
// and shards hold (bytes_per_element of the partition, docs/offload.md has the formulas) plus
// 64 KiB: the transfer buffers, each at most the partition, and the padding.
TEST(EngineOffloadFaultsTest, TinyOffloadingEnginesPinWhatTheirStatesNeed) {
  auto scratch = ::zero::ScratchDir::CreateWithDirectIo("offload_pinned");
  ASSERT_OK(scratch);
  const TestModel model = BlockModel(4, 1000, 10);  // 4040 elements
  const int64_t numel = 4040;
  struct Mode {
    std::string name;
    int stage;
    int gas;
    std::string zero_extra;
    int64_t bytes_per_element;  // what the states hold: host states, host gradients, host shards
  };
  const std::string nvme = scratch->path();
  const std::vector<Mode> modes = {
      // fp32 masters + 2 moments (12) + the host model copy (4); gas 1: the update in backward
      {"offload_optimizer cpu, stage 2", 2, 1, "\"offload_optimizer\": {\"device\": \"cpu\"}", 16},
      {"offload_optimizer cpu, stage 3", 3, 1, "\"offload_optimizer\": {\"device\": \"cpu\"}", 16},
      // gradient accumulation: the fp32 gradient partition in host memory (4)
      {"offload_optimizer cpu, stage 2, gas 2", 2, 2, "\"offload_optimizer\": {\"device\": \"cpu\"}", 20},
      // + the host shards (4), gas 1
      {"offload_optimizer cpu + offload_param cpu", 3, 1,
       "\"offload_optimizer\": {\"device\": \"cpu\"}, \"offload_param\": {\"device\": \"cpu\"}", 24},
      // two group buffers (2 x 12: sub_group_size 1e9 is capped at the partition) + the model copy (4)
      {"offload_optimizer nvme", 3, 1,
       "\"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"" + nvme + "/opt\"}", 28},
      // the cache (max_in_cpu 1e9 capped at every module: 4); no read buffers then (buffer_size 1e8 unused)
      {"offload_param nvme", 3, 1, "\"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"" + nvme + "/param\"}",
       4},
      // the three states (12) in host memory; the staging sets are device memory
      {"offload_optimizer cpu, update_device gpu", 3, 1,
       "\"offload_optimizer\": {\"device\": \"cpu\", \"update_device\": \"gpu\"}", 12},
  };
  for (const Mode& m : modes) {
    SCOPED_TRACE(m.name);
    const size_t before = HostSlab::live_bytes();
    size_t live = 0;
    EngineMemory mem;
    Status s = RunThreadRanks(1, [&](int rank, Communicator* comm, Device* device) -> Status {
      ZERO_ASSIGN_OR_RETURN(Config config, MakeConfig(ConfigJson(m.stage, m.gas, 0.0, "", m.zero_extra), 1));
      ZERO_ASSIGN_OR_RETURN(auto e, MakeEngine(config, model, device, comm));
      TrainOptions o;
      o.steps = 1;
      TrainResult r;
      ZERO_RETURN_IF_ERROR(TrainSteps(e.get(), device, model, rank, o, &r));
      live = HostSlab::live_bytes() - before;
      mem = e->memory();
      return OkStatus();
    });
    ASSERT_OK(s);
    const size_t need = static_cast<size_t>(m.bytes_per_element * numel);
    std::printf("%-45s slab bytes %10zu (host_states %zu, host_gradients %zu, host_params %zu); states %zu\n",
                m.name.c_str(), live, mem.host_states, mem.host_gradients, mem.host_params, need);
    EXPECT_LE(live, 4 * need + (64 << 10)) << "slab bytes of a " << numel << "-element model";
    EXPECT_EQ(HostSlab::live_bytes(), before);
  }
}

// Drops CAP_IPC_LOCK from the calling thread (root ignores RLIMIT_MEMLOCK otherwise; the threads
// it starts from then on inherit that) and lowers RLIMIT_MEMLOCK's soft limit to `soft`, for good:
// only for a child process.
Status DropMemlockPrivileges(rlim_t soft) {
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct caps[2]{};
  if (syscall(SYS_capget, &hdr, caps) != 0) return InternalError("capget failed");
  caps[0].effective &= ~(1u << CAP_IPC_LOCK);
  caps[0].permitted &= ~(1u << CAP_IPC_LOCK);
  caps[0].inheritable &= ~(1u << CAP_IPC_LOCK);
  if (syscall(SYS_capset, &hdr, caps) != 0) return InternalError("capset failed");
  struct rlimit rl;
  if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0) return InternalError("getrlimit failed");
  rl.rlim_cur = std::min(soft, rl.rlim_max);
  if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0) return InternalError("setrlimit failed");
  return OkStatus();
}

// Without memlock privileges (CAP_IPC_LOCK dropped, RLIMIT_MEMLOCK 64 KiB: below a normal user's
// default 8192 KiB): OK when an engine offloading its optimizer states and parameters to the CPU
// with the engine tests' config (MakeConfig: pin_memory true, the default, and pin_memory_fallback)
// trains two steps on pageable slabs, and the same offload with pin_memory_fallback false fails
// Initialize on the limit (so the limit was in force). The model is large enough (4040 elements:
// about 130 KiB of slabs per rank at world 2, 290 KiB at world 1) for both to exceed 64 KiB, since
// the slabs are sized by the model.
Status TrainWithoutMemlockPrivileges() {
  ZERO_RETURN_IF_ERROR(DropMemlockPrivileges(64 << 10));
  const TestModel model = BlockModel(4, 1000, 10);
  const std::string offload = "\"offload_optimizer\": {\"device\": \"cpu\"}, \"offload_param\": {\"device\": \"cpu\"}";
  ZERO_RETURN_IF_ERROR(RunThreadRanks(2, [&](int rank, Communicator* comm, Device* device) -> Status {
    ZERO_ASSIGN_OR_RETURN(Config config, MakeConfig(ConfigJson(3, 1, 0.0, "", offload), 2));
    if (!config.zero.offload_optimizer.pin_memory || !config.zero.offload_param.pin_memory) {
      return InternalError("pin_memory is not true by default");
    }
    ZERO_ASSIGN_OR_RETURN(auto e, MakeEngine(config, model, device, comm));
    if (e->memory().host_states <= (64 << 10)) return InternalError("host states within the limit: nothing falls back");
    TrainOptions o;
    o.steps = 2;
    TrainResult r;
    return TrainSteps(e.get(), device, model, rank, o, &r);
  }));
  const Status strict =
      InitializeWith("\"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory_fallback\": false}", "", model);
  if (strict.code() != StatusCode::kResourceExhausted || strict.message().find("RLIMIT_MEMLOCK") == std::string::npos) {
    return InternalError("pin_memory_fallback false: expected RLIMIT_MEMLOCK's error, got " + strict.ToString());
  }
  return OkStatus();
}

// The guard that the suite needs no memlock privileges, in a child process (gtest's threadsafe
// death-test style re-runs this binary for it, so the capability drop comes before any thread).
TEST(EngineOffloadDeathTest, OffloadingEnginesTrainWithoutMemlockPrivileges) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const Status s = TrainWithoutMemlockPrivileges();
        std::fprintf(stderr, "memlock guard: %s\n", s.ToString().c_str());
        std::fflush(stderr);
        std::_Exit(s.ok() ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "memlock guard: OK");
}

// Three tiers, as bench/run_llm_largest.sh trains its 13B transformer: offload_optimizer.ratio
// keeps the partition's first elements' states on the device (device AdamW), host_memory_budget
// the next ones in pinned host memory (CPU AdamW) and NVMe the rest. With accumulation (GAS 2:
// the fp32 gradients stay on the device for the NVMe tier) and without (GAS 1), at worlds 1 and 2:
// bitwise no offload (masters, model copy, moments, norms, losses), and every tier holds a share.
TEST(EngineOffloadTest, ThreeTiersAreBitwiseNoOffload) {
  auto scratch = ::zero::ScratchDir::CreateWithDirectIo("three_tiers");
  ASSERT_OK(scratch);
  const TestModel model = BlockModel(3, 3000, 10);  // 3 x 3010 elements: 9030, 4515 per rank at world 2
  TrainOptions ro;
  ro.steps = 3;
  for (int world : {1, 2}) {
    for (int gas : {1, 2}) {
      SCOPED_TRACE("world " + std::to_string(world) + " gas " + std::to_string(gas));
      const auto none = TrainAll(ConfigJson(3, gas, 0.0, "", ""), world, model, ro);
      // ratio 0.75: a quarter of each rank's partition on the device; 12 B x 1000 elements of host
      // budget; the rest (about 2400 elements at world 1, 1200 at world 2) on NVMe.
      const std::string dir = scratch->File("w" + std::to_string(world) + "g" + std::to_string(gas));
      const std::string tiers =
          "\"sub_group_size\": 256, \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"" + dir +
          "\", \"buffer_count\": 2, \"cpu_threads\": 2, \"ratio\": 0.75, " + "\"host_memory_budget\": 12000}";
      const auto tiered = TrainAll(ConfigJson(3, gas, 0.0, "", tiers), world, model, ro);
      ASSERT_EQ(none.size(), static_cast<size_t>(world));
      ASSERT_EQ(tiered.size(), static_cast<size_t>(world));
      for (int r = 0; r < world; ++r) {
        EXPECT_TRUE(SameBits(tiered[r].master, none[r].master)) << "rank " << r;
        EXPECT_TRUE(SameBits(tiered[r].model, none[r].model)) << "rank " << r;
        EXPECT_TRUE(SameBits(tiered[r].exp_avg, none[r].exp_avg)) << "rank " << r;
        EXPECT_TRUE(SameBits(tiered[r].exp_avg_sq, none[r].exp_avg_sq)) << "rank " << r;
        EXPECT_EQ(tiered[r].norms, none[r].norms) << "rank " << r;
        EXPECT_EQ(tiered[r].losses, none[r].losses) << "rank " << r;
        const EngineMemory& m = tiered[r].memory;
        EXPECT_GT(m.master_params, 0u) << "rank " << r << ": the device tier";
        EXPECT_LT(m.master_params, none[r].memory.master_params) << "rank " << r;
        EXPECT_GE(m.host_states, 12000u) << "rank " << r << ": the host tier";
        EXPECT_GT(m.nvme_states, 0u) << "rank " << r << ": the NVMe tier";
      }
    }
  }
}

}  // namespace
}  // namespace zero
