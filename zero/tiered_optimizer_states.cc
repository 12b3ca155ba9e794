#include "zero/tiered_optimizer_states.h"

#include <algorithm>
#include <utility>

#include "zero/buffer_pool.h"

namespace zero {
namespace {

class TieredOptimizerStates final : public OptimizerStates {
 public:
  // `device` (null: none) uploads host gradients for a first part that does not update from the
  // host (CreateGpuTieredOptimizerStates).
  TieredOptimizerStates(std::unique_ptr<OptimizerStates> first, std::unique_ptr<OptimizerStates> second,
                        Device* device = nullptr)
      : first_(std::move(first)),
        second_(std::move(second)),
        split_(first_->numel()),
        device_(device),
        upload_(device != nullptr ? std::make_unique<BufferPool>(device, size_t{64} << 20) : nullptr) {}

  int64_t numel() const override { return split_ + second_->numel(); }
  void set_observer(StreamObserver* o) override {
    first_->set_observer(o);
    second_->set_observer(o);
  }

  Status Update(int64_t offset, int64_t n, const float* grads, const AdamWParams& h, void* model_out, DType model_t,
                Stream* stream) override {
    return Split(offset, n, [&](OptimizerStates* s, int64_t off, int64_t len, int64_t done) {
      return s->Update(off, len, grads + done, h, model_out != nullptr ? ElementPtr(model_out, model_t, done) : nullptr,
                       model_t, stream);
    });
  }
  Status UpdateFromGradient(int64_t offset, int64_t n, const void* grad, DType grad_t, const AdamWParams& h,
                            Stream* stream) override {
    return Split(offset, n, [&](OptimizerStates* s, int64_t off, int64_t len, int64_t done) {
      const void* g = grad != nullptr ? ElementPtr(grad, grad_t, done) : nullptr;
      return s->UpdateFromGradient(off, len, g, grad_t, h, stream);
    });
  }
  Status CastMaster(int64_t offset, int64_t n, void* model_out, DType model_t, Stream* stream) override {
    return Split(offset, n, [&](OptimizerStates* s, int64_t off, int64_t len, int64_t done) {
      return s->CastMaster(off, len, ElementPtr(model_out, model_t, done), model_t, stream);
    });
  }
  Status CopyToDevice(OptState which, int64_t offset, int64_t n, float* dst, Stream* stream) override {
    return Split(offset, n, [&](OptimizerStates* s, int64_t off, int64_t len, int64_t done) {
      return s->CopyToDevice(which, off, len, dst + done, stream);
    });
  }
  Status CopyFromDevice(OptState which, int64_t offset, int64_t n, const float* src, Stream* stream) override {
    return Split(offset, n, [&](OptimizerStates* s, int64_t off, int64_t len, int64_t done) {
      return s->CopyFromDevice(which, off, len, src + done, stream);
    });
  }
  Status Read(OptState which, int64_t offset, int64_t n, float* host) override {
    return Split(offset, n, [&](OptimizerStates* s, int64_t off, int64_t len, int64_t done) {
      return s->Read(which, off, len, host + done);
    });
  }
  Status Write(OptState which, int64_t offset, int64_t n, const float* host) override {
    return Split(offset, n, [&](OptimizerStates* s, int64_t off, int64_t len, int64_t done) {
      return s->Write(which, off, len, host + done);
    });
  }
  OptimizerStateBytes bytes() const override {
    OptimizerStateBytes a = first_->bytes(), b = second_->bytes();
    return {a.device + b.device, a.host + b.host, a.nvme + b.nvme};
  }

  // The offloaded (second) part decides; a first part that cannot is served by the upload.
  bool updates_from_host() const override {
    if (!second_->updates_from_host() && second_->numel() > 0) return false;
    return split_ == 0 || first_->updates_from_host() || upload_ != nullptr;
  }
  ThreadPool* host_thread_pool() override {
    ThreadPool* p = second_->host_thread_pool();
    return p != nullptr ? p : first_->host_thread_pool();
  }
  Status UpdateFromHost(int64_t offset, int64_t n, const float* grads, const AdamWParams& h, void* model_out,
                        DType model_t, Stream* stream) override {
    return Split(offset, n, [&](OptimizerStates* s, int64_t off, int64_t len, int64_t done) {
      void* out = model_out != nullptr ? ElementPtr(model_out, model_t, done) : nullptr;
      if (s->updates_from_host()) return s->UpdateFromHost(off, len, grads + done, h, out, model_t, stream);
      return UploadAndUpdate(s, off, len, grads + done, h, out, model_t, stream);
    });
  }

 private:
  // fn(part, offset in the part, length, elements of the range before this piece) for the pieces
  // of [offset, offset + n) in the first and in the second part.
  template <typename Fn>
  Status Split(int64_t offset, int64_t n, Fn fn) {
    ZERO_RETURN_IF_ERROR(CheckStateRange("tiered optimizer states", "a call", offset, n, numel()));
    const int64_t in_first = std::max<int64_t>(0, std::min(offset + n, split_) - offset);
    if (in_first > 0) ZERO_RETURN_IF_ERROR(fn(first_.get(), offset, in_first, 0));
    if (n - in_first > 0) ZERO_RETURN_IF_ERROR(fn(second_.get(), offset + in_first - split_, n - in_first, in_first));
    return OkStatus();
  }

  // Host gradients to the device, chunk by chunk, each updated there (Update) on `stream`; waits
  // for each chunk's copy, so `grads` may be reused when this returns.
  Status UploadAndUpdate(OptimizerStates* s, int64_t offset, int64_t n, const float* grads, const AdamWParams& h,
                         void* model_out, DType model_t, Stream* stream) {
    if (upload_ == nullptr) {
      return UnimplementedError(
          "tiered optimizer states: UpdateFromHost over a part that does not update from host gradients, "
          "without a device to upload them to");
    }
    constexpr int64_t kChunk = int64_t{1} << 24;  // 64 MiB of fp32
    ZERO_ASSIGN_OR_RETURN(DeviceBuffer chunk,
                          upload_->Acquire(static_cast<size_t>(std::min(n, kChunk)) * 4,
                                           "allocating the device chunk of the GPU tier's host gradients"));
    for (int64_t at = 0; at < n; at += kChunk) {
      const int64_t len = std::min(kChunk, n - at);
      ZERO_RETURN_IF_ERROR(
          device_->Copy(chunk.data(), grads + at, static_cast<size_t>(len) * 4, CopyKind::kHostToDevice, stream));
      void* out = model_out != nullptr ? ElementPtr(model_out, model_t, at) : nullptr;
      ZERO_RETURN_IF_ERROR(s->Update(offset + at, len, chunk.as<float>(), h, out, model_t, stream));
      // The next chunk overwrites the buffer, and the caller may reuse `grads` on return.
      ZERO_RETURN_IF_ERROR(device_->SynchronizeStream(stream));
    }
    return upload_->Release(std::move(chunk), stream);
  }

  std::unique_ptr<OptimizerStates> first_, second_;
  int64_t split_;
  Device* device_;
  std::unique_ptr<BufferPool> upload_;
};

}  // namespace

std::unique_ptr<OptimizerStates> CreateGpuTieredOptimizerStates(Device* device,
                                                                std::unique_ptr<OptimizerStates> on_device,
                                                                std::unique_ptr<OptimizerStates> offloaded) {
  return std::make_unique<TieredOptimizerStates>(std::move(on_device), std::move(offloaded), device);
}

std::unique_ptr<OptimizerStates> CreateTieredOptimizerStates(std::unique_ptr<OptimizerStates> first,
                                                             std::unique_ptr<OptimizerStates> second) {
  return std::make_unique<TieredOptimizerStates>(std::move(first), std::move(second));
}

}  // namespace zero
