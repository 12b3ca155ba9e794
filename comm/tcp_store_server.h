// TcpStore::Server: the store's server, which the hosting rank's TcpStore owns (tcp_store.h states
// what it promises: the protocol, the authentication, the limits, the log). One thread polls the
// listening socket and every client over non-blocking sockets, so no call blocks on a client;
// GET and WAIT requests whose keys are missing are parked and answered by the SET that completes
// them. Owns the listening socket, the accepted connections, the wake pipe, the thread and the
// keys; the client (tcp_store.cc) touches none of them. tcp_store_server.cc also defines
// tcp_store.h's IsLoopbackHost, RouteSourceAddress and StoreBindAddress, which choose where the
// server listens. Private to the //comm:tcp_store target.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "comm/tcp_store.h"
#include "runtime/status.h"

namespace zero {

class TcpStore::Server {
 public:
  // Listens on bind_addr:o.port (port 0: a free one) and starts the thread. kInvalidArgument when
  // bind_addr does not resolve, kUnavailable when it cannot be bound (the port is in use, or it is
  // not an address of this machine); a failing socket, listen or pipe2 call as ErrnoError.
  static Result<std::unique_ptr<Server>> Start(const TcpStoreOptions& o, const std::string& bind_addr);
  // Stops the thread, then closes every socket; the keys go with it.
  ~Server();

  int port() const { return port_; }
  const std::string& bind_address() const { return bind_addr_; }

 private:
  using Clock = std::chrono::steady_clock;

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

  explicit Server(const TcpStoreOptions& o);

  std::string Describe() const;  // "TcpStore server on 127.0.0.1:29500"

  // Replies waiting to be read hold back further requests from the same client (Process stops,
  // then reading stops), so a client that pipelines requests and never reads costs at most about
  // two replies and one request.
  size_t OutCap() const { return options_.max_value_bytes + 64; }
  // The largest valid request: a SET of the longest key and value, or a WAIT for kMaxFields keys.
  size_t InCap() const;
  bool WantsInput(const Client& c) const;

  // The thread: polls, reads, answers, accepts, enforces deadlines, drops the dead.
  void Loop();
  // Logs `why` once per peer host and closes the connection.
  void Refuse(Client* c, const std::string& why);
  void Log(const std::string& host, const std::string& peer, const std::string& why);
  void Accept();
  void ReadFrom(Client* c);
  void Authenticate(Client* c);
  // Rejects the current request with `code` and closes the connection once the reply is sent
  // (the rest of the stream cannot be trusted to be aligned on a request).
  void RejectAndClose(Client* c, uint8_t code, const std::string& why);
  // Handles every complete request buffered for `c` unless one is parked or its unread replies
  // reached OutCap(). A header that cannot start a valid request (an unknown command, a field count
  // the command does not take) is refused as soon as it arrives, before any of its fields.
  void Process(Client* c);
  void Handle(Client* c, uint8_t cmd, std::vector<std::string> fields);
  // Answers a parked request whose keys all exist.
  void TryAnswer(Client* c);
  void WakeParked();
  void Reply(Client* c, uint8_t code, const std::string& payload);
  void Flush(Client* c);

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

}  // namespace zero
