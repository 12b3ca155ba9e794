// One rank's fault reaches every rank (issue 23): ranks as threads of this process, each with its
// own gloo communicator made by CreateCommunicator over the real TcpStore that rank 0 hosts (as
// zero_train's ranks are), train the small model; rank 1 meets a fault at one engine entry point
// and the other ranks carry on into their next collective. Every rank's communicator and engine
// stay alive until all ranks are done, so nothing but the fault report can end the others' waits.
// The communicator's timeout is 30 s: the healthy ranks must fail within 5 s of the fault, with an
// error naming rank 1 and its message, while rank 1 returns its own error.
//
// Faults: an error of the user's forward reported through Engine::ReportFault (stage 3: the others
// wait in the next gather; stage 2: in the reduction); a device fault (runtime/faulty_device.h)
// in GradReady's gradient accumulation, in Step's AdamW, in the parameter upload of a stage-3
// gather with offload_param "cpu", in SaveCheckpoint's read of the states (the save publishes
// nothing: `latest` and the tags stay as they were) and in LoadCheckpoint's install.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/rendezvous.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "runtime/cpu_device.h"
#include "runtime/faulty_device.h"
#include "testing/free_port.h"
#include "testing/scratch_dir.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

using namespace ::zero::testing;  // NOLINT: the engine test helpers
using Clock = std::chrono::steady_clock;

constexpr int kWorld = 3;
constexpr int kBad = 1;  // the rank that meets the fault
constexpr auto kCommTimeout = std::chrono::milliseconds(30000);
constexpr double kPromptSeconds = 5.0;

// What one rank's body gets.
struct Rank {
  int rank = 0;
  FaultyDevice* device = nullptr;
  Communicator* comm = nullptr;
  std::unique_ptr<Engine>* engine = nullptr;  // kept alive by the harness until every rank is done
  std::function<void()> fault_now;            // the faulty rank calls it as it meets the fault
};

struct Outcome {
  std::vector<Status> status;
  std::vector<double> seconds_after_fault;  // when each rank's body returned
};

// Runs body on kWorld thread ranks (see the file comment).
Outcome RunRanks(const std::function<Status(Rank&)>& body) {
  RendezvousOptions o;
  o.world_size = kWorld;
  o.master_port = FreeLoopbackPort();
  o.job_secret = "5e1f0c3a9b8d7e6f5a4b3c2d1e0f9a8b";
  o.comm.timeout = kCommTimeout;
  std::vector<CpuDevice> cpus(kWorld);
  std::vector<std::unique_ptr<FaultyDevice>> devices;
  for (auto& c : cpus) devices.push_back(std::make_unique<FaultyDevice>(&c));
  std::vector<std::unique_ptr<Communicator>> comms(kWorld);
  std::vector<std::unique_ptr<Engine>> engines(kWorld);
  Outcome out;
  out.status.assign(kWorld, OkStatus());
  std::vector<Clock::time_point> ended(kWorld);
  std::atomic<int64_t> fault_at{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      RendezvousOptions mine = o;
      mine.rank = r;
      auto comm = CreateCommunicator("gloo", devices[r].get(), mine);
      if (!comm.ok()) {
        out.status[r] = comm.status();
        ended[r] = Clock::now();
        return;
      }
      comms[r] = std::move(comm).value();
      Rank rk;
      rk.rank = r;
      rk.device = devices[r].get();
      rk.comm = comms[r].get();
      rk.engine = &engines[r];
      rk.fault_now = [&] { fault_at = Clock::now().time_since_epoch().count(); };
      out.status[r] = body(rk);
      ended[r] = Clock::now();
    });
  }
  for (auto& t : threads) t.join();
  const Clock::time_point fault{Clock::duration(fault_at.load())};
  for (int r = 0; r < kWorld; ++r) {
    out.seconds_after_fault.push_back(fault_at.load() == 0 ? -1.0
                                                           : std::chrono::duration<double>(ended[r] - fault).count());
  }
  engines.clear();
  comms.clear();
  return out;
}

Status MakeEngine(Rank& rk, const std::string& json) {
  ZERO_ASSIGN_OR_RETURN(Config config, MakeConfig(json, kWorld));
  ZERO_ASSIGN_OR_RETURN(*rk.engine, Engine::Create(config, rk.device, rk.comm));
  Engine* e = rk.engine->get();
  for (const ParamSpec& s : SmallModel().specs) ZERO_RETURN_IF_ERROR(e->RegisterParameter(s).status());
  return e->Initialize([e](int index, float* v) {
    const int64_t n = Numel(e->param_spec(index));
    for (int64_t k = 0; k < n; ++k) v[k] = InitValue(index, k);
  });
}

// Where a TrainStep can be interrupted: `before(stage name)` runs before each part and may return
// an error, which the step returns at once (the faulty rank's own failure).
using Hook = std::function<Status(const std::string& where)>;

// One optimizer step (GAS 1): gather every module, report every gradient (last first), Backward,
// Step.
Status TrainStep(Rank& rk, int step, const Hook& before = nullptr) {
  Engine* e = rk.engine->get();
  const TestModel m = SmallModel();
  auto at = [&](const std::string& where) { return before ? before(where) : OkStatus(); };
  std::vector<ModuleHandle> held;
  for (const std::string& mod : m.modules) {
    ZERO_RETURN_IF_ERROR(at("gather " + mod));
    ZERO_ASSIGN_OR_RETURN(ModuleHandle h, e->GatherModule(mod));
    held.push_back(std::move(h));
  }
  ZERO_RETURN_IF_ERROR(at("forward"));
  for (int i = static_cast<int>(m.specs.size()) - 1; i >= 0; --i) {
    std::vector<float> p;
    ZERO_RETURN_IF_ERROR(ReadParam(e, rk.device, i, &p));
    ZERO_RETURN_IF_ERROR(at("grad " + std::to_string(i)));
    ZERO_RETURN_IF_ERROR(WriteGrad(e, rk.device, i, Gradient(i, p, rk.rank, step, e->gradient_scale())));
  }
  held.clear();
  ZERO_RETURN_IF_ERROR(at("backward"));
  ZERO_RETURN_IF_ERROR(e->Backward());
  ZERO_RETURN_IF_ERROR(at("step"));
  return e->Step();
}

// The checks every case makes: rank kBad returned `own` (its own error); every other rank failed
// within kPromptSeconds of the fault with kUnavailable naming rank kBad and `own`.
void ExpectEveryRankStopped(const Outcome& out, const std::string& own) {
  ASSERT_EQ(out.status.size(), static_cast<size_t>(kWorld));
  for (int r = 0; r < kWorld; ++r) {
    std::printf("rank %d returned %.3f s after the fault: %s\n", r, out.seconds_after_fault[r],
                out.status[r].ToString().c_str());
  }
  EXPECT_FALSE(out.status[kBad].ok());
  EXPECT_NE(out.status[kBad].message().find(own), std::string::npos) << out.status[kBad].ToString();
  EXPECT_EQ(out.status[kBad].message().find("rank " + std::to_string(kBad) + " failed"), std::string::npos)
      << "rank " << kBad << " must return its own error: " << out.status[kBad].ToString();
  for (int r = 0; r < kWorld; ++r) {
    if (r == kBad) continue;
    const Status& s = out.status[r];
    ASSERT_FALSE(s.ok()) << "rank " << r;
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << "rank " << r << ": " << s.ToString();
    EXPECT_NE(s.message().find("rank " + std::to_string(kBad) + " failed"), std::string::npos)
        << "rank " << r << ": " << s.ToString();
    EXPECT_NE(s.message().find(own), std::string::npos) << "rank " << r << ": " << s.ToString();
    EXPECT_GE(out.seconds_after_fault[r], 0.0) << "rank " << r << ": the fault was never met";
    EXPECT_LT(out.seconds_after_fault[r], kPromptSeconds)
        << "rank " << r << " waited " << out.seconds_after_fault[r] << " s (the communicator's timeout is "
        << kCommTimeout.count() / 1000 << " s): " << s.ToString();
  }
}

// Arms `op` of rank kBad's device to fail from its next call on, with `message`.
void Arm(Rank& rk, const std::string& op, const std::string& message) {
  rk.device->FailNthCall(op, rk.device->call_count(op) + 1, /*persistent=*/true, InternalError(message));
}

std::string Stage3(const std::string& more = "") {
  return ConfigJson(3, 1, 0.0, "", "\"stage3_param_persistence_threshold\": 0" + more);
}

class FaultPropagationTest : public ::testing::TestWithParam<int> {};

// The user's forward fails on rank 1 in the second step, after its first gather; rank 1 reports it
// (Engine::ReportFault) and returns. The others wait in their next collective: the next gather
// (stage 3) or the gradient reduction (stages 1/2).
TEST_P(FaultPropagationTest, UserForwardErrorReportedThroughTheEngine) {
  const int stage = GetParam();
  const std::string own = "the user's forward failed: loss is NaN in block m1";
  Outcome out = RunRanks([&](Rank& rk) -> Status {
    ZERO_RETURN_IF_ERROR(MakeEngine(rk, stage == 3 ? Stage3() : ConfigJson(stage, 1, 0.0)));
    ZERO_RETURN_IF_ERROR(TrainStep(rk, 0));
    return TrainStep(rk, 1, [&](const std::string& where) -> Status {
      if (rk.rank != kBad || where != "gather m1") return OkStatus();
      rk.fault_now();
      return (*rk.engine)->ReportFault(InternalError(own));
    });
  });
  ExpectEveryRankStopped(out, own);
}

INSTANTIATE_TEST_SUITE_P(Stages, FaultPropagationTest, ::testing::Values(1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& i) { return "stage" + std::to_string(i.param); });

// Stage 1: GradReady adds the gradient into the local fp32 accumulator; on rank 1 that fails.
// The others wait in the boundary reduction of Backward().
TEST(FaultPropagation, GradientAccumulationFailsInGradReady) {
  const std::string own = "injected: accumulating a gradient failed on this device";
  Outcome out = RunRanks([&](Rank& rk) -> Status {
    ZERO_RETURN_IF_ERROR(MakeEngine(rk, ConfigJson(1, 1, 0.0)));
    ZERO_RETURN_IF_ERROR(TrainStep(rk, 0));
    return TrainStep(rk, 1, [&](const std::string& where) -> Status {
      if (rk.rank == kBad && where == "grad 3") {
        Arm(rk, "AccumulateFirst", own);
        Arm(rk, "Accumulate", own);
        rk.fault_now();
      }
      return OkStatus();
    });
  });
  ExpectEveryRankStopped(out, own);
}

// Stage 2 without offload (no agreement on the update): rank 1's AdamW fails in Step(); the others
// wait in the all-gather of the new weights.
TEST(FaultPropagation, OptimizerUpdateFailsInStepWithoutOffload) {
  const std::string own = "injected: AdamW failed on this device";
  Outcome out = RunRanks([&](Rank& rk) -> Status {
    ZERO_RETURN_IF_ERROR(MakeEngine(rk, ConfigJson(2, 1, 0.0)));
    ZERO_RETURN_IF_ERROR(TrainStep(rk, 0));
    return TrainStep(rk, 1, [&](const std::string& where) -> Status {
      if (rk.rank == kBad && where == "step") {
        Arm(rk, "AdamWCast", own);
        Arm(rk, "AdamW", own);
        rk.fault_now();
      }
      return OkStatus();
    });
  });
  ExpectEveryRankStopped(out, own);
}

// Stage 3 with offload_param "cpu": the upload of rank 1's host shards inside GatherModule fails;
// the others wait in the gather's all-gather.
TEST(FaultPropagation, ParameterUploadFailsInsideAStage3Gather) {
  const std::string own = "injected: uploading a parameter shard failed";
  Outcome out = RunRanks([&](Rank& rk) -> Status {
    ZERO_RETURN_IF_ERROR(MakeEngine(rk, Stage3(", \"offload_param\": {\"device\": \"cpu\"}")));
    ZERO_RETURN_IF_ERROR(TrainStep(rk, 0));
    return TrainStep(rk, 1, [&](const std::string& where) -> Status {
      if (rk.rank == kBad && where == "gather m1") {
        Arm(rk, "Copy", own);
        rk.fault_now();
      }
      return OkStatus();
    });
  });
  ExpectEveryRankStopped(out, own);
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// A checkpoint is saved ("good"); a step later, rank 1's read of its states for the next save
// ("bad") fails before the save's first collective. The others fail promptly in the save, and
// nothing was published: `latest` still names "good" and there is no "bad".
TEST(FaultPropagation, StateReadFailsInSaveCheckpointAndNothingIsPublished) {
  const std::string own = "injected: reading the optimizer states failed";
  ASSERT_OK_AND_ASSIGN(ScratchDir scratch, ScratchDir::Create("fault_propagation_save"));
  const std::string dir = scratch.path();
  Outcome out = RunRanks([&](Rank& rk) -> Status {
    ZERO_RETURN_IF_ERROR(MakeEngine(rk, ConfigJson(1, 1, 0.0)));
    ZERO_RETURN_IF_ERROR(TrainStep(rk, 0));
    ZERO_RETURN_IF_ERROR((*rk.engine)->SaveCheckpoint(dir, "good"));
    ZERO_RETURN_IF_ERROR(TrainStep(rk, 1));
    if (rk.rank == kBad) {
      Arm(rk, "Copy", own);
      rk.fault_now();
    }
    return (*rk.engine)->SaveCheckpoint(dir, "bad");
  });
  ExpectEveryRankStopped(out, own);
  EXPECT_EQ(ReadFile(dir + "/latest"), "good");
  EXPECT_TRUE(std::filesystem::exists(dir + "/good"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/bad"));
}

// Every rank loads a checkpoint it saved; rank 1's install of the loaded state fails. The others
// wait in the all-gather of the loaded weights (stage 2).
TEST(FaultPropagation, InstallFailsInLoadCheckpoint) {
  const std::string own = "injected: writing the loaded state failed";
  ASSERT_OK_AND_ASSIGN(ScratchDir scratch, ScratchDir::Create("fault_propagation_load"));
  const std::string dir = scratch.path();
  Outcome out = RunRanks([&](Rank& rk) -> Status {
    ZERO_RETURN_IF_ERROR(MakeEngine(rk, ConfigJson(2, 1, 0.0)));
    ZERO_RETURN_IF_ERROR(TrainStep(rk, 0));
    ZERO_RETURN_IF_ERROR((*rk.engine)->SaveCheckpoint(dir, "ck"));
    ZERO_RETURN_IF_ERROR(TrainStep(rk, 1));
    if (rk.rank == kBad) {
      Arm(rk, "Copy", own);
      Arm(rk, "Cast", own);
      rk.fault_now();
    }
    return (*rk.engine)->LoadCheckpoint(dir, "ck").status();
  });
  ExpectEveryRankStopped(out, own);
}

}  // namespace
}  // namespace zero
