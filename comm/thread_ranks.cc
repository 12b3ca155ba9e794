#include "comm/thread_ranks.h"

#include <memory>
#include <string>
#include <vector>

#include <gloo/rendezvous/hash_store.h>

#include "comm/gloo_communicator.h"
#include "comm/rank_threads.h"
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
  FirstRankError errors;

  auto run_rank = [&](int rank) {
    devices[rank] = MakeRankCpuDevice(world_size);
    GlooOptions gloo_options;
    gloo_options.comm = options;
    auto comm = GlooCommunicator::Create(rank, world_size, store, devices[rank].get(), gloo_options);
    if (!comm.ok()) {
      errors.Record(rank, comm.status());
      return;
    }
    comms[rank] = std::move(comm).value();
    RunRankBody(rank, comms[rank].get(), devices[rank].get(), body, &errors);
  };

  RunOnRankThreads(world_size, run_rank);
  comms.clear();
  devices.clear();
  return errors.status();
}

}  // namespace zero
