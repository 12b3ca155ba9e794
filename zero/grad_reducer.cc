#include "zero/grad_reducer.h"

#include <algorithm>
#include <string>
#include <utility>

namespace zero {

GradientReducer::GradientReducer(Device* device, Communicator* comm, Stream* compute,
                                 const GradientReducerOptions& options, Consumer consumer)
    : device_(device),
      comm_(comm),
      compute_(compute),
      options_(options),
      consumer_(std::move(consumer)),
      // Keeps up to max_in_flight idle staging buffers for reuse; TrimStaging frees them.
      staging_(device, ~size_t{0}) {
  ZERO_CHECK(options_.max_in_flight >= 1);
}

GradientReducer::~GradientReducer() {
  // Buffers of buckets still in flight must not be freed under the collective.
  for (InFlight& f : in_flight_) {
    if (f.work != nullptr) f.work->Wait().IgnoreError();
  }
}

Status GradientReducer::Fail(Status s) {
  if (failed_.ok()) failed_ = s;
  return s;
}

Status GradientReducer::Add(int param, const void* src, DType src_t, int64_t numel,
                            ReleaseFn release) {
  if (!failed_.ok()) return failed_;
  open_.push_back(Pending{param, src, src_t, numel, std::move(release)});
  open_numel_ += numel;
  if (open_numel_ >= options_.bucket_numel) ZERO_RETURN_IF_ERROR(Launch());
  return Poll();
}

Status GradientReducer::Flush() {
  if (!failed_.ok()) return failed_;
  if (open_.empty()) return OkStatus();
  return Launch();
}

Status GradientReducer::Drain() {
  ZERO_RETURN_IF_ERROR(Flush());
  while (!in_flight_.empty()) ZERO_RETURN_IF_ERROR(ProcessOldest());
  return OkStatus();
}

Status GradientReducer::Poll() {
  if (!failed_.ok()) return failed_;
  while (!in_flight_.empty() &&
         (in_flight_.front().work == nullptr || in_flight_.front().work->IsCompleted())) {
    ZERO_RETURN_IF_ERROR(ProcessOldest());
  }
  return OkStatus();
}

Status GradientReducer::Launch() {
  while (static_cast<int>(in_flight_.size()) >= options_.max_in_flight) {
    ZERO_RETURN_IF_ERROR(ProcessOldest());
  }
  std::vector<Pending> items = std::move(open_);
  open_.clear();
  open_numel_ = 0;
  std::stable_sort(items.begin(), items.end(),
                   [](const Pending& a, const Pending& b) { return a.param < b.param; });
  std::vector<BucketItem> layout_items;
  layout_items.reserve(items.size());
  for (const Pending& p : items) layout_items.push_back(BucketItem{p.param, p.numel});

  const int world = comm_->world_size();
  InFlight f;
  f.layout = BucketLayout(options_.kind, world, std::move(layout_items));
  const DType t = options_.comm_dtype;
  const bool scatter = options_.kind == BucketKind::kShards && world > 1;
  const int64_t staging_numel = f.layout.send_numel() + (scatter ? f.layout.recv_numel() : 0);
  if (staging_numel > 0) {
    auto staging = staging_.AcquireAtLeast(static_cast<size_t>(staging_numel) * SizeOf(t),
                                    "allocating a gradient bucket's staging buffer");
    if (!staging.ok()) return Fail(staging.status());
    f.staging = std::move(staging).value();
  }
  void* send = f.staging.data();
  for (int j = 0; j < f.layout.size(); ++j) {
    Status s = PackBucketItem(device_, compute_, f.layout, j, items[j].src, items[j].src_t, send, t);
    if (!s.ok()) return Fail(s.WithContext("packing gradient bucket"));
  }
  for (Pending& p : items) {
    if (p.release) {
      Status s = p.release();
      if (!s.ok()) return Fail(s);
    }
  }
  const size_t segment = static_cast<size_t>(f.layout.segment());
  if (world == 1 || segment == 0) {
    f.recv = send;  // the mean (or sum) over one rank is the value itself
  } else if (options_.kind == BucketKind::kFull) {
    auto work = comm_->AllReduce(send, segment, t, options_.op, compute_);
    if (!work.ok()) {
      return Fail(work.status().WithContext(std::string(options_.name) + " all-reduce bucket"));
    }
    f.work = std::move(work).value();
    f.recv = send;
  } else {
    void* recv = ElementPtr(send, t, f.layout.send_numel());
    auto work = comm_->ReduceScatter(send, recv, segment, t, options_.op, compute_);
    if (!work.ok()) {
      return Fail(work.status().WithContext(std::string(options_.name) + " reduce-scatter bucket"));
    }
    f.work = std::move(work).value();
    f.recv = recv;
  }
  ++buckets_launched_;
  in_flight_.push_back(std::move(f));
  if (!options_.overlap) return ProcessOldest();
  return OkStatus();
}

Status GradientReducer::ProcessOldest() {
  if (!failed_.ok()) return failed_;
  InFlight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  if (f.work != nullptr) {
    Status s = f.work->StreamWait(compute_);
    if (!s.ok()) {
      return Fail(s.WithContext(std::string(options_.name) + " reduction of bucket with parameters " +
                                std::to_string(f.layout.items().front().param) + ".." +
                                std::to_string(f.layout.items().back().param)));
    }
  }
  for (int j = 0; j < f.layout.size(); ++j) {
    Status s = consumer_(f.layout.items()[j].param,
                         ElementPtr(f.recv, options_.comm_dtype, f.layout.item_offset(j)));
    if (!s.ok()) return Fail(s);
  }
  return staging_.Release(std::move(f.staging), compute_);
}

}  // namespace zero
