#include "zero/loss_scaler.h"

#include <gtest/gtest.h>

#include <vector>

#include "testing/status_matchers.h"

namespace zero {
namespace {

LossScaler MakeDynamic(int power, int64_t window, int hysteresis, bool consecutive, double min_scale) {
  DynamicLossScaleOptions o;
  o.initial_scale_power = power;
  o.scale_window = window;
  o.hysteresis = hysteresis;
  o.consecutive_hysteresis = consecutive;
  o.min_scale = min_scale;
  auto r = LossScaler::Dynamic(o);
  EXPECT_OK(r);
  return *r;
}

// Applies `overflows` one step at a time and returns the scale after each step.
std::vector<float> Steps(LossScaler& s, const std::vector<bool>& overflows) {
  std::vector<float> scales;
  for (bool o : overflows) {
    s.Update(o);
    scales.push_back(s.scale());
  }
  return scales;
}

TEST(LossScalerTest, DefaultScalerIsOne) {
  LossScaler s;
  EXPECT_EQ(s.scale(), 1.0f);
  EXPECT_FALSE(s.dynamic());
  s.Update(true);
  EXPECT_EQ(s.scale(), 1.0f);
}

TEST(LossScalerTest, StaticNeverChanges) {
  auto r = LossScaler::Static(1024);
  ASSERT_OK(r);
  LossScaler s = *r;
  EXPECT_FALSE(s.dynamic());
  EXPECT_EQ(Steps(s, {true, true, false, false, true}), std::vector<float>(5, 1024.0f));
  EXPECT_FALSE(LossScaler::Static(0).ok());
  EXPECT_FALSE(LossScaler::Static(-2).ok());
}

TEST(LossScalerTest, DoublesAfterAWindowOfGoodSteps) {
  // DeepSpeed counts the good steps before the current one: from a fresh start the first doubling is
  // at the (window + 1)-th good step, then every window steps.
  LossScaler s = MakeDynamic(4, 3, 2, false, 1);
  EXPECT_EQ(s.scale(), 16.0f);
  EXPECT_EQ(Steps(s, {false, false, false, false, false, false, false}),
            (std::vector<float>{16, 16, 16, 32, 32, 32, 64}));
}

TEST(LossScalerTest, HysteresisDelaysTheDecrease) {
  LossScaler s = MakeDynamic(4, 3, 2, false, 1);
  Steps(s, {false, false, false, false, false, false, false});  // 64, iterations 0..6
  ASSERT_EQ(s.scale(), 64.0f);
  // Overflow at iteration 7 spends the hysteresis; the next ones halve.
  EXPECT_EQ(Steps(s, {true, true, true}), (std::vector<float>{64, 32, 16}));
  EXPECT_EQ(s.state().cur_hysteresis, 1);
  EXPECT_EQ(s.state().last_overflow_iter, 9);
  // Good steps 10..12 (stable interval 0, 1, 2), the fourth doubles and refills the hysteresis.
  EXPECT_EQ(Steps(s, {false, false, false}), (std::vector<float>{16, 16, 16}));
  EXPECT_EQ(s.state().cur_hysteresis, 1);  // not refilled without consecutive_hysteresis
  EXPECT_EQ(Steps(s, {false}), (std::vector<float>{32}));
  EXPECT_EQ(s.state().cur_hysteresis, 2);
  // An overflow in the middle of a window restarts the count.
  EXPECT_EQ(Steps(s, {false, true, false, false, false, false}), (std::vector<float>{32, 32, 32, 32, 32, 64}));
}

TEST(LossScalerTest, ConsecutiveHysteresisRefillsAfterEveryGoodStep) {
  LossScaler s = MakeDynamic(10, 1000, 2, true, 1);
  // Isolated overflows never reach the scale: each good step refills the hysteresis.
  EXPECT_EQ(Steps(s, {true, false, true, false, true, false}), std::vector<float>(6, 1024.0f));
  EXPECT_EQ(s.state().cur_hysteresis, 2);
  // Two in a row do.
  EXPECT_EQ(Steps(s, {true, true}), (std::vector<float>{1024, 512}));
  // Without consecutive_hysteresis the same isolated overflows halve the scale on the second one.
  LossScaler t = MakeDynamic(10, 1000, 2, false, 1);
  EXPECT_EQ(Steps(t, {true, false, true, false, true}), (std::vector<float>{1024, 1024, 512, 512, 256}));
}

TEST(LossScalerTest, NeverBelowMinScaleAndReportsOverflowAtTheMinimum) {
  LossScaler s = MakeDynamic(2, 1000, 1, false, 1);
  s.Update(true);
  EXPECT_EQ(s.scale(), 2.0f);
  EXPECT_FALSE(s.overflow_at_min_scale());
  s.Update(true);
  EXPECT_EQ(s.scale(), 1.0f);
  EXPECT_FALSE(s.overflow_at_min_scale());
  s.Update(true);  // DeepSpeed raises here
  EXPECT_EQ(s.scale(), 1.0f);
  EXPECT_TRUE(s.overflow_at_min_scale());
  s.Update(false);
  EXPECT_FALSE(s.overflow_at_min_scale());
  // A min scale that is not a power of two stops the halving there.
  LossScaler t = MakeDynamic(3, 1000, 1, false, 3.0);
  EXPECT_EQ(Steps(t, {true, true}), (std::vector<float>{4, 3}));
}

TEST(LossScalerTest, DeepSpeedDefaults) {
  LossScaler s = MakeDynamic(16, 1000, 2, false, 1);
  EXPECT_EQ(s.scale(), 65536.0f);
  for (int i = 0; i < 1000; ++i) s.Update(false);
  EXPECT_EQ(s.scale(), 65536.0f);
  s.Update(false);
  EXPECT_EQ(s.scale(), 131072.0f);
  EXPECT_EQ(s.state().cur_iter, 1001);
}

TEST(LossScalerTest, StateRoundTripContinuesIdentically) {
  LossScaler a = MakeDynamic(8, 4, 3, false, 0.5);
  const std::vector<bool> prefix = {true, false, true, true, true, false, false, false, false, false, true};
  Steps(a, prefix);
  const LossScalerState saved = a.state();
  LossScaler b = MakeDynamic(8, 4, 3, false, 0.5);
  ASSERT_OK(b.Restore(saved));
  EXPECT_EQ(b.state(), saved);
  const std::vector<bool> rest = {false, false, false, false, false, true, true, true, true, false, false};
  EXPECT_EQ(Steps(a, rest), Steps(b, rest));
  EXPECT_EQ(a.state(), b.state());
}

TEST(LossScalerTest, RestoreRejectsImpossibleStates) {
  LossScaler s = MakeDynamic(8, 4, 3, false, 1);
  EXPECT_EQ(s.Restore({0.0, 5, 2, 1}).code(), StatusCode::kDataLoss);    // scale
  EXPECT_EQ(s.Restore({0.5, 5, 2, 1}).code(), StatusCode::kDataLoss);    // below min_scale
  EXPECT_EQ(s.Restore({256.0, 5, 5, 1}).code(), StatusCode::kDataLoss);  // overflow not before cur_iter
  EXPECT_EQ(s.Restore({256.0, 5, 2, 4}).code(), StatusCode::kDataLoss);  // hysteresis above 3
  EXPECT_EQ(s.Restore({256.0, 5, 2, 0}).code(), StatusCode::kDataLoss);  // hysteresis below 1
  EXPECT_OK(s.Restore({256.0, 5, -1, 3}));
  EXPECT_EQ(s.scale(), 256.0f);
}

TEST(LossScalerTest, DynamicRejectsBadOptions) {
  DynamicLossScaleOptions o;
  o.initial_scale_power = 128;
  EXPECT_EQ(LossScaler::Dynamic(o).status().message(),
            "fp16.initial_scale_power: expected an integer in 0..127, got 128");
  o = DynamicLossScaleOptions();
  o.scale_window = 0;
  EXPECT_FALSE(LossScaler::Dynamic(o).ok());
  o = DynamicLossScaleOptions();
  o.hysteresis = 0;
  EXPECT_FALSE(LossScaler::Dynamic(o).ok());
  o = DynamicLossScaleOptions();
  o.min_scale = 0;
  EXPECT_FALSE(LossScaler::Dynamic(o).ok());
}

}  // namespace
}  // namespace zero
