// State factory: which storage one rank's ZeRO state gets, chosen and built from plain plans. It
// owns three choices: where stage 3's model-dtype parameter shards live (a ParamStore in pinned
// host memory or on NVMe, or none: the caller's device buffer), where the fp32 master weights and
// AdamW moments live and where their update runs (OptimizerStates on the device, in host memory
// with the CPU AdamW, in host memory updated on the device chunk by chunk - with the overlapped
// step's scheduler - or on NVMe behind an optional host tier), and which fp32 gradient partition
// the boundary reads (a view of the caller's accumulators, on the device, in host memory, summed
// on the device and sent to the host once per step, or none for the update in backward). It knows
// nothing of the engine's Config (the engine translates its config into these plans), allocates
// none of the engine's flat device buffers (model copy, accumulators) and keeps nothing: the
// caller owns what it returns. Errors are those of the components built, plus the parameter
// store's shard-size check, without context (the engine adds "Initialize").
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nvme/aio_engine.h"
#include "offload/host_slab.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/file_system.h"
#include "runtime/status.h"
#include "zero/deferred_step.h"
#include "zero/grad_partition.h"
#include "zero/optimizer_states.h"
#include "zero/param_store.h"

namespace zero {

// --- stage 3's parameter shards -------------------------------------------------------------------

enum class ParamPlacement {
  kDevice,  // the caller's device buffer: no ParamStore
  kHost,    // offload_param.device "cpu": one host slab (HostParamStore), uploaded for each gather
  kNvme,    // offload_param.device "nvme": a swap file, module by module (NvmeParamStore)
};

// One parameter's shard in the partition layout, for the stores and their messages.
struct ParamShardInfo {
  std::string name;
  int64_t numel = 0;   // the whole parameter's elements
  int64_t offset = 0;  // its shard's first element in the partition layout
  int64_t shard = 0;   // the shard's elements
  int module = -1;
};

struct ParamStorePlan {
  ParamPlacement placement = ParamPlacement::kDevice;
  HostSlabOptions slab;  // pinning and the config key its errors name (`what` is set here)
  int world_size = 1;    // for the shard-size message
  // offload_param.buffer_size: kHost the largest shard one upload takes; kNvme one module buffer.
  int64_t buffer_numel = 100000000;
  int buffer_count = 5;     // kNvme: module buffers in host memory
  int64_t cache_numel = 0;  // kNvme: offload_param.max_in_cpu
  std::string nvme_dir;     // kNvme: this rank's folder
  AioOptions aio;           // kNvme
  AioEngineFactory aio_engine_factory;
  FileSystem* file_system = nullptr;  // kNvme: the swap file's (null: the POSIX one)
};

// kHost / kNvme: the store of `numel` elements of `model_dtype` (zero), writes ordered on `stream`;
// kDevice: null. kHost refuses a shard larger than buffer_numel (InvalidArgument naming the
// parameter and offload_param.buffer_size), kNvme a module larger than it (NvmeParamStore).
Result<std::unique_ptr<ParamStore>> CreateParamStore(Device* device, Stream* stream, DType model_dtype, int64_t numel,
                                                     const std::vector<ParamShardInfo>& shards,
                                                     const std::vector<std::string>& module_names,
                                                     const ParamStorePlan& plan);

// --- fp32 master weights and AdamW moments --------------------------------------------------------

enum class OptimizerPlacement {
  kDevice,       // no offload: three device buffers, AdamW on the device
  kHost,         // offload_optimizer.device "cpu": pinned host memory, the CPU AdamW
  kHostChunked,  // "cpu" with update_device "gpu": pinned host memory, AdamW on the device in chunks
  kNvme,         // "nvme": a swap file and the CPU AdamW, the first host_memory_budget / 12 elements on the host
  // kHost and kNvme with offload_ratio below 1 keep their first elements on the device (below).
};

struct OptimizerStatesPlan {
  OptimizerPlacement placement = OptimizerPlacement::kDevice;
  DType model_dtype = DType::kF32;
  HostSlabOptions slab;  // the offloaded placements: pinning and the config key errors name (`what` set here)
  int cpu_threads = 0;   // kHost, kNvme: the CPU AdamW's threads (0: hardware threads)
  // kHostChunked: elements per chunk and staging sets; with overlap_step also the overlapped
  // step's scheduler (DeferredStep) over `param_ranges` (each parameter's state elements).
  int64_t chunk_numel = int64_t{1} << 24;
  int chunk_buffers = 3;
  bool overlap_step = false;
  std::vector<DeferredStep::Range> param_ranges;
  // kNvme: this rank's folder, zero_optimization.sub_group_size, the group buffers, the aio engine;
  // host_memory_budget bytes of the states (12 per element, the first ones) in pinned host memory.
  std::string nvme_dir;
  int64_t nvme_group_numel = 1000000000;
  int nvme_buffer_count = 4;
  AioOptions aio;
  AioEngineFactory aio_engine_factory;
  FileSystem* file_system = nullptr;  // kNvme: the swap file's (null: the POSIX one)
  int64_t host_memory_budget = 0;
  // kHost, kNvme: offload_optimizer.ratio, the share of the elements offloaded. Below 1 the first
  // numel - floor(numel * ratio) elements stay on the device (device states, AdamW on the device)
  // and the offloaded placement holds the rest (CreateGpuTieredOptimizerStates): the partition's
  // first elements are the first registered parameters, whose gradients arrive last in backward,
  // so what remains of the update after backward runs on the GPU.
  double offload_ratio = 1.0;
};

// What CreateOptimizerStates builds. `deferred_step` (kHostChunked with overlap_step, else null)
// runs on `states` and must go first (declared after it, so a plain destruction is in order).
struct OptimizerStorage {
  std::unique_ptr<OptimizerStates> states;
  std::unique_ptr<DeferredStep> deferred_step;
};

// The elements of `numel` that stay on the device at offload_ratio: numel - floor(numel * ratio)
// (DeepSpeed offloads the first int(ratio * sub-groups) of its sub-groups); 0 at ratio 1.
int64_t OnDeviceElements(int64_t numel, double offload_ratio);

// `numel` elements of each state, zero, placed as `plan` says; copies ordered on `stream`.
Result<OptimizerStorage> CreateOptimizerStates(Device* device, Stream* stream, int64_t numel,
                                               const OptimizerStatesPlan& plan);

// --- the fp32 gradient partition ------------------------------------------------------------------

enum class GradPartitionPlacement {
  kNone,             // the update in backward: gradients go straight into AdamW
  kAccumulatorView,  // stage 0, stage 1 with one rank: the caller's fp32 accumulators are the partition
  kDevice,           // one device buffer
  kHost,             // optimizer offload with the CPU AdamW: pinned host memory, streamed there in backward
  kGpuAccumulated,   // the same, summed on the device and sent once per step (offload_grad_accumulation "gpu")
};

struct GradPartitionPlan {
  // The caller's fp32 accumulators are the partition: a view of `accumulators` (device memory, not
  // owned; null when the layout is empty).
  bool view_accumulators = false;
  float* accumulators = nullptr;
  bool update_in_backward = false;
  bool accumulate_on_device = false;  // host partitions: offload_grad_accumulation "gpu"
  HostSlabOptions slab;               // host partitions: pinning and the config key errors name (`what` set here)
};

// A view with view_accumulators; else none with update_in_backward; else on the host where
// `states` update from host memory on a thread pool (which the partition shares); else the device.
GradPartitionPlacement ChooseGradPartition(const GradPartitionPlan& plan, OptimizerStates* states);

// The partition ChooseGradPartition names (null for kNone): `numel` fp32 elements, zero, one piece
// per parameter; device work on `stream`.
Result<std::unique_ptr<GradPartition>> CreateGradPartition(Device* device, Stream* stream, int64_t numel,
                                                           std::vector<GradPiece> pieces, OptimizerStates* states,
                                                           const GradPartitionPlan& plan);

}  // namespace zero
