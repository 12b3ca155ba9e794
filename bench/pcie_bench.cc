// pcie_bench: pinned host<->device bandwidth on the GPU machine, host->device alone, device->host
// alone and both at once on two streams: the "PCIe floor" that docs/performance.md divides the
// offload modes' bytes per step (mlp_bench's pcie_* fields) by, measured in the same device call
// (issue 11). Flags, medians and output here; the copies in bench/pcie_bench.cu (pcie_copy.h).
//
//   pcie_bench [--sizes-mib 64,256,1024] [--reps 5] [--warmup 1] [--device N] [--dry-run]
//
// Output: a '#' header, one human line per direction and size,
//   h2d  1024 MiB:  55.01 GB/s  (median of 5; min 54.80, max 55.12)
// then one machine-readable line per size and a final one for the largest size,
//   PCIE size_mib=.. reps=.. h2d_gbps=.. d2h_gbps=.. both_gbps=.. both_h2d_gbps=.. both_d2h_gbps=..
//   PCIE_FLOOR size_mib=.. h2d_gbps=.. d2h_gbps=.. both_gbps=..
// GB/s = 1e9 bytes per second of the median time; both_gbps counts the bytes of both directions
// over the wall time until both finished (both_h2d/d2h_gbps: each copy over its own time within
// it). Without the CUDA toolkit only --dry-run works (it prints the plan).
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/bench_flags.h"
#include "runtime/status.h"

#if defined(ZERO_BENCH_HAS_CUDA)
#include <cuda_runtime_api.h>

#include "bench/pcie_copy.h"
#endif

namespace zero::bench {
namespace {

struct Options {
  std::vector<int64_t> sizes_mib = {64, 256, 1024};
  int reps = 5;
  int warmup = 1;
  int device = 0;
  bool dry_run = false;
};

const char kUsage[] =
    "usage: pcie_bench [--sizes-mib 64,256,1024] [--reps N>=1] [--warmup N>=0] [--device N] [--dry-run]\n";

Result<Options> ParseFlags(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    if (f == "--help" || f == "-h") return HelpRequested();
    if (f == "--dry-run") {
      o.dry_run = true;
      continue;
    }
    if (i + 1 >= argc) return InvalidArgumentError(f + ": missing value (or unknown flag)");
    const std::string v = argv[++i];
    int64_t n = 0;
    if (f == "--sizes-mib") {
      o.sizes_mib.clear();
      size_t begin = 0;
      while (begin <= v.size()) {
        const size_t comma = std::min(v.find(',', begin), v.size());
        ZERO_RETURN_IF_ERROR(ParseInt(f, v.substr(begin, comma - begin), 1, 65536, &n));
        o.sizes_mib.push_back(n);
        begin = comma + 1;
      }
    } else if (f == "--reps") {
      ZERO_RETURN_IF_ERROR(ParseInt(f, v, 1, 1000, &n));
      o.reps = static_cast<int>(n);
    } else if (f == "--warmup") {
      ZERO_RETURN_IF_ERROR(ParseInt(f, v, 0, 1000, &n));
      o.warmup = static_cast<int>(n);
    } else if (f == "--device") {
      ZERO_RETURN_IF_ERROR(ParseInt(f, v, 0, 1023, &n));
      o.device = static_cast<int>(n);
    } else {
      return InvalidArgumentError("unknown flag '" + f + "'");
    }
  }
  return o;
}

void PrintPlan(const Options& o) {
  const int64_t max_mib = *std::max_element(o.sizes_mib.begin(), o.sizes_mib.end());
  std::printf("# pcie_bench plan: device %d, sizes", o.device);
  for (int64_t s : o.sizes_mib) std::printf(" %lld", static_cast<long long>(s));
  std::printf(" MiB, %d warmup + %d timed reps of h2d, d2h and both at once; pinned host %lld MiB, device %lld MiB\n",
              o.warmup, o.reps, static_cast<long long>(2 * max_mib), static_cast<long long>(2 * max_mib));
}

#if defined(ZERO_BENCH_HAS_CUDA)

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// GB/s of `bytes` moved in each time of `secs`: median, min, max (of the rates).
struct Rate {
  double median = 0, min = 0, max = 0;
};
Rate Rates(double bytes, const std::vector<double>& secs) {
  const double slowest = *std::max_element(secs.begin(), secs.end());
  const double fastest = *std::min_element(secs.begin(), secs.end());
  return {bytes / Median(secs) / 1e9, bytes / slowest / 1e9, bytes / fastest / 1e9};
}

Status Run(const Options& o) {
  cudaDeviceProp prop{};
  const cudaError_t e = cudaGetDeviceProperties(&prop, o.device);
  if (e != cudaSuccess) {
    return InternalError("cudaGetDeviceProperties(device " + std::to_string(o.device) + "): " + cudaGetErrorString(e));
  }
  PrintPlan(o);
  std::printf("# device %d: %s, PCI %04x:%02x:%02x\n", o.device, prop.name, prop.pciDomainID, prop.pciBusID,
              prop.pciDeviceID);
  std::vector<int64_t> bytes;
  for (int64_t s : o.sizes_mib) bytes.push_back(s << 20);
  ZERO_ASSIGN_OR_RETURN(std::vector<PcieTimes> times, MeasurePcie(o.device, bytes, o.warmup, o.reps));
  struct Line {
    int64_t mib;
    Rate h2d, d2h, both, both_h2d, both_d2h;
  };
  std::vector<Line> lines;
  for (const PcieTimes& t : times) {
    const double n = static_cast<double>(t.bytes);
    lines.push_back({t.bytes >> 20, Rates(n, t.h2d), Rates(n, t.d2h), Rates(2 * n, t.both), Rates(n, t.both_h2d),
                     Rates(n, t.both_d2h)});
  }
  for (const Line& l : lines) {
    const std::pair<const char*, const Rate*> rows[] = {{"h2d", &l.h2d},
                                                        {"d2h", &l.d2h},
                                                        {"both (total)", &l.both},
                                                        {"both: h2d", &l.both_h2d},
                                                        {"both: d2h", &l.both_d2h}};
    for (const auto& [name, r] : rows) {
      std::printf("%-12s %5lld MiB: %7.2f GB/s  (median of %d; min %.2f, max %.2f)\n", name,
                  static_cast<long long>(l.mib), r->median, o.reps, r->min, r->max);
    }
  }
  for (const Line& l : lines) {
    std::printf(
        "PCIE size_mib=%lld reps=%d h2d_gbps=%.2f d2h_gbps=%.2f both_gbps=%.2f both_h2d_gbps=%.2f "
        "both_d2h_gbps=%.2f\n",
        static_cast<long long>(l.mib), o.reps, l.h2d.median, l.d2h.median, l.both.median, l.both_h2d.median,
        l.both_d2h.median);
  }
  const Line& big =
      *std::max_element(lines.begin(), lines.end(), [](const Line& a, const Line& b) { return a.mib < b.mib; });
  std::printf("PCIE_FLOOR size_mib=%lld h2d_gbps=%.2f d2h_gbps=%.2f both_gbps=%.2f\n", static_cast<long long>(big.mib),
              big.h2d.median, big.d2h.median, big.both.median);
  std::fflush(stdout);
  return OkStatus();
}

#else  // !ZERO_BENCH_HAS_CUDA

Status Run(const Options& o) {
  return UnimplementedError("this pcie_bench was built without the CUDA toolkit; only --dry-run works");
}

#endif

}  // namespace
}  // namespace zero::bench

int main(int argc, char** argv) {
  return zero::bench::BenchMain("pcie_bench", zero::bench::kUsage, zero::bench::ParseFlags(argc, argv),
                                [](const zero::bench::Options& o) -> zero::Status {
                                  if (!o.dry_run) return zero::bench::Run(o);
                                  zero::bench::PrintPlan(o);
                                  std::printf("dry run ok\n");
                                  return zero::OkStatus();
                                });
}
