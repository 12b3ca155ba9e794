// EngineTimeline: the engine's own step timeline (docs/timeline.md): the wall_clock_breakdown
// timers (forward, backward, step, communication, offload) and the zero_trace Chrome trace.
//
// Owns a StepTimers, a Timeline (only with zero_trace) and the phase state of the current micro
// step; it never reads or writes training state. Engine calls it at its public methods
// (OnGather, OnGradient, OnBackwardEnd, BeginStep/EndStep) and wraps the few points where its
// thread waits on collectives or on offload work (Timed). When both the breakdown and the trace
// are off every call is one branch: nothing is synchronized, timed or allocated. With the
// breakdown on, each phase boundary synchronizes the compute stream first (DeepSpeed's synchronized
// timers), so the device's work is counted in the phase that enqueued it.
//
// Phases as the engine sees them: forward runs from the first GatherModule of a micro step to its
// first grad_buffer/GradReady, backward from there (or from the first grad_buffer when nothing
// was gathered) to the end of Backward(), step is a boundary Step(). communication and offload
// are the time spent inside Timed calls of that kind (they nest inside the phases, like
// DeepSpeed's allreduce timer inside bwd). Means are per optimizer step over the window.
//
// With zero_trace the timeline also owns a StreamObserver (zero/trace_observer.h) that the engine
// hands to its components (observer()): their spans on the streams where they enqueue work, only
// in traced steps and at most max_component_spans per step (the rest are counted in the trace's
// dropped_spans); device spans are resolved (never waited for) at the end of each traced step and
// waited for when the trace is written. Without zero_trace there is no observer (null).
//
// Thread safety: used from the engine's thread only; the observer takes calls from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "runtime/device.h"
#include "runtime/status.h"
#include "runtime/step_timers.h"
#include "runtime/timeline.h"
#include "zero/trace_observer.h"

namespace zero {

struct EngineTimelineOptions {
  bool breakdown = false;  // wall_clock_breakdown
  int64_t steps_per_print = 10;
  int rank = 0;
  // Receives the breakdown line (rank 0 only); null: stdout.
  std::function<void(const std::string& line)> sink;
  bool trace = false;      // zero_trace.enabled
  std::string trace_path;  // rank 0 writes it, rank r "<path>.rank<r>"
  // Optimizer steps of this engine (from 1, inclusive; a resumed run counts from its first step).
  int64_t trace_first_step = 2;
  int64_t trace_last_step = 4;
  // Component spans (the observer's) recorded per traced step at most.
  int64_t max_component_spans = 4096;
};

// The file rank `rank` writes its trace to.
std::string TracePathForRank(const std::string& path, int rank);

class EngineTimeline {
 public:
  enum class Kind { kCommunication, kOffload };

  EngineTimeline();  // off
  ~EngineTimeline();
  EngineTimeline(const EngineTimeline&) = delete;
  EngineTimeline& operator=(const EngineTimeline&) = delete;

  // Turns the timeline on for `options` on `compute` (the stream the engine enqueues on). With the
  // trace: attaches `device` (one synchronization). Errors name the zero_trace key.
  Status Configure(const EngineTimelineOptions& options, Device* device, Stream* compute);

  bool on() const { return on_; }

  Status OnGather() { return on_ ? Phase(kForward) : OkStatus(); }
  Status OnGradient() { return on_ ? Phase(kBackward) : OkStatus(); }
  Status OnBackwardEnd() { return on_ ? Phase(kIdle) : OkStatus(); }
  // Around a boundary Step(). EndStep counts one optimizer step, prints the breakdown every
  // steps_per_print steps and writes the trace after its last step (errors name zero_trace.path).
  Status BeginStep() { return on_ ? Phase(kStep) : OkStatus(); }
  Status EndStep(int64_t global_step) { return on_ ? EndStepImpl(global_step) : OkStatus(); }

  // Runs `fn` (a wait of the engine's thread) and adds its time to `kind`'s timer; in a traced
  // step also a span named `name` on `track` (device span on the compute stream for the device
  // tracks, host span for kTrackCpuOptimizer and kTrackIo). Nested calls of one kind are timed
  // once (the outermost).
  Status Timed(Kind kind, TrackId track, const char* name, const std::function<Status()>& fn) {
    return on_ ? TimedImpl(kind, track, name, fn) : fn();
  }

  // The last printed window's mean per optimizer step (ms) of each timer that had time in it.
  std::map<std::string, double> last_means() const { return last_means_; }
  // Null unless zero_trace is on.
  Timeline* timeline() { return timeline_.get(); }
  // What the engine hands its components (set_observer); null unless zero_trace is on.
  StreamObserver* observer();
  // Process-wide: observers created (one per engine with zero_trace) and calls they received.
  static int64_t observers_created();
  static int64_t observer_calls();

 private:
  enum PhaseId { kIdle, kForward, kBackward, kStep };
  Status Phase(PhaseId next);
  Status EndStepImpl(int64_t global_step);
  Status TimedImpl(Kind kind, TrackId track, const char* name, const std::function<Status()>& fn);
  Status Sync();
  class Observer;
  bool Recording() const { return timeline_ != nullptr && timeline_->enabled(); }

  bool on_ = false;
  EngineTimelineOptions options_;
  Device* device_ = nullptr;
  Stream* compute_ = nullptr;
  StepTimers timers_;
  std::unique_ptr<Timeline> timeline_;
  std::unique_ptr<Observer> observer_;  // with timeline_
  PhaseId phase_ = kIdle;
  int64_t phase_begin_ns_ = 0;
  int64_t step_begin_ns_ = -1;  // the traced step's first phase; -1: none yet
  int depth_[2] = {0, 0};
  int64_t steps_run_ = 0;  // boundary steps since creation (the trace window counts these)
  std::map<std::string, double> last_means_;
};

}  // namespace zero
