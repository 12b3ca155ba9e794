// The thread-per-rank skeleton that RunThreadRanks and RunSameDeviceRanks share: a CPU device per
// rank, running each rank's body with the abort-on-failure rule, one thread per rank, and the first
// error of any rank. It owns no communicator or device; the callers create and free those.
#pragma once

#include <functional>
#include <memory>
#include <mutex>

#include "comm/communicator.h"
#include "runtime/cpu_device.h"
#include "runtime/device.h"
#include "runtime/status.h"

namespace zero {

// The first error any rank records, as "rank R: <message>". Thread-safe.
class FirstRankError {
 public:
  void Record(int rank, const Status& s);
  Status status();

 private:
  std::mutex mu_;
  Status first_;
};

// A CpuDevice for one of `world_size` ranks in one process.
std::unique_ptr<CpuDevice> MakeRankCpuDevice(int world_size);

// Runs body(rank, comm, device). When it fails, records the error and aborts `comm`, so the other
// ranks' pending collectives fail instead of waiting for this rank.
void RunRankBody(int rank, Communicator* comm, Device* device,
                 const std::function<Status(int rank, Communicator* comm, Device* device)>& body,
                 FirstRankError* errors);

// Calls run_rank(rank) for every rank at once, ranks 1.. on threads of their own and rank 0 on the
// caller's, and returns when all have returned.
void RunOnRankThreads(int world_size, const std::function<void(int rank)>& run_rank);

}  // namespace zero
