// Engine: the orchestration of the ZeRO pieces (zero/) behind the API of engine.h: creation (the
// config checks are Validate's, engine/config.h), parameter registration, Initialize (the flat
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
  // Buckets and gathers in flight finish before their buffers go.
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
    EngineTimelineOptions to{config.wall_clock_breakdown,
                             config.steps_per_print,
                             impl->rank,
                             env.log_sink,
                             config.zero_trace.enabled,
                             config.zero_trace.path,
                             config.zero_trace.first_step,
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
    return InvalidArgumentError("RegisterParameter: parameter name '" + spec.name + "' is already registered (index " +
                                std::to_string(m.param_index[spec.name]) + ")");
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
  Impl& m = *impl_;
  if (!m.broken.ok()) return m.broken;
  if (m.initialized) return FailedPreconditionError("Initialize() called twice");
  Status s = m.InitializeImpl(fill, partition_reads);
  if (!s.ok()) {
    // Nothing half-built stays usable; the other ranks are told (Guard).
    return m.Guard(s);
  }
  m.initialized = true;
  return OkStatus();
}

Status Engine::Impl::InitializeImpl(const InitFill& fill, bool partition_reads) {
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

  // Storage per stage (docs/zero.md); which storage each state gets is zero/state_factory.h's.
  ZERO_RETURN_IF_ERROR(SetUpParamStorage());
  ZERO_RETURN_IF_ERROR(SetUpOptimizerStates());
  // Zero-filled once here: padding and the gaps between pieces stay zero for good; the pieces
  // themselves are overwritten by each window's first contribution (AddGradient).
  if (stage <= 1) {
    ZERO_RETURN_IF_ERROR(Allocate(&acc, full_total, DType::kF32, "fp32 gradient accumulators"));
  }
  ZERO_RETURN_IF_ERROR(SetUpGradPartition());
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
      ZERO_RETURN_IF_ERROR(
          device->Copy(st, values.data(), static_cast<size_t>(p.numel) * 4, CopyKind::kHostToDevice, compute));
      ZERO_RETURN_IF_ERROR(
          device->Fill(st + p.numel, DType::kF32, static_cast<size_t>(p.shard.padded - p.numel), 0.0f, compute));
      ZERO_RETURN_IF_ERROR(
          states->CopyFromDevice(OptState::kMaster, p.part_off, p.shard.shard, st + p.shard.begin, compute));
      if (stage <= 2) {
        ZERO_RETURN_IF_ERROR(
            device->Cast(st, DType::kF32, model_ptr(p.full_off), mdt, static_cast<size_t>(p.shard.padded), compute));
      } else if (host_params != nullptr) {
        ZERO_RETURN_IF_ERROR(host_params->Write(p.part_off, p.shard.shard, [&](void* dst, int64_t at, int64_t len) {
          return device->Cast(st + p.shard.begin + at, DType::kF32, dst, mdt, static_cast<size_t>(len), compute);
        }));
      } else {
        ZERO_RETURN_IF_ERROR(device->Cast(st + p.shard.begin, DType::kF32, model_ptr(p.part_off), mdt, shard, compute));
      }
    }
    // The host vector is refilled for the next parameter.
    ZERO_RETURN_IF_ERROR(device->SynchronizeStream(compute));
  }
  if (world > 1 && !partition_reads && !params.empty()) {
    ZERO_RETURN_IF_ERROR(comm->AllReduceHost(sums.data(), sums.size(), ReduceOp::kMax)
                             .WithContext("Initialize: comparing initial values across ranks"));
    for (int i = 0; i < n_params; ++i) {
      if (sums[i] != -sums[params.size() + i]) {
        return Agreed(
            InvalidArgumentError("Initialize: parameter " + ParamName(params[i]) + " (index " + std::to_string(i) +
                                 ") has different initial values on different ranks; init(index, values) must give "
                                 "every rank the same values"));
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
  const size_t bucket_bytes =
      std::min(total_grad_bytes, static_cast<size_t>(config.zero.reduce_bucket_size) * SizeOf(mdt));
  const size_t pool_keep = PerParamReduction() && !DirectToPartition()
                               ? static_cast<size_t>(max_in_flight + 2) * max_param_bytes
                               : 2 * max_param_bytes + (stage >= 2 && !DirectToPartition() ? bucket_bytes : 0);
  grad_pool = std::make_unique<BufferPool>(device, pool_keep);
  grad_out.resize(params.size());
  grad_held.resize(params.size());
  window.Init(static_cast<int>(params.size()), managed, gas);

  GradientReducerOptions ro;
  ro.op = op;
  ro.bucket_numel = config.zero.reduce_bucket_size;
  ro.overlap = config.zero.overlap_comm;
  ro.contiguous = contiguous;
  ro.max_in_flight = max_in_flight;
  // Stage 0 all-reduces anyway; stages 1-3 reduce-scatter unless reduce_scatter is false.
  ro.scatter = config.zero.reduce_scatter;
  if (stage == 0) {
    ro.kind = BucketKind::kFull;
    ro.delivery = ReducedDelivery::kStore;  // into the accumulators (the partition's view of them)
    ro.comm_dtype = DType::kF32;
    ro.name = "stage-0 gradient";
  } else if (stage == 1) {
    ro.kind = BucketKind::kShards;
    ro.delivery = ReducedDelivery::kStore;  // a no-op where it was reduce-scattered into the partition
    ro.comm_dtype = DType::kF32;
    ro.name = "stage-1 gradient";
  } else {
    ro.kind = BucketKind::kShards;
    ro.delivery = ReducedDelivery::kAdd;
    ro.comm_dtype = comm_dt;
    ro.name = stage == 2 ? "stage-2 gradient" : "stage-3 gradient";
  }
  reducer = std::make_unique<GradientReducer>(device, comm, compute, ro, grad.get(), &window);
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
    coordinator = std::make_unique<ParamCoordinator>(device, comm, compute, mdt, std::move(cps), module_names, co);
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

// Stage 3's shards: a ParamStore with offload_param, else the device buffer `model` (stages 0-2:
// the full parameters).
Status Engine::Impl::SetUpParamStorage() {
  std::vector<ParamShardInfo> shards;
  shards.reserve(params.size());
  for (const ParamInfo& p : params) shards.push_back({p.spec.name, p.numel, p.part_off, p.shard.shard, p.module});
  auto store = CreateParamStore(device, compute, mdt, part_total, shards, module_names,
                                ParamStorePlanOf(config, rank, world, env));
  if (!store.ok()) return store.status().WithContext("Initialize");
  host_params = std::move(store).value();
  if (host_params != nullptr) return OkStatus();
  return Allocate(&model, stage == 3 ? part_total : full_total, mdt, "model parameters");
}

// The fp32 masters and moments (stage 0 in the full layout, else the partition layout) and, with
// overlap_step, the overlapped step's scheduler over each parameter's state elements.
Status Engine::Impl::SetUpOptimizerStates() {
  std::vector<DeferredStep::Range> ranges;
  ranges.reserve(params.size());
  for (const ParamInfo& q : params) {
    const int64_t b = stage == 0 ? q.full_off : q.part_off;
    ranges.push_back({b, b + (stage == 0 ? q.numel : q.shard.shard)});
  }
  auto built = CreateOptimizerStates(device, compute, stage == 0 ? full_total : part_total,
                                     OptimizerStatesPlanOf(config, rank, mdt, env, std::move(ranges)));
  if (!built.ok()) return built.status().WithContext("Initialize");
  states = std::move(built->states);
  deferred = std::move(built->deferred_step);
  return OkStatus();
}

// The fp32 gradients the boundary reads, one piece per parameter (stage 0: its full accumulator;
// otherwise its shard in the partition layout). Zero from creation: padding and gaps stay zero.
Status Engine::Impl::SetUpGradPartition() {
  std::vector<GradPiece> pieces;
  pieces.reserve(params.size());
  for (const ParamInfo& p : params) {
    pieces.push_back(stage == 0 ? GradPiece{p.full_off, p.numel} : GradPiece{p.part_off, p.shard.shard});
  }
  GradPartitionPlan plan;
  plan.view_accumulators = AccIsGrad();
  plan.accumulators = AccIsGrad() ? acc.as<float>() : nullptr;
  plan.update_in_backward = UpdateInBackward();
  plan.accumulate_on_device = config.zero.offload_grad_accumulation == "gpu";
  plan.slab = OffloadSlab(config.zero.offload_optimizer, "zero_optimization.offload_optimizer");
  auto g = CreateGradPartition(device, compute, part_total, std::move(pieces), states.get(), plan);
  if (!g.ok()) return g.status().WithContext("Initialize");
  grad = std::move(g).value();
  return OkStatus();
}

// --- accessors ------------------------------------------------------------------------------------

bool Engine::is_gradient_accumulation_boundary() const {
  const Impl& m = *impl_;
  if (!m.managed) return true;
  return m.window.micro_steps() + 1 == m.gas;
}

bool Engine::was_step_applied() const { return impl_->step_applied; }
double Engine::global_grad_norm() const { return impl_->grad_norm; }
float Engine::loss_scale() const { return impl_->config.fp16.enabled ? impl_->scaler.scale() : 1.0f; }
float Engine::gradient_scale() const { return loss_scale() / static_cast<float>(impl_->gas); }
double Engine::lr() const { return impl_->scheduler->LrAt(impl_->counters.adam_step); }

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
  out.gradients = m.acc.bytes() + gb.device + gb.device_staging + (m.grad_pool != nullptr ? m.grad_pool->bytes() : 0) +
                  out.bucket_staging;
  out.allgather_staging = m.weight_gather != nullptr ? m.weight_gather->staging_bytes() : 0;
  out.device_peak = m.device->memory_stats().peak;
  return out;
}

}  // namespace zero
