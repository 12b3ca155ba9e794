// Engine: the optimizer step. Step() at the accumulation boundary (the global norm, the fp16
// overflow check and clipping, AdamW over the states, the new weights published where the forward
// reads them), SetNoSync, ZeroGrad, and offload_optimizer.overlap_step (the step's chunks queued
// under the next forward; WaitForOptimizerStep). docs/zero.md, docs/offload.md; Impl: engine_impl.h.
#include "engine/engine.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine_impl.h"
#include "engine/engine_timeline.h"
#include "zero/allgather_bucket.h"

namespace zero {

// --- step -----------------------------------------------------------------------------------------

Status Engine::Step() {
  Impl& impl = *impl_;
  ZERO_RETURN_IF_ERROR(impl.CheckUsable("Step"));
  ZERO_RETURN_IF_ERROR(impl.FlushStep("Step"));  // the previous step's pieces: queued, stream-ordered
  if (impl.window.reported_count() > 0) {
    return FailedPreconditionError("Step() with gradients reported since the last Backward(); call Backward() first");
  }
  if (impl.run.managed && !impl.window.pending_step()) {
    impl.progress.step_applied = false;
    return OkStatus();
  }
  if (impl.no_sync) {
    return FailedPreconditionError(
        "Step() at a gradient accumulation boundary while no_sync is on: turn no_sync off "
        "(SetNoSync(false)) before the boundary step");
  }
  impl.window.ClearPendingStep();
  ZERO_RETURN_IF_ERROR(impl.timeline.BeginStep());
  ZERO_RETURN_IF_ERROR(impl.Guard(impl.BoundaryImpl().WithContext(
      "Step (global step " + std::to_string(impl.progress.counters.global_steps) + ")")));
  return impl.timeline.EndStep(impl.progress.counters.global_steps);
}

Status Engine::ReportFault(Status error) {
  if (error.ok()) return InvalidArgumentError("ReportFault: the error to report is OK");
  return impl_->Guard(std::move(error));
}

// Starts a new window. No fill: the pieces are marked unwritten, and the window's first
// contribution overwrites each (AddGradient).
Status Engine::Impl::ZeroAccumulators() {
  if (UpdateInBackward()) {
    // Stream-ordered after the boundary's copy of the partials to the host.
    ZERO_RETURN_IF_ERROR(norm->ZeroSlots());
  }
  if (grad != nullptr) grad->NewWindow();
  window.NewWindow();
  return OkStatus();
}

// The global norm's total (zero/global_norm.h: the partials summed in parameter order, then over
// the ranks at stages 1-3), timed as communication.
Status Engine::Impl::ReadNorm(double* total) {
  return timeline.Timed(EngineTimeline::Kind::kCommunication, kTrackCommunication, "gradient norm",
                        [&] { return norm->Read(total); });
}

Status Engine::Impl::BoundaryImpl() {
  // Every parameter is updated (one without a gradient in the window with a zero gradient, as
  // DeepSpeed does), in managed and unmanaged mode alike; with freeze_inactive_parameters only those
  // that received a gradient on some rank in the window (zero/update_agreement.h).
  std::vector<uint8_t> update(registry.params.size(), 1);
  if (run.freeze_inactive) {
    update = window.active();
    ZERO_RETURN_IF_ERROR(AgreeOnActive(comm, &update));
    window.MergeActive(std::vector<double>(update.begin(), update.end()));
  }
  if (stage <= 1 && !window.reduced()) ZERO_RETURN_IF_ERROR(ReduceAccumulators(update));

  const bool in_backward = UpdateInBackward();
  ZERO_RETURN_IF_ERROR(ComputeNormPartials(update, in_backward));

  const bool fp16 = config.fp16.enabled;
  const double clip = config.gradient_clipping;
  const double s = fp16 ? static_cast<double>(scaler.scale()) : 1.0;
  // fp16 (the overflow check) and clipping (the coefficient) need the norm before AdamW: the host
  // waits for it here. Otherwise AdamW does not depend on it: it is read once, at the end of the
  // step, after AdamW and the weight publication are enqueued (on CUDA the device runs on
  // meanwhile; the value is the same either way).
  const bool norm_first = fp16 || clip > 0.0;
  double total = 0.0;
  double clip_coef = 1.0;
  if (norm_first) {
    bool skipped = false;
    ZERO_RETURN_IF_ERROR(ReadNormBeforeUpdate(s, &total, &clip_coef, &skipped));
    if (skipped) return OkStatus();
  }

  const AdamWParams h = StepParams(s, clip_coef);

  // AdamW, fused with the rounding of the new weights to the model dtype (Device::AdamWCast, the
  // same bits as a separate Cast), over runs of consecutive updated parameters (all of them in
  // managed mode). The model copy is written in place: stage 0 the full layout, stage 3 the
  // partition layout (both the master's own layout); stages 1/2 this rank's shard inside the
  // padded full parameter, ready for the all-gather - one call per parameter, since those shards
  // are not consecutive in the full layout, except with one rank where the two layouts coincide.
  // The gaps between pieces of a flat buffer are zero everywhere and stay zero under AdamW.
  if (coordinator != nullptr) ZERO_RETURN_IF_ERROR(coordinator->QuiesceForUpdate());
  // The update itself is local: with offloaded states or parameters it can fail on one rank only (a
  // swap file's EIO, a full disk). Every rank then agrees before the next collective, so none is
  // left waiting in the weight publication or the norm (AgreeOnUpdate).
  ZERO_RETURN_IF_ERROR(AgreeOnUpdate(UpdateAll(update, h, in_backward)));

  // The new weights where the forward reads them (stage 3: the coordinator re-gathers; stages
  // 1/2: the all-gather). Overlapped (one rank): nothing here reads the model copy.
  ZERO_RETURN_IF_ERROR(timeline.Timed(EngineTimeline::Kind::kCommunication, kTrackCommunication, "publish weights",
                                      [&] { return PublishWeights(update, /*cast=*/false); }));

  if (!norm_first) {
    ZERO_RETURN_IF_ERROR(ReadNorm(&total));
    if (DecideStep(total, fp16, config.stop_on_nonfinite) == StepVerdict::kStop) {
      progress.grad_norm = ReportedNorm(total, s);
      return Agreed(NonFiniteNormError(total, progress.counters.global_steps + 1, /*applied=*/true));
    }
  }
  ZERO_RETURN_IF_ERROR(ZeroAccumulators());
  progress.grad_norm = ReportedNorm(total, s);
  progress.step_applied = true;
  ++progress.counters.global_steps;
  ++progress.counters.adam_step;
  if (fp16) scaler.Update(false);
  return comm->CheckHealth();
}

// The norm's per-parameter partials of the window's fp32 gradients into norm's slots, then
// published (copied to the host, GlobalNorm::Publish). A piece without contribution in the window is
// zero-filled if AdamW is to read it (`update`).
Status Engine::Impl::ComputeNormPartials(const std::vector<uint8_t>& update, bool in_backward) {
  const int n_params = static_cast<int>(registry.params.size());
  // The fp32 gradients (`grad`): stage 0 (and stage 1 with one rank) the accumulators, full
  // layout; otherwise this rank's shards in the gradient partition (padding zero).
  const std::vector<uint8_t>& written = AccIsGrad() ? window.acc_written() : window.part_written();

  // Global norm: per parameter, the sum of squares of its fp32 gradient in double; summed on the
  // host in parameter order; partitioned stages all-reduce the partial sums (rank order). A
  // gradient that got no contribution in the window is zero: its partial is 0.0 (what
  // SumOfSquares of zeros gives), and it is zero-filled only if AdamW is to read it.
  // Update in backward: the partials were written at GradReady (0 for the others).
  if (!in_backward) {
    ZERO_RETURN_IF_ERROR(norm->ZeroSlots());
    // Unmanaged: the window's end is here (offload_grad_accumulation "gpu": the sums go to the host).
    ZERO_RETURN_IF_ERROR(grad->Finish());
    std::vector<int> norm_of;
    for (int i = 0; i < n_params; ++i) {
      if (grad->piece(i).n == 0) continue;
      if (!written[i]) {
        if (update[i]) ZERO_RETURN_IF_ERROR(grad->Zero(i));
        continue;
      }
      norm_of.push_back(i);
    }
    ZERO_RETURN_IF_ERROR(grad->SumsOfSquares(norm_of, norm->slots()));
  }
  return norm->Publish();
}

// fp16 and clipping read the norm before the update: an fp16 overflow skips the step (`skipped`:
// the window starts over, the loss scale drops), a non-finite norm with stop_on_nonfinite stops
// it, clipping sets `clip_coef`. `s`: the loss scale (1 without fp16).
Status Engine::Impl::ReadNormBeforeUpdate(double s, double* total_out, double* clip_coef, bool* skipped) {
  double& total = *total_out;
  ZERO_RETURN_IF_ERROR(ReadNorm(&total));
  // The total is the same on every rank, and so is the verdict (zero/update_agreement.h).
  const StepVerdict verdict = DecideStep(total, config.fp16.enabled, config.stop_on_nonfinite);
  if (verdict == StepVerdict::kSkip) {
    progress.grad_norm = std::numeric_limits<double>::infinity();
    progress.step_applied = false;
    ++progress.counters.global_steps;
    ++progress.counters.skipped_steps;
    scaler.Update(true);
    *skipped = true;
    ZERO_RETURN_IF_ERROR(ZeroAccumulators());
    if (scaler.overflow_at_min_scale()) {
      return Agreed(
          FailedPreconditionError("fp16 gradients overflowed with the loss scale already at fp16.min_loss_scale (" +
                                  std::to_string(config.fp16.min_loss_scale) + "); cannot decrease it further"));
    }
    return OkStatus();
  }
  if (verdict == StepVerdict::kStop) {
    progress.grad_norm = ReportedNorm(total, s);
    return Agreed(NonFiniteNormError(total, progress.counters.global_steps + 1, /*applied=*/false));
  }
  *clip_coef = ClipCoefficient(total, s, config.gradient_clipping);
  return OkStatus();
}

// The optimizer update of the boundary (BoundaryImpl): AdamW over the updated parameters and the
// new weights into the model copy (or the deferred pieces of the overlapped step).
Status Engine::Impl::UpdateAll(const std::vector<uint8_t>& update, const AdamWParams& h, bool in_backward) {
  const int n_params = static_cast<int>(registry.params.size());
  const bool overlap = OverlapStep();
  if (overlap) ZERO_RETURN_IF_ERROR(optimizer.deferred_step->Begin(h));
  if (in_backward) {
    // The masters of the reported parameters were updated in backward; the others (no gradient in
    // the window) get their zero-gradient update now. Then the model copy, cast from the masters
    // (one rank: the full and the partition layouts coincide), in runs of consecutive parameters.
    for (int i = 0; i < n_params; ++i) {
      if (update[i] && !window.updated(i)) ZERO_RETURN_IF_ERROR(UpdateFromGradient(i, nullptr));
    }
    for (int i = 0; i < n_params;) {
      if (!update[i]) {
        ++i;
        continue;
      }
      int j = i;
      while (j + 1 < n_params && update[j + 1]) ++j;
      const int64_t begin = registry.params[i].part_off;
      const int64_t end = registry.params[j].part_off + registry.params[j].shard.shard;
      const int64_t model_off = stage == 3 ? begin : registry.params[i].full_off;
      if (end > begin) {
        if (overlap) {
          optimizer.deferred_step->Defer(begin, end - begin, nullptr, model_ptr(model_off));
        } else {
          ZERO_RETURN_IF_ERROR(ModelFromMasters(begin, end - begin, model_off));
        }
      }
      i = j + 1;
    }
  }
  const bool runs = !(stage == 1 || stage == 2) || world == 1;
  for (int i = 0; i < n_params && !in_backward;) {
    if (!update[i]) {
      ++i;
      continue;
    }
    int j = i;
    while (runs && j + 1 < n_params && update[j + 1]) ++j;
    const int64_t begin = stage == 0 ? registry.params[i].full_off : registry.params[i].part_off;
    const int64_t end = stage == 0 ? registry.params[j].full_off + registry.params[j].shard.padded
                                   : registry.params[j].part_off + registry.params[j].shard.shard;
    const int64_t model_off =
        (stage == 1 || stage == 2) ? registry.params[i].full_off + registry.params[i].shard.begin : begin;
    if (end > begin) {
      if (overlap) {
        // The chunked states read device gradients (their partition is on the device).
        const float* g = grad->device_at(begin);
        if (g == nullptr) return InternalError("the overlapped chunked step needs the fp32 gradients on the device");
        optimizer.deferred_step->Defer(begin, end - begin, g, model_ptr(model_off));
      } else {
        ZERO_RETURN_IF_ERROR(TimedOffload(UpdateTrack(), "optimizer update",
                                          [&] { return UpdateModel(begin, end - begin, h, model_off); }));
      }
    }
    i = j + 1;
  }

  if (overlap) ZERO_RETURN_IF_ERROR(optimizer.deferred_step->End());
  return OkStatus();
}

// With several ranks and anything offloaded (host or NVMe states, host or NVMe parameter shards),
// one small host all-reduce tells every rank whether some rank's update failed
// (zero/update_agreement.h: the failing rank returns its own error, the others an error naming
// it, instead of waiting in the next collective for the communicator's timeout). Without offload,
// or with one rank, `local` is returned as is.
Status Engine::Impl::AgreeOnUpdate(Status local) {
  const OptimizerStateBytes sb = optimizer.states->bytes();
  const bool offloaded = sb.host > 0 || sb.nvme > 0 || host_params != nullptr;
  if (!offloaded) return local;
  AgreedStatus outcome = AgreeOnUpdateOutcome(comm, std::move(local));
  return outcome.agreed ? Agreed(std::move(outcome.status)) : std::move(outcome.status);
}

// The fp32 master weights (of the parameters in `update`) in the model dtype, where the forward
// reads them. With `cast` (LoadCheckpoint) they are rounded from the masters here: stage 0 casts
// the full copy, stage 3 the shards, stages 1/2 each rank's shard into its place; without it
// (Step) AdamWCast already wrote the model copy (stages 1/2: this rank's shard in the padded full
// parameter). Then stage 3 lets the coordinator drop what it had gathered (the caller ran
// QuiesceForUpdate() before the shards changed) and stages 1/2 all-gather the parameters in
// buckets of allgather_bucket_size elements.
Status Engine::Impl::PublishWeights(const std::vector<uint8_t>& update, bool cast) {
  const int n_params = static_cast<int>(registry.params.size());
  if (stage == 0) {
    if (cast) {
      ZERO_RETURN_IF_ERROR(
          optimizer.states->CastMaster(0, registry.full_total, model.data(), run.model_dtype, compute));
    }
  } else if (stage == 3) {
    if (cast) ZERO_RETURN_IF_ERROR(ModelFromMasters(0, registry.part_total, 0));
    ZERO_RETURN_IF_ERROR(coordinator->AfterUpdate());
  } else {
    // Stages 1/2: each updated parameter's shard all-gathered, in buckets of allgather_bucket_size
    // elements (zero/allgather_bucket.h). The bucket asks for this rank's shard at `dst`: either
    // its place in the full parameter (a bucket of one parameter, or one rank), where AdamWCast
    // already wrote it, or a segment of a bucket buffer, which gets a copy of it.
    std::vector<AllGatherItem> items;
    for (int i = 0; i < n_params; ++i) {
      const ParamInfo& p = registry.params[i];
      if (!update[i] || p.numel == 0) continue;
      items.push_back({i, model_ptr(p.full_off), p.shard.shard});
    }
    Status s = weight_gather->Run(items, [this, cast](int i, void* dst) -> Status {
      const ParamInfo& p = registry.params[i];
      const size_t shard = static_cast<size_t>(p.shard.shard);
      void* mine = model_ptr(p.full_off + p.shard.begin);
      if (cast) return optimizer.states->CastMaster(p.part_off, p.shard.shard, dst, run.model_dtype, compute);
      if (dst == mine) return OkStatus();
      return device->Copy(dst, mine, shard * SizeOf(run.model_dtype), CopyKind::kDeviceToDevice, compute);
    });
    if (!s.ok()) return s.WithContext("publishing the updated parameters");
  }
  return OkStatus();
}

// The AdamW hyperparameters of the next applied step (t = adam_step + 1).
AdamWParams Engine::Impl::StepParams(double loss_scale, double clip_coef) const {
  AdamWParams h;
  const OptimizerConfig& oc = config.optimizer;
  const int64_t t = progress.counters.adam_step + 1;
  h.lr = static_cast<float>(scheduler->LrAt(progress.counters.adam_step));
  h.beta1 = static_cast<float>(oc.beta1);
  h.beta2 = static_cast<float>(oc.beta2);
  h.eps = static_cast<float>(oc.eps);
  h.weight_decay = static_cast<float>(oc.weight_decay);
  h.bias_correction1 = static_cast<float>(1.0 - std::pow(oc.beta1, static_cast<double>(t)));
  h.bias_correction2 = static_cast<float>(1.0 - std::pow(oc.beta2, static_cast<double>(t)));
  h.adam_w_mode = oc.adam_w_mode;
  h.grad_scale = static_cast<float>(1.0 / (loss_scale * clip_coef));
  return h;
}

Status Engine::SetNoSync(bool on) {
  Impl& impl = *impl_;
  if (impl.stage >= 2) {
    return FailedPreconditionError("no_sync is not supported at ZeRO stage " + std::to_string(impl.stage) +
                                   " (stage 2/3 reduce-scatter gradients as they are produced); "
                                   "use gradient accumulation instead");
  }
  impl.no_sync = on;
  return OkStatus();
}

Status Engine::ZeroGrad() {
  Impl& impl = *impl_;
  ZERO_RETURN_IF_ERROR(impl.CheckUsable("ZeroGrad"));
  ZERO_RETURN_IF_ERROR(WaitForOptimizerStep());
  if (impl.window.reported_count() > 0) {
    return FailedPreconditionError(
        "ZeroGrad() in the middle of a backward (gradients reported since the last Backward())");
  }
  if (impl.window.any_updated()) {
    return FailedPreconditionError(
        "ZeroGrad() after a Backward() whose parameters were already updated in backward (managed, "
        "gradient_accumulation_steps 1, one rank, no fp16 or clipping: engine.h, 'Update in "
        "backward'); call Step() to finish the step");
  }
  return impl.Guard(impl.ZeroAccumulators().WithContext("ZeroGrad"));
}

// --- overlap_step: the optimizer step under the next forward --------------------------------------

Status Engine::WaitForOptimizerStep() {
  Impl& impl = *impl_;
  if (impl.optimizer.deferred_step == nullptr || !impl.optimizer.deferred_step->unfinished()) return OkStatus();
  ZERO_RETURN_IF_ERROR(impl.CheckUsable("WaitForOptimizerStep"));
  ZERO_RETURN_IF_ERROR(impl.FlushStep("WaitForOptimizerStep"));
  return impl.Guard(impl.optimizer.deferred_step->WaitForHost().WithContext(
      "WaitForOptimizerStep: waiting for the optimizer step's chunks"));
}

}  // namespace zero
