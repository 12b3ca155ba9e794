// Ranks as separate processes on loopback: starts comm_worker once per rank with RANK,
// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT and ZERO_COMM_TIMEOUT_MS set, rendezvous
// through the TcpStore hosted by rank 0, and checks every process's verdict and exit status.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <string>
#include <vector>

#include "comm/worker_launcher.h"

namespace zero {
namespace {

using Clock = std::chrono::steady_clock;
using testing::AllRanks;
using testing::RunWorld;

class MultiProcessTest : public ::testing::TestWithParam<int> {};

TEST_P(MultiProcessTest, MixOfCollectivesThroughTcpStore) {
  const int n = GetParam();
  auto start = Clock::now();
  auto results = RunWorld(n, AllRanks(n), {"--backend=gloo", "--scenario=mix"}, 20000, std::chrono::seconds(60));
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, 0) << "rank " << r.rank << ":\n" << r.output;
    EXPECT_NE(r.output.find("PASS"), std::string::npos) << r.output;
  }
  std::printf("%d processes: %.0f ms\n", n, std::chrono::duration<double, std::milli>(Clock::now() - start).count());
}

// World size 1 as a process: the rendezvous and every collective degenerate correctly.
TEST(MultiProcessSingleRankTest, MixOfCollectives) {
  auto results = RunWorld(1, AllRanks(1), {"--backend=gloo", "--scenario=mix"}, 20000, std::chrono::seconds(60));
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].exit_code, 0) << results[0].output;
  EXPECT_NE(results[0].output.find("PASS"), std::string::npos) << results[0].output;
}

// (b) A process rank SIGKILLed after the first barrier, before the next collective: the others
// fail within the timeout (2 s here) naming it, and fail fast afterwards.
TEST_P(MultiProcessTest, KilledRankBeforeCollective) {
  const int n = GetParam();
  const int victim = n - 1;
  auto start = Clock::now();
  auto results = RunWorld(n, AllRanks(n), {"--backend=gloo", "--scenario=die=" + std::to_string(victim)}, 2000,
                          std::chrono::seconds(30));
  double secs = std::chrono::duration<double>(Clock::now() - start).count();
  for (const auto& r : results) {
    if (r.rank == victim) {
      EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.output;
    } else {
      EXPECT_EQ(r.exit_code, 0) << "rank " << r.rank << ":\n" << r.output;
    }
  }
  EXPECT_LT(secs, 10.0);
}

// The victim dies while the others are already waiting in the collective.
TEST_P(MultiProcessTest, KilledRankDuringCollective) {
  const int n = GetParam();
  const int victim = 0;  // the store's host, too
  auto results = RunWorld(n, AllRanks(n), {"--backend=gloo", "--scenario=die_during=" + std::to_string(victim)}, 2000,
                          std::chrono::seconds(30));
  for (const auto& r : results) {
    if (r.rank == victim) {
      EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.output;
    } else {
      EXPECT_EQ(r.exit_code, 0) << "rank " << r.rank << ":\n" << r.output;
    }
  }
}

// (a) for processes: the last rank never starts; the others fail at rendezvous within the
// timeout, naming it.
TEST_P(MultiProcessTest, MissingRankAtRendezvous) {
  const int n = GetParam();
  std::vector<int> ranks = AllRanks(n - 1);
  auto start = Clock::now();
  auto results = RunWorld(n, ranks, {"--backend=gloo", "--scenario=rendezvous_only"}, 2000, std::chrono::seconds(30));
  double secs = std::chrono::duration<double>(Clock::now() - start).count();
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, 1) << r.output;
    const std::string missing = "rank " + std::to_string(n - 1);
    if (r.rank == 0) {
      EXPECT_NE(r.output.find(missing + " did not join"), std::string::npos) << r.output;
      EXPECT_NE(r.output.find("DEADLINE_EXCEEDED"), std::string::npos) << r.output;
    } else {
      // Either its own deadline passed, or rank 0 (the store's host) gave up first and exited.
      EXPECT_TRUE(r.output.find(missing + " did not join") != std::string::npos ||
                  r.output.find("waiting for " + missing + " to join") != std::string::npos)
          << r.output;
    }
  }
  EXPECT_LT(secs, 8.0);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, MultiProcessTest, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) { return "N" + std::to_string(info.param); });

// Rank 0 (the store's host) never starts: the others cannot reach the store and say so.
TEST(MultiProcessStoreTest, MissingStoreHost) {
  auto results = RunWorld(2, {1}, {"--backend=gloo", "--scenario=rendezvous_only"}, 1500, std::chrono::seconds(20));
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].exit_code, 1) << results[0].output;
  EXPECT_NE(results[0].output.find("could not connect to the store hosted by rank 0"), std::string::npos)
      << results[0].output;
}

}  // namespace
}  // namespace zero
