// LibaioEngine: the AioEngine on Linux native AIO (libaio: io_setup, io_submit, io_getevents).
//
// Owns `intra_op_parallelism` worker threads and one io_context per thread (queue_depth slots),
// destroyed with the engine; owns the file descriptors of the AioFiles it opens (closed by them).
// Each worker reaps with blocking io_getevents calls (reap_timeout slices), retries EINTR and
// EAGAIN (bounded), resubmits the rest of a short transfer, and stops submitting a request's
// remaining pieces after its first error. Thread-safe: any thread may submit and wait.
//
// REQUIRES at destruction: every ticket was waited for (pieces in flight are still drained, so a
// violation loses no memory safety, only the results).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "nvme/aio_engine.h"

namespace zero {

// Tests only (FaultyAioEngine): sees each piece before it is submitted and its result after it is
// reaped, on the worker thread.
class AioIoHook {
 public:
  virtual ~AioIoHook() = default;
  // Before io_submit of a piece (first submission or resubmission). May block (delays, holds).
  virtual void BeforeSubmit(bool write, const std::string& path, uint64_t offset, size_t length) {}
  // After the piece's completion is reaped; may rewrite `*result` (bytes moved, or -errno) to
  // what a kernel could have returned.
  virtual void AfterComplete(bool write, const std::string& path, uint64_t offset, size_t length, int64_t* result) {}
};

class LibaioEngine final : public AioEngine {
 public:
  // Validates the options and starts the workers (io_setup errors name the queue depth and, for
  // EAGAIN, /proc/sys/fs/aio-max-nr). `hook` (tests only) may be null.
  static Result<std::unique_ptr<LibaioEngine>> Create(const AioOptions& options,
                                                      std::shared_ptr<AioIoHook> hook = nullptr);
  ~LibaioEngine() override;

  Result<std::unique_ptr<AioFile>> Open(const std::string& path, AioOpenMode mode) override;
  Result<AioTicket> SubmitRead(AioFile& file, uint64_t offset, void* buffer, size_t length) override;
  Result<AioTicket> SubmitWrite(AioFile& file, uint64_t offset, const void* buffer, size_t length) override;
  Status Wait(AioTicket ticket, std::chrono::milliseconds timeout = kForever) override;
  AioStats stats() const override;
  const AioOptions& options() const override;

  class Impl;

 private:
  explicit LibaioEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zero
