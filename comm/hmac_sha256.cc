#include "comm/hmac_sha256.h"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <climits>

namespace zero {
namespace {

// OpenSSL's oldest queued error as text ("error:...:reason"), or "no OpenSSL error queued".
std::string OpenSslErrorText() {
  const unsigned long e = ERR_get_error();
  if (e == 0) return "no OpenSSL error queued";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  ERR_clear_error();
  return buf;
}

// A non-null pointer for an empty view (OpenSSL may refuse a null key or message).
const unsigned char* Bytes(std::string_view s) {
  static const unsigned char kNothing = 0;
  return s.empty() ? &kNothing : reinterpret_cast<const unsigned char*>(s.data());
}

}  // namespace

Sha256Digest Sha256Of(std::string_view data) {
  Sha256Digest out;
  unsigned int len = 0;
  // Fails only when OpenSSL cannot allocate its context: not an input error.
  ZERO_CHECK_MSG(
      EVP_Digest(Bytes(data), data.size(), out.data(), &len, EVP_sha256(), nullptr) == 1 && len == out.size(),
      "EVP_Digest(SHA-256) failed: " + OpenSslErrorText());
  return out;
}

Sha256Digest HmacSha256(std::string_view key, std::string_view message) {
  ZERO_CHECK_MSG(key.size() <= static_cast<size_t>(INT_MAX), "HMAC key of " + std::to_string(key.size()) + " bytes");
  Sha256Digest out;
  unsigned int len = 0;
  const unsigned char* mac =
      HMAC(EVP_sha256(), Bytes(key), static_cast<int>(key.size()), Bytes(message), message.size(), out.data(), &len);
  ZERO_CHECK_MSG(mac != nullptr && len == out.size(), "HMAC(SHA-256) failed: " + OpenSslErrorText());
  return out;
}

std::string ToHex(const uint8_t* bytes, size_t n) {
  static const char kDigits[] = "0123456789abcdef";
  std::string s;
  s.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    s.push_back(kDigits[bytes[i] >> 4]);
    s.push_back(kDigits[bytes[i] & 15]);
  }
  return s;
}

bool ConstantTimeEqual(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  return a.empty() || CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

Status RandomBytes(size_t n, std::string* out) {
  out->resize(n);
  unsigned char* p = reinterpret_cast<unsigned char*>(out->data());
  for (size_t done = 0; done < n;) {
    const int chunk = static_cast<int>(std::min<size_t>(n - done, INT_MAX));
    if (RAND_bytes(p + done, chunk) != 1) {
      return InternalError("OpenSSL's RAND_bytes could not give " + std::to_string(n) +
                           " random bytes: " + OpenSslErrorText());
    }
    done += static_cast<size_t>(chunk);
  }
  return OkStatus();
}

}  // namespace zero
