// TieredOptimizerStates: one rank's optimizer states split between two OptimizerStates by element
// range, elements [0, split) in `first` and [split, numel) in `second` (the engine: pinned host
// memory first, NVMe for the rest: offload_optimizer.device "nvme" with host_memory_budget).
//
// Owns both. Every call is split at `split` and forwarded (offsets of the second made relative to
// it, pointers advanced by the first part's elements); results are those of the parts, so the
// tiering is bitwise invisible when both parts are. Thread safety: one thread.
#pragma once

#include <cstdint>
#include <memory>

#include "zero/optimizer_states.h"

namespace zero {

// REQUIRES: first->numel() + second->numel() is the total; either may be empty (numel 0).
std::unique_ptr<OptimizerStates> CreateTieredOptimizerStates(std::unique_ptr<OptimizerStates> first,
                                                             std::unique_ptr<OptimizerStates> second);

}  // namespace zero
