// BufferPool: reuse of same-sized device buffers in stream order (gradient buffers, staging
// buffers, stage-3 gathered parameters).
//
// Owns the free buffers it holds; buffers handed out belong to the caller until given back.
// Stream-order reuse: Release(buffer, stream) records an event on `stream` after the buffer's last
// use; a later Acquire may hand the same memory out again immediately, so the new owner must
// enqueue its first use on `stream` or on work ordered after it (a collective issued with
// `after = stream`). That is how the engine uses it: everything it does goes through the compute
// stream or collectives issued after it. Free buffers beyond `max_free_bytes` are really freed,
// after waiting for their release event (a host wait on CUDA; nothing on CPU, where every event is
// complete when recorded), so a cap of 0 returns memory at once.
//
// Thread safety: none (one engine thread).
#pragma once

#include <cstddef>
#include <deque>
#include <memory>

#include "runtime/device.h"
#include "runtime/status.h"

namespace zero {

class BufferPool {
 public:
  BufferPool(Device* device, size_t max_free_bytes) : device_(device), max_free_bytes_(max_free_bytes) {}
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // A buffer of exactly `bytes` bytes: a free one of that size (most recently released first), or
  // a new allocation. Errors: the device's ResourceExhausted, with `what` in front.
  Result<DeviceBuffer> Acquire(size_t bytes, const char* what);
  // A buffer of at least `bytes` bytes: the smallest free one that fits; otherwise the free ones
  // (all too small) are freed and a new one is allocated. So the pool never holds more buffers
  // than were out at once, plus one.
  Result<DeviceBuffer> AcquireAtLeast(size_t bytes, const char* what);
  // Gives `buffer` back; its last use was enqueued on `stream` (null: default stream).
  Status Release(DeviceBuffer buffer, Stream* stream);
  // Frees free buffers until at most `max_free_bytes` remain (waiting for their events).
  Status Trim(size_t max_free_bytes);

  size_t free_bytes() const { return free_bytes_; }
  // Bytes of device memory this pool accounts for: free + handed out.
  size_t bytes() const { return free_bytes_ + outstanding_bytes_; }

 private:
  struct Entry {
    DeviceBuffer buffer;
    std::unique_ptr<Event> released;  // recorded on the releasing stream
  };
  Status FreeOldest();

  Device* device_;
  size_t max_free_bytes_;
  std::deque<Entry> free_;  // oldest first
  size_t free_bytes_ = 0;
  size_t outstanding_bytes_ = 0;
};

}  // namespace zero
