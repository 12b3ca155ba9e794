// Timeline: tracks, host spans from several threads, device spans on the CPU backend (real
// CpuDevice timing events), the Chrome trace parsed back with nlohmann/json, and the atomic write.
#include "runtime/timeline.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "runtime/cpu_device.h"
#include "testing/scratch_dir.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

using nlohmann::json;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A clock the test advances by hand (nanoseconds).
struct FakeClock {
  std::atomic<int64_t> now{1'000'000};
  std::function<int64_t()> fn() {
    return [this] { return now.load(); };
  }
};

// The "X" events of a parsed trace, and the tid -> track name map from the metadata.
struct ParsedTrace {
  std::vector<json> spans;
  std::map<int, std::string> thread_names;
  std::string process_name;
};

ParsedTrace Parse(const std::string& text) {
  ParsedTrace p;
  const json doc = json::parse(text);  // throws (fails the test) on malformed JSON
  EXPECT_TRUE(doc.contains("traceEvents"));
  EXPECT_TRUE(doc["traceEvents"].is_array());
  for (const json& e : doc["traceEvents"]) {
    EXPECT_TRUE(e.contains("ph") && e.contains("pid") && e.contains("tid") && e.contains("name")) << e.dump();
    const std::string ph = e["ph"];
    if (ph == "M") {
      if (e["name"] == "thread_name") p.thread_names[e["tid"].get<int>()] = e["args"]["name"];
      if (e["name"] == "process_name") p.process_name = e["args"]["name"];
    } else {
      EXPECT_EQ(ph, "X") << e.dump();
      EXPECT_TRUE(e["ts"].is_number() && e["dur"].is_number()) << e.dump();
      EXPECT_GE(e["dur"].get<double>(), 0) << e.dump();
      p.spans.push_back(e);
    }
  }
  return p;
}

TEST(Timeline, BuiltinAndUserTracks) {
  Timeline t;
  EXPECT_EQ(t.num_tracks(), kNumBuiltinTracks);
  EXPECT_EQ(t.track_name(kTrackCompute), "compute");
  EXPECT_EQ(t.track_name(kTrackCommunication), "communication");
  EXPECT_EQ(t.track_name(kTrackHostToDevice), "host->device");
  EXPECT_EQ(t.track_name(kTrackDeviceToHost), "device->host");
  EXPECT_EQ(t.track_name(kTrackCpuOptimizer), "CPU optimizer");
  EXPECT_EQ(t.track_name(kTrackIo), "I/O");
  const TrackId loop = t.AddTrack("train loop");
  EXPECT_EQ(loop, kNumBuiltinTracks);
  EXPECT_EQ(t.AddTrack("train loop"), loop);
  EXPECT_EQ(t.AddTrack("I/O"), kTrackIo);
  EXPECT_EQ(t.track_name(loop), "train loop");
  EXPECT_EQ(t.track_name(99), "track 99");
}

// Nested scopes and explicit spans with a fake clock: exact microsecond values, nesting, the
// order of the events, the args and the escaping of names.
TEST(Timeline, ChromeTraceStructureAndNesting) {
  FakeClock clock;
  Timeline t(TimelineOptions{.pid = 3, .process_name = "rank 3", .clock = clock.fn()});
  const TrackId loop = t.AddTrack("train loop");
  {
    auto step = t.Scope(loop, "step 2", {{"step", int64_t{2}}});
    clock.now += 1500;  // 1.5 us
    {
      auto fwd = t.Scope(kTrackCompute, "forward", {{"micro", int64_t{0}}, {"tokens", 1.5}});
      clock.now += 10'000;
    }
    {
      auto bwd = t.Scope(kTrackCompute, "backward \"all\"\n", {{"note", std::string("a\\b")}});
      clock.now += 20'000;
    }
    clock.now += 1;
  }
  t.AddSpan(kTrackCommunication, "all-reduce", 1'005'000, 1'007'000, {{"bytes", int64_t{4096}}});
  t.AddSpan(kTrackIo, "reversed", 5'000'000, 4'000'000);  // stored as zero-length

  ASSERT_OK_AND_ASSIGN(ScratchDir scratch, ScratchDir::Create("timeline_structure"));
  const std::string path = scratch.File("structure.json");
  ASSERT_OK(t.WriteChromeTrace(path));
  const ParsedTrace p = Parse(ReadFile(path));
  EXPECT_EQ(p.process_name, "rank 3");
  ASSERT_EQ(p.thread_names.size(), static_cast<size_t>(kNumBuiltinTracks + 1));
  EXPECT_EQ(p.thread_names.at(kTrackCompute + 1), "compute");
  EXPECT_EQ(p.thread_names.at(loop + 1), "train loop");
  ASSERT_EQ(p.spans.size(), 5u);

  std::map<std::string, json> by_name;
  for (const json& s : p.spans) {
    EXPECT_EQ(s["pid"].get<int>(), 3);
    by_name[s["name"]] = s;
  }
  ASSERT_TRUE(by_name.count("backward \"all\"\n")) << "escaped name did not round-trip";
  const json& step = by_name["step 2"];
  const json& fwd = by_name["forward"];
  const json& bwd = by_name["backward \"all\"\n"];
  EXPECT_EQ(step["tid"].get<int>(), loop + 1);
  EXPECT_EQ(step["cat"], "train loop");
  EXPECT_EQ(fwd["tid"].get<int>(), kTrackCompute + 1);
  EXPECT_EQ(bwd["tid"].get<int>(), kTrackCompute + 1);
  EXPECT_EQ(by_name["all-reduce"]["tid"].get<int>(), kTrackCommunication + 1);
  // Exact microseconds from the fake nanosecond clock.
  EXPECT_DOUBLE_EQ(step["ts"].get<double>(), 1000.0);
  EXPECT_DOUBLE_EQ(step["dur"].get<double>(), 31.501);
  EXPECT_DOUBLE_EQ(fwd["ts"].get<double>(), 1001.5);
  EXPECT_DOUBLE_EQ(fwd["dur"].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(bwd["ts"].get<double>(), 1011.5);
  EXPECT_DOUBLE_EQ(bwd["dur"].get<double>(), 20.0);
  EXPECT_DOUBLE_EQ(by_name["reversed"]["dur"].get<double>(), 0.0);
  // Nesting: forward and backward lie inside the step and do not overlap.
  for (const json* child : {&fwd, &bwd}) {
    EXPECT_GE((*child)["ts"].get<double>(), step["ts"].get<double>());
    EXPECT_LE((*child)["ts"].get<double>() + (*child)["dur"].get<double>(),
              step["ts"].get<double>() + step["dur"].get<double>());
  }
  EXPECT_LE(fwd["ts"].get<double>() + fwd["dur"].get<double>(), bwd["ts"].get<double>());
  // Args.
  EXPECT_EQ(step["args"]["step"].get<int>(), 2);
  EXPECT_EQ(fwd["args"]["micro"].get<int>(), 0);
  EXPECT_DOUBLE_EQ(fwd["args"]["tokens"].get<double>(), 1.5);
  EXPECT_EQ(bwd["args"]["note"], "a\\b");
  EXPECT_EQ(by_name["all-reduce"]["args"]["bytes"].get<int>(), 4096);
  // Order: non-decreasing ts; at equal ts the enclosing (longer) span first.
  for (size_t i = 1; i < p.spans.size(); ++i) {
    EXPECT_LE(p.spans[i - 1]["ts"].get<double>(), p.spans[i]["ts"].get<double>()) << "event " << i;
  }
  EXPECT_EQ(p.spans[0]["name"], "step 2");
}

// Threads recording at once on their own tracks (and two on a shared one): every span lands on
// its thread's track, none is lost, and one thread's spans on a track do not overlap.
TEST(Timeline, SpansFromSeveralThreadsLandOnTheirTracks) {
  Timeline t;
  const TrackId user = t.AddTrack("user work");
  const std::vector<TrackId> tracks = {kTrackCompute, kTrackCommunication, kTrackHostToDevice, kTrackCpuOptimizer, user,
                                       user};
  constexpr int kPerThread = 200;
  std::vector<std::thread> threads;
  for (size_t w = 0; w < tracks.size(); ++w) {
    threads.emplace_back([&, w] {
      for (int i = 0; i < kPerThread; ++i) {
        auto s = t.Scope(tracks[w], "w" + std::to_string(w) + " #" + std::to_string(i),
                         {{"worker", static_cast<int64_t>(w)}, {"i", int64_t{i}}});
      }
    });
  }
  for (auto& th : threads) th.join();
  const ParsedTrace p = Parse(t.ChromeTraceJson());
  ASSERT_EQ(p.spans.size(), tracks.size() * kPerThread);
  std::map<int, std::vector<json>> by_worker;
  for (const json& s : p.spans) {
    const int w = s["args"]["worker"].get<int>();
    EXPECT_EQ(s["tid"].get<int>(), tracks[w] + 1) << s.dump();
    EXPECT_EQ(s["cat"], p.thread_names.at(tracks[w] + 1)) << s.dump();
    by_worker[w].push_back(s);
  }
  for (auto& [w, spans] : by_worker) {
    ASSERT_EQ(spans.size(), static_cast<size_t>(kPerThread)) << "worker " << w;
    std::sort(spans.begin(), spans.end(), [](const json& a, const json& b) { return a["args"]["i"] < b["args"]["i"]; });
    for (size_t i = 1; i < spans.size(); ++i) {
      // Integer nanoseconds printed as exact decimals: compare in nanoseconds.
      const auto ns = [](const json& v) { return std::llround(v.get<double>() * 1000); };
      EXPECT_LE(ns(spans[i - 1]["ts"]) + ns(spans[i - 1]["dur"]), ns(spans[i]["ts"]))
          << "worker " << w << " span " << i;
    }
  }
}

TEST(Timeline, DisabledRecordsNothingAndMaxSpansCountsDrops) {
  FakeClock clock;
  Timeline t(TimelineOptions{.enabled = false, .max_spans = 3, .clock = clock.fn()});
  { auto s = t.Scope(kTrackCompute, "off"); }
  t.AddSpan(kTrackCompute, "off", 0, 1);
  EXPECT_TRUE(t.Spans().empty());
  t.set_enabled(true);
  for (int i = 0; i < 5; ++i) t.AddSpan(kTrackIo, "io", i, i + 1);
  EXPECT_EQ(t.Spans().size(), 3u);
  EXPECT_EQ(t.dropped(), 2u);
  EXPECT_EQ(json::parse(t.ChromeTraceJson())["otherData"]["dropped_spans"].get<int>(), 2);
  t.Clear();
  EXPECT_TRUE(t.Spans().empty());
  EXPECT_EQ(t.dropped(), 0u);
}

// The CPU backend's timing events: host time at RecordEvent; errors for misuse.
TEST(Timeline, CpuDeviceElapsedMilliseconds) {
  CpuDevice device;
  auto a = device.CreateTimingEvent(), b = device.CreateTimingEvent(), plain = device.CreateEvent();
  ASSERT_TRUE(a.ok() && b.ok() && plain.ok());
  auto never = device.ElapsedMilliseconds(a->get(), b->get());
  EXPECT_EQ(never.status().code(), StatusCode::kFailedPrecondition) << never.status().ToString();
  EXPECT_NE(never.status().message().find("never recorded"), std::string::npos);
  ASSERT_OK(device.RecordEvent(a->get(), nullptr));
  ASSERT_OK(device.RecordEvent(b->get(), nullptr));
  ASSERT_OK(device.RecordEvent(plain->get(), nullptr));
  auto ms = device.ElapsedMilliseconds(a->get(), b->get());
  ASSERT_OK(ms);
  ASSERT_TRUE(ms->has_value());
  EXPECT_GE(**ms, 0.0);
  auto back = device.ElapsedMilliseconds(b->get(), a->get());
  ASSERT_TRUE(back.ok() && back->has_value());
  EXPECT_EQ(**back, -**ms);
  auto bad = device.ElapsedMilliseconds(a->get(), plain->get());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("end event is not a timing event"), std::string::npos)
      << bad.status().ToString();
}

// Device spans on the CPU backend: pending until resolved, then on their tracks, in stream order.
TEST(Timeline, DeviceSpansResolveLazilyOntoTheirTracks) {
  CpuDevice device;
  Timeline t;
  // Without a device, device spans are empty and record nothing.
  auto none = t.BeginDeviceSpan(kTrackCompute, "no device", nullptr);
  ASSERT_OK(none);
  EXPECT_TRUE(none->empty());
  ASSERT_OK(t.EndDeviceSpan(std::move(none).value(), nullptr));

  ASSERT_OK(t.AttachDevice(&device));
  auto stream = device.CreateStream();
  ASSERT_OK(stream);
  auto buf = device.Allocate(1 << 20);
  auto host = device.AllocatePinned(1 << 20);
  ASSERT_TRUE(buf.ok() && host.ok());
  const std::vector<std::pair<TrackId, std::string>> work = {
      {kTrackHostToDevice, "fetch"}, {kTrackCompute, "fill"}, {kTrackDeviceToHost, "write back"}};
  for (int round = 0; round < 3; ++round) {
    for (const auto& [track, name] : work) {
      auto span = t.BeginDeviceSpan(track, name, stream->get(), {{"round", int64_t{round}}});
      ASSERT_OK(span);
      ASSERT_FALSE(span->empty());
      if (track == kTrackCompute) {
        ASSERT_OK(device.Fill(buf->data(), DType::kF32, (1 << 20) / 4, 1.0f, stream->get()));
      } else {
        const CopyKind kind = track == kTrackHostToDevice ? CopyKind::kHostToDevice : CopyKind::kDeviceToHost;
        void* dst = track == kTrackHostToDevice ? buf->data() : host->data();
        const void* src = track == kTrackHostToDevice ? host->data() : buf->data();
        ASSERT_OK(device.Copy(dst, src, 1 << 20, kind, stream->get()));
      }
      ASSERT_OK(t.EndDeviceSpan(std::move(span).value(), stream->get()));
    }
  }
  // Recording only queued them.
  EXPECT_EQ(t.pending_device_spans(), 9u);
  EXPECT_TRUE(t.Spans().empty());
  auto left = t.ResolveDeviceSpans();
  ASSERT_OK(left);
  EXPECT_EQ(*left, 0u);  // CPU work is complete when enqueued
  const std::vector<Span> spans = t.Spans();
  ASSERT_EQ(spans.size(), 9u);
  for (size_t i = 0; i < spans.size(); ++i) {
    EXPECT_EQ(spans[i].track, work[i % 3].first) << i;
    EXPECT_EQ(spans[i].name, work[i % 3].second) << i;
    EXPECT_LE(spans[i].begin_ns, spans[i].end_ns) << i;
    if (i > 0) {
      EXPECT_LE(spans[i - 1].end_ns, spans[i].begin_ns) << "stream order broken at span " << i;
    }
  }
  const ParsedTrace p = Parse(t.ChromeTraceJson());
  ASSERT_EQ(p.spans.size(), 9u);
  const std::map<std::string, TrackId> track_of = {
      {"fetch", kTrackHostToDevice}, {"fill", kTrackCompute}, {"write back", kTrackDeviceToHost}};
  for (const json& s : p.spans) {
    ASSERT_TRUE(track_of.count(s["name"])) << s.dump();
    EXPECT_EQ(s["tid"].get<int>(), track_of.at(s["name"]) + 1) << s.dump();
  }
  // Disabled: device spans are empty too.
  t.set_enabled(false);
  auto off = t.BeginDeviceSpan(kTrackCompute, "off", nullptr);
  ASSERT_OK(off);
  EXPECT_TRUE(off->empty());
}

TEST(Timeline, WriteIsAtomicAndErrorsNameThePath) {
  Timeline t;
  t.AddSpan(kTrackCompute, "x", 0, 1000);
  ASSERT_OK_AND_ASSIGN(ScratchDir scratch, ScratchDir::Create("timeline_atomic"));
  const std::string path = scratch.File("trace.json");
  { std::ofstream(path) << "old contents"; }
  ASSERT_OK(t.WriteChromeTrace(path));
  EXPECT_EQ(Parse(ReadFile(path)).spans.size(), 1u);
  // Only the trace is left in the directory (no temporary file).
  EXPECT_NE(access(path.c_str(), R_OK), -1);
  EXPECT_EQ(access((path + ".tmp." + std::to_string(getpid())).c_str(), F_OK), -1);
  const std::string missing = scratch.File("no/such/dir/trace.json");
  Status st = t.WriteChromeTrace(missing);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("no/such/dir/trace.json"), std::string::npos) << st.ToString();
}

}  // namespace
}  // namespace zero
