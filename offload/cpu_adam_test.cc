// CpuAdamW against the reference arithmetic: every path this CPU has (AVX-512, AVX2, scalar) vs a
// loop over AdamWReference and vs CpuDevice::AdamWCast, bit for bit, on sizes that are not
// multiples of the vector width, every output dtype, both weight-decay modes, NaN/Inf/subnormal
// inputs and several thread counts and tile sizes.
#include "offload/cpu_adam.h"

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "offload/thread_pool.h"
#include "runtime/cpu_device.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

constexpr CpuAdamPath kSimdPaths[] = {CpuAdamPath::kAvx512, CpuAdamPath::kAvx2};

std::vector<CpuAdamPath> AvailablePaths() {
  std::vector<CpuAdamPath> paths;
  for (CpuAdamPath p : {CpuAdamPath::kScalar, CpuAdamPath::kAvx2, CpuAdamPath::kAvx512}) {
    if (CpuAdamPathAvailable(p)) paths.push_back(p);
  }
  return paths;
}

struct State {
  std::vector<float> p, g, m, v;
};

// Values of very different magnitudes; with `specials`, about one element in 12 of each array is
// replaced by NaN (several payloads and signs, signaling too), +-Inf, +-0, subnormals or extremes.
State MakeState(size_t n, uint32_t seed, bool specials) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exp(-30, 12);
  auto wide = [&] { return std::ldexp(unit(rng), exp(rng)); };
  const uint32_t kSpecial[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xffffffffu, 0x7fa5a5a5u, 0x7f800000u,
                               0xff800000u, 0x00000000u, 0x80000000u, 0x00000001u, 0x80400000u, 0x007fffffu,
                               0x7f7fffffu, 0xff7fffffu, 0x00800000u, 0x71000000u};
  std::uniform_int_distribution<int> pick(0, 11 * 16 + 15);
  auto maybe_special = [&](float x) {
    if (!specials) return x;
    int k = pick(rng);
    return k < 16 ? BitsToFloat(kSpecial[k]) : x;
  };
  State s;
  s.p.resize(n);
  s.g.resize(n);
  s.m.resize(n);
  s.v.resize(n);
  for (size_t i = 0; i < n; ++i) {
    s.p[i] = maybe_special(unit(rng) * 2.0f);
    s.g[i] = maybe_special(wide());
    s.m[i] = maybe_special(wide() * 0.1f);
    float r = wide();
    s.v[i] = maybe_special(r * r);
  }
  return s;
}

AdamWParams DeepSpeedLike() {
  AdamWParams h;
  h.lr = 3e-4f;
  h.beta1 = 0.9f;
  h.beta2 = 0.95f;
  h.eps = 1e-8f;
  h.weight_decay = 0.1f;
  h.bias_correction1 = 1.0f - 0.9f * 0.9f * 0.9f;
  h.bias_correction2 = 1.0f - 0.95f * 0.95f * 0.95f;
  h.grad_scale = 1.0f / (1024.0f * 4.0f);
  h.adam_w_mode = true;
  return h;
}

AdamWParams ClassicAdam() {
  AdamWParams h = DeepSpeedLike();
  h.lr = 0.25f;
  h.weight_decay = 0.03f;
  h.beta2 = 0.999f;
  h.bias_correction1 = 0.1f;
  h.bias_correction2 = 0.001f;
  h.grad_scale = 0.7f;
  h.adam_w_mode = false;
  return h;
}

struct Output {
  bool present;
  DType t;
  const char* name;
};
constexpr Output kOutputs[] = {{false, DType::kF32, "none"},
                               {true, DType::kF32, "fp32"},
                               {true, DType::kBF16, "bf16"},
                               {true, DType::kF16, "fp16"}};

struct Result4 {
  State s;
  std::vector<uint8_t> out;  // n * SizeOf(t) bytes, or empty
};

// The reference written out: AdamWReference per element, NaN results canonical, the 16-bit copy
// by dtype.h's conversion of the stored weight (device.h's contract for AdamWCast).
Result4 LoopReference(const State& in, const AdamWParams& h, const Output& o) {
  Result4 r{in, {}};
  const size_t n = in.p.size();
  if (o.present) r.out.assign(n * SizeOf(o.t), 0);
  auto canon = [](float x) { return x != x ? BitsToFloat(0x7fffffffu) : x; };
  for (size_t i = 0; i < n; ++i) {
    AdamWReference(&r.s.p[i], r.s.g[i], &r.s.m[i], &r.s.v[i], h);
    r.s.p[i] = canon(r.s.p[i]);
    r.s.m[i] = canon(r.s.m[i]);
    r.s.v[i] = canon(r.s.v[i]);
    if (o.present) StoreFromFloat(r.out.data(), o.t, i, r.s.p[i]);
  }
  return r;
}

Result4 DeviceReference(const State& in, const AdamWParams& h, const Output& o) {
  Result4 r{in, {}};
  const size_t n = in.p.size();
  if (o.present) r.out.assign(n * SizeOf(o.t), 0xee);
  CpuDevice device;
  Status st = device.AdamWCast(r.s.p.data(), r.s.g.data(), r.s.m.data(), r.s.v.data(), n, h,
                               o.present ? r.out.data() : nullptr, o.t, nullptr);
  EXPECT_OK(st);
  return r;
}

// stream: non-temporal stores of model_out, into a 64-byte aligned buffer (they are used only
// for one).
// g16 non-null: CpuAdamWBf16Grad from those bf16 gradients instead of in.g.
Result4 RunCpuAdamW(const State& in, const AdamWParams& h, const Output& o, CpuAdamPath path, ThreadPool* pool,
                    size_t tile = kCpuAdamTileElements, bool stream = false,
                    const std::vector<uint16_t>* g16 = nullptr) {
  Result4 r{in, {}};
  const size_t n = in.p.size();
  const size_t bytes = o.present ? n * SizeOf(o.t) : 0;
  std::unique_ptr<uint8_t, decltype(&std::free)> aligned(
      static_cast<uint8_t*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64)), &std::free);
  std::memset(aligned.get(), 0xee, bytes);
  CpuAdamWOptions options;
  options.path = path;
  options.tile_elements = tile;
  options.stream_model_out = stream;
  void* out = o.present ? aligned.get() : nullptr;
  Status st =
      g16 != nullptr
          ? CpuAdamWBf16Grad(r.s.p.data(), g16->data(), r.s.m.data(), r.s.v.data(), n, h, out, o.t, pool, options)
          : CpuAdamW(r.s.p.data(), r.s.g.data(), r.s.m.data(), r.s.v.data(), n, h, out, o.t, pool, options);
  EXPECT_OK(st);
  r.out.assign(aligned.get(), aligned.get() + bytes);
  return r;
}

std::string Hex(uint32_t x) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", x);
  return buf;
}

// Empty if `got` equals `want` bit for bit; else the first differing element of each array,
// with the inputs that produced it.
std::string Diff(const State& in, const Result4& got, const Result4& want, const Output& o) {
  const size_t n = in.p.size();
  auto inputs = [&](size_t i) {
    return " (inputs p=" + Hex(FloatBits(in.p[i])) + " g=" + Hex(FloatBits(in.g[i])) + " m=" + Hex(FloatBits(in.m[i])) +
           " v=" + Hex(FloatBits(in.v[i])) + ")";
  };
  const std::pair<const char*, const std::vector<float>*> arrays[][2] = {
      {{"param", &got.s.p}, {"param", &want.s.p}},
      {{"exp_avg", &got.s.m}, {"exp_avg", &want.s.m}},
      {{"exp_avg_sq", &got.s.v}, {"exp_avg_sq", &want.s.v}}};
  for (const auto& a : arrays) {
    for (size_t i = 0; i < n; ++i) {
      uint32_t x = FloatBits((*a[0].second)[i]), y = FloatBits((*a[1].second)[i]);
      if (x != y) {
        return std::string(a[0].first) + "[" + std::to_string(i) + "] = " + Hex(x) + ", expected " + Hex(y) + inputs(i);
      }
    }
  }
  if (got.out.size() != want.out.size()) return "model_out sizes differ";
  const size_t es = o.present ? SizeOf(o.t) : 1;
  for (size_t i = 0; i < got.out.size(); i += es) {
    if (std::memcmp(&got.out[i], &want.out[i], es) != 0) {
      uint32_t x = 0, y = 0;
      std::memcpy(&x, &got.out[i], es);
      std::memcpy(&y, &want.out[i], es);
      return std::string("model_out (") + o.name + ")[" + std::to_string(i / es) + "] = " + Hex(x) + ", expected " +
             Hex(y) + inputs(i / es);
    }
  }
  return "";
}

std::unique_ptr<ThreadPool> Pool(int threads) {
  auto pool = ThreadPool::Create(threads);
  EXPECT_OK(pool);
  return std::move(*pool);
}

TEST(CpuAdamTest, ReportsPathsOfThisMachine) {
  std::string paths;
  for (CpuAdamPath p : AvailablePaths()) paths += std::string(" ") + CpuAdamPathName(p);
  std::cout << "CpuAdamW paths on this machine:" << paths << "; auto = " << CpuAdamPathName(BestCpuAdamPath()) << "\n";
  EXPECT_TRUE(CpuAdamPathAvailable(CpuAdamPath::kScalar));
  EXPECT_TRUE(CpuAdamPathAvailable(CpuAdamPath::kAuto));
  EXPECT_NE(BestCpuAdamPath(), CpuAdamPath::kAuto);
  EXPECT_TRUE(CpuAdamPathAvailable(BestCpuAdamPath()));
  for (CpuAdamPath p : {CpuAdamPath::kAuto, CpuAdamPath::kScalar, CpuAdamPath::kAvx2, CpuAdamPath::kAvx512}) {
    CpuAdamPath parsed = CpuAdamPath::kAuto;
    ASSERT_TRUE(ParseCpuAdamPath(CpuAdamPathName(p), &parsed));
    EXPECT_EQ(parsed, p);
  }
  CpuAdamPath untouched = CpuAdamPath::kAvx2;
  EXPECT_FALSE(ParseCpuAdamPath("sse", &untouched));
  EXPECT_EQ(untouched, CpuAdamPath::kAvx2);
}

// A path the CPU lacks is an error and writes nothing. Here the lack is simulated with the test
// ceiling, so the check runs on every machine; a real one is reported the same way.
TEST(CpuAdamTest, UnavailablePathIsReportedNotRun) {
  for (CpuAdamPath ceiling : {CpuAdamPath::kScalar, CpuAdamPath::kAvx2}) {
    SetCpuAdamPathCeilingForTesting(ceiling);
    for (CpuAdamPath p : kSimdPaths) {
      if (static_cast<int>(p) <= static_cast<int>(ceiling)) continue;
      EXPECT_FALSE(CpuAdamPathAvailable(p)) << CpuAdamPathName(p);
      State s = MakeState(40, 1, false);
      const State before = s;
      CpuAdamWOptions options;
      options.path = p;
      Status st = CpuAdamW(s.p.data(), s.g.data(), s.m.data(), s.v.data(), s.p.size(), DeepSpeedLike(), nullptr,
                           DType::kF32, nullptr, options);
      EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
      EXPECT_NE(st.message().find(std::string("'") + CpuAdamPathName(p) + "'"), std::string::npos) << st.ToString();
      EXPECT_EQ(std::memcmp(s.p.data(), before.p.data(), 40 * sizeof(float)), 0);
    }
    EXPECT_NE(BestCpuAdamPath(), CpuAdamPath::kAvx512);
    // Auto falls back to what is left and still matches the reference.
    const State in = MakeState(100, 9, true);
    const Output o = kOutputs[2];
    const Result4 want = DeviceReference(in, DeepSpeedLike(), o);
    const Result4 got = RunCpuAdamW(in, DeepSpeedLike(), o, CpuAdamPath::kAuto, nullptr);
    EXPECT_EQ(Diff(in, got, want, o), "") << "ceiling " << CpuAdamPathName(ceiling);
  }
  SetCpuAdamPathCeilingForTesting(CpuAdamPath::kAuto);
  __builtin_cpu_init();
  EXPECT_EQ(CpuAdamPathAvailable(CpuAdamPath::kAvx512), __builtin_cpu_supports("avx512f") != 0);
}

TEST(CpuAdamTest, BadArgumentsAreErrors) {
  State s = MakeState(8, 2, false);
  AdamWParams h = DeepSpeedLike();
  Status st = CpuAdamW(s.p.data(), nullptr, s.m.data(), s.v.data(), 8, h, nullptr, DType::kF32, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("grad"), std::string::npos) << st.ToString();
  uint16_t out[8];
  st = CpuAdamW(s.p.data(), s.g.data(), s.m.data(), s.v.data(), 8, h, out, static_cast<DType>(7), nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("model_t"), std::string::npos) << st.ToString();
  // n == 0 accepts null arrays and does nothing.
  EXPECT_OK(CpuAdamW(nullptr, nullptr, nullptr, nullptr, 0, h, nullptr, DType::kBF16, nullptr));
}

// Every path, size, output and mode vs both references, on one thread and on a pool.
TEST(CpuAdamTest, EveryPathIsBitwiseTheReference) {
  auto pool3 = Pool(3);
  const size_t sizes[] = {0, 1, 7, 15, 16, 17, 31, 33, 1000, 1000003};
  int cases = 0;
  for (size_t n : sizes) {
    for (bool specials : {false, true}) {
      const State in = MakeState(n, static_cast<uint32_t>(n * 2 + specials), specials);
      for (const AdamWParams& h : {DeepSpeedLike(), ClassicAdam()}) {
        for (const Output& o : kOutputs) {
          const Result4 loop = LoopReference(in, h, o);
          const Result4 dev = DeviceReference(in, h, o);
          SCOPED_TRACE("n=" + std::to_string(n) + " specials=" + std::to_string(specials) +
                       " adam_w_mode=" + std::to_string(h.adam_w_mode) + " out=" + o.name);
          ASSERT_EQ(Diff(in, dev, loop, o), "") << "CpuDevice vs the loop reference";
          for (CpuAdamPath path : AvailablePaths()) {
            for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), pool3.get()}) {
              for (bool stream : {false, true}) {
                // A small tile on the pool, so 1000 and 1000003 elements are many tiles.
                const size_t tile = pool == nullptr ? kCpuAdamTileElements : 192;
                const Result4 got = RunCpuAdamW(in, h, o, path, pool, tile, stream);
                ASSERT_EQ(Diff(in, got, dev, o), "")
                    << "path " << CpuAdamPathName(path) << (pool ? ", 3 threads" : ", 1 thread")
                    << (stream ? ", non-temporal stores" : "");
                ++cases;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 10 * 2 * 2 * 4 * 2 * 2 * static_cast<int>(AvailablePaths().size()));
}

// CpuAdamWBf16Grad: the gradients in bf16 (every special of MakeState rounded to bf16: NaNs of
// several payloads, +-Inf, +-0, subnormals), widened inside the kernel, on every path, threads,
// tiles and stores: bitwise CpuDevice's widening (AccumulateFirst, 0.0f + g) into fp32 followed
// by CpuDevice::AdamWCast.
TEST(CpuAdamTest, Bf16GradientsEveryPathIsBitwiseWidenThenTheReference) {
  auto pool3 = Pool(3);
  CpuDevice device;
  int cases = 0;
  for (size_t n : {size_t{1}, size_t{7}, size_t{15}, size_t{16}, size_t{17}, size_t{33}, size_t{1000003}}) {
    for (bool specials : {false, true}) {
      State in = MakeState(n, static_cast<uint32_t>(n * 3 + specials), specials);
      std::vector<uint16_t> g16(n);
      ASSERT_OK(device.Cast(in.g.data(), DType::kF32, g16.data(), DType::kBF16, n, nullptr));
      // The reference's input: the bf16 gradients widened as the engine widens them.
      ASSERT_OK(device.AccumulateFirst(in.g.data(), g16.data(), DType::kBF16, n, 1.0f, nullptr));
      for (const AdamWParams& h : {DeepSpeedLike(), ClassicAdam()}) {
        for (const Output& o : kOutputs) {
          const Result4 want = DeviceReference(in, h, o);
          for (CpuAdamPath path : AvailablePaths()) {
            for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), pool3.get()}) {
              for (bool stream : {false, true}) {
                SCOPED_TRACE("n=" + std::to_string(n) + " specials=" + std::to_string(specials) + " adam_w_mode=" +
                             std::to_string(h.adam_w_mode) + " out=" + o.name + " path " + CpuAdamPathName(path) +
                             (pool ? ", 3 threads" : ", 1 thread") + (stream ? ", non-temporal stores" : ""));
                const Result4 got =
                    RunCpuAdamW(in, h, o, path, pool, pool == nullptr ? kCpuAdamTileElements : 192, stream, &g16);
                ASSERT_EQ(Diff(in, got, want, o), "");
                ++cases;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 7 * 2 * 2 * 4 * 2 * 2 * static_cast<int>(AvailablePaths().size()));
}

// Results do not depend on the thread count or the tile size.
TEST(CpuAdamTest, IndependentOfThreadsAndTiles) {
  const size_t n = 1000003;
  const State in = MakeState(n, 77, true);
  const Output bf16 = kOutputs[2];
  const AdamWParams h = DeepSpeedLike();
  const Result4 want = DeviceReference(in, h, bf16);
  for (int threads : {1, 2, 5, 8}) {
    auto pool = Pool(threads);
    for (size_t tile : {size_t{1}, size_t{1000}, kCpuAdamTileElements, size_t{1} << 22}) {
      for (CpuAdamPath path : AvailablePaths()) {
        const Result4 got = RunCpuAdamW(in, h, bf16, path, pool.get(), tile, tile > 1000);
        ASSERT_EQ(Diff(in, got, want, bf16), "")
            << "path " << CpuAdamPathName(path) << ", " << threads << " threads, tile " << tile;
      }
    }
  }
}

// The 16-bit copy on a sweep of bit patterns: lr = 0 and zero g/m/v leave a finite nonzero weight
// unchanged, so model_out must be dtype.h's conversion of the input, ties and fp16 subnormals
// included (the SIMD paths convert with integer rounding / vcvtps2ph, not dtype.h's code).
TEST(CpuAdamTest, SixteenBitCopyRoundsLikeDtype) {
  std::vector<float> p;
  const uint32_t lows[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x2fff,
                           0x3000, 0x3001, 0x7fff, 0x8000, 0x8001, 0xffff};
  for (uint32_t hi = 0; hi < 0x10000; ++hi) {
    for (uint32_t lo : lows) p.push_back(BitsToFloat(hi << 16 | lo));
  }
  // Every 61st pattern of the range that rounds to fp16 subnormals (and the smallest normals).
  for (uint32_t abs = 0x32f00000u; abs < 0x38900000u; abs += 61) {
    p.push_back(BitsToFloat(abs));
    p.push_back(BitsToFloat(abs | 0x80000000u));
  }
  const size_t n = p.size();
  State in{p, std::vector<float>(n, 0.0f), std::vector<float>(n, 0.0f), std::vector<float>(n, 0.0f)};
  AdamWParams h = DeepSpeedLike();
  h.lr = 0.0f;
  auto pool = Pool(2);
  for (const Output& o : {kOutputs[2], kOutputs[3]}) {
    const Result4 want = DeviceReference(in, h, o);
    size_t checked = 0;
    for (size_t i = 0; i < n; ++i) {
      const float x = p[i];
      if (x != x || x == 0.0f || std::isinf(x)) continue;
      uint16_t expect = o.t == DType::kBF16 ? FloatToBf16(x) : FloatToHalf(x);
      uint16_t ref;
      std::memcpy(&ref, &want.out[2 * i], 2);
      ASSERT_EQ(ref, expect) << "reference does not keep p[" << i << "] = " << Hex(FloatBits(x));
      ++checked;
    }
    EXPECT_GT(checked, n / 2);
    for (CpuAdamPath path : AvailablePaths()) {
      for (bool stream : {false, true}) {
        const Result4 got = RunCpuAdamW(in, h, o, path, pool.get(), kCpuAdamTileElements, stream);
        ASSERT_EQ(Diff(in, got, want, o), "")
            << "path " << CpuAdamPathName(path) << (stream ? ", non-temporal stores" : "");
      }
    }
  }
}

// Auto runs the best path and agrees with the reference.
TEST(CpuAdamTest, AutoPath) {
  const State in = MakeState(4099, 5, true);
  const Output o = kOutputs[3];
  const Result4 want = DeviceReference(in, ClassicAdam(), o);
  const Result4 got = RunCpuAdamW(in, ClassicAdam(), o, CpuAdamPath::kAuto, nullptr);
  EXPECT_EQ(Diff(in, got, want, o), "");
}

}  // namespace
}  // namespace zero
