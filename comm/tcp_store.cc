#include "comm/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <unordered_map>
#include <utility>

#include <gloo/common/error.h>

namespace zero {
namespace {

// Wire format. Request: u8 command, u32 field count, then per field u64 length + bytes.
// Response: u8 code (0 ok), u64 length + bytes (GET's value; empty otherwise).
constexpr uint8_t kSet = 1;
constexpr uint8_t kGet = 2;
constexpr uint8_t kWait = 3;
constexpr uint64_t kMaxFieldBytes = uint64_t{1} << 30;

using Clock = std::chrono::steady_clock;

std::string ErrnoText(int err) {
  char buf[256];
  return std::string(strerror_r(err, buf, sizeof(buf)));
}

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

}  // namespace

// ---------------------------------------------------------------------------------------------
// Server: one thread polling the listening socket and every client. GET/WAIT requests whose keys
// are missing are parked and answered by the SET that completes them.
class TcpStore::Server {
 public:
  static Result<std::unique_ptr<Server>> Start(int port) {
    auto server = std::unique_ptr<Server>(new Server());
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return ErrnoError("socket", "TcpStore server", errno);
    server->listen_fd_ = fd;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      int err = errno;
      return UnavailableError("TcpStore: cannot listen on port " + std::to_string(port) + ": " +
                              ErrnoText(err) + " (is another job using MASTER_PORT?)");
    }
    if (listen(fd, 1024) != 0) return ErrnoError("listen", "TcpStore server", errno);
    socklen_t len = sizeof(addr);
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    server->port_ = ntohs(addr.sin_port);
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

 private:
  struct Client {
    int fd = -1;
    std::string in;
    std::string out;
    bool dead = false;
    // A GET or WAIT waiting for keys (requests on one connection are sequential).
    bool parked = false;
    uint8_t parked_cmd = 0;
    std::vector<std::string> parked_keys;
  };

  Server() = default;

  void Loop() {
    std::vector<pollfd> fds;
    while (true) {
      fds.clear();
      fds.push_back({wake_[0], POLLIN, 0});
      fds.push_back({listen_fd_, POLLIN, 0});
      for (auto& c : clients_) {
        short ev = POLLIN;
        if (!c->out.empty()) ev |= POLLOUT;
        fds.push_back({c->fd, ev, 0});
      }
      int n = poll(fds.data(), fds.size(), -1);
      if (n < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds[0].revents) return;
      if (fds[1].revents & POLLIN) Accept();
      // clients_ may have grown in Accept(); only the ones polled have entries in fds.
      for (size_t i = 2; i < fds.size(); ++i) {
        Client* c = clients_[i - 2].get();
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) ReadFrom(c);
        if (!c->dead && (fds[i].revents & POLLOUT)) Flush(c);
      }
      clients_.erase(std::remove_if(clients_.begin(), clients_.end(),
                                    [](const std::unique_ptr<Client>& c) {
                                      if (c->dead) close(c->fd);
                                      return c->dead;
                                    }),
                     clients_.end());
    }
  }

  void Accept() {
    while (true) {
      int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;
      SetNoDelay(fd);
      auto c = std::make_unique<Client>();
      c->fd = fd;
      clients_.push_back(std::move(c));
    }
  }

  void ReadFrom(Client* c) {
    char buf[65536];
    while (true) {
      ssize_t r = recv(c->fd, buf, sizeof(buf), 0);
      if (r > 0) {
        c->in.append(buf, static_cast<size_t>(r));
        continue;
      }
      if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        c->dead = true;
        return;
      }
      if (errno == EINTR) continue;
      break;
    }
    Process(c);
  }

  // Handles every complete request buffered for `c` unless one is parked.
  void Process(Client* c) {
    while (!c->dead && !c->parked) {
      const std::string& in = c->in;
      if (in.size() < 5) return;
      uint8_t cmd = static_cast<uint8_t>(in[0]);
      uint32_t nfields;
      std::memcpy(&nfields, in.data() + 1, 4);
      size_t pos = 5;
      std::vector<std::string> fields;
      for (uint32_t f = 0; f < nfields; ++f) {
        if (in.size() < pos + 8) return;
        uint64_t len = ReadU64(in.data() + pos);
        if (len > kMaxFieldBytes) {
          c->dead = true;  // not our protocol
          return;
        }
        if (in.size() < pos + 8 + len) return;
        fields.emplace_back(in.data() + pos + 8, len);
        pos += 8 + len;
      }
      c->in.erase(0, pos);
      Handle(c, cmd, std::move(fields));
    }
  }

  void Handle(Client* c, uint8_t cmd, std::vector<std::string> fields) {
    if (cmd == kSet && fields.size() == 2) {
      map_[fields[0]] = std::vector<char>(fields[1].begin(), fields[1].end());
      Reply(c, 0, {});
      WakeParked();
      return;
    }
    if ((cmd == kGet && fields.size() == 1) || (cmd == kWait && !fields.empty())) {
      c->parked = true;
      c->parked_cmd = cmd;
      c->parked_keys = std::move(fields);
      TryAnswer(c);
      return;
    }
    Reply(c, 1, "TcpStore: malformed request");
  }

  // Answers a parked request whose keys all exist.
  void TryAnswer(Client* c) {
    for (const auto& k : c->parked_keys) {
      if (map_.find(k) == map_.end()) return;
    }
    c->parked = false;
    if (c->parked_cmd == kGet) {
      const auto& v = map_[c->parked_keys[0]];
      Reply(c, 0, std::string(v.begin(), v.end()));
    } else {
      Reply(c, 0, {});
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

  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  int port_ = 0;
  std::thread thread_;
  // Touched only by the server thread.
  std::unordered_map<std::string, std::vector<char>> map_;
  std::vector<std::unique_ptr<Client>> clients_;
};

// ---------------------------------------------------------------------------------------------

TcpStore::TcpStore(const TcpStoreOptions& options) : options_(options), port_(options.port) {}

TcpStore::~TcpStore() {
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
    ZERO_ASSIGN_OR_RETURN(store->server_, Server::Start(options.port));
    store->port_ = store->server_->port();
  }
  std::lock_guard<std::mutex> lock(store->mu_);
  ZERO_RETURN_IF_ERROR(store->ConnectLocked(Clock::now() + options.timeout));
  return store;
}

std::string TcpStore::address() const { return options_.host + ":" + std::to_string(port_); }

std::string TcpStore::Describe() const {
  std::string s = "TcpStore " + address();
  if (options_.rank >= 0) s += " (rank " + std::to_string(options_.rank) + ")";
  return s;
}

void TcpStore::CloseLocked() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

Status TcpStore::ConnectLocked(Clock::time_point deadline) {
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
        fd_ = fd;
        freeaddrinfo(res);
        return OkStatus();
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

  auto lost = [&](const std::string& what, int err) -> Status {
    CloseLocked();
    std::string m = Describe() + ": connection to the store lost while " + what;
    if (err != 0) m += " (" + ErrnoText(err) + ")";
    return UnavailableError(m + "; the host (rank 0) may have exited");
  };
  auto timed_out = [&]() -> Status {
    CloseLocked();  // a late reply would desynchronize the connection
    return DeadlineExceededError(Describe() + ": timed out after " +
                                 std::to_string(timeout.count()) + " ms");
  };

  size_t sent = 0;
  while (sent < frame.size()) {
    ssize_t w = send(fd_, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
    if (w > 0) {
      sent += static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd_, POLLOUT, 0};
      int rc = poll(&p, 1, RemainingMs(deadline));
      if (rc == 0) return timed_out();
      continue;
    }
    return lost("sending", errno);
  }

  auto read_exact = [&](char* dst, size_t bytes) -> Status {
    size_t got = 0;
    while (got < bytes) {
      ssize_t r = recv(fd_, dst + got, bytes - got, 0);
      if (r > 0) {
        got += static_cast<size_t>(r);
        continue;
      }
      if (r == 0) return lost("waiting for a reply", 0);
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        pollfd p{fd_, POLLIN, 0};
        int rc = poll(&p, 1, RemainingMs(deadline));
        if (rc == 0) return timed_out();
        continue;
      }
      return lost("waiting for a reply", errno);
    }
    return OkStatus();
  };

  char header[9];
  ZERO_RETURN_IF_ERROR(read_exact(header, 9));
  uint64_t len = ReadU64(header + 1);
  if (len > kMaxFieldBytes) return lost("reading a reply: malformed length", 0);
  std::vector<char> payload(len);
  if (len > 0) ZERO_RETURN_IF_ERROR(read_exact(payload.data(), len));
  if (header[0] != 0) {
    return InternalError(Describe() + ": " + std::string(payload.begin(), payload.end()));
  }
  return payload;
}

Status TcpStore::Set(const std::string& key, const std::vector<char>& value) {
  auto r = Request(kSet, {key, std::string(value.begin(), value.end())}, options_.timeout);
  if (!r.ok()) return r.status().WithContext("set '" + key + "'");
  return OkStatus();
}

Result<std::vector<char>> TcpStore::Get(const std::string& key, std::chrono::milliseconds timeout) {
  auto r = Request(kGet, {key}, timeout);
  if (!r.ok()) return r.status().WithContext("waiting for key '" + key + "'");
  return r;
}

Status TcpStore::Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  // One key at a time, so a timeout names the key that is missing.
  const auto deadline = Clock::now() + timeout;
  for (const auto& key : keys) {
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
