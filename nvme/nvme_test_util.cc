#include "nvme/nvme_test_util.h"

#include <random>

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

namespace zero {

Result<ScopedMount> ScopedMount::Create(const std::string& dir, const std::string& fstype, const std::string& options,
                                        bool read_only) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return ErrnoError("mkdir", dir, errno);
  }
  unsigned long flags = read_only ? MS_RDONLY : 0;
  if (::mount("zero_test", dir.c_str(), fstype.c_str(), flags, options.c_str()) != 0) {
    const int err = errno;
    ::rmdir(dir.c_str());
    return FailedPreconditionError("mount -t " + fstype + " -o " + options + " at " + dir +
                                   " not permitted here: " + std::strerror(err));
  }
  return ScopedMount(dir);
}

namespace {

// The first of `candidates` that exists and is executable, or "".
std::string FindTool(std::initializer_list<const char*> candidates) {
  for (const char* c : candidates) {
    if (::access(c, X_OK) == 0) return c;
  }
  return "";
}

}  // namespace

Result<ScopedMount> ScopedMount::CreateExt4Image(const std::string& dir, const std::string& image, uint64_t bytes) {
  const std::string mkfs = FindTool({"/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4", "/usr/bin/mkfs.ext4"});
  const std::string mount = FindTool({"/usr/bin/mount", "/bin/mount", "/usr/sbin/mount"});
  if (mkfs.empty() || mount.empty()) {
    return FailedPreconditionError("loop-mounted ext4 at " + dir + ": mkfs.ext4 or mount not found");
  }
  {
    const int fd = ::open(image.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return ErrnoError("create image", image, errno);
    const int rc = ::ftruncate(fd, static_cast<off_t>(bytes));
    const int err = errno;
    ::close(fd);
    if (rc != 0) return ErrnoError("ftruncate image", image, err);
  }
  const std::string mk = mkfs + " -q -F " + image + " >/dev/null 2>&1";
  if (std::system(mk.c_str()) != 0) {
    ::unlink(image.c_str());
    return FailedPreconditionError("loop-mounted ext4 at " + dir + ": '" + mk + "' failed");
  }
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    ::unlink(image.c_str());
    return ErrnoError("mkdir", dir, errno);
  }
  const std::string mt = mount + " -o loop " + image + " " + dir + " >/dev/null 2>&1";
  if (std::system(mt.c_str()) != 0) {
    ::rmdir(dir.c_str());
    ::unlink(image.c_str());
    return FailedPreconditionError("loop-mounted ext4 at " + dir + ": '" + mt +
                                   "' failed (no loop devices, or mounting not permitted here)");
  }
  return ScopedMount(dir, image);
}

ScopedMount::~ScopedMount() {
  if (dir_.empty()) return;
  // A plain unmount first (it releases a loop device at once); lazily if something still uses it.
  if (::umount2(dir_.c_str(), 0) != 0) ::umount2(dir_.c_str(), MNT_DETACH);
  ::rmdir(dir_.c_str());
  if (!image_.empty()) ::unlink(image_.c_str());
}

AlignedBuffer Pattern(size_t size, uint32_t seed) {
  auto b = AlignedBuffer::Allocate(size);
  ZERO_CHECK(b.ok());
  std::mt19937 gen(seed);
  for (size_t i = 0; i < b->size(); ++i) b->bytes()[i] = static_cast<uint8_t>(gen());
  return std::move(b).value();
}

}  // namespace zero
