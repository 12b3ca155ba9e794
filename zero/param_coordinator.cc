#include "zero/param_coordinator.h"

#include <algorithm>
#include <utility>

namespace zero {

namespace {
// How far ahead of the cursor Prefetch looks (trace entries), whatever the sizes.
constexpr size_t kMaxLookahead = 1024;
}  // namespace

ParamCoordinator::ParamCoordinator(Device* device, Communicator* comm, Stream* compute, DType dtype,
                                   std::vector<CoordinatedParam> params,
                                   std::vector<std::string> module_names,
                                   const ParamCoordinatorOptions& options)
    : device_(device),
      comm_(comm),
      compute_(compute),
      dtype_(dtype),
      options_(options),
      pool_(device, options.pool_free_bytes) {
  modules_.resize(module_names.size());
  for (size_t m = 0; m < module_names.size(); ++m) modules_[m].name = std::move(module_names[m]);
  params_.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    ZERO_CHECK(params[i].module >= 0 && params[i].module < static_cast<int>(modules_.size()));
    modules_[params[i].module].params.push_back(static_cast<int>(i));
    params_[i].spec = std::move(params[i]);
  }
}

ParamCoordinator::~ParamCoordinator() {
  for (Param& p : params_) {
    if (p.work != nullptr) p.work->Wait().IgnoreError();
  }
  // The full buffers free themselves; nothing may still read them.
  device_->SynchronizeStream(compute_).IgnoreError();
}

Status ParamCoordinator::Fail(Status s) {
  if (failed_.ok()) failed_ = s;
  return s;
}

bool ParamCoordinator::NeedsGather(const Param& p) const {
  return p.state == State::kReleased || (p.state == State::kReady && p.stale);
}

void ParamCoordinator::NeededNumel(int module, int64_t* all, int64_t* live) const {
  *all = 0;
  *live = 0;
  for (int i : modules_[module].params) {
    const Param& p = params_[i];
    if (!NeedsGather(p)) continue;
    *all += p.spec.padded;
    if (!p.spec.persistent && p.state == State::kReleased) *live += p.spec.padded;
  }
}

Status ParamCoordinator::IssueGathers(int module) {
  for (int i : modules_[module].params) {
    Param& p = params_[i];
    if (!NeedsGather(p)) continue;
    if (p.state == State::kReleased) {
      if (p.spec.padded > 0) {
        auto buf = pool_.Acquire(static_cast<size_t>(p.spec.padded) * SizeOf(dtype_),
                                 "allocating a gathered stage-3 parameter");
        if (!buf.ok()) {
          return Fail(buf.status().WithContext("parameter '" + p.spec.name + "' (module '" +
                                               modules_[module].name + "')"));
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
    auto work = comm_->AllGather(p.spec.shard_data, p.full.data(), static_cast<size_t>(p.spec.shard),
                                 dtype_, compute_);
    if (!work.ok()) {
      return Fail(work.status().WithContext("all-gather of parameter '" + p.spec.name +
                                            "' (module '" + modules_[module].name + "')"));
    }
    p.work = std::move(work).value();
    p.state = State::kInFlight;
    ++stats_.gathers;
  }
  return OkStatus();
}

Status ParamCoordinator::WaitParam(Param& p) {
  if (p.state != State::kInFlight) return OkStatus();
  Status s = p.work->StreamWait(compute_);
  if (!s.ok()) {
    return Fail(s.WithContext("all-gather of parameter '" + p.spec.name + "' (module '" +
                              modules_[p.spec.module].name + "')"));
  }
  p.work.reset();
  p.state = State::kReady;
  return OkStatus();
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
  int64_t bucket = 0;
  const size_t end = std::min(trace_.size(), cursor_ + kMaxLookahead);
  for (size_t j = cursor_; j < end; ++j) {
    const int m = trace_[j];
    int64_t all = 0;
    int64_t live = 0;
    NeededNumel(m, &all, &live);
    if (all == 0) continue;
    if (bucket + all > options_.prefetch_bucket_numel) break;
    if (live_numel_ + live > options_.max_live_numel) break;
    ZERO_RETURN_IF_ERROR(IssueGathers(m));
    modules_[m].prefetched = true;
    ++stats_.prefetched_modules;
    bucket += all;
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
  int64_t all = 0;
  int64_t live = 0;
  NeededNumel(module, &all, &live);
  if (live > 0) ZERO_RETURN_IF_ERROR(MakeRoom(live, module));
  ZERO_RETURN_IF_ERROR(IssueGathers(module));
  ZERO_RETURN_IF_ERROR(WaitModule(module));
  ++mod.ref;
  if (on_trace) ZERO_RETURN_IF_ERROR(Prefetch());
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
  for (Param& p : params_) ZERO_RETURN_IF_ERROR(WaitParam(p));
  return OkStatus();
}

Status ParamCoordinator::AfterUpdate() {
  ZERO_RETURN_IF_ERROR(QuiesceForUpdate());
  for (int m = 0; m < static_cast<int>(modules_.size()); ++m) {
    Module& mod = modules_[m];
    mod.prefetched = false;
    if (mod.ref == 0) ZERO_RETURN_IF_ERROR(FreeModule(m));
    for (int i : mod.params) {
      if (params_[i].state == State::kReady) params_[i].stale = true;
    }
    if (mod.ref > 0) {
      ZERO_RETURN_IF_ERROR(IssueGathers(m));
      ZERO_RETURN_IF_ERROR(WaitModule(m));
    }
  }
  return OkStatus();
}

Result<const void*> ParamCoordinator::Full(int param) const {
  const Param& p = params_[param];
  const Module& mod = modules_[p.spec.module];
  if (p.state == State::kReady && !p.stale && (p.spec.persistent || mod.ref > 0)) {
    return static_cast<const void*>(p.full.data());
  }
  return FailedPreconditionError("parameter '" + p.spec.name + "' is not gathered: hold GatherModule(\"" +
                                 mod.name + "\") while using it (stage 3)");
}

}  // namespace zero
