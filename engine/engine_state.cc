// Engine: the host's view of the training state. GatherMasterWeights / GatherModelParam /
// GatherOptimizerState (full fp32 values gathered from the ranks' shards) and
// SaveCheckpoint / LoadCheckpoint (this rank's states through OptimizerStates, the files through
// engine/checkpoint.h). docs/checkpoints.md; Impl: engine_impl.h.
#include "engine/engine.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/checkpoint_format.h"
#include "engine/engine_impl.h"

namespace zero {

// --- state access ---------------------------------------------------------------------------------

// Full fp32 values of state `which` of parameter `index` into host `out`: read from this rank's
// states (stage 0: the full parameter) or gathered from the ranks' shards (stages 1-3: each rank
// copies its shard into its place of a device buffer, then one in-place all-gather).
Status Engine::Impl::GatherFp32(int index, OptState which, float* out) {
  const ParamInfo& p = params[index];
  if (p.numel == 0) return OkStatus();
  if (stage == 0) return states->Read(which, p.full_off, p.numel, out);
  DeviceBuffer tmp;
  ZERO_RETURN_IF_ERROR(Allocate(&tmp, p.shard.padded, DType::kF32, "a gathered parameter"));
  float* mine = tmp.as<float>() + static_cast<int64_t>(rank) * p.shard.shard;
  ZERO_RETURN_IF_ERROR(states->CopyToDevice(which, p.part_off, p.shard.shard, mine, compute));
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
  Impl& m = *impl_;
  ZERO_RETURN_IF_ERROR(m.CheckUsable("GatherMasterWeights"));
  ZERO_RETURN_IF_ERROR(m.CheckIndex("GatherMasterWeights", index));
  ZERO_RETURN_IF_ERROR(WaitForOptimizerStep());
  const ParamInfo& p = m.params[index];
  return m.Guard(m.GatherFp32(index, OptState::kMaster, out).WithContext("GatherMasterWeights(" + ParamName(p) + ")"));
}

Status Engine::GatherModelParam(int index, float* out) {
  Impl& m = *impl_;
  ZERO_RETURN_IF_ERROR(m.CheckUsable("GatherModelParam"));
  ZERO_RETURN_IF_ERROR(m.CheckIndex("GatherModelParam", index));
  ZERO_RETURN_IF_ERROR(WaitForOptimizerStep());
  const ParamInfo& p = m.params[index];
  if (p.numel == 0) return OkStatus();
  Status s = [&]() -> Status {
    DeviceBuffer as_f32;
    ZERO_RETURN_IF_ERROR(m.Allocate(&as_f32, p.shard.padded, DType::kF32, "a gathered parameter"));
    if (m.stage <= 2) {
      ZERO_RETURN_IF_ERROR(m.device->Cast(m.model_ptr(p.full_off), m.mdt, as_f32.data(), DType::kF32,
                                          static_cast<size_t>(p.numel), m.compute));
    } else {
      // The shards cast to fp32 exactly, then gathered in fp32 (host shards: uploaded first).
      DeviceBuffer shard, uploaded;
      ZERO_RETURN_IF_ERROR(m.Allocate(&shard, std::max<int64_t>(p.shard.shard, 1), DType::kF32, "a shard"));
      const void* src = m.model_ptr(p.part_off);
      if (m.host_params != nullptr) {
        ZERO_RETURN_IF_ERROR(m.Allocate(&uploaded, std::max<int64_t>(p.shard.shard, 1), m.mdt, "a shard"));
        ZERO_RETURN_IF_ERROR(m.host_params->CopyToDevice(p.part_off, p.shard.shard, uploaded.data()));
        src = uploaded.data();
      }
      ZERO_RETURN_IF_ERROR(
          m.device->Cast(src, m.mdt, shard.data(), DType::kF32, static_cast<size_t>(p.shard.shard), m.compute));
      if (m.world == 1) {
        ZERO_RETURN_IF_ERROR(m.device->Copy(as_f32.data(), shard.data(), static_cast<size_t>(p.shard.shard) * 4,
                                            CopyKind::kDeviceToDevice, m.compute));
      } else {
        ZERO_ASSIGN_OR_RETURN(auto w, m.comm->AllGather(shard.data(), as_f32.data(), static_cast<size_t>(p.shard.shard),
                                                        DType::kF32, m.compute));
        ZERO_RETURN_IF_ERROR(w->StreamWait(m.compute));
      }
    }
    ZERO_RETURN_IF_ERROR(
        m.device->Copy(out, as_f32.data(), static_cast<size_t>(p.numel) * 4, CopyKind::kDeviceToHost, m.compute));
    ZERO_RETURN_IF_ERROR(m.device->SynchronizeStream(m.compute));
    return m.comm->CheckHealth();
  }();
  return m.Guard(s.WithContext("GatherModelParam(" + ParamName(p) + ")"));
}

Status Engine::GatherOptimizerState(int index, float* exp_avg_out, float* exp_avg_sq_out) {
  Impl& m = *impl_;
  ZERO_RETURN_IF_ERROR(m.CheckUsable("GatherOptimizerState"));
  ZERO_RETURN_IF_ERROR(m.CheckIndex("GatherOptimizerState", index));
  ZERO_RETURN_IF_ERROR(WaitForOptimizerStep());
  const ParamInfo& p = m.params[index];
  if (exp_avg_out == nullptr || exp_avg_sq_out == nullptr) {
    return InvalidArgumentError("GatherOptimizerState(" + ParamName(p) + "): exp_avg and exp_avg_sq must not be null");
  }
  Status s = [&]() -> Status {
    ZERO_RETURN_IF_ERROR(m.device->Synchronize());
    ZERO_RETURN_IF_ERROR(m.GatherFp32(index, OptState::kExpAvg, exp_avg_out));
    return m.GatherFp32(index, OptState::kExpAvgSq, exp_avg_sq_out);
  }();
  return m.Guard(s.WithContext("GatherOptimizerState(" + ParamName(p) + ")"));
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
  if (managed && window.pending_step()) {
    where = "the accumulation boundary Backward() ran but Step() has not";
  } else if (managed && window.micro_steps() > 0) {
    where = std::to_string(window.micro_steps()) + " of " + std::to_string(gas) +
            " micro steps of the window are accumulated";
  } else if (!managed && window.backwards_since_step() > 0) {
    where = std::to_string(window.backwards_since_step()) + " Backward() call(s) since the last Step()";
  }
  if (where.empty()) return OkStatus();
  return FailedPreconditionError(std::string(call) + " inside a gradient accumulation window (" + where +
                                 ", micro step " + std::to_string(counters.micro_steps) + "): " + why +
                                 "; call it at a window boundary, after Step() has run the optimizer step");
}

Status Engine::SaveCheckpoint(const std::string& dir, const std::string& tag, const std::string& client_state_json) {
  Impl& m = *impl_;
  ZERO_RETURN_IF_ERROR(m.CheckUsable("SaveCheckpoint"));
  ZERO_RETURN_IF_ERROR(m.CheckOutsideWindow("SaveCheckpoint"));
  ZERO_RETURN_IF_ERROR(WaitForOptimizerStep());
  return m.SaveCheckpointImpl(dir, tag, client_state_json);
}

Status Engine::Impl::SaveCheckpointImpl(const std::string& dir, const std::string& tag_in,
                                        const std::string& client_state_json) {
  const std::string tag = tag_in.empty() ? DefaultTag(counters.global_steps) : tag_in;
  ZERO_RETURN_IF_ERROR(Guard(device->Synchronize().WithContext("SaveCheckpoint: waiting for the device")));
  ZERO_RETURN_IF_ERROR(Guard(comm->CheckHealth().WithContext("SaveCheckpoint")));

  CheckpointMeta meta;
  meta.global_steps = counters.global_steps;
  meta.skipped_steps = counters.skipped_steps;
  meta.micro_steps = counters.micro_steps;
  meta.adam_step = counters.adam_step;
  const LossScalerState ls = scaler.state();
  meta.loss_scaler.dynamic = config.fp16.enabled && scaler.dynamic();
  meta.loss_scaler.scale = config.fp16.enabled ? ls.scale : 1.0;
  meta.loss_scaler.good_steps = ls.cur_iter - ls.last_overflow_iter - 1;
  meta.loss_scaler.hysteresis = ls.cur_hysteresis;
  meta.loss_scaler.last_overflow_step = ls.last_overflow_iter;
  meta.scheduler.type = config.scheduler.type;
  meta.scheduler.last_step = counters.adam_step;
  meta.scheduler.last_lr = scheduler->LrAt(std::max<int64_t>(0, counters.adam_step - 1));
  meta.model_dtype = mdt;
  meta.zero_stage = stage;
  meta.dp_world_size = world;
  meta.config_json = ConfigToJson(config);
  meta.client_state_json = client_state_json.empty() ? "{}" : client_state_json;

  // This rank's fp32 state, parameter by parameter through OptimizerStates::Read (stage 0: the
  // same slice of its full copy that a partitioned stage holds, so every stage writes the same
  // files).
  std::vector<ParamShard> shards;
  shards.reserve(params.size());
  std::vector<float> full_master, full_avg, full_sq;
  for (const ParamInfo& p : params) {
    meta.params.push_back(MakeCheckpointParam(p.spec.name, p.spec.shape, p.spec.module, world));
    Status read = [&]() -> Status {
      if (stage == 0) {
        full_master.resize(static_cast<size_t>(p.numel));
        full_avg.resize(static_cast<size_t>(p.numel));
        full_sq.resize(static_cast<size_t>(p.numel));
        ZERO_RETURN_IF_ERROR(states->Read(OptState::kMaster, p.full_off, p.numel, full_master.data()));
        ZERO_RETURN_IF_ERROR(states->Read(OptState::kExpAvg, p.full_off, p.numel, full_avg.data()));
        ZERO_RETURN_IF_ERROR(states->Read(OptState::kExpAvgSq, p.full_off, p.numel, full_sq.data()));
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
      ZERO_RETURN_IF_ERROR(states->Read(OptState::kMaster, p.part_off, p.shard.shard, sh.master.data()));
      ZERO_RETURN_IF_ERROR(states->Read(OptState::kExpAvg, p.part_off, p.shard.shard, sh.exp_avg.data()));
      ZERO_RETURN_IF_ERROR(states->Read(OptState::kExpAvgSq, p.part_off, p.shard.shard, sh.exp_avg_sq.data()));
      shards.push_back(std::move(sh));
      return OkStatus();
    }();
    ZERO_RETURN_IF_ERROR(Guard(read.WithContext("SaveCheckpoint: reading the optimizer state of " + ParamName(p))));
  }
  // Not Guarded: saving changes no training state, and an I/O error (or a rank that did not join)
  // leaves the engine as it was.
  Status st = ::zero::SaveCheckpoint(comm, dir, tag, std::move(meta), shards).WithContext("SaveCheckpoint");
  // Rank 0 keeps the directory locked for the engine's life, so that another job's save into it
  // fails even between this job's saves (the save itself held the lock while it ran).
  if (st.ok() && comm->rank() == 0 && save_locks.count(dir) == 0) {
    auto lock = DirectoryLock::Acquire(dir);
    if (lock.ok()) save_locks.emplace(dir, std::move(lock).value());
  }
  return st;
}

Result<std::string> Engine::LoadCheckpoint(const std::string& dir, const std::string& tag) {
  Impl& m = *impl_;
  ZERO_RETURN_IF_ERROR(m.CheckUsable("LoadCheckpoint"));
  ZERO_RETURN_IF_ERROR(m.CheckOutsideWindow("LoadCheckpoint"));
  ZERO_RETURN_IF_ERROR(WaitForOptimizerStep());
  return m.LoadCheckpointImpl(dir, tag);
}

Result<std::string> Engine::Impl::LoadCheckpointImpl(const std::string& dir, const std::string& tag) {
  ZERO_RETURN_IF_ERROR(Guard(device->Synchronize().WithContext("LoadCheckpoint: waiting for the device")));
  std::vector<ParamSignature> model_sig;
  model_sig.reserve(params.size());
  for (const ParamInfo& p : params) model_sig.push_back({p.spec.name, p.spec.shape});
  // Collective; fails on every rank if it fails on any (the model/checkpoint mismatch, missing or
  // corrupt files are named there). Shards come in registration order, as this rank's partition
  // at the current world size (stage 0: full tensors), whatever world size and stage saved them.
  auto loaded_or = ::zero::LoadCheckpoint(comm, dir, tag, model_sig, stage >= 1);
  if (!loaded_or.ok()) return loaded_or.status().WithContext("LoadCheckpoint");
  LoadedCheckpoint loaded = std::move(loaded_or).value();
  const CheckpointMeta& meta = loaded.meta;
  const std::string what = "LoadCheckpoint: checkpoint '" + meta.tag + "' in " + dir;

  // Everything is checked before any state changes; every rank sees the same metadata, so they all
  // decide alike.
  if (loaded.shards.size() != params.size()) {
    return InternalError(what + ": got " + std::to_string(loaded.shards.size()) + " shards for " +
                         std::to_string(params.size()) + " parameters");
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamInfo& p = params[i];
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
  // The loss scaler resumes when this run and the checkpoint both use a dynamic fp16 scale; a static
  // scale comes from the config, and a non-fp16 checkpoint has no scale to resume (the configured
  // initial scale is kept).
  LossScaler new_scaler = scaler;
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
    ZERO_RETURN_IF_ERROR(new_scaler.Restore(st).WithContext(what));
  }

  // Install, parameter by parameter through OptimizerStates::Write (the gaps between pieces are
  // zero already and stay so).
  Status installed = [&]() -> Status {
    // Stage 3: the gathers in flight read the old shards; finish them before the shards change.
    if (coordinator != nullptr) ZERO_RETURN_IF_ERROR(coordinator->QuiesceForUpdate());
    ZERO_RETURN_IF_ERROR(device->Synchronize());
    for (size_t i = 0; i < params.size(); ++i) {
      const ParamInfo& p = params[i];
      const ParamShard& sh = loaded.shards[i];
      const int64_t off = stage == 0 ? p.full_off : p.part_off;
      const int64_t n = static_cast<int64_t>(sh.master.size());
      ZERO_RETURN_IF_ERROR(states->Write(OptState::kMaster, off, n, sh.master.data()));
      ZERO_RETURN_IF_ERROR(states->Write(OptState::kExpAvg, off, n, sh.exp_avg.data()));
      ZERO_RETURN_IF_ERROR(states->Write(OptState::kExpAvgSq, off, n, sh.exp_avg_sq.data()));
    }
    // The model parameters from the loaded masters (stage 3: the coordinator drops its gathered
    // and persistent buffers, so the next GatherModule gathers the new shards).
    ZERO_RETURN_IF_ERROR(PublishWeights(std::vector<uint8_t>(params.size(), 1), /*cast=*/true));
    ZERO_RETURN_IF_ERROR(ZeroAccumulators());
    // Everything enqueued above is done before the counters change.
    return device->SynchronizeStream(compute);
  }();
  ZERO_RETURN_IF_ERROR(Guard(installed.WithContext(what + ": installing the loaded state")));

  counters.global_steps = meta.global_steps;
  counters.skipped_steps = meta.skipped_steps;
  counters.micro_steps = meta.micro_steps;
  counters.adam_step = meta.adam_step;  // also the scheduler position: lr = LrAt(adam_step)
  scaler = std::move(new_scaler);
  window.RestartCount();
  step_applied = false;
  grad_norm = -1.0;
  return meta.client_state_json;
}

}  // namespace zero
