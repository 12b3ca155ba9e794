#include "zero/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace zero {
namespace {

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

}  // namespace

Result<LossScaler> LossScaler::Static(double scale) {
  if (!(scale > 0.0) || !std::isfinite(scale)) {
    return InvalidArgumentError("fp16.loss_scale: expected a number > 0 for a static scale, got " + Num(scale));
  }
  LossScaler s;
  s.state_.scale = scale;
  return s;
}

Result<LossScaler> LossScaler::Dynamic(const DynamicLossScaleOptions& options) {
  if (options.initial_scale_power < 0 || options.initial_scale_power > 127) {
    return InvalidArgumentError("fp16.initial_scale_power: expected an integer in 0..127, got " +
                                std::to_string(options.initial_scale_power));
  }
  if (options.scale_window < 1) {
    return InvalidArgumentError("fp16.loss_scale_window: expected an integer >= 1, got " +
                                std::to_string(options.scale_window));
  }
  if (options.hysteresis < 1) {
    return InvalidArgumentError("fp16.hysteresis: expected an integer >= 1, got " + std::to_string(options.hysteresis));
  }
  if (!(options.min_scale > 0.0) || !std::isfinite(options.min_scale)) {
    return InvalidArgumentError("fp16.min_loss_scale: expected a number > 0, got " + Num(options.min_scale));
  }
  LossScaler s;
  s.dynamic_ = true;
  s.options_ = options;
  s.state_.scale = std::ldexp(1.0, options.initial_scale_power);
  s.state_.cur_hysteresis = options.hysteresis;
  return s;
}

void LossScaler::Update(bool overflow) {
  overflow_at_min_scale_ = false;
  if (!dynamic_) return;
  LossScalerState& s = state_;
  if (overflow) {
    if (options_.hysteresis == 1 || s.cur_hysteresis == 1) {
      overflow_at_min_scale_ = s.scale == options_.min_scale;
      s.scale = std::max(s.scale / 2.0, options_.min_scale);
    } else {
      s.cur_hysteresis -= 1;
    }
    s.last_overflow_iter = s.cur_iter;
  } else {
    if (options_.consecutive_hysteresis) s.cur_hysteresis = options_.hysteresis;
    // Good steps before this one since the last overflow (or since the start).
    const int64_t stable_interval = (s.cur_iter - s.last_overflow_iter) - 1;
    if (stable_interval > 0 && stable_interval % options_.scale_window == 0) {
      if (!options_.consecutive_hysteresis) s.cur_hysteresis = options_.hysteresis;
      s.scale *= 2.0;
    }
  }
  s.cur_iter += 1;
}

Status LossScaler::Restore(const LossScalerState& state) {
  const std::string where = "loss scaler state: ";
  if (!(state.scale > 0.0) || !std::isfinite(state.scale)) {
    return DataLossError(where + "scale: expected a finite number > 0, got " + Num(state.scale));
  }
  if (!dynamic_) return OkStatus();  // a static scale comes from the config, not the checkpoint
  if (state.cur_iter < 0 || state.last_overflow_iter < -1 || state.last_overflow_iter >= state.cur_iter) {
    return DataLossError(where + "expected -1 <= last_overflow_iter < cur_iter, got last_overflow_iter " +
                         std::to_string(state.last_overflow_iter) + " and cur_iter " + std::to_string(state.cur_iter));
  }
  if (state.cur_hysteresis < 1 || state.cur_hysteresis > options_.hysteresis) {
    return DataLossError(where + "cur_hysteresis: expected 1.." + std::to_string(options_.hysteresis) + ", got " +
                         std::to_string(state.cur_hysteresis));
  }
  if (state.scale < options_.min_scale) {
    return DataLossError(where + "scale: expected >= min_loss_scale " + Num(options_.min_scale) + ", got " +
                         Num(state.scale));
  }
  state_ = state;
  overflow_at_min_scale_ = false;
  return OkStatus();
}

}  // namespace zero
