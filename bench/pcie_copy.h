// The measurement of bench/pcie_bench (the "PCIe floor" of docs/performance.md): timed pinned
// host<->device copies with the CUDA runtime, one direction alone or both at once on two streams.
// Owns nothing past a call: every buffer is allocated and freed inside MeasurePcie. Only built
// with the CUDA toolkit (bench/BUILD).
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/status.h"

namespace zero::bench {

// Seconds of each repetition of one transfer size. Each `both` entry is the wall time from a
// common start until both copies (bytes host->device on one stream, bytes device->host on
// another) have finished; both_h2d / both_d2h are each copy's own time within it.
struct PcieTimes {
  int64_t bytes = 0;
  std::vector<double> h2d, d2h, both, both_h2d, both_d2h;
};

// For each size in `bytes` (ascending or not): `warmup` untimed then `reps` timed repetitions of
// H2D alone, D2H alone and both at once, timed with CUDA events, on device `device`. Host buffers
// are cudaHostAlloc'ed (pinned, portable), of the largest size, and written before the first copy.
// Errors name the CUDA call and the size.
Result<std::vector<PcieTimes>> MeasurePcie(int device, const std::vector<int64_t>& bytes, int warmup, int reps);

}  // namespace zero::bench
