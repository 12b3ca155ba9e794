// FaultyFileSystem: a FileSystem wrapper that injects failures and crashes, for the fault tests of
// the checkpoint code and the swap files (leveldb's fault-injection Env; FaultyDevice and
// FaultyAioEngine do the same for Device and AioEngine).
//
// Forwards every call to the wrapped FileSystem, except that (1) a call of a named operation fails
// with an errno when its 1-based call count reaches the armed N (once, or that call and every later
// one when `persistent`), with the message the POSIX file system would write for that errno and
// nothing done on the wrapped one; (2) Exchange can be turned off, answering UNIMPLEMENTED as on a
// filesystem without RENAME_EXCHANGE, so the callers' fallback runs; (3) the process can be made to
// end (_exit, no destructors, no flushing) at a named crash point of one rank, which leaves the
// files exactly as a kill there would (run the code under test in a fork()ed child). Operation
// names are the method names: "CreateFile", "ReadFile", "ReadFileRange", "Stat", "LinkStat",
// "RemoveFile", "CreateDirectory", "RemoveDirectory", "ListDirectory", "SyncDirectory", "Rename",
// "Exchange", "LockFile", "UnlockFile", and of the files it creates "Append", "Allocate", "Sync",
// "FileStat" (their Stat), "Close" (counted over all of them). An errno injected into LockFile reads
// as flock's: EWOULDBLOCK as another holder ("lock <path>: held by another process"), any other as
// "flock <path>"; an injected UnlockFile failure still releases the lock, as close(2) does. The
// wrapped FileSystem must outlive the wrapper and the files and locks it created. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/file_system.h"
#include "runtime/status.h"

namespace zero {

class FaultyFileSystem final : public FileSystem {
 public:
  // Wraps `inner` (DefaultFileSystem() when null), which must outlive this object.
  explicit FaultyFileSystem(FileSystem* inner = nullptr);
  FaultyFileSystem(const FaultyFileSystem&) = delete;
  FaultyFileSystem& operator=(const FaultyFileSystem&) = delete;

  // The `nth` (1-based, counted from creation; see call_count) call of `op` fails with errno
  // `err`. With `persistent`, every later call fails too. Re-arming an op replaces its rule.
  void FailNthCall(const std::string& op, int64_t nth, int err, bool persistent = false);
  // Exchange answers UNIMPLEMENTED (as without renameat2) while disabled.
  void SetExchangeSupported(bool supported);
  // Reaching crash point `point` on `rank` ends the process with `exit_code` (_exit).
  void ExitAtCrashPoint(const std::string& point, int rank, int exit_code);
  void ClearFaults();  // removes every rule, the crash point, and re-enables Exchange; counts stay

  // Calls of `op` made so far (including failed ones).
  int64_t call_count(const std::string& op) const;
  // The crash points reached so far, as "point@rank", in order.
  std::vector<std::string> crash_points_reached() const;
  FileSystem* inner() const { return inner_; }

  Result<std::unique_ptr<WritableFile>> CreateFile(const std::string& path, int mode, int* err) override;
  Result<std::string> ReadFile(const std::string& path) override;
  Result<std::string> ReadFileRange(const std::string& path, uint64_t offset, size_t size) override;
  Result<FileInfo> Stat(const std::string& path) override;
  Result<FileInfo> LinkStat(const std::string& path) override;
  Status RemoveFile(const std::string& path) override;
  Status CreateDirectory(const std::string& path, int* err) override;
  Status RemoveDirectory(const std::string& path) override;
  Result<std::vector<std::string>> ListDirectory(const std::string& dir) override;
  Status SyncDirectory(const std::string& dir) override;
  Status Rename(const std::string& from, const std::string& to) override;
  Status Exchange(const std::string& a, const std::string& b) override;
  Result<std::unique_ptr<FileLock>> LockFile(const std::string& path, LockFileFailure* failure) override;
  Status UnlockFile(std::unique_ptr<FileLock> lock) override;
  void CrashPoint(const char* point, int rank) override;

 private:
  class File;  // a created file's wrapper (faulty_file_system.cc)
  // Counts a call of `op`; returns the errno to inject (0: none).
  int Enter(const char* op);

  struct Rule {
    int64_t nth = 0;
    int err = 0;
    bool persistent = false;
  };

  FileSystem* const inner_;
  mutable std::mutex mu_;
  std::map<std::string, int64_t> counts_;    // GUARDED_BY(mu_)
  std::map<std::string, Rule> rules_;        // GUARDED_BY(mu_)
  bool exchange_supported_ = true;           // GUARDED_BY(mu_)
  std::string exit_point_;                   // GUARDED_BY(mu_); empty: none
  int exit_rank_ = 0;                        // GUARDED_BY(mu_)
  int exit_code_ = 0;                        // GUARDED_BY(mu_)
  std::vector<std::string> points_reached_;  // GUARDED_BY(mu_)
};

}  // namespace zero
