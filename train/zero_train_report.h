// What zero_train shows a person: the periodic log line, the per-step JSON record (--log-json),
// the terminal progress bar, and the number/size/duration formatting they share.
//
// Pure formatting plus one class that writes to a FILE* (the progress bar); touches no engine or
// communicator state: the trainer gathers the numbers (means over ranks, maxima of memory) and
// hands them here. Not thread-safe.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "engine/engine.h"

namespace zero::examples {

// One optimizer step as seen by rank 0 (values already reduced over ranks where noted).
struct StepRecord {
  int64_t step = 0;            // 1-based optimizer step
  double loss = 0;             // mean over ranks and micro steps of this step
  double lr = 0;               // the lr this step used
  double grad_norm = -1;       // global, unscaled; inf on fp16 overflow
  float loss_scale = 1;        // the scale this step's backward used
  bool fp16 = false;           // whether loss_scale means anything
  bool applied = true;         // false: skipped (fp16 overflow)
  double step_seconds = 0;     // wall time of this step on rank 0 (forward, backward, step)
  int64_t tokens = 0;          // predicted bytes in this step over all ranks
  double elapsed_seconds = 0;  // since training started
  EngineMemory memory;         // rank 0's
};

// {"step":..,"loss":..,"lr":..,"grad_norm":..,"applied":..,"step_ms":..,"tokens":..,
//  "tokens_per_s":..,"elapsed_s":..,["loss_scale":..,]"memory":{...}} on one line, no newline.
// Non-finite numbers are written as null (JSON has no inf/nan).
std::string StepJson(const StepRecord& r);

// The periodic log line over a window of steps ending at `last`.
struct WindowSummary {
  int64_t total_steps = 0;
  StepRecord last;           // the window's last step (lr, grad norm, loss scale)
  double mean_loss = 0;      // over the window's steps
  double seconds = 0;        // wall time of the window's steps
  int64_t steps = 0;         // steps in the window
  int64_t tokens = 0;        // tokens in the window, all ranks
  int64_t skipped = 0;       // skipped steps so far
  EngineMemory memory_max;   // maximum over ranks of each field
  double host_peak_max = 0;  // maximum over ranks of the peak resident set (getrusage), bytes
};
std::string FormatWindow(const WindowSummary& w);

std::string FormatBytes(double bytes);       // "812 B", "1.3 KiB", "4.25 MiB", "2.00 GiB"
std::string FormatDuration(double seconds);  // "0:07", "1:02:03"
std::string FormatCount(double x);           // "12.3k", "1.20M"

// A single terminal line redrawn with '\r': bar, percent, step/total, loss, ETA. Draws nothing
// unless enabled (the trainer enables it for rank 0 when stdout is a TTY). Redraws at most every
// 100 ms; Clear() erases the line before other output, Draw() puts it back.
class ProgressBar {
 public:
  ProgressBar(FILE* out, int64_t total, bool enabled);
  ~ProgressBar();
  void Update(int64_t step, double loss, double elapsed_seconds, bool force = false);
  void Clear();
  void Draw();
  void Finish();  // clears for good
  bool enabled() const { return enabled_; }

 private:
  std::string Render() const;
  FILE* out_;
  int64_t total_;
  bool enabled_;
  bool shown_ = false;
  int64_t step_ = 0;
  double loss_ = 0;
  double elapsed_ = 0;
  double last_draw_ = -1;
};

}  // namespace zero::examples
