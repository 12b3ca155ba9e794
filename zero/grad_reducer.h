// GradientReducer: the overlapped reduction of gradients (all stages), bucketed or per parameter.
//
// Owns the open bucket (the gradients queued but not yet launched), the reductions in flight and
// their staging buffers. It does not own the gradients it is handed (the caller's buffers, given
// back through each item's release callback once the reducer is done reading them) nor the fp32
// gradient partition (zero/grad_partition.h) it delivers the reduced values into: stored
// (ReducedDelivery::kStore, stages 0/1's window sums) or added with the window's first/last flags
// (kAdd, stages 2/3), which a PartitionWindow (zero/grad_window.h) gives.
//
// Two modes (GradientReducerOptions::contiguous, DeepSpeed's zero_optimization.contiguous_gradients):
//
// Contiguous (default). Add(param, src) queues a gradient in the open bucket; once the bucket holds
// at least `bucket_numel` gradient elements it is launched: its items are sorted by parameter index
// (every rank builds the same layout), packed into a staging buffer on the compute stream
// (gradient_bucket.h: kFull for all-reduce, kShards for reduce-scatter; converted to comm_dtype),
// each item is released right after its packing copy, and ONE collective is issued for the bucket
// with `after` = the compute stream, so backward continues while it runs.
//
// Per parameter (contiguous = false). No bucket and no packing copy: every Add issues its own
// collective straight from the caller's buffer, which must already be in the collective's layout:
// kFull: `numel` elements, reduced in place (all-reduce); kShards: PaddedNumel(numel, N) elements
// with zero padding (a padded parameter is its own shard layout: rank r's shard is elements
// [r*shard, (r+1)*shard)), reduce-scattered into `recv` (shard elements, not overlapping the
// source; null: a small staging buffer). The buffer is written by the collective (in-place
// all-reduce) and released only once the reduction has been consumed. When src_t differs from
// comm_dtype a conversion copy into a staging buffer is unavoidable (then the source is released
// right after it).
//   Trade-off: per parameter saves the packing copy (one read and one write of every gradient
//   element) and the staging memory of the buckets (up to max_in_flight buckets of bucket_numel
//   elements, N times that for reduce-scatter's send side); it pays with one collective per
//   parameter instead of per bucket: many more, smaller collectives, each with its own latency
//   (and kernel launches on NCCL), which dominates for models of many small parameters. The
//   gradient buffers stay held until their collective completes (up to max_in_flight of them)
//   instead of being released right after packing.
//
// Reduce-scatter or all-reduce (GradientReducerOptions::scatter, DeepSpeed's reduce_scatter): for
// kShards, scatter = false reduces the whole shard-layout buffer with an in-place AllReduce and the
// partition receives this rank's segment of the result: the same values (every element is summed in rank
// order either way, Gloo), N times the received traffic and no receive area.
//
// In both modes at most `max_in_flight` reductions (buckets, or parameters) are in flight;
// launching another first completes the oldest. Completed reductions are processed strictly in
// launch order: the compute stream is made to wait for the collective (Work::StreamWait), then
// each item's reduced values (comm_dtype device memory: its reduced full gradient for kFull, this
// rank's shard of it for kShards) go into the partition's piece `param`, on the compute stream:
// kStore: GradPartition::Store (nothing to do where the collective wrote the piece itself, the
// `recv` of Add); kAdd: GradPartition::Add with first = window->FirstToPartition(param) and last =
// window->AtBoundary(), asked when the item is processed. overlap = false completes every reduction right
// after launching it. With one rank no collective is issued (the mean over one rank is the value
// itself, bitwise).
//
// Without a plan, every rank must Add the same parameters in the same order between the same
// Flush/Drain calls (the collectives are matched by order). With a plan (SetPlan: the parameters in
// launch order, the same on every rank) the buckets are fixed: bucket k holds the plan's k-th run
// of parameters of at least bucket_numel elements (per parameter: the k-th parameter), bucket k is
// launched once all its parameters were added and buckets 0..k-1 were launched, and Flush launches
// the rest, a parameter that was not added contributing zeros (its piece still receives the
// reduced values of the ranks that did add it). So ranks may add any subset of the plan in any
// order and still reduce the same layout: overlap with backward is best when gradients arrive in
// plan order. After an error the reducer is unusable.
//
// Thread safety: none.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "comm/communicator.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/status.h"
#include "zero/buffer_pool.h"
#include "zero/grad_partition.h"
#include "zero/grad_window.h"
#include "zero/gradient_bucket.h"
#include "zero/trace_observer.h"

namespace zero {

// How a reduced item enters the gradient partition (see above).
enum class ReducedDelivery {
  kStore,  // stages 0/1: the window's fp32 sums, reduced once: piece = reduced (comm_dtype kF32)
  kAdd,    // stages 2/3: every micro step's reduction added to the piece
};

struct GradientReducerOptions {
  BucketKind kind = BucketKind::kShards;
  ReducedDelivery delivery = ReducedDelivery::kAdd;
  DType comm_dtype = DType::kF32;
  ReduceOp op = ReduceOp::kAvg;
  int64_t bucket_numel = 500000000;  // launch once a bucket holds at least this many elements
  bool overlap = true;
  int max_in_flight = 2;
  bool contiguous = true;         // false: no buckets, one collective per Add straight from its buffer
  bool scatter = true;            // kShards: false reduces with AllReduce (this rank keeps its segment)
  const char* name = "gradient";  // for error messages: "gradient reduce-scatter ..."
};

class GradientReducer {
 public:
  using ReleaseFn = std::function<Status()>;

  // `partition` (not owned) receives parameter p's reduced values in its piece p; `window` (not
  // owned) gives kAdd's flags. Both outlive the reducer; either may be null while nothing is added
  // (the engine's update in backward has no partition and never reduces).
  GradientReducer(Device* device, Communicator* comm, Stream* compute, const GradientReducerOptions& options,
                  GradPartition* partition, PartitionWindow* window);
  ~GradientReducer();

  // Queues `numel` elements of `src_t` at `src` (device memory, written on the compute stream).
  // Contiguous: `src` must stay unmodified until `release` has been called (right after packing,
  // in compute stream order); `recv` is ignored. May launch the open bucket.
  // Per parameter: `src` holds the layout described above (kShards: padded, zero padding) and
  // belongs to the reducer (which may overwrite it) until `release` is called (after the reduced
  // values were consumed, in compute stream order). `recv` (kShards with scatter, when src_t ==
  // comm_dtype): where the reduced shard lands, not overlapping `src`; null: a staging buffer.
  // Launches the collective. Either mode may process completed reductions.
  Status Add(int param, void* src, DType src_t, int64_t numel, ReleaseFn release, void* recv = nullptr);
  // Fixes the bucket layout (see above). `order`: every parameter that will be added, each once,
  // in launch order, with its numel (> 0). Call before the first Add.
  void SetPlan(const std::vector<BucketItem>& order);
  // Launches the open bucket (if it holds anything); with a plan, every bucket not yet launched.
  Status Flush();
  // Flush, then completes and processes every bucket in flight, in order.
  Status Drain();
  // Processes the buckets that have already completed (never blocks).
  Status Poll();

  bool idle() const { return open_.empty() && in_flight_.empty() && next_bucket_ == 0; }
  // Device bytes of staging buffers held (in flight and free).
  size_t staging_bytes() const { return staging_.bytes(); }
  // Reductions launched (buckets; parameters in per-parameter mode), with or without a collective.
  int64_t buckets_launched() const { return buckets_launched_; }
  // Collectives issued (none with one rank or for empty buckets).
  int64_t collectives_issued() const { return collectives_issued_; }
  // The per-stream trace's hook (zero/trace_observer.h; null: none): each collective is a span on
  // the communication track from its launch to where the compute stream waits for it.
  void set_observer(StreamObserver* o) { observer_ = o; }

 private:
  struct Pending {
    int param;
    const void* src;  // null: not added (a planned parameter this rank has no gradient for): zeros
    DType src_t;
    int64_t numel;
    ReleaseFn release;
    void* recv = nullptr;  // per parameter
  };
  struct InFlight {
    BucketLayout layout;
    DeviceBuffer staging;
    const void* recv = nullptr;
    std::unique_ptr<Work> work;       // null: nothing to wait for (one rank)
    ReleaseFn release;                // per parameter: gives the source back once consumed
    StreamObserver::SpanId span = 0;  // the collective's trace span
  };

  Status Launch();
  Status LaunchItems(std::vector<Pending> items);
  Status LaunchOne(int param, void* src, DType src_t, int64_t numel, ReleaseFn release, void* recv);
  Status AddPlanned(Pending p);
  Status LaunchPlanned(int bucket);
  Status Issue(InFlight* f, void* send, void* recv);
  Status ProcessOldest();
  Status Deliver(int param, const void* reduced);
  Status Fail(Status s);

  Device* device_;
  Communicator* comm_;
  Stream* compute_;
  GradientReducerOptions options_;
  GradPartition* partition_;
  PartitionWindow* window_;
  BufferPool staging_;
  std::vector<Pending> open_;
  int64_t open_numel_ = 0;
  // The plan (empty: none): buckets of parameters, each parameter's bucket, what was added.
  std::vector<std::vector<BucketItem>> plan_;
  std::vector<int> bucket_of_;                // by parameter index; -1: not in the plan
  std::vector<std::optional<Pending>> slot_;  // by parameter index: added since the last launch
  std::vector<int> added_;                    // per bucket
  int next_bucket_ = 0;
  std::deque<InFlight> in_flight_;
  int64_t buckets_launched_ = 0;
  int64_t collectives_issued_ = 0;
  Status failed_;
  StreamObserver* observer_ = nullptr;
};

}  // namespace zero
