#include "comm/tcp_store_protocol.h"

#include <cstring>

#include "comm/hmac_sha256.h"

namespace zero::tcp_store_protocol {

void AppendU64(std::string* out, uint64_t v) {
  char b[8];
  std::memcpy(b, &v, 8);
  out->append(b, 8);
}

uint64_t ReadU64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

std::string EncodeRequest(uint8_t cmd, const std::vector<std::string>& fields) {
  std::string frame;
  frame.push_back(static_cast<char>(cmd));
  uint32_t n = static_cast<uint32_t>(fields.size());
  frame.append(reinterpret_cast<const char*>(&n), 4);
  for (const auto& f : fields) {
    AppendU64(&frame, f.size());
    frame.append(f);
  }
  return frame;
}

std::string Mac(const std::string& secret, const char* context, const std::string& server_nonce,
                const std::string& client_nonce) {
  Sha256Digest d = HmacSha256(secret, context + server_nonce + client_nonce);
  return std::string(reinterpret_cast<const char*>(d.data()), d.size());
}

}  // namespace zero::tcp_store_protocol
