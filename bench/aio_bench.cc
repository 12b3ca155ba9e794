// aio_bench: swap write and read GB/s through the AioEngine (LibaioEngine) against a raw O_DIRECT
// pwrite/pread loop at the same block size, with queue depth emulated by as many threads each
// doing blocking calls, measured in the same run on the same preallocated file; a block_size x
// queue_depth sweep, printing engine/raw ratios (docs/nvme.md, docs/performance.md).
//
//   bazel run //bench:aio_bench -- --dir=/path/on/nvme --size_mb=1024
//       --block_sizes=262144,1048576 --queue_depths=4,8,16 --threads=1 --reps=3   (one line)
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "nvme/aio_engine.h"
#include "nvme/aligned_buffer.h"
#include "nvme/libaio_engine.h"

namespace zero {
namespace {

struct Flags {
  std::string dir = "/var/tmp";
  uint64_t size_mb = 256;
  std::vector<int64_t> block_sizes = {262144, 1048576};
  std::vector<int64_t> queue_depths = {1, 4, 8, 16};
  int64_t threads = 1;
  int reps = 2;
};

std::vector<int64_t> ParseList(const char* s) {
  std::vector<int64_t> v;
  while (*s) {
    char* end;
    v.push_back(std::strtoll(s, &end, 10));
    s = *end == ',' ? end + 1 : end;
    if (end == s && *s) break;
  }
  return v;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// `depth` threads, each moving blocks i, i+depth, ... with blocking pread/pwrite.
double RawGbps(int fd, bool write, uint8_t* buf, uint64_t size, uint64_t block, int depth) {
  std::atomic<bool> failed{false};
  const uint64_t blocks = (size + block - 1) / block;
  const double t0 = Now();
  std::vector<std::thread> ts;
  for (int t = 0; t < depth; ++t) {
    ts.emplace_back([&, t] {
      for (uint64_t b = t; b < blocks; b += depth) {
        const uint64_t off = b * block;
        const size_t len = std::min<uint64_t>(block, size - off);
        ssize_t n = write ? ::pwrite(fd, buf + off, len, off) : ::pread(fd, buf + off, len, off);
        if (n != static_cast<ssize_t>(len)) failed = true;
      }
    });
  }
  for (auto& t : ts) t.join();
  const double dt = Now() - t0;
  if (failed) {
    std::fprintf(stderr, "aio_bench: raw %s failed: %s\n", write ? "pwrite" : "pread", std::strerror(errno));
    std::exit(1);
  }
  return size / dt / 1e9;
}

double EngineGbps(AioEngine& engine, AioFile& file, bool write, uint8_t* buf, uint64_t size) {
  const double t0 = Now();
  Status st = write ? engine.Write(file, 0, buf, size) : engine.Read(file, 0, buf, size);
  const double dt = Now() - t0;
  if (!st.ok()) {
    std::fprintf(stderr, "aio_bench: %s\n", st.ToString().c_str());
    std::exit(1);
  }
  return size / dt / 1e9;
}

int Main(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&](const char* k) -> const char* {
      size_t n = std::strlen(k);
      return a.compare(0, n, k) == 0 ? argv[i] + n : nullptr;
    };
    if (const char* v = val("--dir=")) f.dir = v;
    else if (const char* v = val("--size_mb=")) f.size_mb = std::strtoull(v, nullptr, 10);
    else if (const char* v = val("--block_sizes=")) f.block_sizes = ParseList(v);
    else if (const char* v = val("--queue_depths=")) f.queue_depths = ParseList(v);
    else if (const char* v = val("--threads=")) f.threads = std::strtoll(v, nullptr, 10);
    else if (const char* v = val("--reps=")) f.reps = std::atoi(v);
    else {
      std::fprintf(stderr, "aio_bench: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  const uint64_t size = f.size_mb << 20;
  const std::string path = f.dir + "/aio_bench." + std::to_string(::getpid()) + ".swp";
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) {
    std::fprintf(stderr, "aio_bench: open %s with O_DIRECT: %s (filesystem %s)\n", path.c_str(),
                 std::strerror(errno), FilesystemType(f.dir).c_str());
    return 1;
  }
  if (int err = ::posix_fallocate(fd, 0, size); err != 0) {
    std::fprintf(stderr, "aio_bench: preallocate %llu bytes in %s: %s\n",
                 static_cast<unsigned long long>(size), path.c_str(), std::strerror(err));
    ::unlink(path.c_str());
    return 1;
  }
  auto buf = AlignedBuffer::Allocate(size, 1 << 20);
  if (!buf.ok()) {
    std::fprintf(stderr, "aio_bench: %s\n", buf.status().ToString().c_str());
    return 1;
  }
  for (uint64_t i = 0; i < size; i += 4096) buf->bytes()[i] = static_cast<uint8_t>(i >> 12);
  std::printf("aio_bench: %s (%s), %llu MiB, intra_op_parallelism %lld, best of %d\n",
              path.c_str(), FilesystemType(f.dir).c_str(),
              static_cast<unsigned long long>(f.size_mb), static_cast<long long>(f.threads), f.reps);
  std::printf("%10s %5s | %10s %10s %6s | %10s %10s %6s\n", "block", "qd", "write GB/s", "raw GB/s",
              "ratio", "read GB/s", "raw GB/s", "ratio");
  for (int64_t block : f.block_sizes) {
    for (int64_t qd : f.queue_depths) {
      AioOptions o;
      o.block_size = block;
      o.queue_depth = qd;
      o.intra_op_parallelism = f.threads;
      auto engine = LibaioEngine::Create(o);
      if (!engine.ok()) {
        std::fprintf(stderr, "aio_bench: %s\n", engine.status().ToString().c_str());
        return 1;
      }
      auto file = (*engine)->Open(path, AioOpenMode::kReadWrite);
      if (!file.ok()) {
        std::fprintf(stderr, "aio_bench: %s\n", file.status().ToString().c_str());
        return 1;
      }
      // Raw gets the same total concurrency: queue_depth x threads blocking callers.
      const int raw_depth = static_cast<int>(qd * f.threads);
      double ew = 0, rw = 0, er = 0, rr = 0;
      for (int r = 0; r < f.reps; ++r) {
        ew = std::max(ew, EngineGbps(**engine, **file, true, buf->bytes(), size));
        rw = std::max(rw, RawGbps(fd, true, buf->bytes(), size, block, raw_depth));
        er = std::max(er, EngineGbps(**engine, **file, false, buf->bytes(), size));
        rr = std::max(rr, RawGbps(fd, false, buf->bytes(), size, block, raw_depth));
      }
      std::printf("%10lld %5lld | %10.3f %10.3f %6.3f | %10.3f %10.3f %6.3f\n",
                  static_cast<long long>(block), static_cast<long long>(qd), ew, rw, ew / rw, er,
                  rr, er / rr);
      std::fflush(stdout);
    }
  }
  ::close(fd);
  ::unlink(path.c_str());
  return 0;
}

}  // namespace
}  // namespace zero

int main(int argc, char** argv) { return zero::Main(argc, argv); }
