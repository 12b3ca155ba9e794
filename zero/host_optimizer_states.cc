#include "zero/host_optimizer_states.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "offload/cpu_adam.h"
#include "offload/thread_pool.h"
#include "zero/host_state_kernels.h"
#include "zero/slot_worker.h"

namespace zero {
namespace {

class HostOptimizerStates final : public OptimizerStates {
 public:
  HostOptimizerStates(Device* device, Stream* stream, int64_t numel, const HostOptimizerStatesOptions& o)
      : device_(device),
        stream_(stream),
        numel_(numel),
        // No longer than the states: every call covers at most numel elements, so a smaller chunk
        // cuts no call differently (the same chunks, the same bits) and pins no unused bytes.
        chunk_(std::max<int64_t>(1, std::min(o.chunk_numel, numel))),
        mdt_(o.model_dtype),
        slots_(static_cast<size_t>(std::max(1, o.ring_slots))) {}

  ~HostOptimizerStates() override {
    worker_.reset();  // runs what is queued, then joins
    device_->SynchronizeStream(stream_).IgnoreError();
  }

  Status Init(const HostOptimizerStatesOptions& o) {
    ZERO_ASSIGN_OR_RETURN(pool_, ThreadPool::Create(o.cpu_threads));
    const size_t state = HostSlab::AlignedSize(static_cast<size_t>(numel_) * 4);
    const size_t copy = HostSlab::AlignedSize(static_cast<size_t>(numel_) * SizeOf(mdt_));
    const size_t chunk = HostSlab::AlignedSize(static_cast<size_t>(chunk_) * 4);
    ZERO_ASSIGN_OR_RETURN(slab_, HostSlab::Create(device_, 3 * state + copy + (3 + 2 * slots_.size()) * chunk, o.slab));
    const char* names[3] = {"fp32 master weights", "AdamW exp_avg", "AdamW exp_avg_sq"};
    for (int k = 0; k < 3; ++k) {
      ZERO_ASSIGN_OR_RETURN(HostSpan sp, slab_.Take(static_cast<size_t>(numel_) * 4, names[k]));
      state_[k] = sp.as<float>();
      std::memset(state_[k], 0, static_cast<size_t>(numel_) * 4);
    }
    ZERO_ASSIGN_OR_RETURN(HostSpan mc, slab_.Take(static_cast<size_t>(numel_) * SizeOf(mdt_), "host model copy"));
    model_copy_ = mc.data;
    std::memset(model_copy_, 0, static_cast<size_t>(numel_) * SizeOf(mdt_));  // round(+0) is +0
    for (int k = 0; k < 2; ++k) {
      ZERO_ASSIGN_OR_RETURN(HostSpan g, slab_.Take(static_cast<size_t>(chunk_) * 4, "gradient transfer chunk"));
      grad_[k] = g.as<float>();
      ZERO_ASSIGN_OR_RETURN(grad_in_[k], NewEvent());
    }
    ZERO_ASSIGN_OR_RETURN(HostSpan cast, slab_.Take(static_cast<size_t>(chunk_) * 4, "cast chunk"));
    cast_ = cast.data;
    ZERO_ASSIGN_OR_RETURN(copied_, NewEvent());  // the last host->device copy out of the slab
    ZERO_RETURN_IF_ERROR(device_->RecordEvent(copied_.get(), stream_));
    for (Slot& sl : slots_) {
      ZERO_ASSIGN_OR_RETURN(HostSpan g, slab_.Take(static_cast<size_t>(chunk_) * 4, "update-in-backward slot"));
      ZERO_ASSIGN_OR_RETURN(HostSpan w, slab_.Take(static_cast<size_t>(chunk_) * 4, "update-in-backward scratch"));
      sl.grad = g.data;
      sl.widened = w.as<float>();
      ZERO_ASSIGN_OR_RETURN(sl.landed, NewEvent());
    }
    // The model copy must not change under a host->device copy still reading it (copied_).
    worker_ = std::make_unique<SlotWorker<Task>>(
        slots_.size(),
        [this](const Task& t) {
          ZERO_RETURN_IF_ERROR(device_->SynchronizeEvent(copied_.get()));
          return RunTask(t);
        },
        "the update in backward");
    return OkStatus();
  }

  int64_t numel() const override { return numel_; }

  Status Update(int64_t offset, int64_t n, const float* grads, const AdamWParams& h, void* model_out, DType model_t,
                Stream* stream) override {
    ZERO_RETURN_IF_ERROR(Check(offset, n, "Update"));
    ZERO_RETURN_IF_ERROR(WaitForWorker());
    ZERO_RETURN_IF_ERROR(device_->SynchronizeEvent(copied_.get()));  // the model copy may change
    const int64_t chunks = (n + chunk_ - 1) / chunk_;
    auto len = [&](int64_t c) { return std::min(chunk_, n - c * chunk_); };
    auto fetch = [&](int64_t c) -> Status {
      const int k = static_cast<int>(c % 2);
      TraceDeviceScope trace(observer_, TraceTrack::kDeviceToHost, "gradients to the host", stream);
      ZERO_RETURN_IF_ERROR(device_->Copy(grad_[k], grads + c * chunk_, static_cast<size_t>(len(c)) * 4,
                                         CopyKind::kDeviceToHost, stream));
      return device_->RecordEvent(grad_in_[k].get(), stream);
    };
    if (chunks > 0) ZERO_RETURN_IF_ERROR(fetch(0));
    for (int64_t c = 0; c < chunks; ++c) {
      const int k = static_cast<int>(c % 2);
      ZERO_RETURN_IF_ERROR(device_->SynchronizeEvent(grad_in_[k].get()));
      // grad_[k ^ 1] was read by the previous chunk's (synchronous) update: free for the next one.
      if (c + 1 < chunks) ZERO_RETURN_IF_ERROR(fetch(c + 1));
      const int64_t at = offset + c * chunk_;
      TraceHostScope trace(observer_, TraceTrack::kCpuOptimizer, "CPU AdamW");
      ZERO_RETURN_IF_ERROR(CpuAdamW(state_[0] + at, grad_[k], state_[1] + at, state_[2] + at,
                                    static_cast<size_t>(len(c)), h, ElementPtr(model_copy_, mdt_, at), mdt_,
                                    pool_.get()));
    }
    if (model_out != nullptr) ZERO_RETURN_IF_ERROR(CastMaster(offset, n, model_out, model_t, stream));
    return OkStatus();
  }

  bool updates_from_host() const override { return true; }
  ThreadPool* host_thread_pool() override { return pool_.get(); }
  // The gradients are in host memory already: AdamW reads them in place (no transfer chunks).
  Status UpdateFromHost(int64_t offset, int64_t n, const float* grads, const AdamWParams& h, void* model_out,
                        DType model_t, Stream* stream) override {
    ZERO_RETURN_IF_ERROR(Check(offset, n, "UpdateFromHost"));
    ZERO_RETURN_IF_ERROR(WaitForWorker());
    ZERO_RETURN_IF_ERROR(device_->SynchronizeEvent(copied_.get()));  // the model copy may change
    if (n > 0) {
      TraceHostScope trace(observer_, TraceTrack::kCpuOptimizer, "CPU AdamW");
      ZERO_RETURN_IF_ERROR(CpuAdamW(state_[0] + offset, grads, state_[1] + offset, state_[2] + offset,
                                    static_cast<size_t>(n), h, ElementPtr(model_copy_, mdt_, offset), mdt_,
                                    pool_.get()));
    }
    if (model_out != nullptr) ZERO_RETURN_IF_ERROR(CastMaster(offset, n, model_out, model_t, stream));
    return OkStatus();
  }

  Status UpdateFromGradient(int64_t offset, int64_t n, const void* grad, DType grad_t, const AdamWParams& h,
                            Stream* stream) override {
    ZERO_RETURN_IF_ERROR(Check(offset, n, "UpdateFromGradient"));
    for (int64_t at = 0; at < n; at += chunk_) {
      const int64_t len = std::min(chunk_, n - at);
      // A free slot (the worker frees them in order), then the chunk's gradients into it.
      ZERO_ASSIGN_OR_RETURN(const size_t s, worker_->Acquire());
      Slot& sl = slots_[s];
      TraceDeviceScope trace(observer_, TraceTrack::kDeviceToHost, "gradients to the host", stream);
      if (grad != nullptr) {
        ZERO_RETURN_IF_ERROR(device_->Copy(sl.grad, ElementPtr(grad, grad_t, at),
                                           static_cast<size_t>(len) * SizeOf(grad_t), CopyKind::kDeviceToHost, stream));
      }
      ZERO_RETURN_IF_ERROR(device_->RecordEvent(sl.landed.get(), stream));
      worker_->Push(Task{s, offset + at, len, grad != nullptr, grad_t, h});
    }
    return OkStatus();
  }

  Status CastMaster(int64_t offset, int64_t n, void* model_out, DType model_t, Stream* stream) override {
    ZERO_RETURN_IF_ERROR(Check(offset, n, "CastMaster"));
    ZERO_RETURN_IF_ERROR(WaitForWorker());
    if (n == 0) return OkStatus();
    TraceDeviceScope trace(observer_, TraceTrack::kHostToDevice, "weights to the device", stream);
    if (model_t == mdt_) {
      // The model copy is round(master) already: one copy.
      ZERO_RETURN_IF_ERROR(device_->Copy(model_out, ElementPtr(model_copy_, mdt_, offset),
                                         static_cast<size_t>(n) * SizeOf(mdt_), CopyKind::kHostToDevice, stream));
      return device_->RecordEvent(copied_.get(), stream);
    }
    for (int64_t at = 0; at < n; at += chunk_) {
      const int64_t m = std::min(chunk_, n - at);
      ZERO_RETURN_IF_ERROR(device_->SynchronizeEvent(copied_.get()));  // cast_ is free
      RoundInto(state_[0] + offset + at, cast_, model_t, m);
      ZERO_RETURN_IF_ERROR(device_->Copy(ElementPtr(model_out, model_t, at), cast_,
                                         static_cast<size_t>(m) * SizeOf(model_t), CopyKind::kHostToDevice, stream));
      ZERO_RETURN_IF_ERROR(device_->RecordEvent(copied_.get(), stream));
    }
    return OkStatus();
  }

  Status CopyToDevice(OptState which, int64_t offset, int64_t n, float* dst, Stream* stream) override {
    ZERO_RETURN_IF_ERROR(Check(offset, n, "CopyToDevice"));
    ZERO_RETURN_IF_ERROR(WaitForWorker());
    if (n == 0) return OkStatus();
    TraceDeviceScope trace(observer_, TraceTrack::kHostToDevice, "states to the device", stream);
    ZERO_RETURN_IF_ERROR(
        device_->Copy(dst, at(which, offset), static_cast<size_t>(n) * 4, CopyKind::kHostToDevice, stream));
    return device_->SynchronizeStream(stream);
  }
  Status CopyFromDevice(OptState which, int64_t offset, int64_t n, const float* src, Stream* stream) override {
    ZERO_RETURN_IF_ERROR(Check(offset, n, "CopyFromDevice"));
    ZERO_RETURN_IF_ERROR(WaitForWorker());
    if (n == 0) return OkStatus();
    ZERO_RETURN_IF_ERROR(device_->SynchronizeEvent(copied_.get()));
    {
      TraceDeviceScope trace(observer_, TraceTrack::kDeviceToHost, "states to the host", stream);
      ZERO_RETURN_IF_ERROR(
          device_->Copy(at(which, offset), src, static_cast<size_t>(n) * 4, CopyKind::kDeviceToHost, stream));
    }
    ZERO_RETURN_IF_ERROR(device_->SynchronizeStream(stream));
    if (which == OptState::kMaster) RoundInto(state_[0] + offset, ElementPtr(model_copy_, mdt_, offset), mdt_, n);
    return OkStatus();
  }
  Status Read(OptState which, int64_t offset, int64_t n, float* host) override {
    ZERO_RETURN_IF_ERROR(Check(offset, n, "Read"));
    ZERO_RETURN_IF_ERROR(WaitForWorker());
    ZERO_RETURN_IF_ERROR(device_->SynchronizeStream(stream_));
    if (n > 0) std::memcpy(host, at(which, offset), static_cast<size_t>(n) * 4);
    return OkStatus();
  }
  Status Write(OptState which, int64_t offset, int64_t n, const float* host) override {
    ZERO_RETURN_IF_ERROR(Check(offset, n, "Write"));
    ZERO_RETURN_IF_ERROR(WaitForWorker());
    ZERO_RETURN_IF_ERROR(device_->SynchronizeStream(stream_));
    if (n == 0) return OkStatus();
    std::memcpy(at(which, offset), host, static_cast<size_t>(n) * 4);
    if (which == OptState::kMaster) RoundInto(state_[0] + offset, ElementPtr(model_copy_, mdt_, offset), mdt_, n);
    return OkStatus();
  }
  OptimizerStateBytes bytes() const override {
    OptimizerStateBytes b;
    b.host = slab_.bytes();
    return b;
  }
  bool casts_to_host() const override { return true; }
  Status CastMasterToHost(int64_t offset, int64_t n, void* host_out, DType model_t) override {
    ZERO_RETURN_IF_ERROR(Check(offset, n, "CastMasterToHost"));
    ZERO_RETURN_IF_ERROR(WaitForWorker());
    ZERO_RETURN_IF_ERROR(device_->SynchronizeStream(stream_));
    if (n == 0) return OkStatus();
    if (model_t == mdt_) {
      // The model copy is round(master) already; copied on every core (a 1B-parameter model's bf16
      // copy is 2 GiB: 0.2 s for one thread on the H200 machine).
      CopyElements(pool_.get(), ElementPtr(model_copy_, mdt_, offset), mdt_, host_out, n);
    } else {
      RoundInto(state_[0] + offset, host_out, model_t, n);
    }
    return OkStatus();
  }

 private:
  struct Slot {
    void* grad = nullptr;      // the chunk's gradients as they came (grad_t)
    float* widened = nullptr;  // 0.0f + g in fp32
    std::unique_ptr<Event> landed;
  };
  struct Task {
    size_t slot;
    int64_t offset, n;
    bool has_grad;
    DType grad_t;
    AdamWParams h;
  };

  Result<std::unique_ptr<Event>> NewEvent() {
    auto e = device_->CreateEvent();
    if (!e.ok()) return e.status().WithContext("host optimizer states: creating an event");
    return std::move(e).value();
  }

  void RoundInto(const float* src, void* dst, DType t, int64_t n) { RoundToDType(pool_.get(), src, dst, t, n); }

  Status RunTask(const Task& t) {
    Slot& sl = slots_[t.slot];
    ZERO_RETURN_IF_ERROR(device_->SynchronizeEvent(sl.landed.get()));
    TraceHostScope trace(observer_, TraceTrack::kCpuOptimizer, "CPU AdamW (update in backward)");
    // The widening and the update fused per tile; the model copy is only read by a DMA to the
    // GPU, so it is written with non-temporal stores where aligned (cpu_adam.h).
    CpuAdamWOptions o;
    o.stream_model_out = true;
    return WidenedAdamW(pool_.get(), t.has_grad ? sl.grad : nullptr, t.grad_t, sl.widened, state_[0] + t.offset,
                        state_[1] + t.offset, state_[2] + t.offset, t.n, t.h, ElementPtr(model_copy_, mdt_, t.offset),
                        mdt_, o);
  }

  Status WaitForWorker() { return worker_->WaitIdle(); }

  float* at(OptState s, int64_t offset) { return state_[static_cast<int>(s)] + offset; }
  Status Check(int64_t offset, int64_t n, const char* call) const {
    return CheckStateRange("host optimizer states", call, offset, n, numel_);
  }

  Device* device_;
  Stream* stream_;
  int64_t numel_;
  int64_t chunk_;
  DType mdt_;
  std::unique_ptr<ThreadPool> pool_;
  HostSlab slab_;
  float* state_[3] = {nullptr, nullptr, nullptr};
  void* model_copy_ = nullptr;
  float* grad_[2] = {nullptr, nullptr};
  void* cast_ = nullptr;
  std::unique_ptr<Event> grad_in_[2], copied_;
  std::vector<Slot> slots_;

  std::unique_ptr<SlotWorker<Task>> worker_;  // the update in backward, slot by slot
};

}  // namespace

Result<std::unique_ptr<OptimizerStates>> CreateHostOptimizerStates(Device* device, int64_t numel, Stream* stream,
                                                                   const HostOptimizerStatesOptions& options) {
  auto s = std::make_unique<HostOptimizerStates>(device, stream, numel, options);
  ZERO_RETURN_IF_ERROR(s->Init(options));
  return std::unique_ptr<OptimizerStates>(std::move(s));
}

}  // namespace zero
