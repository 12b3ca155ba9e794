// Test helpers for comm/: this machine's addresses, for the tests of what the store binds to, and
// a TcpStore server in a child process, for the tests that crash, stop or kill it.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>

#include "comm/tcp_store.h"

namespace zero {

// The first IPv4 address of an interface that is up and not loopback, or "" (the caller skips).
inline std::string NonLoopbackAddress() {
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return {};
  std::string found;
  for (ifaddrs* i = ifs; i != nullptr && found.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if ((i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
    char buf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, buf, sizeof(buf));
    found = buf;
  }
  freeifaddrs(ifs);
  return found;
}

// A TcpStore host (port 0: any free port) in a fork()ed child under a 2 GiB address-space limit,
// which lives until this object is destroyed (SIGKILL) or this process dies (PR_SET_PDEATHSIG).
// port() is -1 if it did not start. REQUIRES: no other threads in this process when constructed.
class ServerProcess {
 public:
  explicit ServerProcess(TcpStoreOptions o) {
    int port_pipe[2], hold[2];
    if (pipe2(port_pipe, O_CLOEXEC) != 0 || pipe2(hold, O_CLOEXEC) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      rlimit as{size_t{2} << 30, size_t{2} << 30};
      setrlimit(RLIMIT_AS, &as);
      close(port_pipe[0]);
      close(hold[1]);
      o.port = 0;
      o.is_server = true;
      o.rank = 0;
      auto s = TcpStore::Create(o);
      int port = s.ok() ? (*s)->port() : -1;
      if (write(port_pipe[1], &port, sizeof(port)) != sizeof(port)) _exit(3);
      char b;
      while (read(hold[0], &b, 1) != 0) {
      }
      _exit(0);
    }
    close(port_pipe[1]);
    close(hold[0]);
    hold_ = hold[1];
    if (read(port_pipe[0], &port_, sizeof(port_)) != sizeof(port_)) port_ = -1;
    close(port_pipe[0]);
  }
  ~ServerProcess() {
    if (pid_ > 0 && Death().empty()) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (hold_ >= 0) close(hold_);
  }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  // "" while the child runs; else how it ended.
  std::string Death() {
    if (!death_.empty()) return death_;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) != pid_) return "";
    death_ = WIFSIGNALED(status)
                 ? "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")"
                 : "exited with status " + std::to_string(WEXITSTATUS(status));
    return death_;
  }
  // VmHWM: the most resident memory the child has used.
  size_t PeakBytes() const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
    }
    return 0;
  }

 private:
  pid_t pid_ = -1;
  int port_ = -1;
  int hold_ = -1;
  std::string death_;
};

}  // namespace zero
