#include "engine/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include <gloo/rendezvous/hash_store.h>

#include "comm/gloo_communicator.h"
#include "comm/thread_ranks.h"
#include "engine/config/config.h"
#include "engine/engine_test_util.h"
#include "runtime/cpu_device.h"
#include "runtime/device.h"
#include "runtime/device_arena.h"
#include "runtime/dtype.h"
#include "testing/deferred_device.h"
#include "testing/same_bits.h"
#include "testing/status_matchers.h"
#include "zero/partition.h"

namespace zero {
namespace {

using namespace ::zero::testing;  // NOLINT: engine_test_util.h's helpers

// --- API misuse ------------------------------------------------------------------------------

TEST(EngineApiTest, CallsOutOfOrderAndBadArguments) {
  Status s = RunThreadRanks(1, [](int rank, Communicator* comm, Device* device) -> Status {
    ZERO_ASSIGN_OR_RETURN(Config config,
                          MakeConfig(ConfigJson(3, 1, 0.0, "", "\"stage3_param_persistence_threshold\": 0"), 1));
    ZERO_ASSIGN_OR_RETURN(auto engine, Engine::Create(config, device, comm));
    ZERO_RETURN_IF_ERROR(Expect(engine->Step(), StatusCode::kFailedPrecondition, "Step"));
    ZERO_RETURN_IF_ERROR(Expect(engine->GatherModule("a").status(), StatusCode::kFailedPrecondition, "GatherModule"));
    ZERO_RETURN_IF_ERROR(Expect(engine->Backward(), StatusCode::kFailedPrecondition, "Backward"));
    ZERO_RETURN_IF_ERROR(engine->RegisterParameter({"a.w", {4, 3}, "a"}).status());
    ZERO_RETURN_IF_ERROR(engine->RegisterParameter({"b.w", {5}, "b"}).status());
    ZERO_RETURN_IF_ERROR(
        Expect(engine->RegisterParameter({"a.w", {2}, "a"}).status(), StatusCode::kInvalidArgument, "a.w"));
    ZERO_RETURN_IF_ERROR(engine->Initialize([](int, float* v) { v[0] = 1.0f; }));
    ZERO_RETURN_IF_ERROR(Expect(engine->RegisterParameter({"c", {1}, "c"}).status(), StatusCode::kFailedPrecondition,
                                "RegisterParameter"));
    ZERO_RETURN_IF_ERROR(Expect(engine->Initialize([](int, float*) {}), StatusCode::kFailedPrecondition, "Initialize"));
    ZERO_RETURN_IF_ERROR(Expect(engine->grad_buffer(7).status(), StatusCode::kInvalidArgument,
                                "grad_buffer(7): no such parameter (2 registered)"));
    ZERO_RETURN_IF_ERROR(Expect(engine->GradReady(-1), StatusCode::kInvalidArgument, "no such parameter"));
    ZERO_RETURN_IF_ERROR(Expect(engine->GradReady(0), StatusCode::kFailedPrecondition, "grad_buffer"));
    ZERO_RETURN_IF_ERROR(Expect(engine->GatherModule("zz").status(), StatusCode::kNotFound, "zz"));
    ZERO_RETURN_IF_ERROR(Expect(engine->param(0).status(), StatusCode::kFailedPrecondition, "a.w"));
    {
      ZERO_ASSIGN_OR_RETURN(ModuleHandle h, engine->GatherModule("a"));
      ZERO_RETURN_IF_ERROR(engine->param(0).status());
    }
    ZERO_RETURN_IF_ERROR(Expect(engine->param(0).status(), StatusCode::kFailedPrecondition, "a"));
    ZERO_ASSIGN_OR_RETURN(void* g, engine->grad_buffer(1));
    std::memset(g, 0, 5 * sizeof(float));
    ZERO_RETURN_IF_ERROR(engine->GradReady(1));
    ZERO_RETURN_IF_ERROR(Expect(engine->GradReady(1), StatusCode::kInvalidArgument, "'b.w'"));
    ZERO_RETURN_IF_ERROR(Expect(engine->grad_buffer(1).status(), StatusCode::kInvalidArgument, "'b.w'"));
    ZERO_RETURN_IF_ERROR(Expect(engine->Step(), StatusCode::kFailedPrecondition, "Backward"));
    ZERO_RETURN_IF_ERROR(
        Expect(engine->SetNoSync(true), StatusCode::kFailedPrecondition, "no_sync is not supported at ZeRO stage 3"));
    ZERO_RETURN_IF_ERROR(engine->Backward());
    ZERO_RETURN_IF_ERROR(engine->Step());
    if (!engine->was_step_applied()) return InternalError("step not applied");
    return OkStatus();
  });
  EXPECT_OK(s);
}

TEST(EngineApiTest, NoSyncRefusesTheBoundaryStep) {
  for (int stage : {0, 1}) {
    Status s = RunThreadRanks(1, [&](int rank, Communicator* comm, Device* device) -> Status {
      ZERO_ASSIGN_OR_RETURN(Config config, MakeConfig(ConfigJson(stage, 2, 0.0), 1));
      ZERO_ASSIGN_OR_RETURN(auto engine, Engine::Create(config, device, comm));
      ZERO_RETURN_IF_ERROR(engine->RegisterParameter({"w", {3}, "m"}).status());
      ZERO_RETURN_IF_ERROR(engine->Initialize([](int, float* v) { v[0] = v[1] = v[2] = 1.0f; }));
      ZERO_RETURN_IF_ERROR(engine->SetNoSync(true));
      for (int j = 0; j < 2; ++j) {
        if (engine->is_gradient_accumulation_boundary() != (j == 1)) return InternalError("boundary flag");
        ZERO_ASSIGN_OR_RETURN(void* g, engine->grad_buffer(0));
        float* f = static_cast<float*>(g);
        f[0] = f[1] = f[2] = 0.5f;
        ZERO_RETURN_IF_ERROR(engine->GradReady(0));
        ZERO_RETURN_IF_ERROR(engine->Backward());
        if (j == 0) {
          ZERO_RETURN_IF_ERROR(engine->Step());  // off the boundary: fine
          if (engine->was_step_applied()) return InternalError("applied off the boundary");
        }
      }
      ZERO_RETURN_IF_ERROR(Expect(engine->Step(), StatusCode::kFailedPrecondition, "no_sync"));
      ZERO_RETURN_IF_ERROR(Expect(engine->Backward(), StatusCode::kFailedPrecondition, "Step()"));
      ZERO_RETURN_IF_ERROR(engine->SetNoSync(false));
      ZERO_RETURN_IF_ERROR(engine->Step());
      if (!engine->was_step_applied() || engine->counters().global_steps != 1) {
        return InternalError("boundary step not applied");
      }
      return OkStatus();
    });
    EXPECT_OK(s) << "stage " << stage;
  }
}

TEST(EngineApiTest, InitialValuesMustAgreeAcrossRanks) {
  Status s = RunThreadRanks(2, [](int rank, Communicator* comm, Device* device) -> Status {
    ZERO_ASSIGN_OR_RETURN(Config config, MakeConfig(ConfigJson(1, 1, 0.0), 2));
    ZERO_ASSIGN_OR_RETURN(auto engine, Engine::Create(config, device, comm));
    ZERO_RETURN_IF_ERROR(engine->RegisterParameter({"same", {3}, "m"}).status());
    ZERO_RETURN_IF_ERROR(engine->RegisterParameter({"differs", {3}, "m"}).status());
    Status init = engine->Initialize([rank](int index, float* v) {
      for (int k = 0; k < 3; ++k) v[k] = index == 1 ? static_cast<float>(rank) : 1.0f;
    });
    return Expect(init, StatusCode::kInvalidArgument, "'differs'");
  });
  EXPECT_OK(s);
}

// The cross-rank hash of the initial values (64-bit words, 32-byte stripes, then a tail) tells a
// one-bit difference apart wherever it is: in a stripe, in the 8-byte tail words, in the last
// 4 bytes, in a parameter of one element.
TEST(EngineApiTest, InitialValuesDifferingInOneBitAnywhereAreCaught) {
  const std::vector<std::pair<int64_t, int64_t>> cases = {{1, 0}, {3, 2},      {8, 0},       {8, 7},
                                                          {9, 8}, {1001, 500}, {1001, 1000}, {1024, 1023}};
  for (const auto& [numel, at] : cases) {
    Status s = RunThreadRanks(2, [&, numel = numel, at = at](int rank, Communicator* comm, Device* device) -> Status {
      ZERO_ASSIGN_OR_RETURN(Config config, MakeConfig(ConfigJson(1, 1, 0.0), 2));
      ZERO_ASSIGN_OR_RETURN(auto engine, Engine::Create(config, device, comm));
      ZERO_RETURN_IF_ERROR(engine->RegisterParameter({"same", {numel}, "m"}).status());
      ZERO_RETURN_IF_ERROR(engine->RegisterParameter({"differs", {numel}, "m"}).status());
      Status init = engine->Initialize([&](int index, float* v) {
        for (int64_t k = 0; k < numel; ++k) v[k] = 0.001f * static_cast<float>(k) - 0.3f;
        if (index == 1 && rank == 1) v[at] = BitsToFloat(FloatBits(v[at]) ^ 1u);
      });
      return Expect(init, StatusCode::kInvalidArgument, "'differs'");
    });
    EXPECT_OK(s) << "numel " << numel << " at " << at;
  }
}

TEST(EngineApiTest, UnsupportedConfigIsRefused) {
  Status s = RunThreadRanks(1, [](int rank, Communicator* comm, Device* device) -> Status {
    // What is not built yet is refused at Create, naming the key and what to use instead.
    ZERO_ASSIGN_OR_RETURN(Config config, MakeConfig(ConfigJson(2, 1, 0.0), 1));
    // offload_param "nvme": below stage 3, without nvme_path, with a negative max_in_cpu (the
    // config parser refuses the first two as well).
    ZERO_ASSIGN_OR_RETURN(Config p, MakeConfig(ConfigJson(2, 1, 0.0), 1));
    p.zero.offload_param.device = OffloadDevice::kNvme;
    p.zero.offload_param.nvme_path = "/tmp";
    ZERO_RETURN_IF_ERROR(Expect(Engine::Create(p, device, comm).status(), StatusCode::kInvalidArgument,
                                "needs zero_optimization.stage 3; stage is 2), got \"nvme\""));
    p.zero.stage = 3;
    p.zero.offload_param.nvme_path.clear();
    ZERO_RETURN_IF_ERROR(Expect(Engine::Create(p, device, comm).status(), StatusCode::kInvalidArgument,
                                "zero_optimization.offload_param.nvme_path"));
    p.zero.offload_param.nvme_path = "/tmp";
    p.zero.offload_param.max_in_cpu = -1;
    ZERO_RETURN_IF_ERROR(Expect(Engine::Create(p, device, comm).status(), StatusCode::kInvalidArgument,
                                "zero_optimization.offload_param.max_in_cpu"));
    ZERO_ASSIGN_OR_RETURN(Config q, MakeConfig(ConfigJson(2, 1, 0.0), 1));
    q.zero.offload_param.device = OffloadDevice::kCpu;  // below stage 3 (ParseConfig refuses it too)
    ZERO_RETURN_IF_ERROR(Expect(Engine::Create(q, device, comm).status(), StatusCode::kInvalidArgument,
                                "needs zero_optimization.stage 3"));
    ZERO_ASSIGN_OR_RETURN(Config r, MakeConfig(ConfigJson(3, 1, 0.0), 1));
    r.zero.offload_optimizer.device = OffloadDevice::kCpu;
    r.zero.offload_optimizer.update_device = "gpu";  // partial offload is built for the CPU AdamW only
    r.zero.offload_optimizer.ratio = 0.5;
    return Expect(Engine::Create(r, device, comm).status(), StatusCode::kUnimplemented,
                  "offload_optimizer.ratio: partial offload with update_device \"gpu\" is not built");
  });
  EXPECT_OK(s);
}

// One config truth: a Config built in code (not parsed) is refused by Engine::Create (and Validate)
// with the message ParseConfig gives for the same value, less the file name.
TEST(EngineApiTest, ConfigBuiltInCodeIsRefusedWithTheParsersMessage) {
  struct Case {
    std::function<void(Config*)> set;
    std::string json;  // the same value as JSON, with "train_batch_size": 1
  };
  const std::vector<Case> cases = {
      // A key's own check (its range).
      {[](Config* c) { c->zero.allgather_bucket_size = 0; }, R"("zero_optimization": {"allgather_bucket_size": 0})"},
      // A key's own check (its choices).
      {[](Config* c) { c->gradient_allreduce_op = "avg"; }, R"("gradient_allreduce_op": "avg")"},
      // Rules between keys.
      {[](Config* c) {
         c->zero.stage = 2;
         c->zero.offload_param.device = OffloadDevice::kCpu;
       },
       R"("zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}})"},
      {[](Config* c) { c->fp16.enabled = c->bf16_enabled = true; },
       R"("fp16": {"enabled": true}, "bf16": {"enabled": true})"},
  };
  Status s = RunThreadRanks(1, [&](int, Communicator* comm, Device* device) -> Status {
    for (const Case& k : cases) {
      Config c;
      c.train_batch_size = c.train_micro_batch_size_per_gpu = c.gradient_accumulation_steps = 1;
      ZERO_RETURN_IF_ERROR(Engine::Create(c, device, comm).status());
      k.set(&c);
      const Status created = Engine::Create(c, device, comm).status();
      const Result<Config> parsed = ParseConfig("{\"train_batch_size\": 1, " + k.json + "}", ParseOptions());
      if (created.ok() || parsed.ok()) return InternalError(k.json + ": accepted");
      if (created.code() != StatusCode::kInvalidArgument ||
          "<config>: " + created.message() != parsed.status().message()) {
        return InternalError(k.json + ": Engine::Create says '" + created.message() + "', ParseConfig '" +
                             parsed.status().message() + "'");
      }
      if (Validate(c).message() != created.message()) return InternalError(k.json + ": Validate differs");
    }
    return OkStatus();
  });
  EXPECT_OK(s);
}

// --- training: stages agree -------------------------------------------------------------------

void ExpectSameAcrossRanks(const std::vector<TrainResult>& r) {
  for (size_t k = 1; k < r.size(); ++k) {
    EXPECT_TRUE(SameBits(r[0].master, r[k].master)) << "rank " << k << " master";
    EXPECT_TRUE(SameBits(r[0].model, r[k].model)) << "rank " << k << " model";
  }
}

TEST(EngineTrainingTest, AllStagesEqualStageZeroAtGas1Fp32World2) {
  const TestModel model = SmallModel();
  const auto ref = TrainAll(ConfigJson(0, 1, 0.0), 2, model);
  ExpectSameAcrossRanks(ref);
  EXPECT_EQ(ref[0].counters.global_steps, 3);
  EXPECT_EQ(ref[0].counters.adam_step, 3);
  // The weights moved.
  EXPECT_NE(ref[0].master[0][0], InitValue(0, 0));
  for (int stage = 1; stage <= 3; ++stage) {
    const auto got = TrainAll(ConfigJson(stage, 1, 0.0), 2, model);
    ExpectSameAcrossRanks(got);
    EXPECT_TRUE(SameBits(ref[0].master, got[0].master)) << "stage " << stage;
    EXPECT_TRUE(SameBits(ref[0].model, got[0].model)) << "stage " << stage;
    for (size_t k = 0; k < ref[0].norms.size(); ++k) {
      EXPECT_NEAR(ref[0].norms[k], got[0].norms[k], 1e-9 * ref[0].norms[k]) << "stage " << stage;
    }
  }
}

TEST(EngineTrainingTest, SameReductionOrderIsBitwiseEqualWithAccumulation) {
  const TestModel model = SmallModel();
  // Stages 0/1 reduce fp32 window sums; stages 2/3 reduce each micro step's gradients.
  const auto s0 = TrainAll(ConfigJson(0, 3, 0.0), 2, model);
  const auto s1 = TrainAll(ConfigJson(1, 3, 0.0), 2, model);
  const auto s2 = TrainAll(ConfigJson(2, 3, 0.0), 2, model);
  const auto s3 = TrainAll(ConfigJson(3, 3, 0.0), 2, model);
  EXPECT_TRUE(SameBits(s0[0].master, s1[0].master));
  EXPECT_TRUE(SameBits(s2[0].master, s3[0].master));
  EXPECT_TRUE(SameBits(s2[1].model, s3[1].model));
  for (size_t i = 0; i < s0[0].master.size(); ++i) {
    for (size_t k = 0; k < s0[0].master[i].size(); ++k) {
      EXPECT_NEAR(s0[0].master[i][k], s2[0].master[i][k], 1e-5f);
    }
  }
  EXPECT_EQ(s0[0].counters.micro_steps, 9);
  EXPECT_EQ(s0[0].counters.global_steps, 3);
}

TEST(EngineTrainingTest, Bf16Stage2EqualsStage3AndSumOpDiffers) {
  const TestModel model = SmallModel();
  const std::string bf16 = "\"bf16\": {\"enabled\": true}";
  const auto s2 = TrainAll(ConfigJson(2, 2, 1.0, bf16), 2, model);
  const auto s3 = TrainAll(ConfigJson(3, 2, 1.0, bf16), 2, model);
  EXPECT_TRUE(SameBits(s2[0].master, s3[0].master));
  EXPECT_TRUE(SameBits(s2[0].model, s3[0].model));
  // Model params are the master weights rounded to bf16.
  for (size_t i = 0; i < s2[0].master.size(); ++i) {
    for (size_t k = 0; k < s2[0].master[i].size(); ++k) {
      EXPECT_EQ(s2[0].model[i][k], Bf16ToFloat(FloatToBf16(s2[0].master[i][k])));
    }
  }
  const auto sum = TrainAll(ConfigJson(2, 2, 0.0, bf16 + ", \"gradient_allreduce_op\": \"sum\""), 2, model);
  const auto mean = TrainAll(ConfigJson(2, 2, 0.0, bf16), 2, model);
  EXPECT_FALSE(SameBits(sum[0].master, mean[0].master));
}

TEST(EngineTrainingTest, ClippingScalesTheUpdateAndNormsAgree) {
  const TestModel model = SmallModel();
  TrainOptions ro;
  ro.grad_scale = 50.0f;  // norms well above the clip value
  const auto s0 = TrainAll(ConfigJson(0, 1, 1.0), 2, model, ro);
  const auto s2 = TrainAll(ConfigJson(2, 1, 1.0), 2, model, ro);
  ASSERT_EQ(s0[0].norms.size(), 3u);
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_GT(s0[0].norms[k], 1.0);
    EXPECT_NEAR(s0[0].norms[k], s2[0].norms[k], 1e-9 * s0[0].norms[k]);
    EXPECT_EQ(s0[0].norms[k], s0[1].norms[k]);
    EXPECT_EQ(s2[0].norms[k], s2[1].norms[k]);
  }
  for (size_t i = 0; i < s0[0].master.size(); ++i) {
    for (size_t k = 0; k < s0[0].master[i].size(); ++k) {
      EXPECT_NEAR(s0[0].master[i][k], s2[0].master[i][k], 1e-6f);
    }
  }
}

// Update in backward (managed, GAS 1, one rank, stages 2/3, no fp16 or clipping): no fp32
// gradient partition is allocated, param() keeps its value until Step(), the step equals the
// same run with clipping enabled but never active (which updates at Step()), and ZeroGrad() after
// such a Backward() is refused.
TEST(EngineTrainingTest, UpdateInBackwardKeepsParamUntilStepAndNeedsNoGradientPartition) {
  for (int stage : {2, 3}) {
    std::vector<float> got, want;
    for (double clip : {0.0, 1e30}) {  // 1e30: clipping on (the boundary path), never active
      Status s = RunThreadRanks(1, [&](int, Communicator* comm, Device* device) -> Status {
        ZERO_ASSIGN_OR_RETURN(Config config,
                              MakeConfig(ConfigJson(stage, 1, clip, "\"bf16\": {\"enabled\": true}"), 1));
        ZERO_ASSIGN_OR_RETURN(auto engine, Engine::Create(config, device, comm));
        ZERO_RETURN_IF_ERROR(engine->RegisterParameter({"w", {37}, "m"}).status());
        ZERO_RETURN_IF_ERROR(engine->RegisterParameter({"unused", {5}, "m"}).status());
        ZERO_RETURN_IF_ERROR(engine->Initialize([](int index, float* v) {
          for (int k = 0; k < (index == 0 ? 37 : 5); ++k) v[k] = 0.25f + 0.01f * k;
        }));
        if (clip == 0.0 && engine->memory().gradient_accumulators != 0) {
          return InternalError("a gradient partition was allocated: " +
                               std::to_string(engine->memory().gradient_accumulators));
        }
        std::vector<float> before, after_ready, w(37);
        for (int step = 0; step < 3; ++step) {
          ZERO_ASSIGN_OR_RETURN(ModuleHandle h, engine->GatherModule("m"));
          ZERO_RETURN_IF_ERROR(ReadParam(engine.get(), device, 0, &before));
          std::vector<float> g(37);
          for (int k = 0; k < 37; ++k) g[k] = 0.5f - 0.03f * k + 0.1f * step;
          ZERO_RETURN_IF_ERROR(WriteGrad(engine.get(), device, 0, g));
          ZERO_RETURN_IF_ERROR(ReadParam(engine.get(), device, 0, &after_ready));
          if (after_ready != before) return InternalError("param() changed before Step()");
          ZERO_RETURN_IF_ERROR(h.Release());
          ZERO_RETURN_IF_ERROR(engine->Backward());
          if (clip == 0.0 && engine->ZeroGrad().ok())
            return InternalError("ZeroGrad accepted after an update in backward");
          ZERO_RETURN_IF_ERROR(engine->Step());
        }
        for (int i = 0; i < 2; ++i) {
          std::vector<float> m(Numel(engine->param_spec(i))), v(m.size()), p(m.size()), q(m.size());
          ZERO_RETURN_IF_ERROR(engine->GatherMasterWeights(i, p.data()));
          ZERO_RETURN_IF_ERROR(engine->GatherOptimizerState(i, m.data(), v.data()));
          ZERO_RETURN_IF_ERROR(engine->GatherModelParam(i, q.data()));
          for (auto* t : {&p, &m, &v, &q})
            (clip == 0.0 ? got : want).insert((clip == 0.0 ? got : want).end(), t->begin(), t->end());
        }
        return OkStatus();
      });
      ASSERT_OK(s) << "stage " << stage << " clip " << clip;
    }
    ASSERT_EQ(got.size(), want.size());
    for (size_t k = 0; k < got.size(); ++k)
      ASSERT_EQ(FloatBits(got[k]), FloatBits(want[k])) << "stage " << stage << " element " << k;
  }
}

// Stage 3 with several ranks, ranks reporting different parameters (rank 0 head_a, rank 1 head_b;
// no gathers, so both modules complete at Backward()): each rank contributes zeros for what it did not
// report, so the weights are bitwise those of a run where every rank reports both, the other one as
// an explicit zero gradient. And reports in opposite orders reduce the same layout.
TEST(EngineTrainingTest, Stage3RanksReportingDifferentParametersContributeZeros) {
  std::vector<std::vector<float>> weights[2];
  for (int explicit_zeros = 0; explicit_zeros < 2; ++explicit_zeros) {
    weights[explicit_zeros].assign(2, {});
    Status s = RunThreadRanks(2, [&](int rank, Communicator* comm, Device* device) -> Status {
      ZERO_ASSIGN_OR_RETURN(Config config, MakeConfig(ConfigJson(3, 1, 0.0), 2));
      ZERO_ASSIGN_OR_RETURN(auto engine, Engine::Create(config, device, comm));
      ZERO_RETURN_IF_ERROR(engine->RegisterParameter({"head_a", {8}, "a"}).status());
      ZERO_RETURN_IF_ERROR(engine->RegisterParameter({"head_b", {8}, "b"}).status());
      ZERO_RETURN_IF_ERROR(engine->Initialize([](int, float* v) {
        for (int k = 0; k < 8; ++k) v[k] = 0.5f;
      }));
      std::vector<float> g(8);
      for (int k = 0; k < 8; ++k) g[k] = 0.25f * static_cast<float>(k + 1 + 8 * rank);
      const std::vector<float> zero(8, 0.0f);
      // Both, in opposite orders.
      ZERO_RETURN_IF_ERROR(WriteGrad(engine.get(), device, rank == 0 ? 0 : 1, g));
      ZERO_RETURN_IF_ERROR(WriteGrad(engine.get(), device, rank == 0 ? 1 : 0, g));
      ZERO_RETURN_IF_ERROR(engine->Backward());
      ZERO_RETURN_IF_ERROR(engine->Step());
      // Rank 0 head_a only, rank 1 head_b only (or the other one as explicit zeros).
      ZERO_RETURN_IF_ERROR(WriteGrad(engine.get(), device, rank, g));
      if (explicit_zeros) ZERO_RETURN_IF_ERROR(WriteGrad(engine.get(), device, 1 - rank, zero));
      ZERO_RETURN_IF_ERROR(engine->Backward());
      ZERO_RETURN_IF_ERROR(engine->Step());
      for (int i = 0; i < 2; ++i) {
        std::vector<float> w(8);
        ZERO_RETURN_IF_ERROR(engine->GatherMasterWeights(i, w.data()));
        if (rank == 0) weights[explicit_zeros][i] = w;
      }
      return OkStatus();
    });
    ASSERT_OK(s);
  }
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(weights[0][i].size(), 8u);
    EXPECT_EQ(std::memcmp(weights[0][i].data(), weights[1][i].data(), 8 * sizeof(float)), 0) << "parameter " << i;
    EXPECT_NE(weights[0][i][0], 0.5f) << "parameter " << i << " was not updated";
  }
}

// With the opt-in freeze (PyTorch's set_to_none behaviour); the default steps them (equivalence
// suite, UnmanagedTest and UnmanagedEqualsManagedTest).
TEST(EngineTrainingTest, UnmanagedWithFreezeLeavesParametersWithoutGradientsUntouched) {
  const TestModel model = SmallModel();
  TrainOptions ro;
  ro.skip_params = {1, 4};
  for (int stage = 0; stage <= 3; ++stage) {
    const std::string unmanaged = "\"managed_gradient_accumulation\": false, \"freeze_inactive_parameters\": true";
    const auto r =
        TrainAll(ConfigJson(stage, 1, 1.0, unmanaged, stage <= 1 ? "\"overlap_comm\": false" : ""), 2, model, ro);
    ExpectSameAcrossRanks(r);
    for (int i : ro.skip_params) {
      for (size_t k = 0; k < r[0].master[i].size(); ++k) {
        EXPECT_EQ(r[0].master[i][k], InitValue(i, k)) << "stage " << stage << " param " << i;
      }
    }
    EXPECT_NE(r[0].master[0][0], InitValue(0, 0)) << "stage " << stage;
  }
  // Managed mode updates every parameter (weight decay moves even those without gradients).
  const auto m = TrainAll(ConfigJson(2, 1, 1.0), 2, model, ro);
  EXPECT_NE(m[0].master[1][0], InitValue(1, 0));
}

// DeepSpeed divides the loss by GAS before scaling it, so the fp16 gradients of a micro step are
// GAS times smaller than the window's mean times the scale: a gradient that overflows fp16 at
// scale 2^16 (2 * 65536 > 65504) does not once divided by GAS = 4, and the step applies with the
// unscaled norm of the window's mean gradient. Unmanaged mode leaves the division to the user.
TEST(EngineTrainingTest, GradientScaleIncludesOneOverGasInManagedMode) {
  for (bool managed : {true, false}) {
    std::string extra = "\"fp16\": {\"enabled\": true}";
    if (!managed) extra += ", \"managed_gradient_accumulation\": false";
    Status s = RunThreadRanks(1, [&](int, Communicator* comm, Device* device) -> Status {
      ZERO_ASSIGN_OR_RETURN(Config config, MakeConfig(ConfigJson(2, 4, 0.0, extra), 1));
      ZERO_ASSIGN_OR_RETURN(auto engine, Engine::Create(config, device, comm));
      ZERO_RETURN_IF_ERROR(engine->RegisterParameter({"w", {5}, "m"}).status());
      ZERO_RETURN_IF_ERROR(engine->Initialize([](int, float* v) {
        for (int k = 0; k < 5; ++k) v[k] = 0.25f * k;
      }));
      const float want_scale = managed ? 65536.0f / 4 : 65536.0f;
      if (engine->gradient_scale() != want_scale) {
        return InternalError("gradient_scale " + std::to_string(engine->gradient_scale()));
      }
      // The user's side: each micro step's gradient 2.0, times gradient_scale(); unmanaged, the
      // user divides by the 4 backwards of the window.
      const float g = 2.0f * engine->gradient_scale() / (managed ? 1.0f : 4.0f);
      for (int micro = 0; micro < 4; ++micro) {
        ZERO_RETURN_IF_ERROR(WriteGrad(engine.get(), device, 0, std::vector<float>(5, g)));
        ZERO_RETURN_IF_ERROR(engine->Backward());
        if (managed) ZERO_RETURN_IF_ERROR(engine->Step());
      }
      if (!managed) ZERO_RETURN_IF_ERROR(engine->Step());
      if (!engine->was_step_applied()) return InternalError("step skipped: the fp16 gradient overflowed");
      const double want = std::sqrt(5.0) * 2.0;
      if (std::fabs(engine->global_grad_norm() - want) > 1e-12 * want) {
        return InternalError("norm " + std::to_string(engine->global_grad_norm()));
      }
      return OkStatus();
    });
    EXPECT_OK(s) << (managed ? "managed: " : "unmanaged: ");
  }
}

TEST(EngineTrainingTest, Fp16OverflowSkipsTheStep) {
  Status s = RunThreadRanks(2, [](int rank, Communicator* comm, Device* device) -> Status {
    ZERO_ASSIGN_OR_RETURN(Config config,
                          MakeConfig(ConfigJson(2, 1, 1.0, "\"fp16\": {\"enabled\": true, \"hysteresis\": 1}"), 2));
    ZERO_ASSIGN_OR_RETURN(auto engine, Engine::Create(config, device, comm));
    ZERO_RETURN_IF_ERROR(engine->RegisterParameter({"w", {5}, "m"}).status());
    ZERO_RETURN_IF_ERROR(engine->Initialize([](int, float* v) {
      for (int k = 0; k < 5; ++k) v[k] = 0.25f * k;
    }));
    const float scale0 = engine->loss_scale();
    if (scale0 != 65536.0f) return InternalError("initial loss scale " + std::to_string(scale0));
    std::vector<float> g(5, 1.0f);
    if (rank == 1) g[3] = std::numeric_limits<float>::infinity();
    ZERO_RETURN_IF_ERROR(WriteGrad(engine.get(), device, 0, g));
    ZERO_RETURN_IF_ERROR(engine->Backward());
    ZERO_RETURN_IF_ERROR(engine->Step());
    if (engine->was_step_applied()) return InternalError("overflow step applied");
    if (!std::isinf(engine->global_grad_norm())) return InternalError("norm not inf");
    const EngineCounters& c = engine->counters();
    if (c.global_steps != 1 || c.skipped_steps != 1 || c.adam_step != 0) return InternalError("counters");
    if (engine->loss_scale() != scale0 / 2) return InternalError("scale not halved");
    std::vector<float> w(5);
    ZERO_RETURN_IF_ERROR(engine->GatherMasterWeights(0, w.data()));
    for (int k = 0; k < 5; ++k) {
      if (w[k] != 0.25f * k) return InternalError("weights changed on overflow");
    }
    // The next window (finite, scaled gradients) applies.
    std::vector<float> ok(5, engine->loss_scale() * 0.001f);
    ZERO_RETURN_IF_ERROR(WriteGrad(engine.get(), device, 0, ok));
    ZERO_RETURN_IF_ERROR(engine->Backward());
    ZERO_RETURN_IF_ERROR(engine->Step());
    if (!engine->was_step_applied() || engine->counters().adam_step != 1) return InternalError("not applied");
    const float g16 = HalfToFloat(FloatToHalf(ok[0]));  // what the fp16 gradient holds
    const double want = std::sqrt(5.0 * static_cast<double>(g16) * g16) / engine->loss_scale();
    if (std::fabs(engine->global_grad_norm() - want) > 1e-6 * want) {
      return InternalError("norm " + std::to_string(engine->global_grad_norm()));
    }
    return OkStatus();
  });
  EXPECT_OK(s);
}

// stop_on_nonfinite (issue 23): a NaN or inf gradient on a step that would be applied ends Step()
// on every rank with an error naming the step (with clipping before the update, without it after);
// false is DeepSpeed's behaviour (applied, training goes on). World 1 without clipping updates in
// backward, world 2 at the boundary.
TEST(EngineTrainingTest, NonFiniteGradientNormStopsTheStep) {
  for (const int world : {1, 2}) {
    for (const double clip : {1.0, 0.0}) {
      for (const bool stop : {true, false}) {
        const std::string what =
            "world " + std::to_string(world) + " clip " + std::to_string(clip) + " stop " + std::to_string(stop);
        Status s = RunThreadRanks(world, [&](int rank, Communicator* comm, Device* device) -> Status {
          ZERO_ASSIGN_OR_RETURN(Config config,
                                MakeConfig(ConfigJson(2, 1, clip, stop ? "" : "\"stop_on_nonfinite\": false"), world));
          ZERO_ASSIGN_OR_RETURN(auto engine, Engine::Create(config, device, comm));
          ZERO_RETURN_IF_ERROR(engine->RegisterParameter({"w", {5}, "m"}).status());
          ZERO_RETURN_IF_ERROR(engine->Initialize([](int, float* v) {
            for (int k = 0; k < 5; ++k) v[k] = 0.25f * k;
          }));
          std::vector<float> g(5, 1.0f);
          if (rank == world - 1) g[3] = std::numeric_limits<float>::quiet_NaN();
          ZERO_RETURN_IF_ERROR(WriteGrad(engine.get(), device, 0, g));
          ZERO_RETURN_IF_ERROR(engine->Backward());
          const Status st = engine->Step();
          if (!std::isnan(engine->global_grad_norm())) return InternalError("norm not NaN");
          if (!stop) {
            ZERO_RETURN_IF_ERROR(st);
            if (!engine->was_step_applied() || engine->counters().adam_step != 1) return InternalError("not applied");
            return OkStatus();
          }
          ZERO_RETURN_IF_ERROR(Expect(st, StatusCode::kFailedPrecondition,
                                      "the global gradient norm of optimizer step 1 is nan (a NaN or inf in some "
                                      "rank's gradients); "));
          ZERO_RETURN_IF_ERROR(Expect(st, StatusCode::kFailedPrecondition,
                                      clip > 0 ? "the step was not applied (the weights are as before)"
                                               : "the step was applied (without gradient_clipping or fp16"));
          ZERO_RETURN_IF_ERROR(Expect(st, StatusCode::kFailedPrecondition, "set stop_on_nonfinite: false"));
          if (engine->counters().adam_step != 0) return InternalError("adam_step counted");
          return Expect(engine->Step(), StatusCode::kFailedPrecondition,
                        "the engine is unusable after an earlier error");
        });
        EXPECT_OK(s) << what;
      }
    }
  }
}

TEST(EngineTrainingTest, WorldOneAllStages) {
  const TestModel model = SmallModel();
  const auto ref = TrainAll(ConfigJson(0, 2, 1.0), 1, model);
  for (int stage = 1; stage <= 3; ++stage) {
    const auto got = TrainAll(ConfigJson(stage, 2, 1.0), 1, model);
    for (size_t i = 0; i < ref[0].master.size(); ++i) {
      for (size_t k = 0; k < ref[0].master[i].size(); ++k) {
        EXPECT_NEAR(ref[0].master[i][k], got[0].master[i][k], 1e-6f) << "stage " << stage;
      }
    }
  }
}

// With one rank no reduction is needed: stages 0/1 skip the reducer (and stage 1 its separate
// gradient partition), stages 2/3 add each gradient straight into the fp32 partition (no bucket, no
// conversion buffer, also with communication_data_type fp32). Every stage then trains bitwise like
// stage 0 (which the equivalence suite checks against the host reference at world 1), norms
// included, for every dtype, GAS 1 and 3, with and without clipping and contiguous_gradients.
TEST(EngineTrainingTest, WorldOneEveryStageBitwiseLikeStageZeroWithoutBuckets) {
  const TestModel model = SmallModel();
  const std::string bf16 = "\"bf16\": {\"enabled\": true}";
  const std::string fp16 = "\"fp16\": {\"enabled\": true}";
  const std::string comm_fp32 = "\"communication_data_type\": \"fp32\"";
  const std::vector<std::string> dtypes = {"", bf16, bf16 + ", " + comm_fp32, fp16, fp16 + ", " + comm_fp32};
  for (const std::string& dtype : dtypes) {
    for (int gas : {1, 3}) {
      for (double clip : {0.0, 1.0}) {
        const std::string where = "[" + dtype + "] gas " + std::to_string(gas) + " clip " + std::to_string(clip);
        // communication_data_type is refused at stages 0/1; the reference is stage 0 without it.
        const std::string base =
            dtype.find("communication") == std::string::npos ? dtype : dtype.substr(0, dtype.find(", "));
        const auto ref = TrainAll(ConfigJson(0, gas, clip, base), 1, model);
        for (int stage = 0; stage <= 3; ++stage) {
          for (const std::string zero_extra : {"", "\"contiguous_gradients\": false"}) {
            const auto got = TrainAll(ConfigJson(stage, gas, clip, stage <= 1 ? base : dtype, zero_extra), 1, model);
            EXPECT_TRUE(SameBits(ref[0].master, got[0].master))
                << where << " stage " << stage << " " << zero_extra << " master";
            EXPECT_TRUE(SameBits(ref[0].model, got[0].model))
                << where << " stage " << stage << " " << zero_extra << " model";
            ASSERT_EQ(ref[0].norms.size(), got[0].norms.size());
            for (size_t k = 0; k < ref[0].norms.size(); ++k) {
              EXPECT_EQ(ref[0].norms[k], got[0].norms[k]) << where << " stage " << stage << " step " << k;
            }
            // No bucket staging (no reduction, no conversion buffer) at any stage.
            EXPECT_EQ(got[0].memory.bucket_staging, 0u) << where << " stage " << stage << " " << zero_extra;
            // Stage 1 holds no gradient partition besides its accumulators: the same as stage 0.
            if (stage == 1) {
              EXPECT_EQ(got[0].memory.gradients, ref[0].memory.gradients) << where;
            }
          }
        }
      }
    }
  }
  // A communication dtype narrower than the model dtype rounds each gradient: that still goes
  // through the reducer's conversion, at one rank too (stages 2 and 3 agree; stage 0 differs).
  const std::string fp32_comm_bf16 = "\"communication_data_type\": \"bf16\"";
  const auto ref = TrainAll(ConfigJson(0, 2, 0.0), 1, model);
  const auto s2 = TrainAll(ConfigJson(2, 2, 0.0, fp32_comm_bf16), 1, model);
  const auto s3 = TrainAll(ConfigJson(3, 2, 0.0, fp32_comm_bf16), 1, model);
  EXPECT_TRUE(SameBits(s2[0].master, s3[0].master));
  EXPECT_FALSE(SameBits(ref[0].master, s2[0].master));
  EXPECT_GT(s3[0].memory.bucket_staging, 0u);
}

// The first contribution of a window overwrites the fp32 accumulator instead of adding to a
// zero-filled one (AccumulateFirst): still exactly 0.0f + g, so a -0 gradient accumulates to +0.
// Made observable with beta1 = 0 (exp_avg = g): step 1 gives exp_avg = -1, step 2's all -0 gradient
// must give exp_avg = 0 * -1 + (+0) = +0 (a copy of the -0 would leave -0: -0 + -0). Every stage,
// one and two ranks, GAS 1 and 2.
TEST(EngineTrainingTest, NegativeZeroGradientAccumulatesToPositiveZero) {
  for (int world : {1, 2}) {
    for (int stage = 0; stage <= 3; ++stage) {
      for (int gas : {1, 2}) {
        const std::string json = ConfigJson(stage, gas, 0.0);
        // beta1 = 0 (valid: [0, 1)); weight decay 0.
        std::string j = json;
        const std::string from = "\"params\": {\"lr\": 0.01, \"weight_decay\": 0.1}";
        j.replace(j.find(from), from.size(),
                  "\"params\": {\"lr\": 0.01, \"weight_decay\": 0.0, \"betas\": [0.0, 0.999]}");
        Status s = RunThreadRanks(world, [&](int rank, Communicator* comm, Device* device) -> Status {
          ZERO_ASSIGN_OR_RETURN(Config config, MakeConfig(j, world));
          ZERO_ASSIGN_OR_RETURN(auto engine, Engine::Create(config, device, comm));
          ZERO_RETURN_IF_ERROR(engine->RegisterParameter({"w", {9}, "m"}).status());
          ZERO_RETURN_IF_ERROR(engine->RegisterParameter({"b", {3}, "m"}).status());
          ZERO_RETURN_IF_ERROR(engine->Initialize([](int index, float* v) {
            for (int k = 0; k < (index == 0 ? 9 : 3); ++k) v[k] = 0.5f + 0.125f * k;
          }));
          for (int step = 0; step < 2; ++step) {
            for (int micro = 0; micro < gas; ++micro) {
              ZERO_ASSIGN_OR_RETURN(ModuleHandle h, engine->GatherModule("m"));
              // gradient_scale() is 1/GAS here: the window's mean gradient is -1 (step 0) or -0.
              const float gs = engine->gradient_scale();
              ZERO_RETURN_IF_ERROR(WriteGrad(engine.get(), device, 0, std::vector<float>(9, step == 0 ? -gs : -0.0f)));
              ZERO_RETURN_IF_ERROR(WriteGrad(engine.get(), device, 1, std::vector<float>(3, -0.5f)));
              ZERO_RETURN_IF_ERROR(h.Release());
              ZERO_RETURN_IF_ERROR(engine->Backward());
              ZERO_RETURN_IF_ERROR(engine->Step());
            }
            std::vector<float> m(9), v(9);
            ZERO_RETURN_IF_ERROR(engine->GatherOptimizerState(0, m.data(), v.data()));
            for (int k = 0; k < 9; ++k) {
              const uint32_t want = step == 0 ? FloatBits(-1.0f) : 0u;
              if (FloatBits(m[k]) != want) {
                return InternalError("rank " + std::to_string(rank) + " step " + std::to_string(step) + ": exp_avg[" +
                                     std::to_string(k) + "] bits " + std::to_string(FloatBits(m[k])) + ", expected " +
                                     std::to_string(want));
              }
            }
          }
          return OkStatus();
        });
        EXPECT_OK(s) << "world " << world << " stage " << stage << " gas " << gas;
      }
    }
  }
}

// --- memory ---------------------------------------------------------------------------------

TEST(EngineMemoryTest, PartitionedStateIsAboutOneNth) {
  const TestModel model = BlockModel(4, 1000, 10);
  for (int stage = 0; stage <= 3; ++stage) {
    const std::string no_persistence = "\"stage3_param_persistence_threshold\": 0";
    TrainOptions ro;
    ro.steps = 1;
    const auto one = TrainAll(ConfigJson(stage, 1, 1.0, "", no_persistence), 1, model, ro);
    const auto four = TrainAll(ConfigJson(stage, 1, 1.0, "", no_persistence), 4, model, ro);
    const EngineMemory& a = one[0].memory;
    const EngineMemory& b = four[0].memory;
    auto about_quarter = [](size_t full, size_t part) { return part * 4 <= full + 4 * 2048 && part * 3 < full; };
    if (stage >= 1) {
      EXPECT_TRUE(about_quarter(a.master_params, b.master_params))
          << stage << ": " << a.master_params << " " << b.master_params;
      EXPECT_TRUE(about_quarter(a.optimizer_states, b.optimizer_states)) << stage;
    } else {
      EXPECT_EQ(a.master_params, b.master_params);
    }
    if (stage == 3) {
      EXPECT_TRUE(about_quarter(a.model_params, b.model_params)) << a.model_params << " " << b.model_params;
    } else {
      EXPECT_EQ(a.model_params, b.model_params);
    }
  }
}

// Optimizer offload "cpu" (the CPU AdamW): the fp32 gradient partition is in host memory, none of
// it on the device with offload_grad_accumulation "cpu" (stages 2 and 3); with "gpu" (stage 3 with
// offload_param too) the device holds exactly the 4-byte fp32 sum, as large as the partition
// without offload. The weights, moments and norms are the same bits in all three.
TEST(EngineGradOffloadTest, GradientPartitionOnTheHostAndTheGpuSum) {
  const TestModel model = BlockModel(3, 3000, 10);
  const std::string cpu_opt = "\"offload_optimizer\": {\"device\": \"cpu\", \"cpu_threads\": 2}";
  const std::string param = ", \"offload_param\": {\"device\": \"cpu\"}";
  TrainOptions ro;
  ro.steps = 2;
  for (int world : {1, 2}) {
    SCOPED_TRACE("world " + std::to_string(world));
    for (int stage : {2, 3}) {
      SCOPED_TRACE("stage " + std::to_string(stage));
      const std::string p = stage == 3 ? param : "";
      const auto none = TrainAll(ConfigJson(stage, 2, 0.0, "", p.empty() ? "" : p.substr(2)), world, model, ro);
      const auto cpu = TrainAll(ConfigJson(stage, 2, 0.0, "", cpu_opt + p), world, model, ro);
      ASSERT_EQ(none.size(), static_cast<size_t>(world));
      ASSERT_EQ(cpu.size(), static_cast<size_t>(world));
      for (int r = 0; r < world; ++r) {
        const size_t partition = none[r].memory.gradient_accumulators;  // fp32, on the device
        EXPECT_GT(partition, 0u);
        EXPECT_EQ(none[r].memory.host_gradients, 0u);
        EXPECT_EQ(cpu[r].memory.gradient_accumulators, 0u) << "rank " << r << ": fp32 gradients on the device";
        EXPECT_GE(cpu[r].memory.host_gradients, partition) << "rank " << r;
        EXPECT_TRUE(SameBits(cpu[r].master, none[r].master)) << "rank " << r;
        EXPECT_EQ(cpu[r].norms, none[r].norms) << "rank " << r;
      }
      if (stage != 3) continue;
      const auto gpu = TrainAll(ConfigJson(stage, 2, 0.0, "", cpu_opt + p + ", \"offload_grad_accumulation\": \"gpu\""),
                                world, model, ro);
      ASSERT_EQ(gpu.size(), static_cast<size_t>(world));
      for (int r = 0; r < world; ++r) {
        EXPECT_EQ(gpu[r].memory.gradient_accumulators, none[r].memory.gradient_accumulators)
            << "rank " << r << ": the device sum is 4 bytes per partition element";
        // The same host partition, without the staging slots (the sums arrive by Store).
        EXPECT_LT(gpu[r].memory.host_gradients, cpu[r].memory.host_gradients) << "rank " << r;
        EXPECT_GE(gpu[r].memory.host_gradients, none[r].memory.gradient_accumulators) << "rank " << r;
        EXPECT_TRUE(SameBits(gpu[r].master, cpu[r].master)) << "rank " << r;
        EXPECT_TRUE(SameBits(gpu[r].model, cpu[r].model)) << "rank " << r;
        EXPECT_EQ(gpu[r].norms, cpu[r].norms) << "rank " << r;
      }
    }
  }
}

// offload_optimizer.ratio below 1 (partial offload): the partition's first elements keep their
// states on the device (device AdamW), the rest in host memory (the CPU AdamW). Bitwise the full
// offload and no offload - weights, model copy, moments, norms - in the update in backward (one
// rank, GAS 1, no clipping), with a host gradient partition (GAS 2; clipping that bites, where the
// device share's host gradients are uploaded), with offload_param "cpu" and at world 2; the device
// holds the device share's 12 bytes per element, the host the rest.
TEST(EngineGradOffloadTest, PartialOffloadRatioIsBitwiseTheFullOffload) {
  const TestModel model = BlockModel(3, 3000, 10);
  const std::string param = ", \"offload_param\": {\"device\": \"cpu\"}";
  struct Case {
    int world, gas;
    double clip;
    float grad_scale;
    std::string extra;
  };
  for (const Case& c : {Case{1, 1, 0.0, 1.0f, ""}, Case{1, 2, 0.0, 1.0f, ""}, Case{1, 1, 0.5, 30.0f, ""},
                        Case{1, 2, 0.0, 1.0f, param}, Case{2, 2, 0.5, 30.0f, ""}, Case{2, 1, 0.0, 1.0f, param}}) {
    SCOPED_TRACE("world " + std::to_string(c.world) + " gas " + std::to_string(c.gas) + " clip " +
                 std::to_string(c.clip) + c.extra);
    TrainOptions ro;
    ro.steps = 2;
    ro.grad_scale = c.grad_scale;
    auto offload = [&](double ratio) {
      return "\"offload_optimizer\": {\"device\": \"cpu\", \"cpu_threads\": 2, \"ratio\": " + std::to_string(ratio) +
             "}" + c.extra;
    };
    const auto none =
        TrainAll(ConfigJson(3, c.gas, c.clip, "", c.extra.empty() ? "" : c.extra.substr(2)), c.world, model, ro);
    const auto full = TrainAll(ConfigJson(3, c.gas, c.clip, "", offload(1.0)), c.world, model, ro);
    ASSERT_EQ(none.size(), static_cast<size_t>(c.world));
    ASSERT_EQ(full.size(), static_cast<size_t>(c.world));
    for (double ratio : {0.5, 0.001}) {
      SCOPED_TRACE("ratio " + std::to_string(ratio));
      const auto part = TrainAll(ConfigJson(3, c.gas, c.clip, "", offload(ratio)), c.world, model, ro);
      ASSERT_EQ(part.size(), static_cast<size_t>(c.world));
      for (int r = 0; r < c.world; ++r) {
        EXPECT_TRUE(SameBits(part[r].master, full[r].master)) << "rank " << r;
        EXPECT_TRUE(SameBits(part[r].master, none[r].master)) << "rank " << r;
        EXPECT_TRUE(SameBits(part[r].model, full[r].model)) << "rank " << r;
        EXPECT_TRUE(SameBits(part[r].exp_avg, full[r].exp_avg)) << "rank " << r;
        EXPECT_TRUE(SameBits(part[r].exp_avg_sq, full[r].exp_avg_sq)) << "rank " << r;
        EXPECT_EQ(part[r].norms, full[r].norms) << "rank " << r;
        EXPECT_EQ(part[r].losses, full[r].losses) << "rank " << r;
        // Masters on the device: a share of the full offload's host masters (ratio 0.001 keeps
        // nearly all of them there).
        const size_t on_device = part[r].memory.master_params;
        EXPECT_GT(on_device, 0u) << "rank " << r;
        EXPECT_EQ(full[r].memory.master_params, 0u) << "rank " << r;
        EXPECT_LT(part[r].memory.host_states, full[r].memory.host_states) << "rank " << r;
        if (ratio == 0.5) EXPECT_LT(on_device, none[r].memory.master_params) << "rank " << r;
      }
    }
  }
}

// offload_param.device "cpu": a parameter whose shard exceeds buffer_size is refused at Initialize
// (DeepSpeed fails at run time), naming the parameter, its shard and the value to set.
TEST(EngineParamOffloadTest, ShardOverBufferSizeIsAnInitializeErrorNamingIt) {
  const TestModel model = SmallModel();  // m0.w: 35 elements, a shard of 18 at world 2
  Status s = RunThreadRanks(2, [&](int rank, Communicator* comm, Device* device) -> Status {
    const std::string small = "\"offload_param\": {\"device\": \"cpu\", \"buffer_size\": 17}";
    ZERO_ASSIGN_OR_RETURN(Config bad, MakeConfig(ConfigJson(3, 1, 0.0, "", small), 2));
    ZERO_RETURN_IF_ERROR(Expect(MakeEngine(bad, model, device, comm).status(), StatusCode::kInvalidArgument,
                                "parameter 'm0.w' has a shard of 18 elements"));
    ZERO_RETURN_IF_ERROR(Expect(MakeEngine(bad, model, device, comm).status(), StatusCode::kInvalidArgument,
                                "raise zero_optimization.offload_param.buffer_size to at least 18"));
    const std::string fits = "\"offload_param\": {\"device\": \"cpu\", \"buffer_size\": 18}";
    ZERO_ASSIGN_OR_RETURN(Config good, MakeConfig(ConfigJson(3, 1, 0.0, "", fits), 2));
    return MakeEngine(good, model, device, comm).status();
  });
  EXPECT_OK(s);
}

// The model's arenas on the engine's device (runtime/device_arena.h) show in memory() by label,
// and only while allocated; another device's arenas do not.
TEST(EngineMemoryTest, CountsTheModelsActivationAndWorkspaceArenas) {
  const TestModel model = BlockModel(2, 1024, 10);
  Status s = RunThreadRanks(1, [&](int rank, Communicator* comm, Device* device) -> Status {
    ZERO_ASSIGN_OR_RETURN(Config c, MakeConfig(ConfigJson(3, 1, 0.0), 1));
    ZERO_ASSIGN_OR_RETURN(auto e, MakeEngine(c, model, device, comm));
    EXPECT_EQ(e->memory().activations, 0u);
    EXPECT_EQ(e->memory().workspace, 0u);
    const size_t peak_before = e->memory().device_peak;
    float* acts = nullptr;
    float* scratch = nullptr;
    DeviceArena activations("activations");
    activations.Reserve(&acts, 3000, "layer inputs");
    DeviceArena workspace("workspace");
    workspace.Reserve(&scratch, 500, "logits chunk");
    ZERO_RETURN_IF_ERROR(activations.Allocate(device));
    ZERO_RETURN_IF_ERROR(workspace.Allocate(device));
    CpuDevice other;
    DeviceArena elsewhere("activations");
    float* unused = nullptr;
    elsewhere.Reserve(&unused, 100000, "another device's");
    ZERO_RETURN_IF_ERROR(elsewhere.Allocate(&other));
    EXPECT_EQ(e->memory().activations, activations.planned_bytes());
    EXPECT_GE(e->memory().activations, 3000 * sizeof(float));
    EXPECT_EQ(e->memory().workspace, workspace.planned_bytes());
    EXPECT_GE(e->memory().device_peak, peak_before + 3500 * sizeof(float));
    activations.Clear();
    EXPECT_EQ(e->memory().activations, 0u);
    EXPECT_EQ(e->memory().workspace, workspace.planned_bytes());
    return OkStatus();
  });
  ASSERT_OK(s);
}

// offload_param.device "cpu": no shard in device memory (model_params is the 4 MiB write scratch
// only, the shards are host_params), a gather puts exactly the module's full parameters on the
// device and its release takes them back; the gathered values equal those without offload.
TEST(EngineParamOffloadTest, ShardsLiveInHostMemory) {
  const TestModel model = BlockModel(4, int64_t{1} << 20, 10);
  const std::string no_persistence = "\"stage3_param_persistence_threshold\": 0";
  const std::string offload = no_persistence + ", \"offload_param\": {\"device\": \"cpu\"}";
  for (int world : {1, 2}) {
    std::vector<EngineMemory> with(world), without(world), gathered(world), released(world);
    std::vector<std::vector<float>> on(world), off(world);
    Status s = RunThreadRanks(world, [&](int rank, Communicator* comm, Device* device) -> Status {
      ZERO_ASSIGN_OR_RETURN(Config c0, MakeConfig(ConfigJson(3, 1, 0.0, "", no_persistence), world));
      ZERO_ASSIGN_OR_RETURN(Config c1, MakeConfig(ConfigJson(3, 1, 0.0, "", offload), world));
      {
        ZERO_ASSIGN_OR_RETURN(auto e, MakeEngine(c0, model, device, comm));
        without[rank] = e->memory();
        ZERO_ASSIGN_OR_RETURN(auto h, e->GatherModule("block1"));
        ZERO_RETURN_IF_ERROR(ReadParam(e.get(), device, 2, &off[rank]));
      }
      ZERO_ASSIGN_OR_RETURN(auto e, MakeEngine(c1, model, device, comm));
      with[rank] = e->memory();
      {
        ZERO_ASSIGN_OR_RETURN(auto h, e->GatherModule("block1"));
        gathered[rank] = e->memory();
        ZERO_RETURN_IF_ERROR(ReadParam(e.get(), device, 2, &on[rank]));
      }
      released[rank] = e->memory();
      return OkStatus();
    });
    ASSERT_OK(s) << "world " << world;
    const size_t shard_bytes = ((size_t{1} << 20) / world + 64) * 4 * 4;  // about 4 weights' shards
    for (int r = 0; r < world; ++r) {
      SCOPED_TRACE("world " + std::to_string(world) + " rank " + std::to_string(r));
      EXPECT_GE(without[r].model_params, shard_bytes * 9 / 10);
      EXPECT_EQ(without[r].host_params, 0u);
      EXPECT_EQ(with[r].model_params, (size_t{1} << 20) * 4) << "only the write scratch on the device";
      EXPECT_GE(with[r].host_params, shard_bytes * 9 / 10);
      EXPECT_EQ(gathered[r].model_params - with[r].model_params, ((size_t{1} << 20) + PaddedNumel(10, world)) * 4)
          << "block1's full parameters";
      EXPECT_EQ(released[r].model_params, with[r].model_params);
      EXPECT_EQ(on[r], off[r]) << "gathered values differ from those without offload";
    }
  }
}

TEST(EngineMemoryTest, Stage3PeakRespectsTheLiveLimitAndReleasingReturnsMemory) {
  const int blocks = 16;
  const int64_t w = 1000, b = 8;
  const TestModel model = BlockModel(blocks, w, b);
  const int64_t max_live = 2500;
  const int world = 2;
  const std::string zero_extra = "\"stage3_max_live_parameters\": " + std::to_string(max_live) +
                                 ", \"stage3_prefetch_bucket_size\": 1500, \"stage3_param_persistence_threshold\": 8" +
                                 ", \"stage3_max_reuse_distance\": 0";
  auto config = MakeConfig(ConfigJson(3, 1, 1.0, "", zero_extra), world);
  ASSERT_OK(config);
  std::vector<size_t> peak_extra(world, 0), leftover(world, 0);
  std::vector<size_t> base(world, 0);
  TrainOptions ro;
  ro.steps = 3;
  Status s = RunThreadRanks(world, [&](int rank, Communicator* comm, Device* device) -> Status {
    TrainOptions mine = ro;
    mine.before_micro = [&, rank](Engine* e, Device* d) -> Status {
      base[rank] = d->memory_stats().in_use;
      d->ResetPeak();
      return OkStatus();
    };
    mine.after_backward = [&, rank](Engine* e, Device* d) -> Status {
      peak_extra[rank] = std::max(peak_extra[rank], d->memory_stats().peak - base[rank]);
      return OkStatus();
    };
    TrainResult r;
    ZERO_RETURN_IF_ERROR(Train(*config, model, rank, comm, device, mine, &r));
    return OkStatus();
  });
  ASSERT_OK(s);
  const size_t full_model = blocks * (w + b) * sizeof(float);
  // Gathered parameters: at most max_live plus one module (a demand may exceed the limit by one
  // module); gradient buffers: a bucket's worth plus the pool; staging: two buckets in flight.
  const size_t bucket_bytes = 40 + w;  // reduce_bucket_size 40: one weight per bucket
  const size_t bound = (max_live + w + b) * sizeof(float) + 3 * w * sizeof(float) +
                       2 * (world + 1) * bucket_bytes * sizeof(float) + 8192;
  for (int r = 0; r < world; ++r) {
    EXPECT_LE(peak_extra[r], bound) << "rank " << r;
    EXPECT_LT(peak_extra[r], full_model) << "rank " << r;
  }
}

TEST(EngineMemoryTest, Stage3StepReleasesGatheredParameters) {
  const TestModel model = BlockModel(4, 1000, 8);
  auto config = MakeConfig(ConfigJson(3, 1, 1.0, "", "\"stage3_param_persistence_threshold\": 8"), 2);
  ASSERT_OK(config);
  Status s = RunThreadRanks(2, [&](int rank, Communicator* comm, Device* device) -> Status {
    TrainOptions ro;
    ro.steps = 2;
    size_t after_init = 0;
    ro.before_micro = [&](Engine* e, Device* d) -> Status {
      if (after_init == 0) after_init = e->memory().model_params;
      // Everything non-persistent was released by the previous Step().
      if (e->memory().model_params > after_init + 4 * 8 * sizeof(float)) {
        return InternalError("gathered parameters kept across Step(): " + std::to_string(e->memory().model_params) +
                             " vs " + std::to_string(after_init));
      }
      return OkStatus();
    };
    TrainResult r;
    return Train(*config, model, rank, comm, device, ro, &r);
  });
  EXPECT_OK(s);
}

// --- stage-3 collectives ------------------------------------------------------------------------

// A module of 5 parameters ("wide") and three blocks of 2, all non-persistent.
TestModel WideAndBlocks() {
  TestModel m;
  m.specs = {{"wide.a", {30}, "wide"},
             {"wide.b", {7}, "wide"},
             {"wide.c", {}, "wide"},
             {"wide.d", {8, 8}, "wide"},
             {"wide.e", {13}, "wide"}};
  m.modules = {"wide"};
  for (int k = 0; k < 3; ++k) {
    const std::string mod = "block" + std::to_string(k);
    m.specs.push_back({mod + ".w", {100}, mod});
    m.specs.push_back({mod + ".b", {9}, mod});
    m.modules.push_back(mod);
  }
  return m;
}

// Runs `micro_steps` micro steps (GAS 2: forward over the modules, backward in reverse) and
// records param_allgathers after every GatherModule, per micro step. In the first micro step every
// parameter read must equal its initial value bitwise.
Status CountStage3Gathers(const Config& config, const TestModel& model, int rank, Communicator* comm, Device* device,
                          int micro_steps, std::vector<std::vector<int64_t>>* deltas) {
  ZERO_ASSIGN_OR_RETURN(auto engine, MakeEngine(config, model, device, comm));
  Engine* e = engine.get();
  const std::vector<std::vector<int>> module_params = ModuleParams(model);
  std::vector<size_t> order;
  for (size_t m = 0; m < model.modules.size(); ++m) order.push_back(m);
  for (size_t m = model.modules.size(); m-- > 0;) order.push_back(m);
  for (int micro = 0; micro < micro_steps; ++micro) {
    deltas->emplace_back();
    for (size_t pos = 0; pos < order.size(); ++pos) {
      const size_t m = order[pos];
      const bool backward = pos >= model.modules.size();
      const int64_t before = e->stats().param_allgathers;
      ZERO_ASSIGN_OR_RETURN(ModuleHandle h, engine->GatherModule(model.modules[m]));
      deltas->back().push_back(e->stats().param_allgathers - before);
      for (int i : module_params[m]) {
        std::vector<float> v;
        ZERO_RETURN_IF_ERROR(ReadParam(e, device, i, &v));
        if (micro == 0) {
          for (size_t k = 0; k < v.size(); ++k) {
            if (FloatBits(v[k]) != FloatBits(InitValue(i, static_cast<int64_t>(k)))) {
              return InternalError("param " + std::to_string(i) + " element " + std::to_string(k));
            }
          }
        }
        if (backward) ZERO_RETURN_IF_ERROR(WriteGrad(e, device, i, Gradient(i, v, rank, micro, 1.0f)));
      }
      ZERO_RETURN_IF_ERROR(h.Release());
    }
    ZERO_RETURN_IF_ERROR(engine->Backward());
    ZERO_RETURN_IF_ERROR(engine->Step());
  }
  return OkStatus();
}

TEST(EngineStatsTest, Stage3GatherIsOneCollectivePerModuleAndPerPrefetch) {
  const TestModel model = WideAndBlocks();
  const int world = 2;
  // (stage3_prefetch_bucket_size, param_allgathers per GatherModule of the second micro step)
  // Order: wide, block0, block1, block2, block2, block1, block0, wide. At N = 2 a block needs
  // 100 + 10 padded elements.
  const std::vector<std::pair<int64_t, std::vector<int64_t>>> cases = {
      // The whole model fits: the demand of wide (1) and one prefetch of the three blocks (1);
      // released modules are kept (reused within stage3_max_reuse_distance).
      {1000000, {2, 0, 0, 0, 0, 0, 0, 0}},
      // Two blocks fit: the demand and one prefetch of block0 and block1, then block2's prefetch.
      {220, {2, 1, 0, 0, 0, 0, 0, 0}},
      // No prefetch: one collective per module demand (and none again: kept).
      {0, {1, 1, 1, 1, 0, 0, 0, 0}},
  };
  for (const auto& [bucket, want] : cases) {
    SCOPED_TRACE("stage3_prefetch_bucket_size " + std::to_string(bucket));
    auto config = MakeConfig(ConfigJson(3, 2, 1.0, "",
                                        "\"stage3_param_persistence_threshold\": 0, \"stage3_prefetch_bucket_size\": " +
                                            std::to_string(bucket)),
                             world);
    ASSERT_OK(config);
    std::vector<std::vector<std::vector<int64_t>>> deltas(world);
    Status s = RunThreadRanks(world, [&](int rank, Communicator* comm, Device* device) {
      return CountStage3Gathers(*config, model, rank, comm, device, 2, &deltas[rank]);
    });
    ASSERT_OK(s);
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(deltas[r].size(), 2u);
      // Recording (first micro step): nothing kept or prefetched: each GatherModule is exactly
      // one all-gather, the 5-parameter module included.
      EXPECT_EQ(deltas[r][0], std::vector<int64_t>(8, 1)) << "rank " << r;
      EXPECT_EQ(deltas[r][1], want) << "rank " << r;
    }
  }
}

// After Step() the persistent parameters are stale: each module's first gather re-gathers its
// weight and its persistent bias in one collective; the prefetch of several modules is one too.
TEST(EngineStatsTest, Stage3PersistentAndGatheredParametersShareOneCollective) {
  const TestModel model = WideAndBlocks();
  const int world = 3;
  auto config = MakeConfig(
      ConfigJson(3, 1, 1.0, "", "\"stage3_param_persistence_threshold\": 10, \"stage3_prefetch_bucket_size\": 0"),
      world);
  ASSERT_OK(config);
  std::vector<std::vector<std::vector<int64_t>>> deltas(world);
  Status s = RunThreadRanks(world, [&](int rank, Communicator* comm, Device* device) {
    return CountStage3Gathers(*config, model, rank, comm, device, 3, &deltas[rank]);
  });
  ASSERT_OK(s);
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(deltas[r].size(), 3u);
    // Recording: nothing is kept, so backward gathers the weights again (one collective each).
    EXPECT_EQ(deltas[r][0], std::vector<int64_t>(8, 1)) << "rank " << r;
    for (size_t micro = 1; micro < 3; ++micro) {
      // GAS 1: every micro step follows a Step(): each module's weights and stale persistent
      // parameters are gathered together, once; then kept for the backward use.
      EXPECT_EQ(deltas[r][micro], (std::vector<int64_t>{1, 1, 1, 1, 0, 0, 0, 0})) << "rank " << r << " micro " << micro;
    }
  }
}

// A larger model through every stage on two ranks: exercises many buckets and prefetches and
// prints the time per step (the CPU path must stay reasonably fast).
TEST(EngineTrainingTest, LargerModelEveryStage) {
  const TestModel model = BlockModel(8, 200000, 1000);
  TrainOptions ro;
  ro.steps = 2;
  for (int stage = 0; stage <= 3; ++stage) {
    const std::string zero_extra =
        "\"reduce_bucket_size\": 300000, \"stage3_prefetch_bucket_size\": 400000, "
        "\"stage3_param_persistence_threshold\": 1000, \"overlap_comm\": true";
    const auto start = std::chrono::steady_clock::now();
    const auto r = TrainAll(ConfigJson(stage, 2, 1.0, "", zero_extra), 2, model, ro);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ExpectSameAcrossRanks(r);
    std::printf("stage %d: %.3f s for 4 micro steps of %d params on 2 ranks (with test-side host math)\n", stage, s,
                8 * 201000);
  }
}

// --- offload_optimizer.overlap_step ------------------------------------------------------------

// One rank on a DeferredDevice (testing/deferred_device.h: the streams run late, in a random legal
// order), so a missing stream wait in the overlapped step shows up as a wrong value.
struct DeferredRank {
  explicit DeferredRank(uint32_t seed) : device(seed) {
    auto c = GlooCommunicator::Create(0, 1, std::make_shared<gloo::rendezvous::HashStore>(), &device);
    EXPECT_OK(c);
    if (c.ok()) comm = std::move(c).value();
  }
  DeferredDevice device;
  std::unique_ptr<GlooCommunicator> comm;
};

std::string OverlapJson(int stage, double clip, bool overlap) {
  return ConfigJson(stage, 1, clip, "",
                    std::string("\"offload_optimizer\": {\"device\": \"cpu\", \"update_device\": \"gpu\", "
                                "\"chunk_size\": 16, \"chunk_buffers\": 2, \"overlap_step\": ") +
                        (overlap ? "true" : "false") + "}");
}

// The overlapped chunked step's engine (OverlapJson at `stage` and `clip`) on rank `r`'s deferred
// device, into *e (to be destroyed before `r`).
void MakeOverlapEngine(const TestModel& model, int stage, double clip, DeferredRank* r, std::unique_ptr<Engine>* e) {
  ASSERT_NE(r->comm, nullptr);
  auto c = MakeConfig(OverlapJson(stage, clip, true), 1);
  ASSERT_OK(c);
  auto made = MakeEngine(*c, model, &r->device, r->comm.get());
  ASSERT_OK(made);
  *e = std::move(made).value();
}

// One micro step (GAS 1) of the forward (every module gathered, its parameters read) and the
// backward (reverse module order), then Step(). With `expect_in_flight` every parameter is first
// checked to be refused by param() before its module is gathered (the step is still in flight).
Status OverlapMicroStep(Engine* e, Device* d, const TestModel& model, bool expect_in_flight, double* loss) {
  const auto mods = ModuleParams(model);
  std::vector<std::vector<float>> values(model.specs.size());
  for (size_t m = 0; m < mods.size(); ++m) {
    for (int i : mods[m]) {
      if (expect_in_flight) {
        ZERO_RETURN_IF_ERROR(Expect(e->param(i).status(), StatusCode::kFailedPrecondition, "GatherModule(\""));
      }
    }
    ZERO_ASSIGN_OR_RETURN(ModuleHandle h, e->GatherModule(model.modules[m]));
    for (int i : mods[m]) {
      ZERO_RETURN_IF_ERROR(ReadParam(e, d, i, &values[i]));
      *loss = AddHalfSquares(*loss, values[i]);
    }
    ZERO_RETURN_IF_ERROR(h.Release());
  }
  const int64_t micro = e->counters().micro_steps;
  for (size_t m = mods.size(); m-- > 0;) {
    ZERO_ASSIGN_OR_RETURN(ModuleHandle h, e->GatherModule(model.modules[m]));
    for (auto it = mods[m].rbegin(); it != mods[m].rend(); ++it) {
      ZERO_RETURN_IF_ERROR(WriteGrad(e, d, *it, Gradient(*it, values[*it], 0, micro, 3.0f)));
    }
    ZERO_RETURN_IF_ERROR(h.Release());
  }
  ZERO_RETURN_IF_ERROR(e->Backward());
  return e->Step();
}

// Stages 1-3, with clipping (AdamW deferred at the boundary) and without (stages 2/3: the update in
// backward, its casts deferred): the parameters read in every forward and the final state are
// bitwise the synchronous chunked step's, on the deferred device for several schedules; param()
// before GatherModule is refused while a step is in flight.
TEST(EngineOverlapStepTest, ForwardWaitsOnlyForItsChunksAndEqualsTheSynchronousStep) {
  const TestModel model = BlockModel(4, 45, 7);
  for (int stage : {1, 2, 3}) {
    for (double clip : {0.0, 0.05}) {
      CpuDevice cpu;
      TrainResult want;
      std::vector<double> want_losses;
      ASSERT_OK(RunThreadRanks(1, [&](int, Communicator* comm, Device* device) -> Status {
        ZERO_ASSIGN_OR_RETURN(Config c, MakeConfig(OverlapJson(stage, clip, false), 1));
        ZERO_ASSIGN_OR_RETURN(auto e, MakeEngine(c, model, device, comm));
        for (int s = 0; s < 4; ++s) {
          double loss = 0;
          ZERO_RETURN_IF_ERROR(OverlapMicroStep(e.get(), device, model, false, &loss));
          want_losses.push_back(loss);
        }
        return Snapshot(e.get(), &want);
      }));
      for (uint32_t seed : {1u, 2u, 3u}) {
        SCOPED_TRACE("stage " + std::to_string(stage) + " clip " + std::to_string(clip) + " seed " +
                     std::to_string(seed));
        DeferredRank r(seed);
        std::unique_ptr<Engine> e;
        ASSERT_NO_FATAL_FAILURE(MakeOverlapEngine(model, stage, clip, &r, &e));
        for (int s = 0; s < 4; ++s) {
          double loss = 0;
          Status st = OverlapMicroStep(e.get(), &r.device, model, /*expect_in_flight=*/s > 0, &loss);
          ASSERT_OK(st) << "step " << s;
          EXPECT_EQ(FloatBits(static_cast<float>(loss)), FloatBits(static_cast<float>(want_losses[s])))
              << "the forward of step " << s << " read other weights than the synchronous step's";
        }
        EXPECT_FALSE(r.device.idle()) << "Step() returned with nothing left in flight: nothing overlaps";
        TrainResult got;
        ASSERT_OK(Snapshot(e.get(), &got));
        EXPECT_TRUE(SameBits(got.master, want.master)) << "master";
        EXPECT_TRUE(SameBits(got.model, want.model)) << "model";
        EXPECT_TRUE(SameBits(got.exp_avg, want.exp_avg)) << "exp_avg";
        EXPECT_TRUE(SameBits(got.exp_avg_sq, want.exp_avg_sq)) << "exp_avg_sq";
      }
    }
  }
}

// Every call that reads or writes parameters or states outside the forward, called while a step is
// in flight (right after Step()), sees that step complete: the gathers and SaveCheckpoint give
// the synchronous step's values, LoadCheckpoint's state is not overwritten by late chunks,
// WaitForOptimizerStep and ZeroGrad leave nothing queued, the destructor completes the step.
TEST(EngineOverlapStepTest, StateAccessWaitsForTheStepInFlight) {
  const TestModel model = BlockModel(3, 40, 5);
  const std::string dir = ::testing::TempDir() + "/overlap_ckpt";
  for (auto [stage, clip] : {std::pair<int, double>{3, 0.0}, {1, 0.05}}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    TrainResult want1, want2;  // the synchronous step after 1 and 2 steps
    ASSERT_OK(RunThreadRanks(1, [&](int, Communicator* comm, Device* device) -> Status {
      ZERO_ASSIGN_OR_RETURN(Config c, MakeConfig(OverlapJson(stage, clip, false), 1));
      ZERO_ASSIGN_OR_RETURN(auto e, MakeEngine(c, model, device, comm));
      double loss = 0;
      ZERO_RETURN_IF_ERROR(OverlapMicroStep(e.get(), device, model, false, &loss));
      ZERO_RETURN_IF_ERROR(Snapshot(e.get(), &want1));
      ZERO_RETURN_IF_ERROR(e->SaveCheckpoint(dir, "sync1"));
      ZERO_RETURN_IF_ERROR(OverlapMicroStep(e.get(), device, model, false, &loss));
      return Snapshot(e.get(), &want2);
    }));
    // Two overlapped steps on the deferred device; the second is in flight when `probe` runs.
    auto run = [&](uint32_t seed, const std::function<void(Engine*, DeferredDevice*)>& probe) {
      DeferredRank r(seed);
      std::unique_ptr<Engine> e;
      ASSERT_NO_FATAL_FAILURE(MakeOverlapEngine(model, stage, clip, &r, &e));
      double loss = 0;
      ASSERT_OK(OverlapMicroStep(e.get(), &r.device, model, false, &loss));
      ASSERT_OK(OverlapMicroStep(e.get(), &r.device, model, true, &loss));
      ASSERT_FALSE(r.device.idle()) << "the step is not in flight: the probe tests nothing";
      probe(e.get(), &r.device);
    };
    for (uint32_t seed : {4u, 5u}) {
      run(seed, [&](Engine* e, DeferredDevice*) {
        const int n = e->num_params();
        for (int i = 0; i < n; ++i) {
          std::vector<float> m(want2.master[i].size()), p(m.size()), a(m.size()), v(m.size());
          ASSERT_OK(e->GatherMasterWeights(i, m.data()));
          EXPECT_EQ(std::memcmp(m.data(), want2.master[i].data(), m.size() * 4), 0) << "GatherMasterWeights " << i;
          ASSERT_OK(e->GatherModelParam(i, p.data()));
          EXPECT_EQ(std::memcmp(p.data(), want2.model[i].data(), p.size() * 4), 0) << "GatherModelParam " << i;
          ASSERT_OK(e->GatherOptimizerState(i, a.data(), v.data()));
          EXPECT_EQ(std::memcmp(a.data(), want2.exp_avg[i].data(), a.size() * 4), 0) << "exp_avg " << i;
          EXPECT_EQ(std::memcmp(v.data(), want2.exp_avg_sq[i].data(), v.size() * 4), 0) << "exp_avg_sq " << i;
        }
      });
      // Each gather on its own, first thing after the step (the loop above waits at its first call).
      run(seed, [&](Engine* e, DeferredDevice*) {
        std::vector<float> p(want2.model[0].size());
        ASSERT_OK(e->GatherModelParam(0, p.data()));
        EXPECT_EQ(std::memcmp(p.data(), want2.model[0].data(), p.size() * 4), 0) << "GatherModelParam alone";
      });
      run(seed, [&](Engine* e, DeferredDevice*) {
        const int last = e->num_params() - 1;
        std::vector<float> a(want2.exp_avg[last].size()), v(a.size());
        ASSERT_OK(e->GatherOptimizerState(last, a.data(), v.data()));
        EXPECT_EQ(std::memcmp(a.data(), want2.exp_avg[last].data(), a.size() * 4), 0) << "exp_avg alone";
      });
      run(seed, [&](Engine* e, DeferredDevice* d) {
        ASSERT_OK(e->WaitForOptimizerStep());
        EXPECT_TRUE(d->idle()) << "WaitForOptimizerStep left work queued";
        EXPECT_EQ(e->param(0).status().message().find("overlapped optimizer step"), std::string::npos)
            << "a step still in flight after WaitForOptimizerStep";
      });
      run(seed, [&](Engine* e, DeferredDevice* d) {
        const int64_t before = d->ops_run();
        ASSERT_OK(e->ZeroGrad());
        EXPECT_GT(d->ops_run(), before) << "ZeroGrad ran nothing of the step in flight";
        EXPECT_EQ(e->param(0).status().message().find("overlapped optimizer step"), std::string::npos)
            << "a step still in flight after ZeroGrad";
      });
      run(seed,
          [&](Engine* e, DeferredDevice*) { ASSERT_OK(e->SaveCheckpoint(dir, "overlap" + std::to_string(seed))); });
      // The checkpoint saved in flight holds the completed step: loaded on the CPU backend.
      ASSERT_OK(RunThreadRanks(1, [&](int, Communicator* comm, Device* device) -> Status {
        ZERO_ASSIGN_OR_RETURN(Config c, MakeConfig(OverlapJson(stage, clip, false), 1));
        ZERO_ASSIGN_OR_RETURN(auto e, MakeEngine(c, model, device, comm, 0.5f));
        ZERO_RETURN_IF_ERROR(e->LoadCheckpoint(dir, "overlap" + std::to_string(seed)).status());
        TrainResult got;
        ZERO_RETURN_IF_ERROR(Snapshot(e.get(), &got));
        if (auto same = SameBits(got.master, want2.master); !same) {
          return InternalError(std::string("saved master: ") + same.message());
        }
        if (auto same = SameBits(got.exp_avg_sq, want2.exp_avg_sq); !same) {
          return InternalError(std::string("saved v: ") + same.message());
        }
        return OkStatus();
      }));
      // Loaded in flight: the late chunks of the step must not land on the loaded state.
      run(seed, [&](Engine* e, DeferredDevice*) {
        ASSERT_OK(e->LoadCheckpoint(dir, "sync1"));
        TrainResult got;
        ASSERT_OK(Snapshot(e, &got));
        EXPECT_TRUE(SameBits(got.master, want1.master)) << "loaded master";
        EXPECT_TRUE(SameBits(got.model, want1.model)) << "loaded model";
        EXPECT_TRUE(SameBits(got.exp_avg, want1.exp_avg)) << "loaded exp_avg";
      });
      // Destroyed in flight: the destructor completes the step (the device runs it before freeing).
      run(seed, [&](Engine*, DeferredDevice*) {});
    }
  }
}

// Refused where not built, naming the key.
TEST(EngineOverlapStepTest, RefusedWithSeveralRanksOrParameterOffload) {
  std::vector<std::string> errors(2);
  ASSERT_OK(RunThreadRanks(2, [&](int rank, Communicator* comm, Device* device) -> Status {
    ZERO_ASSIGN_OR_RETURN(Config c, MakeConfig(OverlapJson(3, 0.0, true), 2));
    errors[rank] = Engine::Create(c, device, comm).status().ToString();
    return OkStatus();
  }));
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("zero_optimization.offload_optimizer.overlap_step: needs one data-parallel rank, got 2"),
              std::string::npos)
        << e;
  }
  ASSERT_OK(RunThreadRanks(1, [&](int, Communicator* comm, Device* device) -> Status {
    ZERO_ASSIGN_OR_RETURN(
        Config c, MakeConfig(ConfigJson(3, 1, 0.0, "",
                                        "\"offload_param\": {\"device\": \"cpu\"}, \"offload_optimizer\": {\"device\": "
                                        "\"cpu\", \"update_device\": \"gpu\", \"overlap_step\": true}"),
                             1));
    return Expect(Engine::Create(c, device, comm).status(), StatusCode::kUnimplemented,
                  "overlap_step: not with zero_optimization.offload_param.device \"cpu\"");
  }));
}

// The same refusals with unmanaged accumulation (the only combinations of issue 10's matrix the
// engine refuses), each saying why; unmanaged overlap_step on one rank without offload_param is
// accepted (tests/equivalence GpuOverlapUnmanagedTest runs it).
TEST(EngineOverlapStepTest, UnmanagedRefusalsSayWhy) {
  const std::string unmanaged = "\"managed_gradient_accumulation\": false";
  const std::string overlap =
      "\"offload_optimizer\": {\"device\": \"cpu\", \"update_device\": \"gpu\", \"overlap_step\": true}";
  std::vector<std::string> errors(2);
  ASSERT_OK(RunThreadRanks(2, [&](int rank, Communicator* comm, Device* device) -> Status {
    ZERO_ASSIGN_OR_RETURN(Config c, MakeConfig(ConfigJson(2, 1, 0.0, unmanaged, overlap), 2));
    errors[rank] = Engine::Create(c, device, comm).status().ToString();
    return OkStatus();
  }));
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("overlap_step: needs one data-parallel rank, got 2 (stages 1/2 all-gather the new weights "
                     "right after the update"),
              std::string::npos)
        << e;
  }
  Status st = RunThreadRanks(1, [&](int, Communicator* comm, Device* device) -> Status {
    for (const char* param : {"\"offload_param\": {\"device\": \"cpu\"}",
                              "\"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"/tmp\"}"}) {
      ZERO_ASSIGN_OR_RETURN(Config c,
                            MakeConfig(ConfigJson(3, 1, 0.0, unmanaged, std::string(param) + ", " + overlap), 1));
      if (c.managed_gradient_accumulation) return InternalError("the config is not unmanaged");
      ZERO_RETURN_IF_ERROR(Expect(Engine::Create(c, device, comm).status(), StatusCode::kUnimplemented,
                                  "(the update writes the host shards through a device scratch)"));
    }
    ZERO_ASSIGN_OR_RETURN(Config ok, MakeConfig(ConfigJson(3, 1, 0.0, unmanaged, overlap), 1));
    return Engine::Create(ok, device, comm).status();
  });
  EXPECT_OK(st);
}

}  // namespace
}  // namespace zero
