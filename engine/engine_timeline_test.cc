// The engine's own step timeline through the Engine (CPU backend, real Gloo between thread ranks):
// wall_clock_breakdown's line every steps_per_print optimizer steps (and never when off), the
// zero_trace Chrome trace (valid JSON, the six tracks, spans nested in their step) and the
// zero_trace config errors.
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

namespace zero {
namespace {

using namespace ::zero::testing;  // NOLINT: the engine test helpers

std::string TmpDir() {
  const char* d = std::getenv("TEST_TMPDIR");
  return d != nullptr ? d : "/tmp";
}

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
  std::vector<std::string> lines;             // what the sink got on this rank
  std::map<std::string, double> breakdown;    // wall_clock_breakdown() after the run
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
  EXPECT_TRUE(s.ok()) << s.ToString();
  return runs;
}

const char* const kOffload = "\"offload_optimizer\": {\"device\": \"cpu\"}";

TEST(EngineTimelineTest, BreakdownLineEveryStepsPerPrintWithTheFiveTimers) {
  // Stage 2 on two ranks with CPU-offloaded states: every one of the five timers has time.
  const std::string json =
      ConfigJson(2, 2, 1.0, "\"wall_clock_breakdown\": true, \"steps_per_print\": 2", kOffload);
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

TEST(EngineTimelineTest, TraceOfTheChosenStepsWithOneTrackPerStream) {
  // In the test's outputs when Bazel keeps them (tools/trace_to_svg.py renders it for docs/timeline.md).
  const char* keep = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  const std::string path = (keep != nullptr ? std::string(keep) : TmpDir()) + "/engine_trace.json";
  std::remove(path.c_str());
  std::remove((path + ".rank1").c_str());
  // Stage 3 on two ranks (gathers and reductions) with CPU AdamW over offloaded states.
  const std::string json = ConfigJson(
      3, 2, 1.0, "\"zero_trace\": {\"enabled\": true, \"path\": \"" + path + "\", \"first_step\": 2, \"last_step\": 3}",
      kOffload);
  TrainRanks(json, 2, 4);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string file = rank == 0 ? path : path + ".rank1";
    const std::string text = ReadFile(file);
    ASSERT_FALSE(text.empty()) << "no trace at " << file;
    const nlohmann::json doc = nlohmann::json::parse(text);  // throws (fails the test) on malformed JSON
    std::map<int, std::string> tracks;
    struct S {
      std::string name, track;
      double ts, end;
    };
    std::vector<S> spans;
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
    // The two traced steps, and every other span inside one of them.
    std::vector<S> steps;
    std::map<std::string, int> count;  // "track/name" -> spans
    for (const S& s : spans) {
      if (s.name.rfind("step ", 0) == 0) steps.push_back(s);
    }
    ASSERT_EQ(steps.size(), 2u) << file;
    EXPECT_EQ(steps[0].name, "step 2");
    EXPECT_EQ(steps[1].name, "step 3");
    for (const S& s : spans) {
      if (s.name.rfind("step ", 0) == 0) continue;
      ++count[s.track + "/" + s.name];
      bool inside = false;
      // Timestamps are microseconds with sub-microsecond rounding: allow 1 us at the edges.
      for (const S& st : steps) inside |= s.ts >= st.ts - 1 && s.end <= st.end + 1;
      EXPECT_TRUE(inside) << file << ": span '" << s.name << "' on " << s.track << " [" << s.ts << ", " << s.end
                          << "] is outside the traced steps";
    }
    // GAS 2: two forwards and backwards per step; one optimizer step each.
    EXPECT_EQ(count["compute/forward"], 4) << file;
    EXPECT_EQ(count["compute/backward"], 4) << file;
    EXPECT_EQ(count["compute/optimizer step"], 2) << file;
    EXPECT_GT(count["communication/gather module"], 0) << file;
    EXPECT_EQ(count["communication/gradient norm"], 2) << file;
    EXPECT_GT(count["CPU optimizer/optimizer update"], 0) << file;
  }
}

TEST(EngineTimelineTest, TraceConfigErrorsNameTheKey) {
  auto empty = MakeConfig(ConfigJson(2, 1, 1.0, "\"zero_trace\": {\"enabled\": true, \"path\": \"\"}"), 1);
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("zero_trace.path"), std::string::npos) << empty.status().ToString();

  auto order = MakeConfig(ConfigJson(2, 1, 1.0, "\"zero_trace\": {\"first_step\": 5, \"last_step\": 3}"), 1);
  ASSERT_FALSE(order.ok());
  EXPECT_NE(order.status().message().find("zero_trace.last_step"), std::string::npos) << order.status().ToString();

  const std::string missing = TmpDir() + "/no_such_dir/trace.json";
  Status s = RunThreadRanks(1, [&](int, Communicator* comm, Device* device) -> Status {
    ZERO_ASSIGN_OR_RETURN(
        Config config,
        MakeConfig(ConfigJson(2, 1, 1.0, "\"zero_trace\": {\"enabled\": true, \"path\": \"" + missing + "\"}"), 1));
    return Engine::Create(config, device, comm).status();
  });
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("zero_trace.path"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find(TmpDir() + "/no_such_dir"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace zero
