// DeviceTensors: device copies of a HostTensors set (one Device::Allocate per tensor), for the model
// tests that run a model on a device against the CPU model on the same values. Owns its device
// memory (freed on destruction; the Device must outlive it). Copies go through Device::Copy on the
// device's default stream and wait for it; CopyTo first waits for the whole device, so it reads
// what work on any of its streams wrote. Failures fail the test (EXPECT). Header-only, test-only.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "models/model_api.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/status.h"

namespace zero::examples {

class DeviceTensors {
 public:
  DeviceTensors(Device* device, const HostTensors& host) : device_(device), dtype_(host.dtype()) {
    for (int i = 0; i < host.size(); ++i) {
      Result<DeviceBuffer> buffer = device_->Allocate(host.numel(i) * SizeOf(dtype_));
      EXPECT_TRUE(buffer.ok()) << buffer.status().ToString();
      buffers_.push_back(buffer.ok() ? std::move(buffer).value() : DeviceBuffer());
    }
    CopyFrom(host);
  }
  DeviceTensors(const DeviceTensors&) = delete;
  DeviceTensors& operator=(const DeviceTensors&) = delete;

  std::vector<ParamView> ParamViews() const {
    std::vector<ParamView> v;
    for (const DeviceBuffer& b : buffers_) v.push_back({b.data(), dtype_});
    return v;
  }
  std::vector<GradView> GradViews() {
    std::vector<GradView> v;
    for (const DeviceBuffer& b : buffers_) v.push_back({b.data(), dtype_});
    return v;
  }
  // From `host`, which has the same specs and dtype; returns once the copies are done.
  void CopyFrom(const HostTensors& host) {
    for (size_t i = 0; i < buffers_.size(); ++i) {
      const Status st = device_->Copy(buffers_[i].data(), host.data(static_cast<int>(i)), buffers_[i].bytes(),
                                      CopyKind::kHostToDevice, nullptr);
      EXPECT_TRUE(st.ok()) << st.ToString();
    }
    const Status st = device_->SynchronizeStream(nullptr);
    EXPECT_TRUE(st.ok()) << st.ToString();
  }
  // Into `host`, which has the same specs and dtype.
  void CopyTo(HostTensors* host) const {
    Status st = device_->Synchronize();
    EXPECT_TRUE(st.ok()) << st.ToString();
    for (size_t i = 0; i < buffers_.size(); ++i) {
      st = device_->Copy(host->data(static_cast<int>(i)), buffers_[i].data(), buffers_[i].bytes(),
                         CopyKind::kDeviceToHost, nullptr);
      EXPECT_TRUE(st.ok()) << st.ToString();
    }
    st = device_->SynchronizeStream(nullptr);
    EXPECT_TRUE(st.ok()) << st.ToString();
  }

 private:
  Device* device_;
  DType dtype_;
  std::vector<DeviceBuffer> buffers_;
};

}  // namespace zero::examples
