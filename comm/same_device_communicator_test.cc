#include "comm/same_device_communicator.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm_test_util.h"
#include "comm/rank_reduce.h"
#include "comm/thread_ranks.h"
#include "runtime/cpu_device.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

using testing::FirstMismatch;
using testing::MakeInput;
using testing::ReferenceReduce;
using Clock = std::chrono::steady_clock;

constexpr DType kDTypes[] = {DType::kF32, DType::kBF16, DType::kF16};
constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax};

SameDeviceOptions Timeout(int ms) {
  SameDeviceOptions o;
  o.comm.timeout = std::chrono::milliseconds(ms);
  return o;
}

std::string Case(DType t, ReduceOp op, size_t n) {
  return std::string(DTypeName(t)) + "/" + ReduceOpName(op) + "/n=" + std::to_string(n);
}

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// Runs body(rank, comm) on `world` threads, each rank on its own CpuDevice and the group's
// communicator, and returns every rank's status (RunSameDeviceRanks returns only the first).
// `before_join`, if set, may keep a rank from joining (return false).
std::vector<Status> RunEach(int world, const std::function<Status(int, SameDeviceCommunicator*)>& body,
                            SameDeviceOptions options = {}, const std::function<bool(int)>& joins = nullptr) {
  std::vector<Status> out(world);
  auto group = SameDeviceGroup::Create(world, options);
  if (!group.ok()) {
    out.assign(world, group.status());
    return out;
  }
  std::vector<std::unique_ptr<CpuDevice>> devices(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    devices[r] = std::make_unique<CpuDevice>();
    threads.emplace_back([&, r] {
      if (joins && !joins(r)) return;
      auto comm = (*group)->Join(r, devices[r].get());
      if (!comm.ok()) {
        out[r] = comm.status();
        return;
      }
      out[r] = body(r, comm->get());
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

// --- every collective against the rank-order reference, bitwise ------------------------------

class SameDeviceWorldTest : public ::testing::TestWithParam<int> {};

// Every dtype x op x count (counts not divisible by the world size among them), all issued before
// any is waited, compared bitwise with the sequential rank-order fp32 reduction.
TEST_P(SameDeviceWorldTest, AllReduceMatchesRankOrderReferenceBitwise) {
  const int n_ranks = GetParam();
  const size_t counts[] = {1, 5, 1031, 70001};
  Status s = RunSameDeviceRanks(n_ranks, [&](int rank, Communicator* comm, Device*) -> Status {
    struct C {
      DType t;
      ReduceOp op;
      size_t n;
      uint32_t seed;
      std::vector<uint8_t> buf;
      std::unique_ptr<Work> work;
    };
    std::vector<C> cases;
    uint32_t seed = 1;
    for (DType t : kDTypes) {
      for (ReduceOp op : kOps) {
        for (size_t n : counts) cases.push_back({t, op, n, seed, MakeInput(t, n, rank, seed), nullptr}), ++seed;
      }
    }
    for (auto& c : cases) {
      auto w = comm->AllReduce(c.buf.data(), c.n, c.t, c.op);
      RANK_EXPECT_OK(w.status());
      c.work = std::move(*w);
    }
    for (auto& c : cases) {
      RANK_EXPECT_OK(c.work->Wait());
      RANK_CHECK(c.work->IsCompleted(), Case(c.t, c.op, c.n));
      std::vector<uint8_t> want(c.n * SizeOf(c.t));
      ReferenceReduce(c.t, 0, c.n, n_ranks, c.op, c.seed, want.data());
      long bad = FirstMismatch(c.buf.data(), want.data(), c.n, c.t);
      RANK_CHECK(bad < 0, Case(c.t, c.op, c.n) + " first mismatch at " + std::to_string(bad));
    }
    return OkStatus();
  });
  EXPECT_OK(s);
}

TEST_P(SameDeviceWorldTest, ReduceScatterMatchesReferenceBitwise) {
  const int n_ranks = GetParam();
  Status s = RunSameDeviceRanks(n_ranks, [&](int rank, Communicator* comm, Device*) -> Status {
    uint32_t seed = 100;
    for (DType t : kDTypes) {
      for (ReduceOp op : kOps) {
        for (size_t rc : {size_t{1}, size_t{7}, size_t{33}}) {
          ++seed;
          std::vector<uint8_t> send = MakeInput(t, n_ranks * rc, rank, seed);
          std::vector<uint8_t> recv(rc * SizeOf(t), 0xcd);
          auto w = comm->ReduceScatter(send.data(), recv.data(), rc, t, op);
          RANK_EXPECT_OK(w.status());
          RANK_EXPECT_OK((*w)->Wait());
          std::vector<uint8_t> want(rc * SizeOf(t));
          ReferenceReduce(t, rank * rc, rc, n_ranks, op, seed, want.data());
          long bad = FirstMismatch(recv.data(), want.data(), rc, t);
          RANK_CHECK(bad < 0, Case(t, op, rc) + " first mismatch at " + std::to_string(bad));
          // The input is not modified.
          RANK_CHECK(send == MakeInput(t, n_ranks * rc, rank, seed), Case(t, op, rc) + " input changed");
        }
      }
    }
    return OkStatus();
  });
  EXPECT_OK(s);
}

TEST_P(SameDeviceWorldTest, AllGatherOutOfPlaceAndInPlace) {
  const int n_ranks = GetParam();
  Status s = RunSameDeviceRanks(n_ranks, [&](int rank, Communicator* comm, Device*) -> Status {
    for (DType t : kDTypes) {
      for (size_t sc : {size_t{1}, size_t{13}}) {
        const size_t es = SizeOf(t);
        std::vector<uint8_t> mine = MakeInput(t, sc, rank, 7);
        std::vector<uint8_t> out(n_ranks * sc * es, 0xcd);
        auto w = comm->AllGather(mine.data(), out.data(), sc, t);
        RANK_EXPECT_OK(w.status());
        RANK_EXPECT_OK((*w)->Wait());
        std::vector<uint8_t> in_place(n_ranks * sc * es, 0xcd);
        std::memcpy(in_place.data() + rank * sc * es, mine.data(), sc * es);
        auto w2 = comm->AllGather(in_place.data() + rank * sc * es, in_place.data(), sc, t);
        RANK_EXPECT_OK(w2.status());
        RANK_EXPECT_OK((*w2)->Wait());
        for (int r = 0; r < n_ranks; ++r) {
          std::vector<uint8_t> want = MakeInput(t, sc, r, 7);
          RANK_CHECK(std::memcmp(out.data() + r * sc * es, want.data(), sc * es) == 0,
                     std::string(DTypeName(t)) + " out of place, share of rank " + std::to_string(r));
          RANK_CHECK(std::memcmp(in_place.data() + r * sc * es, want.data(), sc * es) == 0,
                     std::string(DTypeName(t)) + " in place, share of rank " + std::to_string(r));
        }
      }
    }
    return OkStatus();
  });
  EXPECT_OK(s);
}

TEST_P(SameDeviceWorldTest, BroadcastFromEveryRoot) {
  const int n_ranks = GetParam();
  Status s = RunSameDeviceRanks(n_ranks, [&](int rank, Communicator* comm, Device*) -> Status {
    for (int root = 0; root < n_ranks; ++root) {
      std::vector<uint8_t> buf = MakeInput(DType::kBF16, 301, rank, 9);
      auto w = comm->Broadcast(buf.data(), 301, DType::kBF16, root);
      RANK_EXPECT_OK(w.status());
      RANK_EXPECT_OK((*w)->Wait());
      RANK_CHECK(buf == MakeInput(DType::kBF16, 301, root, 9), "root " + std::to_string(root));
    }
    return OkStatus();
  });
  EXPECT_OK(s);
}

// Host values: summed in rank order in double (kAvg divides), kMax; BroadcastHost; Barrier.
TEST_P(SameDeviceWorldTest, HostCollectivesAndBarrier) {
  const int n_ranks = GetParam();
  std::vector<std::atomic<int>> arrived(n_ranks);
  Status s = RunSameDeviceRanks(n_ranks, [&](int rank, Communicator* comm, Device*) -> Status {
    for (ReduceOp op : kOps) {
      double v[3] = {0.1 * (rank + 1), 1e16 * (rank % 2 ? 1 : -1), rank == n_ranks - 1 ? NAN : 1.0};
      RANK_EXPECT_OK(comm->AllReduceHost(v, 3, op));
      for (int i = 0; i < 3; ++i) {
        double acc = 0;
        for (int r = 0; r < n_ranks; ++r) {
          const double x = i == 0 ? 0.1 * (r + 1) : i == 1 ? 1e16 * (r % 2 ? 1 : -1) : r == n_ranks - 1 ? NAN : 1.0;
          if (r == 0) {
            acc = x;
          } else if (op == ReduceOp::kMax) {
            if (x > acc || x != x) acc = x;
          } else {
            acc += x;
          }
        }
        if (op == ReduceOp::kAvg) acc /= n_ranks;
        RANK_CHECK(std::memcmp(&acc, &v[i], sizeof(double)) == 0, std::string(ReduceOpName(op)) + " value " +
                                                                      std::to_string(i) + ": " + std::to_string(v[i]) +
                                                                      " vs " + std::to_string(acc));
      }
    }
    for (int root = 0; root < n_ranks; ++root) {
      char text[32];
      std::snprintf(text, sizeof(text), "from rank %d", rank);
      RANK_EXPECT_OK(comm->BroadcastHost(text, sizeof(text), root));
      RANK_CHECK(std::string(text) == "from rank " + std::to_string(root), text);
    }
    arrived[rank] = 1;
    RANK_EXPECT_OK(comm->Barrier());
    for (int r = 0; r < n_ranks; ++r) RANK_CHECK(arrived[r] == 1, "rank " + std::to_string(r) + " not at the barrier");
    return comm->CheckHealth();
  });
  EXPECT_OK(s);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, SameDeviceWorldTest, ::testing::Range(1, 9),
                         [](const ::testing::TestParamInfo<int>& info) { return "w" + std::to_string(info.param); });

// The same inputs through GlooCommunicator (thread ranks over loopback) and this one: the same bits,
// -0 and Inf included (only NaN payloads may differ, and these inputs produce none).
TEST(SameDeviceCommunicatorTest, EqualsGlooBitwise) {
  constexpr int kRanks = 3;
  constexpr size_t kShare = 37;
  auto input = [](DType t, int rank) {
    std::vector<uint8_t> v = MakeInput(t, kRanks * kShare, rank, 21);
    StoreFromFloat(v.data(), t, 0, -0.0f);                         // -0 on every rank: -0
    StoreFromFloat(v.data(), t, 1, rank == 1 ? 0.0f : -0.0f);      // +0 somewhere: +0
    StoreFromFloat(v.data(), t, 2, rank == 2 ? INFINITY : 1.0f);   // Inf
    StoreFromFloat(v.data(), t, 3, rank == 0 ? 65504.0f : 32.0f);  // fp16 overflow: Inf
    return v;
  };
  auto run = [&](bool gloo, std::vector<std::vector<uint8_t>>* results) {
    results->assign(kRanks * 9, {});
    auto body = [&](int rank, Communicator* comm, Device*) -> Status {
      int i = 0;
      for (DType t : kDTypes) {
        for (ReduceOp op : kOps) {
          std::vector<uint8_t> send = input(t, rank), recv(kShare * SizeOf(t));
          auto w = comm->ReduceScatter(send.data(), recv.data(), kShare, t, op);
          RANK_EXPECT_OK(w.status());
          RANK_EXPECT_OK((*w)->Wait());
          std::vector<uint8_t> all = input(t, rank);
          auto w2 = comm->AllReduce(all.data(), kRanks * kShare, t, op);
          RANK_EXPECT_OK(w2.status());
          RANK_EXPECT_OK((*w2)->Wait());
          recv.insert(recv.end(), all.begin(), all.end());
          (*results)[rank * 9 + i++] = recv;
        }
      }
      return OkStatus();
    };
    return gloo ? RunThreadRanks(kRanks, body) : RunSameDeviceRanks(kRanks, body);
  };
  std::vector<std::vector<uint8_t>> a, b;
  ASSERT_OK(run(true, &a));
  ASSERT_OK(run(false, &b));
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "rank " << i / 9 << " case " << i % 9;
  // The cases above do produce -0 and Inf results.
  float f;
  std::memcpy(&f, b[0].data(), 4);  // rank 0, fp32 sum, element 0
  EXPECT_TRUE(f == 0.0f && std::signbit(f));
}

// The per-element arithmetic at the edges: signed zeros, Inf, NaN (canonical when arithmetic makes
// it, passed through by kMax and by a lone rank).
TEST(RankReduceTest, SpecialValues) {
  auto reduce = [](std::vector<float> vals, RankReduceOp op) {
    RankReduceArgs a;
    std::vector<float> storage = vals;
    a.n_srcs = static_cast<int>(vals.size());
    for (int k = 0; k < a.n_srcs; ++k) a.srcs[k] = &storage[k];
    float out = 0;
    a.out = &out;
    a.count = 1;
    a.op = op;
    RankReduceHost(a);
    return FloatBits(out);
  };
  const float nan_payload = BitsToFloat(0x7fc01234u);
  EXPECT_EQ(reduce({-0.0f, -0.0f}, RankReduceOp::kSum), 0x80000000u);
  EXPECT_EQ(reduce({-0.0f, 0.0f}, RankReduceOp::kSum), 0x00000000u);
  EXPECT_EQ(reduce({INFINITY, -INFINITY}, RankReduceOp::kSum), 0x7fffffffu);
  EXPECT_EQ(reduce({1.0f, nan_payload, 2.0f}, RankReduceOp::kSum), 0x7fffffffu);
  EXPECT_EQ(reduce({INFINITY, 1.0f, 2.0f}, RankReduceOp::kAvg), FloatBits(INFINITY));
  EXPECT_EQ(reduce({1.0f, 2.0f, 4.0f}, RankReduceOp::kAvg), FloatBits(7.0f / 3.0f));
  EXPECT_EQ(reduce({1.0f, nan_payload, 2.0f}, RankReduceOp::kMax), 0x7fc01234u);
  EXPECT_EQ(reduce({-0.0f, 0.0f}, RankReduceOp::kMax), 0x80000000u);  // a tie keeps the lower rank's
  EXPECT_EQ(reduce({nan_payload}, RankReduceOp::kSum), 0x7fc01234u);
  EXPECT_EQ(reduce({nan_payload}, RankReduceOp::kAvg), 0x7fc01234u);
}

// --- ordering on a device whose streams really are asynchronous ---------------------------------

// A Device whose every stream is a worker thread running its queue in order, each op after a
// random pause (seeded per stream), so the ranks' streams interleave in many ways; events complete
// when their stream reaches them, and StreamWaitEvent queues a wait for the record made before
// the call, as CUDA's. Buffers are host memory. Only what the communicator and this test use is
// implemented. Event state is shared with the queued ops, so an Event may be destroyed while a
// wait for it is still queued (legal on CUDA too).
class AsyncDevice final : public Device {
 public:
  struct EventState {
    std::mutex mu;
    std::condition_variable cv;
    uint64_t recorded = 0;
    uint64_t completed = 0;
  };
  class AsyncEvent final : public Event {
   public:
    std::shared_ptr<EventState> state = std::make_shared<EventState>();
  };
  class AsyncStream final : public Stream {
   public:
    explicit AsyncStream(uint32_t seed) : rng_(seed), thread_([this] { Loop(); }) {}
    ~AsyncStream() override {
      {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
      }
      cv_.notify_all();
      thread_.join();
    }
    void Enqueue(std::function<void()> op) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        queue_.push_back(std::move(op));
      }
      cv_.notify_all();
    }
    void Drain() {
      auto done = std::make_shared<EventState>();
      Enqueue([done] {
        std::lock_guard<std::mutex> lock(done->mu);
        done->completed = 1;
        done->cv.notify_all();
      });
      std::unique_lock<std::mutex> lock(done->mu);
      done->cv.wait(lock, [&] { return done->completed == 1; });
    }

   private:
    void Loop() {
      while (true) {
        std::function<void()> op;
        {
          std::unique_lock<std::mutex> lock(mu_);
          cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
          if (queue_.empty()) return;  // stop_ and drained
          op = std::move(queue_.front());
          queue_.pop_front();
        }
        std::this_thread::sleep_for(std::chrono::microseconds(rng_() % 200));
        op();
      }
    }
    std::mt19937 rng_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> queue_;
    bool stop_ = false;
    std::thread thread_;
  };

  explicit AsyncDevice(uint32_t seed) : seed_(seed) { default_ = std::make_unique<AsyncStream>(seed_ * 7919 + 1); }
  ~AsyncDevice() override { default_.reset(); }

  static AsyncStream* S(Stream* s) { return static_cast<AsyncStream*>(s); }
  AsyncStream* Q(Stream* s) { return s == nullptr ? default_.get() : S(s); }

  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string name() const override { return "async(cpu)"; }
  Result<DeviceBuffer> Allocate(size_t bytes) override {
    if (bytes == 0) return DeviceBuffer();
    void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    NoteAlloc(bytes);
    return DeviceBuffer(this, p, bytes);
  }
  Result<PinnedBuffer> AllocatePinned(size_t) override { return UnimplementedError("async: pinned"); }
  Stream* default_stream() override { return default_.get(); }
  Result<std::unique_ptr<Stream>> CreateStream() override {
    return std::unique_ptr<Stream>(new AsyncStream(seed_ * 7919 + ++streams_ * 104729));
  }
  Result<std::unique_ptr<Event>> CreateEvent() override { return std::unique_ptr<Event>(new AsyncEvent); }
  Status RecordEvent(Event* event, Stream* stream) override {
    std::shared_ptr<EventState> e = static_cast<AsyncEvent*>(event)->state;
    uint64_t gen;
    {
      std::lock_guard<std::mutex> lock(e->mu);
      gen = ++e->recorded;
    }
    Q(stream)->Enqueue([e, gen] {
      std::lock_guard<std::mutex> lock(e->mu);
      e->completed = std::max(e->completed, gen);
      e->cv.notify_all();
    });
    return OkStatus();
  }
  Status StreamWaitEvent(Stream* stream, Event* event) override {
    std::shared_ptr<EventState> e = static_cast<AsyncEvent*>(event)->state;
    uint64_t gen;
    {
      std::lock_guard<std::mutex> lock(e->mu);
      gen = e->recorded;
    }
    Q(stream)->Enqueue([e, gen] {
      std::unique_lock<std::mutex> lock(e->mu);
      e->cv.wait(lock, [&] { return e->completed >= gen; });
    });
    return OkStatus();
  }
  Status SynchronizeEvent(Event* event) override {
    std::shared_ptr<EventState> e = static_cast<AsyncEvent*>(event)->state;
    std::unique_lock<std::mutex> lock(e->mu);
    const uint64_t gen = e->recorded;
    e->cv.wait(lock, [&] { return e->completed >= gen; });
    return OkStatus();
  }
  static bool Completed(Event* event) {
    std::shared_ptr<EventState> e = static_cast<AsyncEvent*>(event)->state;
    std::lock_guard<std::mutex> lock(e->mu);
    return e->completed >= e->recorded;
  }
  Status SynchronizeStream(Stream* stream) override {
    Q(stream)->Drain();
    return OkStatus();
  }
  Status Synchronize() override { return UnimplementedError("async: Synchronize"); }
  Status Copy(void* dst, const void* src, size_t bytes, CopyKind, Stream* stream) override {
    Q(stream)->Enqueue([=] { std::memcpy(dst, src, bytes); });
    return OkStatus();
  }
  Status Fill(void*, DType, size_t, float, Stream*) override { return UnimplementedError("async"); }
  Status Cast(const void*, DType, void*, DType, size_t, Stream*) override { return UnimplementedError("async"); }
  Status Accumulate(float*, const void*, DType, size_t, float, Stream*) override { return UnimplementedError("async"); }
  Status AccumulateFirst(float*, const void*, DType, size_t, float, Stream*) override {
    return UnimplementedError("async");
  }
  Status Scale(void*, DType, size_t, float, Stream*) override { return UnimplementedError("async"); }
  Status SumOfSquares(const void*, DType, size_t, double*, Stream*) override { return UnimplementedError("async"); }
  Status FiniteCheck(const void*, DType, size_t, int32_t*, Stream*) override { return UnimplementedError("async"); }
  Status AdamW(float*, const float*, float*, float*, size_t, const AdamWParams&, Stream*) override {
    return UnimplementedError("async");
  }
  Status AdamWCast(float*, const float*, float*, float*, size_t, const AdamWParams&, void*, DType, Stream*) override {
    return UnimplementedError("async");
  }
  Status AdamWFromGradient(float*, const void*, DType, float*, float*, size_t, const AdamWParams&, Stream*) override {
    return UnimplementedError("async");
  }

 protected:
  void FreeDevice(void* ptr, size_t bytes) override {
    std::free(ptr);
    NoteFree(bytes);
  }
  void FreePinned(void*, size_t) override {}

 private:
  uint32_t seed_;
  int streams_ = 0;
  std::unique_ptr<AsyncStream> default_;
};

SameDeviceOptions AsyncKernels() {
  SameDeviceOptions o;
  o.kernels.reduce = [](Device*, Stream* stream, const RankReduceArgs& args) {
    AsyncDevice::S(stream)->Enqueue([args] { RankReduceHost(args); });
    return OkStatus();
  };
  o.kernels.query = [](Device*, Event* event) -> Result<bool> { return AsyncDevice::Completed(event); };
  return o;
}

// Every rank writes its input on its own stream, issues the collective after that stream, makes
// the stream wait for it, checks the output there and at once overwrites its input with the next
// iteration's values; nothing synchronizes the host in between. A collective that read an input
// before its writer's stream got there, or completed on one rank while a slower rank still read
// that rank's input, gives a wrong sum (the random pauses make both likely within the loop).
TEST(SameDeviceOrderingTest, StreamsWaitForPeersBeforeAndAfterReading) {
  for (int world : {2, 3, 5}) {
    SCOPED_TRACE("world " + std::to_string(world));
    constexpr int kIters = 25;
    constexpr size_t kShare = 48;
    std::vector<std::unique_ptr<AsyncDevice>> devices(world);
    for (int r = 0; r < world; ++r) devices[r] = std::make_unique<AsyncDevice>(1000 * world + r);
    auto value = [](int iter, int rank, size_t i) { return static_cast<float>((iter * 131 + rank * 17 + i) % 251); };
    Status s = RunSameDeviceRanks(
        world,
        [&](int rank, Communicator* comm, Device* d) -> Status {
          AsyncDevice* dev = static_cast<AsyncDevice*>(d);
          AsyncDevice::AsyncStream* st = dev->Q(nullptr);
          auto send = dev->Allocate(world * kShare * 4);
          auto recv = dev->Allocate(kShare * 4);
          auto gathered = dev->Allocate(world * kShare * 4);
          auto ar = dev->Allocate(world * kShare * 4);
          float* sp = send->as<float>();
          float* rp = recv->as<float>();
          float* gp = gathered->as<float>();
          float* ap = ar->as<float>();
          auto errors = std::make_shared<std::atomic<int>>(0);
          auto first = std::make_shared<std::string>();
          auto fill = [=](int iter) {
            st->Enqueue([=] {
              for (size_t i = 0; i < world * kShare; ++i) sp[i] = value(iter, rank, i);
              for (size_t i = 0; i < world * kShare; ++i) ap[i] = value(iter, rank, i) * 2;
            });
          };
          fill(0);
          for (int iter = 0; iter < kIters; ++iter) {
            auto rs = comm->ReduceScatter(sp, rp, kShare, DType::kF32, ReduceOp::kSum, st);
            RANK_EXPECT_OK(rs.status());
            auto ag = comm->AllGather(sp + rank * kShare, gp, kShare, DType::kF32, st);
            RANK_EXPECT_OK(ag.status());
            auto al = comm->AllReduce(ap, world * kShare, DType::kF32, ReduceOp::kSum, st);
            RANK_EXPECT_OK(al.status());
            RANK_EXPECT_OK((*rs)->StreamWait(st));
            RANK_EXPECT_OK((*ag)->StreamWait(st));
            RANK_EXPECT_OK((*al)->StreamWait(st));
            st->Enqueue([=] {
              auto bad = [&](const std::string& what) {
                if (errors->fetch_add(1) == 0) *first = "iteration " + std::to_string(iter) + ": " + what;
              };
              for (size_t i = 0; i < kShare; ++i) {
                float want = 0;
                for (int q = 0; q < world; ++q) want += value(iter, q, rank * kShare + i);
                if (rp[i] != want) return bad("reduce-scatter element " + std::to_string(i));
                for (int q = 0; q < world; ++q) {
                  if (gp[q * kShare + i] != value(iter, q, q * kShare + i)) return bad("all-gather");
                }
              }
              for (size_t i = 0; i < world * kShare; ++i) {
                float want = 0;
                for (int q = 0; q < world; ++q) want += value(iter, q, i) * 2;
                if (ap[i] != want) return bad("all-reduce element " + std::to_string(i));
              }
            });
            fill(iter + 1);  // overwrites the inputs right after the completions, on the stream
          }
          st->Drain();
          RANK_CHECK(*errors == 0, *first + " (" + std::to_string(errors->load()) + " wrong iterations)");
          return OkStatus();
        },
        AsyncKernels(),
        [&](int rank) -> Result<std::unique_ptr<Device>> { return std::unique_ptr<Device>(std::move(devices[rank])); });
    EXPECT_OK(s);
  }
}

// --- failures -----------------------------------------------------------------------------------

TEST(SameDeviceFaultTest, MismatchedCollectivesNameBothRanksAndCalls) {
  std::vector<Status> st = RunEach(
      2,
      [](int rank, SameDeviceCommunicator* comm) -> Status {
        std::vector<float> buf(9, 1.0f);
        auto w = comm->AllReduce(buf.data(), rank == 0 ? 8 : 9, DType::kF32, ReduceOp::kSum);
        if (!w.ok()) return w.status();
        return OkStatus();
      },
      Timeout(20000));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r].code(), StatusCode::kInvalidArgument) << st[r].ToString();
    EXPECT_NE(st[r].message().find("rank 0 issued AllReduce (8 x fp32, sum), rank 1 issued AllReduce (9 x fp32, sum)"),
              std::string::npos)
        << st[r].ToString();
    EXPECT_NE(st[r].message().find("collective #1"), std::string::npos) << st[r].ToString();
  }
  // Different ops as the same collective, and a later call fails at once.
  st = RunEach(
      3,
      [](int rank, SameDeviceCommunicator* comm) -> Status {
        std::vector<uint16_t> buf(16, 0);
        Status first = rank == 2 ? comm->AllGather(buf.data(), buf.data() + 4, 2, DType::kBF16).status()
                                 : comm->Broadcast(buf.data(), 2, DType::kBF16, 0).status();
        if (first.ok()) return InternalError("the mismatched collective succeeded");
        auto t0 = Clock::now();
        Status later = comm->Barrier();
        if (later.ok() || Ms(Clock::now() - t0) > 1000) return InternalError("the later call did not fail at once");
        if (!comm->CheckHealth().ok() && later.message().find("not started") != std::string::npos) return first;
        return InternalError("later: " + later.ToString());
      },
      Timeout(20000));
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(st[r].code(), StatusCode::kInvalidArgument) << st[r].ToString();
    EXPECT_NE(st[r].message().find("issued Broadcast (2 x bf16 from rank 0)"), std::string::npos) << st[r].ToString();
    EXPECT_NE(st[r].message().find("rank 2 issued AllGather (2 x bf16 per rank)"), std::string::npos)
        << st[r].ToString();
  }
}

// A rank that stops issuing collectives: the others fail with DEADLINE_EXCEEDED within the timeout,
// naming the collective, themselves and the silent rank with its last collective; later calls of
// every rank (the silent one's too) fail at once.
TEST(SameDeviceFaultTest, SilentRankTimesOutNamingTheCollective) {
  constexpr int kTimeoutMs = 200;
  std::vector<double> took(3);
  std::vector<Status> later(3);
  std::atomic<int> failed{0};
  std::vector<Status> st = RunEach(
      3,
      [&](int rank, SameDeviceCommunicator* comm) -> Status {
        std::vector<float> buf(3 * 4, 1.0f);
        auto g = comm->AllGather(buf.data() + rank * 4, buf.data(), 4, DType::kF32);
        if (!g.ok()) return g.status();
        if (rank == 2) {  // silent from here on, until the others gave up
          while (failed < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
          later[rank] = comm->Barrier();
          return OkStatus();
        }
        auto t0 = Clock::now();
        auto w = comm->AllReduce(buf.data(), 7, DType::kF32, ReduceOp::kAvg);
        took[rank] = Ms(Clock::now() - t0);
        ++failed;
        later[rank] = comm->Barrier();
        return w.status();
      },
      Timeout(kTimeoutMs));
  EXPECT_OK(st[2]);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r].code(), StatusCode::kDeadlineExceeded) << st[r].ToString();
    EXPECT_NE(st[r].message().find("collective #2 AllReduce (7 x fp32, avg)"), std::string::npos) << st[r].ToString();
    EXPECT_NE(st[r].message().find("rank " + std::to_string(r) + " of 3"), std::string::npos) << st[r].ToString();
    EXPECT_NE(st[r].message().find("rank 2 (its last collective: #1 AllGather (4 x fp32 per rank))"), std::string::npos)
        << st[r].ToString();
    EXPECT_NE(st[r].message().find("200 ms"), std::string::npos) << st[r].ToString();
    // The first rank to time out waited the whole timeout; the other was woken by it.
    EXPECT_GE(took[r], kTimeoutMs / 2) << "rank " << r;
    EXPECT_LT(took[r], kTimeoutMs + 2000) << "rank " << r;
  }
  EXPECT_GE(std::max(took[0], took[1]), kTimeoutMs - 5);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(later[r].code(), StatusCode::kDeadlineExceeded) << later[r].ToString();
    EXPECT_NE(later[r].message().find("not started"), std::string::npos) << later[r].ToString();
  }
}

TEST(SameDeviceFaultTest, RankThatNeverJoinsTimesOut) {
  std::vector<Status> st = RunEach(
      2, [](int, SameDeviceCommunicator* comm) -> Status { return comm->Barrier(); }, Timeout(150),
      [](int rank) { return rank == 0; });
  EXPECT_EQ(st[0].code(), StatusCode::kDeadlineExceeded) << st[0].ToString();
  EXPECT_NE(st[0].message().find("collective #1 Barrier"), std::string::npos) << st[0].ToString();
  EXPECT_NE(st[0].message().find("rank 1 (it has not joined the group)"), std::string::npos) << st[0].ToString();
}

// Abort on one rank wakes the others' pending collective at once (the timeout is a minute).
TEST(SameDeviceFaultTest, AbortFailsTheWaitingRanksPromptly) {
  std::vector<double> took(3);
  std::vector<Status> st = RunEach(
      3,
      [&](int rank, SameDeviceCommunicator* comm) -> Status {
        if (rank == 2) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          comm->Abort("the test gives up");
          Status health = comm->CheckHealth();
          Status next = comm->Barrier();
          if (health.code() != StatusCode::kUnavailable || next.ok()) {
            return InternalError("after Abort: " + health.ToString() + " / " + next.ToString());
          }
          return OkStatus();
        }
        auto t0 = Clock::now();
        std::vector<float> buf(5, 1.0f);
        auto w = comm->AllReduce(buf.data(), 5, DType::kF32, ReduceOp::kSum);
        took[rank] = Ms(Clock::now() - t0);
        if (w.ok()) return InternalError("the collective succeeded");
        if (comm->CheckHealth().ok()) return InternalError("CheckHealth OK after the failure");
        return w.status();
      },
      Timeout(60000));
  EXPECT_OK(st[2]);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r].code(), StatusCode::kUnavailable) << st[r].ToString();
    EXPECT_NE(st[r].message().find("rank 2 aborted: the test gives up"), std::string::npos) << st[r].ToString();
    EXPECT_NE(st[r].message().find("AllReduce (5 x fp32, sum)"), std::string::npos) << st[r].ToString();
    EXPECT_LT(took[r], 5000) << "rank " << r;
  }
}

// Destroying a rank's communicator while the others wait for it: they fail at once, naming it.
TEST(SameDeviceFaultTest, DestroyedRankFailsTheWaitingRanksPromptly) {
  std::vector<double> took(3);
  std::vector<Status> st = RunEach(
      3,
      [&](int rank, SameDeviceCommunicator* comm) -> Status {
        if (rank == 2) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          return OkStatus();  // RunEach destroys it on return
        }
        auto t0 = Clock::now();
        std::vector<float> send(6, 1.0f), recv(2);
        auto w = comm->ReduceScatter(send.data(), recv.data(), 2, DType::kF32, ReduceOp::kSum);
        took[rank] = Ms(Clock::now() - t0);
        return w.ok() ? InternalError("the collective succeeded") : w.status();
      },
      Timeout(60000));
  EXPECT_OK(st[2]);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r].code(), StatusCode::kUnavailable) << st[r].ToString();
    EXPECT_NE(st[r].message().find("rank 2's communicator was destroyed"), std::string::npos) << st[r].ToString();
    EXPECT_NE(st[r].message().find("ReduceScatter"), std::string::npos) << st[r].ToString();
    EXPECT_LT(took[r], 5000) << "rank " << r;
  }
}

// RunSameDeviceRanks: a failing body aborts its communicator, so the others stop waiting; the
// failing rank's error is the one returned.
TEST(SameDeviceFaultTest, FailingBodyAbortsTheOthers) {
  auto t0 = Clock::now();
  Status s = RunSameDeviceRanks(
      4,
      [](int rank, Communicator* comm, Device*) -> Status {
        if (rank == 3) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          return DataLossError("rank 3's data is bad");
        }
        return comm->Barrier();
      },
      Timeout(60000));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_NE(s.message().find("rank 3: rank 3's data is bad"), std::string::npos) << s.ToString();
  EXPECT_LT(Ms(Clock::now() - t0), 5000);
}

// --- arguments ----------------------------------------------------------------------------------

TEST(SameDeviceCommunicatorTest, GroupAndJoinArguments) {
  EXPECT_EQ(SameDeviceGroup::Create(0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SameDeviceGroup::Create(kMaxRankReduceSources + 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_OK(SameDeviceGroup::Create(kMaxRankReduceSources));
  EXPECT_EQ(SameDeviceGroup::Create(2, Timeout(0)).status().code(), StatusCode::kInvalidArgument);
  SameDeviceOptions half;
  half.kernels.query = [](Device*, Event*) -> Result<bool> { return true; };
  EXPECT_EQ(SameDeviceGroup::Create(2, half).status().code(), StatusCode::kInvalidArgument);

  auto group = SameDeviceGroup::Create(2);
  ASSERT_OK(group);
  CpuDevice a, b;
  EXPECT_EQ((*group)->Join(2, &a).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*group)->Join(-1, &a).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*group)->Join(0, nullptr).status().code(), StatusCode::kInvalidArgument);
  AsyncDevice other(1);  // not a CpuDevice, and no kernels given
  Status not_cpu = (*group)->Join(0, &other).status();
  EXPECT_EQ(not_cpu.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(not_cpu.message().find("async(cpu)"), std::string::npos) << not_cpu.ToString();
  auto c0 = (*group)->Join(0, &a);
  ASSERT_OK(c0);
  Status twice = (*group)->Join(0, &b).status();
  EXPECT_EQ(twice.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(twice.message().find("rank 0 joined the group twice"), std::string::npos) << twice.ToString();
  EXPECT_EQ((*c0)->backend(), "same_device");
  EXPECT_EQ((*c0)->world_size(), 2);
  EXPECT_EQ((*c0)->rank(), 0);
  EXPECT_EQ((*c0)->device(), &a);
}

// Bad arguments fail on the calling rank before any rendezvous (the other rank never issues
// anything); zero counts complete at once.
TEST(SameDeviceCommunicatorTest, BadArgumentsAndZeroCountsNeedNoPeer) {
  auto group = SameDeviceGroup::Create(2, Timeout(60000));
  ASSERT_OK(group);
  CpuDevice dev;
  auto comm = (*group)->Join(0, &dev);
  ASSERT_OK(comm);
  Communicator* c = comm->get();
  std::vector<float> buf(16);
  EXPECT_EQ(c->AllReduce(nullptr, 4, DType::kF32, ReduceOp::kSum).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c->ReduceScatter(buf.data(), buf.data() + 1, 4, DType::kF32, ReduceOp::kSum).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(c->AllGather(buf.data() + 1, buf.data(), 4, DType::kF32).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c->Broadcast(buf.data(), 4, DType::kF32, 2).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c->BroadcastHost(buf.data(), 4, -1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c->AllReduceHost(nullptr, 2, ReduceOp::kSum).code(), StatusCode::kInvalidArgument);
  std::vector<Result<std::unique_ptr<Work>>> zero;
  zero.push_back(c->AllReduce(buf.data(), 0, DType::kF32, ReduceOp::kSum));
  zero.push_back(c->ReduceScatter(buf.data(), buf.data() + 8, 0, DType::kF32, ReduceOp::kSum));
  zero.push_back(c->AllGather(buf.data(), buf.data(), 0, DType::kF32));
  zero.push_back(c->Broadcast(buf.data(), 0, DType::kF32, 1));
  for (auto& w : zero) {
    ASSERT_OK(w);
    EXPECT_TRUE((*w)->IsCompleted());
    EXPECT_OK((*w)->Wait());
  }
  EXPECT_OK(c->CheckHealth());
}

}  // namespace
}  // namespace zero
