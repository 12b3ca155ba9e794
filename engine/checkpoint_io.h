// Checkpoint file I/O: crash-safe whole-file writes, and reads verified against a CRC32C
// (runtime/crc32c.h).
//
// A file is never visible half-written under its final name: AtomicFileWriter writes to
// `<path>.tmp.<pid>.<random>` in the same directory, fsyncs it, renames it over `<path>` and fsyncs
// the directory, so after Commit() returns the new contents survive a power loss, and a crash at
// any earlier point leaves whatever was at `<path>` before untouched (plus a `.tmp.` file that is
// debris, safe to delete). Every error names the file and what was wrong (missing, truncated with
// the expected and actual sizes, checksum mismatch with both values, errno text).
//
// This file owns only file descriptors it opens; it knows nothing of the checkpoint layout
// (checkpoint_format.h). All functions are thread-safe; an AtomicFileWriter is used by one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/status.h"

namespace zero {

// Writes one file atomically (see the header comment). Move-only; owns the temporary file's fd.
// Destroying a writer that was not committed closes and unlinks its temporary file.
class AtomicFileWriter {
 public:
  // Creates the temporary file next to `path`. The directory must exist.
  static Result<AtomicFileWriter> Open(const std::string& path);

  AtomicFileWriter(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();

  // Appends bytes (small appends are buffered; large ones go straight to the file). Updates crc().
  Status Append(const void* data, size_t size);
  Status Append(std::string_view data) { return Append(data.data(), data.size()); }
  // Flushes, fsyncs the file, renames it over the final path, fsyncs the directory. After an error
  // the temporary file is removed and the final path is unchanged. REQUIRES: not committed yet.
  Status Commit();

  // CRC32C and count of every byte appended so far.
  uint32_t crc() const { return crc_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }

  // Tests only: closes the file and leaves the temporary file in place without renaming it, as a
  // crash between writing and Commit() would.
  void AbandonForTest();

 private:
  AtomicFileWriter(std::string path, std::string temp_path, int fd);
  Status Flush();
  void Discard();

  std::string path_;
  std::string temp_path_;
  int fd_ = -1;
  std::string buffer_;
  uint32_t crc_ = 0;
  uint64_t size_ = 0;
  bool committed_ = false;
};

// Writes `contents` to `path` atomically.
Status WriteFileAtomic(const std::string& path, std::string_view contents);

// Every read below opens without blocking and refuses anything but a regular file (a named pipe,
// a directory, a device): FAILED_PRECONDITION "<path>: not a regular file (it is a named pipe); ...".
// A pipe in place of a checkpoint file used to hang the resume forever.

// Reads a whole file. Missing file: NOT_FOUND naming it.
Result<std::string> ReadFile(const std::string& path);

// Reads a whole file and checks its size and CRC32C: DATA_LOSS "<path>: truncated: expected N
// bytes, got M" (or "longer than expected"), "<path>: checksum mismatch: expected crc32c 0x...,
// got 0x...".
Result<std::string> ReadFileVerified(const std::string& path, uint64_t expected_size, uint32_t expected_crc);

// Reads `size` bytes at `offset` (pread). Fewer bytes available: DATA_LOSS "truncated".
Result<std::string> ReadFileRange(const std::string& path, uint64_t offset, size_t size);

// Size of a file in bytes (NOT_FOUND naming it when missing).
Result<uint64_t> FileSize(const std::string& path);
bool PathExists(const std::string& path);

// mkdir -p; each directory it creates is made durable (its parent is fsynced). Concurrent callers
// creating the same directory all succeed.
Status CreateDirectories(const std::string& path);
// fsync of a directory, so that names created or renamed in it are durable.
Status SyncDirectory(const std::string& dir);

// "a/b" + "c" -> "a/b/c" (no doubled slash).
std::string JoinPath(const std::string& a, const std::string& b);

// --- directories (the checkpoint save's staging and swap, checkpoint.h) -------------------------
// The names in `dir`, without "." and "..", sorted. Missing: NOT_FOUND naming it.
Result<std::vector<std::string>> ListDirectory(const std::string& dir);
// rm -rf of `path` (a file or a directory tree; symlinks are removed, not followed). A missing
// path is OK. Errors name the entry that could not be removed.
Status RemoveTree(const std::string& path);
// rename(2): `from` to `to` (same filesystem). Errors name both.
Status RenamePath(const std::string& from, const std::string& to);
// Atomically swaps two existing paths (renameat2 RENAME_EXCHANGE): after it, each name holds
// what the other held, and no moment exists where either name is missing. UNIMPLEMENTED when the
// kernel or filesystem cannot do it (the caller then falls back, see checkpoint_format.h).
Status ExchangePaths(const std::string& a, const std::string& b);

// --- the checkpoint directory's lock --------------------------------------------------------------
// An advisory lock (flock) on <dir>/.zero_lock saying that one job saves into `dir`: two jobs saving
// into one directory would remove each other's staging directories and overwrite each other's tags
// and `latest`. The save holds it on rank 0 (checkpoint.h); the Engine keeps holding it after its
// first save, and zero_train from the start of the job. Acquire in another process fails while a
// holder lives: FAILED_PRECONDITION naming the directory and the holder ("pid 1234 on host h", as
// it wrote into the file). Within one process acquisitions of the same directory share one lock
// (thread ranks in tests; zero_train's lock and the save's), released with the last holder. The
// kernel releases it when the holding process dies, however it dies. Thread-safe.
class DirectoryLock {
 public:
  // Creates `dir` when missing, then locks it.
  static Result<DirectoryLock> Acquire(const std::string& dir);

  DirectoryLock() = default;
  DirectoryLock(DirectoryLock&&) noexcept = default;
  DirectoryLock& operator=(DirectoryLock&&) noexcept = default;
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;
  ~DirectoryLock() = default;

  bool held() const { return held_ != nullptr; }

  struct Held;  // the open, flocked lock file (checkpoint_io.cc)

 private:
  explicit DirectoryLock(std::shared_ptr<Held> held) : held_(std::move(held)) {}
  std::shared_ptr<Held> held_;
};

// Creates `dir` when missing and creates and removes a file in it: the check that a save will be
// able to write there, made when a job starts rather than at its first save (access(2) says yes to
// root on a read-only filesystem; creating a file does not). Errors name the directory.
Status CheckWritableDirectory(const std::string& dir);

// The lock file's name inside a checkpoint directory.
inline constexpr const char* kDirectoryLockFile = ".zero_lock";

// --- crash points (tests only) --------------------------------------------------------------------
// The checkpoint save calls CrashPoint(name, rank) at named points of its protocol
// (checkpoint_format.h lists them). A test installs a hook that ends the process there (_exit in a
// fork()ed child) to leave the files exactly as a crash at that point would. No hook: nothing
// happens. The hook is process-wide; set it before starting ranks, not while a save runs.
using CrashPointHook = void (*)(const char* point, int rank);
void SetCrashPointHookForTest(CrashPointHook hook);
void CrashPoint(const char* point, int rank);

}  // namespace zero
