// Ranks started by hand (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, as torchrun or mpirun would) with
// flags or data that differ: both ranks end within seconds, before the first step, with a message
// naming the first difference (the flag or file, rank 1's value and rank 0's), rather than a gloo
// EnforceNotMet abort, a hang, or a run that trains on a mix (Trainer::CheckRanksAgree).
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "testing/free_port.h"
#include "train/run_binary_testing.h"

namespace zero {
namespace {

using testing::DataBinary;
using testing::RunBinary;
using testing::RunResult;

struct Pair {
  RunResult r0, r1;
};

// Rank 0 with args0, rank 1 with args1, on a free loopback port.
Pair RunTwoRanks(const std::string& binary, const std::vector<std::string>& args0,
                 const std::vector<std::string>& args1) {
  const int port = testing::FreeLoopbackPort();
  EXPECT_GT(port, 0);
  const std::vector<std::string> common = {"WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
                                           "MASTER_PORT=" + std::to_string(port)};
  Pair p;
  std::thread t([&] {
    auto env = common;
    env.push_back("RANK=1");
    env.push_back("LOCAL_RANK=1");
    p.r1 = RunBinary(binary, args1, env, 60);
  });
  auto env = common;
  env.push_back("RANK=0");
  env.push_back("LOCAL_RANK=0");
  p.r0 = RunBinary(binary, args0, env, 60);
  t.join();
  return p;
}

std::string Llm() { return DataBinary("train/zero_llm"); }
std::string Byte() { return DataBinary("train/zero_train"); }

std::vector<std::string> LlmArgs(std::vector<std::string> extra) {
  std::vector<std::string> a = {"--preset", "tiny", "--seq",          "32", "--batch",   "2", "--corpus-bytes", "40000",
                                "--plot",   "none", "--eval-windows", "2",  "--timeout", "20"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

std::vector<std::string> ByteArgs(std::vector<std::string> extra) {
  std::vector<std::string> a = {"--hidden", "16", "--ffn",         "32",        "--embed", "8", "--plot", "none",
                                "--sample", "0",  "--no-progress", "--timeout", "20"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// Both ranks fail fast, each with `message`, and neither trained nor hit gloo's EnforceNotMet.
void ExpectBothRefuse(const Pair& p, const std::string& message) {
  for (const RunResult* r : {&p.r0, &p.r1}) {
    EXPECT_EQ(r->exit_code, 1) << r->output;
    EXPECT_LT(r->seconds, 30) << r->output;
    EXPECT_NE(r->output.find(message), std::string::npos) << "expected: " << message << "\n" << r->output;
    EXPECT_EQ(r->output.find("EnforceNotMet"), std::string::npos) << r->output;
    EXPECT_EQ(r->output.find("step 1/"), std::string::npos) << r->output;
  }
}

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = testing::TestTmpDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

std::string SomeText(int seed) {
  std::string s;
  for (int i = 0; i < 4000; ++i) s += "word" + std::to_string((i * 7 + seed) % 97) + (i % 13 == 0 ? ".\n" : " ");
  return s;
}

TEST(RankAgreement, ZeroLlmDifferentSteps) {
  ASSERT_FALSE(Llm().empty());
  ExpectBothRefuse(RunTwoRanks(Llm(), LlmArgs({"--steps", "2"}), LlmArgs({"--steps", "3"})),
                   "--steps: rank 1 has 3, rank 0 has 2");
}

TEST(RankAgreement, ZeroLlmDifferentSeq) {
  ExpectBothRefuse(RunTwoRanks(Llm(), LlmArgs({"--steps", "2"}), LlmArgs({"--steps", "2", "--seq", "16"})),
                   "--seq: rank 1 has 16, rank 0 has 32");
}

TEST(RankAgreement, ZeroLlmDifferentStage) {
  ExpectBothRefuse(RunTwoRanks(Llm(), LlmArgs({"--steps", "2"}), LlmArgs({"--steps", "2", "--stage", "1"})),
                   "--stage: rank 1 has 1, rank 0 has 3");
}

// The same flags, different --data files: the data's identity (its tokens' count and hash) differs.
TEST(RankAgreement, ZeroLlmDifferentDataFiles) {
  const std::string a = WriteFile("llm_a.txt", SomeText(1)), b = WriteFile("llm_b.txt", SomeText(2));
  ExpectBothRefuse(RunTwoRanks(Llm(), LlmArgs({"--steps", "2", "--data", a}), LlmArgs({"--steps", "2", "--data", b})),
                   "the data (--data): rank 1 has ");
}

// The same content at different paths is the same data: the ranks train.
TEST(RankAgreement, ZeroLlmSameDataAtDifferentPathsTrains) {
  const std::string a = WriteFile("llm_same_a.txt", SomeText(3)), b = WriteFile("llm_same_b.txt", SomeText(3));
  Pair p = RunTwoRanks(Llm(), LlmArgs({"--steps", "2", "--data", a}), LlmArgs({"--steps", "2", "--data", b}));
  EXPECT_EQ(p.r0.exit_code, 0) << p.r0.output;
  EXPECT_EQ(p.r1.exit_code, 0) << p.r1.output;
}

TEST(RankAgreement, ZeroTrainDifferentSteps) {
  ASSERT_FALSE(Byte().empty());
  ExpectBothRefuse(RunTwoRanks(Byte(), ByteArgs({"--steps", "2"}), ByteArgs({"--steps", "4"})),
                   "--steps: rank 1 has 4, rank 0 has 2");
}

TEST(RankAgreement, ZeroTrainDifferentDataFiles) {
  const std::string a = WriteFile("byte_a.txt", SomeText(1)), b = WriteFile("byte_b.txt", SomeText(2));
  ExpectBothRefuse(
      RunTwoRanks(Byte(), ByteArgs({"--steps", "2", "--data", a}), ByteArgs({"--steps", "2", "--data", b})),
      "the data (--data): rank 1 has ");
}

// A built-in config on one rank and --config on the other: the resolved configs differ, and the
// message shows the first line that does.
TEST(RankAgreement, ZeroTrainBuiltinAgainstConfigFile) {
  const std::string cfg = WriteFile("byte_cfg.json",
                                    R"({"train_micro_batch_size_per_gpu": 32, "gradient_accumulation_steps": 2,
                                        "optimizer": {"type": "AdamW", "params": {"lr": 0.003}},
                                        "zero_optimization": {"stage": 2}})");
  ExpectBothRefuse(RunTwoRanks(Byte(), ByteArgs({"--steps", "2"}), ByteArgs({"--steps", "2", "--config", cfg})),
                   "--config: rank 1 has given, rank 0 has not given");
}

// Two config files that differ: the message shows the first line of the resolved configs that does.
TEST(RankAgreement, ZeroTrainDifferentConfigFiles) {
  const std::string a = WriteFile("byte_stage2.json", R"({"train_micro_batch_size_per_gpu": 4,
                                      "zero_optimization": {"stage": 2}})");
  const std::string b = WriteFile("byte_stage1.json", R"({"train_micro_batch_size_per_gpu": 4,
                                      "zero_optimization": {"stage": 1}})");
  Pair p = RunTwoRanks(Byte(), ByteArgs({"--steps", "2", "--config", a}), ByteArgs({"--steps", "2", "--config", b}));
  ExpectBothRefuse(p, "the resolved engine config: rank 1 has line ");
  EXPECT_NE(p.r0.output.find("'\"stage\": 1,', rank 0 has line "), std::string::npos) << p.r0.output;
  EXPECT_NE(p.r0.output.find("'\"stage\": 2,'; start every rank"), std::string::npos) << p.r0.output;
}

// The flags against the checkpoint: --resume of a checkpoint past --steps is an error in both jobs,
// and resuming at --steps says there is nothing to train (it printed "loss nan ... (mean of the
// last 0 steps)").
void ExpectResumeChecks(const std::string& binary, const std::vector<std::string>& args, const std::string& dir) {
  const std::string ckpt = testing::TestTmpDir() + "/" + dir;
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = args;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  RunResult saved = RunBinary(binary, with({"--nproc", "1", "--steps", "4", "--save", ckpt}), {}, 60);
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  RunResult past = RunBinary(binary, with({"--nproc", "1", "--steps", "2", "--resume", ckpt}), {}, 60);
  EXPECT_EQ(past.exit_code, 1) << past.output;
  EXPECT_NE(past.output.find("--resume " + ckpt + ": the checkpoint is at step 4, past --steps 2"), std::string::npos)
      << past.output;
  RunResult at = RunBinary(binary, with({"--nproc", "1", "--steps", "4", "--resume", ckpt}), {}, 60);
  EXPECT_EQ(at.exit_code, 0) << at.output;
  EXPECT_NE(at.output.find("nothing to train: the checkpoint is at step 4 = --steps"), std::string::npos) << at.output;
  EXPECT_EQ(at.output.find("nan"), std::string::npos) << at.output;
}

TEST(ResumeAgainstSteps, ZeroLlm) { ExpectResumeChecks(Llm(), LlmArgs({}), "llm_ckpt"); }
TEST(ResumeAgainstSteps, ZeroTrain) { ExpectResumeChecks(Byte(), ByteArgs({}), "byte_ckpt"); }

// Absurd sizes: a micro batch whose activations cannot fit is an error naming the flag before any
// allocation (zero_llm aborted with bad_alloc), and a step of very many micro steps is announced
// with its expected time within seconds (it printed nothing for 40 s).
TEST(AbsurdSizes, ZeroLlmMicroBatchThatCannotFit) {
  RunResult r = RunBinary(Llm(), LlmArgs({"--nproc", "1", "--steps", "1", "--batch", "65536", "--seq", "128"}), {}, 30);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--batch 65536"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("of memory"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("bad_alloc"), std::string::npos) << r.output;
}

TEST(AbsurdSizes, ZeroTrainHugeAccumulationIsAnnounced) {
  const std::string cfg = WriteFile("byte_gas.json", R"({"train_micro_batch_size_per_gpu": 4,
                                        "gradient_accumulation_steps": 1000000000})");
  RunResult r = RunBinary(Byte(), ByteArgs({"--nproc", "1", "--steps", "1", "--config", cfg}), {}, 8);
  EXPECT_NE(r.output.find("step 1: 1000000000 micro steps (gradient_accumulation_steps) of about"), std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace zero
