// FaultyAioEngine: an AioEngine for tests that does real libaio I/O and injects faults into it.
//
// Wraps a LibaioEngine through its AioIoHook, so an injected fault takes the same path as the
// kernel's: an errno in the nth piece's completion (ENOSPC, EIO, EAGAIN...), a short transfer
// (the engine must resubmit the rest), a delay before each submission, a hold that keeps every
// submission waiting until released, and an errno for the next Open. "nth" counts pieces (one
// iocb each, block_size bytes or less) of that direction reaped since the engine was created,
// from 1, over all threads; resubmissions count again. Each rule fires once.
// Thread-safe.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "nvme/aio_engine.h"
#include "nvme/libaio_engine.h"

namespace zero {

class FaultyAioEngine final : public AioEngine {
 public:
  static Result<std::unique_ptr<FaultyAioEngine>> Create(const AioOptions& options);
  ~FaultyAioEngine() override;

  // The nth read (write) piece completes with -err instead of its real result.
  void FailNthRead(int n, int err);
  void FailNthWrite(int n, int err);
  // The nth read (write) piece reports only `bytes` transferred (less than its length).
  void ShortenNthRead(int n, size_t bytes);
  void ShortenNthWrite(int n, size_t bytes);
  // Every submission first sleeps this long.
  void SetSubmitDelay(std::chrono::microseconds delay);
  // While held, every submission blocks (on the worker thread) until ReleaseIo().
  void HoldIo();
  void ReleaseIo();
  // The next Open fails with `err` (as open(2) would), naming the path.
  void FailNextOpen(int err);

  int reads_reaped() const;
  int writes_reaped() const;

  Result<std::unique_ptr<AioFile>> Open(const std::string& path, AioOpenMode mode) override;
  Result<AioTicket> SubmitRead(AioFile& file, uint64_t offset, void* buffer, size_t length) override;
  Result<AioTicket> SubmitWrite(AioFile& file, uint64_t offset, const void* buffer, size_t length) override;
  Status Wait(AioTicket ticket, std::chrono::milliseconds timeout = kForever) override;
  AioStats stats() const override { return base_->stats(); }
  const AioOptions& options() const override { return base_->options(); }

  class Hook;

 private:
  FaultyAioEngine(std::shared_ptr<Hook> hook, std::unique_ptr<LibaioEngine> base);
  std::shared_ptr<Hook> hook_;
  std::unique_ptr<LibaioEngine> base_;
};

}  // namespace zero
