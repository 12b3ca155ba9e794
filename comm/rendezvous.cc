#include "comm/rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>
#include <vector>

#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/hash_store.h>

#include "comm/gloo_communicator.h"
#include "comm/tcp_store.h"

#if defined(ZERO_HAS_NCCL)
#include "comm/nccl_communicator.h"
#include "runtime/cuda_device.h"
#endif

namespace zero {
namespace {

// The first of `names` that is set (and non-empty): its name and value.
bool FirstSet(const std::vector<const char*>& names, std::string* name, std::string* value) {
  for (const char* n : names) {
    const char* v = std::getenv(n);
    if (v != nullptr && *v != '\0') {
      *name = n;
      *value = v;
      return true;
    }
  }
  return false;
}

// Parses a decimal integer in [lo, hi]; the whole string must be the number.
Status ParseInt(const std::string& name, const std::string& value, long lo, long hi, long* out) {
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || end == value.c_str() || *end != '\0' || errno == ERANGE) {
    return InvalidArgumentError(name + "='" + value + "' is not an integer");
  }
  if (v < lo || v > hi) {
    return InvalidArgumentError(name + "=" + value + " is out of range [" + std::to_string(lo) +
                                ", " + std::to_string(hi) + "]");
  }
  *out = v;
  return OkStatus();
}

Status ReadInt(const std::vector<const char*>& names, long lo, long hi, long* out,
               std::string* used_name, bool* was_set) {
  std::string name, value;
  *was_set = FirstSet(names, &name, &value);
  if (!*was_set) return OkStatus();
  *used_name = name;
  return ParseInt(name, value, lo, hi, out);
}

bool IsLoopback(const std::string& addr) {
  return addr == "localhost" || addr == "::1" || addr.rfind("127.", 0) == 0;
}

// The local IPv4/IPv6 address the kernel would use to reach `host` (no packet is sent).
std::string LocalAddressToward(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return {};
  std::string result;
  for (addrinfo* ai = res; ai != nullptr && result.empty(); ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      sockaddr_storage local{};
      socklen_t len = sizeof(local);
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
        char buf[INET6_ADDRSTRLEN] = {};
        const void* a = local.ss_family == AF_INET
                            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
                            : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
        if (inet_ntop(local.ss_family, a, buf, sizeof(buf)) != nullptr) result = buf;
      }
    }
    close(fd);
  }
  freeaddrinfo(res);
  return result;
}

Status MakeDirs(const std::string& path) {
  std::string partial;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || (path[i] == '/' && i > 0)) {
      partial = path.substr(0, i);
      if (mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
        return ErrnoError("mkdir", partial, errno).WithContext("ZERO_STORE_PATH");
      }
    }
  }
  return OkStatus();
}

}  // namespace

Result<RendezvousOptions> RendezvousFromEnv() {
  RendezvousOptions opts;
  long v = 0;
  std::string rank_name = "RANK", size_name = "WORLD_SIZE", local_name = "LOCAL_RANK";
  bool rank_set = false, size_set = false, local_set = false;

  ZERO_RETURN_IF_ERROR(ReadInt({"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"}, 1, 1 << 20,
                               &v, &size_name, &size_set));
  if (size_set) opts.world_size = static_cast<int>(v);
  ZERO_RETURN_IF_ERROR(ReadInt({"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}, 0, 1 << 20, &v,
                               &rank_name, &rank_set));
  if (rank_set) opts.rank = static_cast<int>(v);
  ZERO_RETURN_IF_ERROR(ReadInt({"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}, 0,
                               1 << 20, &v, &local_name, &local_set));
  if (local_set) opts.local_rank = static_cast<int>(v);

  if (rank_set && !size_set) {
    return InvalidArgumentError(rank_name + "=" + std::to_string(opts.rank) +
                                " is set but WORLD_SIZE is not (set both, or neither for one process)");
  }
  if (opts.rank >= opts.world_size) {
    return InvalidArgumentError(rank_name + "=" + std::to_string(opts.rank) + " is out of range for " +
                                size_name + "=" + std::to_string(opts.world_size) +
                                " (ranks are 0.." + std::to_string(opts.world_size - 1) + ")");
  }

  std::string name, value;
  if (FirstSet({"MASTER_ADDR"}, &name, &value)) opts.master_addr = value;
  if (FirstSet({"MASTER_PORT"}, &name, &value)) {
    ZERO_RETURN_IF_ERROR(ParseInt(name, value, 1, 65535, &v));
    opts.master_port = static_cast<int>(v);
  }
  if (FirstSet({"ZERO_STORE_PATH"}, &name, &value)) opts.store_path = value;
  if (FirstSet({"ZERO_COMM_TIMEOUT_MS"}, &name, &value)) {
    ZERO_RETURN_IF_ERROR(ParseInt(name, value, 1, 86400000L * 7, &v));
    opts.comm.timeout = std::chrono::milliseconds(v);
  }
  if (FirstSet({"ZERO_GLOO_IFACE", "GLOO_SOCKET_IFNAME"}, &name, &value)) opts.gloo_iface = value;
  if (FirstSet({"ZERO_GLOO_HOSTNAME"}, &name, &value)) opts.gloo_hostname = value;
  return opts;
}

Result<std::shared_ptr<gloo::rendezvous::Store>> CreateStore(const RendezvousOptions& opts) {
  if (!opts.store_path.empty()) {
    ZERO_RETURN_IF_ERROR(MakeDirs(opts.store_path));
    try {
      return std::shared_ptr<gloo::rendezvous::Store>(
          std::make_shared<gloo::rendezvous::FileStore>(opts.store_path));
    } catch (const std::exception& e) {
      return UnavailableError("FileStore " + opts.store_path + ": " + e.what());
    }
  }
  TcpStoreOptions t;
  t.host = opts.master_addr;
  t.port = opts.master_port;
  t.is_server = opts.rank == 0;
  t.rank = opts.rank;
  t.timeout = opts.comm.timeout;
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<TcpStore> store, TcpStore::Create(t));
  return std::shared_ptr<gloo::rendezvous::Store>(std::move(store));
}

Result<std::unique_ptr<Communicator>> CreateCommunicator(const std::string& backend, Device* device,
                                                         const RendezvousOptions& opts) {
  if (backend != "gloo" && backend != "nccl") {
    return InvalidArgumentError("unknown communication backend '" + backend +
                                "' (expected \"gloo\" or \"nccl\")");
  }
#if !defined(ZERO_HAS_NCCL)
  if (backend == "nccl") {
    return UnimplementedError(
        "backend \"nccl\" is not available: this build has no CUDA/NCCL (built without the CUDA "
        "toolkit or nccl.h); use \"gloo\" or rebuild on a machine with CUDA and NCCL");
  }
#endif
  if (opts.world_size < 1 || opts.rank < 0 || opts.rank >= opts.world_size) {
    return InvalidArgumentError("rendezvous: rank " + std::to_string(opts.rank) +
                                " out of range for world size " + std::to_string(opts.world_size));
  }
  std::shared_ptr<gloo::rendezvous::Store> store;
  if (opts.world_size == 1) {
    store = std::make_shared<gloo::rendezvous::HashStore>();
  } else {
    ZERO_ASSIGN_OR_RETURN(store, CreateStore(opts));
  }
  const std::string prefix = (opts.prefix.empty() ? "zero" : opts.prefix) + "/" + backend;

  if (backend == "gloo") {
    GlooOptions g;
    g.comm = opts.comm;
    g.prefix = prefix;
    g.iface = opts.gloo_iface;
    g.hostname = opts.gloo_hostname;
    if (g.iface.empty() && g.hostname.empty()) {
      if (IsLoopback(opts.master_addr) || opts.world_size == 1) {
        g.hostname = "127.0.0.1";
      } else {
        g.hostname = LocalAddressToward(opts.master_addr, opts.master_port);  // "" -> gethostname
      }
    }
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<GlooCommunicator> comm,
                          GlooCommunicator::Create(opts.rank, opts.world_size, store, device, g));
    return std::unique_ptr<Communicator>(std::move(comm));
  }
#if defined(ZERO_HAS_NCCL)
  auto* cuda = dynamic_cast<CudaDevice*>(device);
  if (cuda == nullptr) {
    return InvalidArgumentError("backend \"nccl\" needs a CUDA device (cuda:LOCAL_RANK), got " +
                                (device == nullptr ? std::string("none") : device->name()));
  }
  NcclOptions n;
  n.comm = opts.comm;
  n.prefix = prefix;
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<NcclCommunicator> comm,
                        NcclCommunicator::Create(opts.rank, opts.world_size, store, cuda, n));
  return std::unique_ptr<Communicator>(std::move(comm));
#else
  return InternalError("unreachable");
#endif
}

}  // namespace zero
