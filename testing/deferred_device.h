// DeferredDevice: a test Device (CPU backend) whose streams really are asynchronous, so a missing
// stream wait in the code under test shows up on CI (the synchronous CpuDevice runs everything at
// once and hides it). Used by the chunked optimizer states' and gradient partition's tests and the
// engine's overlap tests. Test-only.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "runtime/cpu_device.h"
#include "runtime/device.h"
#include "runtime/status.h"

namespace zero::testing {

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
  // Memory comes from inner_ and is held here; freeing it first runs everything queued, as
  // cudaFree / cudaFreeHost synchronize the device (code that frees a buffer right after
  // enqueueing its last use is legal on CUDA).
  Result<DeviceBuffer> Allocate(size_t bytes) override {
    ZERO_ASSIGN_OR_RETURN(DeviceBuffer b, inner_.Allocate(bytes));
    void* p = b.data();
    if (p == nullptr) return DeviceBuffer();
    held_[p] = std::move(b);
    return DeviceBuffer(this, p, bytes);
  }
  Result<PinnedBuffer> AllocatePinned(size_t bytes) override {
    ZERO_ASSIGN_OR_RETURN(PinnedBuffer b, inner_.AllocatePinned(bytes));
    void* p = b.data();
    if (p == nullptr) return PinnedBuffer();
    held_pinned_[p] = std::move(b);
    return PinnedBuffer(this, p, bytes);
  }

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
  Status AdamWFromGradient(float* p, const void* g, DType gt, float* m, float* v, size_t n, const AdamWParams& h,
                           Stream* s) override {
    return Enqueue(s, [=, this] { return inner_.AdamWFromGradient(p, g, gt, m, v, n, h, nullptr); });
  }
  Status AdamWCast(float* p, const float* g, float* m, float* v, size_t n, const AdamWParams& h, void* out, DType t,
                   Stream* s) override {
    return Enqueue(s, [=, this] { return inner_.AdamWCast(p, g, m, v, n, h, out, t, nullptr); });
  }

  int64_t ops_run() const { return ops_run_; }
  // Whether every stream has run everything queued on it.
  bool idle() const {
    for (const Queue* q : queues_) {
      if (!q->ops.empty()) return false;
    }
    return true;
  }

 protected:
  void FreeDevice(void* p, size_t) override {
    Synchronize().IgnoreError();
    held_.erase(p);
  }
  void FreePinned(void* p, size_t) override {
    Synchronize().IgnoreError();
    held_pinned_.erase(p);
  }

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
  std::map<void*, DeviceBuffer> held_;
  std::map<void*, PinnedBuffer> held_pinned_;
  std::mt19937 rng_;
  std::vector<std::unique_ptr<Queue>> owned_;
  std::vector<Queue*> queues_;
  std::unique_ptr<Stream> default_;
  Status error_;
  int64_t ops_run_ = 0;
};

}  // namespace zero::testing
