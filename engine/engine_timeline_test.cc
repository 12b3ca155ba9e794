// The engine's own step timeline through the Engine (CPU backend, real Gloo between thread ranks):
// wall_clock_breakdown's line every steps_per_print optimizer steps (and never when off), the
// zero_trace Chrome trace (valid JSON, the six tracks, spans nested in their step, the components'
// per-stream spans through the stream observer, NVMe runs' aio spans, no observer without
// zero_trace) and the zero_trace config errors.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/thread_ranks.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "engine/engine_timeline.h"
#include "testing/scratch_dir.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

using namespace ::zero::testing;  // NOLINT: the engine test helpers

Result<std::unique_ptr<Engine>> MakeEngineWithSink(const Config& config, const TestModel& model, Device* device,
                                                   Communicator* comm, std::function<void(const std::string&)> sink) {
  EngineEnv env;
  env.log_sink = std::move(sink);
  ZERO_ASSIGN_OR_RETURN(auto engine, Engine::Create(config, device, comm, env));
  for (const ParamSpec& s : model.specs) ZERO_RETURN_IF_ERROR(engine->RegisterParameter(s).status());
  Engine* e = engine.get();
  ZERO_RETURN_IF_ERROR(engine->Initialize([e](int index, float* v) {
    const int64_t n = Numel(e->param_spec(index));
    for (int64_t k = 0; k < n; ++k) v[k] = InitValue(index, k);
  }));
  return engine;
}

struct RankRun {
  std::vector<std::string> lines;           // what the sink got on this rank
  std::map<std::string, double> breakdown;  // wall_clock_breakdown() after the run
};

// `steps` optimizer steps on `world` thread ranks of SmallModel with `json`.
std::vector<RankRun> TrainRanks(const std::string& json, int world, int steps) {
  std::vector<RankRun> runs(world);
  Status s = RunThreadRanks(world, [&](int rank, Communicator* comm, Device* device) -> Status {
    ZERO_ASSIGN_OR_RETURN(Config config, MakeConfig(json, world));
    RankRun& run = runs[rank];
    ZERO_ASSIGN_OR_RETURN(auto engine, MakeEngineWithSink(config, SmallModel(), device, comm,
                                                          [&run](const std::string& l) { run.lines.push_back(l); }));
    TrainOptions opt;
    opt.steps = steps;
    TrainResult r;
    ZERO_RETURN_IF_ERROR(TrainSteps(engine.get(), device, SmallModel(), rank, opt, &r));
    run.breakdown = engine->wall_clock_breakdown();
    return OkStatus();
  });
  EXPECT_OK(s);
  return runs;
}

const char* const kOffload = "\"offload_optimizer\": {\"device\": \"cpu\"}";

TEST(EngineTimelineTest, BreakdownLineEveryStepsPerPrintWithTheFiveTimers) {
  // Stage 2 on two ranks with CPU-offloaded states: every one of the five timers has time.
  const std::string json = ConfigJson(2, 2, 1.0, "\"wall_clock_breakdown\": true, \"steps_per_print\": 2", kOffload);
  const std::vector<RankRun> runs = TrainRanks(json, 2, 5);
  ASSERT_EQ(runs.size(), 2u);
  // After optimizer steps 2 and 4; rank 0 only (DeepSpeed's habit).
  ASSERT_EQ(runs[0].lines.size(), 2u);
  EXPECT_TRUE(runs[1].lines.empty()) << runs[1].lines[0];
  for (const std::string& line : runs[0].lines) {
    std::printf("%s\n", line.c_str());
    double v[5] = {-1, -1, -1, -1, -1};
    ASSERT_EQ(std::sscanf(line.c_str(),
                          "time (ms) | forward: %lf | backward: %lf | step: %lf | communication: %lf | offload: %lf",
                          &v[0], &v[1], &v[2], &v[3], &v[4]),
              5)
        << "expected the five timers in DeepSpeed's format, got: " << line;
    for (double x : v) EXPECT_GE(x, 0.0) << line;
  }
  for (int rank = 0; rank < 2; ++rank) {
    const auto& b = runs[rank].breakdown;
    for (const char* name : {"forward", "backward", "step", "communication", "offload"}) {
      ASSERT_EQ(b.count(name), 1u) << "rank " << rank << ": no '" << name << "' in the last window";
      EXPECT_GT(b.at(name), 0.0) << "rank " << rank << ": " << name;
    }
    // Communication and offload nest inside the phases: their sum is no more than the phases'.
    EXPECT_LE(b.at("offload"), b.at("backward") + b.at("step")) << "rank " << rank;
  }
}

TEST(EngineTimelineTest, NothingWithoutWallClockBreakdown) {
  const std::vector<RankRun> runs = TrainRanks(ConfigJson(2, 2, 1.0, "\"steps_per_print\": 1", kOffload), 2, 3);
  for (const RankRun& r : runs) {
    EXPECT_TRUE(r.lines.empty()) << r.lines[0];
    EXPECT_TRUE(r.breakdown.empty());
  }
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream b;
  b << in.rdbuf();
  return b.str();
}

struct TraceSpan {
  std::string name, track;
  double ts, end;
};

// Rank `rank`'s trace file `file`: its spans, the six built-in tracks checked present, every span
// but the "step N" ones checked to lie inside one of the `steps` traced steps (named in order),
// the spans counted by "track/name" into `count`.
void ReadTrace(const std::string& file, int rank, const std::vector<std::string>& steps,
               std::map<std::string, int>* count) {
  const std::string text = ReadFile(file);
  ASSERT_FALSE(text.empty()) << "no trace at " << file;
  const nlohmann::json doc = nlohmann::json::parse(text);  // throws (fails the test) on malformed JSON
  std::map<int, std::string> tracks;
  std::vector<TraceSpan> spans;
  for (const auto& e : doc.at("traceEvents")) {
    EXPECT_EQ(e.at("pid").get<int>(), rank);
    if (e.at("ph") == "M" && e.at("name") == "thread_name") {
      tracks[e.at("tid").get<int>()] = e.at("args").at("name").get<std::string>();
    }
  }
  for (const auto& e : doc.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    const double ts = e.at("ts").get<double>(), dur = e.at("dur").get<double>();
    spans.push_back({e.at("name").get<std::string>(), tracks.at(e.at("tid").get<int>()), ts, ts + dur});
  }
  for (const char* t : {"compute", "communication", "host->device", "device->host", "CPU optimizer", "I/O"}) {
    bool found = false;
    for (const auto& [tid, name] : tracks) found |= name == t;
    EXPECT_TRUE(found) << file << ": no track '" << t << "'";
  }
  // The traced steps, and every other span inside one of them.
  std::vector<TraceSpan> step_spans;
  for (const TraceSpan& sp : spans) {
    if (sp.name.rfind("step ", 0) == 0) step_spans.push_back(sp);
  }
  ASSERT_EQ(step_spans.size(), steps.size()) << file;
  for (size_t i = 0; i < steps.size(); ++i) EXPECT_EQ(step_spans[i].name, steps[i]) << file;
  for (const TraceSpan& sp : spans) {
    if (sp.name.rfind("step ", 0) == 0) continue;
    ++(*count)[sp.track + "/" + sp.name];
    bool inside = false;
    // Timestamps are microseconds with sub-microsecond rounding: allow 1 us at the edges.
    for (const TraceSpan& st : step_spans) inside |= sp.ts >= st.ts - 1 && sp.end <= st.end + 1;
    EXPECT_TRUE(inside) << file << ": span '" << sp.name << "' on " << sp.track << " [" << sp.ts << ", " << sp.end
                        << "] is outside the traced steps";
  }
}

std::string TraceJson(const std::string& path) {
  return "\"zero_trace\": {\"enabled\": true, \"path\": \"" + path + "\", \"first_step\": 2, \"last_step\": 3}";
}

TEST(EngineTimelineTest, TraceOfTheChosenStepsWithOneTrackPerStream) {
  // In the test's outputs when Bazel keeps them (tools/trace_to_svg.py renders it for docs/timeline.md).
  const char* keep = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  ASSERT_OK_AND_ASSIGN(ScratchDir scratch, ScratchDir::Create("engine_trace"));
  const std::string path = (keep != nullptr ? std::string(keep) : scratch.path()) + "/engine_trace.json";
  std::remove(path.c_str());
  std::remove((path + ".rank1").c_str());
  const int64_t observers = EngineTimeline::observers_created();
  // Stage 3 on two ranks (gathers and reductions) with CPU AdamW over offloaded states.
  TrainRanks(ConfigJson(3, 2, 1.0, TraceJson(path), kOffload), 2, 4);
  EXPECT_EQ(EngineTimeline::observers_created() - observers, 2) << "one stream observer per traced engine";
  for (int rank = 0; rank < 2; ++rank) {
    const std::string file = rank == 0 ? path : path + ".rank1";
    std::map<std::string, int> count;  // "track/name" -> spans
    ReadTrace(file, rank, {"step 2", "step 3"}, &count);
    if (::testing::Test::HasFatalFailure()) return;
    // GAS 2: two forwards and backwards per step; one optimizer step each.
    EXPECT_EQ(count["compute/forward"], 4) << file;
    EXPECT_EQ(count["compute/backward"], 4) << file;
    EXPECT_EQ(count["compute/optimizer step"], 2) << file;
    EXPECT_GT(count["communication/gather module"], 0) << file;
    EXPECT_EQ(count["communication/gradient norm"], 2) << file;
    EXPECT_GT(count["CPU optimizer/optimizer update"], 0) << file;
    // The components' own spans (the stream observer), on the streams they enqueue on.
    EXPECT_GT(count["communication/all-gather"], 0) << file << ": no all-gather of the coordinator";
    EXPECT_GT(count["communication/reduce-scatter"], 0) << file << ": no reduce-scatter of the reducer";
    EXPECT_GT(count["device->host/gradients to the host partition"], 0) << file;
    EXPECT_GT(count["host->device/weights to the device"], 0) << file;
    // One host update per optimizer step at least (the states' CPU AdamW, under the engine's span).
    EXPECT_GE(count["CPU optimizer/CPU AdamW"], 2) << file;
    EXPECT_EQ(count["compute/component spans dropped"], 0) << file;
  }
}

TEST(EngineTimelineTest, NvmeRunsHaveIoSpansOfTheirAioWaits) {
  auto scratch = ScratchDir::CreateWithDirectIo("engine_timeline_nvme");
  ASSERT_OK(scratch);
  const std::string cpu_opt = "\"offload_optimizer\": {\"device\": \"cpu\"}";
  // NVMe optimizer states; then CPU states with the parameters on NVMe (the param store).
  const std::string nvme_states =
      "\"sub_group_size\": 64, \"offload_optimizer\": {\"device\": \"nvme\", "
      "\"nvme_path\": \"" +
      scratch->File("s") + "\", \"buffer_count\": 2}";
  const std::string nvme_params = cpu_opt + ", \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"" +
                                  scratch->File("p") + "\", \"buffer_count\": 2, \"max_in_cpu\": 0}";
  for (const std::string& extra : {nvme_states, nvme_params}) {
    const std::string path = scratch->File("engine_trace_nvme.json");
    std::remove(path.c_str());
    std::remove((path + ".rank1").c_str());
    TrainRanks(ConfigJson(3, 1, 1.0, TraceJson(path), extra), 2, 3);
    for (int rank = 0; rank < 2; ++rank) {
      const std::string file = rank == 0 ? path : path + ".rank1";
      std::map<std::string, int> count;
      ReadTrace(file, rank, {"step 2", "step 3"}, &count);
      if (::testing::Test::HasFatalFailure()) return;
      int io = 0;
      for (const auto& [key, n] : count) {
        if (key.rfind("I/O/aio ", 0) == 0) io += n;
      }
      EXPECT_GT(io, 0) << file << " (" << extra << "): no aio span on the I/O track";
    }
  }
}

TEST(EngineTimelineTest, NoObserverWithoutZeroTrace) {
  const int64_t observers = EngineTimeline::observers_created();
  const int64_t calls = EngineTimeline::observer_calls();
  // Every component that has hooks is in this run (stage 3, two ranks, CPU offload), and the
  // breakdown is on (the timeline exists): still no observer, and no hook reached one.
  TrainRanks(ConfigJson(3, 2, 1.0, "\"wall_clock_breakdown\": true", kOffload), 2, 3);
  EXPECT_EQ(EngineTimeline::observers_created(), observers);
  EXPECT_EQ(EngineTimeline::observer_calls(), calls);
  // The counter counts: a traced run's hooks reach its observer.
  ASSERT_OK_AND_ASSIGN(ScratchDir scratch, ScratchDir::Create("engine_trace_counted"));
  const std::string path = scratch.File("engine_trace_counted.json");
  TrainRanks(ConfigJson(3, 2, 1.0, TraceJson(path), kOffload), 2, 3);
  EXPECT_EQ(EngineTimeline::observers_created(), observers + 2);
  EXPECT_GT(EngineTimeline::observer_calls(), calls);
}

TEST(EngineTimelineTest, TraceConfigErrorsNameTheKey) {
  auto empty = MakeConfig(ConfigJson(2, 1, 1.0, "\"zero_trace\": {\"enabled\": true, \"path\": \"\"}"), 1);
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("zero_trace.path"), std::string::npos) << empty.status().ToString();

  auto order = MakeConfig(ConfigJson(2, 1, 1.0, "\"zero_trace\": {\"first_step\": 5, \"last_step\": 3}"), 1);
  ASSERT_FALSE(order.ok());
  EXPECT_NE(order.status().message().find("zero_trace.last_step"), std::string::npos) << order.status().ToString();

  ASSERT_OK_AND_ASSIGN(ScratchDir scratch, ScratchDir::Create("engine_trace_missing"));
  const std::string missing = scratch.File("no_such_dir/trace.json");
  Status s = RunThreadRanks(1, [&](int, Communicator* comm, Device* device) -> Status {
    ZERO_ASSIGN_OR_RETURN(
        Config config,
        MakeConfig(ConfigJson(2, 1, 1.0, "\"zero_trace\": {\"enabled\": true, \"path\": \"" + missing + "\"}"), 1));
    return Engine::Create(config, device, comm).status();
  });
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("zero_trace.path"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find(scratch.File("no_such_dir")), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace zero
