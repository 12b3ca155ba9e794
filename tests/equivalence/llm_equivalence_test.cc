// The transformer through the engine: the `tiny` Qwen3 preset (tied embedding, GQA, q/k norms)
// trained by the engine on N Gloo thread ranks must equal the same model trained by the plain
// data-parallel reference (reference.h), bitwise: losses, lr, norms, counters, initial and final
// master weights, model parameters and AdamW moments.
//
// Cells (docs/equivalence.md, "The transformer"): stages 0-3 x world {1, 2, 4} x GAS {1, 4} with
// no offload, optimizer offload to the CPU, NVMe (real O_DIRECT I/O) and tiered host+NVMe,
// parameter offload to the CPU and NVMe, the GPU FP32 gradient sum, the chunked GPU AdamW
// synchronous and overlapped with the next forward; managed accumulation and unmanaged windows of
// 2, 5 and 3 backwards (the user divides the loss by the count). Every parameter of the
// transformer gets a gradient in every micro step (the MLP cells cover inactive parameters).
//
// ThroughTheModelApi: the same model driven the way a user writes it (LlmCpu against
// EngineParams/EngineGrads: the tied embedding gathered by the embedding and the head modules,
// its two gradient contributions summed by the model and reported once) at stages 0-3 with two
// ranks and with optimizer/parameter offload at stage 3: final master weights and moments bitwise
// as the reference.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "comm/thread_ranks.h"
#include "engine/config/config.h"
#include "models/engine_adapters.h"
#include "models/llama/cpu_model.h"
#include "models/llama/params.h"
#include "testing/status_matchers.h"
#include "tests/equivalence/cell_checks.h"
#include "tests/equivalence/harness.h"
#include "tests/equivalence/llm_cell_model.h"
#include "tests/equivalence/reference.h"

namespace zero::equivalence {
namespace {

constexpr int kSteps = 3;
constexpr uint64_t kInitSeed = 1234;  // TinyLlmCellModel's

const LlmCellModel& TinyModel() { return TinyLlmCellModel(); }

// stage, world, GAS, mode, managed, dtype
using LlmParam = std::tuple<int, int, int, std::string, bool, DType>;

CellSpec LlmCell(const LlmParam& p) {
  return LlmCellSpec(std::get<0>(p), std::get<1>(p), std::get<2>(p), std::get<3>(p), std::get<4>(p), std::get<5>(p));
}

std::string LlmCellName(const LlmParam& p) { return LlmCell(p).Name() + "_" + std::get<3>(p); }

Schedule LlmSchedule(const CellSpec& cell) { return LlmCellSchedule(cell, kSteps); }

class LlmCellTest : public ::testing::TestWithParam<LlmParam> {};

TEST_P(LlmCellTest, EngineEqualsReferenceBitwise) {
  const CellSpec cell = LlmCell(GetParam());
  const Config config = ParseCell(cell);
  ASSERT_FALSE(::testing::Test::HasFailure());
  const Schedule schedule = LlmSchedule(cell);
  Result<RefTrace> ref = RunReference(config, cell.world, OrderOfStage(cell.stage), TinyModel(), schedule);
  ASSERT_OK(ref);
  ASSERT_EQ(ref->overflow_steps, 0);
  // The loss must move: a cell whose updates do nothing would compare nothing.
  ASSERT_NE(ref->losses.front().front().front(), ref->losses.back().back().front());
  std::vector<RankTrace> traces(cell.world);
  Status st = RunThreadRanks(cell.world, [&](int rank, Communicator* comm, Device* device) -> Status {
    return RunEngineRank(config, TinyModel(), schedule, device, comm, &traces[rank]);
  });
  ASSERT_OK(st);
  ExpectMatches(*ref, traces, Tolerance());
}

std::vector<LlmParam> LlmCells() {
  std::vector<LlmParam> out;
  const DType f32 = DType::kF32, bf16 = DType::kBF16;
  for (int stage = 0; stage <= 3; ++stage) {
    for (int world : {1, 2, 4}) {
      for (int gas : {1, 4}) out.emplace_back(stage, world, gas, "none", true, f32);
    }
    for (int gas : {1, 4}) out.emplace_back(stage, 2, gas, "none", true, bf16);
    out.emplace_back(stage, 2, 1, "none", false, bf16);
    out.emplace_back(stage, 4, 1, "none", false, f32);
  }
  for (int stage = 1; stage <= 3; ++stage) {
    for (int gas : {1, 4}) {
      for (int world : {1, 2, 4}) out.emplace_back(stage, world, gas, "cpu", true, bf16);
      for (int world : {1, 2}) {
        out.emplace_back(stage, world, gas, "nvme", true, bf16);
        out.emplace_back(stage, world, gas, "gpuchunk", true, bf16);
      }
      out.emplace_back(stage, 2, gas, "tiered", true, bf16);
      out.emplace_back(stage, 1, gas, "overlap", true, bf16);
    }
    for (const char* mode : {"cpu", "nvme", "tiered", "gpuchunk"}) out.emplace_back(stage, 2, 1, mode, false, bf16);
    out.emplace_back(stage, 1, 1, "overlap", false, bf16);
  }
  for (int gas : {1, 4}) {
    for (int world : {1, 2, 4}) out.emplace_back(3, world, gas, "paramcpu", true, bf16);
    for (int world : {1, 2}) {
      out.emplace_back(3, world, gas, "paramnvme", true, bf16);
      out.emplace_back(3, world, gas, "gpuacc", true, bf16);
    }
  }
  for (const char* mode : {"paramcpu", "paramnvme", "gpuacc"}) out.emplace_back(3, 2, 1, mode, false, bf16);
  return out;
}

INSTANTIATE_TEST_SUITE_P(Tiny, LlmCellTest, ::testing::ValuesIn(LlmCells()),
                         [](const ::testing::TestParamInfo<LlmParam>& info) { return LlmCellName(info.param); });

// ---------------------------------------------------------------------------------------------
// The model driven through model_api (the user's path): LlmCpu on EngineParams / EngineGrads.

Status TrainThroughModelApi(const Config& config, int steps, Device* device, Communicator* comm,
                            std::vector<std::vector<float>>* master, std::vector<std::vector<float>>* exp_avg) {
  const LlmCellModel& cell_model = TinyModel();
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(config, device, comm));
  const std::vector<examples::ModelParamSpec> specs = llm::LlmParamSpecs(cell_model.config());
  ZERO_RETURN_IF_ERROR(examples::RegisterAndInitialize(engine.get(), specs, kInitSeed));
  llm::LlmCpu model(cell_model.config());
  llm::LlmActivations acts;
  examples::EngineParams params(engine.get(), specs);
  examples::EngineGrads grads(engine.get());
  const int gas = static_cast<int>(config.gradient_accumulation_steps);
  for (int step = 0; step < steps; ++step) {
    for (int m = 0; m < gas; ++m) {
      const llm::LlmBatch batch = cell_model.MakeBatch(comm->rank(), step, m);
      ZERO_RETURN_IF_ERROR(model.Forward(params, batch, &acts).status());
      ZERO_RETURN_IF_ERROR(model.Backward(params, &acts, engine->gradient_scale(), grads));
      ZERO_RETURN_IF_ERROR(engine->Backward());
      ZERO_RETURN_IF_ERROR(engine->Step());
    }
  }
  const int n = engine->num_params();
  master->assign(n, {});
  exp_avg->assign(n, {});
  for (int i = 0; i < n; ++i) {
    const size_t numel = static_cast<size_t>(examples::TotalNumel({specs[i]}));
    (*master)[i].resize(numel);
    std::vector<float> v(numel);
    (*exp_avg)[i].resize(numel);
    ZERO_RETURN_IF_ERROR(engine->GatherMasterWeights(i, (*master)[i].data()));
    ZERO_RETURN_IF_ERROR(engine->GatherOptimizerState(i, (*exp_avg)[i].data(), v.data()));
  }
  return OkStatus();
}

class LlmModelApiTest : public ::testing::TestWithParam<LlmParam> {};

TEST_P(LlmModelApiTest, TiedEmbeddingThroughTheModelApiEqualsReference) {
  const CellSpec cell = LlmCell(GetParam());
  ASSERT_TRUE(TinyModel().config().tie_word_embeddings);
  const Config config = ParseCell(cell);
  ASSERT_FALSE(::testing::Test::HasFailure());
  const Schedule schedule = LlmSchedule(cell);
  Result<RefTrace> ref = RunReference(config, cell.world, OrderOfStage(cell.stage), TinyModel(), schedule);
  ASSERT_OK(ref);
  std::vector<std::vector<std::vector<float>>> master(cell.world), exp_avg(cell.world);
  Status st = RunThreadRanks(cell.world, [&](int rank, Communicator* comm, Device* device) -> Status {
    return TrainThroughModelApi(config, kSteps, device, comm, &master[rank], &exp_avg[rank]);
  });
  ASSERT_OK(st);
  const std::vector<ParamSpec> specs = TinyModel().Params();
  for (int r = 0; r < cell.world; ++r) {
    ASSERT_EQ(master[r].size(), ref->master.size());
    for (size_t p = 0; p < ref->master.size(); ++p) {
      EXPECT_EQ(master[r][p], ref->master[p]) << "rank " << r << " master " << specs[p].name;
      EXPECT_EQ(exp_avg[r][p], ref->exp_avg[p]) << "rank " << r << " exp_avg " << specs[p].name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Tiny, LlmModelApiTest,
    ::testing::Values(LlmParam{0, 2, 4, "none", true, DType::kBF16}, LlmParam{1, 2, 4, "none", true, DType::kBF16},
                      LlmParam{2, 2, 4, "none", true, DType::kBF16}, LlmParam{3, 2, 1, "none", true, DType::kBF16},
                      LlmParam{3, 2, 4, "none", true, DType::kF32}, LlmParam{3, 2, 4, "gpuacc", true, DType::kBF16},
                      LlmParam{3, 1, 1, "cpu", true, DType::kBF16}),
    [](const ::testing::TestParamInfo<LlmParam>& info) { return LlmCellName(info.param); });

}  // namespace
}  // namespace zero::equivalence
