#include "tools/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

extern char** environ;

namespace zero {

Result<int> PickFreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return ErrnoError("socket", "127.0.0.1", errno);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int e = errno;
    close(fd);
    return ErrnoError("bind", "127.0.0.1:0", e);
  }
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

Result<std::string> GenerateJobSecret() {
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open", "/dev/urandom", errno);
  unsigned char bytes[32];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    ssize_t r = read(fd, bytes + got, sizeof(bytes) - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      int e = r < 0 ? errno : EIO;
      close(fd);
      return ErrnoError("read", "/dev/urandom", e);
    }
    got += static_cast<size_t>(r);
  }
  close(fd);
  static const char kDigits[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char b : bytes) {
    hex.push_back(kDigits[b >> 4]);
    hex.push_back(kDigits[b & 15]);
  }
  return hex;
}

namespace {

// How a rank ended, and where its reason is: a rank that exited printed its error (above, on the
// shared stderr); one killed by a signal printed nothing.
std::string DescribeExit(int status) {
  if (WIFEXITED(status)) {
    return "exit status " + std::to_string(WEXITSTATUS(status)) + " (its error is above)";
  }
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    std::string s = std::string("signal ") + strsignal(sig) + " (" + std::to_string(sig) +
                    "): it was killed and printed no error of its own";
    if (sig == SIGKILL) s += " (the kernel's out-of-memory killer sends SIGKILL: dmesg may say)";
    return s;
  }
  return "status " + std::to_string(status);
}

void KillAll(const std::vector<pid_t>& pids, const std::vector<bool>& done, int grace_seconds) {
  for (size_t i = 0; i < pids.size(); ++i) {
    if (!done[i]) kill(pids[i], SIGTERM);
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(grace_seconds);
  std::vector<bool> reaped = done;
  while (std::chrono::steady_clock::now() < deadline) {
    bool all = true;
    for (size_t i = 0; i < pids.size(); ++i) {
      if (reaped[i]) continue;
      int st;
      if (waitpid(pids[i], &st, WNOHANG) == pids[i]) {
        reaped[i] = true;
      } else {
        all = false;
      }
    }
    if (all) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    if (!reaped[i]) {
      kill(pids[i], SIGKILL);
      int st;
      waitpid(pids[i], &st, 0);
    }
  }
}

// --- signals to the launcher (launcher.h) ---

volatile sig_atomic_t g_signal = 0;   // the first SIGINT/SIGTERM while ranks run; 0: none
volatile sig_atomic_t g_signals = 0;  // how many came
pid_t* volatile g_ranks = nullptr;    // the ranks to forward to (<= 0: none there)
volatile sig_atomic_t g_rank_count = 0;

void ForwardSignal(int sig) {
  if (g_signal == 0) g_signal = sig;
  g_signals = g_signals + 1;
  pid_t* ranks = g_ranks;
  for (int i = 0; i < g_rank_count; ++i) {
    if (ranks != nullptr && ranks[i] > 0) kill(ranks[i], sig);
  }
}

// Installs ForwardSignal for SIGINT and SIGTERM (without SA_RESTART, so the wait wakes up) while
// it exists; restores the previous handlers after.
class ForwardSignals {
 public:
  explicit ForwardSignals(pid_t* ranks) {
    g_signal = 0;
    g_signals = 0;
    g_rank_count = 0;
    g_ranks = ranks;
    struct sigaction sa {};
    sa.sa_handler = ForwardSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~ForwardSignals() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
    g_rank_count = 0;
    g_ranks = nullptr;
  }
  ForwardSignals(const ForwardSignals&) = delete;
  ForwardSignals& operator=(const ForwardSignals&) = delete;

 private:
  struct sigaction old_int_ {
  }, old_term_{};
};

const char* SignalName(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal"; }

}  // namespace

Status LaunchLocal(const std::vector<std::string>& argv, const LaunchOptions& options) {
  if (argv.empty()) return InvalidArgumentError("launch: no program given");
  if (options.nproc < 1) {
    return InvalidArgumentError("launch: --nproc must be >= 1, got " + std::to_string(options.nproc));
  }
  int port = options.master_port;
  if (port == 0) {
    ZERO_ASSIGN_OR_RETURN(port, PickFreePort());
  }
  std::string secret = options.job_secret;
  if (secret.empty()) {
    const char* inherited = std::getenv("ZERO_JOB_SECRET");
    if (inherited != nullptr && *inherited != '\0') {
      secret = inherited;
    } else {
      ZERO_ASSIGN_OR_RETURN(secret, GenerateJobSecret());
    }
  }
  std::vector<pid_t> pids;
  std::vector<bool> done;
  const pid_t launcher = getpid();
  std::vector<pid_t> forward(static_cast<size_t>(options.nproc), 0);  // what the signal handler sees
  ForwardSignals forwarding(forward.data());
  for (int r = 0; r < options.nproc; ++r) {
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      std::string kv(*e);
      std::string key = kv.substr(0, kv.find('='));
      if (key == "RANK" || key == "WORLD_SIZE" || key == "LOCAL_RANK" || key == "LOCAL_WORLD_SIZE" ||
          key == "MASTER_ADDR" || key == "MASTER_PORT" || key == "ZERO_JOB_SECRET") {
        continue;
      }
      env.push_back(kv);
    }
    env.push_back("RANK=" + std::to_string(r));
    env.push_back("WORLD_SIZE=" + std::to_string(options.nproc));
    env.push_back("LOCAL_RANK=" + std::to_string(r));
    env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(options.nproc));
    env.push_back("MASTER_ADDR=" + options.master_addr);
    env.push_back("MASTER_PORT=" + std::to_string(port));
    env.push_back("ZERO_JOB_SECRET=" + secret);
    for (const auto& kv : options.extra_env) env.push_back(kv);
    pid_t pid = fork();
    if (pid < 0) {
      int e = errno;
      KillAll(pids, done, options.grace_seconds);
      return ErrnoError("fork", argv[0], e);
    }
    if (pid == 0) {
      // The rank dies with the launcher, however the launcher dies (SIGKILL included): a rank left
      // behind would train on alone. PDEATHSIG survives execve; the getppid() check covers a
      // launcher that died before the prctl.
      signal(SIGINT, SIG_DFL);  // the launcher's forwarding is not the rank's
      signal(SIGTERM, SIG_DFL);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != launcher) _exit(128 + SIGKILL);
      std::vector<char*> cargv, cenv;
      for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
      cargv.push_back(nullptr);
      for (const auto& a : env) cenv.push_back(const_cast<char*>(a.c_str()));
      cenv.push_back(nullptr);
      execve(argv[0].c_str(), cargv.data(), cenv.data());
      std::fprintf(stderr, "launch: cannot run %s: %s\n", argv[0].c_str(), strerror(errno));
      _exit(127);
    }
    pids.push_back(pid);
    done.push_back(false);
    forward[pids.size() - 1] = pid;
    g_rank_count = static_cast<sig_atomic_t>(pids.size());
  }
  int remaining = options.nproc;
  int announced = 0;         // signals reported so far
  std::string stop_outcome;  // with a signal: how each rank ended
  while (remaining > 0) {
    if (g_signals > announced) {
      // The handler forwarded it already; a second one stops the ranks at once.
      if (announced == 0) {
        std::fprintf(stderr,
                     "launch: got %s: forwarding it to the %d ranks and waiting for them to stop (a second "
                     "signal stops them at once)\n",
                     SignalName(g_signal), options.nproc);
      } else {
        std::fprintf(stderr, "launch: got a second signal: stopping the ranks now\n");
        KillAll(pids, done, 0);
        return UnavailableError(std::string("launch: stopped by ") + SignalName(g_signal) +
                                " and then another signal; the ranks were killed");
      }
      announced = g_signals;
    }
    int status = 0;
    pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      KillAll(pids, done, options.grace_seconds);
      return ErrnoError("waitpid", argv[0], e);
    }
    int rank = -1;
    for (int r = 0; r < options.nproc; ++r) {
      if (pids[r] == pid) rank = r;
    }
    if (rank < 0) continue;
    done[rank] = true;
    forward[rank] = 0;
    --remaining;
    bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (g_signal != 0) {
      // Stopping: every rank got the signal and may be saving (a graceful stop); none is cut short.
      stop_outcome += (stop_outcome.empty() ? "" : ", ") + ("rank " + std::to_string(rank) + " ") +
                      (ok ? "exit status 0" : DescribeExit(status));
      continue;
    }
    if (!ok) {
      KillAll(pids, done, options.grace_seconds);
      return UnavailableError("launch: rank " + std::to_string(rank) + " of " + std::to_string(options.nproc) + " (" +
                              argv[0] + ") failed with " + DescribeExit(status) + "; the other ranks were stopped");
    }
  }
  if (g_signal != 0) {
    return UnavailableError(std::string("launch: stopped by ") + SignalName(g_signal) + " (forwarded to the " +
                            std::to_string(options.nproc) + " ranks): " + stop_outcome);
  }
  return OkStatus();
}

Status LaunchSelf(int argc, char** argv, const LaunchOptions& options) {
  char self[PATH_MAX];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::vector<std::string> child_argv;
  child_argv.push_back(len > 0 ? std::string(self, static_cast<size_t>(len)) : std::string(argv[0]));
  for (int i = 1; i < argc; ++i) child_argv.push_back(argv[i]);
  std::fflush(stdout);
  return LaunchLocal(child_argv, options);
}

bool UnderLauncher() {
  for (const char* v : {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}) {
    if (std::getenv(v) != nullptr) return true;
  }
  return false;
}

}  // namespace zero
