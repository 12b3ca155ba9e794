// HostOptimizerStates: OptimizerStates in host memory (offload_optimizer.device "cpu"), updated by
// the CPU AdamW (offload/cpu_adam.h) on the engine's thread pool.
//
// Owns one HostSlab (offload/host_slab.h: one allocation, NUMA-local to the device, pinned as the
// options say) holding the three fp32 states, a host copy of the masters rounded to the model
// dtype (kept equal to round(master) at all times, so publishing the weights is one host->device
// copy), the transfer chunks, the thread pool and one worker thread for the update in backward.
// Bitwise the same as DeviceOptimizerStates: CpuAdamW equals Device::AdamWCast element by element
// and the widening of 16-bit gradients is CpuDevice::AccumulateFirst.
//
// Update (fp32 gradients on the device): each chunk is copied device->host, updated, and (with
// model_out) copied host->device from the model copy, the next chunk's gradients being copied in
// meanwhile (two buffers). UpdateFromGradient: the chunk's model-dtype gradients are copied into a
// ring of pinned slots on the caller's stream and the worker updates them as they land, so the
// caller (the engine, in backward) goes on at once; it blocks only when every slot is in use.
//
// UpdateFromHost (updates_from_host() is true): fp32 gradients already in host memory (the host
// gradient partition, zero/grad_partition.h) are updated in place, no transfer chunk; the thread
// pool is shared with that partition's adds and norm (host_thread_pool()).
//
// CastMasterToHost (casts_to_host() is true) copies the model copy (or rounds the masters) into
// host memory: offload_param "cpu" writes its host shards so, without a device round trip.
//
// With the CPU backend "device memory" is host memory and the copies are memcpy: CI runs these
// code paths. The engine's thread calls every method; the worker only runs queued updates.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "offload/host_slab.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/status.h"
#include "zero/optimizer_states.h"

namespace zero {

struct HostOptimizerStatesOptions {
  HostSlabOptions slab;                    // pinning, NUMA, the config key errors name
  int cpu_threads = 0;                     // CPU AdamW threads; 0: hardware threads
  DType model_dtype = DType::kF32;         // of the host model copy
  int64_t chunk_numel = int64_t{1} << 22;  // elements per transfer chunk (16 MiB of fp32); at most numel
  int ring_slots = 4;                      // gradient slots of the update in backward
};

// `numel` elements of each state, zero; copies ordered on `stream` (the engine's compute stream).
Result<std::unique_ptr<OptimizerStates>> CreateHostOptimizerStates(Device* device, int64_t numel, Stream* stream,
                                                                   const HostOptimizerStatesOptions& options);

}  // namespace zero
