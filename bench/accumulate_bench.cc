// accumulate_bench: the fp32 gradient accumulation kernels (Device::Accumulate, AccumulateFirst:
// what offload_grad_accumulation "gpu" runs each micro step, docs/offload.md) against a
// device->device copy on the same device in the same run (issue 8: the accumulation's bandwidth
// >= 80% of a device copy's).
//
//   accumulate_bench [--device cuda:0|cpu] [--numel N] [--reps N] [--dry-run]
//
// Bytes counted per element: copy 2 x its bytes (read + write); Accumulate from bf16 2 + 4 + 4
// (read src, read acc, write acc), from fp32 4 + 4 + 4; AccumulateFirst from bf16 2 + 4 (read src,
// write acc: it never reads the accumulator). GB/s = 1e9 bytes over the median wall time of one
// call after a stream synchronize (warm-up call excluded). Output:
//   ACCUM op=.. numel=.. bytes_per_elem=.. ms=.. gbps=.. vs_copy=..
// vs_copy: the op's GB/s over the same run's device copy GB/s (copy of numel x 4 bytes).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_flags.h"
#include "runtime/device.h"
#include "runtime/status.h"

namespace zero::bench {
namespace {

struct Options {
  std::string device = "cuda:0";
  int64_t numel = int64_t{1} << 28;  // 256M elements: 1 GiB of fp32
  int reps = 10;
  bool dry_run = false;
};

Result<Options> Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    if (f == "--dry-run") {
      o.dry_run = true;
      continue;
    }
    if (i + 1 >= argc) return InvalidArgumentError(f + ": missing value");
    const std::string v = argv[++i];
    int64_t n = 0;
    if (f == "--device") {
      o.device = v;
    } else if (f == "--numel") {
      ZERO_RETURN_IF_ERROR(ParseInt(f, v, 1, &o.numel));
    } else if (f == "--reps") {
      ZERO_RETURN_IF_ERROR(ParseInt(f, v, 1, 1000000, &n));
      o.reps = static_cast<int>(n);
    } else {
      return InvalidArgumentError("unknown flag '" + f +
                                  "' (usage: accumulate_bench [--device NAME] [--numel N] "
                                  "[--reps N] [--dry-run])");
    }
  }
  return o;
}

// Median milliseconds of `op` over reps calls, each followed by a stream synchronize.
Result<double> TimeMs(Device* d, Stream* s, int reps, const std::function<Status()>& op) {
  ZERO_RETURN_IF_ERROR(op());  // warm-up
  ZERO_RETURN_IF_ERROR(d->SynchronizeStream(s));
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    ZERO_RETURN_IF_ERROR(op());
    ZERO_RETURN_IF_ERROR(d->SynchronizeStream(s));
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

Status Run(const Options& o) {
  std::printf("# accumulate_bench: device %s, numel %lld, reps %d\n", o.device.c_str(), static_cast<long long>(o.numel),
              o.reps);
  if (o.dry_run) {
    std::printf("dry run ok\n");
    return OkStatus();
  }
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Device> d, CreateDevice(o.device));
  const size_t n = static_cast<size_t>(o.numel);
  ZERO_ASSIGN_OR_RETURN(DeviceBuffer acc, d->Allocate(n * 4));
  ZERO_ASSIGN_OR_RETURN(DeviceBuffer src32, d->Allocate(n * 4));
  ZERO_ASSIGN_OR_RETURN(DeviceBuffer src16, d->Allocate(n * 2));
  ZERO_ASSIGN_OR_RETURN(DeviceBuffer dst, d->Allocate(n * 4));
  Stream* s = d->default_stream();
  ZERO_RETURN_IF_ERROR(d->Fill(acc.data(), DType::kF32, n, 0.0f, s));
  ZERO_RETURN_IF_ERROR(d->Fill(src32.data(), DType::kF32, n, 0.5f, s));
  ZERO_RETURN_IF_ERROR(d->Fill(src16.data(), DType::kBF16, n, 0.25f, s));
  ZERO_ASSIGN_OR_RETURN(const double copy_ms, TimeMs(d.get(), s, o.reps, [&] {
                          return d->Copy(dst.data(), src32.data(), n * 4, CopyKind::kDeviceToDevice, s);
                        }));
  const double copy_gbps = 2.0 * n * 4 / (copy_ms * 1e6);
  std::printf("ACCUM op=copy_d2d numel=%zu bytes_per_elem=8 ms=%.3f gbps=%.1f vs_copy=1.000\n", n, copy_ms, copy_gbps);
  struct Case {
    const char* name;
    int bytes;
    std::function<Status()> op;
  };
  const std::vector<Case> cases = {
      {"accumulate_bf16", 10, [&] { return d->Accumulate(acc.as<float>(), src16.data(), DType::kBF16, n, 1.0f, s); }},
      {"accumulate_first_bf16", 6,
       [&] { return d->AccumulateFirst(acc.as<float>(), src16.data(), DType::kBF16, n, 1.0f, s); }},
      {"accumulate_fp32", 12, [&] { return d->Accumulate(acc.as<float>(), src32.data(), DType::kF32, n, 1.0f, s); }},
  };
  for (const Case& c : cases) {
    ZERO_ASSIGN_OR_RETURN(const double ms, TimeMs(d.get(), s, o.reps, c.op));
    const double gbps = static_cast<double>(c.bytes) * n / (ms * 1e6);
    std::printf("ACCUM op=%s numel=%zu bytes_per_elem=%d ms=%.3f gbps=%.1f vs_copy=%.3f\n", c.name, n, c.bytes, ms,
                gbps, gbps / copy_gbps);
  }
  return OkStatus();
}

}  // namespace
}  // namespace zero::bench

int main(int argc, char** argv) {
  return zero::bench::BenchMain("accumulate_bench", nullptr, zero::bench::Parse(argc, argv), zero::bench::Run);
}
