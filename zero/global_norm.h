// GlobalNorm: the global gradient norm of one optimizer step (docs/zero.md, "The boundary", steps
// 2-4). It owns one device double per parameter (the partials: the sum of squares of the
// parameter's fp32 gradient on this rank), their pinned host copy and the event recorded after that
// copy; it does not own the device, the stream or the communicator, does not compute the partials
// (whoever holds the gradients writes them into slots(): GradPartition::SumsOfSquares, or
// Device::SumOfSquares at the update in backward) and knows nothing of the config or the engine.
//
// One step: the partials are written on `stream` (ZeroSlots first where some are not written),
// Publish enqueues their copy to the host and records the event, and Read waits for the event, adds
// the partials in parameter order and, with sum_over_ranks, the ranks' sums in rank order
// (Communicator::AllReduceHost, kSum: the same value on every rank). Beside it, the pure arithmetic
// on that total: the overflow check, the norm reported to the user, the clip coefficient and the
// error of a non-finite norm. Every result is bitwise what the equivalence suite's reference
// computes (tests/).
//
// Errors: the device's and the communicator's statuses, with the context named below; after a
// failed call the partials are undefined. Thread safety: none (one engine thread).
#pragma once

#include <cstdint>
#include <memory>

#include "comm/communicator.h"
#include "runtime/device.h"
#include "runtime/status.h"

namespace zero {

class GlobalNorm {
 public:
  // `num_params` partials (at least one slot is allocated), undefined until ZeroSlots or written.
  // sum_over_ranks: Read adds the ranks' sums (the partitioned stages with several ranks);
  // otherwise every rank's partials already cover the whole gradient (stage 0's all-reduced
  // gradients, or one rank). Errors: an allocation's status with context "allocating norm
  // partials" (device), "allocating norm partials (host)" (pinned) or "creating the norm event".
  // `device`, `comm` and `stream` must outlive the GlobalNorm.
  static Result<std::unique_ptr<GlobalNorm>> Create(Device* device, Communicator* comm, Stream* stream, int num_params,
                                                    bool sum_over_ranks);

  GlobalNorm(const GlobalNorm&) = delete;
  GlobalNorm& operator=(const GlobalNorm&) = delete;

  // The device partials, one double per parameter in parameter order. Valid for the lifetime.
  double* slots() const { return slots_.as<double>(); }
  // Sets every partial to +0.0 (what SumOfSquares of zeros gives) on the stream. No parameters: nothing.
  Status ZeroSlots();
  // Enqueues the partials' copy to the host and records the event after it, on the stream.
  Status Publish();
  // Waits for the last Publish, checks the communicator's health (a collective the watchdog aborted
  // lets the stream pass with undefined data, comm/watchdog.h), and sets *total to the partials'
  // sum in parameter order (+0.0 with no parameters), with sum_over_ranks added over the ranks in
  // rank order (a collective: every rank calls it; error context "gradient norm"). REQUIRES:
  // Publish was called since the partials were last written. *total is unchanged on error.
  Status Read(double* total);

 private:
  GlobalNorm(Device* device, Communicator* comm, Stream* stream, int num_params, bool sum_over_ranks);

  Device* device_;
  Communicator* comm_;
  Stream* stream_;
  int num_params_;
  bool sum_over_ranks_;
  DeviceBuffer slots_;            // one device double per parameter (at least one)
  PinnedBuffer host_;             // their host copy (pinned, so the copy does not block the host)
  std::unique_ptr<Event> ready_;  // recorded after that copy
};

// --- the arithmetic on the total (the squared norm of the loss-scaled gradients) ------------------

// A sum of squares (in double) of fp32 values is finite exactly when every value is: so this is the
// overflow check of every rank's gradients, with no extra pass or collective.
bool NormOverflowed(double total);
// The norm of the unscaled gradients, what Engine::global_grad_norm() reports: sqrt(total) / loss_scale.
double ReportedNorm(double total, double loss_scale);
// gradient_clipping > 0: max(1, (sqrt(total) / loss_scale + 1e-6) / gradient_clipping) in double
// (1 when that is NaN); otherwise 1. AdamW's grad_scale is then 1 / (loss_scale * coefficient).
double ClipCoefficient(double total, double loss_scale, double gradient_clipping);
// stop_on_nonfinite's error (FailedPrecondition) for optimizer step `step` (1-based) whose total is
// NaN or inf: names which, and whether the step was `applied` (the norm read after the update).
Status NonFiniteNormError(double total, int64_t step, bool applied);

}  // namespace zero
