#include "offload/host_slab.h"

#include <dlfcn.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

namespace zero {
namespace {

constexpr int kCapIpcLock = 14;  // linux/capability.h

std::atomic<size_t> g_live_bytes{0};
std::atomic<bool> g_warned_fallback{false};

// libnuma, loaded once at run time. All pointers are null when it is missing.
struct Numa {
  int (*available)() = nullptr;
  int (*max_node)() = nullptr;
  void* (*alloc_onnode)(size_t, int) = nullptr;
  void (*free)(void*, size_t) = nullptr;
  long long (*node_size64)(int, long long*) = nullptr;
  bool usable = false;
};

const Numa& GetNuma() {
  static const Numa numa = [] {
    Numa n;
    void* lib = dlopen("libnuma.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return n;  // never dlclose'd: the functions stay valid for the process
    n.available = reinterpret_cast<int (*)()>(dlsym(lib, "numa_available"));
    n.max_node = reinterpret_cast<int (*)()>(dlsym(lib, "numa_max_node"));
    n.alloc_onnode = reinterpret_cast<void* (*)(size_t, int)>(dlsym(lib, "numa_alloc_onnode"));
    n.free = reinterpret_cast<void (*)(void*, size_t)>(dlsym(lib, "numa_free"));
    n.node_size64 = reinterpret_cast<long long (*)(int, long long*)>(dlsym(lib, "numa_node_size64"));
    n.usable = n.available != nullptr && n.max_node != nullptr && n.alloc_onnode != nullptr && n.free != nullptr &&
               n.available() >= 0;
    return n;
  }();
  return numa;
}

// A "Field:   value" line of a /proc status file; empty when absent.
std::string ProcStatusField(const char* file, const std::string& field) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, field.size() + 1, field + ":") == 0) {
      size_t i = field.size() + 1;
      while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
      return line.substr(i);
    }
  }
  return std::string();
}

size_t LockedBytes() {  // VmLck of the process, in bytes
  std::string v = ProcStatusField("/proc/self/status", "VmLck");
  return v.empty() ? 0 : std::strtoull(v.c_str(), nullptr, 10) * 1024;
}

bool HasCapIpcLock() {  // capabilities are per thread: mlock checks the calling thread's
  std::string v = ProcStatusField("/proc/thread-self/status", "CapEff");
  if (v.empty()) return false;
  uint64_t caps = std::strtoull(v.c_str(), nullptr, 16);
  return (caps >> kCapIpcLock) & 1;
}

std::string NodeText(int node) { return node >= 0 ? "on NUMA node " + std::to_string(node) : "(no NUMA placement)"; }

// What to change when the memory cannot be had, common to every failure.
std::string SmallerAdvice() {
  return "give each rank less to hold: fewer ranks per host, or a larger world size (smaller "
         "partitions per rank)";
}

std::string PinAdvice(const std::string& key) {
  return "set " + key + ".pin_memory false (pageable memory: slower copies that overlap less), " + "or " + key +
         ".pin_memory_fallback true (fall back to pageable with a warning), or " + SmallerAdvice();
}

void WarnFallbackOnce(const Status& why) {
  if (!g_warned_fallback.exchange(true)) {
    std::fprintf(stderr,
                 "zero: WARNING: %s; falling back to pageable host memory (copies will be "
                 "slower; printed once per process)\n",
                 why.message().c_str());
  }
}

}  // namespace

std::string FormatGiB(size_t bytes) {
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%.2f GiB (%zu bytes)", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0),
                bytes);
  return buf;
}

int NumaMaxNode() {
  const Numa& numa = GetNuma();
  return numa.usable ? numa.max_node() : -1;
}

Result<int> NumaNodeOfPciDevice(const std::string& pci_bus_id, const std::string& sysfs_root) {
  std::string id;
  for (char c : pci_bus_id) id += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // CUDA may print an 8-digit PCI domain ("00000000:3b:00.0"); sysfs uses 4.
  size_t colon = id.find(':');
  if (colon == 8 && id.compare(0, 4, "0000") == 0) id = id.substr(4);
  std::string path = sysfs_root + "/bus/pci/devices/" + id + "/numa_node";
  std::ifstream in(path);
  int node = -1;
  if (!(in >> node)) {
    return NotFoundError("cannot read the NUMA node of PCI device " + pci_bus_id + " from " + path);
  }
  return node < 0 ? -1 : node;
}

Status CheckMemlockLimit(size_t bytes, uint64_t limit, size_t already_locked, bool has_cap_ipc_lock,
                         const std::string& what, const std::string& config_key) {
  if (has_cap_ipc_lock || limit == RLIM_INFINITY) return OkStatus();
  if (already_locked <= limit && bytes <= limit - already_locked) return OkStatus();
  return ResourceExhaustedError(what + ": cannot page-lock " + FormatGiB(bytes) + ": RLIMIT_MEMLOCK (ulimit -l) is " +
                                FormatGiB(limit) + " and this process has " + FormatGiB(already_locked) +
                                " locked already; raise the limit (ulimit -l unlimited, or memlock in "
                                "/etc/security/limits.conf / the container's --ulimit memlock=-1), or " +
                                PinAdvice(config_key));
}

size_t HostSlab::live_bytes() { return g_live_bytes.load(); }

Result<HostSlab> HostSlab::Create(Device* device, size_t bytes, const HostSlabOptions& options) {
  HostSlab slab;
  if (bytes == 0) return slab;
  const Numa& numa = GetNuma();
  const int max_node = NumaMaxNode();  // -1: no libnuma
  const std::string& what = options.what;

  // --- where ---------------------------------------------------------------------------------
  int bind_node = -1;  // the node to numa_alloc_onnode on; -1: plain mmap
  int known_node = max_node == 0 ? 0 : -1;
  if (options.numa_node >= 0) {
    if (max_node < 0 && options.numa_node > 0) {
      return FailedPreconditionError(what + ": NUMA node " + std::to_string(options.numa_node) +
                                     " was asked for, but libnuma (libnuma.so.1) is not available to place memory; "
                                     "install libnuma1 or let " +
                                     options.config_key + " choose the node (auto)");
    }
    if (max_node >= 0 && options.numa_node > max_node) {
      return InvalidArgumentError(what + ": NUMA node " + std::to_string(options.numa_node) +
                                  " does not exist; this machine has nodes 0.." + std::to_string(max_node));
    }
    if (max_node >= 1) bind_node = known_node = options.numa_node;
  } else if (options.numa_node == kNumaNodeAuto && max_node >= 1) {
    std::string pci = device->pci_bus_id();
    if (!pci.empty()) {
      Result<int> node = NumaNodeOfPciDevice(pci, options.sysfs_root);
      if (node.ok() && *node >= 0 && *node <= max_node) {
        bind_node = known_node = *node;
      } else {
        std::fprintf(
            stderr, "zero: WARNING: %s: %s; the slab is not NUMA-placed\n", what.c_str(),
            node.ok() ? ("PCI device " + pci + " reports no NUMA node").c_str() : node.status().message().c_str());
      }
    }
  } else if (options.numa_node != kNumaNodeNone && options.numa_node != kNumaNodeAuto) {
    return InvalidArgumentError(what + ": numa_node " + std::to_string(options.numa_node) +
                                " is not a node id, kNumaNodeAuto (-1) or kNumaNodeNone (-2)");
  }
  const std::string where = NodeText(known_node);

  // --- can the machine give it at all ----------------------------------------------------------
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  const size_t ram = pages > 0 && page > 0 ? static_cast<size_t>(pages) * page : 0;
  if (ram > 0 && bytes > ram) {
    return ResourceExhaustedError(what + ": cannot allocate " + FormatGiB(bytes) + " of host memory " + where +
                                  ": the machine has " + FormatGiB(ram) + " of RAM in all; " + SmallerAdvice());
  }
  if (bind_node >= 0 && numa.node_size64 != nullptr) {
    long long node_size = numa.node_size64(bind_node, nullptr);
    if (node_size > 0 && bytes > static_cast<size_t>(node_size)) {
      return ResourceExhaustedError(what + ": cannot allocate " + FormatGiB(bytes) + " of host memory " + where +
                                    ": the node has " + FormatGiB(static_cast<size_t>(node_size)) + " of RAM; " +
                                    SmallerAdvice());
    }
  }

  // --- pinning, checked before anything is mapped -------------------------------------------
  bool pin = options.pin_memory;
  const bool mlock_pin = device->kind() == DeviceKind::kCpu;
  if (pin && mlock_pin) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
      Status st = CheckMemlockLimit(bytes, rl.rlim_cur, LockedBytes(), HasCapIpcLock(), what, options.config_key);
      if (!st.ok()) {
        if (!options.fallback_to_pageable) return st;
        WarnFallbackOnce(st);
        pin = false;
      }
    }
  }

  // --- map -------------------------------------------------------------------------------------
  void* p = nullptr;
  if (bind_node >= 0) {
    errno = 0;
    p = numa.alloc_onnode(bytes, bind_node);
    slab.mapping_ = Mapping::kNuma;
  } else {
    p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) p = nullptr;
    slab.mapping_ = Mapping::kMmap;
  }
  if (p == nullptr) {
    int err = errno != 0 ? errno : ENOMEM;
    return ResourceExhaustedError(what + ": allocating " + FormatGiB(bytes) + " of host memory " + where + " failed (" +
                                  (bind_node >= 0 ? "numa_alloc_onnode" : "mmap") + "): " + std::strerror(err) +
                                  " (errno " + std::to_string(err) + "); " + SmallerAdvice());
  }
  slab.device_ = device;
  slab.data_ = p;
  slab.bytes_ = bytes;
  slab.numa_node_ = known_node;
  g_live_bytes += bytes;

  // --- pin -------------------------------------------------------------------------------------
  if (pin) {
    Status st;
    if (mlock_pin) {
      if (mlock(p, bytes) != 0) {
        int err = errno;
        st = ResourceExhaustedError(what + ": page-locking " + FormatGiB(bytes) + " " + where +
                                    " failed (mlock): " + std::strerror(err) + " (errno " + std::to_string(err) +
                                    "); " + PinAdvice(options.config_key));
      }
    } else {
      st = device->RegisterHostMemory(p, bytes);
      if (!st.ok()) {
        st = ResourceExhaustedError(what + ": pinning " + FormatGiB(bytes) + " of host memory " + where + " through " +
                                    device->name() + " failed: " + st.message() + "; " + PinAdvice(options.config_key));
      }
    }
    if (st.ok()) {
      slab.pin_ = mlock_pin ? Pin::kMlock : Pin::kDevice;
    } else if (options.fallback_to_pageable) {
      WarnFallbackOnce(st);
    } else {
      return st;  // `slab` frees the mapping
    }
  }
  return slab;
}

HostSlab& HostSlab::operator=(HostSlab&& o) noexcept {
  if (this != &o) {
    Reset();
    device_ = o.device_;
    data_ = o.data_;
    bytes_ = o.bytes_;
    used_ = o.used_;
    numa_node_ = o.numa_node_;
    pin_ = o.pin_;
    mapping_ = o.mapping_;
    o.device_ = nullptr;
    o.data_ = nullptr;
    o.bytes_ = 0;
    o.used_ = 0;
    o.numa_node_ = -1;
    o.pin_ = Pin::kNone;
    o.mapping_ = Mapping::kMmap;
  }
  return *this;
}

void HostSlab::Reset() {
  if (data_ != nullptr) {
    if (pin_ == Pin::kDevice) {
      Status st = device_->UnregisterHostMemory(data_);
      if (!st.ok()) std::fprintf(stderr, "zero: %s\n", st.ToString().c_str());
    } else if (pin_ == Pin::kMlock) {
      munlock(data_, bytes_);
    }
    if (mapping_ == Mapping::kNuma) {
      GetNuma().free(data_, bytes_);
    } else if (munmap(data_, bytes_) != 0) {
      std::fprintf(stderr, "zero: munmap of a %s host slab failed: %s\n", FormatGiB(bytes_).c_str(),
                   std::strerror(errno));
    }
    g_live_bytes -= bytes_;
  }
  device_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
  used_ = 0;
  numa_node_ = -1;
  pin_ = Pin::kNone;
  mapping_ = Mapping::kMmap;
}

Result<HostSpan> HostSlab::Take(size_t bytes, const std::string& name) {
  size_t need = AlignedSize(bytes);
  if (need < bytes || need > bytes_ - used_) {
    return OutOfRangeError("host slab: " + name + " needs " + FormatGiB(need) + " but only " +
                           FormatGiB(bytes_ - used_) + " of the " + FormatGiB(bytes_) +
                           " slab are left (slab sized too small: sum HostSlab::AlignedSize)");
  }
  HostSpan span{static_cast<char*>(data_) + used_, used_, bytes};
  if (data_ == nullptr) span.data = nullptr;
  used_ += need;
  return span;
}

}  // namespace zero
