// ParamStore: where stage 3 keeps this rank's model-dtype parameter shards when they are offloaded
// (zero_optimization.offload_param.device "cpu" or "nvme"), in the engine's partition layout.
//
// One interface, two implementations: HostParamStore (host_param_store.h: every shard in one
// pinned host slab) and NvmeParamStore (nvme_param_store.h: the shards in a swap file, module by
// module, read into pinned host buffers on demand). The engine writes the shards through it (the
// initial values, the new weights after each update, a loaded checkpoint) and reads them back
// (GatherModelParam); the ParamCoordinator uploads them for its gathers either straight from
// host_address() (every shard always in host memory) or through module_store() (the shards of
// one module brought into host memory at a time: ModuleShardStore in param_coordinator.h).
//
// Protocol: writes only between the coordinator's QuiesceForUpdate and AfterUpdate (or before the
// coordinator exists); elements outside every parameter's shard (the alignment gaps of the flat
// layout) are zero and writes to them are dropped by stores that do not keep them.
// Thread safety: none (the engine's thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "runtime/status.h"
#include "zero/optimizer_states.h"
#include "zero/trace_observer.h"

namespace zero {

class ModuleShardStore;  // zero/param_coordinator.h

class ParamStore {
 public:
  // Enqueues on the store's stream the values of elements [offset + at, offset + at + len) of a
  // Write into device memory `dst` (len <= the store's device scratch).
  using Producer = std::function<Status(void* dst, int64_t at, int64_t len)>;

  virtual ~ParamStore() = default;

  virtual int64_t numel() const = 0;
  // Elements [offset, offset + n) from `produce`, chunk by chunk through a device scratch.
  virtual Status Write(int64_t offset, int64_t n, const Producer& produce) = 0;
  // Elements [offset, offset + n) = the masters of `states` at the same offsets, rounded to the
  // model dtype (on the host where states->casts_to_host()).
  virtual Status WriteFromMasters(OptimizerStates* states, int64_t offset, int64_t n) = 0;
  // Elements [offset, offset + n) to device memory `dst`, enqueued on the stream (a store that
  // reuses its host buffers waits for the copy before returning).
  virtual Status CopyToDevice(int64_t offset, int64_t n, void* dst) = 0;

  // Host address of element `offset` when every shard stays in host memory for good (the
  // coordinator then uploads from it), else nullptr.
  virtual const void* host_address(int64_t offset) const = 0;
  // When host_address() is nullptr: the coordinator's view of the store (module by module).
  virtual ModuleShardStore* module_store() = 0;

  virtual size_t host_bytes() const = 0;           // host memory held (slabs, buffers, caches)
  virtual size_t device_bytes() const = 0;         // device memory held (the scratch)
  virtual size_t nvme_bytes() const { return 0; }  // swap file size

  // The per-stream trace's hook (zero/trace_observer.h; null: none); set before the store is used.
  void set_observer(StreamObserver* o) { observer_ = o; }

 protected:
  StreamObserver* observer_ = nullptr;
};

}  // namespace zero
