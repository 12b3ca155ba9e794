#include "comm/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>
#include <thread>
#include <unordered_map>
#include <utility>

#include <gloo/common/error.h>

#include "comm/hmac_sha256.h"
#include "runtime/errno_text.h"

namespace zero {
namespace {

// Wire format: see tcp_store.h.
constexpr uint8_t kSet = 1;
constexpr uint8_t kGet = 2;
constexpr uint8_t kWait = 3;
constexpr uint8_t kPing = 4;
constexpr uint8_t kReplyOk = 0;
constexpr uint8_t kReplyMalformed = 1;
constexpr uint8_t kReplyOverLimit = 2;
constexpr uint32_t kMaxFields = 64;
constexpr size_t kNonceBytes = 32;
constexpr size_t kMacBytes = 32;
constexpr char kHello[8] = {'Z', 'S', 'T', 'O', 'R', 'E', '1', '\0'};
constexpr char kBusy[8] = {'Z', 'S', 'T', 'B', 'U', 'S', 'Y', '\0'};
constexpr char kClientContext[] = "zero-tcpstore-v1 client";
constexpr char kServerContext[] = "zero-tcpstore-v1 server";
// Peers whose problems are logged, at most (then the server stops logging new ones).
constexpr size_t kMaxLoggedPeers = 1024;

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

// `n` bytes from the kernel's CSPRNG; false if it cannot be read.
bool RandomBytes(size_t n, std::string* out) {
  out->resize(n);
  size_t got = 0;
  while (got < n) {
    ssize_t r = getrandom(out->data() + got, n - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else if (r < 0 && errno != EINTR) {
      return false;
    }
  }
  return true;
}

std::string Mac(const std::string& secret, const char* context, const std::string& server_nonce,
                const std::string& client_nonce) {
  Sha256Digest d = HmacSha256(secret, context + server_nonce + client_nonce);
  return std::string(reinterpret_cast<const char*>(d.data()), d.size());
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

// Blocking-with-deadline I/O on a non-blocking client socket.
enum class Io { kOk, kTimeout, kClosed, kError };

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

}  // namespace

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
    return InvalidArgumentError("TcpStore: cannot resolve MASTER_ADDR '" + host + "' to choose the address to serve on: " +
                                gai_strerror(gai) + " (set ZERO_STORE_BIND_ADDR to override)");
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
// Server: one thread polling the listening socket and every client; no call blocks on a client.
// GET/WAIT requests whose keys are missing are parked and answered by the SET that completes them.
class TcpStore::Server {
 public:
  static Result<std::unique_ptr<Server>> Start(const TcpStoreOptions& o, const std::string& bind_addr) {
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
      return UnavailableError("TcpStore: cannot listen on " + HostPort(bind_addr, o.port) + ": " +
                              ErrnoText(err) + " (is another job using MASTER_PORT? is " + bind_addr +
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

  ~Server() {
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

  int port() const { return port_; }
  const std::string& bind_address() const { return bind_addr_; }

 private:
  struct Client {
    int fd = -1;
    std::string peer_host;  // for the log: one line per host
    std::string peer;       // host:port
    bool authenticated = false;
    std::string server_nonce;
    std::string in;
    std::string out;
    bool dead = false;
    bool close_after_flush = false;  // an error reply is queued; the stream is not trusted after it
    Clock::time_point deadline = Clock::time_point::max();  // of the handshake or current request
    // A GET or WAIT waiting for keys (requests on one connection are sequential).
    bool parked = false;
    uint8_t parked_cmd = 0;
    std::vector<std::string> parked_keys;
  };

  explicit Server(const TcpStoreOptions& o) : options_(o) {
    const size_t w = static_cast<size_t>(std::max(o.world_size, 0));
    max_connections_ = o.max_connections > 0 ? o.max_connections : (w > 0 ? 4 * w + 16 : 1024);
    max_keys_ = o.max_keys > 0 ? o.max_keys : (w > 0 ? 1024 + 64 * w : 65536);
  }

  std::string Describe() const { return "TcpStore server on " + HostPort(bind_addr_, port_); }

  // Replies waiting to be read hold back further requests from the same client (Process stops,
  // then reading stops), so a client that pipelines requests and never reads costs at most about
  // two replies and one request.
  size_t OutCap() const { return options_.max_value_bytes + 64; }
  // The largest valid request: a SET of the longest key and value, or a WAIT for kMaxFields keys.
  size_t InCap() const {
    return 5 + std::max(16 + options_.max_key_bytes + options_.max_value_bytes,
                        kMaxFields * (8 + options_.max_key_bytes));
  }

  bool WantsInput(const Client& c) const {
    if (c.close_after_flush) return false;
    if (!c.authenticated) return c.in.size() < kNonceBytes + kMacBytes;
    return !c.parked && c.out.size() < OutCap() && c.in.size() < InCap();
  }

  void Loop() {
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

  // Logs `why` once per peer host and closes the connection.
  void Refuse(Client* c, const std::string& why) {
    Log(c->peer_host, c->peer, why);
    c->dead = true;
  }

  void Log(const std::string& host, const std::string& peer, const std::string& why) {
    if (logged_hosts_.size() >= kMaxLoggedPeers || !logged_hosts_.insert(host).second) return;
    std::fprintf(stderr, "%s: closed the connection from %s: %s (further problems from %s are not logged)\n",
                 Describe().c_str(), peer.c_str(), why.c_str(), host.c_str());
  }

  void Accept() {
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
      if (!RandomBytes(kNonceBytes, &c->server_nonce)) {
        Log(c->peer_host, c->peer, "cannot read random bytes for the challenge: " + ErrnoText(errno));
        close(fd);
        continue;
      }
      c->out.assign(kHello, sizeof(kHello));
      c->out += c->server_nonce;
      Flush(c.get());
      clients_.push_back(std::move(c));
    }
  }

  void ReadFrom(Client* c) {
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

  void Authenticate(Client* c) {
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

  // Rejects the current request with `code` and closes the connection once the reply is sent
  // (the rest of the stream cannot be trusted to be aligned on a request).
  void RejectAndClose(Client* c, uint8_t code, const std::string& why) {
    Log(c->peer_host, c->peer, why);
    c->in.clear();
    Reply(c, code, Describe() + ": " + why);
    c->close_after_flush = true;
  }

  // Handles every complete request buffered for `c` unless one is parked or its unread replies
  // reached OutCap(). A header that cannot start a valid request (an unknown command, a field count
  // the command does not take) is refused as soon as it arrives, before any of its fields.
  void Process(Client* c) {
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
        return RejectAndClose(c, kReplyMalformed, "malformed request: command " + std::to_string(cmd) + " with " +
                                                      std::to_string(nfields) + " fields");
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

  void Handle(Client* c, uint8_t cmd, std::vector<std::string> fields) {
    if (cmd == kSet && fields.size() == 2) {
      auto it = map_.find(fields[0]);
      const size_t old_bytes = it == map_.end() ? 0 : it->first.size() + it->second.size();
      const size_t new_bytes = fields[0].size() + fields[1].size();
      if (it == map_.end() && map_.size() >= max_keys_) {
        Log(c->peer_host, c->peer, "the store is full (" + std::to_string(max_keys_) + " keys)");
        Reply(c, kReplyOverLimit, Describe() + ": the store holds " + std::to_string(map_.size()) +
                                      " keys, its limit; key '" + fields[0] + "' was not set");
        return;
      }
      if (total_bytes_ - old_bytes + new_bytes > options_.max_total_bytes) {
        Log(c->peer_host, c->peer, "the store is full (" + std::to_string(options_.max_total_bytes) + " bytes)");
        Reply(c, kReplyOverLimit, Describe() + ": the store would hold more than " +
                                      std::to_string(options_.max_total_bytes) + " bytes; key '" + fields[0] +
                                      "' was not set");
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
    Reply(c, kReplyMalformed, Describe() + ": malformed request (command " + std::to_string(cmd) + " with " +
                                  std::to_string(fields.size()) + " fields)");
  }

  // Answers a parked request whose keys all exist.
  void TryAnswer(Client* c) {
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

  void WakeParked() {
    for (auto& other : clients_) {
      if (other->dead || !other->parked) continue;
      TryAnswer(other.get());
      Process(other.get());
    }
  }

  void Reply(Client* c, uint8_t code, const std::string& payload) {
    c->out.push_back(static_cast<char>(code));
    AppendU64(&c->out, payload.size());
    c->out.append(payload);
    Flush(c);
  }

  void Flush(Client* c) {
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

  const TcpStoreOptions options_;
  size_t max_connections_ = 0;
  size_t max_keys_ = 0;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  int port_ = 0;
  std::string bind_addr_;
  std::thread thread_;
  // Touched only by the server thread.
  std::unordered_map<std::string, std::vector<char>> map_;
  size_t total_bytes_ = 0;
  std::vector<std::unique_ptr<Client>> clients_;
  std::set<std::string> logged_hosts_;
};

// ---------------------------------------------------------------------------------------------

TcpStore::TcpStore(const TcpStoreOptions& options) : options_(options), port_(options.port) {}

TcpStore::~TcpStore() {
  StopWatch();
  StopHeartbeat();
  {
    std::lock_guard<std::mutex> lock(mu_);
    CloseLocked();
  }
  server_.reset();
}

Result<std::unique_ptr<TcpStore>> TcpStore::Create(const TcpStoreOptions& options) {
  if (options.port < 0 || options.port > 65535 || (!options.is_server && options.port == 0)) {
    return InvalidArgumentError("TcpStore: port must be 1..65535 (0 only on the host), got " +
                                std::to_string(options.port));
  }
  auto store = std::unique_ptr<TcpStore>(new TcpStore(options));
  if (options.is_server) {
    std::string bind_addr = options.bind_addr;
    if (bind_addr.empty()) {
      ZERO_ASSIGN_OR_RETURN(bind_addr, StoreBindAddress(options.host));
    }
    ZERO_ASSIGN_OR_RETURN(store->server_, Server::Start(options, bind_addr));
    store->port_ = store->server_->port();
  }
  std::lock_guard<std::mutex> lock(store->mu_);
  ZERO_RETURN_IF_ERROR(store->ConnectLocked(Clock::now() + options.timeout));
  return store;
}

std::string TcpStore::address() const { return HostPort(options_.host, port_); }

std::string TcpStore::bind_address() const { return server_ ? server_->bind_address() : std::string(); }

std::string TcpStore::Describe() const {
  std::string s = "TcpStore " + address();
  if (options_.rank >= 0) s += " (rank " + std::to_string(options_.rank) + ")";
  return s;
}

void TcpStore::CloseLocked() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

Status TcpStore::HandshakeLocked(int fd, Clock::time_point deadline) {
  int err = 0;
  auto broken = [&](Io io, const char* when) -> Status {
    std::string m = std::string("the store ") +
                    (io == Io::kTimeout ? "did not answer" : io == Io::kClosed ? "closed the connection" : "failed") +
                    " " + when;
    if (io == Io::kError) m += " (" + ErrnoText(err) + ")";
    return UnavailableError(m);
  };
  char hello[sizeof(kHello)];
  if (Io io = RecvExact(fd, hello, sizeof(hello), deadline, &err); io != Io::kOk) {
    return broken(io, "before its greeting");
  }
  if (std::memcmp(hello, kBusy, sizeof(kBusy)) == 0) {
    return UnavailableError("the store refused the connection: it has too many connections");
  }
  if (std::memcmp(hello, kHello, sizeof(kHello)) != 0) {
    return FailedPreconditionError(Describe() + ": what answers there is not a zero TcpStore (unexpected greeting)");
  }
  std::string server_nonce(kNonceBytes, '\0');
  if (Io io = RecvExact(fd, server_nonce.data(), kNonceBytes, deadline, &err); io != Io::kOk) {
    return broken(io, "during the handshake");
  }
  std::string client_nonce;
  if (!RandomBytes(kNonceBytes, &client_nonce)) return ErrnoError("getrandom", Describe(), errno);
  const std::string proof = client_nonce + Mac(options_.secret, kClientContext, server_nonce, client_nonce);
  if (Io io = SendAll(fd, proof.data(), proof.size(), deadline, &err); io != Io::kOk) {
    return broken(io, "during the handshake");
  }
  char verdict = 1;
  if (Io io = RecvExact(fd, &verdict, 1, deadline, &err); io != Io::kOk) return broken(io, "during the handshake");
  if (verdict != 0) {
    return FailedPreconditionError(
        Describe() + ": the store refused this rank's proof of the job secret: ZERO_JOB_SECRET differs from "
                     "rank 0's (or is set on one and not the other)");
  }
  std::string server_proof(kMacBytes, '\0');
  if (Io io = RecvExact(fd, server_proof.data(), kMacBytes, deadline, &err); io != Io::kOk) {
    return broken(io, "during the handshake");
  }
  if (!ConstantTimeEqual(server_proof, Mac(options_.secret, kServerContext, server_nonce, client_nonce))) {
    return FailedPreconditionError(Describe() +
                                   ": the server could not prove the job secret (is this rank 0 of the same "
                                   "job? ZERO_JOB_SECRET must be the same on every rank)");
  }
  return OkStatus();
}

Status TcpStore::ConnectLocked(Clock::time_point deadline) {
  ZERO_ASSIGN_OR_RETURN(fd_, Connect(deadline));
  return OkStatus();
}

Result<int> TcpStore::Connect(Clock::time_point deadline) {
  std::string last_error = "no address";
  const std::string port = std::to_string(port_);
  while (true) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    int gai = getaddrinfo(options_.host.c_str(), port.c_str(), &hints, &res);
    if (gai != 0) {
      // A name that does not resolve will not start resolving: fail now.
      return InvalidArgumentError(Describe() + ": cannot resolve host '" + options_.host +
                                  "': " + gai_strerror(gai));
    }
    for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
      int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
      if (fd < 0) {
        last_error = ErrnoText(errno);
        continue;
      }
      int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
      if (rc != 0 && errno == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        int n = poll(&p, 1, std::max(1, std::min(RemainingMs(deadline), 1000)));
        int err = 0;
        socklen_t len = sizeof(err);
        if (n == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) {
          rc = 0;
        } else {
          errno = n == 1 ? err : ETIMEDOUT;
        }
      }
      if (rc == 0) {
        SetNoDelay(fd);
        Status hs = HandshakeLocked(fd, deadline);
        if (hs.ok()) {
          freeaddrinfo(res);
          return fd;
        }
        close(fd);
        if (hs.code() != StatusCode::kUnavailable) {
          freeaddrinfo(res);
          return hs;
        }
        last_error = hs.message();
        continue;
      }
      last_error = ErrnoText(errno);
      close(fd);
    }
    freeaddrinfo(res);
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(50, RemainingMs(deadline) + 1)));
    if (Clock::now() >= deadline) break;
  }
  return UnavailableError(Describe() + ": could not connect to the store hosted by rank 0 within " +
                          std::to_string(options_.timeout.count()) + " ms (last error: " +
                          last_error + "); is rank 0 running and MASTER_ADDR/MASTER_PORT right?");
}

Result<std::vector<char>> TcpStore::Request(uint8_t cmd, const std::vector<std::string>& fields,
                                            std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto deadline = Clock::now() + timeout;
  if (fd_ < 0) ZERO_RETURN_IF_ERROR(ConnectLocked(deadline));

  std::string frame;
  frame.push_back(static_cast<char>(cmd));
  uint32_t n = static_cast<uint32_t>(fields.size());
  frame.append(reinterpret_cast<const char*>(&n), 4);
  for (const auto& f : fields) {
    AppendU64(&frame, f.size());
    frame.append(f);
  }

  auto fail = [&](Io io, const std::string& what, int err) -> Status {
    CloseLocked();  // after a timeout a late reply would desynchronize the connection
    if (io == Io::kTimeout) {
      return DeadlineExceededError(Describe() + ": timed out after " + std::to_string(timeout.count()) + " ms");
    }
    std::string m = Describe() + ": connection to the store lost while " + what;
    if (io == Io::kError) m += " (" + ErrnoText(err) + ")";
    return UnavailableError(m + "; the host (rank 0) may have exited");
  };

  int err = 0;
  if (Io io = SendAll(fd_, frame.data(), frame.size(), deadline, &err); io != Io::kOk) {
    return fail(io, "sending", err);
  }
  char header[9];
  if (Io io = RecvExact(fd_, header, 9, deadline, &err); io != Io::kOk) {
    return fail(io, "waiting for a reply", err);
  }
  uint64_t len = ReadU64(header + 1);
  if (len > options_.max_value_bytes + 65536) return fail(Io::kClosed, "reading a reply: malformed length", 0);
  std::vector<char> payload(len);
  if (len > 0) {
    if (Io io = RecvExact(fd_, payload.data(), len, deadline, &err); io != Io::kOk) {
      return fail(io, "waiting for a reply", err);
    }
  }
  if (header[0] != kReplyOk) {
    CloseLocked();  // the server closes after some errors; start afresh either way
    std::string m(payload.begin(), payload.end());
    if (header[0] == kReplyOverLimit) return ResourceExhaustedError(m);
    if (header[0] == kReplyMalformed) return InvalidArgumentError(m);
    return InternalError(Describe() + ": unknown reply code " + std::to_string(header[0]) + ": " + m);
  }
  return payload;
}

Status TcpStore::StartHeartbeat(std::function<void(const Status&)> on_lost) {
  if (server_ != nullptr || options_.heartbeat.count() <= 0) return OkStatus();
  ZERO_ASSIGN_OR_RETURN(heartbeat_fd_, Connect(Clock::now() + options_.timeout));
  if (pipe2(heartbeat_wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    const int err = errno;
    close(heartbeat_fd_);
    heartbeat_fd_ = -1;
    return ErrnoError("pipe2", Describe() + " heartbeat", err);
  }
  heartbeat_ = std::thread([this, f = std::move(on_lost)] { HeartbeatMain(f); });
  return OkStatus();
}

void TcpStore::StopHeartbeat() {
  if (heartbeat_.joinable()) {
    char b = 1;
    ssize_t ignored = write(heartbeat_wake_[1], &b, 1);
    (void)ignored;
    heartbeat_.join();
  }
  for (int* fd : {&heartbeat_fd_, &heartbeat_wake_[0], &heartbeat_wake_[1]}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
}

void TcpStore::HeartbeatMain(std::function<void(const Status&)> on_lost) {
  const auto bound = options_.heartbeat;
  const auto period = std::max(bound / 2, std::chrono::milliseconds(1));
  std::string ping(1, static_cast<char>(kPing));
  ping.append(4, '\0');  // no fields
  char reply[9];
  size_t have = 0;
  auto next_ping = Clock::now() + period;
  auto sent_at = Clock::time_point::max();  // of the ping not yet answered
  std::string lost;
  bool closed = false;  // the server's end closed: rank 0's process exited (normally or not)
  while (lost.empty()) {
    const auto until = sent_at == Clock::time_point::max() ? next_ping : sent_at + bound;
    pollfd p[2] = {{heartbeat_wake_[0], POLLIN, 0}, {heartbeat_fd_, POLLIN | POLLRDHUP, 0}};
    if (poll(p, 2, RemainingMs(until)) < 0 && errno != EINTR) {
      lost = "polling the heartbeat connection failed (" + ErrnoText(errno) + ")";
      break;
    }
    if (p[0].revents != 0) return;  // StopHeartbeat
    if (p[1].revents != 0) {
      ssize_t r = recv(heartbeat_fd_, reply + have, sizeof(reply) - have, MSG_DONTWAIT);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        lost = "the store's server closed the heartbeat connection" +
               (r < 0 ? " (" + ErrnoText(errno) + ")" : std::string()) +
               ": rank 0's process, which hosts it, has exited or was killed";
        closed = true;
        break;
      }
      if (r > 0 && (have += static_cast<size_t>(r)) == sizeof(reply)) {
        if (reply[0] != kReplyOk || ReadU64(reply + 1) != 0) {
          lost = "the store's server answered a heartbeat with code " + std::to_string(reply[0]);
          break;
        }
        have = 0;
        sent_at = Clock::time_point::max();
      }
    }
    const auto now = Clock::now();
    if (sent_at != Clock::time_point::max() && now >= sent_at + bound) {
      lost = "the store's server did not answer a heartbeat within " + std::to_string(bound.count()) +
             " ms: rank 0's process, which hosts it, is stopped or hung, or its host is unreachable "
             "(ZERO_STORE_HEARTBEAT_MS sets this bound)";
    } else if (sent_at == Clock::time_point::max() && now >= next_ping) {
      // 5 bytes into an idle socket's buffer: a short write means the connection is broken.
      if (send(heartbeat_fd_, ping.data(), ping.size(), MSG_NOSIGNAL | MSG_DONTWAIT) !=
          static_cast<ssize_t>(ping.size())) {
        lost = "sending a heartbeat to the store's server failed (" + ErrnoText(errno) +
               "): rank 0's process, which hosts it, has exited or was killed";
        closed = true;
      }
      sent_at = now;
      next_ping = now + period;
    }
  }
  if (closed) {
    // Rank 0 exits as soon as its own part of the last collective is done, while the other ranks
    // may still be receiving theirs: aborting at once failed a job's final barrier (multiprocess
    // test, 4 ranks on 2 cores). A rank that was done stops the heartbeat within this grace (its
    // communicator is destroyed); one still waiting on rank 0 is aborted after it. A crashed rank 0
    // also closes its gloo connections, which fail on their own.
    const auto grace = std::max(bound / 4, std::chrono::milliseconds(1));
    pollfd w = {heartbeat_wake_[0], POLLIN, 0};
    const auto until = Clock::now() + grace;
    while (Clock::now() < until) {
      const int n = poll(&w, 1, RemainingMs(until));
      if (n > 0) return;  // StopHeartbeat
      if (n < 0 && errno != EINTR) break;
    }
  }
  on_lost(UnavailableError(Describe() + ": " + lost));
}

Status TcpStore::WatchKey(const std::string& key,
                          std::function<void(Result<std::vector<char>>)> on_event) {
  ZERO_RETURN_IF_ERROR(CheckSizes(key, nullptr));
  ZERO_ASSIGN_OR_RETURN(watch_fd_, Connect(Clock::now() + options_.timeout));
  if (pipe2(watch_wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    const int err = errno;
    close(watch_fd_);
    watch_fd_ = -1;
    return ErrnoError("pipe2", Describe() + " watch", err);
  }
  watch_ = std::thread([this, key, f = std::move(on_event)] { WatchMain(key, f); });
  return OkStatus();
}

void TcpStore::StopWatch() {
  if (watch_.joinable()) {
    char b = 1;
    ssize_t ignored = write(watch_wake_[1], &b, 1);
    (void)ignored;
    watch_.join();
  }
  for (int* fd : {&watch_fd_, &watch_wake_[0], &watch_wake_[1]}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
}

void TcpStore::WatchMain(const std::string& key,
                         const std::function<void(Result<std::vector<char>>)>& on_event) {
  auto lost = [&](const std::string& what, int err) {
    on_event(UnavailableError(Describe() + ": the watch of key '" + key + "' ended: " + what +
                              (err != 0 ? " (" + ErrnoText(err) + ")" : std::string())));
  };
  std::string frame(1, static_cast<char>(kGet));
  const uint32_t one = 1;
  frame.append(reinterpret_cast<const char*>(&one), 4);
  AppendU64(&frame, key.size());
  frame.append(key);
  int err = 0;
  if (SendAll(watch_fd_, frame.data(), frame.size(), Clock::now() + options_.timeout, &err) != Io::kOk) {
    return lost("sending the request failed", err);
  }
  while (true) {
    pollfd p[2] = {{watch_wake_[0], POLLIN, 0}, {watch_fd_, POLLIN | POLLRDHUP, 0}};
    if (poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return lost("poll failed", errno);
    }
    if (p[0].revents != 0) return;  // StopWatch
    if (p[1].revents != 0) break;
  }
  // The reply has started: the rest follows at once (bounded by the request timeout).
  const auto deadline = Clock::now() + options_.request_timeout;
  char header[9];
  if (RecvExact(watch_fd_, header, 9, deadline, &err) != Io::kOk) {
    return lost("the store's server closed the connection: rank 0's process may have exited", err);
  }
  const uint64_t len = ReadU64(header + 1);
  if (header[0] != kReplyOk || len > options_.max_value_bytes + 65536) {
    return lost("the server answered with code " + std::to_string(header[0]), 0);
  }
  std::vector<char> value(len);
  if (len > 0 && RecvExact(watch_fd_, value.data(), len, deadline, &err) != Io::kOk) {
    return lost("reading the value failed", err);
  }
  on_event(std::move(value));
}

Status TcpStore::CheckSizes(const std::string& key, const std::vector<char>* value) const {
  if (key.size() > options_.max_key_bytes) {
    return ResourceExhaustedError(Describe() + ": key of " + std::to_string(key.size()) +
                                  " bytes is longer than the store's limit of " +
                                  std::to_string(options_.max_key_bytes) + " bytes");
  }
  if (value != nullptr && value->size() > options_.max_value_bytes) {
    return ResourceExhaustedError(Describe() + ": value of " + std::to_string(value->size()) +
                                  " bytes for key '" + key + "' is larger than the store's limit of " +
                                  std::to_string(options_.max_value_bytes) + " bytes (ZERO_STORE_MAX_VALUE_BYTES)");
  }
  return OkStatus();
}

Status TcpStore::Set(const std::string& key, const std::vector<char>& value) {
  return Set(key, value, options_.timeout);
}

Status TcpStore::Set(const std::string& key, const std::vector<char>& value, std::chrono::milliseconds timeout) {
  ZERO_RETURN_IF_ERROR(CheckSizes(key, &value));
  auto r = Request(kSet, {key, std::string(value.begin(), value.end())}, timeout);
  if (!r.ok()) return r.status().WithContext("set '" + key + "'");
  return OkStatus();
}

Result<std::vector<char>> TcpStore::Get(const std::string& key, std::chrono::milliseconds timeout) {
  ZERO_RETURN_IF_ERROR(CheckSizes(key, nullptr));
  auto r = Request(kGet, {key}, timeout);
  if (!r.ok()) return r.status().WithContext("waiting for key '" + key + "'");
  return r;
}

Status TcpStore::Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  // One key at a time, so a timeout names the key that is missing.
  const auto deadline = Clock::now() + timeout;
  for (const auto& key : keys) {
    ZERO_RETURN_IF_ERROR(CheckSizes(key, nullptr));
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    auto r = Request(kWait, {key}, std::max(left, std::chrono::milliseconds(1)));
    if (!r.ok()) return r.status().WithContext("waiting for key '" + key + "'");
  }
  return OkStatus();
}

void TcpStore::set(const std::string& key, const std::vector<char>& data) {
  Status s = Set(key, data);
  if (!s.ok()) throw gloo::IoException(s.ToString());
}

std::vector<char> TcpStore::get(const std::string& key) {
  auto r = Get(key, options_.timeout);
  if (!r.ok()) throw gloo::IoException(r.status().ToString());
  return std::move(r).value();
}

void TcpStore::wait(const std::vector<std::string>& keys) { wait(keys, options_.timeout); }

void TcpStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  // gloo's kNoTimeout (0) means "forever"; we never wait forever.
  auto t = timeout.count() <= 0 ? options_.timeout : timeout;
  Status s = Wait(keys, t);
  if (!s.ok()) throw gloo::IoException(s.ToString());
}

}  // namespace zero
