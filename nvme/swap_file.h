// SwapFile: one preallocated file holding fixed regions (tensors) at aligned offsets, read and
// written through an AioEngine, each region checked against the CRC32C of its last write.
//
// The owner creates it (the file must not exist: a leftover is reported, never reused) and its
// destructor closes and removes it (RAII). Layout: regions in the order given, each at a multiple
// of kAioAlignment, padded to one; the file is preallocated (posix_fallocate) to the total, so
// running out of disk shows at creation, not in the middle of a step. Buffers hold a region's
// padded size (AlignedBuffer::Allocate(bytes) does); the checksum covers its first `bytes`.
//
// The file's data moves through an AioEngine (O_DIRECT where the filesystem has it); creating,
// preallocating, checking the size of and removing the file go through a FileSystem
// (runtime/file_system.h; SwapFileOptions::file_system), so fault tests can inject errnos there.
//
// Thread safety: one thread at a time uses a SwapFile; at most one read or write per region is in
// flight (checked). Does not own the AioEngine or the FileSystem, which must outlive it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nvme/aio_engine.h"
#include "runtime/file_system.h"
#include "runtime/status.h"

namespace zero {

// A SwapFile call's error `s` (not OK) as its owner reports it when it cannot continue after it:
// what to do, by kind: DataLoss (the file no longer holds what was written) gets `data_loss`
// (what is lost), ResourceExhausted the disk-full advice and any other code the I/O-error advice,
// both naming the `nvme_path_key` config key; then that the engine must be recreated from the last
// checkpoint, pointing at `doc_section` of docs/nvme.md. The code stays s's.
Status WithSwapFaultAdvice(const Status& s, const std::string& data_loss, const std::string& nvme_path_key,
                           const std::string& doc_section);

struct SwapRegionSpec {
  std::string name;  // for messages (e.g. the parameter group and state)
  uint64_t bytes = 0;
};

struct SwapFileOptions {
  // true: after preallocating, write zeros over the whole file once (through the AioEngine), so that
  // every later write, the first swap out included, overwrites written blocks. false (default):
  // the first write of each region goes into unwritten extents (ext4/xfs convert them, a
  // journaled metadata change per write: bench/aio_bench "write, fresh"), later ones overwrite.
  // Costs one write pass of file_size at creation; docs/nvme.md "Benchmark" says when it pays.
  bool prewrite = false;
  // Creates, preallocates, checks and removes the file. null: the POSIX one.
  FileSystem* file_system = nullptr;
};

struct SwapRegion {
  std::string name;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint64_t padded_bytes = 0;  // bytes rounded up to kAioAlignment
};

class SwapFile {
 public:
  // One region's read or write in flight (from Start*; given to Finish exactly once).
  struct Io {
    AioTicket ticket = 0;
    size_t region = 0;
    bool read = false;
    const void* buffer = nullptr;
    uint32_t crc = 0;  // writes: the checksum of what is being written
  };

  // Creates `path` and preallocates it. Errors: FailedPrecondition when it exists already (a stale
  // swap file of an earlier run) or O_DIRECT is unsupported there; NotFound for a missing
  // directory; ResourceExhausted when the disk cannot hold it (naming the sizes); the errno text
  // otherwise. On error nothing is left at `path`.
  // With options.prewrite, a failed zero-fill is returned (with the swap file named) and the
  // file removed.
  static Result<std::unique_ptr<SwapFile>> Create(AioEngine* aio, const std::string& path,
                                                  const std::vector<SwapRegionSpec>& regions,
                                                  const SwapFileOptions& options = {});
  ~SwapFile();  // REQUIRES: no I/O in flight. Removes the file.
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return file_size_; }
  size_t region_count() const { return regions_.size(); }
  const SwapRegion& region(size_t i) const { return regions_[i].layout; }
  bool direct() const;

  // Starts writing region `i` from `buffer` (its padded size; aligned). The buffer must not change
  // until Finish. The region becomes readable when Finish returns OK.
  Result<Io> StartWrite(size_t i, const void* buffer);
  // Starts reading region `i` into `buffer`. REQUIRES: written (FailedPrecondition otherwise).
  Result<Io> StartRead(size_t i, void* buffer);
  // Start* first check (fstat) that the file still covers the region: DataLoss naming the file,
  // the region and its end of file when it was truncated (a write would otherwise re-extend it
  // silently, a read would hit the end of file).
  // Waits for `io`. Reads are checked: DataLoss naming the file, region, offset and both checksums
  // when the bytes differ from the last write, or when the file was truncated. A failed write
  // leaves the region unreadable until written again.
  Status Finish(const Io& io);

  Status Write(size_t i, const void* buffer);
  Status Read(size_t i, void* buffer);

 private:
  struct RegionState {
    SwapRegion layout;
    bool written = false;
    bool busy = false;
    uint32_t crc = 0;
  };
  SwapFile(AioEngine* aio, FileSystem* fs, std::string path, std::unique_ptr<AioFile> file,
           std::unique_ptr<WritableFile> created, std::vector<RegionState> regions, uint64_t file_size);
  std::string Describe(size_t i) const;
  Status CheckRegion(size_t i) const;
  // DataLoss when the file (fstat) no longer covers region i: truncated behind the owner's back.
  Status CheckExtent(size_t i) const;

  AioEngine* const aio_;
  FileSystem* const fs_;
  const std::string path_;
  std::unique_ptr<AioFile> file_;
  // The file as created, kept open for CheckExtent's fstat (the file, not whatever is at path_ later).
  const std::unique_ptr<WritableFile> created_;
  std::vector<RegionState> regions_;
  const uint64_t file_size_;
};

}  // namespace zero
