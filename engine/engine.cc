// Engine: the orchestration of the ZeRO pieces (zero/) behind the API of engine.h: creation (the
// config checks are Validate's, engine/config/config.h), parameter registration, Initialize (the flat
// buffers, states, gradient partition, reducer, gathers and coordinator a config asks for),
// ModuleHandle and the accessors. The training calls are in engine_backward.cc (forward, backward),
// engine_step.cc (the step) and engine_state.cc (state gathers, checkpoints); Engine::Impl is in
// engine_impl.h. See docs/zero.md for how each stage stores and reduces, the bucket layout and the
// boundary arithmetic.
#include "engine/engine.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "engine/engine_impl.h"
#include "engine/engine_timeline.h"
#include "engine/lr_scheduler.h"
#include "runtime/device_arena.h"
#include "runtime/hash.h"
#include "zero/allgather_bucket.h"
#include "zero/buffer_pool.h"
#include "zero/grad_partition.h"
#include "zero/grad_reducer.h"
#include "zero/gradient_bucket.h"
#include "zero/loss_scaler.h"
#include "zero/optimizer_states.h"
#include "zero/param_coordinator.h"
#include "zero/partition.h"
#include "zero/reduction_schedule.h"
#include "zero/state_factory.h"

namespace zero {

namespace {

// Pieces of the engine's flat buffers start at multiples of this many elements (256 bytes of
// fp32), so param(i) and grad shards are aligned for vectorized kernels. Gaps stay zero.
constexpr int64_t kAlign = 64;

}  // namespace

// --- config -> the state factory's plans (zero/state_factory.h) -----------------------------------

// The host slab of an offload section (offload_optimizer or offload_param: both carry pin_memory
// and pin_memory_fallback) and the config key its errors name; the factory says what it holds.
template <typename OffloadSection>
static HostSlabOptions OffloadSlab(const OffloadSection& section, std::string config_key) {
  HostSlabOptions slab;
  slab.pin_memory = section.pin_memory;
  slab.fallback_to_pageable = section.pin_memory_fallback;
  slab.config_key = std::move(config_key);
  return slab;
}

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

// One rank's folder under an NVMe path; the swap file of a killed run there is refused.
static std::string RankSwapDir(const std::string& nvme_path, int rank) {
  return nvme_path + "/zero_swap/rank" + std::to_string(rank);
}

// zero_optimization.offload_param: stage 3's shards on the device, in host memory or on NVMe.
static ParamStorePlan ParamStorePlanOf(const Config& config, int rank, int world, const EngineEnv& env) {
  const OffloadParamConfig& offload_param = config.zero.offload_param;
  ParamStorePlan plan;
  switch (offload_param.device) {
    case OffloadDevice::kCpu:
      plan.placement = ParamPlacement::kHost;
      break;
    case OffloadDevice::kNvme:
      plan.placement = ParamPlacement::kNvme;
      break;
    case OffloadDevice::kNone:
      return plan;
  }
  plan.slab = OffloadSlab(offload_param, "zero_optimization.offload_param");
  plan.world_size = world;
  plan.buffer_numel = offload_param.buffer_size;
  plan.buffer_count = static_cast<int>(std::min<int64_t>(offload_param.buffer_count, 1 << 20));
  plan.cache_numel = offload_param.max_in_cpu;
  plan.nvme_dir = RankSwapDir(offload_param.nvme_path, rank);
  plan.aio = AioOptionsOf(config.aio);
  plan.aio_engine_factory = env.aio_engine_factory;
  plan.file_system = env.file_system;
  return plan;
}

// zero_optimization.offload_optimizer: the states on the device, in host memory (the CPU AdamW, or
// AdamW on the device in chunks with update_device "gpu"), or on NVMe behind host_memory_budget.
static OptimizerStatesPlan OptimizerStatesPlanOf(const Config& config, int rank, DType model_dtype,
                                                 const EngineEnv& env, std::vector<DeferredStep::Range> param_ranges) {
  const OffloadOptimizerConfig& offload_optimizer = config.zero.offload_optimizer;
  OptimizerStatesPlan plan;
  plan.model_dtype = model_dtype;
  switch (offload_optimizer.device) {
    case OffloadDevice::kCpu:
      plan.placement =
          offload_optimizer.update_device == "gpu" ? OptimizerPlacement::kHostChunked : OptimizerPlacement::kHost;
      break;
    case OffloadDevice::kNvme:
      plan.placement = OptimizerPlacement::kNvme;
      break;
    case OffloadDevice::kNone:
      return plan;
  }
  plan.slab = OffloadSlab(offload_optimizer, "zero_optimization.offload_optimizer");
  plan.cpu_threads = offload_optimizer.cpu_threads;
  plan.chunk_numel = offload_optimizer.chunk_size;
  plan.chunk_buffers = static_cast<int>(offload_optimizer.chunk_buffers);
  plan.overlap_step = offload_optimizer.overlap_step;
  plan.param_ranges = std::move(param_ranges);
  plan.nvme_dir = RankSwapDir(offload_optimizer.nvme_path, rank);
  plan.nvme_group_numel = config.zero.sub_group_size;
  plan.nvme_buffer_count = static_cast<int>(offload_optimizer.buffer_count);
  plan.aio = AioOptionsOf(config.aio);
  plan.aio_engine_factory = env.aio_engine_factory;
  plan.file_system = env.file_system;
  plan.host_memory_budget = offload_optimizer.host_memory_budget;
  plan.offload_ratio = offload_optimizer.ratio;
  return plan;
}

// --- ModuleHandle ---------------------------------------------------------------------------------

ModuleHandle::~ModuleHandle() {
  if (engine_ != nullptr) engine_->ReleaseModule(module_id_).IgnoreError();
}

ModuleHandle::ModuleHandle(ModuleHandle&& o) noexcept : engine_(o.engine_), module_id_(o.module_id_) {
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
  if (impl_->StepInFlight()) WaitForOptimizerStep().IgnoreError();
  // Buckets and gathers in flight finish before their buffers gather_options.
  impl_->coordinator.reset();
  impl_->reducer.reset();
  if (impl_->device != nullptr) impl_->device->Synchronize().IgnoreError();
}

Result<std::unique_ptr<Engine>> Engine::Create(const Config& config, Device* device, Communicator* comm,
                                               const EngineEnv& env) {
  if (device == nullptr || comm == nullptr) {
    return InvalidArgumentError("Engine::Create: device and communicator must not be null");
  }
  if (comm->device() != nullptr && comm->device() != device) {
    return InvalidArgumentError("Engine::Create: the communicator's buffers live on device '" + comm->device()->name() +
                                "', not on the engine's device '" + device->name() + "'");
  }
  // Every config rule, key checks included, with ParseConfig's messages (no file name: the Config may be
  // built in code), and what the engine does not build; the ranks are the communicator's.
  ValidateOptions validate;
  validate.world_size = comm->world_size();
  ZERO_RETURN_IF_ERROR(Validate(config, validate));
  const ZeroConfig& z = config.zero;
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->env = env;
  impl->device = device;
  impl->comm = comm;
  impl->compute = device->default_stream();
  impl->rank = comm->rank();
  impl->world = comm->world_size();
  impl->stage = z.stage;
  impl->run.model_dtype = config.model_dtype();
  impl->run.comm_dtype = config.has_communication_data_type ? config.communication_data_type : impl->run.model_dtype;
  impl->run.managed = config.managed_gradient_accumulation;
  impl->run.freeze_inactive = config.freeze_inactive_parameters;
  impl->run.gas = impl->run.managed ? config.gradient_accumulation_steps : 1;
  impl->run.contiguous = z.contiguous_gradients;
  impl->run.reduce_op = config.gradient_allreduce_op == "sum" ? ReduceOp::kSum : ReduceOp::kAvg;
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
    EngineTimelineOptions timeline_options{config.wall_clock_breakdown,
                                           config.steps_per_print,
                                           impl->rank,
                                           env.log_sink,
                                           config.zero_trace.enabled,
                                           config.zero_trace.path,
                                           config.zero_trace.first_step,
                                           config.zero_trace.last_step};
    ZERO_RETURN_IF_ERROR(impl->timeline.Configure(timeline_options, device, impl->compute));
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
  Impl& impl = *impl_;
  if (impl.lifecycle.initialized) {
    return FailedPreconditionError("RegisterParameter('" + spec.name + "') after Initialize()");
  }
  if (spec.name.empty()) return InvalidArgumentError("RegisterParameter: empty parameter name");
  if (impl.registry.param_index.count(spec.name) != 0) {
    return InvalidArgumentError("RegisterParameter: parameter name '" + spec.name + "' is already registered (index " +
                                std::to_string(impl.registry.param_index[spec.name]) + ")");
  }
  int64_t numel = 1;
  for (int64_t d : spec.shape) {
    if (d < 0) {
      return InvalidArgumentError("RegisterParameter('" + spec.name + "'): negative dimension " + std::to_string(d));
    }
    if (d != 0 && numel > std::numeric_limits<int64_t>::max() / 4 / d) {
      return InvalidArgumentError("RegisterParameter('" + spec.name + "'): too many elements");
    }
    numel *= d;
  }
  ParamInfo p;
  p.spec = spec;
  p.numel = numel;
  auto it = impl.registry.module_index.find(spec.module);
  if (it == impl.registry.module_index.end()) {
    it = impl.registry.module_index.emplace(spec.module, static_cast<int>(impl.registry.module_names.size())).first;
    impl.registry.module_names.push_back(spec.module);
    impl.registry.module_params.emplace_back();
  }
  p.module = it->second;
  const int index = static_cast<int>(impl.registry.params.size());
  impl.registry.module_params[p.module].push_back(index);
  impl.registry.param_index[spec.name] = index;
  impl.registry.params.push_back(std::move(p));
  return index;
}

Status Engine::Initialize(const std::function<void(int index, float* values)>& init) {
  if (!init) return InvalidArgumentError("Initialize: init function is empty");
  return InitializeWith(
      [&init](int index, int64_t, int64_t, float* values) {
        init(index, values);
        return OkStatus();
      },
      false);
}

Status Engine::InitializeFromSlices(
    const std::function<Status(int index, int64_t begin, int64_t count, float* values)>& read) {
  if (!read) return InvalidArgumentError("InitializeFromSlices: read function is empty");
  return InitializeWith(read, true);
}

Status Engine::InitializeWith(const std::function<Status(int, int64_t, int64_t, float*)>& fill, bool partition_reads) {
  Impl& impl = *impl_;
  if (!impl.lifecycle.broken.ok()) return impl.lifecycle.broken;
  if (impl.lifecycle.initialized) return FailedPreconditionError("Initialize() called twice");
  Status s = impl.InitializeImpl(fill, partition_reads);
  if (!s.ok()) {
    // Nothing half-built stays usable; the other ranks are told (Guard).
    return impl.Guard(s);
  }
  impl.lifecycle.initialized = true;
  return OkStatus();
}

Status Engine::Impl::InitializeImpl(const InitFill& fill, bool partition_reads) {
  LayOutFlatBuffers();
  // Storage per stage (docs/zero.md); which storage each state gets is zero/state_factory.h's.
  ZERO_RETURN_IF_ERROR(SetUpParamStorage());
  ZERO_RETURN_IF_ERROR(SetUpOptimizerStates());
  // Zero-filled once here: padding and the gaps between pieces stay zero for good; the pieces
  // themselves are overwritten by each window's first contribution (AddGradient).
  if (stage <= 1) {
    ZERO_RETURN_IF_ERROR(Allocate(&acc, registry.full_total, DType::kF32, "fp32 gradient accumulators"));
  }
  ZERO_RETURN_IF_ERROR(SetUpGradPartition());
  ZERO_RETURN_IF_ERROR(AllocateNormPartials());
  ZERO_RETURN_IF_ERROR(UploadInitialValues(fill, partition_reads));

  // Gradient machinery. Without contiguous_gradients (stages 2/3) a buffer is held until its own
  // reduction completes: up to max_in_flight of them besides the ones the user holds.
  const int max_in_flight = run.contiguous ? 2 : 4;
  SetUpGradBuffers(max_in_flight);
  SetUpReducer(max_in_flight);
  if (stage == 1 || stage == 2) SetUpWeightGather();
  if (stage == 3) SetUpCoordinator();
  // zero_trace: the components report the work they enqueue on their own streams (docs/timeline.md).
  if (StreamObserver* o = timeline.observer()) {
    if (reducer != nullptr) reducer->set_observer(o);
    if (coordinator != nullptr) coordinator->set_observer(o);
    if (optimizer.states != nullptr) optimizer.states->set_observer(o);
    if (grad != nullptr) grad->set_observer(o);
    if (host_params != nullptr) host_params->set_observer(o);
  }
  ZERO_RETURN_IF_ERROR(device->SynchronizeStream(compute));
  return OkStatus();
}

// Each parameter's shard, and its offsets in the full and the partition flat layouts.
void Engine::Impl::LayOutFlatBuffers() {
  const int n_params = static_cast<int>(registry.params.size());
  std::vector<int64_t> full_sizes;
  std::vector<int64_t> part_sizes;
  for (ParamInfo& p : registry.params) {
    p.shard = MakeShardSpec(p.numel, world, rank);
    p.persistent = p.numel <= config.zero.stage3_param_persistence_threshold;
    full_sizes.push_back(p.shard.padded);
    part_sizes.push_back(p.shard.shard);
  }
  const FlatLayout full = MakeFlatLayout(full_sizes, kAlign);
  const FlatLayout part = MakeFlatLayout(part_sizes, kAlign);
  for (int i = 0; i < n_params; ++i) {
    registry.params[i].full_off = full.offset[i];
    registry.params[i].part_off = part.offset[i];
  }
  registry.full_total = full.total;
  registry.part_total = part.total;
}

Status Engine::Impl::AllocateNormPartials() {
  auto n = GlobalNorm::Create(device, comm, compute, static_cast<int>(registry.params.size()), stage >= 1 && world > 1);
  if (!n.ok()) return n.status().WithContext("Initialize");
  norm = std::move(n).value();
  // UpdateInBackward writes a parameter's partial when it is reported; the others read 0.
  return norm->ZeroSlots();
}

// Initial values: full fp32 on the host. Where this rank's master holds the whole parameter
// (stage 0, or one rank: the partition layout is then the full layout) they are uploaded
// straight into it (its padding is zero from the allocation) and the model copy is cast from it;
// otherwise through one device staging buffer, from which this rank's shard is taken.
Status Engine::Impl::UploadInitialValues(const InitFill& fill, bool partition_reads) {
  const int n_params = static_cast<int>(registry.params.size());
  const bool direct_upload = stage == 0 || world == 1;
  DeviceBuffer staging;
  if (!direct_upload) {
    int64_t max_padded = 0;
    for (const ParamInfo& p : registry.params) max_padded = std::max(max_padded, p.shard.padded);
    ZERO_RETURN_IF_ERROR(Allocate(&staging, std::max<int64_t>(max_padded, 1), DType::kF32, "initial values"));
  }
  std::vector<float> values;
  std::vector<double> sums(world > 1 ? 2 * registry.params.size() : 0, 0.0);
  for (int i = 0; i < n_params; ++i) {
    const ParamInfo& p = registry.params[i];
    values.assign(static_cast<size_t>(p.numel), 0.0f);
    // Stage 3 with several ranks uses only the shard (staging from p.shard.begin): with
    // partition_reads only that range is read; the rest of `values` stays zero and is never used.
    int64_t lo = 0, hi = p.numel;
    if (partition_reads && stage == 3 && world > 1) {
      lo = std::min(p.shard.begin, p.numel);
      hi = std::min(p.shard.begin + p.shard.shard, p.numel);
    }
    if (hi > lo) {
      ZERO_RETURN_IF_ERROR(
          fill(i, lo, hi - lo, values.data() + lo).WithContext("Initialize: initial values of " + ParamName(p)));
    }
    if (world > 1 && !partition_reads) {  // one rank has nothing to compare with
      sums[i] = ValuesHash52(values.data(), p.numel);
      sums[registry.params.size() + i] = -sums[i];
    }
    if (p.numel == 0) continue;
    ZERO_RETURN_IF_ERROR(UploadInitialValue(p, values, direct_upload ? nullptr : staging.as<float>()));
    // The host vector is refilled for the next parameter.
    ZERO_RETURN_IF_ERROR(device->SynchronizeStream(compute));
  }
  if (world > 1 && !partition_reads && !registry.params.empty()) {
    ZERO_RETURN_IF_ERROR(CheckSameInitialValues(&sums));
  }
  return OkStatus();
}

// Parameter p's initial `values` (numel fp32 on the host) into its master and model copy:
// straight into the master without `staging` (direct upload), else through it.
Status Engine::Impl::UploadInitialValue(const ParamInfo& p, const std::vector<float>& values, float* staging) {
  const size_t shard = static_cast<size_t>(p.shard.shard);
  if (staging == nullptr) {
    const int64_t off = stage == 0 ? p.full_off : p.part_off;
    ZERO_RETURN_IF_ERROR(optimizer.states->Write(OptState::kMaster, off, p.numel, values.data()));
    return ModelFromMasters(off, p.shard.padded, stage == 3 ? p.part_off : p.full_off);
  }
  float* st = staging;
  ZERO_RETURN_IF_ERROR(
      device->Copy(st, values.data(), static_cast<size_t>(p.numel) * 4, CopyKind::kHostToDevice, compute));
  ZERO_RETURN_IF_ERROR(
      device->Fill(st + p.numel, DType::kF32, static_cast<size_t>(p.shard.padded - p.numel), 0.0f, compute));
  ZERO_RETURN_IF_ERROR(
      optimizer.states->CopyFromDevice(OptState::kMaster, p.part_off, p.shard.shard, st + p.shard.begin, compute));
  if (stage <= 2) {
    return device->Cast(st, DType::kF32, model_ptr(p.full_off), run.model_dtype, static_cast<size_t>(p.shard.padded),
                        compute);
  }
  if (host_params != nullptr) {
    return host_params->Write(p.part_off, p.shard.shard, [&](void* dst, int64_t at, int64_t len) {
      return device->Cast(st + p.shard.begin + at, DType::kF32, dst, run.model_dtype, static_cast<size_t>(len),
                          compute);
    });
  }
  return device->Cast(st + p.shard.begin, DType::kF32, model_ptr(p.part_off), run.model_dtype, shard, compute);
}

// `sums`: this rank's checksum of each parameter's initial values, then their negations; after a
// max all-reduce the two halves agree exactly when every rank had the same values.
Status Engine::Impl::CheckSameInitialValues(std::vector<double>* sums) {
  const size_t n_params = registry.params.size();
  ZERO_RETURN_IF_ERROR(comm->AllReduceHost(sums->data(), sums->size(), ReduceOp::kMax)
                           .WithContext("Initialize: comparing initial values across ranks"));
  for (size_t i = 0; i < n_params; ++i) {
    if ((*sums)[i] != -(*sums)[n_params + i]) {
      return Agreed(InvalidArgumentError("Initialize: parameter " + ParamName(registry.params[i]) + " (index " +
                                         std::to_string(i) +
                                         ") has different initial values on different ranks; init(index, values) "
                                         "must give every rank the same values"));
    }
  }
  return OkStatus();
}

// The gradient-buffer pool keeps up to two of the largest parameter's buffers and, at stages 2/3
// (where a bucket holds its gradients until it is packed), one bucket's worth: a model of repeated
// blocks then reuses the same buffers every micro step and never frees (a free can wait on the
// host for the compute stream). Per-parameter reductions hold up to max_in_flight more.
void Engine::Impl::SetUpGradBuffers(int max_in_flight) {
  size_t max_param_bytes = 0;
  size_t total_grad_bytes = 0;
  for (const ParamInfo& p : registry.params) {
    const size_t bytes = static_cast<size_t>(GradBufferNumel(p)) * SizeOf(run.model_dtype);
    max_param_bytes = std::max(max_param_bytes, bytes);
    total_grad_bytes += bytes;
  }
  const size_t bucket_bytes =
      std::min(total_grad_bytes, static_cast<size_t>(config.zero.reduce_bucket_size) * SizeOf(run.model_dtype));
  const size_t pool_keep = PerParamReduction() && !DirectToPartition()
                               ? static_cast<size_t>(max_in_flight + 2) * max_param_bytes
                               : 2 * max_param_bytes + (stage >= 2 && !DirectToPartition() ? bucket_bytes : 0);
  grad_buffers.pool = std::make_unique<BufferPool>(device, pool_keep);
  grad_buffers.handed_out.resize(registry.params.size());
  grad_buffers.held.resize(registry.params.size());
  window.Init(static_cast<int>(registry.params.size()), run.managed, run.gas);
}

// The reducer delivers into the partition (grad_reducer.h): stages 0/1 store the reduced window
// sums (stage 0 into the accumulators, the partition's view of them; a no-op where stage 1
// reduce-scattered straight into the partition), stages 2/3 add every micro step's.
void Engine::Impl::SetUpReducer(int max_in_flight) {
  const int n_params = static_cast<int>(registry.params.size());
  GradientReducerOptions reducer_options;
  reducer_options.op = run.reduce_op;
  reducer_options.bucket_numel = config.zero.reduce_bucket_size;
  reducer_options.overlap = config.zero.overlap_comm;
  reducer_options.contiguous = run.contiguous;
  reducer_options.max_in_flight = max_in_flight;
  // Stage 0 all-reduces anyway; stages 1-3 reduce-scatter unless reduce_scatter is false.
  reducer_options.scatter = config.zero.reduce_scatter;
  reducer_options.kind = stage == 0 ? BucketKind::kFull : BucketKind::kShards;
  reducer_options.delivery = stage <= 1 ? ReducedDelivery::kStore : ReducedDelivery::kAdd;
  reducer_options.comm_dtype = stage <= 1 ? DType::kF32 : run.comm_dtype;
  static const char* const kNames[] = {"stage-0 gradient", "stage-1 gradient", "stage-2 gradient", "stage-3 gradient"};
  reducer_options.name = kNames[stage];
  reducer = std::make_unique<GradientReducer>(device, comm, compute, reducer_options, grad.get(), &window);
  if (world > 1 && stage != 3) {
    // Every rank reduces the same buckets whatever it reports, in whatever order: the layout is
    // fixed by parameter index, last registered first (the order a backward usually produces), and
    // a parameter a rank did not report contributes zeros (grad_reducer.h). Not at stage 3: its
    // gathers share the communicator, and a bucket that completes at a different point among them
    // on one rank would make the ranks' sequences of collectives differ; there the reduction
    // schedule launches each module's reductions at a gather every rank makes (SetUpCoordinator).
    std::vector<BucketItem> order;
    for (int i = n_params - 1; i >= 0; --i) {
      if (registry.params[i].numel > 0) order.push_back(BucketItem{i, registry.params[i].numel});
    }
    reducer->SetPlan(order);
  }
}

// Stages 1/2: the all-gather of the updated parameters.
void Engine::Impl::SetUpWeightGather() {
  BucketedAllGatherOptions gather_options;
  gather_options.dtype = run.model_dtype;
  gather_options.bucket_numel = config.zero.allgather_bucket_size;
  gather_options.max_in_flight = 2;
  // CPU: every event is complete when recorded, so bucket buffers go back at once. CUDA: keep
  // them for stream-ordered reuse without host waits (all of one run have the same size).
  gather_options.pool_free_bytes = device->kind() == DeviceKind::kCpu ? 0 : ~size_t{0};
  weight_gather = std::make_unique<BucketedAllGather>(device, comm, compute, gather_options);
}

// Stage 3: the parameter coordinator (gathers, prefetch, offloaded shards) and, with several ranks,
// the reduction schedule.
void Engine::Impl::SetUpCoordinator() {
  std::vector<CoordinatedParam> cps;
  std::vector<int64_t> module_bytes(registry.module_names.size(), 0);
  for (const ParamInfo& p : registry.params) {
    CoordinatedParam c;
    c.name = p.spec.name;
    c.numel = p.numel;
    c.padded = p.shard.padded;
    c.shard = p.shard.shard;
    c.shard_data = shard_ptr(p.part_off);
    c.module = p.module;
    c.persistent = p.persistent;
    cps.push_back(std::move(c));
    if (!p.persistent) module_bytes[p.module] += p.shard.padded * static_cast<int64_t>(SizeOf(run.model_dtype));
  }
  ParamCoordinatorOptions coordinator_options;
  coordinator_options.prefetch_bucket_numel = config.zero.stage3_prefetch_bucket_size;
  coordinator_options.max_live_numel = config.zero.stage3_max_live_parameters;
  coordinator_options.max_reuse_distance = config.zero.stage3_max_reuse_distance;
  // CPU: every event is complete when recorded, so released memory goes back at once. CUDA:
  // keep about one module's worth for stream-ordered reuse without host waits.
  int64_t largest_module = 0;
  for (int64_t b : module_bytes) largest_module = std::max(largest_module, b);
  coordinator_options.pool_free_bytes = device->kind() == DeviceKind::kCpu ? 0 : static_cast<size_t>(largest_module);
  // Staging buffers of coalesced gathers: CPU frees each right after its unpack; CUDA keeps them
  // for stream-ordered reuse (no more than were in flight at once, plus one) to avoid host waits.
  coordinator_options.staging_free_bytes = device->kind() == DeviceKind::kCpu ? 0 : ~size_t{0};
  if (host_params != nullptr) {
    // offload_param "cpu": the shards are uploaded for each gather, at most buffer_count at once.
    coordinator_options.shard_source = ShardSource::kHost;
    coordinator_options.max_uploads_in_flight =
        static_cast<int>(std::min<int64_t>(config.zero.offload_param.buffer_count, 1 << 20));
    // offload_param "nvme": module by module from the swap file, read ahead along the trace.
    coordinator_options.module_store = host_params->module_store();
    coordinator_options.max_store_read_ahead = coordinator_options.max_uploads_in_flight;
  }
  coordinator = std::make_unique<ParamCoordinator>(device, comm, compute, run.model_dtype, std::move(cps),
                                                   registry.module_names, coordinator_options);
  if (world > 1)
    stage3_reductions.schedule =
        std::make_unique<ReductionSchedule>(comm, static_cast<int>(registry.module_names.size()));
}

// Stage 3's shards: a ParamStore with offload_param, else the device buffer `model` (stages 0-2:
// the full parameters).
Status Engine::Impl::SetUpParamStorage() {
  std::vector<ParamShardInfo> shards;
  shards.reserve(registry.params.size());
  for (const ParamInfo& p : registry.params)
    shards.push_back({p.spec.name, p.numel, p.part_off, p.shard.shard, p.module});
  auto store = CreateParamStore(device, compute, run.model_dtype, registry.part_total, shards, registry.module_names,
                                ParamStorePlanOf(config, rank, world, env));
  if (!store.ok()) return store.status().WithContext("Initialize");
  host_params = std::move(store).value();
  if (host_params != nullptr) return OkStatus();
  return Allocate(&model, stage == 3 ? registry.part_total : registry.full_total, run.model_dtype, "model parameters");
}

// The fp32 masters and moments (stage 0 in the full layout, else the partition layout) and, with
// overlap_step, the overlapped step's scheduler over each parameter's state elements.
Status Engine::Impl::SetUpOptimizerStates() {
  std::vector<DeferredStep::Range> ranges;
  ranges.reserve(registry.params.size());
  for (const ParamInfo& q : registry.params) {
    const int64_t b = stage == 0 ? q.full_off : q.part_off;
    ranges.push_back({b, b + (stage == 0 ? q.numel : q.shard.shard)});
  }
  auto built = CreateOptimizerStates(device, compute, stage == 0 ? registry.full_total : registry.part_total,
                                     OptimizerStatesPlanOf(config, rank, run.model_dtype, env, std::move(ranges)));
  if (!built.ok()) return built.status().WithContext("Initialize");
  optimizer.states = std::move(built->states);
  optimizer.deferred_step = std::move(built->deferred_step);
  return OkStatus();
}

// The fp32 gradients the boundary reads, one piece per parameter (stage 0: its full accumulator;
// otherwise its shard in the partition layout). Zero from creation: padding and gaps stay zero.
Status Engine::Impl::SetUpGradPartition() {
  std::vector<GradPiece> pieces;
  pieces.reserve(registry.params.size());
  for (const ParamInfo& p : registry.params) {
    pieces.push_back(stage == 0 ? GradPiece{p.full_off, p.numel} : GradPiece{p.part_off, p.shard.shard});
  }
  GradPartitionPlan plan;
  plan.view_accumulators = AccIsGrad();
  plan.accumulators = AccIsGrad() ? acc.as<float>() : nullptr;
  plan.update_in_backward = UpdateInBackward();
  plan.accumulate_on_device = config.zero.offload_grad_accumulation == "gpu";
  plan.slab = OffloadSlab(config.zero.offload_optimizer, "zero_optimization.offload_optimizer");
  auto g = CreateGradPartition(device, compute, registry.part_total, std::move(pieces), optimizer.states.get(), plan);
  if (!g.ok()) return g.status().WithContext("Initialize");
  grad = std::move(g).value();
  return OkStatus();
}

// --- accessors ------------------------------------------------------------------------------------

bool Engine::is_gradient_accumulation_boundary() const {
  const Impl& impl = *impl_;
  if (!impl.run.managed) return true;
  return impl.window.micro_steps() + 1 == impl.run.gas;
}

bool Engine::was_step_applied() const { return impl_->progress.step_applied; }
double Engine::global_grad_norm() const { return impl_->progress.grad_norm; }
float Engine::loss_scale() const { return impl_->config.fp16.enabled ? impl_->scaler.scale() : 1.0f; }
float Engine::gradient_scale() const { return loss_scale() / static_cast<float>(impl_->run.gas); }
double Engine::lr() const { return impl_->scheduler->LrAt(impl_->progress.counters.adam_step); }

const Config& Engine::config() const { return impl_->config; }
const EngineCounters& Engine::counters() const { return impl_->progress.counters; }

EngineStats Engine::stats() const {
  const Impl& impl = *impl_;
  EngineStats out;
  out.gradient_collectives = impl.reducer != nullptr ? impl.reducer->collectives_issued() : 0;
  out.weight_allgathers = impl.weight_gather != nullptr ? impl.weight_gather->collectives_issued() : 0;
  out.param_allgathers = impl.coordinator != nullptr ? impl.coordinator->stats().allgathers : 0;
  out.param_uploads = impl.coordinator != nullptr ? impl.coordinator->stats().uploads : 0;
  out.param_uploaded_bytes = impl.coordinator != nullptr ? impl.coordinator->stats().uploaded_bytes : 0;
  return out;
}
std::map<std::string, double> Engine::wall_clock_breakdown() const { return impl_->timeline.last_means(); }
int Engine::num_params() const { return static_cast<int>(impl_->registry.params.size()); }
const ParamSpec& Engine::param_spec(int index) const { return impl_->registry.params[index].spec; }

EngineMemory Engine::memory() const {
  const Impl& impl = *impl_;
  EngineMemory out;
  out.model_params = impl.model.bytes() + (impl.coordinator != nullptr ? impl.coordinator->resident_bytes() : 0) +
                     (impl.host_params != nullptr ? impl.host_params->device_bytes() : 0);
  out.host_params = impl.host_params != nullptr ? impl.host_params->host_bytes() : 0;
  // The three states are the same size: one third is the masters.
  const OptimizerStateBytes sb =
      impl.optimizer.states != nullptr ? impl.optimizer.states->bytes() : OptimizerStateBytes();
  const size_t state_bytes = sb.device;  // EngineMemory counts device memory
  out.host_states = sb.host;
  out.nvme_states = sb.nvme;
  out.master_params = state_bytes / 3;
  out.optimizer_states = state_bytes - state_bytes / 3;
  out.bucket_staging = impl.reducer != nullptr ? impl.reducer->staging_bytes() : 0;
  const GradPartitionBytes gb = impl.grad != nullptr ? impl.grad->bytes() : GradPartitionBytes();
  out.host_gradients = gb.host;
  out.gradient_accumulators = impl.acc.bytes() + gb.device;
  out.gradients = impl.acc.bytes() + gb.device + gb.device_staging +
                  (impl.grad_buffers.pool != nullptr ? impl.grad_buffers.pool->bytes() : 0) + out.bucket_staging;
  out.allgather_staging = impl.weight_gather != nullptr ? impl.weight_gather->staging_bytes() : 0;
  out.device_peak = impl.device->memory_stats().peak;
  out.activations = DeviceArenaBytes(impl.device, "activations");
  out.workspace = DeviceArenaBytes(impl.device, "workspace");
  return out;
}

}  // namespace zero
