// NvmeParamStore: stage 3's model-dtype parameter shards on NVMe (offload_param.device "nvme"),
// read into pinned host buffers module by module for the coordinator's uploads.
//
// Owns the swap file <dir>/params.swp (created at Create, removed by the destructor; a leftover of
// a killed run is refused with its path), the aio engine, one host slab and a device scratch. The
// file holds one region per module (the unit the coordinator gathers): the shards of the module's
// parameters in parameter order, CRC32C-checked on every read. The slab holds `buffer_count`
// buffers of `buffer_numel` elements, through which modules larger than the cache are read, and a
// cache of `cache_numel` elements (offload_param.max_in_cpu, capped at the partition) in which
// modules that fit stay in host memory, least recently used evicted first, so small modules are
// not read again for every gather. A module in host memory is served from there; one on disk is
// read with one request chain (Load blocks; Prefetch starts the read and returns). At most
// `buffer_count` reads are in flight (Prefetch says false beyond that, or when every buffer holds
// a module read ahead and not yet used). A buffer is reused only after the uploads from it
// (Uploaded: an event on the upload stream).
//
// Writes (the engine's update path, between the coordinator's QuiesceForUpdate and AfterUpdate)
// go into the module's host copy (read first unless the write covers the whole module), and the
// module's write-back is started as soon as the write moves on to another module (AfterWrites
// starts the rest); a buffer is reused only after its write-back finished.
//
// Sizing: a module whose shards exceed buffer_numel is a Create error naming the module, its size
// and the value zero_optimization.offload_param.buffer_size must reach; nothing is "out of
// buffers" at run time (a demand waits for the oldest buffer's upload or write-back instead).
//
// Errors: a swap file error (EIO, ENOSPC, end of file, truncation, checksum) is returned naming the
// file, region, offset and length, with what to do; after it every call is refused
// (FailedPrecondition carrying the first error): the engine cannot continue (docs/nvme.md).
// Thread safety: one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nvme/aio_engine.h"
#include "offload/host_slab.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/file_system.h"
#include "runtime/status.h"
#include "zero/param_coordinator.h"
#include "zero/param_store.h"

namespace zero {

// One parameter's shard in the store: elements [offset, offset + shard) of the partition layout,
// gathered with module `module`.
struct StoredShard {
  std::string name;
  int64_t offset = 0;
  int64_t shard = 0;
  int module = -1;
};

struct NvmeParamStoreOptions {
  std::string dir;                   // created if missing (one rank's folder under offload_param.nvme_path)
  int buffer_count = 5;              // offload_param.buffer_count, >= 1
  int64_t buffer_numel = 100000000;  // offload_param.buffer_size (elements), >= 1
  int64_t cache_numel = 0;           // offload_param.max_in_cpu (elements), >= 0
  AioOptions aio;
  AioEngineFactory aio_engine_factory;  // empty: LibaioEngine
  FileSystem* file_system = nullptr;    // the swap file's (SwapFileOptions::file_system); null: the POSIX one
  HostSlabOptions slab;
  int64_t scratch_numel = int64_t{1} << 20;  // device scratch elements (model dtype)
};

struct NvmeParamStoreStats {
  int64_t reads = 0;          // module regions read from the file
  int64_t read_aheads = 0;    // of those, started by Prefetch
  int64_t cache_hits = 0;     // Load / Prefetch of a module already in host memory
  int64_t writes = 0;         // module regions written back
  int64_t skipped_reads = 0;  // writes that covered a whole module not in host memory (no read)
};

class NvmeParamStore final : public ParamStore, public ModuleShardStore {
 public:
  // `shards`: every parameter's shard (any order; offsets within [0, numel)); `module_names`
  // names modules 0..M-1 for messages. Errors: a module larger than buffer_numel
  // (InvalidArgument naming the key and value to set), the swap file's, the slab's.
  static Result<std::unique_ptr<NvmeParamStore>> Create(Device* device, Stream* stream, DType dtype, int64_t numel,
                                                        std::vector<StoredShard> shards,
                                                        const std::vector<std::string>& module_names,
                                                        const NvmeParamStoreOptions& options);
  ~NvmeParamStore() override;  // removes the file (and the rank's folder, if empty)

  // ParamStore.
  int64_t numel() const override { return numel_; }
  Status Write(int64_t offset, int64_t n, const Producer& produce) override;
  Status WriteFromMasters(OptimizerStates* states, int64_t offset, int64_t n) override;
  Status CopyToDevice(int64_t offset, int64_t n, void* dst) override;
  const void* host_address(int64_t) const override { return nullptr; }
  ModuleShardStore* module_store() override { return this; }
  size_t host_bytes() const override { return slab_.bytes(); }
  size_t device_bytes() const override { return scratch_.bytes(); }
  size_t nvme_bytes() const override;

  // ModuleShardStore.
  Result<const void*> Load(int module) override;
  Status Uploaded(int module, Stream* stream) override;
  Result<bool> Prefetch(int module) override;
  Status AfterWrites() override;

  const NvmeParamStoreStats& stats() const { return stats_; }
  const std::string& path() const;
  // Whether module m's shards are in host memory now (read, or being read).
  bool resident(int module) const;

 private:
  struct Module;
  struct Slot;
  NvmeParamStore(Device* device, Stream* stream, DType dtype, int64_t numel);
  Status Init(std::vector<StoredShard> shards, const std::vector<std::string>& module_names,
              const NvmeParamStoreOptions& o);
  Status Usable(const char* call) const;
  Status SwapError(Status s);
  // The swap file's blocking calls, each a host span on the trace's I/O track (the aio waits).
  Status FinishIo(const Slot& s);  // its io
  Status ReadIo(size_t region, void* buffer);
  Status WriteIo(size_t region, const void* buffer);
  // The slot holding module m, its read finished; with `fill` false and m not in host memory, a
  // slot without reading (the caller overwrites all of it).
  Result<Slot*> Get(int m, bool fill);
  // A slot for module m (not in host memory): a free buffer or cache space, evicting as needed;
  // `wait` false: nullptr instead of waiting for any I/O or evicting a module read ahead.
  Result<Slot*> Place(int m, bool wait);
  Status Evict(Slot& s);   // waits for its I/O and upload, writes back if dirty
  Status Settle(Slot& s);  // waits for its I/O and upload
  Status StartWriteBack(Slot& s);
  // fn(module, param, piece offset in the partition, length) over the shards' pieces in range.
  template <typename Fn>
  Status ForPieces(int64_t offset, int64_t n, Fn fn);
  Status WritePieces(int64_t offset, int64_t n,
                     const std::function<Status(void* host, int64_t piece, int64_t len)>& fill);

  Device* device_;
  Stream* stream_;
  DType dtype_;
  int64_t numel_;
  std::string dir_;
  std::vector<StoredShard> shards_;  // by offset
  std::vector<Module> modules_;
  std::vector<std::unique_ptr<Slot>> buffers_;
  std::vector<std::unique_ptr<Slot>> cache_;  // by offset in the cache area
  char* cache_base_ = nullptr;
  size_t cache_bytes_ = 0;
  int max_reads_ = 1;
  uint64_t clock_ = 0;
  std::unique_ptr<AioEngine> aio_;
  std::unique_ptr<class SwapFile> swap_;
  HostSlab slab_;
  DeviceBuffer scratch_;
  int64_t scratch_numel_ = 0;
  NvmeParamStoreStats stats_;
  Status failed_;
};

}  // namespace zero
