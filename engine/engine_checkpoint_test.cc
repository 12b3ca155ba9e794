// Engine::SaveCheckpoint / LoadCheckpoint end to end: ranks as threads (Gloo over loopback), CPU
// devices, the small multi-module model of engine_test_util.h. What docs/checkpoints.md promises:
//   - resume is bitwise: every stage, fp32/bf16/fp16, GAS 2, a warmup schedule, fp16 overflows;
//   - a checkpoint loads at another world size and stage, state bit for bit;
//   - errors name the file, parameter and mismatch; save on rank 0 only fails instead of hanging;
//   - zero_to_fp32 (ConsolidateToFp32) of an engine's checkpoint equals its live master weights.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/thread_ranks.h"
#include "engine/checkpoint/consolidate.h"
#include "engine/checkpoint/format.h"
#include "engine/checkpoint/io.h"
#include "engine/checkpoint/test_util.h"
#include "engine/config/config.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "hf/safetensors.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/faulty_file_system.h"
#include "testing/same_bits.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

using ::zero::testing::ConfigJson;
using ::zero::testing::Expect;
using ::zero::testing::Gradient;
using ::zero::testing::InitValue;
using ::zero::testing::MakeConfig;
using ::zero::testing::MakeEngine;
using ::zero::testing::ReadParam;
using ::zero::testing::SameBits;
using ::zero::testing::ScratchDir;
using ::zero::testing::SmallModel;
using ::zero::testing::Snapshot;
using ::zero::testing::TestModel;
using ::zero::testing::WriteGrad;

// --- training helpers ----------------------------------------------------------------------------

// What a run produced; compared bitwise between an uninterrupted run and a resumed one. Snapshot
// fills the full tensors (master, model, exp_avg, exp_avg_sq) and the counters.
using Record = ::zero::testing::TrainResult;

struct Fp16Faults {
  // Rank 1 writes +Inf into parameter 0's gradient at these global micro steps (fp16 overflow).
  std::vector<int64_t> inf_micro;
  // Rank 0 writes 200 * loss_scale into parameter 0's gradient at these micro steps: finite in
  // fp16 at a scale of 256, an overflow at 512, so whether the step applies depends on the scale.
  std::vector<int64_t> spike_micro;
};

// `steps` windows of engine_test_util.h's TrainSteps, with the loss 0.5 v^2 + 0.1 v summed in
// double, the gradients scaled by the loss scale (as an fp16 user does) and the faults of `to`.
Status TrainSteps(Engine* e, Device* device, const TestModel& model, int rank, int steps, Record* rec,
                  const Fp16Faults& to = {}) {
  ::zero::testing::TrainOptions opt;
  opt.steps = steps;
  opt.times_loss_scale = true;
  opt.add_loss = [](double loss, const std::vector<float>& values) {
    for (float v : values) loss += 0.5 * v * v + 0.1 * v;
    return loss;
  };
  opt.edit_grad = [&to, rank](Engine* e, int i, int64_t micro, std::vector<float>* g) {
    if (i == 0 && rank == 1) {
      for (int64_t bad : to.inf_micro) {
        if (bad == micro) (*g)[3] = std::numeric_limits<float>::infinity();
      }
    }
    if (i == 0 && rank == 0) {
      for (int64_t big : to.spike_micro) {
        if (big == micro) (*g)[0] = 200.0f * e->loss_scale();
      }
    }
  };
  return ::zero::testing::TrainSteps(e, device, model, rank, opt, rec);
}

bool SameCounters(const EngineCounters& a, const EngineCounters& b) {
  return a.global_steps == b.global_steps && a.skipped_steps == b.skipped_steps && a.micro_steps == b.micro_steps &&
         a.adam_step == b.adam_step;
}

// Every field of a run bitwise (with `label` in the failure messages).
void ExpectSameRun(const Record& want, const Record& got, const std::string& label) {
  EXPECT_TRUE(SameBits(want.losses, got.losses)) << label << ": losses";
  EXPECT_TRUE(SameBits(want.norms, got.norms)) << label << ": global_grad_norm";
  EXPECT_TRUE(SameBits(want.lrs, got.lrs)) << label << ": lr";
  EXPECT_TRUE(SameBits(want.scales, got.scales)) << label << ": loss scale";
  EXPECT_EQ(want.applied, got.applied) << label << ": applied steps";
  EXPECT_TRUE(SameBits(want.master, got.master)) << label << ": master";
  EXPECT_TRUE(SameBits(want.model, got.model)) << label << ": model";
  EXPECT_TRUE(SameBits(want.exp_avg, got.exp_avg)) << label << ": exp_avg";
  EXPECT_TRUE(SameBits(want.exp_avg_sq, got.exp_avg_sq)) << label << ": exp_avg_sq";
  EXPECT_TRUE(SameCounters(want.counters, got.counters)) << label << ": counters";
}

// Loaded state equals saved state: master weights and both moments bit for bit, and the model
// parameters are the master weights rounded to the model dtype.
void ExpectSameState(const Record& saved, const Record& loaded, DType model_dtype, const std::string& label) {
  EXPECT_TRUE(SameBits(saved.master, loaded.master)) << label << ": master";
  EXPECT_TRUE(SameBits(saved.exp_avg, loaded.exp_avg)) << label << ": exp_avg";
  EXPECT_TRUE(SameBits(saved.exp_avg_sq, loaded.exp_avg_sq)) << label << ": exp_avg_sq";
  std::vector<std::vector<float>> rounded = saved.master;
  std::vector<uint8_t> raw(SizeOf(model_dtype));
  for (auto& t : rounded) {
    for (float& v : t) {
      StoreFromFloat(raw.data(), model_dtype, 0, v);
      v = LoadAsFloat(raw.data(), model_dtype, 0);
    }
  }
  EXPECT_TRUE(SameBits(rounded, loaded.model)) << label << ": model params";
  EXPECT_TRUE(SameCounters(saved.counters, loaded.counters)) << label << ": counters";
}

const char* kWarmup =
    "\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_min_lr\": 0.001, \"warmup_max_lr\": 0.01, "
    "\"warmup_num_steps\": 10, \"warmup_type\": \"linear\"}}";

std::string DtypeJson(const std::string& dtype) {
  if (dtype == "bf16") return "\"bf16\": {\"enabled\": true}";
  // A small window and an early start so that the scale doubles and drops around the save point.
  if (dtype == "fp16") {
    return "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 8, \"loss_scale_window\": 2, "
           "\"hysteresis\": 2}";
  }
  return "";
}

std::string Join(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  return a + ", " + b;
}

// --- 1. resume is bitwise ---------------------------------------------------------------------------

// K steps, save, M steps (the uninterrupted run); a fresh engine (other initial values) loads and
// runs the same M steps: every loss, norm, lr, loss scale, weight and moment agrees bitwise.
void CheckResumeIsBitwise(int stage, const std::string& dtype, int world) {
  const std::string label = "stage " + std::to_string(stage) + " " + dtype + " world " + std::to_string(world);
  SCOPED_TRACE(label);
  const int kBefore = 3, kAfter = 3;
  auto config = MakeConfig(ConfigJson(stage, 2, 1.0, Join(DtypeJson(dtype), kWarmup)), world);
  ASSERT_OK(config);
  const TestModel model = SmallModel();
  const std::string dir = ScratchDir("resume");
  const std::string client = R"({"epoch":2,"sampler":[1,2,3]})";
  Fp16Faults to;
  if (dtype == "fp16") {
    // Overflows at steps 0 and 5 whatever the scale, and at step 4 only because the scale doubled
    // at step 3 (from good steps counted before the save); step 5's overflow then finds the
    // hysteresis spent and halves the scale.
    to.inf_micro = {1, 10};
    to.spike_micro = {8};
  }
  std::vector<Record> before(world), uninterrupted(world), resumed(world);
  std::vector<std::string> client_back(world);
  std::vector<EngineCounters> at_save(world), after_load(world);
  std::vector<float> scale_at_save(world), scale_after_load(world);
  std::vector<double> lr_at_save(world), lr_after_load(world);
  Status st = RunThreadRanks(world, [&](int rank, Communicator* comm, Device* device) -> Status {
    {
      ZERO_ASSIGN_OR_RETURN(auto a, MakeEngine(*config, model, device, comm));
      ZERO_RETURN_IF_ERROR(TrainSteps(a.get(), device, model, rank, kBefore, &before[rank], to));
      at_save[rank] = a->counters();
      scale_at_save[rank] = a->loss_scale();
      lr_at_save[rank] = a->lr();
      ZERO_RETURN_IF_ERROR(a->SaveCheckpoint(dir, "", client));
      ZERO_RETURN_IF_ERROR(TrainSteps(a.get(), device, model, rank, kAfter, &uninterrupted[rank], to));
      ZERO_RETURN_IF_ERROR(Snapshot(a.get(), &uninterrupted[rank]));
    }
    ZERO_ASSIGN_OR_RETURN(auto b, MakeEngine(*config, model, device, comm, /*init_shift=*/0.375f));
    ZERO_ASSIGN_OR_RETURN(client_back[rank], b->LoadCheckpoint(dir));
    after_load[rank] = b->counters();
    scale_after_load[rank] = b->loss_scale();
    lr_after_load[rank] = b->lr();
    ZERO_RETURN_IF_ERROR(TrainSteps(b.get(), device, model, rank, kAfter, &resumed[rank], to));
    return Snapshot(b.get(), &resumed[rank]);
  });
  ASSERT_OK(st);
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(client_back[r], client) << "rank " << r;
    EXPECT_TRUE(SameCounters(at_save[r], after_load[r])) << "rank " << r;
    EXPECT_EQ(scale_at_save[r], scale_after_load[r]) << "rank " << r;
    EXPECT_EQ(lr_at_save[r], lr_after_load[r]) << "rank " << r;
    ExpectSameRun(uninterrupted[r], resumed[r], label + " rank " + std::to_string(r));
  }
  EXPECT_EQ(at_save[0].global_steps, kBefore);
  EXPECT_EQ(at_save[0].micro_steps, 2 * kBefore);
  EXPECT_TRUE(PathExists(dir + "/global_step3/metadata.json"));
  EXPECT_EQ(*ReadLatest(dir), "global_step3");
  // The runs did something worth checking: weights moved, the lr is still warming up.
  EXPECT_NE(uninterrupted[0].master[0][0], InitValue(0, 0));
  EXPECT_LT(uninterrupted[0].lrs.front(), uninterrupted[0].lrs.back());
  if (dtype == "fp16") {
    // The scaler state mattered: the scale doubled after the save (256 -> 512, from the good steps
    // counted before it), which made step 4 overflow.
    EXPECT_EQ(at_save[0].skipped_steps, 1);
    EXPECT_EQ(uninterrupted[0].counters.skipped_steps, 3);
    EXPECT_EQ(before[0].applied, (std::vector<int>{0, 1, 1}));
    EXPECT_EQ(uninterrupted[0].applied, (std::vector<int>{1, 0, 0}));
    EXPECT_EQ(uninterrupted[0].scales, (std::vector<float>{256.0f, 512.0f, 512.0f}));
    EXPECT_EQ(resumed[0].scales, (std::vector<float>{256.0f, 512.0f, 512.0f}));
  }
}

TEST(EngineCheckpointTest, ResumeIsBitwiseEveryStageFp32AndBf16) {
  for (int stage = 0; stage <= 3; ++stage) {
    for (const char* dtype : {"fp32", "bf16"}) CheckResumeIsBitwise(stage, dtype, 2);
  }
}

TEST(EngineCheckpointTest, ResumeIsBitwiseFp16RestoresTheLossScaler) {
  CheckResumeIsBitwise(1, "fp16", 2);
  CheckResumeIsBitwise(3, "fp16", 2);
}

// Without restoring the loss scaler the fp16 run would differ: a sanity check that the fp16 test
// above can fail. The checkpoint's scaler state is edited back to a fresh scaler's; the resumed run
// then keeps the scale at 256, applies step 4 and ends with other weights.
TEST(EngineCheckpointTest, Fp16ScalerStateIsWhatMakesTheDifference) {
  const int world = 2;
  auto config = MakeConfig(ConfigJson(1, 2, 1.0, Join(DtypeJson("fp16"), kWarmup)), world);
  ASSERT_OK(config);
  const TestModel model = SmallModel();
  const std::string dir = ScratchDir("fp16edit");
  Fp16Faults to;
  to.inf_micro = {1, 10};
  to.spike_micro = {8};
  std::vector<Record> uninterrupted(world), edited(world);
  Status st = RunThreadRanks(world, [&](int rank, Communicator* comm, Device* device) -> Status {
    Record before;
    ZERO_ASSIGN_OR_RETURN(auto a, MakeEngine(*config, model, device, comm));
    ZERO_RETURN_IF_ERROR(TrainSteps(a.get(), device, model, rank, 3, &before, to));
    ZERO_RETURN_IF_ERROR(a->SaveCheckpoint(dir, "t"));
    ZERO_RETURN_IF_ERROR(TrainSteps(a.get(), device, model, rank, 3, &uninterrupted[rank], to));
    ZERO_RETURN_IF_ERROR(Snapshot(a.get(), &uninterrupted[rank]));
    if (comm->rank() == 0) {
      // metadata.json with the scaler as a fresh one has it (hysteresis 2, no good steps).
      ZERO_ASSIGN_OR_RETURN(CheckpointMeta meta, ReadMetadata(dir, "t"));
      meta.loss_scaler.good_steps = 0;
      meta.loss_scaler.hysteresis = 2;
      meta.loss_scaler.last_overflow_step = -1;
      ZERO_RETURN_IF_ERROR(WriteMetadata(dir, "t", meta));
    }
    double sync = 0;
    ZERO_RETURN_IF_ERROR(comm->AllReduceHost(&sync, 1, ReduceOp::kSum));
    ZERO_ASSIGN_OR_RETURN(auto b, MakeEngine(*config, model, device, comm));
    ZERO_RETURN_IF_ERROR(b->LoadCheckpoint(dir, "t").status());
    ZERO_RETURN_IF_ERROR(TrainSteps(b.get(), device, model, rank, 3, &edited[rank], to));
    return Snapshot(b.get(), &edited[rank]);
  });
  ASSERT_OK(st);
  EXPECT_EQ(edited[0].scales, (std::vector<float>{256.0f, 256.0f, 256.0f}));
  EXPECT_EQ(edited[0].applied, (std::vector<int>{1, 1, 0}));
  EXPECT_EQ(uninterrupted[0].applied, (std::vector<int>{1, 0, 0}));
  EXPECT_FALSE(SameBits(uninterrupted[0].master, edited[0].master));
}

// --- 2. another world size ---------------------------------------------------------------------------

// Saves at `from` ranks (stage `stage`, after two steps), loads at `to` ranks: the full master
// weights and moments are the saved ones bit for bit; then two more steps at the new world size
// equal, bitwise, a stage-0 engine at the new world size loaded from the same checkpoint (fp32,
// GAS 1, no clipping: the stages agree bitwise there).
void CheckWorldChange(int stage, int from, int to) {
  const std::string label =
      "stage " + std::to_string(stage) + " world " + std::to_string(from) + " -> " + std::to_string(to);
  SCOPED_TRACE(label);
  const TestModel model = SmallModel();
  const std::string dir = ScratchDir("world");
  auto save_config = MakeConfig(ConfigJson(stage, 1, 0.0, kWarmup), from);
  auto load_config = MakeConfig(ConfigJson(stage, 1, 0.0, kWarmup), to);
  auto ref_config = MakeConfig(ConfigJson(0, 1, 0.0, kWarmup), to);
  ASSERT_TRUE(save_config.ok() && load_config.ok() && ref_config.ok());
  std::vector<Record> saved(from);
  Status st = RunThreadRanks(from, [&](int rank, Communicator* comm, Device* device) -> Status {
    ZERO_ASSIGN_OR_RETURN(auto a, MakeEngine(*save_config, model, device, comm));
    Record r;
    ZERO_RETURN_IF_ERROR(TrainSteps(a.get(), device, model, rank, 2, &r));
    ZERO_RETURN_IF_ERROR(a->SaveCheckpoint(dir));
    return Snapshot(a.get(), &saved[rank]);
  });
  ASSERT_OK(st);

  std::vector<Record> loaded(to), got(to), ref(to);
  st = RunThreadRanks(to, [&](int rank, Communicator* comm, Device* device) -> Status {
    {
      ZERO_ASSIGN_OR_RETURN(auto b, MakeEngine(*load_config, model, device, comm, 0.5f));
      ZERO_RETURN_IF_ERROR(b->LoadCheckpoint(dir).status());
      ZERO_RETURN_IF_ERROR(Snapshot(b.get(), &loaded[rank]));
      ZERO_RETURN_IF_ERROR(TrainSteps(b.get(), device, model, rank, 2, &got[rank]));
      ZERO_RETURN_IF_ERROR(Snapshot(b.get(), &got[rank]));
    }
    ZERO_ASSIGN_OR_RETURN(auto c, MakeEngine(*ref_config, model, device, comm, -0.25f));
    ZERO_RETURN_IF_ERROR(c->LoadCheckpoint(dir).status());
    ZERO_RETURN_IF_ERROR(TrainSteps(c.get(), device, model, rank, 2, &ref[rank]));
    return Snapshot(c.get(), &ref[rank]);
  });
  ASSERT_OK(st);
  for (int r = 0; r < to; ++r) {
    const std::string who = label + " rank " + std::to_string(r);
    ExpectSameState(saved[0], loaded[r], DType::kF32, who);
    EXPECT_TRUE(SameBits(got[r].losses, ref[r].losses)) << who;
    EXPECT_TRUE(SameBits(got[r].lrs, ref[r].lrs)) << who;
    EXPECT_TRUE(SameBits(got[r].master, ref[r].master)) << who << ": master";
    EXPECT_TRUE(SameBits(got[r].model, ref[r].model)) << who << ": model";
    EXPECT_TRUE(SameBits(got[r].exp_avg_sq, ref[r].exp_avg_sq)) << who << ": exp_avg_sq";
    EXPECT_TRUE(SameCounters(got[r].counters, ref[r].counters)) << who;
    for (size_t k = 0; k < ref[r].norms.size(); ++k) {
      EXPECT_NEAR(got[r].norms[k], ref[r].norms[k], 1e-12 * ref[r].norms[k]) << who;
    }
    // Training went on from the loaded state.
    EXPECT_EQ(got[r].counters.global_steps, 4) << who;
    EXPECT_FALSE(SameBits(got[r].master, saved[0].master)) << who;
  }
}

TEST(EngineCheckpointTest, LoadsAtAnotherWorldSizeEveryStage) {
  for (int stage = 0; stage <= 3; ++stage) {
    CheckWorldChange(stage, 2, 3);
    CheckWorldChange(stage, 4, 1);
  }
}

// --- 3. another stage ------------------------------------------------------------------------------

// Two steps under `save_json`, a checkpoint, two more (the uninterrupted run); an engine under
// `load_json` (other initial values) loads it and runs the same two steps: its loaded state equals
// the saved one and its run the uninterrupted one, bitwise. `offloaded`: whether the loading
// engine must keep its states off the device (checked), if given.
void CheckCrossLoad(const std::string& save_json, const std::string& load_json, const std::string& label,
                    std::optional<bool> offloaded = std::nullopt) {
  SCOPED_TRACE(label);
  const TestModel model = SmallModel();
  const int world = 2;
  const std::string dir = ScratchDir("cross");
  auto save_config = MakeConfig(save_json, world);
  auto load_config = MakeConfig(load_json, world);
  ASSERT_OK(save_config);
  ASSERT_OK(load_config);
  std::vector<Record> at_save(world), uninterrupted(world), loaded(world), resumed(world);
  std::vector<EngineMemory> mem(world);
  Status st = RunThreadRanks(world, [&](int rank, Communicator* comm, Device* device) -> Status {
    {
      ZERO_ASSIGN_OR_RETURN(auto a, MakeEngine(*save_config, model, device, comm));
      Record r;
      ZERO_RETURN_IF_ERROR(TrainSteps(a.get(), device, model, rank, 2, &r));
      ZERO_RETURN_IF_ERROR(a->SaveCheckpoint(dir, "cross"));
      ZERO_RETURN_IF_ERROR(Snapshot(a.get(), &at_save[rank]));
      ZERO_RETURN_IF_ERROR(TrainSteps(a.get(), device, model, rank, 2, &uninterrupted[rank]));
      ZERO_RETURN_IF_ERROR(Snapshot(a.get(), &uninterrupted[rank]));
    }
    ZERO_ASSIGN_OR_RETURN(auto b, MakeEngine(*load_config, model, device, comm, 1.0f));
    mem[rank] = b->memory();
    ZERO_RETURN_IF_ERROR(b->LoadCheckpoint(dir, "cross").status());
    ZERO_RETURN_IF_ERROR(Snapshot(b.get(), &loaded[rank]));
    ZERO_RETURN_IF_ERROR(TrainSteps(b.get(), device, model, rank, 2, &resumed[rank]));
    return Snapshot(b.get(), &resumed[rank]);
  });
  ASSERT_OK(st);
  for (int r = 0; r < world; ++r) {
    if (offloaded.has_value()) {
      EXPECT_EQ(mem[r].master_params == 0, *offloaded) << label << ": where the loading engine keeps its states";
    }
    ExpectSameState(at_save[r], loaded[r], DType::kF32, label);
    EXPECT_TRUE(SameBits(uninterrupted[r].losses, resumed[r].losses)) << label;
    EXPECT_TRUE(SameBits(uninterrupted[r].master, resumed[r].master)) << label;
    EXPECT_TRUE(SameBits(uninterrupted[r].model, resumed[r].model)) << label;
    EXPECT_TRUE(SameBits(uninterrupted[r].exp_avg, resumed[r].exp_avg)) << label;
  }
}

// fp32, GAS 1: the stages agree bitwise, so a run that switches stage at the checkpoint equals the
// uninterrupted run of the saving stage.
TEST(EngineCheckpointTest, LoadsAtAnotherStage) {
  for (auto [from, to] : {std::pair{3, 1}, std::pair{1, 3}, std::pair{2, 0}, std::pair{0, 3}}) {
    CheckCrossLoad(ConfigJson(from, 1, 0.0, kWarmup), ConfigJson(to, 1, 0.0, kWarmup),
                   "stage " + std::to_string(from) + " -> " + std::to_string(to));
  }
}

// offload_optimizer.device "cpu" (host states, CPU AdamW) and device states write and read the
// same checkpoints: a run that switches offload mode (and stage) at the checkpoint equals the
// uninterrupted run of the saving configuration, bitwise.
TEST(EngineCheckpointTest, LoadsIntoAnotherOffloadMode) {
  const std::string cpu = "\"offload_optimizer\": {\"device\": \"cpu\", \"cpu_threads\": 2}";
  struct Case {
    int from_stage;
    bool from_offload;
    int to_stage;
    bool to_offload;
  };
  for (const Case& c :
       {Case{2, true, 3, false}, Case{3, false, 1, true}, Case{1, true, 2, true}, Case{3, true, 3, true}}) {
    CheckCrossLoad(ConfigJson(c.from_stage, 1, 0.0, kWarmup, c.from_offload ? cpu : ""),
                   ConfigJson(c.to_stage, 1, 0.0, kWarmup, c.to_offload ? cpu : ""),
                   "stage " + std::to_string(c.from_stage) + (c.from_offload ? " offload" : "") + " -> " +
                       std::to_string(c.to_stage) + (c.to_offload ? " offload" : ""),
                   c.to_offload);
  }
}

// offload_param.device "cpu" (stage 3 shards in host memory) saves and loads the same checkpoints:
// resume within the mode, into a run without it and from one without it, with the optimizer states
// on the device, in host memory or on NVMe (the device-scratch write path), all bitwise.
TEST(EngineCheckpointTest, LoadsAcrossParameterOffload) {
  const std::string dir = ScratchDir("param_offload");
  const std::string param = "\"offload_param\": {\"device\": \"cpu\", \"buffer_count\": 2}";
  const std::string cpu = "\"offload_optimizer\": {\"device\": \"cpu\", \"cpu_threads\": 2}";
  const std::string nvme = "\"sub_group_size\": 50, \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"" +
                           dir + "/swap\", \"buffer_count\": 2, \"cpu_threads\": 2}";
  CheckCrossLoad(ConfigJson(3, 1, 0.0, kWarmup, param), ConfigJson(3, 1, 0.0, kWarmup, param),
                 "stage 3 param offload -> param offload", false);
  CheckCrossLoad(ConfigJson(3, 1, 0.0, kWarmup, param), ConfigJson(3, 1, 0.0, kWarmup, ""),
                 "stage 3 param offload -> no offload", false);
  CheckCrossLoad(ConfigJson(3, 1, 0.0, kWarmup, ""), ConfigJson(3, 1, 0.0, kWarmup, param + ", " + cpu),
                 "stage 3 no offload -> param + optimizer offload", true);
  CheckCrossLoad(ConfigJson(3, 1, 0.0, kWarmup, param + ", " + cpu), ConfigJson(1, 1, 0.0, kWarmup, ""),
                 "stage 3 param + optimizer offload -> stage 1", false);
  CheckCrossLoad(ConfigJson(2, 1, 0.0, kWarmup, cpu), ConfigJson(3, 1, 0.0, kWarmup, param + ", " + nvme),
                 "stage 2 cpu -> stage 3 param offload + nvme states", true);
}

// Unmanaged accumulation (managed_gradient_accumulation false: two Backward() calls, then Step(), per
// window) with parameter offload at stage 3: a checkpoint saved between windows and resumed gives
// the uninterrupted run bitwise, with the shards in host memory (optimizer on the device and in host
// memory) and in a swap file (optimizer on the device and on NVMe).
TEST(EngineCheckpointTest, UnmanagedResumeWithParameterOffload) {
  const std::string dir = ScratchDir("unmanaged_param_offload");
  const std::string unmanaged = std::string(kWarmup) + ", \"managed_gradient_accumulation\": false";
  const std::string param = "\"offload_param\": {\"device\": \"cpu\", \"buffer_count\": 2}";
  const std::string cpu = "\"offload_optimizer\": {\"device\": \"cpu\", \"cpu_threads\": 2}";
  auto param_nvme = [&](const std::string& sub) {
    return "\"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"" + dir + "/" + sub +
           "\", \"buffer_count\": 2, \"max_in_cpu\": 0}";
  };
  auto nvme = [&](const std::string& sub) {
    return "\"sub_group_size\": 50, \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"" + dir + "/" + sub +
           "\", \"buffer_count\": 2, \"cpu_threads\": 2}";
  };
  CheckCrossLoad(ConfigJson(3, 1, 0.0, unmanaged, param), ConfigJson(3, 1, 0.0, unmanaged, param),
                 "unmanaged stage 3 param offload", false);
  CheckCrossLoad(ConfigJson(3, 1, 0.0, unmanaged, param + ", " + cpu),
                 ConfigJson(3, 1, 0.0, unmanaged, param + ", " + cpu), "unmanaged stage 3 param + optimizer offload",
                 true);
  CheckCrossLoad(ConfigJson(3, 1, 0.0, unmanaged, param_nvme("a")), ConfigJson(3, 1, 0.0, unmanaged, param_nvme("b")),
                 "unmanaged stage 3 param nvme", false);
  CheckCrossLoad(ConfigJson(3, 1, 0.0, unmanaged, param_nvme("c") + ", " + nvme("c")),
                 ConfigJson(3, 1, 0.0, unmanaged, param_nvme("d") + ", " + nvme("d")),
                 "unmanaged stage 3 param nvme + optimizer nvme", true);
}

// NVMe and tiered states (swap files with real O_DIRECT I/O, groups of 50 elements, two buffers:
// every step evicts and re-reads) save and load the same checkpoints too: resume within the mode
// and across modes (none, cpu, nvme, tiered) is bitwise.
TEST(EngineCheckpointTest, NvmeAndTieredStatesResumeAndLoadAcrossModes) {
  const std::string dir = ScratchDir("nvme_states");
  auto nvme = [&](const std::string& sub, int64_t budget) {
    return "\"sub_group_size\": 50, \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"" + dir + "/" + sub +
           "\", \"buffer_count\": 2, \"cpu_threads\": 2, \"host_memory_budget\": " + std::to_string(budget) + "}";
  };
  const std::string cpu = "\"offload_optimizer\": {\"device\": \"cpu\"}";
  CheckCrossLoad(ConfigJson(2, 1, 0.0, kWarmup, nvme("a", 0)), ConfigJson(2, 1, 0.0, kWarmup, nvme("b", 0)),
                 "stage 2 nvme -> nvme", true);
  CheckCrossLoad(ConfigJson(3, 1, 0.0, kWarmup, nvme("a", 12 * 40)), ConfigJson(1, 1, 0.0, kWarmup, ""),
                 "stage 3 tiered -> stage 1 on the device", false);
  CheckCrossLoad(ConfigJson(1, 1, 0.0, kWarmup, cpu), ConfigJson(3, 1, 0.0, kWarmup, nvme("b", 12 * 40)),
                 "stage 1 cpu -> stage 3 tiered", true);
  CheckCrossLoad(ConfigJson(3, 1, 0.0, kWarmup, ""), ConfigJson(2, 1, 0.0, kWarmup, nvme("c", 0)),
                 "stage 3 on the device -> stage 2 nvme", true);
}

// bf16 saved at stage 3, loaded at stage 1 and at stage 0 on another world size: the master weights
// and moments arrive intact and the bf16 model parameters are re-derived from them.
TEST(EngineCheckpointTest, Bf16Stage3LoadsAtStage1AndStage0) {
  const TestModel model = SmallModel();
  const std::string bf16 = DtypeJson("bf16");
  const std::string dir = ScratchDir("bf16stage");
  auto save_config = MakeConfig(ConfigJson(3, 2, 1.0, bf16, "\"stage3_param_persistence_threshold\": 5"), 2);
  ASSERT_OK(save_config);
  std::vector<Record> saved(2);
  Status st = RunThreadRanks(2, [&](int rank, Communicator* comm, Device* device) -> Status {
    ZERO_ASSIGN_OR_RETURN(auto a, MakeEngine(*save_config, model, device, comm));
    Record r;
    ZERO_RETURN_IF_ERROR(TrainSteps(a.get(), device, model, rank, 2, &r));
    ZERO_RETURN_IF_ERROR(a->SaveCheckpoint(dir));
    return Snapshot(a.get(), &saved[rank]);
  });
  ASSERT_OK(st);
  for (auto [stage, world] : {std::pair{1, 2}, std::pair{0, 3}}) {
    auto config = MakeConfig(ConfigJson(stage, 2, 1.0, bf16), world);
    ASSERT_OK(config);
    std::vector<Record> loaded(world), after(world);
    st = RunThreadRanks(world, [&](int rank, Communicator* comm, Device* device) -> Status {
      ZERO_ASSIGN_OR_RETURN(auto b, MakeEngine(*config, model, device, comm, 2.0f));
      ZERO_RETURN_IF_ERROR(b->LoadCheckpoint(dir).status());
      ZERO_RETURN_IF_ERROR(Snapshot(b.get(), &loaded[rank]));
      ZERO_RETURN_IF_ERROR(TrainSteps(b.get(), device, model, rank, 1, &after[rank]));
      return Snapshot(b.get(), &after[rank]);
    });
    ASSERT_OK(st);
    for (int r = 0; r < world; ++r) {
      ExpectSameState(saved[0], loaded[r], DType::kBF16, "stage " + std::to_string(stage));
      EXPECT_EQ(after[r].counters.global_steps, 3);
      EXPECT_EQ(after[r].applied, std::vector<int>{1});
    }
  }
}

// A stage-3 engine that holds gathered (and persistent) parameters when it loads: what it gathered
// before is dropped, so the parameters read after the load are the loaded ones.
TEST(EngineCheckpointTest, Stage3LoadDropsGatheredParameters) {
  const TestModel model = SmallModel();
  const std::string dir = ScratchDir("stage3drop");
  auto config = MakeConfig(ConfigJson(3, 1, 1.0, "", "\"stage3_param_persistence_threshold\": 5"), 2);
  ASSERT_OK(config);
  Status st = RunThreadRanks(2, [&](int rank, Communicator* comm, Device* device) -> Status {
    Record r;
    {
      ZERO_ASSIGN_OR_RETURN(auto a, MakeEngine(*config, model, device, comm));
      ZERO_RETURN_IF_ERROR(TrainSteps(a.get(), device, model, rank, 2, &r));
      ZERO_RETURN_IF_ERROR(a->SaveCheckpoint(dir));
      ZERO_RETURN_IF_ERROR(Snapshot(a.get(), &r));
    }
    ZERO_ASSIGN_OR_RETURN(auto b, MakeEngine(*config, model, device, comm, 1.0f));
    // Warm b's gathers: one step (persistent parameters gathered and kept), and hold module m0.
    Record warm;
    ZERO_RETURN_IF_ERROR(TrainSteps(b.get(), device, model, rank, 1, &warm));
    ZERO_ASSIGN_OR_RETURN(ModuleHandle held, b->GatherModule("m0"));
    ZERO_RETURN_IF_ERROR(b->LoadCheckpoint(dir).status());
    // The held module was re-gathered from the loaded shards; the others gather anew.
    for (int i = 0; i < static_cast<int>(model.specs.size()); ++i) {
      std::vector<float> v;
      if (model.specs[i].module == "m0") {
        ZERO_RETURN_IF_ERROR(ReadParam(b.get(), device, i, &v));
      } else {
        ZERO_ASSIGN_OR_RETURN(ModuleHandle h, b->GatherModule(model.specs[i].module));
        ZERO_RETURN_IF_ERROR(ReadParam(b.get(), device, i, &v));
      }
      if (!SameBits(v, r.model[i])) return InternalError("parameter " + model.specs[i].name + " is stale");
    }
    return held.Release();
  });
  EXPECT_OK(st);
}

// --- 4. errors ---------------------------------------------------------------------------------------

CommOptions ShortTimeout() {
  CommOptions o;
  o.timeout = std::chrono::milliseconds(2000);
  return o;
}

// Runs body on `world` ranks and returns each rank's Status (the bodies' errors are expected).
std::vector<Status> PerRank(int world, const std::function<Status(int, Communicator*, Device*)>& body,
                            CommOptions options = {}) {
  std::vector<Status> out(world);
  Status st = RunThreadRanks(
      world,
      [&](int rank, Communicator* comm, Device* device) -> Status {
        out[rank] = body(rank, comm, device);
        return OkStatus();
      },
      options);
  EXPECT_OK(st);
  return out;
}

void FlipByte(const std::string& path, size_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good()) << path;
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

TEST(EngineCheckpointTest, LoadErrorsNameTheProblem) {
  const TestModel model = SmallModel();
  const std::string dir = ScratchDir("errors");
  auto config = MakeConfig(ConfigJson(2, 1, 1.0), 2);
  ASSERT_OK(config);
  Status st = RunThreadRanks(2, [&](int rank, Communicator* comm, Device* device) -> Status {
    ZERO_ASSIGN_OR_RETURN(auto a, MakeEngine(*config, model, device, comm));
    Record r;
    ZERO_RETURN_IF_ERROR(TrainSteps(a.get(), device, model, rank, 1, &r));
    return a->SaveCheckpoint(dir, "good");
  });
  ASSERT_OK(st);

  auto load = [&](const TestModel& m, const std::string& from, const std::string& tag) {
    return PerRank(2, [&](int rank, Communicator* comm, Device* device) -> Status {
      ZERO_ASSIGN_OR_RETURN(auto b, MakeEngine(*config, m, device, comm));
      Status s = b->LoadCheckpoint(from, tag).status();
      if (s.ok()) return s;
      // A refused load leaves the engine usable: it still trains.
      Record r;
      ZERO_RETURN_IF_ERROR(TrainSteps(b.get(), device, m, rank, 1, &r));
      return s;
    });
  };

  // A model with another shape: the parameter and both shapes.
  TestModel other = model;
  other.specs[2].shape = {3, 5};
  for (const Status& s : load(other, dir, "")) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find("parameter 'm1.w': checkpoint shape [5, 3], model shape [3, 5]"), std::string::npos)
        << s.ToString();
  }
  // A model with a parameter the checkpoint lacks.
  TestModel extra = model;
  extra.specs.push_back({"m2.extra", {4}, "m2"});
  for (const Status& s : load(extra, dir, "good")) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find("m2.extra"), std::string::npos) << s.ToString();
  }

  // A missing rank file: the file and the world size it was saved with.
  const std::string file1 = dir + "/good/zero_rank_1_optim_states.bin";
  ASSERT_EQ(std::rename(file1.c_str(), (file1 + ".away").c_str()), 0);
  for (const Status& s : load(model, dir, "good")) {
    EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
    EXPECT_NE(s.message().find("zero_rank_1_optim_states.bin"), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("was saved with dp world size 2"), std::string::npos) << s.ToString();
  }
  ASSERT_EQ(std::rename((file1 + ".away").c_str(), file1.c_str()), 0);

  // A corrupt rank file: the file and the checksums.
  const std::string file0 = dir + "/good/zero_rank_0_optim_states.bin";
  auto size = FileSize(file0);
  ASSERT_OK(size);
  FlipByte(file0, *size / 2);
  for (const Status& s : load(model, dir, "good")) {
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
    EXPECT_NE(s.message().find("zero_rank_0_optim_states.bin"), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("checksum mismatch: expected crc32c 0x"), std::string::npos) << s.ToString();
  }
  FlipByte(file0, *size / 2);
  for (const Status& s : load(model, dir, "good")) EXPECT_OK(s);

  // No `latest`.
  const std::string empty = ScratchDir("empty");
  for (const Status& s : load(model, empty, "")) {
    EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
    EXPECT_NE(s.message().find("no checkpoint was completed"), std::string::npos) << s.ToString();
  }
  // A tag that does not exist.
  for (const Status& s : load(model, dir, "nope")) {
    EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
    EXPECT_NE(s.message().find("'nope'"), std::string::npos) << s.ToString();
  }
}

TEST(EngineCheckpointTest, SaveAndLoadInsideAnAccumulationWindowAreRefused) {
  const TestModel model = SmallModel();
  const std::string dir = ScratchDir("window");
  for (int stage : {0, 2}) {
    auto config = MakeConfig(ConfigJson(stage, 2, 1.0), 2);
    ASSERT_OK(config);
    Status st = RunThreadRanks(2, [&](int rank, Communicator* comm, Device* device) -> Status {
      ZERO_ASSIGN_OR_RETURN(auto e, MakeEngine(*config, model, device, comm));
      ZERO_RETURN_IF_ERROR(e->SaveCheckpoint(dir, "start"));  // before any step: fine
      // One micro step of a GAS-2 window.
      std::vector<float> v;
      for (int i = 0; i < e->num_params(); ++i) {
        ZERO_ASSIGN_OR_RETURN(ModuleHandle h, e->GatherModule(model.specs[i].module));
        ZERO_RETURN_IF_ERROR(ReadParam(e.get(), device, i, &v));
        ZERO_RETURN_IF_ERROR(WriteGrad(e.get(), device, i, Gradient(i, v, rank, 0, 1.0f)));
        if (i == 0) {
          // Mid-backward.
          ZERO_RETURN_IF_ERROR(
              Expect(e->SaveCheckpoint(dir, "mid"), StatusCode::kFailedPrecondition, "in the middle of a backward"));
        }
      }
      ZERO_RETURN_IF_ERROR(e->Backward());
      ZERO_RETURN_IF_ERROR(e->Step());  // off the boundary: advances only
      ZERO_RETURN_IF_ERROR(Expect(e->SaveCheckpoint(dir, "mid"), StatusCode::kFailedPrecondition,
                                  "SaveCheckpoint inside a gradient accumulation window (1 of 2 micro steps"));
      ZERO_RETURN_IF_ERROR(Expect(e->SaveCheckpoint(dir, "mid"), StatusCode::kFailedPrecondition,
                                  "accumulated gradients are not saved"));
      ZERO_RETURN_IF_ERROR(Expect(e->LoadCheckpoint(dir, "start").status(), StatusCode::kFailedPrecondition,
                                  "LoadCheckpoint inside a gradient accumulation window"));
      // The boundary micro step, before Step().
      for (int i = 0; i < e->num_params(); ++i) {
        ZERO_ASSIGN_OR_RETURN(ModuleHandle h, e->GatherModule(model.specs[i].module));
        ZERO_RETURN_IF_ERROR(ReadParam(e.get(), device, i, &v));
        ZERO_RETURN_IF_ERROR(WriteGrad(e.get(), device, i, Gradient(i, v, rank, 1, 1.0f)));
      }
      ZERO_RETURN_IF_ERROR(e->Backward());
      ZERO_RETURN_IF_ERROR(Expect(e->SaveCheckpoint(dir, "mid"), StatusCode::kFailedPrecondition,
                                  "the accumulation boundary Backward() ran but Step() has not"));
      ZERO_RETURN_IF_ERROR(e->Step());
      if (!e->was_step_applied()) return InternalError("step not applied");
      // At the boundary: fine again.
      return e->SaveCheckpoint(dir, "end");
    });
    ASSERT_OK(st) << "stage " << stage;
    EXPECT_FALSE(PathExists(dir + "/mid"));
    EXPECT_EQ(*ReadLatest(dir), "end");
  }

  // Unmanaged accumulation: Backward() calls since the last Step() are a window too.
  auto config =
      MakeConfig(ConfigJson(1, 1, 1.0, "\"managed_gradient_accumulation\": false", "\"overlap_comm\": false"), 2);
  ASSERT_OK(config);
  Status st = RunThreadRanks(2, [&](int rank, Communicator* comm, Device* device) -> Status {
    ZERO_ASSIGN_OR_RETURN(auto e, MakeEngine(*config, model, device, comm));
    std::vector<float> v;
    ZERO_RETURN_IF_ERROR(ReadParam(e.get(), device, 0, &v));
    ZERO_RETURN_IF_ERROR(WriteGrad(e.get(), device, 0, Gradient(0, v, rank, 0, 1.0f)));
    ZERO_RETURN_IF_ERROR(e->Backward());
    ZERO_RETURN_IF_ERROR(Expect(e->SaveCheckpoint(dir, "unmanaged"), StatusCode::kFailedPrecondition,
                                "1 Backward() call(s) since the last Step()"));
    ZERO_RETURN_IF_ERROR(e->Step());
    return e->SaveCheckpoint(dir, "unmanaged");
  });
  ASSERT_OK(st);
}

// EngineEnv::file_system carries the checkpoint files: with every rename failing the save fails on
// every rank naming the errno and leaves nothing; once the fault is gone the engine saves through
// it; a read failing makes the load fail on every rank.
TEST(EngineCheckpointTest, EnvFileSystemCarriesTheCheckpointFiles) {
  const TestModel model = SmallModel();
  const std::string dir = ScratchDir("envfs");
  auto config = MakeConfig(ConfigJson(2, 1, 1.0), 2);
  ASSERT_OK(config);
  FaultyFileSystem fs;
  EngineEnv env;
  env.file_system = &fs;
  auto run = [&](const std::function<Status(Engine*)>& body) {
    return PerRank(2, [&](int rank, Communicator* comm, Device* device) -> Status {
      ZERO_ASSIGN_OR_RETURN(auto e, Engine::Create(*config, device, comm, env));
      for (const ParamSpec& s : model.specs) ZERO_RETURN_IF_ERROR(e->RegisterParameter(s).status());
      ZERO_RETURN_IF_ERROR(e->Initialize([](int index, float* v) { v[0] = InitValue(index, 0); }));
      Record r;
      ZERO_RETURN_IF_ERROR(TrainSteps(e.get(), device, model, rank, 1, &r));
      return body(e.get());
    });
  };

  fs.FailNthCall("Rename", 1, EIO, /*persistent=*/true);
  for (const Status& s : run([&](Engine* e) { return e->SaveCheckpoint(dir, "t"); })) {
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("Input/output error"), std::string::npos) << s.ToString();
  }
  EXPECT_FALSE(PathExists(dir + "/t"));
  EXPECT_FALSE(PathExists(dir + "/latest"));

  fs.ClearFaults();
  const int64_t renames = fs.call_count("Rename");
  for (const Status& s : run([&](Engine* e) { return e->SaveCheckpoint(dir, "t"); })) EXPECT_OK(s);
  EXPECT_GT(fs.call_count("Rename"), renames);
  EXPECT_EQ(*ReadLatest(dir), "t");

  fs.FailNthCall("ReadFile", 1, EIO, /*persistent=*/true);
  for (const Status& s : run([&](Engine* e) { return e->LoadCheckpoint(dir, "t").status(); })) {
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("Input/output error"), std::string::npos) << s.ToString();
  }
}

TEST(EngineCheckpointTest, SaveOnRankZeroOnlyFailsWithoutHanging) {
  const TestModel model = SmallModel();
  const std::string dir = ScratchDir("rank0");
  auto config = MakeConfig(ConfigJson(1, 1, 1.0), 2);
  ASSERT_OK(config);
  const auto start = std::chrono::steady_clock::now();
  std::vector<Status> results = PerRank(
      2,
      [&](int rank, Communicator* comm, Device* device) -> Status {
        ZERO_ASSIGN_OR_RETURN(auto e, MakeEngine(*config, model, device, comm));
        Record r;
        ZERO_RETURN_IF_ERROR(TrainSteps(e.get(), device, model, rank, 1, &r));
        if (rank != 0) return OkStatus();  // the user's `if rank == 0: save()`
        return e->SaveCheckpoint(dir);
      },
      ShortTimeout());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(results[0].ok());
  EXPECT_TRUE(results[0].code() == StatusCode::kDeadlineExceeded || results[0].code() == StatusCode::kUnavailable)
      << results[0].ToString();
  EXPECT_NE(results[0].message().find("not every rank joined the save"), std::string::npos) << results[0].ToString();
  EXPECT_OK(results[1]);
  EXPECT_LT(seconds, 30.0);
  EXPECT_FALSE(PathExists(dir + "/global_step1"));
  EXPECT_FALSE(PathExists(dir + "/latest"));
}

TEST(EngineCheckpointTest, BadArgumentsAreRefusedOnEveryRank) {
  const TestModel model = SmallModel();
  const std::string dir = ScratchDir("badargs");
  auto config = MakeConfig(ConfigJson(3, 1, 1.0), 2);
  ASSERT_OK(config);
  std::vector<Status> results = PerRank(2, [&](int rank, Communicator* comm, Device* device) -> Status {
    ZERO_ASSIGN_OR_RETURN(auto e, MakeEngine(*config, model, device, comm));
    // Invalid client state on one rank only: every rank fails, nothing is written.
    Status s = e->SaveCheckpoint(dir, "t", rank == 1 ? "{not json" : "{}");
    if (s.ok()) return InternalError("invalid client state accepted");
    if (rank == 1) ZERO_RETURN_IF_ERROR(Expect(s, StatusCode::kInvalidArgument, "client_state_json: not valid JSON"));
    if (rank == 0) ZERO_RETURN_IF_ERROR(Expect(s, StatusCode::kFailedPrecondition, "rank(s) 1 refused the save"));
    ZERO_RETURN_IF_ERROR(Expect(e->SaveCheckpoint(dir, "a/b"), StatusCode::kInvalidArgument, "a/b"));
    std::vector<float> a(1), b(1);
    ZERO_RETURN_IF_ERROR(
        Expect(e->GatherOptimizerState(5, a.data(), nullptr), StatusCode::kInvalidArgument, "must not be null"));
    // Still usable.
    return e->SaveCheckpoint(dir, "t");
  });
  for (const Status& s : results) EXPECT_OK(s);
  EXPECT_EQ(*ReadLatest(dir), "t");

  // Before Initialize().
  results = PerRank(1, [&](int, Communicator* comm, Device* device) -> Status {
    ZERO_ASSIGN_OR_RETURN(auto e, Engine::Create(*config, device, comm));
    ZERO_RETURN_IF_ERROR(Expect(e->SaveCheckpoint(dir), StatusCode::kFailedPrecondition, "before Initialize()"));
    return Expect(e->LoadCheckpoint(dir).status(), StatusCode::kFailedPrecondition, "before Initialize()");
  });
  EXPECT_OK(results[0]);
}

// --- 5. zero_to_fp32 -------------------------------------------------------------------------------

TEST(EngineCheckpointTest, ZeroToFp32EqualsTheLiveMasterWeights) {
  const TestModel model = SmallModel();
  for (int stage = 0; stage <= 3; ++stage) {
    for (int world : {2, 3}) {
      const std::string label = "stage " + std::to_string(stage) + " world " + std::to_string(world);
      SCOPED_TRACE(label);
      const std::string dir = ScratchDir("fp32");
      auto config = MakeConfig(ConfigJson(stage, 2, 1.0, Join(DtypeJson("bf16"), kWarmup)), world);
      ASSERT_OK(config);
      std::vector<Record> live(world);
      Status st = RunThreadRanks(world, [&](int rank, Communicator* comm, Device* device) -> Status {
        ZERO_ASSIGN_OR_RETURN(auto e, MakeEngine(*config, model, device, comm));
        Record r;
        ZERO_RETURN_IF_ERROR(TrainSteps(e.get(), device, model, rank, 2, &r));
        ZERO_RETURN_IF_ERROR(e->SaveCheckpoint(dir));
        return Snapshot(e.get(), &live[rank]);
      });
      ASSERT_OK(st);
      const std::string out = dir + "/model.safetensors";
      auto summary = ConsolidateToFp32(dir, "", out);
      ASSERT_OK(summary);
      EXPECT_EQ(summary->tag, "global_step2");
      EXPECT_EQ(summary->zero_stage, stage);
      EXPECT_EQ(summary->dp_world_size, world);
      auto file = llm::SafetensorsFile::Open(out);
      ASSERT_OK(file);
      ASSERT_EQ(file->tensors().size(), model.specs.size());
      for (size_t i = 0; i < model.specs.size(); ++i) {
        const llm::TensorInfo* t = file->Find(model.specs[i].name);
        ASSERT_NE(t, nullptr) << model.specs[i].name;
        EXPECT_EQ(t->shape, model.specs[i].shape) << model.specs[i].name;
        auto values = file->ReadFloats(*t);
        ASSERT_OK(values);
        EXPECT_TRUE(SameBits(*values, live[0].master[i])) << model.specs[i].name;
      }
    }
  }
}

}  // namespace
}  // namespace zero
