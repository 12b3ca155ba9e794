// The TcpStore's wire protocol, as its client and its server both speak it: the command and reply
// codes, the handshake's greetings, sizes and HMAC contexts, the little-endian u64 fields, the
// nonces and the handshake's proofs. tcp_store.h documents the format; this file holds it once so
// the two sides cannot drift. No I/O (tcp_socket.h) and no state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace zero::tcp_store_protocol {

// Requests: u8 command, u32 field count, per field u64 length + bytes.
constexpr uint8_t kSet = 1;   // key, value
constexpr uint8_t kGet = 2;   // key
constexpr uint8_t kWait = 3;  // 1..kMaxFields keys
constexpr uint8_t kPing = 4;  // no fields
constexpr uint32_t kMaxFields = 64;
// Replies: u8 code, u64 length + bytes.
constexpr uint8_t kReplyOk = 0;
constexpr uint8_t kReplyMalformed = 1;
constexpr uint8_t kReplyOverLimit = 2;

// The handshake: greeting + server nonce; client nonce + client proof; verdict byte + server proof.
constexpr size_t kNonceBytes = 32;
constexpr size_t kMacBytes = 32;
constexpr char kHello[8] = {'Z', 'S', 'T', 'O', 'R', 'E', '1', '\0'};
constexpr char kBusy[8] = {'Z', 'S', 'T', 'B', 'U', 'S', 'Y', '\0'};
constexpr char kClientContext[] = "zero-tcpstore-v1 client";
constexpr char kServerContext[] = "zero-tcpstore-v1 server";

// Appends `v` as 8 bytes in the host's order, which the format takes to be little-endian.
void AppendU64(std::string* out, uint64_t v);
// The 8 bytes at `p` as a u64.
uint64_t ReadU64(const char* p);

// A request's bytes: `cmd`, the field count, then each field's length and bytes.
std::string EncodeRequest(uint8_t cmd, const std::vector<std::string>& fields);

// A handshake proof: HMAC-SHA256(secret, context || server_nonce || client_nonce), 32 bytes.
std::string Mac(const std::string& secret, const char* context, const std::string& server_nonce,
                const std::string& client_nonce);

}  // namespace zero::tcp_store_protocol
