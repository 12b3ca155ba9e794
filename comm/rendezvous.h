// Rendezvous: how the ranks of a job find each other and get a Communicator.
//
// Owns the mapping from the usual launcher variables to RendezvousOptions, the choice of store
// (a TcpStore hosted by rank 0 on MASTER_ADDR:MASTER_PORT, or a gloo FileStore in a shared
// directory) and the construction of the backend's communicator through it. The returned
// communicator owns the store it rendezvoused through (rank 0's TCP server must outlive every
// rank's rendezvous). It does not touch the Device beyond handing it to the communicator.
//
// Variables read by RendezvousFromEnv (first one set wins):
//   rank        RANK, OMPI_COMM_WORLD_RANK, SLURM_PROCID                 (default 0)
//   world size  WORLD_SIZE, OMPI_COMM_WORLD_SIZE, SLURM_NTASKS           (default 1)
//   local rank  LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID    (default 0; picks the GPU)
//   MASTER_ADDR (default 127.0.0.1), MASTER_PORT (default 29500),
//   ZERO_STORE_PATH (a FileStore directory instead of TCP), ZERO_COMM_TIMEOUT_MS (default 300000),
//   ZERO_GLOO_IFACE or GLOO_SOCKET_IFNAME (interface for gloo's sockets), ZERO_GLOO_HOSTNAME
//   (address for gloo's sockets), ZERO_JOB_SECRET (the secret every store connection proves; at
//   least 16 characters; tools/launch and zero_train --nproc set one), ZERO_STORE_BIND_ADDR (where
//   rank 0's store listens; default from MASTER_ADDR, tcp_store.h), ZERO_STORE_MAX_VALUE_BYTES
//   (default 1048576), ZERO_STORE_HEARTBEAT_MS (default 5000; 0: none; see CreateCommunicator). A
//   malformed or inconsistent value is an InvalidArgument naming the variable and its value (never
//   the secret's value).
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"
#include "runtime/device.h"
#include "runtime/status.h"

namespace gloo {
namespace rendezvous {
class Store;
}  // namespace rendezvous
}  // namespace gloo

namespace zero {

struct RendezvousOptions {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // A directory shared by all ranks (a FileStore) instead of the TCP store when set. It must be
  // empty or hold no keys of an earlier job with the same prefix.
  std::string store_path;
  // Keys go under this prefix: several communicators can rendezvous through one store.
  std::string prefix;
  CommOptions comm;
  // Gloo sockets: the interface (e.g. "eth0") or address to use. Both empty: loopback when
  // master_addr is a loopback address, else the local address that routes to master_addr.
  std::string gloo_iface;
  std::string gloo_hostname;
  // The TcpStore's job secret, bind address override and value limit (tcp_store.h).
  std::string job_secret;
  std::string store_bind_addr;
  size_t store_max_value_bytes = size_t{1} << 20;
  // How soon ranks other than 0 notice that rank 0's process (the TcpStore's server) is gone
  // (TcpStoreOptions::heartbeat); 0: not at all.
  std::chrono::milliseconds store_heartbeat{5000};
};

// Reads the variables listed above. Errors name the variable and the value.
Result<RendezvousOptions> RendezvousFromEnv();

// The store the ranks meet through: a FileStore when store_path is set, else a TcpStore (rank 0
// hosts the server; others connect with retry until opts.comm.timeout). With no job secret, rank 0
// warns once per process on stderr, saying how to set one: when MASTER_ADDR is not a loopback
// address, that any host that can reach it can join; on loopback, that any user of this machine can
// (tools/launch and zero_train --nproc set a secret, so only ranks started by hand warn).
Result<std::shared_ptr<gloo::rendezvous::Store>> CreateStore(const RendezvousOptions& opts);

// Creates the communicator of `backend` ("gloo": `device` is a cpu Device; "nccl": `device` is
// the CUDA Device of this rank's GPU, normally cuda:LOCAL_RANK). Blocks until every rank joined;
// a rank that does not arrive within opts.comm.timeout gives kDeadlineExceeded naming it. "nccl"
// on a build without CUDA and NCCL gives kUnimplemented; an unknown backend, kInvalidArgument.
// A world of one needs no store and binds no port.
// Through a TcpStore, every rank but 0 keeps a heartbeat to the store (opts.store_heartbeat): when
// rank 0's process exits, is killed, stops or hangs, the communicator is aborted (Abort) within
// about 1.5 x store_heartbeat (at once for an exit or a kill), so the collective in progress and
// every later call fail with kUnavailable naming the store's address and what happened, instead of
// waiting for opts.comm.timeout. Through a TcpStore, every rank also watches the key
// "<prefix>/<backend>/fault" (TcpStore::WatchKey) and ReportFault sets it: when one rank reports a
// fault, every rank's communicator is aborted at once (milliseconds), so their collectives fail
// with kUnavailable "rank R failed: <R's error>" instead of waiting for the timeout; the first
// report wins. A FileStore (store_path) has no such channel: ReportFault does nothing there. The
// returned communicator forwards to the backend's.
Result<std::unique_ptr<Communicator>> CreateCommunicator(const std::string& backend, Device* device,
                                                         const RendezvousOptions& opts);

}  // namespace zero
