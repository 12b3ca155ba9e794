#include "models/engine_adapters.h"

#include <utility>

namespace zero::examples {

Status RegisterAndInitialize(Engine* engine, const std::vector<ModelParamSpec>& specs, uint64_t seed) {
  for (size_t i = 0; i < specs.size(); ++i) {
    const ModelParamSpec& s = specs[i];
    ZERO_ASSIGN_OR_RETURN(int index, engine->RegisterParameter(zero::ParamSpec{s.name, s.shape, s.module}));
    if (index != static_cast<int>(i)) {
      return InternalError("RegisterParameter('" + s.name + "') returned index " + std::to_string(index) +
                           ", expected " + std::to_string(i));
    }
  }
  return engine->Initialize([&](int index, float* values) {
    const ModelParamSpec& s = specs[index];
    InitParamSlice(s, seed, 0, s.numel(), values);
  });
}

EngineParams::EngineParams(Engine* engine, const std::vector<ModelParamSpec>& specs)
    : engine_(engine), dtype_(engine->config().model_dtype()) {
  for (const ModuleSpec& m : GroupByModule(specs)) module_params_[m.name] = m.params;
}

EngineParams::~EngineParams() {
  for (auto& [name, handle] : held_) handle.Release().IgnoreError();
}

Result<std::vector<ParamView>> EngineParams::Acquire(const std::string& module) {
  auto it = module_params_.find(module);
  if (it == module_params_.end()) return NotFoundError("EngineParams::Acquire: unknown module '" + module + "'");
  if (held_.count(module) != 0) {
    return FailedPreconditionError("EngineParams::Acquire: module '" + module + "' is already held");
  }
  ZERO_ASSIGN_OR_RETURN(ModuleHandle handle, engine_->GatherModule(module));
  std::vector<ParamView> views;
  views.reserve(it->second.size());
  for (int i : it->second) {
    auto p = engine_->param(i);
    if (!p.ok()) {
      handle.Release().IgnoreError();
      return p.status();
    }
    views.push_back(ParamView{*p, dtype_});
  }
  held_.emplace(module, std::move(handle));
  return views;
}

Status EngineParams::Release(const std::string& module) {
  auto it = held_.find(module);
  if (it == held_.end()) {
    return FailedPreconditionError("EngineParams::Release: module '" + module + "' is not held");
  }
  ModuleHandle handle = std::move(it->second);
  held_.erase(it);
  return handle.Release();
}

EngineGrads::EngineGrads(Engine* engine) : engine_(engine), dtype_(engine->config().model_dtype()) {}

Result<GradView> EngineGrads::GradBuffer(int param_index) {
  ZERO_ASSIGN_OR_RETURN(void* data, engine_->grad_buffer(param_index));
  return GradView{data, dtype_};
}

Status EngineGrads::GradReady(int param_index) { return engine_->GradReady(param_index); }

Result<std::vector<std::vector<float>>> GatherFullParams(Engine* engine) {
  std::vector<std::vector<float>> out(engine->num_params());
  for (int i = 0; i < engine->num_params(); ++i) {
    int64_t numel = 1;
    for (int64_t d : engine->param_spec(i).shape) numel *= d;
    out[i].resize(static_cast<size_t>(numel));
    ZERO_RETURN_IF_ERROR(engine->GatherModelParam(i, out[i].data()));
  }
  return out;
}

}  // namespace zero::examples
