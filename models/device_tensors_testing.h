// DeviceTensors: device copies of a HostTensors set (one cudaMalloc per tensor), for the CUDA model
// tests that run a model on the GPU against the CPU model on the same values. Owns its device
// memory (freed on destruction); CUDA errors fail the test (EXPECT). Header-only, test-only, built
// only with the CUDA toolkit.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

#include "models/model_api.h"
#include "runtime/dtype.h"

namespace zero::examples {

class DeviceTensors {
 public:
  explicit DeviceTensors(const HostTensors& host) : dtype_(host.dtype()) {
    for (int i = 0; i < host.size(); ++i) {
      const size_t bytes = host.numel(i) * SizeOf(dtype_);
      void* p = nullptr;
      EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(p, host.data(i), bytes, cudaMemcpyHostToDevice), cudaSuccess);
      ptrs_.push_back(p);
      bytes_.push_back(bytes);
    }
  }
  ~DeviceTensors() {
    for (void* p : ptrs_) cudaFree(p);
  }
  DeviceTensors(const DeviceTensors&) = delete;
  DeviceTensors& operator=(const DeviceTensors&) = delete;

  std::vector<ParamView> ParamViews() const {
    std::vector<ParamView> v;
    for (void* p : ptrs_) v.push_back({p, dtype_});
    return v;
  }
  std::vector<GradView> GradViews() {
    std::vector<GradView> v;
    for (void* p : ptrs_) v.push_back({p, dtype_});
    return v;
  }
  // Into `host`, which has the same specs and dtype.
  void CopyTo(HostTensors* host) const {
    for (size_t i = 0; i < ptrs_.size(); ++i) {
      EXPECT_EQ(cudaMemcpy(host->data(i), ptrs_[i], bytes_[i], cudaMemcpyDeviceToHost), cudaSuccess);
    }
  }

 private:
  DType dtype_;
  std::vector<void*> ptrs_;
  std::vector<size_t> bytes_;
};

}  // namespace zero::examples
