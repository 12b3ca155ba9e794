#include "zero/tiered_optimizer_states.h"

#include <algorithm>
#include <utility>

namespace zero {
namespace {

class TieredOptimizerStates final : public OptimizerStates {
 public:
  TieredOptimizerStates(std::unique_ptr<OptimizerStates> first, std::unique_ptr<OptimizerStates> second)
      : first_(std::move(first)), second_(std::move(second)), split_(first_->numel()) {}

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

  std::unique_ptr<OptimizerStates> first_, second_;
  int64_t split_;
};

}  // namespace

std::unique_ptr<OptimizerStates> CreateTieredOptimizerStates(std::unique_ptr<OptimizerStates> first,
                                                             std::unique_ptr<OptimizerStates> second) {
  return std::make_unique<TieredOptimizerStates>(std::move(first), std::move(second));
}

}  // namespace zero
