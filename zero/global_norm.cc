#include "zero/global_norm.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

namespace zero {

GlobalNorm::GlobalNorm(Device* device, Communicator* comm, Stream* stream, int num_params, bool sum_over_ranks)
    : device_(device), comm_(comm), stream_(stream), num_params_(num_params), sum_over_ranks_(sum_over_ranks) {}

Result<std::unique_ptr<GlobalNorm>> GlobalNorm::Create(Device* device, Communicator* comm, Stream* stream,
                                                       int num_params, bool sum_over_ranks) {
  std::unique_ptr<GlobalNorm> norm(new GlobalNorm(device, comm, stream, num_params, sum_over_ranks));
  const size_t bytes = std::max<size_t>(1, static_cast<size_t>(num_params)) * sizeof(double);
  auto b = device->Allocate(bytes);
  if (!b.ok()) return b.status().WithContext("allocating norm partials");
  norm->slots_ = std::move(b).value();
  auto h = device->AllocatePinned(bytes);
  if (!h.ok()) return h.status().WithContext("allocating norm partials (host)");
  norm->host_ = std::move(h).value();
  auto e = device->CreateEvent();
  if (!e.ok()) return e.status().WithContext("creating the norm event");
  norm->ready_ = std::move(e).value();
  return norm;
}

Status GlobalNorm::ZeroSlots() {
  if (num_params_ == 0) return OkStatus();
  // Two fp32 zeros are the bits of one double +0.0.
  return device_->Fill(slots_.data(), DType::kF32, 2 * static_cast<size_t>(num_params_), 0.0f, stream_);
}

Status GlobalNorm::Publish() {
  if (num_params_ > 0) {
    ZERO_RETURN_IF_ERROR(
        device_->Copy(host_.data(), slots_.data(), sizeof(double) * num_params_, CopyKind::kDeviceToHost, stream_));
  }
  return device_->RecordEvent(ready_.get(), stream_);
}

Status GlobalNorm::Read(double* total) {
  ZERO_RETURN_IF_ERROR(device_->SynchronizeEvent(ready_.get()));
  ZERO_RETURN_IF_ERROR(comm_->CheckHealth());
  const double* host = host_.as<double>();
  double sum = 0.0;
  for (int i = 0; i < num_params_; ++i) sum += host[i];
  if (sum_over_ranks_) {
    ZERO_RETURN_IF_ERROR(comm_->AllReduceHost(&sum, 1, ReduceOp::kSum).WithContext("gradient norm"));
  }
  *total = sum;
  return OkStatus();
}

bool NormOverflowed(double total) { return !std::isfinite(total); }

double ReportedNorm(double total, double loss_scale) { return std::sqrt(total) / loss_scale; }

double ClipCoefficient(double total, double loss_scale, double gradient_clipping) {
  if (gradient_clipping <= 0.0) return 1.0;
  const double c = (std::sqrt(total) / loss_scale + 1e-6) / gradient_clipping;
  return c > 1.0 ? c : 1.0;
}

Status NonFiniteNormError(double total, int64_t step, bool applied) {
  return FailedPreconditionError(
      "the global gradient norm of optimizer step " + std::to_string(step) + " is " +
      (std::isnan(total) ? "nan" : "inf") + " (a NaN or inf in some rank's gradients); " +
      (applied ? "the step was applied (without gradient_clipping or fp16 the norm is read after the update), so "
                 "the weights hold it now"
               : "the step was not applied (the weights are as before)") +
      ". Stopping rather than training on it: load the last checkpoint and look at the loss and the learning "
      "rate, or set stop_on_nonfinite: false to apply such steps and train on");
}

}  // namespace zero
