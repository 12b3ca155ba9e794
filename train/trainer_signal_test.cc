// The graceful stop (train/trainer.h): a SIGTERM or SIGINT during training with --save finishes the
// step, saves its checkpoint and exits non-zero, whether the signal reaches the one in-process rank,
// the launching process (which forwards it), or one rank only (the ranks agree at the step
// boundary). Each run is the small model on CPU for a few seconds.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "train/run_binary_testing.h"

namespace {

using zero::testing::DataBinary;
using zero::testing::ReadWholeFile;
using zero::testing::TestTmpDir;

struct Started {
  pid_t pid = -1;
  std::string log;
};

// Starts `binary` as RunBinary does (its own process group, launcher variables removed), output to
// a log file, without waiting.
Started Start(const std::string& binary, const std::vector<std::string>& args, const std::string& log) {
  Started s{-1, log};
  s.pid = fork();
  if (s.pid == 0) {
    setpgid(0, 0);
    FILE* f = std::fopen(log.c_str(), "w");
    dup2(fileno(f), 1);
    dup2(fileno(f), 2);
    for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "MASTER_PORT"}) {
      unsetenv(v);
    }
    std::vector<std::string> all = {binary};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return s;
}

// The exit status, or -1 when killed by a signal or (after timeout_s) by the test.
int Wait(const Started& s, double timeout_s) {
  const auto t0 = std::chrono::steady_clock::now();
  int status = 0;
  while (waitpid(s.pid, &status, WNOHANG) != s.pid) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::duration<double>(timeout_s)) {
      kill(-s.pid, SIGKILL);
      waitpid(s.pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int Lines(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) ++n;
  return n;
}

// Waits until --log-json has a line (the first step is done); false when the process ended first
// or after 60 s.
bool WaitForFirstStep(const std::string& json, pid_t pid) {
  const auto t0 = std::chrono::steady_clock::now();
  while (Lines(json) < 1) {
    if (waitpid(pid, nullptr, WNOHANG) == pid) return false;
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(60)) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// The child processes of `pid` (its ranks), from /proc; empty where the kernel does not list them.
std::vector<pid_t> Children(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  std::vector<pid_t> out;
  pid_t c;
  while (in >> c) out.push_back(c);
  return out;
}

// The step N of "stopped by SIG... after step N" in `output`, or -1.
long StoppedAt(const std::string& output, const std::string& sig) {
  const std::string key = "stopped by " + sig + " after step ";
  const size_t at = output.find(key);
  return at == std::string::npos ? -1 : std::stol(output.substr(at + key.size()));
}

enum class Target { kProcess, kOneRank };

struct Case {
  std::string binary;  // "train/zero_train" or "train/zero_llm"
  std::vector<std::string> flags;
  int nproc;
  int sig;
  Target target;
};

std::vector<std::string> ZeroTrainFlags() {
  return {"--layers", "1", "--hidden", "64", "--ffn", "128", "--sample", "0"};
}

void RunCase(const Case& c, const std::string& name) {
  SCOPED_TRACE(name);
  const std::string binary = DataBinary(c.binary);
  ASSERT_FALSE(binary.empty()) << c.binary;
  const std::string dir = TestTmpDir() + "/" + name, ckpt = dir + "/ckpt", json = dir + "/steps.json";
  ASSERT_EQ(std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str()), 0);
  std::vector<std::string> args = c.flags;
  args.insert(args.end(), {"--nproc", std::to_string(c.nproc), "--steps", "100000", "--save", ckpt, "--log-json", json,
                           "--plot", "none"});
  Started s = Start(binary, args, dir + "/out.log");
  if (!WaitForFirstStep(json, s.pid)) {
    kill(-s.pid, SIGKILL);
    waitpid(s.pid, nullptr, 0);
    FAIL() << "no first step: " << ReadWholeFile(s.log);
  }
  pid_t target = s.pid;
  if (c.target == Target::kOneRank) {
    const std::vector<pid_t> ranks = Children(s.pid);
    if (ranks.size() != static_cast<size_t>(c.nproc)) {
      kill(-s.pid, SIGKILL);
      Wait(s, 10);
      GTEST_SKIP() << "/proc does not list the launcher's children here";
    }
    target = ranks[1];
  }
  ASSERT_EQ(kill(target, c.sig), 0);
  const int code = Wait(s, 60);
  const std::string out = ReadWholeFile(s.log);
  const std::string sig = c.sig == SIGTERM ? "SIGTERM" : "SIGINT";
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(code, -1) << "killed, not stopped: " << out;
  const long step = StoppedAt(out, sig);
  ASSERT_GE(step, 1) << out;
  EXPECT_NE(out.find("the checkpoint of step " + std::to_string(step) + " is saved in " + ckpt), std::string::npos)
      << out;
  // At a step boundary: the checkpoint is that step's, and the log has exactly the steps trained.
  EXPECT_EQ(ReadWholeFile(ckpt + "/latest"), "global_step" + std::to_string(step));
  EXPECT_EQ(Lines(json), step) << out;
  if (c.nproc > 1) {  // every rank stopped at the same step
    for (int r = 0; r < c.nproc; ++r) {
      EXPECT_NE(out.find("rank " + std::to_string(r) + " of " + std::to_string(c.nproc) + ": UNAVAILABLE: stopped by " +
                         sig + " after step " + std::to_string(step)),
                std::string::npos)
          << "rank " << r << ": " << out;
    }
  }
  if (c.target == Target::kProcess && c.nproc > 1) {
    EXPECT_NE(out.find("launch: got " + sig + ": forwarding it to the " + std::to_string(c.nproc) + " ranks"),
              std::string::npos)
        << out;
  }
  // The checkpoint loads: a resumed run trains one more step from it.
  std::vector<std::string> resume = c.flags;
  resume.insert(resume.end(),
                {"--nproc", "1", "--steps", std::to_string(step + 1), "--resume", ckpt, "--plot", "none"});
  zero::testing::RunResult r = zero::testing::RunBinary(binary, resume, {}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from " + ckpt + " at step " + std::to_string(step)), std::string::npos) << r.output;
}

TEST(TrainerSignalTest, ZeroTrainOneRankSigterm) {
  RunCase({"train/zero_train", ZeroTrainFlags(), 1, SIGTERM, Target::kProcess}, "zt_one");
}

TEST(TrainerSignalTest, ZeroTrainTwoRanksSignalToTheLauncher) {
  RunCase({"train/zero_train", ZeroTrainFlags(), 2, SIGTERM, Target::kProcess}, "zt_launcher");
}

TEST(TrainerSignalTest, ZeroTrainTwoRanksSignalToOneRank) {
  RunCase({"train/zero_train", ZeroTrainFlags(), 2, SIGTERM, Target::kOneRank}, "zt_rank1");
}

TEST(TrainerSignalTest, ZeroLlmSigint) {
  RunCase({"train/zero_llm", {"--eval-windows", "0"}, 1, SIGINT, Target::kProcess}, "llm_one");
}

// Output paths are checked at the start, before any step (not after the run), naming the flag;
// and --model given a file says to pass the directory. (Kept here with the other end-to-end runs
// of the Trainer's checks.)
TEST(TrainerOutputPathsTest, CheckedAtStartNamingTheFlag) {
  const std::string dir = TestTmpDir() + "/paths";
  ASSERT_EQ(std::system(("rm -rf " + dir + " && mkdir -p " + dir + "/notexport && echo x > " + dir +
                         "/afile && echo x > " + dir + "/notexport/README.md")
                            .c_str()),
            0);
  struct PathCase {
    std::string binary;
    std::vector<std::string> args;
    std::string expect;
  };
  const std::string file = dir + "/afile";
  for (const PathCase& c : std::vector<PathCase>{
           {"train/zero_llm", {"--save", file}, "--save " + file + ": exists and is not a directory"},
           {"train/zero_llm", {"--export-hf", file + "/x"}, "--export-hf " + file + "/x: export to"},
           {"train/zero_llm", {"--export-hf", dir + "/notexport"}, "holds 'README.md', which an export does not write"},
           {"train/zero_llm", {"--model", file}, "--model " + file + ": a file; pass the Hugging Face directory"},
           {"train/zero_train", {"--save", file}, "--save " + file},
       }) {
    std::vector<std::string> args = c.args;
    args.insert(args.end(), {"--nproc", "1", "--steps", "2"});
    zero::testing::RunResult r = zero::testing::RunBinary(DataBinary(c.binary), args, {}, 60);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << c.expect << " in: " << r.output;
    EXPECT_EQ(r.output.find("step 1"), std::string::npos) << "trained before refusing: " << r.output;
  }
}

}  // namespace
