// CpuDevice: the Device backend whose "device memory" is ordinary host memory.
//
// Owns its allocations (256-byte aligned device buffers, counted in memory_stats(); 4096-byte
// aligned "pinned" buffers, not counted), one default stream and the streams/events it creates.
// Every call runs to completion on the calling thread before it returns (elementwise kernels and
// large copies may fan out to short-lived worker threads and join them before returning), so every
// stream is always synchronized and every recorded event is complete.
//
// Arithmetic: elementwise kernels produce exactly the values device.h specifies (dtype.h
// conversions, AdamWReference per element, NaN results canonical), independent of the thread
// count. SumOfSquares is single-threaded with a fixed order: the input is cut into blocks of 1024
// elements (the last may be shorter); in a block, element i's exact double square is added to lane
// (i mod 8) in increasing i and the lanes are combined as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7));
// block sums are combined pairwise like a binary counter (after block k, while bit j of k is
// set, the level-j sum is added in front: level_j + carry) and the remaining levels are added from
// the lowest up (level + total, total starting at 0). The result depends only on the input, never
// on threads or alignment, and its error grows with log2(n / 1024), not with n.
//
// Thread safety: as Device; kernels on different streams may run concurrently from different
// threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/status.h"

namespace zero {

struct CpuDeviceOptions {
  // Allocate fails with ResourceExhausted once in-use device memory would exceed this (0: only
  // the host's own limit applies).
  size_t memory_limit = 0;
  // Worker threads for elementwise kernels and copies of at least kCpuParallelThreshold elements
  // (0: std::thread::hardware_concurrency(); 1: always single-threaded).
  int num_threads = 0;
};

// Elementwise work on fewer elements than this runs on the calling thread only.
inline constexpr size_t kCpuParallelThreshold = size_t{1} << 20;

class CpuDevice final : public Device {
 public:
  CpuDevice();
  explicit CpuDevice(const CpuDeviceOptions& options);
  ~CpuDevice() override;
  CpuDevice(const CpuDevice&) = delete;
  CpuDevice& operator=(const CpuDevice&) = delete;

  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string name() const override { return "cpu"; }
  CpuDevice* AsCpu() override { return this; }

  Result<DeviceBuffer> Allocate(size_t bytes) override;
  Result<PinnedBuffer> AllocatePinned(size_t bytes) override;

  Stream* default_stream() override;
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
  CpuDeviceOptions options_;
  int num_threads_;
  std::mutex alloc_mu_;  // makes Allocate's limit check and NoteAlloc one step
  std::unique_ptr<Stream> default_stream_;
};

// CpuDevice::SumOfSquares' order in two parts, for callers that compute the block sums on threads
// of their own (the host gradient partition's norm) and must get the same bits: the fp32 input cut
// into blocks of kSumOfSquaresBlock elements (the last may be shorter), BlockSumOfSquaresF32 of each
// (n <= kSumOfSquaresBlock), then CombineBlockSumsOfSquares over the block sums in order.
inline constexpr size_t kSumOfSquaresBlock = 1024;
double BlockSumOfSquaresF32(const float* x, size_t n);
double CombineBlockSumsOfSquares(const double* block_sums, size_t blocks);

}  // namespace zero
