// Test helpers for nvme/: a scratch directory on a filesystem that supports O_DIRECT, and small
// mounted filesystems (tmpfs of a fixed size, ramfs, read-only, a loop-mounted ext4) made inside it when the test may
// mount (root in the container); each is unmounted and removed by its owner.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "nvme/aligned_buffer.h"
#include "runtime/status.h"

// Assertions on Status / Result (gtest), for nvme/'s tests.
#define ASSERT_OK(expr)                      \
  do {                                       \
    const ::zero::Status _st = (expr);       \
    ASSERT_TRUE(_st.ok()) << _st.ToString(); \
  } while (0)

#define ASSERT_OK_AND_ASSIGN(lhs, expr)                        \
  auto ZERO_STATUS_CONCAT(_r, __LINE__) = (expr);              \
  ASSERT_TRUE(ZERO_STATUS_CONCAT(_r, __LINE__).ok())           \
      << ZERO_STATUS_CONCAT(_r, __LINE__).status().ToString(); \
  lhs = std::move(ZERO_STATUS_CONCAT(_r, __LINE__)).value()

namespace zero {

// `size` bytes (aligned, as AlignedBuffer::Allocate pads them) of pseudo-random data from `seed`.
AlignedBuffer Pattern(size_t size, uint32_t seed);

// A fresh directory for one test under ZERO_TEST_TMPDIR, TEST_TMPDIR, /var/tmp or the working
// directory: the first whose filesystem accepts O_DIRECT. Removed (recursively) by the owner.
class ScratchDir {
 public:
  static Result<ScratchDir> Create(const std::string& name);
  ScratchDir(ScratchDir&& o) noexcept : path_(std::move(o.path_)) { o.path_.clear(); }
  ScratchDir(const ScratchDir&) = delete;
  ~ScratchDir();
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  explicit ScratchDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

// A filesystem mounted at a new directory `dir` (mount(2)); unmounted and the directory removed by
// the owner. Create fails (the caller skips with the message) when mounting is not permitted.
class ScopedMount {
 public:
  // fstype "tmpfs" or "ramfs"; options as for mount -o ("size=1m", "ro", ...).
  static Result<ScopedMount> Create(const std::string& dir, const std::string& fstype,
                                    const std::string& options, bool read_only = false);
  // A real disk filesystem of a fixed size (O_DIRECT works, unlike ramfs): an ext4 of `bytes` made
  // in the image file `image` (mkfs.ext4) and loop-mounted at `dir` (mount -o loop). The owner
  // unmounts it (the loop device is released with it) and removes the image. Fails, naming the
  // step, where mkfs.ext4 or loop mounting is missing or not permitted.
  static Result<ScopedMount> CreateExt4Image(const std::string& dir, const std::string& image,
                                             uint64_t bytes);
  ScopedMount(ScopedMount&& o) noexcept
      : dir_(std::move(o.dir_)), image_(std::move(o.image_)) {
    o.dir_.clear();
    o.image_.clear();
  }
  ScopedMount(const ScopedMount&) = delete;
  ~ScopedMount();
  const std::string& dir() const { return dir_; }

 private:
  explicit ScopedMount(std::string dir, std::string image = "")
      : dir_(std::move(dir)), image_(std::move(image)) {}
  std::string dir_;
  std::string image_;  // CreateExt4Image: removed after the unmount
};

}  // namespace zero
