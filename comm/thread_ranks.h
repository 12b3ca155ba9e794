// RunThreadRanks: a whole data-parallel job inside one process, one thread per rank.
//
// For tests and single-process multi-rank runs (the ZeRO equivalence suite runs hundreds of these,
// so setup takes milliseconds). It owns, for the duration of one call, one gloo HashStore, and per
// rank one CpuDevice and one GlooCommunicator connected over loopback TCP; `body` gets the rank's
// communicator and device and must not keep them past its return. It touches nothing else.
#pragma once

#include <functional>

#include "comm/communicator.h"
#include "runtime/device.h"
#include "runtime/status.h"

namespace zero {

// Runs body(rank, comm, device) on `world_size` threads and joins them. Returns OK if every rank
// returned OK, else the first error to occur, as "rank R: <message>" (a later rank's error that
// is only a consequence, such as a lost connection to the failed rank, is not the one returned).
// When a rank's body fails, its communicator is aborted so the other ranks' pending collectives
// fail promptly instead of waiting for options.timeout. Communicators are destroyed only after
// every body has returned.
Status RunThreadRanks(int world_size, const std::function<Status(int rank, Communicator* comm, Device* device)>& body,
                      CommOptions options = {});

}  // namespace zero
