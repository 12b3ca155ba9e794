#include "comm/nccl_communicator.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>

#include "comm/host_reduce.h"
#include "comm/store_join.h"

namespace zero {
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t ToNccl(DType t) {
  switch (t) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;
  }
  return ncclFloat32;
}

ncclRedOp_t ToNccl(ReduceOp op, int world_size) {
  // One rank: the average is the value itself. NCCL 2.28's one-rank ncclAvg (a pre-multiplying
  // kernel) was seen leaving the last elements of an out-of-place ReduceScatter unwritten on an
  // H200; ncclSum there is a plain copy.
  if (op == ReduceOp::kAvg && world_size == 1) return ncclSum;
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
  }
  return ncclSum;
}

// Sleeps a little longer each time, up to 1 ms, while polling for completion.
class Backoff {
 public:
  void Sleep() {
    std::this_thread::sleep_for(std::chrono::microseconds(us_));
    us_ = std::min(us_ * 2, 1000);
  }

 private:
  int us_ = 10;
};

}  // namespace

// What Work handles share with the communicator: the NCCL handle (null once aborted), the sticky
// error and the mutex that serializes NCCL calls.
struct NcclCommunicator::Shared {
  std::mutex mu;
  ncclComm_t comm = nullptr;  // guarded by mu
  Status failed;              // guarded by mu
  uint64_t issued = 0;        // guarded by mu; collectives launched (their sequence numbers)
  int rank = 0;
  int world_size = 1;
  int ordinal = 0;
  std::chrono::milliseconds timeout{300000};

  std::string Who(const std::string& what) const {
    return "nccl " + what + " on rank " + std::to_string(rank) + " of " + std::to_string(world_size);
  }

  // Records `s` as the sticky error (unless there is one) and aborts the NCCL communicator, which
  // makes its kernels in flight exit. REQUIRES: mu held.
  Status AbortLocked(Status s) {
    if (failed.ok()) failed = s;
    if (comm != nullptr) {
      ncclCommAbort(comm);
      comm = nullptr;
    }
    return s;
  }

  // The watchdog's communicator check: the sticky error, else NCCL's asynchronous error (which
  // then aborts). Non-blocking.
  Status Check() {
    std::lock_guard<std::mutex> lock(mu);
    if (!failed.ok()) return failed;
    if (comm == nullptr) return FailedPreconditionError(Who("communicator") + ": not initialized");
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm, &async);
    if (async == ncclSuccess || async == ncclInProgress) return OkStatus();
    std::string msg = Who("communicator") + ": asynchronous error: " + ncclGetErrorString(async);
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && *last != '\0') msg += std::string(" (") + last + ")";
    return AbortLocked(UnavailableError(msg + "; the NCCL communicator was aborted"));
  }

  // Turns the result of an NCCL call into a Status, polling a non-blocking communicator until
  // the call is no longer in progress or the deadline passes. REQUIRES: mu held.
  Status SettleLocked(const std::string& what, ncclResult_t r, Clock::time_point deadline) {
    Backoff backoff;
    while (r == ncclInProgress) {
      if (comm == nullptr) return failed;
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm, &async);
      if (async != ncclInProgress) {
        r = async;
        break;
      }
      if (Clock::now() > deadline) {
        return AbortLocked(
            DeadlineExceededError(Who(what) + ": not done after " + TimeoutText(timeout) +
                                  " (a rank may have died or not joined); the NCCL communicator was aborted"));
      }
      backoff.Sleep();
    }
    if (r == ncclSuccess) return OkStatus();
    std::string msg = Who(what) + ": " + ncclGetErrorString(r);
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && *last != '\0') msg += std::string(" (") + last + ")";
    if (r == ncclInvalidArgument || r == ncclInvalidUsage) return InvalidArgumentError(msg);
    StatusCode code = (r == ncclRemoteError || r == ncclSystemError) ? StatusCode::kUnavailable : StatusCode::kInternal;
    return AbortLocked(Status(code, msg + "; the NCCL communicator was aborted"));
  }
};

static Status CudaCheck(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return OkStatus();
  return InternalError(what + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

// A collective queued on the comm stream: an event recorded after it (shared with the watchdog,
// which may poll it after the Work is gone). Deadlines and asynchronous errors are the watchdog's:
// Wait polls the event and the sticky error, which the watchdog sets (and aborts, which makes the
// kernels exit) when the collective does not complete in time.
class NcclCommunicator::NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<Shared> shared, std::shared_ptr<CUevent_st> event, CudaDevice* device, std::string name)
      : shared_(std::move(shared)), event_(std::move(event)), device_(device), name_(std::move(name)) {}

  Status Wait() override {
    if (done_) return status_;
    cudaSetDevice(shared_->ordinal);
    Backoff backoff;
    while (true) {
      {
        std::lock_guard<std::mutex> lock(shared_->mu);
        if (!shared_->failed.ok()) return Finish(shared_->failed);
      }
      cudaError_t q = cudaEventQuery(event_.get());
      if (q == cudaSuccess) {
        // Complete; but an abort also lets the kernels exit: OK only if none happened before.
        std::lock_guard<std::mutex> lock(shared_->mu);
        return Finish(shared_->failed);
      }
      if (q != cudaErrorNotReady) {
        std::lock_guard<std::mutex> lock(shared_->mu);
        return Finish(shared_->AbortLocked(CudaCheck(q, shared_->Who(name_) + ": cudaEventQuery")));
      }
      backoff.Sleep();
    }
  }

  bool IsCompleted() override {
    if (done_) return true;
    cudaError_t q = cudaEventQuery(event_.get());
    if (q == cudaErrorNotReady) {
      std::lock_guard<std::mutex> lock(shared_->mu);
      return !shared_->failed.ok();
    }
    return true;
  }

  Status StreamWait(Stream* stream) override {
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      if (!shared_->failed.ok()) return shared_->failed;
    }
    if (done_) return status_;
    cudaStream_t s = device_->native_stream(stream);
    return CudaCheck(cudaStreamWaitEvent(s, event_.get(), 0), shared_->Who(name_) + ": cudaStreamWaitEvent");
  }

 private:
  Status Finish(Status s) {
    done_ = true;
    status_ = std::move(s);
    return status_;
  }

  std::shared_ptr<Shared> shared_;
  std::shared_ptr<CUevent_st> event_;
  CudaDevice* device_;
  std::string name_;
  bool done_ = false;
  Status status_;
};

NcclCommunicator::NcclCommunicator(int rank, int world_size, CudaDevice* device, const NcclOptions& options)
    : rank_(rank), world_size_(world_size), device_(device), options_(options), shared_(std::make_shared<Shared>()) {
  shared_->rank = rank;
  shared_->world_size = world_size;
  shared_->ordinal = device->ordinal();
  shared_->timeout = options.comm.timeout;
}

Result<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(int rank, int world_size,
                                                                   std::shared_ptr<gloo::rendezvous::Store> store,
                                                                   CudaDevice* device, const NcclOptions& options) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return InvalidArgumentError("nccl: rank " + std::to_string(rank) + " out of range for world size " +
                                std::to_string(world_size));
  }
  if (device == nullptr) return InvalidArgumentError("nccl: no CUDA device");
  if (store == nullptr && world_size > 1) return InvalidArgumentError("nccl: no rendezvous store");
  if (options.comm.timeout.count() <= 0) {
    return InvalidArgumentError("nccl: timeout must be positive");
  }
  auto comm = std::unique_ptr<NcclCommunicator>(new NcclCommunicator(rank, world_size, device, options));
  ZERO_RETURN_IF_ERROR(comm->Init(std::move(store)));
  return comm;
}

Status NcclCommunicator::Init(std::shared_ptr<gloo::rendezvous::Store> store) {
  store_ = std::move(store);
  const std::string who = "nccl rendezvous of rank " + std::to_string(rank_) + " of " + std::to_string(world_size_);
  const RendezvousDeadline deadline(options_.comm.timeout);
  ZERO_RETURN_IF_ERROR(CudaCheck(cudaSetDevice(shared_->ordinal), who + ": cudaSetDevice"));

  ncclUniqueId id;
  if (world_size_ == 1) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return InternalError(who + ": ncclGetUniqueId: " + ncclGetErrorString(r));
  } else {
    gloo::rendezvous::PrefixStore pstore(options_.prefix, *store_);
    ZERO_RETURN_IF_ERROR(JoinThroughStore(pstore, rank_, world_size_, who, deadline));
    // Rank 0 publishes the unique id, the last step of its join: a store failure here names rank 0.
    try {
      if (rank_ == 0) {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess) return InternalError(who + ": ncclGetUniqueId: " + ncclGetErrorString(r));
        const char* p = reinterpret_cast<const char*>(&id);
        pstore.set("unique_id", std::vector<char>(p, p + sizeof(id)));
      } else {
        pstore.wait({"unique_id"}, deadline.Remaining());
        std::vector<char> v = pstore.get("unique_id");
        if (v.size() != sizeof(id)) {
          return InternalError(who + ": the NCCL unique id in the store has " + std::to_string(v.size()) +
                               " bytes, expected " + std::to_string(sizeof(id)));
        }
        std::memcpy(&id, v.data(), sizeof(id));
      }
    } catch (const std::exception& e) {
      return StoreErrorStatus(who, 0, e.what(), deadline);
    }
  }

  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // init and every call return at once; we poll with a deadline
    ncclResult_t r = ncclCommInitRankConfig(&shared_->comm, world_size_, id, rank_, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      std::string msg = who + ": ncclCommInitRankConfig: " + ncclGetErrorString(r);
      const char* last = ncclGetLastError(nullptr);
      if (last != nullptr && *last != '\0') msg += std::string(" (") + last + ")";
      if (shared_->comm != nullptr) {
        ncclCommAbort(shared_->comm);
        shared_->comm = nullptr;
      }
      return UnavailableError(msg);
    }
    ZERO_RETURN_IF_ERROR(shared_->SettleLocked("init", r, deadline.at()));
  }
  ZERO_RETURN_IF_ERROR(
      CudaCheck(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), who + ": cudaStreamCreate"));
  ZERO_RETURN_IF_ERROR(
      CudaCheck(cudaEventCreateWithFlags(&after_event_, cudaEventDisableTiming), who + ": cudaEventCreate"));
  CollectiveWatchdog::Options wo;
  wo.who = "nccl rank " + std::to_string(rank_) + " of " + std::to_string(world_size_);
  wo.timeout = options_.comm.timeout;
  Shared* shared = shared_.get();  // outlives the watchdog (the destructor stops it first)
  wo.thread_init = [shared] { cudaSetDevice(shared->ordinal); };
  wo.check = [shared] { return shared->Check(); };
  wo.abort = [shared](const Status& error) {
    std::lock_guard<std::mutex> lock(shared->mu);
    shared->AbortLocked(error).IgnoreError();
  };
  watchdog_ = std::make_unique<CollectiveWatchdog>(std::move(wo));
  std::lock_guard<std::mutex> host_lock(host_mu_);
  return EnsureScratch(1);
}

Status NcclCommunicator::CheckHealth() {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->failed;
}

void NcclCommunicator::Abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(shared_->mu);
  shared_->AbortLocked(UnavailableError(shared_->Who("communicator") + " aborted: " + reason)).IgnoreError();
}

NcclCommunicator::~NcclCommunicator() {
  // From here the finalize below keeps the deadline (and aborts on it).
  if (watchdog_ != nullptr) watchdog_->Stop();
  cudaSetDevice(shared_->ordinal);
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (shared_->comm != nullptr) {
      if (!shared_->failed.ok()) {
        ncclCommAbort(shared_->comm);
      } else {
        const auto deadline = Clock::now() + options_.comm.timeout;
        ncclResult_t r = ncclCommFinalize(shared_->comm);
        Backoff backoff;
        while (r == ncclInProgress && Clock::now() < deadline) {
          ncclCommGetAsyncError(shared_->comm, &r);
          if (r == ncclInProgress) backoff.Sleep();
        }
        if (r == ncclSuccess) {
          ncclCommDestroy(shared_->comm);
        } else {
          ncclCommAbort(shared_->comm);
        }
      }
      shared_->comm = nullptr;
      if (shared_->failed.ok()) shared_->failed = FailedPreconditionError("nccl communicator destroyed");
    }
  }
  if (stream_ != nullptr) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  if (after_event_ != nullptr) cudaEventDestroy(after_event_);
  if (scratch_ != nullptr) cudaFree(scratch_);
  if (host_scratch_ != nullptr) cudaFreeHost(host_scratch_);
}

Status NcclCommunicator::EnsureScratch(size_t bytes) {
  if (bytes <= scratch_bytes_) return OkStatus();
  // Growing frees the old buffers (cudaFree synchronizes the device); start large enough that
  // the usual host-value ops never grow it.
  bytes = std::max<size_t>(bytes, size_t{1} << 20);
  if (scratch_ != nullptr) cudaFree(scratch_);
  if (host_scratch_ != nullptr) cudaFreeHost(host_scratch_);
  scratch_ = nullptr;
  host_scratch_ = nullptr;
  scratch_bytes_ = 0;
  size_t want = bytes;
  ZERO_RETURN_IF_ERROR(CudaCheck(cudaMalloc(&scratch_, want), shared_->Who("scratch") + ": cudaMalloc"));
  ZERO_RETURN_IF_ERROR(CudaCheck(cudaMallocHost(&host_scratch_, want), shared_->Who("scratch") + ": cudaMallocHost"));
  scratch_bytes_ = want;
  return OkStatus();
}

template <typename LaunchFn>
Result<std::unique_ptr<Work>> NcclCommunicator::Launch(const std::string& op, Stream* after, LaunchFn&& launch) {
  std::lock_guard<std::mutex> lock(shared_->mu);
  if (!shared_->failed.ok()) {
    return Status(shared_->failed.code(),
                  shared_->Who(op) + " not started: the communicator failed earlier: " + shared_->failed.message());
  }
  const std::string name = "collective #" + std::to_string(++shared_->issued) + " " + op;
  ZERO_RETURN_IF_ERROR(CudaCheck(cudaSetDevice(shared_->ordinal), shared_->Who(name) + ": cudaSetDevice"));
  if (after != nullptr) {
    cudaStream_t s = device_->native_stream(after);
    ZERO_RETURN_IF_ERROR(CudaCheck(cudaEventRecord(after_event_, s), shared_->Who(name) + ": cudaEventRecord"));
    ZERO_RETURN_IF_ERROR(
        CudaCheck(cudaStreamWaitEvent(stream_, after_event_, 0), shared_->Who(name) + ": cudaStreamWaitEvent"));
  }
  const auto deadline = Clock::now() + options_.comm.timeout;
  Status s = launch(deadline);
  if (!s.ok()) return s;
  cudaEvent_t raw = nullptr;
  ZERO_RETURN_IF_ERROR(
      CudaCheck(cudaEventCreateWithFlags(&raw, cudaEventDisableTiming), shared_->Who(name) + ": cudaEventCreate"));
  std::shared_ptr<CUevent_st> done(raw, [](cudaEvent_t e) { cudaEventDestroy(e); });
  ZERO_RETURN_IF_ERROR(CudaCheck(cudaEventRecord(done.get(), stream_), shared_->Who(name) + ": cudaEventRecord"));
  // The kernels are queued: from here a collective that never completes is the watchdog's.
  watchdog_->Track(name, [done]() -> Result<bool> {
    cudaError_t q = cudaEventQuery(done.get());
    if (q == cudaSuccess) return true;
    if (q == cudaErrorNotReady) return false;
    return CudaCheck(q, "cudaEventQuery");
  });
  return std::unique_ptr<Work>(new NcclWork(shared_, std::move(done), device_, name));
}

Result<std::unique_ptr<Work>> NcclCommunicator::AllReduce(void* buf, size_t count, DType t, ReduceOp op,
                                                          Stream* after) {
  if (!IsKnownDType(t)) return InvalidArgumentError("nccl AllReduce: unknown dtype");
  std::string name = "AllReduce (" + std::to_string(count) + " x " + DTypeName(t) + ", " + ReduceOpName(op) + ")";
  return Launch(name, after, [&](Clock::time_point deadline) {
    return shared_->SettleLocked(
        name, ncclAllReduce(buf, buf, count, ToNccl(t), ToNccl(op, world_size_), shared_->comm, stream_), deadline);
  });
}

Result<std::unique_ptr<Work>> NcclCommunicator::ReduceScatter(const void* send, void* recv, size_t recv_count, DType t,
                                                              ReduceOp op, Stream* after) {
  if (!IsKnownDType(t)) return InvalidArgumentError("nccl ReduceScatter: unknown dtype");
  std::string name =
      "ReduceScatter (" + std::to_string(recv_count) + " x " + DTypeName(t) + " per rank, " + ReduceOpName(op) + ")";
  return Launch(name, after, [&](Clock::time_point deadline) {
    return shared_->SettleLocked(
        name, ncclReduceScatter(send, recv, recv_count, ToNccl(t), ToNccl(op, world_size_), shared_->comm, stream_),
        deadline);
  });
}

Result<std::unique_ptr<Work>> NcclCommunicator::AllGather(const void* send, void* recv, size_t send_count, DType t,
                                                          Stream* after) {
  if (!IsKnownDType(t)) return InvalidArgumentError("nccl AllGather: unknown dtype");
  std::string name = "AllGather (" + std::to_string(send_count) + " x " + DTypeName(t) + " per rank)";
  return Launch(name, after, [&](Clock::time_point deadline) {
    return shared_->SettleLocked(name, ncclAllGather(send, recv, send_count, ToNccl(t), shared_->comm, stream_),
                                 deadline);
  });
}

Result<std::unique_ptr<Work>> NcclCommunicator::Broadcast(void* buf, size_t count, DType t, int root, Stream* after) {
  if (!IsKnownDType(t)) return InvalidArgumentError("nccl Broadcast: unknown dtype");
  if (root < 0 || root >= world_size_) {
    return InvalidArgumentError("nccl Broadcast: root " + std::to_string(root) + " out of range for world size " +
                                std::to_string(world_size_));
  }
  std::string name =
      "Broadcast (" + std::to_string(count) + " x " + DTypeName(t) + " from rank " + std::to_string(root) + ")";
  return Launch(name, after, [&](Clock::time_point deadline) {
    return shared_->SettleLocked(name, ncclBroadcast(buf, buf, count, ToNccl(t), root, shared_->comm, stream_),
                                 deadline);
  });
}

Status NcclCommunicator::Barrier() {
  std::lock_guard<std::mutex> host_lock(host_mu_);
  Result<std::unique_ptr<Work>> work = [&]() -> Result<std::unique_ptr<Work>> {
    ZERO_RETURN_IF_ERROR(EnsureScratch(sizeof(float)));
    return Launch("Barrier", nullptr, [&](Clock::time_point deadline) {
      return shared_->SettleLocked(
          "Barrier", ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, shared_->comm, stream_), deadline);
    });
  }();
  if (!work.ok()) return work.status();
  return (*work)->Wait();
}

Status NcclCommunicator::AllReduceHost(double* values, size_t n, ReduceOp op) {
  if (n == 0) return OkStatus();
  std::lock_guard<std::mutex> host_lock(host_mu_);
  const size_t bytes = n * sizeof(double);
  std::string name = "AllReduceHost (" + std::to_string(n) + " doubles, " + ReduceOpName(op) + ")";
  // All-gather, then reduce on the host in rank order: bitwise identical on every rank.
  Result<std::unique_ptr<Work>> work = [&]() -> Result<std::unique_ptr<Work>> {
    ZERO_RETURN_IF_ERROR(EnsureScratch(bytes * world_size_));
    return Launch(name, nullptr, [&](Clock::time_point deadline) -> Status {
      char* dev = static_cast<char*>(scratch_);
      char* host = static_cast<char*>(host_scratch_);
      std::memcpy(host + rank_ * bytes, values, bytes);
      ZERO_RETURN_IF_ERROR(
          CudaCheck(cudaMemcpyAsync(dev + rank_ * bytes, host + rank_ * bytes, bytes, cudaMemcpyHostToDevice, stream_),
                    shared_->Who(name) + ": cudaMemcpyAsync"));
      ZERO_RETURN_IF_ERROR(shared_->SettleLocked(
          name, ncclAllGather(dev + rank_ * bytes, dev, n, ncclFloat64, shared_->comm, stream_), deadline));
      return CudaCheck(cudaMemcpyAsync(host, dev, bytes * world_size_, cudaMemcpyDeviceToHost, stream_),
                       shared_->Who(name) + ": cudaMemcpyAsync");
    });
  }();
  if (!work.ok()) return work.status();
  ZERO_RETURN_IF_ERROR((*work)->Wait());
  const double* all = static_cast<const double*>(host_scratch_);
  for (int r = 0; r < world_size_; ++r) AccumulateHostValues(values, all + r * n, n, op, r == 0);
  FinishHostValues(values, values, n, op, world_size_);
  return OkStatus();
}

Status NcclCommunicator::BroadcastHost(void* data, size_t bytes, int root) {
  if (root < 0 || root >= world_size_) {
    return InvalidArgumentError("nccl BroadcastHost: root " + std::to_string(root) + " out of range for world size " +
                                std::to_string(world_size_));
  }
  if (bytes == 0) return OkStatus();
  std::lock_guard<std::mutex> host_lock(host_mu_);
  std::string name = "BroadcastHost (" + std::to_string(bytes) + " bytes from rank " + std::to_string(root) + ")";
  Result<std::unique_ptr<Work>> work = [&]() -> Result<std::unique_ptr<Work>> {
    ZERO_RETURN_IF_ERROR(EnsureScratch(bytes));
    return Launch(name, nullptr, [&](Clock::time_point deadline) -> Status {
      if (rank_ == root) {
        std::memcpy(host_scratch_, data, bytes);
        ZERO_RETURN_IF_ERROR(CudaCheck(cudaMemcpyAsync(scratch_, host_scratch_, bytes, cudaMemcpyHostToDevice, stream_),
                                       shared_->Who(name) + ": cudaMemcpyAsync"));
      }
      ZERO_RETURN_IF_ERROR(shared_->SettleLocked(
          name, ncclBroadcast(scratch_, scratch_, bytes, ncclUint8, root, shared_->comm, stream_), deadline));
      return CudaCheck(cudaMemcpyAsync(host_scratch_, scratch_, bytes, cudaMemcpyDeviceToHost, stream_),
                       shared_->Who(name) + ": cudaMemcpyAsync");
    });
  }();
  if (!work.ok()) return work.status();
  ZERO_RETURN_IF_ERROR((*work)->Wait());
  std::memcpy(data, host_scratch_, bytes);
  return OkStatus();
}

}  // namespace zero
