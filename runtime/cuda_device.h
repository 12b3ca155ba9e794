// CudaDevice: the Device backend for one NVIDIA GPU, through the CUDA runtime.
//
// Owns its cudaMalloc allocations (counted in memory_stats()), cudaHostAlloc pinned buffers
// (portable, not counted), the streams and events it creates (CudaStream/CudaEvent, which the NCCL
// communicator and the offload pipelines may unwrap to the raw handles) and one default stream.
// Every stream, the default one included, is created with cudaStreamNonBlocking: none of them
// synchronizes implicitly with the legacy NULL stream. Each stream also owns 8 KiB of device
// scratch for SumOfSquares (not counted in memory_stats()), so reductions on different streams
// may run concurrently.
//
// Device binding: every call that touches CUDA first makes this device current on the calling
// thread (cudaSetDevice(ordinal)) and leaves it current, so one thread may drive several devices.
// Kernels are those of cuda_kernels.h: bitwise equal to CpuDevice for the elementwise ones;
// SumOfSquares deterministic on any GPU (fixed grid and summation order), equal to CpuDevice's
// within double rounding. Copies are cudaMemcpyAsync with the given CopyKind; a pageable host
// pointer works but the copy is then not asynchronous. Errors come back as Status: CUDA failures
// as InternalError naming the call (cuda_status.h), out of memory as ResourceExhausted with the
// bytes asked, in use through this device and free on the GPU. Only built when HAS_CUDA.
//
// Thread safety: as Device.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/status.h"

namespace zero {

class CudaStream final : public Stream {
 public:
  ~CudaStream() override;
  cudaStream_t get() const { return stream_; }
  int ordinal() const { return ordinal_; }

 private:
  friend class CudaDevice;
  CudaStream(int ordinal, cudaStream_t stream, double* scratch)
      : ordinal_(ordinal), stream_(stream), scratch_(scratch) {}
  int ordinal_;
  cudaStream_t stream_;
  double* scratch_;  // cuda_kernels::kSumOfSquaresBlocks doubles
};

class CudaEvent final : public Event {
 public:
  ~CudaEvent() override;
  cudaEvent_t get() const { return event_; }
  int ordinal() const { return ordinal_; }
  bool timing() const { return timing_; }  // created by CreateTimingEvent

 private:
  friend class CudaDevice;
  CudaEvent(int ordinal, cudaEvent_t event, bool timing = false) : ordinal_(ordinal), event_(event), timing_(timing) {}
  int ordinal_;
  cudaEvent_t event_;
  bool timing_;
};

class CudaDevice final : public Device {
 public:
  // Opens GPU `ordinal`. Fails with Unavailable when cudaGetDeviceCount fails (no GPU or no
  // driver; the message carries CUDA's text) and InvalidArgument for an ordinal out of range.
  static Result<std::unique_ptr<CudaDevice>> Create(int ordinal);
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string name() const override { return name_; }
  int ordinal() const override { return ordinal_; }
  CudaDevice* AsCuda() override { return this; }
  int multiprocessor_count() const { return sm_count_; }

  // The raw stream behind `stream` (null: the default stream). REQUIRES: a stream of this device.
  cudaStream_t native_stream(Stream* stream);

  Result<DeviceBuffer> Allocate(size_t bytes) override;
  Result<PinnedBuffer> AllocatePinned(size_t bytes) override;
  Status RegisterHostMemory(void* ptr, size_t bytes) override;
  Status UnregisterHostMemory(void* ptr) override;
  std::string pci_bus_id() const override;

  Stream* default_stream() override { return default_stream_.get(); }
  Result<std::unique_ptr<Stream>> CreateStream() override;
  Result<std::unique_ptr<Event>> CreateEvent() override;
  Status RecordEvent(Event* event, Stream* stream) override;
  Status StreamWaitEvent(Stream* stream, Event* event) override;
  Status SynchronizeEvent(Event* event) override;
  Result<std::unique_ptr<Event>> CreateTimingEvent() override;
  Result<std::optional<double>> ElapsedMilliseconds(Event* start, Event* end) override;
  Status SynchronizeStream(Stream* stream) override;
  Status Synchronize() override;

  Status Copy(void* dst, const void* src, size_t bytes, CopyKind kind, Stream* stream) override;

  Status Fill(void* dst, DType t, size_t n, float value, Stream* stream) override;
  Status Cast(const void* src, DType src_t, void* dst, DType dst_t, size_t n, Stream* stream) override;
  Status Accumulate(float* acc, const void* src, DType src_t, size_t n, float scale, Stream* stream) override;
  Status AccumulateFirst(float* acc, const void* src, DType src_t, size_t n, float scale, Stream* stream) override;
  Status Scale(void* x, DType t, size_t n, float s, Stream* stream) override;
  Status SumOfSquares(const void* x, DType t, size_t n, double* out, Stream* stream) override;
  Status FiniteCheck(const void* x, DType t, size_t n, int32_t* flag, Stream* stream) override;
  Status AdamW(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, size_t n, const AdamWParams& h,
               Stream* stream) override;
  Status AdamWCast(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, size_t n, const AdamWParams& h,
                   void* model_out, DType model_t, Stream* stream) override;
  Status AdamWFromGradient(float* param, const void* grad, DType grad_t, float* exp_avg, float* exp_avg_sq, size_t n,
                           const AdamWParams& h, Stream* stream) override;

 protected:
  void FreeDevice(void* ptr, size_t bytes) override;
  void FreePinned(void* ptr, size_t bytes) override;

 private:
  CudaDevice(int ordinal, std::string name, int sm_count);
  Status Bind() const;  // cudaSetDevice(ordinal_)
  Result<std::unique_ptr<CudaStream>> NewStream();
  // Binds the device and resolves `stream` (null: default) to one of this device's streams.
  Result<CudaStream*> Resolve(Stream* stream);
  int max_blocks() const { return sm_count_ * 8; }

  int ordinal_;
  std::string name_;
  int sm_count_;
  std::unique_ptr<CudaStream> default_stream_;
};

}  // namespace zero
