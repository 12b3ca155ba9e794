#include "runtime/cpu_device.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace zero {
namespace {

constexpr size_t kDeviceAlignment = 256;
constexpr size_t kPinnedAlignment = 4096;
// Smallest piece of work handed to a worker thread.
constexpr size_t kMinChunk = size_t{1} << 18;

class CpuStream final : public Stream {};
// Work is complete when RecordEvent returns, so an event's time is the host clock at that call
// (kept only for timing events; 0 means never recorded).
class CpuEvent final : public Event {
 public:
  explicit CpuEvent(bool timing) : timing_(timing) {}
  bool timing() const { return timing_; }
  void Record() {
    if (timing_) recorded_ns_.store(std::chrono::steady_clock::now().time_since_epoch().count() | 1);
  }
  int64_t recorded_ns() const { return recorded_ns_.load(); }

 private:
  const bool timing_;
  std::atomic<int64_t> recorded_ns_{0};
};

std::string FormatBytes(size_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%zu bytes (%.2f GiB)", bytes,
                static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

// Element types as compile-time traits, so each kernel is one specialized loop per dtype.
struct F32 {
  using T = float;
  static float Load(float x) { return x; }
  static float Store(float v) { return v; }
  static uint32_t NonFinite(float x) { return (FloatBits(x) & 0x7f800000u) == 0x7f800000u; }
};
struct BF16 {
  using T = uint16_t;
  static float Load(uint16_t h) { return Bf16ToFloat(h); }
  static uint16_t Store(float v) { return FloatToBf16(v); }
  static uint32_t NonFinite(uint16_t h) { return (h & 0x7f80u) == 0x7f80u; }
};
struct F16 {
  using T = uint16_t;
  // HalfToFloat written without early returns so loops vectorize; equal to it on all 65536
  // patterns (cpu_device_test checks every one through Cast).
  static float Load(uint16_t h) {
    uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t em = static_cast<uint32_t>(h & 0x7fffu) << 13;
    uint32_t exp = h & 0x7c00u;
    float sub = static_cast<float>(h & 0x3ffu) * 5.9604644775390625e-8f;  // exact: mant * 2^-24
    uint32_t bits = exp == 0x7c00u ? (em | 0x7f800000u)                   // Inf/NaN, payload kept
                    : exp == 0     ? FloatBits(sub)                       // zero or subnormal
                                   : em + (112u << 23);                       // normal: rebias 15 -> 127
    return BitsToFloat(sign | bits);
  }
  static uint16_t Store(float v) { return FloatToHalf(v); }
  static uint32_t NonFinite(uint16_t h) { return (h & 0x7c00u) == 0x7c00u; }
};

template <typename F>
auto Dispatch(DType t, F&& f) {
  switch (t) {
    case DType::kF32:
      return f(F32{});
    case DType::kBF16:
      return f(BF16{});
    case DType::kF16:
      break;
  }
  return f(F16{});
}

// NaN results of arithmetic are stored as the canonical NaN 0x7fffffff, which is what the GPU
// produces, so NaN results are bit-identical across backends too.
inline float CanonicalNaN(float r) { return r != r ? BitsToFloat(0x7fffffffu) : r; }

bool ValidDType(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

// Runs body(begin, end) over disjoint pieces covering [0, n): on the calling thread alone below
// kCpuParallelThreshold, else on up to `max_threads` threads (the caller takes the first piece).
// Used only for work whose result does not depend on how [0, n) is split.
template <typename Body>
void ParallelFor(size_t n, int max_threads, const Body& body) {
  size_t threads = 1;
  if (n >= kCpuParallelThreshold && max_threads > 1) {
    threads = std::min<size_t>(static_cast<size_t>(max_threads), n / kMinChunk);
  }
  if (threads <= 1) {
    body(size_t{0}, n);
    return;
  }
  size_t chunk = (n + threads - 1) / threads;
  chunk = (chunk + 63) & ~size_t{63};  // whole cache lines for every element size
  std::vector<std::thread> workers;
  workers.reserve(threads);
  for (size_t begin = chunk; begin < n; begin += chunk) {
    size_t end = std::min(n, begin + chunk);
    try {
      workers.emplace_back([&body, begin, end] { body(begin, end); });
    } catch (const std::system_error&) {
      body(begin, end);  // no thread available: do the piece here
    }
  }
  body(size_t{0}, std::min(n, chunk));
  for (auto& w : workers) w.join();
}

// Per-range loops, one instantiation per dtype; separate functions with restrict-qualified
// pointers so the compiler vectorizes them.
template <typename S, typename D>
void CastRange(const typename S::T* __restrict in, typename D::T* __restrict out, size_t b, size_t e) {
  for (size_t i = b; i < e; ++i) out[i] = D::Store(S::Load(in[i]));
}

template <typename S>
void AccumulateRange(float* __restrict acc, const typename S::T* __restrict in, float scale, size_t b, size_t e) {
  for (size_t i = b; i < e; ++i) acc[i] = CanonicalNaN(acc[i] + scale * S::Load(in[i]));
}

// 0.0f + x is x except for x = -0.0f (+0.0f): kept as an addition on purpose, so the result is
// bitwise the Accumulate into a zero-filled accumulator (the compiler may not drop it: without
// -ffast-math / -fno-signed-zeros, x + 0.0f is not x).
template <typename S>
void AccumulateFirstRange(float* __restrict acc, const typename S::T* __restrict in, float scale, size_t b, size_t e) {
  for (size_t i = b; i < e; ++i) acc[i] = CanonicalNaN(0.0f + scale * S::Load(in[i]));
}

template <typename D>
void ScaleRange(typename D::T* __restrict x, float s, size_t b, size_t e) {
  for (size_t i = b; i < e; ++i) x[i] = D::Store(CanonicalNaN(D::Load(x[i]) * s));
}

template <bool kAdamWMode>
void AdamWRange(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
                const AdamWParams& params, size_t b, size_t e) {
  AdamWParams h = params;
  h.adam_w_mode = kAdamWMode;  // a constant, so the branch leaves the loop
  for (size_t i = b; i < e; ++i) {
    float pi = p[i], mi = m[i], vi = v[i];
    AdamWReference(&pi, g[i], &mi, &vi, h);
    p[i] = CanonicalNaN(pi);
    m[i] = CanonicalNaN(mi);
    v[i] = CanonicalNaN(vi);
  }
}

// AdamW from gradients of dtype S, each widened as AccumulateFirstRange writes it.
template <bool kAdamWMode, typename S>
void AdamWFromGradientRange(float* __restrict p, const typename S::T* __restrict g, float* __restrict m,
                            float* __restrict v, const AdamWParams& params, size_t b, size_t e) {
  AdamWParams h = params;
  h.adam_w_mode = kAdamWMode;
  const float scale = 1.0f;
  for (size_t i = b; i < e; ++i) {
    const float gi = CanonicalNaN(0.0f + scale * S::Load(g[i]));
    float pi = p[i], mi = m[i], vi = v[i];
    AdamWReference(&pi, gi, &mi, &vi, h);
    p[i] = CanonicalNaN(pi);
    m[i] = CanonicalNaN(mi);
    v[i] = CanonicalNaN(vi);
  }
}

// AdamW writing also the new weight rounded to the model dtype D (the canonicalized value, so the
// bits equal a later Cast of the stored weight).
template <bool kAdamWMode, typename D>
void AdamWCastRange(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
                    typename D::T* __restrict out, const AdamWParams& params, size_t b, size_t e) {
  AdamWParams h = params;
  h.adam_w_mode = kAdamWMode;
  for (size_t i = b; i < e; ++i) {
    float pi = p[i], mi = m[i], vi = v[i];
    AdamWReference(&pi, g[i], &mi, &vi, h);
    pi = CanonicalNaN(pi);
    p[i] = pi;
    m[i] = CanonicalNaN(mi);
    v[i] = CanonicalNaN(vi);
    out[i] = D::Store(pi);
  }
}

}  // namespace

CpuDevice::CpuDevice() : CpuDevice(CpuDeviceOptions{}) {}

CpuDevice::CpuDevice(const CpuDeviceOptions& options)
    : options_(options), default_stream_(std::make_unique<CpuStream>()) {
  int n = options.num_threads;
  if (n <= 0) n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  num_threads_ = n;
}

CpuDevice::~CpuDevice() = default;

// --- memory ----------------------------------------------------------------------------------

Result<DeviceBuffer> CpuDevice::Allocate(size_t bytes) {
  if (bytes == 0) return DeviceBuffer();
  // Check-and-count under one lock so concurrent callers cannot overshoot memory_limit.
  std::lock_guard<std::mutex> l(alloc_mu_);
  size_t in_use = memory_stats().in_use;
  if (options_.memory_limit != 0 && (bytes > options_.memory_limit || in_use > options_.memory_limit - bytes)) {
    return ResourceExhaustedError("cpu: out of device memory allocating " + FormatBytes(bytes) + "; in use " +
                                  FormatBytes(in_use) + ", limit " + FormatBytes(options_.memory_limit));
  }
  void* p = nullptr;
  int err = posix_memalign(&p, kDeviceAlignment, bytes);
  if (err != 0 || p == nullptr) {
    return ResourceExhaustedError("cpu: out of device memory allocating " + FormatBytes(bytes) + "; in use " +
                                  FormatBytes(in_use) + " (" + std::strerror(err) + ")");
  }
  NoteAlloc(bytes);
  return DeviceBuffer(this, p, bytes);
}

Result<PinnedBuffer> CpuDevice::AllocatePinned(size_t bytes) {
  if (bytes == 0) return PinnedBuffer();
  void* p = nullptr;
  int err = posix_memalign(&p, kPinnedAlignment, bytes);
  if (err != 0 || p == nullptr) {
    return ResourceExhaustedError("cpu: out of host memory allocating " + FormatBytes(bytes) + " of pinned memory (" +
                                  std::strerror(err) + ")");
  }
  return PinnedBuffer(this, p, bytes);
}

void CpuDevice::FreeDevice(void* ptr, size_t bytes) {
  std::free(ptr);
  NoteFree(bytes);
}

void CpuDevice::FreePinned(void* ptr, size_t bytes) { std::free(ptr); }

// --- streams and events ----------------------------------------------------------------------

namespace {
Status CheckStream(Stream* stream) {
  if (stream != nullptr && dynamic_cast<CpuStream*>(stream) == nullptr) {
    return InvalidArgumentError("cpu: stream does not belong to a CpuDevice");
  }
  return OkStatus();
}
Status CheckEvent(Event* event) {
  if (event == nullptr) return InvalidArgumentError("cpu: null event");
  if (dynamic_cast<CpuEvent*>(event) == nullptr) {
    return InvalidArgumentError("cpu: event does not belong to a CpuDevice");
  }
  return OkStatus();
}
}  // namespace

Stream* CpuDevice::default_stream() { return default_stream_.get(); }

Result<std::unique_ptr<Stream>> CpuDevice::CreateStream() {
  return std::unique_ptr<Stream>(std::make_unique<CpuStream>());
}

Result<std::unique_ptr<Event>> CpuDevice::CreateEvent() {
  return std::unique_ptr<Event>(std::make_unique<CpuEvent>(false));
}

Result<std::unique_ptr<Event>> CpuDevice::CreateTimingEvent() {
  return std::unique_ptr<Event>(std::make_unique<CpuEvent>(true));
}

Status CpuDevice::RecordEvent(Event* event, Stream* stream) {
  ZERO_RETURN_IF_ERROR(CheckEvent(event));
  ZERO_RETURN_IF_ERROR(CheckStream(stream));
  static_cast<CpuEvent*>(event)->Record();
  return OkStatus();
}

Result<std::optional<double>> CpuDevice::ElapsedMilliseconds(Event* start, Event* end) {
  ZERO_RETURN_IF_ERROR(CheckEvent(start));
  ZERO_RETURN_IF_ERROR(CheckEvent(end));
  int64_t ns[2];
  for (int i = 0; i < 2; ++i) {
    auto* e = static_cast<CpuEvent*>(i == 0 ? start : end);
    const char* which = i == 0 ? "start" : "end";
    if (!e->timing()) {
      return InvalidArgumentError(std::string("cpu: ElapsedMilliseconds: the ") + which +
                                  " event is not a timing event (create it with CreateTimingEvent)");
    }
    ns[i] = e->recorded_ns();
    if (ns[i] == 0) {
      return FailedPreconditionError(std::string("cpu: ElapsedMilliseconds: the ") + which +
                                     " event was never recorded");
    }
  }
  return std::optional<double>(static_cast<double>(ns[1] - ns[0]) / 1e6);
}

Status CpuDevice::StreamWaitEvent(Stream* stream, Event* event) {
  ZERO_RETURN_IF_ERROR(CheckEvent(event));
  return CheckStream(stream);
}

Status CpuDevice::SynchronizeEvent(Event* event) { return CheckEvent(event); }

Status CpuDevice::SynchronizeStream(Stream* stream) { return CheckStream(stream); }

Status CpuDevice::Synchronize() { return OkStatus(); }

// --- copies ----------------------------------------------------------------------------------

Status CpuDevice::Copy(void* dst, const void* src, size_t bytes, CopyKind kind, Stream* stream) {
  ZERO_RETURN_IF_ERROR(CheckStream(stream));
  if (bytes == 0 || dst == src) return OkStatus();
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  bool overlap = d < s + bytes && s < d + bytes;
  if (overlap) {
    std::memmove(d, s, bytes);
    return OkStatus();
  }
  ParallelFor(bytes, num_threads_, [d, s](size_t b, size_t e) { std::memcpy(d + b, s + b, e - b); });
  return OkStatus();
}

// --- kernels ---------------------------------------------------------------------------------

Status CpuDevice::Fill(void* dst, DType t, size_t n, float value, Stream* stream) {
  ZERO_RETURN_IF_ERROR(CheckStream(stream));
  if (!ValidDType(t)) return InvalidArgumentError("cpu: Fill: bad dtype");
  if (n == 0) return OkStatus();
  Dispatch(t, [&](auto d) {
    using D = decltype(d);
    using T = typename D::T;
    T* p = static_cast<T*>(dst);
    const T v = D::Store(value);
    ParallelFor(n, num_threads_, [p, v](size_t b, size_t e) { std::fill(p + b, p + e, v); });
    return 0;
  });
  return OkStatus();
}

Status CpuDevice::Cast(const void* src, DType src_t, void* dst, DType dst_t, size_t n, Stream* stream) {
  ZERO_RETURN_IF_ERROR(CheckStream(stream));
  if (!ValidDType(src_t) || !ValidDType(dst_t)) return InvalidArgumentError("cpu: Cast: bad dtype");
  if (n == 0) return OkStatus();
  if (src_t == dst_t) {
    // A bit copy: NaN payloads (signaling ones too) pass through unchanged.
    return Copy(dst, src, n * SizeOf(src_t), CopyKind::kDeviceToDevice, stream);
  }
  Dispatch(src_t, [&](auto s) {
    using S = decltype(s);
    return Dispatch(dst_t, [&](auto d) {
      using D = decltype(d);
      const auto* in = static_cast<const typename S::T*>(src);
      auto* out = static_cast<typename D::T*>(dst);
      ParallelFor(n, num_threads_, [in, out](size_t b, size_t e) { CastRange<S, D>(in, out, b, e); });
      return 0;
    });
  });
  return OkStatus();
}

Status CpuDevice::Accumulate(float* acc, const void* src, DType src_t, size_t n, float scale, Stream* stream) {
  ZERO_RETURN_IF_ERROR(CheckStream(stream));
  if (!ValidDType(src_t)) return InvalidArgumentError("cpu: Accumulate: bad dtype");
  if (n == 0) return OkStatus();
  Dispatch(src_t, [&](auto s) {
    using S = decltype(s);
    const auto* in = static_cast<const typename S::T*>(src);
    ParallelFor(n, num_threads_, [acc, in, scale](size_t b, size_t e) { AccumulateRange<S>(acc, in, scale, b, e); });
    return 0;
  });
  return OkStatus();
}

Status CpuDevice::AccumulateFirst(float* acc, const void* src, DType src_t, size_t n, float scale, Stream* stream) {
  ZERO_RETURN_IF_ERROR(CheckStream(stream));
  if (!ValidDType(src_t)) return InvalidArgumentError("cpu: AccumulateFirst: bad dtype");
  if (n == 0) return OkStatus();
  Dispatch(src_t, [&](auto s) {
    using S = decltype(s);
    const auto* in = static_cast<const typename S::T*>(src);
    ParallelFor(n, num_threads_,
                [acc, in, scale](size_t b, size_t e) { AccumulateFirstRange<S>(acc, in, scale, b, e); });
    return 0;
  });
  return OkStatus();
}

Status CpuDevice::Scale(void* x, DType t, size_t n, float s, Stream* stream) {
  ZERO_RETURN_IF_ERROR(CheckStream(stream));
  if (!ValidDType(t)) return InvalidArgumentError("cpu: Scale: bad dtype");
  if (n == 0) return OkStatus();
  Dispatch(t, [&](auto d) {
    using D = decltype(d);
    auto* p = static_cast<typename D::T*>(x);
    ParallelFor(n, num_threads_, [p, s](size_t b, size_t e) { ScaleRange<D>(p, s, b, e); });
    return 0;
  });
  return OkStatus();
}

namespace {

constexpr size_t kSumBlock = kSumOfSquaresBlock;

// Sum of squares of n <= kSumBlock elements: lane i % 8, lanes combined as a fixed tree.
template <typename D>
double BlockSumOfSquares(const typename D::T* __restrict p, size_t n) {
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) {
      double v = D::Load(p[i + j]);
      lane[j] += v * v;
    }
  }
  for (; i < n; ++i) {
    double v = D::Load(p[i]);
    lane[i % 8] += v * v;
  }
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

// The block sums combined pairwise as a binary counter: level l holds the sum of the last 2^l
// complete blocks not yet merged upward; `block(k)` gives block k's sum.
template <typename BlockFn>
double CombineBlocks(size_t blocks, const BlockFn& block) {
  double level_sum[64];
  for (size_t k = 0; k < blocks; ++k) {
    double carry = block(k);
    int level = 0;
    for (size_t j = k; j & 1; j >>= 1, ++level) carry = level_sum[level] + carry;
    level_sum[level] = carry;
  }
  double total = 0.0;
  for (int level = 0; level < 64; ++level) {
    if ((blocks >> level) & 1) total = level_sum[level] + total;
  }
  return total;
}

}  // namespace

double BlockSumOfSquaresF32(const float* x, size_t n) { return BlockSumOfSquares<F32>(x, n); }

double CombineBlockSumsOfSquares(const double* block_sums, size_t blocks) {
  return CombineBlocks(blocks, [block_sums](size_t k) { return block_sums[k]; });
}

Status CpuDevice::SumOfSquares(const void* x, DType t, size_t n, double* out, Stream* stream) {
  ZERO_RETURN_IF_ERROR(CheckStream(stream));
  if (!ValidDType(t)) return InvalidArgumentError("cpu: SumOfSquares: bad dtype");
  // The fixed order documented in cpu_device.h; single-threaded on purpose (determinism).
  *out = Dispatch(t, [&](auto d) {
    using D = decltype(d);
    const auto* p = static_cast<const typename D::T*>(x);
    return CombineBlocks((n + kSumBlock - 1) / kSumBlock, [p, n](size_t k) {
      const size_t b = k * kSumBlock;
      return BlockSumOfSquares<D>(p + b, std::min(kSumBlock, n - b));
    });
  });
  return OkStatus();
}

Status CpuDevice::FiniteCheck(const void* x, DType t, size_t n, int32_t* flag, Stream* stream) {
  ZERO_RETURN_IF_ERROR(CheckStream(stream));
  if (!ValidDType(t)) return InvalidArgumentError("cpu: FiniteCheck: bad dtype");
  if (n == 0) return OkStatus();
  std::atomic<bool> found{false};
  Dispatch(t, [&](auto d) {
    using D = decltype(d);
    const auto* p = static_cast<const typename D::T*>(x);
    ParallelFor(n, num_threads_, [p, &found](size_t b, size_t e) {
      uint32_t bad = 0;
      for (size_t i = b; i < e; ++i) bad |= D::NonFinite(p[i]);
      if (bad) found.store(true, std::memory_order_relaxed);
    });
    return 0;
  });
  if (found.load()) *flag = 1;
  return OkStatus();
}

Status CpuDevice::AdamW(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, size_t n,
                        const AdamWParams& h, Stream* stream) {
  ZERO_RETURN_IF_ERROR(CheckStream(stream));
  if (n == 0) return OkStatus();
  const AdamWParams hp = h;
  ParallelFor(n, num_threads_, [=, &hp](size_t b, size_t e) {
    if (hp.adam_w_mode) {
      AdamWRange<true>(param, grad, exp_avg, exp_avg_sq, hp, b, e);
    } else {
      AdamWRange<false>(param, grad, exp_avg, exp_avg_sq, hp, b, e);
    }
  });
  return OkStatus();
}

Status CpuDevice::AdamWCast(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, size_t n,
                            const AdamWParams& h, void* model_out, DType model_t, Stream* stream) {
  ZERO_RETURN_IF_ERROR(CheckStream(stream));
  if (model_out == nullptr) return AdamW(param, grad, exp_avg, exp_avg_sq, n, h, stream);
  if (!ValidDType(model_t)) return InvalidArgumentError("cpu: AdamWCast: bad dtype");
  if (n == 0) return OkStatus();
  const AdamWParams hp = h;
  Dispatch(model_t, [&](auto d) {
    using D = decltype(d);
    auto* out = static_cast<typename D::T*>(model_out);
    ParallelFor(n, num_threads_, [=, &hp](size_t b, size_t e) {
      if (hp.adam_w_mode) {
        AdamWCastRange<true, D>(param, grad, exp_avg, exp_avg_sq, out, hp, b, e);
      } else {
        AdamWCastRange<false, D>(param, grad, exp_avg, exp_avg_sq, out, hp, b, e);
      }
    });
    return 0;
  });
  return OkStatus();
}

Status CpuDevice::AdamWFromGradient(float* param, const void* grad, DType grad_t, float* exp_avg, float* exp_avg_sq,
                                    size_t n, const AdamWParams& h, Stream* stream) {
  ZERO_RETURN_IF_ERROR(CheckStream(stream));
  if (!ValidDType(grad_t)) return InvalidArgumentError("cpu: AdamWFromGradient: bad dtype");
  if (n == 0) return OkStatus();
  const AdamWParams hp = h;
  Dispatch(grad_t, [&](auto s) {
    using S = decltype(s);
    const auto* g = static_cast<const typename S::T*>(grad);
    ParallelFor(n, num_threads_, [=, &hp](size_t b, size_t e) {
      if (hp.adam_w_mode) {
        AdamWFromGradientRange<true, S>(param, g, exp_avg, exp_avg_sq, hp, b, e);
      } else {
        AdamWFromGradientRange<false, S>(param, g, exp_avg, exp_avg_sq, hp, b, e);
      }
    });
    return 0;
  });
  return OkStatus();
}

}  // namespace zero
