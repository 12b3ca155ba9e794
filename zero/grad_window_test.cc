#include "zero/grad_window.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace zero {
namespace {

// Managed, two micro steps per window: reports mark parameters active and reported until
// Backward() ends; the second Backward() is the boundary, after which the step is pending.
TEST(GradWindowTest, ManagedWindowCountsMicroStepsToTheBoundary) {
  GradWindow w;
  w.Init(3, /*managed=*/true, /*gas=*/2);
  EXPECT_FALSE(w.AtBoundary());
  w.HandOut(0);
  w.HandOut(2);
  EXPECT_TRUE(w.handed_out(0));
  w.Report(0);
  EXPECT_FALSE(w.handed_out(0));
  EXPECT_TRUE(w.reported(0));
  EXPECT_EQ(w.reported_count(), 1);
  EXPECT_TRUE(w.TakeHandedOut(2));  // handed out, never reported
  EXPECT_FALSE(w.TakeHandedOut(2));
  w.EndBackward();
  EXPECT_FALSE(w.reported(0));
  EXPECT_EQ(w.reported_count(), 0);
  EXPECT_EQ(w.micro_steps(), 1);
  EXPECT_FALSE(w.pending_step());
  EXPECT_EQ(w.active(), (std::vector<uint8_t>{1, 0, 0}));

  EXPECT_TRUE(w.AtBoundary());
  w.Report(1);
  w.EndBackward();
  EXPECT_TRUE(w.pending_step());
  EXPECT_EQ(w.micro_steps(), 0);
  EXPECT_EQ(w.backwards_since_step(), 2);
  EXPECT_EQ(w.active(), (std::vector<uint8_t>{1, 1, 0}));
  w.ClearPendingStep();
  EXPECT_FALSE(w.pending_step());
}

// Unmanaged: never at a boundary, nothing pending; Backward() calls counted until NewWindow.
TEST(GradWindowTest, UnmanagedNeverReachesABoundary) {
  GradWindow w;
  w.Init(2, /*managed=*/false, /*gas=*/1);
  for (int k = 0; k < 3; ++k) {
    EXPECT_FALSE(w.AtBoundary());
    w.EndBackward();
  }
  EXPECT_FALSE(w.pending_step());
  EXPECT_EQ(w.backwards_since_step(), 3);
  w.NewWindow();
  EXPECT_EQ(w.backwards_since_step(), 0);
}

// The first contribution of a window to a piece is reported once; NewWindow starts over and
// clears the active set, the queued reductions, `reduced` and the updates in backward.
TEST(GradWindowTest, FirstContributionsAndNewWindow) {
  GradWindow w;
  w.Init(2, /*managed=*/true, /*gas=*/1);
  EXPECT_TRUE(w.FirstToAcc(0));
  EXPECT_FALSE(w.FirstToAcc(0));
  EXPECT_TRUE(w.FirstToPartition(1));
  EXPECT_FALSE(w.FirstToPartition(1));
  w.MarkAccWritten(1);
  w.MarkPartWritten(0);
  EXPECT_EQ(w.acc_written(), (std::vector<uint8_t>{1, 1}));
  EXPECT_EQ(w.part_written(), (std::vector<uint8_t>{1, 1}));
  EXPECT_TRUE(w.QueueReduction(0));
  EXPECT_FALSE(w.QueueReduction(0));
  w.MarkReduced();
  EXPECT_TRUE(w.reduced());
  EXPECT_FALSE(w.any_updated());
  w.MarkUpdated(1);
  EXPECT_TRUE(w.updated(1));
  EXPECT_TRUE(w.any_updated());
  w.Report(0);

  w.NewWindow();
  EXPECT_TRUE(w.FirstToAcc(0));
  EXPECT_TRUE(w.FirstToPartition(1));
  EXPECT_TRUE(w.QueueReduction(0));
  EXPECT_FALSE(w.reduced());
  EXPECT_FALSE(w.any_updated());
  EXPECT_EQ(w.active(), (std::vector<uint8_t>{0, 0}));
  EXPECT_EQ(w.reported_count(), 1);  // the backward in progress is not the window's to reset
}

// The ranks' union of the active set replaces this rank's; RestartCount clears the count and the
// pending step only.
TEST(GradWindowTest, MergeActiveAndRestartCount) {
  GradWindow w;
  w.Init(3, /*managed=*/true, /*gas=*/1);
  w.Report(0);
  w.MergeActive({0.0, 1.0, 0.0});
  EXPECT_EQ(w.active(), (std::vector<uint8_t>{0, 1, 0}));
  w.EndBackward();
  EXPECT_TRUE(w.pending_step());
  w.RestartCount();
  EXPECT_FALSE(w.pending_step());
  EXPECT_EQ(w.micro_steps(), 0);
  EXPECT_EQ(w.backwards_since_step(), 1);
}

}  // namespace
}  // namespace zero
