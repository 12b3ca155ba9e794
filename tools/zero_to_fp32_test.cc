// zero_to_fp32: the consolidation function, and the binary itself (exit codes and messages).
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "engine/checkpoint/consolidate.h"
#include "engine/checkpoint/format.h"
#include "engine/checkpoint/io.h"
#include "engine/checkpoint/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hf/safetensors.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

using ::testing::HasSubstr;
using zero::testing::SameBits;
using zero::testing::SaveSynthetic;
using zero::testing::ScratchDir;
using zero::testing::SyntheticModel;
using zero::testing::SyntheticState;

// The consolidated file at `path` holds exactly `full`'s master weights, as F32.
void ExpectMatches(const std::string& path, const FullState& full) {
  auto file = llm::SafetensorsFile::Open(path);
  ASSERT_OK(file);
  ASSERT_EQ(file->tensors().size(), full.params.size());
  for (const FullParam& p : full.params) {
    SCOPED_TRACE(p.name);
    const llm::TensorInfo* t = file->Find(p.name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->dtype, DType::kF32);
    EXPECT_EQ(t->shape, p.shape);
    auto values = file->ReadFloats(*t);
    ASSERT_OK(values);
    EXPECT_TRUE(SameBits(*values, p.master));
  }
}

class ZeroToFp32Test : public ::testing::TestWithParam<int> {};

TEST_P(ZeroToFp32Test, ConsolidatesEveryTensorExactly) {
  const int world = GetParam();
  const std::string dir = ScratchDir("z2f");
  FullState full = SyntheticState(SyntheticModel(), world);
  SaveSynthetic(dir, "global_step120", full, world);
  const std::string out = dir + "/model.safetensors";
  auto summary = ConsolidateToFp32(dir, "", out);
  ASSERT_OK(summary);
  EXPECT_EQ(summary->tag, "global_step120");
  EXPECT_EQ(summary->tensors, 6);
  EXPECT_EQ(summary->params, 35 + 143 + 11 + 1 + 0 + 51);
  EXPECT_EQ(summary->dp_world_size, world);
  EXPECT_EQ(summary->zero_stage, 2);
  EXPECT_EQ(summary->bytes, *FileSize(out));
  EXPECT_THAT(summary->ToString(), HasSubstr("6 tensors, 241 params"));

  ExpectMatches(out, full);
  auto file = llm::SafetensorsFile::Open(out);
  ASSERT_OK(file);
  EXPECT_EQ(file->metadata().at("global_steps"), "120");
  EXPECT_EQ(file->metadata().at("zero_stage"), "2");
  EXPECT_EQ(file->metadata().at("dp_world_size"), std::to_string(world));
  EXPECT_EQ(file->metadata().at("tag"), "global_step120");
  EXPECT_EQ(file->metadata().at("model_dtype"), "bf16");
  EXPECT_EQ(file->metadata().at("format"), "pt");
}

INSTANTIATE_TEST_SUITE_P(SavedWorlds, ZeroToFp32Test, ::testing::Values(1, 2, 3, 4));

TEST(ZeroToFp32ErrorsTest, CorruptCheckpointWritesNoOutput) {
  const std::string dir = ScratchDir("z2f");
  FullState full = SyntheticState(SyntheticModel(), 2);
  SaveSynthetic(dir, "t", full, 2);
  ASSERT_EQ(::unlink((dir + "/t/" + RankFileName(1)).c_str()), 0);
  auto r = ConsolidateToFp32(dir, "t", dir + "/out.safetensors");
  EXPECT_THAT(r.status().message(), HasSubstr("zero_rank_1_optim_states.bin is missing"));
  EXPECT_FALSE(PathExists(dir + "/out.safetensors"));
}

// --- the binary
// -----------------------------------------------------------------------------------

struct ToolRun {
  int code;
  std::string output;
};

ToolRun RunTool(const std::string& args) {
  const std::string log = ScratchDir("z2f_log") + "/out.txt";
  int status = std::system(("tools/zero_to_fp32 " + args + " >" + log + " 2>&1").c_str());
  std::stringstream ss;
  ss << std::ifstream(log).rdbuf();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, ss.str()};
}

TEST(ZeroToFp32BinaryTest, ConvertsWithAndWithoutTag) {
  const std::string dir = ScratchDir("z2f_bin");
  FullState full = SyntheticState(SyntheticModel(), 3);
  SaveSynthetic(dir, "global_step120", full, 3);
  FullState other = SyntheticState(SyntheticModel(), 2);
  for (FullParam& p : other.params) {
    for (float& v : p.master) v = -v;
  }
  SaveSynthetic(dir, "older", other, 2);  // now `latest`

  ToolRun run = RunTool(dir + " " + dir + "/a.safetensors --tag global_step120");
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("6 tensors, 241 params"));
  EXPECT_THAT(run.output, HasSubstr("saved at dp world size 3"));
  ExpectMatches(dir + "/a.safetensors", full);

  run = RunTool(dir + " " + dir + "/b.safetensors");
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("tag older"));
  ExpectMatches(dir + "/b.safetensors", other);
}

TEST(ZeroToFp32BinaryTest, UsageAndErrors) {
  ToolRun run = RunTool("");
  EXPECT_EQ(run.code, 2);
  EXPECT_THAT(run.output, HasSubstr("usage: zero_to_fp32"));
  EXPECT_EQ(RunTool("a b --tag").code, 2);
  EXPECT_EQ(RunTool("a b --frobnicate").code, 2);
  EXPECT_EQ(RunTool("--help").code, 0);

  const std::string dir = ScratchDir("z2f_err");
  run = RunTool(dir + "/none " + dir + "/o.safetensors");
  EXPECT_EQ(run.code, 1);
  EXPECT_THAT(run.output, HasSubstr("checkpoint directory " + dir + "/none does not exist"));

  FullState full = SyntheticState(SyntheticModel(), 2);
  SaveSynthetic(dir, "t", full, 2);
  run = RunTool(dir + " " + dir + "/o.safetensors --tag=missing");
  EXPECT_EQ(run.code, 1);
  EXPECT_THAT(run.output, HasSubstr("checkpoint tag 'missing' does not exist"));
}

// An output inside the checkpoint directory that names one of its files (`latest`, the lock, a
// tag directory or anything below one) is refused naming both, and nothing is changed; a new
// .safetensors file directly in the directory (or an earlier one) is fine.
TEST(ZeroToFp32BinaryTest, RefusesToOverwriteTheCheckpoint) {
  const std::string dir = ScratchDir("z2f_self");
  FullState full = SyntheticState(SyntheticModel(), 2);
  SaveSynthetic(dir, "global_step7", full, 2);
  const std::string latest = *ReadFile(dir + "/latest");
  const std::string rank0 = *ReadFile(dir + "/global_step7/" + RankFileName(0));
  for (const std::string& out :
       {dir + "/latest", dir + "/./latest", dir + "/global_step7", dir + "/global_step7/" + RankFileName(0),
        dir + "/global_step7/new.safetensors", dir + "/" + kDirectoryLockFile, dir}) {
    SCOPED_TRACE(out);
    ToolRun run = RunTool(dir + " " + out);
    EXPECT_EQ(run.code, 2) << run.output;
    EXPECT_THAT(run.output, HasSubstr("inside the checkpoint directory " + dir));
    EXPECT_THAT(run.output, HasSubstr(out));
  }
  EXPECT_EQ(*ReadFile(dir + "/latest"), latest);
  EXPECT_TRUE(*ReadFile(dir + "/global_step7/" + RankFileName(0)) == rank0);
  EXPECT_FALSE(PathExists(dir + "/global_step7/new.safetensors"));
  ToolRun run = RunTool(dir + " " + dir + "/fp32.safetensors");
  ASSERT_EQ(run.code, 0) << run.output;
  run = RunTool(dir + " " + dir + "/fp32.safetensors");  // an earlier output is replaced
  ASSERT_EQ(run.code, 0) << run.output;
  ExpectMatches(dir + "/fp32.safetensors", full);
}

}  // namespace
}  // namespace zero
