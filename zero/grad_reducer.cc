#include "zero/grad_reducer.h"

#include <algorithm>
#include <string>
#include <utility>

namespace zero {

GradientReducer::GradientReducer(Device* device, Communicator* comm, Stream* compute,
                                 const GradientReducerOptions& options, GradPartition* partition,
                                 PartitionWindow* window)
    : device_(device),
      comm_(comm),
      compute_(compute),
      options_(options),
      partition_(partition),
      window_(window),
      // Keeps up to max_in_flight idle staging buffers for reuse.
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

void GradientReducer::SetPlan(const std::vector<BucketItem>& order) {
  ZERO_CHECK(idle() && plan_.empty());
  int max_param = -1;
  for (const BucketItem& it : order) max_param = std::max(max_param, it.param);
  bucket_of_.assign(static_cast<size_t>(max_param + 1), -1);
  slot_.assign(static_cast<size_t>(max_param + 1), std::nullopt);
  int64_t numel = 0;
  for (const BucketItem& it : order) {
    ZERO_CHECK(it.param >= 0 && it.numel > 0 && bucket_of_[it.param] == -1);
    if (plan_.empty() || !options_.contiguous || numel >= options_.bucket_numel) {
      plan_.emplace_back();
      numel = 0;
    }
    plan_.back().push_back(it);
    numel += it.numel;
    bucket_of_[it.param] = static_cast<int>(plan_.size()) - 1;
  }
  added_.assign(plan_.size(), 0);
}

Status GradientReducer::AddPlanned(Pending p) {
  const int b = p.param < static_cast<int>(bucket_of_.size()) ? bucket_of_[p.param] : -1;
  if (b < 0) {
    return Fail(InternalError(std::string(options_.name) + " reduction: parameter " + std::to_string(p.param) +
                              " is not in the reduction plan"));
  }
  if (b < next_bucket_ || slot_[p.param].has_value()) {
    return Fail(InternalError(std::string(options_.name) + " reduction: parameter " + std::to_string(p.param) +
                              " added twice before its bucket was reduced"));
  }
  slot_[p.param] = std::move(p);
  ++added_[b];
  while (next_bucket_ < static_cast<int>(plan_.size()) &&
         added_[next_bucket_] == static_cast<int>(plan_[next_bucket_].size())) {
    ZERO_RETURN_IF_ERROR(LaunchPlanned(next_bucket_++));
  }
  return OkStatus();
}

Status GradientReducer::LaunchPlanned(int bucket) {
  std::vector<Pending> items;
  for (const BucketItem& it : plan_[bucket]) {
    std::optional<Pending>& slot = slot_[it.param];
    if (slot.has_value()) {
      items.push_back(std::move(*slot));
      slot.reset();
    } else {
      items.push_back(Pending{it.param, nullptr, options_.comm_dtype, it.numel, nullptr});
    }
  }
  added_[bucket] = 0;
  if (!options_.contiguous) {
    Pending& p = items.front();
    return LaunchOne(p.param, const_cast<void*>(p.src), p.src_t, p.numel, std::move(p.release), p.recv);
  }
  return LaunchItems(std::move(items));
}

Status GradientReducer::Add(int param, void* src, DType src_t, int64_t numel, ReleaseFn release, void* recv) {
  if (!failed_.ok()) return failed_;
  if (!plan_.empty()) {
    ZERO_RETURN_IF_ERROR(AddPlanned(Pending{param, src, src_t, numel, std::move(release), recv}));
    return Poll();
  }
  if (!options_.contiguous) {
    ZERO_RETURN_IF_ERROR(LaunchOne(param, src, src_t, numel, std::move(release), recv));
    return Poll();
  }
  open_.push_back(Pending{param, src, src_t, numel, std::move(release)});
  open_numel_ += numel;
  if (open_numel_ >= options_.bucket_numel) ZERO_RETURN_IF_ERROR(Launch());
  return Poll();
}

Status GradientReducer::Flush() {
  if (!failed_.ok()) return failed_;
  if (!plan_.empty()) {
    while (next_bucket_ < static_cast<int>(plan_.size())) ZERO_RETURN_IF_ERROR(LaunchPlanned(next_bucket_++));
    next_bucket_ = 0;
    return OkStatus();
  }
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
  while (!in_flight_.empty() && (in_flight_.front().work == nullptr || in_flight_.front().work->IsCompleted())) {
    ZERO_RETURN_IF_ERROR(ProcessOldest());
  }
  return OkStatus();
}

Status GradientReducer::Launch() {
  std::vector<Pending> items = std::move(open_);
  open_.clear();
  open_numel_ = 0;
  return LaunchItems(std::move(items));
}

Status GradientReducer::LaunchItems(std::vector<Pending> items) {
  while (static_cast<int>(in_flight_.size()) >= options_.max_in_flight) {
    ZERO_RETURN_IF_ERROR(ProcessOldest());
  }
  std::stable_sort(items.begin(), items.end(), [](const Pending& a, const Pending& b) { return a.param < b.param; });
  std::vector<BucketItem> layout_items;
  layout_items.reserve(items.size());
  for (const Pending& p : items) layout_items.push_back(BucketItem{p.param, p.numel});

  const int world = comm_->world_size();
  InFlight f;
  f.layout = BucketLayout(options_.kind, world, std::move(layout_items));
  const DType t = options_.comm_dtype;
  const bool recv_area =
      options_.kind == BucketKind::kShards && options_.scatter && world > 1 && f.layout.segment() > 0;
  const int64_t staging_numel = f.layout.send_numel() + (recv_area ? f.layout.recv_numel() : 0);
  if (staging_numel > 0) {
    auto staging = staging_.AcquireAtLeast(static_cast<size_t>(staging_numel) * SizeOf(t),
                                           "allocating a gradient bucket's staging buffer");
    if (!staging.ok()) return Fail(staging.status());
    f.staging = std::move(staging).value();
  }
  void* send = f.staging.data();
  const bool missing = std::any_of(items.begin(), items.end(), [](const Pending& p) { return p.src == nullptr; });
  if (missing && f.layout.send_numel() > 0) {
    // Planned parameters this rank has no gradient for contribute zeros.
    Status s = device_->Fill(send, t, static_cast<size_t>(f.layout.send_numel()), 0.0f, compute_);
    if (!s.ok()) return Fail(s.WithContext("zero-filling a gradient bucket"));
  }
  for (int j = 0; j < f.layout.size(); ++j) {
    if (items[j].src == nullptr) continue;
    Status s = PackBucketItem(device_, compute_, f.layout, j, items[j].src, items[j].src_t, send, t);
    if (!s.ok()) return Fail(s.WithContext("packing gradient bucket"));
  }
  for (Pending& p : items) {
    if (p.release) {
      Status s = p.release();
      if (!s.ok()) return Fail(s);
    }
  }
  ZERO_RETURN_IF_ERROR(Issue(&f, send, recv_area ? ElementPtr(send, t, f.layout.send_numel()) : nullptr));
  ++buckets_launched_;
  in_flight_.push_back(std::move(f));
  if (!options_.overlap) return ProcessOldest();
  return OkStatus();
}

Status GradientReducer::LaunchOne(int param, void* src, DType src_t, int64_t numel, ReleaseFn release, void* recv) {
  while (static_cast<int>(in_flight_.size()) >= options_.max_in_flight) {
    ZERO_RETURN_IF_ERROR(ProcessOldest());
  }
  const int world = comm_->world_size();
  InFlight f;
  f.layout = BucketLayout(options_.kind, world, {BucketItem{param, numel}});
  const DType t = options_.comm_dtype;
  const int64_t send_numel = f.layout.send_numel();
  const bool recv_area =
      options_.kind == BucketKind::kShards && options_.scatter && world > 1 && f.layout.segment() > 0;
  void* send = src;
  if (src == nullptr || src_t != t) {
    // The collective runs in comm_dtype: one conversion copy (padding converts to zero); a planned
    // parameter this rank has no gradient for (src null) contributes zeros.
    const int64_t staging_numel = send_numel + (recv_area ? f.layout.recv_numel() : 0);
    if (staging_numel > 0) {
      auto staging = staging_.AcquireAtLeast(static_cast<size_t>(staging_numel) * SizeOf(t),
                                             "allocating a gradient conversion buffer");
      if (!staging.ok()) return Fail(staging.status());
      f.staging = std::move(staging).value();
      send = f.staging.data();
      Status s = src == nullptr ? device_->Fill(send, t, static_cast<size_t>(send_numel), 0.0f, compute_)
                                : device_->Cast(src, src_t, send, t, static_cast<size_t>(send_numel), compute_);
      if (!s.ok()) return Fail(s.WithContext("converting the gradient of parameter " + std::to_string(param)));
    }
    if (release) {
      Status s = release();
      if (!s.ok()) return Fail(s);
    }
    recv = recv_area ? ElementPtr(send, t, send_numel) : nullptr;
  } else {
    f.release = std::move(release);
    if (recv_area && recv == nullptr) {
      auto staging = staging_.AcquireAtLeast(static_cast<size_t>(f.layout.recv_numel()) * SizeOf(t),
                                             "allocating a gradient receive buffer");
      if (!staging.ok()) return Fail(staging.status());
      f.staging = std::move(staging).value();
      recv = f.staging.data();
    }
  }
  ZERO_RETURN_IF_ERROR(Issue(&f, send, recv_area ? recv : nullptr));
  ++buckets_launched_;
  in_flight_.push_back(std::move(f));
  if (!options_.overlap) return ProcessOldest();
  return OkStatus();
}

// Issues f's collective on `send` (f->layout.send_numel() elements of comm_dtype): kFull:
// all-reduce in place; kShards: reduce-scatter into `recv`, or (scatter = false) all-reduce in
// place and keep this rank's segment. Sets f->recv and f->work.
Status GradientReducer::Issue(InFlight* f, void* send, void* recv) {
  const int world = comm_->world_size();
  const DType t = options_.comm_dtype;
  const size_t segment = static_cast<size_t>(f->layout.segment());
  auto what = [&](const char* collective) {
    std::string w = std::string(options_.name) + " " + collective;
    if (options_.contiguous) return w + " bucket";
    return w + " of parameter " + std::to_string(f->layout.items().front().param);
  };
  if (world == 1 || segment == 0) {
    f->recv = send;  // the mean (or sum) over one rank is the value itself
    return OkStatus();
  }
  f->span =
      TraceBegin(observer_, TraceTrack::kCommunication,
                 options_.scatter && options_.kind != BucketKind::kFull ? "reduce-scatter" : "all-reduce", compute_);
  if (options_.kind == BucketKind::kFull) {
    auto work = comm_->AllReduce(send, segment, t, options_.op, compute_);
    if (!work.ok()) return Fail(work.status().WithContext(what("all-reduce")));
    f->work = std::move(work).value();
    f->recv = send;
  } else if (!options_.scatter) {
    auto work = comm_->AllReduce(send, static_cast<size_t>(f->layout.send_numel()), t, options_.op, compute_);
    if (!work.ok()) return Fail(work.status().WithContext(what("all-reduce (reduce_scatter off)")));
    f->work = std::move(work).value();
    f->recv = ElementPtr(send, t, static_cast<int64_t>(comm_->rank()) * f->layout.segment());
  } else {
    ZERO_CHECK(recv != nullptr);
    auto work = comm_->ReduceScatter(send, recv, segment, t, options_.op, compute_);
    if (!work.ok()) return Fail(work.status().WithContext(what("reduce-scatter")));
    f->work = std::move(work).value();
    f->recv = recv;
  }
  ++collectives_issued_;
  return OkStatus();
}

Status GradientReducer::ProcessOldest() {
  if (!failed_.ok()) return failed_;
  InFlight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  if (f.work != nullptr) {
    Status s = f.work->StreamWait(compute_);
    if (!s.ok()) {
      return Fail(
          s.WithContext(std::string(options_.name) + " reduction of " +
                        (options_.contiguous ? "bucket with parameters " : "parameter ") +
                        std::to_string(f.layout.items().front().param) +
                        (options_.contiguous ? ".." + std::to_string(f.layout.items().back().param) : std::string())));
    }
    TraceEnd(observer_, f.span, compute_);
  }
  for (int j = 0; j < f.layout.size(); ++j) {
    Status s = Deliver(f.layout.items()[j].param, ElementPtr(f.recv, options_.comm_dtype, f.layout.item_offset(j)));
    if (!s.ok()) return Fail(s);
  }
  if (f.release) {
    Status s = f.release();
    if (!s.ok()) return Fail(s);
  }
  return staging_.Release(std::move(f.staging), compute_);
}

// Where the reduction was scattered straight into the piece (recv), Store is a no-op.
Status GradientReducer::Deliver(int param, const void* reduced) {
  if (options_.delivery == ReducedDelivery::kStore) {
    return partition_->Store(param, static_cast<const float*>(reduced));
  }
  const bool first = window_->FirstToPartition(param);
  return partition_->Add(param, reduced, options_.comm_dtype, first, /*last=*/window_->AtBoundary());
}

}  // namespace zero
