#include "comm/tcp_socket.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>

#include <cerrno>

namespace zero::net {

using Clock = std::chrono::steady_clock;

int RemainingMs(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return left > 1000000000 ? 1000000000 : static_cast<int>(left);
}

void SetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

std::string SockaddrHost(const sockaddr_storage& a) {
  char buf[INET6_ADDRSTRLEN] = {};
  const void* p = a.ss_family == AF_INET
                      ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(&a)->sin_addr)
                      : static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(&a)->sin6_addr);
  if (inet_ntop(a.ss_family, p, buf, sizeof(buf)) == nullptr) return "?";
  return buf;
}

int SockaddrPort(const sockaddr_storage& a) {
  return a.ss_family == AF_INET ? ntohs(reinterpret_cast<const sockaddr_in*>(&a)->sin_port)
                                : ntohs(reinterpret_cast<const sockaddr_in6*>(&a)->sin6_port);
}

std::string HostPort(const std::string& host, int port) {
  return host.find(':') != std::string::npos ? "[" + host + "]:" + std::to_string(port)
                                             : host + ":" + std::to_string(port);
}

Io SendAll(int fd, const char* p, size_t n, Clock::time_point deadline, int* err) {
  size_t sent = 0;
  while (sent < n) {
    ssize_t w = send(fd, p + sent, n - sent, MSG_NOSIGNAL);
    if (w > 0) {
      sent += static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd pf{fd, POLLOUT, 0};
      if (poll(&pf, 1, RemainingMs(deadline)) == 0) return Io::kTimeout;
      continue;
    }
    *err = errno;
    return Io::kError;
  }
  return Io::kOk;
}

Io RecvExact(int fd, char* p, size_t n, Clock::time_point deadline, int* err) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = recv(fd, p + got, n - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return Io::kClosed;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      pollfd pf{fd, POLLIN, 0};
      if (poll(&pf, 1, RemainingMs(deadline)) == 0) return Io::kTimeout;
      continue;
    }
    *err = errno;
    return Io::kError;
  }
  return Io::kOk;
}

}  // namespace zero::net
