#include "runtime/file_system.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

namespace zero {
namespace {

void SetErr(int* err, int value) {
  if (err != nullptr) *err = value;
}

FileType TypeOf(mode_t mode) {
  if (S_ISREG(mode)) return FileType::kRegular;
  if (S_ISDIR(mode)) return FileType::kDirectory;
  if (S_ISLNK(mode)) return FileType::kSymlink;
  if (S_ISFIFO(mode)) return FileType::kNamedPipe;
  if (S_ISSOCK(mode)) return FileType::kSocket;
  if (S_ISCHR(mode)) return FileType::kCharacterDevice;
  if (S_ISBLK(mode)) return FileType::kBlockDevice;
  return FileType::kOther;
}

FileInfo InfoOf(const struct stat& st) {
  FileInfo info;
  info.type = TypeOf(st.st_mode);
  info.size = static_cast<uint64_t>(st.st_size);
  info.device = static_cast<uint64_t>(st.st_dev);
  info.inode = static_cast<uint64_t>(st.st_ino);
  return info;
}

Status NotRegular(const std::string& path, FileType type) {
  return FailedPreconditionError(path + ": not a regular file (it is " + FileTypeText(type) +
                                 "); checkpoint files are read only from regular files");
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
    return NotRegular(path, TypeOf(st.st_mode));
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }

  const std::string& path() const override { return path_; }

  Status Append(const void* data, size_t size) override {
    ZERO_RETURN_IF_ERROR(CheckOpen("write"));
    const char* p = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t n = ::write(fd_, p, size);
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoError("write", path_, errno);
      }
      p += n;
      size -= static_cast<size_t>(n);
    }
    return OkStatus();
  }

  Status Allocate(uint64_t size, int* err) override {
    SetErr(err, 0);
    ZERO_RETURN_IF_ERROR(CheckOpen("allocate"));
    const int e = ::posix_fallocate(fd_, 0, static_cast<off_t>(size));
    if (e == 0) return OkStatus();
    SetErr(err, e);
    return ErrnoError("allocate", path_, e);
  }

  Status Sync() override {
    ZERO_RETURN_IF_ERROR(CheckOpen("fsync"));
    if (::fsync(fd_) != 0) return ErrnoError("fsync", path_, errno);
    return OkStatus();
  }

  Result<FileInfo> Stat() override {
    ZERO_RETURN_IF_ERROR(CheckOpen("fstat"));
    struct stat st;
    if (::fstat(fd_, &st) != 0) return ErrnoError("fstat", path_, errno);
    return InfoOf(st);
  }

  Status Close() override {
    ZERO_RETURN_IF_ERROR(CheckOpen("close"));
    const int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) return ErrnoError("close", path_, errno);
    return OkStatus();
  }

 private:
  Status CheckOpen(const char* what) const {
    if (fd_ >= 0) return OkStatus();
    return FailedPreconditionError(std::string(what) + " " + path_ + ": the file is closed");
  }

  const std::string path_;
  int fd_;
};

class PosixFileLock final : public FileLock {
 public:
  PosixFileLock(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixFileLock() override { Release().IgnoreError(); }

  const std::string& path() const override { return path_; }

  Status Rewrite(std::string_view contents) override {
    if (::ftruncate(fd_, 0) != 0) return ErrnoError("truncate", path_, errno);
    if (::pwrite(fd_, contents.data(), contents.size(), 0) < 0) return ErrnoError("write", path_, errno);
    return OkStatus();
  }

  // Closing the descriptor releases the flock.
  Status Release() {
    if (fd_ < 0) return OkStatus();
    const int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) return ErrnoError("close", path_, errno);
    return OkStatus();
  }

 private:
  const std::string path_;
  int fd_;
};

void SetFailure(LockFileFailure* failure, LockFileFailure::Step step, int err) {
  if (failure != nullptr) *failure = LockFileFailure{step, err};
}

class PosixFileSystem final : public FileSystem {
 public:
  Result<std::unique_ptr<WritableFile>> CreateFile(const std::string& path, int mode, int* err) override {
    SetErr(err, 0);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0) {
      const int e = errno;
      SetErr(err, e);
      return ErrnoError("create", path, e);
    }
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd));
  }

  Result<std::string> ReadFile(const std::string& path) override {
    ZERO_ASSIGN_OR_RETURN(const int fd, OpenRegularFile(path));
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      return ErrnoError("stat", path, err);
    }
    std::string out;
    out.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < out.size()) {
      const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
      if (n < 0) {
        if (errno == EINTR) continue;
        const int err = errno;
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

  Result<std::string> ReadFileRange(const std::string& path, uint64_t offset, size_t size) override {
    ZERO_ASSIGN_OR_RETURN(const int fd, OpenRegularFile(path));
    std::string out(size, '\0');
    size_t got = 0;
    while (got < size) {
      const ssize_t n = ::pread(fd, out.data() + got, size - got, static_cast<off_t>(offset + got));
      if (n < 0) {
        if (errno == EINTR) continue;
        const int err = errno;
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

  Result<FileInfo> Stat(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return ErrnoError("stat", path, errno);
    return InfoOf(st);
  }

  Result<FileInfo> LinkStat(const std::string& path) override {
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) return ErrnoError("stat", path, errno);
    return InfoOf(st);
  }

  Status RemoveFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return ErrnoError("unlink", path, errno);
    return OkStatus();
  }

  Status CreateDirectory(const std::string& path, int* err) override {
    SetErr(err, 0);
    if (::mkdir(path.c_str(), 0755) == 0) return OkStatus();
    const int e = errno;
    SetErr(err, e);
    return ErrnoError("mkdir", path, e);
  }

  Status RemoveDirectory(const std::string& path) override {
    if (::rmdir(path.c_str()) != 0) return ErrnoError("rmdir", path, errno);
    return OkStatus();
  }

  Result<std::vector<std::string>> ListDirectory(const std::string& dir) override {
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

  Status SyncDirectory(const std::string& dir) override {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ErrnoError("open directory", dir, errno);
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    // Some filesystems refuse fsync on directories; the rename is still atomic there.
    if (rc != 0 && err != EINVAL && err != ENOTSUP) return ErrnoError("fsync directory", dir, err);
    return OkStatus();
  }

  Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) return ErrnoError("rename " + from + " to", to, errno);
    return OkStatus();
  }

  Status Exchange(const std::string& a, const std::string& b) override {
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

  Result<std::unique_ptr<FileLock>> LockFile(const std::string& path, LockFileFailure* failure) override {
    using Step = LockFileFailure::Step;
    SetFailure(failure, Step::kNone, 0);
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
    if (fd < 0) {
      const int err = errno;
      SetFailure(failure, Step::kOpen, err);
      return ErrnoError("open", path, err);
    }
    auto fail = [fd, failure](Step step, int err, Status st) {
      ::close(fd);
      SetFailure(failure, step, err);
      return st;
    };
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      return fail(Step::kOther, err, ErrnoError("stat", path, err));
    }
    if (!S_ISREG(st.st_mode)) {
      return fail(
          Step::kOther, 0,
          FailedPreconditionError(path + ": not a regular file (it is " + FileTypeText(TypeOf(st.st_mode)) + ")"));
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err == EWOULDBLOCK) {
        return fail(Step::kHeld, err, FailedPreconditionError("lock " + path + ": held by another process"));
      }
      return fail(Step::kOther, err, ErrnoError("flock", path, err));
    }
    return std::unique_ptr<FileLock>(new PosixFileLock(path, fd));
  }

  Status UnlockFile(std::unique_ptr<FileLock> lock) override {
    if (lock == nullptr) return OkStatus();
    return static_cast<PosixFileLock*>(lock.get())->Release();
  }

  void CrashPoint(const char* /*point*/, int /*rank*/) override {}
};

}  // namespace

const char* FileTypeText(FileType type) {
  switch (type) {
    case FileType::kDirectory:
      return "a directory";
    case FileType::kNamedPipe:
      return "a named pipe";
    case FileType::kSocket:
      return "a socket";
    case FileType::kCharacterDevice:
      return "a character device";
    case FileType::kBlockDevice:
      return "a block device";
    default:
      return "not a regular file";
  }
}

FileSystem* DefaultFileSystem() {
  static FileSystem* const fs = new PosixFileSystem();
  return fs;
}

std::string JoinPath(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (a.back() == '/') return a + b;
  return a + "/" + b;
}

std::string DirName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

bool PathExists(FileSystem& fs, const std::string& path) { return fs.Stat(path).ok(); }

Result<uint64_t> FileSize(FileSystem& fs, const std::string& path) {
  ZERO_ASSIGN_OR_RETURN(FileInfo info, fs.Stat(path));
  if (info.type != FileType::kRegular) return NotRegular(path, info.type);
  return info.size;
}

Status CreateDirectories(FileSystem& fs, const std::string& path) {
  if (path.empty()) return InvalidArgumentError("create directory: empty path");
  Result<FileInfo> info = fs.Stat(path);
  if (info.ok()) {
    if (info->type == FileType::kDirectory) return OkStatus();
    return FailedPreconditionError("create directory " + path + ": exists and is not a directory");
  }
  const std::string parent = DirName(path);
  if (parent != path && parent != "." && parent != "/") {
    ZERO_RETURN_IF_ERROR(CreateDirectories(fs, parent));
  }
  int err = 0;
  Status st = fs.CreateDirectory(path, &err);
  if (!st.ok()) {
    if (err == EEXIST) {
      info = fs.Stat(path);
      if (info.ok() && info->type == FileType::kDirectory) return OkStatus();  // a concurrent creator
    }
    return st;
  }
  return fs.SyncDirectory(parent);
}

Status RemoveTree(FileSystem& fs, const std::string& path) {
  Result<FileInfo> info = fs.LinkStat(path);
  if (!info.ok()) {
    if (info.status().code() == StatusCode::kNotFound) return OkStatus();
    return info.status();
  }
  if (info->type == FileType::kDirectory) {
    ZERO_ASSIGN_OR_RETURN(std::vector<std::string> names, fs.ListDirectory(path));
    for (const std::string& n : names) ZERO_RETURN_IF_ERROR(RemoveTree(fs, JoinPath(path, n)));
    Status st = fs.RemoveDirectory(path);
    if (!st.ok() && st.code() != StatusCode::kNotFound) return st;
    return OkStatus();
  }
  Status st = fs.RemoveFile(path);
  if (!st.ok() && st.code() != StatusCode::kNotFound) return st;
  return OkStatus();
}

}  // namespace zero
