// The CUDA model's kernels (kernels.cuh) and cuDNN attention (attention_cudnn.h) against CPU
// references on the same inputs; part of the cuda_model_test binary (cuda_model_test.cc tests the
// whole model).
//
// Kernels: each against a plain CPU loop (double accumulation) over the same random inputs, with
// 16-bit inputs rounded on the host first so both sides read identical values. Bounds are relative
// L2 errors (||gpu - ref|| / ||ref||):
// - fp32: 1e-5 (kernels) / 5e-5 (attention backward): both round every operation to fp32 but sum
//   in different orders (and the GPU fuses multiply-adds); such differences are ~1e-7 per value.
// - bf16 outputs: 1e-2: rounding an output to bf16 alone costs up to 2^-9 relative per value
//   (~2e-3 in L2); the attention backward also reads its bf16-rounded forward output.
// Observed on the H200: fp32 <= 7.6e-7, bf16 <= 4.6e-3.
// The printed lines give the observed errors, so the bounds can be judged against them.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/llama/attention_cudnn.h"
#include "models/llama/batch.h"
#include "models/llama/cpu_model.h"
#include "models/llama/cuda_test_util.h"
#include "models/llama/kernels.cuh"
#include "runtime/cuda_device.h"
#include "runtime/dtype.h"
#include "runtime/gpu_test_util.h"
#include "runtime/status.h"
#include "testing/status_matchers.h"

namespace zero::llm {
namespace {

using cuda_test::Next;
using cuda_test::RandomNormal;
using cuda_test::RelL2;
using cuda_test::Rounded;

// ---- Helpers. ---------------------------------------------------------------------------------

// One device buffer of `n` elements of `dtype`.
class DeviceArray {
 public:
  DeviceArray(int64_t n, DType dtype) : n_(n), dtype_(dtype) {
    EXPECT_EQ(cudaMalloc(&p_, std::max<int64_t>(n, 1) * SizeOf(dtype)), cudaSuccess);
    EXPECT_EQ(cudaMemset(p_, 0, std::max<int64_t>(n, 1) * SizeOf(dtype)), cudaSuccess);
  }
  DeviceArray(const std::vector<float>& v, DType dtype) : DeviceArray(static_cast<int64_t>(v.size()), dtype) {
    Upload(v);
  }
  ~DeviceArray() { cudaFree(p_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  void Upload(const std::vector<float>& v) {
    std::vector<uint8_t> host(n_ * SizeOf(dtype_));
    for (int64_t i = 0; i < n_; ++i) StoreFromFloat(host.data(), dtype_, i, v[i]);
    EXPECT_EQ(cudaMemcpy(p_, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<float> Download() const {
    std::vector<uint8_t> host(n_ * SizeOf(dtype_));
    EXPECT_EQ(cudaMemcpy(host.data(), p_, host.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    std::vector<float> v(n_);
    for (int64_t i = 0; i < n_; ++i) v[i] = LoadAsFloat(host.data(), dtype_, i);
    return v;
  }
  void* get() const { return p_; }
  float* f() const { return static_cast<float*>(p_); }
  DType dtype() const { return dtype_; }

 private:
  int64_t n_;
  DType dtype_;
  void* p_ = nullptr;
};

class DeviceInts {
 public:
  explicit DeviceInts(const std::vector<int32_t>& v) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p_), std::max<size_t>(v.size(), 1) * 4), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p_, v.data(), v.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceInts() { cudaFree(p_); }
  DeviceInts(const DeviceInts&) = delete;
  DeviceInts& operator=(const DeviceInts&) = delete;
  const int32_t* get() const { return p_; }

 private:
  int32_t* p_ = nullptr;
};

void Sync() { ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess); }

// ---- Kernel tests. ----------------------------------------------------------------------------

class LlmKernelTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { ZERO_SKIP_WITHOUT_CUDA_DEVICES(1); }
  DType t() const { return GetParam(); }
  // The bound for outputs stored in t().
  double Bound() const { return t() == DType::kF32 ? 1e-5 : 1e-2; }
};

INSTANTIATE_TEST_SUITE_P(Dtypes, LlmKernelTest, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

TEST_P(LlmKernelTest, RmsNormForwardBackwardAndWeightGradient) {
  // Widths that are not multiples of the warp; rows past one column-reduction chunk (256).
  const int64_t rows = 600;
  const int cols = 200;
  const float eps = 1e-6f;
  const auto x = Rounded(RandomNormal(rows * cols, 1.5f, 1), t());
  const auto w = Rounded(RandomNormal(cols, 0.3f, 2), DType::kBF16);
  const auto dy = RandomNormal(rows * cols, 1.0f, 3);
  const auto base = RandomNormal(rows * cols, 1.0f, 4);
  DeviceArray dx_in(x, t()), dw_in(w, DType::kBF16), d_dy(dy, DType::kF32), d_y(rows * cols, t());
  DeviceArray d_rstd(rows, DType::kF32), d_dx(base, DType::kF32), d_dw(cols, DType::kF32);
  DeviceArray partial(kernels::RmsNormWeightGradScratch(rows, cols), DType::kF32);
  EXPECT_OK(kernels::RmsNormForward(dx_in.get(), t(), dw_in.get(), DType::kBF16, rows, cols, eps, d_y.get(), t(),
                                    d_rstd.f(), nullptr));
  EXPECT_OK(kernels::RmsNormBackward(dx_in.get(), t(), d_rstd.f(), dw_in.get(), DType::kBF16, d_dy.get(), DType::kF32,
                                     rows, cols, /*accumulate=*/true, d_dx.get(), DType::kF32, nullptr));
  EXPECT_OK(kernels::RmsNormWeightGrad(dx_in.get(), t(), d_rstd.f(), d_dy.get(), DType::kF32, rows, cols, partial.f(),
                                       d_dw.get(), DType::kF32, nullptr));
  Sync();
  std::vector<double> y(rows * cols), rstd(rows), dx(rows * cols), dw(cols, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int c = 0; c < cols; ++c) ss += double(x[r * cols + c]) * x[r * cols + c];
    rstd[r] = 1.0 / std::sqrt(ss / cols + eps);
    double m = 0;
    for (int c = 0; c < cols; ++c) {
      const double xhat = x[r * cols + c] * rstd[r];
      y[r * cols + c] = xhat * w[c];
      m += dy[r * cols + c] * w[c] * xhat;
      dw[c] += dy[r * cols + c] * xhat;
    }
    m /= cols;
    for (int c = 0; c < cols; ++c) {
      const double xhat = x[r * cols + c] * rstd[r];
      dx[r * cols + c] = base[r * cols + c] + rstd[r] * (dy[r * cols + c] * w[c] - xhat * m);
    }
  }
  const double e_y = RelL2(d_y.Download(), y), e_rstd = RelL2(d_rstd.Download(), rstd);
  const double e_dx = RelL2(d_dx.Download(), dx), e_dw = RelL2(d_dw.Download(), dw);
  std::printf("rmsnorm %s: y %.2g rstd %.2g dx %.2g dw %.2g\n", DTypeName(t()), e_y, e_rstd, e_dx, e_dw);
  EXPECT_LE(e_y, Bound());
  EXPECT_LE(e_rstd, 1e-5);
  EXPECT_LE(e_dx, 1e-5);
  EXPECT_LE(e_dw, 1e-5);
}

// RmsNormBackward's dx_copy: the new dx also stored in t(), the bits Convert(dx) gives (the layer
// backward's compute-dtype dh without a second pass), with and without accumulation.
TEST_P(LlmKernelTest, RmsNormBackwardCopyEqualsConvert) {
  const int64_t rows = 300;
  for (int cols : {256, 200, 30}) {
    for (bool accumulate : {true, false}) {
      const auto x = RandomNormal(rows * cols, 1.5f, 11);
      const auto w = Rounded(RandomNormal(cols, 0.3f, 12), DType::kBF16);
      const auto dy = RandomNormal(rows * cols, 1.0f, 13);
      const auto base = RandomNormal(rows * cols, 1.0f, 14);
      DeviceArray d_x(x, DType::kF32), d_w(w, DType::kBF16), d_dy(dy, DType::kF32), d_y(rows * cols, DType::kF32);
      DeviceArray d_rstd(rows, DType::kF32), d_dx(base, DType::kF32), d_copy(rows * cols, t()),
          d_conv(rows * cols, t());
      EXPECT_OK(kernels::RmsNormForward(d_x.get(), DType::kF32, d_w.get(), DType::kBF16, rows, cols, 1e-6f, d_y.get(),
                                        DType::kF32, d_rstd.f(), nullptr));
      EXPECT_OK(kernels::RmsNormBackward(d_x.get(), DType::kF32, d_rstd.f(), d_w.get(), DType::kBF16, d_dy.get(),
                                         DType::kF32, rows, cols, accumulate, d_dx.get(), DType::kF32, nullptr,
                                         d_copy.get(), t()));
      EXPECT_OK(kernels::Convert(d_dx.get(), DType::kF32, d_conv.get(), t(), rows * cols, nullptr));
      Sync();
      const std::vector<float> a = d_copy.Download(), b = d_conv.Download();
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
          << "cols " << cols << " accumulate " << accumulate;
    }
  }
}

TEST_P(LlmKernelTest, RopeMatchesTheCpuRotationAndInverts) {
  const int seq = 37, heads = 3, hd = 24, batch = 2;
  const int64_t rows = int64_t(batch) * seq, n = rows * heads * hd;
  std::vector<float> cos, sin;
  RopeTables(hd, 10000.0, seq, &cos, &sin);
  const auto x = Rounded(RandomNormal(n, 1.0f, 5), t());
  DeviceArray d_x(x, t()), d_cos(cos, DType::kF32), d_sin(sin, DType::kF32);
  EXPECT_OK(kernels::Rope(d_x.get(), t(), rows, seq, heads, hd, d_cos.f(), d_sin.f(), false, nullptr));
  Sync();
  const std::vector<float> got = d_x.Download();
  std::vector<float> want = x;
  for (int64_t r = 0; r < rows; ++r) {
    const int pos = static_cast<int>(r % seq);
    for (int h = 0; h < heads; ++h) ApplyRope(hd, &cos[pos * hd / 2], &sin[pos * hd / 2], &want[(r * heads + h) * hd]);
  }
  const double e = RelL2(got, want);
  EXPECT_OK(kernels::Rope(d_x.get(), t(), rows, seq, heads, hd, d_cos.f(), d_sin.f(), true, nullptr));
  Sync();
  const double e_inv = RelL2(d_x.Download(), x);
  std::printf("rope %s: forward %.2g inverse(forward) %.2g\n", DTypeName(t()), e, e_inv);
  EXPECT_LE(e, Bound());
  EXPECT_LE(e_inv, t() == DType::kF32 ? 1e-6 : 2e-2);
}

// The backward with cuDNN and no q/k norm rotates dq and dk back in the compute dtype, in place:
// the same bits as widening to fp32, rotating there and rounding back (the kernel computes in fp32
// and rounds once), for both kernel paths (head_dim / 2 a multiple of 4 or not).
TEST_P(LlmKernelTest, InverseRopeInPlaceEqualsTheFp32RoundTrip) {
  if (t() == DType::kF32) GTEST_SKIP() << "the same dtype both ways";
  for (int hd : {128, 6}) {
    const int seq = 33, heads = 5, batch = 2;
    const int64_t rows = int64_t(batch) * seq, n = rows * heads * hd;
    std::vector<float> cos, sin;
    RopeTables(hd, 500000.0, seq, &cos, &sin);
    const auto x = Rounded(RandomNormal(n, 0.01f, 55), t());
    DeviceArray in_place(x, t()), wide(x, DType::kF32), back(n, t()), d_cos(cos, DType::kF32), d_sin(sin, DType::kF32);
    EXPECT_OK(kernels::Rope(in_place.get(), t(), rows, seq, heads, hd, d_cos.f(), d_sin.f(), true, nullptr));
    EXPECT_OK(kernels::Rope(wide.get(), DType::kF32, rows, seq, heads, hd, d_cos.f(), d_sin.f(), true, nullptr));
    EXPECT_OK(kernels::Convert(wide.get(), DType::kF32, back.get(), t(), n, nullptr));
    Sync();
    const std::vector<float> a = in_place.Download(), b = back.Download();
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "head_dim " << hd;
  }
}

TEST_P(LlmKernelTest, SwiGluForwardBackward) {
  const int64_t n = 5000;
  const auto g = Rounded(RandomNormal(n, 2.0f, 6), t());
  const auto u = Rounded(RandomNormal(n, 1.0f, 7), t());
  const auto da = RandomNormal(n, 1.0f, 8);
  DeviceArray d_g(g, t()), d_u(u, t()), d_a(n, t()), d_da(da, DType::kF32), d_dg(n, t()), d_du(n, t());
  EXPECT_OK(kernels::SwiGluForward(d_g.get(), d_u.get(), t(), n, d_a.get(), nullptr));
  EXPECT_OK(kernels::SwiGluBackward(d_g.get(), d_u.get(), t(), d_da.f(), n, d_dg.get(), d_du.get(), nullptr));
  Sync();
  std::vector<double> a(n), dg(n), du(n);
  for (int64_t i = 0; i < n; ++i) {
    const double s = 1.0 / (1.0 + std::exp(-double(g[i])));
    a[i] = g[i] * s * u[i];
    dg[i] = da[i] * u[i] * s * (1.0 + g[i] * (1.0 - s));
    du[i] = da[i] * g[i] * s;
  }
  const double e_a = RelL2(d_a.Download(), a), e_dg = RelL2(d_dg.Download(), dg), e_du = RelL2(d_du.Download(), du);
  std::printf("swiglu %s: a %.2g dg %.2g du %.2g\n", DTypeName(t()), e_a, e_dg, e_du);
  EXPECT_LE(e_a, Bound());
  EXPECT_LE(e_dg, Bound());
  EXPECT_LE(e_du, Bound());
}

// Causal GQA attention in double: o, lse, and the gradients for dout.
struct AttnRef {
  std::vector<double> o, lse, dq, dk, dv;
};

AttnRef AttentionReference(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                           const std::vector<float>& dout, int B, int S, int nh, int nkv, int hd) {
  AttnRef r;
  const int64_t N = int64_t(B) * S, qs = int64_t(nh) * hd, ks = int64_t(nkv) * hd;
  r.o.assign(N * qs, 0);
  r.lse.assign(int64_t(B) * nh * S, 0);
  r.dq.assign(N * qs, 0);
  r.dk.assign(N * ks, 0);
  r.dv.assign(N * ks, 0);
  const double scale = 1.0 / std::sqrt(double(hd));
  std::vector<double> p(S), dp(S);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < nh; ++h) {
      const int kvh = h / (nh / nkv);
      for (int t = 0; t < S; ++t) {
        const int64_t qa = (int64_t(b) * S + t) * qs + int64_t(h) * hd;
        double mx = -1e300;
        for (int j = 0; j <= t; ++j) {
          const int64_t ka = (int64_t(b) * S + j) * ks + int64_t(kvh) * hd;
          double s = 0;
          for (int d = 0; d < hd; ++d) s += double(q[qa + d]) * k[ka + d];
          p[j] = s * scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0;
        for (int j = 0; j <= t; ++j) sum += std::exp(p[j] - mx);
        r.lse[(int64_t(b) * nh + h) * S + t] = mx + std::log(sum);
        for (int j = 0; j <= t; ++j) p[j] = std::exp(p[j] - mx) / sum;
        double delta = 0;
        for (int j = 0; j <= t; ++j) {
          const int64_t ka = (int64_t(b) * S + j) * ks + int64_t(kvh) * hd;
          dp[j] = 0;
          for (int d = 0; d < hd; ++d) {
            r.o[qa + d] += p[j] * v[ka + d];
            dp[j] += double(dout[qa + d]) * v[ka + d];
          }
          delta += p[j] * dp[j];
        }
        for (int j = 0; j <= t; ++j) {
          const int64_t ka = (int64_t(b) * S + j) * ks + int64_t(kvh) * hd;
          const double ds = p[j] * (dp[j] - delta) * scale;
          for (int d = 0; d < hd; ++d) {
            r.dq[qa + d] += ds * k[ka + d];
            r.dk[ka + d] += ds * q[qa + d];
            r.dv[ka + d] += p[j] * dout[qa + d];
          }
        }
      }
    }
  }
  return r;
}

TEST_P(LlmKernelTest, FlashAttentionMatchesTheDirectSoftmax) {
  struct Shape {
    int B, S, nh, nkv, hd;
  };
  // Sequences that end mid-tile, GQA groups of 1, 2 and 4, every head-dim chunk count.
  for (const Shape& sh : {Shape{2, 77, 4, 2, 16}, Shape{1, 64, 2, 2, 48}, Shape{1, 45, 4, 1, 128},
                          Shape{1, 33, 2, 1, 256}, Shape{3, 5, 2, 2, 6}}) {
    SCOPED_TRACE("B=" + std::to_string(sh.B) + " S=" + std::to_string(sh.S) + " heads=" + std::to_string(sh.nh) + "/" +
                 std::to_string(sh.nkv) + " hd=" + std::to_string(sh.hd));
    const int64_t N = int64_t(sh.B) * sh.S, qn = N * sh.nh * sh.hd, kn = N * sh.nkv * sh.hd;
    // Scores of std ~2 after scaling: far from uniform softmax rows.
    const auto q = Rounded(RandomNormal(qn, 1.5f, 10 + sh.hd), t());
    const auto k = Rounded(RandomNormal(kn, 1.5f, 11 + sh.hd), t());
    const auto v = Rounded(RandomNormal(kn, 1.0f, 12 + sh.hd), t());
    const auto dout = Rounded(RandomNormal(qn, 1.0f, 13 + sh.hd), t());
    DeviceArray d_q(q, t()), d_k(k, t()), d_v(v, t()), d_do(dout, t()), d_o(qn, t());
    DeviceArray d_lse(N * sh.nh, DType::kF32), d_delta(N * sh.nh, DType::kF32);
    DeviceArray d_dq(qn, DType::kF32), d_dk(kn, DType::kF32), d_dv(kn, DType::kF32);
    const float scale = 1.0f / std::sqrt(static_cast<float>(sh.hd));
    EXPECT_OK(kernels::AttentionForward(d_q.get(), d_k.get(), d_v.get(), t(), sh.B, sh.S, sh.nh, sh.nkv, sh.hd, scale,
                                        d_o.get(), d_lse.f(), nullptr));
    EXPECT_OK(kernels::AttentionBackward(d_q.get(), d_k.get(), d_v.get(), d_o.get(), d_do.get(), t(), d_lse.f(), sh.B,
                                         sh.S, sh.nh, sh.nkv, sh.hd, scale, d_delta.f(), d_dq.f(), d_dk.f(), d_dv.f(),
                                         nullptr));
    Sync();
    const AttnRef ref = AttentionReference(q, k, v, dout, sh.B, sh.S, sh.nh, sh.nkv, sh.hd);
    const double e_o = RelL2(d_o.Download(), ref.o), e_lse = RelL2(d_lse.Download(), ref.lse);
    const double e_dq = RelL2(d_dq.Download(), ref.dq), e_dk = RelL2(d_dk.Download(), ref.dk);
    const double e_dv = RelL2(d_dv.Download(), ref.dv);
    std::printf("attention %s B=%d S=%d heads=%d/%d hd=%d: o %.2g lse %.2g dq %.2g dk %.2g dv %.2g\n", DTypeName(t()),
                sh.B, sh.S, sh.nh, sh.nkv, sh.hd, e_o, e_lse, e_dq, e_dk, e_dv);
    const double grad_bound = t() == DType::kF32 ? 5e-5 : 1e-2;
    EXPECT_LE(e_o, Bound());
    EXPECT_LE(e_lse, 1e-5);
    EXPECT_LE(e_dq, grad_bound);
    EXPECT_LE(e_dk, grad_bound);
    EXPECT_LE(e_dv, grad_bound);
  }
}

// cuDNN's fused attention (bf16 in and out, fp32 statistics) against the same double reference:
// o and the gradients within bf16's rounding (their own storage and P rounded to bf16 before P V
// on tensor cores), lse as fp32; the deterministic backward gives the same bits twice.
TEST(CudnnAttentionTest, MatchesTheDirectSoftmaxAndRepeatsBitwise) {
  ZERO_SKIP_WITHOUT_CUDA_DEVICES(1);
  if (!CudnnAttention::Built()) GTEST_SKIP() << "this build has no cuDNN";
  Result<std::unique_ptr<CudaDevice>> device = CudaDevice::Create(0);
  ASSERT_OK(device);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  auto attn = CudnnAttention::Create(device->get(), stream);
  ASSERT_OK(attn);
  std::printf("cuDNN %ld at run time\n", CudnnAttention::RuntimeVersion());
  const DType t = DType::kBF16;
  struct Shape {
    int B, S, nh, nkv, hd;
  };
  for (const Shape& sh :
       {Shape{2, 77, 4, 2, 64}, Shape{1, 128, 8, 2, 128}, Shape{1, 300, 4, 4, 128}, Shape{2, 64, 4, 1, 32}}) {
    SCOPED_TRACE("B=" + std::to_string(sh.B) + " S=" + std::to_string(sh.S) + " heads=" + std::to_string(sh.nh) + "/" +
                 std::to_string(sh.nkv) + " hd=" + std::to_string(sh.hd));
    const int64_t N = int64_t(sh.B) * sh.S, qn = N * sh.nh * sh.hd, kn = N * sh.nkv * sh.hd;
    const auto q = Rounded(RandomNormal(qn, 1.5f, 20 + sh.hd), t);
    const auto k = Rounded(RandomNormal(kn, 1.5f, 21 + sh.hd), t);
    const auto v = Rounded(RandomNormal(kn, 1.0f, 22 + sh.hd), t);
    const auto dout = Rounded(RandomNormal(qn, 1.0f, 23 + sh.hd), t);
    DeviceArray d_q(q, t), d_k(k, t), d_v(v, t), d_do(dout, t), d_o(qn, t), d_lse(N * sh.nh, DType::kF32);
    DeviceArray d_dq(qn, t), d_dk(kn, t), d_dv(kn, t);
    const AttentionShape shape{sh.B, sh.S, sh.nh, sh.nkv, sh.hd, 1.0f / std::sqrt(static_cast<float>(sh.hd))};
    const Status prepared = (*attn)->Prepare(shape);
    ASSERT_OK(prepared);
    EXPECT_OK((*attn)->Forward(shape, d_q.get(), d_k.get(), d_v.get(), d_o.get(), d_lse.f()));
    EXPECT_OK((*attn)->Backward(shape, d_q.get(), d_k.get(), d_v.get(), d_o.get(), d_do.get(), d_lse.f(), d_dq.get(),
                                d_dk.get(), d_dv.get()));
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const std::vector<float> dq1 = d_dq.Download(), dk1 = d_dk.Download(), dv1 = d_dv.Download();
    EXPECT_OK((*attn)->Backward(shape, d_q.get(), d_k.get(), d_v.get(), d_o.get(), d_do.get(), d_lse.f(), d_dq.get(),
                                d_dk.get(), d_dv.get()));
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(dq1, d_dq.Download()) << "dq differs between two runs";
    EXPECT_EQ(dk1, d_dk.Download()) << "dk differs between two runs";
    EXPECT_EQ(dv1, d_dv.Download()) << "dv differs between two runs";
    const AttnRef ref = AttentionReference(q, k, v, dout, sh.B, sh.S, sh.nh, sh.nkv, sh.hd);
    const double e_o = RelL2(d_o.Download(), ref.o), e_lse = RelL2(d_lse.Download(), ref.lse);
    const double e_dq = RelL2(dq1, ref.dq), e_dk = RelL2(dk1, ref.dk), e_dv = RelL2(dv1, ref.dv);
    std::printf("cudnn attention B=%d S=%d heads=%d/%d hd=%d: o %.2g lse %.2g dq %.2g dk %.2g dv %.2g\n", sh.B, sh.S,
                sh.nh, sh.nkv, sh.hd, e_o, e_lse, e_dq, e_dk, e_dv);
    EXPECT_LE(e_o, 1e-2);
    EXPECT_LE(e_lse, 1e-5);
    EXPECT_LE(e_dq, 1e-2);
    EXPECT_LE(e_dk, 1e-2);
    EXPECT_LE(e_dv, 1e-2);
  }
  attn->reset();
  cudaStreamDestroy(stream);
}

TEST_P(LlmKernelTest, CrossEntropyLossAndGradient) {
  const int64_t rows = 6, vocab = 3001;
  const std::vector<int32_t> targets = {5, kIgnoreIndex, 3000, 0, 17, 2999};
  const auto logits = RandomNormal(rows * vocab, 3.0f, 20);
  const float coef = 0.37f;
  DeviceArray d_logits(logits, DType::kF32), d_loss(rows, DType::kF32), d_grad(rows * vocab, t());
  DeviceArray d_sum(2, DType::kF32);  // one double
  DeviceInts d_targets(targets);
  EXPECT_OK(
      kernels::CrossEntropy(d_logits.f(), d_targets.get(), rows, vocab, coef, d_loss.f(), d_grad.get(), t(), nullptr));
  EXPECT_OK(kernels::SumToDouble(d_loss.f(), rows, static_cast<double*>(d_sum.get()), nullptr));
  Sync();
  std::vector<double> loss(rows, 0.0), grad(rows * vocab, 0.0);
  double total = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] == kIgnoreIndex) continue;
    double mx = -1e300, s = 0;
    for (int64_t i = 0; i < vocab; ++i) mx = std::max(mx, double(logits[r * vocab + i]));
    for (int64_t i = 0; i < vocab; ++i) s += std::exp(logits[r * vocab + i] - mx);
    const double lse = mx + std::log(s);
    loss[r] = lse - logits[r * vocab + targets[r]];
    total += loss[r];
    for (int64_t i = 0; i < vocab; ++i) {
      grad[r * vocab + i] = (std::exp(logits[r * vocab + i] - lse) - (i == targets[r] ? 1.0 : 0.0)) * coef;
    }
  }
  double sum = 0;
  ASSERT_EQ(cudaMemcpy(&sum, d_sum.get(), sizeof(double), cudaMemcpyDeviceToHost), cudaSuccess);
  const std::vector<float> got_grad = d_grad.Download();
  const double e_loss = RelL2(d_loss.Download(), loss), e_grad = RelL2(got_grad, grad);
  std::printf("cross-entropy %s: loss %.2g dlogits %.2g sum %.2g\n", DTypeName(t()), e_loss, e_grad,
              std::abs(sum - total) / total);
  EXPECT_LE(e_loss, 1e-5);
  EXPECT_LE(e_grad, Bound());
  EXPECT_NEAR(sum, total, 1e-5 * total);
  for (int64_t i = 0; i < vocab; ++i) ASSERT_EQ(got_grad[vocab + i], 0.0f) << "ignored row, column " << i;
}

TEST_P(LlmKernelTest, EmbeddingLookupAndItsGradientInTokenOrder) {
  const int64_t vocab = 50, hidden = 300, rows = 97;
  std::vector<int32_t> ids(rows);
  uint64_t s = 3;
  for (auto& id : ids) id = static_cast<int32_t>(Next(&s) % 13) * 3;  // repeats; most ids absent
  const auto table = Rounded(RandomNormal(vocab * hidden, 1.0f, 30), t());
  const auto dh = RandomNormal(rows * hidden, 1.0f, 31);
  const auto base = RandomNormal(vocab * hidden, 1.0f, 32);
  // Positions sorted by id, then position; distinct ids and their run starts.
  std::vector<int32_t> pos(rows), unique, starts;
  for (int64_t i = 0; i < rows; ++i) pos[i] = static_cast<int32_t>(i);
  std::stable_sort(pos.begin(), pos.end(), [&](int32_t a, int32_t b) { return ids[a] < ids[b]; });
  for (int64_t p = 0; p < rows; ++p) {
    if (p == 0 || ids[pos[p]] != ids[pos[p - 1]]) {
      unique.push_back(ids[pos[p]]);
      starts.push_back(static_cast<int32_t>(p));
    }
  }
  starts.push_back(static_cast<int32_t>(rows));
  DeviceInts d_ids(ids), d_pos(pos), d_unique(unique), d_starts(starts);
  DeviceArray d_table(table, t()), d_out(rows * hidden, DType::kF32), d_dh(dh, DType::kF32);
  DeviceArray d_acc(base, DType::kF32), d_grad(vocab * hidden, t());
  EXPECT_OK(kernels::EmbeddingForward(d_ids.get(), rows, hidden, d_table.get(), t(), d_out.f(), nullptr));
  EXPECT_OK(kernels::EmbeddingBackward(d_pos.get(), d_unique.get(), d_starts.get(), unique.size(), hidden, d_dh.f(),
                                       true, d_acc.get(), DType::kF32, nullptr));
  EXPECT_OK(kernels::EmbeddingBackward(d_pos.get(), d_unique.get(), d_starts.get(), unique.size(), hidden, d_dh.f(),
                                       false, d_grad.get(), t(), nullptr));
  Sync();
  // The CPU model's order: rows added in token order onto the base (fp32), so equal bits.
  std::vector<float> lookup(rows * hidden), acc = base, fresh(vocab * hidden, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < hidden; ++c) {
      lookup[r * hidden + c] = table[ids[r] * hidden + c];
      acc[ids[r] * hidden + c] += dh[r * hidden + c];
      fresh[ids[r] * hidden + c] += dh[r * hidden + c];
    }
  }
  EXPECT_EQ(d_out.Download(), lookup);
  EXPECT_EQ(d_acc.Download(), acc);
  EXPECT_EQ(d_grad.Download(), Rounded(fresh, t()));
}

}  // namespace
}  // namespace zero::llm
