// StreamObserver: the hook through which zero's components report the work they enqueue, for the
// engine's per-stream Chrome trace (zero_trace, docs/timeline.md).
//
// A component holds a StreamObserver* (null unless the engine traces: every hook is then one
// branch) and brackets the work it enqueues: a device span is begun on the stream the work goes to
// just before it is enqueued and ended on the stream where it is known to be done (the same
// stream, or, for a collective, the stream that waits for its completion); a host span times work
// the calling thread does itself (the CPU AdamW, a wait for an aio request). The observer decides
// whether to record (only in traced steps, a bounded number per step) and never fails the caller:
// its errors are kept and reported by its owner (engine/engine_timeline.h).
//
// Owns nothing; the helpers below are header-only so components depend on nothing but this file
// and runtime/device.h.
//
// Thread safety: implementations must accept calls from any thread (the host states' worker, the
// engine's thread); the streams follow Device's rule.
#pragma once

#include <chrono>
#include <cstdint>

#include "runtime/device.h"

namespace zero {

// The rows of the trace the components' work goes to (runtime/timeline.h's built-in tracks, plus
// the streamed GPU update's own row).
enum class TraceTrack { kCommunication, kHostToDevice, kDeviceToHost, kCpuOptimizer, kIo, kGpuOptimizer };

class StreamObserver {
 public:
  using SpanId = int64_t;  // 0: not recorded (EndDevice(0, ...) does nothing)

  virtual ~StreamObserver() = default;

  // Starts a device span named `name` on `track` where `stream` reaches this point (null: the
  // device's default stream). 0 when not recording.
  virtual SpanId BeginDevice(TraceTrack track, const char* name, Stream* stream) = 0;
  // Ends span `id` where `stream` reaches this point. Each id is ended at most once.
  virtual void EndDevice(SpanId id, Stream* stream) = 0;
  // A host span [begin_ns, end_ns] of the steady clock (NowNs).
  virtual void HostSpan(TraceTrack track, const char* name, int64_t begin_ns, int64_t end_ns) = 0;

  static int64_t NowNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
};

// The hooks components call; `o` may be null (nothing happens).
inline StreamObserver::SpanId TraceBegin(StreamObserver* o, TraceTrack track, const char* name, Stream* stream) {
  return o != nullptr ? o->BeginDevice(track, name, stream) : 0;
}
inline void TraceEnd(StreamObserver* o, StreamObserver::SpanId id, Stream* stream) {
  if (o != nullptr && id != 0) o->EndDevice(id, stream);
}

// A device span over the work a scope enqueues on one stream (ended on it at scope exit).
class [[nodiscard]] TraceDeviceScope {
 public:
  TraceDeviceScope(StreamObserver* o, TraceTrack track, const char* name, Stream* stream)
      : o_(o), stream_(stream), id_(TraceBegin(o, track, name, stream)) {}
  ~TraceDeviceScope() { TraceEnd(o_, id_, stream_); }
  TraceDeviceScope(const TraceDeviceScope&) = delete;
  TraceDeviceScope& operator=(const TraceDeviceScope&) = delete;

 private:
  StreamObserver* o_;
  Stream* stream_;
  StreamObserver::SpanId id_;
};

// A host span over a scope of the calling thread.
class [[nodiscard]] TraceHostScope {
 public:
  TraceHostScope(StreamObserver* o, TraceTrack track, const char* name)
      : o_(o), track_(track), name_(name), begin_ns_(o != nullptr ? StreamObserver::NowNs() : 0) {}
  ~TraceHostScope() {
    if (o_ != nullptr) o_->HostSpan(track_, name_, begin_ns_, StreamObserver::NowNs());
  }
  TraceHostScope(const TraceHostScope&) = delete;
  TraceHostScope& operator=(const TraceHostScope&) = delete;

 private:
  StreamObserver* o_;
  TraceTrack track_;
  const char* name_;
  int64_t begin_ns_;
};

}  // namespace zero
