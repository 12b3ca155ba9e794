#include "engine/checkpoint/io.h"

#include <unistd.h>

#include <map>
#include <mutex>
#include <utility>

namespace zero {

// --- the checkpoint directory's lock --------------------------------------------------------------

struct DirectoryLock::Held {
  FileSystem* fs = nullptr;
  std::unique_ptr<FileLock> lock;
  std::pair<uint64_t, uint64_t> key;  // the directory's (device, inode)
  ~Held();
};

namespace {

// This process's held locks by directory (device, inode), so that acquisitions in one process share
// one flock (a second flock on a new open file description would conflict with the first).
std::mutex g_locks_mu;
std::map<std::pair<uint64_t, uint64_t>, std::weak_ptr<DirectoryLock::Held>>& HeldLocks() {
  static auto* locks = new std::map<std::pair<uint64_t, uint64_t>, std::weak_ptr<DirectoryLock::Held>>();
  return *locks;
}

std::string HostName() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) return "?";
  return host;
}

// What the holder wrote into the lock file (at most 255 bytes, trailing newlines and spaces
// dropped), or "another process".
std::string HolderOf(FileSystem& fs, const std::string& path) {
  auto contents = fs.ReadFile(path);
  std::string holder = contents.ok() && !contents->empty() ? contents->substr(0, 255) : "another process";
  while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
  return holder;
}

}  // namespace

DirectoryLock::Held::~Held() {
  {
    std::lock_guard<std::mutex> lock(g_locks_mu);
    auto it = HeldLocks().find(key);
    if (it != HeldLocks().end() && it->second.expired()) HeldLocks().erase(it);
  }
  if (lock != nullptr) fs->UnlockFile(std::move(lock)).IgnoreError();  // releases the flock
}

Status CheckWritableDirectory(const std::string& dir, FileSystem* fs) {
  fs = FileSystemOrDefault(fs);
  ZERO_RETURN_IF_ERROR(CreateDirectories(*fs, dir));
  const std::string probe = JoinPath(dir, ".zero_write_check." + std::to_string(::getpid()));
  int err = 0;
  auto file = fs->CreateFile(probe, 0600, &err);
  if (!file.ok()) {
    if (err == 0) return file.status();
    return ErrnoError("create a file in the checkpoint directory", dir, err);
  }
  (*file)->Close().IgnoreError();
  if (Status st = fs->RemoveFile(probe); !st.ok()) {
    // FileSystem::RemoveFile says "unlink <probe>: ..."; this check has always said "remove".
    const std::string unlink_prefix = "unlink ";
    std::string message = st.message();
    if (message.compare(0, unlink_prefix.size(), unlink_prefix) == 0)
      message = "remove " + message.substr(unlink_prefix.size());
    return Status(st.code(), std::move(message));
  }
  return OkStatus();
}

Result<DirectoryLock> DirectoryLock::Acquire(const std::string& dir, FileSystem* fs) {
  fs = FileSystemOrDefault(fs);
  ZERO_RETURN_IF_ERROR(CreateDirectories(*fs, dir));
  ZERO_ASSIGN_OR_RETURN(const FileInfo dir_info, fs->Stat(dir));
  const std::pair<uint64_t, uint64_t> key{dir_info.device, dir_info.inode};
  std::lock_guard<std::mutex> guard(g_locks_mu);
  if (auto held = HeldLocks()[key].lock()) return DirectoryLock(std::move(held));
  const std::string path = JoinPath(dir, kDirectoryLockFile);
  LockFileFailure failure;
  auto lock = fs->LockFile(path, &failure);
  if (!lock.ok()) {
    switch (failure.step) {
      case LockFileFailure::Step::kOpen:
        return ErrnoError("open the checkpoint directory's lock file (is the directory writable?)", path, failure.err);
      case LockFileFailure::Step::kHeld:
        return FailedPreconditionError(
            "checkpoint directory " + dir + " is in use by another job (" + HolderOf(*fs, path) + " holds " + path +
            "): two jobs saving into one directory would remove each other's staging directories and "
            "overwrite each other's checkpoints and `latest`; give each job its own directory");
      default:
        return lock.status();
    }
  }
  // Constructed under g_locks_mu: a Held destroyed here would take it again, so none is until the end.
  auto held = std::make_shared<Held>();
  held->fs = fs;
  held->lock = std::move(lock).value();
  held->key = key;
  const std::string me = "pid " + std::to_string(::getpid()) + " on host " + HostName() + "\n";
  // The holder's name is only for the other job's message; the lock is what matters.
  held->lock->Rewrite(me).IgnoreError();
  HeldLocks()[key] = held;
  return DirectoryLock(std::move(held));
}

}  // namespace zero
