// Test helpers for nvme/: pseudo-random aligned buffers, and small mounted filesystems (tmpfs of a
// fixed size, ramfs, read-only, a loop-mounted ext4) made inside a scratch directory
// (testing/scratch_dir.h, CreateWithDirectIo) when the test may mount (root in the container); each
// is unmounted and removed by its owner.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "nvme/aligned_buffer.h"
#include "runtime/status.h"

namespace zero {

// `size` bytes (aligned, as AlignedBuffer::Allocate pads them) of pseudo-random data from `seed`.
AlignedBuffer Pattern(size_t size, uint32_t seed);

// A filesystem mounted at a new directory `dir` (mount(2)); unmounted and the directory removed by
// the owner. Create fails (the caller skips with the message) when mounting is not permitted.
class ScopedMount {
 public:
  // fstype "tmpfs" or "ramfs"; options as for mount -o ("size=1m", "ro", ...).
  static Result<ScopedMount> Create(const std::string& dir, const std::string& fstype, const std::string& options,
                                    bool read_only = false);
  // A real disk filesystem of a fixed size (O_DIRECT works, unlike ramfs): an ext4 of `bytes` made
  // in the image file `image` (mkfs.ext4) and loop-mounted at `dir` (mount -o loop). The owner
  // unmounts it (the loop device is released with it) and removes the image. Fails, naming the
  // step, where mkfs.ext4 or loop mounting is missing or not permitted.
  static Result<ScopedMount> CreateExt4Image(const std::string& dir, const std::string& image, uint64_t bytes);
  ScopedMount(ScopedMount&& o) noexcept : dir_(std::move(o.dir_)), image_(std::move(o.image_)) {
    o.dir_.clear();
    o.image_.clear();
  }
  ScopedMount(const ScopedMount&) = delete;
  ~ScopedMount();
  const std::string& dir() const { return dir_; }

 private:
  explicit ScopedMount(std::string dir, std::string image = "") : dir_(std::move(dir)), image_(std::move(image)) {}
  std::string dir_;
  std::string image_;  // CreateExt4Image: removed after the unmount
};

}  // namespace zero
