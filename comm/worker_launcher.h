// Test helper: runs comm_worker once per rank as separate processes on loopback (RANK,
// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1, a free MASTER_PORT, ZERO_COMM_TIMEOUT_MS and a
// per-world ZERO_JOB_SECRET set, so the store's authentication is exercised),
// waits for them with a limit (killing stragglers) and returns each rank's exit code and output.
// Header-only, for tests; owns the child processes until they are reaped.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace zero {
namespace testing {

using Clock = std::chrono::steady_clock;

inline std::string WorkerPath() {
  std::vector<std::string> candidates = {"comm/comm_worker"};
  if (const char* srcdir = std::getenv("TEST_SRCDIR")) {
    candidates.push_back(std::string(srcdir) + "/zero/comm/comm_worker");
  }
  char self[PATH_MAX] = {};
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    std::string dir(self, n);
    candidates.push_back(dir.substr(0, dir.rfind('/')) + "/comm_worker");
  }
  for (const auto& c : candidates) {
    if (access(c.c_str(), X_OK) == 0) return c;
  }
  return {};
}

inline int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

inline std::string TmpDir() {
  const char* t = std::getenv("TEST_TMPDIR");
  return t != nullptr ? t : "/tmp";
}

struct RankResult {
  int rank = 0;
  int exit_code = -1;  // -1: did not exit in time (killed); 128+sig if signaled
  std::string output;
};

// Starts `ranks` (a subset of 0..world_size-1) and waits for all of them, up to `limit`.
inline std::vector<RankResult> RunWorld(int world_size, const std::vector<int>& ranks,
                                        const std::vector<std::string>& worker_args, int timeout_ms,
                                        std::chrono::seconds limit) {
  const std::string worker = WorkerPath();
  EXPECT_FALSE(worker.empty()) << "comm_worker not found";
  const int port = FreePort();
  // Not a real secret (tests need no unpredictability), only distinct per world.
  const std::string secret = "test-secret-" + std::to_string(getpid()) + "-" + std::to_string(port);
  std::vector<RankResult> results;
  std::vector<pid_t> pids;
  for (int rank : ranks) {
    RankResult r;
    r.rank = rank;
    std::string log = TmpDir() + "/comm_worker_" + std::to_string(port) + "_" + std::to_string(rank) + ".log";
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::strncmp(*e, "ZERO_JOB_SECRET=", 16) != 0) env_strings.push_back(*e);
    }
    env_strings.push_back("ZERO_JOB_SECRET=" + secret);
    env_strings.push_back("RANK=" + std::to_string(rank));
    env_strings.push_back("WORLD_SIZE=" + std::to_string(world_size));
    env_strings.push_back("LOCAL_RANK=" + std::to_string(rank));
    env_strings.push_back("MASTER_ADDR=127.0.0.1");
    env_strings.push_back("MASTER_PORT=" + std::to_string(port));
    env_strings.push_back("ZERO_COMM_TIMEOUT_MS=" + std::to_string(timeout_ms));
    std::vector<char*> envp;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> arg_strings = {worker};
    arg_strings.insert(arg_strings.end(), worker_args.begin(), worker_args.end());
    std::vector<char*> argv;
    for (auto& s : arg_strings) argv.push_back(s.data());
    argv.push_back(nullptr);

    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid = -1;
    int rc = posix_spawn(&pid, worker.c_str(), &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    EXPECT_EQ(rc, 0) << "posix_spawn " << worker;
    pids.push_back(rc == 0 ? pid : -1);
    r.output = log;  // path for now; replaced by the contents below
    results.push_back(r);
  }
  const auto deadline = Clock::now() + limit;
  for (size_t i = 0; i < pids.size(); ++i) {
    if (pids[i] < 0) continue;
    int status = 0;
    while (true) {
      pid_t w = waitpid(pids[i], &status, WNOHANG);
      if (w == pids[i]) break;
      if (Clock::now() > deadline) {
        kill(pids[i], SIGKILL);
        waitpid(pids[i], &status, 0);
        status = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (status == -1) {
      results[i].exit_code = -1;
    } else if (WIFEXITED(status)) {
      results[i].exit_code = WEXITSTATUS(status);
    } else if (WIFSIGNALED(status)) {
      results[i].exit_code = 128 + WTERMSIG(status);
    }
  }
  for (auto& r : results) {
    std::ifstream in(r.output);
    std::stringstream ss;
    ss << in.rdbuf();
    unlink(r.output.c_str());
    r.output = ss.str();
  }
  return results;
}

inline std::vector<int> AllRanks(int n) {
  std::vector<int> v;
  for (int i = 0; i < n; ++i) v.push_back(i);
  return v;
}

}  // namespace testing
}  // namespace zero
