// LossScaler: the fp16 loss scale, static or dynamic, updated once per optimizer step.
//
// Owns the scale and the counters of DeepSpeed's DynamicLossScaler.update_scale
// (deepspeed/runtime/fp16/loss_scaler.py), reproduced step for step: on an overflow with no
// hysteresis left (delayed_shift 1 or cur_hysteresis 1) the scale becomes max(scale / 2,
// min_scale), otherwise cur_hysteresis drops by one; the overflow is remembered as the last
// overflow iteration. A step without overflow refills the hysteresis when consecutive_hysteresis
// is set, and when the number of good steps before it since the last overflow is a positive
// multiple of scale_window, the scale doubles (and the hysteresis is refilled when
// consecutive_hysteresis is not set). Every Update advances the iteration counter. So from a fresh
// scaler the scale first doubles at the (window + 1)-th good step in a row, as in DeepSpeed today.
// It does not look at gradients: the caller decides `overflow` (any non-finite value in any rank's
// gradients). It knows nothing of the config file: the engine maps fp16.* onto the options. A value
// type; not thread-safe.
#pragma once

#include <cstdint>

#include "runtime/status.h"

namespace zero {

struct DynamicLossScaleOptions {
  int initial_scale_power = 16;  // starts at 2^initial_scale_power
  int64_t scale_window = 1000;   // good steps before the scale doubles
  int hysteresis = 2;            // DeepSpeed's delayed_shift
  bool consecutive_hysteresis = false;
  double min_scale = 1.0;
};

// Everything a checkpoint needs to resume the scaler exactly.
struct LossScalerState {
  double scale = 1.0;
  int64_t cur_iter = 0;
  int64_t last_overflow_iter = -1;
  int cur_hysteresis = 1;

  friend bool operator==(const LossScalerState&, const LossScalerState&) = default;
};

class LossScaler {
 public:
  // A scale of 1 that never changes (fp32 and bf16 training).
  LossScaler() = default;
  // fp16.loss_scale > 0: a fixed scale. Fails for scale <= 0 or non-finite.
  static Result<LossScaler> Static(double scale);
  // fp16.loss_scale == 0. Fails, naming the fp16 key, for a power outside 0..127, window < 1,
  // hysteresis < 1 or min_scale <= 0.
  static Result<LossScaler> Dynamic(const DynamicLossScaleOptions& options);

  float scale() const { return static_cast<float>(state_.scale); }
  bool dynamic() const { return dynamic_; }

  // Call once per optimizer step (applied or skipped) with whether the gradients overflowed.
  void Update(bool overflow);

  // True after an Update(true) that found the scale already at min_scale with no hysteresis left:
  // DeepSpeed raises "Current loss scale already at minimum" there, and the engine should fail the
  // step. The scaler itself carries on as DeepSpeed does with raise_error_at_min_scale off.
  bool overflow_at_min_scale() const { return overflow_at_min_scale_; }

  LossScalerState state() const { return state_; }
  // Dynamic: fails (DATA_LOSS) for a state no scaler with these options could reach (scale <= 0
  // or below min_scale, cur_hysteresis outside 1..hysteresis, last_overflow_iter >= cur_iter).
  // Static: a no-op; the scale is the configured one.
  Status Restore(const LossScalerState& state);

 private:
  bool dynamic_ = false;
  DynamicLossScaleOptions options_;
  LossScalerState state_;
  bool overflow_at_min_scale_ = false;
};

}  // namespace zero
