#include "comm/rendezvous.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
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
    return InvalidArgumentError(name + "=" + value + " is out of range [" + std::to_string(lo) + ", " +
                                std::to_string(hi) + "]");
  }
  *out = v;
  return OkStatus();
}

Status ReadInt(const std::vector<const char*>& names, long lo, long hi, long* out, std::string* used_name,
               bool* was_set) {
  std::string name, value;
  *was_set = FirstSet(names, &name, &value);
  if (!*was_set) return OkStatus();
  *used_name = name;
  return ParseInt(name, value, lo, hi, out);
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

// The communicator of a TcpStore rendezvous: the backend's, plus two uses of the store.
//  - Heartbeat (ranks but 0): aborted when rank 0's process is gone (TcpStore::StartHeartbeat).
//  - Faults (every rank): ReportFault sets the key "<prefix>/fault" to "<rank>\n<error>" and every
//    rank's watch of that key (TcpStore::WatchKey: a GET parked at the server, no polling) aborts its
//    communicator with "rank R failed: <error>" as soon as it is set, so the collective in progress
//    fails then. The first report wins: the watches fire on it, and a rank that learned of a fault
//    does not report its own failure, which that fault caused. A failure of the backend (a
//    collective's error, a sync operation's) is given the reporter's name and message: another
//    rank's abort or exit can end a collective here a moment before this rank's own watch fires, so
//    on the first error it waits up to a second for the watch.
// Costs nothing on the hot path: one parked request per rank, a forwarding call per operation, and
// each Work wrapped once. Both threads are stopped before the backend's communicator is destroyed
// (they call its Abort).
class StoreWatchedCommunicator final : public Communicator {
 public:
  StoreWatchedCommunicator(std::unique_ptr<Communicator> inner, std::shared_ptr<TcpStore> store, std::string fault_key,
                           std::chrono::milliseconds timeout)
      : inner_(std::move(inner)), store_(std::move(store)), fault_key_(std::move(fault_key)), timeout_(timeout) {}
  ~StoreWatchedCommunicator() override {
    store_->StopWatch();
    store_->StopHeartbeat();
  }

  Status Start() {
    Communicator* comm = inner_.get();
    if (comm->rank() != 0) {
      ZERO_RETURN_IF_ERROR(store_->StartHeartbeat([comm](const Status& lost) { comm->Abort(lost.message()); })
                               .WithContext("starting the store heartbeat"));
    }
    return store_->WatchKey(fault_key_, [this](Result<std::vector<char>> event) { OnFaultKey(std::move(event)); })
        .WithContext("starting the watch of the ranks' faults");
  }

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string backend() const override { return inner_->backend(); }
  Device* device() const override { return inner_->device(); }
  Result<std::unique_ptr<Work>> AllReduce(void* buf, size_t count, DType t, ReduceOp op, Stream* after) override {
    return Wrap(inner_->AllReduce(buf, count, t, op, after));
  }
  Result<std::unique_ptr<Work>> ReduceScatter(const void* send, void* recv, size_t recv_count, DType t, ReduceOp op,
                                              Stream* after) override {
    return Wrap(inner_->ReduceScatter(send, recv, recv_count, t, op, after));
  }
  Result<std::unique_ptr<Work>> AllGather(const void* send, void* recv, size_t send_count, DType t,
                                          Stream* after) override {
    return Wrap(inner_->AllGather(send, recv, send_count, t, after));
  }
  Result<std::unique_ptr<Work>> Broadcast(void* buf, size_t count, DType t, int root, Stream* after) override {
    return Wrap(inner_->Broadcast(buf, count, t, root, after));
  }
  Status Barrier() override { return Explain(inner_->Barrier()); }
  Status AllReduceHost(double* values, size_t n, ReduceOp op) override {
    return Explain(inner_->AllReduceHost(values, n, op));
  }
  Status BroadcastHost(void* data, size_t bytes, int root) override {
    return Explain(inner_->BroadcastHost(data, bytes, root));
  }
  Status CheckHealth() override { return Explain(inner_->CheckHealth()); }
  void Abort(const std::string& reason) override { inner_->Abort(reason); }

  void ReportFault(const Status& error) override {
    const std::string mine = "rank " + std::to_string(rank()) + " failed: " + error.ToString();
    std::string known;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (reported_) return;
      reported_ = true;
      known = fault_;
    }
    if (!known.empty()) {  // a consequence of the fault another rank reported
      inner_->Abort(known);
      return;
    }
    // The store's value limit is 1 MiB by default; a message is rarely over a few hundred bytes.
    std::string value = std::to_string(rank()) + "\n" + error.ToString().substr(0, 16384);
    const auto bound = std::min<std::chrono::milliseconds>(timeout_, std::chrono::milliseconds(5000));
    Status told = store_->Set(fault_key_, std::vector<char>(value.begin(), value.end()), bound);
    if (!told.ok()) {
      std::fprintf(stderr, "rank %d: telling the other ranks of this rank's failure through the store failed: %s\n",
                   rank(), told.ToString().c_str());
    }
    inner_->Abort(mine);
  }

 private:
  class ExplainedWork final : public Work {
   public:
    ExplainedWork(std::unique_ptr<Work> inner, StoreWatchedCommunicator* comm)
        : inner_(std::move(inner)), comm_(comm) {}
    Status Wait() override { return comm_->Explain(inner_->Wait()); }
    bool IsCompleted() override { return inner_->IsCompleted(); }
    Status StreamWait(Stream* stream) override { return comm_->Explain(inner_->StreamWait(stream)); }

   private:
    std::unique_ptr<Work> inner_;
    StoreWatchedCommunicator* comm_;
  };

  Result<std::unique_ptr<Work>> Wrap(Result<std::unique_ptr<Work>> work) {
    if (!work.ok()) return Explain(work.status());
    return std::unique_ptr<Work>(new ExplainedWork(std::move(work).value(), this));
  }

  void OnFaultKey(Result<std::vector<char>> event) {
    std::string reason;
    {
      std::lock_guard<std::mutex> lock(mu_);
      watch_ended_ = true;
      if (event.ok()) {
        const std::string v(event->begin(), event->end());
        const size_t nl = v.find('\n');
        fault_ = "rank " + v.substr(0, nl) + " failed: " + (nl == std::string::npos ? v : v.substr(nl + 1));
        reason = fault_;
      }
    }
    cv_.notify_all();
    if (!reason.empty()) inner_->Abort(reason);
  }

  // `s` naming the reported fault when there is one (see the class comment).
  Status Explain(Status s) {
    if (s.ok()) return s;
    std::unique_lock<std::mutex> lock(mu_);
    if (!waited_) {
      waited_ = true;
      cv_.wait_for(lock, std::chrono::seconds(1), [this] { return watch_ended_; });
    }
    if (fault_.empty() || s.message().find(fault_) != std::string::npos) return s;
    return UnavailableError(fault_ + " (this rank stopped as a consequence: " + s.message() + ")");
  }

  std::unique_ptr<Communicator> inner_;
  std::shared_ptr<TcpStore> store_;
  const std::string fault_key_;
  const std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string fault_;         // guarded by mu_: "rank R failed: <error>" once the key is set
  bool watch_ended_ = false;  // guarded by mu_
  bool waited_ = false;       // guarded by mu_: Explain waited for the watch once
  bool reported_ = false;     // guarded by mu_
};

// `comm` watched through `store` when it is a TcpStore: every rank watches the fault key, every rank
// but 0 keeps a heartbeat.
Result<std::unique_ptr<Communicator>> WatchStore(std::unique_ptr<Communicator> comm,
                                                 const std::shared_ptr<gloo::rendezvous::Store>& store,
                                                 const std::string& prefix, std::chrono::milliseconds timeout) {
  auto tcp = std::dynamic_pointer_cast<TcpStore>(store);
  if (tcp == nullptr) return comm;
  auto watched =
      std::make_unique<StoreWatchedCommunicator>(std::move(comm), std::move(tcp), prefix + "/fault", timeout);
  ZERO_RETURN_IF_ERROR(watched->Start());
  return std::unique_ptr<Communicator>(std::move(watched));
}

}  // namespace

Result<RendezvousOptions> RendezvousFromEnv() {
  RendezvousOptions opts;
  long v = 0;
  std::string rank_name = "RANK", size_name = "WORLD_SIZE", local_name = "LOCAL_RANK";
  bool rank_set = false, size_set = false, local_set = false;

  ZERO_RETURN_IF_ERROR(
      ReadInt({"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"}, 1, 1 << 20, &v, &size_name, &size_set));
  if (size_set) opts.world_size = static_cast<int>(v);
  ZERO_RETURN_IF_ERROR(
      ReadInt({"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}, 0, 1 << 20, &v, &rank_name, &rank_set));
  if (rank_set) opts.rank = static_cast<int>(v);
  ZERO_RETURN_IF_ERROR(
      ReadInt({"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}, 0, 1 << 20, &v, &local_name, &local_set));
  if (local_set) opts.local_rank = static_cast<int>(v);

  if (rank_set && !size_set) {
    return InvalidArgumentError(rank_name + "=" + std::to_string(opts.rank) +
                                " is set but WORLD_SIZE is not (set both, or neither for one process)");
  }
  if (opts.rank >= opts.world_size) {
    return InvalidArgumentError(rank_name + "=" + std::to_string(opts.rank) + " is out of range for " + size_name +
                                "=" + std::to_string(opts.world_size) + " (ranks are 0.." +
                                std::to_string(opts.world_size - 1) + ")");
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
  if (FirstSet({"ZERO_JOB_SECRET"}, &name, &value)) {
    if (value.size() < 16) {
      return InvalidArgumentError("ZERO_JOB_SECRET is " + std::to_string(value.size()) +
                                  " characters long; use at least 16 random characters (tools/launch "
                                  "generates 64 hex digits)");
    }
    opts.job_secret = value;
  }
  if (FirstSet({"ZERO_STORE_BIND_ADDR"}, &name, &value)) opts.store_bind_addr = value;
  if (FirstSet({"ZERO_STORE_MAX_VALUE_BYTES"}, &name, &value)) {
    ZERO_RETURN_IF_ERROR(ParseInt(name, value, 1024, 1L << 30, &v));
    opts.store_max_value_bytes = static_cast<size_t>(v);
  }
  if (FirstSet({"ZERO_STORE_HEARTBEAT_MS"}, &name, &value)) {
    ZERO_RETURN_IF_ERROR(ParseInt(name, value, 0, 86400000L, &v));
    opts.store_heartbeat = std::chrono::milliseconds(v);
  }
  return opts;
}

Result<std::shared_ptr<gloo::rendezvous::Store>> CreateStore(const RendezvousOptions& opts) {
  if (!opts.store_path.empty()) {
    ZERO_RETURN_IF_ERROR(MakeDirs(opts.store_path));
    try {
      return std::shared_ptr<gloo::rendezvous::Store>(std::make_shared<gloo::rendezvous::FileStore>(opts.store_path));
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
  t.secret = opts.job_secret;
  t.bind_addr = opts.store_bind_addr;
  t.world_size = opts.world_size;
  t.max_value_bytes = opts.store_max_value_bytes;
  t.heartbeat = opts.store_heartbeat;
  if (t.is_server && t.secret.empty() && IsLoopbackHost(opts.master_addr)) {
    static std::once_flag warned;
    std::call_once(warned, [&] {
      std::fprintf(stderr,
                   "warning: ZERO_JOB_SECRET is not set: any user of this machine can connect to this job's "
                   "rendezvous store on %s:%d and read or write it. Set ZERO_JOB_SECRET to the same random "
                   "value on every rank (e.g. `export ZERO_JOB_SECRET=$(head -c 32 /dev/urandom | xxd -p -c 64)`); "
                   "tools/launch and zero_train --nproc set one.\n",
                   opts.master_addr.c_str(), opts.master_port);
    });
  }
  if (t.is_server && t.secret.empty() && !IsLoopbackHost(opts.master_addr)) {
    static std::once_flag warned;
    std::call_once(warned, [&] {
      std::fprintf(stderr,
                   "warning: ZERO_JOB_SECRET is not set and MASTER_ADDR=%s is not a loopback address: any "
                   "host that can reach %s:%d can read and write this job's rendezvous store. Set "
                   "ZERO_JOB_SECRET to the same random value on every rank (e.g. "
                   "`export ZERO_JOB_SECRET=$(head -c 32 /dev/urandom | xxd -p -c 64)`); tools/launch sets one.\n",
                   opts.master_addr.c_str(), opts.master_addr.c_str(), opts.master_port);
    });
  }
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<TcpStore> store, TcpStore::Create(t));
  return std::shared_ptr<gloo::rendezvous::Store>(std::move(store));
}

Result<std::unique_ptr<Communicator>> CreateCommunicator(const std::string& backend, Device* device,
                                                         const RendezvousOptions& opts) {
  if (backend != "gloo" && backend != "nccl") {
    return InvalidArgumentError("unknown communication backend '" + backend + "' (expected \"gloo\" or \"nccl\")");
  }
#if !defined(ZERO_HAS_NCCL)
  if (backend == "nccl") {
    return UnimplementedError(
        "backend \"nccl\" is not available: this build has no CUDA/NCCL (built without the CUDA "
        "toolkit or nccl.h); use \"gloo\" or rebuild on a machine with CUDA and NCCL");
  }
#endif
  if (opts.world_size < 1 || opts.rank < 0 || opts.rank >= opts.world_size) {
    return InvalidArgumentError("rendezvous: rank " + std::to_string(opts.rank) + " out of range for world size " +
                                std::to_string(opts.world_size));
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
      if (IsLoopbackHost(opts.master_addr) || opts.world_size == 1) {
        g.hostname = "127.0.0.1";
      } else {
        g.hostname = RouteSourceAddress(opts.master_addr, opts.master_port);  // "" -> gethostname
      }
    }
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<GlooCommunicator> comm,
                          GlooCommunicator::Create(opts.rank, opts.world_size, store, device, g));
    return WatchStore(std::move(comm), store, prefix, opts.comm.timeout);
  }
#if defined(ZERO_HAS_NCCL)
  CudaDevice* cuda = device == nullptr ? nullptr : device->AsCuda();
  if (cuda == nullptr) {
    return InvalidArgumentError("backend \"nccl\" needs a CUDA device (cuda:LOCAL_RANK), got " +
                                (device == nullptr ? std::string("none") : device->name()));
  }
  NcclOptions n;
  n.comm = opts.comm;
  n.prefix = prefix;
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<NcclCommunicator> comm,
                        NcclCommunicator::Create(opts.rank, opts.world_size, store, cuda, n));
  return WatchStore(std::move(comm), store, prefix, opts.comm.timeout);
#else
  return InternalError("unreachable");
#endif
}

}  // namespace zero
