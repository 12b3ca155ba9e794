// bench_flags: what the command lines of the bench binaries share. Integer and number flag values
// parsed with the expected range in the error (the flag named), and BenchMain, the main() around a
// binary's parse and run: usage on --help (exit 0) and after a bad command line (exit 2), the
// error of a failed run (exit 1). Header-only; used by mlp_bench, pcie_bench, accumulate_bench.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "runtime/status.h"

namespace zero::bench {

// `v` as a base-10 integer in [lo, hi]; otherwise InvalidArgument "FLAG: expected an integer in
// [lo, hi], got 'v'" (or ">= lo" when hi is INT64_MAX).
inline Status ParseInt(const std::string& flag, const std::string& v, int64_t lo, int64_t hi, int64_t* out) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (errno != 0 || end == v.c_str() || *end != '\0' || x < lo || x > hi) {
    const std::string range =
        hi == INT64_MAX ? ">= " + std::to_string(lo) : "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    return InvalidArgumentError(flag + ": expected an integer " + range + ", got '" + v + "'");
  }
  *out = x;
  return OkStatus();
}
inline Status ParseInt(const std::string& flag, const std::string& v, int64_t lo, int64_t* out) {
  return ParseInt(flag, v, lo, INT64_MAX, out);
}

// `v` as a finite number >= 0; otherwise InvalidArgument naming the flag.
inline Status ParseDouble(const std::string& flag, const std::string& v, double* out) {
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(v.c_str(), &end);
  if (errno != 0 || end == v.c_str() || *end != '\0' || !(x >= 0.0) || !std::isfinite(x)) {
    return InvalidArgumentError(flag + ": expected a number >= 0, got '" + v + "'");
  }
  *out = x;
  return OkStatus();
}

// What a parser returns for --help / -h: BenchMain prints the usage and exits 0.
inline Status HelpRequested() { return InvalidArgumentError("help"); }

// The main() of a bench binary `name`: `parsed` is its command line (HelpRequested() for
// --help), `run` what it does with it (a Status). `usage` (may be null) is printed on --help and
// after a command-line error.
template <typename Options, typename Run>
int BenchMain(const char* name, const char* usage, const Result<Options>& parsed, Run run) {
  if (!parsed.ok()) {
    if (usage != nullptr && parsed.status().message() == "help") {
      std::fputs(usage, stdout);
      return 0;
    }
    std::fprintf(stderr, "%s: %s\n%s", name, parsed.status().ToString().c_str(), usage != nullptr ? usage : "");
    return 2;
  }
  const Status s = run(*parsed);
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", name, s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace zero::bench
