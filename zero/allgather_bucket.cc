#include "zero/allgather_bucket.h"

#include <algorithm>
#include <string>
#include <utility>

#include "zero/gradient_bucket.h"

namespace zero {

BucketedAllGather::BucketedAllGather(Device* device, Communicator* comm, Stream* compute,
                                     const BucketedAllGatherOptions& options)
    : device_(device), comm_(comm), compute_(compute), options_(options), pool_(device, options.pool_free_bytes) {
  ZERO_CHECK(options_.bucket_numel >= 1);
  ZERO_CHECK(options_.max_in_flight >= 1);
}

BucketedAllGather::~BucketedAllGather() = default;

std::vector<std::pair<size_t, size_t>> BucketedAllGather::Plan(const std::vector<int64_t>& shards, int world_size,
                                                               int64_t bucket_numel) {
  std::vector<std::pair<size_t, size_t>> out;
  size_t begin = 0;
  while (begin < shards.size()) {
    size_t end = begin;
    int64_t segment = 0;
    while (end < shards.size()) {
      // Gathered elements if shards[end] joined: N * (segment + shard). The first item always joins.
      if (end > begin && static_cast<int64_t>(world_size) * (segment + shards[end]) > bucket_numel) break;
      segment += shards[end];
      ++end;
    }
    out.emplace_back(begin, end);
    begin = end;
  }
  return out;
}

Status BucketedAllGather::Run(const std::vector<AllGatherItem>& all_items, const FillFn& fill) {
  const int world = comm_->world_size();
  std::vector<AllGatherItem> items;
  items.reserve(all_items.size());
  for (const AllGatherItem& it : all_items) {
    if (it.shard > 0) items.push_back(it);
  }
  if (world == 1) {
    // One shard is the whole padded parameter: nothing to gather.
    for (const AllGatherItem& it : items) ZERO_RETURN_IF_ERROR(fill(it.param, it.full));
    return OkStatus();
  }
  std::vector<int64_t> shards;
  shards.reserve(items.size());
  for (const AllGatherItem& it : items) shards.push_back(it.shard);
  const auto plan = Plan(shards, world, options_.bucket_numel);
  // Every bucket buffer of this run has the size of the largest, so the pool reuses them.
  int64_t buffer_numel = 0;
  for (const auto& [b, e] : plan) {
    if (e - b < 2) continue;
    int64_t segment = 0;
    for (size_t k = b; k < e; ++k) segment += shards[k];
    buffer_numel = std::max(buffer_numel, segment * world);
  }
  std::deque<Flight> flights;
  Status s = [&]() -> Status {
    for (const auto& [b, e] : plan) {
      while (static_cast<int>(flights.size()) >= options_.max_in_flight) {
        ZERO_RETURN_IF_ERROR(Complete(&flights.front()));
        flights.pop_front();
      }
      std::vector<AllGatherItem> bucket(items.begin() + static_cast<std::ptrdiff_t>(b),
                                        items.begin() + static_cast<std::ptrdiff_t>(e));
      ZERO_RETURN_IF_ERROR(Launch(std::move(bucket), buffer_numel, fill, &flights));
    }
    while (!flights.empty()) {
      ZERO_RETURN_IF_ERROR(Complete(&flights.front()));
      flights.pop_front();
    }
    return OkStatus();
  }();
  if (!s.ok()) {
    // The buffers of gathers still in flight must not be freed under the collective.
    for (Flight& f : flights) {
      if (f.work != nullptr) f.work->Wait().IgnoreError();
    }
  }
  return s;
}

Status BucketedAllGather::Launch(std::vector<AllGatherItem> items, int64_t buffer_numel, const FillFn& fill,
                                 std::deque<Flight>* flights) {
  const int rank = comm_->rank();
  const DType t = options_.dtype;
  Flight f;
  f.items = std::move(items);
  for (const AllGatherItem& it : f.items) {
    f.offset.push_back(f.segment);
    f.segment += it.shard;
  }
  const std::string what = "all-gather of updated parameters " + std::to_string(f.items.front().param) +
                           (f.items.size() > 1 ? ".." + std::to_string(f.items.back().param) : "");
  if (f.items.size() == 1) {
    // In place in the full parameter: no buffer, no unpack.
    const AllGatherItem& it = f.items.front();
    void* mine = ElementPtr(it.full, t, static_cast<int64_t>(rank) * it.shard);
    ZERO_RETURN_IF_ERROR(fill(it.param, mine));
    auto work = comm_->AllGather(mine, it.full, static_cast<size_t>(it.shard), t, compute_);
    if (!work.ok()) return work.status().WithContext(what);
    f.work = std::move(work).value();
  } else {
    auto buffer =
        pool_.AcquireAtLeast(static_cast<size_t>(buffer_numel) * SizeOf(t), "allocating an all-gather bucket buffer");
    if (!buffer.ok()) return buffer.status().WithContext(what);
    f.buffer = std::move(buffer).value();
    void* mine = ElementPtr(f.buffer.data(), t, static_cast<int64_t>(rank) * f.segment);
    for (size_t j = 0; j < f.items.size(); ++j) {
      ZERO_RETURN_IF_ERROR(fill(f.items[j].param, ElementPtr(mine, t, f.offset[j])));
    }
    auto work = comm_->AllGather(mine, f.buffer.data(), static_cast<size_t>(f.segment), t, compute_);
    if (!work.ok()) {
      // Nothing in flight reads the buffer: give it back (stream order covers the fills).
      pool_.Release(std::move(f.buffer), compute_).IgnoreError();
      return work.status().WithContext(what);
    }
    f.work = std::move(work).value();
  }
  ++collectives_issued_;
  flights->push_back(std::move(f));
  return OkStatus();
}

Status BucketedAllGather::Complete(Flight* f) {
  const std::string what = "all-gather of updated parameters " + std::to_string(f->items.front().param) +
                           (f->items.size() > 1 ? ".." + std::to_string(f->items.back().param) : "");
  if (f->work != nullptr) {
    ZERO_RETURN_IF_ERROR(f->work->StreamWait(compute_).WithContext(what));
    f->work.reset();
  }
  if (f->buffer.empty()) return OkStatus();
  // Unpack: rank r's shard of item j, from segment r of the buffer to its place in the parameter.
  const DType t = options_.dtype;
  const int world = comm_->world_size();
  for (int r = 0; r < world; ++r) {
    for (size_t j = 0; j < f->items.size(); ++j) {
      const AllGatherItem& it = f->items[j];
      ZERO_RETURN_IF_ERROR(
          device_
              ->Copy(ElementPtr(it.full, t, static_cast<int64_t>(r) * it.shard),
                     ElementPtr(f->buffer.data(), t, static_cast<int64_t>(r) * f->segment + f->offset[j]),
                     static_cast<size_t>(it.shard) * SizeOf(t), CopyKind::kDeviceToDevice, compute_)
              .WithContext(what + ": unpacking"));
    }
  }
  return pool_.Release(std::move(f->buffer), compute_);
}

}  // namespace zero
