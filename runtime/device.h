// Device: the one interface through which the engine touches memory and runs elementwise math.
//
// Owns nothing itself; each backend (CpuDevice in cpu_device.h, CudaDevice in cuda_device.h) owns
// its allocations, streams and events and frees them when the DeviceBuffer/Stream/Event handles
// die. "Device memory" is host memory for the CPU backend and GPU memory for CUDA; "pinned host
// memory" is page-locked host memory (cudaHostAlloc) for CUDA and ordinary aligned host memory for
// the CPU backend.
//
// Streams and ordering: every copy and kernel is enqueued on a Stream and runs in order on it;
// the call returns once the work is enqueued. A buffer handed to an async call must stay alive and
// unmodified (inputs) / unread (outputs) until the stream passes that point (Synchronize, or an
// Event recorded after the call and waited on). The CPU backend runs each call to completion on the
// calling thread before returning, so on CPU every stream is already synchronized and every event
// recorded is complete; code written for CUDA ordering is correct on CPU as well.
//
// Kernels read/write `n` elements addressed with size_t (no 32-bit index overflow for n >= 2^31).
// Elementwise results are bit-identical between the CPU and CUDA backends (both use dtype.h's
// conversions; CUDA is compiled without FMA contraction). A NaN produced by arithmetic
// (Accumulate, Scale, AdamW) is stored as the canonical NaN 0x7fffffff (as 16 bits: 0x7fff), which
// is what the GPU produces, so NaN results are bit-identical too; Fill and Cast carry NaN sign and
// top payload bits through dtype.h's conversions. Reductions (SumOfSquares) accumulate exact
// double squares in a fixed order per backend (deterministic run to run; see cpu_device.h and
// cuda_kernels.h); the orders differ, so CPU and CUDA agree within double rounding.
//
// A null Stream* in any call means default_stream(). Allocate(0) returns an empty buffer
// (data() == nullptr); copies and kernels with zero bytes/elements do nothing (SumOfSquares writes
// 0.0) and accept null data pointers.
//
// Thread safety: allocation, stream and event creation are thread-safe; a Stream must be used by
// one thread at a time.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "runtime/dtype.h"
#include "runtime/status.h"

namespace zero {

enum class DeviceKind { kCpu, kCuda };
const char* DeviceKindName(DeviceKind k);

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice, kHostToHost };

class Stream {
 public:
  virtual ~Stream() = default;
};

class Event {
 public:
  virtual ~Event() = default;
};

// Hyperparameters of one AdamW call (host-side values; bias corrections computed by the caller
// for the step number t: bias_correction1 = 1 - beta1^t, bias_correction2 = 1 - beta2^t).
struct AdamWParams {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  float bias_correction1 = 1.0f;
  float bias_correction2 = 1.0f;
  bool adam_w_mode = true;  // false: classic Adam, weight decay added to the gradient (L2)
  float grad_scale = 1.0f;  // the gradient is multiplied by this first (1/(loss_scale*GAS), clip)
};

// The update, per element, in this exact order (DeepSpeed's):
//   g = grad * grad_scale;  if (!adam_w_mode) g += weight_decay * p;
//   m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * (g * g);
//   denom = sqrt(v) / sqrt(bias_correction2) + eps;
//   if (adam_w_mode) p = p - lr * weight_decay * p;
//   p = p - (lr / bias_correction1) * (m / denom);
// Reference implementation for tests and both backends: AdamWReference (one element; ZERO_HD so
// the CUDA kernel compiles this very expression).
ZERO_HD void AdamWReference(float* p, float g, float* m, float* v, const AdamWParams& h) {
  g = g * h.grad_scale;
  if (!h.adam_w_mode) g = g + h.weight_decay * *p;
  *m = h.beta1 * *m + (1.0f - h.beta1) * g;
  *v = h.beta2 * *v + (1.0f - h.beta2) * (g * g);
  float denom = sqrtf(*v) / sqrtf(h.bias_correction2) + h.eps;
  if (h.adam_w_mode) *p = *p - h.lr * h.weight_decay * *p;
  *p = *p - (h.lr / h.bias_correction1) * (*m / denom);
}

struct MemoryStats {
  size_t in_use = 0;  // bytes of device memory currently allocated through this Device
  size_t peak = 0;    // high-water mark since creation or the last ResetPeak()
};

class Device;
class CpuDevice;
class CudaDevice;

// Owns one device allocation; frees it on destruction. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Device* device, void* ptr, size_t bytes) : device_(device), ptr_(ptr), bytes_(bytes) {}
  ~DeviceBuffer() { Reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }
  bool empty() const { return ptr_ == nullptr; }
  void Reset();  // frees now (the caller guarantees no stream still uses it)

 private:
  Device* device_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Owns one pinned host allocation. Move-only.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(Device* device, void* ptr, size_t bytes) : device_(device), ptr_(ptr), bytes_(bytes) {}
  ~PinnedBuffer() { Reset(); }
  PinnedBuffer(PinnedBuffer&& o) noexcept { *this = std::move(o); }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* data() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }
  void Reset();

 private:
  Device* device_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

class Device {
 public:
  virtual ~Device() = default;

  virtual DeviceKind kind() const = 0;
  virtual std::string name() const = 0;  // "cpu", "cuda:0 (NVIDIA H200)"
  virtual int ordinal() const { return 0; }

  // The backend behind this object, for code that needs backend-specific handles (a CUDA stream, the
  // host kernels): the CpuDevice or CudaDevice itself, else null. Wrappers (FaultyDevice, test
  // devices) answer null, so code that needs a real backend refuses them as it would any other.
  virtual CpuDevice* AsCpu() { return nullptr; }
  virtual CudaDevice* AsCuda() { return nullptr; }

  // --- memory -------------------------------------------------------------------------------
  // Device memory, 256-byte aligned, uninitialized. ResourceExhausted names the size asked for and
  // what is in use.
  virtual Result<DeviceBuffer> Allocate(size_t bytes) = 0;
  virtual Result<PinnedBuffer> AllocatePinned(size_t bytes) = 0;
  MemoryStats memory_stats() const;
  void ResetPeak();

  // Page-locks host memory this process allocated (page-aligned [ptr, ptr + bytes)) so copies
  // from/to it are truly async: CUDA: cudaHostRegister(portable); on failure the Status carries
  // CUDA's text. The default (CPU backend: no DMA engine to serve) does nothing and returns OK;
  // offload/host_slab.h page-locks with mlock there itself. Unregister undoes a successful
  // Register on the same ptr (the default: OK). Used by HostSlab (offload/host_slab.h).
  virtual Status RegisterHostMemory(void* ptr, size_t bytes) { return OkStatus(); }
  virtual Status UnregisterHostMemory(void* ptr) { return OkStatus(); }
  // The PCI address ("0000:3b:00.0", lower-case hex) of the device, to find its NUMA node in
  // /sys; empty when it has none (the default, CPU).
  virtual std::string pci_bus_id() const { return std::string(); }

  // --- streams and events -------------------------------------------------------------------
  virtual Stream* default_stream() = 0;
  virtual Result<std::unique_ptr<Stream>> CreateStream() = 0;
  virtual Result<std::unique_ptr<Event>> CreateEvent() = 0;
  virtual Status RecordEvent(Event* event, Stream* stream) = 0;
  // Work enqueued on `stream` after this call starts only once `event` has completed.
  virtual Status StreamWaitEvent(Stream* stream, Event* event) = 0;
  virtual Status SynchronizeEvent(Event* event) = 0;
  virtual Status SynchronizeStream(Stream* stream) = 0;
  virtual Status Synchronize() = 0;  // all streams of this device

  // --- timing (runtime/timeline.h measures device spans with these) -----------------------------
  // An event that ElapsedMilliseconds can time. CreateEvent's events may not be timeable (CUDA
  // creates them with cudaEventDisableTiming, which makes recording and waiting cheaper); these
  // are used like them otherwise. Default: Unimplemented (a backend without device timing).
  virtual Result<std::unique_ptr<Event>> CreateTimingEvent();
  // Milliseconds of device time from `start` to `end`, two recorded timing events of this device
  // (on any streams). Never blocks: nullopt while either has not completed on the device yet.
  // CPU: the host clock at the two RecordEvent calls. FailedPrecondition if either was never
  // recorded; InvalidArgument for an event that is not a timing event of this device.
  virtual Result<std::optional<double>> ElapsedMilliseconds(Event* start, Event* end);

  // --- copies -------------------------------------------------------------------------------
  // Host pointers must be pinned for the copy to be truly async on CUDA (pageable works, slower).
  virtual Status Copy(void* dst, const void* src, size_t bytes, CopyKind kind, Stream* stream) = 0;

  // --- elementwise kernels (async on `stream`) -------------------------------------------------
  // dst[i] = value (rounded to t).
  virtual Status Fill(void* dst, DType t, size_t n, float value, Stream* stream) = 0;
  // dst[i] = (dst_t) src[i]. src and dst may not overlap unless identical with equal types.
  virtual Status Cast(const void* src, DType src_t, void* dst, DType dst_t, size_t n, Stream* stream) = 0;
  // acc[i] = acc[i] + scale * (float) src[i]   (fp32 accumulator; scale == 1 is exact "acc += src").
  virtual Status Accumulate(float* acc, const void* src, DType src_t, size_t n, float scale, Stream* stream) = 0;
  // acc[i] = 0.0f + scale * (float) src[i]: Accumulate into an accumulator that holds +0, without
  // reading (or first filling) it; what was in acc is ignored. Bitwise what Fill(acc, 0) followed
  // by Accumulate gives, for every input: a -0 result becomes +0 (0.0f + -0.0f is +0.0f) and a NaN
  // is the canonical NaN, so this is NOT a Cast (which keeps -0 and NaN payloads). For the first
  // contribution to an fp32 accumulator: one pass (read src, write acc) instead of a fill and a
  // read-modify-write. src must not overlap acc.
  virtual Status AccumulateFirst(float* acc, const void* src, DType src_t, size_t n, float scale, Stream* stream) = 0;
  // x[i] = (t)((float) x[i] * s).
  virtual Status Scale(void* x, DType t, size_t n, float s, Stream* stream) = 0;
  // *out = sum_i (double) x[i]^2, written (not added) to a device-resident double.
  virtual Status SumOfSquares(const void* x, DType t, size_t n, double* out, Stream* stream) = 0;
  // If any x[i] is Inf or NaN, *flag = 1 (device-resident int32; never cleared here).
  virtual Status FiniteCheck(const void* x, DType t, size_t n, int32_t* flag, Stream* stream) = 0;
  // AdamW over fp32 master weights and states; see AdamWReference for the exact arithmetic.
  virtual Status AdamW(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, size_t n,
                       const AdamWParams& h, Stream* stream) = 0;
  // AdamW, and in the same pass model_out[i] = the new param[i] rounded to model_t (StoreFromFloat;
  // kF32: the new weight's bits): bitwise what AdamW followed by Cast(param, kF32, model_out,
  // model_t, n) gives, NaN included, without re-reading the new weights. model_out must not
  // overlap the other buffers; null: AdamW alone.
  virtual Status AdamWCast(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, size_t n,
                           const AdamWParams& h, void* model_out, DType model_t, Stream* stream) = 0;
  // AdamW reading the gradient in its own dtype: element i's gradient is 0.0f + 1.0f * (float)
  // grad[i], bitwise what AccumulateFirst(scratch, grad, grad_t, n, 1.0f) followed by AdamW(param,
  // scratch, ...) gives (a -0 gradient becomes +0, a NaN the canonical NaN), in one pass and
  // without the fp32 scratch (the update in backward: 16-bit gradients read once, 8 bytes per
  // element less traffic). grad must not overlap the other buffers.
  virtual Status AdamWFromGradient(float* param, const void* grad, DType grad_t, float* exp_avg, float* exp_avg_sq,
                                   size_t n, const AdamWParams& h, Stream* stream) = 0;

 protected:
  // Backends call these from Allocate/free so memory_stats() is tracked in one place.
  void NoteAlloc(size_t bytes);
  void NoteFree(size_t bytes);
  friend class DeviceBuffer;
  friend class PinnedBuffer;
  virtual void FreeDevice(void* ptr, size_t bytes) = 0;
  virtual void FreePinned(void* ptr, size_t bytes) = 0;

 private:
  struct Counters;
  std::shared_ptr<Counters> counters_ = MakeCounters();
  static std::shared_ptr<Counters> MakeCounters();
};

// Creates a device from a name: "cpu", "cuda", "cuda:N". Unknown names and CUDA on a build or
// machine without it give a clear error. Defined in //runtime:device_factory (link that target to
// call it); the backends live in //runtime:cpu_device and, with CUDA, //runtime:cuda_device.
Result<std::unique_ptr<Device>> CreateDevice(const std::string& name);

}  // namespace zero
