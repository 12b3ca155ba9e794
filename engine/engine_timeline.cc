#include "engine/engine_timeline.h"

#include <chrono>
#include <cstdio>
#include <utility>

namespace zero {

namespace {

int64_t SteadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

const char* TimerName(int phase) {
  switch (phase) {
    case 1: return "forward";
    case 2: return "backward";
    case 3: return "step";
  }
  return "?";
}

// The trace's name of a phase: "step" is the optimizer step inside the "step N" span.
const char* SpanName(int phase) { return phase == 3 ? "optimizer step" : TimerName(phase); }

}  // namespace

std::string TracePathForRank(const std::string& path, int rank) {
  return rank == 0 ? path : path + ".rank" + std::to_string(rank);
}

Status EngineTimeline::Configure(const EngineTimelineOptions& options, Device* device, Stream* compute) {
  options_ = options;
  device_ = device;
  compute_ = compute;
  on_ = options.breakdown || options.trace;
  if (!options.trace) return OkStatus();
  TimelineOptions to;
  to.pid = options.rank;
  to.process_name = "rank " + std::to_string(options.rank);
  to.enabled = options.trace_first_step <= 1 && 1 <= options.trace_last_step;
  timeline_ = std::make_unique<Timeline>(std::move(to));
  return timeline_->AttachDevice(device).WithContext("zero_trace: timing the device");
}

Status EngineTimeline::Sync() { return device_->SynchronizeStream(compute_); }

Status EngineTimeline::Phase(PhaseId next) {
  if (next == kForward && phase_ != kIdle) return OkStatus();  // a gather in backward, or a later one
  if (next == phase_) return OkStatus();
  if (options_.breakdown) ZERO_RETURN_IF_ERROR(Sync().WithContext("wall_clock_breakdown: synchronizing"));
  const int64_t now = SteadyNs();
  if (phase_ != kIdle) {
    if (options_.breakdown) ZERO_RETURN_IF_ERROR(timers_.Stop(TimerName(phase_)));
    if (Recording()) timeline_->AddSpan(kTrackCompute, SpanName(phase_), phase_begin_ns_, now);
  }
  if (next != kIdle) {
    if (options_.breakdown) ZERO_RETURN_IF_ERROR(timers_.Start(TimerName(next)));
    phase_begin_ns_ = now;
    if (Recording() && step_begin_ns_ < 0) step_begin_ns_ = now;
  }
  phase_ = next;
  return OkStatus();
}

Status EngineTimeline::EndStepImpl(int64_t global_step) {
  ZERO_RETURN_IF_ERROR(Phase(kIdle));
  ++steps_run_;
  if (Recording()) {
    if (step_begin_ns_ >= 0) {
      timeline_->AddSpan(kTrackCompute, "step " + std::to_string(global_step), step_begin_ns_, SteadyNs(),
                         {{"step", global_step}});
    }
    ZERO_RETURN_IF_ERROR(timeline_->ResolveDeviceSpans().status().WithContext("zero_trace"));
  }
  step_begin_ns_ = -1;
  if (options_.breakdown) {
    timers_.EndStep();
    if (timers_.steps() >= options_.steps_per_print) {
      last_means_.clear();
      for (const std::string& n : BreakdownTimerNames()) {
        if (timers_.has(n)) last_means_[n] = timers_.MeanMs(n);
      }
      if (options_.rank == 0) {
        const std::string line = timers_.Format(BreakdownTimerNames());
        if (options_.sink) {
          options_.sink(line);
        } else {
          std::printf("%s\n", line.c_str());
          std::fflush(stdout);
        }
      }
      timers_.Reset();
    }
  }
  if (timeline_ != nullptr) {
    if (steps_run_ == options_.trace_last_step) {
      timeline_->set_enabled(false);
      const std::string path = TracePathForRank(options_.trace_path, options_.rank);
      ZERO_RETURN_IF_ERROR(timeline_->WriteChromeTrace(path).WithContext("zero_trace.path"));
    }
    const int64_t next = steps_run_ + 1;
    timeline_->set_enabled(next >= options_.trace_first_step && next <= options_.trace_last_step);
  }
  return OkStatus();
}

Status EngineTimeline::TimedImpl(Kind kind, TrackId track, const char* name, const std::function<Status()>& fn) {
  int& depth = depth_[kind == Kind::kCommunication ? 0 : 1];
  if (depth > 0) return fn();
  const char* timer = kind == Kind::kCommunication ? "communication" : "offload";
  if (options_.breakdown) {
    ZERO_RETURN_IF_ERROR(Sync().WithContext("wall_clock_breakdown: synchronizing"));
    ZERO_RETURN_IF_ERROR(timers_.Start(timer));
  }
  const bool recording = Recording();
  const bool host_span = track == kTrackCpuOptimizer || track == kTrackIo;
  const int64_t begin_ns = SteadyNs();
  Timeline::DeviceSpan span;
  if (recording && !host_span) {
    auto s = timeline_->BeginDeviceSpan(track, name, compute_);
    if (!s.ok()) return s.status().WithContext("zero_trace");
    span = std::move(s).value();
  }
  ++depth;
  Status s = fn();
  --depth;
  if (options_.breakdown) {
    Status sync = Sync();
    if (s.ok()) s = sync.WithContext("wall_clock_breakdown: synchronizing");
    Status stop = timers_.Stop(timer);
    if (s.ok()) s = stop;
  }
  if (recording) {
    if (host_span) {
      timeline_->AddSpan(track, name, begin_ns, SteadyNs());
    } else if (!span.empty()) {
      Status end = timeline_->EndDeviceSpan(std::move(span), compute_);
      if (s.ok()) s = end.WithContext("zero_trace");
    }
  }
  return s;
}

}  // namespace zero
