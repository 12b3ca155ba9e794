// The equivalence harness: what one training run is (Schedule), what it produced (traces), how the
// engine is driven through it on one rank (RunEngineRank), and how an engine rank's trace is
// compared with the reference's (CompareRankTrace). Shared by the CPU gtest suite and the GPU
// binary; the reference itself is in reference.h.
//
// A Schedule is a list of windows (optimizer steps); each window is a list of micro steps (one
// Backward each) saying which heads the model uses, what the user divides the loss by, and which
// rank (if any) gets a batch that overflows fp16. Managed runs have exactly GAS micro steps per
// window and call Step() after every Backward(); unmanaged runs call Step() once per window.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "engine/config/config.h"
#include "engine/engine.h"
#include "runtime/device.h"
#include "runtime/status.h"
#include "tests/equivalence/test_model.h"

namespace zero::equivalence {

// A target scale that makes every scaled fp16 gradient of that rank overflow to Inf.
inline constexpr float kOverflowTargetScale = 1e20f;

struct MicroSpec {
  Heads heads;
  // Non-empty: rank r uses rank_heads[r] instead of `heads` (ranks using different parameters in
  // one micro step); every rank gathers the modules any rank uses (gathers are collective) and
  // reports only its own heads' gradients.
  std::vector<Heads> rank_heads;
  float loss_divisor = 1.0f;  // the user divides the loss (seeds the gradient) by this
  int overflow_rank = -1;     // this rank's batch forces an fp16 overflow
};

struct Window {
  std::vector<MicroSpec> micros;
};

// The heads rank `rank` uses in micro step `m`, and those some rank uses.
Heads HeadsOf(const MicroSpec& m, int rank);
Heads UnionHeads(const MicroSpec& m);

struct Schedule {
  std::vector<Window> windows;
  bool managed = true;
  // Odd ranks report gradients in forward order (modules and parameters) after the backward's last
  // gather, even ranks in reverse during it.
  bool odd_ranks_report_forward = false;
  // Odd ranks report each module's parameters in forward order, still while the module is gathered
  // in backward (even ranks: reverse).
  bool odd_ranks_report_params_forward = false;
  // Every rank reports after the backward's last gather, in forward order.
  bool every_rank_reports_after_gathers = false;
  bool snapshots = false;  // record weights and AdamW moments after every window
};

// Managed schedule: `steps` windows of `gas` micro steps; head B is used only in micro steps whose
// global index (window * gas + micro) is even, so it gets no gradient in the others.
Schedule ManagedSchedule(int steps, int gas);

// What one boundary produced.
struct StepRecord {
  float loss_scale_used = 0;  // the loss scale the user multiplied in during the window
  double lr_used = 0;         // engine lr() before the boundary: the lr this step uses if applied
  bool applied = false;
  double grad_norm = 0;  // global_grad_norm() after the boundary
  float loss_scale_after = 0;
  int64_t global_steps = 0;
  int64_t skipped_steps = 0;
  int64_t adam_step = 0;
};

using Tensors = std::vector<std::vector<float>>;  // per parameter, full, as float

// One engine rank's record of a run.
struct RankTrace {
  std::vector<std::vector<float>> losses;  // [window][micro]
  std::vector<StepRecord> steps;
  Tensors initial_master, initial_model;
  Tensors master, model;                  // after the last window
  Tensors exp_avg, exp_avg_sq;            // AdamW moments after the last window
  std::vector<Tensors> master_snapshots;  // [window] (Schedule::snapshots)
  std::vector<Tensors> model_snapshots;
  std::vector<Tensors> exp_avg_snapshots, exp_avg_sq_snapshots;
  EngineMemory memory;             // after the last window, no module gathered
  std::vector<std::string> notes;  // protocol violations seen while driving (empty = none)
};

// The reference's record: the same, with every rank's losses.
struct RefTrace {
  std::vector<std::vector<std::vector<float>>> losses;  // [window][micro][rank]
  std::vector<StepRecord> steps;
  Tensors initial_master, initial_model;
  Tensors master, model;
  Tensors exp_avg, exp_avg_sq;
  std::vector<Tensors> master_snapshots, model_snapshots;
  std::vector<Tensors> exp_avg_snapshots, exp_avg_sq_snapshots;
  std::vector<std::string> names;  // parameter names (for messages)
  int clipped_steps = 0;           // boundaries whose clip coefficient exceeded 1
  int overflow_steps = 0;          // boundaries skipped for fp16 overflow
};

struct DriverOptions {
  // Synchronize the whole device (not only the default stream) before reading a parameter and
  // after writing a gradient: for diagnosing a stream-ordering problem on CUDA.
  bool sync_device = false;
};

// Drives an engine through `schedule` on this rank (every rank calls it; collective). Parameters
// are read with Device::Copy on the default stream (then synchronized); gradients are written the
// same way before GradReady.
Status RunEngineRank(const Config& config, const CellModel& model, const Schedule& schedule, Device* device,
                     Communicator* comm, RankTrace* out, const DriverOptions& options = {});
// The same with the suite's small model (MlpCellModel(dims)).
Status RunEngineRank(const Config& config, const ModelDims& dims, const Schedule& schedule, Device* device,
                     Communicator* comm, RankTrace* out, const DriverOptions& options = {});

// How far an engine rank may be from the reference. Zero everywhere means bitwise.
struct Tolerance {
  // |norm_engine - norm_ref| <= norm_rel * norm_ref. 0 on the CPU backend (the reference sums in
  // CpuDevice's order). CUDA's SumOfSquares sums in its own order: the same non-negative double
  // terms in another order differ by at most 2 (n - 1) 2^-53 relative (n = elements).
  double norm_rel = 0.0;
  // Weights (master and model), moments and losses: allowed ulps (0 = memcmp-equal bits).
  int weight_ulps = 0;
  int loss_ulps = 0;
};

// Appends one line per mismatch (at most a few per item, first differing element with both
// values and their bits) to `out`. Returns the number of mismatching items.
int CompareRankTrace(const RefTrace& ref, int rank, const RankTrace& got, const Tolerance& tol,
                     std::vector<std::string>* out);

// ulp distance between two floats (same sign ordering; 0 when bitwise equal; NaN/Inf: 0 only if
// bitwise equal, else a large number).
int64_t UlpDistance(float a, float b);
std::string FloatBitsString(float f);

// The JSON config of one cell.
struct CellSpec {
  int stage = 0;
  int world = 1;
  DType dtype = DType::kF32;
  int gas = 1;
  double clip = 0.0;
  bool managed = true;
  bool freeze_inactive = false;    // freeze_inactive_parameters
  bool offload_optimizer = false;  // offload_optimizer.device "cpu" (CPU AdamW, host states)
  // With offload_optimizer: "nvme" instead, swap files (real O_DIRECT I/O) under NvmeTestDir()
  // (ScratchDir::CreateWithDirectIo), sub_group_size 300, 2 group buffers.
  bool nvme = false;
  int64_t host_memory_budget = 0;  // with nvme: the tiered host part (bytes, 12 per element)
  // With offload_optimizer ("cpu" or "nvme", not gpu_update_chunk), below 1: offload_optimizer.ratio,
  // partial offload (stage 3; docs/offload.md, "Partial offload"): the first numel - floor(numel *
  // ratio) elements of each rank's partition keep their states on the device with the device AdamW,
  // the rest are offloaded (with nvme and host_memory_budget: three tiers). Names end "_r50" (0.5).
  double offload_ratio = 1.0;
  // With offload_optimizer (not nvme), above 0: update_device "gpu" (AdamW on the device over the
  // host states, streamed in chunks of this many elements through 3 staging sets).
  int64_t gpu_update_chunk = 0;
  // With gpu_update_chunk: offload_optimizer.overlap_step (the update queued under the next forward).
  bool overlap_step = false;
  // Stage 3: offload_param.device "cpu" (the shards in host memory, buffer_count 2).
  bool offload_param = false;
  // With offload_optimizer "cpu" and offload_param: offload_grad_accumulation "gpu" (the fp32 sum on
  // the device, sent to the host once per step) instead of the default "cpu".
  bool gpu_grad_accumulation = false;
  // With offload_param: "nvme" instead (a swap file per rank under the nvme cells' folder, real
  // O_DIRECT I/O, buffer_count 2, max_in_cpu 0: every module read through the buffers).
  bool nvme_param = false;
  int loss_scale_window = 1000;
  int hysteresis = 2;
  int initial_scale_power = 12;
  int64_t persistence_threshold = 16;
  int64_t reduce_bucket_size = 100;
  int64_t sub_group_size = 300;  // nvme cells: elements per swapped sub-group
  int micro_batch = 4;           // train_micro_batch_size_per_gpu (the batch arithmetic only)
  std::string Name() const;      // "s2_w3_bf16_gas4_clip"
};
std::string CellConfigJson(const CellSpec& cell);
std::string NvmeTestDir();

// The stage-3 small-parameter threshold etc. are in the JSON; the sum of all parameters' numel.
int64_t TotalNumel(const ModelDims& dims);

}  // namespace zero::equivalence
