// tools/launch: start N ranks of a program on this machine.
//   launch --nproc N [--master_port P] [--master_addr A] -- program args...
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tools/launcher.h"

int main(int argc, char** argv) {
  zero::LaunchOptions opts;
  std::vector<std::string> prog;
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* flag) -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "launch: %s needs a value\n", flag);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--") {
      ++i;
      break;
    } else if (a == "--nproc" || a == "--nproc_per_node") {
      opts.nproc = std::atoi(value(a.c_str()).c_str());
    } else if (a == "--master_port") {
      opts.master_port = std::atoi(value(a.c_str()).c_str());
    } else if (a == "--master_addr") {
      opts.master_addr = value(a.c_str());
    } else if (a == "-h" || a == "--help") {
      std::printf("usage: launch --nproc N [--master_port P] [--master_addr A] -- program args...\n");
      return 0;
    } else {
      break;
    }
  }
  for (; i < argc; ++i) prog.push_back(argv[i]);
  if (prog.empty()) {
    std::fprintf(stderr, "launch: no program given (usage: launch --nproc N -- program args...)\n");
    return 2;
  }
  zero::Status st = zero::LaunchLocal(prog, opts);
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
