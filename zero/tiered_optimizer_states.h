// TieredOptimizerStates: one rank's optimizer states split between two OptimizerStates by element
// range, elements [0, split) in `first` and [split, numel) in `second`. The engine builds two
// kinds: pinned host memory first and NVMe for the rest (offload_optimizer.device "nvme" with
// host_memory_budget), and device memory first with the offloaded states for the rest
// (offload_optimizer.ratio below 1: a share of the states stays on the GPU, DeepSpeed's partial
// offload).
//
// Owns both. Every call is split at `split` and forwarded (offsets of the second made relative to
// it, pointers advanced by the first part's elements); results are those of the parts, so the
// tiering is bitwise invisible when both parts are. Thread safety: one thread.
//
// Updates from host gradients (updates_from_host()): the second part decides. Where it updates on
// the host but the first does not (device states), CreateGpuTieredOptimizerStates's states upload
// the first part's host gradients through a chunk-sized device buffer and update there (Update),
// so the engine keeps its host gradient partition and the CPU AdamW for the offloaded share.
#pragma once

#include <cstdint>
#include <memory>

#include "runtime/device.h"
#include "zero/optimizer_states.h"

namespace zero {

// REQUIRES: first->numel() + second->numel() is the total; either may be empty (numel 0).
std::unique_ptr<OptimizerStates> CreateTieredOptimizerStates(std::unique_ptr<OptimizerStates> first,
                                                             std::unique_ptr<OptimizerStates> second);

// Device states (`on_device`, elements [0, on_device->numel())) tiered with offloaded ones
// (`offloaded`, the rest). updates_from_host() and host_thread_pool() are the offloaded part's;
// UpdateFromHost over the device part copies the host gradients to `device` on the call's stream
// (at most 64 MiB at a time, synchronized before it returns, so `grads` may be reused) and runs
// Update there. casts_to_host() is false: the model copy is cast into device memory (CastMaster).
std::unique_ptr<OptimizerStates> CreateGpuTieredOptimizerStates(Device* device,
                                                                std::unique_ptr<OptimizerStates> on_device,
                                                                std::unique_ptr<OptimizerStates> offloaded);

}  // namespace zero
