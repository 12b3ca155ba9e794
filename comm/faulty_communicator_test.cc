// The collective watchdog (comm/watchdog.h) through FaultyCommunicator over real Gloo thread
// ranks: a collective made to hang on one rank becomes, within the watchdog's timeout, an error
// naming the collective (sequence number, op, count, dtype) and the rank; every later call returns
// the same error; the peer fails promptly instead of at its own (much longer) timeout; an injected
// completion failure is sticky the same way; and a communicator whose collectives all complete
// is left alone.
#include "comm/faulty_communicator.h"

#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm_test_util.h"
#include "comm/thread_ranks.h"
#include "comm/watchdog.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

constexpr std::chrono::milliseconds kWatchdog{300};

// Gloo's own timeout: far longer than the watchdog's, so an error within the test's run comes
// from the watchdog (or from the aborting peer closing its connections), not from Gloo's deadline.
CommOptions GlooTimeout() {
  CommOptions o;
  o.timeout = std::chrono::milliseconds(60000);
  return o;
}

Status ExpectError(const Status& s, StatusCode code, const std::vector<std::string>& needles, const std::string& what) {
  if (s.code() != code) {
    return InternalError(what + ": expected " + StatusCodeName(code) + ", got " + s.ToString());
  }
  for (const auto& n : needles) {
    if (s.message().find(n) == std::string::npos) {
      return InternalError(what + ": expected the error to contain '" + n + "', got " + s.ToString());
    }
  }
  return OkStatus();
}

bool Same(const Status& a, const Status& b) { return a.code() == b.code() && a.message() == b.message(); }

Status AllReduceOnce(Communicator* comm, std::vector<float>* buf) {
  ZERO_ASSIGN_OR_RETURN(auto w, comm->AllReduce(buf->data(), buf->size(), DType::kF32, ReduceOp::kSum));
  return w->Wait();
}

// Rank 1's third collective never completes: its Wait fails with the watchdog's error naming it;
// later calls fail with the same error; rank 0's real collective #3 fails promptly too.
TEST(FaultyCommunicatorTest, HungCollectiveBecomesStickyErrorNamingItAndTheRank) {
  Status s = RunThreadRanks(
      2,
      [](int rank, Communicator* gloo, Device*) -> Status {
        FaultyCommunicator comm(gloo, kWatchdog);
        if (rank == 1) comm.InjectAt(3, FaultyCommunicator::Fault::kHang);
        std::vector<float> buf(7, 1.0f + rank);
        ZERO_RETURN_IF_ERROR(AllReduceOnce(&comm, &buf));  // #1
        RANK_CHECK(buf[0] == 3.0f, "AllReduce #1 sum is " + std::to_string(buf[0]));
        std::vector<float> gathered(14);
        ZERO_ASSIGN_OR_RETURN(auto g, comm.AllGather(buf.data(), gathered.data(), 7, DType::kF32));  // #2
        ZERO_RETURN_IF_ERROR(g->Wait());
        ZERO_RETURN_IF_ERROR(comm.CheckHealth());

        auto w = comm.AllReduce(buf.data(), 7, DType::kF32, ReduceOp::kSum);  // #3
        ZERO_RETURN_IF_ERROR(w.status());                                     // queued: a hang is only seen by waiting
        Status waited = (*w)->Wait();
        if (rank == 0) {
          // The peer's abort closed its connections: an error now, not after Gloo's 60 s.
          RANK_CHECK(!waited.ok(), "rank 0's collective #3 succeeded although rank 1 never took part");
          return OkStatus();
        }
        ZERO_RETURN_IF_ERROR(ExpectError(
            waited, StatusCode::kDeadlineExceeded,
            {"rank 1 of 2", "collective #3 AllReduce (7 x fp32, sum)", "did not complete within 300 ms", "aborted"},
            "Wait of the hung collective"));
        RANK_CHECK((*w)->IsCompleted(), "a failed collective must count as completed");
        RANK_CHECK(Same((*w)->Wait(), waited), "a second Wait returned " + (*w)->Wait().ToString());
        RANK_CHECK(Same(comm.CheckHealth(), waited), "CheckHealth returned " + comm.CheckHealth().ToString());
        RANK_CHECK(Same((*w)->StreamWait(nullptr), waited), "StreamWait returned a different status");
        auto later = comm.AllReduce(buf.data(), 7, DType::kF32, ReduceOp::kSum);
        ZERO_RETURN_IF_ERROR(ExpectError(later.status(), StatusCode::kDeadlineExceeded,
                                         {"collective #4", "not started", "collective #3 AllReduce"},
                                         "a collective after the hang"));
        ZERO_RETURN_IF_ERROR(ExpectError(comm.Barrier(), StatusCode::kDeadlineExceeded,
                                         {"collective #3 AllReduce (7 x fp32, sum)"}, "Barrier after the hang"));
        double v = 1.0;
        ZERO_RETURN_IF_ERROR(ExpectError(comm.AllReduceHost(&v, 1, ReduceOp::kSum), StatusCode::kDeadlineExceeded,
                                         {"collective #3"}, "AllReduceHost after the hang"));
        // The wrapped communicator was aborted with the same error (its peers fail promptly). The
        // watchdog thread aborts it right after recording the error: wait (bounded) for that.
        for (int i = 0; i < 500 && gloo->CheckHealth().ok(); ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        ZERO_RETURN_IF_ERROR(ExpectError(gloo->CheckHealth(), StatusCode::kUnavailable, {"collective #3 AllReduce"},
                                         "the wrapped Gloo communicator"));
        return OkStatus();
      },
      GlooTimeout());
  EXPECT_OK(s);
}

// Several collectives in flight behind a hung one (as on one stream): the first Wait of any of
// them fails with the error of the oldest, the hung one; a host op after it fails the same way.
TEST(FaultyCommunicatorTest, CollectivesQueuedBehindAHangFailWithItsError) {
  Status s = RunThreadRanks(
      3,
      [](int rank, Communicator* gloo, Device*) -> Status {
        FaultyCommunicator comm(gloo, kWatchdog);
        if (rank == 2) comm.InjectAtOp("ReduceScatter", 1, FaultyCommunicator::Fault::kHang);
        std::vector<float> send(3 * 5, 1.0f), recv(5), all(3 * 5);
        ZERO_ASSIGN_OR_RETURN(auto a, comm.AllReduce(send.data(), send.size(), DType::kF32, ReduceOp::kSum));
        ZERO_ASSIGN_OR_RETURN(auto b, comm.ReduceScatter(send.data(), recv.data(), 5, DType::kF32, ReduceOp::kAvg));
        ZERO_ASSIGN_OR_RETURN(auto c, comm.AllGather(recv.data(), all.data(), 5, DType::kF32));
        Status sa = a->Wait();
        Status sc = c->Wait();  // waited before the hung one
        Status sb = b->Wait();
        if (rank != 2) {
          RANK_CHECK(!sc.ok() || !sb.ok(),
                     "rank " + std::to_string(rank) + ": the collectives rank 2 never ran succeeded");
          return OkStatus();
        }
        ZERO_RETURN_IF_ERROR(sa);
        ZERO_RETURN_IF_ERROR(ExpectError(sc, StatusCode::kDeadlineExceeded,
                                         {"rank 2 of 3", "collective #2 ReduceScatter (5 x fp32 per rank, avg)"},
                                         "Wait of a collective queued behind the hang"));
        RANK_CHECK(Same(sb, sc), "the hung collective's Wait returned " + sb.ToString());
        ZERO_RETURN_IF_ERROR(
            ExpectError(comm.Barrier(), StatusCode::kDeadlineExceeded, {"collective #2 ReduceScatter"}, "Barrier"));
        return OkStatus();
      },
      GlooTimeout());
  EXPECT_OK(s);
}

// A hung host operation (AllReduceHost blocks) returns the watchdog's error instead of blocking.
TEST(FaultyCommunicatorTest, HungHostOperationReturnsTheError) {
  Status s = RunThreadRanks(
      2,
      [](int rank, Communicator* gloo, Device*) -> Status {
        FaultyCommunicator comm(gloo, kWatchdog);
        if (rank == 0) comm.InjectAtOp("AllReduceHost", 2, FaultyCommunicator::Fault::kHang);
        double v[2] = {1.0, 2.0};
        ZERO_RETURN_IF_ERROR(comm.AllReduceHost(v, 2, ReduceOp::kSum));
        RANK_CHECK(v[0] == 2.0 && v[1] == 4.0, "AllReduceHost #1 gave " + std::to_string(v[0]));
        Status hung = comm.AllReduceHost(v, 2, ReduceOp::kMax);
        if (rank == 1) {
          RANK_CHECK(!hung.ok(), "rank 1's AllReduceHost succeeded without rank 0");
          return OkStatus();
        }
        return ExpectError(hung, StatusCode::kDeadlineExceeded,
                           {"rank 0 of 2", "collective #2 AllReduceHost (2 doubles, max)"}, "the hung AllReduceHost");
      },
      GlooTimeout());
  EXPECT_OK(s);
}

// kFail: the collective runs everywhere, but rank 0 sees it fail (an asynchronous error): the
// error is sticky, names the collective, and aborting makes rank 1's next collective fail.
TEST(FaultyCommunicatorTest, InjectedFailureIsStickyAndAbortsThePeers) {
  Status s = RunThreadRanks(
      2,
      [](int rank, Communicator* gloo, Device*) -> Status {
        FaultyCommunicator comm(gloo, kWatchdog);
        if (rank == 0) {
          comm.InjectAt(2, FaultyCommunicator::Fault::kFail, UnavailableError("NCCL remote error (injected)"));
        }
        std::vector<float> buf(4, 1.0f);
        ZERO_RETURN_IF_ERROR(AllReduceOnce(&comm, &buf));                               // #1
        ZERO_ASSIGN_OR_RETURN(auto w, comm.Broadcast(buf.data(), 4, DType::kBF16, 1));  // #2
        Status first = w->Wait();
        if (rank == 0) {
          ZERO_RETURN_IF_ERROR(ExpectError(
              first, StatusCode::kUnavailable,
              {"rank 0 of 2", "collective #2 Broadcast (4 x bf16 from rank 1) failed", "NCCL remote error (injected)"},
              "the failed Broadcast"));
          RANK_CHECK(Same(comm.CheckHealth(), first), "CheckHealth returned " + comm.CheckHealth().ToString());
          ZERO_RETURN_IF_ERROR(ExpectError(AllReduceOnce(&comm, &buf), StatusCode::kUnavailable,
                                           {"collective #2 Broadcast"}, "AllReduce after the failure"));
          return OkStatus();
        }
        ZERO_RETURN_IF_ERROR(first);  // rank 1 saw no fault in #2
        // Rank 0 aborted: this one cannot complete, and fails (closed connection or rank 0's abort).
        Status next = AllReduceOnce(&comm, &buf);
        RANK_CHECK(!next.ok(), "rank 1's AllReduce succeeded after rank 0 aborted");
        return OkStatus();
      },
      GlooTimeout());
  EXPECT_OK(s);
}

// The watchdog leaves a healthy communicator alone: many collectives, each completing, some waited
// long after they were issued; no error, nothing left in flight.
TEST(FaultyCommunicatorTest, CompletingCollectivesNeverTrip) {
  Status s = RunThreadRanks(
      2,
      [](int rank, Communicator* gloo, Device*) -> Status {
        FaultyCommunicator comm(gloo, kWatchdog);
        std::vector<std::vector<float>> bufs(50, std::vector<float>(33, 1.0f));
        std::vector<std::unique_ptr<Work>> works;
        for (auto& b : bufs) {
          ZERO_ASSIGN_OR_RETURN(auto w, comm.AllReduce(b.data(), b.size(), DType::kF32, ReduceOp::kSum));
          works.push_back(std::move(w));
        }
        for (auto& w : works) ZERO_RETURN_IF_ERROR(w->Wait());
        for (auto& b : bufs) RANK_CHECK(b[32] == 2.0f, "sum is " + std::to_string(b[32]));
        ZERO_RETURN_IF_ERROR(comm.Barrier());
        RANK_CHECK(comm.issued() == 51, "issued() is " + std::to_string(comm.issued()));
        return comm.CheckHealth();
      },
      GlooTimeout());
  EXPECT_OK(s);
}

// The watchdog on its own: a poll that never completes trips it once, the abort callback runs
// exactly once with the error, and Fail after that keeps the first error.
TEST(CollectiveWatchdogTest, TimeoutAbortsOnceAndKeepsTheFirstError) {
  int aborts = 0;
  Status aborted_with;
  std::mutex mu;
  CollectiveWatchdog::Options o;
  o.who = "test rank 3 of 4";
  o.timeout = std::chrono::milliseconds(300);
  o.abort = [&](const Status& e) {
    std::lock_guard<std::mutex> lock(mu);
    ++aborts;
    aborted_with = e;
  };
  CollectiveWatchdog wd(o);
  wd.Track("collective #1 AllGather (9 x fp16 per rank)", [] { return Result<bool>(true); });
  wd.Track("collective #2 AllReduce (5 x fp32, sum)", [] { return Result<bool>(false); });
  Status s = wd.AwaitFailure();
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
  EXPECT_NE(s.message().find("test rank 3 of 4: collective #2 AllReduce (5 x fp32, sum) did not complete"),
            std::string::npos)
      << s.ToString();
  EXPECT_TRUE(Same(wd.Fail(InternalError("later")), s));
  EXPECT_EQ(wd.in_flight(), 0u);
  wd.Stop();
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(aborts, 1);
  EXPECT_TRUE(Same(aborted_with, s)) << aborted_with.ToString();
}

}  // namespace
}  // namespace zero
