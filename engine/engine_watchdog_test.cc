// The Engine over a communicator whose collective hangs (FaultyCommunicator, comm/watchdog.h):
// at stages 1-3 with two Gloo thread ranks, rank 1's first gradient reduction of the second step
// never completes; its training call returns the watchdog's error (naming the collective and rank
// 1) instead of hanging, rank 0 fails too (rank 1's abort closes its connections), and on both
// ranks the engine is unusable afterwards: Backward, Step and ZeroGrad return the earlier error.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "comm/faulty_communicator.h"
#include "comm/thread_ranks.h"
#include "engine/config/config.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "runtime/status.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

using testing::MakeConfig;
using testing::MakeEngine;
using testing::SmallModel;
using testing::TrainOptions;
using testing::TrainResult;
using testing::TrainSteps;

constexpr std::chrono::milliseconds kWatchdog{300};

#define RANK_CHECK(cond, msg)                                                              \
  do {                                                                                     \
    if (!(cond)) return ::zero::InternalError(std::string(#cond ": ") + std::string(msg)); \
  } while (0)

bool Contains(const Status& s, const std::string& needle) { return s.message().find(needle) != std::string::npos; }

class EngineWatchdogTest : public ::testing::TestWithParam<int> {};

TEST_P(EngineWatchdogTest, HungReductionFailsTrainingAndLeavesTheEngineUnusable) {
  const int stage = GetParam();
  auto config = MakeConfig(testing::ConfigJson(stage, 1, 1.0), 2);
  ASSERT_OK(config);
  const testing::TestModel model = SmallModel();
  CommOptions gloo_options;
  gloo_options.timeout = std::chrono::milliseconds(60000);  // so the errors below are the watchdog's
  Status s = RunThreadRanks(
      2,
      [&](int rank, Communicator* gloo, Device* device) -> Status {
        FaultyCommunicator comm(gloo, kWatchdog);
        ZERO_ASSIGN_OR_RETURN(auto engine, MakeEngine(*config, model, device, &comm));
        TrainResult out;
        TrainOptions one;
        one.steps = 1;
        ZERO_RETURN_IF_ERROR(TrainSteps(engine.get(), device, model, rank, one, &out).WithContext("step 1"));

        // Step 2: on rank 1 the next gradient reduction (AllReduce or ReduceScatter, whichever the
        // stage issues first) hangs, and so does every collective after it.

        if (rank == 1) {
          comm.InjectAtOp("AllReduce", comm.calls("AllReduce") + 1, FaultyCommunicator::Fault::kHang);
          comm.InjectAtOp("ReduceScatter", comm.calls("ReduceScatter") + 1, FaultyCommunicator::Fault::kHang);
        }
        Status failed = TrainSteps(engine.get(), device, model, rank, one, &out);
        RANK_CHECK(!failed.ok(), "step 2 succeeded although rank 1's reduction never completed");
        if (rank == 1) {
          std::fprintf(stderr, "stage %d, rank 1, step 2: %s\n", stage, failed.ToString().c_str());
          RANK_CHECK(failed.code() == StatusCode::kDeadlineExceeded, failed.ToString());
          RANK_CHECK(Contains(failed, "faulty(gloo) rank 1 of 2: collective #"), failed.ToString());
          RANK_CHECK(Contains(failed, "did not complete within 300 ms"), failed.ToString());
          RANK_CHECK(Contains(failed, " x fp32"), failed.ToString());
          RANK_CHECK(Contains(failed, "AllReduce (") || Contains(failed, "ReduceScatter ("), failed.ToString());
          RANK_CHECK(comm.CheckHealth().code() == StatusCode::kDeadlineExceeded, comm.CheckHealth().ToString());
        }
        // Unusable: every training call returns the earlier error, on both ranks.
        for (const auto& [call, status] : {std::pair<std::string, Status>{"Backward", engine->Backward()},
                                           {"Step", engine->Step()},
                                           {"ZeroGrad", engine->ZeroGrad()}}) {
          RANK_CHECK(!status.ok(), call + " succeeded on an engine whose communicator failed");
          RANK_CHECK(Contains(status, "unusable"), call + ": " + status.ToString());
          if (rank == 1) RANK_CHECK(Contains(status, "did not complete within"), call + ": " + status.ToString());
        }
        RANK_CHECK(!comm.CheckHealth().ok(), "the communicator still reports healthy");

        return OkStatus();
      },
      gloo_options);
  EXPECT_OK(s) << "stage " << stage;
}

INSTANTIATE_TEST_SUITE_P(Stages, EngineWatchdogTest, ::testing::Values(1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& i) { return "Stage" + std::to_string(i.param); });

}  // namespace
}  // namespace zero
