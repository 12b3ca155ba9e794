#include "comm/rank_threads.h"

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

namespace zero {

void FirstRankError::Record(int rank, const Status& s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (first_.ok()) first_ = s.WithContext("rank " + std::to_string(rank));
}

Status FirstRankError::status() {
  std::lock_guard<std::mutex> lock(mu_);
  return first_;
}

std::unique_ptr<CpuDevice> MakeRankCpuDevice(int world_size) {
  CpuDeviceOptions options;
  // Ranks share the cores; a kernel of one rank need not fan out over all of them.
  options.num_threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / world_size);
  return std::make_unique<CpuDevice>(options);
}

void RunRankBody(int rank, Communicator* comm, Device* device,
                 const std::function<Status(int rank, Communicator* comm, Device* device)>& body,
                 FirstRankError* errors) {
  Status s = body(rank, comm, device);
  if (!s.ok()) {
    errors->Record(rank, s);
    comm->Abort("rank " + std::to_string(rank) + " failed: " + s.ToString());
  }
}

void RunOnRankThreads(int world_size, const std::function<void(int rank)>& run_rank) {
  std::vector<std::thread> threads;
  threads.reserve(world_size - 1);
  for (int r = 1; r < world_size; ++r) threads.emplace_back(run_rank, r);
  run_rank(0);
  for (auto& t : threads) t.join();
}

}  // namespace zero
