// nvme_states_bench: swap throughput of the NVMe optimizer states (zero/nvme_optimizer_states.h)
// in the two access patterns the engine makes, against a raw O_DIRECT read-then-write pass over
// the same bytes in the same run (docs/nvme.md):
//   - "backward": the update in backward, one UpdateFromGradient call per parameter, last
//     parameter first (each group read, updated, written back once);
//   - "boundary": one Update call over the whole partition, upward.
// The disk floor of one pass is read bytes / raw read GB/s + write bytes / raw write GB/s (the
// disk serves one direction at a time at best). Runs on the CPU backend (no GPU needed).
//   nvme_states_bench --dir DIR [--numel N] [--group N] [--param N] [--buffers N] [--passes N]
//                     [--dim D --ffn F] [--aio-qd N] [--aio-threads N]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "runtime/cpu_device.h"
#include "runtime/device.h"
#include "zero/nvme_optimizer_states.h"

namespace zero {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Raw O_DIRECT pass: write then read `bytes` in 1 MiB blocks, 8 threads-free sequential pwrite /
// pread (the engine keeps queue_depth 8 in flight; this is the plain sequential floor).
void RawPass(const std::string& path, size_t bytes, double* write_gbs, double* read_gbs) {
  const size_t block = 1 << 20;
  void* buf = nullptr;
  if (posix_memalign(&buf, 4096, block) != 0) std::abort();
  std::memset(buf, 7, block);
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0600);
  if (fd < 0) {
    std::perror("open raw");
    std::exit(1);
  }
  auto t = Clock::now();
  for (size_t off = 0; off < bytes; off += block) {
    if (pwrite(fd, buf, block, static_cast<off_t>(off)) != static_cast<ssize_t>(block)) {
      std::perror("pwrite");
      std::exit(1);
    }
  }
  fdatasync(fd);
  *write_gbs = bytes / Since(t) / 1e9;
  t = Clock::now();
  for (size_t off = 0; off < bytes; off += block) {
    if (pread(fd, buf, block, static_cast<off_t>(off)) != static_cast<ssize_t>(block)) {
      std::perror("pread");
      std::exit(1);
    }
  }
  *read_gbs = bytes / Since(t) / 1e9;
  close(fd);
  unlink(path.c_str());
  free(buf);
}

int Main(int argc, char** argv) {
  std::string dir;
  int64_t numel = int64_t{1} << 28, group = int64_t{1} << 25, param = int64_t{1} << 24;
  int buffers = 4, passes = 2;
  int64_t dim = 0, ffn = 0;
  int64_t aio_qd = 8, aio_threads = 1;  // the aio block's queue_depth and intra_op_parallelism  // > 0: parameters laid
                                        // out as mlp_bench's blocks (W1, b1, W2, b2 each)
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    const char* v = argv[i + 1];
    if (f == "--dir")
      dir = v;
    else if (f == "--numel")
      numel = std::atoll(v);
    else if (f == "--group")
      group = std::atoll(v);
    else if (f == "--param")
      param = std::atoll(v);
    else if (f == "--buffers")
      buffers = std::atoi(v);
    else if (f == "--passes")
      passes = std::atoi(v);
    else if (f == "--dim")
      dim = std::atoll(v);
    else if (f == "--aio-qd")
      aio_qd = std::atoll(v);
    else if (f == "--aio-threads")
      aio_threads = std::atoll(v);
    else if (f == "--ffn")
      ffn = std::atoll(v);
    else {
      std::fprintf(stderr, "unknown flag %s\n", f.c_str());
      return 2;
    }
  }
  if (dir.empty()) {
    std::fprintf(stderr, "usage: nvme_states_bench --dir DIR [...]\n");
    return 2;
  }
  // The parameters' [begin, end) in the partition: equal slices of `param`, or mlp_bench's blocks
  // (each parameter aligned to 64 elements, as the engine's layout) filling `numel`.
  std::vector<std::pair<int64_t, int64_t>> ranges;
  if (dim > 0 && ffn > 0) {
    int64_t at = 0;
    const int64_t sizes[4] = {ffn * dim, ffn, dim * ffn, dim};
    while (true) {
      bool full = false;
      for (int64_t n : sizes) {
        if (at + n > numel) {
          full = true;
          break;
        }
        ranges.push_back({at, at + n});
        at = (at + n + 63) / 64 * 64;
      }
      if (full) break;
    }
    numel = ranges.back().second;
    param = ffn * dim;
  } else {
    for (int64_t b = 0; b < numel; b += param) ranges.push_back({b, std::min(numel, b + param)});
  }
  const double state_bytes = 12.0 * static_cast<double>(numel);
  double raw_w = 0, raw_r = 0;
  RawPass(dir + "/raw_pass.bin", static_cast<size_t>(std::min(state_bytes, 4e9)), &raw_w, &raw_r);
  std::printf("raw O_DIRECT 1 MiB sequential: write %.3f GB/s, read %.3f GB/s\n", raw_w, raw_r);
  const double floor_s = state_bytes / 1e9 / raw_r + state_bytes / 1e9 / raw_w;

  auto device = std::make_unique<CpuDevice>();
  NvmeOptimizerStatesOptions o;
  o.dir = dir + "/states";
  o.group_numel = group;
  o.buffer_count = buffers;
  o.model_dtype = DType::kBF16;
  o.aio.queue_depth = aio_qd;
  o.aio.intra_op_parallelism = aio_threads;
  std::printf("aio: queue_depth %lld x intra_op_parallelism %lld\n", static_cast<long long>(aio_qd),
              static_cast<long long>(aio_threads));
  auto t = Clock::now();
  auto st = CreateNvmeOptimizerStates(device.get(), numel, device->default_stream(), o);
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.status().ToString().c_str());
    return 1;
  }
  std::printf("create (%.2f GB swap file): %.2f s\n", state_bytes / 1e9, Since(t));
  std::unique_ptr<OptimizerStates> states = std::move(st).value();
  std::vector<uint16_t> grad(static_cast<size_t>(param), 0x3c00);  // bf16 grads (1.0-ish)
  std::vector<float> gradf(static_cast<size_t>(param), 0.5f);
  AdamWParams h;
  h.lr = 1e-4f;
  h.bias_correction1 = 0.1f;
  h.bias_correction2 = 0.001f;
  for (int p = 0; p < passes; ++p) {
    t = Clock::now();
    for (auto it = ranges.rbegin(); it != ranges.rend(); ++it) {
      const int64_t begin = it->first, end = it->second;
      Status s = states->UpdateFromGradient(begin, end - begin, grad.data(), DType::kBF16, h, device->default_stream());
      if (!s.ok()) {
        std::fprintf(stderr, "%s\n", s.ToString().c_str());
        return 1;
      }
    }
    // The pass ends when the last write-back is on disk: a read of group 0's master forces nothing;
    // time the next pass's start instead (steady state): report the pass time as measured.
    const double b = Since(t);
    std::printf("backward pass %d: %.2f s, %.3f GB/s of read+write, %.2fx the disk floor (%.2f s)\n", p, b,
                2 * state_bytes / 1e9 / b, b / floor_s, floor_s);
  }
  for (int p = 0; p < passes; ++p) {
    t = Clock::now();
    for (const auto& [at, end] : ranges) {
      const int64_t n = end - at;
      Status s = states->Update(at, n, gradf.data(), h, nullptr, DType::kBF16, device->default_stream());
      if (!s.ok()) {
        std::fprintf(stderr, "%s\n", s.ToString().c_str());
        return 1;
      }
    }
    const double b = Since(t);
    std::printf("boundary pass %d: %.2f s, %.3f GB/s of read+write, %.2fx the disk floor (%.2f s)\n", p, b,
                2 * state_bytes / 1e9 / b, b / floor_s, floor_s);
  }
  return 0;
}

}  // namespace
}  // namespace zero

int main(int argc, char** argv) { return zero::Main(argc, argv); }
