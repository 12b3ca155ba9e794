// Crc32cFast: CRC32C (Castagnoli) with the SSE4.2 crc32 instruction, for checksumming swapped
// regions at memory speed. The same function as zero::Crc32c (engine/checkpoint_io.h, software,
// ~1 GB/s), chainable the same way; without SSE4.2 it falls back to a bytewise table.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zero {

uint32_t Crc32cFast(const void* data, size_t size, uint32_t crc = 0);

}  // namespace zero
