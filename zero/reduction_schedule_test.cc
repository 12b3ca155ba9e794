// ReductionSchedule over real Gloo ranks (threads): decisions are the same on every rank whatever
// each reports, replayed micro steps issue no collective, a departure re-records, and a report
// after its module's completion is refused.
#include "zero/reduction_schedule.h"

#include <gtest/gtest.h>

#include <mutex>
#include <vector>

#include "comm/thread_ranks.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

// Modules 0 (body), 1 (head_a), 2 (head_b): forward 0,1,2 then backward 2,1,0, each gathered and
// released once per pass; rank r reports modules `reports[r]` during their backward use.
struct Pass {
  std::vector<std::vector<int>> completed_at;  // per backward gather anchor, then Backward()
};

Status RunMicroStep(ReductionSchedule* s, const std::vector<int>& reports, bool late, Pass* out) {
  auto reported = [&](int m) {
    for (int r : reports) {
      if (r == m) return true;
    }
    return false;
  };
  for (int m : {0, 1, 2}) {  // forward
    ZERO_ASSIGN_OR_RETURN(auto c, s->AtGather(m));
    out->completed_at.push_back(c);
    s->Released(m, 0);
  }
  for (int m : {2, 1, 0}) {  // backward
    ZERO_ASSIGN_OR_RETURN(auto c, s->AtGather(m));
    out->completed_at.push_back(c);
    if (!late && reported(m) && !s->Reported(m)) {
      return FailedPreconditionError("module " + std::to_string(m) + " reported after completion");
    }
    s->Released(m, 0);
  }
  if (late) {
    for (int m : reports) {
      if (!s->Reported(m)) return FailedPreconditionError("module " + std::to_string(m) + " reported after completion");
    }
  }
  ZERO_ASSIGN_OR_RETURN(auto c, s->AtBackward());
  out->completed_at.push_back(c);
  return OkStatus();
}

TEST(ReductionScheduleTest, SameDecisionsOnEveryRankAndReplayWithoutCollectives) {
  constexpr int kWorld = 3;
  // Rank 0 uses head_a, rank 1 head_b, rank 2 both; every rank reports body.
  const std::vector<std::vector<int>> reports = {{1, 0}, {2, 0}, {2, 1, 0}};
  std::mutex mu;
  std::vector<std::vector<Pass>> passes(kWorld);
  std::vector<ReductionScheduleStats> stats(kWorld);
  Status st = RunThreadRanks(kWorld, [&](int rank, Communicator* comm, Device*) -> Status {
    ReductionSchedule s(comm, 3);
    std::vector<Pass> mine(3);
    for (Pass& p : mine) ZERO_RETURN_IF_ERROR(RunMicroStep(&s, reports[rank], false, &p));
    std::lock_guard<std::mutex> l(mu);
    passes[rank] = mine;
    stats[rank] = s.stats();
    return OkStatus();
  });
  ASSERT_OK(st);
  // Anchors: 6 gathers then Backward(). head_b completes at the gather of head_a, head_a at the gather
  // of body, body (no gather after it) at Backward().
  const std::vector<std::vector<int>> expected = {{}, {}, {}, {}, {2}, {1}, {0}};
  for (int r = 0; r < kWorld; ++r) {
    for (int k = 0; k < 3; ++k) EXPECT_EQ(passes[r][k].completed_at, expected) << "rank " << r << " micro " << k;
    // Recording: the forward's releases are candidates at gathers 1-5 (flags all 0 in the forward),
    // plus Backward(); replays issue only Backward()'s all-reduce.
    EXPECT_EQ(stats[r].recorded_anchors, 6);
    EXPECT_EQ(stats[r].replayed_anchors, 12);
    EXPECT_EQ(stats[r].host_allreduces, 5 + 1 + 2 * 1) << "rank " << r;
  }
}

TEST(ReductionScheduleTest, ModulesNoRankReportedAreNotReduced) {
  Status st = RunThreadRanks(2, [&](int rank, Communicator* comm, Device*) -> Status {
    ReductionSchedule s(comm, 3);
    Pass p;
    ZERO_RETURN_IF_ERROR(RunMicroStep(&s, {0}, false, &p));
    const std::vector<std::vector<int>> expected = {{}, {}, {}, {}, {}, {}, {0}};
    if (p.completed_at != expected) return InternalError("rank " + std::to_string(rank) + ": unexpected decisions");
    return OkStatus();
  });
  ASSERT_OK(st);
}

TEST(ReductionScheduleTest, EveryRankReportingLateCompletesAtBackward) {
  Status st = RunThreadRanks(2, [&](int rank, Communicator* comm, Device*) -> Status {
    ReductionSchedule s(comm, 3);
    for (int k = 0; k < 2; ++k) {
      Pass p;
      ZERO_RETURN_IF_ERROR(RunMicroStep(&s, {0, 1, 2}, true, &p));
      const std::vector<std::vector<int>> expected = {{}, {}, {}, {}, {}, {}, {0, 1, 2}};
      if (p.completed_at != expected) return InternalError("rank " + std::to_string(rank) + ": unexpected decisions");
    }
    return OkStatus();
  });
  ASSERT_OK(st);
}

TEST(ReductionScheduleTest, ReportAfterAnotherRankCompletedTheModuleFailsEveryRank) {
  // Rank 0 reports head_b during its backward use; rank 1 only after all gathers: head_b completed at
  // the gather of head_a, so rank 1's report comes too late. Both ranks fail at AtBackward (no rank
  // is left waiting), naming rank 1.
  std::vector<Status> results(2);
  std::vector<bool> refused(2, false);
  Status st = RunThreadRanks(2, [&](int rank, Communicator* comm, Device*) -> Status {
    ReductionSchedule s(comm, 3);
    const int order[] = {0, 1, 2, 2, 1, 0};  // forward, then backward
    for (int k = 0; k < 6; ++k) {
      ZERO_RETURN_IF_ERROR(s.AtGather(order[k]).status());
      if (rank == 0 && k == 3 && !s.Reported(2)) return InternalError("rank 0 refused");
      s.Released(order[k], 0);
    }
    if (rank == 1) refused[1] = !s.Reported(2);
    results[rank] = s.AtBackward().status();
    return OkStatus();
  });
  ASSERT_OK(st);
  EXPECT_TRUE(refused[1]);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].code(), StatusCode::kFailedPrecondition) << results[r].ToString();
    EXPECT_NE(results[r].message().find("rank 1 reported a gradient after its module"), std::string::npos)
        << results[r].ToString();
  }
}

TEST(ReductionScheduleTest, DepartureFromTheRecordReRecords) {
  Status st = RunThreadRanks(2, [&](int rank, Communicator* comm, Device*) -> Status {
    ReductionSchedule s(comm, 3);
    Pass p0, p1, p2;
    ZERO_RETURN_IF_ERROR(RunMicroStep(&s, {0, 1, 2}, false, &p0));
    // A micro step that skips head_a: the anchors depart at the second gather.
    for (int m : {0, 2}) {
      ZERO_RETURN_IF_ERROR(s.AtGather(m).status());
      s.Released(m, 0);
    }
    for (int m : {2, 0}) {
      ZERO_ASSIGN_OR_RETURN(auto c, s.AtGather(m));
      p1.completed_at.push_back(c);
      if (!s.Reported(m)) return InternalError("refused");
      s.Released(m, 0);
    }
    ZERO_ASSIGN_OR_RETURN(auto c, s.AtBackward());
    p1.completed_at.push_back(c);
    const std::vector<std::vector<int>> expected1 = {{}, {2}, {0}};
    if (p1.completed_at != expected1) return InternalError("rank " + std::to_string(rank) + ": skip step decisions");
    const int64_t recorded = s.stats().recorded_anchors;
    ZERO_RETURN_IF_ERROR(RunMicroStep(&s, {0, 1, 2}, false, &p2));
    if (p2.completed_at != p0.completed_at) return InternalError("rank " + std::to_string(rank) + ": re-recorded step");
    if (s.stats().recorded_anchors == recorded) return InternalError("the departed step was not re-recorded");
    return OkStatus();
  });
  ASSERT_OK(st);
}

}  // namespace
}  // namespace zero
