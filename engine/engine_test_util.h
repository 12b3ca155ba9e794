// Test helpers shared by the Engine's tests (engine_test, engine_options_test,
// engine_checkpoint_test): a tiny multi-module model with deterministic initial values and
// gradients, config JSON builders, host reads/writes of model parameters and gradient buffers, and
// the one training loop they all run (engine_test_util.cc). Test-only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "engine/config/config.h"
#include "engine/engine.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/status.h"

namespace zero::testing {

struct TestModel {
  std::vector<ParamSpec> specs;
  std::vector<std::string> modules;  // forward order
};

inline TestModel SmallModel() {
  TestModel m;
  m.specs = {
      {"m0.w", {7, 5}, "m0"}, {"m0.b", {5}, "m0"},  {"m1.w", {5, 3}, "m1"},
      {"m1.b", {3}, "m1"},    {"m2.w", {13}, "m2"}, {"m2.s", {}, "m2"},
  };
  m.modules = {"m0", "m1", "m2"};
  return m;
}

// `blocks` modules of one weight (numel w) and one bias (numel b) each.
inline TestModel BlockModel(int blocks, int64_t w, int64_t b) {
  TestModel m;
  for (int k = 0; k < blocks; ++k) {
    const std::string mod = "block" + std::to_string(k);
    m.specs.push_back({mod + ".w", {w}, mod});
    m.specs.push_back({mod + ".b", {b}, mod});
    m.modules.push_back(mod);
  }
  return m;
}

inline int64_t Numel(const ParamSpec& s) {
  int64_t n = 1;
  for (int64_t d : s.shape) n *= d;
  return n;
}

inline float InitValue(int index, int64_t e) {
  return 0.05f * static_cast<float>((e * 7 + index * 3) % 11) - 0.2f + 0.01f * index;
}

// The config of `json` for `world` ranks. Unless `json` names pin_memory_fallback itself, both
// offload blocks get pin_memory_fallback true beside pin_memory (default true): the offloaded
// states and shards are pinned where RLIMIT_MEMLOCK allows (always as root, CAP_IPC_LOCK) and
// pageable beyond it, with one warning, so the suite passes as a normal user with the default
// `ulimit -l` (8192 KiB). Pinned or pageable, the arithmetic is the same.
inline Result<Config> MakeConfig(const std::string& json, int world) {
  ParseOptions o;
  o.world_size = world;
  Result<Config> c = ParseConfig(json, o);
  if (c.ok() && json.find("pin_memory_fallback") == std::string::npos) {
    c->zero.offload_optimizer.pin_memory_fallback = true;
    c->zero.offload_param.pin_memory_fallback = true;
  }
  return c;
}

// `zero_extra` may set reduce_bucket_size itself (a key given twice is an error).
inline std::string ConfigJson(int stage, int gas, double clip, const std::string& extra = "",
                              const std::string& zero_extra = "") {
  const bool own_bucket = zero_extra.find("\"reduce_bucket_size\"") != std::string::npos;
  return "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": " + std::to_string(gas) +
         ", \"gradient_clipping\": " + std::to_string(clip) +
         ", \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.1}}" +
         (extra.empty() ? "" : ", " + extra) + ", \"zero_optimization\": {\"stage\": " + std::to_string(stage) +
         (own_bucket ? "" : ", \"reduce_bucket_size\": 40") + (zero_extra.empty() ? "" : ", " + zero_extra) + "}}";
}

// Parameter `index` (model dtype, full; gathered) as floats.
inline Status ReadParam(Engine* engine, Device* device, int index, std::vector<float>* out) {
  const int64_t n = Numel(engine->param_spec(index));
  const DType t = engine->config().model_dtype();
  ZERO_ASSIGN_OR_RETURN(const void* p, engine->param(index));
  std::vector<uint8_t> raw(static_cast<size_t>(n) * SizeOf(t));
  ZERO_RETURN_IF_ERROR(device->Copy(raw.data(), p, raw.size(), CopyKind::kDeviceToHost, nullptr));
  ZERO_RETURN_IF_ERROR(device->SynchronizeStream(nullptr));
  out->resize(n);
  for (int64_t e = 0; e < n; ++e) (*out)[e] = LoadAsFloat(raw.data(), t, e);
  return OkStatus();
}

// Writes `g` (rounded to the model dtype) into parameter `index`'s gradient buffer, then GradReady.
inline Status WriteGrad(Engine* engine, Device* device, int index, const std::vector<float>& g) {
  const DType t = engine->config().model_dtype();
  ZERO_ASSIGN_OR_RETURN(void* buf, engine->grad_buffer(index));
  std::vector<uint8_t> raw(g.size() * SizeOf(t));
  for (size_t e = 0; e < g.size(); ++e) StoreFromFloat(raw.data(), t, e, g[e]);
  ZERO_RETURN_IF_ERROR(device->Copy(buf, raw.data(), raw.size(), CopyKind::kHostToDevice, nullptr));
  ZERO_RETURN_IF_ERROR(device->SynchronizeStream(nullptr));
  return engine->GradReady(index);
}

// A gradient that depends on the parameter's current value, the rank and the micro step.
inline std::vector<float> Gradient(int index, const std::vector<float>& p, int rank, int64_t micro, float scale) {
  std::vector<float> g(p.size());
  for (size_t e = 0; e < p.size(); ++e) {
    g[e] = scale * (0.5f * p[e] + 0.03f * static_cast<float>((rank + 1) * ((e + index) % 5)) -
                    0.004f * static_cast<float>(micro % 7) + 0.02f * index);
  }
  return g;
}

// OK when `s` has `code` and contains `needle`; else an error describing what came instead.
inline Status Expect(const Status& s, StatusCode code, const std::string& needle) {
  if (s.code() != code || s.message().find(needle) == std::string::npos) {
    return InternalError("expected " + std::string(StatusCodeName(code)) + " containing '" + needle + "', got " +
                         s.ToString());
  }
  return OkStatus();
}

// --- the training loop (engine_test_util.cc) ---------------------------------------------------

// The default TrainOptions::add_loss: a float running sum of 0.5 v^2 (`loss` holds a float).
inline double AddHalfSquares(double loss, const std::vector<float>& values) {
  float l = static_cast<float>(loss);
  for (float v : values) l += 0.5f * v * v;
  return l;
}

struct TrainOptions {
  int steps = 3;                  // optimizer steps (windows)
  float grad_scale = 1.0f;        // multiplies every gradient (large values: clipping kicks in)
  bool times_loss_scale = false;  // and so does loss_scale() (as an fp16 user scales the loss)
  std::vector<int> skip_params;   // never reported
  // Called before every micro step's forward and after every Backward() (stage-3 memory probes).
  std::function<Status(Engine*, Device*)> before_micro;
  std::function<Status(Engine*, Device*)> after_backward;
  // Edits parameter `index`'s gradient of micro step `micro` (counters().micro_steps) before it
  // is written (fp16 overflows).
  std::function<void(Engine*, int index, int64_t micro, std::vector<float>* g)> edit_grad;
  // Adds one parameter's values, read in forward, to the micro step's loss (0 at the start).
  std::function<double(double loss, const std::vector<float>& values)> add_loss = AddHalfSquares;
};

struct TrainResult {
  std::vector<double> losses;  // per micro step (a function of the parameters read in forward)
  std::vector<double> norms;   // global_grad_norm() per window
  std::vector<double> lrs;     // lr() before each window
  std::vector<float> scales;   // loss_scale() before each window
  std::vector<int> applied;    // was_step_applied() per window
  // Snapshot: full tensors (GatherMasterWeights, GatherModelParam, GatherOptimizerState) and the
  // engine's counters, memory and stats.
  std::vector<std::vector<float>> master, model, exp_avg, exp_avg_sq;
  EngineCounters counters;
  EngineMemory memory;
  EngineStats stats;
};

// The parameter indices of each module of `model`, in registration order.
std::vector<std::vector<int>> ModuleParams(const TestModel& model);

// Creates an engine, registers `model` and initializes it with InitValue + `init_shift` (a fresh
// engine that loads a checkpoint must not depend on its own initial values).
Result<std::unique_ptr<Engine>> MakeEngine(const Config& config, const TestModel& model, Device* device,
                                           Communicator* comm, float init_shift = 0.0f);

// `opt.steps` windows on an initialized engine, appended to `out` (losses, norms, lrs, scales,
// applied). A micro step: forward (gather every module, read its parameters, the loss), backward
// in reverse module order with Gradient(index, values, rank, counters().micro_steps, scale),
// Backward(), Step() (managed); unmanaged: two micro steps and one Step() per window.
Status TrainSteps(Engine* e, Device* device, const TestModel& model, int rank, const TrainOptions& opt,
                  TrainResult* out);

// The full state at this point into `out` (collective); the AdamW moments only with
// `optimizer_state`.
Status Snapshot(Engine* e, TrainResult* out, bool optimizer_state = true);

// MakeEngine, TrainSteps and a Snapshot without the moments.
Status Train(const Config& config, const TestModel& model, int rank, Communicator* comm, Device* device,
             const TrainOptions& opt, TrainResult* out);

// Train on `world` thread ranks; every rank's result (failures are gtest failures).
std::vector<TrainResult> TrainAll(const std::string& json, int world, const TestModel& model,
                                  const TrainOptions& opt = {});

}  // namespace zero::testing
