#include "nvme/aio_engine.h"

#include <fcntl.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace zero {

Status ValidateAioOptions(const AioOptions& o) {
  if (o.block_size <= 0 || o.block_size % static_cast<int64_t>(kAioAlignment) != 0) {
    return InvalidArgumentError("aio.block_size: expected a positive multiple of " + std::to_string(kAioAlignment) +
                                ", got " + std::to_string(o.block_size));
  }
  if (o.queue_depth < 1 || o.queue_depth > 65536) {
    return InvalidArgumentError("aio.queue_depth: expected 1..65536, got " + std::to_string(o.queue_depth));
  }
  if (o.intra_op_parallelism < 1 || o.intra_op_parallelism > 1024) {
    return InvalidArgumentError("aio.intra_op_parallelism: expected 1..1024, got " +
                                std::to_string(o.intra_op_parallelism));
  }
  if (o.reap_timeout.count() <= 0) {
    return InvalidArgumentError("aio reap_timeout: expected > 0 ms, got " + std::to_string(o.reap_timeout.count()));
  }
  return OkStatus();
}

Status CheckAioAlignment(const AioFile& file, uint64_t offset, const void* buffer, size_t length) {
  const std::string a = std::to_string(kAioAlignment);
  if (offset % kAioAlignment != 0) {
    return InvalidArgumentError("aio " + file.path() + ": offset " + std::to_string(offset) + " is not a multiple of " +
                                a + " (direct I/O alignment)");
  }
  if (length % kAioAlignment != 0) {
    return InvalidArgumentError("aio " + file.path() + ": length " + std::to_string(length) + " is not a multiple of " +
                                a + " (direct I/O alignment; pad the buffer, see AlignedBuffer)");
  }
  if (reinterpret_cast<uintptr_t>(buffer) % kAioAlignment != 0) {
    char addr[32];
    std::snprintf(addr, sizeof(addr), "%p", buffer);
    return InvalidArgumentError("aio " + file.path() + ": buffer address " + addr + " is not a multiple of " + a +
                                " (direct I/O alignment; allocate it with AlignedBuffer)");
  }
  return OkStatus();
}

std::string FilesystemType(const std::string& path) {
  struct statfs s;
  if (::statfs(path.c_str(), &s) != 0) return "unknown";
  const auto magic = static_cast<uint64_t>(s.f_type);
  switch (magic) {
    case 0xEF53:
      return "ext4";  // ext2/3/4 share the magic
    case 0x58465342:
      return "xfs";
    case 0x9123683E:
      return "btrfs";
    case 0x01021994:
      return "tmpfs";
    case 0x858458F6:
      return "ramfs";
    case 0x794C7630:
      return "overlayfs";
    case 0x6969:
      return "nfs";
    case 0xF2F52010:
      return "f2fs";
    case 0x2FC12FC1:
      return "zfs";
    case 0x65735546:
      return "fuse";
    case 0x01021997:
      return "9p";
    default:
      break;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(magic));
  return buf;
}

Status ProbeDirectIo(const std::string& dir) {
  static std::atomic<int> counter{0};
  const std::string path = dir + "/.zero_odirect_probe." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int err = errno;
    ::unlink(path.c_str());
    if (err == EINVAL) {
      return FailedPreconditionError("direct I/O probe in " + dir + ": the filesystem (" + FilesystemType(dir) +
                                     ") does not support O_DIRECT");
    }
    return ErrnoError("direct I/O probe: create", path, err);
  }
  void* buf = nullptr;
  Status st;
  if (::posix_memalign(&buf, kAioAlignment, kAioAlignment) != 0) {
    st = ResourceExhaustedError("direct I/O probe: no memory for a 4 KiB buffer");
  } else {
    std::memset(buf, 0, kAioAlignment);
    ssize_t n = ::pwrite(fd, buf, kAioAlignment, 0);
    if (n < 0) {
      const int err = errno;
      st = err == EINVAL ? FailedPreconditionError("direct I/O probe in " + dir + ": the filesystem (" +
                                                   FilesystemType(dir) + ") refuses O_DIRECT writes")
                         : ErrnoError("direct I/O probe: write", path, err);
    }
    std::free(buf);
  }
  ::close(fd);
  ::unlink(path.c_str());
  return st;
}

Status AioEngine::Read(AioFile& file, uint64_t offset, void* buffer, size_t length) {
  ZERO_ASSIGN_OR_RETURN(AioTicket t, SubmitRead(file, offset, buffer, length));
  return Wait(t);
}

Status AioEngine::Write(AioFile& file, uint64_t offset, const void* buffer, size_t length) {
  ZERO_ASSIGN_OR_RETURN(AioTicket t, SubmitWrite(file, offset, buffer, length));
  return Wait(t);
}

}  // namespace zero
