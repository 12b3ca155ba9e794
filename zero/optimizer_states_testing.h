// Test-only: comparing two OptimizerStates implementations element for element (the offload
// states' tests check each against DeviceOptimizerStates this way).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "testing/same_bits.h"
#include "testing/status_matchers.h"
#include "zero/optimizer_states.h"

namespace zero::testing {

// The three fp32 states (master, exp_avg, exp_avg_sq) over [0, n) of `got` and `want`, read with
// Read() and compared bit for bit; a failure names the state. Wrap the call in
// ASSERT_NO_FATAL_FAILURE where a failed Read must end the test.
inline void ExpectStatesBitwiseEqual(OptimizerStates& got, OptimizerStates& want, int64_t n) {
  for (OptState w : {OptState::kMaster, OptState::kExpAvg, OptState::kExpAvgSq}) {
    std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
    ASSERT_OK(got.Read(w, 0, n, x.data())) << OptStateName(w);
    ASSERT_OK(want.Read(w, 0, n, y.data())) << OptStateName(w);
    EXPECT_TRUE(SameBits(x, y)) << OptStateName(w);
  }
}

}  // namespace zero::testing
