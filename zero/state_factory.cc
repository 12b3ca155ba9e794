#include "zero/state_factory.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "zero/chunked_optimizer_states.h"
#include "zero/host_optimizer_states.h"
#include "zero/host_param_store.h"
#include "zero/nvme_optimizer_states.h"
#include "zero/nvme_param_store.h"
#include "zero/tiered_optimizer_states.h"

namespace zero {

namespace {

// The device side of the parameter stores' writes: 2-4 MiB, chunked.
constexpr int64_t kParamStoreScratchNumel = int64_t{1} << 20;

HostSlabOptions SlabHolding(const HostSlabOptions& base, std::string what) {
  HostSlabOptions slab = base;
  slab.what = std::move(what);
  return slab;
}

// --- parameter stores ---

// Every shard must fit one upload (DeepSpeed finds this at run time).
Status CheckShardsFitOneUpload(const std::vector<ParamShardInfo>& shards, const ParamStorePlan& plan) {
  for (const ParamShardInfo& p : shards) {
    if (p.shard > plan.buffer_numel) {
      return InvalidArgumentError(
          "parameter '" + p.name + "' has a shard of " + std::to_string(p.shard) + " elements (" +
          std::to_string(p.numel) + " over " + std::to_string(plan.world_size) +
          " ranks), more than zero_optimization.offload_param.buffer_size (" + std::to_string(plan.buffer_numel) +
          "); raise zero_optimization.offload_param.buffer_size to at least " + std::to_string(p.shard));
    }
  }
  return OkStatus();
}

Result<std::unique_ptr<ParamStore>> CreateHostParamStore(Device* device, Stream* stream, DType model_dtype,
                                                         int64_t numel, const std::vector<ParamShardInfo>& shards,
                                                         const ParamStorePlan& plan) {
  ZERO_RETURN_IF_ERROR(CheckShardsFitOneUpload(shards, plan));
  HostParamStoreOptions options;
  options.slab = SlabHolding(plan.slab, "parameter shards (offload_param.device \"cpu\")");
  options.scratch_numel = kParamStoreScratchNumel;
  auto store = HostParamStore::Create(device, stream, model_dtype, numel, options);
  if (!store.ok()) return store.status();
  return std::unique_ptr<ParamStore>(std::move(store).value());
}

// The shards in <nvme_dir>/params.swp, module by module (zero/nvme_param_store.h); a module larger
// than buffer_numel is refused there, naming it.
Result<std::unique_ptr<ParamStore>> CreateNvmeParamStore(Device* device, Stream* stream, DType model_dtype,
                                                         int64_t numel, const std::vector<ParamShardInfo>& shards,
                                                         const std::vector<std::string>& module_names,
                                                         const ParamStorePlan& plan) {
  std::vector<StoredShard> stored;
  for (const ParamShardInfo& p : shards) stored.push_back({p.name, p.offset, p.shard, p.module});
  NvmeParamStoreOptions options;
  options.dir = plan.nvme_dir;
  options.buffer_count = plan.buffer_count;
  options.buffer_numel = plan.buffer_numel;
  options.cache_numel = plan.cache_numel;
  options.aio = plan.aio;
  options.aio_engine_factory = plan.aio_engine_factory;
  options.file_system = plan.file_system;
  options.slab = SlabHolding(plan.slab, "parameter buffers (offload_param.device \"nvme\")");
  options.scratch_numel = kParamStoreScratchNumel;
  auto store = NvmeParamStore::Create(device, stream, model_dtype, numel, std::move(stored), module_names, options);
  if (!store.ok()) return store.status();
  return std::unique_ptr<ParamStore>(std::move(store).value());
}

// --- optimizer states ---

// The CPU AdamW's host states (kHost, and the host tier of kNvme).
HostOptimizerStatesOptions HostStatesOptions(const OptimizerStatesPlan& plan, std::string what) {
  HostOptimizerStatesOptions options;
  options.slab = SlabHolding(plan.slab, std::move(what));
  options.cpu_threads = plan.cpu_threads;
  options.model_dtype = plan.model_dtype;
  return options;
}

Result<OptimizerStorage> Stored(Result<std::unique_ptr<OptimizerStates>> states) {
  if (!states.ok()) return states.status();
  OptimizerStorage out;
  out.states = std::move(states).value();
  return out;
}

// AdamW on the device over the host states, streamed in chunks (docs/offload.md); with overlap_step
// the step's chunks are queued as the next forward reaches them (zero/deferred_step.h).
Result<OptimizerStorage> CreateChunkedStates(Device* device, Stream* stream, int64_t numel,
                                             const OptimizerStatesPlan& plan) {
  ChunkedOptimizerStatesOptions options;
  options.slab = SlabHolding(plan.slab, "optimizer states (offload_optimizer.update_device \"gpu\")");
  options.chunk_numel = plan.chunk_numel;
  options.chunk_buffers = plan.chunk_buffers;
  options.model_dtype = plan.model_dtype;  // 16-bit: the update in backward keeps a host model copy for Step's publish
  auto chunked = ChunkedOptimizerStates::Create(device, numel, stream, options);
  if (!chunked.ok()) return chunked.status();
  OptimizerStorage out;
  if (plan.overlap_step) {
    out.deferred_step =
        std::make_unique<DeferredStep>(device, stream, chunked.value().get(), plan.param_ranges, plan.model_dtype);
  }
  out.states = std::move(chunked).value();
  return out;
}

// One folder per rank; the swap file of a killed run there is refused. Tiered: as many elements
// as host_memory_budget holds (12 bytes each) in pinned host memory, the first ones; the rest on NVMe.
Result<OptimizerStorage> CreateNvmeStates(Device* device, Stream* stream, int64_t numel,
                                          const OptimizerStatesPlan& plan) {
  NvmeOptimizerStatesOptions nvme;
  nvme.dir = plan.nvme_dir;
  nvme.group_numel = plan.nvme_group_numel;
  nvme.buffer_count = plan.nvme_buffer_count;
  nvme.aio = plan.aio;
  nvme.aio_engine_factory = plan.aio_engine_factory;
  nvme.file_system = plan.file_system;
  nvme.slab = SlabHolding(plan.slab, "NVMe optimizer state buffers");
  nvme.cpu_threads = plan.cpu_threads;
  nvme.model_dtype = plan.model_dtype;
  const int64_t on_host = std::min<int64_t>(numel, plan.host_memory_budget / 12);
  if (on_host == 0) return Stored(CreateNvmeOptimizerStates(device, numel, stream, nvme));
  auto host_tier = CreateHostOptimizerStates(
      device, on_host, stream, HostStatesOptions(plan, "optimizer states (the host tier of host_memory_budget)"));
  if (!host_tier.ok()) return host_tier.status();
  auto nvme_tier = CreateNvmeOptimizerStates(device, numel - on_host, stream, nvme);
  if (!nvme_tier.ok()) return nvme_tier.status();
  return Stored(CreateTieredOptimizerStates(std::move(host_tier).value(), std::move(nvme_tier).value()));
}

}  // namespace

Result<std::unique_ptr<ParamStore>> CreateParamStore(Device* device, Stream* stream, DType model_dtype, int64_t numel,
                                                     const std::vector<ParamShardInfo>& shards,
                                                     const std::vector<std::string>& module_names,
                                                     const ParamStorePlan& plan) {
  switch (plan.placement) {
    case ParamPlacement::kHost:
      return CreateHostParamStore(device, stream, model_dtype, numel, shards, plan);
    case ParamPlacement::kNvme:
      return CreateNvmeParamStore(device, stream, model_dtype, numel, shards, module_names, plan);
    case ParamPlacement::kDevice:
      break;
  }
  return std::unique_ptr<ParamStore>();
}

namespace {

// The offloaded placements (kHost, kNvme) over `numel` elements.
Result<OptimizerStorage> CreateOffloadedStates(Device* device, Stream* stream, int64_t numel,
                                               const OptimizerStatesPlan& plan) {
  if (plan.placement == OptimizerPlacement::kNvme) return CreateNvmeStates(device, stream, numel, plan);
  return Stored(CreateHostOptimizerStates(
      device, numel, stream, HostStatesOptions(plan, "optimizer states (offload_optimizer.device \"cpu\")")));
}

}  // namespace

int64_t OnDeviceElements(int64_t numel, double offload_ratio) {
  if (offload_ratio >= 1.0) return 0;
  const int64_t offloaded = static_cast<int64_t>(std::floor(static_cast<double>(numel) * std::max(0.0, offload_ratio)));
  return numel - std::min(numel, offloaded);
}

Result<OptimizerStorage> CreateOptimizerStates(Device* device, Stream* stream, int64_t numel,
                                               const OptimizerStatesPlan& plan) {
  const bool offloaded = plan.placement == OptimizerPlacement::kHost || plan.placement == OptimizerPlacement::kNvme;
  const int64_t on_device = offloaded ? OnDeviceElements(numel, plan.offload_ratio) : 0;
  if (on_device > 0) {
    // Partial offload: the first elements on the device, the rest offloaded.
    auto device_tier = CreateDeviceOptimizerStates(device, on_device, stream);
    if (!device_tier.ok()) {
      return device_tier.status().WithContext("the device share of offload_optimizer.ratio (" +
                                              std::to_string(on_device) + " elements)");
    }
    ZERO_ASSIGN_OR_RETURN(OptimizerStorage rest, CreateOffloadedStates(device, stream, numel - on_device, plan));
    return Stored(CreateGpuTieredOptimizerStates(device, std::move(device_tier).value(), std::move(rest.states)));
  }
  switch (plan.placement) {
    case OptimizerPlacement::kHostChunked:
      return CreateChunkedStates(device, stream, numel, plan);
    case OptimizerPlacement::kHost:
      return Stored(CreateHostOptimizerStates(
          device, numel, stream, HostStatesOptions(plan, "optimizer states (offload_optimizer.device \"cpu\")")));
    case OptimizerPlacement::kNvme:
      return CreateNvmeStates(device, stream, numel, plan);
    case OptimizerPlacement::kDevice:
      break;
  }
  return Stored(CreateDeviceOptimizerStates(device, numel, stream));
}

GradPartitionPlacement ChooseGradPartition(const GradPartitionPlan& plan, OptimizerStates* states) {
  if (plan.view_accumulators) return GradPartitionPlacement::kAccumulatorView;
  if (plan.update_in_backward) return GradPartitionPlacement::kNone;  // engine.h, "Update in backward"
  // Optimizer offload with the CPU AdamW (host states that update from host gradients): the reduced
  // pieces stream to the host during backward, or are summed on the device and sent once per step.
  // Otherwise (no offload, update_device "gpu", NVMe states) on the device.
  if (states->updates_from_host() && states->host_thread_pool() != nullptr) {
    return plan.accumulate_on_device ? GradPartitionPlacement::kGpuAccumulated : GradPartitionPlacement::kHost;
  }
  return GradPartitionPlacement::kDevice;
}

Result<std::unique_ptr<GradPartition>> CreateGradPartition(Device* device, Stream* stream, int64_t numel,
                                                           std::vector<GradPiece> pieces, OptimizerStates* states,
                                                           const GradPartitionPlan& plan) {
  HostGradPartitionOptions host;
  switch (ChooseGradPartition(plan, states)) {
    case GradPartitionPlacement::kNone:
      return std::unique_ptr<GradPartition>();
    case GradPartitionPlacement::kAccumulatorView:
      return CreateDeviceGradPartitionView(device, stream, plan.accumulators, std::move(pieces));
    case GradPartitionPlacement::kDevice:
      return CreateDeviceGradPartition(device, stream, numel, std::move(pieces));
    case GradPartitionPlacement::kHost:
    case GradPartitionPlacement::kGpuAccumulated:
      host.slab = SlabHolding(plan.slab, "fp32 gradient partition (offload_optimizer.device \"cpu\")");
      host.pool = states->host_thread_pool();
      break;
  }
  return plan.accumulate_on_device ? CreateGpuAccumulatedGradPartition(device, stream, numel, std::move(pieces), host)
                                   : CreateHostGradPartition(device, stream, numel, std::move(pieces), host);
}

}  // namespace zero
