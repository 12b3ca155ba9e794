// SameDeviceCommunicator: the Communicator for ranks that are threads of one process sharing one
// device (one GPU, or the host for the CPU backend), so that several data-parallel ranks run where
// NCCL refuses them (NCCL takes one rank per GPU).
//
// A SameDeviceGroup is created once for N ranks; each rank's thread then Join()s it with its own
// Device object, which owns that rank's streams (its default stream is the rank's compute stream):
// with CUDA every rank opens its own CudaDevice on the same ordinal (CudaDevice objects of one
// ordinal share the process's CUDA context, so a buffer of one rank is a plain device pointer for
// the others, and their streams and events mix), with the CPU backend every rank has its own
// CpuDevice. The group owns the rendezvous state (per collective, a slot where each rank publishes
// its buffer pointers, its events and a description of the call); each communicator owns one
// stream of its rank's device (the comm stream) on which its part of every collective runs.
//
// A collective: the comm stream waits for `after` (an event recorded on it; no host sync), records
// an "arrived" event and publishes it with the call's pointers; once every rank has published (a
// host-side wait with the timeout), each rank makes its comm stream wait for every other rank's
// event, enqueues its own part (device copies and the rank_reduce.h kernel, reading the other
// ranks' buffers directly), records an event and publishes it again; once every rank has, the
// comm stream waits for all of those and records the completion event the Work handle holds. So a
// collective completes on rank r's stream only after every rank has finished reading rank r's
// buffers: the caller may overwrite its input as soon as its stream passes the completion.
//   ReduceScatter: rank r reduces share r of every rank's input into its output.
//   AllGather: rank r copies every rank's input into its output.
//   Broadcast: every other rank copies the root's buffer.
//   AllReduce (in place): rank r reduces chunk r (N near-equal chunks) of every rank's buffer into
//     chunk r of its own (nobody else reads that chunk), then, after a second exchange, copies
//     every other rank's reduced chunk into its buffer.
//   Barrier, AllReduceHost, BroadcastHost: host-side only (the host doubles are summed in rank
//     order exactly as GlooCommunicator does).
// Reductions: rank order, fp32, rounded once (rank_reduce.h): bitwise Gloo's results, NaN payloads
// aside. Collectives with a zero count return a completed Work without a rendezvous, as Gloo.
//
// Blocking: a collective call returns once every rank has issued the same collective and the
// rank's part is enqueued; nothing waits on the device. The device work cannot hang (every wait is
// on an event already recorded), so no watchdog is needed: the only waits are the host-side ones,
// each bounded by CommOptions::timeout.
//
// Errors: a rank that does not issue the collective within the timeout makes the waiting ranks
// fail with kDeadlineExceeded naming the collective ("collective #N Op (count x dtype, ...)"), the
// waiting rank and the missing ranks (with the last collective each of those issued); the group is
// then failed, and every later collective of every rank fails at once with that error. Ranks that
// issue different collectives as the same one (op, count, dtype, reduction or root differ) fail
// with kInvalidArgument naming both ranks and both calls. Abort() on one rank fails the group with
// kUnavailable carrying the reason; the waiting ranks fail promptly. Destroying a rank's
// communicator makes the ranks waiting for it (and every later collective) fail with kUnavailable
// naming it, so peers never hang on a rank that is gone. After its first error a communicator is
// unusable (CheckHealth and every call return the sticky error). Invalid arguments (null buffers,
// overlaps, a root out of range) fail on the calling rank only, before any rendezvous.
//
// Supported devices: CpuDevice and (with CUDA) CudaDevice, all ranks of one kind and ordinal.
// SameDeviceOptions::kernels replaces the built-in reduction and event query (tests use it with a
// device whose streams really run asynchronously).
//
// Thread safety: every method may be called from any thread; the calls of one communicator are
// serialized, and must be issued in the same order on every rank. Abort and CheckHealth never block
// on a collective in progress.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/rank_reduce.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/status.h"

namespace zero {

// How a rank's part of a collective runs on its device. Empty members: the built-in backends
// (CpuDevice: on the calling thread; CudaDevice: the same_device_kernels.h kernel, cudaEventQuery).
struct SameDeviceKernels {
  // Enqueues args' reduction on `stream` of `device`.
  std::function<Status(Device* device, Stream* stream, const RankReduceArgs& args)> reduce;
  // Non-blocking: true once `event` (recorded on a stream of `device`) has completed.
  std::function<Result<bool>(Device* device, Event* event)> query;
};

struct SameDeviceOptions {
  CommOptions comm;  // timeout: per collective, for every host-side wait
  SameDeviceKernels kernels;
};

class SameDeviceCommunicator;

class SameDeviceGroup : public std::enable_shared_from_this<SameDeviceGroup> {
 public:
  // A group of `world_size` ranks (1..kMaxRankReduceSources). InvalidArgument otherwise, or for a
  // non-positive timeout.
  static Result<std::shared_ptr<SameDeviceGroup>> Create(int world_size, SameDeviceOptions options = {});
  ~SameDeviceGroup();
  SameDeviceGroup(const SameDeviceGroup&) = delete;
  SameDeviceGroup& operator=(const SameDeviceGroup&) = delete;

  int world_size() const { return world_size_; }

  // Rank `rank`'s communicator on `device` (which must outlive it). Does not wait for the other
  // ranks (the first collective does). InvalidArgument for a rank out of range or already joined,
  // a device that is neither a CpuDevice nor a CudaDevice (without SameDeviceOptions::kernels), or
  // one of another kind or ordinal than the ranks that joined before; the error of creating its
  // comm stream otherwise. The communicator keeps the group alive.
  Result<std::unique_ptr<SameDeviceCommunicator>> Join(int rank, Device* device);

  // OK while no collective failed and no rank aborted; else the first failure.
  Status status() const;

  // Fails the group with `error` unless it failed already: every waiting rank wakes and fails,
  // every later collective fails at once (e.g. a rank that could not even create its device).
  void Fail(const Status& error);

 private:
  friend class SameDeviceCommunicator;
  struct Call;     // what one rank issued as one collective
  struct Posting;  // one rank's entry in a slot
  struct Slot;     // the rendezvous of one collective

  SameDeviceGroup(int world_size, SameDeviceOptions options);

  // Every rank's pointers and events of one phase, by rank.
  struct Gathered {
    std::vector<const void*> in;
    std::vector<void*> out;
    std::vector<std::shared_ptr<Event>> events;
  };
  // Publishes rank `rank`'s arrival at collective `seq` (its call, pointers and "arrived" event)
  // and waits for every rank's; fills `gathered`. Returns the slot (keep it until Leave), or the
  // error; *not_started is set when the group had failed before this call (nothing was posted).
  Result<std::shared_ptr<Slot>> Arrive(int rank, uint64_t seq, const Call& call, const void* in, void* out,
                                       std::shared_ptr<Event> arrived, std::chrono::steady_clock::time_point deadline,
                                       Gathered* gathered, bool* not_started);
  // Publishes the end of rank `rank`'s phase `phase` (>= 1) of `slot` and waits for every rank's;
  // fills `events` with every rank's event of that phase.
  Status Publish(int rank, Slot* slot, int phase, std::shared_ptr<Event> event,
                 std::chrono::steady_clock::time_point deadline, std::vector<std::shared_ptr<Event>>* events);
  // Rank `rank` is done with `slot` (the last rank to leave frees it).
  void Leave(int rank, const std::shared_ptr<Slot>& slot);
  // Rank `rank`'s communicator is being destroyed.
  void Depart(int rank);

  // REQUIRES: mu_ held. Waits until every rank has posted `phase` of `slot`.
  Status AwaitLocked(std::unique_lock<std::mutex>& lock, int rank, Slot* slot, int phase,
                     std::chrono::steady_clock::time_point deadline);
  // REQUIRES: mu_ held. "rank 2 (its last collective: #4 AllGather (...))".
  std::string DescribeRankLocked(int rank) const;

  const int world_size_;
  const SameDeviceOptions options_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  Status failed_;                                    // guarded by mu_; the first failure
  std::map<uint64_t, std::shared_ptr<Slot>> slots_;  // guarded by mu_; by sequence number
  std::vector<bool> joined_;                         // guarded by mu_
  std::vector<bool> departed_;                       // guarded by mu_
  std::vector<std::string> last_issued_;             // guarded by mu_; per rank
  int kind_ = -1;                                    // guarded by mu_; the joined devices' kind
  int ordinal_ = -1;                                 // guarded by mu_; and ordinal
};

class SameDeviceCommunicator final : public Communicator {
 public:
  // Waits for the comm stream, then leaves the group: ranks waiting for this one, and every later
  // collective of the group, fail with kUnavailable naming it.
  ~SameDeviceCommunicator() override;
  SameDeviceCommunicator(const SameDeviceCommunicator&) = delete;
  SameDeviceCommunicator& operator=(const SameDeviceCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend() const override { return "same_device"; }
  Device* device() const override { return device_; }
  // The stream every collective of this rank runs on.
  Stream* comm_stream() const { return stream_.get(); }

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
  void Abort(const std::string& reason) override;

 private:
  friend class SameDeviceGroup;
  class SameDeviceWork;
  struct Shared;  // the sticky error, shared with the Work handles
  using Group = SameDeviceGroup;

  SameDeviceCommunicator(std::shared_ptr<SameDeviceGroup> group, int rank, Device* device, SameDeviceKernels kernels,
                         std::unique_ptr<Stream> stream, std::unique_ptr<Event> after_event);

  // One phase of a device collective: enqueues this rank's part on the comm stream, given every
  // rank's posting of the slot (pointers by rank).
  using PhaseFn = std::function<Status(const std::vector<const void*>& in, const std::vector<void*>& out)>;
  // Runs a collective: `call` describes it (every rank must issue the same), `in`/`out` are this
  // rank's pointers; `phases` run in order, each after every rank finished the previous one on the
  // device (device collectives) or the host (host collectives: `host` true, no events).
  Result<std::unique_ptr<Work>> Run(const SameDeviceGroup::Call& call, const void* in, void* out, Stream* after,
                                    const std::vector<PhaseFn>& phases, bool host);
  Status Reduce(const RankReduceArgs& args);
  Status Copy(void* dst, const void* src, size_t bytes);
  // The sticky error (set once): records and returns `error`.
  Status Stick(const Status& error);
  std::string Who(const std::string& name) const;

  const std::shared_ptr<SameDeviceGroup> group_;
  const int rank_;
  const int world_size_;
  Device* const device_;
  const SameDeviceKernels kernels_;
  const std::unique_ptr<Stream> stream_;
  const std::unique_ptr<Event> after_event_;
  const std::shared_ptr<Shared> shared_;

  std::mutex call_mu_;   // serializes the calls
  uint64_t issued_ = 0;  // guarded by call_mu_; collectives issued (their sequence numbers)
};

// A whole job inside one process on one device: runs body(rank, comm, device) on `world_size`
// threads, rank r on the Device make_device(r) (null: a CpuDevice each, sharing the cores) and the
// group's communicator, and joins them. Returns OK if every rank returned OK, else the first error,
// as "rank R: <message>" (a later rank's error that is only a consequence is not the one
// returned); a failing rank's communicator is aborted so the others fail promptly. Devices and
// communicators are destroyed only after every body has returned.
Status RunSameDeviceRanks(int world_size,
                          const std::function<Status(int rank, Communicator* comm, Device* device)>& body,
                          SameDeviceOptions options = {},
                          const std::function<Result<std::unique_ptr<Device>>(int rank)>& make_device = nullptr);

}  // namespace zero
