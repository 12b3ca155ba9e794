// cpu_adam_bench: params/s of the CPU AdamW (offload/cpu_adam.h) for each path and thread count,
// next to a STREAM-like copy and triad measured in the same run, on the same threads and tiles, so
// the AdamW's ratio to the memory bandwidth roof comes from one machine state.
//
//   cpu_adam_bench [--n 268435456] [--threads 1,8,16] [--paths avx512,avx2,scalar]
//                  [--outputs none,bf16,bf16nt] [--iters 5] [--tile 65536] [--slot 4194304]
//
// Bytes per parameter, counted as STREAM counts (bytes the kernel reads plus bytes it writes; the
// read-for-ownership of a written line is not counted, for AdamW as for triad): AdamW reads
// p, g, m, v and writes p, m, v: 28 B; the 16-bit copy adds 2 B (fp32 copy: 4 B). Copy counts
// 8 B per float, triad (a = b + s*c) 12 B. bf16nt/fp16nt write the copy with non-temporal stores
// (CpuAdamWOptions::stream_model_out), which saves its read-for-ownership; the count stays 30 B. Each figure is the
// best of --iters timed repetitions after one warm-up. The last line is one summary: the best AdamW path with the bf16
// copy at the largest thread count, its params/s and its fraction of the triad bandwidth.
//
// Then the engine's update in backward (zero/host_optimizer_states.cc): bf16 gradients arriving
// in slots of --slot elements (default 4M, the 16 MiB staging slots), widened to fp32 and
// updated with the bf16 copy written non-temporally: "widen2pass" (WidenToF32 over the slot, then
// CpuAdamW over it: the engine before 2026-12-01) against "widenfused" (WidenedAdamW: the same per
// tile, the widened tile read back from cache), same run, same threads; counted 28 B per param
// (p, m, v read and written, the bf16 gradient and copy 2 B each).
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "offload/cpu_adam.h"
#include "offload/thread_pool.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "zero/host_state_kernels.h"

namespace zero {
namespace {

struct Flags {
  size_t n = size_t{1} << 28;
  std::vector<int> threads;
  std::vector<CpuAdamPath> paths;
  std::vector<std::string> outputs = {"none", "bf16", "bf16nt"};
  int iters = 5;
  size_t tile = kCpuAdamTileElements;
  size_t slot = size_t{1} << 22;  // the update-in-backward lines: elements per staging slot
};

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> parts;
  size_t b = 0;
  while (b <= s.size()) {
    size_t e = s.find(',', b);
    if (e == std::string::npos) e = s.size();
    if (e > b) parts.push_back(s.substr(b, e - b));
    b = e + 1;
  }
  return parts;
}

[[noreturn]] void Usage(const std::string& why) {
  std::fprintf(stderr,
               "cpu_adam_bench: %s\nusage: cpu_adam_bench [--n N] [--threads a,b,..] "
               "[--paths avx512,avx2,scalar] [--outputs none,bf16,fp16,fp32,bf16nt,fp16nt] [--iters K] "
               "[--tile T] [--slot S]\n",
               why.c_str());
  std::exit(2);
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) Usage("flag " + a + " needs a value");
    std::string v = argv[++i];
    if (a == "--n") {
      f.n = std::strtoull(v.c_str(), nullptr, 10);
    } else if (a == "--threads") {
      for (const auto& t : Split(v)) {
        int k = std::atoi(t.c_str());
        if (k < 1) Usage("--threads: '" + t + "' is not a positive count");
        f.threads.push_back(k);
      }
    } else if (a == "--paths") {
      for (const auto& p : Split(v)) {
        CpuAdamPath path;
        if (!ParseCpuAdamPath(p, &path) || path == CpuAdamPath::kAuto) {
          Usage("--paths: unknown path '" + p + "' (expected avx512, avx2, scalar)");
        }
        if (!CpuAdamPathAvailable(path)) {
          Usage("--paths: '" + p + "' is not available on this CPU");
        }
        f.paths.push_back(path);
      }
    } else if (a == "--outputs") {
      f.outputs = Split(v);
      for (const auto& o : f.outputs) {
        if (o != "none" && o != "bf16" && o != "fp16" && o != "fp32" && o != "bf16nt" && o != "fp16nt") {
          Usage("--outputs: unknown '" + o + "' (expected none, bf16, fp16, fp32, bf16nt, fp16nt)");
        }
      }
    } else if (a == "--iters") {
      f.iters = std::atoi(v.c_str());
      if (f.iters < 1) Usage("--iters must be >= 1");
    } else if (a == "--tile") {
      f.tile = std::strtoull(v.c_str(), nullptr, 10);
    } else if (a == "--slot") {
      f.slot = std::strtoull(v.c_str(), nullptr, 10);
      if (f.slot == 0) Usage("--slot must be > 0");
    } else {
      Usage("unknown flag " + a);
    }
  }
  if (f.n == 0) Usage("--n must be > 0");
  if (f.threads.empty()) {
    int hw = std::max(1u, std::thread::hardware_concurrency());
    f.threads = {1};
    if (hw / 2 > 1) f.threads.push_back(hw / 2);
    if (hw > 1) f.threads.push_back(hw);
  }
  if (f.paths.empty()) {
    for (CpuAdamPath p : {CpuAdamPath::kAvx512, CpuAdamPath::kAvx2, CpuAdamPath::kScalar}) {
      if (CpuAdamPathAvailable(p)) f.paths.push_back(p);
    }
  }
  return f;
}

// 2 MiB-aligned, transparent huge pages where the kernel allows (fewer TLB misses for both the
// AdamW and the bandwidth loops).
template <typename T>
T* AllocateArray(size_t n) {
  size_t bytes = ((n * sizeof(T)) + (size_t{2} << 20) - 1) & ~((size_t{2} << 20) - 1);
  void* p = std::aligned_alloc(size_t{2} << 20, bytes);
  if (p == nullptr) {
    std::fprintf(stderr, "cpu_adam_bench: cannot allocate %zu bytes (lower --n)\n", bytes);
    std::exit(1);
  }
  madvise(p, bytes, MADV_HUGEPAGE);
  return static_cast<T*>(p);
}

// --- bandwidth loops: plain loads/stores (no streaming stores), as the AdamW does ---------------

__attribute__((target("avx512f"))) void Triad512(float* a, const float* b, const float* c, float s, size_t lo,
                                                 size_t hi) {
  const __m512 vs = _mm512_set1_ps(s);
  size_t i = lo;
  for (; i + 16 <= hi; i += 16) {
    _mm512_storeu_ps(a + i, _mm512_add_ps(_mm512_loadu_ps(b + i), _mm512_mul_ps(vs, _mm512_loadu_ps(c + i))));
  }
  for (; i < hi; ++i) a[i] = b[i] + s * c[i];
}
__attribute__((target("avx512f"))) void Copy512(float* a, const float* b, size_t lo, size_t hi) {
  size_t i = lo;
  for (; i + 16 <= hi; i += 16) _mm512_storeu_ps(a + i, _mm512_loadu_ps(b + i));
  for (; i < hi; ++i) a[i] = b[i];
}
__attribute__((target("avx2"))) void Triad256(float* a, const float* b, const float* c, float s, size_t lo, size_t hi) {
  const __m256 vs = _mm256_set1_ps(s);
  size_t i = lo;
  for (; i + 8 <= hi; i += 8) {
    _mm256_storeu_ps(a + i, _mm256_add_ps(_mm256_loadu_ps(b + i), _mm256_mul_ps(vs, _mm256_loadu_ps(c + i))));
  }
  for (; i < hi; ++i) a[i] = b[i] + s * c[i];
}
__attribute__((target("avx2"))) void Copy256(float* a, const float* b, size_t lo, size_t hi) {
  size_t i = lo;
  for (; i + 8 <= hi; i += 8) _mm256_storeu_ps(a + i, _mm256_loadu_ps(b + i));
  for (; i < hi; ++i) a[i] = b[i];
}
void TriadPlain(float* __restrict a, const float* __restrict b, const float* __restrict c, float s, size_t lo,
                size_t hi) {
  for (size_t i = lo; i < hi; ++i) a[i] = b[i] + s * c[i];
}
void CopyPlain(float* __restrict a, const float* __restrict b, size_t lo, size_t hi) {
  for (size_t i = lo; i < hi; ++i) a[i] = b[i];
}

template <typename Body>
void Tiled(ThreadPool* pool, size_t n, size_t tile, const Body& body) {
  size_t tiles = (n + tile - 1) / tile;
  pool->ParallelFor(tiles, [&](size_t t) { body(t * tile, std::min(n, (t + 1) * tile)); });
}

template <typename F>
double BestSeconds(int iters, const F& f) {
  f();  // warm-up
  double best = 1e30;
  for (int i = 0; i < iters; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
  }
  return best;
}

int Main(int argc, char** argv) {
  const Flags f = ParseFlags(argc, argv);
  const size_t n = f.n;
  const size_t tile = std::max<size_t>(64, (f.tile + 63) & ~size_t{63});
  const int max_threads = *std::max_element(f.threads.begin(), f.threads.end());
  std::printf("cpu_adam_bench: n=%zu params, tile=%zu, hardware threads=%u, auto path=%s\n", n, tile,
              std::thread::hardware_concurrency(), CpuAdamPathName(BestCpuAdamPath()));

  float* p = AllocateArray<float>(n);
  float* g = AllocateArray<float>(n);
  float* m = AllocateArray<float>(n);
  float* v = AllocateArray<float>(n);
  uint16_t* out16 = AllocateArray<uint16_t>(n);
  float* out32 = AllocateArray<float>(n);
  float* a = AllocateArray<float>(n);
  float* b = AllocateArray<float>(n);
  float* c = AllocateArray<float>(n);
  {
    // First touch on the widest pool, tile by tile as the loops below run (NUMA placement).
    auto pool = ThreadPool::Create(max_threads);
    if (!pool.ok()) {
      std::fprintf(stderr, "cpu_adam_bench: %s\n", pool.status().ToString().c_str());
      return 1;
    }
    Tiled(pool->get(), n, tile, [&](size_t lo, size_t hi) {
      for (size_t i = lo; i < hi; ++i) {
        uint32_t x = static_cast<uint32_t>(i) * 2654435761u;
        float r = static_cast<float>(x >> 8) * (1.0f / 16777216.0f) - 0.5f;  // [-0.5, 0.5)
        p[i] = r;
        g[i] = r * 0.01f + 1e-3f;
        m[i] = 0.0f;
        v[i] = 0.0f;
        out16[i] = 0;
        out32[i] = 0.0f;
        a[i] = 0.0f;
        b[i] = r;
        c[i] = 1.0f - r;
      }
    });
  }

  AdamWParams h;
  h.lr = 1e-4f;
  h.weight_decay = 0.01f;
  h.beta2 = 0.95f;
  h.bias_correction1 = 0.1f;
  h.bias_correction2 = 0.05f;
  h.grad_scale = 1.0f / 1024.0f;

  const bool avx512 = CpuAdamPathAvailable(CpuAdamPath::kAvx512);
  const bool avx2 = CpuAdamPathAvailable(CpuAdamPath::kAvx2);
  double summary_params = 0, summary_frac = 0;
  std::string summary_path = "-";
  int summary_threads = 0;
  for (int threads : f.threads) {
    auto pool_or = ThreadPool::Create(threads);
    if (!pool_or.ok()) {
      std::fprintf(stderr, "cpu_adam_bench: %s\n", pool_or.status().ToString().c_str());
      return 1;
    }
    ThreadPool* pool = pool_or->get();
    const double t_copy = BestSeconds(f.iters, [&] {
      Tiled(pool, n, tile, [&](size_t lo, size_t hi) {
        avx512 ? Copy512(a, b, lo, hi) : avx2 ? Copy256(a, b, lo, hi) : CopyPlain(a, b, lo, hi);
      });
    });
    const double t_triad = BestSeconds(f.iters, [&] {
      Tiled(pool, n, tile, [&](size_t lo, size_t hi) {
        avx512 ? Triad512(a, b, c, 0.5f, lo, hi)
        : avx2 ? Triad256(a, b, c, 0.5f, lo, hi)
               : TriadPlain(a, b, c, 0.5f, lo, hi);
      });
    });
    const double copy_gbs = 8.0 * n / t_copy / 1e9;
    const double triad_gbs = 12.0 * n / t_triad / 1e9;
    std::printf("threads=%-3d copy %8.2f GB/s   triad %8.2f GB/s\n", threads, copy_gbs, triad_gbs);
    for (CpuAdamPath path : f.paths) {
      for (const std::string& o : f.outputs) {
        void* out = o == "none" ? nullptr : o == "fp32" ? static_cast<void*>(out32) : out16;
        const bool nt = o.size() > 4;  // bf16nt, fp16nt: non-temporal stores of the copy
        DType t = o.rfind("bf16", 0) == 0 ? DType::kBF16 : o.rfind("fp16", 0) == 0 ? DType::kF16 : DType::kF32;
        const double bytes = 28.0 + (o == "none" ? 0.0 : o == "fp32" ? 4.0 : 2.0);
        CpuAdamWOptions options;
        options.path = path;
        options.tile_elements = tile;
        options.stream_model_out = nt;
        Status st = OkStatus();
        const double t_adam = BestSeconds(f.iters, [&] {
          Status s = CpuAdamW(p, g, m, v, n, h, out, t, pool, options);
          if (!s.ok()) st = s;
        });
        if (!st.ok()) {
          std::fprintf(stderr, "cpu_adam_bench: %s\n", st.ToString().c_str());
          return 1;
        }
        const double params = n / t_adam;
        const double gbs = bytes * params / 1e9;
        std::printf(
            "threads=%-3d path=%-6s out=%-6s %7.3f ms  %9.3f Mparams/s  %7.2f GB/s (%2.0f B/param)"
            "  %5.1f%% of triad  %5.1f%% of copy\n",
            threads, CpuAdamPathName(path), o.c_str(), t_adam * 1e3, params / 1e6, gbs, bytes, 100.0 * gbs / triad_gbs,
            100.0 * gbs / copy_gbs);
        if (o.rfind("bf16", 0) == 0 && threads == max_threads && params > summary_params) {
          summary_params = params;
          summary_frac = gbs / triad_gbs;
          summary_path = std::string(CpuAdamPathName(path)) + (nt ? " out=bf16nt" : " out=bf16");
          summary_threads = threads;
        }
      }
    }
    // The update in backward from bf16 gradients, slot by slot: two passes against fused.
    {
      const size_t slot = std::min(f.slot, n);
      std::vector<uint16_t> g16(n, 0x3c00);  // bf16 0.0078125
      std::vector<float> scratch(slot);
      CpuAdamWOptions options;
      options.stream_model_out = true;
      for (const char* mode : {"widen2pass", "widenfused"}) {
        const bool fused = mode[5] == 'f';
        Status st = OkStatus();
        const double t = BestSeconds(f.iters, [&] {
          for (size_t at = 0; at < n; at += slot) {
            const size_t len = std::min(slot, n - at);
            Status s2;
            if (fused) {
              s2 = WidenedAdamW(pool, g16.data() + at, DType::kBF16, scratch.data(), p + at, m + at, v + at,
                                static_cast<int64_t>(len), h, out16 + at, DType::kBF16, options);
            } else {
              WidenToF32(pool, g16.data() + at, DType::kBF16, scratch.data(), static_cast<int64_t>(len));
              s2 = CpuAdamW(p + at, scratch.data(), m + at, v + at, len, h, out16 + at, DType::kBF16, pool, options);
            }
            if (!s2.ok()) st = s2;
          }
        });
        if (!st.ok()) {
          std::fprintf(stderr, "cpu_adam_bench: %s\n", st.ToString().c_str());
          return 1;
        }
        const double params = n / t;
        std::printf(
            "threads=%-3d update_in_backward=%-10s slot=%zu %7.3f ms  %9.3f Mparams/s  %7.2f GB/s (28 B/param)"
            "  %5.1f%% of triad\n",
            threads, mode, slot, t * 1e3, params / 1e6, 28.0 * params / 1e9, 100.0 * 28.0 * params / 1e9 / triad_gbs);
      }
    }
  }
  std::printf(
      "SUMMARY cpu_adam_bench n=%zu threads=%d path=%s params_per_s=%.4g "
      "frac_of_triad=%.3f\n",
      n, summary_threads, summary_path.c_str(), summary_params, summary_frac);
  for (void* q : {static_cast<void*>(p), static_cast<void*>(g), static_cast<void*>(m), static_cast<void*>(v),
                  static_cast<void*>(out16), static_cast<void*>(out32), static_cast<void*>(a), static_cast<void*>(b),
                  static_cast<void*>(c)}) {
    std::free(q);
  }
  return 0;
}

}  // namespace
}  // namespace zero

int main(int argc, char** argv) { return zero::Main(argc, argv); }
