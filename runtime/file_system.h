// FileSystem: every plain file operation of the checkpoint code (engine/checkpoint_*.h) and of the
// NVMe swap files (nvme/swap_file.h) goes through this interface, as leveldb's Env: the POSIX one
// (DefaultFileSystem) in production, a FaultyFileSystem (faulty_file_system.h) in the fault tests,
// which fails chosen calls with an errno and ends the process at named crash points, so that no
// test switch lives in library code. O_DIRECT swap I/O is not here: it stays on the AioEngine.
//
// A FileSystem owns nothing beyond the descriptors it opens: each is closed before a call returns,
// except a WritableFile's, which the WritableFile owns. Every method is thread-safe and reports a
// failed system call as ErrnoError (status.h) naming the call and the path, "open /x/y: No such
// file or directory (errno 2)" (NOT_FOUND for ENOENT). Out-parameters are left as they were on
// failure. A call either did all it says or, where the system call failed, nothing more than that
// call did (a failed Append may have written part of its bytes).
//
// Below the interface: the helpers built on it (path names, CreateDirectories, RemoveTree, the
// regular-file size). runtime/atomic_file.h builds the crash-safe whole-file write and the
// checksummed read on it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/status.h"

namespace zero {

enum class FileType { kRegular, kDirectory, kSymlink, kNamedPipe, kSocket, kCharacterDevice, kBlockDevice, kOther };

// For messages "<path>: not a regular file (it is <text>)": "a directory", "a named pipe", "a
// socket", "a character device", "a block device"; anything else "not a regular file".
const char* FileTypeText(FileType type);

struct FileInfo {
  FileType type = FileType::kOther;
  uint64_t size = 0;
  // Together they name the file (stat's st_dev and st_ino).
  uint64_t device = 0;
  uint64_t inode = 0;
};

// A file created for writing (FileSystem::CreateFile). Owns its descriptor; the destructor closes
// it when still open (an error is lost then: call Close to see it). Used by one thread at a time.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  WritableFile() = default;
  WritableFile(const WritableFile&) = delete;
  WritableFile& operator=(const WritableFile&) = delete;

  virtual const std::string& path() const = 0;
  // Writes all `size` bytes at the end of the file (short writes are continued). "write <path>".
  virtual Status Append(const void* data, size_t size) = 0;
  // posix_fallocate of [0, size): the blocks are reserved, so running out of space shows here.
  // `err`, when not null, receives the errno of a failure (0 on success) for callers that choose
  // their message by it (a full disk). "allocate <path>".
  virtual Status Allocate(uint64_t size, int* err) = 0;
  // fsync. "fsync <path>".
  virtual Status Sync() = 0;
  // fstat of the open file (not of whatever `path` names later). "fstat <path>".
  virtual Result<FileInfo> Stat() = 0;
  // Closes the descriptor; later calls fail with FAILED_PRECONDITION. "close <path>".
  virtual Status Close() = 0;
};

// A file locked by FileSystem::LockFile. Owns the open descriptor that holds the lock: the lock lasts
// until FileSystem::UnlockFile, the destructor, or the end of the process however it ends (the
// kernel releases it). Used by one thread at a time.
class FileLock {
 public:
  virtual ~FileLock() = default;
  FileLock() = default;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

  virtual const std::string& path() const = 0;
  // Replaces the file's contents with `contents` (ftruncate, then pwrite at 0): what a holder writes
  // for another process's message. "truncate <path>" / "write <path>".
  virtual Status Rewrite(std::string_view contents) = 0;
};

// Why FileSystem::LockFile failed, for a caller that words its own message.
struct LockFileFailure {
  enum class Step {
    kNone,   // it did not fail
    kOpen,   // open(2) of the file failed: `err`
    kHeld,   // another open of the file holds the lock (`err` is EWOULDBLOCK)
    kOther,  // fstat or flock failed (`err`), or the path is not a regular file (`err` 0)
  };
  Step step = Step::kNone;
  int err = 0;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;

  // --- files -----------------------------------------------------------------------------------
  // Creates `path` for writing with permission bits `mode`; fails when it exists (O_EXCL), so two
  // creators never share a file. "create <path>". `err`, when not null, receives the errno of a
  // failure (0 on success): EEXIST for a taken name, EACCES / EROFS for a directory that cannot
  // take a file.
  virtual Result<std::unique_ptr<WritableFile>> CreateFile(const std::string& path, int mode, int* err) = 0;
  // Reads a whole file. Opens without blocking and refuses anything but a regular file (a named
  // pipe with no writer would otherwise hang the caller forever): FAILED_PRECONDITION "<path>: not
  // a regular file (it is a named pipe); checkpoint files are read only from regular files".
  virtual Result<std::string> ReadFile(const std::string& path) = 0;
  // Reads `size` bytes at `offset` (same refusal). Fewer available: DATA_LOSS "<path>: truncated:
  // expected <offset + size> bytes, got <end>".
  virtual Result<std::string> ReadFileRange(const std::string& path, uint64_t offset, size_t size) = 0;
  // stat(2), following symbolic links ("stat <path>"; NOT_FOUND when missing).
  virtual Result<FileInfo> Stat(const std::string& path) = 0;
  // lstat(2): a symbolic link is reported as one.
  virtual Result<FileInfo> LinkStat(const std::string& path) = 0;
  // unlink(2) of a file or symbolic link. "unlink <path>" (NOT_FOUND when missing).
  virtual Status RemoveFile(const std::string& path) = 0;

  // --- directories -----------------------------------------------------------------------------
  // mkdir(2) with mode 0755; the parent must exist. "mkdir <path>"; `err` as for CreateFile
  // (EEXIST when the name is taken).
  virtual Status CreateDirectory(const std::string& path, int* err) = 0;
  // rmdir(2) of an empty directory. "rmdir <path>" (NOT_FOUND when missing).
  virtual Status RemoveDirectory(const std::string& path) = 0;
  // The names in `dir`, without "." and "..", sorted. "open directory <dir>".
  virtual Result<std::vector<std::string>> ListDirectory(const std::string& dir) = 0;
  // fsync of a directory, so that names created or renamed in it are durable. Filesystems that
  // refuse fsync on a directory (EINVAL, ENOTSUP) count as success: their renames are atomic still.
  virtual Status SyncDirectory(const std::string& dir) = 0;

  // --- names -----------------------------------------------------------------------------------
  // rename(2) of `from` to `to` (one filesystem). "rename <from> to <to>".
  virtual Status Rename(const std::string& from, const std::string& to) = 0;
  // Swaps two existing paths atomically (renameat2 RENAME_EXCHANGE): after it each name holds what
  // the other held, and no moment exists where either is missing. UNIMPLEMENTED when the kernel
  // or the filesystem cannot (the caller then falls back to two renames); "exchange <a> and <b>".
  virtual Status Exchange(const std::string& a, const std::string& b) = 0;

  // --- locks (leveldb's Env::LockFile) ---------------------------------------------------------
  // Opens `path` read-write, creating it (mode 0644) when missing, without following a final
  // symbolic link or blocking, refuses anything but a regular file, and takes an exclusive advisory
  // lock on it (flock LOCK_EX | LOCK_NB) without waiting. The lock belongs to this open: a second
  // LockFile of the same file is refused while the first is held, from this process too (a caller
  // that shares one lock among its threads keeps its own table). Errors: "open <path>",
  // "stat <path>", FAILED_PRECONDITION "<path>: not a regular file (it is a directory)", another
  // holder FAILED_PRECONDITION "lock <path>: held by another process" (the file is left as it is;
  // its contents may name the holder), "flock <path>". `failure`, when not null, says which.
  virtual Result<std::unique_ptr<FileLock>> LockFile(const std::string& path, LockFileFailure* failure) = 0;
  // Releases the lock and closes the file, which stays (leveldb's Env::UnlockFile). The lock is
  // released even when closing reports an error ("close <path>").
  virtual Status UnlockFile(std::unique_ptr<FileLock> lock) = 0;

  // --- crash points ----------------------------------------------------------------------------
  // A protocol built on this interface (the checkpoint save, engine/checkpoint/directory.h) calls
  // this at its named points. Nothing happens on the POSIX file system; a FaultyFileSystem may end
  // the process there to leave the files exactly as a crash at that point would.
  virtual void CrashPoint(const char* point, int rank) = 0;
};

// The POSIX file system: a process-wide object, never destroyed.
FileSystem* DefaultFileSystem();
// `fs`, or DefaultFileSystem() when null (the convention of every `FileSystem* fs = nullptr`).
inline FileSystem* FileSystemOrDefault(FileSystem* fs) { return fs != nullptr ? fs : DefaultFileSystem(); }

// --- helpers built on the interface -------------------------------------------------------------

// "a/b" + "c" -> "a/b/c" (no doubled slash).
std::string JoinPath(const std::string& a, const std::string& b);
// The directory part: "a/b/c" -> "a/b", "c" -> ".", "/c" -> "/".
std::string DirName(const std::string& path);

// Whether `path` names anything (Stat succeeds).
bool PathExists(FileSystem& fs, const std::string& path);
// Size of a regular file. NOT_FOUND naming it when missing; FAILED_PRECONDITION "<path>: not a
// regular file (it is ...)" for anything else.
Result<uint64_t> FileSize(FileSystem& fs, const std::string& path);
// mkdir -p; each directory it creates is made durable (its parent is synced). Concurrent callers
// creating the same directory all succeed. FAILED_PRECONDITION when a component is not a directory.
Status CreateDirectories(FileSystem& fs, const std::string& path);
// rm -rf of `path` (a file or a directory tree; symbolic links are removed, not followed). A missing
// path is OK. Errors name the entry that could not be removed.
Status RemoveTree(FileSystem& fs, const std::string& path);

}  // namespace zero
