// BucketedAllGather: stages 1/2's all-gather of the updated model-dtype parameters, in buckets of
// up to `bucket_numel` gathered elements (DeepSpeed's zero_optimization.allgather_bucket_size).
//
// Stages 1/2 keep every parameter in full on every rank (model dtype, padded to n_pad = N*shard),
// and after the optimizer step each rank holds the new values of its own shard only. Run() gives
// every rank the new full parameters:
//
//   - The parameters, in the order given (the same on every rank), are grouped greedily into
//     buckets of at most bucket_numel gathered elements (N * the sum of their shards); a parameter
//     larger than that is a bucket of its own (parameters are never split).
//   - A bucket of several parameters p1..pk uses one buffer of N*S elements, S = sum of shard_j.
//     fill(pj, dst) writes this rank's shard of pj (e.g. the fp32 master shard cast to the model
//     dtype) into this rank's segment of the buffer, at offset sum_{l<j} shard_l:
//         [ rank 0's shards of p1..pk | rank 1's shards of p1..pk | ... ]   (segments of S)
//     ONE in-place AllGather of the segment fills the whole buffer, and each rank's shard of each
//     parameter is copied to its place [r*shard_j, (r+1)*shard_j) of the full parameter (the
//     unpack; padding travels as the zeros it is).
//   - A bucket of one parameter needs no buffer: fill writes the shard straight into its place in
//     the full parameter and the AllGather runs in place there (what stages 1/2 did for every
//     parameter before buckets).
//   - With one rank nothing is gathered: fill writes straight into the full parameter (the one
//     shard is the whole padded parameter).
//
// Values are only moved, never combined, so the result is bitwise the same whatever the bucket
// size. Fewer, larger collectives amortize each collective's latency; the price is the unpack
// copies and up to max_in_flight bucket buffers of device memory (bounded by bucket_numel).
//
// Ordering: fills, unpack copies and the AllGathers go through the compute stream (gathers are
// issued with `after` = compute; the compute stream waits for each with Work::StreamWait before
// its unpack), so there is no host wait on CUDA. Up to max_in_flight buckets are in flight:
// launching another first completes the oldest (wait + unpack), whose buffer is then reused in
// stream order. Run() returns with every gather complete in compute-stream order.
//
// Collective: every rank must call Run with the same items in the same order. Thread safety: none.
#pragma once

#include <cstddef>
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

namespace zero {

struct AllGatherItem {
  int param = -1;        // passed back to fill (and named in errors)
  void* full = nullptr;  // the full padded parameter: N * shard elements of the gather dtype
  int64_t shard = 0;     // elements of one rank's shard
};

struct BucketedAllGatherOptions {
  DType dtype = DType::kF32;
  int64_t bucket_numel = 500000000;  // gathered elements per bucket (N * sum of shards), >= 1
  int max_in_flight = 2;
  // Free bucket buffers kept for reuse (beyond that they are freed after their last use).
  size_t pool_free_bytes = ~size_t{0};
};

class BucketedAllGather {
 public:
  // Writes this rank's shard of `param` (shard elements of the dtype) at `dst`, on the compute
  // stream.
  using FillFn = std::function<Status(int param, void* dst)>;

  BucketedAllGather(Device* device, Communicator* comm, Stream* compute, const BucketedAllGatherOptions& options);
  ~BucketedAllGather();
  BucketedAllGather(const BucketedAllGather&) = delete;
  BucketedAllGather& operator=(const BucketedAllGather&) = delete;

  // Gathers every item (collective). Items with shard 0 are skipped. On error, the gathers in
  // flight are waited for before returning.
  Status Run(const std::vector<AllGatherItem>& items, const FillFn& fill);

  // The buckets Run would form for these shard sizes: [begin, end) index ranges.
  static std::vector<std::pair<size_t, size_t>> Plan(const std::vector<int64_t>& shards, int world_size,
                                                     int64_t bucket_numel);

  int64_t collectives_issued() const { return collectives_issued_; }
  // Device bytes of bucket buffers held (free ones kept for reuse).
  size_t staging_bytes() const { return pool_.bytes(); }

 private:
  struct Flight {
    std::vector<AllGatherItem> items;
    std::vector<int64_t> offset;  // of item j in a segment
    int64_t segment = 0;
    DeviceBuffer buffer;         // empty: in place (one item, or one rank)
    std::unique_ptr<Work> work;  // null: nothing to wait for
  };
  Status Launch(std::vector<AllGatherItem> items, int64_t buffer_numel, const FillFn& fill,
                std::deque<Flight>* flights);
  Status Complete(Flight* f);

  Device* device_;
  Communicator* comm_;
  Stream* compute_;
  BucketedAllGatherOptions options_;
  BufferPool pool_;
  int64_t collectives_issued_ = 0;
};

}  // namespace zero
