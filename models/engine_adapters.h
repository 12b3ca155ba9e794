// The glue between a model written against model_api.h (ParamProvider / GradSink) and the Engine
// that owns its parameters and gradients: registration of the model's parameter list, its
// deterministic initialization, and the two adapters.
//
//   EngineParams: Acquire(module) = Engine::GatherModule(module) (a no-op handle at stages 0-2,
//     an all-gather at stage 3) plus views of engine->param(i) in the model dtype; Release(module)
//     releases that handle. On CUDA the views are device pointers ready for work on the engine's
//     compute stream (the Device's default stream), which is the stream the model must use.
//   EngineGrads: GradBuffer(i) = engine->grad_buffer(i) (model dtype), GradReady(i) =
//     engine->GradReady(i).
//
// Owns only the module handles it holds between Acquire and Release; never the Engine. Used from
// the engine's thread only.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "models/model_api.h"
#include "runtime/status.h"

namespace zero::examples {

// Registers `specs` with the engine in order (engine index i == spec index i, checked) and
// initializes them with InitParam(spec, seed) (the same values on every rank).
Status RegisterAndInitialize(Engine* engine, const std::vector<ModelParamSpec>& specs, uint64_t seed);

class EngineParams final : public ParamProvider {
 public:
  EngineParams(Engine* engine, const std::vector<ModelParamSpec>& specs);
  ~EngineParams() override;  // releases anything still held (ignoring errors)

  Result<std::vector<ParamView>> Acquire(const std::string& module) override;
  Status Release(const std::string& module) override;

 private:
  Engine* engine_;
  DType dtype_;
  std::map<std::string, std::vector<int>> module_params_;
  std::map<std::string, ModuleHandle> held_;
};

class EngineGrads final : public GradSink {
 public:
  explicit EngineGrads(Engine* engine);

  Result<GradView> GradBuffer(int param_index) override;
  Status GradReady(int param_index) override;

 private:
  Engine* engine_;
  DType dtype_;
};

// Every parameter, full, in fp32 on the host (collective: every rank calls it; every rank gets
// the values). Indexed like the engine's parameters.
Result<std::vector<std::vector<float>>> GatherFullParams(Engine* engine);

}  // namespace zero::examples
