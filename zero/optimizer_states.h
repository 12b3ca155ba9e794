// OptimizerStates: where one rank's fp32 master weights and AdamW moments live and where their
// update runs. The engine addresses the states by element offsets in its flat layout (stage 0: the
// full layout, stages 1-3: the partition layout) and never touches their memory directly: offload
// implementations (pinned host memory with the CPU AdamW, NVMe swap) plug in behind this interface.
//
// Implementations: DeviceOptimizerStates (CreateDeviceOptimizerStates below: three device buffers,
// AdamW on the device). Every method may be called from the engine's thread only.
//
// Ordering: calls that take a `stream` are enqueued on it (device memory they read or write must
// stay valid until the stream passes them); Read/Write are blocking: when they return, `host` has
// been filled / may be reused, and they are ordered after everything enqueued earlier on the
// stream the states were created with.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/status.h"
#include "zero/trace_observer.h"

namespace zero {

class ThreadPool;  // offload/thread_pool.h

enum class OptState { kMaster, kExpAvg, kExpAvgSq };
const char* OptStateName(OptState s);  // "fp32 master weights", "AdamW exp_avg", "AdamW exp_avg_sq"

// Bytes held, by where they live.
struct OptimizerStateBytes {
  size_t device = 0;
  size_t host = 0;
  size_t nvme = 0;
};

class OptimizerStates {
 public:
  virtual ~OptimizerStates() = default;

  // Elements of each state (all three have the same layout; the elements start zeroed).
  virtual int64_t numel() const = 0;
  // AdamW (runtime/device.h, AdamWReference) over elements [offset, offset + n): grads[i] (device
  // memory, fp32) is the gradient of element offset + i. With `model_out` (device memory) the new
  // weights rounded to `model_t` are written there in the same pass (AdamWCast). On `stream`.
  virtual Status Update(int64_t offset, int64_t n, const float* grads, const AdamWParams& h, void* model_out,
                        DType model_t, Stream* stream) = 0;
  // The update in backward (docs/zero.md, "Update in backward"): AdamW over [offset, offset + n) from gradients of
  // `grad_t` at `grad` (device memory, n elements, written on `stream`; null: zero gradients), widened exactly as
  // Device::AccumulateFirst does (0.0f + g); device states read `grad` in place (Device::AdamWFromGradient). May return
  // before the update is done (host states run it on a worker, overlapped with the caller's backward); `grad` may be
  // reused once `stream` passes this call. Every other call waits for the updates queued before it.
  virtual Status UpdateFromGradient(int64_t offset, int64_t n, const void* grad, DType grad_t, const AdamWParams& h,
                                    Stream* stream) = 0;
  // model_out[i] = master[offset + i] rounded to `model_t` (device memory), on `stream`.
  virtual Status CastMaster(int64_t offset, int64_t n, void* model_out, DType model_t, Stream* stream) = 0;
  // n elements of `which` at `offset` to device memory `dst` / from device memory `src`, on `stream`.
  virtual Status CopyToDevice(OptState which, int64_t offset, int64_t n, float* dst, Stream* stream) = 0;
  virtual Status CopyFromDevice(OptState which, int64_t offset, int64_t n, const float* src, Stream* stream) = 0;
  // n elements of `which` at `offset` to / from host memory; blocking.
  virtual Status Read(OptState which, int64_t offset, int64_t n, float* host) = 0;
  virtual Status Write(OptState which, int64_t offset, int64_t n, const float* host) = 0;
  virtual OptimizerStateBytes bytes() const = 0;

  // Whether CastMasterToHost is available: the masters live in host memory (host states), so the
  // rounded weights can be written to host memory without crossing to the device and back
  // (offload_param.device "cpu" writes its host shards so). Default: false.
  virtual bool casts_to_host() const { return false; }
  // host_out[i] = master[offset + i] rounded to `model_t` (host memory); blocking, ordered after
  // the updates queued before it and everything enqueued earlier on the states' stream. The
  // default (casts_to_host() false): Unimplemented.
  virtual Status CastMasterToHost(int64_t offset, int64_t n, void* host_out, DType model_t);

  // Whether UpdateFromHost is available: the update runs on the host over host states (the CPU
  // AdamW), so fp32 gradients already in host memory (the host gradient partition,
  // zero/grad_partition.h) are read in place. Default: false.
  virtual bool updates_from_host() const { return false; }
  // As Update, from n fp32 gradients in host memory at `grads` (read before it returns). The
  // default (updates_from_host() false): Unimplemented.
  virtual Status UpdateFromHost(int64_t offset, int64_t n, const float* grads, const AdamWParams& h, void* model_out,
                                DType model_t, Stream* stream);
  // The thread pool the host update runs on, for other host passes that share its cores (the
  // host gradient partition's adds and norm); null where there is none. Owned by the states.
  virtual ThreadPool* host_thread_pool() { return nullptr; }

  // The per-stream trace's hook (zero/trace_observer.h; null: none). Set before the states are
  // used; implementations report their copies, updates and waits to `observer_`.
  virtual void set_observer(StreamObserver* o) { observer_ = o; }

 protected:
  StreamObserver* observer_ = nullptr;
};

// For implementations: OK, or OutOfRange naming `what` and `call`: "[offset, offset + n) outside
// [0, numel)".
Status CheckStateRange(const char* what, const char* call, int64_t offset, int64_t n, int64_t numel);

// The states in device memory (three buffers of `numel` fp32 elements, zero-filled on `stream`,
// which Read/Write order against). Errors name the state that could not be allocated.
Result<std::unique_ptr<OptimizerStates>> CreateDeviceOptimizerStates(Device* device, int64_t numel, Stream* stream);

}  // namespace zero
