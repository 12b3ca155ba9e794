// CRC32C (Castagnoli, the iSCSI/ext4 polynomial): the one checksum of checkpoint files, their
// metadata and NVMe swap regions. With SSE4.2 (the build's -march=x86-64-v2 has it) it runs on the
// crc32 instruction at memory speed; without it, a software slice-by-8 with the same values, so a
// file written by either build is read by the other. Pure functions of their arguments: no state,
// no resources, safe from any thread. What to checksum and where to store it is the caller's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace zero {

// Chainable: Crc32c(b, nb, Crc32c(a, na)) == Crc32c(a followed by b).
// Crc32c("123456789", 9) == 0xE3069283.
uint32_t Crc32c(const void* data, size_t size, uint32_t crc = 0);

// "0x1a2b3c4d" (8 hex digits), as checkpoint files and messages print checksums.
std::string Crc32cHex(uint32_t crc);

// The software path Crc32c takes without SSE4.2 (same values). Declared so that its test runs on
// a machine with SSE4.2 too; everything else calls Crc32c.
uint32_t Crc32cSoftware(const void* data, size_t size, uint32_t crc = 0);

}  // namespace zero
