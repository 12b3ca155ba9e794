#include "zero/host_optimizer_states.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "offload/cpu_adam.h"
#include "offload/thread_pool.h"
#include "runtime/dtype.h"

namespace zero {
namespace {

void* At(void* base, DType t, int64_t i) { return static_cast<char*>(base) + static_cast<size_t>(i) * SizeOf(t); }

class HostOptimizerStates final : public OptimizerStates {
 public:
  HostOptimizerStates(Device* device, Stream* stream, int64_t numel, const HostOptimizerStatesOptions& o)
      : device_(device), stream_(stream), numel_(numel), chunk_(std::max<int64_t>(1, o.chunk_numel)) {}

  Status Init(const HostOptimizerStatesOptions& o) {
    ZERO_ASSIGN_OR_RETURN(pool_, ThreadPool::Create(o.cpu_threads));
    const size_t state = HostSlab::AlignedSize(static_cast<size_t>(numel_) * 4);
    const size_t grad = HostSlab::AlignedSize(static_cast<size_t>(chunk_) * 4);
    HostSlabOptions so = o.slab;
    ZERO_ASSIGN_OR_RETURN(slab_, HostSlab::Create(device_, 3 * state + 4 * grad, so));
    ZERO_ASSIGN_OR_RETURN(HostSpan m, slab_.Take(static_cast<size_t>(numel_) * 4, "fp32 master weights"));
    ZERO_ASSIGN_OR_RETURN(HostSpan a, slab_.Take(static_cast<size_t>(numel_) * 4, "AdamW exp_avg"));
    ZERO_ASSIGN_OR_RETURN(HostSpan v, slab_.Take(static_cast<size_t>(numel_) * 4, "AdamW exp_avg_sq"));
    state_[0] = m.as<float>();
    state_[1] = a.as<float>();
    state_[2] = v.as<float>();
    for (int k = 0; k < 2; ++k) {
      ZERO_ASSIGN_OR_RETURN(HostSpan g, slab_.Take(static_cast<size_t>(chunk_) * 4, "gradient transfer chunk"));
      ZERO_ASSIGN_OR_RETURN(HostSpan w, slab_.Take(static_cast<size_t>(chunk_) * 4, "weight transfer chunk"));
      grad_[k] = g.as<float>();
      out_[k] = w.data;
      auto e1 = device_->CreateEvent();
      if (!e1.ok()) return e1.status().WithContext("host optimizer states: creating a transfer event");
      grad_in_[k] = std::move(e1).value();
      auto e2 = device_->CreateEvent();
      if (!e2.ok()) return e2.status().WithContext("host optimizer states: creating a transfer event");
      out_done_[k] = std::move(e2).value();
      ZERO_RETURN_IF_ERROR(device_->RecordEvent(out_done_[k].get(), stream_));
    }
    for (float* s : state_) std::memset(s, 0, static_cast<size_t>(numel_) * 4);
    return OkStatus();
  }

  int64_t numel() const override { return numel_; }

  // Chunk c: gradients device->host into grad_[c%2] (after the copy out of out_[c%2] two chunks
  // ago is done), the CPU AdamW, new weights host->device from out_[c%2]. The next chunk's
  // gradient copy is enqueued before this chunk's update runs, so it overlaps the CPU work.
  Status Update(int64_t offset, int64_t n, const float* grads, const AdamWParams& h, void* model_out, DType model_t,
                Stream* stream) override {
    ZERO_RETURN_IF_ERROR(Check(offset, n, "Update"));
    const int64_t chunks = (n + chunk_ - 1) / chunk_;
    auto len = [&](int64_t c) { return std::min(chunk_, n - c * chunk_); };
    auto fetch = [&](int64_t c) -> Status {
      const int k = static_cast<int>(c % 2);
      ZERO_RETURN_IF_ERROR(device_->SynchronizeEvent(out_done_[k].get()));  // out_[k], grad_[k] free
      ZERO_RETURN_IF_ERROR(device_->Copy(grad_[k], grads + c * chunk_, static_cast<size_t>(len(c)) * 4,
                                         CopyKind::kDeviceToHost, stream));
      return device_->RecordEvent(grad_in_[k].get(), stream);
    };
    if (chunks > 0) ZERO_RETURN_IF_ERROR(fetch(0));
    for (int64_t c = 0; c < chunks; ++c) {
      const int k = static_cast<int>(c % 2);
      if (c + 1 < chunks) ZERO_RETURN_IF_ERROR(fetch(c + 1));
      ZERO_RETURN_IF_ERROR(device_->SynchronizeEvent(grad_in_[k].get()));
      const int64_t at = offset + c * chunk_;
      ZERO_RETURN_IF_ERROR(CpuAdamW(state_[0] + at, grad_[k], state_[1] + at, state_[2] + at,
                                    static_cast<size_t>(len(c)), h, model_out != nullptr ? out_[k] : nullptr,
                                    model_t, pool_.get()));
      if (model_out != nullptr) {
        ZERO_RETURN_IF_ERROR(device_->Copy(At(model_out, model_t, c * chunk_), out_[k],
                                           static_cast<size_t>(len(c)) * SizeOf(model_t), CopyKind::kHostToDevice,
                                           stream));
      }
      ZERO_RETURN_IF_ERROR(device_->RecordEvent(out_done_[k].get(), stream));
    }
    return OkStatus();
  }

  Status CastMaster(int64_t offset, int64_t n, void* model_out, DType model_t, Stream* stream) override {
    ZERO_RETURN_IF_ERROR(Check(offset, n, "CastMaster"));
    for (int64_t c = 0; c * chunk_ < n; ++c) {
      const int k = static_cast<int>(c % 2);
      const int64_t m = std::min(chunk_, n - c * chunk_);
      ZERO_RETURN_IF_ERROR(device_->SynchronizeEvent(out_done_[k].get()));
      const float* src = state_[0] + offset + c * chunk_;
      void* out = out_[k];
      constexpr int64_t kTile = int64_t{1} << 16;
      pool_->ParallelFor(static_cast<size_t>((m + kTile - 1) / kTile), [&](size_t t) {
        const int64_t end = std::min(m, static_cast<int64_t>(t + 1) * kTile);
        for (int64_t i = static_cast<int64_t>(t) * kTile; i < end; ++i) {
          StoreFromFloat(out, model_t, static_cast<size_t>(i), src[i]);
        }
      });
      ZERO_RETURN_IF_ERROR(device_->Copy(At(model_out, model_t, c * chunk_), out_[k],
                                         static_cast<size_t>(m) * SizeOf(model_t), CopyKind::kHostToDevice, stream));
      ZERO_RETURN_IF_ERROR(device_->RecordEvent(out_done_[k].get(), stream));
    }
    return OkStatus();
  }

  // The states change only inside calls that wait for their copies, so these copies read or
  // write the slab directly; the host waits for them (the slab is the state itself).
  Status CopyToDevice(OptState which, int64_t offset, int64_t n, float* dst, Stream* stream) override {
    ZERO_RETURN_IF_ERROR(Check(offset, n, "CopyToDevice"));
    if (n == 0) return OkStatus();
    ZERO_RETURN_IF_ERROR(device_->Copy(dst, at(which, offset), static_cast<size_t>(n) * 4, CopyKind::kHostToDevice, stream));
    return device_->SynchronizeStream(stream);
  }
  Status CopyFromDevice(OptState which, int64_t offset, int64_t n, const float* src, Stream* stream) override {
    ZERO_RETURN_IF_ERROR(Check(offset, n, "CopyFromDevice"));
    if (n == 0) return OkStatus();
    ZERO_RETURN_IF_ERROR(device_->Copy(at(which, offset), src, static_cast<size_t>(n) * 4, CopyKind::kDeviceToHost, stream));
    return device_->SynchronizeStream(stream);
  }
  Status Read(OptState which, int64_t offset, int64_t n, float* host) override {
    ZERO_RETURN_IF_ERROR(Check(offset, n, "Read"));
    ZERO_RETURN_IF_ERROR(device_->SynchronizeStream(stream_));
    if (n > 0) std::memcpy(host, at(which, offset), static_cast<size_t>(n) * 4);
    return OkStatus();
  }
  Status Write(OptState which, int64_t offset, int64_t n, const float* host) override {
    ZERO_RETURN_IF_ERROR(Check(offset, n, "Write"));
    ZERO_RETURN_IF_ERROR(device_->SynchronizeStream(stream_));
    if (n > 0) std::memcpy(at(which, offset), host, static_cast<size_t>(n) * 4);
    return OkStatus();
  }
  OptimizerStateBytes bytes() const override {
    OptimizerStateBytes b;
    b.host = slab_.bytes();
    return b;
  }

 private:
  float* at(OptState s, int64_t offset) { return state_[static_cast<int>(s)] + offset; }
  Status Check(int64_t offset, int64_t n, const char* call) const {
    if (offset < 0 || n < 0 || offset + n > numel_) {
      return OutOfRangeError(std::string("host optimizer states: ") + call + " of [" + std::to_string(offset) +
                             ", " + std::to_string(offset + n) + ") outside [0, " + std::to_string(numel_) + ")");
    }
    return OkStatus();
  }

  Device* device_;
  Stream* stream_;
  int64_t numel_;
  int64_t chunk_;
  std::unique_ptr<ThreadPool> pool_;
  HostSlab slab_;
  float* state_[3] = {nullptr, nullptr, nullptr};
  float* grad_[2] = {nullptr, nullptr};
  void* out_[2] = {nullptr, nullptr};
  std::unique_ptr<Event> grad_in_[2], out_done_[2];
};

}  // namespace

Result<std::unique_ptr<OptimizerStates>> CreateHostOptimizerStates(Device* device, int64_t numel, Stream* stream,
                                                                   const HostOptimizerStatesOptions& options) {
  auto s = std::make_unique<HostOptimizerStates>(device, stream, numel, options);
  ZERO_RETURN_IF_ERROR(s->Init(options));
  return std::unique_ptr<OptimizerStates>(std::move(s));
}

}  // namespace zero
