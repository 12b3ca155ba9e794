// comm_worker: one rank of a multi-process communicator test. Reads RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR, MASTER_PORT, ZERO_COMM_TIMEOUT_MS from the environment (rendezvous.h), creates
// the communicator of --backend through CreateCommunicator and runs --scenario:
//   mix        every collective, results checked (bitwise against the rank-order reference for
//              gloo; exactly, with inputs whose sums are exact in any order, for nccl)
//   die=R      rank R kills itself (SIGKILL) after a first barrier; the others then run a
//              collective, which must fail within the timeout naming rank R
//   die_during=R  as die, but the others are already waiting in the collective when R dies
//   rendezvous_only  create the communicator and report its status (for missing-rank tests)
// Prints "PASS ..." and exits 0, or "FAIL ..." and exits 1.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm_test_util.h"
#include "comm/communicator.h"
#include "comm/rendezvous.h"
#include "runtime/cpu_device.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/status.h"

namespace zero {
namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string backend = "gloo";
  std::string scenario = "mix";
  int victim = -1;
};

// Buffers live in the Device's memory; these move data between it and the host.
class Buf {
 public:
  static Result<Buf> Make(Device* d, size_t bytes) {
    Buf b;
    b.device_ = d;
    ZERO_ASSIGN_OR_RETURN(b.mem_, d->Allocate(std::max<size_t>(bytes, 1)));
    b.bytes_ = bytes;
    return b;
  }
  void* data() const { return mem_.data(); }
  Status Upload(const std::vector<uint8_t>& host) {
    ZERO_RETURN_IF_ERROR(device_->Copy(mem_.data(), host.data(), host.size(), CopyKind::kHostToDevice, nullptr));
    return device_->Synchronize();
  }
  Result<std::vector<uint8_t>> Download() {
    std::vector<uint8_t> host(bytes_);
    ZERO_RETURN_IF_ERROR(device_->Copy(host.data(), mem_.data(), bytes_, CopyKind::kDeviceToHost, nullptr));
    ZERO_RETURN_IF_ERROR(device_->Synchronize());
    return host;
  }

 private:
  Device* device_ = nullptr;
  DeviceBuffer mem_;
  size_t bytes_ = 0;
};

// Inputs whose sum, average and max are exact in any order (small integers), for NCCL.
std::vector<uint8_t> ExactInput(DType t, size_t n, int rank, uint32_t seed) {
  std::vector<uint8_t> buf(n * SizeOf(t));
  for (size_t i = 0; i < n; ++i) {
    int v = static_cast<int>((i * 7 + rank * 13 + seed) % 17) - 8;
    StoreFromFloat(buf.data(), t, i, static_cast<float>(v));
  }
  return buf;
}

void ExactReference(DType t, size_t offset, size_t n, int n_ranks, ReduceOp op, uint32_t seed, void* out) {
  for (size_t i = 0; i < n; ++i) {
    float acc = 0;
    for (int r = 0; r < n_ranks; ++r) {
      float v = static_cast<float>(static_cast<int>(((offset + i) * 7 + r * 13 + seed) % 17) - 8);
      acc = r == 0 ? v : (op == ReduceOp::kMax ? std::max(acc, v) : acc + v);
    }
    if (op == ReduceOp::kAvg) acc /= n_ranks;
    StoreFromFloat(out, t, i, acc);
  }
}

Status RunMix(Communicator* comm, Device* dev, bool exact_inputs) {
  const int rank = comm->rank();
  const int n_ranks = comm->world_size();
  auto input = [&](DType t, size_t n, int r, uint32_t seed) {
    return exact_inputs ? ExactInput(t, n, r, seed) : testing::MakeInput(t, n, r, seed);
  };
  auto reference = [&](DType t, size_t off, size_t n, ReduceOp op, uint32_t seed, void* out) {
    if (exact_inputs) {
      ExactReference(t, off, n, n_ranks, op, seed, out);
    } else {
      testing::ReferenceReduce(t, off, n, n_ranks, op, seed, out);
    }
  };
  uint32_t seed = 1;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
      // kAvg of small integers is exact only for power-of-two world sizes.
      if (exact_inputs && op == ReduceOp::kAvg && (n_ranks & (n_ranks - 1)) != 0) continue;
      for (size_t n : {size_t{1}, size_t{7}, size_t{100003}}) {
        ++seed;
        const size_t es = SizeOf(t);
        // AllReduce.
        ZERO_ASSIGN_OR_RETURN(Buf b, Buf::Make(dev, n * es));
        RANK_EXPECT_OK(b.Upload(input(t, n, rank, seed)));
        ZERO_ASSIGN_OR_RETURN(auto w, comm->AllReduce(b.data(), n, t, op));
        RANK_EXPECT_OK(w->Wait());
        ZERO_ASSIGN_OR_RETURN(auto got, b.Download());
        std::vector<uint8_t> want(n * es);
        reference(t, 0, n, op, seed, want.data());
        long bad = testing::FirstMismatch(got.data(), want.data(), n, t);
        RANK_CHECK(bad < 0, std::string("AllReduce ") + DTypeName(t) + " " + ReduceOpName(op) +
                                " n=" + std::to_string(n) + " differs at " + std::to_string(bad));
        // ReduceScatter.
        ZERO_ASSIGN_OR_RETURN(Buf send, Buf::Make(dev, n * n_ranks * es));
        ZERO_ASSIGN_OR_RETURN(Buf recv, Buf::Make(dev, n * es));
        RANK_EXPECT_OK(send.Upload(input(t, n * n_ranks, rank, seed)));
        ZERO_ASSIGN_OR_RETURN(auto w2, comm->ReduceScatter(send.data(), recv.data(), n, t, op));
        RANK_EXPECT_OK(w2->Wait());
        ZERO_ASSIGN_OR_RETURN(got, recv.Download());
        reference(t, rank * n, n, op, seed, want.data());
        bad = testing::FirstMismatch(got.data(), want.data(), n, t);
        RANK_CHECK(bad < 0, std::string("ReduceScatter ") + DTypeName(t) + " " + ReduceOpName(op) +
                                " n=" + std::to_string(n) + " differs at " + std::to_string(bad));
      }
    }
    // AllGather (in place) and Broadcast from every root.
    for (size_t n : {size_t{1}, size_t{100003}}) {
      ++seed;
      const size_t es = SizeOf(t);
      std::vector<uint8_t> want(n * n_ranks * es);
      for (int r = 0; r < n_ranks; ++r) {
        auto part = input(t, n, r, seed);
        std::memcpy(want.data() + r * n * es, part.data(), part.size());
      }
      ZERO_ASSIGN_OR_RETURN(Buf all, Buf::Make(dev, n * n_ranks * es));
      std::vector<uint8_t> init(n * n_ranks * es, 0);
      auto mine = input(t, n, rank, seed);
      std::memcpy(init.data() + rank * n * es, mine.data(), mine.size());
      RANK_EXPECT_OK(all.Upload(init));
      char* base = static_cast<char*>(all.data());
      ZERO_ASSIGN_OR_RETURN(auto w, comm->AllGather(base + rank * n * es, base, n, t));
      RANK_EXPECT_OK(w->Wait());
      ZERO_ASSIGN_OR_RETURN(auto got, all.Download());
      RANK_CHECK(got == want, "AllGather n=" + std::to_string(n));
      for (int root = 0; root < n_ranks; ++root) {
        ZERO_ASSIGN_OR_RETURN(Buf b, Buf::Make(dev, n * es));
        auto root_data = input(t, n, root, seed + 1000);
        RANK_EXPECT_OK(b.Upload(rank == root ? root_data : std::vector<uint8_t>(n * es, 0)));
        ZERO_ASSIGN_OR_RETURN(auto wb, comm->Broadcast(b.data(), n, t, root));
        RANK_EXPECT_OK(wb->Wait());
        ZERO_ASSIGN_OR_RETURN(auto gb, b.Download());
        RANK_CHECK(gb == root_data, "Broadcast root " + std::to_string(root));
      }
    }
  }
  RANK_EXPECT_OK(comm->Barrier());
  double v[2] = {1.0 + rank, rank % 2 ? 1e16 : 0.25};
  RANK_EXPECT_OK(comm->AllReduceHost(v, 2, ReduceOp::kSum));
  double want0 = 0, want1 = 0;
  for (int r = 0; r < n_ranks; ++r) {
    want0 = r == 0 ? 1.0 : want0 + (1.0 + r);
    want1 = r == 0 ? 0.25 : want1 + (r % 2 ? 1e16 : 0.25);
  }
  RANK_CHECK(v[0] == want0 && v[1] == want1, "AllReduceHost");
  char msg[32] = {};
  if (rank == n_ranks - 1) std::snprintf(msg, sizeof(msg), "from %d", rank);
  RANK_EXPECT_OK(comm->BroadcastHost(msg, sizeof(msg), n_ranks - 1));
  RANK_CHECK(std::string(msg) == "from " + std::to_string(n_ranks - 1), msg);
  return comm->Barrier();
}

// Returns OK when this rank observed the failure the scenario expects.
Status RunDie(Communicator* comm, Device* dev, int victim, bool during, std::chrono::milliseconds timeout) {
  RANK_EXPECT_OK(comm->Barrier());
  if (comm->rank() == victim) {
    if (during) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::fflush(stdout);
    kill(getpid(), SIGKILL);
  }
  if (!during) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ZERO_ASSIGN_OR_RETURN(Buf b, Buf::Make(dev, 1000 * sizeof(float)));
  RANK_EXPECT_OK(b.Upload(std::vector<uint8_t>(1000 * sizeof(float), 0)));
  auto start = Clock::now();
  Status s;
  auto w = comm->AllReduce(b.data(), 1000, DType::kF32, ReduceOp::kSum);
  s = w.ok() ? (*w)->Wait() : w.status();
  auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  std::printf("rank %d: collective after rank %d died: %s (%lld ms)\n", comm->rank(), victim, s.ToString().c_str(),
              static_cast<long long>(took.count()));
  RANK_CHECK(!s.ok(), "a collective with a dead rank succeeded");
  RANK_CHECK(s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kDeadlineExceeded, s.ToString());
  RANK_CHECK(took < timeout + std::chrono::milliseconds(1500), "took too long");
  // Fails fast afterwards.
  auto t0 = Clock::now();
  Status again = comm->Barrier();
  RANK_CHECK(!again.ok(), "a barrier after the failure succeeded");
  RANK_CHECK(Clock::now() - t0 < std::chrono::milliseconds(500), "later call did not fail fast");
  if (comm->backend() == "gloo") {
    // Gloo names the peer whose connection closed (or the one it waited for).
    RANK_CHECK(s.message().find("rank " + std::to_string(victim)) != std::string::npos, s.ToString());
  }
  return OkStatus();
}

int Main(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--backend=", 0) == 0) {
      args.backend = a.substr(10);
    } else if (a.rfind("--scenario=", 0) == 0) {
      args.scenario = a.substr(11);
      auto eq = args.scenario.find('=');
      if (eq != std::string::npos) {
        args.victim = std::stoi(args.scenario.substr(eq + 1));
        args.scenario = args.scenario.substr(0, eq);
      }
    } else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  auto opts = RendezvousFromEnv();
  if (!opts.ok()) {
    std::printf("FAIL %s\n", opts.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<Device> device;
  if (args.backend == "nccl") {
    auto d = CreateDevice("cuda:" + std::to_string(opts->local_rank));
    if (!d.ok()) {
      std::printf("FAIL %s\n", d.status().ToString().c_str());
      return 1;
    }
    device = std::move(d).value();
  } else {
    device = std::make_unique<CpuDevice>();
  }
  auto start = Clock::now();
  auto comm = CreateCommunicator(args.backend, device.get(), *opts);
  double setup_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  if (args.scenario == "rendezvous_only") {
    std::printf("%s rank %d rendezvous: %s (%.0f ms)\n", comm.ok() ? "PASS" : "FAIL", opts->rank,
                comm.ok() ? "OK" : comm.status().ToString().c_str(), setup_ms);
    return comm.ok() ? 0 : 1;
  }
  if (!comm.ok()) {
    std::printf("FAIL rank %d: %s\n", opts->rank, comm.status().ToString().c_str());
    return 1;
  }
  Status s;
  if (args.scenario == "mix") {
    s = RunMix(comm->get(), device.get(), args.backend == "nccl");
  } else if (args.scenario == "die" || args.scenario == "die_during") {
    s = RunDie(comm->get(), device.get(), args.victim, args.scenario == "die_during", opts->comm.timeout);
  } else {
    s = InvalidArgumentError("unknown scenario " + args.scenario);
  }
  std::printf("%s rank %d of %d (%s, %s, setup %.0f ms): %s\n", s.ok() ? "PASS" : "FAIL", opts->rank, opts->world_size,
              args.backend.c_str(), args.scenario.c_str(), setup_ms, s.ToString().c_str());
  std::fflush(stdout);
  return s.ok() ? 0 : 1;
}

}  // namespace
}  // namespace zero

int main(int argc, char** argv) { return zero::Main(argc, argv); }
