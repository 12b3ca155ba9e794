#include "zero/global_norm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "comm/thread_ranks.h"
#include "runtime/cpu_device.h"
#include "runtime/dtype.h"
#include "testing/same_bits.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

using ::zero::testing::SameBits;

// Writes `partials` into the norm's slots, publishes them and reads the total.
Status ReadPartials(Device* device, GlobalNorm* norm, const std::vector<double>& partials, double* total) {
  Stream* s = device->default_stream();
  if (!partials.empty()) {
    ZERO_RETURN_IF_ERROR(
        device->Copy(norm->slots(), partials.data(), partials.size() * sizeof(double), CopyKind::kHostToDevice, s));
  }
  ZERO_RETURN_IF_ERROR(norm->Publish());
  return norm->Read(total);
}

// The sum in parameter order, as the equivalence suite's reference adds it.
double InOrder(const std::vector<double>& v) {
  double sum = 0.0;
  for (double x : v) sum += x;
  return sum;
}

TEST(GlobalNormTest, SumsThePartialsInParameterOrder) {
  // Rounding makes the order visible: in order 1e16 + 1 + -1e16 + 1 is 1, in reverse 0.
  const std::vector<double> partials = {1e16, 1.0, -1e16, 1.0};
  ASSERT_OK(RunThreadRanks(1, [&](int rank, Communicator* comm, Device* device) -> Status {
    ZERO_ASSIGN_OR_RETURN(auto norm, GlobalNorm::Create(device, comm, device->default_stream(), 4, false));
    double total = -1.0;
    ZERO_RETURN_IF_ERROR(ReadPartials(device, norm.get(), partials, &total));
    EXPECT_TRUE(SameBits(std::vector<double>{total}, std::vector<double>{InOrder(partials)}));
    EXPECT_EQ(total, 1.0);
    // ZeroSlots: every partial +0.0 again.
    ZERO_RETURN_IF_ERROR(norm->ZeroSlots());
    ZERO_RETURN_IF_ERROR(norm->Publish());
    ZERO_RETURN_IF_ERROR(norm->Read(&total));
    EXPECT_TRUE(SameBits(std::vector<double>{total}, std::vector<double>{0.0}));
    return OkStatus();
  }));
}

// The engine's use: each partial is Device::SumOfSquares of a parameter's fp32 gradient, written
// into its slot; a parameter without one keeps the +0.0 of ZeroSlots.
TEST(GlobalNormTest, PartialsFromSumOfSquares) {
  const std::vector<std::vector<float>> grads = {{1.5f, -2.0f, 0.25f}, {}, {3.0f, 1e-3f}};
  ASSERT_OK(RunThreadRanks(1, [&](int rank, Communicator* comm, Device* device) -> Status {
    Stream* s = device->default_stream();
    ZERO_ASSIGN_OR_RETURN(auto norm, GlobalNorm::Create(device, comm, s, 3, false));
    ZERO_RETURN_IF_ERROR(norm->ZeroSlots());
    std::vector<double> want(3, 0.0);
    for (int i : {0, 2}) {
      ZERO_RETURN_IF_ERROR(device->SumOfSquares(grads[i].data(), DType::kF32, grads[i].size(), norm->slots() + i, s));
      for (float g : grads[i]) want[i] += static_cast<double>(g) * static_cast<double>(g);
    }
    ZERO_RETURN_IF_ERROR(norm->Publish());
    double total = -1.0;
    ZERO_RETURN_IF_ERROR(norm->Read(&total));
    EXPECT_TRUE(SameBits(std::vector<double>{total}, std::vector<double>{InOrder(want)}));
    return OkStatus();
  }));
}

TEST(GlobalNormTest, NoParametersReadZero) {
  ASSERT_OK(RunThreadRanks(2, [&](int rank, Communicator* comm, Device* device) -> Status {
    ZERO_ASSIGN_OR_RETURN(auto norm, GlobalNorm::Create(device, comm, device->default_stream(), 0, true));
    ZERO_RETURN_IF_ERROR(norm->ZeroSlots());
    double total = -1.0;
    ZERO_RETURN_IF_ERROR(ReadPartials(device, norm.get(), {}, &total));
    EXPECT_TRUE(SameBits(std::vector<double>{total}, std::vector<double>{0.0})) << "rank " << rank;
    return OkStatus();
  }));
}

// sum_over_ranks: each rank's parameter-order sum, added in rank order, the same bits on every rank;
// without it each rank keeps its own sum.
TEST(GlobalNormTest, SumOverRanksInRankOrder) {
  const std::vector<std::vector<double>> partials = {{0.1, 0.7, 1e-17}, {0.2, 3e-5, 0.3}};
  const double want = InOrder(partials[0]) + InOrder(partials[1]);
  for (bool over_ranks : {true, false}) {
    std::vector<double> got(2, -1.0);
    ASSERT_OK(RunThreadRanks(2, [&](int rank, Communicator* comm, Device* device) -> Status {
      ZERO_ASSIGN_OR_RETURN(auto norm, GlobalNorm::Create(device, comm, device->default_stream(), 3, over_ranks));
      return ReadPartials(device, norm.get(), partials[rank], &got[rank]);
    }));
    for (int r = 0; r < 2; ++r) {
      const double expected = over_ranks ? want : InOrder(partials[r]);
      EXPECT_TRUE(SameBits(std::vector<double>{got[r]}, std::vector<double>{expected}))
          << "rank " << r << (over_ranks ? ", summed over ranks" : ", own sum");
    }
  }
}

TEST(GlobalNormTest, ArithmeticOnTheTotal) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FALSE(NormOverflowed(4.0));
  EXPECT_FALSE(NormOverflowed(0.0));
  EXPECT_TRUE(NormOverflowed(inf));
  EXPECT_TRUE(NormOverflowed(nan));

  EXPECT_EQ(ReportedNorm(16.0, 2.0), 2.0);
  EXPECT_EQ(ReportedNorm(inf, 1.0), inf);
  EXPECT_TRUE(std::isnan(ReportedNorm(nan, 1.0)));

  // Off (0 or negative): 1. Below the threshold: 1. Above: (norm + 1e-6) / clip, in double.
  EXPECT_EQ(ClipCoefficient(100.0, 1.0, 0.0), 1.0);
  EXPECT_EQ(ClipCoefficient(100.0, 1.0, -1.0), 1.0);
  EXPECT_EQ(ClipCoefficient(0.25, 1.0, 1.0), 1.0);
  EXPECT_TRUE(SameBits(std::vector<double>{ClipCoefficient(64.0, 2.0, 0.5)},
                       std::vector<double>{(std::sqrt(64.0) / 2.0 + 1e-6) / 0.5}));
  EXPECT_EQ(ClipCoefficient(nan, 1.0, 1.0), 1.0);
  EXPECT_EQ(ClipCoefficient(inf, 1.0, 1.0), inf);
}

TEST(GlobalNormTest, NonFiniteNormErrorNamesTheValueAndWhetherApplied) {
  const Status applied = NonFiniteNormError(std::numeric_limits<double>::quiet_NaN(), 7, true);
  EXPECT_EQ(applied.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(applied.message().find("optimizer step 7 is nan"), std::string::npos) << applied.message();
  EXPECT_NE(applied.message().find("the step was applied"), std::string::npos) << applied.message();
  const Status skipped = NonFiniteNormError(std::numeric_limits<double>::infinity(), 3, false);
  EXPECT_NE(skipped.message().find("optimizer step 3 is inf"), std::string::npos) << skipped.message();
  EXPECT_NE(skipped.message().find("the step was not applied"), std::string::npos) << skipped.message();
  EXPECT_NE(skipped.message().find("stop_on_nonfinite: false"), std::string::npos) << skipped.message();
}

}  // namespace
}  // namespace zero
