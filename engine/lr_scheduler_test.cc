#include "engine/lr_scheduler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "testing/status_matchers.h"

namespace zero {
namespace {

SchedulerConfig Sched(const std::string& type, int64_t warmup, const std::string& warmup_type) {
  SchedulerConfig s;
  s.type = type;
  s.warmup_num_steps = warmup;
  s.warmup_type = warmup_type;
  return s;
}

LrScheduler Make(const SchedulerConfig& s, double base_lr) {
  auto r = LrScheduler::Create(s, base_lr);
  EXPECT_OK(r);
  return *r;
}

TEST(LrSchedulerTest, ConstantWithoutAType) {
  LrScheduler s = Make(SchedulerConfig(), 0.125);
  for (int64_t step : {0, 1, 2, 1000, 1000000}) EXPECT_EQ(s.LrAt(step), 0.125);
}

TEST(LrSchedulerTest, WarmupLrLog) {
  SchedulerConfig c = Sched("WarmupLR", 10, "log");
  c.warmup_min_lr = 0.0;
  c.warmup_max_lr = 0.01;
  LrScheduler s = Make(c, 1.0);
  EXPECT_EQ(s.LrAt(0), 0.0);                                           // before any scheduler.step(): min lr
  EXPECT_EQ(s.LrAt(1), 0.0);                                           // iteration 0: log(1) = 0
  EXPECT_DOUBLE_EQ(s.LrAt(2), 0.01 * std::log(2.0) / std::log(10.0));  // 0.0030103
  EXPECT_NEAR(s.LrAt(2), 0.0030103, 1e-7);
  EXPECT_NEAR(s.LrAt(5), 0.01 * 0.69897, 1e-7);  // log(5)/log(10)
  EXPECT_DOUBLE_EQ(s.LrAt(10), 0.01);            // iteration 9: log(10)/log(10)
  EXPECT_EQ(s.LrAt(11), 0.01);
  EXPECT_EQ(s.LrAt(100000), 0.01);
}

TEST(LrSchedulerTest, WarmupLrLinearAndDefaultMaxIsTheOptimizersLr) {
  SchedulerConfig c = Sched("WarmupLR", 10, "linear");
  c.warmup_min_lr = 0.001;  // warmup_max_lr stays -1: the base lr
  LrScheduler s = Make(c, 0.011);
  EXPECT_EQ(s.LrAt(0), 0.001);
  EXPECT_EQ(s.LrAt(1), 0.001);
  EXPECT_DOUBLE_EQ(s.LrAt(6), 0.006);   // iteration 5: 5/10
  EXPECT_DOUBLE_EQ(s.LrAt(10), 0.01);   // iteration 9: 9/10, not yet the max
  EXPECT_DOUBLE_EQ(s.LrAt(11), 0.011);  // iteration 10: done
}

TEST(LrSchedulerTest, WarmupStepsBelowTwoActAsTwo) {
  SchedulerConfig c = Sched("WarmupLR", 1, "linear");
  c.warmup_max_lr = 1.0;
  LrScheduler s = Make(c, 1.0);
  EXPECT_EQ(s.LrAt(1), 0.0);
  EXPECT_EQ(s.LrAt(2), 0.5);
  EXPECT_EQ(s.LrAt(3), 1.0);
}

TEST(LrSchedulerTest, WarmupDecayLr) {
  SchedulerConfig c = Sched("WarmupDecayLR", 10, "linear");
  c.warmup_max_lr = 1.0;
  c.total_num_steps = 20;
  LrScheduler s = Make(c, 0.5);
  EXPECT_EQ(s.LrAt(0), 0.0);
  EXPECT_DOUBLE_EQ(s.LrAt(5), 0.4);  // iteration 4
  EXPECT_EQ(s.LrAt(11), 1.0);        // iteration 10: (20-10)/(20-10)
  EXPECT_EQ(s.LrAt(16), 0.5);        // iteration 15: 5/10
  EXPECT_EQ(s.LrAt(20), 0.1);        // iteration 19: 1/10
  EXPECT_EQ(s.LrAt(21), 0.0);        // iteration 20: the end
  EXPECT_EQ(s.LrAt(500), 0.0);       // never negative
}

TEST(LrSchedulerTest, WarmupDecayLrWithTotalNotAfterWarmup) {
  SchedulerConfig c = Sched("WarmupDecayLR", 10, "linear");
  c.warmup_max_lr = 1.0;
  c.total_num_steps = 5;  // DeepSpeed only warns; the decay denominator is max(1, 5 - 10) = 1
  LrScheduler s = Make(c, 1.0);
  EXPECT_DOUBLE_EQ(s.LrAt(10), 0.9);
  EXPECT_EQ(s.LrAt(11), 0.0);
}

TEST(LrSchedulerTest, WarmupCosineLr) {
  SchedulerConfig c = Sched("WarmupCosineLR", 10, "linear");
  c.total_num_steps = 110;
  c.warmup_min_ratio = 0.1;
  c.cos_min_ratio = 0.0;
  LrScheduler s = Make(c, 2.0);
  EXPECT_EQ(s.LrAt(0), 0.0);         // DeepSpeed's get_lr() before any step is 0 for this schedule
  EXPECT_DOUBLE_EQ(s.LrAt(1), 0.2);  // iteration 0: warmup_min_ratio
  EXPECT_DOUBLE_EQ(s.LrAt(6), 1.1);  // iteration 5: 0.1 + 0.5 * 0.9 = 0.55
  EXPECT_DOUBLE_EQ(s.LrAt(10), 2.0 * (0.1 + 0.9 * 0.9));
  EXPECT_DOUBLE_EQ(s.LrAt(11), 2.0 * (1 + std::cos(M_PI * 0.01)) / 2);  // iteration 10: 1 of 100
  EXPECT_NEAR(s.LrAt(11), 1.99950656, 1e-8);
  EXPECT_DOUBLE_EQ(s.LrAt(60), 1.0);     // iteration 59: halfway, cos(pi/2) = 0
  EXPECT_NEAR(s.LrAt(110), 0.0, 1e-15);  // iteration 109: the end
  EXPECT_NEAR(s.LrAt(1000), 0.0, 1e-15);
}

TEST(LrSchedulerTest, WarmupCosineLrStaysAtItsFloor) {
  SchedulerConfig c = Sched("WarmupCosineLR", 4, "log");
  c.total_num_steps = 8;
  c.cos_min_ratio = 0.25;
  LrScheduler s = Make(c, 1.0);
  EXPECT_EQ(s.LrAt(1), 0.0);  // log warmup from warmup_min_ratio 0
  EXPECT_DOUBLE_EQ(s.LrAt(3), std::log(3.0) / std::log(4.0));
  EXPECT_DOUBLE_EQ(s.LrAt(6), 0.25 + 0.75 * (1 + std::cos(M_PI * 0.5)) / 2);  // iteration 5: 2 of 4
  EXPECT_DOUBLE_EQ(s.LrAt(9), 0.25);
  EXPECT_DOUBLE_EQ(s.LrAt(12), 0.25);
  EXPECT_DOUBLE_EQ(s.LrAt(100), 0.25);
}

TEST(LrSchedulerTest, TheTthUpdateUsesLrAtTMinusOne) {
  SchedulerConfig c = Sched("WarmupLR", 4, "linear");
  c.warmup_max_lr = 1.0;
  LrScheduler s = Make(c, 1.0);
  // The engine: update with lr(), then Step() when the update was applied.
  const double expected[] = {0.0, 0.0, 0.25, 0.5, 0.75, 1.0, 1.0};
  for (double want : expected) {
    EXPECT_EQ(s.lr(), want) << "update " << s.steps() + 1;
    s.Step();
  }
  EXPECT_EQ(s.steps(), 7);
}

TEST(LrSchedulerTest, StateSaveAndRestore) {
  SchedulerConfig c = Sched("WarmupDecayLR", 5, "log");
  c.warmup_max_lr = 0.1;
  c.total_num_steps = 50;
  LrScheduler a = Make(c, 1.0);
  EXPECT_EQ(a.state().last_batch_iteration, -1);
  for (int i = 0; i < 17; ++i) a.Step();
  const LrSchedulerState saved = a.state();
  EXPECT_EQ(saved.last_batch_iteration, 16);
  LrScheduler b = Make(c, 1.0);
  ASSERT_OK(b.Restore(saved));
  EXPECT_EQ(b.state(), saved);
  for (int i = 0; i < 40; ++i) {
    EXPECT_EQ(a.lr(), b.lr());
    a.Step();
    b.Step();
  }
  const Status bad = b.Restore(LrSchedulerState{-2});
  EXPECT_EQ(bad.code(), StatusCode::kOutOfRange);
}

TEST(LrSchedulerTest, CreateRejectsBadConfigs) {
  SchedulerConfig c = Sched("WarmupDecayLR", 5, "log");
  auto r = LrScheduler::Create(c, 1.0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "scheduler.params.total_num_steps: expected an integer >= 1 (WarmupDecayLR requires it), got 0");
  EXPECT_FALSE(LrScheduler::Create(Sched("OneCycle", 5, "log"), 1.0).ok());
  EXPECT_FALSE(LrScheduler::Create(Sched("WarmupLR", 0, "log"), 1.0).ok());
  EXPECT_FALSE(LrScheduler::Create(Sched("WarmupLR", 5, "exp"), 1.0).ok());
  EXPECT_FALSE(LrScheduler::Create(SchedulerConfig(), -1.0).ok());
}

TEST(LrSchedulerTest, FromAParsedConfig) {
  auto config = ParseConfig(R"({"train_batch_size": 8, "optimizer": {"params": {"lr": 0.5}},
                               "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 2,
                               "warmup_type": "linear"}}})",
                            ParseOptions());
  ASSERT_OK(config);
  LrScheduler s = Make(config->scheduler, config->optimizer.lr);
  EXPECT_EQ(s.LrAt(1), 0.0);
  EXPECT_EQ(s.LrAt(2), 0.25);
  EXPECT_EQ(s.LrAt(3), 0.5);
}

}  // namespace
}  // namespace zero
