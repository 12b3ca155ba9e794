// AlignedBuffer: host memory whose address and size are multiples of an alignment, for O_DIRECT.
//
// Owns its memory (posix_memalign, freed on destruction); move-only. The size is the requested
// size rounded up to the alignment, zero-filled, so a tensor of any byte count can be swapped
// through its padded size. Page-aligned memory can later be pinned for the GPU (cudaHostRegister)
// by its user; this file does not.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/status.h"

namespace zero {

// Rounds `n` up to a multiple of `alignment` (a power of two).
inline constexpr uint64_t AlignUp(uint64_t n, uint64_t alignment) { return (n + alignment - 1) & ~(alignment - 1); }

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // `alignment`: a power of two and a multiple of sizeof(void*) (default 4096). Errors:
  // InvalidArgument for a bad alignment, ResourceExhausted naming the size when allocation fails.
  static Result<AlignedBuffer> Allocate(size_t size, size_t alignment = 4096);

  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer();

  void* data() { return data_; }
  const void* data() const { return data_; }
  uint8_t* bytes() { return static_cast<uint8_t*>(data_); }
  const uint8_t* bytes() const { return static_cast<const uint8_t*>(data_); }
  // The padded size (a multiple of alignment()).
  size_t size() const { return size_; }
  size_t alignment() const { return alignment_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
  size_t alignment_ = 0;
};

}  // namespace zero
