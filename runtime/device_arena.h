// DeviceArena: one Device allocation carved into named, aligned regions (a model's activations, a
// kernel's workspace), and the per-device tally of the bytes arenas hold by label.
//
// Owns its one DeviceBuffer, taken through Device::Allocate, so Device::memory_stats() counts it
// like any other device memory; it owns nothing else and never touches the memory it hands out.
// Use is in two phases. Planning: Reserve(&ptr, count, name) records a region of `count`
// elements at the next kAlignment-aligned offset (nothing is allocated, the device is not needed).
// Allocate(device): one Device::Allocate of planned_bytes(), and every reserved pointer is set to
// its region. Offsets depend only on the sizes reserved, in order, so the same plan gives the same
// layout on every backend. Clear() frees the allocation and forgets the plan.
//
// While allocated, the arena's bytes are added to a process-wide tally keyed by (device, label),
// which DeviceArenaBytes / DeviceArenaUsage read: code that holds only the Device (the engine, a
// memory report) can tell "activations" from "workspace" from the rest of memory_stats().
//
// Freeing (Clear, the destructor, assigning over it) is immediate: as for DeviceBuffer::Reset, the
// caller guarantees no stream still uses the memory (synchronize first). The pointers Allocate set
// are left as they are by Clear and must not be used afterwards.
//
// Thread safety: an arena is used by one thread at a time; the tally functions are thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/device.h"
#include "runtime/status.h"

namespace zero {

class DeviceArena {
 public:
  // Every region starts at a multiple of this from the allocation's start (itself 256-byte
  // aligned: Device::Allocate's contract), so every region is 256-byte aligned.
  static constexpr size_t kAlignment = 256;

  // `label` names what the arena holds ("activations", "workspace"): the key of the tally and the
  // start of Allocate's error messages.
  explicit DeviceArena(std::string label);
  ~DeviceArena();
  DeviceArena(DeviceArena&& o) noexcept;
  DeviceArena& operator=(DeviceArena&& o) noexcept;
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // One region of `count` elements of T (a negative count counts as 0), named `name` in regions().
  // Allocate sets *slot to it; `slot` must stay valid (not moved) until then. REQUIRES: not
  // allocated (checked: a broken invariant aborts).
  template <typename T>
  void Reserve(T** slot, int64_t count, std::string name) {
    const size_t bytes = static_cast<size_t>(count < 0 ? 0 : count) * sizeof(T);
    AddRegion(slot, &Bind<T>, bytes, std::move(name));
  }
  // A region of `bytes` bytes (untyped), as Reserve.
  void ReserveBytes(void** slot, size_t bytes, std::string name) {
    AddRegion(slot, &Bind<void>, bytes, std::move(name));
  }

  // One Device::Allocate of planned_bytes() from `device` (which must outlive the allocation), then
  // every reserved slot is pointed at its region; a plan of 0 bytes allocates nothing and sets
  // every slot to null. On failure nothing is allocated, the slots are untouched, the plan is kept
  // (Allocate may be retried), and the error (the device's, ResourceExhausted when out of memory)
  // is prefixed with the label, the bytes and the region count. FailedPrecondition when already
  // allocated.
  Status Allocate(Device* device);
  // Frees the allocation (if any) and forgets the plan; the label stays.
  void Clear();

  const std::string& label() const { return label_; }
  bool allocated() const { return allocated_; }
  // The device of the current allocation; null when not allocated.
  Device* device() const { return allocated_ ? device_ : nullptr; }
  // The bytes the plan needs (each region rounded up to kAlignment), allocated or not.
  size_t planned_bytes() const { return offset_; }
  // The bytes allocated now (planned_bytes() while allocated, else 0).
  size_t bytes() const { return allocated_ ? offset_ : 0; }

  struct Region {
    std::string name;
    size_t offset = 0;  // from the allocation's start, a multiple of kAlignment
    size_t bytes = 0;   // as reserved, before rounding up
  };
  // The plan, in reservation order.
  const std::vector<Region>& regions() const { return regions_; }

 private:
  using Binder = void (*)(void* slot, void* address);
  template <typename T>
  static void Bind(void* slot, void* address) {
    *static_cast<T**>(slot) = static_cast<T*>(address);
  }
  void AddRegion(void* slot, Binder bind, size_t bytes, std::string name);
  void Free();

  struct Slot {
    void* slot;
    Binder bind;
  };
  std::string label_;
  std::vector<Region> regions_;
  std::vector<Slot> slots_;  // parallel to regions_
  size_t offset_ = 0;
  bool allocated_ = false;
  Device* device_ = nullptr;
  DeviceBuffer memory_;
};

// The bytes held now by the allocated arenas of `device` whose label is `label`; every label when
// `label` is empty. 0 for a device without arenas.
size_t DeviceArenaBytes(const Device* device, const std::string& label = std::string());
// Each label of `device`'s allocated arenas with the bytes they hold, sorted by label.
std::vector<std::pair<std::string, size_t>> DeviceArenaUsage(const Device* device);

}  // namespace zero
