#include "engine/checkpoint_io.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <mutex>
#include <utility>

namespace zero {

// --- the checkpoint directory's lock --------------------------------------------------------------

struct DirectoryLock::Held {
  int fd = -1;
  std::pair<dev_t, ino_t> key;
  ~Held();
};

namespace {

// This process's held locks by directory (device, inode), so that acquisitions in one process share
// one flock (a second flock on a new open file description would conflict with the first).
std::mutex g_locks_mu;
std::map<std::pair<dev_t, ino_t>, std::weak_ptr<DirectoryLock::Held>>& HeldLocks() {
  static auto* locks = new std::map<std::pair<dev_t, ino_t>, std::weak_ptr<DirectoryLock::Held>>();
  return *locks;
}

// The lock file is checked on its open descriptor (fstat), not by name; FileSystem::Stat is by name.
FileType TypeOfMode(mode_t mode) {
  if (S_ISREG(mode)) return FileType::kRegular;
  if (S_ISDIR(mode)) return FileType::kDirectory;
  if (S_ISFIFO(mode)) return FileType::kNamedPipe;
  if (S_ISSOCK(mode)) return FileType::kSocket;
  if (S_ISCHR(mode)) return FileType::kCharacterDevice;
  if (S_ISBLK(mode)) return FileType::kBlockDevice;
  return FileType::kOther;
}

std::string HostName() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) return "?";
  return host;
}

}  // namespace

DirectoryLock::Held::~Held() {
  {
    std::lock_guard<std::mutex> lock(g_locks_mu);
    auto it = HeldLocks().find(key);
    if (it != HeldLocks().end() && it->second.expired()) HeldLocks().erase(it);
  }
  if (fd >= 0) ::close(fd);  // releases the flock
}

Status CheckWritableDirectory(const std::string& dir) {
  ZERO_RETURN_IF_ERROR(CreateDirectories(dir));
  const std::string probe = JoinPath(dir, ".zero_write_check." + std::to_string(::getpid()));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return ErrnoError("create a file in the checkpoint directory", dir, errno);
  ::close(fd);
  if (::unlink(probe.c_str()) != 0) return ErrnoError("remove", probe, errno);
  return OkStatus();
}

Result<DirectoryLock> DirectoryLock::Acquire(const std::string& dir) {
  ZERO_RETURN_IF_ERROR(CreateDirectories(dir));
  struct stat ds;
  if (::stat(dir.c_str(), &ds) != 0) return ErrnoError("stat", dir, errno);
  const std::pair<dev_t, ino_t> key{ds.st_dev, ds.st_ino};
  std::lock_guard<std::mutex> lock(g_locks_mu);
  if (auto held = HeldLocks()[key].lock()) return DirectoryLock(std::move(held));
  const std::string path = JoinPath(dir, kDirectoryLockFile);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  if (fd < 0) {
    return ErrnoError("open the checkpoint directory's lock file (is the directory writable?)", path, errno);
  }
  // Until it is locked the descriptor is closed by hand: a Held destroyed here would take g_locks_mu.
  auto fail = [fd](Status st) {
    ::close(fd);
    return st;
  };
  struct stat fs;
  if (::fstat(fd, &fs) != 0) return fail(ErrnoError("stat", path, errno));
  if (!S_ISREG(fs.st_mode)) {
    return fail(
        FailedPreconditionError(path + ": not a regular file (it is " + FileTypeText(TypeOfMode(fs.st_mode)) + ")"));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err != EWOULDBLOCK) return fail(ErrnoError("flock", path, err));
    char buf[256] = {};
    const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
    std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "another process";
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    return fail(FailedPreconditionError(
        "checkpoint directory " + dir + " is in use by another job (" + holder + " holds " + path +
        "): two jobs saving into one directory would remove each other's staging directories and "
        "overwrite each other's checkpoints and `latest`; give each job its own directory"));
  }
  auto held = std::make_shared<Held>();
  held->fd = fd;
  held->key = key;
  const std::string me = "pid " + std::to_string(::getpid()) + " on host " + HostName() + "\n";
  if (::ftruncate(fd, 0) == 0) {
    if (::pwrite(fd, me.data(), me.size(), 0) < 0) {
      // The holder's name is only for the other job's message; the lock is what matters.
    }
  }
  HeldLocks()[key] = held;
  return DirectoryLock(std::move(held));
}

}  // namespace zero
