// zero_llm's (and zero_train's) data inputs end to end on the CPU, one rank, the tiny preset, a few
// seconds each (issue 35): the held-out split is whole files, reported, with the training split's
// loss beside it on the same windows' definition; --eval-only refuses data with no window and a
// loss that is not finite, honours --resume DIR and refuses --save / --export-hf; a --data path that
// is not a regular file is refused at start naming the flag, the path and what it is; token files
// are told by their name's extension in any case and binary text is refused; a model directory
// without tokenizer.json gets no tokenizer trained on the text unless one is asked for.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "data/token_data.h"
#include "hf/safetensors.h"
#include "testing/status_matchers.h"
#include "train/run_binary_testing.h"

namespace zero::llm {
namespace {

using zero::testing::ReadWholeFile;
using zero::testing::RunResult;

RunResult RunLlm(const std::vector<std::string>& args, double timeout_s = 60) {
  return zero::testing::RunBinary(zero::testing::DataBinary("train/zero_llm"), args, {}, timeout_s);
}

std::string Tmp(const std::string& name) { return zero::testing::TestTmpDir() + "/" + name; }

// One rank, the tiny preset on 200 kB of the built-in corpus, a 300-token tokenizer, short rows.
std::vector<std::string> Tiny(std::vector<std::string> extra) {
  std::vector<std::string> a = {"--nproc", "1",  "--preset", "tiny", "--corpus-bytes", "200000",
                                "--seq",   "32", "--batch",  "4",    "--plot",         "none"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// The value after `key` ("eval_loss=") in the output, NaN when absent.
double Value(const std::string& output, const std::string& key) {
  const size_t at = output.find(key);
  if (at == std::string::npos) return NAN;
  return std::stod(output.substr(at + key.size()));
}

bool Has(const RunResult& r, const std::string& text) { return r.output.find(text) != std::string::npos; }

// A Hugging Face directory of the tiny preset's initial weights (config.json, model.safetensors,
// tokenizer.json), made once.
const std::string& ModelDir() {
  static const std::string dir = [] {
    const std::string d = Tmp("model");
    RunResult r = RunLlm(Tiny({"--tokenizer-vocab", "300", "--steps", "0", "--eval-windows", "0", "--export-hf", d}));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return d;
  }();
  return dir;
}

// The default run's split (issue 35: it held out the last 5% of the tokens, one codec table of
// Python's encodings): whole files, named in the header, and after training the training split's
// loss and the held-out loss over as many windows, each with its standard error.
TEST(ZeroLlmData, HeldOutFilesAreReportedAndBothSplitsEvaluatedAlike) {
  RunResult r = RunLlm(Tiny({"--tokenizer-vocab", "300", "--steps", "3", "--eval-windows", "16"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Has(r, "held out for evaluation (--holdout 0.05, --seed 1): ")) << r.output;
  EXPECT_TRUE(Has(r, " files, ")) << r.output;
  EXPECT_TRUE(Has(r, "train_loss=")) << r.output;
  EXPECT_TRUE(Has(r, "(training split: 16 of its ")) << r.output;
  EXPECT_TRUE(Has(r, "(held-out: 16 of its ")) << r.output;
  EXPECT_TRUE(Has(r, " tokens=512 ")) << "16 windows of 32 targets";
  EXPECT_GT(Value(r.output, "eval_loss="), 0.0) << r.output;
  EXPECT_GT(Value(r.output, "train_loss="), 0.0) << r.output;

  // Another seed holds out other files.
  RunResult other = RunLlm(Tiny({"--tokenizer-vocab", "300", "--steps", "0", "--eval-windows", "0", "--seed", "2"}));
  ASSERT_EQ(other.exit_code, 0) << other.output;
  auto held_line = [](const std::string& out) {
    const size_t at = out.find("held out for evaluation");
    return at == std::string::npos ? std::string() : out.substr(out.find(':', at) + 1, out.find('\n', at) - at);
  };
  EXPECT_NE(held_line(r.output), held_line(other.output)) << r.output << other.output;
}

// --eval-only printed eval_loss=0.000000 tokens=0 and exited 0 on empty or too short data, and
// eval_loss=nan on NaN weights.
TEST(ZeroLlmData, EvalOnlyRefusesNoWindowAndANonFiniteLoss) {
  ASSERT_OK(WriteTokenBin(Tmp("empty.bin"), {}));
  ASSERT_OK(WriteTokenBin(Tmp("short.bin"), {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
  for (const std::string name : {"empty.bin", "short.bin"}) {
    RunResult r = RunLlm(Tiny({"--model", ModelDir(), "--data", Tmp(name), "--eval-only"}));
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_TRUE(Has(r, "--eval-only: --data " + Tmp(name) + " holds ")) << r.output;
    EXPECT_TRUE(Has(r, "fewer than one window of --seq + 1 = 33")) << r.output;
    EXPECT_FALSE(Has(r, "eval_loss=")) << r.output;
  }

  // The directory's weights with every element of the final norm NaN.
  const std::string nan_dir = Tmp("nan_model");
  mkdir(nan_dir.c_str(), 0755);
  std::ofstream(nan_dir + "/config.json") << ReadWholeFile(ModelDir() + "/config.json");
  std::ofstream(nan_dir + "/tokenizer.json") << ReadWholeFile(ModelDir() + "/tokenizer.json");
  Result<SafetensorsFile> in = SafetensorsFile::Open(ModelDir() + "/model.safetensors");
  ASSERT_OK(in);
  std::vector<std::vector<char>> bytes;
  std::vector<TensorToWrite> out;
  for (const TensorInfo& t : in->tensors()) {
    bytes.emplace_back(t.data_end - t.data_begin);
    ASSERT_OK(in->ReadRaw(t, bytes.back().data()));
    if (t.name == "model.norm.weight") {
      ASSERT_EQ(t.dtype, DType::kBF16);
      for (size_t i = 0; i + 1 < bytes.back().size(); i += 2) bytes.back()[i] = '\xc0', bytes.back()[i + 1] = '\x7f';
    }
    out.push_back({t.name, t.dtype, t.shape, bytes.back().data()});
  }
  ASSERT_OK(WriteSafetensors(nan_dir + "/model.safetensors", out));
  std::vector<int32_t> ids;
  for (int i = 0; i < 33 * 3; ++i) ids.push_back((i * 37 + 11) % 300);
  ASSERT_OK(WriteTokenBin(Tmp("three.bin"), ids));
  RunResult nan = RunLlm(Tiny({"--model", nan_dir, "--data", Tmp("three.bin"), "--eval-only"}));
  EXPECT_NE(nan.exit_code, 0) << nan.output;
  EXPECT_TRUE(Has(nan, "--eval-only on " + Tmp("three.bin") + ": the loss over 3 windows (96 targets) is nan"))
      << nan.output;
  EXPECT_FALSE(Has(nan, "eval_loss=")) << nan.output;
}

// --eval-only --resume DIR ignored DIR (even a missing one); --save and --export-hf were ignored.
TEST(ZeroLlmData, EvalOnlyEvaluatesTheCheckpointAndRefusesWritingFlags) {
  std::vector<int32_t> ids;
  for (int i = 0; i < 33 * 4; ++i) ids.push_back((i * 7 + 3) % 300);
  ASSERT_OK(WriteTokenBin(Tmp("four.bin"), ids));
  RunResult trained = RunLlm(Tiny({"--model", ModelDir(), "--data", Tmp("four.bin"), "--holdout", "0", "--steps", "3",
                                   "--lr", "0.01", "--save", Tmp("ckpt")}));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  RunResult initial = RunLlm(Tiny({"--model", ModelDir(), "--data", Tmp("four.bin"), "--eval-only"}));
  RunResult resumed =
      RunLlm(Tiny({"--model", ModelDir(), "--data", Tmp("four.bin"), "--eval-only", "--resume", Tmp("ckpt")}));
  ASSERT_EQ(initial.exit_code, 0) << initial.output;
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(Has(resumed, "evaluating the checkpoint " + Tmp("ckpt") + " (step 3)")) << resumed.output;
  EXPECT_TRUE(Has(resumed, "tokens=128 (all of the data: 4 of its 4 windows")) << resumed.output;
  EXPECT_LT(Value(resumed.output, "eval_loss="), Value(initial.output, "eval_loss=") - 0.01)
      << "three steps on these very windows lower their loss" << initial.output << resumed.output;

  RunResult missing =
      RunLlm(Tiny({"--model", ModelDir(), "--data", Tmp("four.bin"), "--eval-only", "--resume", Tmp("no_ckpt")}));
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_TRUE(Has(missing, "--eval-only --resume " + Tmp("no_ckpt") + ": no such checkpoint directory"))
      << missing.output;
  RunResult save = RunLlm(Tiny({"--model", ModelDir(), "--eval-only", "--save", Tmp("s")}));
  EXPECT_EQ(save.exit_code, 2) << save.output;
  EXPECT_TRUE(Has(save, "--eval-only and --save " + Tmp("s"))) << save.output;
  RunResult exp = RunLlm(Tiny({"--model", ModelDir(), "--eval-only", "--export-hf", Tmp("e")}));
  EXPECT_EQ(exp.exit_code, 2) << exp.output;
  EXPECT_TRUE(Has(exp, "--eval-only and --export-hf " + Tmp("e"))) << exp.output;
  EXPECT_TRUE(Has(exp, "--steps 0 --export-hf")) << exp.output;
}

// A named pipe as --data blocked both binaries forever; /dev/zero read 1 GiB (zero_train); a
// directory was "0 bytes ... too short". Refused at start, within seconds, naming the flag, the
// path and what it is.
TEST(ZeroLlmData, DataThatIsNotARegularFileIsRefusedAtStart) {
  const std::string fifo = Tmp("data_fifo");
  unlink(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const std::string dir = Tmp("data_dir");
  mkdir(dir.c_str(), 0755);
  struct Case {
    std::string path, what;
  };
  for (const Case& c :
       {Case{fifo, "a named pipe"}, Case{dir, "a directory"}, Case{"/dev/zero", "a character device"}}) {
    const std::string want = "--data " + c.path + ": not a regular file (it is " + c.what + "); expected ";
    const auto t0 = std::chrono::steady_clock::now();
    RunResult llm = RunLlm(Tiny({"--tokenizer-vocab", "300", "--data", c.path, "--steps", "1"}), 30);
    RunResult byte = zero::testing::RunBinary(zero::testing::DataBinary("train/zero_train"),
                                              {"--nproc", "1", "--data", c.path, "--steps", "1"}, {}, 30);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20.0) << c.path;
    EXPECT_EQ(llm.exit_code, 2) << llm.output;
    EXPECT_TRUE(Has(llm, want)) << llm.output;
    EXPECT_EQ(byte.exit_code, 2) << byte.output;
    EXPECT_TRUE(Has(byte, want)) << byte.output;
  }
  RunResult tok = RunLlm(Tiny({"--tokenizer", dir, "--steps", "1"}), 30);
  EXPECT_EQ(tok.exit_code, 2) << tok.output;
  EXPECT_TRUE(Has(tok, "--tokenizer " + dir + ": not a regular file (it is a directory)")) << tok.output;
}

// tokens.BIN was read as text and a tokenizer trained on its bytes; token ids in a .dat file too.
TEST(ZeroLlmData, TokenFilesAreToldByExtensionInAnyCaseAndBinaryTextIsRefused) {
  std::vector<int32_t> ids;
  for (int i = 0; i < 33 * 20; ++i) ids.push_back((i * 13 + 5) % 300);
  ASSERT_OK(WriteTokenBin(Tmp("tokens.BIN"), ids));
  RunResult upper = RunLlm(Tiny({"--data", Tmp("tokens.BIN"), "--steps", "1", "--eval-windows", "0"}));
  ASSERT_EQ(upper.exit_code, 0) << upper.output;
  EXPECT_TRUE(Has(upper, Tmp("tokens.BIN") + " (660 token ids)")) << upper.output;

  ASSERT_OK(WriteTokenBin(Tmp("tokens.dat"), ids));
  RunResult dat = RunLlm(Tiny({"--tokenizer-vocab", "300", "--data", Tmp("tokens.dat"), "--steps", "1"}));
  EXPECT_NE(dat.exit_code, 0) << dat.output;
  EXPECT_TRUE(Has(dat, "--data " + Tmp("tokens.dat") + ": byte 1 is NUL")) << dat.output;
  EXPECT_TRUE(Has(dat, "must be named *.bin")) << dat.output;
}

// A model directory without tokenizer.json and text data: a tokenizer was trained on the text,
// silently, so the model's loss meant nothing. Refused unless asked for.
TEST(ZeroLlmData, AModelWithoutATokenizerGetsNoneTrainedUnlessAskedFor) {
  const std::string bare = Tmp("no_tokenizer");
  mkdir(bare.c_str(), 0755);
  std::ofstream(bare + "/config.json") << ReadWholeFile(ModelDir() + "/config.json");
  std::ofstream(bare + "/model.safetensors", std::ios::binary) << ReadWholeFile(ModelDir() + "/model.safetensors");
  std::ofstream(Tmp("text.txt")) << ReadWholeFile("/usr/share/common-licenses/GPL-3");
  for (const std::vector<std::string>& data :
       {std::vector<std::string>{"--data", Tmp("text.txt"), "--eval-only"}, std::vector<std::string>{"--steps", "1"}}) {
    std::vector<std::string> args = {"--model", bare};
    args.insert(args.end(), data.begin(), data.end());
    RunResult r = RunLlm(Tiny(args), 30);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_TRUE(Has(r, "--model " + bare + " has no tokenizer.json")) << r.output;
    EXPECT_TRUE(Has(r, "--tokenizer FILE")) << r.output;
    EXPECT_TRUE(Has(r, "--tokenizer-vocab N")) << r.output;
  }
  RunResult asked =
      RunLlm(Tiny({"--model", bare, "--data", Tmp("text.txt"), "--eval-only", "--tokenizer-vocab", "300"}));
  EXPECT_EQ(asked.exit_code, 0) << asked.output;
  RunResult given = RunLlm(
      Tiny({"--model", bare, "--data", Tmp("text.txt"), "--eval-only", "--tokenizer", ModelDir() + "/tokenizer.json"}));
  EXPECT_EQ(given.exit_code, 0) << given.output;
  EXPECT_NEAR(Value(asked.output, "eval_loss="), std::log(512.0), 1.0) << asked.output;
}

}  // namespace
}  // namespace zero::llm
