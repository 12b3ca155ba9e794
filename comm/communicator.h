// Communicator: collectives among the data-parallel ranks of one job.
//
// Backends: GlooCommunicator (gloo_communicator.h; buffers in host memory, ranks as threads of one
// process or as processes, over TCP on loopback or a network) and NcclCommunicator
// (nccl_communicator.h; buffers in CUDA device memory, collectives on the communicator's own
// stream). Create one through rendezvous.h.
//
// Buffers: "device" buffers of the backend's Device (host memory for Gloo, GPU memory for NCCL).
// Every collective is asynchronous: it returns a Work handle once queued. The caller must keep the
// buffers alive and must not touch them (read outputs or write inputs) until Work::Wait() returns
// OK, or, for NCCL, until a stream made to wait with Work::StreamWait has passed that point.
// Collectives must be issued in the same order on every rank (as with NCCL and Gloo).
//
// Ordering with compute: a collective given `after` (a Stream of the same Device) starts only when
// the work already enqueued on `after` is done (NCCL: an event recorded on `after` is waited on by
// the comm stream; no host sync. CPU: streams are synchronous, so this holds trivially).
//
// Padding contract: reduce_scatter and all_gather move equal shares: `send` of ReduceScatter holds
// world_size * recv_count elements and rank r receives elements [r*recv_count, (r+1)*recv_count).
// Callers whose data is not divisible by world_size pad it (zero/partition.h computes the padded
// size); the communicator never pads.
//
// Reduction semantics (Gloo backend, and the contract the equivalence suite relies on): the sum of
// element i is accumulated in fp32 in rank order 0, 1, ..., N-1 (16-bit inputs converted exactly)
// and rounded once to the buffer's dtype; kAvg divides that fp32 sum by N before the rounding. So
// results are bitwise reproducible and identical on every rank. NCCL sums in its own order.
//
// Errors and timeouts: a rank that dies or never arrives makes every other rank's pending or next
// collective fail with kDeadlineExceeded/kUnavailable within `timeout` (CommOptions), naming the
// rank and the operation; after such an error the communicator is unusable.
//
// Watchdog (NCCL, and FaultyCommunicator; see docs/comm.md): every collective in flight is watched
// by a thread; one that does not complete within `timeout` of becoming the oldest in flight, or an
// asynchronous communicator error, aborts the communicator. Every pending and later Wait,
// StreamWait and collective then returns that error, which names the collective ("collective #N
// Op (count x dtype, ...)") and the rank; a host synchronization of a stream made to wait with
// StreamWait returns (the abort makes the collective's kernels exit), after which CheckHealth()
// returns the error: the buffers of the aborted collectives hold no defined values.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/status.h"

namespace zero {

enum class ReduceOp { kSum, kAvg, kMax };
const char* ReduceOpName(ReduceOp op);

// Handle to one queued collective.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the collective is done (buffers usable from the host; for NCCL the comm stream is
  // synchronized). Returns the collective's error, if any. Calling twice returns the same status.
  virtual Status Wait() = 0;
  // Non-blocking: true once done (successfully or not).
  virtual bool IsCompleted() = 0;
  // Makes `stream` wait for this collective without blocking the host (NCCL); CPU: same as Wait().
  virtual Status StreamWait(Stream* stream) = 0;
};

struct CommOptions {
  std::chrono::milliseconds timeout{300000};  // per collective and for rendezvous
};

// "2000 ms": how every communicator's messages write a timeout.
std::string TimeoutText(std::chrono::milliseconds t);

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string backend() const = 0;  // "gloo", "nccl"
  virtual Device* device() const = 0;       // the Device whose memory the buffers live in

  // In place: buf[i] = op over ranks of buf[i].
  virtual Result<std::unique_ptr<Work>> AllReduce(void* buf, size_t count, DType t, ReduceOp op,
                                                  Stream* after = nullptr) = 0;
  // recv[j] = op over ranks r of send_r[rank * recv_count + j]. send and recv must not overlap.
  virtual Result<std::unique_ptr<Work>> ReduceScatter(const void* send, void* recv, size_t recv_count, DType t,
                                                      ReduceOp op, Stream* after = nullptr) = 0;
  // recv[r * send_count + j] = send_r[j]. `send` may alias recv + rank * send_count (in place).
  virtual Result<std::unique_ptr<Work>> AllGather(const void* send, void* recv, size_t send_count, DType t,
                                                  Stream* after = nullptr) = 0;
  virtual Result<std::unique_ptr<Work>> Broadcast(void* buf, size_t count, DType t, int root,
                                                  Stream* after = nullptr) = 0;
  virtual Status Barrier() = 0;

  // Small synchronous reductions of host doubles (grad-norm partial sums, overflow flags, loss
  // values): values[i] = op over ranks, summed in rank order, identical on every rank.
  virtual Status AllReduceHost(double* values, size_t n, ReduceOp op) = 0;
  // Synchronous broadcast of host bytes from root (config checks, checkpoint tags).
  virtual Status BroadcastHost(void* data, size_t bytes, int root) = 0;

  // Non-blocking: OK while the communicator is usable; once a collective failed or timed out (or
  // after Abort), the sticky error naming the collective and the rank. Call it after every host
  // synchronization (Device::SynchronizeStream/SynchronizeEvent/Synchronize) that follows a
  // Work::StreamWait before trusting the buffers: a collective aborted by the watchdog lets the
  // synchronization return without an error of its own.
  virtual Status CheckHealth() = 0;

  // Makes the communicator unusable with kUnavailable carrying `reason`: the collective in
  // progress and every later call fail, and the peers' pending collectives fail promptly (their
  // connections close / NCCL kernels exit). Idempotent; the first error stays the sticky one.
  virtual void Abort(const std::string& reason) = 0;

  // Fault propagation: this rank failed with `error` (in the user's code, a local I/O or device
  // error, a collective) and will take no further part in the job's collectives. Tells every rank
  // where the communicator has a channel for it, so that their pending and next collectives fail
  // within seconds with kUnavailable naming this rank and `error`, instead of waiting for `timeout`;
  // this communicator is then aborted too. Communicators made by CreateCommunicator over a TcpStore
  // have that channel (rendezvous.h); the default has none and does nothing (the peers learn of the
  // fault when this rank's process exits or, failing that, at their timeout). A rank whose own
  // failure was caused by a fault another rank reported does not report it again. Never blocks for
  // long (bounded by a few seconds when the store is unreachable); idempotent.
  virtual void ReportFault(const Status& error);
};

}  // namespace zero
