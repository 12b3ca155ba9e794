// zero_llm's and zero_train's option checks without processes: a flag given with --config must
// agree with the file's key (ResolveLlmConfig), and every flag is either compared across ranks
// (LlmAgreedFlags / AgreedFlags, Trainer::CheckRanksAgree) or listed as one that may differ.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "testing/status_matchers.h"
#include "train/zero_llm_options.h"
#include "train/zero_train_options.h"

namespace zero {
namespace {

std::string WriteConfig(const std::string& text) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp != nullptr ? tmp : "/tmp") + "/llm_options_config.json";
  std::ofstream(path) << text;
  return path;
}

constexpr char kConfig[] = R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
  "steps_per_print": 5, "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
  "zero_optimization": {"stage": 2}})";

Result<Config> Resolve(std::vector<std::string> args) {
  ZERO_ASSIGN_OR_RETURN(llm::LlmTrainOptions o, llm::ParseLlmTrainOptions(args));
  return llm::ResolveLlmConfig(o, 2);
}

// A flag that disagrees with --config's key is an error naming the flag, the key path and both
// values (before: the file's value won silently).
TEST(LlmOptions, FlagDisagreeingWithConfigIsAnError) {
  const std::string cfg = WriteConfig(kConfig);
  struct Case {
    std::vector<std::string> flag;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {{"--stage", "3"}, "--stage 3 disagrees with --config " + cfg + ": zero_optimization.stage is 2 there"},
           {{"--batch", "8"}, "--batch 8 disagrees with --config " + cfg + ": train_micro_batch_size_per_gpu is 4"},
           {{"--gas=1"}, "--gas 1 disagrees with --config " + cfg + ": gradient_accumulation_steps is 2"},
           {{"--lr", "0.003"}, "--lr 0.003 disagrees with --config " + cfg + ": optimizer.params.lr is 0.001"},
           {{"--print_every", "10"}, "--print-every 10 disagrees with --config " + cfg + ": steps_per_print is 5"},
       }) {
    std::vector<std::string> args = {"--config", cfg};
    args.insert(args.end(), c.flag.begin(), c.flag.end());
    auto r = Resolve(args);
    ASSERT_FALSE(r.ok()) << c.flag[0];
    EXPECT_NE(r.status().message().find(c.message), std::string::npos) << r.status().ToString();
  }
}

// A flag that agrees with the file is fine, and so is a flag's default that was not given.
TEST(LlmOptions, FlagAgreeingWithConfigIsFine) {
  const std::string cfg = WriteConfig(kConfig);
  auto r =
      Resolve({"--config", cfg, "--stage", "2", "--batch", "4", "--gas", "2", "--lr", "1e-3", "--print-every", "5"});
  ASSERT_OK(r);
  EXPECT_EQ(r->zero.stage, 2);
  ASSERT_OK(Resolve({"--config", cfg}));
  // Without --config the flags make the built-in config.
  auto b = Resolve({"--stage", "1", "--batch", "3"});
  ASSERT_OK(b);
  EXPECT_EQ(b->zero.stage, 1);
  EXPECT_EQ(b->train_micro_batch_size_per_gpu, 3);
}

// The "--name" at the start of each usage line.
std::set<std::string> UsageFlags(const std::string& usage) {
  std::set<std::string> names;
  std::istringstream in(usage);
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find_first_not_of(' ');
    if (at == std::string::npos || line.compare(at, 2, "--") != 0) continue;
    names.insert(line.substr(at + 2, line.find_first_of(" =", at) - at - 2));
  }
  return names;
}

void ExpectEveryFlagCovered(const std::set<std::string>& usage,
                            const std::vector<std::pair<std::string, std::string>>& agreed,
                            const std::vector<std::string>& per_rank) {
  std::set<std::string> covered(per_rank.begin(), per_rank.end());
  for (const auto& [flag, value] : agreed) {
    EXPECT_TRUE(covered.insert(flag.substr(2)).second) << flag << " twice";
  }
  EXPECT_GT(usage.size(), 10u);
  for (const std::string& f : usage) {
    EXPECT_TRUE(covered.count(f)) << "--" << f << " is neither compared across ranks nor listed as per-rank";
  }
  for (const std::string& f : covered) EXPECT_TRUE(usage.count(f)) << "--" << f << " is not a flag";
}

// A new flag must be added to the comparison across ranks or, on purpose, to the per-rank list.
TEST(RankAgreementFlags, EveryFlagIsComparedOrPerRank) {
  llm::LlmTrainOptions o;
  ExpectEveryFlagCovered(UsageFlags(llm::LlmUsageText()), llm::LlmAgreedFlags(o), llm::LlmPerRankFlags());
  examples::TrainOptions t;
  ExpectEveryFlagCovered(UsageFlags(examples::UsageText()), examples::AgreedFlags(t), examples::PerRankFlags());
}

}  // namespace
}  // namespace zero
