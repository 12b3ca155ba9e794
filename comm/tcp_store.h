// TcpStore: a small key-value store over TCP through which the ranks of one job rendezvous.
//
// The rank that hosts it (rank 0 by convention: is_server) runs a server thread listening on
// `port` on every IPv4 interface; every rank, the host included, is a client that connects to
// `host:port`, retrying until `timeout` while the server is not up yet. Keys are strings, values
// are bytes; set overwrites, get and wait block until the keys exist or the deadline passes. It
// implements gloo::rendezvous::Store (so gloo contexts can connectFullMesh through it; those
// methods throw gloo::IoException as gloo expects) and offers Status-returning equivalents for
// everything else (the NCCL unique id, rendezvous checks). Errors name the store's address, this
// rank and the keys still missing. The server keeps its keys for the lifetime of the hosting
// TcpStore, so the hosting process must keep it alive until every rank has finished reading
// (communicators created through rendezvous.h own their store for their whole lifetime).
//
// Thread safety: all methods may be called from several threads; requests on one TcpStore are
// serialized over its single connection. Owns one socket (plus, on the host, the listening socket,
// the accepted connections and the server thread), closed on destruction.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "runtime/status.h"

namespace zero {

struct TcpStoreOptions {
  std::string host = "127.0.0.1";  // where clients connect (MASTER_ADDR)
  int port = 29500;                // MASTER_PORT; 0 on the host picks a free port (see port())
  bool is_server = false;          // host the server in this process
  int rank = -1;                   // for error messages only
  // Connect retry window, and the deadline of gloo's get()/wait() without an explicit timeout.
  std::chrono::milliseconds timeout{300000};
};

class TcpStore final : public gloo::rendezvous::Store {
 public:
  // Starts the server (is_server) and connects to it. Fails with kUnavailable if the port cannot
  // be bound (host) or nothing accepts on host:port within the timeout (others).
  static Result<std::unique_ptr<TcpStore>> Create(const TcpStoreOptions& options);
  ~TcpStore() override;
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  // The port the server listens on (resolved when options.port was 0).
  int port() const { return port_; }
  // "host:port", as used in messages.
  std::string address() const;

  // --- Status API ---------------------------------------------------------------------------
  Status Set(const std::string& key, const std::vector<char>& value);
  // Blocks until `key` exists; kDeadlineExceeded after `timeout` naming the key.
  Result<std::vector<char>> Get(const std::string& key, std::chrono::milliseconds timeout);
  // Blocks until every key exists; kDeadlineExceeded after `timeout` naming the missing keys.
  Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);

  // --- gloo::rendezvous::Store (throws gloo::IoException on error or timeout) ---------------
  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  class Server;
  explicit TcpStore(const TcpStoreOptions& options);

  // One request/response exchange; reconnects first if an earlier request broke the connection.
  Result<std::vector<char>> Request(uint8_t cmd, const std::vector<std::string>& fields,
                                    std::chrono::milliseconds timeout);
  Status ConnectLocked(std::chrono::steady_clock::time_point deadline);
  void CloseLocked();
  std::string Describe() const;  // "TcpStore 127.0.0.1:29500 (rank 2)"

  TcpStoreOptions options_;
  int port_ = 0;
  std::unique_ptr<Server> server_;
  std::mutex mu_;  // serializes requests; guards fd_
  int fd_ = -1;
};

}  // namespace zero
