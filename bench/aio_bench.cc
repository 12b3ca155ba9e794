// aio_bench: swap write and read GB/s through the AioEngine (LibaioEngine) against a raw O_DIRECT
// pwrite/pread loop at the same block size, with queue depth emulated by as many threads each
// doing blocking calls, measured in the same run on the same file and, for every measurement, the
// same file state for both (docs/nvme.md "Benchmark"):
//   written: every block of the file was written before (the steady state of swap files: each
//            swap out overwrites the previous one; pure overwrites, no metadata change);
//   fresh:   the file was just preallocated (posix_fallocate: unwritten extents on ext4/xfs), so
//            each write also converts its extents to written (a journaled metadata change); this
//            is the first swap out into a SwapFile created without prewrite.
//   extend:  (only when asked for) the file was truncated to 0 and not preallocated, so every
//            write extends the file (ext4 completes such direct writes synchronously: io_submit
//            blocks, no queue depth). What writing a kCreate'd file without preallocating costs.
// Reads always read written blocks (reading unwritten extents returns zeros without disk I/O).
// Engine and raw alternate which goes first in each rep; the best of --reps is printed.
//
//   bazel build -c opt //bench:aio_bench && bazel-bin/bench/aio_bench --dir=/path/on/nvme
//       --size_mb=2048 --block_sizes=262144,1048576 --queue_depths=1,4,8 --reps=2   (one line)
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

enum class FileState { kWritten, kFresh, kExtend };

const char* StateName(FileState s) {
  switch (s) {
    case FileState::kWritten:
      return "written";
    case FileState::kFresh:
      return "fresh";
    case FileState::kExtend:
      return "extend";
  }
  return "?";
}

struct Flags {
  std::string dir = "/var/tmp";
  uint64_t size_mb = 256;
  std::vector<int64_t> block_sizes = {262144, 1048576};
  std::vector<int64_t> queue_depths = {1, 4, 8, 16};
  std::vector<FileState> states = {FileState::kWritten, FileState::kFresh};
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

bool ParseStates(const char* s, std::vector<FileState>* out) {
  out->clear();
  std::string list = s;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t comma = list.find(',', pos);
    if (comma == std::string::npos) comma = list.size();
    const std::string name = list.substr(pos, comma - pos);
    if (name == "written") {
      out->push_back(FileState::kWritten);
    } else if (name == "fresh") {
      out->push_back(FileState::kFresh);
    } else if (name == "extend") {
      out->push_back(FileState::kExtend);
    } else {
      std::fprintf(stderr, "aio_bench: --states: expected a list of written, fresh, extend; got '%s'\n", name.c_str());
      return false;
    }
    pos = comma + 1;
  }
  return !out->empty();
}

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

[[noreturn]] void Die(const std::string& what, int err) {
  std::fprintf(stderr, "aio_bench: %s: %s\n", what.c_str(), std::strerror(err));
  std::exit(1);
}

// Puts the whole file into `state` before a write is measured (outside the timing), and syncs so
// that no metadata of the preparation is left to commit during the measurement.
//   fresh:   truncate to 0 (frees the blocks), posix_fallocate the size again (new unwritten
//            extents), fsync.
//   extend:  truncate to 0, fsync.
//   written: if the file is not fully written yet, pwrite every block once, fsync.
class FileStateKeeper {
 public:
  FileStateKeeper(int fd, std::string path, uint8_t* buf, uint64_t size)
      : fd_(fd), path_(std::move(path)), buf_(buf), size_(size) {}

  void Prepare(FileState state) {
    if (state == FileState::kFresh || state == FileState::kExtend) {
      if (::ftruncate(fd_, 0) != 0) Die("truncate " + path_, errno);
      if (state == FileState::kFresh) {
        if (int err = ::posix_fallocate(fd_, 0, static_cast<off_t>(size_)); err != 0) {
          Die("preallocate " + std::to_string(size_) + " bytes in " + path_, err);
        }
      }
      if (::fsync(fd_) != 0) Die("fsync " + path_, errno);
      written_ = false;
    } else if (!written_) {
      constexpr uint64_t kChunk = 8 << 20;
      for (uint64_t off = 0; off < size_; off += kChunk) {
        const size_t len = std::min<uint64_t>(kChunk, size_ - off);
        if (::pwrite(fd_, buf_ + off, len, static_cast<off_t>(off)) != static_cast<ssize_t>(len)) {
          Die("prewrite " + path_ + " offset " + std::to_string(off), errno);
        }
      }
      if (::fsync(fd_) != 0) Die("fsync " + path_, errno);
      written_ = true;
    }
  }
  // After a measured write: every block is written now.
  void Wrote() { written_ = true; }

 private:
  const int fd_;
  const std::string path_;
  uint8_t* const buf_;
  const uint64_t size_;
  bool written_ = false;  // posix_fallocate'd at start: fresh
};

// `depth` threads, each moving blocks i, i+depth, ... with blocking pread/pwrite.
double RawGbps(int fd, bool write, uint8_t* buf, uint64_t size, uint64_t block, int depth) {
  std::atomic<int> failed_errno{0};
  const uint64_t blocks = (size + block - 1) / block;
  const double t0 = Now();
  std::vector<std::thread> ts;
  for (int t = 0; t < depth; ++t) {
    ts.emplace_back([&, t] {
      for (uint64_t b = t; b < blocks; b += depth) {
        const uint64_t off = b * block;
        const size_t len = std::min<uint64_t>(block, size - off);
        ssize_t n = write ? ::pwrite(fd, buf + off, len, off) : ::pread(fd, buf + off, len, off);
        if (n != static_cast<ssize_t>(len)) failed_errno = n < 0 ? errno : EIO;
      }
    });
  }
  for (auto& t : ts) t.join();
  const double dt = Now() - t0;
  if (failed_errno != 0) Die(std::string("raw ") + (write ? "pwrite" : "pread"), failed_errno);
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
    if (const char* v = val("--dir="))
      f.dir = v;
    else if (const char* v = val("--size_mb="))
      f.size_mb = std::strtoull(v, nullptr, 10);
    else if (const char* v = val("--block_sizes="))
      f.block_sizes = ParseList(v);
    else if (const char* v = val("--queue_depths="))
      f.queue_depths = ParseList(v);
    else if (const char* v = val("--states=")) {
      if (!ParseStates(v, &f.states)) return 2;
    } else if (const char* v = val("--threads="))
      f.threads = std::strtoll(v, nullptr, 10);
    else if (const char* v = val("--reps="))
      f.reps = std::atoi(v);
    else {
      std::fprintf(stderr, "aio_bench: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  if (f.reps < 1 || f.size_mb == 0) {
    std::fprintf(stderr, "aio_bench: --reps and --size_mb must be >= 1\n");
    return 2;
  }
  const uint64_t size = f.size_mb << 20;
  const std::string path = f.dir + "/aio_bench." + std::to_string(::getpid()) + ".swp";
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) {
    std::fprintf(stderr, "aio_bench: open %s with O_DIRECT: %s (filesystem %s)\n", path.c_str(), std::strerror(errno),
                 FilesystemType(f.dir).c_str());
    return 1;
  }
  if (int err = ::posix_fallocate(fd, 0, size); err != 0) {
    std::fprintf(stderr, "aio_bench: preallocate %llu bytes in %s: %s\n", static_cast<unsigned long long>(size),
                 path.c_str(), std::strerror(err));
    ::unlink(path.c_str());
    return 1;
  }
  auto buf = AlignedBuffer::Allocate(size, 1 << 20);
  if (!buf.ok()) {
    std::fprintf(stderr, "aio_bench: %s\n", buf.status().ToString().c_str());
    return 1;
  }
  for (uint64_t i = 0; i < size; i += 4096) buf->bytes()[i] = static_cast<uint8_t>(i >> 12);
  FileStateKeeper keeper(fd, path, buf->bytes(), size);
  std::printf(
      "aio_bench: %s (%s), %llu MiB, intra_op_parallelism %lld, best of %d; engine and "
      "raw measured over the same file state, alternating which goes first\n",
      path.c_str(), FilesystemType(f.dir).c_str(), static_cast<unsigned long long>(f.size_mb),
      static_cast<long long>(f.threads), f.reps);
  std::printf(
      "  write/written: overwrite of written blocks (steady-state swap out); "
      "write/fresh: into just-preallocated (unwritten) extents; read: of written blocks\n");
  // Two header lines: the group (what was measured over which file state), then the columns.
  std::printf("%16s", "");
  for (FileState s : f.states) std::printf(" | %-24s", (std::string("write, ") + StateName(s)).c_str());
  std::printf(" | %-24s\n", "read, written");
  std::printf("%10s %5s", "block", "qd");
  for (size_t k = 0; k <= f.states.size(); ++k) {
    std::printf(" | %8s %8s %6s", "eng GB/s", "raw GB/s", "ratio");
  }
  std::printf("\n");
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
      auto engine_write = [&] { return EngineGbps(**engine, **file, true, buf->bytes(), size); };
      auto raw_write = [&] { return RawGbps(fd, true, buf->bytes(), size, block, raw_depth); };
      std::printf("%10lld %5lld", static_cast<long long>(block), static_cast<long long>(qd));
      for (FileState s : f.states) {
        double ew = 0, rw = 0;
        for (int r = 0; r < f.reps; ++r) {
          // Each write starts from `s`; odd reps measure raw first.
          for (int k = 0; k < 2; ++k) {
            const bool eng = (k == 0) == (r % 2 == 0);
            keeper.Prepare(s);
            if (eng) {
              ew = std::max(ew, engine_write());
            } else {
              rw = std::max(rw, raw_write());
            }
            keeper.Wrote();
          }
        }
        std::printf(" | %8.3f %8.3f %6.3f", ew, rw, ew / rw);
        std::fflush(stdout);
      }
      keeper.Prepare(FileState::kWritten);
      double er = 0, rr = 0;
      for (int r = 0; r < f.reps; ++r) {
        for (int k = 0; k < 2; ++k) {
          if ((k == 0) == (r % 2 == 0)) {
            er = std::max(er, EngineGbps(**engine, **file, false, buf->bytes(), size));
          } else {
            rr = std::max(rr, RawGbps(fd, false, buf->bytes(), size, block, raw_depth));
          }
        }
      }
      std::printf(" | %8.3f %8.3f %6.3f\n", er, rr, er / rr);
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
