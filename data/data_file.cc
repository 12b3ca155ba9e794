#include "data/data_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "runtime/file_system.h"
#include "runtime/scoped_fd.h"

namespace zero::data {
namespace {

FileType TypeOf(mode_t mode) {
  if (S_ISREG(mode)) return FileType::kRegular;
  if (S_ISDIR(mode)) return FileType::kDirectory;
  if (S_ISFIFO(mode)) return FileType::kNamedPipe;
  if (S_ISSOCK(mode)) return FileType::kSocket;
  if (S_ISCHR(mode)) return FileType::kCharacterDevice;
  if (S_ISBLK(mode)) return FileType::kBlockDevice;
  return FileType::kOther;
}

std::string Named(const std::string& flag, const std::string& path) { return flag.empty() ? path : flag + " " + path; }

Status NotRegular(const std::string& flag, const std::string& path, mode_t mode, const std::string& expected) {
  const FileType type = TypeOf(mode);
  const std::string what = type == FileType::kOther
                               ? std::string("not a regular file")
                               : std::string("not a regular file (it is ") + FileTypeText(type) + ")";
  return InvalidArgumentError(Named(flag, path) + ": " + what + "; expected " + expected);
}

Status OpenFailed(const std::string& flag, const std::string& path, int err, const std::string& expected) {
  if (err == ENOENT) return NotFoundError(Named(flag, path) + ": no such file; expected " + expected);
  return ErrnoError("open", Named(flag, path), err);
}

}  // namespace

Status CheckDataFile(const std::string& flag, const std::string& path, const std::string& expected) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return OpenFailed(flag, path, errno, expected);
  if (!S_ISREG(st.st_mode)) return NotRegular(flag, path, st.st_mode, expected);
  return OkStatus();
}

Result<std::string> ReadDataFile(const std::string& flag, const std::string& path, const std::string& expected) {
  // O_NONBLOCK: a named pipe without a writer would block the open (and its read) forever.
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (fd.get() < 0) return OpenFailed(flag, path, errno, expected);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoError("stat", Named(flag, path), errno);
  if (!S_ISREG(st.st_mode)) return NotRegular(flag, path, st.st_mode, expected);
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::read(fd.get(), out.data() + got, out.size() - got);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return ErrnoError("read", Named(flag, path), errno);
    }
    if (n == 0) break;  // shrank while reading
    got += static_cast<size_t>(n);
  }
  out.resize(got);
  return out;
}

}  // namespace zero::data
