// Tests that run one of the examples' binaries as a user would: in its own process group, with the
// launcher variables (RANK etc.) removed so it starts its own ranks, stdout and stderr captured
// together, killed (with its whole group) after a timeout. Header-only, test-only.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace zero::testing {

inline std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline std::string TestTmpDir() {
  const char* t = std::getenv("TEST_TMPDIR");
  return t != nullptr ? t : "/tmp";
}

// The path of a binary the test depends on (`data`), e.g. "train/zero_train": under
// $TEST_SRCDIR/zero/ when bazel runs the test, else relative to the working directory. "" if absent.
inline std::string DataBinary(const std::string& workspace_path) {
  std::vector<std::string> candidates = {workspace_path};
  if (const char* srcdir = std::getenv("TEST_SRCDIR")) {
    candidates.insert(candidates.begin(), std::string(srcdir) + "/zero/" + workspace_path);
  }
  for (const auto& c : candidates) {
    if (access(c.c_str(), X_OK) == 0) return c;
  }
  return "";
}

struct RunResult {
  int exit_code = -1;  // -1: killed by the timeout or a signal
  double seconds = 0;
  std::string output;  // stdout and stderr together
};

// Runs `binary` with `args` and extra "K=V" environment entries; kills its process group after
// timeout_s.
inline RunResult RunBinary(const std::string& binary, const std::vector<std::string>& args,
                           const std::vector<std::string>& env, double timeout_s) {
  static std::atomic<int> counter{0};
  const std::string log = TestTmpDir() + "/run_" + std::to_string(getpid()) + "_" + std::to_string(counter++) + ".log";
  const auto t0 = std::chrono::steady_clock::now();
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "MASTER_PORT"}) {
      unsetenv(v);
    }
    for (const auto& kv : env) putenv(const_cast<char*>(kv.c_str()));
    std::vector<std::string> all = {binary};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  RunResult r;
  int status = 0;
  while (true) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r.seconds > timeout_s) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      r.output = ReadWholeFile(log) + "\n[killed after " + std::to_string(timeout_s) + " s]";
      return r;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.output = ReadWholeFile(log);
  return r;
}

}  // namespace zero::testing
