#include "zero/chunked_optimizer_states.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

namespace zero {

namespace {

constexpr OptState kStates[3] = {OptState::kMaster, OptState::kExpAvg, OptState::kExpAvgSq};

}  // namespace

ChunkedOptimizerStates::ChunkedOptimizerStates(Device* device, Stream* stream, int64_t numel,
                                               const ChunkedOptimizerStatesOptions& o)
    : device_(device),
      stream_(stream),
      numel_(numel),
      chunk_(std::max<int64_t>(1, std::min<int64_t>(o.chunk_numel, numel))),
      model_dtype_(o.model_dtype) {}

ChunkedOptimizerStates::~ChunkedOptimizerStates() { Drain().IgnoreError(); }

Result<std::unique_ptr<ChunkedOptimizerStates>> ChunkedOptimizerStates::Create(
    Device* device, int64_t numel, Stream* stream, const ChunkedOptimizerStatesOptions& options) {
  if (options.chunk_numel < 1) {
    return InvalidArgumentError(
        "chunked optimizer states: zero_optimization.offload_optimizer.chunk_size must be "
        ">= 1 element, got " +
        std::to_string(options.chunk_numel));
  }
  if (options.chunk_buffers < 2) {
    return InvalidArgumentError(
        "chunked optimizer states: zero_optimization.offload_optimizer.chunk_buffers must be "
        ">= 2 (one set is uploaded while another is updated), got " +
        std::to_string(options.chunk_buffers));
  }
  if (numel < 0) return InvalidArgumentError("chunked optimizer states: numel " + std::to_string(numel) + " < 0");
  std::unique_ptr<ChunkedOptimizerStates> s(new ChunkedOptimizerStates(device, stream, numel, options));
  ZERO_RETURN_IF_ERROR(s->Init(options));
  return s;
}

Status ChunkedOptimizerStates::Init(const ChunkedOptimizerStatesOptions& o) {
  const size_t state_bytes = static_cast<size_t>(numel_) * 4;
  const bool keep_copy = SizeOf(model_dtype_) == 2;
  const size_t copy_bytes = keep_copy ? static_cast<size_t>(numel_) * 2 : 0;
  ZERO_ASSIGN_OR_RETURN(
      slab_, HostSlab::Create(
                 device_, 3 * HostSlab::AlignedSize(state_bytes) + (keep_copy ? HostSlab::AlignedSize(copy_bytes) : 0),
                 o.slab));
  for (int k = 0; k < 3; ++k) {
    ZERO_ASSIGN_OR_RETURN(HostSpan sp, slab_.Take(state_bytes, OptStateName(kStates[k])));
    state_[k] = sp.as<float>();
    if (state_bytes > 0) std::memset(state_[k], 0, state_bytes);
  }
  if (keep_copy) {
    // Zeros: the zero masters cast (so the copy is current everywhere at creation).
    ZERO_ASSIGN_OR_RETURN(HostSpan sp, slab_.Take(copy_bytes, "host model copy"));
    copy_ = static_cast<uint8_t*>(sp.data);
    if (copy_bytes > 0) std::memset(copy_, 0, copy_bytes);
    MarkCopy(0, numel_, true);
  }
  for (auto [stream, name] : {std::pair<std::unique_ptr<Stream>*, const char*>{&upload_, "upload"},
                              {&update_, "update"},
                              {&download_, "download"}}) {
    auto st = device_->CreateStream();
    if (!st.ok())
      return st.status().WithContext(std::string("chunked optimizer states: creating the ") + name + " stream");
    *stream = std::move(st).value();
  }
  auto event = [&](std::unique_ptr<Event>* e) -> Status {
    auto r = device_->CreateEvent();
    if (!r.ok()) return r.status().WithContext("chunked optimizer states: creating an event");
    *e = std::move(r).value();
    return device_->RecordEvent(e->get(), upload_.get());  // recorded once, so every wait is defined
  };
  sets_.resize(static_cast<size_t>(o.chunk_buffers));
  for (size_t i = 0; i < sets_.size(); ++i) {
    for (int k = 0; k < 3; ++k) {
      auto b = device_->Allocate(static_cast<size_t>(chunk_) * 4);
      if (!b.ok()) {
        return b.status().WithContext("chunked optimizer states: allocating staging set " + std::to_string(i) + " of " +
                                      std::to_string(sets_.size()) + " (" + OptStateName(kStates[k]) + ", " +
                                      std::to_string(chunk_) +
                                      " elements; lower zero_optimization.offload_optimizer.chunk_size or "
                                      "chunk_buffers)");
      }
      sets_[i].state[k] = std::move(b).value();
    }
    if (copy_ != nullptr) {
      auto b = device_->Allocate(static_cast<size_t>(chunk_) * 2);
      if (!b.ok()) {
        return b.status().WithContext("chunked optimizer states: allocating the model buffer of staging set " +
                                      std::to_string(i) + " (" + std::to_string(chunk_) + " 16-bit elements)");
      }
      sets_[i].model = std::move(b).value();
    }
    ZERO_RETURN_IF_ERROR(event(&sets_[i].uploaded));
    ZERO_RETURN_IF_ERROR(event(&sets_[i].free));
  }
  ZERO_RETURN_IF_ERROR(event(&entry_));
  ZERO_RETURN_IF_ERROR(event(&widened_));
  for (auto& t : tail_) ZERO_RETURN_IF_ERROR(event(&t));
  return OkStatus();
}

Result<std::shared_ptr<Event>> ChunkedOptimizerStates::PooledEvent() {
  std::unique_ptr<Event> e;
  if (!spare_events_.empty()) {
    e = std::move(spare_events_.back());
    spare_events_.pop_back();
  } else {
    auto r = device_->CreateEvent();
    if (!r.ok()) return r.status().WithContext("chunked optimizer states: creating a chunk event");
    e = std::move(r).value();
  }
  // Back to the pool when no record holds it any more (re-recording it later is safe: waits
  // already queued on it keep the point they were queued against).
  return std::shared_ptr<Event>(e.release(), [this](Event* p) { spare_events_.emplace_back(p); });
}

Status ChunkedOptimizerStates::WaitForHostRange(int64_t b, int64_t e) {
  // The download stream runs in order, so the latest overlapping download covers the earlier
  // ones; cast records wrote no host memory and their uploads precede ours on the upload stream.
  const Record* latest = nullptr;
  auto consider = [&](const Record& r) {
    if (r.host_written && (latest == nullptr || r.seq > latest->seq)) latest = &r;
  };
  auto it = records_.lower_bound(b);
  if (it != records_.begin()) {
    auto prev = std::prev(it);
    if (prev->second.end > b) consider(prev->second);
  }
  for (; it != records_.end() && it->first < e; ++it) consider(it->second);
  if (latest == nullptr) return OkStatus();
  return device_->StreamWaitEvent(upload_.get(), latest->stored.get());
}

void ChunkedOptimizerStates::Note(int64_t b, int64_t e, std::shared_ptr<Event> updated, std::shared_ptr<Event> stored,
                                  bool host_written) {
  auto it = records_.lower_bound(b);
  if (it != records_.begin()) {
    auto prev = std::prev(it);
    if (prev->second.end > b) {
      if (prev->second.end > e) {
        Record tail = prev->second;
        records_.emplace(e, std::move(tail));
      }
      prev->second.end = b;
    }
  }
  it = records_.lower_bound(b);
  while (it != records_.end() && it->first < e) {
    if (it->second.end > e) {
      Record tail = it->second;
      records_.emplace(e, std::move(tail));
    }
    it = records_.erase(it);
  }
  records_.emplace(b, Record{e, ++seq_, host_written, std::move(updated), std::move(stored)});
}

Status ChunkedOptimizerStates::Pipeline(Kind kind, int64_t offset, int64_t n, const void* grads, DType grad_t,
                                        const AdamWParams& h, void* model_out, DType model_t, Stream* caller,
                                        Event* after) {
  if (n == 0) return OkStatus();
  const bool cast = kind == Kind::kCast;
  const bool widen = kind == Kind::kUpdateFromGradient;
  if (widen && scratch_.empty()) {
    auto b = device_->Allocate(static_cast<size_t>(chunk_) * 4);
    if (!b.ok()) {
      return b.status().WithContext(
          "chunked optimizer states: allocating the gradient chunk of the update in "
          "backward (" +
          std::to_string(chunk_) + " fp32 elements)");
    }
    scratch_ = std::move(b).value();
  }
  const int moved = cast ? 1 : 3;  // a cast needs the masters only
  // The caller's stream up to here: gradients written, model_out no longer read.
  ZERO_RETURN_IF_ERROR(WaitForCaller(update_.get(), caller, after));
  Event* last = nullptr;
  for (int64_t at = 0; at < n; at += chunk_) {
    const int64_t len = std::min(chunk_, n - at);
    const size_t bytes = static_cast<size_t>(len) * 4;
    const int64_t b = offset + at;
    Set& s = sets_[next_set_];
    next_set_ = (next_set_ + 1) % sets_.size();
    ZERO_ASSIGN_OR_RETURN(std::shared_ptr<Event> updated, PooledEvent());
    ZERO_ASSIGN_OR_RETURN(std::shared_ptr<Event> stored, PooledEvent());

    // 1. Upload: once the set is free and the host range is final.
    ZERO_RETURN_IF_ERROR(device_->StreamWaitEvent(upload_.get(), s.free.get()));
    ZERO_RETURN_IF_ERROR(WaitForHostRange(b, b + len));
    StreamObserver::SpanId trace = TraceBegin(observer_, TraceTrack::kHostToDevice, "chunk upload", upload_.get());
    for (int k = 0; k < moved; ++k) {
      ZERO_RETURN_IF_ERROR(
          device_->Copy(s.state[k].data(), state_[k] + b, bytes, CopyKind::kHostToDevice, upload_.get()));
    }
    TraceEnd(observer_, trace, upload_.get());
    ZERO_RETURN_IF_ERROR(device_->RecordEvent(s.uploaded.get(), upload_.get()));
    if (cast) ZERO_RETURN_IF_ERROR(device_->RecordEvent(stored.get(), upload_.get()));

    // 2. Update (the widening first: the scratch was last read by the previous AdamW, on this stream).
    const float* g = nullptr;
    if (widen) {
      float* w = scratch_.as<float>();
      if (grads != nullptr) {
        ZERO_RETURN_IF_ERROR(device_->AccumulateFirst(w, ElementPtr(grads, grad_t, at), grad_t,
                                                      static_cast<size_t>(len), 1.0f, update_.get()));
      } else {
        ZERO_RETURN_IF_ERROR(device_->Fill(w, DType::kF32, static_cast<size_t>(len), 0.0f, update_.get()));
      }
      ZERO_RETURN_IF_ERROR(device_->RecordEvent(widened_.get(), update_.get()));
      g = w;
    } else if (!cast) {
      g = static_cast<const float*>(grads) + at;
    }
    ZERO_RETURN_IF_ERROR(device_->StreamWaitEvent(update_.get(), s.uploaded.get()));
    trace = TraceBegin(observer_, TraceTrack::kGpuOptimizer, cast ? "chunk cast" : "chunk AdamW", update_.get());
    // The update in backward writes the new weights into the set's model buffer (the host copy).
    const bool to_copy = widen && copy_ != nullptr;
    void* out = to_copy ? s.model.data() : model_out != nullptr ? ElementPtr(model_out, model_t, at) : nullptr;
    const DType out_t = to_copy ? model_dtype_ : model_t;
    if (cast) {
      ZERO_RETURN_IF_ERROR(
          device_->Cast(s.state[0].data(), DType::kF32, out, out_t, static_cast<size_t>(len), update_.get()));
    } else {
      ZERO_RETURN_IF_ERROR(device_->AdamWCast(s.state[0].as<float>(), g, s.state[1].as<float>(), s.state[2].as<float>(),
                                              static_cast<size_t>(len), h, out, out_t, update_.get()));
    }
    TraceEnd(observer_, trace, update_.get());
    ZERO_RETURN_IF_ERROR(device_->RecordEvent(updated.get(), update_.get()));

    // 3. Download (a cast wrote nothing to the set: it is free after the cast).
    if (cast) {
      ZERO_RETURN_IF_ERROR(device_->RecordEvent(s.free.get(), update_.get()));
    } else {
      ZERO_RETURN_IF_ERROR(device_->StreamWaitEvent(download_.get(), updated.get()));
      trace = TraceBegin(observer_, TraceTrack::kDeviceToHost, "chunk download", download_.get());
      for (int k = 0; k < 3; ++k) {
        ZERO_RETURN_IF_ERROR(
            device_->Copy(state_[k] + b, s.state[k].data(), bytes, CopyKind::kDeviceToHost, download_.get()));
      }
      if (to_copy) {
        ZERO_RETURN_IF_ERROR(device_->Copy(copy_ + static_cast<size_t>(b) * 2, s.model.data(),
                                           static_cast<size_t>(len) * 2, CopyKind::kDeviceToHost, download_.get()));
      }
      TraceEnd(observer_, trace, download_.get());
      ZERO_RETURN_IF_ERROR(device_->RecordEvent(stored.get(), download_.get()));
      ZERO_RETURN_IF_ERROR(device_->RecordEvent(s.free.get(), download_.get()));
    }
    last = cast ? updated.get() : widen ? widened_.get() : stored.get();
    Note(b, b + len, std::move(updated), std::move(stored), !cast);
  }
  if (caller == nullptr) return OkStatus();
  return device_->StreamWaitEvent(caller, last);
}

Status ChunkedOptimizerStates::Update(int64_t offset, int64_t n, const float* grads, const AdamWParams& h,
                                      void* model_out, DType model_t, Stream* stream) {
  ZERO_RETURN_IF_ERROR(Check(offset, n, "Update"));
  MarkCopy(offset, offset + n, false);
  return Pipeline(Kind::kUpdate, offset, n, grads, DType::kF32, h, model_out, model_t, stream);
}

Status ChunkedOptimizerStates::UpdateFromGradient(int64_t offset, int64_t n, const void* grad, DType grad_t,
                                                  const AdamWParams& h, Stream* stream) {
  ZERO_RETURN_IF_ERROR(Check(offset, n, "UpdateFromGradient"));
  ZERO_RETURN_IF_ERROR(Pipeline(Kind::kUpdateFromGradient, offset, n, grad, grad_t, h, nullptr, DType::kF32, stream));
  if (copy_ != nullptr) MarkCopy(offset, offset + n, true);
  return OkStatus();
}

Status ChunkedOptimizerStates::CastMaster(int64_t offset, int64_t n, void* model_out, DType model_t, Stream* stream) {
  ZERO_RETURN_IF_ERROR(Check(offset, n, "CastMaster"));
  if (model_t == model_dtype_ && CopyCurrent(offset, offset + n))
    return PublishCopy(offset, n, model_out, stream, nullptr);
  return Pipeline(Kind::kCast, offset, n, nullptr, DType::kF32, AdamWParams(), model_out, model_t, stream);
}

Status ChunkedOptimizerStates::UpdateAfter(int64_t offset, int64_t n, const float* grads, const AdamWParams& h,
                                           void* model_out, DType model_t, Event* after) {
  ZERO_RETURN_IF_ERROR(Check(offset, n, "UpdateAfter"));
  MarkCopy(offset, offset + n, false);
  return Pipeline(Kind::kUpdate, offset, n, grads, DType::kF32, h, model_out, model_t, nullptr, after);
}

Status ChunkedOptimizerStates::CastMasterAfter(int64_t offset, int64_t n, void* model_out, DType model_t,
                                               Event* after) {
  ZERO_RETURN_IF_ERROR(Check(offset, n, "CastMasterAfter"));
  if (model_t == model_dtype_ && CopyCurrent(offset, offset + n))
    return PublishCopy(offset, n, model_out, nullptr, after);
  return Pipeline(Kind::kCast, offset, n, nullptr, DType::kF32, AdamWParams(), model_out, model_t, nullptr, after);
}

Status ChunkedOptimizerStates::PublishCopy(int64_t offset, int64_t n, void* model_out, Stream* caller, Event* after) {
  if (n == 0) return OkStatus();
  // The caller's stream up to here (or `after`): model_out is no longer read.
  ZERO_RETURN_IF_ERROR(WaitForCaller(upload_.get(), caller, after));
  Event* last = nullptr;
  for (int64_t at = 0; at < n; at += chunk_) {
    const int64_t len = std::min(chunk_, n - at);
    const int64_t b = offset + at;
    ZERO_ASSIGN_OR_RETURN(std::shared_ptr<Event> updated, PooledEvent());
    ZERO_ASSIGN_OR_RETURN(std::shared_ptr<Event> stored, PooledEvent());
    ZERO_RETURN_IF_ERROR(WaitForHostRange(b, b + len));  // the copy's download has landed
    StreamObserver::SpanId trace =
        TraceBegin(observer_, TraceTrack::kHostToDevice, "chunk model copy upload", upload_.get());
    ZERO_RETURN_IF_ERROR(device_->Copy(ElementPtr(model_out, model_dtype_, at), copy_ + static_cast<size_t>(b) * 2,
                                       static_cast<size_t>(len) * 2, CopyKind::kHostToDevice, upload_.get()));
    TraceEnd(observer_, trace, upload_.get());
    ZERO_RETURN_IF_ERROR(device_->RecordEvent(updated.get(), upload_.get()));
    ZERO_RETURN_IF_ERROR(device_->RecordEvent(stored.get(), upload_.get()));
    last = updated.get();
    // No host memory written: later uploads are ordered after this one (and its wait) anyway.
    Note(b, b + len, std::move(updated), std::move(stored), false);
  }
  copy_published_ += n;
  if (caller == nullptr) return OkStatus();
  return device_->StreamWaitEvent(caller, last);
}

Status ChunkedOptimizerStates::WaitForCaller(Stream* s, Stream* caller, Event* after) {
  if (after != nullptr) return device_->StreamWaitEvent(s, after);
  ZERO_RETURN_IF_ERROR(device_->RecordEvent(entry_.get(), caller));
  return device_->StreamWaitEvent(s, entry_.get());
}

void ChunkedOptimizerStates::MarkCopy(int64_t b, int64_t e, bool valid) {
  if (copy_ == nullptr || e <= b) return;
  // Remove [b, e) from the valid ranges (trimming the ones that straddle it).
  auto it = copy_valid_.lower_bound(b);
  if (it != copy_valid_.begin()) {
    auto prev = std::prev(it);
    if (prev->second > b) {
      const int64_t end = prev->second;
      prev->second = b;
      if (end > e) copy_valid_.emplace(e, end);
    }
  }
  it = copy_valid_.lower_bound(b);
  while (it != copy_valid_.end() && it->first < e) {
    if (it->second > e) copy_valid_.emplace(e, it->second);
    it = copy_valid_.erase(it);
  }
  if (!valid) return;
  // Insert [b, e), merged with the ranges it touches.
  int64_t nb = b, ne = e;
  it = copy_valid_.lower_bound(b);
  if (it != copy_valid_.begin() && std::prev(it)->second == b) {
    --it;
    nb = it->first;
    it = copy_valid_.erase(it);
  }
  if (it != copy_valid_.end() && it->first == e) {
    ne = it->second;
    copy_valid_.erase(it);
  }
  copy_valid_.emplace(nb, ne);
}

bool ChunkedOptimizerStates::CopyCurrent(int64_t b, int64_t e) const {
  if (copy_ == nullptr) return false;
  if (e <= b) return true;
  auto it = copy_valid_.upper_bound(b);
  if (it == copy_valid_.begin()) return false;
  --it;
  return it->first <= b && it->second >= e;
}

Status ChunkedOptimizerStates::Drain() {
  for (Stream* s : {upload_.get(), update_.get(), download_.get()}) {
    if (s != nullptr) ZERO_RETURN_IF_ERROR(device_->SynchronizeStream(s));
  }
  records_.clear();
  return OkStatus();
}

Status ChunkedOptimizerStates::CopyToDevice(OptState which, int64_t offset, int64_t n, float* dst, Stream* stream) {
  ZERO_RETURN_IF_ERROR(Check(offset, n, "CopyToDevice"));
  ZERO_RETURN_IF_ERROR(Drain());
  if (n == 0) return OkStatus();
  TraceDeviceScope trace(observer_, TraceTrack::kHostToDevice, "states to the device", stream);
  ZERO_RETURN_IF_ERROR(
      device_->Copy(dst, host(which, offset), static_cast<size_t>(n) * 4, CopyKind::kHostToDevice, stream));
  return device_->SynchronizeStream(stream);
}

Status ChunkedOptimizerStates::CopyFromDevice(OptState which, int64_t offset, int64_t n, const float* src,
                                              Stream* stream) {
  ZERO_RETURN_IF_ERROR(Check(offset, n, "CopyFromDevice"));
  ZERO_RETURN_IF_ERROR(Drain());
  if (n == 0) return OkStatus();
  if (which == OptState::kMaster) MarkCopy(offset, offset + n, false);
  TraceDeviceScope trace(observer_, TraceTrack::kDeviceToHost, "states to the host", stream);
  ZERO_RETURN_IF_ERROR(
      device_->Copy(host(which, offset), src, static_cast<size_t>(n) * 4, CopyKind::kDeviceToHost, stream));
  return device_->SynchronizeStream(stream);
}

Status ChunkedOptimizerStates::Read(OptState which, int64_t offset, int64_t n, float* out) {
  ZERO_RETURN_IF_ERROR(Check(offset, n, "Read"));
  ZERO_RETURN_IF_ERROR(Drain());
  ZERO_RETURN_IF_ERROR(device_->SynchronizeStream(stream_));
  if (n > 0) std::memcpy(out, host(which, offset), static_cast<size_t>(n) * 4);
  return OkStatus();
}

Status ChunkedOptimizerStates::Write(OptState which, int64_t offset, int64_t n, const float* in) {
  ZERO_RETURN_IF_ERROR(Check(offset, n, "Write"));
  ZERO_RETURN_IF_ERROR(Drain());
  if (which == OptState::kMaster) MarkCopy(offset, offset + n, false);
  ZERO_RETURN_IF_ERROR(device_->SynchronizeStream(stream_));
  if (n > 0) std::memcpy(host(which, offset), in, static_cast<size_t>(n) * 4);
  return OkStatus();
}

OptimizerStateBytes ChunkedOptimizerStates::bytes() const {
  OptimizerStateBytes b;
  for (const Set& s : sets_) {
    for (const DeviceBuffer& d : s.state) b.device += d.bytes();
    b.device += s.model.bytes();
  }
  b.device += scratch_.bytes();
  b.host = slab_.bytes();
  return b;
}

Status ChunkedOptimizerStates::WaitForUpdates(Stream* stream) {
  Stream* streams[3] = {upload_.get(), update_.get(), download_.get()};
  for (int i = 0; i < 3; ++i) {
    ZERO_RETURN_IF_ERROR(device_->RecordEvent(tail_[i].get(), streams[i]));
    ZERO_RETURN_IF_ERROR(device_->StreamWaitEvent(stream, tail_[i].get()));
  }
  return OkStatus();
}

std::optional<ChunkEvents> ChunkedOptimizerStates::Chunk(int64_t e) const {
  auto it = records_.upper_bound(e);
  if (it == records_.begin()) return std::nullopt;
  --it;
  if (e >= it->second.end) return std::nullopt;
  return ChunkEvents{it->first, it->second.end, it->second.updated.get(), it->second.stored.get()};
}

}  // namespace zero
