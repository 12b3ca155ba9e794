#include "zero/param_coordinator.h"

#include <algorithm>
#include <utility>

namespace zero {

namespace {
// How far ahead of the cursor Prefetch looks (trace entries), whatever the sizes.
constexpr size_t kMaxLookahead = 1024;
}  // namespace

ParamCoordinator::ParamCoordinator(Device* device, Communicator* comm, Stream* compute, DType dtype,
                                   std::vector<CoordinatedParam> params, std::vector<std::string> module_names,
                                   const ParamCoordinatorOptions& options)
    : device_(device),
      comm_(comm),
      compute_(compute),
      dtype_(dtype),
      options_(options),
      host_(options.shard_source == ShardSource::kHost),
      pool_(device, options.pool_free_bytes),
      staging_pool_(device, options.staging_free_bytes) {
  modules_.resize(module_names.size());
  for (size_t m = 0; m < module_names.size(); ++m) modules_[m].name = std::move(module_names[m]);
  params_.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    ZERO_CHECK(params[i].module >= 0 && params[i].module < static_cast<int>(modules_.size()));
    modules_[params[i].module].params.push_back(static_cast<int>(i));
    params_[i].spec = std::move(params[i]);
  }
  // Module store: each module's shards packed in parameter order.
  module_offset_.assign(params_.size(), 0);
  for (const Module& mod : modules_) {
    int64_t at = 0;
    for (int i : mod.params) {
      module_offset_[i] = at;
      at += params_[i].spec.shard;
    }
  }
}

ParamCoordinator::~ParamCoordinator() {
  // The collectives in flight write the full and staging buffers; nothing may free them earlier.
  for (auto& [id, f] : flights_) {
    if (f.work != nullptr) f.work->Wait().IgnoreError();
  }
  // The buffers free themselves; nothing may still read or write them.
  if (upload_stream_ != nullptr) device_->SynchronizeStream(upload_stream_.get()).IgnoreError();
  device_->SynchronizeStream(compute_).IgnoreError();
}

Status ParamCoordinator::Fail(Status s) {
  if (failed_.ok()) failed_ = s;
  return s;
}

bool ParamCoordinator::NeedsGather(const Param& p) const {
  return p.state == State::kReleased || (p.state == State::kReady && p.stale);
}

ParamCoordinator::Need ParamCoordinator::NeededBy(int module) const {
  Need n;
  for (int i : modules_[module].params) {
    const Param& p = params_[i];
    if (!NeedsGather(p) || p.spec.padded == 0) continue;
    n.all += p.spec.padded;
    ++n.count;
    if (!p.spec.persistent && p.state == State::kReleased) n.live += p.spec.padded;
  }
  return n;
}

int64_t ParamCoordinator::ModuleNumel(int module) const {
  int64_t n = 0;
  for (int i : modules_[module].params) n += params_[i].spec.padded;
  return n;
}

Status ParamCoordinator::Upload(Flight& f, const std::vector<void*>& dst) {
  const size_t esize = SizeOf(dtype_);
  if (upload_stream_ == nullptr) {
    auto st = device_->CreateStream();
    if (!st.ok()) return Fail(st.status().WithContext("stage-3 parameter offload: creating the upload stream"));
    upload_stream_ = std::move(st).value();
    auto ev = device_->CreateEvent();
    if (!ev.ok()) return Fail(ev.status().WithContext("stage-3 parameter offload: creating an event"));
    compute_mark_ = std::move(ev).value();
  }
  // The destinations come from pools released in compute-stream order: write them after it.
  Status s = device_->RecordEvent(compute_mark_.get(), compute_);
  if (s.ok()) s = device_->StreamWaitEvent(upload_stream_.get(), compute_mark_.get());
  if (!s.ok()) return Fail(s.WithContext(Describe(f) + ": ordering the upload"));
  TraceDeviceScope trace(observer_, TraceTrack::kHostToDevice, "upload host shards", upload_stream_.get());
  ModuleShardStore* store = options_.module_store;
  int loaded = -1;  // module store: the module whose shards `base` holds
  const char* base = nullptr;
  for (size_t j = 0; j < f.params.size(); ++j) {
    const Param& p = params_[f.params[j]];
    const size_t bytes = static_cast<size_t>(p.spec.shard) * esize;
    const void* src = p.spec.shard_data;
    if (store != nullptr) {
      if (p.spec.module != loaded) {
        if (loaded >= 0) s = store->Uploaded(loaded, upload_stream_.get());
        if (!s.ok()) return Fail(s.WithContext(Describe(f)));
        Result<const void*> b = store->Load(p.spec.module);
        if (!b.ok())
          return Fail(b.status().WithContext(Describe(f) + ": loading the shards of module '" +
                                             modules_[p.spec.module].name + "'"));
        base = static_cast<const char*>(*b);
        loaded = p.spec.module;
      }
      src = base + static_cast<size_t>(module_offset_[f.params[j]]) * esize;
    }
    s = device_->Copy(dst[j], src, bytes, CopyKind::kHostToDevice, upload_stream_.get());
    if (!s.ok()) return Fail(s.WithContext(Describe(f) + ": uploading the host shard of '" + p.spec.name + "'"));
    ++stats_.uploads;
    stats_.uploaded_bytes += static_cast<int64_t>(bytes);
  }
  if (loaded >= 0) {
    s = store->Uploaded(loaded, upload_stream_.get());
    if (!s.ok()) return Fail(s.WithContext(Describe(f)));
  }
  if (comm_->world_size() == 1) {
    // No collective to order the compute stream after the copies: an event does.
    if (free_events_.empty()) {
      auto ev = device_->CreateEvent();
      if (!ev.ok()) return Fail(ev.status().WithContext("stage-3 parameter offload: creating an event"));
      f.uploaded = std::move(ev).value();
    } else {
      f.uploaded = std::move(free_events_.back());
      free_events_.pop_back();
    }
    s = device_->RecordEvent(f.uploaded.get(), upload_stream_.get());
    if (!s.ok()) return Fail(s.WithContext(Describe(f) + ": recording the upload"));
  }
  return OkStatus();
}

int64_t ParamCoordinator::StagingNumel(int64_t all, int64_t count) const {
  // N*S = the sum of the padded sizes; one parameter (or one rank) needs no staging.
  return count >= 2 && comm_->world_size() > 1 ? all : 0;
}

std::string ParamCoordinator::Describe(const Flight& f) const {
  std::string out = "all-gather of ";
  const size_t shown = std::min<size_t>(f.params.size(), 4);
  for (size_t j = 0; j < shown; ++j) {
    const Param& p = params_[f.params[j]];
    out += (j ? ", '" : "'") + p.spec.name + "' (module '" + modules_[p.spec.module].name + "')";
  }
  if (f.params.size() > shown) out += " and " + std::to_string(f.params.size() - shown) + " more parameters";
  return out;
}

Status ParamCoordinator::Claim(int module, Flight* f) {
  for (int i : modules_[module].params) {
    Param& p = params_[i];
    if (!NeedsGather(p)) continue;
    if (p.state == State::kReleased) {
      // One rank with device shards: the shard is the whole padded parameter and serves as the
      // full buffer (Data()).
      if (p.spec.padded > 0 && !Aliases()) {
        auto buf = pool_.Acquire(static_cast<size_t>(p.spec.padded) * SizeOf(dtype_),
                                 "allocating a gathered stage-3 parameter");
        if (!buf.ok()) {
          return Fail(
              buf.status().WithContext("parameter '" + p.spec.name + "' (module '" + modules_[module].name + "')"));
        }
        p.full = std::move(buf).value();
      }
      if (!p.spec.persistent) {
        live_numel_ += p.spec.padded;
        stats_.max_live_numel_seen = std::max(stats_.max_live_numel_seen, live_numel_);
      }
    }
    p.stale = false;
    if (p.spec.padded == 0) {
      p.state = State::kReady;
      continue;
    }
    p.state = State::kInFlight;
    p.flight = -1;
    f->params.push_back(i);
  }
  return OkStatus();
}

Status ParamCoordinator::Launch(Flight f) {
  if (f.params.empty()) return OkStatus();
  const int world = comm_->world_size();
  const int rank = comm_->rank();
  const size_t esize = SizeOf(dtype_);
  stats_.gathered_params += static_cast<int64_t>(f.params.size());
  if (Aliases()) {
    // The one shard is the whole padded parameter and is read in place (Data()): no collective,
    // no copy.
    for (int i : f.params) params_[i].state = State::kReady;
    return OkStatus();
  }
  for (int i : f.params) {
    f.offset.push_back(f.segment);
    f.segment += params_[i].spec.shard;
  }
  const bool staged = world > 1 && f.params.size() >= 2;
  void* mine = nullptr;  // staged: this rank's segment of the staging buffer
  if (staged) {
    f.staging_numel = f.segment * world;
    auto buf = staging_pool_.AcquireAtLeast(static_cast<size_t>(f.staging_numel) * esize,
                                            "allocating a stage-3 all-gather staging buffer");
    if (!buf.ok()) return Fail(buf.status().WithContext(Describe(f)));
    f.staging = std::move(buf).value();
    live_numel_ += f.staging_numel;
    stats_.max_live_numel_seen = std::max(stats_.max_live_numel_seen, live_numel_);
    stats_.max_staging_numel = std::max(stats_.max_staging_numel, f.staging_numel);
    mine = static_cast<char*>(f.staging.data()) + static_cast<size_t>(rank * f.segment) * esize;
  }
  // Where this rank's shard of params[j] must be before the collective (or, with one rank, is the
  // full parameter).
  auto target = [&](size_t j) -> void* {
    Param& p = params_[f.params[j]];
    if (staged) return static_cast<char*>(mine) + static_cast<size_t>(f.offset[j]) * esize;
    if (world == 1) return p.full.data();
    return static_cast<char*>(p.full.data()) + static_cast<size_t>(rank * p.spec.shard) * esize;
  };
  if (host_) {
    std::vector<void*> dst;
    for (size_t j = 0; j < f.params.size(); ++j) dst.push_back(target(j));
    ZERO_RETURN_IF_ERROR(Upload(f, dst));
  } else if (staged) {
    // Pack this rank's shards into its segment (compute stream; the collective runs after it).
    for (size_t j = 0; j < f.params.size(); ++j) {
      const Param& p = params_[f.params[j]];
      Status s = device_->Copy(target(j), p.spec.shard_data, static_cast<size_t>(p.spec.shard) * esize,
                               CopyKind::kDeviceToDevice, compute_);
      if (!s.ok()) return Fail(s.WithContext(Describe(f) + ": packing"));
    }
  }
  if (world > 1) {
    // Host shards: after the upload stream (which is after the compute stream's work so far).
    Stream* after = host_ ? upload_stream_.get() : compute_;
    Result<std::unique_ptr<Work>> work = std::unique_ptr<Work>();
    f.span = TraceBegin(observer_, TraceTrack::kCommunication, "all-gather", after);
    if (!staged) {
      // Straight into the full buffer: no staging, no pack, no unpack (in place with host shards).
      Param& p = params_[f.params.front()];
      const void* send = host_ ? target(0) : p.spec.shard_data;
      work = comm_->AllGather(send, p.full.data(), static_cast<size_t>(p.spec.shard), dtype_, after);
    } else {
      work = comm_->AllGather(mine, f.staging.data(), static_cast<size_t>(f.segment), dtype_, after);
    }
    if (!work.ok()) return Fail(work.status().WithContext(Describe(f)));
    f.work = std::move(work).value();
    ++stats_.allgathers;
  }
  const int64_t id = next_flight_++;
  for (int i : f.params) params_[i].flight = id;
  flights_.emplace(id, std::move(f));
  if (host_) {
    stats_.max_uploads_in_flight_seen =
        std::max(stats_.max_uploads_in_flight_seen, static_cast<int64_t>(flights_.size()));
  }
  return OkStatus();
}

Status ParamCoordinator::Complete(int64_t id) {
  auto it = flights_.find(id);
  ZERO_CHECK(it != flights_.end());
  Flight& f = it->second;
  if (f.work != nullptr) {
    Status s = f.work->StreamWait(compute_);
    if (!s.ok()) return Fail(s.WithContext(Describe(f)));
    f.work.reset();
    TraceEnd(observer_, f.span, compute_);
  }
  if (f.uploaded != nullptr) {
    Status s = device_->StreamWaitEvent(compute_, f.uploaded.get());
    if (!s.ok()) return Fail(s.WithContext(Describe(f) + ": waiting for the upload"));
    // The wait captured the event; it may be recorded again.
    free_events_.push_back(std::move(f.uploaded));
  }
  if (!f.staging.empty()) {
    // Unpack: rank r's shard of params[j], from segment r to its place in the full buffer.
    const size_t esize = SizeOf(dtype_);
    const int world = comm_->world_size();
    const char* base = static_cast<const char*>(f.staging.data());
    for (int r = 0; r < world; ++r) {
      for (size_t j = 0; j < f.params.size(); ++j) {
        Param& p = params_[f.params[j]];
        const size_t bytes = static_cast<size_t>(p.spec.shard) * esize;
        Status s = device_->Copy(static_cast<char*>(p.full.data()) + r * bytes,
                                 base + static_cast<size_t>(r * f.segment + f.offset[j]) * esize, bytes,
                                 CopyKind::kDeviceToDevice, compute_);
        if (!s.ok()) return Fail(s.WithContext(Describe(f) + ": unpacking"));
      }
    }
    // Freed (or pooled) right after the unpack, in compute-stream order.
    Status s = staging_pool_.Release(std::move(f.staging), compute_);
    if (!s.ok()) return Fail(s);
    live_numel_ -= f.staging_numel;
  }
  for (int i : f.params) {
    params_[i].state = State::kReady;
    params_[i].flight = -1;
  }
  flights_.erase(it);
  return OkStatus();
}

Status ParamCoordinator::CompleteAll() {
  while (!flights_.empty()) ZERO_RETURN_IF_ERROR(Complete(flights_.begin()->first));
  return OkStatus();
}

Status ParamCoordinator::WaitParam(Param& p) {
  if (p.state != State::kInFlight) return OkStatus();
  ZERO_CHECK(p.flight >= 0);
  return Complete(p.flight);
}

Status ParamCoordinator::WaitModule(int module) {
  for (int i : modules_[module].params) ZERO_RETURN_IF_ERROR(WaitParam(params_[i]));
  return OkStatus();
}

Status ParamCoordinator::FreeParam(Param& p) {
  if (p.state == State::kReleased) return OkStatus();
  ZERO_RETURN_IF_ERROR(WaitParam(p));
  Status s = pool_.Release(std::move(p.full), compute_);
  if (!s.ok()) return Fail(s);
  if (!p.spec.persistent) live_numel_ -= p.spec.padded;
  p.state = State::kReleased;
  p.stale = false;
  return OkStatus();
}

Status ParamCoordinator::FreeModule(int module) {
  for (int i : modules_[module].params) {
    if (!params_[i].spec.persistent) ZERO_RETURN_IF_ERROR(FreeParam(params_[i]));
  }
  return OkStatus();
}

int ParamCoordinator::NextUse(int module, int64_t* distance) const {
  *distance = 0;
  for (size_t j = cursor_; j < trace_.size(); ++j) {
    const int m = trace_[j];
    if (m == module) return static_cast<int>(j);
    for (int i : modules_[m].params) *distance += params_[i].spec.padded;
  }
  return -1;
}

Status ParamCoordinator::MakeRoom(int64_t needed_live, int demanded) {
  // Staging of earlier flights first: completing them frees it without losing any gathered
  // parameter, and the demand's collective is queued behind theirs anyway.
  while (live_numel_ + needed_live > options_.max_live_numel) {
    auto it =
        std::find_if(flights_.begin(), flights_.end(), [](const auto& kv) { return kv.second.staging_numel > 0; });
    if (it == flights_.end()) break;
    ZERO_RETURN_IF_ERROR(Complete(it->first));
  }
  while (live_numel_ + needed_live > options_.max_live_numel) {
    // The unheld module holding live parameters whose next use is farthest away (or never).
    int victim = -1;
    int64_t victim_rank = -1;
    for (int m = 0; m < static_cast<int>(modules_.size()); ++m) {
      if (m == demanded || modules_[m].ref > 0) continue;
      bool holds = false;
      for (int i : modules_[m].params) {
        const Param& p = params_[i];
        if (!p.spec.persistent && p.state != State::kReleased && p.spec.padded > 0) holds = true;
      }
      if (!holds) continue;
      int64_t distance = 0;
      const int pos = trace_valid_ ? NextUse(m, &distance) : -1;
      const int64_t rank = pos < 0 ? std::numeric_limits<int64_t>::max() : pos;
      if (rank > victim_rank) {
        victim = m;
        victim_rank = rank;
      }
    }
    if (victim < 0) return OkStatus();  // only held modules left: the demand exceeds the limit
    ZERO_RETURN_IF_ERROR(FreeModule(victim));
    modules_[victim].prefetched = false;
    ++stats_.evicted_modules;
  }
  return OkStatus();
}

Status ParamCoordinator::Prefetch() {
  if (!trace_valid_ || recording_) return OkStatus();
  // Host shards: at most max_uploads_in_flight flights (uploads) at once.
  if (host_ && static_cast<int64_t>(flights_.size()) >= options_.max_uploads_in_flight) return OkStatus();
  // One flight for every module this call prefetches: at most prefetch_bucket_numel elements,
  // and the live elements (their staging included) within max_live_numel.
  // What is already gathered ahead (prefetched, not yet demanded) counts toward the bucket; the
  // first module ahead is prefetched even when it alone is larger than the bucket (as DeepSpeed,
  // which checks the bucket before adding, and FSDP2's one-module prefetch do), so a model whose
  // modules exceed stage3_prefetch_bucket_size still has its next module's gather overlap compute.
  Flight f;
  int64_t bucket = 0;
  int64_t count = 0;
  const size_t end = std::min(trace_.size(), cursor_ + kMaxLookahead);
  for (size_t j = cursor_; j < end; ++j) {
    const int m = trace_[j];
    const Need need = NeededBy(m);
    if (need.all == 0) {
      if (modules_[m].prefetched) bucket += ModuleNumel(m);
      continue;
    }
    // (A bucket of 0 turns prefetching off, as DeepSpeed's stage3_prefetch_bucket_size 0 does.)
    if ((bucket > 0 || options_.prefetch_bucket_numel <= 0) && bucket + need.all > options_.prefetch_bucket_numel) {
      break;
    }
    // live_numel_ already includes what this flight claimed so far; its staging comes at launch.
    if (live_numel_ + need.live + StagingNumel(bucket + need.all, count + need.count) > options_.max_live_numel) {
      break;
    }
    ZERO_RETURN_IF_ERROR(Claim(m, &f));
    modules_[m].prefetched = true;
    ++stats_.prefetched_modules;
    bucket += need.all;
    count += need.count;
  }
  ZERO_RETURN_IF_ERROR(Launch(std::move(f)));
  return ReadAhead();
}

Status ParamCoordinator::ReadAhead() {
  ModuleShardStore* store = options_.module_store;
  if (store == nullptr || !host_ || !trace_valid_ || recording_) return OkStatus();
  int asked = 0;
  const size_t end = std::min(trace_.size(), cursor_ + kMaxLookahead);
  for (size_t j = cursor_; j < end && asked < options_.max_store_read_ahead; ++j) {
    const int m = trace_[j];
    if (NeededBy(m).all == 0) continue;  // gathered, or in flight (uploaded already)
    Result<bool> started = store->Prefetch(m);
    if (!started.ok()) {
      return Fail(started.status().WithContext("reading ahead the shards of module '" + modules_[m].name + "'"));
    }
    if (!*started) break;  // no buffer free: the reads already started cover the budget
    ++stats_.store_read_aheads;
    ++asked;
  }
  return OkStatus();
}

Status ParamCoordinator::Acquire(int module) {
  if (!failed_.ok()) return failed_;
  ZERO_CHECK(module >= 0 && module < static_cast<int>(modules_.size()));
  bool on_trace = false;
  if (recording_) {
    recorded_.push_back(module);
  } else if (trace_valid_) {
    if (cursor_ < trace_.size() && trace_[cursor_] == module) {
      ++cursor_;
      on_trace = true;
    } else {
      trace_valid_ = false;
      record_next_ = true;
      ++stats_.trace_invalidations;
    }
  }
  Module& mod = modules_[module];
  if (mod.prefetched) {
    ++stats_.prefetch_hits;
    mod.prefetched = false;
  }
  const Need need = NeededBy(module);
  const int64_t needed_live = need.live + StagingNumel(need.all, need.count);
  if (needed_live > 0) ZERO_RETURN_IF_ERROR(MakeRoom(needed_live, module));
  // Host shards: this demand's upload must fit under max_uploads_in_flight (oldest flights first;
  // their collectives precede the demand's anyway).
  while (host_ && need.all > 0 && !flights_.empty() &&
         static_cast<int64_t>(flights_.size()) >= options_.max_uploads_in_flight) {
    ZERO_RETURN_IF_ERROR(Complete(flights_.begin()->first));
  }
  Flight f;
  ZERO_RETURN_IF_ERROR(Claim(module, &f));
  ZERO_RETURN_IF_ERROR(Launch(std::move(f)));
  ZERO_RETURN_IF_ERROR(WaitModule(module));
  ++mod.ref;
  if (on_trace) {
    ZERO_RETURN_IF_ERROR(Prefetch());
    // Prefetch returns early when the uploads in flight are at their limit: read ahead anyway.
    ZERO_RETURN_IF_ERROR(ReadAhead());
  }
  return OkStatus();
}

Status ParamCoordinator::Release(int module) {
  if (!failed_.ok()) return failed_;
  ZERO_CHECK(module >= 0 && module < static_cast<int>(modules_.size()));
  Module& mod = modules_[module];
  if (mod.ref <= 0) {
    return FailedPreconditionError("module '" + mod.name + "' released more often than gathered");
  }
  if (--mod.ref > 0) return OkStatus();
  if (trace_valid_ && !recording_ && live_numel_ <= options_.max_live_numel) {
    int64_t distance = 0;
    if (NextUse(module, &distance) >= 0 && distance <= options_.max_reuse_distance) {
      ++stats_.kept_modules;
      return OkStatus();
    }
  }
  return FreeModule(module);
}

Status ParamCoordinator::EndMicroStep() {
  if (!failed_.ok()) return failed_;
  if (recording_) {
    if (!recorded_.empty()) {
      trace_ = std::move(recorded_);
      recorded_.clear();
      trace_valid_ = true;
      recording_ = false;
    }
  } else if (record_next_) {
    record_next_ = false;
    recording_ = true;
    recorded_.clear();
  }
  cursor_ = 0;
  return OkStatus();
}

Status ParamCoordinator::QuiesceForUpdate() {
  if (!failed_.ok()) return failed_;
  ZERO_RETURN_IF_ERROR(CompleteAll());
  // Host shards: the caller rewrites them next (on the host or on the compute stream); no upload
  // may still be reading them.
  if (upload_stream_ != nullptr) {
    Status s = device_->SynchronizeStream(upload_stream_.get());
    if (!s.ok()) return Fail(s.WithContext("stage-3 parameter offload: waiting for the uploads"));
  }
  return OkStatus();
}

Status ParamCoordinator::AfterUpdate() {
  ZERO_RETURN_IF_ERROR(QuiesceForUpdate());
  if (options_.module_store != nullptr) {
    Status s = options_.module_store->AfterWrites();
    if (!s.ok()) return Fail(s.WithContext("stage-3 parameter offload: writing back the new weights"));
  }
  for (int m = 0; m < static_cast<int>(modules_.size()); ++m) {
    Module& mod = modules_[m];
    mod.prefetched = false;
    if (mod.ref == 0) ZERO_RETURN_IF_ERROR(FreeModule(m));
    for (int i : mod.params) {
      if (params_[i].state == State::kReady) params_[i].stale = true;
    }
  }
  // The modules the user still holds, re-gathered from the new shards in one flight.
  Flight f;
  for (int m = 0; m < static_cast<int>(modules_.size()); ++m) {
    if (modules_[m].ref > 0) ZERO_RETURN_IF_ERROR(Claim(m, &f));
  }
  ZERO_RETURN_IF_ERROR(Launch(std::move(f)));
  return CompleteAll();
}

Result<const void*> ParamCoordinator::Full(int param) const {
  const Param& p = params_[param];
  const Module& mod = modules_[p.spec.module];
  if (p.state == State::kReady && !p.stale && (p.spec.persistent || mod.ref > 0)) {
    return Data(p);
  }
  return FailedPreconditionError("parameter '" + p.spec.name + "' is not gathered: hold GatherModule(\"" + mod.name +
                                 "\") while using it (stage 3)");
}

}  // namespace zero
