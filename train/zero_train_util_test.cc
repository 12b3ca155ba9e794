// zero_train's pieces without processes: flag parsing and its errors, the built-in config, the
// JSON step record and formatting, and the engine adapters driving ByteLm on two thread ranks.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/thread_ranks.h"
#include "engine/config/config.h"
#include "engine/engine.h"
#include "models/byte/byte_lm.h"
#include "models/engine_adapters.h"
#include "testing/scratch_dir.h"
#include "testing/status_matchers.h"
#include "train/zero_train_options.h"
#include "train/zero_train_report.h"

namespace zero::examples {
namespace {

Result<TrainOptions> Parse(std::vector<std::string> args) { return ParseTrainOptions(args); }

TEST(ZeroTrainOptions, Defaults) {
  auto o = Parse({});
  ASSERT_OK(o);
  EXPECT_EQ(o->steps, kDefaultSteps);
  EXPECT_EQ(o->device, "cpu");
  EXPECT_EQ(o->nproc, 0);
  EXPECT_EQ(o->plot, kDefaultPlot);
  EXPECT_EQ(o->prompt, kDefaultPrompt);
  EXPECT_EQ(o->data, "/usr/share/common-licenses/GPL-3");
  EXPECT_TRUE(o->config_path.empty());
}

TEST(ZeroTrainOptions, BothFlagSpellings) {
  auto o = Parse({"--steps", "7", "--seed=3", "--layers=1", "--hidden", "16", "--log_json", "x.jsonl", "--plot", "none",
                  "--no-progress", "--prompt=Hello there", "--device", "cuda", "--nproc=4"});
  ASSERT_OK(o);
  EXPECT_EQ(o->steps, 7);
  EXPECT_EQ(o->seed, 3u);
  EXPECT_EQ(o->model.layers, 1);
  EXPECT_EQ(o->model.hidden, 16);
  EXPECT_EQ(o->log_json, "x.jsonl");
  EXPECT_EQ(o->plot, "");
  EXPECT_FALSE(o->progress);
  EXPECT_EQ(o->prompt, "Hello there");
  EXPECT_EQ(o->device, "cuda");
  EXPECT_EQ(o->nproc, 4);
}

TEST(ZeroTrainOptions, ErrorsNameTheFlag) {
  auto unknown = Parse({"--stpes", "3"});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("--stpes"), std::string::npos);
  EXPECT_NE(unknown.status().message().find("did you mean --steps"), std::string::npos);

  auto bad = Parse({"--steps", "ten"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--steps"), std::string::npos);
  EXPECT_NE(bad.status().message().find("'ten'"), std::string::npos);

  auto missing = Parse({"--data"});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("--data needs a value"), std::string::npos);

  auto device = Parse({"--device", "tpu"});
  ASSERT_FALSE(device.ok());
  EXPECT_NE(device.status().message().find("cpu or cuda"), std::string::npos);

  auto stray = Parse({"steps"});
  ASSERT_FALSE(stray.ok());

  auto every = Parse({"--save-every", "10"});
  ASSERT_FALSE(every.ok());
  EXPECT_NE(every.status().message().find("--save"), std::string::npos);

  auto model = Parse({"--hidden", "0"});
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("--hidden"), std::string::npos);

  auto sw = Parse({"--no-progress=yes"});
  ASSERT_FALSE(sw.ok());
}

TEST(ZeroTrainOptions, UsageListsEveryFlag) {
  const std::string u = UsageText();
  for (const char* f : {"--data", "--config", "--device", "--nproc", "--steps", "--seed", "--log-json", "--plot",
                        "--prompt", "--save", "--save-every", "--resume", "--layers", "--timeout"}) {
    EXPECT_NE(u.find(f), std::string::npos) << f;
  }
}

TEST(ZeroTrainOptions, BuiltinConfig) {
  TrainOptions o = *Parse({"--steps", "250"});
  for (int world : {1, 2, 3}) {
    auto c = ResolveConfig(o, world);
    ASSERT_OK(c);
    EXPECT_EQ(c->zero.stage, 3);
    EXPECT_EQ(c->train_micro_batch_size_per_gpu, 32);
    EXPECT_EQ(c->gradient_accumulation_steps, 2);
    EXPECT_EQ(c->train_batch_size, 64 * world);
    EXPECT_DOUBLE_EQ(c->gradient_clipping, 1.0);
    EXPECT_EQ(c->steps_per_print, 10);
    EXPECT_EQ(c->scheduler.type, "WarmupCosineLR");
    EXPECT_EQ(c->scheduler.total_num_steps, 250);
    EXPECT_DOUBLE_EQ(c->optimizer.lr, 3e-3);
    EXPECT_TRUE(c->warnings.empty()) << c->warnings[0];
    EXPECT_TRUE(ConfigNotes(o, *c).empty());
  }
}

// `text` written to dir/name; returns the path.
std::string WriteFile(const ScratchDir& dir, const std::string& name, const std::string& text) {
  const std::string path = dir.File(name);
  std::ofstream(path) << text;
  return path;
}

TEST(ZeroTrainOptions, ConfigFileErrorsNameTheKey) {
  ASSERT_OK_AND_ASSIGN(ScratchDir dir, ScratchDir::Create("zero_train_config"));
  TrainOptions o;
  o.config_path =
      WriteFile(dir, "bad_stage.json", R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 9}})");
  auto c = ResolveConfig(o, 2);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("zero_optimization.stage"), std::string::npos) << c.status().ToString();
  EXPECT_NE(c.status().message().find("bad_stage.json"), std::string::npos) << c.status().ToString();

  o.config_path = WriteFile(dir, "batch.json", R"({"train_batch_size": 8, "gradient_accumulation_steps": 2})");
  c = ResolveConfig(o, 2);
  ASSERT_OK(c);
  EXPECT_EQ(c->train_micro_batch_size_per_gpu, 8 / 2 / 2);
  c = ResolveConfig(o, 3);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("train_batch_size"), std::string::npos);
}

TEST(ZeroTrainOptions, NotesOnScheduleLength) {
  TrainOptions o = *Parse({"--steps", "100"});
  auto c = ResolveConfig(*Parse({"--steps", "400"}), 2);
  ASSERT_OK(c);
  auto notes = ConfigNotes(o, *c);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("total_num_steps"), std::string::npos);
}

TEST(ZeroTrainReport, StepJson) {
  StepRecord r;
  r.step = 3;
  r.loss = 2.5;
  r.lr = 1e-3;
  r.grad_norm = std::numeric_limits<double>::infinity();
  r.fp16 = true;
  r.loss_scale = 1024;
  r.applied = false;
  r.step_seconds = 0.5;
  r.tokens = 128;
  r.memory.model_params = 1000;
  const auto j = nlohmann::json::parse(StepJson(r));
  EXPECT_EQ(j["step"], 3);
  EXPECT_DOUBLE_EQ(j["loss"].get<double>(), 2.5);
  EXPECT_TRUE(j["grad_norm"].is_null());
  EXPECT_EQ(j["applied"], false);
  EXPECT_DOUBLE_EQ(j["loss_scale"].get<double>(), 1024);
  EXPECT_DOUBLE_EQ(j["tokens_per_s"].get<double>(), 256);
  EXPECT_EQ(j["memory"]["model_params"], 1000);
  r.fp16 = false;
  EXPECT_FALSE(nlohmann::json::parse(StepJson(r)).contains("loss_scale"));
}

TEST(ZeroTrainReport, Formatting) {
  EXPECT_EQ(FormatBytes(812), "812 B");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(3.0 * 1024 * 1024 * 1024), "3.00 GiB");
  EXPECT_EQ(FormatDuration(7), "0:07");
  EXPECT_EQ(FormatDuration(3723), "1:02:03");
  EXPECT_EQ(FormatDuration(NAN), "--:--");
  EXPECT_EQ(FormatCount(12345), "12.3k");
  WindowSummary w;
  w.total_steps = 100;
  w.last.step = 10;
  w.last.lr = 1e-3;
  w.last.grad_norm = 0.5;
  w.mean_loss = 3.25;
  w.seconds = 1;
  w.steps = 10;
  w.tokens = 1280;
  const std::string line = FormatWindow(w);
  EXPECT_NE(line.find("step  10/100"), std::string::npos) << line;
  EXPECT_NE(line.find("loss 3.2500"), std::string::npos) << line;
  EXPECT_NE(line.find("1280 tok/s"), std::string::npos) << line;
  EXPECT_NE(line.find("100.0 ms/step"), std::string::npos) << line;
  EXPECT_EQ(line.find("loss scale"), std::string::npos) << line;
}

// The adapters drive the model through the engine at stage 3 (parameters gathered per module) on
// two thread ranks: the loss falls and every rank ends with the same full parameters.
TEST(ZeroTrainAdapters, TrainsThroughTheEngineAtStage3) {
  ByteLmConfig mc;
  mc.context = 3;
  mc.embed_dim = 4;
  mc.hidden = 8;
  mc.ffn = 12;
  mc.layers = 1;
  const std::vector<ModelParamSpec> specs = ByteLmParamSpecs(mc);
  ParseOptions po;
  po.world_size = 2;
  auto config = ParseConfig(R"({"train_micro_batch_size_per_gpu": 6, "gradient_accumulation_steps": 2,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.0}},
      "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}})",
                            po);
  ASSERT_OK(config);
  const std::string text = "the quick brown fox jumps over the lazy dog. ";
  std::vector<std::vector<std::vector<float>>> finals(2);
  std::vector<std::vector<double>> losses(2);
  Status st = RunThreadRanks(2, [&](int rank, Communicator* comm, Device* device) -> Status {
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(*config, device, comm));
    ZERO_RETURN_IF_ERROR(RegisterAndInitialize(engine.get(), specs, 5));
    ByteLmCpu model(mc);
    ByteLmActivations acts;
    EngineParams params(engine.get(), specs);
    EngineGrads grads(engine.get());
    for (int step = 0; step < 30; ++step) {
      double sum = 0;
      for (int m = 0; m < 2; ++m) {
        std::vector<uint8_t> rows;
        for (int i = 0; i < 6; ++i) {
          const size_t start = static_cast<size_t>((step * 7 + m * 3 + rank * 11 + i * 5) % (text.size() - 4));
          rows.insert(rows.end(), text.begin() + start, text.begin() + start + 4);
        }
        ZERO_ASSIGN_OR_RETURN(double loss, model.Forward(params, rows.data(), 6, &acts));
        ZERO_RETURN_IF_ERROR(model.Backward(params, &acts, engine->gradient_scale(), grads));
        ZERO_RETURN_IF_ERROR(engine->Backward());
        sum += loss;
      }
      ZERO_RETURN_IF_ERROR(engine->Step());
      if (!engine->was_step_applied()) return InternalError("step not applied");
      losses[rank].push_back(sum / 2);
    }
    // Releasing a module that is not held is an error; acquiring an unknown one too.
    if (params.Release("head").ok()) return InternalError("Release of a module not held succeeded");
    if (params.Acquire("nope").ok()) return InternalError("Acquire of an unknown module succeeded");
    ZERO_ASSIGN_OR_RETURN(finals[rank], GatherFullParams(engine.get()));
    return OkStatus();
  });
  ASSERT_OK(st);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(losses[r].size(), 30u);
    EXPECT_LT(losses[r].back(), losses[r].front() - 0.5) << "rank " << r;
  }
  ASSERT_EQ(finals[0].size(), specs.size());
  EXPECT_EQ(finals[0], finals[1]);
  for (size_t i = 0; i < specs.size(); ++i) EXPECT_EQ(static_cast<int64_t>(finals[0][i].size()), specs[i].numel());
}

}  // namespace
}  // namespace zero::examples
