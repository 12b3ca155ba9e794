// The Engine's private state, shared by the .cc files of //engine:engine only (not installed):
// ParamInfo (a registered parameter and its place in the flat buffers), ParamName, the groups of
// Impl's fields (RunSettings, Lifecycle, ParamRegistry, GradBuffers, Stage3Reductions,
// StepProgress), and the definition of struct Engine::Impl: its fields, its small inline helpers
// (layout, mode predicates, Guard/Check*, the model-copy writes) and the member functions the .cc files define:
//   engine.cc           creation and set-up (Create, RegisterParameter, Initialize), ModuleHandle,
//                       the accessors
//   engine_backward.cc  forward (GatherModule, param) and backward (grad_buffer, GradReady, the
//                       reductions, Backward)
//   engine_step.cc      the step (norm, AdamW, weight publication, ZeroGrad) and overlap_step
//   engine_state.cc     host gathers of the state and checkpoints
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/checkpoint/checkpoint.h"
#include "engine/checkpoint/io.h"
#include "engine/engine.h"
#include "engine/engine_timeline.h"
#include "engine/lr_scheduler.h"
#include "zero/allgather_bucket.h"
#include "zero/buffer_pool.h"
#include "zero/deferred_step.h"
#include "zero/global_norm.h"
#include "zero/grad_partition.h"
#include "zero/grad_reducer.h"
#include "zero/grad_window.h"
#include "zero/loss_scaler.h"
#include "zero/optimizer_states.h"
#include "zero/param_coordinator.h"
#include "zero/param_store.h"
#include "zero/partition.h"
#include "zero/reduction_schedule.h"
#include "zero/state_factory.h"
#include "zero/update_agreement.h"

namespace zero {
namespace engine_internal {

struct ParamInfo {
  ParamSpec spec;
  int64_t numel = 0;
  int module = -1;
  ShardSpec shard;       // this rank's shard of the padded parameter
  int64_t full_off = 0;  // offset in the full flat buffers (model at stages 0-2; fp32 at stage 0/1)
  int64_t part_off = 0;  // offset in the partition flat buffers (stages 1-3)
  bool persistent = false;
};

inline std::string ParamName(const ParamInfo& p) { return "'" + p.spec.name + "'"; }

// Copies of config values the engine reads on every call (Engine::Create fills them).
struct RunSettings {
  DType model_dtype = DType::kF32;
  DType comm_dtype = DType::kF32;  // stage 2/3 gradient reduction dtype
  bool managed = true;             // managed_gradient_accumulation
  // freeze_inactive_parameters: a parameter no rank reported in the window keeps its weights and
  // moments; otherwise (default, DeepSpeed) it is stepped with a zero gradient. Both modes.
  bool freeze_inactive = false;
  int64_t gas = 1;  // gradient_accumulation_steps in managed mode, else 1
  ReduceOp reduce_op = ReduceOp::kAvg;
  // contiguous_gradients false: no buckets; each gradient is reduced on its own, straight from the
  // buffer grad_buffer() handed out (stages 2/3: padded to n_pad, see GradBufferNumel).
  bool contiguous = true;
};

// Whether the engine can be used: Initialize done, and the first error that made it unusable.
struct Lifecycle {
  bool initialized = false;
  Status broken;
  bool failure_agreed = false;  // the error in flight is one every rank returns (Agreed)
};

// The registered parameters, their modules, and the sizes of the flat buffers (docs/zero.md;
// full_total / part_total in elements, set by Initialize).
struct ParamRegistry {
  std::vector<ParamInfo> params;
  std::map<std::string, int> param_index;
  std::vector<std::string> module_names;
  std::map<std::string, int> module_index;
  std::vector<std::vector<int>> module_params;
  int64_t full_total = 0;
  int64_t part_total = 0;
};

// The model-dtype gradient buffers of grad_buffer(), from a pool keyed by size.
struct GradBuffers {
  std::unique_ptr<BufferPool> pool;
  std::vector<DeviceBuffer> handed_out;  // by grad_buffer(), not yet reported
  std::vector<DeviceBuffer> held;        // stages 2/3: reported, waiting to be packed
};

// Stage 3 with several ranks: when each module's gradients are reduced (zero/reduction_schedule.h;
// until then they wait in GradBuffers::held), and the parameters this rank reported too late.
struct Stage3Reductions {
  std::unique_ptr<ReductionSchedule> schedule;
  std::vector<std::string> late_reports;
};

// What the steps so far did (Engine::counters, was_step_applied, global_grad_norm).
struct StepProgress {
  EngineCounters counters;
  bool step_applied = false;
  double grad_norm = -1.0;
};

}  // namespace engine_internal

using engine_internal::GradBuffers;
using engine_internal::Lifecycle;
using engine_internal::ParamInfo;
using engine_internal::ParamName;
using engine_internal::ParamRegistry;
using engine_internal::RunSettings;
using engine_internal::Stage3Reductions;
using engine_internal::StepProgress;

struct Engine::Impl {
  Config config;
  EngineEnv env;
  // wall_clock_breakdown and zero_trace (engine/engine_timeline.h): off unless configured. Declared
  // before the components: destroyed after them, as they hold its stream observer.
  EngineTimeline timeline;
  Device* device = nullptr;
  Communicator* comm = nullptr;
  Stream* compute = nullptr;
  int rank = 0;
  int world = 1;
  int stage = 0;
  RunSettings run;
  std::optional<LrScheduler> scheduler;
  LossScaler scaler;
  Lifecycle lifecycle;
  ParamRegistry registry;

  // Storage per stage (docs/zero.md; chosen by zero/state_factory.h).
  DeviceBuffer model;  // stages 0-2: full params (model dtype); stage 3: this rank's shards
  // Stage 3 with offload_param.device "cpu" / "nvme": this rank's shards in host memory or in a
  // swap file instead (`model` stays empty; zero/param_store.h). Written only between
  // QuiesceForUpdate and AfterUpdate (or before the coordinator exists), through ModelFromMasters /
  // UpdateModel.
  std::unique_ptr<ParamStore> host_params;
  // fp32 master weights and AdamW moments (zero/optimizer_states.h): stage 0 in the full layout,
  // stages 1-3 in the partition layout; and with offload_optimizer.overlap_step over the chunked
  // states the overlapped step's scheduler (docs/offload.md, "Overlap with the next forward";
  // zero/deferred_step.h), else null: UpdateAll hands it the step's AdamW runs (or, after an
  // update in backward, its casts of the masters); GatherModule lets it queue and wait for the
  // module's chunks; everything left is queued, and the compute stream waits for all of it, before
  // anything writes the gradients or states again (FlushStep).
  OptimizerStorage optimizer;
  DeviceBuffer acc;  // stages 0/1: fp32 full per-rank accumulators (stage 0: reduced in place)
  // The fp32 gradients the boundary reads (zero/grad_partition.h), one piece per parameter: a view
  // of `acc` where the accumulators are the partition (AccIsGrad), otherwise this rank's fp32
  // gradient partition (stages 1-3; none with UpdateInBackward).
  std::unique_ptr<GradPartition> grad;
  // The global norm's per-parameter partials and their sum over ranks (zero/global_norm.h).
  std::unique_ptr<GlobalNorm> norm;

  GradBuffers grad_buffers;
  Stage3Reductions stage3_reductions;
  // Per parameter: handed out, reported, active, which fp32 gradient pieces hold this window's
  // values (the rest hold stale values of an earlier window; see AddGradient), queued reductions,
  // updates in backward; and the window's counts (zero/grad_window.h).
  GradWindow window;
  std::unique_ptr<GradientReducer> reducer;
  std::unique_ptr<BucketedAllGather> weight_gather;  // stages 1/2
  std::unique_ptr<ParamCoordinator> coordinator;

  bool no_sync = false;
  StepProgress progress;
  // Rank 0: the checkpoint directories this engine saved into, locked until it is destroyed
  // (DirectoryLock, checkpoint_io.h).
  std::map<std::string, DirectoryLock> save_locks;

  float* f32(const DeviceBuffer& b, int64_t off) const { return b.as<float>() + off; }
  // Stages 2/3 without contiguous_gradients: the gradient buffer is the padded parameter (its own
  // shard layout, padding zeroed when handed out) followed, when the reduce-scatter runs in the
  // model dtype, by the shard-sized area it receives into. Otherwise numel elements.
  bool PerParamReduction() const { return !run.contiguous && stage >= 2; }
  bool GradRecvArea() const {
    return PerParamReduction() && run.comm_dtype == run.model_dtype && config.zero.reduce_scatter && world > 1;
  }
  int64_t GradBufferNumel(const ParamInfo& p) const {
    if (!PerParamReduction() || p.numel == 0) return p.numel;
    return p.shard.padded + (GradRecvArea() ? p.shard.shard : 0);
  }
  void* model_ptr(int64_t off) const { return ElementPtr(model.data(), run.model_dtype, off); }
  // Stage 3: this rank's shard store (device `model`, or host_params) at partition offset `off`.
  // nullptr with offload_param "nvme" (the coordinator asks the store module by module).
  const void* shard_ptr(int64_t off) const { return host_params ? host_params->host_address(off) : model_ptr(off); }
  // The model copy of partition (stage 3) / state (other stages) elements [off, off + n) cast from
  // the masters, written at model offset `model_off`: into `model`, or at stage 3 with parameter
  // offload into the host shards (off == model_off there).
  Status ModelFromMasters(int64_t off, int64_t n, int64_t model_off) {
    if (host_params != nullptr) return host_params->WriteFromMasters(optimizer.states.get(), off, n);
    return optimizer.states->CastMaster(off, n, model_ptr(model_off), run.model_dtype, compute);
  }
  // AdamW over state elements [off, off + n) from the fp32 gradients in `grad` (at off), the new
  // weights rounded into the model copy at `model_off` (as ModelFromMasters). Host shards: with
  // host states the update, then the rounded masters on the host; otherwise chunk by chunk into
  // the store's device scratch (AdamW is elementwise: the same bits).
  Status UpdateModel(int64_t off, int64_t n, const AdamWParams& h, int64_t model_off) {
    if (host_params == nullptr)
      return grad->Update(optimizer.states.get(), off, n, h, model_ptr(model_off), run.model_dtype);
    if (optimizer.states->casts_to_host()) {
      ZERO_RETURN_IF_ERROR(grad->Update(optimizer.states.get(), off, n, h, nullptr, run.model_dtype));
      return host_params->WriteFromMasters(optimizer.states.get(), off, n);
    }
    return host_params->Write(off, n, [&](void* dst, int64_t at, int64_t len) {
      return grad->Update(optimizer.states.get(), off + at, len, h, dst, run.model_dtype);
    });
  }
  // The fp32 gradients the boundary reads (norm, AdamW) are the accumulators at stage 0, and at
  // stage 1 with one rank, where the reduce-scatter would be the identity and the partition layout
  // is the full layout (shard = n_pad = numel, part_off = full_off); otherwise the partition.
  bool AccIsGrad() const { return stage == 0 || (stage == 1 && world == 1); }
  // Stages 2/3 with one rank: no reduction is needed (the mean over one rank is the value itself),
  // so GradReady adds the model-dtype gradient straight into the fp32 partition, with no bucket
  // and no conversion buffer. Bitwise the same as the reducer path whenever its conversion to
  // communication_data_type is exact: fp32 (Accumulate reads 16-bit sources exactly as Cast
  // widens them) or the model dtype itself; a narrowing communication dtype still goes through
  // the reducer, whose Cast rounds.
  bool DirectToPartition() const {
    return stage >= 2 && world == 1 && (run.comm_dtype == run.model_dtype || run.comm_dtype == DType::kF32);
  }
  // Update in backward: when a parameter's gradient is final as soon as it is reported (managed,
  // GAS 1, one rank at stages 2/3: DirectToPartition) and nothing needs the global norm before the
  // update (no fp16 overflow check, no clipping), GradReady runs its AdamW at once, through a
  // chunk-sized fp32 scratch, and no fp32 gradient partition exists. The model copy is cast from
  // the new masters at Step() (param() does not change before Step(), as in the other modes).
  // Bitwise the same as the boundary path: the scratch holds what the partition would (0.0f + g),
  // AdamW is elementwise, and AdamW followed by Cast equals AdamWCast.
  bool UpdateInBackward() const {
    return run.managed && run.gas == 1 && DirectToPartition() && !config.fp16.enabled &&
           config.gradient_clipping <= 0.0;
  }

  // A failure that makes the engine unusable. Unless every rank fails together (Agreed), it is
  // reported to the other ranks (Communicator::ReportFault), so they stop within seconds, naming
  // this rank, instead of waiting in their next collective for the communicator's timeout.
  Status Guard(Status s) {
    if (!s.ok() && lifecycle.broken.ok()) {
      lifecycle.broken = s;
      if (!lifecycle.failure_agreed) comm->ReportFault(s);
    }
    return s;
  }
  // Marks `s` as an error every rank returns at the same call (a global decision: a non-finite
  // norm, an agreement's outcome): Guard does not report it, since reporting would abort a rank
  // still finishing the collective that decided it.
  Status Agreed(Status s) {
    if (!s.ok()) lifecycle.failure_agreed = true;
    return s;
  }
  Status CheckUsable(const char* call) const {
    if (!lifecycle.broken.ok()) {
      return Status(lifecycle.broken.code(), std::string(call) + ": the engine is unusable after an earlier error: " +
                                                 lifecycle.broken.message());
    }
    if (!lifecycle.initialized) {
      return FailedPreconditionError(std::string(call) + " before Initialize()");
    }
    return OkStatus();
  }
  Status CheckIndex(const char* call, int index) const {
    if (index < 0 || index >= static_cast<int>(registry.params.size())) {
      return InvalidArgumentError(std::string(call) + "(" + std::to_string(index) + "): no such parameter (" +
                                  std::to_string(registry.params.size()) + " registered)");
    }
    return OkStatus();
  }

  Status Allocate(DeviceBuffer* out, int64_t numel, DType t, const char* what) {
    auto b = device->Allocate(static_cast<size_t>(numel) * SizeOf(t));
    if (!b.ok()) return b.status().WithContext(std::string("Initialize: allocating ") + what);
    *out = std::move(b).value();
    return device->Fill(out->data(), t, static_cast<size_t>(numel), 0.0f, compute);
  }

  // fill(index, begin, count, values): elements [begin, begin + count) of the parameter's initial
  // values. partition_reads: Engine::InitializeFromSlices (stage 3 asks for the rank's shard only,
  // ranks are not compared); else Engine::Initialize (whole parameters, compared across ranks).
  using InitFill = std::function<Status(int index, int64_t begin, int64_t count, float* values)>;
  Status InitializeImpl(const InitFill& fill, bool partition_reads);
  // InitializeImpl's steps, in order (engine.cc).
  void LayOutFlatBuffers();
  Status SetUpParamStorage();
  Status SetUpOptimizerStates();
  Status SetUpGradPartition();
  Status AllocateNormPartials();
  Status UploadInitialValues(const InitFill& fill, bool partition_reads);
  Status UploadInitialValue(const ParamInfo& p, const std::vector<float>& values, float* staging);
  Status CheckSameInitialValues(std::vector<double>* sums);
  void SetUpGradBuffers(int max_in_flight);
  void SetUpReducer(int max_in_flight);
  void SetUpWeightGather();
  void SetUpCoordinator();
  Status GradReadyImpl(int index);
  Status BackwardImpl();
  Status QueueBoundaryReduction(int index);
  Status ReduceModules(const std::vector<int>& modules);
  Status ReduceAccumulators(const std::vector<uint8_t>& which);
  Status UpdateAll(const std::vector<uint8_t>& update, const AdamWParams& h, bool in_backward);
  Status AgreeOnUpdate(Status local);
  Status BoundaryImpl();
  Status ComputeNormPartials(const std::vector<uint8_t>& update, bool in_backward);
  Status ReadNormBeforeUpdate(double loss_scale, double* total, double* clip_coef, bool* skipped);
  Status ZeroAccumulators();
  Status AddGradient(float* dst, const void* src, DType src_t, int64_t n, bool first);
  Status AddToPartition(int index, const void* src, DType src_t);
  AdamWParams StepParams(double loss_scale, double clip_coef) const;
  Status UpdateFromGradient(int index, const void* src);
  Status ReadNorm(double* total);
  // fn, timed as offload (wall_clock_breakdown) on `track` (zero_trace) when states or gradients
  // live off the device; otherwise just fn.
  Status TimedOffload(TrackId track, const char* name, const std::function<Status()>& fn) {
    const bool off = config.zero.offload_optimizer.device != OffloadDevice::kNone ||
                     config.zero.offload_param.device != OffloadDevice::kNone;
    return off ? timeline.Timed(EngineTimeline::Kind::kOffload, track, name, fn) : fn();
  }
  // The trace track of the optimizer update over the states: CPU AdamW, NVMe, or the GPU update.
  TrackId UpdateTrack() const {
    if (config.zero.offload_optimizer.device == OffloadDevice::kNvme) return kTrackIo;
    return optimizer.states != nullptr && optimizer.states->updates_from_host() ? kTrackCpuOptimizer
                                                                                : kTrackHostToDevice;
  }
  Status GatherFp32(int index, OptState which, float* out);
  Status PublishWeights(const std::vector<uint8_t>& update, bool cast);
  Status CheckOutsideWindow(const char* call) const;
  Status SaveCheckpointImpl(const std::string& dir, const std::string& tag, const std::string& client_state_json);
  Result<std::string> LoadCheckpointImpl(const std::string& dir, const std::string& tag);
  Status CheckLoadedCheckpoint(const LoadedCheckpoint& loaded, const std::string& what) const;
  Status ResumeLossScaler(const CheckpointMeta& meta, const std::string& what, LossScaler* new_scaler) const;
  Status InstallLoadedState(const LoadedCheckpoint& loaded);

  bool OverlapStep() const { return optimizer.deferred_step != nullptr; }
  bool StepInFlight() const { return optimizer.deferred_step != nullptr && optimizer.deferred_step->in_flight(); }
  // Queues every piece left and makes the compute stream wait for all of them (no host wait).
  Status FlushStep(const char* call) {
    if (!StepInFlight()) return OkStatus();
    Status s = optimizer.deferred_step->Flush();
    if (!s.ok()) {
      return Guard(s.WithContext(std::string(call) + ": queueing the rest of the overlapped optimizer step"));
    }
    return OkStatus();
  }
};

}  // namespace zero
