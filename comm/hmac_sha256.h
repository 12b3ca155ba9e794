// The TcpStore's cryptography (tcp_store.h's challenge-response), all of it OpenSSL's libcrypto:
// SHA-256 and HMAC-SHA256 (RFC 2104) one-shot, a comparison of MACs in constant time
// (CRYPTO_memcmp) and nonces from OpenSSL's CSPRNG (RAND_bytes). Nothing here is written by hand;
// this file only adapts libcrypto's calls to strings and Status. Every function is safe to call
// from several threads at once (OpenSSL 3's RAND_bytes and HMAC are).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "runtime/status.h"

namespace zero {

using Sha256Digest = std::array<uint8_t, 32>;

// SHA-256 (FIPS 180-4) of `data`.
Sha256Digest Sha256Of(std::string_view data);
// HMAC-SHA256 (RFC 2104 / RFC 4231) of `message` under `key` (any length, empty included).
Sha256Digest HmacSha256(std::string_view key, std::string_view message);

// Lower-case hex of `bytes` (for tests and secrets).
std::string ToHex(const uint8_t* bytes, size_t n);
inline std::string ToHex(const Sha256Digest& d) { return ToHex(d.data(), d.size()); }

// True when a and b have the same length and bytes; for equal lengths the time depends only on the
// length (CRYPTO_memcmp), so a MAC comparison does not tell where the first difference is.
bool ConstantTimeEqual(std::string_view a, std::string_view b);

// Replaces *out with `n` bytes from OpenSSL's CSPRNG (RAND_bytes; seeded from the kernel's).
// INTERNAL naming OpenSSL's error when the generator cannot give them (*out is then unspecified).
Status RandomBytes(size_t n, std::string* out);

}  // namespace zero
