// The training loop's own timing (docs/timeline.md): what the loop sees without the engine's help.
// The breakdown (the config's wall_clock_breakdown) times forward, backward (the model's and
// Engine::Backward's reduction) and step on the host, synchronizing the device before each stop as
// DeepSpeed's synchronized timers do; the trace (--trace) records steps 2-4 (the first warms up) as
// host spans on a "train loop" track and the model's forward and backward as device spans on the
// compute track. With neither every call returns at once. Used by one thread (the Trainer's).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "runtime/device.h"
#include "runtime/status.h"
#include "runtime/step_timers.h"
#include "runtime/timeline.h"

namespace zero::train {

// Rank 0 writes `path`, rank r `path.rank<r>`.
std::string TracePathForRank(const std::string& path, int rank);

class LoopTiming {
 public:
  // `breakdown`: time the phases (printed every print_every steps); `trace`: the trace's path ("":
  // none) for a run from `start_step` to `steps`. `device` must outlive the LoopTiming.
  static Result<std::unique_ptr<LoopTiming>> Create(bool breakdown, const std::string& trace, int64_t steps,
                                                    Device* device, int rank, int64_t start_step);

  // Steps are numbered from 1 (the step about to run).
  void BeginStep(int64_t step);

  // A phase of the step: timer `name` (if the breakdown is on) and a host span on the loop track
  // (micro >= 0: the micro step, as an arg). End it with EndPhase.
  struct Phase {
    std::string name;
    int64_t begin_ns = 0;
  };
  Result<Phase> BeginPhase(const std::string& name);
  Status EndPhase(Phase p, int64_t micro);
  // The model's own work on the compute stream (the device's default stream), as a device span.
  Result<Timeline::DeviceSpan> BeginCompute(const std::string& name, int64_t micro);
  Status EndCompute(Timeline::DeviceSpan span);

  // After the step: closes its span; prints the breakdown (lead) when `print_now`; writes the
  // trace after its last step.
  Status EndStep(int64_t step, bool print_now, bool lead);

 private:
  LoopTiming() = default;
  Device* device_ = nullptr;
  std::unique_ptr<StepTimers> timers_;
  std::unique_ptr<Timeline> timeline_;
  std::string path_;
  TrackId loop_track_ = 0;
  int64_t first_ = 0, last_ = -1;
  int64_t step_begin_ns_ = 0;
};

}  // namespace zero::train
