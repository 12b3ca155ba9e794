#include "runtime/timeline.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <utility>

namespace zero {
namespace {

constexpr const char* kBuiltinTrackNames[kNumBuiltinTracks] = {
    "compute", "communication", "host->device", "device->host", "CPU optimizer", "I/O",
};

// Resolve (without blocking) once this many device spans are pending, so a long traced window
// keeps a bounded number of events in flight.
constexpr size_t kResolveEvery = 256;

int64_t SteadyNowNs() { return std::chrono::steady_clock::now().time_since_epoch().count(); }

void AppendJsonString(std::string* out, const std::string& s) {
  out->push_back('"');
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      default:
        if (u < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", u);
          *out += buf;
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

// Nanoseconds as microseconds with three decimals: exact, and monotonic in the input.
void AppendMicros(std::string* out, int64_t ns) {
  char buf[40];
  const bool neg = ns < 0;
  const uint64_t a = neg ? static_cast<uint64_t>(-(ns + 1)) + 1 : static_cast<uint64_t>(ns);
  std::snprintf(buf, sizeof(buf), "%s%llu.%03llu", neg ? "-" : "", static_cast<unsigned long long>(a / 1000),
                static_cast<unsigned long long>(a % 1000));
  *out += buf;
}

void AppendArgs(std::string* out, const SpanArgs& args) {
  out->push_back('{');
  for (size_t i = 0; i < args.size(); ++i) {
    if (i > 0) out->push_back(',');
    AppendJsonString(out, args[i].key);
    out->push_back(':');
    const auto& v = args[i].value;
    if (const auto* s = std::get_if<std::string>(&v)) {
      AppendJsonString(out, *s);
    } else if (const auto* n = std::get_if<int64_t>(&v)) {
      *out += std::to_string(*n);
    } else {
      const double d = std::get<double>(v);
      if (std::isfinite(d)) {
        char buf[32];
        std::snprintf(buf, sizeof(buf), "%.17g", d);
        *out += buf;
      } else {
        *out += "null";  // JSON has no Inf/NaN
      }
    }
  }
  out->push_back('}');
}

}  // namespace

// --- Timeline ---------------------------------------------------------------------------------------

Timeline::Timeline(TimelineOptions options) : options_(std::move(options)), enabled_(options_.enabled) {
  if (!options_.clock) options_.clock = SteadyNowNs;
  tracks_.assign(std::begin(kBuiltinTrackNames), std::end(kBuiltinTrackNames));
}

Timeline::~Timeline() = default;

void Timeline::set_enabled(bool enabled) { enabled_.store(enabled, std::memory_order_relaxed); }
bool Timeline::enabled() const { return enabled_.load(std::memory_order_relaxed); }

TrackId Timeline::AddTrack(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < tracks_.size(); ++i) {
    if (tracks_[i] == name) return static_cast<TrackId>(i);
  }
  tracks_.push_back(name);
  return static_cast<TrackId>(tracks_.size() - 1);
}

std::string Timeline::track_name(TrackId track) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (track >= 0 && static_cast<size_t>(track) < tracks_.size()) return tracks_[track];
  return "track " + std::to_string(track);
}

int Timeline::num_tracks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(tracks_.size());
}

int64_t Timeline::Now() const { return options_.clock(); }

void Timeline::Store(Span span) {
  if (spans_.size() >= options_.max_spans) {
    ++dropped_;
    return;
  }
  spans_.push_back(std::move(span));
}

void Timeline::AddSpan(TrackId track, std::string name, int64_t begin_ns, int64_t end_ns, SpanArgs args) {
  if (!enabled()) return;
  Span s{track, std::move(name), begin_ns, std::max(begin_ns, end_ns), std::move(args)};
  std::lock_guard<std::mutex> lock(mu_);
  Store(std::move(s));
}

Timeline::ScopedSpan::ScopedSpan(Timeline* t, TrackId track, std::string name, SpanArgs args)
    : timeline_(t->enabled() ? t : nullptr), track_(track), name_(std::move(name)), args_(std::move(args)) {
  if (timeline_ != nullptr) begin_ns_ = timeline_->Now();
}

Timeline::ScopedSpan::ScopedSpan(ScopedSpan&& o) noexcept
    : timeline_(o.timeline_),
      track_(o.track_),
      name_(std::move(o.name_)),
      args_(std::move(o.args_)),
      begin_ns_(o.begin_ns_) {
  o.timeline_ = nullptr;
}

Timeline::ScopedSpan::~ScopedSpan() {
  if (timeline_ != nullptr) {
    timeline_->AddSpan(track_, std::move(name_), begin_ns_, timeline_->Now(), std::move(args_));
  }
}

Timeline::ScopedSpan Timeline::Scope(TrackId track, std::string name, SpanArgs args) {
  return ScopedSpan(this, track, std::move(name), std::move(args));
}

// --- device spans -------------------------------------------------------------------------------

Status Timeline::AttachDevice(Device* device) {
  if (device == nullptr) return InvalidArgumentError("Timeline::AttachDevice: null device");
  auto anchor = std::make_shared<Anchor>();
  anchor->device = device;
  auto ev = device->CreateTimingEvent();
  if (!ev.ok()) return ev.status().WithContext("Timeline::AttachDevice(" + device->name() + ")");
  anchor->event = std::move(ev).value();
  // With the device idle, the anchor completes as soon as it is recorded: its host time is the
  // middle of [record, completion seen].
  ZERO_RETURN_IF_ERROR(device->Synchronize().WithContext("Timeline::AttachDevice: synchronize"));
  const int64_t t0 = Now();
  ZERO_RETURN_IF_ERROR(device->RecordEvent(anchor->event.get(), nullptr));
  ZERO_RETURN_IF_ERROR(device->SynchronizeEvent(anchor->event.get()));
  const int64_t t1 = Now();
  anchor->host_ns = t0 + (t1 - t0) / 2;
  std::lock_guard<std::mutex> lock(mu_);
  if (anchor_ != nullptr && anchor_->device != device) free_events_.clear();
  anchor_ = std::move(anchor);
  return OkStatus();
}

Result<std::unique_ptr<Event>> Timeline::TakeEvent(Device* device) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_events_.empty() && anchor_ != nullptr && anchor_->device == device) {
      std::unique_ptr<Event> e = std::move(free_events_.back());
      free_events_.pop_back();
      return e;
    }
  }
  return device->CreateTimingEvent();
}

Result<Timeline::DeviceSpan> Timeline::BeginDeviceSpan(TrackId track, std::string name, Stream* stream, SpanArgs args) {
  DeviceSpan span;
  if (!enabled()) return span;
  std::shared_ptr<const Anchor> anchor;
  {
    std::lock_guard<std::mutex> lock(mu_);
    anchor = anchor_;
  }
  if (anchor == nullptr) return span;
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Event> start, TakeEvent(anchor->device));
  Status st = anchor->device->RecordEvent(start.get(), stream);
  if (!st.ok()) return st.WithContext("Timeline: beginning device span '" + name + "'");
  span.track_ = track;
  span.name_ = std::move(name);
  span.args_ = std::move(args);
  span.start_ = std::move(start);
  return span;
}

Status Timeline::EndDeviceSpan(DeviceSpan span, Stream* stream) {
  if (span.empty()) return OkStatus();
  std::shared_ptr<const Anchor> anchor;
  {
    std::lock_guard<std::mutex> lock(mu_);
    anchor = anchor_;
  }
  if (anchor == nullptr)
    return FailedPreconditionError("Timeline: device span '" + span.name_ + "' ended with no device attached");
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Event> end, TakeEvent(anchor->device));
  Status st = anchor->device->RecordEvent(end.get(), stream);
  if (!st.ok()) return st.WithContext("Timeline: ending device span '" + span.name_ + "'");
  std::lock_guard<std::mutex> lock(mu_);
  pending_.push_back(Pending{span.track_, std::move(span.name_), std::move(span.args_), std::move(span.start_),
                             std::move(end), anchor});
  if (pending_.size() >= kResolveEvery) {
    size_t left = 0;
    return ResolveLocked(/*wait=*/false, &left);
  }
  return OkStatus();
}

Result<bool> Timeline::TryResolve(Pending& p, bool wait) {
  Device* device = p.anchor->device;
  if (wait) {
    ZERO_RETURN_IF_ERROR(
        device->SynchronizeEvent(p.end.get()).WithContext("Timeline: waiting for device span '" + p.name + "'"));
  }
  ZERO_ASSIGN_OR_RETURN(std::optional<double> to_end, device->ElapsedMilliseconds(p.anchor->event.get(), p.end.get()));
  if (!to_end.has_value()) return false;
  ZERO_ASSIGN_OR_RETURN(std::optional<double> to_start,
                        device->ElapsedMilliseconds(p.anchor->event.get(), p.start.get()));
  ZERO_ASSIGN_OR_RETURN(std::optional<double> length, device->ElapsedMilliseconds(p.start.get(), p.end.get()));
  if (!to_start.has_value() || !length.has_value()) return false;
  const int64_t begin = p.anchor->host_ns + std::llround(*to_start * 1e6);
  const int64_t dur = std::max<int64_t>(0, std::llround(*length * 1e6));
  Store(Span{p.track, std::move(p.name), begin, begin + dur, std::move(p.args)});
  if (anchor_ != nullptr && anchor_->device == device) {
    free_events_.push_back(std::move(p.start));
    free_events_.push_back(std::move(p.end));
  }
  return true;
}

Status Timeline::ResolveLocked(bool wait, size_t* still_pending) {
  size_t kept = 0;
  Status first_error;
  for (size_t i = 0; i < pending_.size(); ++i) {
    Result<bool> done = TryResolve(pending_[i], wait);
    if (done.ok() && *done) continue;
    if (!done.ok() && first_error.ok()) first_error = done.status();
    if (done.ok()) {
      if (kept != i) pending_[kept] = std::move(pending_[i]);
      ++kept;
    }
    // A span whose events fail to resolve is dropped (counted), so one bad event does not stall
    // every later resolution.
    if (!done.ok()) ++dropped_;
  }
  pending_.resize(kept);
  *still_pending = kept;
  return first_error;
}

Result<size_t> Timeline::ResolveDeviceSpans() {
  std::lock_guard<std::mutex> lock(mu_);
  size_t left = 0;
  ZERO_RETURN_IF_ERROR(ResolveLocked(/*wait=*/false, &left));
  return left;
}

Status Timeline::WaitDeviceSpans() {
  std::lock_guard<std::mutex> lock(mu_);
  size_t left = 0;
  return ResolveLocked(/*wait=*/true, &left);
}

size_t Timeline::pending_device_spans() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_.size();
}

std::vector<Span> Timeline::Spans() const {
  std::lock_guard<std::mutex> lock(mu_);
  return spans_;
}

size_t Timeline::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

void Timeline::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  spans_.clear();
  dropped_ = 0;
}

// --- Chrome trace -----------------------------------------------------------------------------------

std::string Timeline::ChromeTraceJson() const {
  std::vector<Span> spans;
  std::vector<std::string> tracks;
  size_t dropped = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    spans = spans_;
    tracks = tracks_;
    dropped = dropped_;
  }
  // Parents before children: by begin, then the longer first (the viewers nest by containment).
  std::stable_sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    if (a.begin_ns != b.begin_ns) return a.begin_ns < b.begin_ns;
    return a.end_ns > b.end_ns;
  });
  const std::string pid = std::to_string(options_.pid);
  std::string out = "{\"traceEvents\":[\n";
  out += "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" + pid + ",\"tid\":0,\"args\":{\"name\":";
  AppendJsonString(&out, options_.process_name);
  out += "}}";
  for (size_t t = 0; t < tracks.size(); ++t) {
    const std::string tid = std::to_string(t + 1);
    out += ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" + pid + ",\"tid\":" + tid + ",\"args\":{\"name\":";
    AppendJsonString(&out, tracks[t]);
    out += "}}";
    out += ",\n{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":" + pid + ",\"tid\":" + tid +
           ",\"args\":{\"sort_index\":" + tid + "}}";
  }
  for (const Span& s : spans) {
    out += ",\n{\"ph\":\"X\",\"name\":";
    AppendJsonString(&out, s.name);
    out += ",\"cat\":";
    AppendJsonString(&out, s.track >= 0 && static_cast<size_t>(s.track) < tracks.size()
                               ? tracks[s.track]
                               : "track " + std::to_string(s.track));
    out += ",\"pid\":" + pid + ",\"tid\":" + std::to_string(s.track + 1) + ",\"ts\":";
    AppendMicros(&out, s.begin_ns);
    out += ",\"dur\":";
    AppendMicros(&out, s.end_ns - s.begin_ns);
    if (!s.args.empty()) {
      out += ",\"args\":";
      AppendArgs(&out, s.args);
    }
    out += "}";
  }
  out += "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"dropped_spans\":" + std::to_string(dropped) + "}}\n";
  return out;
}

Status Timeline::WriteChromeTrace(const std::string& path) {
  ZERO_RETURN_IF_ERROR(WaitDeviceSpans().WithContext("writing the trace " + path));
  return WriteFileAtomically(path, ChromeTraceJson());
}

Status WriteFileAtomically(const std::string& path, const std::string& contents) {
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("open (for writing)", tmp, errno);
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = write(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(fd);
      unlink(tmp.c_str());
      return ErrnoError("write", tmp, err);
    }
    done += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) {
    const int err = errno;
    close(fd);
    unlink(tmp.c_str());
    return ErrnoError("fsync", tmp, err);
  }
  if (close(fd) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return ErrnoError("close", tmp, err);
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return ErrnoError("rename " + tmp + " to", path, err);
  }
  return OkStatus();
}

}  // namespace zero
