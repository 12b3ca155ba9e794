// ChunkedOptimizerStates: OptimizerStates whose fp32 master weights and AdamW moments live in
// pinned host memory (offload_optimizer.device "cpu" with update_device "gpu") while AdamW runs
// on the device, over the states streamed through a few device staging sets.
//
// Owns one HostSlab (offload/host_slab.h: NUMA-local to the device, pinned as the options say)
// holding the three fp32 states, `chunk_buffers` staging sets of device memory (one set = master,
// exp_avg and exp_avg_sq of `chunk_numel` elements: chunk_buffers * chunk_numel * 12 bytes), three
// streams of its own (upload, update, download), the events between them and, from the first
// UpdateFromGradient on, one chunk of fp32 device scratch for widened gradients.
//
// Update(offset, n, ...) cuts [offset, offset + n) into chunks of chunk_numel elements (the last
// may be shorter) and gives chunk c the staging set c mod chunk_buffers (counted over every call,
// so consecutive calls keep the pipeline full). Per chunk:
//   1. upload stream: waits until the set is free (the previous chunk in it has been downloaded)
//      and until every download queued earlier to a host range this chunk overlaps has finished;
//      copies the chunk's three states host->device into the set.
//   2. update stream: waits for the upload (and, once per call, for the caller's stream at the
//      time of the call: the gradients are written, model_out may be overwritten); runs
//      Device::AdamWCast on the set with the caller's gradients, writing model_out.
//   3. download stream: waits for the update; copies the three states device->host; the set is
//      free again after this.
// So the upload of chunk i+1, the update of chunk i and the download of chunk i-1 run at once (on
// CUDA). Update returns when everything is queued; the caller's stream is ordered after the last
// chunk's download, so once it passes that point the gradients may be reused, model_out holds the
// new weights and the host states are final. Chunk boundaries do not change results: AdamW is
// elementwise, so every method gives bitwise what DeviceOptimizerStates gives, for any chunk size.
//
// The other calls:
//   - UpdateFromGradient: as Update, the update stream first widening the chunk of `grad`
//     (Device::AccumulateFirst, exactly as DeviceOptimizerStates does) into the fp32 scratch. The
//     caller's stream is ordered after the last chunk's widening only: `grad` may be reused then,
//     the rest (AdamW, download) completes in the background, ordered before every later call.
//   - CastMaster: per chunk, the masters are uploaded into a staging set (upload stream, after
//     overlapping downloads) and cast into model_out on the update stream; the caller's stream is
//     ordered after the last cast.
//   - The host model copy (options.model_dtype 16-bit): UpdateFromGradient's AdamWCast also writes
//     the new weights in the model dtype into the set's model buffer, downloaded with the states
//     into a host copy (2 bytes per element in the slab). A later CastMaster (or CastMasterAfter)
//     in that dtype over a range whose copy is current uploads the copy straight into model_out
//     on the upload stream (2 bytes per element instead of the 4 of the masters, and no set),
//     bitwise what the cast gives (AdamW followed by Cast equals AdamWCast). The copy is current
//     where the masters have not changed since it was written: from creation (zeros) and after
//     UpdateFromGradient; Update, UpdateAfter, Write and CopyFromDevice of the masters make it
//     stale there (CastMaster then casts the masters, as without a copy).
//   - CopyToDevice / CopyFromDevice / Read / Write: blocking. They wait for everything queued
//     (the three streams), then copy straight between host memory and `dst`/`src` (on the
//     caller's stream, synchronized) or `host`; Read/Write are also ordered after the stream the
//     states were created with.
// Host memory of the states (what Read returns) is valid for element e once every chunk covering
// e has been downloaded: after WaitForUpdates(s) when s passes it, or after any blocking call.
//
// Thread safety: every method must be called from one thread (the engine's). Event pointers
// returned by Chunk() stay valid until the next non-const call.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "offload/host_slab.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/status.h"
#include "zero/optimizer_states.h"

namespace zero {

struct ChunkedOptimizerStatesOptions {
  HostSlabOptions slab;                    // pinning, NUMA, the config key errors name
  int64_t chunk_numel = int64_t{1} << 24;  // elements per chunk (>= 1): 192 MiB of staging per set
  int chunk_buffers = 3;                   // staging sets (>= 2)
  // The model dtype: 16-bit keeps the host model copy (above); kF32 keeps none.
  DType model_dtype = DType::kF32;
};

// A chunk queued since the last blocking call: elements [begin, end) of the states.
struct ChunkEvents {
  int64_t begin = 0;
  int64_t end = 0;
  // Recorded on the update stream after the chunk's AdamW (or cast): its model_out elements are
  // written and its gradients read. A stream that waits on it may read those model_out elements.
  Event* updated = nullptr;
  // Recorded after the chunk's host memory is final (its download; for a cast chunk, which
  // writes no host memory, its upload).
  Event* stored = nullptr;
};

class ChunkedOptimizerStates final : public OptimizerStates {
 public:
  // `numel` elements of each state, zero. `stream` (the engine's compute stream) is what Read and
  // Write order against. InvalidArgument for chunk_numel < 1 or chunk_buffers < 2 (naming the
  // config keys); allocation errors name what could not be allocated.
  static Result<std::unique_ptr<ChunkedOptimizerStates>> Create(Device* device, int64_t numel, Stream* stream,
                                                                const ChunkedOptimizerStatesOptions& options);
  ~ChunkedOptimizerStates() override;  // waits for everything queued

  int64_t numel() const override { return numel_; }
  Status Update(int64_t offset, int64_t n, const float* grads, const AdamWParams& h, void* model_out, DType model_t,
                Stream* stream) override;
  Status UpdateFromGradient(int64_t offset, int64_t n, const void* grad, DType grad_t, const AdamWParams& h,
                            Stream* stream) override;
  Status CastMaster(int64_t offset, int64_t n, void* model_out, DType model_t, Stream* stream) override;
  Status CopyToDevice(OptState which, int64_t offset, int64_t n, float* dst, Stream* stream) override;
  Status CopyFromDevice(OptState which, int64_t offset, int64_t n, const float* src, Stream* stream) override;
  Status Read(OptState which, int64_t offset, int64_t n, float* host) override;
  Status Write(OptState which, int64_t offset, int64_t n, const float* host) override;
  OptimizerStateBytes bytes() const override;

  // For overlapping the update with the next forward (offload_optimizer.overlap_step): as Update /
  // CastMaster, but the update stream is ordered after `after` (an event the caller recorded on
  // its stream once the gradients were written and model_out was no longer read; it must stay
  // recorded at that point until every call naming it has returned) instead of after a caller
  // stream, and no stream is made to wait at the end: whoever reads model_out element e waits on
  // Chunk(e)->updated, and the gradients may be rewritten once a stream waits on the `updated`
  // event of every chunk that reads them (or on WaitForUpdates). Consecutive calls keep the
  // pipeline full (nothing orders one call's update after the previous call's download).
  Status UpdateAfter(int64_t offset, int64_t n, const float* grads, const AdamWParams& h, void* model_out,
                     DType model_t, Event* after);
  Status CastMasterAfter(int64_t offset, int64_t n, void* model_out, DType model_t, Event* after);

  // For overlapping the update with later work. `stream` waits (device-side; the host does not
  // block) for every chunk queued so far on the three streams: after it, model_out of every
  // Update/CastMaster is written and the host states are final.
  Status WaitForUpdates(Stream* stream);
  // The latest chunk queued since the last blocking call that covers element `e`, or nullopt
  // when none does (then no work on e is in flight). Waiting on its `updated` event is enough to
  // read e's new model weight; a later chunk over e replaces it.
  std::optional<ChunkEvents> Chunk(int64_t e) const;

  int64_t chunk_numel() const { return chunk_; }
  int chunk_buffers() const { return static_cast<int>(sets_.size()); }
  // Elements CastMaster / CastMasterAfter published from the host model copy since creation (tests).
  int64_t copy_published() const { return copy_published_; }

 private:
  struct Set {
    DeviceBuffer state[3];            // master, exp_avg, exp_avg_sq (chunk_ elements each)
    DeviceBuffer model;               // the new weights in model_dtype_ (with the host copy)
    std::unique_ptr<Event> uploaded;  // upload stream: its states (or masters) landed
    std::unique_ptr<Event> free;      // the last reader/writer of the set is done
  };
  struct Record {
    int64_t end = 0;
    uint64_t seq = 0;           // queue order
    bool host_written = false;  // an update chunk (downloaded), not a cast
    std::shared_ptr<Event> updated, stored;
  };
  enum class Kind { kUpdate, kUpdateFromGradient, kCast };

  ChunkedOptimizerStates(Device* device, Stream* stream, int64_t numel, const ChunkedOptimizerStatesOptions& o);
  Status Init(const ChunkedOptimizerStatesOptions& o);
  // The chunked pipeline of Update / UpdateFromGradient / CastMaster.
  // With `after` (UpdateAfter / CastMasterAfter) `caller` is null: ordered after the event, and no
  // stream waits at the end.
  Status Pipeline(Kind kind, int64_t offset, int64_t n, const void* grads, DType grad_t, const AdamWParams& h,
                  void* model_out, DType model_t, Stream* caller, Event* after = nullptr);
  // `s` waits for `after`, or (after null) for `caller` at this point of its queue.
  Status WaitForCaller(Stream* s, Stream* caller, Event* after);
  // CastMaster from the host model copy: per chunk, host copy -> model_out on the upload stream.
  Status PublishCopy(int64_t offset, int64_t n, void* model_out, Stream* caller, Event* after);
  // The host model copy is current (valid) or stale over [b, e); Current: over all of it.
  void MarkCopy(int64_t b, int64_t e, bool valid);
  bool CopyCurrent(int64_t b, int64_t e) const;
  // The upload stream waits for every download queued to a host range overlapping [b, e).
  Status WaitForHostRange(int64_t b, int64_t e);
  // Records [b, e) as the latest chunk over that range (trimming older records).
  void Note(int64_t b, int64_t e, std::shared_ptr<Event> updated, std::shared_ptr<Event> stored, bool host_written);
  Result<std::shared_ptr<Event>> PooledEvent();
  // Waits for the three streams; the records are dropped.
  Status Drain();
  Status Check(int64_t offset, int64_t n, const char* call) const {
    return CheckStateRange("chunked optimizer states", call, offset, n, numel_);
  }
  float* host(OptState s, int64_t offset) { return state_[static_cast<int>(s)] + offset; }

  Device* device_;
  Stream* stream_;
  int64_t numel_;
  int64_t chunk_;  // staging elements per set: min(chunk_numel, numel)
  HostSlab slab_;
  float* state_[3] = {nullptr, nullptr, nullptr};
  DType model_dtype_ = DType::kF32;
  uint8_t* copy_ = nullptr;                // the host model copy (16-bit model_dtype_), or null
  std::map<int64_t, int64_t> copy_valid_;  // begin -> end: where copy_ is current; disjoint, merged
  int64_t copy_published_ = 0;
  std::unique_ptr<Stream> upload_, update_, download_;
  std::vector<Set> sets_;
  size_t next_set_ = 0;
  std::unique_ptr<Event> entry_;    // the caller's stream at the start of a call
  std::unique_ptr<Event> widened_;  // update stream: the last widening of UpdateFromGradient
  std::unique_ptr<Event> tail_[3];  // WaitForUpdates' marks on the three streams
  DeviceBuffer scratch_;            // the widened gradients of UpdateFromGradient (allocated on first use)
  // Declared before records_: the pooled events' deleters return them here while records_ dies.
  std::vector<std::unique_ptr<Event>> spare_events_;
  std::map<int64_t, Record> records_;  // begin -> the latest chunk over [begin, end); disjoint
  uint64_t seq_ = 0;
};

}  // namespace zero
