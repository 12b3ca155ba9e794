#include "zero/nvme_param_store.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <utility>

#include "nvme/aligned_buffer.h"
#include "nvme/libaio_engine.h"
#include "nvme/swap_file.h"

namespace zero {

struct NvmeParamStore::Module {
  std::string name;
  std::vector<int> members;  // indices into shards_, in parameter order
  std::vector<int64_t> at;   // each member's offset in the module (elements)
  int64_t numel = 0;
  int region = -1;       // -1: no shards (nothing stored)
  bool on_disk = false;  // the region holds the module (written at least once)
  Slot* slot = nullptr;  // where it is in host memory, if it is
};

struct NvmeParamStore::Slot {
  char* data = nullptr;
  size_t bytes = 0;      // capacity
  size_t cache_off = 0;  // cache slots: offset in the cache area
  bool cache = false;
  int module = -1;       // -1: empty
  bool reading = false;  // io is a read into it
  bool writing = false;  // io is its write-back
  SwapFile::Io io;
  bool dirty = false;   // changed since read or written back
  bool ahead = false;   // read ahead (Prefetch), not yet used
  bool fenced = false;  // uploads from it were enqueued after `fence`'s last record
  std::unique_ptr<Event> fence;
  uint64_t last_use = 0;
};

namespace {
size_t Padded(int64_t numel, DType t) { return AlignUp(static_cast<uint64_t>(numel) * SizeOf(t), kAioAlignment); }
}  // namespace

NvmeParamStore::NvmeParamStore(Device* device, Stream* stream, DType dtype, int64_t numel)
    : device_(device), stream_(stream), dtype_(dtype), numel_(numel) {}

NvmeParamStore::~NvmeParamStore() {
  auto quiet = [&](Slot& s) {
    s.dirty = false;  // the file goes: no write-back
    Settle(s).IgnoreError();
  };
  for (auto& s : buffers_) quiet(*s);
  for (auto& s : cache_) quiet(*s);
  swap_.reset();  // removes the file
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove(dir_, ec);  // the rank's folder, if now empty
    const std::filesystem::path parent = std::filesystem::path(dir_).parent_path();
    if (parent.filename() == "zero_swap") std::filesystem::remove(parent, ec);
  }
}

Result<std::unique_ptr<NvmeParamStore>> NvmeParamStore::Create(Device* device, Stream* stream, DType dtype,
                                                               int64_t numel, std::vector<StoredShard> shards,
                                                               const std::vector<std::string>& module_names,
                                                               const NvmeParamStoreOptions& options) {
  std::unique_ptr<NvmeParamStore> s(new NvmeParamStore(device, stream, dtype, numel));
  ZERO_RETURN_IF_ERROR(s->Init(std::move(shards), module_names, options)
                           .WithContext("offloaded parameters (offload_param.device \"nvme\") in " + options.dir));
  return s;
}

Status NvmeParamStore::Init(std::vector<StoredShard> shards, const std::vector<std::string>& module_names,
                            const NvmeParamStoreOptions& o) {
  if (o.buffer_count < 1 || o.buffer_numel < 1 || o.cache_numel < 0) {
    return InvalidArgumentError(
        "zero_optimization.offload_param.buffer_count / buffer_size / max_in_cpu: expected >= 1 / >= 1 / >= 0, got " +
        std::to_string(o.buffer_count) + " / " + std::to_string(o.buffer_numel) + " / " +
        std::to_string(o.cache_numel));
  }
  shards_ = std::move(shards);
  modules_.resize(module_names.size());
  for (size_t m = 0; m < module_names.size(); ++m) modules_[m].name = module_names[m];
  for (size_t k = 0; k < shards_.size(); ++k) {
    const StoredShard& sh = shards_[k];
    if (sh.module < 0 || sh.module >= static_cast<int>(modules_.size()) || sh.offset < 0 || sh.shard < 0 ||
        sh.offset + sh.shard > numel_) {
      return InvalidArgumentError("shard of '" + sh.name + "' (module " + std::to_string(sh.module) + ", [" +
                                  std::to_string(sh.offset) + ", " + std::to_string(sh.offset + sh.shard) +
                                  ")) outside the modules or the partition of " + std::to_string(numel_));
    }
    Module& mod = modules_[sh.module];
    mod.members.push_back(static_cast<int>(k));
    mod.at.push_back(mod.numel);
    mod.numel += sh.shard;
  }
  int64_t largest = 0;
  size_t total_padded = 0;
  for (const Module& mod : modules_) {
    if (mod.numel > o.buffer_numel) {
      return InvalidArgumentError("module '" + mod.name + "' has " + std::to_string(mod.numel) +
                                  " elements of shards on this rank (" + std::to_string(mod.members.size()) +
                                  " parameters), more than zero_optimization.offload_param.buffer_size (" +
                                  std::to_string(o.buffer_numel) +
                                  "): a module is read into one buffer; raise "
                                  "zero_optimization.offload_param.buffer_size to at least " +
                                  std::to_string(mod.numel));
    }
    largest = std::max(largest, mod.numel);
    if (mod.numel > 0) total_padded += Padded(mod.numel, dtype_);
  }
  // The cache: max_in_cpu elements, no more than every module takes.
  cache_bytes_ = std::min(
      total_padded, static_cast<size_t>(AlignUp(static_cast<uint64_t>(o.cache_numel) * SizeOf(dtype_), kAioAlignment)));
  if (o.cache_numel == 0) cache_bytes_ = 0;
  bool needs_buffers = false;
  for (const Module& mod : modules_) {
    if (mod.numel > 0 && Padded(mod.numel, dtype_) > cache_bytes_) needs_buffers = true;
  }
  const size_t buffer_bytes = Padded(largest, dtype_);
  const int nbuf = needs_buffers ? o.buffer_count : 0;
  max_reads_ = o.buffer_count;

  dir_ = o.dir;
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) {
    const std::string d = dir_;
    dir_.clear();
    return FailedPreconditionError("zero_optimization.offload_param.nvme_path: cannot create " + d + ": " +
                                   ec.message());
  }
  if (o.aio_engine_factory) {
    ZERO_ASSIGN_OR_RETURN(aio_, o.aio_engine_factory(o.aio));
  } else {
    ZERO_ASSIGN_OR_RETURN(aio_, LibaioEngine::Create(o.aio));
  }
  std::vector<SwapRegionSpec> regions;
  for (Module& mod : modules_) {
    if (mod.numel == 0) continue;
    mod.region = static_cast<int>(regions.size());
    regions.push_back({"shards of module '" + mod.name + "'", static_cast<uint64_t>(mod.numel) * SizeOf(dtype_)});
  }
  SwapFileOptions swap_options;
  swap_options.file_system = o.file_system;
  ZERO_ASSIGN_OR_RETURN(swap_, SwapFile::Create(aio_.get(), dir_ + "/params.swp", regions, swap_options));

  const size_t slab_bytes = static_cast<size_t>(nbuf) * buffer_bytes + cache_bytes_;
  auto slab = HostSlab::Create(device_, slab_bytes, o.slab);
  if (!slab.ok()) {
    return slab.status().WithContext(std::to_string(nbuf) + " buffers of " + FormatGiB(buffer_bytes) +
                                     " (the largest module) and a cache of " + FormatGiB(cache_bytes_) +
                                     " (lower zero_optimization.offload_param.buffer_count or max_in_cpu)");
  }
  slab_ = std::move(slab).value();
  for (int b = 0; b < nbuf; ++b) {
    ZERO_ASSIGN_OR_RETURN(HostSpan span, slab_.Take(buffer_bytes, "parameter buffer"));
    auto s = std::make_unique<Slot>();
    s->data = static_cast<char*>(span.data);
    s->bytes = buffer_bytes;
    buffers_.push_back(std::move(s));
  }
  if (cache_bytes_ > 0) {
    ZERO_ASSIGN_OR_RETURN(HostSpan span, slab_.Take(cache_bytes_, "parameter cache"));
    cache_base_ = static_cast<char*>(span.data);
  }
  scratch_numel_ = std::min<int64_t>(numel_, std::max<int64_t>(1, o.scratch_numel));
  if (scratch_numel_ > 0) {
    auto b = device_->Allocate(static_cast<size_t>(scratch_numel_) * SizeOf(dtype_));
    if (!b.ok()) return b.status().WithContext("allocating the device scratch of the offloaded parameters");
    scratch_ = std::move(b).value();
  }
  return OkStatus();
}

size_t NvmeParamStore::nvme_bytes() const { return swap_ != nullptr ? swap_->file_size() : 0; }
const std::string& NvmeParamStore::path() const { return swap_->path(); }
bool NvmeParamStore::resident(int module) const { return modules_[module].slot != nullptr; }

Status NvmeParamStore::Usable(const char* call) const {
  if (!failed_.ok()) {
    return FailedPreconditionError(std::string("offloaded parameters (NVMe): ") + call +
                                   " refused: unusable after an earlier swap file error: " + failed_.message());
  }
  return OkStatus();
}

Status NvmeParamStore::FinishIo(const Slot& s) {
  TraceHostScope trace(observer_, TraceTrack::kIo, s.io.read ? "aio read wait" : "aio write wait");
  return swap_->Finish(s.io);
}
Status NvmeParamStore::ReadIo(size_t region, void* buffer) {
  TraceHostScope trace(observer_, TraceTrack::kIo, "aio read");
  return swap_->Read(region, buffer);
}
Status NvmeParamStore::WriteIo(size_t region, const void* buffer) {
  TraceHostScope trace(observer_, TraceTrack::kIo, "aio write");
  return swap_->Write(region, buffer);
}

// Every swap file error goes through here: it says what to do and ends the store's use (a buffer
// may hold a module whose read failed, a region whose write failed is unreadable).
Status NvmeParamStore::SwapError(Status s) {
  if (s.ok()) return s;
  s = WithSwapFaultAdvice(s,
                          "the parameter swap file (under zero_optimization.offload_param.nvme_path) was truncated, "
                          "corrupted or changed behind the engine's back: its weights are lost",
                          "zero_optimization.offload_param.nvme_path", "Parameter offload to NVMe");
  if (failed_.ok()) failed_ = s;
  return s;
}

Status NvmeParamStore::Settle(Slot& s) {
  if (s.reading) {
    s.reading = false;
    ZERO_RETURN_IF_ERROR(SwapError(FinishIo(s)));
  }
  if (s.writing) {
    s.writing = false;
    ZERO_RETURN_IF_ERROR(SwapError(FinishIo(s)));
  }
  if (s.fenced) {
    s.fenced = false;
    ZERO_RETURN_IF_ERROR(device_->SynchronizeEvent(s.fence.get()).WithContext("waiting for a parameter upload"));
  }
  return OkStatus();
}

Status NvmeParamStore::Evict(Slot& s) {
  ZERO_RETURN_IF_ERROR(Settle(s));
  if (s.module < 0) return OkStatus();
  Module& mod = modules_[s.module];
  if (s.dirty) {
    ZERO_RETURN_IF_ERROR(device_->SynchronizeStream(stream_));  // the device->host writes landed
    ZERO_RETURN_IF_ERROR(SwapError(WriteIo(static_cast<size_t>(mod.region), s.data)));
    ++stats_.writes;
    mod.on_disk = true;
    s.dirty = false;
  }
  mod.slot = nullptr;
  s.module = -1;
  s.ahead = false;
  return OkStatus();
}

Status NvmeParamStore::StartWriteBack(Slot& s) {
  if (!s.dirty || s.module < 0) return OkStatus();
  ZERO_RETURN_IF_ERROR(device_->SynchronizeStream(stream_));
  if (s.writing) {
    s.writing = false;
    ZERO_RETURN_IF_ERROR(SwapError(FinishIo(s)));
  }
  Module& mod = modules_[s.module];
  Result<SwapFile::Io> io = swap_->StartWrite(static_cast<size_t>(mod.region), s.data);
  if (!io.ok()) return SwapError(io.status());
  s.io = *io;
  s.writing = true;
  s.dirty = false;
  mod.on_disk = true;
  ++stats_.writes;
  return OkStatus();
}

Result<NvmeParamStore::Slot*> NvmeParamStore::Place(int m, bool wait) {
  const size_t need = Padded(modules_[m].numel, dtype_);
  // Without waiting: only slots with no I/O in flight and not read ahead may be taken.
  auto idle = [&](const Slot& s) { return !s.reading && !s.writing && !s.ahead && !s.dirty; };
  if (need <= cache_bytes_) {
    while (true) {
      // First fit among the gaps of the cache area (slots are kept by offset).
      size_t at = 0;
      size_t pos = 0;
      for (; pos < cache_.size(); ++pos) {
        if (cache_[pos]->cache_off - at >= need) break;
        at = cache_[pos]->cache_off + cache_[pos]->bytes;
      }
      if (pos < cache_.size() || cache_bytes_ - at >= need) {
        auto s = std::make_unique<Slot>();
        s->cache = true;
        s->cache_off = at;
        s->data = cache_base_ + at;
        s->bytes = need;
        Slot* raw = s.get();
        cache_.insert(cache_.begin() + static_cast<std::ptrdiff_t>(pos), std::move(s));
        return raw;
      }
      // Evict the least recently used (without waiting: an idle one).
      int victim = -1;
      for (size_t k = 0; k < cache_.size(); ++k) {
        if (!wait && !idle(*cache_[k])) continue;
        if (victim < 0 || cache_[k]->last_use < cache_[victim]->last_use) victim = static_cast<int>(k);
      }
      if (victim < 0) return static_cast<Slot*>(nullptr);
      ZERO_RETURN_IF_ERROR(Evict(*cache_[victim]));
      cache_.erase(cache_.begin() + victim);
    }
  }
  Slot* pick = nullptr;
  for (auto& s : buffers_) {
    if (s->module < 0 && !s->reading && !s->writing) {
      pick = s.get();
      break;
    }
  }
  if (pick == nullptr) {
    // The least recently used: idle ones first, then (waiting) any, read-ahead ones last.
    for (int pass = 0; pass < (wait ? 3 : 1) && pick == nullptr; ++pass) {
      for (auto& s : buffers_) {
        const bool ok = pass == 0 ? idle(*s) : pass == 1 ? !s->ahead : true;
        if (ok && (pick == nullptr || s->last_use < pick->last_use)) pick = s.get();
      }
    }
  }
  if (pick == nullptr) return static_cast<Slot*>(nullptr);
  ZERO_RETURN_IF_ERROR(Evict(*pick));
  return pick;
}

Result<NvmeParamStore::Slot*> NvmeParamStore::Get(int m, bool fill) {
  Module& mod = modules_[m];
  Slot* s = mod.slot;
  if (s != nullptr) {
    if (s->reading) {
      s->reading = false;
      ZERO_RETURN_IF_ERROR(SwapError(FinishIo(*s)));
    }
    if (!s->ahead) ++stats_.cache_hits;
  } else {
    ZERO_ASSIGN_OR_RETURN(s, Place(m, /*wait=*/true));
    ZERO_CHECK(s != nullptr);
    if (fill && mod.on_disk) {
      ZERO_RETURN_IF_ERROR(SwapError(ReadIo(static_cast<size_t>(mod.region), s->data)));
      ++stats_.reads;
    } else if (fill) {
      std::memset(s->data, 0, s->bytes);  // never written: zeros, as the partition starts
    } else if (mod.on_disk) {
      ++stats_.skipped_reads;
    }
    s->module = m;
    mod.slot = s;
  }
  s->ahead = false;
  s->last_use = ++clock_;
  return s;
}

Result<const void*> NvmeParamStore::Load(int module) {
  ZERO_RETURN_IF_ERROR(Usable("Load"));
  ZERO_CHECK(module >= 0 && module < static_cast<int>(modules_.size()));
  if (modules_[module].numel == 0) return static_cast<const void*>(nullptr);
  ZERO_ASSIGN_OR_RETURN(Slot * s, Get(module, /*fill=*/true));
  return static_cast<const void*>(s->data);
}

Status NvmeParamStore::Uploaded(int module, Stream* stream) {
  ZERO_RETURN_IF_ERROR(Usable("Uploaded"));
  Slot* s = modules_[module].slot;
  if (s == nullptr) return OkStatus();
  if (s->fence == nullptr) {
    ZERO_ASSIGN_OR_RETURN(s->fence, device_->CreateEvent());
  }
  ZERO_RETURN_IF_ERROR(device_->RecordEvent(s->fence.get(), stream));
  s->fenced = true;
  return OkStatus();
}

Result<bool> NvmeParamStore::Prefetch(int module) {
  ZERO_RETURN_IF_ERROR(Usable("Prefetch"));
  Module& mod = modules_[module];
  if (mod.numel == 0 || !mod.on_disk) return true;  // nothing to read
  if (mod.slot != nullptr) {
    ++stats_.cache_hits;
    return true;
  }
  int reading = 0;
  for (const auto& s : buffers_) reading += s->reading ? 1 : 0;
  for (const auto& s : cache_) reading += s->reading ? 1 : 0;
  if (reading >= max_reads_) return false;
  ZERO_ASSIGN_OR_RETURN(Slot * s, Place(module, /*wait=*/false));
  if (s == nullptr) return false;
  Result<SwapFile::Io> io = swap_->StartRead(static_cast<size_t>(mod.region), s->data);
  if (!io.ok()) {
    if (s->cache) {
      cache_.erase(std::find_if(cache_.begin(), cache_.end(), [&](const auto& c) { return c.get() == s; }));
    }
    return SwapError(io.status());
  }
  s->io = *io;
  s->reading = true;
  s->ahead = true;
  s->module = module;
  s->last_use = ++clock_;
  mod.slot = s;
  ++stats_.reads;
  ++stats_.read_aheads;
  return true;
}

Status NvmeParamStore::AfterWrites() {
  ZERO_RETURN_IF_ERROR(Usable("AfterWrites"));
  for (auto& s : buffers_) ZERO_RETURN_IF_ERROR(StartWriteBack(*s));
  for (auto& s : cache_) ZERO_RETURN_IF_ERROR(StartWriteBack(*s));
  return OkStatus();
}

template <typename Fn>
Status NvmeParamStore::ForPieces(int64_t offset, int64_t n, Fn fn) {
  if (offset < 0 || n < 0 || offset + n > numel_) {
    return OutOfRangeError("offloaded parameters (NVMe): [" + std::to_string(offset) + ", " +
                           std::to_string(offset + n) + ") outside [0, " + std::to_string(numel_) + ")");
  }
  for (int m = 0; m < static_cast<int>(modules_.size()); ++m) {
    const Module& mod = modules_[m];
    for (size_t j = 0; j < mod.members.size(); ++j) {
      const StoredShard& sh = shards_[mod.members[j]];
      const int64_t b = std::max(offset, sh.offset);
      const int64_t e = std::min(offset + n, sh.offset + sh.shard);
      if (e > b) ZERO_RETURN_IF_ERROR(fn(m, mod.at[j] + (b - sh.offset), b, e - b));
    }
  }
  return OkStatus();
}

Status NvmeParamStore::WritePieces(int64_t offset, int64_t n,
                                   const std::function<Status(void* host, int64_t piece, int64_t len)>& fill) {
  ZERO_RETURN_IF_ERROR(Usable("Write"));
  const size_t esize = SizeOf(dtype_);
  // Modules in order, so each is finished (and its write-back started) before the next.
  int current = -1;
  ZERO_RETURN_IF_ERROR(ForPieces(offset, n, [&](int m, int64_t in_module, int64_t piece, int64_t len) -> Status {
    if (m != current) {
      if (current >= 0 && modules_[current].slot != nullptr) {
        ZERO_RETURN_IF_ERROR(StartWriteBack(*modules_[current].slot));
      }
      current = m;
    }
    // No read when this write covers all of a module not in host memory (every piece comes now).
    const Module& mod = modules_[m];
    bool covers = mod.slot == nullptr && in_module == 0;
    for (size_t j = 0; covers && j < mod.members.size(); ++j) {
      const StoredShard& sh = shards_[mod.members[j]];
      covers = sh.shard == 0 || (sh.offset >= offset && sh.offset + sh.shard <= offset + n);
    }
    ZERO_ASSIGN_OR_RETURN(Slot * s, Get(m, /*fill=*/!covers));
    if (s->writing) {
      s->writing = false;
      ZERO_RETURN_IF_ERROR(SwapError(FinishIo(*s)));
    }
    if (s->fenced) {
      s->fenced = false;
      ZERO_RETURN_IF_ERROR(device_->SynchronizeEvent(s->fence.get()));
    }
    s->dirty = true;
    return fill(s->data + static_cast<size_t>(in_module) * esize, piece, len);
  }));
  if (current >= 0 && modules_[current].slot != nullptr) {
    ZERO_RETURN_IF_ERROR(StartWriteBack(*modules_[current].slot));
  }
  return OkStatus();
}

Status NvmeParamStore::Write(int64_t offset, int64_t n, const Producer& produce) {
  const size_t esize = SizeOf(dtype_);
  return WritePieces(offset, n, [&](void* host, int64_t piece, int64_t len) -> Status {
    for (int64_t c = 0; c < len; c += scratch_numel_) {
      const int64_t l = std::min(scratch_numel_, len - c);
      ZERO_RETURN_IF_ERROR(produce(scratch_.data(), piece - offset + c, l));
      ZERO_RETURN_IF_ERROR(device_->Copy(static_cast<char*>(host) + static_cast<size_t>(c) * esize, scratch_.data(),
                                         static_cast<size_t>(l) * esize, CopyKind::kDeviceToHost, stream_));
    }
    return OkStatus();
  });
}

Status NvmeParamStore::WriteFromMasters(OptimizerStates* states, int64_t offset, int64_t n) {
  if (states->casts_to_host()) {
    ZERO_RETURN_IF_ERROR(device_->SynchronizeStream(stream_));
    return WritePieces(offset, n, [&](void* host, int64_t piece, int64_t len) {
      return states->CastMasterToHost(piece, len, host, dtype_);
    });
  }
  return Write(offset, n, [&](void* dst, int64_t at, int64_t len) {
    return states->CastMaster(offset + at, len, dst, dtype_, stream_);
  });
}

Status NvmeParamStore::CopyToDevice(int64_t offset, int64_t n, void* dst) {
  ZERO_RETURN_IF_ERROR(Usable("CopyToDevice"));
  const size_t esize = SizeOf(dtype_);
  return ForPieces(offset, n, [&](int m, int64_t in_module, int64_t piece, int64_t len) -> Status {
    ZERO_ASSIGN_OR_RETURN(Slot * s, Get(m, /*fill=*/true));
    ZERO_RETURN_IF_ERROR(device_->Copy(static_cast<char*>(dst) + static_cast<size_t>(piece - offset) * esize,
                                       s->data + static_cast<size_t>(in_module) * esize,
                                       static_cast<size_t>(len) * esize, CopyKind::kHostToDevice, stream_));
    return device_->SynchronizeStream(stream_);  // the slot may be reused by the next piece
  });
}

}  // namespace zero
