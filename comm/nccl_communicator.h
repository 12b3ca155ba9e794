// NcclCommunicator: the Communicator over NCCL, for buffers in the memory of one CUDA GPU.
//
// One process (or thread) per GPU; the GPU is the CudaDevice handed in (normally
// cuda:LOCAL_RANK). Owns the NCCL communicator (created non-blocking, so initialization and every
// wait have a deadline), its own non-blocking CUDA stream on which every collective runs, the
// events that order it after the caller's streams and mark each collective's completion, and a
// small device scratch buffer for the host-value operations. Rank 0 creates the NCCL unique id
// and publishes it through the rendezvous store (TcpStore or FileStore), which the communicator
// keeps alive for its lifetime.
//
// Semantics: as communicator.h, with NCCL's own summation order for AllReduce/ReduceScatter
// (results may differ from Gloo's rank-order sums in the last bit). kAvg is ncclAvg, kMax
// ncclMax; dtypes fp32, bf16, fp16. `after` makes the comm stream wait on an event recorded on
// that stream (no host sync). Work is an event recorded on the comm stream after the collective;
// StreamWait makes another stream wait for it. A watchdog thread (comm/watchdog.h) polls the
// event of the oldest collective in flight and ncclCommGetAsyncError; a collective that does not
// complete within CommOptions::timeout of becoming the oldest, or an asynchronous error, aborts
// the NCCL communicator (ncclCommAbort, which makes the kernels exit, so a Device synchronization
// of a stream that StreamWait-ed returns) and records kDeadlineExceeded/kUnavailable naming the
// collective (sequence number, op, count, dtype) and the rank; Wait, StreamWait, every later call
// and CheckHealth() then return it. AllReduceHost all-gathers the values and sums them on the
// host in rank order (bitwise identical on every rank, as the contract requires); BroadcastHost
// and Barrier go through the scratch buffer. Only built when CUDA and NCCL are present.
//
// Thread safety: calls are serialized by an internal mutex (NCCL communicators are not
// thread-safe); they must be issued in the same order on every rank.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "comm/communicator.h"
#include "comm/watchdog.h"
#include "runtime/cuda_device.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/status.h"

namespace gloo {
namespace rendezvous {
class Store;
}  // namespace rendezvous
}  // namespace gloo

namespace zero {

struct NcclOptions {
  CommOptions comm;
  std::string prefix = "zero/nccl";  // store keys go under this prefix
};

class NcclCommunicator final : public Communicator {
 public:
  // Rendezvous of rank `rank` of `world_size` through `store` (may be null when world_size is 1)
  // and ncclCommInitRankConfig on `device`'s GPU. Fails with kDeadlineExceeded naming the rank
  // that did not join within the timeout.
  static Result<std::unique_ptr<NcclCommunicator>> Create(int rank, int world_size,
                                                          std::shared_ptr<gloo::rendezvous::Store> store,
                                                          CudaDevice* device, const NcclOptions& options = {});
  // Finalizes the NCCL communicator (aborts it if it failed or does not finish within the
  // timeout), destroys the stream, events and scratch.
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend() const override { return "nccl"; }
  Device* device() const override { return device_; }
  cudaStream_t stream() const { return stream_; }

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
  class NcclWork;
  struct Shared;  // state the Work handles share with the communicator

  NcclCommunicator(int rank, int world_size, CudaDevice* device, const NcclOptions& options);
  Status Init(std::shared_ptr<gloo::rendezvous::Store> store);

  // Runs `launch` (NCCL calls on stream_) after ordering stream_ behind `after`, then records a
  // completion event and hands it to the watchdog as "collective #N <op>". Holds the mutex;
  // checks the sticky error first.
  template <typename Launch>
  Result<std::unique_ptr<Work>> Launch(const std::string& op, Stream* after, Launch&& launch);
  Status EnsureScratch(size_t bytes);

  const int rank_;
  const int world_size_;
  CudaDevice* const device_;
  const NcclOptions options_;
  std::shared_ptr<gloo::rendezvous::Store> store_;
  std::shared_ptr<Shared> shared_;
  std::unique_ptr<CollectiveWatchdog> watchdog_;  // created by Init; stopped first by the destructor
  cudaStream_t stream_ = nullptr;
  cudaEvent_t after_event_ = nullptr;  // recorded on `after` streams; guarded by shared_->mu
  // Host-value ops (Barrier, AllReduceHost, BroadcastHost) hold host_mu_ from start to finish:
  // they share the scratch buffers below.
  std::mutex host_mu_;
  void* scratch_ = nullptr;       // device memory; guarded by host_mu_
  void* host_scratch_ = nullptr;  // pinned host memory of the same size; guarded by host_mu_
  size_t scratch_bytes_ = 0;
};

}  // namespace zero
