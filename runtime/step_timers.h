// StepTimers: named wall-clock timers summed over a window of optimizer steps, and the
// DeepSpeed-style `wall_clock_breakdown` line "time (ms) | forward: 12.34 | backward: ... | step: ..."
// (deepspeed/utils/timer.py, SynchronizedWallClockTimer.log) with each timer's mean per step over
// the window (docs/timeline.md).
//
// Owns only its sums; touches no device. Times are host time between Start and Stop: a phase that
// only enqueues device work must synchronize before Stop to be measured (or feed a device-measured
// time through Add). Thread-safe (one mutex).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/status.h"

namespace zero {

// The timers of the breakdown line, in the order DeepSpeed users read them.
inline const std::vector<std::string>& BreakdownTimerNames() {
  static const std::vector<std::string>* names =
      new std::vector<std::string>{"forward", "backward", "step", "communication", "offload"};
  return *names;
}

class StepTimers {
 public:
  // `clock`: host nanoseconds (default steady_clock); tests pass a fake one.
  explicit StepTimers(std::function<int64_t()> clock = nullptr);

  // Starts timer `name`. FailedPrecondition (naming it) if it is already running.
  Status Start(const std::string& name);
  // Stops it and adds the time since Start to the window. FailedPrecondition if it is not running.
  Status Stop(const std::string& name);
  // Adds `ms` to timer `name` in the window (a time measured elsewhere, e.g. on the device).
  void Add(const std::string& name, double ms);
  // Marks the end of one optimizer step: the window's means divide by the steps marked.
  void EndStep();

  int64_t steps() const;                          // steps marked in this window
  bool has(const std::string& name) const;        // the timer has time in this window
  double TotalMs(const std::string& name) const;  // its sum in the window (0 if none)
  double MeanMs(const std::string& name) const;   // TotalMs / max(steps, 1)

  // "time (ms) | a: 1.23 | b: 4.56": the mean per step of each of `names` that has time in the
  // window, in that order, with two decimals (DeepSpeed's format); just "time (ms)" when none has.
  std::string Format(const std::vector<std::string>& names) const;
  // Format of every timer with time in the window, in the order each was first used.
  std::string FormatAll() const;
  // Starts a new window: sums and the step count go to zero; running timers keep running.
  void Reset();

 private:
  struct Timer {
    double total_ms = 0;
    bool used = false;  // has time in this window
    bool running = false;
    int64_t started_ns = 0;
  };
  Timer& Get(const std::string& name);  // REQUIRES: mu_ held
  std::string FormatLocked(const std::vector<std::string>& names) const;

  std::function<int64_t()> clock_;
  mutable std::mutex mu_;
  std::map<std::string, Timer> timers_;  // GUARDED_BY(mu_)
  std::vector<std::string> order_;       // GUARDED_BY(mu_): first-use order
  int64_t steps_ = 0;                    // GUARDED_BY(mu_)
};

}  // namespace zero
