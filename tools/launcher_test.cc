#include "tools/launcher.h"

#include <gtest/gtest.h>

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "testing/scratch_dir.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

TEST(LauncherTest, AllRanksSucceed) {
  LaunchOptions o;
  o.nproc = 3;
  // Each rank checks that its variables are set and consistent.
  Status st = LaunchLocal({"/bin/sh", "-c",
                           "test \"$WORLD_SIZE\" = 3 && test \"$RANK\" = \"$LOCAL_RANK\" && "
                           "test -n \"$MASTER_PORT\" && test \"$MASTER_ADDR\" = 127.0.0.1"},
                          o);
  EXPECT_OK(st);
}

// Every rank of one job gets the same fresh 64-hex-digit secret; the next job gets another.
TEST(LauncherTest, RanksShareAFreshJobSecret) {
  unsetenv("ZERO_JOB_SECRET");
  ASSERT_OK_AND_ASSIGN(ScratchDir scratch, ScratchDir::Create("launcher_secret"));
  const std::string dir = scratch.path();
  LaunchOptions o;
  o.nproc = 3;
  for (int job = 0; job < 2; ++job) {
    const std::string out = dir + "/secret_job" + std::to_string(job) + "_";
    Status st = LaunchLocal({"/bin/sh", "-c",
                             "printf %s \"$ZERO_JOB_SECRET\" > " + out +
                                 "$RANK && "
                                 "printf %s \"$ZERO_JOB_SECRET\" | grep -qxE '[0-9a-f]{64}'"},
                            o);
    ASSERT_OK(st) << "job " << job;
  }
  auto read = [&](int job, int rank) {
    std::ifstream in(dir + "/secret_job" + std::to_string(job) + "_" + std::to_string(rank));
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  const std::string s0 = read(0, 0);
  EXPECT_EQ(s0.size(), 64u) << s0;
  EXPECT_EQ(read(0, 1), s0);
  EXPECT_EQ(read(0, 2), s0);
  EXPECT_EQ(read(1, 1), read(1, 0));
  EXPECT_NE(read(1, 0), s0) << "two jobs got the same secret";
  // A secret set around the launcher (a multi-host job sharing one) is passed on unchanged.
  setenv("ZERO_JOB_SECRET", "shared-secret-of-a-multi-host-job", 1);
  Status st = LaunchLocal({"/bin/sh", "-c", "test \"$ZERO_JOB_SECRET\" = shared-secret-of-a-multi-host-job"}, o);
  unsetenv("ZERO_JOB_SECRET");
  EXPECT_OK(st);
}

TEST(LauncherTest, FailingRankStopsTheOthersAndIsNamed) {
  LaunchOptions o;
  o.nproc = 3;
  o.grace_seconds = 1;
  auto t0 = std::chrono::steady_clock::now();
  // Rank 1 fails at once; the others would sleep for a minute.
  Status st = LaunchLocal({"/bin/sh", "-c", "if [ \"$RANK\" = 1 ]; then exit 7; fi; sleep 60"}, o);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("rank 1 of 3"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("exit status 7"), std::string::npos) << st.message();
  EXPECT_LT(secs, 30.0);
}

// A rank killed by a signal printed nothing: the message says so instead of pointing above.
TEST(LauncherTest, RankKilledByASignalIsNamedAsSuch) {
  LaunchOptions o;
  o.nproc = 2;
  o.grace_seconds = 1;
  Status st = LaunchLocal({"/bin/sh", "-c", "if [ \"$RANK\" = 0 ]; then kill -9 $$; fi; sleep 60"}, o);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("rank 0 of 2"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("signal Killed (9): it was killed and printed no error of its own"), std::string::npos)
      << st.message();
  EXPECT_EQ(st.message().find("above"), std::string::npos) << st.message();
  st = LaunchLocal({"/bin/sh", "-c", "exit 3"}, o);
  EXPECT_NE(st.message().find("exit status 3 (its error is above)"), std::string::npos) << st.message();
}

// Killing the launcher (SIGKILL: no cleanup of its own) ends its ranks within seconds; they used to
// train on alone.
TEST(LauncherTest, RanksDieWithTheLauncher) {
  ASSERT_OK_AND_ASSIGN(ScratchDir scratch, ScratchDir::Create("launcher_pdeath"));
  const std::string dir = scratch.path();
  const pid_t launcher = fork();
  if (launcher == 0) {
    LaunchOptions o;
    o.nproc = 2;
    // Each rank records its pid, then sleeps as a training rank would run.
    LaunchLocal(
        {"/bin/sh", "-c",
         "echo $$ > " + dir + "/rank$RANK.tmp && mv " + dir + "/rank$RANK.tmp " + dir + "/rank$RANK && exec sleep 60"},
        o)
        .IgnoreError();
    _exit(0);
  }
  std::vector<pid_t> ranks;
  const auto t0 = std::chrono::steady_clock::now();
  while (ranks.size() < 2 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10)) {
    ranks.clear();
    for (int r = 0; r < 2; ++r) {
      std::ifstream in(dir + "/rank" + std::to_string(r));
      pid_t p = 0;
      if (in >> p) ranks.push_back(p);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(ranks.size(), 2u) << "the ranks did not start";
  ASSERT_EQ(kill(launcher, SIGKILL), 0);
  waitpid(launcher, nullptr, 0);
  // A rank is gone when it no longer exists or is a zombie (its reaper is not this test).
  auto alive = [](pid_t p) {
    std::ifstream stat("/proc/" + std::to_string(p) + "/stat");
    std::string line;
    if (!std::getline(stat, line)) return false;
    const size_t close = line.rfind(')');
    return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z';
  };
  const auto t1 = std::chrono::steady_clock::now();
  bool any = true;
  while (any && std::chrono::steady_clock::now() - t1 < std::chrono::seconds(5)) {
    any = alive(ranks[0]) || alive(ranks[1]);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_FALSE(any) << "ranks " << ranks[0] << ", " << ranks[1] << " outlived their launcher by 5 s";
  for (pid_t p : ranks) kill(p, SIGKILL);  // an old build's ranks: not left behind by the test
}

TEST(LauncherTest, MissingProgramIsReported) {
  LaunchOptions o;
  o.nproc = 2;
  Status st = LaunchLocal({"/nonexistent/program"}, o);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("exit status 127"), std::string::npos) << st.message();
}

TEST(LauncherTest, BadNproc) {
  LaunchOptions o;
  o.nproc = 0;
  EXPECT_FALSE(LaunchLocal({"/bin/true"}, o).ok());
}

// --- the launch binary ---------------------------------------------------------------------------

// The launch binary under bazel (data = [":launch"]), else beside the working directory.
std::string LaunchBinary() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const std::string in_runfiles = srcdir != nullptr ? std::string(srcdir) + "/zero/tools/launch" : "";
  if (!in_runfiles.empty() && access(in_runfiles.c_str(), X_OK) == 0) return in_runfiles;
  return "tools/launch";
}

// A started process whose stdout and stderr go to `log`.
struct Started {
  pid_t pid = -1;
  std::string log;
};

Started Start(const std::vector<std::string>& args, const std::string& log) {
  Started s{-1, log};
  s.pid = fork();
  if (s.pid == 0) {
    setpgid(0, 0);
    FILE* f = std::fopen(log.c_str(), "w");
    dup2(fileno(f), 1);
    dup2(fileno(f), 2);
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return s;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Waits up to timeout_s for the process; its exit status, or -1 (killed by the timeout, or by a signal).
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

struct LaunchRun {
  int code;
  std::string output;
};

LaunchRun RunLaunch(const std::vector<std::string>& args, const std::string& dir) {
  std::vector<std::string> all = {LaunchBinary()};
  all.insert(all.end(), args.begin(), args.end());
  Started s = Start(all, dir + "/launch.log");
  const int code = Wait(s, 30);
  return {code, ReadAll(s.log)};
}

// A bad value says what was expected and what came; an unknown flag before the program is not
// taken for the program, and names the flag it resembles.
TEST(LaunchBinaryTest, FlagErrorsSayWhatWasExpected) {
  ASSERT_OK_AND_ASSIGN(ScratchDir scratch, ScratchDir::Create("launch_flags"));
  const std::string dir = scratch.path();
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  };
  for (const Case& c : std::vector<Case>{
           {{"--nproc", "abc", "--", "/bin/true"}, "--nproc expects a whole number >= 1, got 'abc'"},
           {{"--nproc", "0", "--", "/bin/true"}, "--nproc expects a whole number >= 1, got '0'"},
           {{"--nproc", "2x", "--", "/bin/true"}, "got '2x'"},
           {{"--nproc=-1", "--", "/bin/true"}, "got '-1'"},
           {{"--nprocs", "2", "--", "/bin/true"}, "unknown flag --nprocs (did you mean --nproc?)"},
           {{"--master-port", "2", "/bin/true"}, "unknown flag --master-port (did you mean --master_port?)"},
           {{"--master_port", "70000", "/bin/true"},
            "--master_port expects a port in 1..65535 (or 0: pick a free one), got '70000'"},
           {{"--nproc"}, "--nproc needs a value"},
           {{"--nproc", "2"}, "no program given"},
       }) {
    LaunchRun r = RunLaunch(c.args, dir);
    EXPECT_EQ(r.code, 2) << c.args[0] << ": " << r.output;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << "expected '" << c.expect << "' in: " << r.output;
  }
  LaunchRun ok = RunLaunch({"--nproc=2", "--", "/bin/true"}, dir);
  EXPECT_EQ(ok.code, 0) << ok.output;
}

// SIGTERM or SIGINT to the launcher: it says so, forwards the signal to every rank (which may stop
// gracefully: each rank here prints and exits 7), waits for them, and exits non-zero.
TEST(LaunchBinaryTest, ASignalIsForwardedToTheRanksAndReported) {
  for (int sig : {SIGTERM, SIGINT}) {
    ASSERT_OK_AND_ASSIGN(ScratchDir scratch, ScratchDir::Create("launch_signal"));
    const std::string dir = scratch.path();
    const std::string name = sig == SIGTERM ? "TERM" : "INT";
    Started s = Start({LaunchBinary(), "--nproc", "2", "--", "/bin/sh", "-c",
                       "trap 'echo rank $RANK got " + name + "; exit 7' " + name + "; touch " + dir +
                           "/ready$RANK; while :; do sleep 0.05; done"},
                      dir + "/launch.log");
    const auto t0 = std::chrono::steady_clock::now();
    while ((access((dir + "/ready0").c_str(), F_OK) != 0 || access((dir + "/ready1").c_str(), F_OK) != 0) &&
           std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the traps are set before `touch`
    kill(s.pid, sig);
    const int code = Wait(s, 20);
    const std::string out = ReadAll(s.log);
    EXPECT_NE(code, 0) << out;
    EXPECT_NE(code, -1) << "the launcher did not exit by itself: " << out;
    EXPECT_NE(out.find("launch: got SIG" + name + ": forwarding it to the 2 ranks"), std::string::npos) << out;
    EXPECT_NE(out.find("rank 0 got " + name), std::string::npos) << out;
    EXPECT_NE(out.find("rank 1 got " + name), std::string::npos) << out;
    EXPECT_NE(out.find("launch: stopped by SIG" + name), std::string::npos) << out;
  }
}

}  // namespace
}  // namespace zero
