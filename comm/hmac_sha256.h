// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), self-contained, for the TcpStore's
// challenge-response (tcp_store.h). Not a general crypto library: no streaming HMAC, no other
// hashes. ConstantTimeEqual compares MACs without leaking where they first differ.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace zero {

using Sha256Digest = std::array<uint8_t, 32>;

// Incremental SHA-256: Update any number of times, then Final once (the object is then spent).
class Sha256 {
 public:
  Sha256();
  void Update(const void* data, size_t bytes);
  void Update(std::string_view s) { Update(s.data(), s.size()); }
  Sha256Digest Final();

 private:
  void Block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_bytes_ = 0;
};

Sha256Digest Sha256Of(std::string_view data);
Sha256Digest HmacSha256(std::string_view key, std::string_view message);

// Lower-case hex of `bytes` (for tests and secrets).
std::string ToHex(const uint8_t* bytes, size_t n);
inline std::string ToHex(const Sha256Digest& d) { return ToHex(d.data(), d.size()); }

// True when a and b have the same length and bytes; time depends only on the length.
bool ConstantTimeEqual(std::string_view a, std::string_view b);

}  // namespace zero
