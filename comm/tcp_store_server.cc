#include "comm/tcp_store_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "comm/hmac_sha256.h"
#include "comm/tcp_socket.h"
#include "comm/tcp_store_protocol.h"
#include "runtime/errno_text.h"

namespace zero {
namespace {

using net::HostPort;
using net::RemainingMs;
using net::SetNoDelay;
using net::SockaddrHost;
using net::SockaddrPort;
using tcp_store_protocol::AppendU64;
using tcp_store_protocol::kBusy;
using tcp_store_protocol::kClientContext;
using tcp_store_protocol::kGet;
using tcp_store_protocol::kHello;
using tcp_store_protocol::kMacBytes;
using tcp_store_protocol::kMaxFields;
using tcp_store_protocol::kNonceBytes;
using tcp_store_protocol::kPing;
using tcp_store_protocol::kReplyMalformed;
using tcp_store_protocol::kReplyOk;
using tcp_store_protocol::kReplyOverLimit;
using tcp_store_protocol::kServerContext;
using tcp_store_protocol::kSet;
using tcp_store_protocol::kWait;
using tcp_store_protocol::Mac;
using tcp_store_protocol::ReadU64;

// Peers whose problems are logged, at most (then the server stops logging new ones).
constexpr size_t kMaxLoggedPeers = 1024;

}  // namespace

// ---------------------------------------------------------------------------------------------
// Where the server listens (tcp_store.h's free functions).

bool IsLoopbackHost(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

std::string RouteSourceAddress(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return {};
  std::string result;
  for (addrinfo* ai = res; ai != nullptr && result.empty(); ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      sockaddr_storage local{};
      socklen_t len = sizeof(local);
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) result = SockaddrHost(local);
    }
    close(fd);
  }
  freeaddrinfo(res);
  return result;
}

Result<std::string> StoreBindAddress(const std::string& host) {
  if (host == "localhost") return std::string("127.0.0.1");
  if (IsLoopbackHost(host)) return host;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int gai = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (gai != 0) {
    return InvalidArgumentError("TcpStore: cannot resolve MASTER_ADDR '" + host +
                                "' to choose the address to serve on: " + gai_strerror(gai) +
                                " (set ZERO_STORE_BIND_ADDR to override)");
  }
  // An address of this machine binds; the port stays 0 so nothing else is disturbed.
  std::string local;
  for (addrinfo* ai = res; ai != nullptr && local.empty(); ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage a{};
    std::memcpy(&a, ai->ai_addr, ai->ai_addrlen);
    if (a.ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(&a)->sin_port = 0;
    if (a.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(&a)->sin6_port = 0;
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), ai->ai_addrlen) == 0) local = SockaddrHost(a);
    close(fd);
  }
  freeaddrinfo(res);
  if (!local.empty()) return local;
  std::string route = RouteSourceAddress(host, 29500);
  if (!route.empty()) return route;
  return InvalidArgumentError("TcpStore: MASTER_ADDR '" + host +
                              "' is not an address of this machine and no route leads to it, so the store "
                              "does not know where to serve; set ZERO_STORE_BIND_ADDR to this machine's address");
}

// ---------------------------------------------------------------------------------------------
// The server.

Result<std::unique_ptr<TcpStore::Server>> TcpStore::Server::Start(const TcpStoreOptions& o,
                                                                  const std::string& bind_addr) {
  auto server = std::unique_ptr<Server>(new Server(o));
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  int gai = getaddrinfo(bind_addr.c_str(), std::to_string(o.port).c_str(), &hints, &res);
  if (gai != 0) {
    return InvalidArgumentError("TcpStore: cannot resolve the address to serve on '" + bind_addr +
                                "': " + gai_strerror(gai));
  }
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    int e = errno;
    freeaddrinfo(res);
    return ErrnoError("socket", "TcpStore server", e);
  }
  server->listen_fd_ = fd;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (res->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
  int rc = bind(fd, res->ai_addr, res->ai_addrlen);
  int err = errno;
  freeaddrinfo(res);
  if (rc != 0) {
    return UnavailableError("TcpStore: cannot listen on " + HostPort(bind_addr, o.port) + ": " + ErrnoText(err) +
                            " (is another job using MASTER_PORT? is " + bind_addr +
                            " an address of this machine? ZERO_STORE_BIND_ADDR overrides it)");
  }
  if (listen(fd, 1024) != 0) return ErrnoError("listen", "TcpStore server", errno);
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  server->port_ = SockaddrPort(addr);
  server->bind_addr_ = SockaddrHost(addr);
  if (pipe2(server->wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    return ErrnoError("pipe2", "TcpStore server", errno);
  }
  server->thread_ = std::thread([s = server.get()] { s->Loop(); });
  return server;
}

TcpStore::Server::~Server() {
  if (thread_.joinable()) {
    char b = 1;
    ssize_t ignored = write(wake_[1], &b, 1);
    (void)ignored;
    thread_.join();
  }
  for (auto& c : clients_) close(c->fd);
  if (listen_fd_ >= 0) close(listen_fd_);
  if (wake_[0] >= 0) close(wake_[0]);
  if (wake_[1] >= 0) close(wake_[1]);
}

TcpStore::Server::Server(const TcpStoreOptions& o) : options_(o) {
  const size_t w = static_cast<size_t>(std::max(o.world_size, 0));
  max_connections_ = o.max_connections > 0 ? o.max_connections : (w > 0 ? 4 * w + 16 : 1024);
  max_keys_ = o.max_keys > 0 ? o.max_keys : (w > 0 ? 1024 + 64 * w : 65536);
}

std::string TcpStore::Server::Describe() const { return "TcpStore server on " + HostPort(bind_addr_, port_); }

size_t TcpStore::Server::InCap() const {
  return 5 +
         std::max(16 + options_.max_key_bytes + options_.max_value_bytes, kMaxFields * (8 + options_.max_key_bytes));
}

bool TcpStore::Server::WantsInput(const Client& c) const {
  if (c.close_after_flush) return false;
  if (!c.authenticated) return c.in.size() < kNonceBytes + kMacBytes;
  return !c.parked && c.out.size() < OutCap() && c.in.size() < InCap();
}

void TcpStore::Server::Loop() {
  std::vector<pollfd> fds;
  while (true) {
    fds.clear();
    fds.push_back({wake_[0], POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    Clock::time_point next = Clock::time_point::max();
    for (auto& c : clients_) {
      short ev = POLLRDHUP;
      if (WantsInput(*c)) ev |= POLLIN;
      if (!c->out.empty()) ev |= POLLOUT;
      fds.push_back({c->fd, ev, 0});
      next = std::min(next, c->deadline);
    }
    int timeout_ms = next == Clock::time_point::max() ? -1 : std::max(1, RemainingMs(next) + 1);
    int n = poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[0].revents) return;
    // clients_ may grow in Accept(); only the ones polled have entries in fds.
    const size_t polled = fds.size() - 2;
    for (size_t i = 0; i < polled; ++i) {
      Client* c = clients_[i].get();
      const short re = fds[i + 2].revents;
      if (c->dead) continue;
      if (re & POLLIN) {
        ReadFrom(c);
      } else if (re & (POLLRDHUP | POLLHUP | POLLERR)) {
        c->dead = true;  // gone while we were not reading (parked, or backpressured)
      }
      if (!c->dead && (re & POLLOUT)) {
        Flush(c);
        Process(c);  // requests held back while the replies were unread
      }
    }
    if (fds[1].revents & POLLIN) Accept();
    const auto now = Clock::now();
    for (auto& c : clients_) {
      if (c->dead) continue;
      if (c->close_after_flush && c->out.empty()) c->dead = true;
      const bool busy = !c->authenticated || (!c->parked && !c->in.empty()) || !c->out.empty();
      if (!busy) {
        c->deadline = Clock::time_point::max();
      } else if (c->deadline == Clock::time_point::max()) {
        c->deadline = now + options_.request_timeout;
      } else if (now >= c->deadline) {
        Refuse(c.get(), (c->authenticated ? "a request did not complete" : "the handshake did not complete") +
                            std::string(" within ") + std::to_string(options_.request_timeout.count()) + " ms");
      }
    }
    clients_.erase(std::remove_if(clients_.begin(), clients_.end(),
                                  [](const std::unique_ptr<Client>& c) {
                                    if (c->dead) close(c->fd);
                                    return c->dead;
                                  }),
                   clients_.end());
  }
}

void TcpStore::Server::Refuse(Client* c, const std::string& why) {
  Log(c->peer_host, c->peer, why);
  c->dead = true;
}

void TcpStore::Server::Log(const std::string& host, const std::string& peer, const std::string& why) {
  if (logged_hosts_.size() >= kMaxLoggedPeers || !logged_hosts_.insert(host).second) return;
  std::fprintf(stderr, "%s: closed the connection from %s: %s (further problems from %s are not logged)\n",
               Describe().c_str(), peer.c_str(), why.c_str(), host.c_str());
}

void TcpStore::Server::Accept() {
  while (true) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    auto c = std::make_unique<Client>();
    c->fd = fd;
    c->peer_host = SockaddrHost(addr);
    c->peer = HostPort(c->peer_host, SockaddrPort(addr));
    size_t live = 0;
    Client* oldest_unauthenticated = nullptr;
    for (auto& other : clients_) {
      if (other->dead) continue;
      ++live;
      if (!other->authenticated && oldest_unauthenticated == nullptr) oldest_unauthenticated = other.get();
    }
    const std::string limit = "too many connections (limit " + std::to_string(max_connections_) + ")";
    if (live >= max_connections_) {
      if (oldest_unauthenticated != nullptr) {
        Refuse(oldest_unauthenticated, limit + "; the oldest unauthenticated connection goes first");
      } else {
        ssize_t ignored = send(fd, kBusy, sizeof(kBusy), MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)ignored;
        Log(c->peer_host, c->peer, limit);
        close(fd);
        continue;
      }
    }
    SetNoDelay(fd);
    if (Status st = RandomBytes(kNonceBytes, &c->server_nonce); !st.ok()) {
      Log(c->peer_host, c->peer, "cannot make the challenge's nonce: " + st.message());
      close(fd);
      continue;
    }
    c->out.assign(kHello, sizeof(kHello));
    c->out += c->server_nonce;
    Flush(c.get());
    clients_.push_back(std::move(c));
  }
}

void TcpStore::Server::ReadFrom(Client* c) {
  char buf[65536];
  while (WantsInput(*c)) {
    // Before authentication, read no more than the proof; after, no more than InCap().
    size_t want = (c->authenticated ? InCap() : kNonceBytes + kMacBytes) - c->in.size();
    ssize_t r = recv(c->fd, buf, std::min(want, sizeof(buf)), 0);
    if (r > 0) {
      c->in.append(buf, static_cast<size_t>(r));
      if (!c->authenticated) Authenticate(c);
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
      c->dead = true;
      return;
    }
    break;
  }
  Process(c);
}

void TcpStore::Server::Authenticate(Client* c) {
  if (c->in.size() < kNonceBytes + kMacBytes) return;
  const std::string client_nonce = c->in.substr(0, kNonceBytes);
  const std::string proof = c->in.substr(kNonceBytes, kMacBytes);
  c->in.erase(0, kNonceBytes + kMacBytes);
  if (!ConstantTimeEqual(proof, Mac(options_.secret, kClientContext, c->server_nonce, client_nonce))) {
    c->out.push_back(static_cast<char>(1));
    c->close_after_flush = true;
    Log(c->peer_host, c->peer,
        "it did not prove the job secret (wrong or missing ZERO_JOB_SECRET, or not a rank of this job)");
    Flush(c);
    return;
  }
  c->authenticated = true;
  c->deadline = Clock::time_point::max();
  c->out.push_back(static_cast<char>(0));
  c->out += Mac(options_.secret, kServerContext, c->server_nonce, client_nonce);
  Flush(c);
}

void TcpStore::Server::RejectAndClose(Client* c, uint8_t code, const std::string& why) {
  Log(c->peer_host, c->peer, why);
  c->in.clear();
  Reply(c, code, Describe() + ": " + why);
  c->close_after_flush = true;
}

void TcpStore::Server::Process(Client* c) {
  while (c->authenticated && !c->dead && !c->close_after_flush && !c->parked && c->out.size() < OutCap()) {
    const std::string& in = c->in;
    if (in.empty()) return;
    const uint8_t cmd = static_cast<uint8_t>(in[0]);
    if (cmd != kSet && cmd != kGet && cmd != kWait && cmd != kPing) {
      return RejectAndClose(c, kReplyMalformed, "malformed request: unknown command " + std::to_string(cmd));
    }
    if (in.size() < 5) return;
    uint32_t nfields;
    std::memcpy(&nfields, in.data() + 1, 4);
    const bool count_ok = cmd == kSet    ? nfields == 2
                          : cmd == kGet  ? nfields == 1
                          : cmd == kWait ? nfields >= 1 && nfields <= kMaxFields
                                         : nfields == 0;
    if (!count_ok) {
      return RejectAndClose(
          c, kReplyMalformed,
          "malformed request: command " + std::to_string(cmd) + " with " + std::to_string(nfields) + " fields");
    }
    size_t pos = 5;
    std::vector<std::string> fields;
    for (uint32_t f = 0; f < nfields; ++f) {
      if (in.size() < pos + 8) return;
      uint64_t len = ReadU64(in.data() + pos);
      const bool is_value = cmd == kSet && f == 1;
      const uint64_t limit = is_value ? options_.max_value_bytes : options_.max_key_bytes;
      if (len > limit) {
        return RejectAndClose(c, kReplyOverLimit,
                              std::string(is_value ? "a value" : "a key") + " of " + std::to_string(len) +
                                  " bytes (at most " + std::to_string(limit) + "; " +
                                  (is_value ? "ZERO_STORE_MAX_VALUE_BYTES" : "keys are at most 4 KiB") + ")");
      }
      if (in.size() < pos + 8 + len) return;
      fields.emplace_back(in.data() + pos + 8, len);
      pos += 8 + len;
    }
    c->in.erase(0, pos);
    c->deadline = Clock::time_point::max();  // the next request gets its own deadline
    Handle(c, cmd, std::move(fields));
  }
}

void TcpStore::Server::Handle(Client* c, uint8_t cmd, std::vector<std::string> fields) {
  if (cmd == kSet && fields.size() == 2) {
    auto it = map_.find(fields[0]);
    const size_t old_bytes = it == map_.end() ? 0 : it->first.size() + it->second.size();
    const size_t new_bytes = fields[0].size() + fields[1].size();
    if (it == map_.end() && map_.size() >= max_keys_) {
      Log(c->peer_host, c->peer, "the store is full (" + std::to_string(max_keys_) + " keys)");
      Reply(c, kReplyOverLimit,
            Describe() + ": the store holds " + std::to_string(map_.size()) + " keys, its limit; key '" + fields[0] +
                "' was not set");
      return;
    }
    if (total_bytes_ - old_bytes + new_bytes > options_.max_total_bytes) {
      Log(c->peer_host, c->peer, "the store is full (" + std::to_string(options_.max_total_bytes) + " bytes)");
      Reply(c, kReplyOverLimit,
            Describe() + ": the store would hold more than " + std::to_string(options_.max_total_bytes) +
                " bytes; key '" + fields[0] + "' was not set");
      return;
    }
    total_bytes_ = total_bytes_ - old_bytes + new_bytes;
    map_[fields[0]] = std::vector<char>(fields[1].begin(), fields[1].end());
    Reply(c, kReplyOk, {});
    WakeParked();
    return;
  }
  if (cmd == kPing) {
    Reply(c, kReplyOk, {});
    return;
  }
  if ((cmd == kGet && fields.size() == 1) || (cmd == kWait && !fields.empty())) {
    c->parked = true;
    c->parked_cmd = cmd;
    c->parked_keys = std::move(fields);
    TryAnswer(c);
    return;
  }
  Reply(c, kReplyMalformed,
        Describe() + ": malformed request (command " + std::to_string(cmd) + " with " + std::to_string(fields.size()) +
            " fields)");
}

void TcpStore::Server::TryAnswer(Client* c) {
  for (const auto& k : c->parked_keys) {
    if (map_.find(k) == map_.end()) return;
  }
  c->parked = false;
  if (c->parked_cmd == kGet) {
    const auto& v = map_[c->parked_keys[0]];
    Reply(c, kReplyOk, std::string(v.begin(), v.end()));
  } else {
    Reply(c, kReplyOk, {});
  }
  c->parked_keys.clear();
}

void TcpStore::Server::WakeParked() {
  for (auto& other : clients_) {
    if (other->dead || !other->parked) continue;
    TryAnswer(other.get());
    Process(other.get());
  }
}

void TcpStore::Server::Reply(Client* c, uint8_t code, const std::string& payload) {
  c->out.push_back(static_cast<char>(code));
  AppendU64(&c->out, payload.size());
  c->out.append(payload);
  Flush(c);
}

void TcpStore::Server::Flush(Client* c) {
  while (!c->out.empty()) {
    ssize_t w = send(c->fd, c->out.data(), c->out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      c->out.erase(0, static_cast<size_t>(w));
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    c->dead = true;
    return;
  }
}

}  // namespace zero
