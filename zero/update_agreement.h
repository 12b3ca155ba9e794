// The ranks' agreement on an optimizer step (docs/zero.md, "The boundary"): which parameters it
// updates (with freeze_inactive_parameters, those some rank reported in the window), whether it is
// applied, skipped or stopped (decided from the global norm's total, which is the same on every
// rank, so every rank decides alike with no collective), and whether the local update went through
// on every rank (with offloaded states one rank's swap file can fail alone). Free functions over a
// Communicator; they own nothing and know nothing of the config or the engine's failure reporting:
// they say which errors every rank returns together (AgreedStatus::agreed), and the caller does not
// report those as faults to the other ranks.
//
// The collectives below are host all-reduces every rank must call at the same point. Thread
// safety: that of the communicator (one engine thread).
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "runtime/status.h"

namespace zero {

// Sets (*active)[i] to 1 when it is nonzero on some rank, else 0 (one AllReduceHost, kMax, of one
// double per parameter; error context "agreeing on the parameters with gradients"). One rank:
// nothing is changed and no collective is made. REQUIRES: the same size on every rank. *active is
// unchanged on error.
Status AgreeOnActive(Communicator* comm, std::vector<uint8_t>* active);

// What a step does with the total it read (GlobalNorm::Read): apply the update; skip it (fp16 and
// an overflow: the loss scale drops and the window starts over); or stop (a non-finite total with
// stop_on_nonfinite: NonFiniteNormError). bf16/fp32 with a non-finite total and stop_on_nonfinite
// off apply it (DeepSpeed 0.19.8 would skip it with bf16, and with fp32 at stages 1-3; docs/config.md).
enum class StepVerdict { kApply, kSkip, kStop };
StepVerdict DecideStep(double total, bool fp16, bool stop_on_nonfinite);

// A status and whether every rank returns an error at the same call (so it is not to be reported as
// a fault: that would abort a rank still finishing the collective that decided it).
struct AgreedStatus {
  Status status;
  bool agreed = false;
};

// After a local optimizer update whose outcome is `local`: with several ranks, one AllReduceHost
// (kMax of the failing rank, -1 for none; error context "agreeing on the optimizer update") tells
// every rank whether some rank failed. The failing rank gets `local` back (agreed when the
// all-reduce went through), the others Unavailable naming the highest failing rank (agreed), or the
// all-reduce's own error (not agreed); no failure anywhere gives OK. One rank: `local` as is, not
// agreed, and no collective.
AgreedStatus AgreeOnUpdateOutcome(Communicator* comm, Status local);

}  // namespace zero
