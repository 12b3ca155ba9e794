// GradPartition: where one rank's fp32 gradient partition lives, how reduced gradient pieces are
// added to it, its per-parameter sums of squares (the boundary norm) and its hand-off to the
// optimizer states' update.
//
// The engine sees the partition as pieces, one per parameter (piece i = elements [offset, offset +
// n) of a flat fp32 layout of `numel` elements, the partition layout of engine.cc; gaps and padding
// are zero from creation and stay zero). It decides when a piece gets its window's first
// contribution (`first`) and which pieces are unwritten; the partition stores the values.
//
// Implementations:
//   - Device (CreateDeviceGradPartition / CreateDeviceGradPartitionView): one device buffer, the
//     adds and the norm on the device (Device::AccumulateFirst / Accumulate / SumOfSquares), AdamW
//     through OptimizerStates::Update from device gradients. Today's engine behaviour, bit for bit.
//   - Host (CreateHostGradPartition; offload_optimizer "cpu" with the CPU AdamW,
//     offload_grad_accumulation "cpu"): the partition in pinned host memory (one HostSlab). Add
//     copies the reduced piece in chunks into a ring of staging slots, each a device slot and a
//     pinned host slot: device->device into the device slot on the caller's stream (so the source
//     is free once that stream passes the call), then device->host on the partition's own copy
//     stream, so the caller's later kernels never queue behind PCIe; a worker thread adds each
//     chunk into the host partition as it lands (on the states' thread pool), so backward goes on
//     meanwhile. Add blocks only when every slot is in use. The device slots are the only device
//     memory (staging_slots x chunk_numel x 4 bytes): no full-model staging copy. Store (stage 1,
//     the GPU sum's flush) copies straight into the partition on the caller's stream. The norm is
//     CpuDevice::SumOfSquares' order on the host (the same bits as the CPU backend's device norm); AdamW reads the host
//     partition in place (OptimizerStates::UpdateFromHost).
//   - GPU-accumulated (CreateGpuAccumulatedGradPartition; offload_grad_accumulation "gpu"): a
//     device fp32 sum (4 bytes per element on the device) in front of a host partition. Every add
//     goes to the device sum; a piece's sum is copied to the host once per window, when its last
//     contribution was added (Add with `last`, the boundary micro step) or at Finish() (a piece
//     whose last contribution came earlier). So the host gets the same fp32 sum, in the same order,
//     as the host partition's own adds would make (bitwise), crossing PCIe once per step.
//
// Ordering: every call is made from the engine's thread; device reads and writes are enqueued on
// the stream given at creation (the engine's compute stream): a source may be reused once that
// stream passes the call. SumsOfSquares and Update wait for the adds before them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "offload/host_slab.h"
#include "offload/thread_pool.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/status.h"
#include "zero/optimizer_states.h"
#include "zero/trace_observer.h"

namespace zero {

struct GradPiece {
  int64_t offset = 0;
  int64_t n = 0;
};

// Bytes held, by where they live.
struct GradPartitionBytes {
  size_t device = 0;          // the partition (or the GPU sum) on the device
  size_t device_staging = 0;  // the host partition's device staging slots
  size_t host = 0;
};

class GradPartition {
 public:
  virtual ~GradPartition() = default;

  int num_pieces() const { return static_cast<int>(pieces_.size()); }
  const GradPiece& piece(int i) const { return pieces_[i]; }

  // Piece i = 0.0f + src (first: Device::AccumulateFirst) or piece i + src (Accumulate), from its
  // n elements of `src_t` at `src` (device memory). `last`: no further contribution to piece i
  // comes in this window (a hint; GPU accumulation sends the sum to the host then).
  virtual Status Add(int i, const void* src, DType src_t, bool first, bool last) = 0;
  // Piece i = src (n fp32 elements, device memory), bit for bit (stage 1's reduced sums).
  virtual Status Store(int i, const float* src) = 0;
  // Piece i = zeros (a piece without contribution in the window that AdamW will read).
  virtual Status Zero(int i) = 0;
  // Where a collective may write piece i directly (device memory), or null: none (host).
  virtual float* device_piece(int i) { return nullptr; }
  // The partition's element `offset` in device memory (the layout is contiguous there), or null
  // where the partition lives on the host. Valid until the next window's first Add; what the
  // overlapped chunked step reads after Step() returns (engine.h, WaitForOptimizerStep).
  virtual const float* device_at(int64_t offset) const { return nullptr; }
  // Every contribution of the window was added: pieces still pending are completed (GPU
  // accumulation: sent to the host). Idempotent until NewWindow().
  virtual Status Finish() { return OkStatus(); }
  // A new window starts (no piece is pending).
  virtual void NewWindow() {}
  // For each i in `which`: slots[i] = sum of squares of piece i in double (device memory; the
  // other slots are left as they are, or set to 0.0), on the stream.
  virtual Status SumsOfSquares(const std::vector<int>& which, double* slots) = 0;
  // AdamW over state elements [offset, offset + n) of `states` from the partition's elements at the
  // same offsets (the state and partition layouts coincide), writing the rounded weights to
  // `model_out` (device memory, may be null) as OptimizerStates::Update does.
  virtual Status Update(OptimizerStates* states, int64_t offset, int64_t n, const AdamWParams& h, void* model_out,
                        DType model_t) = 0;
  // Piece i's n values into host memory `out`; blocking, after every call before it (tests, debugging).
  virtual Status Read(int i, float* out) = 0;
  virtual GradPartitionBytes bytes() const = 0;

  // The per-stream trace's hook (zero/trace_observer.h; null: none); set before the partition is
  // used. The host partition reports its device->host copies.
  virtual void set_observer(StreamObserver* o) { observer_ = o; }

 protected:
  explicit GradPartition(std::vector<GradPiece> pieces) : pieces_(std::move(pieces)) {}
  std::vector<GradPiece> pieces_;
  StreamObserver* observer_ = nullptr;
};

// A zero-filled device buffer of `numel` fp32 elements. Errors name "fp32 gradient partition".
Result<std::unique_ptr<GradPartition>> CreateDeviceGradPartition(Device* device, Stream* stream, int64_t numel,
                                                                 std::vector<GradPiece> pieces);
// The same over an fp32 device buffer the caller owns (the engine's accumulators where they are
// the partition); bytes() counts nothing.
std::unique_ptr<GradPartition> CreateDeviceGradPartitionView(Device* device, Stream* stream, float* data,
                                                             std::vector<GradPiece> pieces);

struct HostGradPartitionOptions {
  HostSlabOptions slab;                    // pinning, NUMA, the config key errors name
  ThreadPool* pool = nullptr;              // the host adds and the norm (not owned; required)
  int64_t chunk_numel = int64_t{1} << 22;  // elements per staging slot (16 MiB of fp32; at most the largest piece)
  int staging_slots = 4;                   // device->host copies in flight
  bool device_staging = true;              // false: no device slots, Add refused (Store only: the GPU sum's host side)
};

// `numel` fp32 elements in one host slab (zero), plus the staging ring.
Result<std::unique_ptr<GradPartition>> CreateHostGradPartition(Device* device, Stream* stream, int64_t numel,
                                                               std::vector<GradPiece> pieces,
                                                               const HostGradPartitionOptions& options);
// A device fp32 sum of `numel` elements in front of a host partition made with `options`.
Result<std::unique_ptr<GradPartition>> CreateGpuAccumulatedGradPartition(Device* device, Stream* stream, int64_t numel,
                                                                         std::vector<GradPiece> pieces,
                                                                         const HostGradPartitionOptions& options);

}  // namespace zero
