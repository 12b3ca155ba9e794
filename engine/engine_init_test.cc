// Engine::InitializeFromSlices: at stage 3 with several ranks each rank is asked only for its shard
// of every parameter, and the engine then holds bitwise what Initialize gives from full values; at
// other stages the whole parameter is asked for; a read error fails Initialize naming the parameter.
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "comm/thread_ranks.h"
#include "engine/config/config.h"
#include "engine/engine.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

// Parameter sizes that do not divide by the world sizes used (padding in the last shard).
const std::vector<ParamSpec> kSpecs = {{"a", {7, 5}, "m0"}, {"b", {3}, "m0"}, {"c", {13, 3}, "m1"}};

float Value(int index, int64_t e) { return 0.25f * static_cast<float>(index + 1) + 0.001f * static_cast<float>(e); }

Config StageConfig(int stage, int world) {
  ParseOptions o;
  o.world_size = world;
  Result<Config> c = ParseConfig("{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimization\": {\"stage\": " +
                                     std::to_string(stage) + "}, \"bf16\": {\"enabled\": true}}",
                                 o);
  EXPECT_OK(c);
  return *c;
}

struct Read {
  int rank, index;
  int64_t begin, count;
};

// Runs `world` ranks at `stage`; each initializes either from slices (recording what it was asked
// for) or from full values, then gathers every master weight.
Status RunRanks(int stage, int world, bool slices, std::vector<Read>* reads, std::vector<std::vector<float>>* masters) {
  std::mutex mu;
  masters->assign(kSpecs.size(), {});
  return RunThreadRanks(world, [&](int rank, Communicator* comm, Device* device) -> Status {
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(StageConfig(stage, world), device, comm));
    for (const ParamSpec& s : kSpecs) ZERO_RETURN_IF_ERROR(engine->RegisterParameter(s).status());
    if (slices) {
      ZERO_RETURN_IF_ERROR(engine->InitializeFromSlices([&](int index, int64_t begin, int64_t count, float* v) {
        std::lock_guard<std::mutex> l(mu);
        reads->push_back({rank, index, begin, count});
        for (int64_t e = 0; e < count; ++e) v[e] = Value(index, begin + e);
        return OkStatus();
      }));
    } else {
      ZERO_RETURN_IF_ERROR(engine->Initialize([&](int index, float* v) {
        int64_t n = 1;
        for (int64_t d : kSpecs[index].shape) n *= d;
        for (int64_t e = 0; e < n; ++e) v[e] = Value(index, e);
      }));
    }
    for (size_t i = 0; i < kSpecs.size(); ++i) {
      int64_t n = 1;
      for (int64_t d : kSpecs[i].shape) n *= d;
      std::vector<float> m(static_cast<size_t>(n));
      ZERO_RETURN_IF_ERROR(engine->GatherMasterWeights(static_cast<int>(i), m.data()));
      if (rank == 0) (*masters)[i] = m;
    }
    return OkStatus();
  });
}

TEST(InitializeFromSlices, StageThreeReadsOnlyEachRanksShardAndHoldsTheSameBits) {
  for (int world : {2, 3}) {
    std::vector<Read> reads, unused;
    std::vector<std::vector<float>> from_slices, from_full;
    ASSERT_OK(RunRanks(3, world, true, &reads, &from_slices));
    ASSERT_OK(RunRanks(3, world, false, &unused, &from_full));
    EXPECT_EQ(from_slices, from_full) << "world " << world;
    // Every (rank, parameter) asked at most once, for at most ceil(numel / world) elements, and the
    // ranks' ranges tile the parameter.
    for (size_t i = 0; i < kSpecs.size(); ++i) {
      int64_t n = 1;
      for (int64_t d : kSpecs[i].shape) n *= d;
      const int64_t shard = (n + world - 1) / world;
      std::vector<int> covered(static_cast<size_t>(n), 0);
      for (const Read& r : reads) {
        if (r.index != static_cast<int>(i)) continue;
        EXPECT_LE(r.count, shard) << kSpecs[i].name;
        EXPECT_EQ(r.begin, r.rank * shard) << kSpecs[i].name;
        for (int64_t e = r.begin; e < r.begin + r.count; ++e) ++covered[e];
      }
      for (int64_t e = 0; e < n; ++e) EXPECT_EQ(covered[e], 1) << kSpecs[i].name << " element " << e;
    }
  }
}

TEST(InitializeFromSlices, OtherStagesReadWholeParameters) {
  for (int stage : {0, 1, 2}) {
    std::vector<Read> reads, unused;
    std::vector<std::vector<float>> from_slices, from_full;
    ASSERT_OK(RunRanks(stage, 2, true, &reads, &from_slices));
    ASSERT_OK(RunRanks(stage, 2, false, &unused, &from_full));
    EXPECT_EQ(from_slices, from_full) << "stage " << stage;
    for (const Read& r : reads) EXPECT_EQ(r.begin, 0) << "stage " << stage;
  }
}

TEST(InitializeFromSlices, AReadErrorFailsInitializeNamingTheParameter) {
  Status st = RunThreadRanks(1, [&](int, Communicator* comm, Device* device) -> Status {
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(StageConfig(3, 1), device, comm));
    for (const ParamSpec& s : kSpecs) ZERO_RETURN_IF_ERROR(engine->RegisterParameter(s).status());
    return engine->InitializeFromSlices([](int index, int64_t, int64_t, float*) {
      return index == 2 ? DataLossError("model.safetensors: tensor c truncated") : OkStatus();
    });
  });
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("initial values of"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("truncated"), std::string::npos) << st.ToString();
}

}  // namespace
}  // namespace zero
