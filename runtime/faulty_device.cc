#include "runtime/faulty_device.h"

#include <utility>

namespace zero {

FaultyDevice::FaultyDevice(Device* inner) : inner_(inner) {}

FaultyDevice::FaultyDevice(std::unique_ptr<Device> inner) : owned_(std::move(inner)), inner_(owned_.get()) {}

FaultyDevice::~FaultyDevice() {
  // Buffers still held by users of the wrapper would be freed through it later; free what the
  // wrapper holds now so the wrapped device's accounting balances.
  std::lock_guard<std::mutex> l(mu_);
  device_buffers_.clear();
  pinned_buffers_.clear();
}

void FaultyDevice::SetAllocationBudget(size_t bytes) {
  std::lock_guard<std::mutex> l(mu_);
  budget_ = bytes;
}

void FaultyDevice::FailNthCall(const std::string& op, int64_t nth, bool persistent, Status error) {
  std::lock_guard<std::mutex> l(mu_);
  rules_[op] = Rule{nth, persistent, std::move(error)};
}

void FaultyDevice::ClearFaults() {
  std::lock_guard<std::mutex> l(mu_);
  rules_.clear();
  budget_ = std::numeric_limits<size_t>::max();
}

int64_t FaultyDevice::call_count(const std::string& op) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = counts_.find(op);
  return it == counts_.end() ? 0 : it->second;
}

Status FaultyDevice::Enter(const char* op) {
  std::lock_guard<std::mutex> l(mu_);
  int64_t count = ++counts_[op];
  auto it = rules_.find(op);
  if (it == rules_.end()) return OkStatus();
  const Rule& rule = it->second;
  if (count == rule.nth || (rule.persistent && count > rule.nth)) {
    if (!rule.error.ok()) return rule.error;
    std::string msg = std::string("injected fault: ") + op + " call " + std::to_string(count) + " on " + inner_->name();
    std::string op_name = op;
    if (op_name == "Allocate" || op_name == "AllocatePinned") return ResourceExhaustedError(msg);
    return InternalError(msg);
  }
  return OkStatus();
}

Result<DeviceBuffer> FaultyDevice::Allocate(size_t bytes) {
  ZERO_RETURN_IF_ERROR(Enter("Allocate"));
  // Budget check, allocation and NoteAlloc as one step, so concurrent callers cannot overshoot.
  std::lock_guard<std::mutex> alloc_lock(alloc_mu_);
  {
    size_t in_use = memory_stats().in_use;
    std::lock_guard<std::mutex> l(mu_);
    if (bytes > budget_ || in_use > budget_ - bytes) {
      return ResourceExhaustedError("injected fault: out of device memory on " + inner_->name() + " allocating " +
                                    std::to_string(bytes) + " bytes; in use " + std::to_string(in_use) +
                                    " bytes, budget " + std::to_string(budget_) + " bytes");
    }
  }
  ZERO_ASSIGN_OR_RETURN(DeviceBuffer inner, inner_->Allocate(bytes));
  if (inner.empty()) return DeviceBuffer();
  void* ptr = inner.data();
  {
    std::lock_guard<std::mutex> l(mu_);
    device_buffers_.emplace(ptr, std::move(inner));
  }
  NoteAlloc(bytes);
  return DeviceBuffer(this, ptr, bytes);
}

Result<PinnedBuffer> FaultyDevice::AllocatePinned(size_t bytes) {
  ZERO_RETURN_IF_ERROR(Enter("AllocatePinned"));
  ZERO_ASSIGN_OR_RETURN(PinnedBuffer inner, inner_->AllocatePinned(bytes));
  if (inner.data() == nullptr) return PinnedBuffer();
  void* ptr = inner.data();
  {
    std::lock_guard<std::mutex> l(mu_);
    pinned_buffers_.emplace(ptr, std::move(inner));
  }
  return PinnedBuffer(this, ptr, bytes);
}

void FaultyDevice::FreeDevice(void* ptr, size_t bytes) {
  std::map<void*, DeviceBuffer>::node_type node;
  {
    std::lock_guard<std::mutex> l(mu_);
    node = device_buffers_.extract(ptr);
  }
  NoteFree(bytes);
  // `node` frees the wrapped buffer here, outside the lock.
}

void FaultyDevice::FreePinned(void* ptr, size_t bytes) {
  std::map<void*, PinnedBuffer>::node_type node;
  {
    std::lock_guard<std::mutex> l(mu_);
    node = pinned_buffers_.extract(ptr);
  }
}

Result<std::unique_ptr<Stream>> FaultyDevice::CreateStream() {
  ZERO_RETURN_IF_ERROR(Enter("CreateStream"));
  return inner_->CreateStream();
}

Result<std::unique_ptr<Event>> FaultyDevice::CreateEvent() {
  ZERO_RETURN_IF_ERROR(Enter("CreateEvent"));
  return inner_->CreateEvent();
}

Status FaultyDevice::RecordEvent(Event* event, Stream* stream) {
  ZERO_RETURN_IF_ERROR(Enter("RecordEvent"));
  return inner_->RecordEvent(event, stream);
}

Status FaultyDevice::StreamWaitEvent(Stream* stream, Event* event) {
  ZERO_RETURN_IF_ERROR(Enter("StreamWaitEvent"));
  return inner_->StreamWaitEvent(stream, event);
}

Status FaultyDevice::SynchronizeEvent(Event* event) {
  ZERO_RETURN_IF_ERROR(Enter("SynchronizeEvent"));
  return inner_->SynchronizeEvent(event);
}

Status FaultyDevice::SynchronizeStream(Stream* stream) {
  ZERO_RETURN_IF_ERROR(Enter("SynchronizeStream"));
  return inner_->SynchronizeStream(stream);
}

Status FaultyDevice::Synchronize() {
  ZERO_RETURN_IF_ERROR(Enter("Synchronize"));
  return inner_->Synchronize();
}

Status FaultyDevice::Copy(void* dst, const void* src, size_t bytes, CopyKind kind, Stream* stream) {
  ZERO_RETURN_IF_ERROR(Enter("Copy"));
  return inner_->Copy(dst, src, bytes, kind, stream);
}

Status FaultyDevice::Fill(void* dst, DType t, size_t n, float value, Stream* stream) {
  ZERO_RETURN_IF_ERROR(Enter("Fill"));
  return inner_->Fill(dst, t, n, value, stream);
}

Status FaultyDevice::Cast(const void* src, DType src_t, void* dst, DType dst_t, size_t n, Stream* stream) {
  ZERO_RETURN_IF_ERROR(Enter("Cast"));
  return inner_->Cast(src, src_t, dst, dst_t, n, stream);
}

Status FaultyDevice::Accumulate(float* acc, const void* src, DType src_t, size_t n, float scale, Stream* stream) {
  ZERO_RETURN_IF_ERROR(Enter("Accumulate"));
  return inner_->Accumulate(acc, src, src_t, n, scale, stream);
}

Status FaultyDevice::AccumulateFirst(float* acc, const void* src, DType src_t, size_t n, float scale, Stream* stream) {
  ZERO_RETURN_IF_ERROR(Enter("AccumulateFirst"));
  return inner_->AccumulateFirst(acc, src, src_t, n, scale, stream);
}

Status FaultyDevice::Scale(void* x, DType t, size_t n, float s, Stream* stream) {
  ZERO_RETURN_IF_ERROR(Enter("Scale"));
  return inner_->Scale(x, t, n, s, stream);
}

Status FaultyDevice::SumOfSquares(const void* x, DType t, size_t n, double* out, Stream* stream) {
  ZERO_RETURN_IF_ERROR(Enter("SumOfSquares"));
  return inner_->SumOfSquares(x, t, n, out, stream);
}

Status FaultyDevice::FiniteCheck(const void* x, DType t, size_t n, int32_t* flag, Stream* stream) {
  ZERO_RETURN_IF_ERROR(Enter("FiniteCheck"));
  return inner_->FiniteCheck(x, t, n, flag, stream);
}

Status FaultyDevice::AdamW(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, size_t n,
                           const AdamWParams& h, Stream* stream) {
  ZERO_RETURN_IF_ERROR(Enter("AdamW"));
  return inner_->AdamW(param, grad, exp_avg, exp_avg_sq, n, h, stream);
}

Status FaultyDevice::AdamWFromGradient(float* param, const void* grad, DType grad_t, float* exp_avg, float* exp_avg_sq,
                                       size_t n, const AdamWParams& h, Stream* stream) {
  ZERO_RETURN_IF_ERROR(Enter("AdamWFromGradient"));
  return inner_->AdamWFromGradient(param, grad, grad_t, exp_avg, exp_avg_sq, n, h, stream);
}

Status FaultyDevice::AdamWCast(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, size_t n,
                               const AdamWParams& h, void* model_out, DType model_t, Stream* stream) {
  ZERO_RETURN_IF_ERROR(Enter("AdamWCast"));
  return inner_->AdamWCast(param, grad, exp_avg, exp_avg_sq, n, h, model_out, model_t, stream);
}

}  // namespace zero
