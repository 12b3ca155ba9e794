#include "comm/thread_ranks.h"

#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gloo/rendezvous/hash_store.h>

#include "comm/gloo_communicator.h"
#include "runtime/cpu_device.h"

namespace zero {

Status RunThreadRanks(int world_size, const std::function<Status(int rank, Communicator* comm, Device* device)>& body,
                      CommOptions options) {
  if (world_size < 1) {
    return InvalidArgumentError("RunThreadRanks: world_size must be >= 1, got " + std::to_string(world_size));
  }
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  std::vector<std::unique_ptr<CpuDevice>> devices(world_size);
  std::vector<std::unique_ptr<GlooCommunicator>> comms(world_size);
  std::mutex mu;
  Status first_error;

  auto record = [&](int rank, const Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    if (first_error.ok()) first_error = s.WithContext("rank " + std::to_string(rank));
  };

  auto run_rank = [&](int rank) {
    CpuDeviceOptions device_options;
    // Ranks share the cores; a kernel of one rank need not fan out over all of them.
    unsigned hw = std::thread::hardware_concurrency();
    device_options.num_threads = std::max(1, static_cast<int>(hw) / world_size);
    devices[rank] = std::make_unique<CpuDevice>(device_options);
    GlooOptions gloo_options;
    gloo_options.comm = options;
    auto comm = GlooCommunicator::Create(rank, world_size, store, devices[rank].get(), gloo_options);
    if (!comm.ok()) {
      record(rank, comm.status());
      return;
    }
    comms[rank] = std::move(comm).value();
    Status s = body(rank, comms[rank].get(), devices[rank].get());
    if (!s.ok()) {
      record(rank, s);
      comms[rank]->Abort("rank " + std::to_string(rank) + " failed: " + s.ToString());
    }
  };

  std::vector<std::thread> threads;
  threads.reserve(world_size - 1);
  for (int r = 1; r < world_size; ++r) threads.emplace_back(run_rank, r);
  run_rank(0);
  for (auto& t : threads) t.join();
  comms.clear();
  devices.clear();
  return first_error;
}

}  // namespace zero
