#include "engine/lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace zero {

Result<LrScheduler> LrScheduler::Create(const SchedulerConfig& config, double base_lr) {
  if (!(base_lr >= 0.0) || !std::isfinite(base_lr)) {
    return InvalidArgumentError("optimizer.params.lr: expected a number >= 0, got " + std::to_string(base_lr));
  }
  LrScheduler s;
  s.base_lr_ = base_lr;
  if (config.type.empty()) return s;

  if (config.type == "WarmupLR") {
    s.kind_ = Kind::kWarmup;
  } else if (config.type == "WarmupDecayLR") {
    s.kind_ = Kind::kWarmupDecay;
  } else if (config.type == "WarmupCosineLR") {
    s.kind_ = Kind::kWarmupCosine;
  } else {
    return InvalidArgumentError(
        "scheduler.type: expected one of \"\", \"WarmupLR\", \"WarmupDecayLR\", "
        "\"WarmupCosineLR\", got \"" +
        config.type + "\"");
  }
  if (config.warmup_num_steps < 1) {
    return InvalidArgumentError("scheduler.params.warmup_num_steps: expected an integer >= 1, got " +
                                std::to_string(config.warmup_num_steps));
  }
  if (config.warmup_type != "log" && config.warmup_type != "linear") {
    return InvalidArgumentError("scheduler.params.warmup_type: expected one of \"log\", \"linear\", got \"" +
                                config.warmup_type + "\"");
  }
  if (s.kind_ != Kind::kWarmup && config.total_num_steps < 1) {
    return InvalidArgumentError("scheduler.params.total_num_steps: expected an integer >= 1 (" + config.type +
                                " requires it), got " + std::to_string(config.total_num_steps));
  }
  s.warmup_steps_ = std::max<int64_t>(2, config.warmup_num_steps);
  s.linear_ = config.warmup_type == "linear";
  s.inverse_log_warmup_ = 1.0 / std::log(static_cast<double>(s.warmup_steps_));
  s.total_steps_ = config.total_num_steps;
  s.min_lr_ = config.warmup_min_lr;
  s.max_lr_ = config.warmup_max_lr == -1.0 ? base_lr : config.warmup_max_lr;
  s.warmup_min_ratio_ = config.warmup_min_ratio;
  s.cos_min_ratio_ = config.cos_min_ratio;
  if (s.kind_ != Kind::kWarmupCosine && (!(s.min_lr_ >= 0.0) || !(s.max_lr_ >= 0.0))) {
    return InvalidArgumentError("scheduler.params.warmup_min_lr/warmup_max_lr: expected numbers >= 0, got " +
                                std::to_string(s.min_lr_) + " and " + std::to_string(s.max_lr_));
  }
  if (s.kind_ == Kind::kWarmupCosine && !(s.warmup_min_ratio_ >= 0.0 && s.warmup_min_ratio_ <= 1.0 &&
                                          s.cos_min_ratio_ >= 0.0 && s.cos_min_ratio_ <= 1.0)) {
    return InvalidArgumentError("scheduler.params.warmup_min_ratio/cos_min_ratio: expected numbers in [0, 1], got " +
                                std::to_string(s.warmup_min_ratio_) + " and " + std::to_string(s.cos_min_ratio_));
  }
  return s;
}

double LrScheduler::WarmupGamma(int64_t i) const {
  if (linear_) return static_cast<double>(i) / static_cast<double>(warmup_steps_);
  return inverse_log_warmup_ * std::log(static_cast<double>(i + 1));
}

double LrScheduler::LrAt(int64_t steps) const {
  const int64_t i = steps - 1;  // DeepSpeed's last_batch_iteration
  switch (kind_) {
    case Kind::kConstant:
      return base_lr_;
    case Kind::kWarmup:
    case Kind::kWarmupDecay: {
      if (i < 0) return min_lr_;
      double gamma = 1.0;
      if (i < warmup_steps_) {
        gamma = WarmupGamma(i);
      } else if (kind_ == Kind::kWarmupDecay) {
        gamma = std::max(0.0, static_cast<double>(total_steps_ - i) /
                                  std::max(1.0, static_cast<double>(total_steps_ - warmup_steps_)));
      }
      return min_lr_ + (max_lr_ - min_lr_) * gamma;
    }
    case Kind::kWarmupCosine: {
      if (i < 0) return 0.0;
      double ratio;
      if (i < warmup_steps_) {
        ratio = warmup_min_ratio_ + WarmupGamma(i) * (1.0 - warmup_min_ratio_);
      } else {
        const int64_t real_last_step = i - warmup_steps_ + 1;
        const int64_t real_total_steps = std::max<int64_t>(1, total_steps_ - warmup_steps_);
        const double progress =
            std::min(1.0, static_cast<double>(real_last_step) / static_cast<double>(real_total_steps));
        const double cosine = (1 + std::cos(M_PI * progress)) / 2;
        ratio = std::max(0.0, cos_min_ratio_ + (1.0 - cos_min_ratio_) * cosine);
      }
      return base_lr_ * ratio;
    }
  }
  return base_lr_;
}

Status LrScheduler::Restore(const LrSchedulerState& state) {
  if (state.last_batch_iteration < -1) {
    return OutOfRangeError("lr scheduler state: last_batch_iteration: expected >= -1, got " +
                           std::to_string(state.last_batch_iteration));
  }
  steps_ = state.last_batch_iteration + 1;
  return OkStatus();
}

}  // namespace zero
