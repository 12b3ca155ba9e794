// TcpStore: a small key-value store over TCP through which the ranks of one job rendezvous.
//
// The rank that hosts it (rank 0 by convention: is_server) runs a server thread listening on
// `port` at one address (StoreBindAddress: loopback for a loopback host, else this machine's
// address toward `host`; never every interface unless bind_addr says "0.0.0.0"); every rank, the
// host included, is a client that connects to `host:port`, retrying until `timeout` while the
// server is not up yet. Keys are strings, values are bytes; set overwrites, get and wait block
// until the keys exist or the deadline passes. It implements gloo::rendezvous::Store (so gloo
// contexts can connectFullMesh through it; those methods throw gloo::IoException as gloo expects)
// and offers Status-returning equivalents for everything else (the NCCL unique id, rendezvous
// checks). Errors name the store's address, this rank and the keys still missing. The server
// keeps its keys for the lifetime of the hosting TcpStore, so the hosting process must keep it
// alive until every rank has finished reading (communicators created through rendezvous.h own
// their store for their whole lifetime).
//
// Authentication (docs/comm.md, "The store's security model"): every connection proves the job
// secret before its first command, and the server proves it back:
//   server -> client  "ZSTORE1\0" + 32-byte server nonce   ("ZSTBUSY\0": too many connections)
//   client -> server  32-byte client nonce + HMAC-SHA256(secret, "zero-tcpstore-v1 client" || sn || cn)
//   server -> client  0x00 + HMAC-SHA256(secret, "zero-tcpstore-v1 server" || sn || cn), or 0x01
//                     (refused) and close
// An empty secret is the empty HMAC key: it keeps out nothing (loopback jobs without a secret).
// Requests: u8 command (1 set: key, value; 2 get: key; 3 wait: 1..64 keys; 4 ping: no fields), u32
// field count, per field u64 length + bytes (little-endian). Replies: u8 code (0 ok, 1 malformed,
// 2 over a limit), u64 length + bytes.
//
// The server never blocks on one client (one poll loop, non-blocking sockets) and bounds what
// each may cost: key and value sizes, keys stored, connections (the oldest unauthenticated one is
// dropped first), and a deadline for the handshake and for each request once its first byte
// arrived. A connection that breaks a rule is answered (malformed, over a limit) when the rule is
// about a request, then closed, and logged on stderr once per peer address. A request header that
// cannot start a valid request (unknown command, wrong field count) or announces a field over its
// limit is refused as soon as it arrives. Per connection the server buffers at most one largest
// valid request unread and about two replies unsent: a client that pipelines requests without
// reading the replies is held back, then closed at the request deadline
// (comm/tcp_store_fuzz_test.cc).
//
// Heartbeat (StartHeartbeat, other ranks only): a second connection on which a thread pings the
// server, so that a rank notices within seconds that rank 0's process (the server) exited, was
// killed or hangs, instead of waiting for a collective's timeout. rendezvous.h aborts the
// communicator with it.
//
// Watch (WatchKey, every rank, the host included): a third connection on which a GET of one key
// stays parked at the server until some client sets the key, so that every rank learns of it at
// once without polling (rendezvous.h publishes one rank's fault through it).
//
// Thread safety: all methods may be called from several threads; requests on one TcpStore are
// serialized over its single connection. Owns one socket (plus, on the host, the listening socket,
// the accepted connections and the server thread; with a heartbeat, its socket and thread), closed
// on destruction; with a watch, its socket and thread).
//
// Files: tcp_store.cc is the client; tcp_store_server.h the server; tcp_store_protocol.h the wire
// format's constants, encoding and handshake proofs, shared by both; tcp_socket.h the socket
// utilities under them. Only this header is for users.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
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
  // The job secret every connection proves (ZERO_JOB_SECRET); empty: no protection.
  std::string secret;
  // StartHeartbeat's bound (ZERO_STORE_HEARTBEAT_MS): a ping every heartbeat / 2, and the server is
  // lost when one stays unanswered for `heartbeat`, or heartbeat / 4 after its connection closed
  // (the grace lets ranks finish the collective rank 0 left at a normal exit). 0: no heartbeat.
  std::chrono::milliseconds heartbeat{5000};
  // --- server only ------------------------------------------------------------------------------
  // Where to listen (ZERO_STORE_BIND_ADDR); empty: StoreBindAddress(host).
  std::string bind_addr;
  // Ranks expected; bounds connections (4 x world_size + 16) and keys (1024 + 64 x world_size).
  // 0: unknown (1024 connections, 65536 keys).
  int world_size = 0;
  size_t max_key_bytes = 4096;
  size_t max_value_bytes = size_t{1} << 20;  // ZERO_STORE_MAX_VALUE_BYTES
  size_t max_keys = 0;                       // 0: from world_size as above
  size_t max_total_bytes = size_t{256} << 20;
  size_t max_connections = 0;  // 0: from world_size as above
  // The handshake, and each request from its first byte, must complete within this.
  std::chrono::milliseconds request_timeout{10000};
};

// True for "localhost", "::1" and 127.0.0.0/8 literals.
bool IsLoopbackHost(const std::string& host);

// The local address the kernel would use to reach `host` (no packet is sent); "" when `host` does
// not resolve or no route leads to it.
std::string RouteSourceAddress(const std::string& host, int port);

// The address the store's server binds for clients that connect to `host`: `host` itself for a
// loopback literal ("127.0.0.1" for "localhost"); else the first address `host` resolves to that
// is an address of this machine; else RouteSourceAddress(host). kInvalidArgument naming `host`
// (and ZERO_STORE_BIND_ADDR) when none applies.
Result<std::string> StoreBindAddress(const std::string& host);

class TcpStore final : public gloo::rendezvous::Store {
 public:
  // Starts the server (is_server) and connects to it. Fails with kUnavailable if the port cannot
  // be bound (host) or nothing accepts on host:port within the timeout (others), and with
  // kFailedPrecondition if the server refuses this client's proof of the secret or cannot prove
  // it back (the ranks were given different ZERO_JOB_SECRET values).
  static Result<std::unique_ptr<TcpStore>> Create(const TcpStoreOptions& options);
  ~TcpStore() override;
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  // The port the server listens on (resolved when options.port was 0).
  int port() const { return port_; }
  // The address the server listens on (host only; "" on other ranks).
  std::string bind_address() const;
  // "host:port", as used in messages.
  std::string address() const;

  // --- Status API ---------------------------------------------------------------------------
  // kResourceExhausted naming the key when the key or value is over the server's limits or the
  // store holds as many keys (or bytes) as it may.
  Status Set(const std::string& key, const std::vector<char>& value);
  // Set within `timeout` instead of options.timeout (kDeadlineExceeded after it).
  Status Set(const std::string& key, const std::vector<char>& value, std::chrono::milliseconds timeout);
  // Blocks until `key` exists; kDeadlineExceeded after `timeout` naming the key.
  Result<std::vector<char>> Get(const std::string& key, std::chrono::milliseconds timeout);
  // Blocks until every key exists; kDeadlineExceeded after `timeout` naming the missing keys.
  Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);

  // --- gloo::rendezvous::Store (throws gloo::IoException on error or timeout) ---------------
  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

  // --- Heartbeat --------------------------------------------------------------------------------
  // Opens and authenticates a second connection (as Create does, within options.timeout) and starts
  // a thread that pings the server on it every heartbeat / 2 and otherwise sleeps in poll(): one
  // wakeup, 5 bytes out and 9 back per period, nothing on the request path. When the server closes
  // that connection (rank 0's process exited or was killed: noticed at once) or leaves a ping
  // unanswered for `heartbeat` (stopped, hung or unreachable: noticed within 1.5 x heartbeat),
  // `on_lost` is called once, on that thread, with kUnavailable naming the store's address and what
  // happened, and the thread ends. OK and nothing started on the host (the server is this process)
  // or when options.heartbeat is 0. Errors: those of Create's connection (kUnavailable,
  // kFailedPrecondition). REQUIRES: called at most once.
  Status StartHeartbeat(std::function<void(const Status& lost)> on_lost);
  // Ends the heartbeat: when it returns, on_lost is not running and will not be called. Idempotent;
  // the destructor calls it. REQUIRES: not called from on_lost.
  void StopHeartbeat();

  // --- Watch -------------------------------------------------------------------------------------
  // Opens and authenticates another connection (as Create does, within options.timeout) and starts
  // a thread that sends one GET of `key` on it and sleeps in poll() until the reply: the server
  // answers when some client sets `key` (at once if it exists), so nothing is sent or woken while it
  // is absent. on_event is called once, on that thread: with the key's value, or with kUnavailable
  // naming the store when the connection ends first (the server exited or was killed; the heartbeat
  // is what reports that) - then the thread ends. Also on the host (a client of its own server).
  // Errors: those of Create's connection. REQUIRES: called at most once.
  Status WatchKey(const std::string& key, std::function<void(Result<std::vector<char>> event)> on_event);
  // Ends the watch: when it returns, on_event is not running and will not be called. Idempotent; the
  // destructor calls it. REQUIRES: not called from on_event.
  void StopWatch();

 private:
  class Server;
  explicit TcpStore(const TcpStoreOptions& options);

  // One request/response exchange; reconnects first if an earlier request broke the connection.
  Result<std::vector<char>> Request(uint8_t cmd, const std::vector<std::string>& fields,
                                    std::chrono::milliseconds timeout);
  Status ConnectLocked(std::chrono::steady_clock::time_point deadline);
  // A new authenticated connection to the server (ConnectLocked's retry loop); touches no member
  // but the options.
  Result<int> Connect(std::chrono::steady_clock::time_point deadline);
  void HeartbeatMain(std::function<void(const Status&)> on_lost);
  void WatchMain(const std::string& key, const std::function<void(Result<std::vector<char>>)>& on_event);
  // The client half of the handshake on a fresh connection; kUnavailable to retry (server busy or
  // gone), kFailedPrecondition for a secret mismatch.
  Status HandshakeLocked(int fd, std::chrono::steady_clock::time_point deadline);
  void CloseLocked();
  // kResourceExhausted when the key or value is over this rank's limits (checked before sending).
  Status CheckSizes(const std::string& key, const std::vector<char>* value) const;
  std::string Describe() const;  // "TcpStore 127.0.0.1:29500 (rank 2)"

  TcpStoreOptions options_;
  int port_ = 0;
  std::unique_ptr<Server> server_;
  std::mutex mu_;  // serializes requests; guards fd_
  int fd_ = -1;
  // Heartbeat: its connection and a pipe that wakes its thread to stop (set up by StartHeartbeat,
  // closed by StopHeartbeat after the join).
  int heartbeat_fd_ = -1;
  int heartbeat_wake_[2] = {-1, -1};
  std::thread heartbeat_;
  // Watch: its connection and stop pipe (as the heartbeat's).
  int watch_fd_ = -1;
  int watch_wake_[2] = {-1, -1};
  std::thread watch_;
};

}  // namespace zero
