// Socket utilities of the TcpStore (its client and its server): deadlines in poll(2)'s
// milliseconds, TCP_NODELAY, printable socket addresses, and blocking-with-deadline I/O on a
// non-blocking socket. Knows nothing of the store's protocol (tcp_store_protocol.h) and owns no
// descriptor: every fd is the caller's.
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <string>

namespace zero::net {

// Milliseconds left until `deadline`, for poll(2): 0 once it has passed, at most 1e9.
int RemainingMs(std::chrono::steady_clock::time_point deadline);

// Sets TCP_NODELAY (the store's requests and replies are small and latency-bound); errors ignored.
void SetNoDelay(int fd);

// The numeric host of an AF_INET or AF_INET6 address ("?" if it cannot be printed), and its port.
std::string SockaddrHost(const sockaddr_storage& a);
int SockaddrPort(const sockaddr_storage& a);

// "host:port", or "[host]:port" for an IPv6 literal.
std::string HostPort(const std::string& host, int port);

// The outcome of SendAll and RecvExact: kClosed is an orderly shutdown by the peer; kError leaves
// errno's value in *err.
enum class Io { kOk, kTimeout, kClosed, kError };

// Sends all `n` bytes (MSG_NOSIGNAL), polling while the socket's buffer is full, until `deadline`.
Io SendAll(int fd, const char* p, size_t n, std::chrono::steady_clock::time_point deadline, int* err);
// Receives exactly `n` bytes, polling while none are ready, until `deadline`.
Io RecvExact(int fd, char* p, size_t n, std::chrono::steady_clock::time_point deadline, int* err);

}  // namespace zero::net
