// zero_llm end to end on the CPU: the binary started as 2 ranks on the tiny preset. Checks that the
// loss falls on the built-in corpus, the step log and plot, the export as a Hugging Face directory
// (config.json, model.safetensors, tokenizer.json) read back by the project's own reader, that
// importing that directory and exporting it again with no step is bitwise the same, that
// --eval-only prints its one line and agrees between world sizes, and that bad input ends quickly
// with an error naming what is wrong.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/token_data.h"
#include "hf/model_dir.h"
#include "hf/safetensors.h"
#include "testing/status_matchers.h"
#include "train/run_binary_testing.h"

namespace zero::llm {
namespace {

using zero::testing::ReadWholeFile;
using zero::testing::RunResult;

RunResult RunLlm(const std::vector<std::string>& args, double timeout_s = 240) {
  return zero::testing::RunBinary(zero::testing::DataBinary("train/zero_llm"), args, {}, timeout_s);
}

std::string Tmp(const std::string& name) { return zero::testing::TestTmpDir() + "/" + name; }

// The tiny preset on 200 kB of the built-in corpus, a 512-token tokenizer, short rows.
std::vector<std::string> Tiny(std::vector<std::string> extra) {
  std::vector<std::string> a = {
      "--preset", "tiny", "--corpus-bytes", "200000", "--tokenizer-vocab", "512", "--seq", "32", "--batch", "4",
      "--lr",     "0.01", "--plot",         "none"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

double EvalLoss(const std::string& output) {
  const size_t at = output.find("eval_loss=");
  if (at == std::string::npos) return NAN;
  return std::stod(output.substr(at + 10));
}

// One training run shared by the tests below (it is the slow part).
class ZeroLlmTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    trained_ = new RunResult(RunLlm(Tiny({"--nproc", "2", "--steps", "30", "--print-every", "10", "--log-json",
                                          Tmp("log.jsonl"), "--export-hf", Tmp("export")})));
  }
  static void TearDownTestSuite() { delete trained_; }
  static RunResult* trained_;
};
RunResult* ZeroLlmTest::trained_ = nullptr;

TEST_F(ZeroLlmTest, TrainsTheTinyPresetAndTheLossFalls) {
  ASSERT_EQ(trained_->exit_code, 0) << trained_->output;
  std::ifstream in(Tmp("log.jsonl"));
  std::vector<double> losses;
  for (std::string line; std::getline(in, line);) losses.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  ASSERT_EQ(losses.size(), 30u) << trained_->output;
  EXPECT_NEAR(losses.front(), std::log(512.0), 1.0) << "an untrained model predicts about uniformly";
  const double first = (losses[0] + losses[1] + losses[2]) / 3, last = (losses[27] + losses[28] + losses[29]) / 3;
  EXPECT_LT(last, first - 0.5) << trained_->output;
  EXPECT_NE(trained_->output.find("step 30/30"), std::string::npos) << trained_->output;
  EXPECT_NE(trained_->output.find("eval_loss="), std::string::npos) << trained_->output;
}

TEST_F(ZeroLlmTest, ExportsAHuggingFaceDirectory) {
  ASSERT_EQ(trained_->exit_code, 0) << trained_->output;
  const nlohmann::json config = nlohmann::json::parse(ReadWholeFile(Tmp("export/config.json")));
  EXPECT_EQ(config["architectures"][0], "Qwen3ForCausalLM");
  EXPECT_EQ(config["model_type"], "qwen3");
  EXPECT_TRUE(config["tie_word_embeddings"].get<bool>());
  Result<HfWeights> w = HfWeights::Open(Tmp("export"));
  ASSERT_OK(w);
  ASSERT_NE(w->Find("model.embed_tokens.weight"), nullptr);
  EXPECT_EQ(w->Find("lm_head.weight"), nullptr) << "a tied model has no lm_head tensor";
  ASSERT_NE(w->Find("model.layers.1.self_attn.k_norm.weight"), nullptr);
  EXPECT_EQ(w->dtype_of("model.norm.weight"), DType::kBF16);
  const nlohmann::json tok = nlohmann::json::parse(ReadWholeFile(Tmp("export/tokenizer.json")));
  EXPECT_EQ(tok["model"]["type"], "BPE");
}

TEST_F(ZeroLlmTest, ImportThenExportWithoutAStepIsBitwise) {
  ASSERT_EQ(trained_->exit_code, 0) << trained_->output;
  RunResult again = RunLlm(Tiny({"--nproc", "2", "--model", Tmp("export"), "--steps", "0", "--eval-windows", "0",
                                 "--export-hf", Tmp("export2")}));
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(ReadWholeFile(Tmp("export/model.safetensors")), ReadWholeFile(Tmp("export2/model.safetensors")));
  EXPECT_EQ(ReadWholeFile(Tmp("export/config.json")), ReadWholeFile(Tmp("export2/config.json")));
}

// A tied model's directory may hold lm_head.weight only as an exact copy of the embedding: the
// model computes its head from the embedding, so a different lm_head would be dropped silently.
TEST_F(ZeroLlmTest, TiedModelRefusesALmHeadThatIsNotTheEmbedding) {
  ASSERT_EQ(trained_->exit_code, 0) << trained_->output;
  for (const bool same : {true, false}) {
    const std::string dir = Tmp(same ? "tied_copy" : "tied_other");
    mkdir(dir.c_str(), 0755);
    std::ofstream(dir + "/config.json") << ReadWholeFile(Tmp("export/config.json"));
    std::ofstream(dir + "/tokenizer.json") << ReadWholeFile(Tmp("export/tokenizer.json"));
    Result<SafetensorsFile> in = SafetensorsFile::Open(Tmp("export/model.safetensors"));
    ASSERT_OK(in);
    std::vector<std::vector<char>> bytes;
    std::vector<TensorToWrite> out;
    for (const TensorInfo& t : in->tensors()) {
      bytes.emplace_back(t.data_end - t.data_begin);
      ASSERT_OK(in->ReadRaw(t, bytes.back().data()));
      out.push_back({t.name, t.dtype, t.shape, bytes.back().data()});
    }
    const TensorInfo* embed = in->Find("model.embed_tokens.weight");
    ASSERT_NE(embed, nullptr);
    bytes.emplace_back(embed->data_end - embed->data_begin);
    ASSERT_OK(in->ReadRaw(*embed, bytes.back().data()));
    if (!same) bytes.back()[6] ^= 0x40;  // one bit of one element (bf16: element 3's high byte)
    out.push_back({"lm_head.weight", embed->dtype, embed->shape, bytes.back().data()});
    ASSERT_OK(WriteSafetensors(dir + "/model.safetensors", out));
    RunResult r = RunLlm(Tiny({"--nproc", "1", "--model", dir, "--steps", "0", "--eval-windows", "0"}), 60);
    if (same) {
      EXPECT_EQ(r.exit_code, 0) << r.output;
    } else {
      EXPECT_NE(r.exit_code, 0) << r.output;
      EXPECT_NE(r.output.find("lm_head.weight"), std::string::npos) << r.output;
      EXPECT_NE(r.output.find("tie_word_embeddings is true"), std::string::npos) << r.output;
    }
  }
}

TEST_F(ZeroLlmTest, EvalOnlyPrintsOneLineAndAgreesAcrossWorldSizesAndStages) {
  ASSERT_EQ(trained_->exit_code, 0) << trained_->output;
  // Token ids of a text the model never saw, written as .bin.
  std::vector<int32_t> ids;
  for (int i = 0; i < 33 * 5 + 7; ++i) ids.push_back((i * 37 + 11) % 500);
  ASSERT_OK(WriteTokenBin(Tmp("eval.bin"), ids));
  RunResult one = RunLlm(Tiny({"--nproc", "1", "--model", Tmp("export"), "--data", Tmp("eval.bin"), "--eval-only"}));
  RunResult two = RunLlm(
      Tiny({"--nproc", "2", "--stage", "3", "--model", Tmp("export"), "--data", Tmp("eval.bin"), "--eval-only"}));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(two.exit_code, 0) << two.output;
  // 5 whole windows of seq + 1 = 33 tokens (the partial sixth is dropped): 5 * 32 targets.
  EXPECT_NE(one.output.find(" tokens=160"), std::string::npos) << one.output;
  EXPECT_NEAR(EvalLoss(one.output), EvalLoss(two.output), 1e-9) << one.output << two.output;
  EXPECT_GT(EvalLoss(one.output), 0.0);
}

// A checkpoint records its tokenizer: resuming with another one is refused (the ids would mean other
// text); with the same one the run goes on.
TEST(ZeroLlmResume, ACheckpointResumesOnlyWithItsTokenizer) {
  const std::string ckpt = Tmp("tokenizer_ckpt");
  RunResult first = RunLlm(Tiny({"--nproc", "1", "--steps", "2", "--eval-windows", "0", "--save", ckpt}), 60);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  RunResult same = RunLlm(Tiny({"--nproc", "1", "--steps", "3", "--eval-windows", "0", "--resume", ckpt}), 60);
  EXPECT_EQ(same.exit_code, 0) << same.output;
  std::vector<std::string> other = Tiny({"--nproc", "1", "--steps", "3", "--eval-windows", "0", "--resume", ckpt});
  for (size_t i = 0; i + 1 < other.size(); ++i) {
    if (other[i] == "--tokenizer-vocab") other[i + 1] = "384";
  }
  RunResult changed = RunLlm(other, 60);
  EXPECT_NE(changed.exit_code, 0) << changed.output;
  EXPECT_NE(changed.output.find("the checkpoint was trained with another tokenizer"), std::string::npos)
      << changed.output;
}

std::string WeightsHash(const std::string& output) {
  const size_t at = output.find("master_weights_hash=");
  return at == std::string::npos ? "" : output.substr(at + 20, 16);
}

// The same rows (--sequential-data) at stages 1 and 3 with two ranks, fp32, GAS 1: the two reduction
// orders coincide there (docs/zero.md, "The arithmetic contract"), so the fp32 master weights are bitwise equal;
// another seed moves them.
TEST(ZeroLlmHash, StagesOneAndThreeTrainTheSameBits) {
  std::vector<int32_t> ids;
  for (int i = 0; i < 33 * 40; ++i) ids.push_back((i * 7919 + i / 3) % 512);
  ASSERT_OK(WriteTokenBin(Tmp("rows.bin"), ids));
  auto run = [&](const std::string& stage, const std::string& seed) {
    return RunLlm(Tiny({"--nproc", "2", "--stage", stage, "--seed", seed, "--data", Tmp("rows.bin"),
                        "--sequential-data", "--steps", "4", "--hash-weights", "--eval-windows", "0"}),
                  120);
  };
  RunResult s1 = run("1", "1"), s3 = run("3", "1"), other = run("3", "2");
  ASSERT_EQ(s1.exit_code, 0) << s1.output;
  ASSERT_EQ(s3.exit_code, 0) << s3.output;
  ASSERT_EQ(other.exit_code, 0) << other.output;
  ASSERT_EQ(WeightsHash(s1.output).size(), 16u) << s1.output;
  EXPECT_EQ(WeightsHash(s1.output), WeightsHash(s3.output));
  EXPECT_NE(WeightsHash(s3.output), WeightsHash(other.output));
}

// A DeepSpeed-style config for the tiny preset: ZeRO-3, fp32, AdamW with weight decay, clipping,
// optimizer and parameters offloaded to the CPU (pinned, the default, with pin_memory_fallback
// true: pageable beyond a normal user's RLIMIT_MEMLOCK), GAS `gas`, micro batch 4, and `zero_extra` /
// `top_extra` members added to zero_optimization / the top level.
std::string OffloadConfig(const std::string& name, int gas, const std::string& zero_extra,
                          const std::string& top_extra) {
  const std::string path = Tmp(name);
  std::ofstream(path) << "{\"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": " << gas
                      << ", \"gradient_clipping\": 0.5, \"optimizer\": {\"type\": \"AdamW\", \"params\": "
                         "{\"lr\": 0.01, \"weight_decay\": 0.1}}, \"zero_optimization\": {\"stage\": 3, "
                         "\"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory_fallback\": true}, "
                         "\"offload_param\": {\"device\": \"cpu\", \"pin_memory_fallback\": true}"
                      << zero_extra << "}" << top_extra << "}\n";
  return path;
}

// Two runs that must train the same master-weight bits and a control run that must not; `banner`
// is a line the second run prints.
void ExpectSameBitsAndControlDiffers(const RunResult& a, const RunResult& b, const RunResult& control,
                                     const std::string& banner) {
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ASSERT_EQ(b.exit_code, 0) << b.output;
  ASSERT_EQ(control.exit_code, 0) << control.output;
  EXPECT_NE(b.output.find(banner), std::string::npos) << b.output;
  ASSERT_EQ(WeightsHash(a.output).size(), 16u) << a.output;
  EXPECT_EQ(WeightsHash(a.output), WeightsHash(b.output));
  EXPECT_NE(WeightsHash(a.output), WeightsHash(control.output));
}

// Validation (i) of docs/llm.md on the CPU: with an extra head used only in micro step 0 of every
// window (its weight gets a gradient in the first micro step only), offload_grad_accumulation "cpu"
// (host adds) and "gpu" (device sums, one copy per step) train the same fp32 master bits. The
// control: without the extra head's micro step the weights differ, so the head is in the sum.
TEST(ZeroLlmHeads, GradAccumulationOnHostOrDeviceAgreeWithAHeadOnlyInTheFirstMicroStep) {
  auto run = [&](const std::string& acc, const std::string& heads) {
    const std::string cfg =
        OffloadConfig("first_micro_" + acc + ".json", 4, ", \"offload_grad_accumulation\": \"" + acc + "\"", "");
    return RunLlm(Tiny({"--nproc", "2", "--config", cfg, "--task", "reverse-text", "--extra-heads", "1", "--heads",
                        heads, "--steps", "3", "--hash-weights", "--eval-windows", "0"}),
                  180);
  };
  ExpectSameBitsAndControlDiffers(run("cpu", "first-micro"), run("gpu", "first-micro"), run("cpu", "main"),
                                  "1 extra head(s), schedule first-micro");
}

// Validation (iii) of docs/llm.md on the CPU: unmanaged accumulation (managed_gradient_accumulation
// false; zero_llm divides by the micro steps itself) trains the same fp32 master bits as managed,
// with optimizer and parameter offload and the model's own head and an extra head alternating
// between windows (each is absent from every other window). The control: the heads matter.
TEST(ZeroLlmHeads, UnmanagedEqualsManagedWithHeadsAlternatingBetweenWindows) {
  auto run = [&](bool managed, const std::string& heads) {
    const std::string cfg = OffloadConfig(std::string("alternate_") + (managed ? "managed" : "unmanaged") + ".json", 2,
                                          "", managed ? "" : ", \"managed_gradient_accumulation\": false");
    return RunLlm(Tiny({"--nproc", "2", "--config", cfg, "--extra-heads", "1", "--heads", heads, "--steps", "4",
                        "--hash-weights", "--eval-windows", "0"}),
                  180);
  };
  ExpectSameBitsAndControlDiffers(run(true, "alternate"), run(false, "alternate"), run(false, "main"),
                                  "unmanaged gradient accumulation");
}

TEST(ZeroLlmErrors, BadInputEndsQuicklyNamingWhatIsWrong) {
  RunResult seq = RunLlm(Tiny({"--nproc", "1", "--seq", "100000"}), 30);
  EXPECT_EQ(seq.exit_code, 2) << seq.output;
  EXPECT_NE(seq.output.find("max_position_embeddings"), std::string::npos) << seq.output;

  std::vector<int32_t> ids = {1, 2, 3, 600, 4};
  ASSERT_OK(WriteTokenBin(Tmp("bad.bin"), ids));
  RunResult bad = RunLlm(Tiny({"--nproc", "1", "--data", Tmp("bad.bin"), "--steps", "1"}), 30);
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_NE(bad.output.find("600"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("3"), std::string::npos) << bad.output;

  mkdir(Tmp("empty_model").c_str(), 0755);
  RunResult missing = RunLlm(Tiny({"--nproc", "1", "--model", Tmp("empty_model"), "--steps", "1"}), 30);
  EXPECT_NE(missing.exit_code, 0) << missing.output;
  EXPECT_NE(missing.output.find("config.json"), std::string::npos) << missing.output;

  RunResult heads = RunLlm(Tiny({"--nproc", "1", "--heads", "alternate"}), 30);
  EXPECT_EQ(heads.exit_code, 2) << heads.output;
  EXPECT_NE(heads.output.find("--heads alternate needs --extra-heads 1 or more"), std::string::npos) << heads.output;

  RunResult flag = RunLlm({"--stpes", "3"}, 30);
  EXPECT_EQ(flag.exit_code, 2);
  EXPECT_NE(flag.output.find("did you mean --steps"), std::string::npos) << flag.output;
}

}  // namespace
}  // namespace zero::llm
