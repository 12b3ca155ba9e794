#include "comm/tcp_store.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>

#include <gloo/common/error.h>

#include "comm/hmac_sha256.h"
#include "comm/tcp_socket.h"
#include "comm/tcp_store_protocol.h"
#include "comm/tcp_store_server.h"
#include "runtime/errno_text.h"

namespace zero {
namespace {

using net::HostPort;
using net::Io;
using net::RecvExact;
using net::RemainingMs;
using net::SendAll;
using net::SetNoDelay;
using tcp_store_protocol::EncodeRequest;
using tcp_store_protocol::kBusy;
using tcp_store_protocol::kClientContext;
using tcp_store_protocol::kGet;
using tcp_store_protocol::kHello;
using tcp_store_protocol::kMacBytes;
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

using Clock = std::chrono::steady_clock;

// The heartbeat's and the watch's side threads: each has its own connection `*fd` and a pipe
// `wake` that wakes it to stop.

// Opens `wake`; on failure closes *fd as well (sets it to -1) and names `who`.
Status OpenWakePipe(int* fd, int wake[2], const std::string& who) {
  if (pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    const int err = errno;
    close(*fd);
    *fd = -1;
    return ErrnoError("pipe2", who, err);
  }
  return OkStatus();
}

// Wakes and joins `thread` if it runs, then closes its connection and pipe. Idempotent.
void StopSideThread(std::thread* thread, int* fd, int wake[2]) {
  if (thread->joinable()) {
    char b = 1;
    ssize_t ignored = write(wake[1], &b, 1);
    (void)ignored;
    thread->join();
  }
  for (int* f : {fd, &wake[0], &wake[1]}) {
    if (*f >= 0) close(*f);
    *f = -1;
  }
}

}  // namespace

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
                    (io == Io::kTimeout  ? "did not answer"
                     : io == Io::kClosed ? "closed the connection"
                                         : "failed") +
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
  ZERO_RETURN_IF_ERROR(RandomBytes(kNonceBytes, &client_nonce).WithContext(Describe() + ": the handshake's nonce"));
  const std::string proof = client_nonce + Mac(options_.secret, kClientContext, server_nonce, client_nonce);
  if (Io io = SendAll(fd, proof.data(), proof.size(), deadline, &err); io != Io::kOk) {
    return broken(io, "during the handshake");
  }
  char verdict = 1;
  if (Io io = RecvExact(fd, &verdict, 1, deadline, &err); io != Io::kOk) return broken(io, "during the handshake");
  if (verdict != 0) {
    return FailedPreconditionError(
        Describe() +
        ": the store refused this rank's proof of the job secret: ZERO_JOB_SECRET differs from "
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
      return InvalidArgumentError(Describe() + ": cannot resolve host '" + options_.host + "': " + gai_strerror(gai));
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
                          std::to_string(options_.timeout.count()) + " ms (last error: " + last_error +
                          "); is rank 0 running and MASTER_ADDR/MASTER_PORT right?");
}

Result<std::vector<char>> TcpStore::Request(uint8_t cmd, const std::vector<std::string>& fields,
                                            std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto deadline = Clock::now() + timeout;
  if (fd_ < 0) ZERO_RETURN_IF_ERROR(ConnectLocked(deadline));

  const std::string frame = EncodeRequest(cmd, fields);

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
  ZERO_RETURN_IF_ERROR(OpenWakePipe(&heartbeat_fd_, heartbeat_wake_, Describe() + " heartbeat"));
  heartbeat_ = std::thread([this, f = std::move(on_lost)] { HeartbeatMain(f); });
  return OkStatus();
}

void TcpStore::StopHeartbeat() { StopSideThread(&heartbeat_, &heartbeat_fd_, heartbeat_wake_); }

void TcpStore::HeartbeatMain(std::function<void(const Status&)> on_lost) {
  const auto bound = options_.heartbeat;
  const auto period = std::max(bound / 2, std::chrono::milliseconds(1));
  const std::string ping = EncodeRequest(kPing, {});
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

Status TcpStore::WatchKey(const std::string& key, std::function<void(Result<std::vector<char>>)> on_event) {
  ZERO_RETURN_IF_ERROR(CheckSizes(key, nullptr));
  ZERO_ASSIGN_OR_RETURN(watch_fd_, Connect(Clock::now() + options_.timeout));
  ZERO_RETURN_IF_ERROR(OpenWakePipe(&watch_fd_, watch_wake_, Describe() + " watch"));
  watch_ = std::thread([this, key, f = std::move(on_event)] { WatchMain(key, f); });
  return OkStatus();
}

void TcpStore::StopWatch() { StopSideThread(&watch_, &watch_fd_, watch_wake_); }

void TcpStore::WatchMain(const std::string& key, const std::function<void(Result<std::vector<char>>)>& on_event) {
  auto lost = [&](const std::string& what, int err) {
    on_event(UnavailableError(Describe() + ": the watch of key '" + key + "' ended: " + what +
                              (err != 0 ? " (" + ErrnoText(err) + ")" : std::string())));
  };
  const std::string frame = EncodeRequest(kGet, {key});
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
    return ResourceExhaustedError(Describe() + ": value of " + std::to_string(value->size()) + " bytes for key '" +
                                  key + "' is larger than the store's limit of " +
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
