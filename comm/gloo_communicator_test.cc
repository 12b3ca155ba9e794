#include "comm/gloo_communicator.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gloo/rendezvous/hash_store.h>

#include "comm/comm_test_util.h"
#include "comm/thread_ranks.h"
#include "runtime/cpu_device.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

using testing::FirstMismatch;
using testing::MakeInput;
using testing::ReferenceReduce;
using Clock = std::chrono::steady_clock;

constexpr DType kDTypes[] = {DType::kF32, DType::kBF16, DType::kF16};
constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax};

CommOptions Timeout(int ms) {
  CommOptions o;
  o.timeout = std::chrono::milliseconds(ms);
  return o;
}

std::string Case(DType t, ReduceOp op, size_t n) {
  return std::string(DTypeName(t)) + "/" + ReduceOpName(op) + "/n=" + std::to_string(n);
}

class GlooWorldTest : public ::testing::TestWithParam<int> {};

// Every dtype x op x count, all issued before any is waited (many in flight), waited in order,
// compared bitwise with the sequential rank-order fp32 reference.
TEST_P(GlooWorldTest, AllReduceMatchesRankOrderReferenceBitwise) {
  const int n_ranks = GetParam();
  const size_t counts[] = {1, 7, 4099, 1000003};
  Status s = RunThreadRanks(n_ranks, [&](int rank, Communicator* comm, Device*) -> Status {
    struct Case_ {
      DType t;
      ReduceOp op;
      size_t n;
      uint32_t seed;
      std::vector<uint8_t> buf;
      std::unique_ptr<Work> work;
    };
    std::vector<Case_> cases;
    uint32_t seed = 1;
    for (DType t : kDTypes) {
      for (ReduceOp op : kOps) {
        for (size_t n : counts) {
          cases.push_back({t, op, n, seed, MakeInput(t, n, rank, seed), nullptr});
          ++seed;
        }
      }
    }
    for (auto& c : cases) {
      auto w = comm->AllReduce(c.buf.data(), c.n, c.t, c.op);
      RANK_EXPECT_OK(w.status());
      c.work = std::move(w).value();
    }
    for (auto& c : cases) {
      RANK_EXPECT_OK(c.work->Wait());
      RANK_CHECK(c.work->IsCompleted(), "IsCompleted after Wait");
      std::vector<uint8_t> want(c.n * SizeOf(c.t));
      ReferenceReduce(c.t, 0, c.n, n_ranks, c.op, c.seed, want.data());
      long bad = FirstMismatch(c.buf.data(), want.data(), c.n, c.t);
      RANK_CHECK(bad < 0, Case(c.t, c.op, c.n) + " differs at " + std::to_string(bad) + ": got " +
                              std::to_string(LoadAsFloat(c.buf.data(), c.t, bad)) + " want " +
                              std::to_string(LoadAsFloat(want.data(), c.t, bad)));
    }
    return OkStatus();
  });
  EXPECT_OK(s);
}

TEST_P(GlooWorldTest, ReduceScatterMatchesReferenceBitwise) {
  const int n_ranks = GetParam();
  const size_t counts[] = {1, 7, 250001};
  Status s = RunThreadRanks(n_ranks, [&](int rank, Communicator* comm, Device*) -> Status {
    uint32_t seed = 100;
    for (DType t : kDTypes) {
      for (ReduceOp op : kOps) {
        for (size_t n : counts) {
          ++seed;
          auto send = MakeInput(t, n * n_ranks, rank, seed);
          std::vector<uint8_t> recv(n * SizeOf(t), 0xee);
          auto w = comm->ReduceScatter(send.data(), recv.data(), n, t, op);
          RANK_EXPECT_OK(w.status());
          RANK_EXPECT_OK((*w)->Wait());
          std::vector<uint8_t> want(n * SizeOf(t));
          ReferenceReduce(t, rank * n, n, n_ranks, op, seed, want.data());
          long bad = FirstMismatch(recv.data(), want.data(), n, t);
          RANK_CHECK(bad < 0, Case(t, op, n) + " differs at " + std::to_string(bad));
        }
      }
    }
    return OkStatus();
  });
  EXPECT_OK(s);
}

TEST_P(GlooWorldTest, AllGatherOutOfPlaceAndInPlace) {
  const int n_ranks = GetParam();
  Status s = RunThreadRanks(n_ranks, [&](int rank, Communicator* comm, Device*) -> Status {
    uint32_t seed = 200;
    for (DType t : kDTypes) {
      for (size_t n : {size_t{1}, size_t{7}, size_t{100003}}) {
        ++seed;
        const size_t es = SizeOf(t);
        std::vector<uint8_t> want(n * n_ranks * es);
        for (int r = 0; r < n_ranks; ++r) {
          auto part = MakeInput(t, n, r, seed);
          std::memcpy(want.data() + r * n * es, part.data(), part.size());
        }
        // Out of place.
        auto send = MakeInput(t, n, rank, seed);
        std::vector<uint8_t> recv(n * n_ranks * es, 0xee);
        auto w = comm->AllGather(send.data(), recv.data(), n, t);
        RANK_EXPECT_OK(w.status());
        RANK_EXPECT_OK((*w)->Wait());
        RANK_CHECK(FirstMismatch(recv.data(), want.data(), n * n_ranks, t) < 0, "out of place");
        // In place: send aliases recv + rank * n.
        std::vector<uint8_t> inplace(n * n_ranks * es, 0xee);
        std::memcpy(inplace.data() + rank * n * es, send.data(), send.size());
        auto w2 = comm->AllGather(inplace.data() + rank * n * es, inplace.data(), n, t);
        RANK_EXPECT_OK(w2.status());
        RANK_EXPECT_OK((*w2)->Wait());
        RANK_CHECK(FirstMismatch(inplace.data(), want.data(), n * n_ranks, t) < 0, "in place");
      }
    }
    return OkStatus();
  });
  EXPECT_OK(s);
}

TEST_P(GlooWorldTest, BroadcastFromEveryRoot) {
  const int n_ranks = GetParam();
  Status s = RunThreadRanks(n_ranks, [&](int rank, Communicator* comm, Device*) -> Status {
    uint32_t seed = 300;
    for (int root = 0; root < n_ranks; ++root) {
      for (DType t : {DType::kF32, DType::kBF16}) {
        // 300007 fp32 elements take the scatter + all-gather path.
        for (size_t n : {size_t{1}, size_t{7}, size_t{300007}}) {
          ++seed;
          auto want = MakeInput(t, n, root, seed);
          auto buf = rank == root ? want : std::vector<uint8_t>(want.size(), 0xee);
          auto w = comm->Broadcast(buf.data(), n, t, root);
          RANK_EXPECT_OK(w.status());
          RANK_EXPECT_OK((*w)->Wait());
          RANK_CHECK(buf == want, "root " + std::to_string(root) + " n=" + std::to_string(n));
        }
      }
      std::string text = rank == root ? "hello from root " + std::to_string(root) : std::string(18, '?');
      text.resize(18, ' ');
      RANK_EXPECT_OK(comm->BroadcastHost(text.data(), text.size(), root));
      std::string want = "hello from root " + std::to_string(root);
      want.resize(18, ' ');
      RANK_CHECK(text == want, text);
    }
    return OkStatus();
  });
  EXPECT_OK(s);
}

TEST_P(GlooWorldTest, BarrierAndAllReduceHost) {
  const int n_ranks = GetParam();
  Status s = RunThreadRanks(n_ranks, [&](int rank, Communicator* comm, Device*) -> Status {
    for (int i = 0; i < 5; ++i) RANK_EXPECT_OK(comm->Barrier());
    // Values whose double sum depends on order: rank-order sum must be reproduced exactly.
    auto value = [](int r, int i) { return (r % 2 ? 1e16 : 1.0) * (i + 1) + 0.1 * r; };
    for (ReduceOp op : kOps) {
      double v[3];
      for (int i = 0; i < 3; ++i) v[i] = value(rank, i);
      RANK_EXPECT_OK(comm->AllReduceHost(v, 3, op));
      for (int i = 0; i < 3; ++i) {
        double want = value(0, i);
        for (int r = 1; r < n_ranks; ++r) {
          double x = value(r, i);
          if (op == ReduceOp::kMax) {
            if (x > want) want = x;
          } else {
            want += x;
          }
        }
        if (op == ReduceOp::kAvg) want /= n_ranks;
        RANK_CHECK(v[i] == want, std::string(ReduceOpName(op)) + " element " + std::to_string(i));
      }
    }
    return OkStatus();
  });
  EXPECT_OK(s);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GlooWorldTest, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) { return "N" + std::to_string(info.param); });

TEST(GlooCommunicatorTest, ZeroCountsAndBadArguments) {
  Status s = RunThreadRanks(2, [&](int rank, Communicator* comm, Device*) -> Status {
    auto w = comm->AllReduce(nullptr, 0, DType::kF32, ReduceOp::kSum);
    RANK_EXPECT_OK(w.status());
    RANK_EXPECT_OK((*w)->Wait());
    float x[8] = {};
    auto bad_root = comm->Broadcast(x, 8, DType::kF32, 2);
    RANK_CHECK(!bad_root.ok() && bad_root.status().code() == StatusCode::kInvalidArgument,
               bad_root.status().ToString());
    auto overlap = comm->ReduceScatter(x, x + 1, 2, DType::kF32, ReduceOp::kSum);
    RANK_CHECK(!overlap.ok() && overlap.status().code() == StatusCode::kInvalidArgument, overlap.status().ToString());
    RANK_CHECK(comm->backend() == "gloo", comm->backend());
    RANK_CHECK(comm->world_size() == 2 && comm->rank() == rank, "rank/world_size");
    return comm->Barrier();
  });
  EXPECT_OK(s);
}

TEST(GlooCommunicatorTest, RejectsNonHostDevice) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  auto r = GlooCommunicator::Create(0, 1, store, nullptr);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

// Setup must be cheap: the equivalence suite runs hundreds of small worlds.
TEST(GlooCommunicatorTest, ThreadRanksSetupIsFast) {
  constexpr int kRuns = 20;
  auto start = Clock::now();
  for (int i = 0; i < kRuns; ++i) {
    Status s = RunThreadRanks(4, [](int, Communicator* comm, Device*) { return comm->Barrier(); });
    ASSERT_OK(s);
  }
  double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count() / kRuns;
  std::printf("RunThreadRanks(4) with one barrier: %.1f ms per run\n", ms);
  EXPECT_LT(ms, 250.0);
}

// (a) A rank that never joins the rendezvous: the others fail within the timeout, naming it.
TEST(GlooFaultTest, MissingRankAtRendezvousTimesOut) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  CpuDevice dev0, dev1;
  GlooOptions options;
  options.comm = Timeout(2000);
  Status st[2];
  auto start = Clock::now();
  std::thread t1([&] { st[1] = GlooCommunicator::Create(1, 3, store, &dev1, options).status(); });
  st[0] = GlooCommunicator::Create(0, 3, store, &dev0, options).status();
  t1.join();
  double secs = std::chrono::duration<double>(Clock::now() - start).count();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r].code(), StatusCode::kDeadlineExceeded) << st[r].ToString();
    EXPECT_NE(st[r].message().find("rank 2 did not join"), std::string::npos) << st[r].ToString();
  }
  EXPECT_LT(secs, 5.0);
}

// A rank that joined but never issues the collective: the others' collective fails within the
// timeout naming it, and every later call fails fast.
TEST(GlooFaultTest, SilentRankTimesOutAndLaterCallsFailFast) {
  std::atomic<int> checked{0};
  auto start = Clock::now();
  Status s = RunThreadRanks(
      3,
      [&](int rank, Communicator* comm, Device*) -> Status {
        if (rank == 2) {
          // Stays alive (its connections open) but takes no part, past the others' timeout.
          std::this_thread::sleep_for(std::chrono::milliseconds(3500));
          return OkStatus();
        }
        std::vector<float> x(1000, 1.0f);
        auto w = comm->AllReduce(x.data(), x.size(), DType::kF32, ReduceOp::kSum);
        RANK_EXPECT_OK(w.status());
        Status ws = (*w)->Wait();
        RANK_CHECK(!ws.ok(), "collective with a silent rank succeeded");
        RANK_CHECK(ws.code() == StatusCode::kDeadlineExceeded || ws.code() == StatusCode::kUnavailable, ws.ToString());
        RANK_CHECK(ws.message().find("rank 2") != std::string::npos ||
                       ws.message().find("rank " + std::to_string(1 - rank)) != std::string::npos,
                   ws.ToString());
        auto t0 = Clock::now();
        Status again = comm->Barrier();
        RANK_CHECK(!again.ok(), "call after failure succeeded");
        RANK_CHECK(Clock::now() - t0 < std::chrono::milliseconds(100), "did not fail fast");
        ++checked;
        return ws;  // report it: RunThreadRanks returns the first error
      },
      Timeout(2000));
  double secs = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_EQ(checked.load(), 2);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
  EXPECT_NE(s.message().find("rank 2"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("AllReduce"), std::string::npos) << s.ToString();
  EXPECT_LT(secs, 6.0);
}

// A rank whose body fails: its communicator is aborted and the others' pending collective fails
// promptly, long before their (large) timeout; the status returned is the failing rank's.
TEST(GlooFaultTest, FailingRankAbortsOthersPromptly) {
  auto start = Clock::now();
  Status s = RunThreadRanks(
      4,
      [&](int rank, Communicator* comm, Device*) -> Status {
        if (rank == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          return InternalError("injected failure");
        }
        std::vector<float> x(100000, 1.0f);
        auto w = comm->AllReduce(x.data(), x.size(), DType::kF32, ReduceOp::kSum);
        RANK_EXPECT_OK(w.status());
        return (*w)->Wait();
      },
      Timeout(60000));
  double secs = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rank 1: injected failure"), std::string::npos) << s.ToString();
  EXPECT_LT(secs, 5.0);
}

// Abort from another thread interrupts a collective in progress.
TEST(GlooFaultTest, AbortInterruptsPendingCollective) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  CpuDevice dev0, dev1;
  GlooOptions options;
  options.comm = Timeout(60000);
  std::unique_ptr<GlooCommunicator> c0, c1;
  std::thread t1([&] { c1 = std::move(GlooCommunicator::Create(1, 2, store, &dev1, options)).value(); });
  c0 = std::move(GlooCommunicator::Create(0, 2, store, &dev0, options)).value();
  t1.join();
  std::vector<float> x(10, 1.0f);
  auto w = c0->AllReduce(x.data(), x.size(), DType::kF32, ReduceOp::kSum);  // rank 1 never joins it
  ASSERT_OK(w);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto start = Clock::now();
  c0->Abort("test abort");
  Status s = (*w)->Wait();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("test abort"), std::string::npos) << s.ToString();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));
  // Rank 1 sees rank 0's connection close on its next collective.
  Status s1 = c1->Barrier();
  EXPECT_FALSE(s1.ok());
  EXPECT_EQ(s1.code(), StatusCode::kUnavailable) << s1.ToString();
}

}  // namespace
}  // namespace zero
