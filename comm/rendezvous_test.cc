#include "comm/rendezvous.h"
#include "comm/net_test_util.h"

#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "comm/tcp_store.h"
#include "runtime/cpu_device.h"
#include "testing/free_port.h"
#include "testing/scratch_dir.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

using ::zero::testing::FreeLoopbackPort;

const char* kVars[] = {"RANK",
                       "WORLD_SIZE",
                       "LOCAL_RANK",
                       "OMPI_COMM_WORLD_RANK",
                       "OMPI_COMM_WORLD_SIZE",
                       "OMPI_COMM_WORLD_LOCAL_RANK",
                       "SLURM_PROCID",
                       "SLURM_NTASKS",
                       "SLURM_LOCALID",
                       "MASTER_ADDR",
                       "MASTER_PORT",
                       "ZERO_STORE_PATH",
                       "ZERO_COMM_TIMEOUT_MS",
                       "ZERO_GLOO_IFACE",
                       "GLOO_SOCKET_IFNAME",
                       "ZERO_GLOO_HOSTNAME",
                       "ZERO_JOB_SECRET",
                       "ZERO_STORE_BIND_ADDR",
                       "ZERO_STORE_MAX_VALUE_BYTES",
                       "ZERO_STORE_HEARTBEAT_MS"};

class RendezvousEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars) unsetenv(v);
  }
  void TearDown() override { SetUp(); }
  void Set(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (auto& [k, v] : vars) setenv(k, v, 1);
  }
};

TEST_F(RendezvousEnvTest, DefaultsWithNothingSet) {
  auto o = RendezvousFromEnv();
  ASSERT_OK(o);
  EXPECT_EQ(o->rank, 0);
  EXPECT_EQ(o->world_size, 1);
  EXPECT_EQ(o->local_rank, 0);
  EXPECT_EQ(o->master_addr, "127.0.0.1");
  EXPECT_EQ(o->master_port, 29500);
  EXPECT_EQ(o->comm.timeout.count(), 300000);
}

TEST_F(RendezvousEnvTest, TorchrunVariables) {
  Set({{"RANK", "3"},
       {"WORLD_SIZE", "8"},
       {"LOCAL_RANK", "1"},
       {"MASTER_ADDR", "10.0.0.2"},
       {"MASTER_PORT", "1234"},
       {"ZERO_COMM_TIMEOUT_MS", "2500"},
       {"ZERO_STORE_PATH", "/shared/x"},
       {"GLOO_SOCKET_IFNAME", "eth1"}});
  auto o = RendezvousFromEnv();
  ASSERT_OK(o);
  EXPECT_EQ(o->rank, 3);
  EXPECT_EQ(o->world_size, 8);
  EXPECT_EQ(o->local_rank, 1);
  EXPECT_EQ(o->master_addr, "10.0.0.2");
  EXPECT_EQ(o->master_port, 1234);
  EXPECT_EQ(o->comm.timeout.count(), 2500);
  EXPECT_EQ(o->store_path, "/shared/x");
  EXPECT_EQ(o->gloo_iface, "eth1");
}

TEST_F(RendezvousEnvTest, OpenMpiAndSlurmFallbacks) {
  Set({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}});
  auto o = RendezvousFromEnv();
  ASSERT_OK(o);
  EXPECT_EQ(o->rank, 2);
  EXPECT_EQ(o->world_size, 4);
  EXPECT_EQ(o->local_rank, 2);
  SetUp();
  Set({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "6"}, {"SLURM_LOCALID", "1"}});
  o = RendezvousFromEnv();
  ASSERT_OK(o);
  EXPECT_EQ(o->rank, 5);
  EXPECT_EQ(o->world_size, 6);
  EXPECT_EQ(o->local_rank, 1);
  // The torchrun names win over the fallbacks.
  Set({{"RANK", "0"}, {"WORLD_SIZE", "2"}});
  o = RendezvousFromEnv();
  ASSERT_OK(o);
  EXPECT_EQ(o->rank, 0);
  EXPECT_EQ(o->world_size, 2);
}

void ExpectError(const char* needle1, const char* needle2) {
  auto o = RendezvousFromEnv();
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(o.status().message().find(needle1), std::string::npos) << o.status().ToString();
  EXPECT_NE(o.status().message().find(needle2), std::string::npos) << o.status().ToString();
}

TEST_F(RendezvousEnvTest, MalformedValuesNameVariableAndValue) {
  Set({{"RANK", "abc"}, {"WORLD_SIZE", "2"}});
  ExpectError("RANK", "abc");
  SetUp();
  Set({{"RANK", "1"}, {"WORLD_SIZE", "2x"}});
  ExpectError("WORLD_SIZE", "2x");
  SetUp();
  Set({{"RANK", "2"}, {"WORLD_SIZE", "2"}});
  ExpectError("RANK=2", "WORLD_SIZE=2");
  SetUp();
  Set({{"MASTER_PORT", "70000"}});
  ExpectError("MASTER_PORT", "70000");
  SetUp();
  Set({{"ZERO_COMM_TIMEOUT_MS", "-5"}});
  ExpectError("ZERO_COMM_TIMEOUT_MS", "-5");
  SetUp();
  Set({{"SLURM_PROCID", "1"}});
  ExpectError("SLURM_PROCID", "WORLD_SIZE");
  SetUp();
  Set({{"WORLD_SIZE", "0"}});
  ExpectError("WORLD_SIZE", "0");
}

TEST_F(RendezvousEnvTest, StoreSecurityVariables) {
  const char* secret = "0123456789abcdef0123456789abcdef";
  Set({{"ZERO_JOB_SECRET", secret}, {"ZERO_STORE_BIND_ADDR", "10.1.2.3"}, {"ZERO_STORE_MAX_VALUE_BYTES", "65536"}});
  auto o = RendezvousFromEnv();
  ASSERT_OK(o);
  EXPECT_EQ(o->job_secret, secret);
  EXPECT_EQ(o->store_bind_addr, "10.1.2.3");
  EXPECT_EQ(o->store_max_value_bytes, 65536u);
  SetUp();
  EXPECT_EQ(RendezvousFromEnv()->store_max_value_bytes, size_t{1} << 20);
  EXPECT_TRUE(RendezvousFromEnv()->job_secret.empty());
  // A short secret is refused without echoing it.
  Set({{"ZERO_JOB_SECRET", "hunter2"}});
  auto bad = RendezvousFromEnv();
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("ZERO_JOB_SECRET is 7 characters"), std::string::npos)
      << bad.status().ToString();
  EXPECT_EQ(bad.status().message().find("hunter2"), std::string::npos) << bad.status().ToString();
  SetUp();
  Set({{"ZERO_STORE_MAX_VALUE_BYTES", "12"}});
  ExpectError("ZERO_STORE_MAX_VALUE_BYTES", "12");
  SetUp();
  EXPECT_EQ(RendezvousFromEnv()->store_heartbeat.count(), 5000);
  Set({{"ZERO_STORE_HEARTBEAT_MS", "0"}});
  EXPECT_EQ(RendezvousFromEnv()->store_heartbeat.count(), 0);
  Set({{"ZERO_STORE_HEARTBEAT_MS", "-5"}});
  ExpectError("ZERO_STORE_HEARTBEAT_MS", "-5");
}

// Two gloo ranks rendezvous over TCP with a job secret while an intruder with another secret
// tries to join: the intruder is refused, the ranks get a working communicator.
TEST(CreateCommunicatorTest, TcpRendezvousWithSecretRefusesAnIntruder) {
  CpuDevice d0, d1;
  RendezvousOptions o;
  o.world_size = 2;
  o.master_port = FreeLoopbackPort();
  o.job_secret = "5e1f0c3a9b8d7e6f5a4b3c2d1e0f9a8b";
  o.comm.timeout = std::chrono::milliseconds(10000);
  Result<std::unique_ptr<Communicator>> c1 = UnavailableError("not run");
  Result<std::unique_ptr<Communicator>> intruder = UnavailableError("not run");
  ::testing::internal::CaptureStderr();
  std::thread t([&] {
    RendezvousOptions o1 = o;
    o1.rank = 1;
    c1 = CreateCommunicator("gloo", &d1, o1);
  });
  std::thread bad([&] {
    CpuDevice d;
    RendezvousOptions ob = o;
    ob.rank = 1;
    ob.job_secret = "an-attacker-guess-of-the-secret";
    intruder = CreateCommunicator("gloo", &d, ob);
  });
  auto c0 = CreateCommunicator("gloo", &d0, o);
  t.join();
  bad.join();
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_OK(c0);
  ASSERT_OK(c1);
  ASSERT_FALSE(intruder.ok());
  EXPECT_EQ(intruder.status().code(), StatusCode::kFailedPrecondition) << intruder.status().ToString();
  EXPECT_NE(log.find("did not prove the job secret"), std::string::npos) << log;
  double v0 = 1, v1 = 2;
  std::thread t2([&] { EXPECT_OK((*c1)->AllReduceHost(&v1, 1, ReduceOp::kSum)); });
  EXPECT_OK((*c0)->AllReduceHost(&v0, 1, ReduceOp::kSum));
  t2.join();
  EXPECT_EQ(v0, 3);
  EXPECT_EQ(v1, 3);
}

// A non-loopback MASTER_ADDR: rank 0's store listens on that address (not on loopback) and, with
// no secret set, warns once that anyone who can reach it can join.
TEST(CreateCommunicatorTest, NonLoopbackMasterWithoutSecretWarnsOnce) {
  const std::string addr = NonLoopbackAddress();
  if (addr.empty()) GTEST_SKIP() << "this machine has no non-loopback IPv4 interface that is up";
  RendezvousOptions o;
  o.world_size = 2;
  o.master_addr = addr;
  o.master_port = FreeLoopbackPort();
  o.comm.timeout = std::chrono::milliseconds(5000);
  ::testing::internal::CaptureStderr();
  auto store = CreateStore(o);
  RendezvousOptions again = o;
  again.master_port = FreeLoopbackPort();
  auto store2 = CreateStore(again);
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_OK(store);
  ASSERT_OK(store2);
  auto* tcp = dynamic_cast<TcpStore*>(store->get());
  ASSERT_NE(tcp, nullptr);
  EXPECT_EQ(tcp->bind_address(), addr);
  size_t first = log.find("ZERO_JOB_SECRET is not set");
  ASSERT_NE(first, std::string::npos) << log;
  EXPECT_EQ(log.find("ZERO_JOB_SECRET is not set", first + 1), std::string::npos) << "warned twice: " << log;
  EXPECT_NE(log.find(addr), std::string::npos) << log;
}

// Ranks started by hand on loopback without a secret: rank 0 warns once per process that any user
// of this machine can join, and how to set the secret. (No earlier test in this binary creates a
// loopback TCP store without a secret; the warning is once per process.)
TEST(CreateCommunicatorTest, LoopbackMasterWithoutSecretWarnsOnce) {
  RendezvousOptions o;
  o.world_size = 2;
  o.master_port = FreeLoopbackPort();
  o.comm.timeout = std::chrono::milliseconds(5000);
  ::testing::internal::CaptureStderr();
  auto store = CreateStore(o);
  RendezvousOptions again = o;
  again.master_port = FreeLoopbackPort();
  auto store2 = CreateStore(again);
  RendezvousOptions with_secret = o;
  with_secret.master_port = FreeLoopbackPort();
  with_secret.job_secret = "5e1f0c3a9b8d7e6f5a4b3c2d1e0f9a8b";
  auto store3 = CreateStore(with_secret);
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_OK(store);
  ASSERT_OK(store2);
  ASSERT_OK(store3);
  const std::string warning = "warning: ZERO_JOB_SECRET is not set: any user of this machine can connect";
  size_t first = log.find(warning);
  ASSERT_NE(first, std::string::npos) << log;
  EXPECT_EQ(log.find(warning, first + 1), std::string::npos) << "warned twice: " << log;
  EXPECT_NE(log.find("127.0.0.1:" + std::to_string(o.master_port)), std::string::npos) << log;
  EXPECT_NE(log.find("export ZERO_JOB_SECRET="), std::string::npos) << log;
}

// Rank 0's process stops (SIGSTOP: its sockets stay open, so gloo sees nothing) while rank 1 waits
// in a collective: rank 1's store heartbeat aborts the communicator, and the collective fails within
// about 1.5 x the heartbeat (0.5 s here) naming the store's address, instead of after the
// communicator's timeout (20 s here, 300 s by default).
TEST(CreateCommunicatorTest, StoppedRankZeroFailsTheOthersWithinTheHeartbeat) {
  RendezvousOptions o;
  o.world_size = 2;
  o.master_port = FreeLoopbackPort();
  o.job_secret = "5e1f0c3a9b8d7e6f5a4b3c2d1e0f9a8b";
  o.comm.timeout = std::chrono::milliseconds(20000);
  o.store_heartbeat = std::chrono::milliseconds(500);
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t rank0 = fork();  // before this process starts any thread
  if (rank0 == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    CpuDevice d;
    auto c = CreateCommunicator("gloo", &d, o);
    char b = c.ok() ? 1 : 0;
    if (write(ready[1], &b, 1) != 1 || !c.ok()) _exit(1);
    while (true) pause();  // never joins a collective
  }
  ASSERT_GT(rank0, 0);
  CpuDevice d1;
  RendezvousOptions o1 = o;
  o1.rank = 1;
  auto c1 = CreateCommunicator("gloo", &d1, o1);
  char b = 0;
  const bool rank0_ok = read(ready[0], &b, 1) == 1 && b == 1;
  close(ready[0]);
  close(ready[1]);
  if (!c1.ok() || !rank0_ok) kill(rank0, SIGKILL);
  ASSERT_OK(c1);
  ASSERT_TRUE(rank0_ok) << "rank 0 did not create its communicator";
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    kill(rank0, SIGSTOP);
  });
  const auto t0 = std::chrono::steady_clock::now();
  double v = 1;
  Status s = (*c1)->AllReduceHost(&v, 1, ReduceOp::kSum);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stopper.join();
  kill(rank0, SIGKILL);
  waitpid(rank0, nullptr, 0);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_LT(secs, 4.0) << s.ToString();
  EXPECT_NE(s.message().find("TcpStore 127.0.0.1:" + std::to_string(o.master_port) + " (rank 1)"), std::string::npos)
      << s.ToString();
  EXPECT_NE(s.message().find("did not answer a heartbeat within 500 ms"), std::string::npos) << s.ToString();
  // The communicator stays failed with the same error; destroying it is prompt.
  EXPECT_EQ((*c1)->CheckHealth().code(), StatusCode::kUnavailable);
  c1->reset();
}

// One rank's fault reaches every rank (issue 23): three thread ranks over the real TcpStore; ranks 0
// and 1 wait in a collective while rank 2 reports a fault (Communicator::ReportFault) and never
// joins. Both fail at once (not after the communicator's timeout, 30 s here) with UNAVAILABLE naming
// rank 2 and its error; rank 2's own communicator is aborted too; rank 0, whose failure is a
// consequence, reporting again changes nothing.
TEST(CreateCommunicatorTest, ReportedFaultFailsEveryRankAtOnceNamingIt) {
  RendezvousOptions o;
  o.world_size = 3;
  o.master_port = FreeLoopbackPort();
  o.job_secret = "5e1f0c3a9b8d7e6f5a4b3c2d1e0f9a8b";
  o.comm.timeout = std::chrono::milliseconds(30000);
  CpuDevice devices[3];
  std::unique_ptr<Communicator> comms[3];
  Status made[3];
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      RendezvousOptions mine = o;
      mine.rank = r;
      auto c = CreateCommunicator("gloo", &devices[r], mine);
      made[r] = c.status();
      if (c.ok()) comms[r] = std::move(c).value();
    });
  }
  for (auto& t : threads) t.join();
  threads.clear();
  for (int r = 0; r < 3; ++r) ASSERT_OK(made[r]);

  Status waited[2];
  double secs[2] = {0, 0};
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      double v = r;
      waited[r] = comms[r]->AllReduceHost(&v, 1, ReduceOp::kSum);
      secs[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  comms[2]->ReportFault(InternalError("swap file /nvme/rank2/params.swp: read failed: Input/output error"));
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_FALSE(waited[r].ok());
    EXPECT_EQ(waited[r].code(), StatusCode::kUnavailable) << waited[r].ToString();
    EXPECT_LT(secs[r], 3.0) << waited[r].ToString();
    EXPECT_NE(waited[r].message().find("rank 2 failed: INTERNAL: swap file /nvme/rank2/params.swp: read failed"),
              std::string::npos)
        << waited[r].ToString();
  }
  double v = 0;
  EXPECT_EQ(comms[2]->AllReduceHost(&v, 1, ReduceOp::kSum).code(), StatusCode::kUnavailable);
  comms[0]->ReportFault(waited[0]);
  Status later = comms[1]->CheckHealth();
  EXPECT_NE(later.message().find("rank 2 failed"), std::string::npos) << later.ToString();
  for (auto& c : comms) c.reset();
}

TEST(CreateCommunicatorTest, UnknownBackendAndSingleRank) {
  CpuDevice dev;
  RendezvousOptions o;
  auto bad = CreateCommunicator("mpi", &dev, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("mpi"), std::string::npos);
  // A world of one binds no port: two at once on the same MASTER_PORT both work.
  auto a = CreateCommunicator("gloo", &dev, o);
  auto b = CreateCommunicator("gloo", &dev, o);
  ASSERT_OK(a);
  ASSERT_OK(b);
  EXPECT_EQ((*a)->backend(), "gloo");
  float x[3] = {1, 2, 3};
  auto w = (*a)->AllReduce(x, 3, DType::kF32, ReduceOp::kAvg);
  ASSERT_OK(w);
  EXPECT_OK((*w)->Wait());
  EXPECT_EQ(x[2], 3.0f);
  // gloo needs host memory; nccl a CUDA device (or, without CUDA, is not built at all).
  auto nccl = CreateCommunicator("nccl", &dev, o);
  ASSERT_FALSE(nccl.ok());
  EXPECT_TRUE(nccl.status().code() == StatusCode::kUnimplemented ||
              nccl.status().code() == StatusCode::kInvalidArgument)
      << nccl.status().ToString();
}

TEST(CreateCommunicatorTest, FileStoreRendezvousOfTwoThreads) {
  ASSERT_OK_AND_ASSIGN(ScratchDir dir, ScratchDir::Create("zero_filestore"));
  CpuDevice d0, d1;
  RendezvousOptions o;
  o.world_size = 2;
  o.store_path = dir.path();
  o.comm.timeout = std::chrono::milliseconds(5000);
  Result<std::unique_ptr<Communicator>> c1 = UnavailableError("not run");
  std::thread t([&] {
    RendezvousOptions o1 = o;
    o1.rank = 1;
    c1 = CreateCommunicator("gloo", &d1, o1);
  });
  auto c0 = CreateCommunicator("gloo", &d0, o);
  t.join();
  ASSERT_OK(c0);
  ASSERT_OK(c1);
  double v0 = 1.5, v1 = 2.25;
  std::thread t2([&] { EXPECT_OK((*c1)->AllReduceHost(&v1, 1, ReduceOp::kSum)); });
  EXPECT_OK((*c0)->AllReduceHost(&v0, 1, ReduceOp::kSum));
  t2.join();
  EXPECT_EQ(v0, 3.75);
  EXPECT_EQ(v1, 3.75);
}

}  // namespace
}  // namespace zero
