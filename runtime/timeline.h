// Timeline: a thread-safe recorder of the spans of work one rank does, one track per kind of work
// (compute, communication, host->device, device->host, CPU optimizer, I/O, and tracks the user
// adds), written as a Chrome trace that chrome://tracing and Perfetto open (docs/timeline.md).
//
// Owns only its spans, its device anchor and a pool of timing events it created; it never touches
// a stream except to record its own events on the streams it is handed. Host spans carry host
// timestamps (steady_clock nanoseconds, or TimelineOptions::clock). Device spans are bracketed by
// two timing events (Device::CreateTimingEvent) and resolved lazily: recording one enqueues two
// event records and nothing else, and ResolveDeviceSpans only queries events that have completed
// (Device::ElapsedMilliseconds never blocks); only AttachDevice (set-up) and WaitDeviceSpans /
// WriteChromeTrace (the end) synchronize. A device span's position on the host clock is the anchor's
// host time plus the device time since the anchor (AttachDevice); its length is the device time
// between its two events.
//
// Thread safety: every method may be called from any thread. The streams handed to the device-span
// calls follow Device's rule (one thread at a time per stream).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <variant>
#include <vector>

#include "runtime/device.h"
#include "runtime/status.h"

namespace zero {

// A track: one row of the trace (a Chrome trace "thread"). The built-in ones always exist.
using TrackId = int;
inline constexpr TrackId kTrackCompute = 0;        // the compute stream: forward, backward, kernels
inline constexpr TrackId kTrackCommunication = 1;  // collectives (reduce-scatter, all-gather, ...)
inline constexpr TrackId kTrackHostToDevice = 2;   // copies host -> device (offload fetches)
inline constexpr TrackId kTrackDeviceToHost = 3;   // copies device -> host (offload writes)
inline constexpr TrackId kTrackCpuOptimizer = 4;   // the optimizer step on the host (CPU AdamW)
inline constexpr TrackId kTrackIo = 5;             // file I/O: NVMe swap, checkpoints
inline constexpr int kNumBuiltinTracks = 6;

// One key of a span's "args" (shown when the span is selected in the viewer).
struct SpanArg {
  std::string key;
  std::variant<std::string, int64_t, double> value;
};
using SpanArgs = std::vector<SpanArg>;

// A finished span: [begin_ns, end_ns] on the host clock.
struct Span {
  TrackId track = kTrackCompute;
  std::string name;
  int64_t begin_ns = 0;
  int64_t end_ns = 0;
  SpanArgs args;
};

struct TimelineOptions {
  int pid = 0;                          // the trace's process id: the rank
  std::string process_name = "rank 0";  // its label in the viewer
  bool enabled = true;                  // set_enabled() changes it later
  size_t max_spans = size_t{1} << 20;   // spans past this are dropped (and counted: dropped())
  // Host clock in nanoseconds; default steady_clock. Device spans assume the default (the CPU
  // backend's events carry steady_clock time), so a custom clock is for host-only timelines (tests).
  std::function<int64_t()> clock;
};

class Timeline {
 public:
  explicit Timeline(TimelineOptions options = {});
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // While disabled every record call is a no-op (cheap: one atomic load); spans already recorded
  // stay. A device span begun while enabled is still recorded at its end.
  void set_enabled(bool enabled);
  bool enabled() const;

  // A user track named `name` (the same id for a name already added, built-in names included).
  TrackId AddTrack(const std::string& name);
  // The track's name; "track N" for an id never added.
  std::string track_name(TrackId track) const;
  int num_tracks() const;

  int64_t Now() const;  // the host clock, nanoseconds

  // Records a complete host span. REQUIRES: end_ns >= begin_ns (a reversed span is stored with
  // end = begin).
  void AddSpan(TrackId track, std::string name, int64_t begin_ns, int64_t end_ns, SpanArgs args = {});

  // Records [construction, destruction) of the scope on `track`.
  class [[nodiscard]] ScopedSpan {
   public:
    ScopedSpan(ScopedSpan&& o) noexcept;
    ScopedSpan& operator=(ScopedSpan&&) = delete;
    ~ScopedSpan();

   private:
    friend class Timeline;
    ScopedSpan(Timeline* t, TrackId track, std::string name, SpanArgs args);
    Timeline* timeline_;  // null: disabled at the start, or moved from
    TrackId track_;
    std::string name_;
    SpanArgs args_;
    int64_t begin_ns_ = 0;
  };
  ScopedSpan Scope(TrackId track, std::string name, SpanArgs args = {});

  // --- device spans ------------------------------------------------------------------------------
  // Aligns `device`'s clock with the host clock: synchronizes the device once, records an anchor
  // event and notes the host time. Call at set-up (or again to re-anchor, e.g. before a traced
  // window of a long run: ElapsedMilliseconds is a float, so positions lose precision hours away
  // from the anchor). Unimplemented if the backend cannot time events.
  Status AttachDevice(Device* device);

  // A device span between BeginDeviceSpan and EndDeviceSpan. Move-only; empty (recording nothing)
  // when the timeline was disabled or had no device at the begin.
  class DeviceSpan {
   public:
    DeviceSpan() = default;
    DeviceSpan(DeviceSpan&&) noexcept = default;
    DeviceSpan& operator=(DeviceSpan&&) noexcept = default;
    bool empty() const { return start_ == nullptr; }

   private:
    friend class Timeline;
    TrackId track_ = kTrackCompute;
    std::string name_;
    SpanArgs args_;
    std::unique_ptr<Event> start_;
  };
  // Records the span's start event on `stream` (null: the default stream). Errors come from the
  // device (the span is then empty).
  Result<DeviceSpan> BeginDeviceSpan(TrackId track, std::string name, Stream* stream, SpanArgs args = {});
  // Records the end event on `stream` (usually the begin's stream; another stream of the device
  // works as long as it runs after the begin) and queues the span for resolution.
  Status EndDeviceSpan(DeviceSpan span, Stream* stream);

  // Moves every device span whose events have completed into the span list; never blocks.
  // Returns how many are still pending.
  Result<size_t> ResolveDeviceSpans();
  // Waits for every pending device span (synchronizes on its end event) and resolves it.
  Status WaitDeviceSpans();
  size_t pending_device_spans() const;

  // A copy of the resolved spans, in recording order (device spans in resolution order).
  std::vector<Span> Spans() const;
  size_t dropped() const;  // spans not kept because of max_spans
  // Forgets the resolved spans and the dropped count (tracks, anchor and pending spans stay).
  void Clear();

  // The Chrome trace JSON of the resolved spans: {"traceEvents": [...]} with a process_name,
  // thread_name and thread_sort_index metadata event ("ph": "M") per track, then one complete event
  // ("ph": "X") per span, pid = options.pid, tid = track + 1, ts and dur in microseconds of the host
  // clock (absolute, so traces of ranks on one host can be merged), sorted by (ts, longest first).
  std::string ChromeTraceJson() const;
  // WaitDeviceSpans, then writes ChromeTraceJson to `path` atomically (a temporary file in the same
  // directory, fsync, rename): a reader sees the old file or the whole new one. Errors name the path.
  Status WriteChromeTrace(const std::string& path);

 private:
  struct Anchor {
    Device* device = nullptr;
    std::unique_ptr<Event> event;
    int64_t host_ns = 0;
  };
  struct Pending {
    TrackId track;
    std::string name;
    SpanArgs args;
    std::unique_ptr<Event> start, end;
    std::shared_ptr<const Anchor> anchor;
  };
  void Store(Span span);  // REQUIRES: mu_ held
  Result<std::unique_ptr<Event>> TakeEvent(Device* device);
  // Resolves pending_[i] if complete (or, with wait, after waiting). REQUIRES: mu_ held.
  Result<bool> TryResolve(Pending& p, bool wait);
  Status ResolveLocked(bool wait, size_t* still_pending);

  TimelineOptions options_;
  std::atomic<bool> enabled_;
  mutable std::mutex mu_;
  std::vector<std::string> tracks_;                  // GUARDED_BY(mu_)
  std::vector<Span> spans_;                          // GUARDED_BY(mu_)
  size_t dropped_ = 0;                               // GUARDED_BY(mu_)
  std::shared_ptr<const Anchor> anchor_;             // GUARDED_BY(mu_)
  std::vector<Pending> pending_;                     // GUARDED_BY(mu_)
  std::vector<std::unique_ptr<Event>> free_events_;  // GUARDED_BY(mu_): timing events of anchor_'s device
};

// Writes `contents` to `path` atomically (temporary file in the same directory, fsync, rename).
Status WriteFileAtomically(const std::string& path, const std::string& contents);

}  // namespace zero
