#include "zero/reduction_schedule.h"

#include <algorithm>
#include <string>

namespace zero {

ReductionSchedule::ReductionSchedule(Communicator* comm, int num_modules)
    : comm_(comm), complete_(static_cast<size_t>(num_modules), 0), flag_(static_cast<size_t>(num_modules), 0) {}

Result<std::vector<int>> ReductionSchedule::Agree(const std::vector<int>& candidates, const char* where, int* late) {
  std::vector<int> out;
  if (candidates.empty() && late == nullptr) return out;
  std::vector<double> flags(candidates.size());
  for (size_t k = 0; k < candidates.size(); ++k) flags[k] = flag_[candidates[k]];
  if (late != nullptr) flags.push_back(late_ ? comm_->rank() : -1);
  ++stats_.host_allreduces;
  ZERO_RETURN_IF_ERROR(comm_->AllReduceHost(flags.data(), flags.size(), ReduceOp::kMax)
                           .WithContext(std::string("agreeing which modules' gradients are complete ") + where));
  for (size_t k = 0; k < candidates.size(); ++k) {
    if (flags[k] != 0.0) out.push_back(candidates[k]);
  }
  if (late != nullptr) *late = static_cast<int>(flags.back());
  return out;
}

Result<std::vector<int>> ReductionSchedule::AtGather(int module) {
  Anchor a;
  a.module = module;
  a.candidates.swap(released_);
  const size_t index = current_.size();
  if (index == 0) replaying_ = true;  // the first anchor of a micro step starts following the record
  replaying_ = replaying_ && index < recorded_.size() && recorded_[index].module == module &&
               recorded_[index].candidates == a.candidates;
  if (replaying_) {
    a.completed = recorded_[index].completed;
    ++stats_.replayed_anchors;
  } else {
    ZERO_ASSIGN_OR_RETURN(a.completed, Agree(a.candidates, "at a gather"));
    ++stats_.recorded_anchors;
  }
  for (int m : a.completed) complete_[m] = 1;
  current_.push_back(a);
  return a.completed;
}

void ReductionSchedule::Released(int module, int ref_after) {
  if (ref_after != 0 || complete_[module]) return;
  for (int m : released_) {
    if (m == module) return;
  }
  released_.push_back(module);
}

bool ReductionSchedule::Reported(int module) {
  if (complete_[module]) {
    late_ = true;
    return false;
  }
  flag_[module] = 1;
  return true;
}

Result<std::vector<int>> ReductionSchedule::AtBackward() {
  std::vector<int> remaining;
  for (int m = 0; m < static_cast<int>(complete_.size()); ++m) {
    if (!complete_[m]) remaining.push_back(m);
  }
  int late = -1;
  ZERO_ASSIGN_OR_RETURN(std::vector<int> out, Agree(remaining, "at the end of backward", &late));
  if (late >= 0) {
    return FailedPreconditionError(
        "rank " + std::to_string(late) +
        " reported a gradient after its module's gradients were reduced in this "
        "micro step (at stage 3 with several ranks, a module is reduced at the first gather after its release "
        "once some rank has reported one of its parameters; every rank must report a module's gradients before "
        "that gather, or all ranks only after their last gather); that rank's error names the parameters");
  }
  recorded_.swap(current_);
  current_.clear();
  released_.clear();
  replaying_ = false;
  std::fill(complete_.begin(), complete_.end(), 0);
  std::fill(flag_.begin(), flag_.end(), 0);
  return out;
}

}  // namespace zero
