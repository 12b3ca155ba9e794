#include "zero/update_agreement.h"

#include <string>
#include <utility>

#include "zero/global_norm.h"

namespace zero {

Status AgreeOnActive(Communicator* comm, std::vector<uint8_t>* active) {
  if (comm->world_size() == 1) return OkStatus();
  std::vector<double> flags(active->begin(), active->end());
  ZERO_RETURN_IF_ERROR(comm->AllReduceHost(flags.data(), flags.size(), ReduceOp::kMax)
                           .WithContext("agreeing on the parameters with gradients"));
  for (size_t i = 0; i < active->size(); ++i) (*active)[i] = flags[i] != 0.0 ? 1 : 0;
  return OkStatus();
}

StepVerdict DecideStep(double total, bool fp16, bool stop_on_nonfinite) {
  if (!NormOverflowed(total)) return StepVerdict::kApply;
  if (fp16) return StepVerdict::kSkip;
  return stop_on_nonfinite ? StepVerdict::kStop : StepVerdict::kApply;
}

AgreedStatus AgreeOnUpdateOutcome(Communicator* comm, Status local) {
  if (comm->world_size() == 1) return {std::move(local), false};
  double failed = local.ok() ? -1.0 : static_cast<double>(comm->rank());
  Status agree = comm->AllReduceHost(&failed, 1, ReduceOp::kMax).WithContext("agreeing on the optimizer update");
  // Every rank took part: the outcome is known everywhere.
  if (!local.ok()) return {std::move(local), agree.ok()};
  if (!agree.ok()) return {std::move(agree), false};
  if (failed < 0) return {OkStatus(), false};
  return {UnavailableError("rank " + std::to_string(static_cast<int>(failed)) +
                           " failed in the optimizer update (its error says why, e.g. a swap file fault); every "
                           "rank stops here: create new engines and LoadCheckpoint the last checkpoint"),
          true};
}

}  // namespace zero
