#include "zero/buffer_pool.h"

#include <string>
#include <utility>

namespace zero {

BufferPool::~BufferPool() {
  // The engine synchronizes its streams before it is destroyed; wait for the events anyway.
  for (Entry& e : free_) {
    if (e.released != nullptr) device_->SynchronizeEvent(e.released.get()).IgnoreError();
  }
}

Result<DeviceBuffer> BufferPool::Acquire(size_t bytes, const char* what) {
  for (auto it = free_.rbegin(); it != free_.rend(); ++it) {
    if (it->buffer.bytes() == bytes) {
      DeviceBuffer out = std::move(it->buffer);
      free_.erase(std::next(it).base());
      free_bytes_ -= bytes;
      outstanding_bytes_ += bytes;
      return out;
    }
  }
  Result<DeviceBuffer> fresh = device_->Allocate(bytes);
  if (!fresh.ok() && !free_.empty()) {
    // Out of memory with free buffers of other sizes around: give them back and retry.
    ZERO_RETURN_IF_ERROR(Trim(0));
    fresh = device_->Allocate(bytes);
  }
  if (!fresh.ok()) return fresh.status().WithContext(what);
  outstanding_bytes_ += bytes;
  return std::move(fresh).value();
}

Result<DeviceBuffer> BufferPool::AcquireAtLeast(size_t bytes, const char* what) {
  auto best = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->buffer.bytes() >= bytes && (best == free_.end() || it->buffer.bytes() < best->buffer.bytes())) {
      best = it;
    }
  }
  if (best != free_.end()) {
    DeviceBuffer out = std::move(best->buffer);
    free_.erase(best);
    free_bytes_ -= out.bytes();
    outstanding_bytes_ += out.bytes();
    return out;
  }
  ZERO_RETURN_IF_ERROR(Trim(0));
  Result<DeviceBuffer> fresh = device_->Allocate(bytes);
  if (!fresh.ok()) return fresh.status().WithContext(what);
  outstanding_bytes_ += bytes;
  return std::move(fresh).value();
}

Status BufferPool::Release(DeviceBuffer buffer, Stream* stream) {
  if (buffer.empty()) return OkStatus();
  const size_t bytes = buffer.bytes();
  ZERO_CHECK(outstanding_bytes_ >= bytes);
  outstanding_bytes_ -= bytes;
  Entry e;
  ZERO_ASSIGN_OR_RETURN(e.released, device_->CreateEvent());
  ZERO_RETURN_IF_ERROR(device_->RecordEvent(e.released.get(), stream));
  e.buffer = std::move(buffer);
  free_.push_back(std::move(e));
  free_bytes_ += bytes;
  return Trim(max_free_bytes_);
}

Status BufferPool::FreeOldest() {
  Entry& e = free_.front();
  ZERO_RETURN_IF_ERROR(device_->SynchronizeEvent(e.released.get()));
  free_bytes_ -= e.buffer.bytes();
  free_.pop_front();
  return OkStatus();
}

Status BufferPool::Trim(size_t max_free_bytes) {
  while (free_bytes_ > max_free_bytes && !free_.empty()) ZERO_RETURN_IF_ERROR(FreeOldest());
  return OkStatus();
}

}  // namespace zero
