// GradientReducer: the bucketed, overlapped reduction of gradients (all stages).
//
// Owns the open bucket (the gradients queued but not yet launched), the buckets in flight and
// their staging buffers. It does not own the gradients it is handed (the caller's buffers, given
// back through each item's release callback once packed) nor what the reduced values are added to
// (the consumer callback does that).
//
// Flow: Add(param, src) queues a gradient in the open bucket; once the bucket holds at least
// `bucket_numel` gradient elements it is launched: its items are sorted by parameter index (every
// rank builds the same layout), packed into a staging buffer on the compute stream
// (gradient_bucket.h: kFull for all-reduce, kShards for reduce-scatter; converted to comm_dtype),
// and one collective is issued with `after` = the compute stream, so backward continues while it
// runs. At most `max_in_flight` buckets are in flight; launching another first completes the
// oldest. Completed buckets are processed strictly in launch order: the compute stream is made to
// wait for the collective (Work::StreamWait), then consumer(param, reduced) is called per item,
// where `reduced` (comm_dtype device memory, valid during the call; enqueue reads on the compute
// stream) holds the item's reduced full gradient (kFull) or this rank's shard of it (kShards).
// overlap = false completes every bucket right after launching it. With one rank no collective
// is issued (the mean over one rank is the value itself, bitwise).
//
// Every rank must Add the same parameters in the same order between the same Flush/Drain calls
// (the collectives are matched by order). After an error the reducer is unusable.
//
// Thread safety: none.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/status.h"
#include "zero/buffer_pool.h"
#include "zero/gradient_bucket.h"

namespace zero {

struct GradientReducerOptions {
  BucketKind kind = BucketKind::kShards;
  DType comm_dtype = DType::kF32;
  ReduceOp op = ReduceOp::kAvg;
  int64_t bucket_numel = 500000000;  // launch once a bucket holds at least this many elements
  bool overlap = true;
  int max_in_flight = 2;
  const char* name = "gradient";  // for error messages: "gradient reduce-scatter ..."
};

class GradientReducer {
 public:
  using Consumer = std::function<Status(int param, const void* reduced)>;
  using ReleaseFn = std::function<Status()>;

  GradientReducer(Device* device, Communicator* comm, Stream* compute,
                  const GradientReducerOptions& options, Consumer consumer);
  ~GradientReducer();

  // Queues `numel` elements of `src_t` at `src` (device memory, written on the compute stream).
  // `src` must stay unmodified until `release` has been called (right after packing, in compute
  // stream order). May launch the open bucket and process completed ones.
  Status Add(int param, const void* src, DType src_t, int64_t numel, ReleaseFn release);
  // Launches the open bucket (if it holds anything).
  Status Flush();
  // Flush, then completes and processes every bucket in flight, in order.
  Status Drain();
  // Processes the buckets that have already completed (never blocks).
  Status Poll();

  bool idle() const { return open_.empty() && in_flight_.empty(); }
  // Device bytes of staging buffers held (in flight and free).
  size_t staging_bytes() const { return staging_.bytes(); }
  // Frees idle staging buffers (all of them when `keep` is 0).
  Status TrimStaging(size_t keep_bytes) { return staging_.Trim(keep_bytes); }
  int64_t buckets_launched() const { return buckets_launched_; }

 private:
  struct Pending {
    int param;
    const void* src;
    DType src_t;
    int64_t numel;
    ReleaseFn release;
  };
  struct InFlight {
    BucketLayout layout;
    DeviceBuffer staging;
    const void* recv = nullptr;
    std::unique_ptr<Work> work;  // null: nothing to wait for (one rank)
  };

  Status Launch();
  Status ProcessOldest();
  Status Fail(Status s);

  Device* device_;
  Communicator* comm_;
  Stream* compute_;
  GradientReducerOptions options_;
  Consumer consumer_;
  BufferPool staging_;
  std::vector<Pending> open_;
  int64_t open_numel_ = 0;
  std::deque<InFlight> in_flight_;
  int64_t buckets_launched_ = 0;
  Status failed_;
};

}  // namespace zero
