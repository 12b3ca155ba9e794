#include "runtime/device.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <utility>

namespace zero {

const char* DeviceKindName(DeviceKind k) { return k == DeviceKind::kCpu ? "cpu" : "cuda"; }

struct Device::Counters {
  std::mutex mu;
  size_t in_use = 0;
  size_t peak = 0;
};

std::shared_ptr<Device::Counters> Device::MakeCounters() { return std::make_shared<Counters>(); }

void Device::NoteAlloc(size_t bytes) {
  std::lock_guard<std::mutex> l(counters_->mu);
  counters_->in_use += bytes;
  counters_->peak = std::max(counters_->peak, counters_->in_use);
}

void Device::NoteFree(size_t bytes) {
  std::lock_guard<std::mutex> l(counters_->mu);
  counters_->in_use -= bytes;
}

MemoryStats Device::memory_stats() const {
  std::lock_guard<std::mutex> l(counters_->mu);
  return MemoryStats{counters_->in_use, counters_->peak};
}

Result<std::unique_ptr<Event>> Device::CreateTimingEvent() {
  return UnimplementedError(name() + ": this device backend has no timing events (CreateTimingEvent)");
}

Result<std::optional<double>> Device::ElapsedMilliseconds(Event* start, Event* end) {
  return UnimplementedError(name() + ": this device backend cannot time events (ElapsedMilliseconds)");
}

void Device::ResetPeak() {
  std::lock_guard<std::mutex> l(counters_->mu);
  counters_->peak = counters_->in_use;
}

namespace {

// DeviceBuffer's and PinnedBuffer's move: the same three fields, leaving the moved-from buffer empty.
void TakeAllocation(Device*& device, void*& ptr, size_t& bytes, Device*& from_device, void*& from_ptr,
                    size_t& from_bytes) {
  device = std::exchange(from_device, nullptr);
  ptr = std::exchange(from_ptr, nullptr);
  bytes = std::exchange(from_bytes, 0);
}

}  // namespace

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    Reset();
    TakeAllocation(device_, ptr_, bytes_, o.device_, o.ptr_, o.bytes_);
  }
  return *this;
}

void DeviceBuffer::Reset() {
  if (ptr_ != nullptr && device_ != nullptr) device_->FreeDevice(ptr_, bytes_);
  device_ = nullptr;
  ptr_ = nullptr;
  bytes_ = 0;
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    Reset();
    TakeAllocation(device_, ptr_, bytes_, o.device_, o.ptr_, o.bytes_);
  }
  return *this;
}

void PinnedBuffer::Reset() {
  if (ptr_ != nullptr && device_ != nullptr) device_->FreePinned(ptr_, bytes_);
  device_ = nullptr;
  ptr_ = nullptr;
  bytes_ = 0;
}

}  // namespace zero
