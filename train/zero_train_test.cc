// zero_train end to end on the CPU: the binary started as 2 ranks (--nproc 2: it launches itself),
// short runs of a small model. Checks exit codes, the per-step JSON log, that the loss falls, the
// SVG plot, that stages 0-3 train the same model alike, and that mistakes and a dying rank end the
// job quickly with a message naming what to fix.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/checkpoint/io.h"
#include "testing/status_matchers.h"
#include "train/run_binary_testing.h"

namespace {

std::string Binary() { return zero::testing::DataBinary("train/zero_train"); }

std::string TmpDir() { return zero::testing::TestTmpDir(); }

std::string ReadFile(const std::string& path) { return zero::testing::ReadWholeFile(path); }

void WriteFile(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

using zero::testing::RunResult;

// Runs the binary with `args` and extra "K=V" environment entries (RANK etc. removed first so the
// binary launches its own ranks), stdout+stderr to a file; kills it after timeout_s.
RunResult RunZeroTrain(const std::vector<std::string>& args, const std::vector<std::string>& env = {},
                       double timeout_s = 60) {
  return zero::testing::RunBinary(Binary(), args, env, timeout_s);
}

// The small model and short run every training test uses.
std::vector<std::string> Small(std::vector<std::string> extra) {
  std::vector<std::string> a = {"--nproc", "2", "--layers", "1", "--hidden", "64", "--ffn", "128", "--sample", "40"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

std::vector<nlohmann::json> ReadJsonLines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    out.push_back(nlohmann::json::parse(line));  // throws (fails the test) on a malformed line
  }
  return out;
}

double MeanLoss(const std::vector<nlohmann::json>& lines, size_t begin, size_t end) {
  double s = 0;
  for (size_t i = begin; i < end; ++i) s += lines[i]["loss"].get<double>();
  return s / static_cast<double>(end - begin);
}

// A small well-formedness check: the document is one <svg> element whose tags nest and close.
::testing::AssertionResult WellFormedSvg(const std::string& xml) {
  std::vector<std::string> stack;
  bool saw_svg = false;
  size_t i = 0;
  while ((i = xml.find('<', i)) != std::string::npos) {
    const size_t end = xml.find('>', i);
    if (end == std::string::npos) return ::testing::AssertionFailure() << "unterminated tag at " << i;
    std::string tag = xml.substr(i + 1, end - i - 1);
    i = end + 1;
    if (tag.empty()) return ::testing::AssertionFailure() << "empty tag";
    if (tag[0] == '?' || tag[0] == '!') continue;  // declaration, comment
    if (tag[0] == '/') {
      const std::string name = tag.substr(1, tag.find_first_of(" \t\n") - 1);
      if (stack.empty() || stack.back() != name) {
        return ::testing::AssertionFailure()
               << "</" << name << "> closes " << (stack.empty() ? "nothing" : stack.back());
      }
      stack.pop_back();
      continue;
    }
    const std::string name = tag.substr(0, tag.find_first_of(" \t\n/"));
    if (stack.empty()) {
      if (name != "svg" || saw_svg) return ::testing::AssertionFailure() << "root element <" << name << ">";
      saw_svg = true;
    }
    if (tag.back() != '/') stack.push_back(name);
  }
  if (!saw_svg) return ::testing::AssertionFailure() << "no <svg>";
  if (!stack.empty()) return ::testing::AssertionFailure() << "<" << stack.back() << "> never closed";
  return ::testing::AssertionSuccess();
}

TEST(ZeroTrain, BinaryIsThere) { ASSERT_FALSE(Binary().empty()) << "examples/zero_train not in the runfiles"; }

// The built-in config (stage 3, clipping, WarmupCosineLR, 2 accumulation steps) on 2 ranks.
TEST(ZeroTrain, DefaultConfigTrainsOnTwoRanks) {
  const std::string dir = TmpDir();
  const std::string json = dir + "/default.jsonl", svg = dir + "/default.svg";
  RunResult r = RunZeroTrain(Small({"--steps", "30", "--log-json", json, "--plot", svg}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The log: one valid JSON object per step, numbered 1..30, with the global batch of 2 ranks.
  const auto lines = ReadJsonLines(json);
  ASSERT_EQ(lines.size(), 30u) << r.output;
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i]["step"].get<int>(), static_cast<int>(i + 1));
    EXPECT_EQ(lines[i]["tokens"].get<int>(), 32 * 2 * 2);
    EXPECT_TRUE(lines[i]["applied"].get<bool>());
    EXPECT_TRUE(std::isfinite(lines[i]["loss"].get<double>()));
    EXPECT_GT(lines[i]["grad_norm"].get<double>(), 0);
    EXPECT_GT(lines[i]["memory"]["optimizer_states"].get<double>(), 0);
  }
  EXPECT_FALSE(lines[0].contains("loss_scale"));
  const double first = MeanLoss(lines, 0, 3), last = MeanLoss(lines, 27, 30);
  EXPECT_LT(last, first - 0.5) << "loss did not fall: " << first << " -> " << last;
  EXPECT_NEAR(lines[0]["loss"].get<double>(), std::log(256.0), 0.5);  // an untrained model is near uniform
  // The plot.
  const std::string xml = ReadFile(svg);
  ASSERT_FALSE(xml.empty()) << "no SVG at " << svg;
  EXPECT_TRUE(WellFormedSvg(xml));
  // What a person reads.
  EXPECT_NE(r.output.find("ZeRO stage 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step 10/30"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step 30/30"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tok/s"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("mem/rank"), std::string::npos) << r.output;
  // The device peak is the memory_stats() peak, not another field (it printed 'peak 0 B' always).
  EXPECT_NE(r.output.find(", peak "), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(", peak 0 B"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("held-out loss"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("The GNU General Public License"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("\r"), std::string::npos) << "progress bar drawn on a pipe";
  EXPECT_EQ(r.output.find("time (ms)"), std::string::npos) << "breakdown printed without wall_clock_breakdown";
}

// Stages 0, 1, 2 and 3 through --config: each trains, and all four follow the same loss curve (the
// same data, initialization and arithmetic up to reduction rounding).
TEST(ZeroTrain, StagesThroughConfigFiles) {
  std::vector<std::vector<nlohmann::json>> logs;
  for (int stage = 0; stage <= 3; ++stage) {
    const std::string config = TmpDir() + "/stage" + std::to_string(stage) + ".json";
    WriteFile(config, R"({
      "train_batch_size": 96,
      "gradient_accumulation_steps": 2,
      "steps_per_print": 5,
      "gradient_clipping": 1.0,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "betas": [0.9, 0.99], "weight_decay": 0.0}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 3, "warmup_type": "linear"}},
      "zero_optimization": {"stage": )" +
                          std::to_string(stage) +
                          R"(, "reduce_bucket_size": 5000, "stage3_param_persistence_threshold": 100}
    })");
    const std::string json = TmpDir() + "/stage" + std::to_string(stage) + ".jsonl";
    RunResult r = RunZeroTrain(Small({"--config", config, "--steps", "20", "--log-json", json, "--plot", "none"}));
    ASSERT_EQ(r.exit_code, 0) << "stage " << stage << ":\n" << r.output;
    EXPECT_NE(r.output.find("ZeRO stage " + std::to_string(stage)), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("24 rows/rank x 2 accumulation x 2 = 96"), std::string::npos) << r.output;
    logs.push_back(ReadJsonLines(json));
    ASSERT_EQ(logs.back().size(), 20u) << r.output;
    EXPECT_LT(MeanLoss(logs.back(), 17, 20), MeanLoss(logs.back(), 0, 3) - 0.5) << "stage " << stage;
    EXPECT_EQ(logs.back()[0]["tokens"].get<int>(), 96);
  }
  for (int stage = 1; stage <= 3; ++stage) {
    for (size_t i = 0; i < 20; ++i) {
      EXPECT_NEAR(logs[stage][i]["loss"].get<double>(), logs[0][i]["loss"].get<double>(), 0.05)
          << "stage " << stage << " step " << i + 1;
    }
  }
}

TEST(ZeroTrain, BadConfigNamesTheKey) {
  const std::string config = TmpDir() + "/bad.json";
  WriteFile(config, R"({"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 7}})");
  RunResult r = RunZeroTrain(Small({"--config", config, "--steps", "3"}));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.exit_code, -1) << r.output;
  EXPECT_NE(r.output.find("zero_optimization.stage"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("bad.json"), std::string::npos) << r.output;

  WriteFile(config, R"({"train_micro_batch_size_per_gpu": 8, "optimizer": {"type": "AdamW", "params": {"lr": -1}}})");
  r = RunZeroTrain(Small({"--config", config, "--steps", "3"}));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("optimizer.params.lr"), std::string::npos) << r.output;

  WriteFile(config, R"({"train_micro_batch_size_per_gpu": 8, )");
  r = RunZeroTrain(Small({"--config", config, "--steps", "3"}));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("line"), std::string::npos) << r.output;
}

TEST(ZeroTrain, UserMistakesNameWhatToFix) {
  RunResult r = RunZeroTrain({"--stpes", "3"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--steps"), std::string::npos) << r.output;

  r = RunZeroTrain({"--data", TmpDir() + "/no_such_corpus.txt"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("no_such_corpus.txt"), std::string::npos) << r.output;

  WriteFile(TmpDir() + "/tiny.txt", "abc");
  r = RunZeroTrain({"--data", TmpDir() + "/tiny.txt"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("too short"), std::string::npos) << r.output;

  r = RunZeroTrain({"--config", TmpDir() + "/no_such_config.json"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("no_such_config.json"), std::string::npos) << r.output;

  // A directory was reported as malformed JSON.
  r = RunZeroTrain({"--config", TmpDir()});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("config " + TmpDir() + ": not a regular file (it is a directory)"), std::string::npos)
      << r.output;

  r = RunZeroTrain({"--help"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--log-json"), std::string::npos) << r.output;

  r = RunZeroTrain({"--print-config"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(nlohmann::json::parse(r.output)["zero_optimization"]["stage"].get<int>(), 3);
}

// A rank whose environment is refused before the rendezvous (here a short ZERO_JOB_SECRET) names its
// own rank; every rank used to say "rank 0 of 1".
TEST(ZeroTrain, EnvironmentErrorNamesTheRank) {
  RunResult r =
      RunZeroTrain(Small({"--steps", "3"}), {"RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1", "MASTER_ADDR=127.0.0.1",
                                             "MASTER_PORT=29999", "ZERO_JOB_SECRET=short"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_LT(r.seconds, 10) << r.output;
  EXPECT_NE(r.output.find("zero_train: rank 1 of 2: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ZERO_JOB_SECRET is 5 characters long"), std::string::npos) << r.output;
}

// A micro batch within the config's bounds but beyond this machine's memory (1e9 rows) is an error
// naming the key before training; it used to end every rank with an uncaught bad_alloc.
TEST(ZeroTrain, MicroBatchBeyondMemoryNamesTheKey) {
  const std::string config = TmpDir() + "/huge_batch.json";
  WriteFile(config, R"({"train_micro_batch_size_per_gpu": 1000000000})");
  RunResult r = RunZeroTrain(Small({"--steps", "3", "--config", config}));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_LT(r.seconds, 10) << r.output;
  EXPECT_NE(r.output.find("train_micro_batch_size_per_gpu 1000000000 rows of at least "), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("of memory; lower train_micro_batch_size_per_gpu"), std::string::npos) << r.output;
}

// --save is checked when the job starts (issue 23): a directory that cannot take a file, or one
// that another job saves into, ends the job before training (it used to fail at the first save, or
// let the two jobs overwrite each other).
TEST(ZeroTrain, SaveDirectoryIsCheckedAtTheStart) {
  WriteFile(TmpDir() + "/a_file", "x");
  const std::string bad = TmpDir() + "/a_file/ckpt";
  RunResult r = RunZeroTrain(Small({"--steps", "5", "--plot", "none", "--save", bad}));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--save " + bad), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("training"), std::string::npos) << "trained before checking --save:\n" << r.output;

  const std::string dir = TmpDir() + "/locked_ckpt";
  auto lock = zero::DirectoryLock::Acquire(dir);  // this test process is the other job
  ASSERT_OK(lock);
  r = RunZeroTrain(Small({"--steps", "5", "--plot", "none", "--save", dir}));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("is in use by another job (pid " + std::to_string(getpid())), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("training"), std::string::npos) << r.output;
}

// An lr that blows the weights up: the first NaN/inf gradient norm (or loss) on an applied step ends
// the job with an error naming the step (it used to train into NaN and exit 0).
TEST(ZeroTrain, NonFiniteTrainingStops) {
  const std::string config = TmpDir() + "/explode.json";
  WriteFile(config, R"({"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 0,
                        "optimizer": {"params": {"lr": 1e30}}, "zero_optimization": {"stage": 1}})");
  RunResult r = RunZeroTrain(Small({"--steps", "20", "--plot", "none", "--config", config}));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_LT(r.seconds, 30) << r.output;
  const bool norm = r.output.find("the global gradient norm of optimizer step ") != std::string::npos;
  const bool loss = r.output.find(": the mean loss is ") != std::string::npos;
  EXPECT_TRUE(norm || loss) << r.output;
  EXPECT_NE(r.output.find("stop_on_nonfinite: false"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("step 20/20"), std::string::npos) << r.output;
}

// A rank that dies mid-run ends the job promptly with a message naming it, both when zero_train
// launched the ranks and when an outside launcher did (the survivor sees the broken connection
// instead of waiting out the timeout).
TEST(ZeroTrain, DyingRankEndsTheJob) {
  RunResult r = RunZeroTrain(Small({"--steps", "30", "--plot", "none"}), {"ZERO_TRAIN_TEST_EXIT=1:5"});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, -1) << r.output;
  EXPECT_LT(r.seconds, 30);
  EXPECT_NE(r.output.find("rank 1 of 2"), std::string::npos) << r.output;

  // Two ranks started by hand (RANK set), as torchrun or mpirun would.
  const int port = 20000 + getpid() % 20000;
  std::vector<std::string> common = {"WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port),
                                     "ZERO_TRAIN_TEST_EXIT=1:4"};
  std::vector<std::string> args = Small({"--steps", "30", "--plot", "none", "--timeout", "20"});
  RunResult r1;
  std::thread t([&] {
    auto env = common;
    env.push_back("RANK=1");
    env.push_back("LOCAL_RANK=1");
    r1 = RunZeroTrain(args, env);
  });
  auto env0 = common;
  env0.push_back("RANK=0");
  env0.push_back("LOCAL_RANK=0");
  RunResult r0 = RunZeroTrain(args, env0);
  t.join();
  EXPECT_EQ(r1.exit_code, 3) << r1.output;
  EXPECT_EQ(r0.exit_code, 1) << r0.output;
  EXPECT_LT(r0.seconds, 20) << r0.output;
  EXPECT_NE(r0.output.find("rank 0 of 2"), std::string::npos) << r0.output;
}

}  // namespace

namespace {

// Stop after step 10 and resume: the resumed run's steps 11..20 log the same losses, lr and grad
// norms, bit for bit (the log prints doubles with 17 significant digits, round-trip exact), as the run that never
// stopped. Then the same checkpoint resumes at 3 ranks, and zero_to_fp32 consolidates it.
TEST(ZeroTrain, SaveAndResumeContinueExactly) {
  const std::string dir = TmpDir() + "/resume";
  const std::string ckpt = dir + "/ckpt";
  mkdir(dir.c_str(), 0755);
  const std::string full = dir + "/full.jsonl", resumed = dir + "/resumed.jsonl", three = dir + "/three.jsonl";
  RunResult a = RunZeroTrain(Small(
      {"--steps", "20", "--save", ckpt, "--save-every", "10", "--log-json", full, "--plot", "none", "--sample", "0"}));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_NE(a.output.find("checkpoint saved: " + ckpt + "/global_step10"), std::string::npos) << a.output;
  EXPECT_NE(a.output.find("checkpoint saved: " + ckpt + "/global_step20"), std::string::npos) << a.output;
  EXPECT_EQ(ReadFile(ckpt + "/latest").find("global_step20"), 0u);
  WriteFile(ckpt + "/latest", "global_step10");  // resume from the middle of the run

  RunResult b = RunZeroTrain(
      Small({"--steps", "20", "--resume", ckpt, "--log-json", resumed, "--plot", "none", "--sample", "0"}));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("resumed from " + ckpt + " at step 10"), std::string::npos) << b.output;
  const auto f = ReadJsonLines(full), r = ReadJsonLines(resumed);
  ASSERT_EQ(f.size(), 20u);
  ASSERT_EQ(r.size(), 10u);
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(r[i]["step"].get<int>(), static_cast<int>(i + 11));
    for (const char* key : {"loss", "lr", "grad_norm"}) {
      EXPECT_EQ(r[i][key].get<double>(), f[i + 10][key].get<double>()) << key << " at step " << i + 11;
    }
  }

  // Another world size: 3 ranks continue from the 2-rank checkpoint (the batch grows with the world).
  std::vector<std::string> args3 =
      Small({"--steps", "20", "--resume", ckpt, "--log-json", three, "--plot", "none", "--sample", "0"});
  args3[1] = "3";  // --nproc 3
  RunResult c = RunZeroTrain(args3);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  const auto t = ReadJsonLines(three);
  ASSERT_EQ(t.size(), 10u);
  EXPECT_EQ(t[0]["step"].get<int>(), 11);
  EXPECT_LT(t[0]["loss"].get<double>(), f[0]["loss"].get<double>() - 0.3) << "the 3-rank run did not start trained";

  // A missing checkpoint is named before any rank starts.
  RunResult d = RunZeroTrain(Small({"--steps", "20", "--resume", dir + "/nothing"}));
  EXPECT_EQ(d.exit_code, 2) << d.output;
  EXPECT_NE(d.output.find("nothing/latest"), std::string::npos) << d.output;
}

}  // namespace

namespace {

// wall_clock_breakdown prints DeepSpeed's "time (ms) | forward: ... | backward: ... | step: ..."
// line at every steps_per_print boundary (and the last step); --trace writes a Chrome trace of
// steps 2-4 per rank whose spans sit on the right tracks, nested in their step.
TEST(ZeroTrain, WallClockBreakdownAndTrace) {
  const std::string dir = TmpDir() + "/timeline";
  mkdir(dir.c_str(), 0755);
  const std::string config = dir + "/wcb.json", trace = dir + "/trace.json";
  WriteFile(config, R"({
    "train_micro_batch_size_per_gpu": 8,
    "gradient_accumulation_steps": 2,
    "steps_per_print": 3,
    "wall_clock_breakdown": true,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.003}},
    "zero_optimization": {"stage": 2}
  })");
  RunResult r = RunZeroTrain(Small({"--config", config, "--steps", "7", "--trace", trace, "--plot", "none"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;

  // The breakdown: after steps 3, 6 and 7, from rank 0 only.
  std::vector<std::string> lines;
  std::istringstream out(r.output);
  for (std::string line; std::getline(out, line);) {
    if (line.rfind("time (ms)", 0) == 0) lines.push_back(line);
  }
  ASSERT_EQ(lines.size(), 3u) << r.output;
  for (const std::string& line : lines) {
    double f = -1, b = -1, s = -1;
    ASSERT_EQ(std::sscanf(line.c_str(), "time (ms) | forward: %lf | backward: %lf | step: %lf", &f, &b, &s), 3) << line;
    EXPECT_GT(f, 0) << line;
    EXPECT_GT(b, 0) << line;
    EXPECT_GT(s, 0) << line;
  }
  EXPECT_NE(r.output.find("trace of steps 2-4: " + trace), std::string::npos) << r.output;

  for (int rank = 0; rank < 2; ++rank) {
    const std::string path = rank == 0 ? trace : trace + ".rank1";
    const std::string text = ReadFile(path);
    ASSERT_FALSE(text.empty()) << "no trace at " << path;
    const nlohmann::json doc = nlohmann::json::parse(text);  // throws (fails) on malformed JSON
    std::map<int, std::string> track;                        // tid -> name
    std::vector<nlohmann::json> spans;
    for (const auto& e : doc.at("traceEvents")) {
      EXPECT_EQ(e.at("pid").get<int>(), rank) << path;
      if (e.at("ph") == "M" && e.at("name") == "thread_name") track[e.at("tid").get<int>()] = e["args"]["name"];
      if (e.at("ph") == "X") spans.push_back(e);
    }
    for (const char* name :
         {"compute", "communication", "host->device", "device->host", "CPU optimizer", "I/O", "train loop"}) {
      bool found = false;
      for (const auto& [tid, n] : track) found = found || n == name;
      EXPECT_TRUE(found) << "no track '" << name << "' in " << path;
    }
    // Steps 2, 3, 4 and nothing else; in each, 2 forward and 2 backward spans on the compute track
    // (the device-timed model work) and on the train loop track, and one optimizer step.
    std::map<std::string, nlohmann::json> steps;
    for (const auto& s : spans) {
      const std::string n = s["name"];
      if (n.rfind("step ", 0) == 0) steps[n] = s;
    }
    ASSERT_EQ(steps.size(), 3u) << path;
    for (const char* n : {"step 2", "step 3", "step 4"}) ASSERT_TRUE(steps.count(n)) << n << " missing in " << path;
    for (const auto& [name, step] : steps) {
      EXPECT_EQ(track[step["tid"].get<int>()], "train loop");
      const double begin = step["ts"].get<double>(), end = begin + step["dur"].get<double>();
      std::map<std::string, int> counts;
      for (const auto& s : spans) {
        const double b = s["ts"].get<double>(), e = b + s["dur"].get<double>();
        if (b < begin || e > end || s["name"] == name) continue;
        counts[track[s["tid"].get<int>()] + ":" + s["name"].get<std::string>()]++;
      }
      EXPECT_EQ(counts["compute:forward"], 2) << name << " in " << path;
      EXPECT_EQ(counts["compute:backward"], 2) << name << " in " << path;
      EXPECT_EQ(counts["train loop:forward"], 2) << name << " in " << path;
      EXPECT_EQ(counts["train loop:backward"], 2) << name << " in " << path;
      EXPECT_EQ(counts["train loop:Engine::Backward"], 2) << name << " in " << path;
      EXPECT_EQ(counts["train loop:step"], 1) << name << " in " << path;
    }
    // Everything recorded lies inside one of the three steps.
    size_t inside = 0;
    for (const auto& s : spans) {
      const double b = s["ts"].get<double>(), e = b + s["dur"].get<double>();
      for (const auto& [name, step] : steps) {
        const double sb = step["ts"].get<double>();
        if (b >= sb && e <= sb + step["dur"].get<double>()) {
          ++inside;
          break;
        }
      }
    }
    EXPECT_EQ(inside, spans.size()) << path;
  }
}

}  // namespace
