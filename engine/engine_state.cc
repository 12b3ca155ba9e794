// Engine: the host's view of the training state. GatherMasterWeights / GatherModelParam /
// GatherOptimizerState (full fp32 values gathered from the ranks' shards) and
// SaveCheckpoint / LoadCheckpoint (this rank's states through OptimizerStates, the files through
// engine/checkpoint/checkpoint.h). docs/checkpoints.md; Impl: engine_impl.h.
#include "engine/engine.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "engine/checkpoint/checkpoint.h"
#include "engine/checkpoint/format.h"
#include "engine/engine_impl.h"

namespace zero {

// --- state access ---------------------------------------------------------------------------------

// Full fp32 values of state `which` of parameter `index` into host `out`: read from this rank's
// states (stage 0: the full parameter) or gathered from the ranks' shards (stages 1-3: each rank
// copies its shard into its place of a device buffer, then one in-place all-gather).
Status Engine::Impl::GatherFp32(int index, OptState which, float* out) {
  const ParamInfo& p = registry.params[index];
  if (p.numel == 0) return OkStatus();
  if (stage == 0) return optimizer.states->Read(which, p.full_off, p.numel, out);
  DeviceBuffer tmp;
  ZERO_RETURN_IF_ERROR(Allocate(&tmp, p.shard.padded, DType::kF32, "a gathered parameter"));
  float* mine = tmp.as<float>() + static_cast<int64_t>(rank) * p.shard.shard;
  ZERO_RETURN_IF_ERROR(optimizer.states->CopyToDevice(which, p.part_off, p.shard.shard, mine, compute));
  if (world > 1) {
    ZERO_ASSIGN_OR_RETURN(auto w,
                          comm->AllGather(mine, tmp.data(), static_cast<size_t>(p.shard.shard), DType::kF32, compute));
    ZERO_RETURN_IF_ERROR(w->StreamWait(compute));
  }
  ZERO_RETURN_IF_ERROR(
      device->Copy(out, tmp.data(), static_cast<size_t>(p.numel) * 4, CopyKind::kDeviceToHost, compute));
  ZERO_RETURN_IF_ERROR(device->SynchronizeStream(compute));
  return comm->CheckHealth();
}

Status Engine::GatherMasterWeights(int index, float* out) {
  Impl& impl = *impl_;
  ZERO_RETURN_IF_ERROR(impl.CheckUsable("GatherMasterWeights"));
  ZERO_RETURN_IF_ERROR(impl.CheckIndex("GatherMasterWeights", index));
  ZERO_RETURN_IF_ERROR(WaitForOptimizerStep());
  const ParamInfo& p = impl.registry.params[index];
  return impl.Guard(
      impl.GatherFp32(index, OptState::kMaster, out).WithContext("GatherMasterWeights(" + ParamName(p) + ")"));
}

Status Engine::GatherModelParam(int index, float* out) {
  Impl& impl = *impl_;
  ZERO_RETURN_IF_ERROR(impl.CheckUsable("GatherModelParam"));
  ZERO_RETURN_IF_ERROR(impl.CheckIndex("GatherModelParam", index));
  ZERO_RETURN_IF_ERROR(WaitForOptimizerStep());
  const ParamInfo& p = impl.registry.params[index];
  if (p.numel == 0) return OkStatus();
  Status s = [&]() -> Status {
    DeviceBuffer as_f32;
    ZERO_RETURN_IF_ERROR(impl.Allocate(&as_f32, p.shard.padded, DType::kF32, "a gathered parameter"));
    if (impl.stage <= 2) {
      ZERO_RETURN_IF_ERROR(impl.device->Cast(impl.model_ptr(p.full_off), impl.run.model_dtype, as_f32.data(),
                                             DType::kF32, static_cast<size_t>(p.numel), impl.compute));
    } else {
      // The shards cast to fp32 exactly, then gathered in fp32 (host shards: uploaded first).
      DeviceBuffer shard, uploaded;
      ZERO_RETURN_IF_ERROR(impl.Allocate(&shard, std::max<int64_t>(p.shard.shard, 1), DType::kF32, "a shard"));
      const void* src = impl.model_ptr(p.part_off);
      if (impl.host_params != nullptr) {
        ZERO_RETURN_IF_ERROR(
            impl.Allocate(&uploaded, std::max<int64_t>(p.shard.shard, 1), impl.run.model_dtype, "a shard"));
        ZERO_RETURN_IF_ERROR(impl.host_params->CopyToDevice(p.part_off, p.shard.shard, uploaded.data()));
        src = uploaded.data();
      }
      ZERO_RETURN_IF_ERROR(impl.device->Cast(src, impl.run.model_dtype, shard.data(), DType::kF32,
                                             static_cast<size_t>(p.shard.shard), impl.compute));
      if (impl.world == 1) {
        ZERO_RETURN_IF_ERROR(impl.device->Copy(as_f32.data(), shard.data(), static_cast<size_t>(p.shard.shard) * 4,
                                               CopyKind::kDeviceToDevice, impl.compute));
      } else {
        ZERO_ASSIGN_OR_RETURN(
            auto w, impl.comm->AllGather(shard.data(), as_f32.data(), static_cast<size_t>(p.shard.shard), DType::kF32,
                                         impl.compute));
        ZERO_RETURN_IF_ERROR(w->StreamWait(impl.compute));
      }
    }
    ZERO_RETURN_IF_ERROR(
        impl.device->Copy(out, as_f32.data(), static_cast<size_t>(p.numel) * 4, CopyKind::kDeviceToHost, impl.compute));
    ZERO_RETURN_IF_ERROR(impl.device->SynchronizeStream(impl.compute));
    return impl.comm->CheckHealth();
  }();
  return impl.Guard(s.WithContext("GatherModelParam(" + ParamName(p) + ")"));
}

Status Engine::GatherOptimizerState(int index, float* exp_avg_out, float* exp_avg_sq_out) {
  Impl& impl = *impl_;
  ZERO_RETURN_IF_ERROR(impl.CheckUsable("GatherOptimizerState"));
  ZERO_RETURN_IF_ERROR(impl.CheckIndex("GatherOptimizerState", index));
  ZERO_RETURN_IF_ERROR(WaitForOptimizerStep());
  const ParamInfo& p = impl.registry.params[index];
  if (exp_avg_out == nullptr || exp_avg_sq_out == nullptr) {
    return InvalidArgumentError("GatherOptimizerState(" + ParamName(p) + "): exp_avg and exp_avg_sq must not be null");
  }
  Status s = [&]() -> Status {
    ZERO_RETURN_IF_ERROR(impl.device->Synchronize());
    ZERO_RETURN_IF_ERROR(impl.GatherFp32(index, OptState::kExpAvg, exp_avg_out));
    return impl.GatherFp32(index, OptState::kExpAvgSq, exp_avg_sq_out);
  }();
  return impl.Guard(s.WithContext("GatherOptimizerState(" + ParamName(p) + ")"));
}

// --- checkpoints ----------------------------------------------------------------------------------

Status Engine::Impl::CheckOutsideWindow(const char* call) const {
  const std::string why = std::string(call) == "SaveCheckpoint"
                              ? "accumulated gradients are not saved in checkpoints"
                              : "the gradients accumulated so far would be applied to the loaded weights";
  if (window.reported_count() > 0) {
    return FailedPreconditionError(std::string(call) +
                                   " in the middle of a backward (gradients reported since the "
                                   "last Backward()): " +
                                   why);
  }
  std::string where;
  if (run.managed && window.pending_step()) {
    where = "the accumulation boundary Backward() ran but Step() has not";
  } else if (run.managed && window.micro_steps() > 0) {
    where = std::to_string(window.micro_steps()) + " of " + std::to_string(run.gas) +
            " micro steps of the window are accumulated";
  } else if (!run.managed && window.backwards_since_step() > 0) {
    where = std::to_string(window.backwards_since_step()) + " Backward() call(s) since the last Step()";
  }
  if (where.empty()) return OkStatus();
  return FailedPreconditionError(std::string(call) + " inside a gradient accumulation window (" + where +
                                 ", micro step " + std::to_string(progress.counters.micro_steps) + "): " + why +
                                 "; call it at a window boundary, after Step() has run the optimizer step");
}

Status Engine::SaveCheckpoint(const std::string& dir, const std::string& tag, const std::string& client_state_json) {
  Impl& impl = *impl_;
  ZERO_RETURN_IF_ERROR(impl.CheckUsable("SaveCheckpoint"));
  ZERO_RETURN_IF_ERROR(impl.CheckOutsideWindow("SaveCheckpoint"));
  ZERO_RETURN_IF_ERROR(WaitForOptimizerStep());
  return impl.SaveCheckpointImpl(dir, tag, client_state_json);
}

Status Engine::Impl::SaveCheckpointImpl(const std::string& dir, const std::string& tag_in,
                                        const std::string& client_state_json) {
  const std::string tag = tag_in.empty() ? DefaultTag(progress.counters.global_steps) : tag_in;
  ZERO_RETURN_IF_ERROR(Guard(device->Synchronize().WithContext("SaveCheckpoint: waiting for the device")));
  ZERO_RETURN_IF_ERROR(Guard(comm->CheckHealth().WithContext("SaveCheckpoint")));

  CheckpointMeta meta;
  meta.global_steps = progress.counters.global_steps;
  meta.skipped_steps = progress.counters.skipped_steps;
  meta.micro_steps = progress.counters.micro_steps;
  meta.adam_step = progress.counters.adam_step;
  const LossScalerState ls = scaler.state();
  meta.loss_scaler.dynamic = config.fp16.enabled && scaler.dynamic();
  meta.loss_scaler.scale = config.fp16.enabled ? ls.scale : 1.0;
  meta.loss_scaler.good_steps = ls.cur_iter - ls.last_overflow_iter - 1;
  meta.loss_scaler.hysteresis = ls.cur_hysteresis;
  meta.loss_scaler.last_overflow_step = ls.last_overflow_iter;
  meta.scheduler.type = config.scheduler.type;
  meta.scheduler.last_step = progress.counters.adam_step;
  meta.scheduler.last_lr = scheduler->LrAt(std::max<int64_t>(0, progress.counters.adam_step - 1));
  meta.model_dtype = run.model_dtype;
  meta.zero_stage = stage;
  meta.dp_world_size = world;
  meta.config_json = ConfigToJson(config);
  meta.client_state_json = client_state_json.empty() ? "{}" : client_state_json;

  // This rank's fp32 state, parameter by parameter through OptimizerStates::Read (stage 0: the
  // same slice of its full copy that a partitioned stage holds, so every stage writes the same
  // files).
  std::vector<ParamShard> shards;
  shards.reserve(registry.params.size());
  std::vector<float> full_master, full_avg, full_sq;
  for (const ParamInfo& p : registry.params) {
    meta.params.push_back(MakeCheckpointParam(p.spec.name, p.spec.shape, p.spec.module, world));
    Status read = [&]() -> Status {
      if (stage == 0) {
        full_master.resize(static_cast<size_t>(p.numel));
        full_avg.resize(static_cast<size_t>(p.numel));
        full_sq.resize(static_cast<size_t>(p.numel));
        ZERO_RETURN_IF_ERROR(optimizer.states->Read(OptState::kMaster, p.full_off, p.numel, full_master.data()));
        ZERO_RETURN_IF_ERROR(optimizer.states->Read(OptState::kExpAvg, p.full_off, p.numel, full_avg.data()));
        ZERO_RETURN_IF_ERROR(optimizer.states->Read(OptState::kExpAvgSq, p.full_off, p.numel, full_sq.data()));
        shards.push_back(SliceFullParam(p.spec.name, p.spec.shape, p.spec.module, full_master.data(), full_avg.data(),
                                        full_sq.data(), rank, world));
        return OkStatus();
      }
      ParamShard sh;
      sh.name = p.spec.name;
      sh.shape = p.spec.shape;
      sh.module = p.spec.module;
      sh.numel = p.numel;
      sh.begin = p.shard.begin;
      sh.end = p.shard.begin + p.shard.shard;
      const size_t n = static_cast<size_t>(p.shard.shard);
      sh.master.resize(n);
      sh.exp_avg.resize(n);
      sh.exp_avg_sq.resize(n);
      ZERO_RETURN_IF_ERROR(optimizer.states->Read(OptState::kMaster, p.part_off, p.shard.shard, sh.master.data()));
      ZERO_RETURN_IF_ERROR(optimizer.states->Read(OptState::kExpAvg, p.part_off, p.shard.shard, sh.exp_avg.data()));
      ZERO_RETURN_IF_ERROR(
          optimizer.states->Read(OptState::kExpAvgSq, p.part_off, p.shard.shard, sh.exp_avg_sq.data()));
      shards.push_back(std::move(sh));
      return OkStatus();
    }();
    ZERO_RETURN_IF_ERROR(Guard(read.WithContext("SaveCheckpoint: reading the optimizer state of " + ParamName(p))));
  }
  // Not Guarded: saving changes no training state, and an I/O error (or a rank that did not join)
  // leaves the engine as it was.
  Status st =
      ::zero::SaveCheckpoint(comm, dir, tag, std::move(meta), shards, env.file_system).WithContext("SaveCheckpoint");
  // Rank 0 keeps the directory locked for the engine's life, so that another job's save into it
  // fails even between this job's saves (the save itself held the lock while it ran).
  if (st.ok() && comm->rank() == 0 && save_locks.count(dir) == 0) {
    auto lock = DirectoryLock::Acquire(dir, env.file_system);
    if (lock.ok()) save_locks.emplace(dir, std::move(lock).value());
  }
  return st;
}

Result<std::string> Engine::LoadCheckpoint(const std::string& dir, const std::string& tag) {
  Impl& impl = *impl_;
  ZERO_RETURN_IF_ERROR(impl.CheckUsable("LoadCheckpoint"));
  ZERO_RETURN_IF_ERROR(impl.CheckOutsideWindow("LoadCheckpoint"));
  ZERO_RETURN_IF_ERROR(WaitForOptimizerStep());
  return impl.LoadCheckpointImpl(dir, tag);
}

Result<std::string> Engine::Impl::LoadCheckpointImpl(const std::string& dir, const std::string& tag) {
  ZERO_RETURN_IF_ERROR(Guard(device->Synchronize().WithContext("LoadCheckpoint: waiting for the device")));
  std::vector<ParamSignature> model_sig;
  model_sig.reserve(registry.params.size());
  for (const ParamInfo& p : registry.params) model_sig.push_back({p.spec.name, p.spec.shape});
  // Collective; fails on every rank if it fails on any (the model/checkpoint mismatch, missing or
  // corrupt files are named there). Shards come in registration order, as this rank's partition
  // at the current world size (stage 0: full tensors), whatever world size and stage saved them.
  auto loaded_or = ::zero::LoadCheckpoint(comm, dir, tag, model_sig, stage >= 1, env.file_system);
  if (!loaded_or.ok()) return loaded_or.status().WithContext("LoadCheckpoint");
  LoadedCheckpoint loaded = std::move(loaded_or).value();
  const CheckpointMeta& meta = loaded.meta;
  const std::string what = "LoadCheckpoint: checkpoint '" + meta.tag + "' in " + dir;

  // Everything is checked before any state changes; every rank sees the same metadata, so they all
  // decide alike.
  ZERO_RETURN_IF_ERROR(CheckLoadedCheckpoint(loaded, what));
  // The loss scaler resumes when this run and the checkpoint both use a dynamic fp16 scale; a static
  // scale comes from the config, and a non-fp16 checkpoint has no scale to resume (the configured
  // initial scale is kept).
  LossScaler new_scaler = scaler;
  ZERO_RETURN_IF_ERROR(ResumeLossScaler(meta, what, &new_scaler));

  // Install, parameter by parameter through OptimizerStates::Write (the gaps between pieces are
  // zero already and stay so).
  ZERO_RETURN_IF_ERROR(Guard(InstallLoadedState(loaded).WithContext(what + ": installing the loaded state")));

  progress.counters.global_steps = meta.global_steps;
  progress.counters.skipped_steps = meta.skipped_steps;
  progress.counters.micro_steps = meta.micro_steps;
  progress.counters.adam_step = meta.adam_step;  // also the scheduler position: lr = LrAt(adam_step)
  scaler = std::move(new_scaler);
  window.RestartCount();
  progress.step_applied = false;
  progress.grad_norm = -1.0;
  return meta.client_state_json;
}

// The loaded shards are this rank's partition of every parameter, and the counters are consistent.
Status Engine::Impl::CheckLoadedCheckpoint(const LoadedCheckpoint& loaded, const std::string& what) const {
  const CheckpointMeta& meta = loaded.meta;
  if (loaded.shards.size() != registry.params.size()) {
    return InternalError(what + ": got " + std::to_string(loaded.shards.size()) + " shards for " +
                         std::to_string(registry.params.size()) + " parameters");
  }
  for (size_t i = 0; i < registry.params.size(); ++i) {
    const ParamInfo& p = registry.params[i];
    const ParamShard& sh = loaded.shards[i];
    const int64_t begin = stage == 0 ? 0 : p.shard.begin;
    const int64_t end = stage == 0 ? p.numel : p.shard.begin + p.shard.shard;
    const size_t n = static_cast<size_t>(end - begin);
    if (sh.name != p.spec.name || sh.begin != begin || sh.end != end || sh.master.size() != n ||
        sh.exp_avg.size() != n || sh.exp_avg_sq.size() != n) {
      return InternalError(what + ": parameter " + ParamName(p) + ": loaded slice '" + sh.name + "' [" +
                           std::to_string(sh.begin) + ", " + std::to_string(sh.end) +
                           ") does not match this rank's partition [" + std::to_string(begin) + ", " +
                           std::to_string(end) + ")");
    }
  }
  if (meta.global_steps < 0 || meta.skipped_steps < 0 || meta.micro_steps < 0 || meta.adam_step < 0 ||
      meta.adam_step > meta.global_steps) {
    return DataLossError(what + ": inconsistent counters (global_steps " + std::to_string(meta.global_steps) +
                         ", skipped_steps " + std::to_string(meta.skipped_steps) + ", micro_steps " +
                         std::to_string(meta.micro_steps) + ", adam_step " + std::to_string(meta.adam_step) + ")");
  }
  return OkStatus();
}

// A dynamic fp16 scaler's state from the checkpoint into `new_scaler` (unchanged otherwise).
Status Engine::Impl::ResumeLossScaler(const CheckpointMeta& meta, const std::string& what,
                                      LossScaler* new_scaler) const {
  if (config.fp16.enabled && scaler.dynamic() && meta.loss_scaler.dynamic) {
    const CheckpointLossScaler& c = meta.loss_scaler;
    if (c.good_steps < 0 || c.last_overflow_step < -1 || c.hysteresis < 1 ||
        c.hysteresis > std::numeric_limits<int>::max()) {
      return DataLossError(what + ": loss_scaler: good_steps " + std::to_string(c.good_steps) + ", hysteresis " +
                           std::to_string(c.hysteresis) + ", last_overflow_step " +
                           std::to_string(c.last_overflow_step) + " are not a valid dynamic loss scaler state");
    }
    LossScalerState st;
    st.scale = c.scale;
    st.last_overflow_iter = c.last_overflow_step;
    st.cur_iter = c.last_overflow_step + 1 + c.good_steps;
    st.cur_hysteresis = static_cast<int>(c.hysteresis);
    ZERO_RETURN_IF_ERROR(new_scaler->Restore(st).WithContext(what));
  }
  return OkStatus();
}

// The loaded masters and moments into the states, the model copy cast from them, a new window.
Status Engine::Impl::InstallLoadedState(const LoadedCheckpoint& loaded) {
  // Stage 3: the gathers in flight read the old shards; finish them before the shards change.
  if (coordinator != nullptr) ZERO_RETURN_IF_ERROR(coordinator->QuiesceForUpdate());
  ZERO_RETURN_IF_ERROR(device->Synchronize());
  for (size_t i = 0; i < registry.params.size(); ++i) {
    const ParamInfo& p = registry.params[i];
    const ParamShard& sh = loaded.shards[i];
    const int64_t off = stage == 0 ? p.full_off : p.part_off;
    const int64_t n = static_cast<int64_t>(sh.master.size());
    ZERO_RETURN_IF_ERROR(optimizer.states->Write(OptState::kMaster, off, n, sh.master.data()));
    ZERO_RETURN_IF_ERROR(optimizer.states->Write(OptState::kExpAvg, off, n, sh.exp_avg.data()));
    ZERO_RETURN_IF_ERROR(optimizer.states->Write(OptState::kExpAvgSq, off, n, sh.exp_avg_sq.data()));
  }
  // The model parameters from the loaded masters (stage 3: the coordinator drops its gathered
  // and persistent buffers, so the next GatherModule gathers the new shards).
  ZERO_RETURN_IF_ERROR(PublishWeights(std::vector<uint8_t>(registry.params.size(), 1), /*cast=*/true));
  ZERO_RETURN_IF_ERROR(ZeroAccumulators());
  // Everything enqueued above is done before the counters change.
  return device->SynchronizeStream(compute);
}

}  // namespace zero
