// Engine: forward and backward. GatherModule/ReleaseModule (stage 3: the coordinator's gathers and
// the reduction schedule) and param(); grad_buffer/GradReady (each reported gradient into the
// accumulators, the partition or the reducer's buckets, or its AdamW at once: "Update in
// backward"), the stage 0/1 boundary reductions and Backward(). docs/zero.md; Impl: engine_impl.h.
#include "engine/engine.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine_impl.h"
#include "engine/engine_timeline.h"

namespace zero {

// --- forward --------------------------------------------------------------------------------------

Result<ModuleHandle> Engine::GatherModule(const std::string& module) {
  Impl& impl = *impl_;
  ZERO_RETURN_IF_ERROR(impl.CheckUsable("GatherModule"));
  auto it = impl.registry.module_index.find(module);
  if (it == impl.registry.module_index.end()) {
    std::string known;
    for (size_t k = 0; k < impl.registry.module_names.size() && k < 8; ++k) {
      known += (k ? ", '" : "'") + impl.registry.module_names[k] + "'";
    }
    if (impl.registry.module_names.size() > 8) known += ", ...";
    return NotFoundError("GatherModule: unknown module '" + module + "' (registered: " + known + ")");
  }
  ZERO_RETURN_IF_ERROR(impl.timeline.OnGather());
  if (impl.StepInFlight()) {
    ZERO_RETURN_IF_ERROR(impl.Guard(impl.optimizer.deferred_step->Reach(impl.registry.module_params[it->second])
                                        .WithContext("GatherModule('" + module + "')")));
  }
  if (impl.stage == 3) {
    if (impl.stage3_reductions.schedule != nullptr) {
      // The reductions of the modules every rank now agrees are complete go first, at the same
      // point among the gathers on every rank.
      auto done = impl.stage3_reductions.schedule->AtGather(it->second);
      Status s = done.ok() ? impl.ReduceModules(*done) : done.status();
      ZERO_RETURN_IF_ERROR(impl.Guard(s.WithContext("GatherModule('" + module + "'): reducing gradients")));
    }
    ZERO_RETURN_IF_ERROR(impl.Guard(impl.timeline
                                        .Timed(EngineTimeline::Kind::kCommunication, kTrackCommunication,
                                               "gather module", [&] { return impl.coordinator->Acquire(it->second); })
                                        .WithContext("GatherModule('" + module + "')")));
  }
  return ModuleHandle(this, it->second);
}

Status Engine::ReleaseModule(int module_id) {
  Impl& impl = *impl_;
  if (impl.stage != 3 || impl.coordinator == nullptr) return OkStatus();
  if (!impl.lifecycle.broken.ok()) return impl.lifecycle.broken;
  ZERO_RETURN_IF_ERROR(impl.coordinator->Release(module_id));
  if (impl.stage3_reductions.schedule != nullptr)
    impl.stage3_reductions.schedule->Released(module_id, impl.coordinator->ref_count(module_id));
  return OkStatus();
}

Result<const void*> Engine::param(int index) const {
  const Impl& impl = *impl_;
  ZERO_RETURN_IF_ERROR(impl.CheckUsable("param"));
  ZERO_RETURN_IF_ERROR(impl.CheckIndex("param", index));
  if (impl.StepInFlight() && !impl.optimizer.deferred_step->waited(index)) {
    return FailedPreconditionError(
        "param(" + std::to_string(index) + "): parameter " + ParamName(impl.registry.params[index]) +
        " may still be written by the overlapped optimizer step (zero_optimization.offload_optimizer."
        "overlap_step): reach it through GatherModule(\"" +
        impl.registry.params[index].spec.module + "\") first, at every stage, or call WaitForOptimizerStep()");
  }
  if (impl.stage == 3) return impl.coordinator->Full(index);
  return static_cast<const void*>(impl.model_ptr(impl.registry.params[index].full_off));
}

// --- backward -------------------------------------------------------------------------------------

Result<void*> Engine::grad_buffer(int index) {
  Impl& impl = *impl_;
  ZERO_RETURN_IF_ERROR(impl.CheckUsable("grad_buffer"));
  ZERO_RETURN_IF_ERROR(impl.CheckIndex("grad_buffer", index));
  ZERO_RETURN_IF_ERROR(impl.FlushStep("grad_buffer"));
  ZERO_RETURN_IF_ERROR(impl.timeline.OnGradient());
  const ParamInfo& p = impl.registry.params[index];
  if (impl.window.reported(index)) {
    return InvalidArgumentError("grad_buffer(" + std::to_string(index) + "): the gradient of parameter " +
                                ParamName(p) + " was already reported in this backward");
  }
  if (impl.window.pending_step()) {
    return FailedPreconditionError("grad_buffer(" + std::to_string(index) +
                                   "): the accumulation boundary was reached; call Step() first");
  }
  if (!impl.window.handed_out(index)) {
    if (p.numel > 0) {
      auto b =
          impl.grad_buffers.pool->Acquire(static_cast<size_t>(impl.GradBufferNumel(p)) * SizeOf(impl.run.model_dtype),
                                          "grad_buffer: allocating a gradient buffer");
      if (!b.ok()) return b.status().WithContext("parameter " + ParamName(p));
      impl.grad_buffers.handed_out[index] = std::move(b).value();
      if (impl.PerParamReduction() && p.shard.padded > p.numel) {
        // The padding of the shard layout is zero (a pooled buffer may come from another
        // parameter of the same size).
        Status s =
            impl.device->Fill(ElementPtr(impl.grad_buffers.handed_out[index].data(), impl.run.model_dtype, p.numel),
                              impl.run.model_dtype, static_cast<size_t>(p.shard.padded - p.numel), 0.0f, impl.compute);
        if (!s.ok()) return impl.Guard(s.WithContext("grad_buffer(" + ParamName(p) + ")"));
      }
    }
    impl.window.HandOut(index);
  }
  return impl.grad_buffers.handed_out[index].data();
}

Status Engine::GradReady(int index) {
  Impl& impl = *impl_;
  ZERO_RETURN_IF_ERROR(impl.CheckUsable("GradReady"));
  ZERO_RETURN_IF_ERROR(impl.CheckIndex("GradReady", index));
  ZERO_RETURN_IF_ERROR(impl.FlushStep("GradReady"));
  ZERO_RETURN_IF_ERROR(impl.timeline.OnGradient());
  const ParamInfo& p = impl.registry.params[index];
  if (impl.window.reported(index)) {
    return InvalidArgumentError("GradReady(" + std::to_string(index) + "): the gradient of parameter " + ParamName(p) +
                                " was reported twice in one backward");
  }
  if (!impl.window.handed_out(index)) {
    return FailedPreconditionError("GradReady(" + std::to_string(index) + ") for parameter " + ParamName(p) +
                                   " without grad_buffer(" + std::to_string(index) + ") first");
  }
  return impl.Guard(impl.GradReadyImpl(index).WithContext("GradReady(" + ParamName(p) + ")"));
}

Status Engine::Impl::GradReadyImpl(int index) {
  const ParamInfo& p = registry.params[index];
  window.Report(index);
  DeviceBuffer buf = std::move(grad_buffers.handed_out[index]);
  if (p.numel == 0) return OkStatus();
  if (stage <= 1) {
    ZERO_RETURN_IF_ERROR(
        AddGradient(f32(acc, p.full_off), buf.data(), run.model_dtype, p.numel, window.FirstToAcc(index)));
    ZERO_RETURN_IF_ERROR(grad_buffers.pool->Release(std::move(buf), compute));
    // The boundary micro step: this accumulator is final, so its reduction can start now.
    if (window.AtBoundary() && !no_sync) ZERO_RETURN_IF_ERROR(QueueBoundaryReduction(index));
    return OkStatus();
  }
  if (UpdateInBackward()) {
    ZERO_RETURN_IF_ERROR(UpdateFromGradient(index, buf.data()));
    return grad_buffers.pool->Release(std::move(buf), compute);
  }
  if (DirectToPartition()) {
    // One rank: straight into the fp32 partition (shard = numel), no bucket, no conversion.
    ZERO_RETURN_IF_ERROR(AddToPartition(index, buf.data(), run.model_dtype));
    return grad_buffers.pool->Release(std::move(buf), compute);
  }
  if (stage3_reductions.schedule != nullptr) {
    // Held until the schedule says every rank reduces this module (ReduceModules).
    if (!stage3_reductions.schedule->Reported(p.module)) {
      // Too late: the ranks already reduced this module. Backward() fails on every rank.
      if (stage3_reductions.late_reports.size() < 8) stage3_reductions.late_reports.push_back(ParamName(p));
      return grad_buffers.pool->Release(std::move(buf), compute);
    }
    grad_buffers.held[index] = std::move(buf);
    return OkStatus();
  }
  grad_buffers.held[index] = std::move(buf);
  void* data = grad_buffers.held[index].data();
  // Without contiguous_gradients the buffer is reduced in place; its tail receives the shard.
  void* recv = GradRecvArea() ? ElementPtr(data, run.model_dtype, p.shard.padded) : nullptr;
  return reducer->Add(
      index, data, run.model_dtype, p.numel,
      [this, index]() { return grad_buffers.pool->Release(std::move(grad_buffers.held[index]), compute); }, recv);
}

// Stage 3 with several ranks: every parameter of `modules` (in that order, each module's last
// registered first) goes to the reducer, the ones this rank did not report as zeros, so every rank
// reduces the same layout at the same point.
Status Engine::Impl::ReduceModules(const std::vector<int>& modules) {
  for (int mod : modules) {
    const std::vector<int>& ps = registry.module_params[mod];
    for (auto it = ps.rbegin(); it != ps.rend(); ++it) {
      const int index = *it;
      const ParamInfo& p = registry.params[index];
      if (p.numel == 0) continue;
      if (grad_buffers.held[index].empty()) {
        // Not reported here: this rank contributes zeros (padding included).
        auto b = grad_buffers.pool->Acquire(static_cast<size_t>(GradBufferNumel(p)) * SizeOf(run.model_dtype),
                                            "allocating a zero gradient buffer");
        if (!b.ok()) return b.status().WithContext("parameter " + ParamName(p));
        grad_buffers.held[index] = std::move(b).value();
        const int64_t zeros = PerParamReduction() ? p.shard.padded : p.numel;
        ZERO_RETURN_IF_ERROR(
            device->Fill(grad_buffers.held[index].data(), run.model_dtype, static_cast<size_t>(zeros), 0.0f, compute));
      }
      void* data = grad_buffers.held[index].data();
      void* recv = GradRecvArea() ? ElementPtr(data, run.model_dtype, p.shard.padded) : nullptr;
      ZERO_RETURN_IF_ERROR(reducer->Add(
          index, data, run.model_dtype, p.numel,
          [this, index]() { return grad_buffers.pool->Release(std::move(grad_buffers.held[index]), compute); }, recv));
    }
  }
  return OkStatus();
}

// The first contribution of a window to an fp32 gradient piece overwrites it (Device::
// AccumulateFirst: 0.0f + g, one pass, the accumulator not read), later ones add (Accumulate). This
// replaces zero-filling every accumulator at the window start, bitwise: AccumulateFirst is defined
// as Accumulate into +0, so a -0 gradient still becomes +0 and a NaN the canonical NaN. (A plain
// Cast or copy would not be exact: it keeps -0, and a -0 accumulator can change later bits -
// classic Adam's g + wd*p, an exp_avg of -0 with beta1 = 0 and through it a -0 weight - as well as
// NaN payloads in the norm's double sum on the CPU backend.) Pieces that get no contribution in a
// window are zero-filled only where they are read: before a stage-0/1 reduction (this rank adds
// zeros) and at the boundary when AdamW updates them (managed mode updates every parameter).
Status Engine::Impl::AddGradient(float* dst, const void* src, DType src_t, int64_t n, bool first) {
  if (n == 0) return OkStatus();
  if (first) return device->AccumulateFirst(dst, src, src_t, static_cast<size_t>(n), 1.0f, compute);
  return device->Accumulate(dst, src, src_t, static_cast<size_t>(n), 1.0f, compute);
}

// Stages 2/3 with one rank (DirectToPartition): the model-dtype gradient of parameter `index` into
// its piece of the partition, first contribution of the window or not as AddGradient. `last`: the
// managed boundary micro step, after which the piece gets nothing more in this window. (With
// several ranks the reducer adds the reduced shards itself, with the same flags: grad_reducer.h.)
Status Engine::Impl::AddToPartition(int index, const void* src, DType src_t) {
  const bool first = window.FirstToPartition(index);
  return grad->Add(index, src, src_t, first, /*last=*/window.AtBoundary());
}

// UpdateInBackward: parameter `index`'s norm partial (from the model-dtype gradient at `src`, the
// same squares as of its fp32 widening) and its AdamW over the masters and moments from the
// gradient widened as the partition would hold it (0.0f + g; zeros when `src` is null: a parameter
// without a gradient in the window), queued through OptimizerStates::UpdateFromGradient (device
// states: on the compute stream; host states: on their worker, overlapped with backward). No
// model copy: Step() publishes it.
Status Engine::Impl::UpdateFromGradient(int index, const void* src) {
  const ParamInfo& p = registry.params[index];
  window.MarkUpdated(index);
  if (p.numel == 0) return OkStatus();
  if (src != nullptr) {
    ZERO_RETURN_IF_ERROR(
        device->SumOfSquares(src, run.model_dtype, static_cast<size_t>(p.numel), norm->slots() + index, compute));
  }
  // One rank: the partition piece is the whole (unpadded) parameter.
  return optimizer.states->UpdateFromGradient(p.part_off, p.shard.shard, src, run.model_dtype, StepParams(1.0, 1.0),
                                              compute);
}

Status Engine::Impl::QueueBoundaryReduction(int index) {
  if (!window.QueueReduction(index)) return OkStatus();
  const ParamInfo& p = registry.params[index];
  if (p.numel == 0) return OkStatus();
  // One rank: the mean over one rank is the sum itself (bitwise; the reducer issued no collective
  // there either), and stage 1 reads the accumulators as its partition (AccIsGrad): no reduction,
  // no bucket copies.
  if (world == 1) return OkStatus();
  if (!window.acc_written()[index]) {
    // No local gradient in this window: this rank contributes zeros.
    ZERO_RETURN_IF_ERROR(device->Fill(f32(acc, p.full_off), DType::kF32, static_cast<size_t>(p.numel), 0.0f, compute));
    window.MarkAccWritten(index);
  }
  if (stage == 1) window.MarkPartWritten(index);  // the reduction writes the whole shard
  // Without contiguous_gradients stage 0 all-reduces the accumulator in place and stage 1
  // reduce-scatters it (its full-layout piece is padded, padding zero) straight into the gradient
  // partition.
  return reducer->Add(index, f32(acc, p.full_off), DType::kF32, p.numel, nullptr,
                      stage == 1 ? grad->device_piece(index) : nullptr);
}

Status Engine::Impl::ReduceAccumulators(const std::vector<uint8_t>& which) {
  for (int i = 0; i < static_cast<int>(registry.params.size()); ++i) {
    if (which[i]) ZERO_RETURN_IF_ERROR(QueueBoundaryReduction(i));
  }
  ZERO_RETURN_IF_ERROR(reducer->Drain());
  window.MarkReduced();
  return OkStatus();
}

Status Engine::Backward() {
  Impl& impl = *impl_;
  ZERO_RETURN_IF_ERROR(impl.CheckUsable("Backward"));
  if (impl.window.pending_step()) {
    return FailedPreconditionError(
        "Backward() after the gradient accumulation boundary: call Step() before the next backward");
  }
  ZERO_RETURN_IF_ERROR(impl.Guard(impl.BackwardImpl().WithContext("Backward")));
  return impl.timeline.OnBackwardEnd();
}

Status Engine::Impl::BackwardImpl() {
  // Buffers handed out but never reported carry no gradient.
  for (int i = 0; i < static_cast<int>(registry.params.size()); ++i) {
    if (window.TakeHandedOut(i)) {
      ZERO_RETURN_IF_ERROR(grad_buffers.pool->Release(std::move(grad_buffers.handed_out[i]), compute));
    }
  }
  const bool boundary = window.AtBoundary();
  if (stage <= 1) {
    if (boundary && !no_sync) {
      // Managed: every parameter is updated; the ones not reported now have final sums too.
      ZERO_RETURN_IF_ERROR(ReduceAccumulators(std::vector<uint8_t>(registry.params.size(), 1)));
    }
  } else {
    if (stage3_reductions.schedule != nullptr) {
      auto rest = stage3_reductions.schedule->AtBackward();
      if (!rest.ok()) {
        Status s = rest.status();
        if (!stage3_reductions.late_reports.empty()) {
          std::string names;
          for (const std::string& n : stage3_reductions.late_reports) names += (names.empty() ? "" : ", ") + n;
          s = s.WithContext("this rank reported " + names + " after their modules were reduced");
        }
        // A late report is found by an all-reduce: every rank fails here with it.
        return s.code() == StatusCode::kFailedPrecondition ? Agreed(s) : s;
      }
      ZERO_RETURN_IF_ERROR(ReduceModules(*rest));
    }
    ZERO_RETURN_IF_ERROR(timeline.Timed(EngineTimeline::Kind::kCommunication, kTrackCommunication, "reduce gradients",
                                        [&] { return reducer->Drain(); }));
  }
  // Every contribution of the window is in: pieces whose last one came in an earlier micro step
  // are completed now (offload_grad_accumulation "gpu": sent to the host).
  if (boundary && grad != nullptr)
    ZERO_RETURN_IF_ERROR(
        TimedOffload(kTrackDeviceToHost, "gradients to the partition", [&] { return grad->Finish(); }));
  if (coordinator != nullptr) ZERO_RETURN_IF_ERROR(coordinator->EndMicroStep());
  window.EndBackward();
  ++progress.counters.micro_steps;
  return comm->CheckHealth();
}

}  // namespace zero
