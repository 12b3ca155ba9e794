#include "zero/host_state_kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "offload/cpu_adam.h"
#include "offload/thread_pool.h"
#include "runtime/cpu_device.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

// WidenedAdamW (bf16: widened in the AdamW kernel; fp16/fp32/none: fused per tile) against the two passes it replaces,
// WidenToF32 over the whole range then CpuAdamW: every state and the model copy bit for bit, for
// 16-bit and fp32 gradients, no gradient, sizes that are not a multiple of a tile or of the vector
// width, gradients holding -0 and NaN, with and without non-temporal model stores.
TEST(HostStateKernelsTest, WidenedAdamWEqualsWidenThenAdamW) {
  auto pool = ThreadPool::Create(3);
  ASSERT_OK(pool);
  CpuDevice cpu;
  AdamWParams h;
  h.lr = 0.01f;
  h.weight_decay = 0.1f;
  h.bias_correction1 = 0.19f;
  h.bias_correction2 = 0.002f;
  for (int64_t n : {int64_t{1}, int64_t{17}, int64_t{65536}, int64_t{65536 * 2 + 37}}) {
    for (DType gt : {DType::kBF16, DType::kF16, DType::kF32}) {
      for (bool null_grad : {false, true}) {
        for (bool stream : {false, true}) {
          SCOPED_TRACE("n " + std::to_string(n) + ", grad " + DTypeName(gt) + (null_grad ? ", no gradient" : "") +
                       (stream ? ", streaming stores" : ""));
          std::vector<float> g32(n), p(n), m(n), v(n);
          for (int64_t i = 0; i < n; ++i) {
            g32[i] = 0.01f * static_cast<float>((i * 7) % 29) - 0.1f;
            p[i] = 0.5f - 0.001f * static_cast<float>(i % 113);
            m[i] = 0.0001f * static_cast<float>(i % 17);
            v[i] = 0.00001f * static_cast<float>(i % 5);
          }
          g32[0] = -0.0f;
          if (n > 3) g32[3] = std::numeric_limits<float>::quiet_NaN();
          std::vector<uint8_t> g(static_cast<size_t>(n) * SizeOf(gt));
          ASSERT_OK(cpu.Cast(g32.data(), DType::kF32, g.data(), gt, static_cast<size_t>(n), nullptr));
          const void* grad = null_grad ? nullptr : g.data();
          std::vector<float> p1 = p, m1 = m, v1 = v, p2 = p, m2 = m, v2 = v, s1(n), s2(n, 7.0f);
          std::vector<uint16_t> o1(n, 1), o2(n, 2);
          WidenToF32(pool->get(), grad, gt, s1.data(), n);
          ASSERT_OK(CpuAdamW(p1.data(), s1.data(), m1.data(), v1.data(), static_cast<size_t>(n), h, o1.data(),
                             DType::kBF16, pool->get()));
          CpuAdamWOptions o;
          o.stream_model_out = stream;
          ASSERT_OK(WidenedAdamW(pool->get(), grad, gt, s2.data(), p2.data(), m2.data(), v2.data(), n, h, o2.data(),
                                 DType::kBF16, o));
          EXPECT_EQ(0, std::memcmp(p1.data(), p2.data(), n * 4)) << "master";
          EXPECT_EQ(0, std::memcmp(m1.data(), m2.data(), n * 4)) << "exp_avg";
          EXPECT_EQ(0, std::memcmp(v1.data(), v2.data(), n * 4)) << "exp_avg_sq";
          EXPECT_EQ(o1, o2) << "model copy";
        }
      }
    }
  }
}

// SumsOfSquaresF32 (block sums on the pool's threads) against CpuDevice::SumOfSquares (one thread)
// bit for bit: empty, sub-block, block-boundary and multi-task spans (4096 blocks a task), values of
// wildly different magnitudes so a changed combining order would show in the low bits, at 1 and 5
// threads. The control: summing the blocks in plain order differs in the last bits for the long span.
TEST(HostStateKernelsTest, SumsOfSquaresSpreadOverThreadsEqualTheDevicesOrder) {
  const std::vector<int64_t> sizes = {0, 1, 1023, 1024, 1025, 8 * 1024 + 3, 4096 * 1024, 4096 * 1024 * 2 + 4097};
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  std::vector<float> x(static_cast<size_t>(total));
  uint64_t r = 88172645463325252ull;
  for (float& v : x) {
    r ^= r << 13;
    r ^= r >> 7;
    r ^= r << 17;
    v = std::ldexp(static_cast<float>(r % 2000001) / 1e6f - 1.0f, static_cast<int>(r % 41) - 20);
  }
  CpuDevice cpu;
  std::vector<F32Span> spans;
  std::vector<double> want;
  int64_t at = 0;
  for (int64_t n : sizes) {
    spans.push_back({x.data() + at, n});
    double w = -1.0;
    ASSERT_OK(cpu.SumOfSquares(x.data() + at, DType::kF32, static_cast<size_t>(n), &w, nullptr));
    want.push_back(w);
    at += n;
  }
  for (int threads : {1, 5}) {
    auto pool = ThreadPool::Create(threads);
    ASSERT_OK(pool);
    std::vector<double> got(spans.size(), -1.0);
    SumsOfSquaresF32(pool->get(), spans, got.data());
    for (size_t i = 0; i < spans.size(); ++i) {
      EXPECT_EQ(std::memcmp(&got[i], &want[i], sizeof(double)), 0)
          << "span of " << sizes[i] << " at " << threads << " threads: " << got[i] << " vs " << want[i];
    }
  }
  const F32Span& longest = spans.back();
  double plain = 0.0;
  for (int64_t b = 0; b < longest.n; b += 1024) {
    plain += BlockSumOfSquaresF32(longest.data + b, static_cast<size_t>(std::min<int64_t>(1024, longest.n - b)));
  }
  EXPECT_NE(plain, want.back()) << "the test's values do not tell the combining orders apart";
}

TEST(HostStateKernelsTest, WidenedAdamWReportsABadModelDtype) {
  auto pool = ThreadPool::Create(2);
  ASSERT_OK(pool);
  std::vector<float> p(100), m(100), v(100), s(100);
  std::vector<uint16_t> g(100), out(100);
  Status st = WidenedAdamW(pool->get(), g.data(), DType::kBF16, s.data(), p.data(), m.data(), v.data(), 100,
                           AdamWParams(), out.data(), static_cast<DType>(99));
  EXPECT_FALSE(st.ok());
}

}  // namespace
}  // namespace zero
