#include "offload/thread_pool.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

TEST(ThreadPoolTest, RunsEveryTaskExactlyOnce) {
  for (int threads : {1, 2, 5}) {
    auto pool = ThreadPool::Create(threads);
    ASSERT_OK(pool);
    EXPECT_EQ((*pool)->num_threads(), threads);
    for (size_t tasks : {0, 1, 2, 7, 1000}) {
      for (int round = 0; round < 3; ++round) {
        std::vector<std::atomic<int>> hits(tasks);
        (*pool)->ParallelFor(tasks, [&](size_t t) { hits[t].fetch_add(1); });
        for (size_t t = 0; t < tasks; ++t) {
          ASSERT_EQ(hits[t].load(), 1) << "task " << t << " of " << tasks << ", threads " << threads << ", round "
                                       << round;
        }
      }
    }
  }
}

TEST(ThreadPoolTest, UsesSeveralThreads) {
  auto pool = ThreadPool::Create(3);
  ASSERT_OK(pool);
  // Each task waits until three distinct threads have arrived: only a pool that really runs
  // tasks on three threads at once finishes (a serial one would hang, and the test time out).
  std::atomic<int> arrived{0};
  (*pool)->ParallelFor(3, [&](size_t) {
    arrived.fetch_add(1);
    while (arrived.load() < 3) std::this_thread::yield();
  });
  EXPECT_EQ(arrived.load(), 3);
}

TEST(ThreadPoolTest, ConcurrentCallersEachGetTheirWholeLoop) {
  auto pool = ThreadPool::Create(4);
  ASSERT_OK(pool);
  // Two callers share the pool; each loop must run all of its own tasks and none of the other's.
  auto caller = [&](long* result) {
    long total = 0;
    for (int r = 0; r < 50; ++r) {
      std::atomic<long> sum{0};
      (*pool)->ParallelFor(64, [&](size_t t) { sum.fetch_add(static_cast<long>(t) + 1); });
      total += sum.load();
    }
    *result = total;
  };
  long ra = 0, rb = 0;
  std::thread a(caller, &ra), b(caller, &rb);
  a.join();
  b.join();
  EXPECT_EQ(ra, 50L * (64 * 65 / 2));
  EXPECT_EQ(rb, 50L * (64 * 65 / 2));
}

TEST(ThreadPoolTest, ZeroMeansHardwareThreadsAndNegativeIsAnError) {
  auto pool = ThreadPool::Create(0);
  ASSERT_OK(pool);
  unsigned hw = std::thread::hardware_concurrency();
  EXPECT_EQ((*pool)->num_threads(), hw == 0 ? 1 : static_cast<int>(hw));
  auto bad = ThreadPool::Create(-2);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("-2"), std::string::npos) << bad.status().ToString();
}

}  // namespace
}  // namespace zero
