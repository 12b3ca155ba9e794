// The reference trainer: what docs/zero.md's arithmetic contract says a run must produce, computed in
// one process with no communicator and no partitioning.
//
// It holds the full fp32 master weights, the AdamW moments and the model-dtype parameters (as the
// floats they round to), runs every rank's forward/backward with the same model code on the same
// data, and applies the contract:
//   - the user's gradient is rounded to the model dtype (what grad_buffer holds);
//   - mean over ranks = fp32 sum in rank order 0..N-1, divided by N (fp32 division), rounded once
//     to the reduced buffer's dtype;
//   - ReductionOrder::kRankFirst (stages 0/1): each rank accumulates its gradients in fp32 over the
//     window's micro steps (acc += g, starting from zero), then the fp32 sums are mean-reduced;
//     ReductionOrder::kMicroFirst (stages 2/3): each micro step's gradients are mean-reduced in the
//     model dtype, and the result is added to the fp32 accumulator;
//   - at the boundary: sumsq = sum of (double) acc^2 in the contract's order (per parameter, this
//     rank's partition (stage 0: all of it) summed as CpuDevice::SumOfSquares does (8 lanes), the
//     partials added in parameter order, the ranks' sums in rank order (stages 1-3)); fp16
//     overflow = any accumulator element not finite -> the step is skipped (counted in global and
//     skipped steps, not in adam_step; the LR schedule does not advance), the loss scaler
//     (zero/loss_scaler.h, the real one) is updated;
//     norm = sqrt(sumsq) / GAS (GAS = 1 unmanaged); clip_coef = max(1, (norm/loss_scale + 1e-6)/clip)
//     (1 when clipping is off); grad_scale = (float)(1 / (GAS * loss_scale * clip_coef));
//     bias corrections (float)(1 - beta^t) computed in double (std::pow), t = applied steps so far;
//     lr = (float) of the LR scheduler's (engine/lr_scheduler.h) value for this step;
//     AdamWReference per element; the model parameter = master rounded to the model dtype;
//     global_grad_norm = norm / loss_scale.
//   - managed: every parameter is updated at every boundary (an unreported gradient is zero);
//     unmanaged: only parameters reported in some Backward() of the window are updated, the
//     others keep weights and moments untouched.
// Initial state: master = the init values exactly (fp32), model parameter = init rounded to the
// model dtype, moments zero.
#pragma once

#include "engine/config/config.h"
#include "runtime/status.h"
#include "tests/equivalence/harness.h"
#include "tests/equivalence/test_model.h"

namespace zero::equivalence {

enum class ReductionOrder {
  kRankFirst,   // stages 0/1: per-rank fp32 accumulation, then the mean over ranks in fp32
  kMicroFirst,  // stages 2/3: per micro step mean over ranks in the model dtype, then fp32 sum
};
ReductionOrder OrderOfStage(int stage);

// Runs the reference for `world` ranks. `config` is the same parsed config the engine gets.
Result<RefTrace> RunReference(const Config& config, int world, ReductionOrder order, const CellModel& model,
                              const Schedule& schedule);
// The same with the suite's small model (MlpCellModel(dims)).
Result<RefTrace> RunReference(const Config& config, int world, ReductionOrder order, const ModelDims& dims,
                              const Schedule& schedule);

}  // namespace zero::equivalence
