#include "nvme/aligned_buffer.h"

#include <cstdlib>
#include <cstring>
#include <utility>

namespace zero {

Result<AlignedBuffer> AlignedBuffer::Allocate(size_t size, size_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment % sizeof(void*) != 0) {
    return InvalidArgumentError("aligned buffer: alignment " + std::to_string(alignment) +
                                " is not a power of two multiple of " + std::to_string(sizeof(void*)));
  }
  AlignedBuffer b;
  b.alignment_ = alignment;
  b.size_ = AlignUp(size, alignment);
  if (b.size_ == 0) return b;
  int rc = ::posix_memalign(&b.data_, alignment, b.size_);
  if (rc != 0) {
    b.data_ = nullptr;
    return ResourceExhaustedError("aligned buffer: cannot allocate " + std::to_string(b.size_) + " bytes aligned to " +
                                  std::to_string(alignment) + ": " + std::strerror(rc));
  }
  std::memset(b.data_, 0, b.size_);
  return b;
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)), alignment_(o.alignment_) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  if (this != &o) {
    std::free(data_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    alignment_ = o.alignment_;
  }
  return *this;
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

}  // namespace zero
