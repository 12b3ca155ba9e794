// ReductionSchedule: when stage 3 with several ranks reduces each module's gradients, decided from
// what every rank shares, so ranks that report different parameters still issue the same
// sequence of collectives.
//
// Stage 3's gradient reductions and parameter gathers share one communicator, and collectives are
// matched by order, so a reduction must be launched at the same point among the gathers on every
// rank. Reports (GradReady) are rank-local - a rank that does not use a head never reports it - but
// the gathers and releases are the same calls on every rank (engine.h). So reductions are tied to
// those: the engine holds each reported gradient, and at each "anchor" (the start of a
// GatherModule, and Backward()) asks which modules are complete; it then reduces every parameter
// of those modules, in a fixed order, a parameter this rank did not report contributing zeros.
//
// A module is complete at an anchor when it was released (count 0) since the previous anchor and
// some rank reported one of its parameters in this micro step: while
// recording (the first micro step, or one that departed from the recorded sequence) one host
// all-reduce (max) over the candidates' flags decides it; a micro step that repeats the recorded
// sequence of anchors (same modules gathered, same candidates at each) reuses the recorded
// decisions and issues no collective. At Backward() the modules not yet complete that some rank
// reported are complete (one host all-reduce); the others (no rank reported them: frozen or
// unused) are not reduced at all.
//
// The one thing this forbids: reporting a parameter of a module after that module was complete in
// this micro step (another rank reported it before the gather that followed the module's release,
// this one after): Reported() returns false, and the next AtBackward() fails on EVERY rank (its
// all-reduce carries the flag, so no rank is left waiting in a collective), naming the rank that
// reported late. Reporting a module's gradients before the next gather after its release - or
// every rank reporting them only after all gathers - is always fine.
//
// Thread safety: none. Every rank must make the same AtGather/Released/AtBackward calls in the
// same order (the engine's GatherModule/ReleaseModule/Backward, which are collective anyway).
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "runtime/status.h"

namespace zero {

struct ReductionScheduleStats {
  int64_t host_allreduces = 0;   // flag all-reduces issued (recording anchors and Backward())
  int64_t recorded_anchors = 0;  // anchors decided by flags
  int64_t replayed_anchors = 0;  // anchors decided by the recorded sequence
};

class ReductionSchedule {
 public:
  // `comm` must outlive the schedule; `num_modules` module ids 0..num_modules-1.
  ReductionSchedule(Communicator* comm, int num_modules);

  // Anchor before module `module`'s gather: the modules every rank reduces now, in release order.
  Result<std::vector<int>> AtGather(int module);
  // After a release of `module`; `ref_after` is its count after the release (0: a candidate).
  void Released(int module, int ref_after);
  // Local: a parameter of `module` was reported. False when `module` was already complete in this
  // micro step: that gradient can no longer be reduced consistently (the caller drops it, and
  // AtBackward fails on every rank).
  bool Reported(int module);
  // The end of the micro step's backward: the remaining modules some rank reported (ascending
  // module id), then resets the micro step and adopts its sequence as the recorded one.
  // FailedPrecondition on every rank when some rank reported late (one host all-reduce either way).
  Result<std::vector<int>> AtBackward();

  bool complete(int module) const { return complete_[module] != 0; }
  const ReductionScheduleStats& stats() const { return stats_; }

 private:
  struct Anchor {
    int module = -1;
    std::vector<int> candidates;
    std::vector<int> completed;
    bool operator==(const Anchor&) const = default;
  };

  // The candidates some rank reported in this micro step (one host all-reduce); with `late`, also
  // the highest rank that reported late (-1: none).
  Result<std::vector<int>> Agree(const std::vector<int>& candidates, const char* where, int* late = nullptr);

  Communicator* comm_;
  std::vector<uint8_t> complete_;  // by module, this micro step
  std::vector<uint8_t> flag_;      // by module: reported here in this micro step
  std::vector<int> released_;      // candidates since the last anchor, in release order
  std::vector<Anchor> current_;    // this micro step's anchors
  std::vector<Anchor> recorded_;   // the last finished micro step's anchors
  bool replaying_ = false;         // this micro step follows recorded_ so far
  bool late_ = false;              // a report after its module was complete, this micro step
  ReductionScheduleStats stats_;
};

}  // namespace zero
