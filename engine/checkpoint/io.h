// Checkpoint file I/O: the checkpoint directory's lock, and shorthands of runtime/file_system.h
// and runtime/atomic_file.h on the POSIX file system (DefaultFileSystem) for code that has no
// FileSystem to pass (tools, examples, tests reading what a save wrote).
//
// The file layer itself lives in runtime/: the FileSystem interface (leveldb's Env), the atomic
// write and the checksummed read; the checkpoint code (checkpoint_*.h) takes a `FileSystem* fs`
// (null: the POSIX one) and calls it, so that fault tests pass a FaultyFileSystem. Every error
// names the file and what was wrong (missing, truncated with the expected and actual sizes,
// checksum mismatch with both values, errno text).
//
// This file owns only the lock file's FileLock; it knows nothing of the checkpoint layout
// (checkpoint_format.h). All functions are thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/atomic_file.h"
#include "runtime/file_system.h"
#include "runtime/status.h"

namespace zero {

// --- shorthands on DefaultFileSystem() (see runtime/file_system.h for the contracts) ------------
inline Status WriteFileAtomic(const std::string& path, std::string_view contents) {
  return WriteFileAtomic(*DefaultFileSystem(), path, contents);
}
inline Result<std::string> ReadFile(const std::string& path) { return DefaultFileSystem()->ReadFile(path); }
inline Result<std::string> ReadFileVerified(const std::string& path, uint64_t expected_size, uint32_t expected_crc) {
  return ReadFileVerified(*DefaultFileSystem(), path, expected_size, expected_crc);
}
inline Result<std::string> ReadFileRange(const std::string& path, uint64_t offset, size_t size) {
  return DefaultFileSystem()->ReadFileRange(path, offset, size);
}
inline Result<uint64_t> FileSize(const std::string& path) { return FileSize(*DefaultFileSystem(), path); }
inline bool PathExists(const std::string& path) { return PathExists(*DefaultFileSystem(), path); }
inline Status CreateDirectories(const std::string& path) { return CreateDirectories(*DefaultFileSystem(), path); }
inline Status SyncDirectory(const std::string& dir) { return DefaultFileSystem()->SyncDirectory(dir); }
inline Result<std::vector<std::string>> ListDirectory(const std::string& dir) {
  return DefaultFileSystem()->ListDirectory(dir);
}
inline Status RemoveTree(const std::string& path) { return RemoveTree(*DefaultFileSystem(), path); }
inline Status RenamePath(const std::string& from, const std::string& to) {
  return DefaultFileSystem()->Rename(from, to);
}
inline Status ExchangePaths(const std::string& a, const std::string& b) { return DefaultFileSystem()->Exchange(a, b); }

// --- the checkpoint directory's lock --------------------------------------------------------------
// An advisory lock (flock) on <dir>/.zero_lock saying that one job saves into `dir`: two jobs saving
// into one directory would remove each other's staging directories and overwrite each other's tags
// and `latest`. The save holds it on rank 0 (checkpoint.h); the Engine keeps holding it after its
// first save, and zero_train from the start of the job. Acquire in another process fails while a
// holder lives: FAILED_PRECONDITION naming the directory and the holder ("pid 1234 on host h", as
// it wrote into the file). Within one process acquisitions of the same directory share one lock
// (thread ranks in tests; zero_train's lock and the save's), released with the last holder. The
// kernel releases it when the holding process dies, however it dies. The lock is the FileSystem's
// LockFile (runtime/file_system.h). Thread-safe.
class DirectoryLock {
 public:
  // Creates `dir` when missing, then locks it through `fs` (null: the POSIX one), which must outlive
  // the lock (a later Acquire in this process shares the first one's lock, and its FileSystem).
  static Result<DirectoryLock> Acquire(const std::string& dir, FileSystem* fs = nullptr);

  DirectoryLock() = default;
  DirectoryLock(DirectoryLock&&) noexcept = default;
  DirectoryLock& operator=(DirectoryLock&&) noexcept = default;
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;
  ~DirectoryLock() = default;

  bool held() const { return held_ != nullptr; }

  struct Held;  // the FileLock on the lock file (checkpoint_io.cc)

 private:
  explicit DirectoryLock(std::shared_ptr<Held> held) : held_(std::move(held)) {}
  std::shared_ptr<Held> held_;
};

// Creates `dir` when missing and creates and removes a file in it: the check that a save will be
// able to write there, made when a job starts rather than at its first save (access(2) says yes to
// root on a read-only filesystem; creating a file does not). Errors name the directory. Through `fs`
// (null: the POSIX one).
Status CheckWritableDirectory(const std::string& dir, FileSystem* fs = nullptr);

// The lock file's name inside a checkpoint directory.
inline constexpr const char* kDirectoryLockFile = ".zero_lock";

}  // namespace zero
