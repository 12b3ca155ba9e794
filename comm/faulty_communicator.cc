#include "comm/faulty_communicator.h"

#include <utility>

namespace zero {
namespace {

class DoneWork final : public Work {
 public:
  explicit DoneWork(Status s) : status_(std::move(s)) {}
  Status Wait() override { return status_; }
  bool IsCompleted() override { return true; }
  Status StreamWait(Stream*) override { return status_; }

 private:
  Status status_;
};

std::string Count(size_t n, DType t) { return std::to_string(n) + " x " + DTypeName(t); }

}  // namespace

struct FaultyCommunicator::State {
  std::unique_ptr<Work> inner;  // null when hung
  bool hang = false;
  Status injected;  // reported on completion (kFail)
  std::string name;
};

class FaultyCommunicator::FaultyWork final : public Work {
 public:
  FaultyWork(std::shared_ptr<State> state, std::shared_ptr<CollectiveWatchdog> watchdog)
      : state_(std::move(state)), watchdog_(std::move(watchdog)) {}

  Status Wait() override {
    if (done_) return status_;
    done_ = true;
    if (state_->hang) {
      status_ = watchdog_->AwaitFailure();
      if (status_.ok()) {
        status_ = FailedPreconditionError(state_->name + ": abandoned (the communicator was destroyed while it hung)");
      }
      return status_;
    }
    // Bounded: the wrapped communicator's own timeout, and the watchdog's abort of it.
    Status s = state_->inner->Wait();
    status_ = watchdog_->status();
    if (!status_.ok()) return status_;
    if (!state_->injected.ok()) return status_ = watchdog_->FailCollective(state_->name, state_->injected);
    if (!s.ok()) return status_ = watchdog_->Fail(s);
    return status_;
  }

  bool IsCompleted() override {
    if (done_) return true;
    if (state_->hang) return !watchdog_->status().ok();
    return state_->inner->IsCompleted();
  }

  // The wrapped backend completes on the host (Gloo), so a stream wait is a host wait.
  Status StreamWait(Stream*) override { return Wait(); }

 private:
  std::shared_ptr<State> state_;
  std::shared_ptr<CollectiveWatchdog> watchdog_;
  bool done_ = false;
  Status status_;
};

FaultyCommunicator::FaultyCommunicator(Communicator* inner, std::chrono::milliseconds timeout) : inner_(inner) {
  CollectiveWatchdog::Options o;
  o.who = "faulty(" + inner->backend() + ") rank " + std::to_string(inner->rank()) + " of " +
          std::to_string(inner->world_size());
  o.timeout = timeout;
  o.check = [inner] { return inner->CheckHealth(); };
  o.abort = [inner](const Status& error) { inner->Abort(error.ToString()); };
  watchdog_ = std::make_shared<CollectiveWatchdog>(std::move(o));
}

FaultyCommunicator::~FaultyCommunicator() { watchdog_->Stop(); }

void FaultyCommunicator::InjectAt(int64_t seq, Fault fault, Status error) {
  std::lock_guard<std::mutex> lock(mu_);
  by_seq_[seq] = Rule{fault, std::move(error)};
}

void FaultyCommunicator::InjectAtOp(const std::string& op, int64_t nth, Fault fault, Status error) {
  std::lock_guard<std::mutex> lock(mu_);
  by_op_[{op, nth}] = Rule{fault, std::move(error)};
}

int64_t FaultyCommunicator::issued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return issued_;
}

int64_t FaultyCommunicator::calls(const std::string& op) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = op_calls_.find(op);
  return it == op_calls_.end() ? 0 : it->second;
}

Result<std::unique_ptr<Work>> FaultyCommunicator::Issue(const std::string& op, const std::string& detail,
                                                        const std::function<Result<std::unique_ptr<Work>>()>& issue) {
  // Held across the issue so sequence numbers follow the wrapped communicator's order.
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t seq = ++issued_;
  const int64_t nth = ++op_calls_[op];
  auto state = std::make_shared<State>();
  state->name = "collective #" + std::to_string(seq) + " " + op + " (" + detail + ")";
  Status failed = watchdog_->status();
  if (!failed.ok()) {
    return Status(failed.code(), state->name + " on rank " + std::to_string(inner_->rank()) +
                                     " not started: the communicator failed earlier: " + failed.message());
  }
  const Rule* rule = nullptr;
  if (auto it = by_seq_.find(seq); it != by_seq_.end()) {
    rule = &it->second;
  } else if (auto jt = by_op_.find({op, nth}); jt != by_op_.end()) {
    rule = &jt->second;
  }
  if (rule != nullptr && rule->fault == Fault::kHang) hung_ = true;
  state->hang = hung_;
  if (!state->hang) {
    ZERO_ASSIGN_OR_RETURN(state->inner, issue());
    if (rule != nullptr && rule->fault == Fault::kFail) {
      state->injected = rule->error.ok() ? UnavailableError("injected failure (FaultyCommunicator)") : rule->error;
    }
  }
  watchdog_->Track(state->name, [state]() -> Result<bool> {
    if (state->hang) return false;
    if (!state->inner->IsCompleted()) return false;
    if (!state->injected.ok()) return state->injected;
    return true;
  });
  return std::unique_ptr<Work>(new FaultyWork(state, watchdog_));
}

Status FaultyCommunicator::IssueHost(const std::string& op, const std::string& detail,
                                     const std::function<Status()>& run) {
  ZERO_ASSIGN_OR_RETURN(auto work, Issue(op, detail, [&]() -> Result<std::unique_ptr<Work>> {
                          return std::unique_ptr<Work>(new DoneWork(run()));
                        }));
  return work->Wait();
}

Result<std::unique_ptr<Work>> FaultyCommunicator::AllReduce(void* buf, size_t count, DType t, ReduceOp op,
                                                            Stream* after) {
  return Issue("AllReduce", Count(count, t) + ", " + ReduceOpName(op),
               [&] { return inner_->AllReduce(buf, count, t, op, after); });
}

Result<std::unique_ptr<Work>> FaultyCommunicator::ReduceScatter(const void* send, void* recv, size_t recv_count,
                                                                DType t, ReduceOp op, Stream* after) {
  return Issue("ReduceScatter", Count(recv_count, t) + " per rank, " + ReduceOpName(op),
               [&] { return inner_->ReduceScatter(send, recv, recv_count, t, op, after); });
}

Result<std::unique_ptr<Work>> FaultyCommunicator::AllGather(const void* send, void* recv, size_t send_count, DType t,
                                                            Stream* after) {
  return Issue("AllGather", Count(send_count, t) + " per rank",
               [&] { return inner_->AllGather(send, recv, send_count, t, after); });
}

Result<std::unique_ptr<Work>> FaultyCommunicator::Broadcast(void* buf, size_t count, DType t, int root, Stream* after) {
  return Issue("Broadcast", Count(count, t) + " from rank " + std::to_string(root),
               [&] { return inner_->Broadcast(buf, count, t, root, after); });
}

Status FaultyCommunicator::Barrier() {
  return IssueHost("Barrier", "all ranks", [&] { return inner_->Barrier(); });
}

Status FaultyCommunicator::AllReduceHost(double* values, size_t n, ReduceOp op) {
  return IssueHost("AllReduceHost", std::to_string(n) + " doubles, " + ReduceOpName(op),
                   [&] { return inner_->AllReduceHost(values, n, op); });
}

Status FaultyCommunicator::BroadcastHost(void* data, size_t bytes, int root) {
  return IssueHost("BroadcastHost", std::to_string(bytes) + " bytes from rank " + std::to_string(root),
                   [&] { return inner_->BroadcastHost(data, bytes, root); });
}

Status FaultyCommunicator::CheckHealth() {
  Status s = watchdog_->status();
  if (!s.ok()) return s;
  return inner_->CheckHealth();
}

void FaultyCommunicator::Abort(const std::string& reason) {
  watchdog_
      ->Fail(UnavailableError("faulty(" + inner_->backend() + ") rank " + std::to_string(inner_->rank()) +
                              " aborted: " + reason))
      .IgnoreError();
}

}  // namespace zero
