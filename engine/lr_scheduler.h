// LrScheduler: the learning rate as a function of optimizer steps, with DeepSpeed's schedules.
//
// Owns the schedule math for a constant lr, WarmupLR, WarmupDecayLR and WarmupCosineLR, computed
// in double with the same formulas (and the same floating-point order) as DeepSpeed's
// deepspeed/runtime/lr_schedules.py, so the lr of every step matches DeepSpeed's exactly. It does
// not touch the optimizer: the engine asks for the lr and hands it to the update.
//
// Step counting. DeepSpeed builds a scheduler with last_batch_iteration = -1 and calls
// scheduler.step() after every optimizer step that was applied (a step skipped for fp16 overflow
// does not count). `LrAt(s)` is the lr the optimizer holds after s such calls, i.e. DeepSpeed's
// get_lr() at last_batch_iteration = s - 1. So the t-th applied update (t = 1, 2, ...) uses
// LrAt(t - 1): the first update uses LrAt(0) = warmup_min_lr for WarmupLR/WarmupDecayLR and 0 for
// WarmupCosineLR, exactly as in DeepSpeed. With W = max(2, warmup_num_steps) and i = s - 1 >= 0:
//   WarmupLR:       min + (max - min) * g,  g = log(i + 1) / log(W) (log) or i / W (linear) while
//                   i < W, then 1.
//   WarmupDecayLR:  as WarmupLR during warmup, then g = max(0, (T - i) / max(1, T - W)).
//   WarmupCosineLR: lr * r; warmup r = wmin + g * (1 - wmin); after it, with
//                   p = min(1, (i - W + 1) / max(1, T - W)), r = max(0, cmin + (1 - cmin) * (1 + cos(pi p)) / 2).
// A value is cheap to copy; LrAt is const and thread-compatible.
#pragma once

#include <cstdint>

#include "engine/config/config.h"
#include "runtime/status.h"

namespace zero {

// What a checkpoint keeps of a scheduler: DeepSpeed's state_dict() has the same single field.
struct LrSchedulerState {
  int64_t last_batch_iteration = -1;  // applied optimizer steps - 1

  friend bool operator==(const LrSchedulerState&, const LrSchedulerState&) = default;
};

class LrScheduler {
 public:
  // `config.type` "" is a constant lr. `base_lr` is optimizer.params.lr; warmup_max_lr -1 means it.
  // Errors name the scheduler key at fault (unknown type, total_num_steps missing, ...).
  static Result<LrScheduler> Create(const SchedulerConfig& config, double base_lr);

  // The lr after `steps` applied optimizer steps (see above); steps >= 0.
  double LrAt(int64_t steps) const;

  // Stateful use: lr() is the lr for the next update; call Step() after each applied update.
  double lr() const { return LrAt(steps_); }
  void Step() { ++steps_; }
  int64_t steps() const { return steps_; }

  LrSchedulerState state() const { return {steps_ - 1}; }
  // Fails (OUT_OF_RANGE) for last_batch_iteration < -1.
  Status Restore(const LrSchedulerState& state);

 private:
  enum class Kind { kConstant, kWarmup, kWarmupDecay, kWarmupCosine };

  LrScheduler() = default;
  // The warmup fraction g in [0, 1] at DeepSpeed iteration i (0 <= i < warmup_steps_).
  double WarmupGamma(int64_t i) const;

  Kind kind_ = Kind::kConstant;
  double base_lr_ = 0.0;
  double min_lr_ = 0.0;
  double max_lr_ = 0.0;
  int64_t warmup_steps_ = 2;  // max(2, warmup_num_steps), as DeepSpeed
  bool linear_ = false;
  double inverse_log_warmup_ = 0.0;
  int64_t total_steps_ = 0;
  double warmup_min_ratio_ = 0.0;
  double cos_min_ratio_ = 0.0;
  int64_t steps_ = 0;
};

}  // namespace zero
