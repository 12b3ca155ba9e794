#include "zero/optimizer_states.h"

#include <algorithm>
#include <string>
#include <utility>

#include "zero/buffer_pool.h"

namespace zero {

const char* OptStateName(OptState s) {
  switch (s) {
    case OptState::kMaster:
      return "fp32 master weights";
    case OptState::kExpAvg:
      return "AdamW exp_avg";
    case OptState::kExpAvgSq:
      return "AdamW exp_avg_sq";
  }
  return "?";
}

Status CheckStateRange(const char* what, const char* call, int64_t offset, int64_t n, int64_t numel) {
  if (offset < 0 || n < 0 || offset + n > numel) {
    return OutOfRangeError(std::string(what) + ": " + call + " of [" + std::to_string(offset) + ", " +
                           std::to_string(offset + n) + ") outside [0, " + std::to_string(numel) + ")");
  }
  return OkStatus();
}

Status OptimizerStates::CastMasterToHost(int64_t offset, int64_t n, void* host_out, DType model_t) {
  return UnimplementedError(
      "CastMasterToHost: these optimizer states keep no masters in host memory "
      "(casts_to_host() is false); cast into device memory with CastMaster");
}

Status OptimizerStates::UpdateFromHost(int64_t offset, int64_t n, const float* grads, const AdamWParams& h,
                                       void* model_out, DType model_t, Stream* stream) {
  return UnimplementedError(
      "UpdateFromHost: these optimizer states do not update on the host "
      "(updates_from_host() is false); pass device gradients to Update");
}

namespace {

class DeviceOptimizerStates final : public OptimizerStates {
 public:
  DeviceOptimizerStates(Device* device, Stream* stream, int64_t numel)
      : device_(device), stream_(stream), numel_(numel), scratch_(device, size_t{64} << 20) {}

  Status Init() {
    for (OptState s : {OptState::kMaster, OptState::kExpAvg, OptState::kExpAvgSq}) {
      auto b = device_->Allocate(static_cast<size_t>(numel_) * 4);
      if (!b.ok()) return b.status().WithContext(std::string("allocating the ") + OptStateName(s));
      buf(s) = std::move(b).value();
      ZERO_RETURN_IF_ERROR(device_->Fill(buf(s).data(), DType::kF32, static_cast<size_t>(numel_), 0.0f, stream_));
    }
    return OkStatus();
  }

  int64_t numel() const override { return numel_; }

  Status Update(int64_t offset, int64_t n, const float* grads, const AdamWParams& h, void* model_out, DType model_t,
                Stream* stream) override {
    ZERO_RETURN_IF_ERROR(Check(offset, n, "Update"));
    return device_->AdamWCast(at(OptState::kMaster, offset), grads, at(OptState::kExpAvg, offset),
                              at(OptState::kExpAvgSq, offset), static_cast<size_t>(n), h, model_out, model_t, stream);
  }
  // One pass reading the gradient in its own dtype (Device::AdamWFromGradient); zero gradients
  // (null) through a chunk-sized fp32 scratch of zeros (reused in stream order), chunk by chunk.
  Status UpdateFromGradient(int64_t offset, int64_t n, const void* grad, DType grad_t, const AdamWParams& h,
                            Stream* stream) override {
    ZERO_RETURN_IF_ERROR(Check(offset, n, "UpdateFromGradient"));
    if (n == 0) return OkStatus();
    if (grad != nullptr) {
      return device_->AdamWFromGradient(at(OptState::kMaster, offset), grad, grad_t, at(OptState::kExpAvg, offset),
                                        at(OptState::kExpAvgSq, offset), static_cast<size_t>(n), h, stream);
    }
    constexpr int64_t kChunk = int64_t{1} << 24;  // 64 MiB of fp32
    ZERO_ASSIGN_OR_RETURN(DeviceBuffer scratch,
                          scratch_.Acquire(static_cast<size_t>(std::min(n, kChunk)) * 4,
                                           "allocating the gradient chunk of the update in backward"));
    for (int64_t at = 0; at < n; at += kChunk) {
      const size_t len = static_cast<size_t>(std::min(kChunk, n - at));
      float* g = scratch.as<float>();
      ZERO_RETURN_IF_ERROR(device_->Fill(g, DType::kF32, len, 0.0f, stream));
      ZERO_RETURN_IF_ERROR(Update(offset + at, static_cast<int64_t>(len), g, h, nullptr, DType::kF32, stream));
    }
    return scratch_.Release(std::move(scratch), stream);
  }

  Status CastMaster(int64_t offset, int64_t n, void* model_out, DType model_t, Stream* stream) override {
    ZERO_RETURN_IF_ERROR(Check(offset, n, "CastMaster"));
    return device_->Cast(at(OptState::kMaster, offset), DType::kF32, model_out, model_t, static_cast<size_t>(n),
                         stream);
  }
  Status CopyToDevice(OptState which, int64_t offset, int64_t n, float* dst, Stream* stream) override {
    ZERO_RETURN_IF_ERROR(Check(offset, n, "CopyToDevice"));
    return device_->Copy(dst, at(which, offset), static_cast<size_t>(n) * 4, CopyKind::kDeviceToDevice, stream);
  }
  Status CopyFromDevice(OptState which, int64_t offset, int64_t n, const float* src, Stream* stream) override {
    ZERO_RETURN_IF_ERROR(Check(offset, n, "CopyFromDevice"));
    return device_->Copy(at(which, offset), src, static_cast<size_t>(n) * 4, CopyKind::kDeviceToDevice, stream);
  }
  Status Read(OptState which, int64_t offset, int64_t n, float* host) override {
    ZERO_RETURN_IF_ERROR(Check(offset, n, "Read"));
    if (n == 0) return OkStatus();
    ZERO_RETURN_IF_ERROR(
        device_->Copy(host, at(which, offset), static_cast<size_t>(n) * 4, CopyKind::kDeviceToHost, stream_));
    return device_->SynchronizeStream(stream_);
  }
  Status Write(OptState which, int64_t offset, int64_t n, const float* host) override {
    ZERO_RETURN_IF_ERROR(Check(offset, n, "Write"));
    if (n == 0) return OkStatus();
    ZERO_RETURN_IF_ERROR(
        device_->Copy(at(which, offset), host, static_cast<size_t>(n) * 4, CopyKind::kHostToDevice, stream_));
    return device_->SynchronizeStream(stream_);  // `host` may be reused when this returns
  }
  OptimizerStateBytes bytes() const override {
    OptimizerStateBytes b;
    b.device = master_.bytes() + exp_avg_.bytes() + exp_avg_sq_.bytes();
    return b;
  }

 private:
  DeviceBuffer& buf(OptState s) {
    return s == OptState::kMaster ? master_ : s == OptState::kExpAvg ? exp_avg_ : exp_avg_sq_;
  }
  float* at(OptState s, int64_t offset) { return buf(s).as<float>() + offset; }
  Status Check(int64_t offset, int64_t n, const char* call) const {
    return CheckStateRange("optimizer states", call, offset, n, numel_);
  }

  Device* device_;
  Stream* stream_;
  int64_t numel_;
  DeviceBuffer master_, exp_avg_, exp_avg_sq_;
  BufferPool scratch_;  // the update in backward's fp32 chunk
};

}  // namespace

Result<std::unique_ptr<OptimizerStates>> CreateDeviceOptimizerStates(Device* device, int64_t numel, Stream* stream) {
  auto s = std::make_unique<DeviceOptimizerStates>(device, stream, numel);
  ZERO_RETURN_IF_ERROR(s->Init());
  return std::unique_ptr<OptimizerStates>(std::move(s));
}

}  // namespace zero
