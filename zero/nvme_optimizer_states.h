// NvmeOptimizerStates: OptimizerStates on NVMe (offload_optimizer.device "nvme"), swapped through
// the libaio engine (nvme/) group by group and updated by the CPU AdamW.
//
// Owns the swap file <dir>/optimizer_states.swp (created at Create, removed by the destructor; a
// leftover of a killed run is refused with its path), the aio engine, and one host slab holding
// `buffer_count` group buffers, the model-dtype copy of the masters (kept equal to round(master),
// so publishing the weights is one host->device copy) and the transfer chunks. The elements are
// split into groups of `group_numel` (zero_optimization.sub_group_size); a group's three states
// are one region of the file, [master | exp_avg | exp_avg_sq], CRC32C-checked on every read. An
// update reads each group it touches, runs the CPU AdamW on its part, and writes it back, the next
// group's read and the previous group's write in flight meanwhile (buffer_count >= 2). Bitwise the
// same as the other OptimizerStates (the same CPU AdamW and widening).
//
// Errors: a swap file error (EIO, ENOSPC, end of file, truncation, checksum) is returned naming the
// file, region, offset and length, with what to do; after it every call is refused
// (FailedPrecondition carrying the first error): the states are not used again (docs/nvme.md
// "Faults during training").
//
// Host memory (one slab): min(buffer_count, max(groups, 2)) group buffers of 12 x min(group_numel,
// numel) bytes plus the model copy (its dtype's size per element) plus two transfer chunks of
// 4 x min(chunk_numel, numel) bytes (each rounded up to 4096); disk: 12 bytes per element. Thread
// safety: one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "nvme/aio_engine.h"
#include "offload/host_slab.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/file_system.h"
#include "runtime/status.h"
#include "zero/optimizer_states.h"

namespace zero {

struct NvmeOptimizerStatesOptions {
  std::string dir;                   // created if missing (one rank's folder under nvme_path)
  int64_t group_numel = 1000000000;  // sub_group_size
  int buffer_count = 4;              // group buffers in host memory, >= 2
  AioOptions aio;
  // Creates the aio engine from `aio` (empty: LibaioEngine). Tests inject faults through it.
  AioEngineFactory aio_engine_factory;
  // Creates, preallocates, checks and removes the swap file (SwapFileOptions::file_system); null: the
  // POSIX one. Tests inject faults through it.
  FileSystem* file_system = nullptr;
  HostSlabOptions slab;
  int cpu_threads = 0;
  DType model_dtype = DType::kF32;
  int64_t chunk_numel = int64_t{1} << 22;  // device<->host transfer chunk
};

Result<std::unique_ptr<OptimizerStates>> CreateNvmeOptimizerStates(Device* device, int64_t numel, Stream* stream,
                                                                   const NvmeOptimizerStatesOptions& options);

}  // namespace zero
