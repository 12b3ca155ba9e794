// tools/launch: start N ranks of a program on this machine.
//   launch --nproc N [--master_port P] [--master_addr A] -- program args...
// Flags come before the program (or before "--"); a flag it does not know is an error naming the
// flag it resembles, never taken for the program. Exit status: the ranks' (0 when all succeed), 1
// when a rank failed or the launcher was stopped by a signal (forwarded to the ranks: LaunchLocal),
// 2 for a usage error.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tools/launcher.h"

namespace {

constexpr const char* kUsage = "usage: launch --nproc N [--master_port P] [--master_addr A] -- program args...\n";

// Levenshtein distance, for "did you mean".
size_t Distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

[[noreturn]] void UsageError(const std::string& message) {
  std::fprintf(stderr, "launch: %s\n%s", message.c_str(), kUsage);
  std::exit(2);
}

// A whole number in [lo, hi], or a usage error naming the flag, the range and the value.
int ParseInt(const std::string& flag, const std::string& text, long lo, long hi, const std::string& expected) {
  char* end = nullptr;
  errno = 0;
  const long v = text.empty() ? 0 : std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || v < lo || v > hi) {
    UsageError(flag + " expects " + expected + ", got '" + text + "'");
  }
  return static_cast<int>(v);
}

}  // namespace

int main(int argc, char** argv) {
  zero::LaunchOptions opts;
  const std::vector<std::string> known = {"--nproc", "--nproc_per_node", "--master_port", "--master_addr", "--help"};
  std::vector<std::string> prog;
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "-h" || a == "--help") {
      std::printf("%s", kUsage);
      return 0;
    }
    if (a.rfind("--", 0) != 0) break;  // the program
    std::string flag = a, inline_value;
    bool has_inline = false;
    if (const size_t eq = a.find('='); eq != std::string::npos) {
      flag = a.substr(0, eq);
      inline_value = a.substr(eq + 1);
      has_inline = true;
    }
    auto value = [&]() -> std::string {
      if (has_inline) return inline_value;
      if (i + 1 >= argc) UsageError(flag + " needs a value");
      return argv[++i];
    };
    if (flag == "--nproc" || flag == "--nproc_per_node") {
      opts.nproc = ParseInt(flag, value(), 1, 1 << 20, "a whole number >= 1");
    } else if (flag == "--master_port") {
      opts.master_port = ParseInt(flag, value(), 0, 65535, "a port in 1..65535 (or 0: pick a free one)");
    } else if (flag == "--master_addr") {
      opts.master_addr = value();
      if (opts.master_addr.empty()) UsageError("--master_addr expects a host name or address, got ''");
    } else {
      std::string best;
      size_t best_d = 4;
      for (const std::string& k : known) {
        const size_t d = Distance(flag, k);
        if (d < best_d) best_d = d, best = k;
      }
      UsageError("unknown flag " + flag + (best.empty() ? "" : " (did you mean " + best + "?)") +
                 "; launch's flags come before the program, or put the program after --");
    }
  }
  for (; i < argc; ++i) prog.push_back(argv[i]);
  if (prog.empty()) UsageError("no program given");
  zero::Status st = zero::LaunchLocal(prog, opts);
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
