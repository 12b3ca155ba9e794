#include "zero/update_agreement.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "comm/thread_ranks.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

TEST(UpdateAgreementTest, ActiveIsTheUnionOverRanks) {
  const std::vector<std::vector<uint8_t>> local = {{1, 0, 0, 0}, {0, 0, 1, 0}};
  std::vector<std::vector<uint8_t>> got(2);
  ASSERT_OK(RunThreadRanks(2, [&](int rank, Communicator* comm, Device*) -> Status {
    got[rank] = local[rank];
    return AgreeOnActive(comm, &got[rank]);
  }));
  const std::vector<uint8_t> want = {1, 0, 1, 0};
  EXPECT_EQ(got[0], want);
  EXPECT_EQ(got[1], want);
}

TEST(UpdateAgreementTest, OneRankKeepsItsActiveSet) {
  std::vector<uint8_t> active = {0, 1, 1};
  ASSERT_OK(
      RunThreadRanks(1, [&](int, Communicator* comm, Device*) -> Status { return AgreeOnActive(comm, &active); }));
  EXPECT_EQ(active, (std::vector<uint8_t>{0, 1, 1}));
}

TEST(UpdateAgreementTest, DecideStep) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (bool fp16 : {false, true}) {
    for (bool stop : {false, true}) {
      EXPECT_EQ(DecideStep(2.5, fp16, stop), StepVerdict::kApply);
      EXPECT_EQ(DecideStep(0.0, fp16, stop), StepVerdict::kApply);
    }
  }
  for (double total : {inf, nan}) {
    // fp16: an overflow skips the step, whatever stop_on_nonfinite says.
    EXPECT_EQ(DecideStep(total, true, false), StepVerdict::kSkip);
    EXPECT_EQ(DecideStep(total, true, true), StepVerdict::kSkip);
    // bf16/fp32: stop_on_nonfinite stops; otherwise the step is applied (DeepSpeed would skip it).
    EXPECT_EQ(DecideStep(total, false, true), StepVerdict::kStop);
    EXPECT_EQ(DecideStep(total, false, false), StepVerdict::kApply);
  }
}

TEST(UpdateAgreementTest, OneRankReturnsTheLocalOutcomeNotAgreed) {
  ASSERT_OK(RunThreadRanks(1, [&](int, Communicator* comm, Device*) -> Status {
    AgreedStatus ok = AgreeOnUpdateOutcome(comm, OkStatus());
    EXPECT_OK(ok.status);
    EXPECT_FALSE(ok.agreed);
    AgreedStatus failed = AgreeOnUpdateOutcome(comm, InternalError("swap file: EIO"));
    EXPECT_EQ(failed.status.message(), "swap file: EIO");
    EXPECT_FALSE(failed.agreed);
    return OkStatus();
  }));
}

TEST(UpdateAgreementTest, EveryRankLearnsOfAFailedUpdate) {
  // No failure; rank 1 fails; both fail.
  const std::vector<std::vector<bool>> fails = {{false, false}, {false, true}, {true, true}};
  for (const std::vector<bool>& fail : fails) {
    std::vector<AgreedStatus> got(2);
    ASSERT_OK(RunThreadRanks(2, [&](int rank, Communicator* comm, Device*) -> Status {
      got[rank] = AgreeOnUpdateOutcome(
          comm, fail[rank] ? InternalError("rank " + std::to_string(rank) + "'s swap file: EIO") : OkStatus());
      return OkStatus();
    }));
    for (int r = 0; r < 2; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r) + ", failing: " + std::to_string(fail[0]) + std::to_string(fail[1]));
      if (!fail[0] && !fail[1]) {
        EXPECT_OK(got[r].status);
        EXPECT_FALSE(got[r].agreed);
      } else if (fail[r]) {
        EXPECT_EQ(got[r].status.message(), "rank " + std::to_string(r) + "'s swap file: EIO");
        EXPECT_TRUE(got[r].agreed);
      } else {
        EXPECT_EQ(got[r].status.code(), StatusCode::kUnavailable);
        EXPECT_EQ(got[r].status.message().rfind("rank 1 failed in the optimizer update", 0), 0u)
            << got[r].status.message();
        EXPECT_TRUE(got[r].agreed);
      }
    }
  }
}

}  // namespace
}  // namespace zero
