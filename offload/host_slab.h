// HostSlab: the one host allocation that an offload keeps its fp32 master weights, AdamW moments
// (and transfer buffers) in, NUMA-local to the GPU and pinned through the Device.
//
// Owns exactly one mapping of host memory (page-aligned; with libnuma and several NUMA nodes,
// numa_alloc_onnode on the chosen node, otherwise a plain anonymous mmap) and, when pinned, its
// registration (CUDA: Device::RegisterHostMemory = cudaHostRegister; CPU backend: mlock, after
// checking RLIMIT_MEMLOCK). The destructor unregisters, then frees. Sub-allocations are 64-byte
// aligned offsets into it, handed out in order by Take(); they own nothing. Knows nothing of the
// config file: the caller passes the key prefix its error messages should name.
// libnuma is loaded at run time (dlopen "libnuma.so.1"), so a binary runs where it is missing.
//
// Thread safety: Create and the destructor may run on any thread; Take() must not race with
// itself; the memory itself is the caller's to synchronize.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/device.h"
#include "runtime/status.h"

namespace zero {

inline constexpr size_t kHostSlabAlignment = 64;  // every Take() offset is a multiple of this
inline constexpr int kNumaNodeAuto = -1;          // the Device's node (its PCI device's, in /sys)
inline constexpr int kNumaNodeNone = -2;          // no placement: the kernel's default policy

struct HostSlabOptions {
  // true: page-locked (fast async H2D/D2H copies). false: pageable memory; copies from it are
  // staged by the driver and do not overlap with compute as well. Mirrors `pin_memory`.
  bool pin_memory = true;
  // When pinning fails: false (default) Create fails with the reason and the settings to change;
  // true: keep the slab pageable, print one warning per process, pinned() is false.
  bool fallback_to_pageable = false;
  // kNumaNodeAuto, kNumaNodeNone or a node id. With one node (or no libnuma) placement is moot
  // and the allocation is a plain mmap; an explicit node the machine does not have is an error.
  int numa_node = kNumaNodeAuto;
  // What the slab holds and the config key prefix its errors name, e.g. "optimizer states" and
  // "zero_optimization.offload_optimizer" (-> "...offload_optimizer.pin_memory").
  std::string what = "host slab";
  std::string config_key = "zero_optimization.offload_optimizer";
  // Where /sys is (tests point it at a fake tree for the PCI -> node lookup).
  std::string sysfs_root = "/sys";
};

// A sub-allocation: `bytes` at `data` == slab.data() + offset. Owns nothing.
struct HostSpan {
  void* data = nullptr;
  size_t offset = 0;
  size_t bytes = 0;
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

class HostSlab {
 public:
  // Bytes a Take(bytes) uses (rounded up to kHostSlabAlignment): size a slab as the sum of these.
  static size_t AlignedSize(size_t bytes) {
    return (bytes + kHostSlabAlignment - 1) / kHostSlabAlignment * kHostSlabAlignment;
  }

  // Allocates `bytes` (0: an empty slab, nothing mapped) of uninitialized host memory for use
  // with `device` (which must outlive the slab), placed and pinned as `options` say.
  // Errors (nothing is left allocated on failure): InvalidArgument for a NUMA node the machine
  // does not have; ResourceExhausted when the size exceeds the machine's (or node's) RAM, the
  // mapping fails (errno text), or pinning fails (CUDA text, or the RLIMIT_MEMLOCK limit and
  // what is locked already). Every message names what, the size in GiB, the node and the
  // setting to change.
  static Result<HostSlab> Create(Device* device, size_t bytes, const HostSlabOptions& options);

  HostSlab() = default;
  ~HostSlab() { Reset(); }
  HostSlab(HostSlab&& o) noexcept { *this = static_cast<HostSlab&&>(o); }
  HostSlab& operator=(HostSlab&& o) noexcept;
  HostSlab(const HostSlab&) = delete;
  HostSlab& operator=(const HostSlab&) = delete;

  // The next AlignedSize(bytes) of the slab. OutOfRange (naming `name`, the size and what is left)
  // when it does not fit; the slab is unchanged then. Take(0) gives an empty span at the cursor.
  Result<HostSpan> Take(size_t bytes, const std::string& name);

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  size_t used() const { return used_; }
  bool pinned() const { return pin_ != Pin::kNone; }
  // The node the pages are bound to; -1 when not bound (one node, no libnuma, kNumaNodeNone, or
  // a device without a node).
  int numa_node() const { return numa_node_; }

  void Reset();  // unregisters and frees now; the slab is empty after

  // Process-wide count of live slab bytes (mapped, not yet freed): the leak check of the tests
  // and a number the engine can report.
  static size_t live_bytes();

 private:
  enum class Pin { kNone, kDevice, kMlock };
  enum class Mapping { kMmap, kNuma };

  Device* device_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  size_t used_ = 0;
  int numa_node_ = -1;
  Pin pin_ = Pin::kNone;
  Mapping mapping_ = Mapping::kMmap;
};

// --- pieces of Create, exposed for tests -------------------------------------------------------

// The NUMA node of PCI device `pci_bus_id` ("0000:3b:00.0"; an 8-digit domain is accepted) from
// <sysfs_root>/bus/pci/devices/<id>/numa_node: -1 when the file says -1 (no affinity).
// NotFound naming the file when it cannot be read.
Result<int> NumaNodeOfPciDevice(const std::string& pci_bus_id, const std::string& sysfs_root);

// Whether locking `bytes` more fits RLIMIT_MEMLOCK: OK when `has_cap_ipc_lock`, the limit is
// RLIM_INFINITY, or already_locked + bytes <= limit; otherwise ResourceExhausted reporting the
// limit, what is locked already and the request (`what`, `config_key` as in HostSlabOptions).
Status CheckMemlockLimit(size_t bytes, uint64_t limit, size_t already_locked, bool has_cap_ipc_lock,
                         const std::string& what, const std::string& config_key);

// The highest NUMA node id libnuma reports, or -1 when libnuma is missing or numa_available()
// fails (then the machine is treated as one node).
int NumaMaxNode();

// "4.00 GiB (4294967296 bytes)"
std::string FormatGiB(size_t bytes);

}  // namespace zero
