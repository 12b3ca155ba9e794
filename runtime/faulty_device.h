// FaultyDevice: a Device wrapper that injects failures, for the fault tests of the layers above.
//
// Forwards every call to the wrapped Device (streams, events and kernels are the wrapped device's
// own), except that (1) Allocate fails with ResourceExhausted when the bytes currently allocated
// through this wrapper plus the request would exceed the allocation budget, and (2) a call of a
// named operation fails when its 1-based call count reaches the armed N (once, or that call and
// every later one when `persistent`). Operation names are the Device method names: "Allocate",
// "AllocatePinned", "CreateStream", "CreateEvent", "RecordEvent", "StreamWaitEvent",
// "SynchronizeEvent", "SynchronizeStream", "Synchronize", "Copy", "Fill", "Cast", "Accumulate",
// "AccumulateFirst", "Scale", "SumOfSquares", "FiniteCheck", "AdamW", "AdamWCast",
// "AdamWFromGradient". A failed
// call does nothing on the wrapped device. Buffers allocated through the wrapper are owned by it
// (its memory_stats() count them) and freed through the wrapped device; the wrapped device must
// outlive the wrapper and every buffer it handed out. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "runtime/device.h"
#include "runtime/status.h"

namespace zero {

class FaultyDevice final : public Device {
 public:
  // Wraps `inner`, which must outlive this object.
  explicit FaultyDevice(Device* inner);
  // Wraps and owns `inner`.
  explicit FaultyDevice(std::unique_ptr<Device> inner);
  ~FaultyDevice() override;
  FaultyDevice(const FaultyDevice&) = delete;
  FaultyDevice& operator=(const FaultyDevice&) = delete;

  // Allocate fails once in-use bytes (through this wrapper) would exceed `bytes`.
  // std::numeric_limits<size_t>::max() (the default) means no budget.
  void SetAllocationBudget(size_t bytes);
  // Makes the `nth` (1-based, counted from creation; see call_count) call of `op` fail with
  // `error` (default: ResourceExhausted for Allocate/AllocatePinned, Internal otherwise, the
  // message naming the op and call number). With `persistent`, every later call fails too.
  // Re-arming an op replaces its previous rule.
  void FailNthCall(const std::string& op, int64_t nth, bool persistent = false, Status error = OkStatus());
  void ClearFaults();  // removes every rule and the budget; counts are kept
  // Calls of `op` made so far (including failed ones).
  int64_t call_count(const std::string& op) const;
  Device* inner() const { return inner_; }

  DeviceKind kind() const override { return inner_->kind(); }
  std::string name() const override { return "faulty(" + inner_->name() + ")"; }
  int ordinal() const override { return inner_->ordinal(); }

  Result<DeviceBuffer> Allocate(size_t bytes) override;
  Result<PinnedBuffer> AllocatePinned(size_t bytes) override;

  Stream* default_stream() override { return inner_->default_stream(); }
  Result<std::unique_ptr<Stream>> CreateStream() override;
  Result<std::unique_ptr<Event>> CreateEvent() override;
  Status RecordEvent(Event* event, Stream* stream) override;
  Status StreamWaitEvent(Stream* stream, Event* event) override;
  Status SynchronizeEvent(Event* event) override;
  Status SynchronizeStream(Stream* stream) override;
  Status Synchronize() override;

  Status Copy(void* dst, const void* src, size_t bytes, CopyKind kind, Stream* stream) override;

  Status Fill(void* dst, DType t, size_t n, float value, Stream* stream) override;
  Status Cast(const void* src, DType src_t, void* dst, DType dst_t, size_t n, Stream* stream) override;
  Status Accumulate(float* acc, const void* src, DType src_t, size_t n, float scale, Stream* stream) override;
  Status AccumulateFirst(float* acc, const void* src, DType src_t, size_t n, float scale, Stream* stream) override;
  Status Scale(void* x, DType t, size_t n, float s, Stream* stream) override;
  Status SumOfSquares(const void* x, DType t, size_t n, double* out, Stream* stream) override;
  Status FiniteCheck(const void* x, DType t, size_t n, int32_t* flag, Stream* stream) override;
  Status AdamW(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, size_t n, const AdamWParams& h,
               Stream* stream) override;
  Status AdamWCast(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, size_t n, const AdamWParams& h,
                   void* model_out, DType model_t, Stream* stream) override;
  Status AdamWFromGradient(float* param, const void* grad, DType grad_t, float* exp_avg, float* exp_avg_sq, size_t n,
                           const AdamWParams& h, Stream* stream) override;

 protected:
  void FreeDevice(void* ptr, size_t bytes) override;
  void FreePinned(void* ptr, size_t bytes) override;

 private:
  struct Rule {
    int64_t nth = 0;
    bool persistent = false;
    Status error;
  };
  // Counts the call and returns the injected error, if any.
  Status Enter(const char* op);

  std::unique_ptr<Device> owned_;
  Device* inner_;
  std::mutex alloc_mu_;  // serializes Allocate (budget check through NoteAlloc)
  mutable std::mutex mu_;
  size_t budget_ = std::numeric_limits<size_t>::max();  // GUARDED_BY(mu_)
  std::map<std::string, int64_t> counts_;               // GUARDED_BY(mu_)
  std::map<std::string, Rule> rules_;                   // GUARDED_BY(mu_)
  std::map<void*, DeviceBuffer> device_buffers_;        // GUARDED_BY(mu_)
  std::map<void*, PinnedBuffer> pinned_buffers_;        // GUARDED_BY(mu_)
};

}  // namespace zero
