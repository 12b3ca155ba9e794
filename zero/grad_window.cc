#include "zero/grad_window.h"

#include <algorithm>

namespace zero {

void GradWindow::Init(int num_params, bool managed, int64_t gas) {
  managed_ = managed;
  gas_ = gas;
  const size_t n = static_cast<size_t>(num_params);
  handed_out_.assign(n, 0);
  reported_.assign(n, 0);
  active_.assign(n, 0);
  reduce_queued_.assign(n, 0);
  acc_written_.assign(n, 0);
  part_written_.assign(n, 0);
  updated_.assign(n, 0);
}

bool GradWindow::TakeHandedOut(int i) {
  if (!handed_out_[i]) return false;
  handed_out_[i] = 0;
  return true;
}

void GradWindow::Report(int i) {
  reported_[i] = 1;
  active_[i] = 1;
  ++reported_count_;
  handed_out_[i] = 0;
}

void GradWindow::EndBackward() {
  const bool boundary = AtBoundary();
  std::fill(reported_.begin(), reported_.end(), 0);
  reported_count_ = 0;
  ++micro_;
  ++backwards_since_step_;
  if (boundary) {
    pending_step_ = true;
    micro_ = 0;
  }
}

void GradWindow::RestartCount() {
  micro_ = 0;
  pending_step_ = false;
}

void GradWindow::MergeActive(const std::vector<double>& any_rank) {
  for (size_t i = 0; i < active_.size(); ++i) active_[i] = any_rank[i] != 0.0 ? 1 : 0;
}

bool GradWindow::FirstToAcc(int i) {
  const bool first = acc_written_[i] == 0;
  acc_written_[i] = 1;
  return first;
}

bool GradWindow::FirstToPartition(int i) {
  const bool first = part_written_[i] == 0;
  part_written_[i] = 1;
  return first;
}

bool GradWindow::QueueReduction(int i) {
  if (reduce_queued_[i]) return false;
  reduce_queued_[i] = 1;
  return true;
}

bool GradWindow::any_updated() const { return std::find(updated_.begin(), updated_.end(), 1) != updated_.end(); }

void GradWindow::NewWindow() {
  std::fill(updated_.begin(), updated_.end(), 0);
  std::fill(acc_written_.begin(), acc_written_.end(), 0);
  std::fill(part_written_.begin(), part_written_.end(), 0);
  std::fill(active_.begin(), active_.end(), 0);
  std::fill(reduce_queued_.begin(), reduce_queued_.end(), 0);
  reduced_ = false;
  backwards_since_step_ = 0;
}

}  // namespace zero
