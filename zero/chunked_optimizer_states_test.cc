#include "zero/chunked_optimizer_states.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "runtime/cpu_device.h"
#include "zero/optimizer_states.h"

namespace zero {
namespace {

// A Device whose streams really are asynchronous: every copy and kernel is queued on its stream
// and runs (on a CpuDevice) only when the host synchronizes on something that needs it. Which
// runnable stream goes next is drawn from a seeded generator, so ops of different streams run in
// many legal orders; an op after a StreamWaitEvent runs only once the event's point has passed.
// A missing wait in the code under test shows up as a wrong value (or a deadlock, reported as an
// error), which the synchronous CpuDevice could never show.
class DeferredDevice final : public Device {
 public:
  explicit DeferredDevice(uint32_t seed) : rng_(seed) { default_ = NewQueue(); }
  ~DeferredDevice() override { Synchronize().IgnoreError(); }

  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string name() const override { return "deferred(cpu)"; }
  Result<DeviceBuffer> Allocate(size_t bytes) override { return inner_.Allocate(bytes); }
  Result<PinnedBuffer> AllocatePinned(size_t bytes) override { return inner_.AllocatePinned(bytes); }

  Stream* default_stream() override { return default_.get(); }
  Result<std::unique_ptr<Stream>> CreateStream() override { return NewQueue(); }
  Result<std::unique_ptr<Event>> CreateEvent() override { return std::unique_ptr<Event>(new Ev); }
  Status RecordEvent(Event* event, Stream* stream) override {
    Ev* e = static_cast<Ev*>(event);
    e->q = Q(stream);
    e->pos = e->q->queued;
    return OkStatus();
  }
  Status StreamWaitEvent(Stream* stream, Event* event) override {
    Ev* e = static_cast<Ev*>(event);
    if (e->q == nullptr) return OkStatus();  // never recorded: nothing to wait for
    Queue* q = Q(stream);
    q->ops.push_back(Op{nullptr, e->q, e->pos});
    ++q->queued;
    return OkStatus();
  }
  Status SynchronizeEvent(Event* event) override {
    Ev* e = static_cast<Ev*>(event);
    return RunUntil([e] { return e->q == nullptr || e->q->done >= e->pos; });
  }
  Status SynchronizeStream(Stream* stream) override {
    Queue* q = Q(stream);
    return RunUntil([q] { return q->ops.empty(); });
  }
  Status Synchronize() override {
    return RunUntil([this] {
      for (Queue* q : queues_) {
        if (!q->ops.empty()) return false;
      }
      return true;
    });
  }

  Status Copy(void* dst, const void* src, size_t bytes, CopyKind kind, Stream* s) override {
    return Enqueue(s, [=, this] { return inner_.Copy(dst, src, bytes, kind, nullptr); });
  }
  Status Fill(void* dst, DType t, size_t n, float value, Stream* s) override {
    return Enqueue(s, [=, this] { return inner_.Fill(dst, t, n, value, nullptr); });
  }
  Status Cast(const void* src, DType st, void* dst, DType dt, size_t n, Stream* s) override {
    return Enqueue(s, [=, this] { return inner_.Cast(src, st, dst, dt, n, nullptr); });
  }
  Status Accumulate(float* acc, const void* src, DType t, size_t n, float scale, Stream* s) override {
    return Enqueue(s, [=, this] { return inner_.Accumulate(acc, src, t, n, scale, nullptr); });
  }
  Status AccumulateFirst(float* acc, const void* src, DType t, size_t n, float scale, Stream* s) override {
    return Enqueue(s, [=, this] { return inner_.AccumulateFirst(acc, src, t, n, scale, nullptr); });
  }
  Status Scale(void* x, DType t, size_t n, float f, Stream* s) override {
    return Enqueue(s, [=, this] { return inner_.Scale(x, t, n, f, nullptr); });
  }
  Status SumOfSquares(const void* x, DType t, size_t n, double* out, Stream* s) override {
    return Enqueue(s, [=, this] { return inner_.SumOfSquares(x, t, n, out, nullptr); });
  }
  Status FiniteCheck(const void* x, DType t, size_t n, int32_t* flag, Stream* s) override {
    return Enqueue(s, [=, this] { return inner_.FiniteCheck(x, t, n, flag, nullptr); });
  }
  Status AdamW(float* p, const float* g, float* m, float* v, size_t n, const AdamWParams& h, Stream* s) override {
    return Enqueue(s, [=, this] { return inner_.AdamW(p, g, m, v, n, h, nullptr); });
  }
  Status AdamWCast(float* p, const float* g, float* m, float* v, size_t n, const AdamWParams& h, void* out,
                   DType t, Stream* s) override {
    return Enqueue(s, [=, this] { return inner_.AdamWCast(p, g, m, v, n, h, out, t, nullptr); });
  }

  int64_t ops_run() const { return ops_run_; }

 protected:
  // Buffers come from inner_ and are freed by it.
  void FreeDevice(void*, size_t) override {}
  void FreePinned(void*, size_t) override {}

 private:
  struct Queue;
  struct Op {
    std::function<Status()> fn;  // null: a wait for `wq` to have run `wpos` ops
    Queue* wq = nullptr;
    int64_t wpos = 0;
  };
  struct Queue {
    std::deque<Op> ops;
    int64_t queued = 0, done = 0;
  };
  struct Handle : Stream {
    Queue* q;
  };
  struct Ev : Event {
    Queue* q = nullptr;
    int64_t pos = 0;
  };

  std::unique_ptr<Stream> NewQueue() {
    owned_.push_back(std::make_unique<Queue>());
    queues_.push_back(owned_.back().get());
    auto h = std::make_unique<Handle>();
    h->q = owned_.back().get();
    return h;
  }
  Queue* Q(Stream* s) { return static_cast<Handle*>(s == nullptr ? default_.get() : s)->q; }
  Status Enqueue(Stream* s, std::function<Status()> fn) {
    Queue* q = Q(s);
    q->ops.push_back(Op{std::move(fn), nullptr, 0});
    ++q->queued;
    return OkStatus();
  }
  Status RunUntil(const std::function<bool()>& done) {
    while (!done()) {
      std::vector<Queue*> runnable;
      for (Queue* q : queues_) {
        if (!q->ops.empty() && (q->ops.front().fn || q->ops.front().wq->done >= q->ops.front().wpos)) {
          runnable.push_back(q);
        }
      }
      if (runnable.empty()) return InternalError("deferred device: deadlock (every stream waits)");
      Queue* q = runnable[std::uniform_int_distribution<size_t>(0, runnable.size() - 1)(rng_)];
      Op op = std::move(q->ops.front());
      q->ops.pop_front();
      if (op.fn) {
        Status st = op.fn();
        if (!st.ok() && error_.ok()) error_ = st;
      }
      ++q->done;
      ++ops_run_;
    }
    return error_;
  }

  CpuDevice inner_;
  std::mt19937 rng_;
  std::vector<std::unique_ptr<Queue>> owned_;
  std::vector<Queue*> queues_;
  std::unique_ptr<Stream> default_;
  Status error_;
  int64_t ops_run_ = 0;
};

ChunkedOptimizerStatesOptions Options(int64_t chunk, int buffers) {
  ChunkedOptimizerStatesOptions o;
  o.chunk_numel = chunk;
  o.chunk_buffers = buffers;
  o.slab.pin_memory = false;
  return o;
}

AdamWParams Params(int step) {
  AdamWParams h;
  h.lr = 0.01f;
  h.weight_decay = 0.1f;
  h.bias_correction1 = static_cast<float>(1.0 - std::pow(0.9, step));
  h.bias_correction2 = static_cast<float>(1.0 - std::pow(0.999, step));
  h.grad_scale = 0.5f;
  return h;
}

std::vector<uint16_t> Bf16(const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
  CpuDevice d;
  EXPECT_TRUE(d.Cast(x.data(), DType::kF32, out.data(), DType::kBF16, x.size(), nullptr).ok());
  return out;
}

// The chunked states on a device with real asynchrony against DeviceOptimizerStates on the
// synchronous CPU backend: the same bits in every output, for chunk sizes 1 (every element a
// chunk), 7 and 100 (ragged: no range is a multiple of them) and one chunk for all, with two and
// three staging sets and several schedules. Per step the calls overlap each other's ranges with
// no blocking call in between (Update over two ranges, the update in backward over a sub-range
// with 16-bit gradients and over one with none, a cast of the masters), so the host-range
// hazards between chunks of different calls are exercised; the caller's stream is synchronized
// only where the contract says results are ready, and the gradients are clobbered right after.
TEST(ChunkedOptimizerStatesTest, BitwiseEqualToDeviceStatesForAnyChunking) {
  constexpr int64_t kN = 1031;
  for (int64_t chunk : {int64_t{1}, int64_t{7}, int64_t{100}, int64_t{1} << 20}) {
    for (int buffers : {2, 3}) {
      for (uint32_t seed : {1u, 2u, 3u}) {
        SCOPED_TRACE("chunk " + std::to_string(chunk) + ", buffers " + std::to_string(buffers) + ", seed " +
                     std::to_string(seed));
        DeferredDevice dd(seed);
        CpuDevice cpu;
        Stream* s = dd.default_stream();
        auto created = ChunkedOptimizerStates::Create(&dd, kN, s, Options(chunk, buffers));
        ASSERT_TRUE(created.ok()) << created.status().ToString();
        ChunkedOptimizerStates& ch = **created;
        auto dev = CreateDeviceOptimizerStates(&cpu, kN, nullptr);
        ASSERT_TRUE(dev.ok());
        OptimizerStates& ref = **dev;
        const int64_t staged = std::min<int64_t>(chunk, kN);
        EXPECT_EQ(ch.bytes().device, static_cast<size_t>(buffers) * 3 * staged * 4);
        EXPECT_GE(ch.bytes().host, 3u * kN * 4);

        std::vector<float> init(kN), m0(kN);
        for (int64_t i = 0; i < kN; ++i) {
          init[i] = 0.5f - 0.001f * static_cast<float>(i % 113);
          m0[i] = 0.0001f * static_cast<float>(i % 17);
        }
        for (OptimizerStates* st : {static_cast<OptimizerStates*>(&ch), &ref}) {
          ASSERT_TRUE(st->Write(OptState::kMaster, 0, kN, init.data()).ok());
          ASSERT_TRUE(st->Write(OptState::kExpAvg, 0, kN, m0.data()).ok());
        }
        for (int step = 1; step <= 3; ++step) {
          const AdamWParams h = Params(step);
          std::vector<float> g(kN);
          for (int64_t i = 0; i < kN; ++i) g[i] = 0.01f * static_cast<float>((i * 7 + step) % 29) - 0.1f;
          const std::vector<uint16_t> g16 = Bf16(g);
          std::vector<uint16_t> a(kN, 1), b(kN, 1), ca(kN, 2), cb(kN, 2);
          std::vector<float> ga = g;
          std::vector<uint16_t> g16a = g16;
          ASSERT_TRUE(ch.Update(0, 600, ga.data(), h, a.data(), DType::kBF16, s).ok());
          ASSERT_TRUE(ch.Update(600, kN - 600, ga.data() + 600, h, nullptr, DType::kBF16, s).ok());
          ASSERT_TRUE(ch.UpdateFromGradient(100, 300, g16a.data() + 100, DType::kBF16, h, s).ok());
          ASSERT_TRUE(ch.UpdateFromGradient(590, 20, nullptr, DType::kBF16, h, s).ok());
          ASSERT_TRUE(ch.CastMaster(5, kN - 5, ca.data() + 5, DType::kBF16, s).ok());
          // The caller's stream passing these calls is what makes the outputs valid and the
          // gradients reusable: clobber the gradients then, before anything else synchronizes.
          ASSERT_TRUE(dd.SynchronizeStream(s).ok());
          std::fill(ga.begin(), ga.end(), 1e30f);
          std::fill(g16a.begin(), g16a.end(), uint16_t{0x7f80});

          ASSERT_TRUE(ref.Update(0, 600, g.data(), h, b.data(), DType::kBF16, nullptr).ok());
          ASSERT_TRUE(ref.Update(600, kN - 600, g.data() + 600, h, nullptr, DType::kBF16, nullptr).ok());
          ASSERT_TRUE(ref.UpdateFromGradient(100, 300, g16.data() + 100, DType::kBF16, h, nullptr).ok());
          ASSERT_TRUE(ref.UpdateFromGradient(590, 20, nullptr, DType::kBF16, h, nullptr).ok());
          ASSERT_TRUE(ref.CastMaster(5, kN - 5, cb.data() + 5, DType::kBF16, nullptr).ok());
          EXPECT_EQ(a, b) << "step " << step << ": the model copy written by Update";
          EXPECT_EQ(ca, cb) << "step " << step << ": CastMaster";
        }
        for (OptState w : {OptState::kMaster, OptState::kExpAvg, OptState::kExpAvgSq}) {
          std::vector<float> x(kN), y(kN);
          ASSERT_TRUE(ch.Read(w, 0, kN, x.data()).ok());
          ASSERT_TRUE(ref.Read(w, 0, kN, y.data()).ok());
          EXPECT_EQ(0, std::memcmp(x.data(), y.data(), kN * 4)) << OptStateName(w);
        }
        EXPECT_GT(ch.bytes().device, static_cast<size_t>(buffers) * 3 * staged * 4)
            << "the update in backward's gradient chunk is counted once allocated";
        EXPECT_GT(dd.ops_run(), 0);
      }
    }
  }
}

// Copies to and from the device and the blocking Read/Write move exactly the elements asked for,
// after every queued chunk (an Update in flight when they are called); out-of-range calls are
// OutOfRange errors that name the range.
TEST(ChunkedOptimizerStatesTest, CopiesWaitForQueuedChunksAndAreExact) {
  constexpr int64_t kN = 50;
  DeferredDevice dd(7);
  Stream* s = dd.default_stream();
  auto created = ChunkedOptimizerStates::Create(&dd, kN, s, Options(8, 2));
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  ChunkedOptimizerStates& ch = **created;
  std::vector<float> ones(kN, 1.0f), got(kN);
  ASSERT_TRUE(ch.Write(OptState::kExpAvg, 0, kN, ones.data()).ok());
  // In flight: the zero-gradient update of [0, kN), which decays exp_avg by beta1.
  AdamWParams h = Params(1);
  std::vector<float> zeros(kN, 0.0f);
  ASSERT_TRUE(ch.Update(0, kN, zeros.data(), h, nullptr, DType::kF32, s).ok());
  std::vector<float> dev(5, -1.0f);
  ASSERT_TRUE(ch.CopyToDevice(OptState::kExpAvg, 10, 3, dev.data() + 1, s).ok());
  EXPECT_EQ(dev[0], -1.0f);
  EXPECT_EQ(dev[1], h.beta1 * 1.0f) << "CopyToDevice waited for the queued update";
  EXPECT_EQ(dev[3], h.beta1 * 1.0f);
  EXPECT_EQ(dev[4], -1.0f);
  const float in[2] = {7.0f, 8.0f};
  ASSERT_TRUE(ch.CopyFromDevice(OptState::kExpAvgSq, kN - 2, 2, in, s).ok());
  ASSERT_TRUE(ch.Read(OptState::kExpAvgSq, kN - 3, 3, got.data()).ok());
  EXPECT_EQ(got[0], 0.0f);
  EXPECT_EQ(got[1], 7.0f);
  EXPECT_EQ(got[2], 8.0f);
  ASSERT_TRUE(ch.Update(0, kN, zeros.data(), h, nullptr, DType::kF32, s).ok());
  ASSERT_TRUE(ch.Read(OptState::kExpAvg, 0, kN, got.data()).ok());
  EXPECT_EQ(got[kN - 1], h.beta1 * (h.beta1 * 1.0f)) << "Read waited for the queued update";

  Status bad = ch.Read(OptState::kMaster, kN - 1, 2, got.data());
  EXPECT_EQ(bad.code(), StatusCode::kOutOfRange) << bad.ToString();
  EXPECT_NE(bad.message().find("[49, 51) outside [0, 50)"), std::string::npos) << bad.ToString();
  EXPECT_EQ(ch.Update(-1, 2, zeros.data(), h, nullptr, DType::kF32, s).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(ch.CastMaster(0, kN + 1, got.data(), DType::kF32, s).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(ch.UpdateFromGradient(kN, 1, nullptr, DType::kF32, h, s).code(), StatusCode::kOutOfRange);
}

// Chunk(e) names the chunk of the latest call over e; waiting on its `updated` event is enough to
// read e's new weight (the other chunks may not have run yet); WaitForUpdates makes a stream wait
// for everything; a blocking call retires every chunk.
TEST(ChunkedOptimizerStatesTest, ChunkEventsAndWaitForUpdates) {
  constexpr int64_t kN = 1000;
  DeferredDevice dd(11);
  Stream* s = dd.default_stream();
  auto other = dd.CreateStream();
  ASSERT_TRUE(other.ok());
  auto created = ChunkedOptimizerStates::Create(&dd, kN, s, Options(100, 3));
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  ChunkedOptimizerStates& ch = **created;
  EXPECT_EQ(ch.chunk_numel(), 100);
  EXPECT_EQ(ch.chunk_buffers(), 3);
  EXPECT_FALSE(ch.Chunk(0).has_value());
  CpuDevice cpu;
  auto ref = CreateDeviceOptimizerStates(&cpu, kN, nullptr);
  ASSERT_TRUE(ref.ok());
  std::vector<float> init(kN);
  for (int64_t i = 0; i < kN; ++i) init[i] = 0.25f + 0.001f * static_cast<float>(i % 37);
  ASSERT_TRUE(ch.Write(OptState::kMaster, 0, kN, init.data()).ok());
  ASSERT_TRUE((*ref)->Write(OptState::kMaster, 0, kN, init.data()).ok());
  std::vector<float> g(kN, 0.125f);
  const AdamWParams h = Params(1);
  std::vector<float> want(kN), got(kN, -5.0f);
  ASSERT_TRUE((*ref)->Update(0, kN, g.data(), h, want.data(), DType::kF32, nullptr).ok());

  // Offset 50: chunks [50, 150), [150, 250), ..., [950, 1000).
  ASSERT_TRUE(ch.Update(50, kN - 50, g.data() + 50, h, got.data() + 50, DType::kF32, s).ok());
  EXPECT_FALSE(ch.Chunk(49).has_value());
  auto c = ch.Chunk(260);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->begin, 250);
  EXPECT_EQ(c->end, 350);
  ASSERT_NE(c->updated, nullptr);
  ASSERT_NE(c->stored, nullptr);
  auto last = ch.Chunk(999);
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->begin, 950);
  EXPECT_EQ(last->end, 1000);
  ASSERT_TRUE(dd.SynchronizeEvent(c->updated).ok());
  EXPECT_EQ(std::memcmp(got.data() + 250, want.data() + 250, 100 * 4), 0);
  // A later call over part of a chunk replaces it there only.
  ASSERT_TRUE(ch.CastMaster(300, 10, got.data() + 300, DType::kF32, s).ok());
  auto cast = ch.Chunk(305);
  ASSERT_TRUE(cast.has_value());
  EXPECT_EQ(cast->begin, 300);
  EXPECT_EQ(cast->end, 310);
  auto left = ch.Chunk(299), right = ch.Chunk(310);
  ASSERT_TRUE(left.has_value() && right.has_value());
  EXPECT_EQ(left->begin, 250);
  EXPECT_EQ(left->end, 300);
  EXPECT_EQ(right->begin, 310);
  EXPECT_EQ(right->end, 350);
  EXPECT_EQ(left->updated, right->updated);

  ASSERT_TRUE(ch.WaitForUpdates(other->get()).ok());
  ASSERT_TRUE(dd.SynchronizeStream(other->get()).ok());
  EXPECT_EQ(std::memcmp(got.data() + 50, want.data() + 50, (kN - 50) * 4), 0);
  EXPECT_EQ(got[49], -5.0f);
  std::vector<float> master(kN), want_master(kN);
  ASSERT_TRUE(ch.Read(OptState::kMaster, 0, kN, master.data()).ok());
  EXPECT_FALSE(ch.Chunk(500).has_value()) << "a blocking call retires every chunk";
  ASSERT_TRUE((*ref)->Read(OptState::kMaster, 0, kN, want_master.data()).ok());
  EXPECT_EQ(std::memcmp(master.data() + 50, want_master.data() + 50, (kN - 50) * 4), 0);
  EXPECT_EQ(master[0], init[0]) << "elements outside the updated range are untouched";
}

// Bad options are InvalidArgument errors naming the config key; an empty state is valid.
TEST(ChunkedOptimizerStatesTest, OptionErrorsAndEmptyStates) {
  CpuDevice cpu;
  auto zero_chunk = ChunkedOptimizerStates::Create(&cpu, 10, nullptr, Options(0, 3));
  ASSERT_FALSE(zero_chunk.ok());
  EXPECT_EQ(zero_chunk.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(zero_chunk.status().message().find("offload_optimizer.chunk_size"), std::string::npos)
      << zero_chunk.status().ToString();
  auto one_set = ChunkedOptimizerStates::Create(&cpu, 10, nullptr, Options(4, 1));
  ASSERT_FALSE(one_set.ok());
  EXPECT_NE(one_set.status().message().find("offload_optimizer.chunk_buffers must be >= 2"), std::string::npos)
      << one_set.status().ToString();
  auto empty = ChunkedOptimizerStates::Create(&cpu, 0, nullptr, Options(4, 2));
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_EQ((*empty)->numel(), 0);
  EXPECT_TRUE((*empty)->Update(0, 0, nullptr, AdamWParams(), nullptr, DType::kF32, nullptr).ok());
  EXPECT_TRUE((*empty)->Read(OptState::kMaster, 0, 0, nullptr).ok());
}

}  // namespace
}  // namespace zero
