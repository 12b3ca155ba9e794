#include "engine/engine_timeline.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <utility>

namespace zero {

namespace {

int64_t SteadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

const char* TimerName(int phase) {
  switch (phase) {
    case 1:
      return "forward";
    case 2:
      return "backward";
    case 3:
      return "step";
  }
  return "?";
}

// The trace's name of a phase: "step" is the optimizer step inside the "step N" span.
const char* SpanName(int phase) { return phase == 3 ? "optimizer step" : TimerName(phase); }

std::atomic<int64_t> created_observers{0};
std::atomic<int64_t> observer_call_count{0};

}  // namespace

// The components' spans into the timeline: only while it records (the traced steps), at most
// `max_per_step` per step; errors are kept for EndStep (a trace never fails a component's call).
class EngineTimeline::Observer final : public StreamObserver {
 public:
  Observer(Timeline* timeline, int64_t max_per_step) : timeline_(timeline), max_per_step_(max_per_step) {
    created_observers.fetch_add(1, std::memory_order_relaxed);
  }

  SpanId BeginDevice(TraceTrack track, const char* name, Stream* stream) override {
    observer_call_count.fetch_add(1, std::memory_order_relaxed);
    if (!timeline_->enabled() || !Admit()) return 0;
    Result<Timeline::DeviceSpan> span = timeline_->BeginDeviceSpan(TrackOf(track), name, stream);
    if (!span.ok()) {
      Keep(span.status().WithContext(std::string("zero_trace: the start of '") + name + "'"));
      return 0;
    }
    if (span->empty()) return 0;
    std::lock_guard<std::mutex> lock(mu_);
    const SpanId id = next_id_++;
    open_.emplace(id, std::move(span).value());
    return id;
  }

  void EndDevice(SpanId id, Stream* stream) override {
    observer_call_count.fetch_add(1, std::memory_order_relaxed);
    Timeline::DeviceSpan span;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = open_.find(id);
      if (it == open_.end()) return;
      span = std::move(it->second);
      open_.erase(it);
    }
    Status s = timeline_->EndDeviceSpan(std::move(span), stream);
    if (!s.ok()) Keep(s.WithContext("zero_trace: the end of a component's device span"));
  }

  void HostSpan(TraceTrack track, const char* name, int64_t begin_ns, int64_t end_ns) override {
    observer_call_count.fetch_add(1, std::memory_order_relaxed);
    if (!timeline_->enabled() || !Admit()) return;
    timeline_->AddSpan(TrackOf(track), name, begin_ns, end_ns);
  }

  // The end of a step: the per-step bound starts over; returns the spans dropped in the step and
  // the first error since the last call.
  Status EndStep(int64_t* dropped) {
    std::lock_guard<std::mutex> lock(mu_);
    *dropped = dropped_;
    dropped_ = 0;
    this_step_ = 0;
    Status s = std::move(error_);
    error_ = OkStatus();
    return s;
  }

 private:
  TrackId TrackOf(TraceTrack t) {
    switch (t) {
      case TraceTrack::kCommunication:
        return kTrackCommunication;
      case TraceTrack::kHostToDevice:
        return kTrackHostToDevice;
      case TraceTrack::kDeviceToHost:
        return kTrackDeviceToHost;
      case TraceTrack::kCpuOptimizer:
        return kTrackCpuOptimizer;
      case TraceTrack::kIo:
        return kTrackIo;
      case TraceTrack::kGpuOptimizer:
        return timeline_->AddTrack("GPU optimizer");  // only when used
    }
    return kTrackCompute;
  }
  bool Admit() {
    std::lock_guard<std::mutex> lock(mu_);
    if (this_step_ >= max_per_step_) {
      ++dropped_;
      return false;
    }
    ++this_step_;
    return true;
  }
  void Keep(Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.ok()) error_ = std::move(s);
  }

  Timeline* const timeline_;
  const int64_t max_per_step_;
  std::mutex mu_;
  std::map<SpanId, Timeline::DeviceSpan> open_;  // GUARDED_BY(mu_): begun, not yet ended
  SpanId next_id_ = 1;                           // GUARDED_BY(mu_)
  int64_t this_step_ = 0;                        // GUARDED_BY(mu_): admitted in this step
  int64_t dropped_ = 0;                          // GUARDED_BY(mu_): refused in this step
  Status error_;                                 // GUARDED_BY(mu_)
};

EngineTimeline::EngineTimeline() = default;
EngineTimeline::~EngineTimeline() = default;

StreamObserver* EngineTimeline::observer() { return observer_.get(); }
int64_t EngineTimeline::observers_created() { return created_observers.load(); }
int64_t EngineTimeline::observer_calls() { return observer_call_count.load(); }

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
  ZERO_RETURN_IF_ERROR(timeline_->AttachDevice(device).WithContext("zero_trace: timing the device"));
  observer_ = std::make_unique<Observer>(timeline_.get(), options.max_component_spans);
  return OkStatus();
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
  const bool recording = Recording();
  if (observer_ != nullptr) {
    int64_t dropped = 0;
    ZERO_RETURN_IF_ERROR(observer_->EndStep(&dropped));
    if (recording && dropped > 0) {
      const int64_t now = SteadyNs();
      timeline_->AddSpan(kTrackCompute, "component spans dropped", now, now,
                         {{"dropped", dropped}, {"max_component_spans", options_.max_component_spans}});
    }
  }
  if (recording) {
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
