// GradWindow: the per-parameter bookkeeping of one gradient accumulation window and of the backward
// in progress inside it (docs/zero.md, "Window start"). It owns flags and counts only: which
// gradient buffers are handed out, which parameters were reported in this backward, which received
// a gradient in the window (the active set: unmanaged accumulation and freeze_inactive_parameters
// update from it), which fp32 gradient pieces hold this window's values (the window's first
// contribution to a piece overwrites it, later ones add: nothing zero-fills the pieces at a window
// start), which stage-0/1 boundary reductions are queued, which parameters AdamW already updated in
// backward, and the window's counts (micro steps, Backward() calls since the last step, the managed
// boundary reached). It touches no buffer, device or communicator: the engine does the work the
// flags describe and tells the window when it is done.
//
// A window starts at Init and at every NewWindow (Step(), ZeroGrad(), an fp16 overflow skip,
// LoadCheckpoint). Indices are parameter indices in [0, num_params); out-of-range ones are the
// caller's bug. Thread safety: none (one engine thread).
#pragma once

#include <cstdint>
#include <vector>

namespace zero {

// The window as whoever adds a contribution to the gradient partition sees it (the reducer,
// zero/grad_reducer.h): GradPartition::Add's `first` and `last` flags. GradWindow is the one
// implementation; tests may supply their own.
class PartitionWindow {
 public:
  virtual ~PartitionWindow() = default;
  // Marks i's partition piece written; returns whether this is the window's first contribution to it.
  virtual bool FirstToPartition(int i) = 0;
  // Managed: the backward in progress is the window's last micro step (no further contribution
  // to any piece comes in this window).
  virtual bool AtBoundary() const = 0;
};

class GradWindow final : public PartitionWindow {
 public:
  // `num_params` parameters, none handed out, reported or written. Managed accumulation: the
  // window ends with the `gas`-th Backward(). REQUIRES: called once, before the other calls
  // (before it the counts read 0 and nothing is pending).
  void Init(int num_params, bool managed, int64_t gas);

  // --- the backward in progress ---------------------------------------------------------------
  bool handed_out(int i) const { return handed_out_[i] != 0; }
  void HandOut(int i) { handed_out_[i] = 1; }
  // Clears i's handed-out mark; returns whether it was set (Backward() gives such buffers back).
  bool TakeHandedOut(int i);
  bool reported(int i) const { return reported_[i] != 0; }
  // i's gradient is reported in this backward: active in the window, its buffer no longer out.
  void Report(int i);
  // Parameters reported since the last Backward().
  int reported_count() const { return reported_count_; }
  // Managed: the backward in progress is the window's last micro step.
  bool AtBoundary() const override { return managed_ && micro_ + 1 == gas_; }
  // Backward() is done: no parameter is reported any more; one micro step more, and at the
  // boundary (AtBoundary before this call) the step is pending and the micro count restarts.
  void EndBackward();

  // --- the window -----------------------------------------------------------------------------
  // Backward() calls in the current window (managed; 0 again at the boundary).
  int64_t micro_steps() const { return micro_; }
  // Backward() calls since the last NewWindow.
  int64_t backwards_since_step() const { return backwards_since_step_; }
  // Managed: the boundary Backward() ran; Step() does the update.
  bool pending_step() const { return pending_step_; }
  void ClearPendingStep() { pending_step_ = false; }
  // The micro count starts over and no step is pending (a loaded checkpoint); the flags stay.
  void RestartCount();

  // Received a gradient in the window (on this rank, or on some rank after MergeActive).
  const std::vector<uint8_t>& active() const { return active_; }
  // The active set agreed across ranks: i is active when any_rank[i] != 0. REQUIRES: one value
  // per parameter.
  void MergeActive(const std::vector<double>& any_rank);

  // The fp32 gradient pieces holding this window's values: stages 0/1 the accumulator (this rank's
  // local sum), stages 1-3 the gradient partition (the reduced sum).
  const std::vector<uint8_t>& acc_written() const { return acc_written_; }
  const std::vector<uint8_t>& part_written() const { return part_written_; }
  // Marks i's piece written; returns whether this is the window's first contribution to it.
  bool FirstToAcc(int i);
  bool FirstToPartition(int i) override;
  void MarkAccWritten(int i) { acc_written_[i] = 1; }
  void MarkPartWritten(int i) { part_written_[i] = 1; }

  // Stages 0/1: marks i's boundary reduction queued; false when it already was.
  bool QueueReduction(int i);
  // Stages 0/1: the accumulators were reduced for this window.
  bool reduced() const { return reduced_; }
  void MarkReduced() { reduced_ = true; }

  // The update in backward: AdamW already ran for i in this window.
  bool updated(int i) const { return updated_[i] != 0; }
  void MarkUpdated(int i) { updated_[i] = 1; }
  bool any_updated() const;

  // A new window: nothing active, written, queued, reduced or updated; no Backward() since the step.
  void NewWindow();

 private:
  bool managed_ = true;
  int64_t gas_ = 1;
  std::vector<uint8_t> handed_out_;
  std::vector<uint8_t> reported_;  // in the current backward
  std::vector<uint8_t> active_;
  std::vector<uint8_t> reduce_queued_;
  std::vector<uint8_t> acc_written_;
  std::vector<uint8_t> part_written_;
  std::vector<uint8_t> updated_;
  int reported_count_ = 0;
  int64_t micro_ = 0;
  bool pending_step_ = false;
  bool reduced_ = false;
  int64_t backwards_since_step_ = 0;
};

}  // namespace zero
