#include "runtime/device_arena.h"

#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace zero {
namespace {

// The bytes of allocated arenas per (device, label). A pointer key is enough: an arena's memory is
// freed through its device, so no arena outlives the device its bytes are tallied under.
struct Tally {
  std::mutex mu;
  std::map<std::pair<const Device*, std::string>, size_t> bytes;
};

Tally& GlobalTally() {
  static Tally* tally = new Tally();  // never destroyed: arenas may be freed during static teardown
  return *tally;
}

void AddToTally(const Device* device, const std::string& label, size_t bytes) {
  Tally& t = GlobalTally();
  std::lock_guard<std::mutex> l(t.mu);
  t.bytes[{device, label}] += bytes;
}

void SubtractFromTally(const Device* device, const std::string& label, size_t bytes) {
  Tally& t = GlobalTally();
  std::lock_guard<std::mutex> l(t.mu);
  auto it = t.bytes.find({device, label});
  ZERO_CHECK(it != t.bytes.end() && it->second >= bytes);
  it->second -= bytes;
  if (it->second == 0) t.bytes.erase(it);
}

size_t AlignUp(size_t bytes) {
  return (bytes + DeviceArena::kAlignment - 1) / DeviceArena::kAlignment * DeviceArena::kAlignment;
}

}  // namespace

DeviceArena::DeviceArena(std::string label) : label_(std::move(label)) {}

DeviceArena::~DeviceArena() { Free(); }

DeviceArena::DeviceArena(DeviceArena&& o) noexcept { *this = std::move(o); }

DeviceArena& DeviceArena::operator=(DeviceArena&& o) noexcept {
  if (this != &o) {
    Free();
    // The tally is keyed by device and label, both of which move with the allocation.
    label_ = std::move(o.label_);
    regions_ = std::move(o.regions_);
    slots_ = std::move(o.slots_);
    offset_ = std::exchange(o.offset_, 0);
    allocated_ = std::exchange(o.allocated_, false);
    device_ = std::exchange(o.device_, nullptr);
    memory_ = std::move(o.memory_);
    o.regions_.clear();
    o.slots_.clear();
  }
  return *this;
}

void DeviceArena::AddRegion(void* slot, Binder bind, size_t bytes, std::string name) {
  ZERO_CHECK_MSG(!allocated_, "DeviceArena \"" + label_ + "\": Reserve of " + name + " after Allocate");
  regions_.push_back(Region{std::move(name), offset_, bytes});
  slots_.push_back(Slot{slot, bind});
  offset_ += AlignUp(bytes);
}

Status DeviceArena::Allocate(Device* device) {
  if (allocated_) {
    return FailedPreconditionError("device arena \"" + label_ + "\": already allocated (" + std::to_string(offset_) +
                                   " bytes); Clear() it first");
  }
  if (device == nullptr) return InvalidArgumentError("device arena \"" + label_ + "\": null device");
  Result<DeviceBuffer> memory = device->Allocate(offset_);
  if (!memory.ok()) {
    return memory.status().WithContext("device arena \"" + label_ + "\" (" + std::to_string(offset_) + " bytes in " +
                                       std::to_string(regions_.size()) + " regions)");
  }
  memory_ = std::move(memory).value();
  char* base = static_cast<char*>(memory_.data());
  for (size_t i = 0; i < slots_.size(); ++i) {
    slots_[i].bind(slots_[i].slot, base == nullptr ? nullptr : base + regions_[i].offset);
  }
  allocated_ = true;
  device_ = device;
  if (offset_ > 0) AddToTally(device_, label_, offset_);
  return OkStatus();
}

void DeviceArena::Free() {
  if (allocated_ && offset_ > 0) SubtractFromTally(device_, label_, offset_);
  memory_.Reset();
  allocated_ = false;
  device_ = nullptr;
}

void DeviceArena::Clear() {
  Free();
  regions_.clear();
  slots_.clear();
  offset_ = 0;
}

size_t DeviceArenaBytes(const Device* device, const std::string& label) {
  Tally& t = GlobalTally();
  std::lock_guard<std::mutex> l(t.mu);
  size_t sum = 0;
  for (const auto& [key, bytes] : t.bytes) {
    if (key.first == device && (label.empty() || key.second == label)) sum += bytes;
  }
  return sum;
}

std::vector<std::pair<std::string, size_t>> DeviceArenaUsage(const Device* device) {
  Tally& t = GlobalTally();
  std::lock_guard<std::mutex> l(t.mu);
  std::vector<std::pair<std::string, size_t>> out;
  for (const auto& [key, bytes] : t.bytes) {
    if (key.first == device) out.emplace_back(key.second, bytes);
  }
  return out;  // std::map orders by (device, label): sorted by label
}

}  // namespace zero
