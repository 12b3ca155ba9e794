// The training loop shared by the Engine's tests (engine_test_util.h).
#include "engine/engine_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "comm/thread_ranks.h"
#include "testing/status_matchers.h"

namespace zero::testing {

std::vector<std::vector<int>> ModuleParams(const TestModel& model) {
  std::vector<std::vector<int>> module_params(model.modules.size());
  for (int i = 0; i < static_cast<int>(model.specs.size()); ++i) {
    for (size_t m = 0; m < model.modules.size(); ++m) {
      if (model.specs[i].module == model.modules[m]) module_params[m].push_back(i);
    }
  }
  return module_params;
}

Result<std::unique_ptr<Engine>> MakeEngine(const Config& config, const TestModel& model, Device* device,
                                           Communicator* comm, float init_shift) {
  ZERO_ASSIGN_OR_RETURN(auto engine, Engine::Create(config, device, comm));
  for (const ParamSpec& s : model.specs) ZERO_RETURN_IF_ERROR(engine->RegisterParameter(s).status());
  Engine* e = engine.get();
  ZERO_RETURN_IF_ERROR(engine->Initialize([e, init_shift](int index, float* v) {
    const int64_t n = Numel(e->param_spec(index));
    for (int64_t k = 0; k < n; ++k) v[k] = InitValue(index, k) + init_shift;
  }));
  return engine;
}

Status TrainSteps(Engine* e, Device* device, const TestModel& model, int rank, const TrainOptions& opt,
                  TrainResult* out) {
  const int n_params = static_cast<int>(model.specs.size());
  const std::vector<std::vector<int>> module_params = ModuleParams(model);
  const bool managed = e->config().managed_gradient_accumulation;
  const int gas = static_cast<int>(e->config().gradient_accumulation_steps);
  for (int step = 0; step < opt.steps; ++step) {
    out->lrs.push_back(e->lr());
    out->scales.push_back(e->loss_scale());
    const int micros = managed ? gas : 2;
    for (int j = 0; j < micros; ++j) {
      if (opt.before_micro) ZERO_RETURN_IF_ERROR(opt.before_micro(e, device));
      const int64_t micro = e->counters().micro_steps;
      std::vector<std::vector<float>> values(n_params);
      double loss = 0.0;
      for (size_t m = 0; m < model.modules.size(); ++m) {
        ZERO_ASSIGN_OR_RETURN(ModuleHandle h, e->GatherModule(model.modules[m]));
        for (int i : module_params[m]) {
          ZERO_RETURN_IF_ERROR(ReadParam(e, device, i, &values[i]));
          loss = opt.add_loss(loss, values[i]);
        }
        ZERO_RETURN_IF_ERROR(h.Release());
      }
      out->losses.push_back(loss);
      for (size_t m = model.modules.size(); m-- > 0;) {
        ZERO_ASSIGN_OR_RETURN(ModuleHandle h, e->GatherModule(model.modules[m]));
        for (auto it = module_params[m].rbegin(); it != module_params[m].rend(); ++it) {
          const int i = *it;
          if (std::find(opt.skip_params.begin(), opt.skip_params.end(), i) != opt.skip_params.end()) continue;
          const float scale = opt.times_loss_scale ? opt.grad_scale * e->gradient_scale() : opt.grad_scale;
          std::vector<float> g = Gradient(i, values[i], rank, micro, scale);
          if (opt.edit_grad) opt.edit_grad(e, i, micro, &g);
          ZERO_RETURN_IF_ERROR(WriteGrad(e, device, i, g));
        }
      }
      ZERO_RETURN_IF_ERROR(e->Backward());
      if (opt.after_backward) ZERO_RETURN_IF_ERROR(opt.after_backward(e, device));
      if (managed) ZERO_RETURN_IF_ERROR(e->Step());
    }
    if (!managed) ZERO_RETURN_IF_ERROR(e->Step());
    out->norms.push_back(e->global_grad_norm());
    out->applied.push_back(e->was_step_applied() ? 1 : 0);
  }
  return OkStatus();
}

Status Snapshot(Engine* e, TrainResult* out, bool optimizer_state) {
  const int n = e->num_params();
  out->master.assign(n, {});
  out->model.assign(n, {});
  out->exp_avg.assign(optimizer_state ? n : 0, {});
  out->exp_avg_sq.assign(optimizer_state ? n : 0, {});
  for (int i = 0; i < n; ++i) {
    const size_t numel = static_cast<size_t>(Numel(e->param_spec(i)));
    out->master[i].resize(numel);
    out->model[i].resize(numel);
    ZERO_RETURN_IF_ERROR(e->GatherMasterWeights(i, out->master[i].data()));
    ZERO_RETURN_IF_ERROR(e->GatherModelParam(i, out->model[i].data()));
    if (optimizer_state) {
      out->exp_avg[i].resize(numel);
      out->exp_avg_sq[i].resize(numel);
      ZERO_RETURN_IF_ERROR(e->GatherOptimizerState(i, out->exp_avg[i].data(), out->exp_avg_sq[i].data()));
    }
  }
  out->counters = e->counters();
  out->memory = e->memory();
  out->stats = e->stats();
  return OkStatus();
}

Status Train(const Config& config, const TestModel& model, int rank, Communicator* comm, Device* device,
             const TrainOptions& opt, TrainResult* out) {
  ZERO_ASSIGN_OR_RETURN(auto engine, MakeEngine(config, model, device, comm));
  ZERO_RETURN_IF_ERROR(TrainSteps(engine.get(), device, model, rank, opt, out));
  return Snapshot(engine.get(), out, /*optimizer_state=*/false);
}

std::vector<TrainResult> TrainAll(const std::string& json, int world, const TestModel& model, const TrainOptions& opt) {
  std::vector<TrainResult> results(world);
  auto config = MakeConfig(json, world);
  EXPECT_OK(config) << "\n" << json;
  if (!config.ok()) return results;
  Status s = RunThreadRanks(world, [&](int rank, Communicator* comm, Device* device) {
    return Train(*config, model, rank, comm, device, opt, &results[rank]);
  });
  EXPECT_OK(s) << "\n" << json;
  return results;
}

}  // namespace zero::testing
