// The zero_optimization keys that change only the shape of the collectives, never a value:
// contiguous_gradients, reduce_scatter, allgather_bucket_size and reduce_bucket_size. Every
// setting must train bitwise like the defaults (Gloo sums every element in rank order whatever the
// collective), at world 2 and 3, stages 0-3, fp32 and bf16, GAS 1 and 3; and the debug counters
// (EngineStats, EngineMemory::bucket_staging) show the collectives really changed shape.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "comm/thread_ranks.h"
#include "engine/config/config.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "testing/same_bits.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

using namespace ::zero::testing;  // NOLINT: engine_test_util.h's helpers

// SmallModel plus a 150-element weight (alone in an all-gather bucket of 100 elements), a
// 15-element bias and a 14-element one: sizes that do not divide by 2 or 3, a scalar, a parameter
// smaller than N; m3.c (14) and m2.w (13) have the same padded size at N = 2 and 3, so their
// gradient buffers are pooled together (the padding must be re-zeroed).
TestModel OptionsModel() {
  TestModel m = SmallModel();
  m.specs.push_back({"m3.w", {10, 15}, "m3"});
  m.specs.push_back({"m3.b", {15}, "m3"});
  m.specs.push_back({"m3.c", {14}, "m3"});
  m.modules.push_back("m3");
  return m;
}

// The config of one cell: `zero_extra` adds zero_optimization keys to the defaults (no
// reduce_bucket_size or allgather_bucket_size unless given: DeepSpeed's 5e8).
std::string CellJson(int stage, DType dtype, int gas, const std::string& zero_extra, const std::string& extra = "") {
  std::string j = "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": " + std::to_string(gas) +
                  ", \"gradient_clipping\": 1.0"
                  ", \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.1}}";
  if (dtype == DType::kBF16) j += ", \"bf16\": {\"enabled\": true}";
  if (!extra.empty()) j += ", " + extra;
  j += ", \"zero_optimization\": {\"stage\": " + std::to_string(stage);
  if (!zero_extra.empty()) j += ", " + zero_extra;
  return j + "}}";
}

// Losses are float sums (AddHalfSquares) held as doubles: compared as the floats they are.
bool SameLossBits(const std::vector<double>& a, const std::vector<double>& b, std::string* where) {
  if (a.size() != b.size()) {
    *where = "sizes differ";
    return false;
  }
  for (size_t k = 0; k < a.size(); ++k) {
    if (FloatBits(static_cast<float>(a[k])) != FloatBits(static_cast<float>(b[k]))) {
      *where = "element " + std::to_string(k) + ": " + std::to_string(a[k]) + " vs " + std::to_string(b[k]);
      return false;
    }
  }
  return true;
}

// Every rank of `got` against the same rank of `ref`: master weights, model parameters, losses
// and norms, bitwise.
void ExpectBitwiseEqual(const std::vector<TrainResult>& ref, const std::vector<TrainResult>& got,
                        const std::string& what) {
  ASSERT_EQ(ref.size(), got.size());
  for (size_t r = 0; r < ref.size(); ++r) {
    std::string where;
    EXPECT_TRUE(SameBits(ref[r].master, got[r].master)) << what << " rank " << r << " master";
    EXPECT_TRUE(SameBits(ref[r].model, got[r].model)) << what << " rank " << r << " model";
    EXPECT_TRUE(SameLossBits(ref[r].losses, got[r].losses, &where)) << what << " rank " << r << " losses: " << where;
    EXPECT_TRUE(SameBits(ref[r].norms, got[r].norms)) << what << " rank " << r << " norms";
    EXPECT_EQ(ref[r].counters.global_steps, got[r].counters.global_steps) << what;
    EXPECT_EQ(ref[r].counters.adam_step, got[r].counters.adam_step) << what;
  }
}

struct Variant {
  const char* name;
  std::string zero_extra;
};

std::vector<Variant> Variants() {
  return {
      {"contiguous_gradients false", "\"contiguous_gradients\": false"},
      {"contiguous_gradients false, overlap_comm true", "\"contiguous_gradients\": false, \"overlap_comm\": true"},
      {"reduce_scatter false", "\"reduce_scatter\": false"},
      {"allgather_bucket_size 100", "\"allgather_bucket_size\": 100"},
      {"reduce_bucket_size 5", "\"reduce_bucket_size\": 5"},
      {"all of them",
       "\"contiguous_gradients\": false, \"reduce_scatter\": false, \"allgather_bucket_size\": 100, "
       "\"reduce_bucket_size\": 5"},
  };
}

struct Cell {
  int world;
  int stage;
  DType dtype;
  int gas;
};

std::string CellName(const Cell& c) {
  return "w" + std::to_string(c.world) + "_s" + std::to_string(c.stage) + "_" + DTypeName(c.dtype) + "_gas" +
         std::to_string(c.gas);
}

class OptionsMatrixTest : public ::testing::TestWithParam<Cell> {};

TEST_P(OptionsMatrixTest, EveryVariantTrainsBitwiseLikeTheDefaults) {
  const Cell c = GetParam();
  const TestModel model = OptionsModel();
  const int n_params = static_cast<int>(model.specs.size());
  const int steps = 3;
  const auto ref = TrainAll(CellJson(c.stage, c.dtype, c.gas, ""), c.world, model);
  ASSERT_EQ(ref[0].counters.adam_step, steps);
  EXPECT_NE(ref[0].master[0][0], InitValue(0, 0));  // the weights moved
  // Defaults: one bucket (5e8 elements) per reduction and one all-gather bucket per step.
  const int64_t reductions_per_step = c.stage <= 1 ? 1 : c.gas;
  // Stage 3 (every parameter persistent under the default threshold; the default prefetch bucket
  // holds the model): the first step gathers each of the 4 modules once (one collective each, the
  // trace being recorded); after every later Step() the demand of m0 and one prefetch of m1..m3
  // re-gather the stale parameters: 2 collectives, whatever the number of parameters.
  const int64_t param_allgathers = c.stage == 3 ? 4 + 2 * (steps - 1) : 0;
  for (const TrainResult& r : ref) {
    EXPECT_EQ(r.stats.gradient_collectives, steps * reductions_per_step);
    EXPECT_EQ(r.stats.weight_allgathers, (c.stage == 1 || c.stage == 2) ? steps : 0);
    EXPECT_EQ(r.stats.param_allgathers, param_allgathers);
    EXPECT_GT(r.memory.bucket_staging, 0u);
  }
  for (const Variant& v : Variants()) {
    SCOPED_TRACE(v.name);
    const auto got = TrainAll(CellJson(c.stage, c.dtype, c.gas, v.zero_extra), c.world, model);
    ExpectBitwiseEqual(ref, got, v.name);
    const bool contiguous = v.zero_extra.find("\"contiguous_gradients\": false") == std::string::npos;
    const bool small_allgather = v.zero_extra.find("allgather_bucket_size") != std::string::npos;
    for (const TrainResult& r : got) {
      EXPECT_EQ(r.stats.param_allgathers, param_allgathers);  // no variant changes the gathers
      if (!contiguous) {
        // One collective per parameter, no bucket staging buffers.
        EXPECT_EQ(r.stats.gradient_collectives, steps * reductions_per_step * n_params);
        EXPECT_EQ(r.memory.bucket_staging, 0u);
      }
      if (c.stage == 1 || c.stage == 2) {
        if (small_allgather) {
          EXPECT_GT(r.stats.weight_allgathers, steps);
        } else {
          EXPECT_EQ(r.stats.weight_allgathers, steps);
        }
      } else {
        EXPECT_EQ(r.stats.weight_allgathers, 0);
      }
    }
  }
}

std::vector<Cell> AllCells() {
  std::vector<Cell> cells;
  for (int world : {2, 3}) {
    for (int stage = 0; stage <= 3; ++stage) {
      for (DType dtype : {DType::kF32, DType::kBF16}) {
        for (int gas : {1, 3}) cells.push_back({world, stage, dtype, gas});
      }
    }
  }
  return cells;
}

INSTANTIATE_TEST_SUITE_P(Cells, OptionsMatrixTest, ::testing::ValuesIn(AllCells()),
                         [](const ::testing::TestParamInfo<Cell>& info) { return CellName(info.param); });

// Unmanaged accumulation (stages 0/1 reduce at Step(), only the active parameters) with parameters
// that never get a gradient: the per-parameter reduction matches the buckets.
TEST(EngineOptionsTest, UnmanagedWithInactiveParameters) {
  const TestModel model = OptionsModel();
  TrainOptions opt;
  opt.skip_params = {1, 4, 6};
  const std::string unmanaged = "\"managed_gradient_accumulation\": false, \"freeze_inactive_parameters\": true";
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const auto ref = TrainAll(CellJson(stage, DType::kBF16, 1, "", unmanaged), 3, model, opt);
    for (const Variant& v : Variants()) {
      if (stage <= 1 && v.zero_extra.find("overlap_comm") != std::string::npos) continue;  // refused
      const auto got = TrainAll(CellJson(stage, DType::kBF16, 1, v.zero_extra, unmanaged), 3, model, opt);
      ExpectBitwiseEqual(ref, got, v.name);
      for (int i : opt.skip_params) {
        EXPECT_EQ(got[0].master[i][0], InitValue(i, 0)) << v.name << " param " << i;
      }
    }
  }
}

// A communication dtype other than the model dtype: the per-parameter reduction converts each
// gradient (the one staging buffer it needs), with the same values as the packed buckets.
TEST(EngineOptionsTest, CommunicationDtypeDifferentFromTheModelDtype) {
  const TestModel model = OptionsModel();
  const std::string comm_fp32 = "\"communication_data_type\": \"fp32\"";
  for (int stage = 2; stage <= 3; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const auto ref = TrainAll(CellJson(stage, DType::kBF16, 2, "", comm_fp32), 2, model);
    const auto bf16 = TrainAll(CellJson(stage, DType::kBF16, 2, ""), 2, model);
    EXPECT_FALSE(SameBits(ref[0].master, bf16[0].master)) << "fp32 communication had no effect";
    for (const Variant& v : Variants()) {
      const auto got = TrainAll(CellJson(stage, DType::kBF16, 2, v.zero_extra, comm_fp32), 2, model);
      ExpectBitwiseEqual(ref, got, v.name);
    }
  }
}

// World 1 issues no collective in any variant and still trains like the defaults.
TEST(EngineOptionsTest, WorldOne) {
  const TestModel model = OptionsModel();
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const auto ref = TrainAll(CellJson(stage, DType::kF32, 2, ""), 1, model);
    for (const Variant& v : Variants()) {
      const auto got = TrainAll(CellJson(stage, DType::kF32, 2, v.zero_extra), 1, model);
      ExpectBitwiseEqual(ref, got, v.name);
      EXPECT_EQ(got[0].stats.gradient_collectives, 0);
      EXPECT_EQ(got[0].stats.weight_allgathers, 0);
      EXPECT_EQ(got[0].stats.param_allgathers, 0);
    }
  }
}

// Refused values.
TEST(EngineOptionsTest, AllgatherBucketSizeMustBePositive) {
  Status s = RunThreadRanks(1, [](int rank, Communicator* comm, Device* device) -> Status {
    ZERO_ASSIGN_OR_RETURN(Config config, MakeConfig(CellJson(1, DType::kF32, 1, ""), 1));
    config.zero.allgather_bucket_size = 0;
    return Expect(Engine::Create(config, device, comm).status(), StatusCode::kInvalidArgument, "allgather_bucket_size");
  });
  EXPECT_OK(s);
}

}  // namespace
}  // namespace zero
