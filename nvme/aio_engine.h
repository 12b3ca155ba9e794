// AioEngine: asynchronous direct I/O of aligned host buffers to and from files (the NVMe tier).
//
// One interface for all swap I/O (leveldb's Env pattern): LibaioEngine (libaio_engine.h) is the
// real one, FaultyAioEngine (faulty_aio_engine.h) wraps it to inject errors, short transfers and
// delays in tests. A request is split into `block_size` pieces spread over `intra_op_parallelism`
// worker threads, each with its own kernel io_context and up to `queue_depth` pieces in flight.
// The options mirror DeepSpeed's `aio` config block (engine/config/config.h AioConfig, same names and
// defaults); this header knows nothing of the config file.
//
// Alignment (checked at submit, InvalidArgument naming which value is off): the buffer address,
// the file offset and the length must be multiples of kAioAlignment (4096), also under the
// buffered fallback, so code that runs on one filesystem runs on all.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "runtime/status.h"

namespace zero {

// Direct I/O alignment of offsets, lengths and buffer addresses (the largest logical block size
// of common NVMe and SATA disks).
inline constexpr size_t kAioAlignment = 4096;

struct AioOptions {
  // Bytes per piece (one iocb). Must be a positive multiple of kAioAlignment.
  int64_t block_size = 1048576;
  // Pieces in flight per worker thread (the io_context's size). >= 1.
  int64_t queue_depth = 8;
  // Worker threads, each with its own io_context; a request's pieces are split among them. >= 1.
  int64_t intra_op_parallelism = 1;
  // true: one io_submit per piece; false: all pieces that fit in the queue in one io_submit.
  bool single_submit = false;
  // true: a new piece is submitted as soon as any completes; false: a batch of queue_depth pieces
  // is submitted and all are reaped before the next batch.
  bool overlap_events = true;
  // When the filesystem refuses O_DIRECT (EINVAL on open, e.g. tmpfs on older kernels, ramfs):
  // false (default) fails Open with a message naming the path and filesystem; true opens the file
  // without O_DIRECT (page cache; io_submit then completes synchronously). See docs/nvme.md.
  bool allow_buffered_fallback = false;
  // Slice of each blocking io_getevents call; a worker with nothing in flight sleeps on a
  // condition variable instead. Never a busy-wait.
  std::chrono::milliseconds reap_timeout{1000};
};

// Checks the options; InvalidArgument naming the field (as the aio config key) otherwise.
Status ValidateAioOptions(const AioOptions& options);

enum class AioOpenMode {
  kRead,       // the file must exist
  kReadWrite,  // the file must exist
  kCreate,     // created or truncated, read/write
};

// An open file. Owned by the caller of AioEngine::Open; must outlive every request on it and be
// closed (destroyed) only when none is in flight. Not copyable.
class AioFile {
 public:
  virtual ~AioFile() = default;
  AioFile(const AioFile&) = delete;
  AioFile& operator=(const AioFile&) = delete;

  const std::string& path() const { return path_; }
  // true: opened with O_DIRECT; false: the buffered fallback.
  bool direct() const { return direct_; }
  // The filesystem type holding the file ("ext4", "tmpfs", or "0x<magic>").
  const std::string& filesystem() const { return filesystem_; }

 protected:
  AioFile(std::string path, bool direct, std::string filesystem)
      : path_(std::move(path)), direct_(direct), filesystem_(std::move(filesystem)) {}

 private:
  std::string path_;
  bool direct_;
  std::string filesystem_;
};

// Identifies one submitted request until it is waited for.
using AioTicket = uint64_t;

// Counters since the engine was created (all requests, all threads).
struct AioStats {
  uint64_t pieces = 0;                 // pieces submitted for the first time
  uint64_t io_submit_calls = 0;        // successful io_submit system calls
  uint64_t short_resubmits = 0;        // pieces resubmitted after a short transfer
  uint64_t retries = 0;                // EINTR/EAGAIN retried (io_submit, io_getevents, completions)
  uint64_t extend_preallocations = 0;  // writes past the end of file preallocated first (fallocate)
};

class AioEngine {
 public:
  static constexpr std::chrono::milliseconds kForever = std::chrono::milliseconds::max();

  virtual ~AioEngine() = default;

  // Opens `path`. Errors: NotFound (missing, kRead/kReadWrite), the errno text for anything else;
  // a filesystem without O_DIRECT is FailedPrecondition naming the path and filesystem type unless
  // allow_buffered_fallback. On error no file is left behind by kCreate.
  virtual Result<std::unique_ptr<AioFile>> Open(const std::string& path, AioOpenMode mode) = 0;

  // Starts reading `length` bytes at `offset` of `file` into `buffer` (or writing them from it).
  // REQUIRES: `file` and `buffer` stay valid and `buffer` is not touched until Wait for the ticket
  // returns something other than DeadlineExceeded. Alignment errors are returned here and nothing
  // is submitted; I/O errors come from Wait. length 0 is allowed (completes at once).
  // A direct write that ends past the end of the file fallocates that part first (extending
  // direct writes are synchronous on ext4 and xfs: io_submit would block for each piece); its
  // ENOSPC is reported by Wait like any I/O error. See docs/nvme.md "Benchmark".
  virtual Result<AioTicket> SubmitRead(AioFile& file, uint64_t offset, void* buffer, size_t length) = 0;
  virtual Result<AioTicket> SubmitWrite(AioFile& file, uint64_t offset, const void* buffer, size_t length) = 0;

  // Blocks until the request completes (or `timeout` passes: DeadlineExceeded, the request stays
  // in flight and may be waited for again). Returns its outcome: OK when every byte moved, else
  // the first error, naming the file, the failing piece's offset and length, and errno text:
  // ResourceExhausted (ENOSPC), DataLoss (end of file inside a read: the file is shorter than
  // expected), Internal (EIO and other errno). Each ticket is waited for (to a non-deadline
  // result) exactly once; an unknown ticket is NotFound. Thread-safe.
  virtual Status Wait(AioTicket ticket, std::chrono::milliseconds timeout = kForever) = 0;

  virtual AioStats stats() const = 0;
  virtual const AioOptions& options() const = 0;

  // Submit + Wait.
  Status Read(AioFile& file, uint64_t offset, void* buffer, size_t length);
  Status Write(AioFile& file, uint64_t offset, const void* buffer, size_t length);
};

// Makes the AioEngine a component does its I/O with (leveldb's Env pattern: the environment is
// passed in, never a global switch). Empty means the real one, LibaioEngine::Create(options); tests
// pass a factory that returns a FaultyAioEngine (which wraps a LibaioEngine) to inject faults.
using AioEngineFactory = std::function<Result<std::unique_ptr<AioEngine>>(const AioOptions& options)>;

// Checks the alignment rules for one request on `file`; InvalidArgument naming the path, the
// value at fault and the required multiple.
Status CheckAioAlignment(const AioFile& file, uint64_t offset, const void* buffer, size_t length);

// The filesystem type of the directory or file at `path` ("ext4", "tmpfs", ... or "0x<magic>");
// "unknown" when statfs fails.
std::string FilesystemType(const std::string& path);

// Probes whether files in `dir` can be opened with O_DIRECT (creates and removes a temporary
// file). OK, or FailedPrecondition naming dir and filesystem; errno errors for an unusable dir.
Status ProbeDirectIo(const std::string& dir);

}  // namespace zero
