// Engine: wires the ZeRO pieces (zero/) into the API of engine.h. See docs/zero.md for how each
// stage stores and reduces, the bucket layout and the boundary arithmetic.
#include "engine/engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/checkpoint_format.h"
#include "engine/engine_timeline.h"
#include "engine/lr_scheduler.h"
#include "zero/allgather_bucket.h"
#include "zero/buffer_pool.h"
#include "zero/chunked_optimizer_states.h"
#include "zero/grad_partition.h"
#include "zero/grad_reducer.h"
#include "zero/gradient_bucket.h"
#include "zero/loss_scaler.h"
#include "zero/host_optimizer_states.h"
#include "zero/host_param_store.h"
#include "zero/nvme_optimizer_states.h"
#include "zero/nvme_param_store.h"
#include "zero/tiered_optimizer_states.h"
#include "zero/optimizer_states.h"
#include "zero/param_coordinator.h"
#include "zero/partition.h"
#include "zero/reduction_schedule.h"

namespace zero {

namespace {

// Pieces of the engine's flat buffers start at multiples of this many elements (256 bytes of
// fp32), so param(i) and grad shards are aligned for vectorized kernels. Gaps stay zero.
constexpr int64_t kAlign = 64;

struct ParamInfo {
  ParamSpec spec;
  int64_t numel = 0;
  int module = -1;
  ShardSpec shard;        // this rank's shard of the padded parameter
  int64_t full_off = 0;   // offset in the full flat buffers (model at stages 0-2; fp32 at stage 0/1)
  int64_t part_off = 0;   // offset in the partition flat buffers (stages 1-3)
  bool persistent = false;
};

// 52-bit hash of the values' bits, compared across ranks by Initialize (exact as a double, so
// AllReduceHost max/min compare it). xxHash64's construction (four independent lanes over 32-byte
// stripes, one multiply-rotate-multiply round per 64-bit word, then an avalanche): several GB/s on
// one core, where the byte-wise FNV-1a it replaces ran at about 1 byte/ns. Not a cryptographic
// hash: it tells honest mismatches apart (a differing init function, seed or rank-dependent
// value), which is all Initialize needs.
constexpr uint64_t kP1 = 0x9E3779B185EBCA87ull;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4Full;
constexpr uint64_t kP3 = 0x165667B19E3779F9ull;
constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ull;
constexpr uint64_t kP5 = 0x27D4EB2F165667C5ull;
inline uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t HashRound(uint64_t acc, uint64_t w) { return Rotl(acc + w * kP2, 31) * kP1; }
inline uint64_t HashMerge(uint64_t h, uint64_t lane) { return (h ^ HashRound(0, lane)) * kP1 + kP4; }

double Checksum(const float* v, int64_t n) {
  const unsigned char* b = reinterpret_cast<const unsigned char*>(v);
  const size_t bytes = static_cast<size_t>(n) * 4;
  auto word = [b](size_t at) {
    uint64_t w;
    std::memcpy(&w, b + at, 8);
    return w;
  };
  size_t i = 0;
  uint64_t h;
  if (bytes >= 32) {
    uint64_t l0 = kP1 + kP2, l1 = kP2, l2 = 0, l3 = 0 - kP1;
    for (; i + 32 <= bytes; i += 32) {
      l0 = HashRound(l0, word(i));
      l1 = HashRound(l1, word(i + 8));
      l2 = HashRound(l2, word(i + 16));
      l3 = HashRound(l3, word(i + 24));
    }
    h = Rotl(l0, 1) + Rotl(l1, 7) + Rotl(l2, 12) + Rotl(l3, 18);
    h = HashMerge(HashMerge(HashMerge(HashMerge(h, l0), l1), l2), l3);
  } else {
    h = kP5;
  }
  h += static_cast<uint64_t>(bytes);
  for (; i + 8 <= bytes; i += 8) h = Rotl(h ^ HashRound(0, word(i)), 27) * kP1 + kP4;
  if (i + 4 <= bytes) {
    uint32_t w;
    std::memcpy(&w, b + i, 4);
    h = Rotl(h ^ (static_cast<uint64_t>(w) * kP1), 23) * kP2 + kP3;
  }
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return static_cast<double>(h & ((uint64_t{1} << 52) - 1));
}

std::string ParamName(const ParamInfo& p) { return "'" + p.spec.name + "'"; }

}  // namespace

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
  DType mdt = DType::kF32;      // model dtype
  DType comm_dt = DType::kF32;  // stage 2/3 gradient reduction dtype
  bool managed = true;
  // freeze_inactive_parameters: a parameter no rank reported in the window keeps its weights and
  // moments; otherwise (default, DeepSpeed) it is stepped with a zero gradient. Both modes.
  bool freeze_inactive = false;
  int64_t gas = 1;
  ReduceOp op = ReduceOp::kAvg;
  // contiguous_gradients false: no buckets; each gradient is reduced on its own, straight from the
  // buffer grad_buffer() handed out (stages 2/3: padded to n_pad, see GradBufferNumel).
  bool contiguous = true;
  std::optional<LrScheduler> scheduler;
  LossScaler scaler;

  // Set-up.
  bool initialized = false;
  std::vector<ParamInfo> params;
  std::map<std::string, int> param_index;
  std::vector<std::string> module_names;
  std::map<std::string, int> module_index;
  std::vector<std::vector<int>> module_params;

  // Flat buffers (see docs/zero.md). full_total / part_total in elements.
  int64_t full_total = 0;
  int64_t part_total = 0;
  DeviceBuffer model;       // stages 0-2: full params (mdt); stage 3: this rank's shards (mdt)
  // Stage 3 with offload_param.device "cpu" / "nvme": this rank's shards in host memory or in a
  // swap file instead (`model` stays empty; zero/param_store.h). Written only between
  // QuiesceForUpdate and AfterUpdate (or before the coordinator exists), through ModelFromMasters /
  // UpdateModel.
  std::unique_ptr<ParamStore> host_params;
  // fp32 master weights and AdamW moments (zero/optimizer_states.h): stage 0 in the full layout,
  // stages 1-3 in the partition layout.
  std::unique_ptr<OptimizerStates> states;
  DeviceBuffer acc;         // stages 0/1: fp32 full per-rank accumulators (stage 0: reduced in place)
  // The fp32 gradients the boundary reads (zero/grad_partition.h), one piece per parameter: a view
  // of `acc` where the accumulators are the partition (AccIsGrad), otherwise this rank's fp32
  // gradient partition (stages 1-3; none with UpdateInBackward).
  std::unique_ptr<GradPartition> grad;
  DeviceBuffer norm_slots;  // one device double per parameter
  PinnedBuffer norm_host;   // their host copy (pinned, so the copy does not block the host)
  std::unique_ptr<Event> norm_ready;  // recorded after that copy

  std::unique_ptr<BufferPool> grad_pool;
  std::vector<DeviceBuffer> grad_out;   // handed out by grad_buffer(), not yet reported
  std::vector<DeviceBuffer> grad_held;  // stage 2/3: reported, waiting to be packed
  // Stage 3 with several ranks: when each module's gradients are reduced (zero/reduction_schedule.h;
  // until then they wait in grad_held), and the parameters this rank reported too late for that.
  std::unique_ptr<ReductionSchedule> schedule;
  std::vector<std::string> late_reports;
  std::vector<uint8_t> handed_out;
  std::vector<uint8_t> reported;        // in the current backward
  std::vector<uint8_t> active;          // received a gradient in the current window
  std::vector<uint8_t> reduce_queued;   // stage 0/1: queued for the boundary reduction
  // Which fp32 gradient pieces hold this window's values (the rest hold stale values of an earlier
  // window: nothing zero-fills the accumulators at a window start; see AddGradient).
  std::vector<uint8_t> acc_written;     // stages 0/1: acc piece (this rank's local sum)
  std::vector<uint8_t> part_written;    // stages 1-3: `grad` piece (the reduced sum)
  std::vector<uint8_t> updated;         // UpdateInBackward: AdamW already ran in this window
  int reported_count = 0;
  std::unique_ptr<GradientReducer> reducer;
  std::unique_ptr<BucketedAllGather> weight_gather;  // stages 1/2
  std::unique_ptr<ParamCoordinator> coordinator;

  // Accumulation state.
  int64_t window_micro = 0;   // Backward() calls in the current window (managed)
  bool pending_step = false;  // managed: the boundary Backward() ran; Step() does the update
  bool reduced = false;       // stage 0/1: accumulators reduced for this window
  bool no_sync = false;
  int64_t backwards_since_step = 0;  // Backward() calls since the last boundary or ZeroGrad()

  EngineCounters counters;
  bool step_applied = false;
  double grad_norm = -1.0;
  Status broken;

  float* f32(const DeviceBuffer& b, int64_t off) const { return b.as<float>() + off; }
  // Stages 2/3 without contiguous_gradients: the gradient buffer is the padded parameter (its own
  // shard layout, padding zeroed when handed out) followed, when the reduce-scatter runs in the
  // model dtype, by the shard-sized area it receives into. Otherwise numel elements.
  bool PerParamReduction() const { return !contiguous && stage >= 2; }
  bool GradRecvArea() const {
    return PerParamReduction() && comm_dt == mdt && config.zero.reduce_scatter && world > 1;
  }
  int64_t GradBufferNumel(const ParamInfo& p) const {
    if (!PerParamReduction() || p.numel == 0) return p.numel;
    return p.shard.padded + (GradRecvArea() ? p.shard.shard : 0);
  }
  void* model_ptr(int64_t off) const { return ElementPtr(model.data(), mdt, off); }
  // Stage 3: this rank's shard store (device `model`, or host_params) at partition offset `off`.
  // nullptr with offload_param "nvme" (the coordinator asks the store module by module).
  const void* shard_ptr(int64_t off) const { return host_params ? host_params->host_address(off) : model_ptr(off); }
  // The model copy of partition (stage 3) / state (other stages) elements [off, off + n) cast from
  // the masters, written at model offset `model_off`: into `model`, or at stage 3 with parameter
  // offload into the host shards (off == model_off there).
  Status ModelFromMasters(int64_t off, int64_t n, int64_t model_off) {
    if (host_params != nullptr) return host_params->WriteFromMasters(states.get(), off, n);
    return states->CastMaster(off, n, model_ptr(model_off), mdt, compute);
  }
  // AdamW over state elements [off, off + n) from the fp32 gradients in `grad` (at off), the new
  // weights rounded into the model copy at `model_off` (as ModelFromMasters). Host shards: with
  // host states the update, then the rounded masters on the host; otherwise chunk by chunk into
  // the store's device scratch (AdamW is elementwise: the same bits).
  Status UpdateModel(int64_t off, int64_t n, const AdamWParams& h, int64_t model_off) {
    if (host_params == nullptr) return grad->Update(states.get(), off, n, h, model_ptr(model_off), mdt);
    if (states->casts_to_host()) {
      ZERO_RETURN_IF_ERROR(grad->Update(states.get(), off, n, h, nullptr, mdt));
      return host_params->WriteFromMasters(states.get(), off, n);
    }
    return host_params->Write(off, n, [&](void* dst, int64_t at, int64_t len) {
      return grad->Update(states.get(), off + at, len, h, dst, mdt);
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
    return stage >= 2 && world == 1 && (comm_dt == mdt || comm_dt == DType::kF32);
  }
  // Update in backward: when a parameter's gradient is final as soon as it is reported (managed,
  // GAS 1, one rank at stages 2/3: DirectToPartition) and nothing needs the global norm before the
  // update (no fp16 overflow check, no clipping), GradReady runs its AdamW at once, through a
  // chunk-sized fp32 scratch, and no fp32 gradient partition exists. The model copy is cast from
  // the new masters at Step() (param() does not change before Step(), as in the other modes).
  // Bitwise the same as the boundary path: the scratch holds what the partition would (0.0f + g),
  // AdamW is elementwise, and AdamW followed by Cast equals AdamWCast.
  bool UpdateInBackward() const {
    return managed && gas == 1 && DirectToPartition() && !config.fp16.enabled &&
           config.gradient_clipping <= 0.0;
  }

  Status Guard(Status s) {
    if (!s.ok() && broken.ok()) broken = s;
    return s;
  }
  Status CheckUsable(const char* call) const {
    if (!broken.ok()) {
      return Status(broken.code(), std::string(call) + ": the engine is unusable after an earlier error: " +
                                       broken.message());
    }
    if (!initialized) {
      return FailedPreconditionError(std::string(call) + " before Initialize()");
    }
    return OkStatus();
  }
  Status CheckIndex(const char* call, int index) const {
    if (index < 0 || index >= static_cast<int>(params.size())) {
      return InvalidArgumentError(std::string(call) + "(" + std::to_string(index) +
                                  "): no such parameter (" + std::to_string(params.size()) +
                                  " registered)");
    }
    return OkStatus();
  }

  Status Allocate(DeviceBuffer* out, int64_t numel, DType t, const char* what) {
    auto b = device->Allocate(static_cast<size_t>(numel) * SizeOf(t));
    if (!b.ok()) return b.status().WithContext(std::string("Initialize: allocating ") + what);
    *out = std::move(b).value();
    return device->Fill(out->data(), t, static_cast<size_t>(numel), 0.0f, compute);
  }

  Status InitializeImpl(const std::function<void(int index, float* values)>& init);
  Status GradReadyImpl(int index);
  Status BackwardImpl();
  Status QueueBoundaryReduction(int index);
  Status ReduceModules(const std::vector<int>& modules);
  Status ReduceAccumulators(const std::vector<uint8_t>& which);
  Status UnionActive();
  Status BoundaryImpl();
  Status ZeroAccumulators();
  Status AddGradient(float* dst, const void* src, DType src_t, int64_t n, uint8_t* written);
  Status AddToPartition(int index, const void* src, DType src_t);
  Status CreateGradPartition();
  AdamWParams StepParams(double loss_scale, double clip_coef) const;
  Status UpdateFromGradient(int index, const void* src);
  Status ReadNorm(double* total);
  Status ReadNormImpl(double* total);
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
    return states != nullptr && states->updates_from_host() ? kTrackCpuOptimizer : kTrackHostToDevice;
  }
  Status GatherFp32(int index, OptState which, float* out);
  Status PublishWeights(const std::vector<uint8_t>& update, bool cast);
  Status CheckOutsideWindow(const char* call) const;
  Status SaveCheckpointImpl(const std::string& dir, const std::string& tag,
                            const std::string& client_state_json);
  Result<std::string> LoadCheckpointImpl(const std::string& dir, const std::string& tag);

  // offload_optimizer.overlap_step (docs/offload.md, "Overlap with the next forward"; helpers at
  // the end of this file). Step() records step_mark on the compute stream (the gradients are
  // final, the last forward's reads of the model copy are enqueued before it), cuts the step's
  // AdamW runs (or, after an update in backward, its casts of the masters) into chunk-sized
  // pieces, queues the first chunk_buffers of them (ChunkedOptimizerStates::UpdateAfter /
  // CastMasterAfter, ordered after step_mark only) and returns. GatherModule queues the pieces
  // covering its module's parameters plus chunk_buffers more, then makes the compute stream wait
  // on those parameters' chunk events; everything left is queued, and the compute stream waits for
  // all of it, before anything writes the gradients or states again (FlushStep).
  struct StepPiece {
    int64_t begin = 0;             // state elements [begin, begin + n)
    int64_t n = 0;
    int64_t model_off = 0;         // where the new weights (or the cast masters) go in `model`
    const float* grads = nullptr;  // fp32 gradients of `begin`; null: a cast of the masters
    bool queued = false;
  };
  ChunkedOptimizerStates* chunked = nullptr;  // the states, with update_device "gpu"
  bool OverlapStep() const { return chunked != nullptr && config.zero.offload_optimizer.overlap_step; }
  bool step_in_flight = false;    // pieces of the last step the compute stream has not waited for
  bool step_unfinished = false;   // a deferred step the host has not waited for (WaitForOptimizerStep)
  AdamWParams step_h;             // the in-flight step's hyperparameters (lr, t, loss scale, clip)
  std::vector<StepPiece> pieces;  // in state order, disjoint
  size_t pieces_queued = 0;       // every piece before it is queued
  std::unique_ptr<Event> step_mark;
  std::vector<uint8_t> param_waited;  // since the step: the compute stream waited for its chunks
  Status BeginDeferredStep(const AdamWParams& h);
  // Adds [off, off + n) (grads null: a cast) to the step's pieces, cut at chunk_numel.
  Status DeferPieces(int64_t off, int64_t n, const float* grads, int64_t model_off);
  Status EndDeferredStep();
  Status QueuePiece(size_t k);
  void PiecesOf(int index, size_t* first, size_t* last) const;  // [first, last) overlapping its state range
  Status ReachModule(int module);
  // Queues every piece left and makes the compute stream wait for all of them (no host wait).
  Status FlushStep(const char* call);
};

// The aio engine's options from the config's "aio" block (both NVMe swap files use them).
static AioOptions AioOptionsOf(const AioConfig& a) {
  AioOptions o;
  o.block_size = a.block_size;
  o.queue_depth = a.queue_depth;
  o.intra_op_parallelism = a.intra_op_parallelism;
  o.single_submit = a.single_submit;
  o.overlap_events = a.overlap_events;
  o.allow_buffered_fallback = a.allow_buffered_fallback;
  return o;
}

// --- ModuleHandle ---------------------------------------------------------------------------------

ModuleHandle::~ModuleHandle() {
  if (engine_ != nullptr) engine_->ReleaseModule(module_id_).IgnoreError();
}

ModuleHandle::ModuleHandle(ModuleHandle&& o) noexcept
    : engine_(o.engine_), module_id_(o.module_id_) {
  o.engine_ = nullptr;
  o.module_id_ = -1;
}

ModuleHandle& ModuleHandle::operator=(ModuleHandle&& o) noexcept {
  if (this != &o) {
    if (engine_ != nullptr) engine_->ReleaseModule(module_id_).IgnoreError();
    engine_ = o.engine_;
    module_id_ = o.module_id_;
    o.engine_ = nullptr;
    o.module_id_ = -1;
  }
  return *this;
}

Status ModuleHandle::Release() {
  if (engine_ == nullptr) return OkStatus();
  Engine* e = engine_;
  engine_ = nullptr;
  return e->ReleaseModule(module_id_);
}

// --- creation -------------------------------------------------------------------------------------

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Engine::~Engine() {
  if (impl_ == nullptr) return;
  if (impl_->step_in_flight) WaitForOptimizerStep().IgnoreError();
  // Buckets and gathers in flight finish before their buffers go.
  impl_->coordinator.reset();
  impl_->reducer.reset();
  if (impl_->device != nullptr) impl_->device->Synchronize().IgnoreError();
}

Result<std::unique_ptr<Engine>> Engine::Create(const Config& config, Device* device,
                                               Communicator* comm, const EngineEnv& env) {
  if (device == nullptr || comm == nullptr) {
    return InvalidArgumentError("Engine::Create: device and communicator must not be null");
  }
  if (comm->device() != nullptr && comm->device() != device) {
    return InvalidArgumentError("Engine::Create: the communicator's buffers live on device '" +
                                comm->device()->name() + "', not on the engine's device '" +
                                device->name() + "'");
  }
  const ZeroConfig& z = config.zero;
  if (z.stage < 0 || z.stage > 3) {
    return InvalidArgumentError("zero_optimization.stage: expected 0..3, got " + std::to_string(z.stage));
  }
  if (z.offload_param.device != OffloadDevice::kNone && z.stage != 3) {
    return InvalidArgumentError(std::string("zero_optimization.offload_param.device: \"") +
                                (z.offload_param.device == OffloadDevice::kNvme ? "nvme" : "cpu") +
                                "\" needs zero_optimization.stage 3 (only stage 3 partitions the parameters), got "
                                "stage " + std::to_string(z.stage));
  }
  if (z.offload_param.device == OffloadDevice::kNvme && z.offload_param.nvme_path.empty()) {
    return InvalidArgumentError("zero_optimization.offload_param.nvme_path: offload_param.device \"nvme\" needs a "
                                "directory for the parameter swap files (on a local NVMe disk), got none");
  }
  if (z.offload_param.device == OffloadDevice::kNvme && z.offload_param.max_in_cpu < 0) {
    return InvalidArgumentError("zero_optimization.offload_param.max_in_cpu: expected >= 0 elements, got " +
                                std::to_string(z.offload_param.max_in_cpu));
  }
  if (z.offload_param.device != OffloadDevice::kNone &&
      (z.offload_param.buffer_count < 1 || z.offload_param.buffer_size < 1)) {
    return InvalidArgumentError("zero_optimization.offload_param.buffer_count / buffer_size: expected >= 1, got " +
                                std::to_string(z.offload_param.buffer_count) + " / " +
                                std::to_string(z.offload_param.buffer_size));
  }
  if (z.offload_optimizer.device != OffloadDevice::kNone && z.offload_optimizer.ratio != 1.0) {
    return UnimplementedError("zero_optimization.offload_optimizer.ratio: partial offload is not built; expected "
                              "1.0, got " + std::to_string(z.offload_optimizer.ratio));
  }
  if (config.prescale_gradients || config.gradient_predivide_factor != 1.0) {
    return UnimplementedError(
        "prescale_gradients / gradient_predivide_factor: not supported (expected false / 1.0)");
  }
  if (config.has_grad_accum_dtype && config.grad_accum_dtype != DType::kF32) {
    return UnimplementedError(std::string("data_types.grad_accum_dtype: gradients are accumulated in fp32; got ") +
                              DTypeName(config.grad_accum_dtype));
  }
  if (config.has_communication_data_type && z.stage <= 1 &&
      config.communication_data_type != DType::kF32) {
    return UnimplementedError(std::string("communication_data_type: stages 0/1 reduce fp32 accumulators; got ") +
                              DTypeName(config.communication_data_type));
  }
  if (config.gradient_accumulation_steps < 1) {
    return InvalidArgumentError("gradient_accumulation_steps: expected >= 1, got " +
                                std::to_string(config.gradient_accumulation_steps) +
                                " (ParseConfig resolves it from the batch sizes)");
  }
  if (config.gradient_allreduce_op != "mean" && config.gradient_allreduce_op != "sum") {
    return InvalidArgumentError("gradient_allreduce_op: expected \"mean\" or \"sum\", got \"" +
                                config.gradient_allreduce_op + "\"");
  }
  if (z.reduce_bucket_size < 1) {
    return InvalidArgumentError("zero_optimization.reduce_bucket_size: expected >= 1, got " +
                                std::to_string(z.reduce_bucket_size));
  }
  if (z.allgather_bucket_size < 1) {
    return InvalidArgumentError("zero_optimization.allgather_bucket_size: expected >= 1, got " +
                                std::to_string(z.allgather_bucket_size));
  }
  if (z.offload_optimizer.overlap_step) {
    if (comm->world_size() != 1) {
      return UnimplementedError(
          "zero_optimization.offload_optimizer.overlap_step: needs one data-parallel rank, got " +
          std::to_string(comm->world_size()) +
          " (stages 1/2 all-gather the new weights right after the update and stage 3's gathers and "
          "prefetches read the shards, so with several ranks there is nothing left to overlap without "
          "per-chunk gathers; docs/offload.md); set it to false");
    }
    if (z.offload_param.device != OffloadDevice::kNone) {
      return UnimplementedError(
          "zero_optimization.offload_optimizer.overlap_step: not with zero_optimization.offload_param.device "
          "\"" + std::string(OffloadDeviceName(z.offload_param.device)) +
          "\" (the update writes the host shards through a device scratch); set one of them off");
    }
  }
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->env = env;
  impl->device = device;
  impl->comm = comm;
  impl->compute = device->default_stream();
  impl->rank = comm->rank();
  impl->world = comm->world_size();
  impl->stage = z.stage;
  impl->mdt = config.model_dtype();
  impl->comm_dt = config.has_communication_data_type ? config.communication_data_type : impl->mdt;
  impl->managed = config.managed_gradient_accumulation;
  impl->freeze_inactive = config.freeze_inactive_parameters;
  impl->gas = impl->managed ? config.gradient_accumulation_steps : 1;
  impl->contiguous = z.contiguous_gradients;
  impl->op = config.gradient_allreduce_op == "sum" ? ReduceOp::kSum : ReduceOp::kAvg;
  auto scheduler = LrScheduler::Create(config.scheduler, config.optimizer.lr);
  if (!scheduler.ok()) return scheduler.status();
  impl->scheduler.emplace(std::move(scheduler).value());
  auto scaler = CreateLossScaler(config);
  if (!scaler.ok()) return scaler.status();
  impl->scaler = std::move(scaler).value();
  if (config.wall_clock_breakdown || config.zero_trace.enabled) {
    const std::filesystem::path dir = std::filesystem::path(config.zero_trace.path).parent_path();
    std::error_code ec;
    if (config.zero_trace.enabled && !dir.empty() && !std::filesystem::is_directory(dir, ec)) {
      return InvalidArgumentError("zero_trace.path: the directory '" + dir.string() + "' of '" +
                                  config.zero_trace.path + "' does not exist (expected an existing directory)");
    }
    EngineTimelineOptions to{config.wall_clock_breakdown, config.steps_per_print, impl->rank, env.log_sink,
                             config.zero_trace.enabled, config.zero_trace.path, config.zero_trace.first_step,
                             config.zero_trace.last_step};
    ZERO_RETURN_IF_ERROR(impl->timeline.Configure(to, device, impl->compute));
  }
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Result<LossScaler> CreateLossScaler(const Config& config) {
  if (!config.fp16.enabled) return LossScaler();
  if (config.fp16.loss_scale > 0) return LossScaler::Static(config.fp16.loss_scale);
  DynamicLossScaleOptions o;
  o.initial_scale_power = config.fp16.initial_scale_power;
  o.scale_window = config.fp16.loss_scale_window;
  o.hysteresis = config.fp16.hysteresis;
  o.consecutive_hysteresis = config.fp16.consecutive_hysteresis;
  o.min_scale = config.fp16.min_loss_scale;
  return LossScaler::Dynamic(o);
}

// --- set-up ---------------------------------------------------------------------------------------

Result<int> Engine::RegisterParameter(const ParamSpec& spec) {
  Impl& m = *impl_;
  if (m.initialized) {
    return FailedPreconditionError("RegisterParameter('" + spec.name + "') after Initialize()");
  }
  if (spec.name.empty()) return InvalidArgumentError("RegisterParameter: empty parameter name");
  if (m.param_index.count(spec.name) != 0) {
    return InvalidArgumentError("RegisterParameter: parameter name '" + spec.name +
                                "' is already registered (index " +
                                std::to_string(m.param_index[spec.name]) + ")");
  }
  int64_t numel = 1;
  for (int64_t d : spec.shape) {
    if (d < 0) {
      return InvalidArgumentError("RegisterParameter('" + spec.name + "'): negative dimension " +
                                  std::to_string(d));
    }
    if (d != 0 && numel > std::numeric_limits<int64_t>::max() / 4 / d) {
      return InvalidArgumentError("RegisterParameter('" + spec.name + "'): too many elements");
    }
    numel *= d;
  }
  ParamInfo p;
  p.spec = spec;
  p.numel = numel;
  auto it = m.module_index.find(spec.module);
  if (it == m.module_index.end()) {
    it = m.module_index.emplace(spec.module, static_cast<int>(m.module_names.size())).first;
    m.module_names.push_back(spec.module);
    m.module_params.emplace_back();
  }
  p.module = it->second;
  const int index = static_cast<int>(m.params.size());
  m.module_params[p.module].push_back(index);
  m.param_index[spec.name] = index;
  m.params.push_back(std::move(p));
  return index;
}

Status Engine::Initialize(const std::function<void(int index, float* values)>& init) {
  Impl& m = *impl_;
  if (!m.broken.ok()) return m.broken;
  if (m.initialized) return FailedPreconditionError("Initialize() called twice");
  if (!init) return InvalidArgumentError("Initialize: init function is empty");
  Status s = m.InitializeImpl(init);
  if (!s.ok()) {
    // Nothing half-built stays usable.
    m.broken = s;
    return s;
  }
  m.initialized = true;
  return OkStatus();
}

Status Engine::Impl::InitializeImpl(const std::function<void(int index, float* values)>& init) {
  const int n_params = static_cast<int>(params.size());
  std::vector<int64_t> full_sizes;
  std::vector<int64_t> part_sizes;
  int64_t max_padded = 0;
  for (ParamInfo& p : params) {
    p.shard = MakeShardSpec(p.numel, world, rank);
    p.persistent = p.numel <= config.zero.stage3_param_persistence_threshold;
    full_sizes.push_back(p.shard.padded);
    part_sizes.push_back(p.shard.shard);
    max_padded = std::max(max_padded, p.shard.padded);
  }
  const FlatLayout full = MakeFlatLayout(full_sizes, kAlign);
  const FlatLayout part = MakeFlatLayout(part_sizes, kAlign);
  for (int i = 0; i < n_params; ++i) {
    params[i].full_off = full.offset[i];
    params[i].part_off = part.offset[i];
  }
  full_total = full.total;
  part_total = part.total;

  // Storage per stage (docs/zero.md).
  const int64_t opt_total = stage == 0 ? full_total : part_total;
  const OffloadParamConfig& po = config.zero.offload_param;
  if (po.device == OffloadDevice::kCpu) {
    // Parameter offload: every shard must fit one upload (DeepSpeed finds this at run time).
    for (const ParamInfo& p : params) {
      if (p.shard.shard > po.buffer_size) {
        return InvalidArgumentError(
            "Initialize: parameter " + ParamName(p) + " has a shard of " + std::to_string(p.shard.shard) +
            " elements (" + std::to_string(p.numel) + " over " + std::to_string(world) +
            " ranks), more than zero_optimization.offload_param.buffer_size (" + std::to_string(po.buffer_size) +
            "); raise zero_optimization.offload_param.buffer_size to at least " + std::to_string(p.shard.shard));
      }
    }
    HostParamStoreOptions ho;
    ho.slab.pin_memory = po.pin_memory;
    ho.slab.fallback_to_pageable = po.pin_memory_fallback;
    ho.slab.what = "parameter shards (offload_param.device \"cpu\")";
    ho.slab.config_key = "zero_optimization.offload_param";
    ho.scratch_numel = int64_t{1} << 20;  // the device side of the writes: 2-4 MiB, chunked
    auto store = HostParamStore::Create(device, compute, mdt, part_total, ho);
    if (!store.ok()) return store.status().WithContext("Initialize");
    host_params = std::move(store).value();
  } else if (po.device == OffloadDevice::kNvme) {
    // Parameter swap: the shards in <nvme_path>/zero_swap/rank<r>/params.swp, module by module
    // (zero/nvme_param_store.h); a module larger than buffer_size is refused here, naming it.
    std::vector<StoredShard> shards;
    for (const ParamInfo& p : params) shards.push_back({p.spec.name, p.part_off, p.shard.shard, p.module});
    NvmeParamStoreOptions no;
    no.dir = po.nvme_path + "/zero_swap/rank" + std::to_string(rank);
    no.buffer_count = static_cast<int>(std::min<int64_t>(po.buffer_count, 1 << 20));
    no.buffer_numel = po.buffer_size;
    no.cache_numel = po.max_in_cpu;
    no.aio = AioOptionsOf(config.aio);
    no.aio_engine_factory = env.aio_engine_factory;
    no.slab.pin_memory = po.pin_memory;
    no.slab.fallback_to_pageable = po.pin_memory_fallback;
    no.slab.what = "parameter buffers (offload_param.device \"nvme\")";
    no.slab.config_key = "zero_optimization.offload_param";
    no.scratch_numel = int64_t{1} << 20;
    auto store = NvmeParamStore::Create(device, compute, mdt, part_total, std::move(shards), module_names, no);
    if (!store.ok()) return store.status().WithContext("Initialize");
    host_params = std::move(store).value();
  } else {
    ZERO_RETURN_IF_ERROR(Allocate(&model, stage == 3 ? part_total : full_total, mdt, "model parameters"));
  }
  {
    const OffloadOptimizerConfig& oo = config.zero.offload_optimizer;
    Result<std::unique_ptr<OptimizerStates>> st = std::unique_ptr<OptimizerStates>();
    if (oo.device == OffloadDevice::kCpu && oo.update_device == "gpu") {
      // AdamW on the device over the host states, streamed in chunks (docs/offload.md).
      ChunkedOptimizerStatesOptions co;
      co.slab.pin_memory = oo.pin_memory;
      co.slab.fallback_to_pageable = oo.pin_memory_fallback;
      co.slab.what = "optimizer states (offload_optimizer.update_device \"gpu\")";
      co.chunk_numel = oo.chunk_size;
      co.chunk_buffers = static_cast<int>(oo.chunk_buffers);
      auto c = ChunkedOptimizerStates::Create(device, opt_total, compute, co);
      if (!c.ok()) return c.status().WithContext("Initialize");
      chunked = c.value().get();
      st = std::unique_ptr<OptimizerStates>(std::move(c).value());
    } else if (oo.device == OffloadDevice::kCpu) {
      HostOptimizerStatesOptions ho;
      ho.slab.pin_memory = oo.pin_memory;
      ho.slab.fallback_to_pageable = oo.pin_memory_fallback;
      ho.slab.what = "optimizer states (offload_optimizer.device \"cpu\")";
      ho.slab.config_key = "zero_optimization.offload_optimizer";
      ho.cpu_threads = oo.cpu_threads;
      ho.model_dtype = mdt;
      st = CreateHostOptimizerStates(device, opt_total, compute, ho);
    } else if (oo.device == OffloadDevice::kNvme) {
      // One folder per rank under nvme_path; the swap file of a killed run there is refused.
      NvmeOptimizerStatesOptions no;
      no.dir = oo.nvme_path + "/zero_swap/rank" + std::to_string(rank);
      no.group_numel = config.zero.sub_group_size;
      no.buffer_count = static_cast<int>(oo.buffer_count);
      no.aio = AioOptionsOf(config.aio);
      no.aio_engine_factory = env.aio_engine_factory;
      no.slab.pin_memory = oo.pin_memory;
      no.slab.fallback_to_pageable = oo.pin_memory_fallback;
      no.slab.what = "NVMe optimizer state buffers";
      no.slab.config_key = "zero_optimization.offload_optimizer";
      no.cpu_threads = oo.cpu_threads;
      no.model_dtype = mdt;
      // Tiered: as many elements as host_memory_budget holds (12 bytes each) in pinned host
      // memory, the partition's first ones; the rest on NVMe.
      const int64_t on_host = std::min<int64_t>(opt_total, oo.host_memory_budget / 12);
      if (on_host == 0) {
        st = CreateNvmeOptimizerStates(device, opt_total, compute, no);
      } else {
        HostOptimizerStatesOptions ho;
        ho.slab.pin_memory = oo.pin_memory;
        ho.slab.fallback_to_pageable = oo.pin_memory_fallback;
        ho.slab.what = "optimizer states (the host tier of host_memory_budget)";
        ho.slab.config_key = "zero_optimization.offload_optimizer";
        ho.cpu_threads = oo.cpu_threads;
        ho.model_dtype = mdt;
        auto first = CreateHostOptimizerStates(device, on_host, compute, ho);
        if (!first.ok()) return first.status().WithContext("Initialize");
        auto second = CreateNvmeOptimizerStates(device, opt_total - on_host, compute, no);
        if (!second.ok()) return second.status().WithContext("Initialize");
        st = CreateTieredOptimizerStates(std::move(first).value(), std::move(second).value());
      }
    } else {
      st = CreateDeviceOptimizerStates(device, opt_total, compute);
    }
    if (!st.ok()) return st.status().WithContext("Initialize");
    states = std::move(st).value();
  }
  // Zero-filled once here: padding and the gaps between pieces stay zero for good; the pieces
  // themselves are overwritten by each window's first contribution (AddGradient).
  if (stage <= 1) {
    ZERO_RETURN_IF_ERROR(Allocate(&acc, full_total, DType::kF32, "fp32 gradient accumulators"));
  }
  ZERO_RETURN_IF_ERROR(CreateGradPartition());
  {
    const size_t bytes = std::max<size_t>(1, params.size()) * sizeof(double);
    auto b = device->Allocate(bytes);
    if (!b.ok()) return b.status().WithContext("Initialize: allocating norm partials");
    norm_slots = std::move(b).value();
    // UpdateInBackward writes a parameter's partial when it is reported; the others read 0.
    ZERO_RETURN_IF_ERROR(device->Fill(norm_slots.data(), DType::kF32, bytes / 4, 0.0f, compute));
    auto h = device->AllocatePinned(bytes);
    if (!h.ok()) return h.status().WithContext("Initialize: allocating norm partials (host)");
    norm_host = std::move(h).value();
    auto e = device->CreateEvent();
    if (!e.ok()) return e.status().WithContext("Initialize: creating the norm event");
    norm_ready = std::move(e).value();
  }

  // Initial values: full fp32 on the host. Where this rank's master holds the whole parameter
  // (stage 0, or one rank: the partition layout is then the full layout) they are uploaded
  // straight into it (its padding is zero from the allocation) and the model copy is cast from it;
  // otherwise through one device staging buffer, from which this rank's shard is taken.
  const bool direct_upload = stage == 0 || world == 1;
  DeviceBuffer staging;
  if (!direct_upload) {
    ZERO_RETURN_IF_ERROR(Allocate(&staging, std::max<int64_t>(max_padded, 1), DType::kF32, "initial values"));
  }
  std::vector<float> values;
  std::vector<double> sums(world > 1 ? 2 * params.size() : 0, 0.0);
  for (int i = 0; i < n_params; ++i) {
    const ParamInfo& p = params[i];
    values.assign(static_cast<size_t>(p.numel), 0.0f);
    init(i, values.data());
    if (world > 1) {  // one rank has nothing to compare with
      sums[i] = Checksum(values.data(), p.numel);
      sums[params.size() + i] = -sums[i];
    }
    if (p.numel == 0) continue;
    const size_t shard = static_cast<size_t>(p.shard.shard);
    if (direct_upload) {
      const int64_t off = stage == 0 ? p.full_off : p.part_off;
      ZERO_RETURN_IF_ERROR(states->Write(OptState::kMaster, off, p.numel, values.data()));
      ZERO_RETURN_IF_ERROR(ModelFromMasters(off, p.shard.padded, stage == 3 ? p.part_off : p.full_off));
    } else {
      float* st = staging.as<float>();
      ZERO_RETURN_IF_ERROR(device->Copy(st, values.data(), static_cast<size_t>(p.numel) * 4,
                                        CopyKind::kHostToDevice, compute));
      ZERO_RETURN_IF_ERROR(device->Fill(st + p.numel, DType::kF32,
                                        static_cast<size_t>(p.shard.padded - p.numel), 0.0f, compute));
      ZERO_RETURN_IF_ERROR(states->CopyFromDevice(OptState::kMaster, p.part_off, p.shard.shard, st + p.shard.begin,
                                                  compute));
      if (stage <= 2) {
        ZERO_RETURN_IF_ERROR(device->Cast(st, DType::kF32, model_ptr(p.full_off), mdt,
                                          static_cast<size_t>(p.shard.padded), compute));
      } else if (host_params != nullptr) {
        ZERO_RETURN_IF_ERROR(host_params->Write(p.part_off, p.shard.shard, [&](void* dst, int64_t at, int64_t len) {
          return device->Cast(st + p.shard.begin + at, DType::kF32, dst, mdt, static_cast<size_t>(len), compute);
        }));
      } else {
        ZERO_RETURN_IF_ERROR(device->Cast(st + p.shard.begin, DType::kF32, model_ptr(p.part_off), mdt,
                                          shard, compute));
      }
    }
    // The host vector is refilled for the next parameter.
    ZERO_RETURN_IF_ERROR(device->SynchronizeStream(compute));
  }
  if (world > 1 && !params.empty()) {
    ZERO_RETURN_IF_ERROR(comm->AllReduceHost(sums.data(), sums.size(), ReduceOp::kMax)
                             .WithContext("Initialize: comparing initial values across ranks"));
    for (int i = 0; i < n_params; ++i) {
      if (sums[i] != -sums[params.size() + i]) {
        return InvalidArgumentError(
            "Initialize: parameter " + ParamName(params[i]) + " (index " + std::to_string(i) +
            ") has different initial values on different ranks; init(index, values) must give "
            "every rank the same values");
      }
    }
  }

  // Gradient machinery.
  // The gradient-buffer pool keeps up to two of the largest parameter's buffers and, at stages
  // 2/3 (where a bucket holds its gradients until it is packed), one bucket's worth: a model of
  // repeated blocks then reuses the same buffers every micro step and never frees (a free can
  // wait on the host for the compute stream).
  // Without contiguous_gradients (stages 2/3) a buffer is held until its own reduction completes:
  // up to max_in_flight of them besides the ones the user holds.
  const int max_in_flight = contiguous ? 2 : 4;
  size_t max_param_bytes = 0;
  size_t total_grad_bytes = 0;
  for (const ParamInfo& p : params) {
    const size_t bytes = static_cast<size_t>(GradBufferNumel(p)) * SizeOf(mdt);
    max_param_bytes = std::max(max_param_bytes, bytes);
    total_grad_bytes += bytes;
  }
  const size_t bucket_bytes = std::min(
      total_grad_bytes, static_cast<size_t>(config.zero.reduce_bucket_size) * SizeOf(mdt));
  const size_t pool_keep = PerParamReduction() && !DirectToPartition()
                               ? static_cast<size_t>(max_in_flight + 2) * max_param_bytes
                               : 2 * max_param_bytes + (stage >= 2 && !DirectToPartition() ? bucket_bytes : 0);
  grad_pool = std::make_unique<BufferPool>(device, pool_keep);
  grad_out.resize(params.size());
  grad_held.resize(params.size());
  handed_out.assign(params.size(), 0);
  reported.assign(params.size(), 0);
  active.assign(params.size(), 0);
  reduce_queued.assign(params.size(), 0);
  acc_written.assign(params.size(), 0);
  part_written.assign(params.size(), 0);
  updated.assign(params.size(), 0);

  GradientReducerOptions ro;
  ro.op = op;
  ro.bucket_numel = config.zero.reduce_bucket_size;
  ro.overlap = config.zero.overlap_comm;
  ro.contiguous = contiguous;
  ro.max_in_flight = max_in_flight;
  // Stage 0 all-reduces anyway; stages 1-3 reduce-scatter unless reduce_scatter is false.
  ro.scatter = config.zero.reduce_scatter;
  GradientReducer::Consumer consumer;
  if (stage == 0) {
    ro.kind = BucketKind::kFull;
    ro.comm_dtype = DType::kF32;
    ro.name = "stage-0 gradient";
    consumer = [this](int i, const void* reduced) -> Status {
      float* dst = f32(acc, params[i].full_off);
      if (reduced == dst) return OkStatus();
      return device->Copy(dst, reduced, static_cast<size_t>(params[i].numel) * 4,
                          CopyKind::kDeviceToDevice, compute);
    };
  } else if (stage == 1) {
    ro.kind = BucketKind::kShards;
    ro.comm_dtype = DType::kF32;
    ro.name = "stage-1 gradient";
    consumer = [this](int i, const void* reduced) -> Status {
      // (A no-op where it was reduce-scattered straight into the partition.)
      return grad->Store(i, static_cast<const float*>(reduced));
    };
  } else {
    ro.kind = BucketKind::kShards;
    ro.comm_dtype = comm_dt;
    ro.name = stage == 2 ? "stage-2 gradient" : "stage-3 gradient";
    consumer = [this](int i, const void* reduced) -> Status {
      return AddToPartition(i, reduced, comm_dt);
    };
  }
  reducer = std::make_unique<GradientReducer>(device, comm, compute, ro, std::move(consumer));
  if (world > 1 && stage != 3) {
    // Every rank reduces the same buckets whatever it reports, in whatever order: the layout is
    // fixed by parameter index, last registered first (the order a backward usually produces), and
    // a parameter a rank did not report contributes zeros (grad_reducer.h). Not at stage 3: its
    // gathers share the communicator, and a bucket that completes at a different point among them
    // on one rank would make the ranks' sequences of collectives differ; there the reduction
    // schedule launches each module's reductions at a gather every rank makes (below).
    std::vector<BucketItem> order;
    for (int i = n_params - 1; i >= 0; --i) {
      if (params[i].numel > 0) order.push_back(BucketItem{i, params[i].numel});
    }
    reducer->SetPlan(order);
  }

  if (stage == 1 || stage == 2) {
    BucketedAllGatherOptions go;
    go.dtype = mdt;
    go.bucket_numel = config.zero.allgather_bucket_size;
    go.max_in_flight = 2;
    // CPU: every event is complete when recorded, so bucket buffers go back at once. CUDA: keep
    // them for stream-ordered reuse without host waits (all of one run have the same size).
    go.pool_free_bytes = device->kind() == DeviceKind::kCpu ? 0 : ~size_t{0};
    weight_gather = std::make_unique<BucketedAllGather>(device, comm, compute, go);
  }

  if (stage == 3) {
    std::vector<CoordinatedParam> cps;
    std::vector<int64_t> module_bytes(module_names.size(), 0);
    for (const ParamInfo& p : params) {
      CoordinatedParam c;
      c.name = p.spec.name;
      c.numel = p.numel;
      c.padded = p.shard.padded;
      c.shard = p.shard.shard;
      c.shard_data = shard_ptr(p.part_off);
      c.module = p.module;
      c.persistent = p.persistent;
      cps.push_back(std::move(c));
      if (!p.persistent) module_bytes[p.module] += p.shard.padded * static_cast<int64_t>(SizeOf(mdt));
    }
    ParamCoordinatorOptions co;
    co.prefetch_bucket_numel = config.zero.stage3_prefetch_bucket_size;
    co.max_live_numel = config.zero.stage3_max_live_parameters;
    co.max_reuse_distance = config.zero.stage3_max_reuse_distance;
    // CPU: every event is complete when recorded, so released memory goes back at once. CUDA:
    // keep about one module's worth for stream-ordered reuse without host waits.
    int64_t largest_module = 0;
    for (int64_t b : module_bytes) largest_module = std::max(largest_module, b);
    co.pool_free_bytes = device->kind() == DeviceKind::kCpu ? 0 : static_cast<size_t>(largest_module);
    // Staging buffers of coalesced gathers: CPU frees each right after its unpack; CUDA keeps them
    // for stream-ordered reuse (no more than were in flight at once, plus one) to avoid host waits.
    co.staging_free_bytes = device->kind() == DeviceKind::kCpu ? 0 : ~size_t{0};
    if (host_params != nullptr) {
      // offload_param "cpu": the shards are uploaded for each gather, at most buffer_count at once.
      co.shard_source = ShardSource::kHost;
      co.max_uploads_in_flight = static_cast<int>(std::min<int64_t>(config.zero.offload_param.buffer_count, 1 << 20));
      // offload_param "nvme": module by module from the swap file, read ahead along the trace.
      co.module_store = host_params->module_store();
      co.max_store_read_ahead = co.max_uploads_in_flight;
    }
    coordinator = std::make_unique<ParamCoordinator>(device, comm, compute, mdt, std::move(cps),
                                                     module_names, co);
    if (world > 1) schedule = std::make_unique<ReductionSchedule>(comm, static_cast<int>(module_names.size()));
  }
  // zero_trace: the components report the work they enqueue on their own streams (docs/timeline.md).
  if (StreamObserver* o = timeline.observer()) {
    if (reducer != nullptr) reducer->set_observer(o);
    if (coordinator != nullptr) coordinator->set_observer(o);
    if (states != nullptr) states->set_observer(o);
    if (grad != nullptr) grad->set_observer(o);
    if (host_params != nullptr) host_params->set_observer(o);
  }
  ZERO_RETURN_IF_ERROR(device->SynchronizeStream(compute));
  return OkStatus();
}

// --- forward --------------------------------------------------------------------------------------

Result<ModuleHandle> Engine::GatherModule(const std::string& module) {
  Impl& m = *impl_;
  ZERO_RETURN_IF_ERROR(m.CheckUsable("GatherModule"));
  auto it = m.module_index.find(module);
  if (it == m.module_index.end()) {
    std::string known;
    for (size_t k = 0; k < m.module_names.size() && k < 8; ++k) {
      known += (k ? ", '" : "'") + m.module_names[k] + "'";
    }
    if (m.module_names.size() > 8) known += ", ...";
    return NotFoundError("GatherModule: unknown module '" + module + "' (registered: " + known + ")");
  }
  ZERO_RETURN_IF_ERROR(m.timeline.OnGather());
  if (m.step_in_flight) {
    ZERO_RETURN_IF_ERROR(m.Guard(m.ReachModule(it->second).WithContext("GatherModule('" + module + "')")));
  }
  if (m.stage == 3) {
    if (m.schedule != nullptr) {
      // The reductions of the modules every rank now agrees are complete go first, at the same
      // point among the gathers on every rank.
      auto done = m.schedule->AtGather(it->second);
      Status s = done.ok() ? m.ReduceModules(*done) : done.status();
      ZERO_RETURN_IF_ERROR(m.Guard(s.WithContext("GatherModule('" + module + "'): reducing gradients")));
    }
    ZERO_RETURN_IF_ERROR(m.Guard(m.timeline.Timed(EngineTimeline::Kind::kCommunication, kTrackCommunication,
                                                  "gather module", [&] { return m.coordinator->Acquire(it->second); })
                                     .WithContext("GatherModule('" + module + "')")));
  }
  return ModuleHandle(this, it->second);
}

Status Engine::ReleaseModule(int module_id) {
  Impl& m = *impl_;
  if (m.stage != 3 || m.coordinator == nullptr) return OkStatus();
  if (!m.broken.ok()) return m.broken;
  ZERO_RETURN_IF_ERROR(m.coordinator->Release(module_id));
  if (m.schedule != nullptr) m.schedule->Released(module_id, m.coordinator->ref_count(module_id));
  return OkStatus();
}

Result<const void*> Engine::param(int index) const {
  const Impl& m = *impl_;
  ZERO_RETURN_IF_ERROR(m.CheckUsable("param"));
  ZERO_RETURN_IF_ERROR(m.CheckIndex("param", index));
  if (m.step_in_flight && !m.param_waited[index]) {
    return FailedPreconditionError(
        "param(" + std::to_string(index) + "): parameter " + ParamName(m.params[index]) +
        " may still be written by the overlapped optimizer step (zero_optimization.offload_optimizer."
        "overlap_step): reach it through GatherModule(\"" + m.params[index].spec.module +
        "\") first, at every stage, or call WaitForOptimizerStep()");
  }
  if (m.stage == 3) return m.coordinator->Full(index);
  return static_cast<const void*>(m.model_ptr(m.params[index].full_off));
}

// --- backward -------------------------------------------------------------------------------------

Result<void*> Engine::grad_buffer(int index) {
  Impl& m = *impl_;
  ZERO_RETURN_IF_ERROR(m.CheckUsable("grad_buffer"));
  ZERO_RETURN_IF_ERROR(m.CheckIndex("grad_buffer", index));
  ZERO_RETURN_IF_ERROR(m.FlushStep("grad_buffer"));
  ZERO_RETURN_IF_ERROR(m.timeline.OnGradient());
  const ParamInfo& p = m.params[index];
  if (m.reported[index]) {
    return InvalidArgumentError("grad_buffer(" + std::to_string(index) + "): the gradient of parameter " +
                                ParamName(p) + " was already reported in this backward");
  }
  if (m.pending_step) {
    return FailedPreconditionError("grad_buffer(" + std::to_string(index) +
                                   "): the accumulation boundary was reached; call Step() first");
  }
  if (!m.handed_out[index]) {
    if (p.numel > 0) {
      auto b = m.grad_pool->Acquire(static_cast<size_t>(m.GradBufferNumel(p)) * SizeOf(m.mdt),
                                    "grad_buffer: allocating a gradient buffer");
      if (!b.ok()) return b.status().WithContext("parameter " + ParamName(p));
      m.grad_out[index] = std::move(b).value();
      if (m.PerParamReduction() && p.shard.padded > p.numel) {
        // The padding of the shard layout is zero (a pooled buffer may come from another
        // parameter of the same size).
        Status s = m.device->Fill(ElementPtr(m.grad_out[index].data(), m.mdt, p.numel), m.mdt,
                                  static_cast<size_t>(p.shard.padded - p.numel), 0.0f, m.compute);
        if (!s.ok()) return m.Guard(s.WithContext("grad_buffer(" + ParamName(p) + ")"));
      }
    }
    m.handed_out[index] = 1;
  }
  return m.grad_out[index].data();
}

Status Engine::GradReady(int index) {
  Impl& m = *impl_;
  ZERO_RETURN_IF_ERROR(m.CheckUsable("GradReady"));
  ZERO_RETURN_IF_ERROR(m.CheckIndex("GradReady", index));
  ZERO_RETURN_IF_ERROR(m.FlushStep("GradReady"));
  ZERO_RETURN_IF_ERROR(m.timeline.OnGradient());
  const ParamInfo& p = m.params[index];
  if (m.reported[index]) {
    return InvalidArgumentError("GradReady(" + std::to_string(index) + "): the gradient of parameter " +
                                ParamName(p) + " was reported twice in one backward");
  }
  if (!m.handed_out[index]) {
    return FailedPreconditionError("GradReady(" + std::to_string(index) + ") for parameter " + ParamName(p) +
                                   " without grad_buffer(" + std::to_string(index) + ") first");
  }
  return m.Guard(m.GradReadyImpl(index).WithContext("GradReady(" + ParamName(p) + ")"));
}

Status Engine::Impl::GradReadyImpl(int index) {
  const ParamInfo& p = params[index];
  reported[index] = 1;
  active[index] = 1;
  ++reported_count;
  handed_out[index] = 0;
  DeviceBuffer buf = std::move(grad_out[index]);
  if (p.numel == 0) return OkStatus();
  if (stage <= 1) {
    ZERO_RETURN_IF_ERROR(AddGradient(f32(acc, p.full_off), buf.data(), mdt, p.numel, &acc_written[index]));
    ZERO_RETURN_IF_ERROR(grad_pool->Release(std::move(buf), compute));
    // The boundary micro step: this accumulator is final, so its reduction can start now.
    if (managed && window_micro + 1 == gas && !no_sync) ZERO_RETURN_IF_ERROR(QueueBoundaryReduction(index));
    return OkStatus();
  }
  if (UpdateInBackward()) {
    ZERO_RETURN_IF_ERROR(UpdateFromGradient(index, buf.data()));
    return grad_pool->Release(std::move(buf), compute);
  }
  if (DirectToPartition()) {
    // One rank: straight into the fp32 partition (shard = numel), no bucket, no conversion.
    ZERO_RETURN_IF_ERROR(AddToPartition(index, buf.data(), mdt));
    return grad_pool->Release(std::move(buf), compute);
  }
  if (schedule != nullptr) {
    // Held until the schedule says every rank reduces this module (ReduceModules).
    if (!schedule->Reported(p.module)) {
      // Too late: the ranks already reduced this module. Backward() fails on every rank.
      if (late_reports.size() < 8) late_reports.push_back(ParamName(p));
      return grad_pool->Release(std::move(buf), compute);
    }
    grad_held[index] = std::move(buf);
    return OkStatus();
  }
  grad_held[index] = std::move(buf);
  void* data = grad_held[index].data();
  // Without contiguous_gradients the buffer is reduced in place; its tail receives the shard.
  void* recv = GradRecvArea() ? ElementPtr(data, mdt, p.shard.padded) : nullptr;
  return reducer->Add(index, data, mdt, p.numel, [this, index]() {
    return grad_pool->Release(std::move(grad_held[index]), compute);
  }, recv);
}

// Stage 3 with several ranks: every parameter of `modules` (in that order, each module's last
// registered first) goes to the reducer, the ones this rank did not report as zeros, so every rank
// reduces the same layout at the same point.
Status Engine::Impl::ReduceModules(const std::vector<int>& modules) {
  for (int mod : modules) {
    const std::vector<int>& ps = module_params[mod];
    for (auto it = ps.rbegin(); it != ps.rend(); ++it) {
      const int index = *it;
      const ParamInfo& p = params[index];
      if (p.numel == 0) continue;
      if (grad_held[index].empty()) {
        // Not reported here: this rank contributes zeros (padding included).
        auto b = grad_pool->Acquire(static_cast<size_t>(GradBufferNumel(p)) * SizeOf(mdt),
                                    "allocating a zero gradient buffer");
        if (!b.ok()) return b.status().WithContext("parameter " + ParamName(p));
        grad_held[index] = std::move(b).value();
        const int64_t zeros = PerParamReduction() ? p.shard.padded : p.numel;
        ZERO_RETURN_IF_ERROR(device->Fill(grad_held[index].data(), mdt, static_cast<size_t>(zeros), 0.0f, compute));
      }
      void* data = grad_held[index].data();
      void* recv = GradRecvArea() ? ElementPtr(data, mdt, p.shard.padded) : nullptr;
      ZERO_RETURN_IF_ERROR(reducer->Add(index, data, mdt, p.numel, [this, index]() {
        return grad_pool->Release(std::move(grad_held[index]), compute);
      }, recv));
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
Status Engine::Impl::AddGradient(float* dst, const void* src, DType src_t, int64_t n, uint8_t* written) {
  const bool first = *written == 0;
  *written = 1;
  if (n == 0) return OkStatus();
  if (first) return device->AccumulateFirst(dst, src, src_t, static_cast<size_t>(n), 1.0f, compute);
  return device->Accumulate(dst, src, src_t, static_cast<size_t>(n), 1.0f, compute);
}

// Stages 1-3: a (reduced, or with one rank the model-dtype) gradient of parameter `index` into its
// piece of the partition, first contribution of the window or not as AddGradient. `last`: the
// managed boundary micro step, after which the piece gets nothing more in this window.
Status Engine::Impl::AddToPartition(int index, const void* src, DType src_t) {
  const bool first = part_written[index] == 0;
  part_written[index] = 1;
  return grad->Add(index, src, src_t, first, /*last=*/managed && window_micro + 1 == gas);
}

// The fp32 gradients the boundary reads, one piece per parameter (stage 0: its full accumulator;
// otherwise its shard in the partition layout). Zero from creation: padding and gaps stay zero.
Status Engine::Impl::CreateGradPartition() {
  std::vector<GradPiece> pieces;
  pieces.reserve(params.size());
  for (const ParamInfo& p : params) {
    pieces.push_back(stage == 0 ? GradPiece{p.full_off, p.numel} : GradPiece{p.part_off, p.shard.shard});
  }
  if (AccIsGrad()) {
    grad = CreateDeviceGradPartitionView(device, compute, acc.as<float>(), std::move(pieces));
    return OkStatus();
  }
  if (UpdateInBackward()) return OkStatus();  // no partition: engine.h, "Update in backward"
  // Optimizer offload with the CPU AdamW (host states that update from host gradients): the
  // partition lives in pinned host memory, the reduced pieces stream there during backward
  // (offload_grad_accumulation "cpu"), or are summed on the device and sent once per step ("gpu").
  // Otherwise (no offload, update_device "gpu", NVMe states) on the device.
  Result<std::unique_ptr<GradPartition>> g = std::unique_ptr<GradPartition>();
  if (states->updates_from_host() && states->host_thread_pool() != nullptr) {
    const OffloadOptimizerConfig& oo = config.zero.offload_optimizer;
    HostGradPartitionOptions ho;
    ho.slab.pin_memory = oo.pin_memory;
    ho.slab.fallback_to_pageable = oo.pin_memory_fallback;
    ho.slab.what = "fp32 gradient partition (offload_optimizer.device \"cpu\")";
    ho.slab.config_key = "zero_optimization.offload_optimizer";
    ho.pool = states->host_thread_pool();
    g = config.zero.offload_grad_accumulation == "gpu"
            ? CreateGpuAccumulatedGradPartition(device, compute, part_total, std::move(pieces), ho)
            : CreateHostGradPartition(device, compute, part_total, std::move(pieces), ho);
  } else {
    g = CreateDeviceGradPartition(device, compute, part_total, std::move(pieces));
  }
  if (!g.ok()) return g.status().WithContext("Initialize");
  grad = std::move(g).value();
  return OkStatus();
}

// The AdamW hyperparameters of the next applied step (t = adam_step + 1).
AdamWParams Engine::Impl::StepParams(double loss_scale, double clip_coef) const {
  AdamWParams h;
  const OptimizerConfig& oc = config.optimizer;
  const int64_t t = counters.adam_step + 1;
  h.lr = static_cast<float>(scheduler->LrAt(counters.adam_step));
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

// UpdateInBackward: parameter `index`'s norm partial (from the model-dtype gradient at `src`, the
// same squares as of its fp32 widening) and its AdamW over the masters and moments from the
// gradient widened as the partition would hold it (0.0f + g; zeros when `src` is null: a parameter
// without a gradient in the window), queued through OptimizerStates::UpdateFromGradient (device
// states: on the compute stream; host states: on their worker, overlapped with backward). No
// model copy: Step() publishes it.
Status Engine::Impl::UpdateFromGradient(int index, const void* src) {
  const ParamInfo& p = params[index];
  updated[index] = 1;
  if (p.numel == 0) return OkStatus();
  if (src != nullptr) {
    ZERO_RETURN_IF_ERROR(device->SumOfSquares(src, mdt, static_cast<size_t>(p.numel),
                                              norm_slots.as<double>() + index, compute));
  }
  // One rank: the partition piece is the whole (unpadded) parameter.
  return states->UpdateFromGradient(p.part_off, p.shard.shard, src, mdt, StepParams(1.0, 1.0), compute);
}

Status Engine::Impl::QueueBoundaryReduction(int index) {
  if (reduce_queued[index]) return OkStatus();
  reduce_queued[index] = 1;
  const ParamInfo& p = params[index];
  if (p.numel == 0) return OkStatus();
  // One rank: the mean over one rank is the sum itself (bitwise; the reducer issued no collective
  // there either), and stage 1 reads the accumulators as its partition (AccIsGrad): no reduction,
  // no bucket copies.
  if (world == 1) return OkStatus();
  if (!acc_written[index]) {
    // No local gradient in this window: this rank contributes zeros.
    ZERO_RETURN_IF_ERROR(device->Fill(f32(acc, p.full_off), DType::kF32, static_cast<size_t>(p.numel), 0.0f,
                                      compute));
    acc_written[index] = 1;
  }
  if (stage == 1) part_written[index] = 1;  // the reduction writes the whole shard
  // Without contiguous_gradients stage 0 all-reduces the accumulator in place and stage 1
  // reduce-scatters it (its full-layout piece is padded, padding zero) straight into the gradient
  // partition.
  return reducer->Add(index, f32(acc, p.full_off), DType::kF32, p.numel, nullptr,
                      stage == 1 ? grad->device_piece(index) : nullptr);
}

Status Engine::Impl::ReduceAccumulators(const std::vector<uint8_t>& which) {
  for (int i = 0; i < static_cast<int>(params.size()); ++i) {
    if (which[i]) ZERO_RETURN_IF_ERROR(QueueBoundaryReduction(i));
  }
  ZERO_RETURN_IF_ERROR(reducer->Drain());
  reduced = true;
  return OkStatus();
}

Status Engine::Backward() {
  Impl& m = *impl_;
  ZERO_RETURN_IF_ERROR(m.CheckUsable("Backward"));
  if (m.pending_step) {
    return FailedPreconditionError(
        "Backward() after the gradient accumulation boundary: call Step() before the next backward");
  }
  ZERO_RETURN_IF_ERROR(m.Guard(m.BackwardImpl().WithContext("Backward")));
  return m.timeline.OnBackwardEnd();
}

Status Engine::Impl::BackwardImpl() {
  // Buffers handed out but never reported carry no gradient.
  for (int i = 0; i < static_cast<int>(params.size()); ++i) {
    if (handed_out[i]) {
      handed_out[i] = 0;
      ZERO_RETURN_IF_ERROR(grad_pool->Release(std::move(grad_out[i]), compute));
    }
  }
  const bool boundary = managed && window_micro + 1 == gas;
  if (stage <= 1) {
    if (boundary && !no_sync) {
      // Managed: every parameter is updated; the ones not reported now have final sums too.
      ZERO_RETURN_IF_ERROR(ReduceAccumulators(std::vector<uint8_t>(params.size(), 1)));
    }
  } else {
    if (schedule != nullptr) {
      auto rest = schedule->AtBackward();
      if (!rest.ok()) {
        Status s = rest.status();
        if (!late_reports.empty()) {
          std::string names;
          for (const std::string& n : late_reports) names += (names.empty() ? "" : ", ") + n;
          s = s.WithContext("this rank reported " + names + " after their modules were reduced");
        }
        return s;
      }
      ZERO_RETURN_IF_ERROR(ReduceModules(*rest));
    }
    ZERO_RETURN_IF_ERROR(timeline.Timed(EngineTimeline::Kind::kCommunication, kTrackCommunication,
                                        "reduce gradients", [&] { return reducer->Drain(); }));
  }
  // Every contribution of the window is in: pieces whose last one came in an earlier micro step
  // are completed now (offload_grad_accumulation "gpu": sent to the host).
  if (boundary && grad != nullptr) ZERO_RETURN_IF_ERROR(TimedOffload(kTrackDeviceToHost, "gradients to the partition", [&] { return grad->Finish(); }));
  if (coordinator != nullptr) ZERO_RETURN_IF_ERROR(coordinator->EndMicroStep());
  std::fill(reported.begin(), reported.end(), 0);
  reported_count = 0;
  ++counters.micro_steps;
  ++window_micro;
  ++backwards_since_step;
  if (boundary) {
    pending_step = true;
    window_micro = 0;
  }
  return comm->CheckHealth();
}

// --- step -----------------------------------------------------------------------------------------

bool Engine::is_gradient_accumulation_boundary() const {
  const Impl& m = *impl_;
  if (!m.managed) return true;
  return m.window_micro + 1 == m.gas;
}

Status Engine::Step() {
  Impl& m = *impl_;
  ZERO_RETURN_IF_ERROR(m.CheckUsable("Step"));
  ZERO_RETURN_IF_ERROR(m.FlushStep("Step"));  // the previous step's pieces: queued, stream-ordered
  if (m.reported_count > 0) {
    return FailedPreconditionError("Step() with gradients reported since the last Backward(); call Backward() first");
  }
  if (m.managed && !m.pending_step) {
    m.step_applied = false;
    return OkStatus();
  }
  if (m.no_sync) {
    return FailedPreconditionError(
        "Step() at a gradient accumulation boundary while no_sync is on: turn no_sync off "
        "(SetNoSync(false)) before the boundary step");
  }
  m.pending_step = false;
  ZERO_RETURN_IF_ERROR(m.timeline.BeginStep());
  ZERO_RETURN_IF_ERROR(m.Guard(m.BoundaryImpl().WithContext("Step (global step " +
                                                            std::to_string(m.counters.global_steps) + ")")));
  return m.timeline.EndStep(m.counters.global_steps);
}

Status Engine::Impl::UnionActive() {
  if (world == 1) return OkStatus();
  std::vector<double> flags(active.begin(), active.end());
  ZERO_RETURN_IF_ERROR(comm->AllReduceHost(flags.data(), flags.size(), ReduceOp::kMax)
                           .WithContext("agreeing on the parameters with gradients"));
  for (size_t i = 0; i < active.size(); ++i) active[i] = flags[i] != 0.0 ? 1 : 0;
  return OkStatus();
}

// Starts a new window. No fill: the pieces are marked unwritten, and the window's first
// contribution overwrites each (AddGradient).
Status Engine::Impl::ZeroAccumulators() {
  if (UpdateInBackward() && !params.empty()) {
    // Stream-ordered after the boundary's copy of the partials to the host.
    ZERO_RETURN_IF_ERROR(device->Fill(norm_slots.data(), DType::kF32, 2 * params.size(), 0.0f, compute));
  }
  if (grad != nullptr) grad->NewWindow();
  std::fill(updated.begin(), updated.end(), 0);
  std::fill(acc_written.begin(), acc_written.end(), 0);
  std::fill(part_written.begin(), part_written.end(), 0);
  std::fill(active.begin(), active.end(), 0);
  std::fill(reduce_queued.begin(), reduce_queued.end(), 0);
  reduced = false;
  backwards_since_step = 0;
  return OkStatus();
}

// Sums the per-parameter norm partials copied to the host (after waiting for that copy) in
// parameter order; stages 1-3 with several ranks add the ranks' sums (AllReduceHost, rank order).
Status Engine::Impl::ReadNorm(double* total) {
  return timeline.Timed(EngineTimeline::Kind::kCommunication, kTrackCommunication, "gradient norm",
                        [&] { return ReadNormImpl(total); });
}

Status Engine::Impl::ReadNormImpl(double* total) {
  ZERO_RETURN_IF_ERROR(device->SynchronizeEvent(norm_ready.get()));
  // A collective the watchdog aborted lets the stream pass with undefined data (comm/watchdog.h).
  ZERO_RETURN_IF_ERROR(comm->CheckHealth());
  const double* host = norm_host.as<double>();
  double sum = 0.0;
  for (size_t i = 0; i < params.size(); ++i) sum += host[i];
  if (stage >= 1 && world > 1) {
    ZERO_RETURN_IF_ERROR(comm->AllReduceHost(&sum, 1, ReduceOp::kSum).WithContext("gradient norm"));
  }
  *total = sum;
  return OkStatus();
}

Status Engine::Impl::BoundaryImpl() {
  const int n_params = static_cast<int>(params.size());
  // Every parameter is updated (one without a gradient in the window with a zero gradient, as
  // DeepSpeed does), in managed and unmanaged mode alike; with freeze_inactive_parameters only those
  // that received a gradient on some rank in the window.
  std::vector<uint8_t> update(params.size(), 1);
  if (freeze_inactive) {
    ZERO_RETURN_IF_ERROR(UnionActive());
    update = active;
  }
  if (stage <= 1 && !reduced) ZERO_RETURN_IF_ERROR(ReduceAccumulators(update));

  // The fp32 gradients (`grad`): stage 0 (and stage 1 with one rank) the accumulators, full
  // layout; otherwise this rank's shards in the gradient partition (padding zero).
  const std::vector<uint8_t>& written = AccIsGrad() ? acc_written : part_written;

  // Global norm: per parameter, the sum of squares of its fp32 gradient in double; summed on the
  // host in parameter order; partitioned stages all-reduce the partial sums (rank order). A
  // gradient that got no contribution in the window is zero: its partial is 0.0 (what
  // SumOfSquares of zeros gives), and it is zero-filled only if AdamW is to read it.
  double* slots = norm_slots.as<double>();
  const bool in_backward = UpdateInBackward();
  if (n_params > 0 && !in_backward) {
    ZERO_RETURN_IF_ERROR(device->Fill(slots, DType::kF32, 2 * static_cast<size_t>(n_params), 0.0f, compute));
  }
  // Update in backward: the partials were written at GradReady (0 for the others).
  if (!in_backward) {
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
    ZERO_RETURN_IF_ERROR(grad->SumsOfSquares(norm_of, slots));
  }
  if (n_params > 0) {
    ZERO_RETURN_IF_ERROR(device->Copy(norm_host.data(), slots, sizeof(double) * n_params,
                                      CopyKind::kDeviceToHost, compute));
  }
  ZERO_RETURN_IF_ERROR(device->RecordEvent(norm_ready.get(), compute));

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
    ZERO_RETURN_IF_ERROR(ReadNorm(&total));
    // A sum of squares (in double) of fp32 values is finite exactly when every value is finite, so
    // this is the overflow check of every rank's gradients.
    const bool overflow = !std::isfinite(total);
    if (fp16 && overflow) {
      grad_norm = std::numeric_limits<double>::infinity();
      step_applied = false;
      ++counters.global_steps;
      ++counters.skipped_steps;
      scaler.Update(true);
      ZERO_RETURN_IF_ERROR(ZeroAccumulators());
      if (scaler.overflow_at_min_scale()) {
        return FailedPreconditionError(
            "fp16 gradients overflowed with the loss scale already at fp16.min_loss_scale (" +
            std::to_string(config.fp16.min_loss_scale) + "); cannot decrease it further");
      }
      return OkStatus();
    }
    if (clip > 0.0) {
      const double c = (std::sqrt(total) / s + 1e-6) / clip;
      if (c > 1.0) clip_coef = c;
    }
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
  const bool overlap = OverlapStep();
  if (overlap) ZERO_RETURN_IF_ERROR(BeginDeferredStep(h));
  if (in_backward) {
    // The masters of the reported parameters were updated in backward; the others (no gradient in
    // the window) get their zero-gradient update now. Then the model copy, cast from the masters
    // (one rank: the full and the partition layouts coincide), in runs of consecutive parameters.
    for (int i = 0; i < n_params; ++i) {
      if (update[i] && !updated[i]) ZERO_RETURN_IF_ERROR(UpdateFromGradient(i, nullptr));
    }
    for (int i = 0; i < n_params;) {
      if (!update[i]) {
        ++i;
        continue;
      }
      int j = i;
      while (j + 1 < n_params && update[j + 1]) ++j;
      const int64_t begin = params[i].part_off;
      const int64_t end = params[j].part_off + params[j].shard.shard;
      const int64_t model_off = stage == 3 ? begin : params[i].full_off;
      if (end > begin) {
        ZERO_RETURN_IF_ERROR(overlap ? DeferPieces(begin, end - begin, nullptr, model_off)
                                     : ModelFromMasters(begin, end - begin, model_off));
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
    const int64_t begin = stage == 0 ? params[i].full_off : params[i].part_off;
    const int64_t end = stage == 0 ? params[j].full_off + params[j].shard.padded
                                   : params[j].part_off + params[j].shard.shard;
    const int64_t model_off = (stage == 1 || stage == 2) ? params[i].full_off + params[i].shard.begin : begin;
    if (end > begin) {
      if (overlap) {
        // The chunked states read device gradients (their partition is on the device).
        const float* g = grad->device_at(begin);
        if (g == nullptr) return InternalError("the overlapped chunked step needs the fp32 gradients on the device");
        ZERO_RETURN_IF_ERROR(DeferPieces(begin, end - begin, g, model_off));
      } else {
        ZERO_RETURN_IF_ERROR(TimedOffload(UpdateTrack(), "optimizer update",
                                          [&] { return UpdateModel(begin, end - begin, h, model_off); }));
      }
    }
    i = j + 1;
  }

  if (overlap) ZERO_RETURN_IF_ERROR(EndDeferredStep());

  // The new weights where the forward reads them (stage 3: the coordinator re-gathers; stages
  // 1/2: the all-gather). Overlapped (one rank): nothing here reads the model copy.
  ZERO_RETURN_IF_ERROR(timeline.Timed(EngineTimeline::Kind::kCommunication, kTrackCommunication,
                                      "publish weights", [&] { return PublishWeights(update, /*cast=*/false); }));

  if (!norm_first) ZERO_RETURN_IF_ERROR(ReadNorm(&total));
  ZERO_RETURN_IF_ERROR(ZeroAccumulators());
  grad_norm = std::sqrt(total) / s;
  step_applied = true;
  ++counters.global_steps;
  ++counters.adam_step;
  if (fp16) scaler.Update(false);
  return comm->CheckHealth();
}

// The fp32 master weights (of the parameters in `update`) in the model dtype, where the forward
// reads them. With `cast` (LoadCheckpoint) they are rounded from the masters here: stage 0 casts
// the full copy, stage 3 the shards, stages 1/2 each rank's shard into its place; without it
// (Step) AdamWCast already wrote the model copy (stages 1/2: this rank's shard in the padded full
// parameter). Then stage 3 lets the coordinator drop what it had gathered (the caller ran
// QuiesceForUpdate() before the shards changed) and stages 1/2 all-gather the parameters in
// buckets of allgather_bucket_size elements.
Status Engine::Impl::PublishWeights(const std::vector<uint8_t>& update, bool cast) {
  const int n_params = static_cast<int>(params.size());
  if (stage == 0) {
    if (cast) {
      ZERO_RETURN_IF_ERROR(states->CastMaster(0, full_total, model.data(), mdt, compute));
    }
  } else if (stage == 3) {
    if (cast) ZERO_RETURN_IF_ERROR(ModelFromMasters(0, part_total, 0));
    ZERO_RETURN_IF_ERROR(coordinator->AfterUpdate());
  } else {
    // Stages 1/2: each updated parameter's shard all-gathered, in buckets of allgather_bucket_size
    // elements (zero/allgather_bucket.h). The bucket asks for this rank's shard at `dst`: either
    // its place in the full parameter (a bucket of one parameter, or one rank), where AdamWCast
    // already wrote it, or a segment of a bucket buffer, which gets a copy of it.
    std::vector<AllGatherItem> items;
    for (int i = 0; i < n_params; ++i) {
      const ParamInfo& p = params[i];
      if (!update[i] || p.numel == 0) continue;
      items.push_back({i, model_ptr(p.full_off), p.shard.shard});
    }
    Status s = weight_gather->Run(items, [this, cast](int i, void* dst) -> Status {
      const ParamInfo& p = params[i];
      const size_t shard = static_cast<size_t>(p.shard.shard);
      void* mine = model_ptr(p.full_off + p.shard.begin);
      if (cast) return states->CastMaster(p.part_off, p.shard.shard, dst, mdt, compute);
      if (dst == mine) return OkStatus();
      return device->Copy(dst, mine, shard * SizeOf(mdt), CopyKind::kDeviceToDevice, compute);
    });
    if (!s.ok()) return s.WithContext("publishing the updated parameters");
  }
  return OkStatus();
}

bool Engine::was_step_applied() const { return impl_->step_applied; }
double Engine::global_grad_norm() const { return impl_->grad_norm; }
float Engine::loss_scale() const { return impl_->config.fp16.enabled ? impl_->scaler.scale() : 1.0f; }
float Engine::gradient_scale() const { return loss_scale() / static_cast<float>(impl_->gas); }
double Engine::lr() const { return impl_->scheduler->LrAt(impl_->counters.adam_step); }

Status Engine::SetNoSync(bool on) {
  Impl& m = *impl_;
  if (m.stage >= 2) {
    return FailedPreconditionError("no_sync is not supported at ZeRO stage " + std::to_string(m.stage) +
                                   " (stage 2/3 reduce-scatter gradients as they are produced); "
                                   "use gradient accumulation instead");
  }
  m.no_sync = on;
  return OkStatus();
}

Status Engine::ZeroGrad() {
  Impl& m = *impl_;
  ZERO_RETURN_IF_ERROR(m.CheckUsable("ZeroGrad"));
  ZERO_RETURN_IF_ERROR(WaitForOptimizerStep());
  if (m.reported_count > 0) {
    return FailedPreconditionError("ZeroGrad() in the middle of a backward (gradients reported since the last Backward())");
  }
  if (std::find(m.updated.begin(), m.updated.end(), 1) != m.updated.end()) {
    return FailedPreconditionError(
        "ZeroGrad() after a Backward() whose parameters were already updated in backward (managed, "
        "gradient_accumulation_steps 1, one rank, no fp16 or clipping: engine.h, 'Update in "
        "backward'); call Step() to finish the step");
  }
  return m.Guard(m.ZeroAccumulators().WithContext("ZeroGrad"));
}

const Config& Engine::config() const { return impl_->config; }
const EngineCounters& Engine::counters() const { return impl_->counters; }

EngineStats Engine::stats() const {
  const Impl& m = *impl_;
  EngineStats out;
  out.gradient_collectives = m.reducer != nullptr ? m.reducer->collectives_issued() : 0;
  out.weight_allgathers = m.weight_gather != nullptr ? m.weight_gather->collectives_issued() : 0;
  out.param_allgathers = m.coordinator != nullptr ? m.coordinator->stats().allgathers : 0;
  out.param_uploads = m.coordinator != nullptr ? m.coordinator->stats().uploads : 0;
  out.param_uploaded_bytes = m.coordinator != nullptr ? m.coordinator->stats().uploaded_bytes : 0;
  return out;
}
std::map<std::string, double> Engine::wall_clock_breakdown() const { return impl_->timeline.last_means(); }
int Engine::num_params() const { return static_cast<int>(impl_->params.size()); }
const ParamSpec& Engine::param_spec(int index) const { return impl_->params[index].spec; }

EngineMemory Engine::memory() const {
  const Impl& m = *impl_;
  EngineMemory out;
  out.model_params = m.model.bytes() + (m.coordinator != nullptr ? m.coordinator->resident_bytes() : 0) +
                     (m.host_params != nullptr ? m.host_params->device_bytes() : 0);
  out.host_params = m.host_params != nullptr ? m.host_params->host_bytes() : 0;
  // The three states are the same size: one third is the masters.
  const OptimizerStateBytes sb = m.states != nullptr ? m.states->bytes() : OptimizerStateBytes();
  const size_t state_bytes = sb.device;  // EngineMemory counts device memory
  out.host_states = sb.host;
  out.nvme_states = sb.nvme;
  out.master_params = state_bytes / 3;
  out.optimizer_states = state_bytes - state_bytes / 3;
  out.bucket_staging = m.reducer != nullptr ? m.reducer->staging_bytes() : 0;
  const GradPartitionBytes gb = m.grad != nullptr ? m.grad->bytes() : GradPartitionBytes();
  out.host_gradients = gb.host;
  out.gradient_accumulators = m.acc.bytes() + gb.device;
  out.gradients = m.acc.bytes() + gb.device +
                  (m.grad_pool != nullptr ? m.grad_pool->bytes() : 0) + out.bucket_staging;
  out.allgather_staging = m.weight_gather != nullptr ? m.weight_gather->staging_bytes() : 0;
  out.device_peak = m.device->memory_stats().peak;
  return out;
}

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
    ZERO_ASSIGN_OR_RETURN(auto w, comm->AllGather(mine, tmp.data(), static_cast<size_t>(p.shard.shard),
                                                  DType::kF32, compute));
    ZERO_RETURN_IF_ERROR(w->StreamWait(compute));
  }
  ZERO_RETURN_IF_ERROR(device->Copy(out, tmp.data(), static_cast<size_t>(p.numel) * 4,
                                    CopyKind::kDeviceToHost, compute));
  ZERO_RETURN_IF_ERROR(device->SynchronizeStream(compute));
  return comm->CheckHealth();
}

Status Engine::GatherMasterWeights(int index, float* out) {
  Impl& m = *impl_;
  ZERO_RETURN_IF_ERROR(m.CheckUsable("GatherMasterWeights"));
  ZERO_RETURN_IF_ERROR(m.CheckIndex("GatherMasterWeights", index));
  ZERO_RETURN_IF_ERROR(WaitForOptimizerStep());
  const ParamInfo& p = m.params[index];
  return m.Guard(m.GatherFp32(index, OptState::kMaster, out)
                     .WithContext("GatherMasterWeights(" + ParamName(p) + ")"));
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
      ZERO_RETURN_IF_ERROR(m.device->Cast(src, m.mdt, shard.data(), DType::kF32,
                                          static_cast<size_t>(p.shard.shard), m.compute));
      if (m.world == 1) {
        ZERO_RETURN_IF_ERROR(m.device->Copy(as_f32.data(), shard.data(), static_cast<size_t>(p.shard.shard) * 4,
                                            CopyKind::kDeviceToDevice, m.compute));
      } else {
        ZERO_ASSIGN_OR_RETURN(auto w, m.comm->AllGather(shard.data(), as_f32.data(),
                                                        static_cast<size_t>(p.shard.shard), DType::kF32,
                                                        m.compute));
        ZERO_RETURN_IF_ERROR(w->StreamWait(m.compute));
      }
    }
    ZERO_RETURN_IF_ERROR(m.device->Copy(out, as_f32.data(), static_cast<size_t>(p.numel) * 4,
                                        CopyKind::kDeviceToHost, m.compute));
    ZERO_RETURN_IF_ERROR(m.device->SynchronizeStream(m.compute));
    return m.comm->CheckHealth();
  }();
  return m.Guard(s.WithContext("GatherModelParam(" + ParamName(p) + ")"));
}

}  // namespace zero

namespace zero {

Status Engine::GatherOptimizerState(int index, float* exp_avg_out, float* exp_avg_sq_out) {
  Impl& m = *impl_;
  ZERO_RETURN_IF_ERROR(m.CheckUsable("GatherOptimizerState"));
  ZERO_RETURN_IF_ERROR(m.CheckIndex("GatherOptimizerState", index));
  ZERO_RETURN_IF_ERROR(WaitForOptimizerStep());
  const ParamInfo& p = m.params[index];
  if (exp_avg_out == nullptr || exp_avg_sq_out == nullptr) {
    return InvalidArgumentError("GatherOptimizerState(" + ParamName(p) +
                                "): exp_avg and exp_avg_sq must not be null");
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
  const std::string why =
      std::string(call) == "SaveCheckpoint"
          ? "accumulated gradients are not saved in checkpoints"
          : "the gradients accumulated so far would be applied to the loaded weights";
  if (reported_count > 0) {
    return FailedPreconditionError(std::string(call) +
                                   " in the middle of a backward (gradients reported since the "
                                   "last Backward()): " + why);
  }
  std::string where;
  if (managed && pending_step) {
    where = "the accumulation boundary Backward() ran but Step() has not";
  } else if (managed && window_micro > 0) {
    where = std::to_string(window_micro) + " of " + std::to_string(gas) +
            " micro steps of the window are accumulated";
  } else if (!managed && backwards_since_step > 0) {
    where = std::to_string(backwards_since_step) + " Backward() call(s) since the last Step()";
  }
  if (where.empty()) return OkStatus();
  return FailedPreconditionError(
      std::string(call) + " inside a gradient accumulation window (" + where + ", micro step " +
      std::to_string(counters.micro_steps) + "): " + why +
      "; call it at a window boundary, after Step() has run the optimizer step");
}

Status Engine::SaveCheckpoint(const std::string& dir, const std::string& tag,
                              const std::string& client_state_json) {
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
        shards.push_back(SliceFullParam(p.spec.name, p.spec.shape, p.spec.module, full_master.data(),
                                        full_avg.data(), full_sq.data(), rank, world));
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
  return ::zero::SaveCheckpoint(comm, dir, tag, std::move(meta), shards)
      .WithContext("SaveCheckpoint");
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
                         std::to_string(meta.micro_steps) + ", adam_step " + std::to_string(meta.adam_step) +
                         ")");
  }
  // The loss scaler resumes when this run and the checkpoint both use a dynamic fp16 scale; a static
  // scale comes from the config, and a non-fp16 checkpoint has no scale to resume (the configured
  // initial scale is kept).
  LossScaler new_scaler = scaler;
  if (config.fp16.enabled && scaler.dynamic() && meta.loss_scaler.dynamic) {
    const CheckpointLossScaler& c = meta.loss_scaler;
    if (c.good_steps < 0 || c.last_overflow_step < -1 || c.hysteresis < 1 ||
        c.hysteresis > std::numeric_limits<int>::max()) {
      return DataLossError(what + ": loss_scaler: good_steps " + std::to_string(c.good_steps) +
                           ", hysteresis " + std::to_string(c.hysteresis) + ", last_overflow_step " +
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
  window_micro = 0;
  pending_step = false;
  step_applied = false;
  grad_norm = -1.0;
  return meta.client_state_json;
}

// --- overlap_step: the optimizer step under the next forward --------------------------------------

Status Engine::WaitForOptimizerStep() {
  Impl& m = *impl_;
  if (!m.step_unfinished) return OkStatus();
  ZERO_RETURN_IF_ERROR(m.CheckUsable("WaitForOptimizerStep"));
  ZERO_RETURN_IF_ERROR(m.FlushStep("WaitForOptimizerStep"));
  Status s = m.chunked->WaitForUpdates(m.compute);
  if (s.ok()) s = m.device->SynchronizeStream(m.compute);
  ZERO_RETURN_IF_ERROR(m.Guard(s.WithContext("WaitForOptimizerStep: waiting for the optimizer step's chunks")));
  m.step_unfinished = false;
  return OkStatus();
}

Status Engine::Impl::BeginDeferredStep(const AdamWParams& h) {
  if (step_mark == nullptr) {
    auto e = device->CreateEvent();
    if (!e.ok()) return e.status().WithContext("overlap_step: creating the step event");
    step_mark = std::move(e).value();
  }
  // Everything the step reads (the gradients, the norm's inputs) is written on the compute stream
  // before this point, and everything that read the old model copy is enqueued before it.
  ZERO_RETURN_IF_ERROR(device->RecordEvent(step_mark.get(), compute));
  step_h = h;
  pieces.clear();
  pieces_queued = 0;
  return OkStatus();
}

Status Engine::Impl::DeferPieces(int64_t off, int64_t n, const float* grads, int64_t model_off) {
  const int64_t chunk = chunked->chunk_numel();
  for (int64_t at = 0; at < n; at += chunk) {
    StepPiece p;
    p.begin = off + at;
    p.n = std::min(chunk, n - at);
    p.model_off = model_off + at;
    p.grads = grads != nullptr ? grads + at : nullptr;
    pieces.push_back(p);
  }
  return OkStatus();
}

Status Engine::Impl::EndDeferredStep() {
  // The first chunk_buffers pieces go now (the forward usually starts with the first parameters);
  // the rest when the forward reaches them.
  const size_t first = std::min(pieces.size(), static_cast<size_t>(chunked->chunk_buffers()));
  for (size_t k = 0; k < first; ++k) ZERO_RETURN_IF_ERROR(QueuePiece(k));
  pieces_queued = first;
  param_waited.assign(params.size(), 0);
  for (int i = 0; i < static_cast<int>(params.size()); ++i) {
    size_t f = 0, l = 0;
    PiecesOf(i, &f, &l);
    if (f == l) param_waited[i] = 1;  // nothing of the step writes it
  }
  step_in_flight = !pieces.empty();
  step_unfinished = step_unfinished || step_in_flight;
  return OkStatus();
}

Status Engine::Impl::QueuePiece(size_t k) {
  StepPiece& p = pieces[k];
  if (p.queued) return OkStatus();
  p.queued = true;
  if (p.grads == nullptr) return chunked->CastMasterAfter(p.begin, p.n, model_ptr(p.model_off), mdt, step_mark.get());
  return chunked->UpdateAfter(p.begin, p.n, p.grads, step_h, model_ptr(p.model_off), mdt, step_mark.get());
}

void Engine::Impl::PiecesOf(int index, size_t* first, size_t* last) const {
  const ParamInfo& p = params[index];
  const int64_t b = stage == 0 ? p.full_off : p.part_off;
  const int64_t e = b + (stage == 0 ? p.numel : p.shard.shard);
  auto lo = std::partition_point(pieces.begin(), pieces.end(), [b](const StepPiece& q) { return q.begin + q.n <= b; });
  auto hi = std::partition_point(lo, pieces.end(), [e](const StepPiece& q) { return q.begin < e; });
  *first = static_cast<size_t>(lo - pieces.begin());
  *last = e > b ? static_cast<size_t>(hi - pieces.begin()) : *first;
}

Status Engine::Impl::ReachModule(int module) {
  const std::vector<int>& ps = module_params[module];
  size_t end = 0;
  bool any = false;
  for (int i : ps) {
    size_t f = 0, l = 0;
    PiecesOf(i, &f, &l);
    for (size_t k = f; k < l; ++k) ZERO_RETURN_IF_ERROR(QueuePiece(k));
    if (l > f) {
      end = std::max(end, l);
      any = true;
    }
  }
  // Look-ahead: the next chunk_buffers pieces not yet queued after this module's (bounded, so the
  // launch queue never holds the whole step).
  size_t ahead = static_cast<size_t>(chunked->chunk_buffers());
  for (size_t k = any ? end : pieces_queued; k < pieces.size() && ahead > 0; ++k) {
    if (pieces[k].queued) continue;
    ZERO_RETURN_IF_ERROR(QueuePiece(k));
    --ahead;
  }
  while (pieces_queued < pieces.size() && pieces[pieces_queued].queued) ++pieces_queued;
  // The compute stream waits for the chunks holding this module's parameters only (before the
  // stage-3 gather reads the shards, before param() is used at stages 0-2).
  for (int i : ps) {
    size_t f = 0, l = 0;
    PiecesOf(i, &f, &l);
    for (size_t k = f; k < l; ++k) {
      std::optional<ChunkEvents> c = chunked->Chunk(pieces[k].begin);
      if (c.has_value()) ZERO_RETURN_IF_ERROR(device->StreamWaitEvent(compute, c->updated));
    }
    param_waited[i] = 1;
  }
  return OkStatus();
}

Status Engine::Impl::FlushStep(const char* call) {
  if (!step_in_flight) return OkStatus();
  Status s = [&]() -> Status {
    for (size_t k = pieces_queued; k < pieces.size(); ++k) ZERO_RETURN_IF_ERROR(QueuePiece(k));
    // The gradients and states may be written again once the compute stream passes this.
    return chunked->WaitForUpdates(compute);
  }();
  if (!s.ok()) {
    return Guard(s.WithContext(std::string(call) + ": queueing the rest of the overlapped optimizer step"));
  }
  step_in_flight = false;
  pieces.clear();
  pieces_queued = 0;
  return OkStatus();
}

}  // namespace zero
