// The ZeRO equivalence suite: the engine, run as N thread ranks over Gloo on the CPU backend, must
// reproduce the single-process reference (reference.h) of docs/zero.md's arithmetic contract.
//
// Cells and what is compared (docs/equivalence.md has the table and the reasons):
//   Matrix:     stage {0,1,2,3} x world {1,2,3,4} x dtype {fp32,bf16,fp16} x GAS {1,4} x clipping
//               {off, 0.05}: 192 cells, 4 optimizer steps, WarmupLR, weight decay 0.1. Every rank's
//               loss per micro step, lr, loss scale, was_step_applied, counters, and the initial
//               and final fp32 master weights, model parameters and AdamW moments, and
//               global_grad_norm: all BITWISE (memcmp-equal bits).
//   Overflow:   fp16, stages 0-3, world {1,2,3}, GAS {1,4}: a huge target on the last rank in
//               windows 1 and 2 overflows fp16; both steps skipped on all ranks, the loss scale
//               keeps (hysteresis 2), then halves, then grows (window 2): bitwise as the reference.
//   Unmanaged:  managed_gradient_accumulation false, stages 0-3, world {2,3}, all dtypes, windows
//               [A x2, B x5, A x3] (A uses head A only, B head B only), the user divides the loss
//               by the count, x freeze_inactive_parameters {false, true}: by default a parameter
//               inactive in a window is stepped with a zero gradient (DeepSpeed; it moves), with
//               the freeze it keeps weights and moments (weights and moments compared with the
//               reference after every window, bitwise).
//   UnmanagedEqualsManaged: stages 0-3, world 2, all dtypes, GAS 2, freeze {false, true}: the
//               unmanaged engine (the user divides by 2, Step() after every 2 backwards) against
//               the managed engine on the same micro-batches (head B only in every other micro
//               step): engine against engine, every rank's losses, norms, counters, weights and
//               moments bitwise.
//   CrossOrder: engine stage 1 vs engine stage 2 (the two reduction orders): bitwise where the
//               orders coincide (world 1, or fp32 at GAS 1), otherwise within a dtype-derived
//               tolerance on the weight change.
//   DifferentHeads: stages 0-2, world {2,3}, fp32/bf16, managed (GAS 2) and unmanaged: ranks
//               use different heads in one micro step (rank 0 head A, rank 1 head B, rank 2 both,
//               swapped between micro steps) and odd ranks report in forward order: bitwise as
//               the reference, where a rank's unreported gradient is zero.
//   Unmanaged with offload: the Unmanaged windows with offload_optimizer "cpu" (stages 1-3),
//               "nvme"/tiered, offload_param "cpu" (+ optimizer none/"cpu"), offload_param "nvme"
//               (+ optimizer none/"cpu"/"nvme"), offload_grad_accumulation "gpu", update_device
//               "gpu" (stages 1-3, worlds 1-2) and overlap_step (world 1); fp16 overflows inside
//               unmanaged windows with optimizer/param offload; DifferentHeads at stage 3 with
//               param and/or optimizer offload, managed and unmanaged: bitwise as the reference.
//   Partial offload: offload_optimizer.ratio 0.5 at stage 3 (RatioMatrix: "cpu", worlds 1-2,
//               fp32/bf16, GAS 1/4, clipping; TieredRatioMatrix: "nvme" + host_memory_budget,
//               bf16): bitwise as the reference, with masters and moments on the device.
//   Memory:     per rank, stage k's master/optimizer (k>=1), fp32 gradient accumulator (k>=2) and parameter
//               (k=3) bytes are 1/N of stage 0's, within per-parameter padding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "comm/thread_ranks.h"
#include "engine/config/config.h"
#include "testing/status_matchers.h"
#include "tests/equivalence/cell_checks.h"
#include "tests/equivalence/harness.h"
#include "tests/equivalence/reference.h"
#include "tests/equivalence/test_model.h"

namespace zero::equivalence {
namespace {

constexpr int kSteps = 4;
constexpr double kClip = 0.05;

// Runs the engine on `world` thread ranks; every rank's trace.
Status RunEngine(const Config& config, int world, const Schedule& schedule, std::vector<RankTrace>* traces,
                 const ModelDims& dims = ModelDims()) {
  traces->assign(world, RankTrace());
  return RunThreadRanks(world, [&](int rank, Communicator* comm, Device* device) -> Status {
    return RunEngineRank(config, dims, schedule, device, comm, &(*traces)[rank]);
  });
}

// On the CPU backend everything is bitwise, the grad norm included: the reference sums the
// squares in the contract's order with CpuDevice's lane order (reference.h).
Tolerance ContractTolerance() { return Tolerance(); }

// ---------------------------------------------------------------------------------------------
// The 192-cell matrix.

using MatrixParam = std::tuple<int, int, DType, int, bool>;  // stage, world, dtype, GAS, clip

CellSpec MatrixCell(const MatrixParam& p) {
  CellSpec c;
  c.stage = std::get<0>(p);
  c.world = std::get<1>(p);
  c.dtype = std::get<2>(p);
  c.gas = std::get<3>(p);
  c.clip = std::get<4>(p) ? kClip : 0.0;
  return c;
}

class MatrixTest : public ::testing::TestWithParam<MatrixParam> {};

void ExpectStatesOffTheDevice(const std::vector<RankTrace>& traces);
void ExpectStatesSplit(const CellSpec& cell, const std::vector<RankTrace>& traces);
void ExpectTiers(const CellSpec& cell, const std::vector<RankTrace>& traces);
void ExpectGradientPartition(const CellSpec& cell, const std::vector<RankTrace>& traces);

void RunMatrixCell(const CellSpec& cell) {
  const Config config = ParseCell(cell);
  ASSERT_FALSE(::testing::Test::HasFailure());
  const Schedule schedule = ManagedSchedule(kSteps, cell.gas);
  Result<RefTrace> ref = RunReference(config, cell.world, OrderOfStage(cell.stage), ModelDims(), schedule);
  ASSERT_OK(ref);
  // The reference must exercise what the cell claims to test.
  EXPECT_EQ(ref->overflow_steps, 0) << "an unforced fp16 overflow: the cell tests nothing";
  if (cell.clip > 0) {
    EXPECT_EQ(ref->clipped_steps, kSteps) << "clipping must clip every step of a clipping cell";
  } else {
    EXPECT_EQ(ref->clipped_steps, 0);
  }
  std::vector<RankTrace> traces;
  Status st = RunEngine(config, cell.world, schedule, &traces);
  ASSERT_OK(st);
  ExpectMatches(*ref, traces, ContractTolerance());
  if (cell.offload_optimizer && cell.offload_ratio < 1.0) {
    ExpectStatesSplit(cell, traces);
    ExpectTiers(cell, traces);
    ExpectGradientPartition(cell, traces);
  } else if (cell.offload_optimizer) {
    ExpectStatesOffTheDevice(traces);
    ExpectTiers(cell, traces);
    ExpectGradientPartition(cell, traces);
  }
  for (size_t r = 0; r < traces.size() && cell.offload_param; ++r) {
    EXPECT_GT(traces[r].memory.host_params, 0u) << "rank " << r << ": no shards in host memory";
  }
}

TEST_P(MatrixTest, EngineEqualsReferenceBitwise) { RunMatrixCell(MatrixCell(GetParam())); }

// An offload cell must really keep its states off the device (else it would test nothing new).
void ExpectStatesOffTheDevice(const std::vector<RankTrace>& traces) {
  for (size_t r = 0; r < traces.size(); ++r) {
    EXPECT_EQ(traces[r].memory.master_params, 0u) << "rank " << r << ": master weights on the device";
    EXPECT_EQ(traces[r].memory.optimizer_states, 0u) << "rank " << r << ": moments on the device";
    EXPECT_GT(traces[r].memory.host_states, 0u) << "rank " << r;
  }
}

// A partial-offload cell (offload_optimizer.ratio below 1) must really split its states: some
// masters and moments on the device (4 + 8 bytes per element; no upper bound: the device
// allocations are rounded up, so at world 2 this small model's half partition reads as 1024 bytes
// of masters, more than 4 bytes for each of the 170 elements of the whole partition), the rest
// offloaded (the inverse of ExpectStatesOffTheDevice, which a ratio that sent every state to
// the host would pass and this fails).
void ExpectStatesSplit(const CellSpec& cell, const std::vector<RankTrace>& traces) {
  for (size_t r = 0; r < traces.size(); ++r) {
    const EngineMemory& m = traces[r].memory;
    EXPECT_GT(m.master_params, 0u) << "rank " << r << ": no master weights on the device";
    EXPECT_EQ(m.optimizer_states, 2 * m.master_params) << "rank " << r << ": moments of the device share";
    EXPECT_GT(m.host_states, 0u) << "rank " << r << ": nothing offloaded";
    // Tiered: the host tier holds its budget (the NVMe tier: ExpectTiers).
    EXPECT_GE(m.host_states, static_cast<size_t>(cell.host_memory_budget)) << "rank " << r << ": the host tier";
  }
}

// Where an offload cell's fp32 gradient partition is (zero/grad_partition.h): with the CPU AdamW
// (offload_optimizer "cpu", update_device "cpu") in host memory, none of it on the device with
// offload_grad_accumulation "cpu" and the 4-byte device sum with "gpu". Not where there is no
// partition: stage 1 with one rank (the device accumulators are the partition) and the update in
// backward (docs/zero.md, "Update in backward"). Other offload kinds keep it on the device.
void ExpectGradientPartition(const CellSpec& cell, const std::vector<RankTrace>& traces) {
  const bool in_backward = cell.managed && cell.gas == 1 && cell.world == 1 && cell.stage >= 2 &&
                           cell.dtype != DType::kF16 && cell.clip <= 0.0;
  const bool no_partition = (cell.stage == 1 && cell.world == 1) || in_backward;
  const bool host = !cell.nvme && cell.gpu_update_chunk == 0 && !no_partition;
  for (size_t r = 0; r < traces.size(); ++r) {
    const EngineMemory& m = traces[r].memory;
    EXPECT_EQ(m.host_gradients > 0, host) << "rank " << r << ": host gradient partition";
    if (!host || cell.stage < 2) continue;            // stage 1 keeps its full fp32 accumulators on the device
    const size_t partition_bytes = m.host_gradients;  // the partition and its staging slots
    if (cell.gpu_grad_accumulation) {
      EXPECT_GT(m.gradient_accumulators, 0u) << "rank " << r << ": no fp32 device sum";
      EXPECT_LE(m.gradient_accumulators, partition_bytes) << "rank " << r;
    } else {
      EXPECT_EQ(m.gradient_accumulators, 0u) << "rank " << r << ": fp32 gradients on the device";
    }
  }
}

// Where an offload cell's states are: NVMe (and tiered) cells have a swap file, CPU cells none.
// (That a tiered cell splits its states is checked by TieredOptimizerStatesTest.)
void ExpectTiers(const CellSpec& cell, const std::vector<RankTrace>& traces) {
  for (size_t r = 0; r < traces.size(); ++r) {
    EXPECT_EQ(traces[r].memory.nvme_states > 0, cell.nvme) << "rank " << r << ": swap file";
  }
}

std::string MatrixName(const ::testing::TestParamInfo<MatrixParam>& info) { return MatrixCell(info.param).Name(); }

INSTANTIATE_TEST_SUITE_P(Cells, MatrixTest,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                                            ::testing::Values(1, 4), ::testing::Bool()),
                         MatrixName);

// The same cells with offload_optimizer.device "cpu" (host states, the CPU AdamW): bitwise as the
// reference, so bitwise as without offload (CpuAdamW equals the device AdamW element by element).
class OffloadMatrixTest : public ::testing::TestWithParam<MatrixParam> {};

CellSpec OffloadCell(const MatrixParam& p) {
  CellSpec c = MatrixCell(p);
  c.offload_optimizer = true;
  return c;
}

TEST_P(OffloadMatrixTest, EngineEqualsReferenceBitwise) { RunMatrixCell(OffloadCell(GetParam())); }

INSTANTIATE_TEST_SUITE_P(Cells, OffloadMatrixTest,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(1, 2, 3),
                                            ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                                            ::testing::Values(1, 4), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<MatrixParam>& info) {
                           return OffloadCell(info.param).Name();
                         });

// offload_param.device "cpu" at stage 3 (the shards in host memory, uploaded for every gather,
// buffer_count 2) with offload_optimizer none or "cpu": the same arithmetic (values are only moved),
// so bitwise as the reference, hence as without offload.
using ParamOffloadParam = std::tuple<int, DType, int, bool, bool>;  // world, dtype, GAS, clip, offload_optimizer
CellSpec ParamOffloadCell(const ParamOffloadParam& p) {
  CellSpec c = MatrixCell({3, std::get<0>(p), std::get<1>(p), std::get<2>(p), std::get<3>(p)});
  c.offload_param = true;
  c.offload_optimizer = std::get<4>(p);
  return c;
}
class ParamOffloadMatrixTest : public ::testing::TestWithParam<ParamOffloadParam> {};
TEST_P(ParamOffloadMatrixTest, EngineEqualsReferenceBitwise) { RunMatrixCell(ParamOffloadCell(GetParam())); }
INSTANTIATE_TEST_SUITE_P(Cells, ParamOffloadMatrixTest,
                         ::testing::Combine(::testing::Values(1, 2), ::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::Values(1, 2), ::testing::Bool(), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<ParamOffloadParam>& info) {
                           return ParamOffloadCell(info.param).Name();
                         });

// offload_grad_accumulation "gpu" (stage 3, offload_param and offload_optimizer "cpu"): the fp32
// sum of the non-final micro steps on the device, sent to the host once per step; bitwise as the
// reference, hence as "cpu" (ParamOffloadMatrixTest's offload_optimizer cells). ManagedSchedule
// uses head B only in even micro steps: at GAS 2 its only gradient is in the first micro step (the
// flush at the end of backward), at GAS 4 not in the last one either.
using GpuAccParam = std::tuple<int, DType, int, bool>;  // world, dtype, GAS, clip
CellSpec GpuAccCell(const GpuAccParam& p) {
  CellSpec c = ParamOffloadCell({std::get<0>(p), std::get<1>(p), std::get<2>(p), std::get<3>(p), true});
  c.gpu_grad_accumulation = true;
  return c;
}
class GpuAccMatrixTest : public ::testing::TestWithParam<GpuAccParam> {};
TEST_P(GpuAccMatrixTest, EngineEqualsReferenceBitwise) { RunMatrixCell(GpuAccCell(GetParam())); }
INSTANTIATE_TEST_SUITE_P(Cells, GpuAccMatrixTest,
                         ::testing::Combine(::testing::Values(1, 2), ::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::Values(1, 2, 4), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<GpuAccParam>& info) {
                           return GpuAccCell(info.param).Name();
                         });

// offload_param.device "nvme" at stage 3 (the shards in a swap file per rank, real O_DIRECT I/O,
// two module buffers, no cache: every gather reads its module from the file, read ahead along the
// trace) with offload_optimizer none, "cpu" or "nvme": values are only moved, so bitwise as the
// reference.
using ParamNvmeParam = std::tuple<int, DType, int, bool, int>;  // world, dtype, GAS, clip, optimizer 0/1/2
CellSpec ParamNvmeCell(const ParamNvmeParam& p) {
  CellSpec c = MatrixCell({3, std::get<0>(p), std::get<1>(p), std::get<2>(p), std::get<3>(p)});
  c.offload_param = true;
  c.nvme_param = true;
  c.offload_optimizer = std::get<4>(p) > 0;
  c.nvme = std::get<4>(p) == 2;
  return c;
}
class ParamNvmeMatrixTest : public ::testing::TestWithParam<ParamNvmeParam> {};
TEST_P(ParamNvmeMatrixTest, EngineEqualsReferenceBitwise) { RunMatrixCell(ParamNvmeCell(GetParam())); }
INSTANTIATE_TEST_SUITE_P(Cells, ParamNvmeMatrixTest,
                         ::testing::Combine(::testing::Values(1, 2), ::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::Values(1, 2), ::testing::Bool(), ::testing::Values(0, 1, 2)),
                         [](const ::testing::TestParamInfo<ParamNvmeParam>& info) {
                           return ParamNvmeCell(info.param).Name();
                         });

// ---------------------------------------------------------------------------------------------
// fp16 overflow: skipped on every rank, loss scale hysteresis, halving and growth.

using OverflowParam = std::tuple<int, int, int>;  // stage, world, GAS

class OverflowTest : public ::testing::TestWithParam<OverflowParam> {};

void RunOverflowCell(const OverflowParam& param, bool offload) {
  CellSpec cell;
  cell.stage = std::get<0>(param);
  cell.world = std::get<1>(param);
  cell.gas = std::get<2>(param);
  cell.offload_optimizer = offload;
  cell.dtype = DType::kF16;
  cell.clip = kClip;
  cell.loss_scale_window = 2;
  cell.hysteresis = 2;
  const Config config = ParseCell(cell);
  ASSERT_FALSE(::testing::Test::HasFailure());
  Schedule schedule = ManagedSchedule(7, cell.gas);
  // Windows 1 and 2: the last rank's first micro batch overflows.
  schedule.windows[1].micros[0].overflow_rank = cell.world - 1;
  schedule.windows[2].micros[0].overflow_rank = cell.world - 1;
  Result<RefTrace> ref = RunReference(config, cell.world, OrderOfStage(cell.stage), ModelDims(), schedule);
  ASSERT_OK(ref);
  ASSERT_EQ(ref->overflow_steps, 2);
  const float s0 = std::ldexp(1.0f, cell.initial_scale_power);
  // The schedule the cell is about: hysteresis absorbs the first overflow, the second halves the
  // scale, and after `window` good steps it doubles again.
  std::vector<float> used, after;
  for (const StepRecord& s : ref->steps) {
    used.push_back(s.loss_scale_used);
    after.push_back(s.loss_scale_after);
  }
  EXPECT_FALSE(ref->steps[1].applied);
  EXPECT_FALSE(ref->steps[2].applied);
  EXPECT_EQ(after[1], s0) << "hysteresis 2: the first overflow keeps the scale";
  EXPECT_EQ(after[2], s0 / 2) << "the second overflow halves it";
  bool grew = false;
  for (size_t i = 3; i < after.size(); ++i) grew |= after[i] > after[i - 1];
  EXPECT_TRUE(grew) << "the scale should grow again within the run (window 2)";
  std::vector<RankTrace> traces;
  Status st = RunEngine(config, cell.world, schedule, &traces);
  ASSERT_OK(st);
  ExpectMatches(*ref, traces, ContractTolerance());
  if (cell.offload_optimizer) {
    ExpectStatesOffTheDevice(traces);
    ExpectTiers(cell, traces);
  }
}

TEST_P(OverflowTest, SkipsAndRescalesLikeReference) { RunOverflowCell(GetParam(), false); }

// With offload_optimizer.device "cpu" at stages 1-3: the skipped steps leave the host states alone.
class OffloadOverflowTest : public ::testing::TestWithParam<OverflowParam> {};
TEST_P(OffloadOverflowTest, SkipsAndRescalesLikeReference) { RunOverflowCell(GetParam(), true); }
INSTANTIATE_TEST_SUITE_P(Fp16, OffloadOverflowTest,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(1, 2),
                                            ::testing::Values(1, 4)),
                         [](const ::testing::TestParamInfo<OverflowParam>& info) {
                           return "s" + std::to_string(std::get<0>(info.param)) + "_w" +
                                  std::to_string(std::get<1>(info.param)) + "_gas" +
                                  std::to_string(std::get<2>(info.param)) + "_offload";
                         });

INSTANTIATE_TEST_SUITE_P(Fp16, OverflowTest,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Values(1, 2, 3),
                                            ::testing::Values(1, 4)),
                         [](const ::testing::TestParamInfo<OverflowParam>& info) {
                           return "s" + std::to_string(std::get<0>(info.param)) + "_w" +
                                  std::to_string(std::get<1>(info.param)) + "_gas" +
                                  std::to_string(std::get<2>(info.param));
                         });

// ---------------------------------------------------------------------------------------------
// Unmanaged accumulation with inactive parameters.

using UnmanagedParam = std::tuple<int, int, DType, bool>;  // stage, world, dtype, freeze

Schedule UnmanagedSchedule() {
  Schedule s;
  s.managed = false;
  s.snapshots = true;
  auto window = [](int count, Heads heads) {
    Window w;
    for (int i = 0; i < count; ++i) {
      MicroSpec m;
      m.heads = heads;
      m.loss_divisor = static_cast<float>(count);
      w.micros.push_back(m);
    }
    return w;
  };
  s.windows = {window(2, {true, false}), window(5, {false, true}), window(3, {true, false})};
  return s;
}

class UnmanagedTest : public ::testing::TestWithParam<UnmanagedParam> {};

void RunUnmanagedSpec(const CellSpec& cell);

// offload: "" (none), "cpu", "nvme" or "tiered".
void RunUnmanagedCell(const UnmanagedParam& param, const std::string& offload) {
  CellSpec cell;
  cell.stage = std::get<0>(param);
  cell.world = std::get<1>(param);
  cell.dtype = std::get<2>(param);
  cell.freeze_inactive = std::get<3>(param);
  cell.offload_optimizer = !offload.empty();
  cell.nvme = offload == "nvme" || offload == "tiered";
  // "cpu_gpuacc" (stage 3): offload_param too, and offload_grad_accumulation "gpu" (flushed at Step()).
  cell.offload_param = offload == "cpu_gpuacc";
  cell.gpu_grad_accumulation = offload == "cpu_gpuacc";
  if (offload == "tiered") cell.host_memory_budget = 12 * (TotalNumel(ModelDims()) / (2 * cell.world));
  cell.managed = false;
  cell.gas = 1;
  cell.clip = kClip;
  RunUnmanagedSpec(cell);
}

// The chunked GPU update's device footprint: the staging sets only (unmanaged cells clip, so the
// engine never updates in backward), the states in host memory.
void ExpectOnlyStagingOnTheDevice(const CellSpec& cell, const std::vector<RankTrace>& traces);

// The windows of UnmanagedSchedule under `cell` (unmanaged, GAS 1): bitwise as the reference, and
// the inactive parameters checked after every window. overlap_step cells run without the snapshots
// (their gathers after each window would wait for the step before the next forward: nothing would
// overlap), so only the final state is compared there.
void RunUnmanagedSpec(const CellSpec& cell) {
  const Config config = ParseCell(cell);
  ASSERT_FALSE(::testing::Test::HasFailure());
  Schedule schedule = UnmanagedSchedule();
  schedule.snapshots = !cell.overlap_step;
  Result<RefTrace> ref = RunReference(config, cell.world, OrderOfStage(cell.stage), ModelDims(), schedule);
  ASSERT_OK(ref);
  EXPECT_EQ(ref->overflow_steps, 0);
  std::vector<RankTrace> traces;
  Status st = RunEngine(config, cell.world, schedule, &traces);
  ASSERT_OK(st);
  // Inactive: head B in window 0, head A in window 1, head B in window 2. Everything bitwise
  // against the reference (which steps inactive parameters with a zero gradient, or skips them
  // with the freeze); besides, checked directly: without the freeze they move (weight decay in
  // window 0, weight decay and momentum in window 1), with it weights and moments stay put.
  for (size_t r = 0; r < traces.size() && schedule.snapshots; ++r) {
    const RankTrace& t = traces[r];
    ASSERT_EQ(t.master_snapshots.size(), 3u);
    if (!cell.freeze_inactive) {
      EXPECT_NE(t.master_snapshots[0][kHeadBW], t.initial_master[kHeadBW])
          << "rank " << r << ": head_b not stepped in window A";
      EXPECT_NE(t.master_snapshots[1][kHeadAW], t.master_snapshots[0][kHeadAW])
          << "rank " << r << ": head_a not stepped in window B";
      EXPECT_NE(t.exp_avg_snapshots[1][kHeadAW], t.exp_avg_snapshots[0][kHeadAW])
          << "rank " << r << ": head_a's moments did not decay";
      continue;
    }
    EXPECT_EQ(t.master_snapshots[0][kHeadBW], t.initial_master[kHeadBW])
        << "rank " << r << ": head_b master changed in window A";
    EXPECT_EQ(t.model_snapshots[0][kHeadBW], t.initial_model[kHeadBW]) << "rank " << r;
    EXPECT_EQ(t.master_snapshots[1][kHeadAW], t.master_snapshots[0][kHeadAW])
        << "rank " << r << ": head_a master changed in window B";
    EXPECT_EQ(t.master_snapshots[2][kHeadBW], t.master_snapshots[1][kHeadBW])
        << "rank " << r << ": head_b master changed in the second window A";
    EXPECT_NE(t.master_snapshots[1][kHeadBW], t.master_snapshots[0][kHeadBW]) << "head_b must move in window B";
    // Moments: head_b's are still zero after window 0, head_a's unchanged by window 1, head_b's
    // unchanged by window 2.
    const std::vector<float> zeros(t.exp_avg_snapshots[0][kHeadBW].size(), 0.0f);
    EXPECT_EQ(t.exp_avg_snapshots[0][kHeadBW], zeros) << "rank " << r;
    EXPECT_EQ(t.exp_avg_sq_snapshots[0][kHeadBW], zeros) << "rank " << r;
    EXPECT_EQ(t.exp_avg_snapshots[1][kHeadAW], t.exp_avg_snapshots[0][kHeadAW]) << "rank " << r;
    EXPECT_EQ(t.exp_avg_sq_snapshots[1][kHeadAW], t.exp_avg_sq_snapshots[0][kHeadAW]) << "rank " << r;
    EXPECT_EQ(t.exp_avg_snapshots[2][kHeadBW], t.exp_avg_snapshots[1][kHeadBW]) << "rank " << r;
    EXPECT_EQ(t.exp_avg_sq_snapshots[2][kHeadBW], t.exp_avg_sq_snapshots[1][kHeadBW]) << "rank " << r;
  }
  ExpectMatches(*ref, traces, ContractTolerance());
  if (cell.offload_optimizer && cell.gpu_update_chunk > 0) {
    ExpectOnlyStagingOnTheDevice(cell, traces);
  } else if (cell.offload_optimizer) {
    ExpectStatesOffTheDevice(traces);
    ExpectTiers(cell, traces);
    ExpectGradientPartition(cell, traces);
  }
  for (size_t r = 0; r < traces.size() && cell.offload_param && !cell.nvme_param; ++r) {
    EXPECT_GT(traces[r].memory.host_params, 0u) << "rank " << r << ": no shards in host memory";
  }
}

TEST_P(UnmanagedTest, InactiveParameters) { RunUnmanagedCell(GetParam(), ""); }

// offload_optimizer.device "nvme" (swap files with real O_DIRECT I/O, groups of 300 elements, two
// group buffers): the matrix at stages 1-3, worlds 1-2, fp32/bf16, GAS 1/4, clipping; bitwise as
// the reference.
class NvmeMatrixTest : public ::testing::TestWithParam<MatrixParam> {};
CellSpec NvmeCell(const MatrixParam& p) {
  CellSpec c = MatrixCell(p);
  c.offload_optimizer = true;
  c.nvme = true;
  return c;
}
TEST_P(NvmeMatrixTest, EngineEqualsReferenceBitwise) { RunMatrixCell(NvmeCell(GetParam())); }
INSTANTIATE_TEST_SUITE_P(Cells, NvmeMatrixTest,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(1, 2),
                                            ::testing::Values(DType::kF32, DType::kBF16), ::testing::Values(1, 4),
                                            ::testing::Bool()),
                         [](const ::testing::TestParamInfo<MatrixParam>& info) { return NvmeCell(info.param).Name(); });

// Tiered: host_memory_budget keeps about half of each rank's partition in pinned host memory, the
// rest on NVMe (so parameters straddle the split): bitwise as the reference.
class TieredMatrixTest : public ::testing::TestWithParam<MatrixParam> {};
CellSpec TieredCell(const MatrixParam& p) {
  CellSpec c = NvmeCell(p);
  c.host_memory_budget = 12 * (TotalNumel(ModelDims()) / (2 * c.world));
  return c;
}
TEST_P(TieredMatrixTest, EngineEqualsReferenceBitwise) { RunMatrixCell(TieredCell(GetParam())); }
INSTANTIATE_TEST_SUITE_P(Cells, TieredMatrixTest,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(1, 2),
                                            ::testing::Values(DType::kBF16), ::testing::Values(1, 4),
                                            ::testing::Bool()),
                         [](const ::testing::TestParamInfo<MatrixParam>& info) {
                           return TieredCell(info.param).Name();
                         });

// Partial offload (offload_optimizer.ratio 0.5, stage 3; docs/offload.md, "Partial offload"): the
// first half of each rank's partition keeps its states on the device with the device AdamW, the
// rest is offloaded: "cpu" (host states, the CPU AdamW) at worlds 1-2, fp32/bf16, GAS 1/4, clipping
// (GAS 1, one rank, no clipping is the update in backward), and tiered ("nvme" with a
// host_memory_budget of a quarter of the partition: device, host and NVMe) in bf16. Bitwise as the
// reference, with states in each tier (ExpectStatesSplit, ExpectTiers).
constexpr double kOffloadRatio = 0.5;
class RatioMatrixTest : public ::testing::TestWithParam<MatrixParam> {};
CellSpec RatioCell(const MatrixParam& p) {
  CellSpec c = OffloadCell(p);
  c.offload_ratio = kOffloadRatio;
  return c;
}
TEST_P(RatioMatrixTest, EngineEqualsReferenceBitwise) { RunMatrixCell(RatioCell(GetParam())); }
INSTANTIATE_TEST_SUITE_P(Cells, RatioMatrixTest,
                         ::testing::Combine(::testing::Values(3), ::testing::Values(1, 2),
                                            ::testing::Values(DType::kF32, DType::kBF16), ::testing::Values(1, 4),
                                            ::testing::Bool()),
                         [](const ::testing::TestParamInfo<MatrixParam>& info) {
                           return RatioCell(info.param).Name();
                         });
class TieredRatioMatrixTest : public ::testing::TestWithParam<MatrixParam> {};
CellSpec TieredRatioCell(const MatrixParam& p) {
  CellSpec c = NvmeCell(p);
  c.offload_ratio = kOffloadRatio;
  c.host_memory_budget = 12 * (TotalNumel(ModelDims()) / (4 * c.world));
  return c;
}
TEST_P(TieredRatioMatrixTest, EngineEqualsReferenceBitwise) { RunMatrixCell(TieredRatioCell(GetParam())); }
INSTANTIATE_TEST_SUITE_P(Cells, TieredRatioMatrixTest,
                         ::testing::Combine(::testing::Values(3), ::testing::Values(1, 2),
                                            ::testing::Values(DType::kBF16), ::testing::Values(1, 4),
                                            ::testing::Bool()),
                         [](const ::testing::TestParamInfo<MatrixParam>& info) {
                           return TieredRatioCell(info.param).Name();
                         });

// offload_optimizer.update_device "gpu" (host states streamed through the device in chunks of 37
// elements, 3 staging sets, AdamW on the device): stages 1-3, worlds 1-2, fp32/bf16, GAS 1/2,
// with and without clipping (without, GAS 1, one rank at stages 2/3 is the update in backward):
// bitwise as the reference. Only the staging sets are on the device.
class GpuChunkMatrixTest : public ::testing::TestWithParam<MatrixParam> {};
constexpr int64_t kGpuChunk = 37;
CellSpec GpuChunkCell(const MatrixParam& p) {
  CellSpec c = MatrixCell(p);
  c.offload_optimizer = true;
  c.gpu_update_chunk = kGpuChunk;
  return c;
}
TEST_P(GpuChunkMatrixTest, EngineEqualsReferenceBitwise) {
  const CellSpec cell = GpuChunkCell(GetParam());
  const Config config = ParseCell(cell);
  ASSERT_FALSE(::testing::Test::HasFailure());
  const Schedule schedule = ManagedSchedule(kSteps, cell.gas);
  Result<RefTrace> ref = RunReference(config, cell.world, OrderOfStage(cell.stage), ModelDims(), schedule);
  ASSERT_OK(ref);
  EXPECT_EQ(ref->clipped_steps, cell.clip > 0 ? kSteps : 0);
  std::vector<RankTrace> traces;
  Status st = RunEngine(config, cell.world, schedule, &traces);
  ASSERT_OK(st);
  ExpectMatches(*ref, traces, ContractTolerance());
  for (size_t r = 0; r < traces.size(); ++r) {
    const EngineMemory& m = traces[r].memory;
    // 3 sets of 37 elements of three fp32 states (and, with a 16-bit model, of the model buffer
    // of the host model copy), plus one fp32 gradient chunk when the engine updates in backward
    // (UpdateFromGradient: GAS 1, one rank, stages 2/3, no clipping).
    const bool in_backward = cell.gas == 1 && cell.world == 1 && cell.stage >= 2 && cell.clip == 0;
    const size_t set = kGpuChunk * 12 + (cell.dtype == DType::kF32 ? 0 : kGpuChunk * 2);
    EXPECT_EQ(m.master_params + m.optimizer_states, 3 * set + (in_backward ? kGpuChunk * 4 : 0))
        << "rank " << r << ": the device holds the staging sets only";
    EXPECT_GE(m.host_states, static_cast<size_t>(TotalNumel(ModelDims()) / cell.world) * 12) << "rank " << r;
    EXPECT_EQ(m.nvme_states, 0u) << "rank " << r;
  }
}
INSTANTIATE_TEST_SUITE_P(Cells, GpuChunkMatrixTest,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(1, 2),
                                            ::testing::Values(DType::kF32, DType::kBF16), ::testing::Values(1, 2),
                                            ::testing::Bool()),
                         [](const ::testing::TestParamInfo<MatrixParam>& info) {
                           return GpuChunkCell(info.param).Name();
                         });

// offload_optimizer.overlap_step (one rank): the chunked GPU update queued under the next forward
// (GatherModule queues and waits for its module's chunks; the rest is queued before the next
// backward's first gradient). Stages 1-3 (stage 0 has no optimizer offload), fp32/bf16, GAS 1/2, with and without
// clipping (without, GAS 1 at stages 2/3: the casts after the update in backward are what is deferred), weight decay
// 0.1, over a schedule where head B first gets a gradient in window 2 (its module is not gathered
// before then, so its chunks are only queued by the flush): the trajectory (losses, norms) and the
// final weights and moments bitwise as the reference and as the synchronous chunked step.
class GpuOverlapMatrixTest : public ::testing::TestWithParam<MatrixParam> {};
CellSpec GpuOverlapCell(const MatrixParam& p) {
  CellSpec c = GpuChunkCell(p);
  c.overlap_step = true;
  return c;
}
Schedule LateHeadSchedule(int steps, int gas) {
  Schedule s = ManagedSchedule(steps, gas);
  for (size_t w = 0; w < s.windows.size(); ++w) {
    for (size_t j = 0; j < s.windows[w].micros.size(); ++j) s.windows[w].micros[j].heads.b = w >= 2 && j == 0;
  }
  // No snapshots: their gathers after every window would wait for each step before the next
  // forward (WaitForOptimizerStep), so the forward would never run with a step in flight.
  return s;
}
void ExpectSameOverlapTensors(const Tensors& a, const Tensors& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].size(), b[i].size()) << what << " " << i;
    EXPECT_EQ(std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)), 0)
        << what << " of parameter " << i << " differs between the overlapped and the synchronous chunked step";
  }
}
TEST_P(GpuOverlapMatrixTest, EqualsReferenceAndSynchronousChunkedBitwise) {
  const CellSpec cell = GpuOverlapCell(GetParam());
  CellSpec sync_cell = cell;
  sync_cell.overlap_step = false;
  const Config config = ParseCell(cell);
  const Config sync_config = ParseCell(sync_cell);
  ASSERT_FALSE(::testing::Test::HasFailure());
  ASSERT_TRUE(config.zero.offload_optimizer.overlap_step);
  const Schedule schedule = LateHeadSchedule(kSteps, cell.gas);
  Result<RefTrace> ref = RunReference(config, cell.world, OrderOfStage(cell.stage), ModelDims(), schedule);
  ASSERT_OK(ref);
  EXPECT_EQ(ref->clipped_steps, cell.clip > 0 ? kSteps : 0);
  std::vector<RankTrace> traces, sync_traces;
  Status st = RunEngine(config, cell.world, schedule, &traces);
  ASSERT_OK(st);
  ExpectMatches(*ref, traces, ContractTolerance());
  st = RunEngine(sync_config, cell.world, schedule, &sync_traces);
  ASSERT_OK(st);
  ExpectMatches(*ref, sync_traces, ContractTolerance());
  const RankTrace& a = traces[0];
  const RankTrace& b = sync_traces[0];
  ExpectSameOverlapTensors(a.master, b.master, "master");
  ExpectSameOverlapTensors(a.model, b.model, "model");
  ExpectSameOverlapTensors(a.exp_avg, b.exp_avg, "exp_avg");
  ExpectSameOverlapTensors(a.exp_avg_sq, b.exp_avg_sq, "exp_avg_sq");
  EXPECT_TRUE(a.master_snapshots.empty());
}
INSTANTIATE_TEST_SUITE_P(Cells, GpuOverlapMatrixTest,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(1),
                                            ::testing::Values(DType::kF32, DType::kBF16), ::testing::Values(1, 2),
                                            ::testing::Bool()),
                         [](const ::testing::TestParamInfo<MatrixParam>& info) {
                           return GpuOverlapCell(info.param).Name();
                         });

// Unmanaged accumulation with offload_optimizer.device "cpu" (stages 1-3).
class OffloadUnmanagedTest : public ::testing::TestWithParam<UnmanagedParam> {};
TEST_P(OffloadUnmanagedTest, InactiveParameters) { RunUnmanagedCell(GetParam(), "cpu"); }
// Stage 3 with offload_param and offload_grad_accumulation "gpu": the device sums go to the host at
// Step(), the boundary of an unmanaged window.
class GpuAccUnmanagedTest : public ::testing::TestWithParam<UnmanagedParam> {};
TEST_P(GpuAccUnmanagedTest, InactiveParameters) { RunUnmanagedCell(GetParam(), "cpu_gpuacc"); }
INSTANTIATE_TEST_SUITE_P(Windows, GpuAccUnmanagedTest,
                         ::testing::Combine(::testing::Values(3), ::testing::Values(2),
                                            ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                                            ::testing::Bool()),
                         [](const ::testing::TestParamInfo<UnmanagedParam>& info) {
                           return "s3_w2_" + std::string(DTypeName(std::get<2>(info.param))) +
                                  (std::get<3>(info.param) ? "_freeze" : "_step") + "_paramoffload_gpuacc";
                         });
// The same windows with NVMe and tiered states (bf16).
class NvmeUnmanagedTest : public ::testing::TestWithParam<UnmanagedParam> {};
TEST_P(NvmeUnmanagedTest, InactiveParameters) { RunUnmanagedCell(GetParam(), "nvme"); }
TEST_P(NvmeUnmanagedTest, InactiveParametersTiered) { RunUnmanagedCell(GetParam(), "tiered"); }
INSTANTIATE_TEST_SUITE_P(Windows, NvmeUnmanagedTest,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(2),
                                            ::testing::Values(DType::kBF16), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<UnmanagedParam>& info) {
                           return "s" + std::to_string(std::get<0>(info.param)) + "_w2_bf16" +
                                  (std::get<3>(info.param) ? "_freeze" : "_step");
                         });
INSTANTIATE_TEST_SUITE_P(Windows, OffloadUnmanagedTest,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(2),
                                            ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                                            ::testing::Bool()),
                         [](const ::testing::TestParamInfo<UnmanagedParam>& info) {
                           return "s" + std::to_string(std::get<0>(info.param)) + "_w2_" +
                                  DTypeName(std::get<2>(info.param)) + (std::get<3>(info.param) ? "_freeze" : "_step") +
                                  "_offload";
                         });

INSTANTIATE_TEST_SUITE_P(Windows, UnmanagedTest,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Values(2, 3),
                                            ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                                            ::testing::Bool()),
                         [](const ::testing::TestParamInfo<UnmanagedParam>& info) {
                           return "s" + std::to_string(std::get<0>(info.param)) + "_w" +
                                  std::to_string(std::get<1>(info.param)) + "_" + DTypeName(std::get<2>(info.param)) +
                                  (std::get<3>(info.param) ? "_freeze" : "_step");
                         });

// Unmanaged accumulation with the offload modes beyond optimizer offload "cpu" (issue 10): the
// windows of UnmanagedSchedule (backward counts 2, 5, 3, heads A, B, A, the user divides by the
// count), freeze_inactive_parameters off and on, bitwise as the reference.
//
// offload_param "cpu" at stage 3 with offload_optimizer none or "cpu", worlds 1-2, fp32/bf16.
using ParamOffloadUnmanagedParam = std::tuple<int, DType, bool, int>;  // world, dtype, freeze, optimizer 0/1/2
CellSpec ParamOffloadUnmanagedCell(const ParamOffloadUnmanagedParam& p, bool nvme_param) {
  CellSpec c;
  c.stage = 3;
  c.world = std::get<0>(p);
  c.dtype = std::get<1>(p);
  c.freeze_inactive = std::get<2>(p);
  c.offload_param = true;
  c.nvme_param = nvme_param;
  c.offload_optimizer = std::get<3>(p) > 0;
  c.nvme = std::get<3>(p) == 2;
  c.managed = false;
  c.gas = 1;
  c.clip = kClip;
  return c;
}
class ParamOffloadUnmanagedTest : public ::testing::TestWithParam<ParamOffloadUnmanagedParam> {};
TEST_P(ParamOffloadUnmanagedTest, InactiveParameters) {
  RunUnmanagedSpec(ParamOffloadUnmanagedCell(GetParam(), false));
}
INSTANTIATE_TEST_SUITE_P(Windows, ParamOffloadUnmanagedTest,
                         ::testing::Combine(::testing::Values(1, 2), ::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::Bool(), ::testing::Values(0, 1)),
                         [](const ::testing::TestParamInfo<ParamOffloadUnmanagedParam>& info) {
                           return ParamOffloadUnmanagedCell(info.param, false).Name();
                         });

// offload_param "nvme" at stage 3 (every gather reads its module from the swap file) with
// offload_optimizer none, "cpu" or "nvme", worlds 1-2, fp32/bf16.
class ParamNvmeUnmanagedTest : public ::testing::TestWithParam<ParamOffloadUnmanagedParam> {};
TEST_P(ParamNvmeUnmanagedTest, InactiveParameters) { RunUnmanagedSpec(ParamOffloadUnmanagedCell(GetParam(), true)); }
INSTANTIATE_TEST_SUITE_P(Windows, ParamNvmeUnmanagedTest,
                         ::testing::Combine(::testing::Values(1, 2), ::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::Bool(), ::testing::Values(0, 1, 2)),
                         [](const ::testing::TestParamInfo<ParamOffloadUnmanagedParam>& info) {
                           return ParamOffloadUnmanagedCell(info.param, true).Name();
                         });

// offload_optimizer.update_device "gpu" (the chunked AdamW over the host states, 37-element chunks,
// 3 staging sets), stages 1-3, worlds 1-2, fp32/bf16; with overlap_step (world 1 only: the engine
// refuses it with several ranks) the step of each window is queued under the next window's forward.
CellSpec GpuChunkUnmanagedCell(const UnmanagedParam& p, bool overlap) {
  CellSpec c;
  c.stage = std::get<0>(p);
  c.world = std::get<1>(p);
  c.dtype = std::get<2>(p);
  c.freeze_inactive = std::get<3>(p);
  c.offload_optimizer = true;
  c.gpu_update_chunk = kGpuChunk;
  c.overlap_step = overlap;
  c.managed = false;
  c.gas = 1;
  c.clip = kClip;
  return c;
}
void ExpectOnlyStagingOnTheDevice(const CellSpec& cell, const std::vector<RankTrace>& traces) {
  for (size_t r = 0; r < traces.size(); ++r) {
    const EngineMemory& m = traces[r].memory;
    // Three states per set, and the model buffer of the host model copy with a 16-bit model.
    const int64_t per_elem = 12 + (cell.dtype == DType::kF32 ? 0 : 2);
    EXPECT_EQ(m.master_params + m.optimizer_states, static_cast<size_t>(3 * cell.gpu_update_chunk * per_elem))
        << "rank " << r << ": the device holds the staging sets only";
    EXPECT_GE(m.host_states, static_cast<size_t>(TotalNumel(ModelDims()) / cell.world) * 12) << "rank " << r;
    EXPECT_EQ(m.nvme_states, 0u) << "rank " << r;
  }
}
class GpuChunkUnmanagedTest : public ::testing::TestWithParam<UnmanagedParam> {};
TEST_P(GpuChunkUnmanagedTest, InactiveParameters) { RunUnmanagedSpec(GpuChunkUnmanagedCell(GetParam(), false)); }
INSTANTIATE_TEST_SUITE_P(Windows, GpuChunkUnmanagedTest,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(1, 2),
                                            ::testing::Values(DType::kF32, DType::kBF16), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<UnmanagedParam>& info) {
                           return GpuChunkUnmanagedCell(info.param, false).Name();
                         });
class GpuOverlapUnmanagedTest : public ::testing::TestWithParam<UnmanagedParam> {};
TEST_P(GpuOverlapUnmanagedTest, InactiveParameters) {
  const CellSpec cell = GpuChunkUnmanagedCell(GetParam(), true);
  ASSERT_TRUE(ParseCell(cell).zero.offload_optimizer.overlap_step);
  RunUnmanagedSpec(cell);
}
INSTANTIATE_TEST_SUITE_P(Windows, GpuOverlapUnmanagedTest,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(1),
                                            ::testing::Values(DType::kF32, DType::kBF16), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<UnmanagedParam>& info) {
                           return GpuChunkUnmanagedCell(info.param, true).Name();
                         });

// fp16 with overflows inside unmanaged windows, with offload: windows of 2, 5, 3, 3, 2, 4, 2 backwards
// (heads A and B alternating); the last rank's third backward of window 1 and first of window 2 overflow.
// Both steps skipped on every rank, hysteresis 2 keeps the scale at the first and halves it at the
// second, and it grows again (loss_scale_window 2): bitwise as the reference. Cells: offload_optimizer
// "cpu" at stages 1-3, and stage 3 with offload_param "cpu" (optimizer on the device and "cpu").
using UnmanagedOverflowParam = std::tuple<int, int, bool, bool>;  // stage, world, offload_optimizer, offload_param
CellSpec UnmanagedOverflowCell(const UnmanagedOverflowParam& p) {
  CellSpec c;
  c.stage = std::get<0>(p);
  c.world = std::get<1>(p);
  c.offload_optimizer = std::get<2>(p);
  c.offload_param = std::get<3>(p);
  c.dtype = DType::kF16;
  c.managed = false;
  c.gas = 1;
  c.clip = kClip;
  c.loss_scale_window = 2;
  c.hysteresis = 2;
  return c;
}
class OffloadUnmanagedOverflowTest : public ::testing::TestWithParam<UnmanagedOverflowParam> {};
TEST_P(OffloadUnmanagedOverflowTest, SkipsAndRescalesLikeReference) {
  const CellSpec cell = UnmanagedOverflowCell(GetParam());
  const Config config = ParseCell(cell);
  ASSERT_FALSE(HasFailure());
  Schedule schedule;
  schedule.managed = false;
  const int counts[7] = {2, 5, 3, 3, 2, 4, 2};
  for (int w = 0; w < 7; ++w) {
    Window win;
    for (int i = 0; i < counts[w]; ++i) {
      MicroSpec m;
      m.heads = w % 2 == 1 ? Heads{false, true} : Heads{true, false};
      m.loss_divisor = static_cast<float>(counts[w]);
      win.micros.push_back(m);
    }
    schedule.windows.push_back(win);
  }
  schedule.windows[1].micros[2].overflow_rank = cell.world - 1;
  schedule.windows[2].micros[0].overflow_rank = cell.world - 1;
  Result<RefTrace> ref = RunReference(config, cell.world, OrderOfStage(cell.stage), ModelDims(), schedule);
  ASSERT_OK(ref);
  ASSERT_EQ(ref->overflow_steps, 2);
  const float s0 = std::ldexp(1.0f, cell.initial_scale_power);
  EXPECT_TRUE(ref->steps[0].applied);
  EXPECT_FALSE(ref->steps[1].applied);
  EXPECT_FALSE(ref->steps[2].applied);
  EXPECT_EQ(ref->steps[1].loss_scale_after, s0) << "hysteresis 2: the first overflow keeps the scale";
  EXPECT_EQ(ref->steps[2].loss_scale_after, s0 / 2) << "the second overflow halves it";
  bool grew = false;
  for (size_t i = 3; i < ref->steps.size(); ++i)
    grew |= ref->steps[i].loss_scale_after > ref->steps[i - 1].loss_scale_after;
  EXPECT_TRUE(grew) << "the scale should grow again within the run (loss_scale_window 2)";
  std::vector<RankTrace> traces;
  Status st = RunEngine(config, cell.world, schedule, &traces);
  ASSERT_OK(st);
  ExpectMatches(*ref, traces, ContractTolerance());
  if (cell.offload_optimizer) ExpectStatesOffTheDevice(traces);
  for (size_t r = 0; r < traces.size() && cell.offload_param; ++r) {
    EXPECT_GT(traces[r].memory.host_params, 0u) << "rank " << r << ": no shards in host memory";
  }
}
INSTANTIATE_TEST_SUITE_P(
    Fp16, OffloadUnmanagedOverflowTest,
    ::testing::Values(UnmanagedOverflowParam{1, 1, true, false}, UnmanagedOverflowParam{1, 2, true, false},
                      UnmanagedOverflowParam{2, 2, true, false}, UnmanagedOverflowParam{3, 2, true, false},
                      UnmanagedOverflowParam{3, 1, false, true}, UnmanagedOverflowParam{3, 2, false, true},
                      UnmanagedOverflowParam{3, 1, true, true}, UnmanagedOverflowParam{3, 2, true, true}),
    [](const ::testing::TestParamInfo<UnmanagedOverflowParam>& info) {
      return UnmanagedOverflowCell(info.param).Name();
    });

// Ranks that use different parameters in the same micro step, reporting in different orders: rank
// 0 uses head A only, rank 1 head B only, rank 2 both; some micro steps swap them. Stages 0-2: odd
// ranks report after the backward's last gather, in forward order; every rank reduces the same
// layout (the reducer's plan), a parameter a rank did not report contributing zeros. Stage 3: odd
// ranks report each module's parameters in forward order while it is gathered; every rank reduces
// a module once all agree it is complete (zero/reduction_schedule.h), zeros for what it did not
// report. Bitwise as the reference, managed and unmanaged.
using DifferentHeadsParam = std::tuple<int, int, DType, bool>;  // stage, world, dtype, managed
class DifferentHeadsTest : public ::testing::TestWithParam<DifferentHeadsParam> {};

void RunDifferentHeadsCell(const CellSpec& cell);

TEST_P(DifferentHeadsTest, SameLayoutOnEveryRank) {
  CellSpec cell;
  cell.stage = std::get<0>(GetParam());
  cell.world = std::get<1>(GetParam());
  cell.dtype = std::get<2>(GetParam());
  cell.managed = std::get<3>(GetParam());
  cell.gas = cell.managed ? 2 : 1;
  cell.clip = kClip;
  RunDifferentHeadsCell(cell);
}

// Runs `cell` over `windows` of micro steps in which rank r uses windows[w][j][r] (the unmanaged
// user divides by the window's length), against the reference; `schedule` says how ranks report.
void RunPerRankHeads(const CellSpec& cell, Schedule schedule,
                     const std::vector<std::vector<std::vector<Heads>>>& windows) {
  const Config config = ParseCell(cell);
  ASSERT_FALSE(::testing::Test::HasFailure());
  schedule.managed = cell.managed;
  for (const auto& win : windows) {
    Window w;
    for (const auto& per_rank : win) {
      MicroSpec m;
      m.rank_heads = per_rank;
      if (!cell.managed) m.loss_divisor = static_cast<float>(win.size());
      w.micros.push_back(m);
    }
    schedule.windows.push_back(w);
  }
  Result<RefTrace> ref = RunReference(config, cell.world, OrderOfStage(cell.stage), ModelDims(), schedule);
  ASSERT_OK(ref);
  std::vector<RankTrace> traces;
  Status st = RunEngine(config, cell.world, schedule, &traces);
  ASSERT_OK(st);
  ExpectMatches(*ref, traces, ContractTolerance());
  if (cell.offload_optimizer) {
    ExpectStatesOffTheDevice(traces);
    ExpectGradientPartition(cell, traces);
  }
  for (size_t r = 0; r < traces.size() && cell.offload_param; ++r) {
    EXPECT_GT(traces[r].memory.host_params, 0u) << "rank " << r << ": no shards in host memory";
  }
}

void RunDifferentHeadsCell(const CellSpec& cell) {
  Schedule schedule;
  schedule.odd_ranks_report_forward = cell.stage < 3;
  schedule.odd_ranks_report_params_forward = cell.stage == 3;
  const Heads a{true, false}, b{false, true}, both{true, true};
  RunPerRankHeads(cell, schedule, {{{a, b, both}, {b, a, a}}, {{a, b, b}, {a, b, both}}, {{b, a, both}, {both, b, a}}});
}

// The same at stage 3 with offload: offload_param "cpu" (optimizer on the device), offload_optimizer
// "cpu", and both; worlds 2-3, fp32/bf16, managed (GAS 2) and unmanaged.
using OffloadDifferentHeadsParam =
    std::tuple<int, int, DType, bool>;  // offload 0 param/1 optimizer/2 both, world, dtype, managed
CellSpec OffloadDifferentHeadsCell(const OffloadDifferentHeadsParam& p) {
  CellSpec c;
  c.stage = 3;
  c.offload_param = std::get<0>(p) != 1;
  c.offload_optimizer = std::get<0>(p) != 0;
  c.world = std::get<1>(p);
  c.dtype = std::get<2>(p);
  c.managed = std::get<3>(p);
  c.gas = c.managed ? 2 : 1;
  c.clip = kClip;
  return c;
}
class OffloadDifferentHeadsTest : public ::testing::TestWithParam<OffloadDifferentHeadsParam> {};
TEST_P(OffloadDifferentHeadsTest, SameLayoutOnEveryRank) {
  RunDifferentHeadsCell(OffloadDifferentHeadsCell(GetParam()));
}
INSTANTIATE_TEST_SUITE_P(Ranks, OffloadDifferentHeadsTest,
                         ::testing::Combine(::testing::Values(0, 1, 2), ::testing::Values(2, 3),
                                            ::testing::Values(DType::kF32, DType::kBF16), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<OffloadDifferentHeadsParam>& info) {
                           return OffloadDifferentHeadsCell(info.param).Name();
                         });

INSTANTIATE_TEST_SUITE_P(Ranks, DifferentHeadsTest,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Values(2, 3),
                                            ::testing::Values(DType::kF32, DType::kBF16), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<DifferentHeadsParam>& info) {
                           return "s" + std::to_string(std::get<0>(info.param)) + "_w" +
                                  std::to_string(std::get<1>(info.param)) + "_" + DTypeName(std::get<2>(info.param)) +
                                  (std::get<3>(info.param) ? "_managed" : "_unmanaged");
                         });

// Stage 3, several ranks using different heads, every rank reporting only after the backward's last
// gather: the modules complete at Backward(), bitwise as the reference.
using Stage3LateParam = std::tuple<int, bool>;  // world, managed
class Stage3LateReportsTest : public ::testing::TestWithParam<Stage3LateParam> {};

TEST_P(Stage3LateReportsTest, EveryRankReportingAfterItsGathersIsExact) {
  CellSpec cell;
  cell.stage = 3;
  cell.world = std::get<0>(GetParam());
  cell.dtype = DType::kBF16;
  cell.managed = std::get<1>(GetParam());
  cell.gas = cell.managed ? 2 : 1;
  cell.clip = kClip;
  Schedule schedule;
  schedule.every_rank_reports_after_gathers = true;
  const Heads a{true, false}, b{false, true}, both{true, true};
  RunPerRankHeads(cell, schedule, {{{a, b, both}, {b, a, a}}, {{both, b, a}, {a, b, b}}});
}

INSTANTIATE_TEST_SUITE_P(Ranks, Stage3LateReportsTest, ::testing::Combine(::testing::Values(2, 3), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<Stage3LateParam>& info) {
                           return "w" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_managed" : "_unmanaged");
                         });

// Stage 3: rank 0 reports head B while it is gathered in backward, rank 1 only after its last
// gather, so head B was already reduced (at the next gather) when rank 1 reported it: Backward()
// fails on every rank (no rank is left waiting), naming rank 1 and, on rank 1, the parameter.
TEST(Stage3ReportTimingTest, AReportAfterTheModuleWasReducedFailsEveryRank) {
  CellSpec cell;
  cell.stage = 3;
  cell.world = 2;
  cell.dtype = DType::kF32;
  const Config config = ParseCell(cell);
  ASSERT_FALSE(HasFailure());
  Schedule schedule;
  schedule.odd_ranks_report_forward = true;
  Window w;
  MicroSpec both;
  both.heads = Heads{true, true};
  w.micros.push_back(both);
  schedule.windows.push_back(w);
  std::vector<RankTrace> traces;
  Status st = RunEngine(config, cell.world, schedule, &traces);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  EXPECT_NE(st.message().find("rank 1 reported a gradient after its module's gradients were reduced"),
            std::string::npos)
      << st.ToString();
}

// Unmanaged accumulation equals managed accumulation for the same boundaries, bitwise.
using ManagedPairParam = std::tuple<int, DType, bool>;  // stage, dtype, freeze
class UnmanagedEqualsManagedTest : public ::testing::TestWithParam<ManagedPairParam> {};

void ExpectSameTensors(const Tensors& a, const Tensors& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t p = 0; p < a.size(); ++p) {
    ASSERT_EQ(a[p].size(), b[p].size()) << what << " param " << p;
    for (size_t i = 0; i < a[p].size(); ++i) {
      ASSERT_EQ(FloatBits(a[p][i]), FloatBits(b[p][i])) << what << " param " << p << " element " << i;
    }
  }
}

TEST_P(UnmanagedEqualsManagedTest, SameBoundariesSameBits) {
  constexpr int kGas = 2, kSteps = 4, kWorld = 2;
  CellSpec cell;
  cell.stage = std::get<0>(GetParam());
  cell.world = kWorld;
  cell.dtype = std::get<1>(GetParam());
  cell.freeze_inactive = std::get<2>(GetParam());
  cell.gas = kGas;
  cell.clip = kClip;
  const Config managed_config = ParseCell(cell);
  CellSpec u = cell;
  u.managed = false;
  u.gas = 1;
  const Config unmanaged_config = ParseCell(u);
  ASSERT_FALSE(HasFailure());
  // Head B inactive in window 1, head A in window 2: the default steps them with zero gradients
  // in both modes, the freeze keeps them in both.
  Schedule managed;
  const std::vector<std::vector<Heads>> heads = {{{true, true}, {true, false}},
                                                 {{true, false}, {true, false}},
                                                 {{false, true}, {false, true}},
                                                 {{true, true}, {false, true}}};
  static_assert(kSteps == 4 && kGas == 2);
  for (const auto& window : heads) {
    Window w;
    for (const Heads& h : window) {
      MicroSpec m;
      m.heads = h;
      w.micros.push_back(m);
    }
    managed.windows.push_back(w);
  }
  Schedule unmanaged = managed;
  unmanaged.managed = false;
  for (Window& w : unmanaged.windows) {
    for (MicroSpec& m : w.micros) m.loss_divisor = static_cast<float>(kGas);
  }
  std::vector<RankTrace> a, b;
  Status st = RunEngine(managed_config, kWorld, managed, &a);
  ASSERT_OK(st);
  st = RunEngine(unmanaged_config, kWorld, unmanaged, &b);
  ASSERT_OK(st);
  for (int r = 0; r < kWorld; ++r) {
    const std::string rank = "rank " + std::to_string(r) + ": ";
    ASSERT_EQ(a[r].steps.size(), b[r].steps.size());
    for (size_t k = 0; k < a[r].steps.size(); ++k) {
      const StepRecord &x = a[r].steps[k], &y = b[r].steps[k];
      EXPECT_EQ(x.applied, y.applied) << rank << "step " << k;
      EXPECT_EQ(x.grad_norm, y.grad_norm) << rank << "step " << k;
      EXPECT_EQ(x.adam_step, y.adam_step) << rank << "step " << k;
      EXPECT_EQ(FloatBits(x.loss_scale_after), FloatBits(y.loss_scale_after)) << rank << "step " << k;
    }
    EXPECT_EQ(a[r].losses, b[r].losses) << rank;
    ExpectSameTensors(a[r].master, b[r].master, rank + "master");
    ExpectSameTensors(a[r].model, b[r].model, rank + "model");
    ExpectSameTensors(a[r].exp_avg, b[r].exp_avg, rank + "exp_avg");
    ExpectSameTensors(a[r].exp_avg_sq, b[r].exp_avg_sq, rank + "exp_avg_sq");
  }
}

INSTANTIATE_TEST_SUITE_P(Pairs, UnmanagedEqualsManagedTest,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3),
                                            ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                                            ::testing::Bool()),
                         [](const ::testing::TestParamInfo<ManagedPairParam>& info) {
                           return "s" + std::to_string(std::get<0>(info.param)) + "_" +
                                  DTypeName(std::get<1>(info.param)) + (std::get<2>(info.param) ? "_freeze" : "_step");
                         });

// ---------------------------------------------------------------------------------------------
// Stage 1 (rank-first order) vs stage 2 (micro-first order), engine against engine.

using CrossParam = std::tuple<int, DType, int>;  // world, dtype, GAS

// Unit roundoff of the dtype the micro-first order rounds each micro step's mean to.
double UnitRoundoff(DType t) {
  switch (t) {
    case DType::kF32:
      return std::ldexp(1.0, -24);
    case DType::kBF16:
      return std::ldexp(1.0, -8);
    default:
      return std::ldexp(1.0, -11);
  }
}

class CrossOrderTest : public ::testing::TestWithParam<CrossParam> {};

TEST_P(CrossOrderTest, Stage1AndStage2Agree) {
  CellSpec cell;
  cell.world = std::get<0>(GetParam());
  cell.dtype = std::get<1>(GetParam());
  cell.gas = std::get<2>(GetParam());
  cell.clip = kClip;
  const Schedule schedule = ManagedSchedule(kSteps, cell.gas);
  std::vector<RankTrace> s1, s2;
  cell.stage = 1;
  const Config c1 = ParseCell(cell);
  cell.stage = 2;
  const Config c2 = ParseCell(cell);
  ASSERT_FALSE(HasFailure());
  Status st = RunEngine(c1, cell.world, schedule, &s1);
  ASSERT_OK(st);
  st = RunEngine(c2, cell.world, schedule, &s2);
  ASSERT_OK(st);
  const RankTrace& a = s1[0];
  const RankTrace& b = s2[0];
  // The orders coincide when each micro step's mean needs no rounding and the fp32 sums are the
  // same sums: one rank (the mean of one value is that value), or fp32 with one micro step.
  const bool same_arithmetic = cell.world == 1 || (cell.dtype == DType::kF32 && cell.gas == 1);
  if (same_arithmetic) {
    EXPECT_EQ(a.master, b.master);
    EXPECT_EQ(a.model, b.model);
    EXPECT_EQ(a.losses, b.losses);
    return;
  }
  // Otherwise the micro-first order rounds each micro step's mean to the model dtype (relative
  // error <= u, the dtype's unit roundoff) where the rank-first order keeps fp32. AdamW's update is
  // invariant to a common scale of the gradient and moves by O(u) relative for an O(u) relative
  // perturbation of it, so each tensor's change over the run (final - initial master) agrees
  // within a small multiple of u in norm: 4u for bf16/fp16 (measured <= 0.5u over these cells).
  // fp32: u = 2^-24 is below the rounding of the weights themselves, which the change carries
  // (|p| / |change| is ~30 after 4 small steps), so the bound is 2^-18 (measured <= 11 * 2^-24).
  const double tol = cell.dtype == DType::kF32 ? std::ldexp(1.0, -18) : 4.0 * UnitRoundoff(cell.dtype);
  for (int p = 0; p < kNumParams; ++p) {
    double diff = 0.0, base = 0.0;
    for (size_t i = 0; i < a.master[p].size(); ++i) {
      const double da = static_cast<double>(a.master[p][i]) - a.initial_master[p][i];
      const double db = static_cast<double>(b.master[p][i]) - b.initial_master[p][i];
      diff += (da - db) * (da - db);
      base += da * da;
    }
    const double rel = std::sqrt(diff) / std::sqrt(base);
    std::printf("cross-order w%d %s gas%d %-14s relative change difference %.3g (tolerance %.3g)\n", cell.world,
                DTypeName(cell.dtype), cell.gas, ModelParams(ModelDims())[p].name.c_str(), rel, tol);
    EXPECT_LE(rel, tol) << ModelParams(ModelDims())[p].name;
  }
  for (size_t w = 0; w < a.losses.size(); ++w) {
    for (size_t j = 0; j < a.losses[w].size(); ++j) {
      EXPECT_LE(std::fabs(a.losses[w][j] - b.losses[w][j]), tol * std::fabs(a.losses[w][j]))
          << "loss of window " << w << " micro " << j;
    }
  }
  for (size_t w = 0; w < a.steps.size(); ++w) {
    const double na = a.steps[w].grad_norm, nb = b.steps[w].grad_norm;
    EXPECT_LE(std::fabs(na - nb), tol * na) << "grad norm of step " << w;
  }
}

INSTANTIATE_TEST_SUITE_P(Orders, CrossOrderTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                                            ::testing::Values(1, 4)),
                         [](const ::testing::TestParamInfo<CrossParam>& info) {
                           return "w" + std::to_string(std::get<0>(info.param)) + "_" +
                                  DTypeName(std::get<1>(info.param)) + "_gas" + std::to_string(std::get<2>(info.param));
                         });

// ---------------------------------------------------------------------------------------------
// Memory: partitioned state is 1/N of stage 0's, within per-parameter padding.

class MemoryTest : public ::testing::TestWithParam<int> {};  // world

TEST_P(MemoryTest, PartitionedStateIsOneNth) {
  const int world = GetParam();
  // Big enough that 1/N is not lost in the engine's per-parameter alignment of its flat buffers.
  ModelDims dims;
  dims.d_in = 64;
  dims.hidden = 255;
  dims.out = 17;
  dims.batch = 2;
  std::map<int, std::vector<EngineMemory>> mem;  // stage -> per rank
  for (int stage = 0; stage <= 3; ++stage) {
    CellSpec cell;
    cell.stage = stage;
    cell.world = world;
    cell.dtype = DType::kBF16;
    cell.gas = 2;
    cell.persistence_threshold = 0;  // nothing stays gathered: model params are pure shards
    cell.reduce_bucket_size = 8192;
    const Config config = ParseCell(cell);
    ASSERT_FALSE(HasFailure());
    std::vector<RankTrace> traces;
    Status st = RunEngine(config, world, ManagedSchedule(1, cell.gas), &traces, dims);
    ASSERT_OK(st) << "stage " << stage;
    for (const RankTrace& t : traces) mem[stage].push_back(t.memory);
  }
  const std::vector<ParamSpec> specs = ModelParams(dims);
  size_t full = 0, shard = 0;  // elements: all parameters, and one rank's padded shares
  for (const ParamSpec& p : specs) {
    const size_t n = static_cast<size_t>(Numel(p));
    full += n;
    shard += (n + world - 1) / world;
  }
  // Alignment: each parameter's piece of a flat buffer may be rounded up to 64 elements (256 bytes
  // of fp32), about 0.5% of these sizes.
  const size_t slack = 256 * specs.size();
  for (int stage = 0; stage <= 3; ++stage) {
    const EngineMemory& m = mem[stage][0];
    std::printf("memory w%d stage %d rank 0: model_params %zu master %zu optimizer %zu gradients %zu staging %zu\n",
                world, stage, m.model_params, m.master_params, m.optimizer_states, m.gradients, m.bucket_staging);
  }
  for (int r = 0; r < world; ++r) {
    const EngineMemory& m0 = mem[0][r];
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_GE(m0.master_params, full * 4);
    EXPECT_GE(m0.gradient_accumulators, full * 4);
    EXPECT_GE(m0.optimizer_states, full * 8);
    for (int stage = 1; stage <= 3; ++stage) {
      const EngineMemory& m = mem[stage][r];
      SCOPED_TRACE("stage " + std::to_string(stage));
      EXPECT_GE(m.master_params, shard * 4);
      EXPECT_LE(m.master_params, m0.master_params / world + shard * 4 - full * 4 / world + slack);
      EXPECT_GE(m.optimizer_states, shard * 8);
      EXPECT_LE(m.optimizer_states, m0.optimizer_states / world + (shard * 8 - full * 8 / world) + 2 * slack);
      if (stage >= 2) {
        // The fp32 accumulators become shards (the gradient buffers and buckets around them stay
        // whatever their layout makes them, and are not compared).
        EXPECT_LE(m.gradient_accumulators, shard * 4 + slack)
            << "stage " << stage << " accumulators " << m.gradient_accumulators;
        EXPECT_GE(m.gradient_accumulators, shard * 4) << "stage " << stage;
      }
      if (stage == 3) {
        EXPECT_GE(m.model_params, shard * 2);
        EXPECT_LE(m.model_params, m0.model_params / world + (shard * 2 - full * 2 / world) + slack);
      } else {
        EXPECT_GE(m.model_params, full * 2);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, MemoryTest, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) { return "w" + std::to_string(info.param); });

}  // namespace
}  // namespace zero::equivalence

// ---------------------------------------------------------------------------------------------
// The same-device communicator (comm/same_device_communicator.h): the engine's ranks as threads on
// one device (here one CpuDevice per rank, the reductions run by its rank-order kernel instead of
// Gloo's point-to-point exchange), bitwise as the reference. A sample of the cells: the matrix
// (stages 0-3 x worlds 2-4 x dtypes, GAS 1 without and GAS 4 with clipping), optimizer offload
// (stages 1-3) and its chunked GPU update, parameter offload (stage 3), fp16 overflows (world 3,
// the last rank overflowing), and ranks using different heads, managed and unmanaged (stages 0-3).
// gpu_equivalence --comm same_device runs every cell this way on one GPU.
#include "comm/same_device_communicator.h"

namespace zero::equivalence {
namespace {

struct SameDeviceCell {
  CellSpec spec;
  bool different_heads = false;
  bool overflow = false;
  std::string Name() const {
    return spec.Name() + (different_heads ? "_diffheads" : "") + (overflow ? "_overflow" : "");
  }
};

std::vector<SameDeviceCell> SameDeviceCells() {
  std::vector<SameDeviceCell> cells;
  for (int stage = 0; stage <= 3; ++stage) {
    for (int world : {2, 3, 4}) {
      for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
        for (int gas : {1, 4}) {
          SameDeviceCell c;
          c.spec = MatrixCell({stage, world, dt, gas, gas == 4});
          cells.push_back(c);
        }
      }
    }
    if (stage >= 1) {
      for (int world : {2, 3}) {
        SameDeviceCell c;
        c.spec = MatrixCell({stage, world, DType::kBF16, 2, true});
        c.spec.offload_optimizer = true;
        cells.push_back(c);
        c.spec.gpu_update_chunk = 37;
        cells.push_back(c);
      }
    }
    if (stage == 3) {
      SameDeviceCell c;
      c.spec = MatrixCell({3, 3, DType::kF32, 1, true});
      c.spec.offload_param = true;
      cells.push_back(c);
      c.spec.offload_optimizer = true;
      cells.push_back(c);
    }
    SameDeviceCell o;
    o.spec = MatrixCell({stage, 3, DType::kF16, 2, true});
    o.spec.loss_scale_window = 2;
    o.overflow = true;
    cells.push_back(o);
    for (bool managed : {true, false}) {
      SameDeviceCell h;
      h.spec.stage = stage;
      h.spec.world = 3;
      h.spec.dtype = DType::kBF16;
      h.spec.managed = managed;
      h.spec.gas = managed ? 2 : 1;
      h.spec.clip = kClip;
      h.different_heads = true;
      cells.push_back(h);
    }
  }
  return cells;
}

// Ranks using different heads (rank 0 A, rank 1 B, rank 2 both; swapped between micro steps), odd
// ranks reporting in forward order: the CPU suite's DifferentHeads schedule.
Schedule DifferentHeadsSchedule(const CellSpec& cell) {
  Schedule s;
  s.managed = cell.managed;
  s.odd_ranks_report_forward = cell.stage < 3;
  s.odd_ranks_report_params_forward = cell.stage == 3;
  const Heads a{true, false}, b{false, true}, both{true, true};
  const std::vector<std::vector<std::vector<Heads>>> windows = {
      {{a, b, both}, {b, a, a}}, {{a, b, b}, {a, b, both}}, {{b, a, both}, {both, b, a}}};
  for (const auto& win : windows) {
    Window w;
    for (const auto& per_rank : win) {
      MicroSpec m;
      m.rank_heads = per_rank;
      if (!cell.managed) m.loss_divisor = static_cast<float>(win.size());
      w.micros.push_back(m);
    }
    s.windows.push_back(w);
  }
  return s;
}

class SameDeviceCommTest : public ::testing::TestWithParam<SameDeviceCell> {};

TEST_P(SameDeviceCommTest, EngineEqualsReferenceBitwise) {
  const SameDeviceCell& cell = GetParam();
  const Config config = ParseCell(cell.spec);
  ASSERT_FALSE(::testing::Test::HasFailure());
  Schedule schedule = cell.different_heads ? DifferentHeadsSchedule(cell.spec) : ManagedSchedule(kSteps, cell.spec.gas);
  if (cell.overflow) {
    // As the Overflow cells: the last rank's first micro batch overflows in windows 1 and 2.
    schedule = ManagedSchedule(7, cell.spec.gas);
    schedule.windows[1].micros[0].overflow_rank = cell.spec.world - 1;
    schedule.windows[2].micros[0].overflow_rank = cell.spec.world - 1;
  }
  Result<RefTrace> ref = RunReference(config, cell.spec.world, OrderOfStage(cell.spec.stage), ModelDims(), schedule);
  ASSERT_OK(ref);
  if (cell.overflow) {
    EXPECT_EQ(ref->overflow_steps, 2);
  } else {
    EXPECT_EQ(ref->overflow_steps, 0);
    if (!cell.different_heads) {
      EXPECT_EQ(ref->clipped_steps, cell.spec.clip > 0 ? kSteps : 0);
    }
  }
  std::vector<RankTrace> traces(cell.spec.world);
  std::vector<std::string> backends(cell.spec.world);
  Status st = RunSameDeviceRanks(cell.spec.world, [&](int rank, Communicator* comm, Device* device) -> Status {
    backends[rank] = comm->backend();
    return RunEngineRank(config, ModelDims(), schedule, device, comm, &traces[rank]);
  });
  ASSERT_OK(st);
  for (const std::string& b : backends) EXPECT_EQ(b, "same_device");
  ExpectMatches(*ref, traces, ContractTolerance());
  // (The chunked GPU update stages its chunks on the device.)
  if (cell.spec.offload_optimizer && cell.spec.gpu_update_chunk == 0) ExpectStatesOffTheDevice(traces);
  for (size_t r = 0; r < traces.size() && cell.spec.offload_param; ++r) {
    EXPECT_GT(traces[r].memory.host_params, 0u) << "rank " << r << ": no shards in host memory";
  }
}

INSTANTIATE_TEST_SUITE_P(SameDevice, SameDeviceCommTest, ::testing::ValuesIn(SameDeviceCells()),
                         [](const ::testing::TestParamInfo<SameDeviceCell>& info) { return info.param.Name(); });

}  // namespace
}  // namespace zero::equivalence
