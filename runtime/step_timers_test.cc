// StepTimers with a fake clock: window means, the DeepSpeed breakdown line, Add, Reset, misuse.
#include "runtime/step_timers.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "testing/status_matchers.h"

namespace zero {
namespace {

struct FakeClock {
  int64_t now = 0;
  std::function<int64_t()> fn() {
    return [this] { return now; };
  }
};

Status Timed(StepTimers& t, FakeClock& c, const std::string& name, int64_t ns) {
  ZERO_RETURN_IF_ERROR(t.Start(name));
  c.now += ns;
  return t.Stop(name);
}

TEST(StepTimers, BreakdownLineIsTheMeanPerStepOverTheWindow) {
  FakeClock c;
  StepTimers t(c.fn());
  // Three steps of two micro steps each: forward 1+2 ms, backward 3+4 ms per step; step varies.
  const int64_t step_ns[3] = {1'000'000, 2'000'000, 6'000'000};
  for (int s = 0; s < 3; ++s) {
    for (int m = 0; m < 2; ++m) {
      ASSERT_OK(Timed(t, c, "forward", (1 + m) * 1'000'000));
      ASSERT_OK(Timed(t, c, "backward", (3 + m) * 1'000'000));
    }
    ASSERT_OK(Timed(t, c, "step", step_ns[s]));
    t.EndStep();
  }
  EXPECT_EQ(t.steps(), 3);
  EXPECT_DOUBLE_EQ(t.TotalMs("forward"), 9.0);
  EXPECT_DOUBLE_EQ(t.MeanMs("forward"), 3.0);
  EXPECT_DOUBLE_EQ(t.MeanMs("backward"), 7.0);
  EXPECT_DOUBLE_EQ(t.MeanMs("step"), 3.0);
  // DeepSpeed's line; timers without time in the window (communication, offload) are left out.
  EXPECT_EQ(t.Format(BreakdownTimerNames()), "time (ms) | forward: 3.00 | backward: 7.00 | step: 3.00");
  t.Add("communication", 1.5);
  t.Add("communication", 0.75);
  EXPECT_EQ(t.Format(BreakdownTimerNames()),
            "time (ms) | forward: 3.00 | backward: 7.00 | step: 3.00 | communication: 0.75");
  t.Add("my phase", 3.333);
  EXPECT_EQ(t.FormatAll(),
            "time (ms) | forward: 3.00 | backward: 7.00 | step: 3.00 | communication: 0.75 | my phase: 1.11");

  // A new window.
  t.Reset();
  EXPECT_EQ(t.steps(), 0);
  EXPECT_FALSE(t.has("forward"));
  EXPECT_EQ(t.Format(BreakdownTimerNames()), "time (ms)");
  ASSERT_OK(Timed(t, c, "forward", 500'000));
  t.EndStep();
  EXPECT_EQ(t.Format(BreakdownTimerNames()), "time (ms) | forward: 0.50");
}

TEST(StepTimers, RunningTimerSpansAReset) {
  FakeClock c;
  StepTimers t(c.fn());
  ASSERT_OK(t.Start("step"));
  c.now += 1'000'000;
  t.Reset();
  c.now += 1'000'000;
  ASSERT_OK(t.Stop("step"));
  EXPECT_DOUBLE_EQ(t.TotalMs("step"), 2.0);  // the whole run of the timer counts in the new window
}

TEST(StepTimers, MisuseNamesTheTimer) {
  StepTimers t;
  Status st = t.Stop("backward");
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("'backward' stopped without a Start"), std::string::npos) << st.ToString();
  ASSERT_OK(t.Start("forward"));
  st = t.Start("forward");
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("'forward' started while already running"), std::string::npos) << st.ToString();
  ASSERT_OK(t.Stop("forward"));
  EXPECT_FALSE(t.Stop("forward").ok());
}

TEST(StepTimers, ConcurrentAddsAreAllCounted) {
  StepTimers t;
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) t.Add("communication", 0.25);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_DOUBLE_EQ(t.TotalMs("communication"), 1000.0);
}

}  // namespace
}  // namespace zero
