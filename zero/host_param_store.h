// HostParamStore: stage 3's model-dtype parameter shards in host memory (offload_param.device
// "cpu"), in the engine's partition layout. A ParamStore (param_store.h) whose host_address() is
// always valid.
//
// Owns one HostSlab (offload/host_slab.h: one allocation, NUMA-local to the device, pinned as the
// options say) of `numel` model-dtype elements, zeroed (so padding and gaps stay zero), and a
// device scratch of up to `scratch_numel` elements through which values produced on the device
// (a cast, an AdamWCast) reach the slab: each chunk is produced into the scratch on the stream,
// then copied device->host on the same stream. The ParamCoordinator reads the slab (its uploads,
// ShardSource::kHost); the caller keeps the coordinator's protocol (write only between
// QuiesceForUpdate and AfterUpdate, or before the coordinator exists).
//
// Ordering: Write and CopyToDevice enqueue on the stream given at Create (the engine's compute
// stream); WriteFromMasters with host states (OptimizerStates::casts_to_host) first waits for that
// stream, then writes on the host (blocking). Thread safety: none (the engine's thread).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "offload/host_slab.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/status.h"
#include "zero/optimizer_states.h"
#include "zero/param_store.h"

namespace zero {

struct HostParamStoreOptions {
  HostSlabOptions slab;                      // pinning, NUMA, the config key errors name
  int64_t scratch_numel = int64_t{1} << 22;  // device scratch elements (model dtype)
};

class HostParamStore final : public ParamStore {
 public:
  static Result<std::unique_ptr<HostParamStore>> Create(Device* device, Stream* stream, DType dtype, int64_t numel,
                                                        const HostParamStoreOptions& options);

  // Host address of element `offset`.
  void* at(int64_t offset) const { return ElementPtr(slab_.data(), dtype_, offset); }
  int64_t numel() const override { return numel_; }

  // Elements [offset, offset + n) from `produce`, chunk by chunk through the scratch.
  Status Write(int64_t offset, int64_t n, const Producer& produce) override;
  // Elements [offset, offset + n) = the masters of `states` at the same offsets, rounded to the
  // model dtype: on the host where states->casts_to_host(), else CastMaster through the scratch.
  Status WriteFromMasters(OptimizerStates* states, int64_t offset, int64_t n) override;
  // Elements [offset, offset + n) to device memory `dst`, on the stream.
  Status CopyToDevice(int64_t offset, int64_t n, void* dst) override;

  const void* host_address(int64_t offset) const override { return at(offset); }
  ModuleShardStore* module_store() override { return nullptr; }
  size_t host_bytes() const override { return slab_.bytes(); }
  size_t device_bytes() const override { return scratch_.bytes(); }  // the scratch
  bool pinned() const { return slab_.pinned(); }

 private:
  HostParamStore(Device* device, Stream* stream, DType dtype, int64_t numel)
      : device_(device), stream_(stream), dtype_(dtype), numel_(numel) {}
  Status Check(int64_t offset, int64_t n, const char* call) const;

  Device* device_;
  Stream* stream_;
  DType dtype_;
  int64_t numel_;
  int64_t scratch_numel_ = 0;
  HostSlab slab_;
  DeviceBuffer scratch_;
};

}  // namespace zero
