// FaultyCommunicator: a Communicator wrapper that makes chosen collectives hang or fail, for the
// watchdog and fault tests of the layers above (leveldb's fault-injecting Env pattern).
//
// Forwards every call to the wrapped communicator, which must complete its collectives on the
// host (Gloo: Work::StreamWait is Work::Wait; the wrapper's StreamWait is its Wait), and watches
// every collective with a CollectiveWatchdog (comm/watchdog.h), exactly as NcclCommunicator does:
// a collective that does not complete within `timeout` of becoming the oldest in flight aborts
// the wrapped communicator (Communicator::Abort, so the peers fail promptly) and becomes the
// sticky error "faulty(<backend>) rank R of N: collective #S <Op> (<count> x <dtype>, ...) did not
// complete within T ms ...", which every pending and later call and CheckHealth() return.
//
// Faults, chosen by the collective's 1-based sequence number S (counted over every collective and
// host operation made through this wrapper: AllReduce, ReduceScatter, AllGather, Broadcast,
// Barrier, AllReduceHost, BroadcastHost) or by the nth call of one operation:
//   kHang: the collective is never passed to the wrapped communicator and never completes, and
//     neither does any later one (they would queue behind it on a device stream): the model of an
//     NCCL kernel that never finishes. Only the watchdog ends it.
//   kFail: the collective runs on the wrapped communicator, but its completion reports `error`
//     (as an NCCL asynchronous error would), which aborts the communicator.
// Owns the watchdog only; the wrapped communicator must outlive the wrapper. Thread-safe as the
// wrapped communicator is.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "comm/communicator.h"
#include "comm/watchdog.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/status.h"

namespace zero {

class FaultyCommunicator final : public Communicator {
 public:
  enum class Fault { kHang, kFail };

  // Wraps `inner`; `timeout` is the watchdog's (CommOptions::timeout of a real backend).
  FaultyCommunicator(Communicator* inner, std::chrono::milliseconds timeout);
  // Stops the watchdog. Pending hung collectives are abandoned (their Works then fail).
  ~FaultyCommunicator() override;
  FaultyCommunicator(const FaultyCommunicator&) = delete;
  FaultyCommunicator& operator=(const FaultyCommunicator&) = delete;

  // Arms `fault` for the collective with sequence number `seq` (1-based; see issued()). kFail
  // reports `error` (default: kUnavailable naming the collective as injected). Replaces an
  // earlier rule for the same seq.
  void InjectAt(int64_t seq, Fault fault, Status error = OkStatus());
  // Arms `fault` for the `nth` (1-based, counted from creation) call of `op`, an operation name
  // as above ("AllReduce", "ReduceScatter", ...).
  void InjectAtOp(const std::string& op, int64_t nth, Fault fault, Status error = OkStatus());
  // Collectives issued through the wrapper so far (the last sequence number handed out).
  int64_t issued() const;
  // Calls of operation `op` made through the wrapper so far.
  int64_t calls(const std::string& op) const;

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string backend() const override { return inner_->backend(); }
  Device* device() const override { return inner_->device(); }

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
  void ReportFault(const Status& error) override { inner_->ReportFault(error); }

 private:
  struct State;  // one collective's, shared by its Work and the watchdog
  class FaultyWork;
  struct Rule {
    Fault fault;
    Status error;
  };

  // Numbers the collective `op` (`detail`: its arguments), applies the armed rule and the hang
  // that earlier hangs imply, issues it through `issue` unless it hangs, and tracks it.
  Result<std::unique_ptr<Work>> Issue(const std::string& op, const std::string& detail,
                                      const std::function<Result<std::unique_ptr<Work>>()>& issue);
  // A host operation: Issue around a completed Work running `run` synchronously.
  Status IssueHost(const std::string& op, const std::string& detail, const std::function<Status()>& run);

  Communicator* const inner_;
  std::shared_ptr<CollectiveWatchdog> watchdog_;  // shared with the Works

  mutable std::mutex mu_;
  int64_t issued_ = 0;                                     // guarded by mu_
  std::map<std::string, int64_t> op_calls_;                // guarded by mu_
  std::map<int64_t, Rule> by_seq_;                         // guarded by mu_
  std::map<std::pair<std::string, int64_t>, Rule> by_op_;  // guarded by mu_
  bool hung_ = false;                                      // guarded by mu_; a hang was issued
};

}  // namespace zero
