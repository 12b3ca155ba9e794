#include "engine/checkpoint_io.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <utility>

#include "runtime/crc32c.h"

namespace zero {
namespace {

// Appends stay in a user-space buffer up to this size; bigger ones are written directly.
constexpr size_t kBufferSize = 1 << 20;

Status WriteAll(int fd, const char* data, size_t size, const std::string& path) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("write", path, errno);
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return OkStatus();
}

std::string DirName(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

const char* FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a named pipe";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

// Opens `path` for reading. O_NONBLOCK: opening a named pipe with no writer would otherwise block
// forever (and reading one without data too); anything but a regular file is refused, naming it.
// Regular files ignore O_NONBLOCK; it is cleared all the same.
Result<int> OpenRegularFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return ErrnoError("open", path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError("stat", path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return FailedPreconditionError(path + ": not a regular file (it is " + FileKind(st.st_mode) +
                                   "); checkpoint files are read only from regular files");
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

uint64_t RandomSuffix() {
  static thread_local std::mt19937_64 gen([] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(::getpid());
  }());
  return gen();
}

}  // namespace

// --- AtomicFileWriter ------------------------------------------------------------------------

AtomicFileWriter::AtomicFileWriter(std::string path, std::string temp_path, int fd)
    : path_(std::move(path)), temp_path_(std::move(temp_path)), fd_(fd) {}

Result<AtomicFileWriter> AtomicFileWriter::Open(const std::string& path) {
  for (int attempt = 0; attempt < 8; ++attempt) {
    char suffix[64];
    std::snprintf(suffix, sizeof(suffix), ".tmp.%d.%016llx", static_cast<int>(::getpid()),
                  static_cast<unsigned long long>(RandomSuffix()));
    std::string temp = path + suffix;
    int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) return AtomicFileWriter(path, temp, fd);
    if (errno != EEXIST) return ErrnoError("create", temp, errno);
  }
  return InternalError("create " + path + ".tmp.*: no free temporary name after 8 attempts");
}

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& o) noexcept
    : path_(std::move(o.path_)),
      temp_path_(std::move(o.temp_path_)),
      fd_(o.fd_),
      buffer_(std::move(o.buffer_)),
      crc_(o.crc_),
      size_(o.size_),
      committed_(o.committed_) {
  o.fd_ = -1;
  o.committed_ = true;  // the moved-from writer owns nothing to discard
}

AtomicFileWriter& AtomicFileWriter::operator=(AtomicFileWriter&& o) noexcept {
  if (this != &o) {
    Discard();
    path_ = std::move(o.path_);
    temp_path_ = std::move(o.temp_path_);
    fd_ = o.fd_;
    buffer_ = std::move(o.buffer_);
    crc_ = o.crc_;
    size_ = o.size_;
    committed_ = o.committed_;
    o.fd_ = -1;
    o.committed_ = true;
  }
  return *this;
}

AtomicFileWriter::~AtomicFileWriter() { Discard(); }

void AtomicFileWriter::Discard() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  if (!committed_ && !temp_path_.empty()) ::unlink(temp_path_.c_str());
  committed_ = true;
}

void AtomicFileWriter::AbandonForTest() {
  if (fd_ >= 0) {
    Flush().IgnoreError();
    ::close(fd_);
    fd_ = -1;
  }
  committed_ = true;  // keep the temporary file, as a crash would
}

Status AtomicFileWriter::Flush() {
  if (buffer_.empty()) return OkStatus();
  Status st = WriteAll(fd_, buffer_.data(), buffer_.size(), temp_path_);
  buffer_.clear();
  return st;
}

Status AtomicFileWriter::Append(const void* data, size_t size) {
  if (fd_ < 0) return FailedPreconditionError("append to " + path_ + ": writer is closed");
  crc_ = Crc32c(data, size, crc_);
  size_ += size;
  const char* p = static_cast<const char*>(data);
  if (buffer_.size() + size <= kBufferSize) {
    buffer_.append(p, size);
    return OkStatus();
  }
  Status st = Flush();
  if (st.ok()) st = WriteAll(fd_, p, size, temp_path_);
  if (!st.ok()) Discard();
  return st;
}

Status AtomicFileWriter::Commit() {
  if (fd_ < 0 || committed_) return FailedPreconditionError("commit " + path_ + ": writer is closed");
  Status st = Flush();
  if (st.ok() && ::fsync(fd_) != 0) st = ErrnoError("fsync", temp_path_, errno);
  if (st.ok()) {
    int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) st = ErrnoError("close", temp_path_, errno);
  }
  if (st.ok() && ::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    st = ErrnoError("rename " + temp_path_ + " to", path_, errno);
  }
  if (!st.ok()) {
    Discard();
    return st;
  }
  committed_ = true;
  return SyncDirectory(DirName(path_));
}

// --- whole files -------------------------------------------------------------------------------

Status WriteFileAtomic(const std::string& path, std::string_view contents) {
  ZERO_ASSIGN_OR_RETURN(AtomicFileWriter w, AtomicFileWriter::Open(path));
  ZERO_RETURN_IF_ERROR(w.Append(contents));
  return w.Commit();
}

Result<std::string> ReadFile(const std::string& path) {
  ZERO_ASSIGN_OR_RETURN(const int fd, OpenRegularFile(path));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoError("stat", path, err);
  }
  std::string out;
  out.resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < out.size()) {
    ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return ErrnoError("read", path, err);
    }
    if (n == 0) break;  // shrank while reading
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  out.resize(got);
  return out;
}

Result<std::string> ReadFileVerified(const std::string& path, uint64_t expected_size, uint32_t expected_crc) {
  ZERO_ASSIGN_OR_RETURN(std::string data, ReadFile(path));
  if (data.size() < expected_size) {
    return DataLossError(path + ": truncated: expected " + std::to_string(expected_size) + " bytes, got " +
                         std::to_string(data.size()));
  }
  if (data.size() > expected_size) {
    return DataLossError(path + ": longer than expected: expected " + std::to_string(expected_size) + " bytes, got " +
                         std::to_string(data.size()));
  }
  uint32_t crc = Crc32c(data.data(), data.size());
  if (crc != expected_crc) {
    return DataLossError(path + ": checksum mismatch: expected crc32c " + Crc32cHex(expected_crc) + ", got " +
                         Crc32cHex(crc) + " (the file is corrupt)");
  }
  return data;
}

Result<std::string> ReadFileRange(const std::string& path, uint64_t offset, size_t size) {
  ZERO_ASSIGN_OR_RETURN(const int fd, OpenRegularFile(path));
  std::string out(size, '\0');
  size_t got = 0;
  while (got < size) {
    ssize_t n = ::pread(fd, out.data() + got, size - got, static_cast<off_t>(offset + got));
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return ErrnoError("read", path, err);
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  if (got < size) {
    return DataLossError(path + ": truncated: expected " + std::to_string(offset + size) + " bytes, got " +
                         std::to_string(offset + got));
  }
  return out;
}

Result<uint64_t> FileSize(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoError("stat", path, errno);
  if (!S_ISREG(st.st_mode)) {
    return FailedPreconditionError(path + ": not a regular file (it is " + FileKind(st.st_mode) +
                                   "); checkpoint files are read only from regular files");
  }
  return static_cast<uint64_t>(st.st_size);
}

bool PathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

Status SyncDirectory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open directory", dir, errno);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some filesystems refuse fsync on directories; the rename is still atomic there.
  if (rc != 0 && err != EINVAL && err != ENOTSUP) return ErrnoError("fsync directory", dir, err);
  return OkStatus();
}

Status CreateDirectories(const std::string& path) {
  if (path.empty()) return InvalidArgumentError("create directory: empty path");
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return OkStatus();
    return FailedPreconditionError("create directory " + path + ": exists and is not a directory");
  }
  std::string parent = DirName(path);
  if (parent != path && parent != "." && parent != "/") {
    ZERO_RETURN_IF_ERROR(CreateDirectories(parent));
  }
  if (::mkdir(path.c_str(), 0755) != 0) {
    if (errno == EEXIST && ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return OkStatus();
    return ErrnoError("mkdir", path, errno);
  }
  return SyncDirectory(parent);
}

std::string JoinPath(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (a.back() == '/') return a + b;
  return a + "/" + b;
}

// --- directories ---------------------------------------------------------------------------------

Result<std::vector<std::string>> ListDirectory(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return ErrnoError("open directory", dir, errno);
  std::vector<std::string> names;
  while (struct dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(std::move(name));
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

Status RemoveTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return OkStatus();
    return ErrnoError("stat", path, errno);
  }
  if (S_ISDIR(st.st_mode)) {
    ZERO_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(path));
    for (const std::string& n : names) ZERO_RETURN_IF_ERROR(RemoveTree(JoinPath(path, n)));
    if (::rmdir(path.c_str()) != 0 && errno != ENOENT) return ErrnoError("rmdir", path, errno);
    return OkStatus();
  }
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoError("unlink", path, errno);
  return OkStatus();
}

Status RenamePath(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    return ErrnoError("rename " + from + " to", to, errno);
  }
  return OkStatus();
}

Status ExchangePaths(const std::string& a, const std::string& b) {
#if defined(SYS_renameat2)
  constexpr unsigned kRenameExchange = 1u << 1;  // RENAME_EXCHANGE (linux/fs.h)
  if (::syscall(SYS_renameat2, AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), kRenameExchange) == 0) {
    return OkStatus();
  }
  const int err = errno;
  if (err == EINVAL || err == ENOSYS || err == ENOTSUP || err == EOPNOTSUPP) {
    return UnimplementedError("exchange " + a + " and " + b + ": renameat2(RENAME_EXCHANGE) is not supported here (" +
                              std::strerror(err) + ")");
  }
  return ErrnoError("exchange " + a + " and", b, err);
#else
  return UnimplementedError("exchange " + a + " and " + b + ": no renameat2 on this system");
#endif
}

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
    return fail(FailedPreconditionError(path + ": not a regular file (it is " + FileKind(fs.st_mode) + ")"));
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

// --- crash points ---------------------------------------------------------------------------------

namespace {
std::atomic<CrashPointHook> g_crash_hook{nullptr};
}  // namespace

void SetCrashPointHookForTest(CrashPointHook hook) { g_crash_hook.store(hook); }

void CrashPoint(const char* point, int rank) {
  CrashPointHook hook = g_crash_hook.load();
  if (hook != nullptr) hook(point, rank);
}

}  // namespace zero
