#include "train/trainer_timing.h"

#include <algorithm>
#include <cstdio>
#include <utility>

namespace zero::train {

std::string TracePathForRank(const std::string& path, int rank) {
  return rank == 0 ? path : path + ".rank" + std::to_string(rank);
}

Result<std::unique_ptr<LoopTiming>> LoopTiming::Create(bool breakdown, const std::string& trace, int64_t steps,
                                                       Device* device, int rank, int64_t start_step) {
  auto t = std::unique_ptr<LoopTiming>(new LoopTiming());
  t->device_ = device;
  if (breakdown) t->timers_ = std::make_unique<StepTimers>();
  if (!trace.empty()) {
    t->path_ = TracePathForRank(trace, rank);
    TimelineOptions to;
    to.pid = rank;
    to.process_name = "rank " + std::to_string(rank);
    to.enabled = false;
    t->timeline_ = std::make_unique<Timeline>(std::move(to));
    ZERO_RETURN_IF_ERROR(t->timeline_->AttachDevice(device).WithContext("--trace"));
    t->loop_track_ = t->timeline_->AddTrack("train loop");
    const int64_t run = steps - start_step;
    t->first_ = start_step + (run >= 2 ? 2 : 1);
    t->last_ = std::min<int64_t>(start_step + 4, steps);
  }
  return t;
}

void LoopTiming::BeginStep(int64_t step) {
  if (timeline_ == nullptr) return;
  timeline_->set_enabled(step >= first_ && step <= last_);
  step_begin_ns_ = timeline_->Now();
}

Result<LoopTiming::Phase> LoopTiming::BeginPhase(const std::string& name) {
  Phase p;
  p.name = name;
  if (timers_ != nullptr) ZERO_RETURN_IF_ERROR(timers_->Start(name));
  if (timeline_ != nullptr) p.begin_ns = timeline_->Now();
  return p;
}

Status LoopTiming::EndPhase(Phase p, int64_t micro) {
  if (timers_ != nullptr) {
    ZERO_RETURN_IF_ERROR(device_->SynchronizeStream(nullptr));
    ZERO_RETURN_IF_ERROR(timers_->Stop(p.name));
  }
  if (timeline_ != nullptr) {
    SpanArgs args;
    if (micro >= 0) args.push_back({"micro", micro});
    timeline_->AddSpan(loop_track_, p.name, p.begin_ns, timeline_->Now(), std::move(args));
  }
  return OkStatus();
}

Result<Timeline::DeviceSpan> LoopTiming::BeginCompute(const std::string& name, int64_t micro) {
  if (timeline_ == nullptr) return Timeline::DeviceSpan();
  return timeline_->BeginDeviceSpan(kTrackCompute, name, nullptr, {{"micro", micro}});
}

Status LoopTiming::EndCompute(Timeline::DeviceSpan span) {
  if (timeline_ == nullptr) return OkStatus();
  return timeline_->EndDeviceSpan(std::move(span), nullptr);
}

Status LoopTiming::EndStep(int64_t step, bool print_now, bool lead) {
  if (timeline_ != nullptr) {
    timeline_->AddSpan(loop_track_, "step " + std::to_string(step), step_begin_ns_, timeline_->Now(), {{"step", step}});
    ZERO_RETURN_IF_ERROR(timeline_->ResolveDeviceSpans().status().WithContext("--trace"));
    if (step == last_) {
      timeline_->set_enabled(false);
      ZERO_RETURN_IF_ERROR(timeline_->WriteChromeTrace(path_).WithContext("--trace"));
      if (lead) {
        std::printf("  trace of steps %lld-%lld: %s\n", static_cast<long long>(first_), static_cast<long long>(last_),
                    path_.c_str());
      }
    }
  }
  if (timers_ != nullptr) {
    timers_->EndStep();
    if (print_now) {
      if (lead) std::printf("%s\n", timers_->Format(BreakdownTimerNames()).c_str());
      timers_->Reset();
    }
  }
  return OkStatus();
}

}  // namespace zero::train
