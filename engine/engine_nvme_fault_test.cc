// NVMe faults during training, through the Engine (issue 9 item 6): an engine with
// offload_optimizer.device "nvme" (stages 1-3, and tiered) trains a few steps with real O_DIRECT
// swap I/O under a scratch directory on the disk, saves a checkpoint, then meets a fault: EIO on a
// read and on a write, ENOSPC on a write (injected through a FaultyAioEngine given to the Engine
// in its EngineEnv), a short read, the swap file truncated or one of its bytes flipped on disk
// between steps, and a real full disk (a loop-mounted ext4 image filled up during training).
// For each: the call that touches the state fails with an error naming the swap file, the offset
// and length and what to do; the engine refuses further use (Step and SaveCheckpoint, so the last
// checkpoint cannot be overwritten); destroying it returns every pinned byte and removes the swap
// folder; and a fresh engine that loads the checkpoint and trains on has bitwise the weights of an
// uninterrupted run. Faults the engine absorbs (a short read it completes, a disk that fills
// after the swap file was preallocated) must leave the weights bitwise those of a clean run.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "comm/thread_ranks.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "nvme/faulty_aio_engine.h"
#include "nvme/nvme_test_util.h"
#include "offload/host_slab.h"
#include "runtime/faulty_file_system.h"
#include "testing/same_bits.h"
#include "testing/scratch_dir.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

using namespace ::zero::testing;  // NOLINT: the engine test helpers
using Weights = std::vector<std::vector<float>>;

// 3 x (700 + 20) elements; groups of 512 elements (regions of 6144 bytes, padded to 8192), two
// group buffers: every step evicts and re-reads every group, so each fault is met at once.
TestModel Model() { return BlockModel(3, 700, 20); }
constexpr int kStepsBefore = 2;  // trained, then the checkpoint, then the fault
constexpr int kStepsAfter = 2;   // trained after the fault (or after the resume)

struct Case {
  int stage;
  bool tiered;  // host_memory_budget of 1000 elements: the rest on NVMe
  double clip;  // 0 at stages 2/3: the update runs in GradReady (update in backward)
  // offload_param.device "nvme" (stage 3, two module buffers, no cache) instead of the NVMe
  // optimizer states: the faults hit params.swp.
  bool param_nvme = false;
  std::string Name() const {
    return "stage " + std::to_string(stage) + (tiered ? " tiered" : "") + (clip > 0 ? " clip" : "") +
           (param_nvme ? " offload_param nvme" : "");
  }
};

std::string Json(const Case& c, const std::string& nvme_path) {
  if (c.param_nvme) {
    return ConfigJson(c.stage, 1, c.clip, "",
                      "\"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"" + nvme_path +
                          "\", \"buffer_count\": 2, \"max_in_cpu\": 0}");
  }
  return ConfigJson(c.stage, 1, c.clip, "",
                    "\"sub_group_size\": 512, \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"" +
                        nvme_path + "\", \"buffer_count\": 2" + (c.tiered ? ", \"host_memory_budget\": 12000" : "") +
                        "}");
}

std::string SwapPath(const Case& c, const std::string& nvme_path) {
  return nvme_path + "/zero_swap/rank0/" + (c.param_nvme ? "params.swp" : "optimizer_states.swp");
}

Result<std::unique_ptr<Engine>> MakeEngineIn(const Config& config, Device* device, Communicator* comm,
                                             const EngineEnv& env, float init_shift = 0.0f) {
  ZERO_ASSIGN_OR_RETURN(auto engine, Engine::Create(config, device, comm, env));
  for (const ParamSpec& s : Model().specs) ZERO_RETURN_IF_ERROR(engine->RegisterParameter(s).status());
  Engine* e = engine.get();
  ZERO_RETURN_IF_ERROR(engine->Initialize([e, init_shift](int index, float* v) {
    const int64_t n = Numel(e->param_spec(index));
    for (int64_t k = 0; k < n; ++k) v[k] = InitValue(index, k) + init_shift;
  }));
  return engine;
}

// An EngineEnv whose NVMe swap files go through a FaultyAioEngine over the real one; *aio is set to
// it when the engine creates it (the engine owns it).
EngineEnv FaultyEnv(FaultyAioEngine** aio) {
  EngineEnv env;
  env.aio_engine_factory = [aio](const AioOptions& o) -> Result<std::unique_ptr<AioEngine>> {
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<FaultyAioEngine> f, FaultyAioEngine::Create(o));
    *aio = f.get();
    return std::unique_ptr<AioEngine>(std::move(f));
  };
  return env;
}

Status Masters(Engine* e, Weights* out) {
  out->clear();
  for (int i = 0; i < e->num_params(); ++i) {
    std::vector<float> w(static_cast<size_t>(Numel(e->param_spec(i))));
    ZERO_RETURN_IF_ERROR(e->GatherMasterWeights(i, w.data()));
    out->push_back(std::move(w));
  }
  return OkStatus();
}

Status Train(Engine* e, Device* device, int steps) {
  TrainOptions o;
  o.steps = steps;
  TrainResult r;
  return TrainSteps(e, device, Model(), /*rank=*/0, o, &r);
}

// The master weights after kStepsBefore + kStepsAfter uninterrupted steps.
Weights Reference(const Case& c, const std::string& nvme_path) {
  Weights w;
  Status s = RunThreadRanks(1, [&](int, Communicator* comm, Device* device) -> Status {
    ZERO_ASSIGN_OR_RETURN(Config config, MakeConfig(Json(c, nvme_path), 1));
    ZERO_ASSIGN_OR_RETURN(auto e, MakeEngineIn(config, device, comm, {}));
    ZERO_RETURN_IF_ERROR(Train(e.get(), device, kStepsBefore + kStepsAfter));
    return Masters(e.get(), &w);
  });
  EXPECT_OK(s) << c.Name() << " reference";
  return w;
}

// A fresh engine (other initial values) loads `ckpt`, trains kStepsAfter steps: its masters.
Status Resume(const Case& c, const std::string& nvme_path, const std::string& ckpt, Weights* out) {
  return RunThreadRanks(1, [&](int, Communicator* comm, Device* device) -> Status {
    ZERO_ASSIGN_OR_RETURN(Config config, MakeConfig(Json(c, nvme_path), 1));
    ZERO_ASSIGN_OR_RETURN(auto e, MakeEngineIn(config, device, comm, {}, /*init_shift=*/1.0f));
    ZERO_RETURN_IF_ERROR(e->LoadCheckpoint(ckpt).status());
    ZERO_RETURN_IF_ERROR(Train(e.get(), device, kStepsAfter));
    return Masters(e.get(), out);
  });
}

enum class Fault {
  kEioRead,      // injected: the next read piece completes with -EIO
  kEioWrite,     // injected: the next write piece completes with -EIO
  kEnospcWrite,  // injected: the next write piece completes with -ENOSPC
  kZeroRead,     // injected: the next read piece transfers 0 bytes (a read at end of file)
  kShortRead,    // injected: the next read piece transfers 4096 of 8192 bytes (the rest is resubmitted)
  kTruncate,     // on disk: the swap file cut to half its size
  kCorrupt,      // on disk: one byte of region 0 flipped
};

const char* FaultName(Fault f) {
  switch (f) {
    case Fault::kEioRead:
      return "EIO on read";
    case Fault::kEioWrite:
      return "EIO on write";
    case Fault::kEnospcWrite:
      return "ENOSPC on write";
    case Fault::kZeroRead:
      return "0-byte read";
    case Fault::kShortRead:
      return "short read";
    case Fault::kTruncate:
      return "truncated swap file";
    case Fault::kCorrupt:
      return "corrupted byte";
  }
  return "?";
}

// What the failing call must say, beyond the swap file's path and the advice.
struct Expected {
  StatusCode code;
  std::vector<std::string> needles;
};

Expected ExpectedError(Fault f) {
  switch (f) {
    case Fault::kEioRead:
      return {StatusCode::kInternal, {"pread", "Input/output error", "length", "dmesg"}};
    case Fault::kEioWrite:
      return {StatusCode::kInternal, {"pwrite", "Input/output error", "length", "dmesg"}};
    case Fault::kEnospcWrite:
      return {StatusCode::kResourceExhausted, {"pwrite", "No space left on device", "length", "free space"}};
    case Fault::kZeroRead:
      return {StatusCode::kDataLoss, {"pread", "end of file", "length", "lost"}};
    case Fault::kTruncate:
      return {StatusCode::kDataLoss, {"region", "end of file", "truncated", "lost"}};
    case Fault::kCorrupt:
      return {StatusCode::kDataLoss, {"checksum mismatch", "region 0", "lost"}};
    case Fault::kShortRead:
      break;
  }
  return {StatusCode::kOk, {}};
}

Status Apply(Fault f, FaultyAioEngine* aio, const std::string& swap) {
  switch (f) {
    case Fault::kEioRead:
      aio->FailNthRead(aio->reads_reaped() + 1, EIO);
      return OkStatus();
    case Fault::kEioWrite:
      aio->FailNthWrite(aio->writes_reaped() + 1, EIO);
      return OkStatus();
    case Fault::kEnospcWrite:
      aio->FailNthWrite(aio->writes_reaped() + 1, ENOSPC);
      return OkStatus();
    case Fault::kZeroRead:
      aio->ShortenNthRead(aio->reads_reaped() + 1, 0);
      return OkStatus();
    case Fault::kShortRead:
      aio->ShortenNthRead(aio->reads_reaped() + 1, 4096);
      return OkStatus();
    case Fault::kTruncate: {
      std::error_code ec;
      const uintmax_t size = std::filesystem::file_size(swap, ec);
      if (ec) return InternalError("file_size " + swap + ": " + ec.message());
      std::filesystem::resize_file(swap, size / 2, ec);
      if (ec) return InternalError("truncate " + swap + ": " + ec.message());
      return OkStatus();
    }
    case Fault::kCorrupt: {
      const int fd = ::open(swap.c_str(), O_RDWR | O_CLOEXEC);
      if (fd < 0) return ErrnoError("open", swap, errno);
      unsigned char byte = 0;
      Status st;
      if (::pread(fd, &byte, 1, 100) != 1) st = ErrnoError("pread", swap, errno);
      byte ^= 0x40;
      if (st.ok() && ::pwrite(fd, &byte, 1, 100) != 1) st = ErrnoError("pwrite", swap, errno);
      if (st.ok() && ::fsync(fd) != 0) st = ErrnoError("fsync", swap, errno);
      ::close(fd);
      return st;
    }
  }
  return OkStatus();
}

bool Contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

// Trains kStepsBefore steps with a FaultyAioEngine, checkpoints, applies `fault`, trains on; then
// the checks in the file comment.
void RunFault(const Case& c, Fault fault, const std::string& dir, const Weights& reference) {
  SCOPED_TRACE(c.Name() + ", " + FaultName(fault));
  const std::string nvme = dir + "/nvme";
  const std::string ckpt = dir + "/ckpt";
  const size_t pinned_before = HostSlab::live_bytes();
  Weights after_fault;
  Status s = RunThreadRanks(1, [&](int, Communicator* comm, Device* device) -> Status {
    ZERO_ASSIGN_OR_RETURN(Config config, MakeConfig(Json(c, nvme), 1));
    FaultyAioEngine* aio = nullptr;  // owned by the engine's NVMe states
    const EngineEnv env = FaultyEnv(&aio);
    ZERO_ASSIGN_OR_RETURN(auto e, MakeEngineIn(config, device, comm, env));
    if (aio == nullptr) return InternalError("the engine did not use EngineEnv::aio_engine_factory");
    ZERO_RETURN_IF_ERROR(Train(e.get(), device, kStepsBefore));
    ZERO_RETURN_IF_ERROR(e->SaveCheckpoint(ckpt));
    const uint64_t resubmits_before = aio->stats().short_resubmits;
    ZERO_RETURN_IF_ERROR(Apply(fault, aio, SwapPath(c, nvme)));
    const Status failed = Train(e.get(), device, kStepsAfter);
    const Expected want = ExpectedError(fault);
    if (want.code == StatusCode::kOk) {  // absorbed: training goes on, bitwise as without it
      ZERO_RETURN_IF_ERROR(failed);
      if (aio->stats().short_resubmits == resubmits_before) {
        return InternalError("the short read was not injected (no short transfer resubmitted)");
      }
      return Masters(e.get(), &after_fault);
    }
    // The failing call: a clear error naming the swap file, where, what happened, what to do.
    if (failed.ok())
      return InternalError(std::string("no error in ") + std::to_string(kStepsAfter) + " steps after the fault");
    std::printf("%s, %s:\n  %s\n", c.Name().c_str(), FaultName(fault), failed.ToString().c_str());
    EXPECT_EQ(failed.code(), want.code) << failed.ToString();
    const std::string& m = failed.message();
    EXPECT_TRUE(Contains(m, SwapPath(c, nvme))) << "the swap file is not named: " << failed.ToString();
    EXPECT_TRUE(Contains(m, "offset")) << "no offset: " << failed.ToString();
    EXPECT_TRUE(Contains(m, "LoadCheckpoint")) << "no advice: " << failed.ToString();
    for (const std::string& n : want.needles) EXPECT_TRUE(Contains(m, n)) << "no '" << n << "': " << failed.ToString();
    // The engine refuses further use, saving included (the last checkpoint cannot be replaced).
    const Status step = e->Step();
    EXPECT_TRUE(Contains(step.message(), "unusable after an earlier error")) << step.ToString();
    EXPECT_TRUE(Contains(step.message(), SwapPath(c, nvme))) << step.ToString();
    const Status save = e->SaveCheckpoint(ckpt);
    EXPECT_TRUE(Contains(save.message(), "unusable after an earlier error")) << save.ToString();
    std::vector<float> w(static_cast<size_t>(Numel(e->param_spec(0))));
    const Status gather = e->GatherMasterWeights(0, w.data());
    EXPECT_FALSE(gather.ok()) << "GatherMasterWeights after the fault";
    e.reset();  // destroying a failed engine: no crash, no hang, nothing left behind
    return OkStatus();
  });
  ASSERT_OK(s);
  EXPECT_EQ(HostSlab::live_bytes(), pinned_before) << "pinned host memory left behind";
  EXPECT_FALSE(std::filesystem::exists(nvme + "/zero_swap")) << "the swap folder was left behind";
  if (ExpectedError(fault).code == StatusCode::kOk) {
    EXPECT_TRUE(SameBits(after_fault, reference)) << "after an absorbed fault";
    return;
  }
  // The checkpoint saved before the fault resumes bitwise onto the uninterrupted run.
  Weights resumed;
  ASSERT_OK(Resume(c, dir + "/resume", ckpt, &resumed));
  EXPECT_TRUE(SameBits(resumed, reference)) << "resumed from the checkpoint before the fault";
}

void RunAllFaults(const Case& c, const std::vector<Fault>& faults) {
  auto scratch = ::zero::ScratchDir::CreateWithDirectIo("engine_nvme_faults");
  ASSERT_OK(scratch);
  const Weights reference = Reference(c, scratch->File("reference"));
  ASSERT_FALSE(reference.empty());
  for (size_t k = 0; k < faults.size(); ++k) {
    RunFault(c, faults[k], scratch->File("f" + std::to_string(k)), reference);
  }
}

const std::vector<Fault> kAllFaults = {Fault::kEioRead,   Fault::kEioWrite, Fault::kEnospcWrite, Fault::kZeroRead,
                                       Fault::kShortRead, Fault::kTruncate, Fault::kCorrupt};

TEST(EngineNvmeFaultTest, Stage1) { RunAllFaults({1, false, 0.0}, kAllFaults); }
TEST(EngineNvmeFaultTest, Stage2Clipped) { RunAllFaults({2, false, 1.0}, kAllFaults); }
TEST(EngineNvmeFaultTest, Stage3UpdateInBackward) { RunAllFaults({3, false, 0.0}, kAllFaults); }
TEST(EngineNvmeFaultTest, Stage3Tiered) { RunAllFaults({3, true, 0.0}, kAllFaults); }
// offload_param.device "nvme": EIO on a parameter read (a gather's Load, or a read ahead) and a
// corrupted params.swp (the checksum of module 0's region), with and without clipping.
TEST(EngineNvmeFaultTest, Stage3ParamNvme) {
  RunAllFaults({3, false, 0.0, true}, {Fault::kEioRead, Fault::kCorrupt, Fault::kTruncate});
}
TEST(EngineNvmeFaultTest, Stage3ParamNvmeClipped) {
  RunAllFaults({3, false, 1.0, true}, {Fault::kEioRead, Fault::kCorrupt});
}

// EngineEnv::file_system reaches the NVMe swap files (zero/state_factory's plans carry it to
// SwapFileOptions::file_system): ENOSPC injected into the preallocation of optimizer_states.swp
// (offload_optimizer nvme) and of params.swp (offload_param nvme) fails Initialize with the full-disk
// message naming the swap file; without the fault the engine creates its swap file, trains, and
// removes the file at destruction, each through the FileSystem.
TEST(EngineNvmeFaultTest, EnvFileSystemReachesTheSwapFiles) {
  auto scratch = ::zero::ScratchDir::CreateWithDirectIo("engine_nvme_fs");
  ASSERT_OK(scratch);
  int k = 0;
  for (const Case& c : {Case{1, false, 0.0}, Case{3, false, 0.0, true}}) {
    const std::string nvme = scratch->File("fs" + std::to_string(k++));
    const size_t pinned_before = HostSlab::live_bytes();
    FaultyFileSystem faulty;
    EngineEnv env;
    env.file_system = &faulty;
    faulty.FailNthCall("Allocate", 1, ENOSPC);
    Status s = RunThreadRanks(1, [&](int, Communicator* comm, Device* device) -> Status {
      ZERO_ASSIGN_OR_RETURN(Config config, MakeConfig(Json(c, nvme), 1));
      return MakeEngineIn(config, device, comm, env).status();
    });
    EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << c.Name() << ": " << s.ToString();
    EXPECT_TRUE(Contains(s.message(), SwapPath(c, nvme))) << s.ToString();
    EXPECT_TRUE(Contains(s.message(), "cannot preallocate")) << s.ToString();
    EXPECT_EQ(faulty.call_count("CreateFile"), 1) << c.Name();
    EXPECT_EQ(HostSlab::live_bytes(), pinned_before) << c.Name();

    faulty.ClearFaults();
    s = RunThreadRanks(1, [&](int, Communicator* comm, Device* device) -> Status {
      ZERO_ASSIGN_OR_RETURN(Config config, MakeConfig(Json(c, nvme), 1));
      ZERO_ASSIGN_OR_RETURN(auto e, MakeEngineIn(config, device, comm, env));
      ZERO_RETURN_IF_ERROR(Train(e.get(), device, 1));
      if (!std::filesystem::exists(SwapPath(c, nvme))) return InternalError("no swap file " + SwapPath(c, nvme));
      return OkStatus();
    });
    ASSERT_OK(s) << c.Name();
    EXPECT_EQ(faulty.call_count("CreateFile"), 2) << c.Name();
    EXPECT_EQ(faulty.call_count("RemoveFile"), 2) << c.Name();  // the failed creation's and the engine's
    EXPECT_FALSE(std::filesystem::exists(SwapPath(c, nvme))) << c.Name();
  }
}

// Appends to `path` in 1 MiB writes until the disk is full (ENOSPC); the bytes written.
Result<uint64_t> FillDisk(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError("open", path, errno);
  std::vector<char> chunk(1 << 20, 'x');
  uint64_t total = 0;
  size_t len = chunk.size();
  while (true) {
    const ssize_t n = ::write(fd, chunk.data(), len);
    if (n > 0) {
      total += static_cast<uint64_t>(n);
      continue;
    }
    const int err = errno;
    if (n < 0 && err == ENOSPC && len > 4096) {  // the last blocks: smaller writes
      len /= 2;
      continue;
    }
    ::fsync(fd);
    ::close(fd);
    if (n < 0 && err == ENOSPC) return total;
    return ErrnoError("fill disk: write", path, n < 0 ? err : EIO);
  }
}

// A real disk-full: nvme_path on a 16 MiB ext4 (a loop-mounted image), filled while the engine
// trains. The swap file was preallocated and written once at Initialize, so the swap writes of
// later steps only overwrite its blocks: training goes on bitwise as on an empty disk. A checkpoint
// saved onto the full disk fails and leaves the engine usable and unchanged; a second engine
// cannot create its swap file there and says so at Initialize, naming the bytes.
TEST(EngineNvmeFaultTest, RealDiskFullDuringTraining) {
  auto scratch = ::zero::ScratchDir::CreateWithDirectIo("engine_nvme_full");
  ASSERT_OK(scratch);
  auto disk = ScopedMount::CreateExt4Image(scratch->File("disk"), scratch->File("disk.img"), 16 << 20);
  if (!disk.ok()) GTEST_SKIP() << "no loop-mounted ext4 here: " << disk.status().ToString();
  ASSERT_OK(ProbeDirectIo(disk->dir()));
  const Case c{2, false, 1.0};
  const Weights reference = Reference(c, scratch->File("reference"));
  ASSERT_FALSE(reference.empty());
  const std::string nvme = disk->dir() + "/nvme";
  const std::string filler = disk->dir() + "/filler";
  const size_t pinned_before = HostSlab::live_bytes();
  Weights got;
  Status s = RunThreadRanks(1, [&](int, Communicator* comm, Device* device) -> Status {
    ZERO_ASSIGN_OR_RETURN(Config config, MakeConfig(Json(c, nvme), 1));
    ZERO_ASSIGN_OR_RETURN(auto e, MakeEngineIn(config, device, comm, {}));
    ZERO_RETURN_IF_ERROR(Train(e.get(), device, kStepsBefore));
    ZERO_ASSIGN_OR_RETURN(uint64_t filled, FillDisk(filler));
    struct statvfs st {};
    if (::statvfs(disk->dir().c_str(), &st) != 0 || st.f_bfree * st.f_bsize >= (1 << 20)) {
      return InternalError("the disk is not full after writing " + std::to_string(filled) + " bytes");
    }
    const Status save = e->SaveCheckpoint(disk->dir() + "/ckpt");
    EXPECT_FALSE(save.ok()) << "a checkpoint fit on the full disk";
    std::printf("SaveCheckpoint onto the full disk:\n  %s\n", save.ToString().c_str());
    EXPECT_TRUE(Contains(save.message(), disk->dir() + "/ckpt")) << save.ToString();
    ZERO_RETURN_IF_ERROR(Train(e.get(), device, kStepsAfter));
    return Masters(e.get(), &got);
  });
  ASSERT_OK(s);
  EXPECT_TRUE(SameBits(got, reference)) << "training on a full disk";
  EXPECT_EQ(HostSlab::live_bytes(), pinned_before) << "pinned host memory left behind";

  // The first engine's swap file is gone (its space freed): fill that too, then a new engine.
  ASSERT_OK(FillDisk(filler));
  s = RunThreadRanks(1, [&](int, Communicator* comm, Device* device) -> Status {
    ZERO_ASSIGN_OR_RETURN(Config config, MakeConfig(Json(c, nvme), 1));
    return MakeEngineIn(config, device, comm, {}).status();
  });
  std::printf("Initialize on the full disk:\n  %s\n", s.ToString().c_str());
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), SwapPath(c, nvme))) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "cannot preallocate")) << s.ToString();
  EXPECT_EQ(HostSlab::live_bytes(), pinned_before) << "pinned host memory left behind by the failed Initialize";
}

// Two ranks, NVMe states, EIO on rank 1's next swap read: its Step fails with the swap error, and
// rank 0's Step fails at once too, naming rank 1 (the ranks agree on the update before the next
// collective), instead of waiting in the weight all-gather for the communicator's timeout (set far
// above this test's own time limit, so a rank left waiting fails the test).
TEST(EngineNvmeFaultTest, AFaultOnOneRankStopsEveryRankAtOnce) {
  auto scratch = ScratchDir::CreateWithDirectIo("nvme_fault_two_ranks");
  ASSERT_OK(scratch);
  const std::string nvme = scratch->File("nvme");
  const Case c{2, false, 0.05};
  std::vector<Status> steps(2);
  CommOptions options;
  options.timeout = std::chrono::milliseconds(600000);
  Status s = RunThreadRanks(
      2,
      [&](int rank, Communicator* comm, Device* device) -> Status {
        ZERO_ASSIGN_OR_RETURN(Config config, MakeConfig(Json(c, nvme), 2));
        FaultyAioEngine* aio = nullptr;
        const EngineEnv env = FaultyEnv(&aio);
        ZERO_ASSIGN_OR_RETURN(auto e, MakeEngineIn(config, device, comm, env));
        TrainOptions o;
        o.steps = kStepsBefore;
        TrainResult r;
        ZERO_RETURN_IF_ERROR(TrainSteps(e.get(), device, Model(), rank, o, &r));
        if (rank == 1) aio->FailNthRead(aio->reads_reaped() + 1, EIO);
        o.steps = 1;
        steps[rank] = TrainSteps(e.get(), device, Model(), rank, o, &r);
        return OkStatus();
      },
      options);
  ASSERT_OK(s);
  std::printf("rank 0: %s\nrank 1: %s\n", steps[0].ToString().c_str(), steps[1].ToString().c_str());
  EXPECT_FALSE(steps[1].ok());
  EXPECT_TRUE(Contains(steps[1].message(), "rank1/optimizer_states.swp")) << steps[1].ToString();
  EXPECT_EQ(steps[0].code(), StatusCode::kUnavailable) << steps[0].ToString();
  EXPECT_TRUE(Contains(steps[0].message(), "rank 1 failed in the optimizer update")) << steps[0].ToString();
}

}  // namespace
}  // namespace zero
