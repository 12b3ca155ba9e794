// HostOptimizerStates: OptimizerStates in host memory (offload_optimizer.device "cpu"), updated by
// the CPU AdamW (offload/cpu_adam.h) on the engine's thread pool.
//
// Owns one HostSlab (offload/host_slab.h) holding the three fp32 states (one allocation, NUMA-local
// to the device and pinned as the options say), two pinned transfer chunks (fp32 gradients in,
// model-dtype weights out) and the thread pool. The gradients stay in device memory until Update:
// each chunk is copied device->host, updated, and the new model-dtype weights copied host->device
// while the next chunk's gradients are copied in (two transfer buffers of each kind, so a chunk's
// copies overlap the neighbouring chunk's CPU update). Bitwise the same as DeviceOptimizerStates:
// CpuAdamW equals Device::AdamWCast element by element.
//
// With the CPU backend "device memory" is host memory and the copies are memcpy: CI runs these
// code paths. Thread safety: the engine's thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "offload/host_slab.h"
#include "runtime/device.h"
#include "runtime/status.h"
#include "zero/optimizer_states.h"

namespace zero {

struct HostOptimizerStatesOptions {
  HostSlabOptions slab;     // pinning, NUMA, the config key errors name
  int cpu_threads = 0;      // CPU AdamW threads; 0: hardware threads
  int64_t chunk_numel = int64_t{1} << 22;  // elements per transfer chunk (16 MiB of fp32)
};

// `numel` elements of each state, zero; copies ordered on `stream` (the engine's compute stream).
Result<std::unique_ptr<OptimizerStates>> CreateHostOptimizerStates(Device* device, int64_t numel, Stream* stream,
                                                                   const HostOptimizerStatesOptions& options);

}  // namespace zero
