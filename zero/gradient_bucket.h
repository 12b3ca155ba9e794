// GradientBucket layout: where each parameter's gradient goes in one reduction bucket's send and
// receive buffers, and the copies that pack it there. Owns no memory and issues no communication
// (grad_reducer.h does); the packing copies are enqueued on a Device stream.
//
// Two kinds of bucket:
//   kFull (stage 0, all-reduce): the items' full gradients back to back, [g1 | g2 | ... | gk];
//     the all-reduce runs in place and every rank receives every item's full mean.
//   kShards (stages 1-3, reduce-scatter): shard layout. Each item's gradient is padded to
//     n_pad = ceil(n/N)*N and split into its N shards (zero/partition.h); the send buffer is
//       [rank 0's shards of p1..pk | rank 1's shards of p1..pk | ... | rank N-1's shards of p1..pk]
//     (segment r holds, for each item in order, elements [r*shard_j, (r+1)*shard_j) of item j,
//     padding zero), so ONE equal-share ReduceScatter with recv_count = segment gives rank r the
//     reduced segment r: its own shard of every item, at item_offset(j) in the receive buffer.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/status.h"

namespace zero {

enum class BucketKind { kFull, kShards };

struct BucketItem {
  int param = -1;
  int64_t numel = 0;
};

class BucketLayout {
 public:
  BucketLayout() = default;
  // `items` in layout order. REQUIRES: world_size >= 1, numel >= 0.
  BucketLayout(BucketKind kind, int world_size, std::vector<BucketItem> items);

  BucketKind kind() const { return kind_; }
  int world_size() const { return world_size_; }
  const std::vector<BucketItem>& items() const { return items_; }
  int size() const { return static_cast<int>(items_.size()); }

  // Elements of one rank's segment: kFull: sum of numel; kShards: sum of shard sizes.
  int64_t segment() const { return segment_; }
  // Elements of the send buffer: kFull: segment(); kShards: N * segment().
  int64_t send_numel() const;
  // Elements of the receive buffer: kFull: segment() (the send buffer, in place); kShards:
  // segment().
  int64_t recv_numel() const { return segment_; }
  // Offset of item j inside a segment (and in the receive buffer).
  int64_t item_offset(int j) const { return offset_[j]; }
  // kShards: shard size of item j; kFull: its numel.
  int64_t item_extent(int j) const { return extent_[j]; }
  // Where rank r's piece of item j starts in the send buffer.
  int64_t send_offset(int j, int r) const;

 private:
  BucketKind kind_ = BucketKind::kFull;
  int world_size_ = 1;
  std::vector<BucketItem> items_;
  std::vector<int64_t> offset_;
  std::vector<int64_t> extent_;
  int64_t segment_ = 0;
};

// Enqueues on `stream` the copies (Cast when src_t != send_t) that put item j's gradient (numel
// elements of src_t at `src`, device memory) into its places in `send` (send_t), and zero-fills
// its padding. `send` holds layout.send_numel() elements.
Status PackBucketItem(Device* device, Stream* stream, const BucketLayout& layout, int j, const void* src, DType src_t,
                      void* send, DType send_t);

}  // namespace zero
