#include "zero/gradient_bucket.h"

#include <utility>

#include "zero/partition.h"

namespace zero {

BucketLayout::BucketLayout(BucketKind kind, int world_size, std::vector<BucketItem> items)
    : kind_(kind), world_size_(world_size), items_(std::move(items)) {
  ZERO_CHECK(world_size >= 1);
  offset_.reserve(items_.size());
  extent_.reserve(items_.size());
  for (const BucketItem& item : items_) {
    const int64_t extent = kind_ == BucketKind::kFull ? item.numel : ShardNumel(item.numel, world_size_);
    offset_.push_back(segment_);
    extent_.push_back(extent);
    segment_ += extent;
  }
}

int64_t BucketLayout::send_numel() const { return kind_ == BucketKind::kFull ? segment_ : segment_ * world_size_; }

int64_t BucketLayout::send_offset(int j, int r) const {
  if (kind_ == BucketKind::kFull) return offset_[j];
  return static_cast<int64_t>(r) * segment_ + offset_[j];
}

namespace {

Status CopyOrCast(Device* device, Stream* stream, const void* src, DType src_t, void* dst, DType dst_t, int64_t n) {
  if (n <= 0) return OkStatus();
  if (src_t == dst_t) {
    return device->Copy(dst, src, static_cast<size_t>(n) * SizeOf(src_t), CopyKind::kDeviceToDevice, stream);
  }
  return device->Cast(src, src_t, dst, dst_t, static_cast<size_t>(n), stream);
}

}  // namespace

Status PackBucketItem(Device* device, Stream* stream, const BucketLayout& layout, int j, const void* src, DType src_t,
                      void* send, DType send_t) {
  const BucketItem& item = layout.items()[j];
  if (layout.kind() == BucketKind::kFull) {
    return CopyOrCast(device, stream, src, src_t, ElementPtr(send, send_t, layout.send_offset(j, 0)), send_t,
                      item.numel);
  }
  const int n_ranks = layout.world_size();
  const int64_t shard = layout.item_extent(j);
  for (int r = 0; r < n_ranks; ++r) {
    const int64_t valid = ShardValidNumel(item.numel, n_ranks, r);
    void* dst = ElementPtr(send, send_t, layout.send_offset(j, r));
    ZERO_RETURN_IF_ERROR(CopyOrCast(device, stream, ElementPtr(src, src_t, r * shard), src_t, dst, send_t, valid));
    if (valid < shard) {
      ZERO_RETURN_IF_ERROR(
          device->Fill(ElementPtr(dst, send_t, valid), send_t, static_cast<size_t>(shard - valid), 0.0f, stream));
    }
  }
  return OkStatus();
}

}  // namespace zero
