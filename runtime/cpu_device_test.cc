#include "runtime/cpu_device.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/faulty_device.h"
#include "runtime/kernel_test_util.h"
#include "runtime/status.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

using testing::RandomBytes;
using testing::RandomFloats;
constexpr auto Diff = testing::FirstDifference;

constexpr DType kAllTypes[] = {DType::kF32, DType::kBF16, DType::kF16};
// Small, odd, and above kCpuParallelThreshold (so the threaded path runs).
const size_t kSizes[] = {0, 1, 7, 1000, 12345, 1024 * 11 + 5, kCpuParallelThreshold + 37};

std::string Where(DType t, size_t n) { return std::string(DTypeName(t)) + " n=" + std::to_string(n); }

// A device buffer holding `bytes`.
DeviceBuffer Upload(Device& dev, const std::vector<uint8_t>& bytes) {
  Result<DeviceBuffer> buf = dev.Allocate(bytes.size());
  EXPECT_OK(buf);
  if (!bytes.empty()) {
    EXPECT_OK(dev.Copy(buf->data(), bytes.data(), bytes.size(), CopyKind::kHostToDevice, nullptr));
  }
  return std::move(buf).value();
}

std::vector<uint8_t> Download(Device& dev, const DeviceBuffer& buf) {
  std::vector<uint8_t> out(buf.bytes());
  if (!out.empty()) {
    EXPECT_OK(dev.Copy(out.data(), buf.data(), out.size(), CopyKind::kDeviceToHost, nullptr));
  }
  EXPECT_OK(dev.Synchronize());
  return out;
}

class CpuKernelTest : public ::testing::TestWithParam<int> {
 protected:
  // Param: worker threads (1: single-threaded; 4: the threaded path for large n).
  CpuKernelTest() : dev_(CpuDeviceOptions{0, GetParam()}) {}
  CpuDevice dev_;
};

TEST_P(CpuKernelTest, Fill) {
  for (DType t : kAllTypes) {
    for (size_t n : kSizes) {
      for (float value : {0.0f, -0.0f, 0.1f, 1e6f, -INFINITY}) {
        std::vector<uint8_t> expect(n * SizeOf(t));
        testing::RefFill(expect.data(), t, n, value);
        DeviceBuffer buf = Upload(dev_, RandomBytes(t, n, 1, false));
        ASSERT_OK(dev_.Fill(buf.data(), t, n, value, nullptr));
        ASSERT_EQ(Diff(Download(dev_, buf), expect, SizeOf(t)), "") << Where(t, n) << " value " << value;
      }
    }
  }
}

TEST_P(CpuKernelTest, CastAllPairs) {
  for (DType st : kAllTypes) {
    for (DType dt : kAllTypes) {
      for (size_t n : kSizes) {
        std::vector<uint8_t> src = RandomBytes(st, n, 2 + n, true, 8.0f);
        std::vector<uint8_t> expect(n * SizeOf(dt));
        testing::RefCast(src.data(), st, expect.data(), dt, n);
        DeviceBuffer in = Upload(dev_, src);
        DeviceBuffer out = Upload(dev_, std::vector<uint8_t>(n * SizeOf(dt)));
        ASSERT_OK(dev_.Cast(in.data(), st, out.data(), dt, n, nullptr));
        ASSERT_EQ(Diff(Download(dev_, out), expect, SizeOf(dt)), "") << DTypeName(st) << "->" << Where(dt, n);
      }
    }
  }
}

// Every fp16 and bf16 pattern through Cast to fp32 and back: the backend's loops agree with
// dtype.h's conversions on all of them.
TEST_P(CpuKernelTest, CastEvery16BitPattern) {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  for (DType t : {DType::kBF16, DType::kF16}) {
    std::vector<float> f(65536);
    ASSERT_OK(dev_.Cast(all.data(), t, f.data(), DType::kF32, 65536, nullptr));
    for (uint32_t i = 0; i < 65536; ++i) {
      float expect = LoadAsFloat(all.data(), t, i);
      ASSERT_EQ(std::memcmp(&f[i], &expect, 4), 0) << DTypeName(t) << " pattern " << i;
    }
    std::vector<uint16_t> back(65536);
    ASSERT_OK(dev_.Cast(f.data(), DType::kF32, back.data(), t, 65536, nullptr));
    for (uint32_t i = 0; i < 65536; ++i) {
      uint16_t expect = t == DType::kBF16 ? FloatToBf16(f[i]) : FloatToHalf(f[i]);
      ASSERT_EQ(back[i], expect) << DTypeName(t) << " pattern " << i;
    }
  }
}

TEST_P(CpuKernelTest, Accumulate) {
  for (DType st : kAllTypes) {
    for (size_t n : kSizes) {
      for (float scale : {1.0f, 0.37f, -3.0f}) {
        std::vector<float> acc = RandomFloats(n, 3 + n);
        std::vector<uint8_t> src = RandomBytes(st, n, 4 + n, true);
        std::vector<float> expect = acc;
        testing::RefAccumulate(expect.data(), src.data(), st, n, scale);
        std::vector<uint8_t> acc_bytes(n * 4);
        std::memcpy(acc_bytes.data(), acc.data(), n * 4);
        DeviceBuffer a = Upload(dev_, acc_bytes);
        DeviceBuffer s = Upload(dev_, src);
        ASSERT_OK(dev_.Accumulate(a.as<float>(), s.data(), st, n, scale, nullptr));
        std::vector<uint8_t> got = Download(dev_, a);
        ASSERT_EQ(std::memcmp(got.data(), expect.data(), n * 4), 0) << Where(st, n) << " scale " << scale;
      }
    }
  }
}

// AccumulateFirst ignores what the accumulator held and gives the bits of Fill(0) + Accumulate
// (-0 -> +0, NaN canonical: not a Cast), for every source dtype and scale.
TEST_P(CpuKernelTest, AccumulateFirstEqualsFillAndAccumulate) {
  for (DType st : kAllTypes) {
    for (size_t n : kSizes) {
      for (float scale : {1.0f, 0.37f, -3.0f}) {
        std::vector<uint8_t> src = RandomBytes(st, n, 14 + n, true);
        if (n > 2) {
          StoreFromFloat(src.data(), st, 0, -0.0f);
          StoreFromFloat(src.data(), st, 1, NAN);
        }
        std::vector<float> expect(n, 0.0f);
        testing::RefAccumulate(expect.data(), src.data(), st, n, scale);
        // Stale contents (random, with NaN and Inf) must not matter.
        DeviceBuffer a = Upload(dev_, RandomBytes(DType::kF32, n, 15 + n, true));
        DeviceBuffer s = Upload(dev_, src);
        ASSERT_OK(dev_.AccumulateFirst(a.as<float>(), s.data(), st, n, scale, nullptr));
        std::vector<uint8_t> got = Download(dev_, a);
        ASSERT_EQ(std::memcmp(got.data(), expect.data(), n * 4), 0) << Where(st, n) << " scale " << scale;
        // The same through the device's own Fill + Accumulate.
        DeviceBuffer b = Upload(dev_, std::vector<uint8_t>(n * 4, 0x5a));
        ASSERT_OK(dev_.Fill(b.data(), DType::kF32, n, 0.0f, nullptr));
        ASSERT_OK(dev_.Accumulate(b.as<float>(), s.data(), st, n, scale, nullptr));
        ASSERT_EQ(Download(dev_, b), got) << Where(st, n) << " scale " << scale;
        if (n > 2 && scale == 1.0f) {
          float first;
          std::memcpy(&first, got.data(), 4);
          EXPECT_FALSE(std::signbit(first)) << "-0 must become +0";
        }
      }
    }
  }
}

TEST_P(CpuKernelTest, Scale) {
  for (DType t : kAllTypes) {
    for (size_t n : kSizes) {
      for (float s : {1.0f, 0.5f, 1.0f / 65536.0f, 300.0f}) {
        std::vector<uint8_t> x = RandomBytes(t, n, 5 + n, true);
        std::vector<uint8_t> expect = x;
        testing::RefScale(expect.data(), t, n, s);
        DeviceBuffer buf = Upload(dev_, x);
        ASSERT_OK(dev_.Scale(buf.data(), t, n, s, nullptr));
        ASSERT_EQ(Diff(Download(dev_, buf), expect, SizeOf(t)), "") << Where(t, n) << " s " << s;
      }
    }
  }
}

// The order documented in cpu_device.h: blocks of 1024 with 8 lanes each, block sums combined
// pairwise (written here as an explicit recursive pairing of equal power-of-two runs of blocks).
double DocumentedBlock(const void* x, DType t, size_t begin, size_t end) {
  double lane[8] = {};
  for (size_t i = begin; i < end; ++i) {
    double v = LoadAsFloat(x, t, i);
    lane[(i - begin) % 8] += v * v;
  }
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}
// Sum of blocks [first, first + count), count a power of two: (left half) + (right half).
double DocumentedRun(const std::vector<double>& blocks, size_t first, size_t count) {
  if (count == 1) return blocks[first];
  return DocumentedRun(blocks, first, count / 2) + DocumentedRun(blocks, first + count / 2, count / 2);
}
double DocumentedSumOfSquares(const void* x, DType t, size_t n) {
  std::vector<double> blocks;
  for (size_t b = 0; b < n; b += 1024) blocks.push_back(DocumentedBlock(x, t, b, std::min(n, b + 1024)));
  // The binary counter leaves one run per set bit of the block count, largest run first in the
  // input; they are added from the smallest (last) run up.
  double total = 0.0;
  size_t end = blocks.size();
  for (int level = 0; level < 64; ++level) {
    size_t run = size_t{1} << level;
    if ((blocks.size() >> level) & 1) {
      end -= run;
      total = DocumentedRun(blocks, end, run) + total;
    }
  }
  return total;
}

TEST_P(CpuKernelTest, SumOfSquares) {
  for (DType t : kAllTypes) {
    for (size_t n : kSizes) {
      std::vector<uint8_t> x = RandomBytes(t, n, 6 + n, false, 2.0f);
      DeviceBuffer buf = Upload(dev_, x);
      DeviceBuffer out = Upload(dev_, std::vector<uint8_t>(8, 0xff));
      ASSERT_OK(dev_.SumOfSquares(buf.data(), t, n, out.as<double>(), nullptr));
      double got = *out.as<double>();
      ASSERT_EQ(got, DocumentedSumOfSquares(x.data(), t, n)) << Where(t, n);
      double ref = testing::RefSumOfSquaresLongDouble(x.data(), t, n);
      if (n == 0) {
        ASSERT_EQ(got, 0.0);
      } else {
        ASSERT_LT(std::fabs(got - ref) / ref, 1e-12) << Where(t, n);
      }
    }
  }
}

TEST_P(CpuKernelTest, SumOfSquaresIgnoresAlignment) {
  // Same values at a different address (offset by one element) give the same bits.
  const size_t n = 100003;
  std::vector<uint8_t> x = RandomBytes(DType::kBF16, n + 1, 7, false);
  DeviceBuffer buf = Upload(dev_, x);
  DeviceBuffer shifted = Upload(dev_, std::vector<uint8_t>((n + 1) * 2));
  std::memcpy(shifted.as<uint16_t>() + 1, x.data(), n * 2);
  double a = 0, b = 0;
  ASSERT_OK(dev_.SumOfSquares(buf.data(), DType::kBF16, n, &a, nullptr));
  ASSERT_OK(dev_.SumOfSquares(shifted.as<uint16_t>() + 1, DType::kBF16, n, &b, nullptr));
  EXPECT_EQ(a, b);
}

TEST_P(CpuKernelTest, FiniteCheck) {
  for (DType t : kAllTypes) {
    for (size_t n : kSizes) {
      if (n == 0) continue;
      std::vector<uint8_t> x = RandomBytes(t, n, 8 + n, false, 1.0f);
      ASSERT_FALSE(testing::RefAnyNonFinite(x.data(), t, n));
      DeviceBuffer buf = Upload(dev_, x);
      int32_t flag = 0;
      ASSERT_OK(dev_.FiniteCheck(buf.data(), t, n, &flag, nullptr));
      EXPECT_EQ(flag, 0) << Where(t, n);
      flag = 1;  // never cleared by the kernel
      ASSERT_OK(dev_.FiniteCheck(buf.data(), t, n, &flag, nullptr));
      EXPECT_EQ(flag, 1) << Where(t, n);
      for (size_t at : {size_t{0}, n / 2, n - 1}) {
        for (float bad : {INFINITY, -INFINITY, NAN}) {
          std::vector<uint8_t> y = x;
          StoreFromFloat(y.data(), t, at, bad);
          DeviceBuffer b2 = Upload(dev_, y);
          flag = 0;
          ASSERT_OK(dev_.FiniteCheck(b2.data(), t, n, &flag, nullptr));
          EXPECT_EQ(flag, 1) << Where(t, n) << " at " << at << " " << bad;
        }
      }
    }
  }
}

TEST_P(CpuKernelTest, AdamWSeveralSteps) {
  for (size_t n : kSizes) {
    for (bool w_mode : {true, false}) {
      std::vector<float> p = RandomFloats(n, 9 + n, 1.0f);
      std::vector<float> m(n, 0.0f), v(n, 0.0f);
      std::vector<float> rp = p, rm = m, rv = v;
      Result<DeviceBuffer> dp = dev_.Allocate(n * 4), dg = dev_.Allocate(n * 4), dm = dev_.Allocate(n * 4),
                           dv = dev_.Allocate(n * 4);
      ASSERT_TRUE(dp.ok() && dg.ok() && dm.ok() && dv.ok());
      if (n > 0) {
        std::memcpy(dp->data(), p.data(), n * 4);
        std::memcpy(dm->data(), m.data(), n * 4);
        std::memcpy(dv->data(), v.data(), n * 4);
      }
      for (int step = 1; step <= 4; ++step) {
        std::vector<float> g = RandomFloats(n, 100 * step + n, 3.0f);
        AdamWParams h = testing::AdamWStep(step, w_mode, step == 3 ? 0.25f : 1.0f);
        testing::RefAdamW(rp.data(), g.data(), rm.data(), rv.data(), n, h);
        if (n > 0) std::memcpy(dg->data(), g.data(), n * 4);
        ASSERT_OK(dev_.AdamW(dp->as<float>(), dg->as<float>(), dm->as<float>(), dv->as<float>(), n, h, nullptr));
      }
      if (n == 0) continue;
      EXPECT_EQ(std::memcmp(dp->data(), rp.data(), n * 4), 0) << "param n=" << n << " w " << w_mode;
      EXPECT_EQ(std::memcmp(dm->data(), rm.data(), n * 4), 0) << "exp_avg n=" << n;
      EXPECT_EQ(std::memcmp(dv->data(), rv.data(), n * 4), 0) << "exp_avg_sq n=" << n;
    }
  }
}

// AdamWCast: the same param / exp_avg / exp_avg_sq bits as AdamW, and model_out equal to a Cast
// of the new weights, for every model dtype and both modes, over several steps (gradients with
// Inf, NaN and -0 salted in, so NaN results are checked too).
TEST_P(CpuKernelTest, AdamWCastEqualsAdamWThenCast) {
  for (DType mt : kAllTypes) {
    for (size_t n : kSizes) {
      for (bool w_mode : {true, false}) {
        std::vector<uint8_t> p0 = RandomBytes(DType::kF32, n, 19 + n, false, 1.0f);
        DeviceBuffer fp = Upload(dev_, p0), fm = Upload(dev_, std::vector<uint8_t>(n * 4, 0)),
                     fv = Upload(dev_, std::vector<uint8_t>(n * 4, 0));
        DeviceBuffer rp = Upload(dev_, p0), rm = Upload(dev_, std::vector<uint8_t>(n * 4, 0)),
                     rv = Upload(dev_, std::vector<uint8_t>(n * 4, 0));
        DeviceBuffer out = Upload(dev_, std::vector<uint8_t>(n * SizeOf(mt), 0x5a));
        DeviceBuffer ref_out = Upload(dev_, std::vector<uint8_t>(n * SizeOf(mt), 0));
        for (int step = 1; step <= 3; ++step) {
          DeviceBuffer g = Upload(dev_, RandomBytes(DType::kF32, n, 200 * step + n, step == 3, 3.0f));
          AdamWParams h = testing::AdamWStep(step, w_mode, step == 2 ? 0.25f : 1.0f);
          ASSERT_OK(dev_.AdamWCast(fp.as<float>(), g.as<float>(), fm.as<float>(), fv.as<float>(), n, h, out.data(), mt,
                                   nullptr));
          ASSERT_OK(dev_.AdamW(rp.as<float>(), g.as<float>(), rm.as<float>(), rv.as<float>(), n, h, nullptr));
          ASSERT_OK(dev_.Cast(rp.data(), DType::kF32, ref_out.data(), mt, n, nullptr));
          const std::string where = Where(mt, n) + " w " + std::to_string(w_mode) + " step " + std::to_string(step);
          ASSERT_EQ(Diff(Download(dev_, fp), Download(dev_, rp), 4), "") << "param " << where;
          ASSERT_EQ(Diff(Download(dev_, fm), Download(dev_, rm), 4), "") << "exp_avg " << where;
          ASSERT_EQ(Diff(Download(dev_, fv), Download(dev_, rv), 4), "") << "exp_avg_sq " << where;
          ASSERT_EQ(Diff(Download(dev_, out), Download(dev_, ref_out), SizeOf(mt)), "") << "model " << where;
        }
      }
    }
  }
  // A null model_out is AdamW alone.
  std::vector<float> p = {1.0f, -2.0f}, g = {0.5f, 0.25f}, m(2, 0.0f), v(2, 0.0f);
  std::vector<float> p2 = p, m2 = m, v2 = v;
  AdamWParams h = testing::AdamWStep(1, true, 1.0f);
  ASSERT_OK(dev_.AdamWCast(p.data(), g.data(), m.data(), v.data(), 2, h, nullptr, DType::kBF16, nullptr));
  ASSERT_OK(dev_.AdamW(p2.data(), g.data(), m2.data(), v2.data(), 2, h, nullptr));
  EXPECT_EQ(std::memcmp(p.data(), p2.data(), 8), 0);
  EXPECT_EQ(std::memcmp(m.data(), m2.data(), 8), 0);
}

// AdamWFromGradient: the same param / exp_avg / exp_avg_sq bits as AccumulateFirst into an fp32
// scratch followed by AdamW, for every gradient dtype and both modes, over several steps (gradients
// with Inf, NaN and -0 salted in: -0 must reach AdamW as +0, a NaN payload as the canonical NaN).
TEST_P(CpuKernelTest, AdamWFromGradientEqualsAccumulateFirstThenAdamW) {
  for (DType gt : kAllTypes) {
    for (size_t n : kSizes) {
      for (bool w_mode : {true, false}) {
        std::vector<uint8_t> p0 = RandomBytes(DType::kF32, n, 29 + n, false, 1.0f);
        DeviceBuffer fp = Upload(dev_, p0), fm = Upload(dev_, std::vector<uint8_t>(n * 4, 0)),
                     fv = Upload(dev_, std::vector<uint8_t>(n * 4, 0));
        DeviceBuffer rp = Upload(dev_, p0), rm = Upload(dev_, std::vector<uint8_t>(n * 4, 0)),
                     rv = Upload(dev_, std::vector<uint8_t>(n * 4, 0));
        DeviceBuffer scratch = Upload(dev_, std::vector<uint8_t>(n * 4, 0x5a));
        for (int step = 1; step <= 3; ++step) {
          DeviceBuffer g = Upload(dev_, RandomBytes(gt, n, 300 * step + n, step == 3, 3.0f));
          AdamWParams h = testing::AdamWStep(step, w_mode, step == 2 ? 0.25f : 1.0f);
          ASSERT_OK(
              dev_.AdamWFromGradient(fp.as<float>(), g.data(), gt, fm.as<float>(), fv.as<float>(), n, h, nullptr));
          ASSERT_OK(dev_.AccumulateFirst(scratch.as<float>(), g.data(), gt, n, 1.0f, nullptr));
          ASSERT_OK(dev_.AdamW(rp.as<float>(), scratch.as<float>(), rm.as<float>(), rv.as<float>(), n, h, nullptr));
          const std::string where = Where(gt, n) + " w " + std::to_string(w_mode) + " step " + std::to_string(step);
          ASSERT_EQ(Diff(Download(dev_, fp), Download(dev_, rp), 4), "") << "param " << where;
          ASSERT_EQ(Diff(Download(dev_, fm), Download(dev_, rm), 4), "") << "exp_avg " << where;
          ASSERT_EQ(Diff(Download(dev_, fv), Download(dev_, rv), 4), "") << "exp_avg_sq " << where;
        }
      }
    }
  }
  // A -0 gradient is a +0 one: exp_avg stays +0 (beta1 * +0 + (1 - beta1) * +0), not -0.
  for (DType gt : kAllTypes) {
    std::vector<uint8_t> neg_zero(SizeOf(gt), 0);
    neg_zero.back() = 0x80;
    float p = 1.0f, m = 0.0f, v = 0.0f;
    ASSERT_OK(dev_.AdamWFromGradient(&p, neg_zero.data(), gt, &m, &v, 1, testing::AdamWStep(1, true, 1.0f), nullptr));
    EXPECT_FALSE(std::signbit(m)) << DTypeName(gt);
  }
}

TEST_P(CpuKernelTest, CopyLargeAndOverlapping) {
  const size_t bytes = (size_t{3} << 20) + 5;
  std::vector<uint8_t> src = RandomBytes(DType::kF32, bytes / 4 + 1, 11, false);
  src.resize(bytes);
  DeviceBuffer a = Upload(dev_, src);
  DeviceBuffer b = Upload(dev_, std::vector<uint8_t>(bytes));
  ASSERT_OK(dev_.Copy(b.data(), a.data(), bytes, CopyKind::kDeviceToDevice, nullptr));
  EXPECT_EQ(Download(dev_, b), src);
  // Overlapping ranges behave like memmove.
  std::vector<uint8_t> expect = src;
  std::memmove(expect.data() + 1000, expect.data(), bytes - 1000);
  ASSERT_OK(dev_.Copy(a.as<uint8_t>() + 1000, a.data(), bytes - 1000, CopyKind::kDeviceToDevice, nullptr));
  EXPECT_EQ(Download(dev_, a), expect);
}

INSTANTIATE_TEST_SUITE_P(Threads, CpuKernelTest, ::testing::Values(1, 4));

TEST(CpuDeviceTest, NameAndKind) {
  CpuDevice dev;
  EXPECT_EQ(dev.kind(), DeviceKind::kCpu);
  EXPECT_EQ(dev.name(), "cpu");
  EXPECT_EQ(dev.ordinal(), 0);
}

TEST(CpuDeviceTest, MemoryStatsAndAlignment) {
  CpuDevice dev;
  EXPECT_EQ(dev.memory_stats().in_use, 0u);
  {
    Result<DeviceBuffer> a = dev.Allocate(1000);
    ASSERT_OK(a);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % 256, 0u);
    EXPECT_EQ(a->bytes(), 1000u);
    EXPECT_EQ(dev.memory_stats().in_use, 1000u);
    {
      Result<DeviceBuffer> b = dev.Allocate(3000);
      ASSERT_OK(b);
      EXPECT_EQ(dev.memory_stats().in_use, 4000u);
      EXPECT_EQ(dev.memory_stats().peak, 4000u);
    }
    EXPECT_EQ(dev.memory_stats().in_use, 1000u);
    EXPECT_EQ(dev.memory_stats().peak, 4000u);
    dev.ResetPeak();
    EXPECT_EQ(dev.memory_stats().peak, 1000u);
    // Pinned memory is page aligned and not counted as device memory.
    Result<PinnedBuffer> p = dev.AllocatePinned(10000);
    ASSERT_OK(p);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p->data()) % 4096, 0u);
    EXPECT_EQ(dev.memory_stats().in_use, 1000u);
    // Move keeps one owner.
    DeviceBuffer moved = std::move(a).value();
    EXPECT_EQ(dev.memory_stats().in_use, 1000u);
    moved.Reset();
    EXPECT_EQ(dev.memory_stats().in_use, 0u);
  }
  EXPECT_EQ(dev.memory_stats().in_use, 0u);
  Result<DeviceBuffer> empty = dev.Allocate(0);
  ASSERT_OK(empty);
  EXPECT_TRUE(empty->empty());
}

TEST(CpuDeviceTest, AllocationFailureNamesBytes) {
  CpuDevice dev(CpuDeviceOptions{1 << 20, 1});
  Result<DeviceBuffer> a = dev.Allocate(700000);
  ASSERT_OK(a);
  Result<DeviceBuffer> b = dev.Allocate(500000);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(b.status().message().find("500000 bytes"), std::string::npos) << b.status().ToString();
  EXPECT_NE(b.status().message().find("in use 700000 bytes"), std::string::npos) << b.status().ToString();
  EXPECT_EQ(dev.memory_stats().in_use, 700000u);

  // Without a limit, a request the host cannot satisfy fails the same way.
  CpuDevice unlimited;
  Result<DeviceBuffer> huge = unlimited.Allocate(size_t{1} << 62);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(huge.status().message().find(std::to_string(size_t{1} << 62)), std::string::npos);
  EXPECT_EQ(unlimited.memory_stats().in_use, 0u);
}

class ForeignStream : public Stream {};

TEST(CpuDeviceTest, StreamsAndEventsAreSynchronous) {
  CpuDevice dev;
  Result<std::unique_ptr<Stream>> s = dev.CreateStream();
  Result<std::unique_ptr<Event>> e = dev.CreateEvent();
  ASSERT_TRUE(s.ok() && e.ok());
  float x[4] = {1, 2, 3, 4};
  ASSERT_OK(dev.Scale(x, DType::kF32, 4, 2.0f, s->get()));
  EXPECT_EQ(x[3], 8.0f);  // done when the call returns
  EXPECT_OK(dev.RecordEvent(e->get(), s->get()));
  EXPECT_OK(dev.StreamWaitEvent(dev.default_stream(), e->get()));
  EXPECT_OK(dev.SynchronizeEvent(e->get()));
  EXPECT_OK(dev.SynchronizeStream(s->get()));
  EXPECT_OK(dev.Synchronize());
  ForeignStream foreign;
  Status st = dev.Fill(x, DType::kF32, 4, 0.0f, &foreign);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(x[0], 2.0f);
}

TEST(DeviceFactoryTest, Names) {
  Result<std::unique_ptr<Device>> cpu = CreateDevice("cpu");
  ASSERT_OK(cpu);
  EXPECT_EQ((*cpu)->kind(), DeviceKind::kCpu);
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "CPU", ""}) {
    Result<std::unique_ptr<Device>> d = CreateDevice(bad);
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  // Depending on the build and machine: a GPU, a build without CUDA, or no usable GPU.
  Result<std::unique_ptr<Device>> cuda = CreateDevice("cuda");
  if (cuda.ok()) {
    EXPECT_EQ((*cuda)->kind(), DeviceKind::kCuda);
  } else {
    const Status& st = cuda.status();
    EXPECT_TRUE(st.code() == StatusCode::kUnimplemented || st.code() == StatusCode::kUnavailable) << st.ToString();
    EXPECT_TRUE(st.message().find("no CUDA support") != std::string::npos ||
                st.message().find("cudaGetDeviceCount") != std::string::npos)
        << st.ToString();
    std::printf("CreateDevice(\"cuda\") here: %s\n", st.ToString().c_str());
  }
}

// --- FaultyDevice ----------------------------------------------------------------------------

TEST(FaultyDeviceTest, AllocationBudget) {
  CpuDevice inner;
  FaultyDevice dev(&inner);
  dev.SetAllocationBudget(10000);
  Result<DeviceBuffer> a = dev.Allocate(6000);
  ASSERT_OK(a);
  EXPECT_EQ(dev.memory_stats().in_use, 6000u);
  EXPECT_EQ(inner.memory_stats().in_use, 6000u);
  Result<DeviceBuffer> b = dev.Allocate(5000);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(b.status().message().find("5000 bytes"), std::string::npos) << b.status().ToString();
  Result<DeviceBuffer> c = dev.Allocate(4000);
  ASSERT_OK(c);
  a->Reset();
  EXPECT_EQ(dev.memory_stats().in_use, 4000u);
  EXPECT_EQ(inner.memory_stats().in_use, 4000u);
  Result<DeviceBuffer> d = dev.Allocate(5000);
  EXPECT_OK(d);
  dev.ClearFaults();
  Result<DeviceBuffer> e = dev.Allocate(1 << 20);
  EXPECT_OK(e);
  // The wrapped device's kernels run on the wrapper's buffers.
  ASSERT_OK(dev.Fill(e->data(), DType::kF32, 1000, 2.0f, nullptr));
  EXPECT_EQ(e->as<float>()[999], 2.0f);
  EXPECT_EQ(dev.kind(), DeviceKind::kCpu);
  EXPECT_EQ(dev.name(), "faulty(cpu)");
}

TEST(FaultyDeviceTest, NthCallOfNamedOp) {
  FaultyDevice dev(std::make_unique<CpuDevice>());
  dev.FailNthCall("Fill", 3);
  float x[8] = {};
  EXPECT_OK(dev.Fill(x, DType::kF32, 8, 1.0f, nullptr));
  EXPECT_OK(dev.Fill(x, DType::kF32, 8, 2.0f, nullptr));
  Status st = dev.Fill(x, DType::kF32, 8, 3.0f, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInternal);
  EXPECT_NE(st.message().find("Fill call 3"), std::string::npos) << st.ToString();
  EXPECT_EQ(x[0], 2.0f);  // the failed call did nothing
  EXPECT_OK(dev.Fill(x, DType::kF32, 8, 4.0f, nullptr));
  EXPECT_EQ(dev.call_count("Fill"), 4);
  EXPECT_EQ(dev.call_count("Scale"), 0);

  // Persistent, with a chosen error.
  dev.FailNthCall("AdamW", 2, /*persistent=*/true, UnavailableError("device lost"));
  AdamWParams h;
  float g[8] = {}, m[8] = {}, v[8] = {};
  EXPECT_OK(dev.AdamW(x, g, m, v, 8, h, nullptr));
  for (int i = 0; i < 3; ++i) {
    Status s = dev.AdamW(x, g, m, v, 8, h, nullptr);
    EXPECT_EQ(s.code(), StatusCode::kUnavailable);
    EXPECT_EQ(s.message(), "device lost");
  }

  // The fused kernels are ops of their own.
  dev.FailNthCall("AdamWCast", 1);
  uint16_t out[8] = {};
  EXPECT_EQ(dev.AdamWCast(x, g, m, v, 8, h, out, DType::kBF16, nullptr).code(), StatusCode::kInternal);
  EXPECT_OK(dev.AdamWCast(x, g, m, v, 8, h, out, DType::kBF16, nullptr));
  dev.FailNthCall("AccumulateFirst", 2);
  EXPECT_OK(dev.AccumulateFirst(m, g, DType::kF32, 8, 1.0f, nullptr));
  EXPECT_FALSE(dev.AccumulateFirst(m, g, DType::kF32, 8, 1.0f, nullptr).ok());
  EXPECT_EQ(dev.call_count("AccumulateFirst"), 2);

  // Allocate's injected failure is ResourceExhausted.
  dev.FailNthCall("Allocate", 1);
  Result<DeviceBuffer> a = dev.Allocate(64);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kResourceExhausted);
  EXPECT_OK(dev.Allocate(64));
  EXPECT_EQ(dev.memory_stats().in_use, 0u);  // the temporary above was freed
}

TEST(FaultyDeviceTest, PinnedAndStreamsPassThrough) {
  CpuDevice inner;
  {
    FaultyDevice dev(&inner);
    Result<PinnedBuffer> p = dev.AllocatePinned(8192);
    ASSERT_OK(p);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p->data()) % 4096, 0u);
    dev.FailNthCall("CreateStream", 1);
    EXPECT_FALSE(dev.CreateStream().ok());
    Result<std::unique_ptr<Stream>> s = dev.CreateStream();
    ASSERT_OK(s);
    Result<DeviceBuffer> held = dev.Allocate(100);
    ASSERT_OK(held);
    EXPECT_OK(dev.Synchronize());
    EXPECT_EQ(dev.call_count("CreateStream"), 2);
  }
  EXPECT_EQ(inner.memory_stats().in_use, 0u);
}

}  // namespace
}  // namespace zero
