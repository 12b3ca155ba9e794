// GlooCommunicator: the Communicator over Gloo's TCP transport, for buffers in host memory.
//
// Owns one gloo TCP device (its sockets and event-loop thread), one gloo context connected to every
// other rank, and one comm thread that runs the collectives in the order they were issued (a FIFO
// queue), so they overlap with the caller's work; Work::Wait returns each one's status. Buffers are
// the caller's: the communicator reads and writes them only on the comm thread between the call and
// the completion of its Work. It keeps the rendezvous store alive for its whole lifetime (a TCP
// store's host must outlive every rank's rendezvous).
//
// Algorithms (all point-to-point over gloo unbound buffers; the reduction arithmetic is
// communicator.h's contract, bitwise identical on every rank and to a sequential rank-order fp32
// sum): ReduceScatter: every rank sends rank p the p-th share of its input and sums the N shares of
// its own chunk in rank order 0..N-1 in fp32 (16-bit converted exactly), rounding once (kAvg divides
// the fp32 sum by N first; kMax keeps the larger, NaN wins; ties keep the lower rank's value).
// AllReduce: the same exchange over N near-equal chunks of the buffer (the count need not be
// divisible by N) followed by an all-gather of the reduced chunks; each rank sends and receives
// (N-1)/N of the buffer, like a ring. Small buffers (<= 64 KiB) take one exchange of whole buffers
// instead (lower latency, the same result). AllGather: every rank sends its share to every other.
// Broadcast: the root sends to every rank (small) or scatters and all-gathers (large). The host ops
// sum doubles in rank order.
//
// Errors: a rank that never joins the rendezvous, dies, or stops taking part makes every other
// rank's pending or next call fail within CommOptions::timeout, with a status naming the operation,
// this rank and the peer (kDeadlineExceeded for the rank whose wait timed out, kUnavailable for the
// ranks that then see its connections close). After the first error the communicator closes its
// connections (so peers fail fast as well) and every later call fails fast with that error.
//
// Signals: gloo writes to its sockets with writev(2); so that a vanished peer gives EPIPE instead
// of killing the process with SIGPIPE, the comm thread and gloo's event-loop thread run with
// SIGPIPE blocked (no process-wide signal disposition is changed).
//
// Thread safety: all methods may be called from any thread; calls are serialized into the queue in
// the order they are made, which must be the same order on every rank.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/status.h"

namespace gloo {
namespace rendezvous {
class Context;
class Store;
}  // namespace rendezvous
namespace transport {
class Device;
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo

namespace zero {

struct GlooOptions {
  CommOptions comm;
  // Keys this communicator puts into the store are put under this prefix, so several
  // communicators can rendezvous through one store (each needs its own prefix).
  std::string prefix;
  // Address this rank's gloo sockets bind to and advertise. Loopback by default (all ranks on one
  // host). Empty: the address of this host's name (gethostname), unless `iface` is set.
  std::string hostname = "127.0.0.1";
  // Network interface whose address to use (e.g. "eth0"); takes precedence over hostname.
  std::string iface;
};

class GlooCommunicator final : public Communicator {
 public:
  // Rendezvous of rank `rank` of `world_size` through `store`: every rank calls this with a store
  // holding the same data (one HashStore for threads; a TcpStore or FileStore for processes) and
  // the same options.prefix. Blocks until every rank has joined and connected; fails with
  // kDeadlineExceeded naming the ranks that did not join within options.comm.timeout.
  // `device` is the Device whose memory the buffers live in; it must be host memory (kCpu) and
  // outlive the communicator.
  static Result<std::unique_ptr<GlooCommunicator>> Create(int rank, int world_size,
                                                          std::shared_ptr<gloo::rendezvous::Store> store,
                                                          Device* device, const GlooOptions& options = {});

  // Drains the queue (each queued collective still completes or fails within the timeout), then
  // closes the connections.
  ~GlooCommunicator() override;
  GlooCommunicator(const GlooCommunicator&) = delete;
  GlooCommunicator& operator=(const GlooCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend() const override { return "gloo"; }
  Device* device() const override { return device_; }

  Result<std::unique_ptr<Work>> AllReduce(void* buf, size_t count, DType t, ReduceOp op,
                                          Stream* after = nullptr) override;
  Result<std::unique_ptr<Work>> ReduceScatter(const void* send, void* recv, size_t recv_count, DType t, ReduceOp op,
                                              Stream* after = nullptr) override;
  Result<std::unique_ptr<Work>> AllGather(const void* send, void* recv, size_t send_count, DType t,
                                          Stream* after = nullptr) override;
  Result<std::unique_ptr<Work>> Broadcast(void* buf, size_t count, DType t, int root, Stream* after = nullptr) override;
  Status Barrier() override;
  Status AllReduceHost(double* values, size_t n, ReduceOp op) override;
  Status BroadcastHost(void* data, size_t bytes, int root) override;
  Status CheckHealth() override;

  // Fails the collective in progress and every later one with kUnavailable carrying `reason`, and
  // closes this rank's connections so that the peers' collectives fail promptly too. Used when
  // this rank gives up (RunThreadRanks calls it when a rank's body fails). Idempotent.
  void Abort(const std::string& reason) override;

 private:
  struct WorkState;
  class WorkHandle;
  class Exchange;
  class LoopKicker;
  struct Op {
    std::string name;           // "collective #3 AllReduce (7 x fp32, sum)"
    std::function<void()> run;  // runs on the comm thread; may throw gloo exceptions
    std::shared_ptr<WorkState> state;
  };

  GlooCommunicator(int rank, int world_size, Device* device, const GlooOptions& options);
  Status Rendezvous(std::shared_ptr<gloo::rendezvous::Store> store);

  // Queues `run`; returns a Work handle, or the sticky error if the communicator already failed.
  Result<std::unique_ptr<Work>> Enqueue(std::string name, std::function<void()> run, Stream* after);
  void ThreadMain();
  Status RunOp(Op& op);
  Status Translate(const std::string& op_name, const char* what, bool timed_out, const std::string& lost) const;
  // After an I/O error: "rank 2" (or "rank 1, rank 2"), the peers whose connection broke.
  std::string LostPeers();

  // Collective bodies (comm thread).
  void DoReduceChunks(const char* data, const std::vector<size_t>& begin, const std::vector<size_t>& len, DType t,
                      ReduceOp op, void* out, uint64_t slot);
  void DoAllReduce(void* buf, size_t count, DType t, ReduceOp op);
  void DoAllReduceDirect(void* buf, size_t count, DType t, ReduceOp op);
  void DoGatherChunks(char* buf, const std::vector<size_t>& begin, const std::vector<size_t>& len, size_t elem,
                      int skip_recv_rank, uint64_t slot);
  void DoBroadcast(void* buf, size_t bytes, size_t elem, int root);
  void DoBarrier();
  void DoAllReduceHost(double* values, size_t n, ReduceOp op);

  uint64_t NextSlot();

  const int rank_;
  const int world_size_;
  Device* const device_;
  const GlooOptions options_;

  std::shared_ptr<gloo::rendezvous::Store> store_;
  // Wakes gloo's event loop while connections are opened and closed (see the .cc).
  std::unique_ptr<LoopKicker> kicker_;
  std::shared_ptr<gloo::transport::Device> gloo_device_;
  // Used by the comm thread only (and by Create before the thread starts); reset after an error.
  std::shared_ptr<gloo::rendezvous::Context> context_;

  // Comm-thread state.
  uint64_t next_seq_ = 0;
  int waiting_peer_ = -1;
  const char* waiting_what_ = "";
  std::chrono::steady_clock::time_point deadline_;
  std::vector<char> staging_;
  std::vector<float> acc_;
  std::vector<double> acc_double_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> queue_;                                 // guarded by mu_
  bool stop_ = false;                                    // guarded by mu_
  uint64_t issued_ = 0;                                  // guarded by mu_
  Status failed_;                                        // guarded by mu_; sticky
  std::vector<gloo::transport::UnboundBuffer*> active_;  // guarded by mu_; for Abort
  std::thread thread_;
};

}  // namespace zero
