// CudaDevice against CpuDevice on the same random inputs: elementwise kernels bitwise equal,
// SumOfSquares within 1e-12 relative; copies, pinned memory, streams and events; one test past
// 2^31 elements; bandwidth lines for Accumulate, AccumulateFirst, AdamW, AdamWCast and AdamWFromGradient
// (informative). Skips without a GPU.
// Run on the GPU machine: bazel-bin/runtime/cuda_device_test
#include "runtime/cuda_device.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "runtime/cpu_device.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/gpu_test_util.h"
#include "runtime/kernel_test_util.h"
#include "runtime/status.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

using testing::RandomBytes;
using testing::RandomFloats;
constexpr auto Diff = testing::FirstDifference;

constexpr DType kAllTypes[] = {DType::kF32, DType::kBF16, DType::kF16};
// Odd sizes, a size below one vector group, and sizes larger than one full grid of threads.
const size_t kSizes[] = {1, 3, 1000, 65537, (size_t{1} << 20) + 3, (size_t{5} << 20) + 1};
// 0: aligned pointers (vector loads); 1: offset by one element (scalar path).
const size_t kOffsets[] = {0, 1};

std::string Where(DType t, size_t n, size_t off) {
  return std::string(DTypeName(t)) + " n=" + std::to_string(n) + " offset=" + std::to_string(off);
}

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ZERO_SKIP_WITHOUT_CUDA_DEVICES(1);
    Result<std::unique_ptr<CudaDevice>> d = CudaDevice::Create(0);
    ASSERT_OK(d) << "a CUDA device is visible but CudaDevice::Create(0) failed";
    gpu_ = std::move(d).value();
  }

  // Device buffer (GPU) with `bytes` copied in at byte offset `offset`.
  DeviceBuffer ToGpu(const std::vector<uint8_t>& bytes, size_t offset = 0) {
    Result<DeviceBuffer> buf = gpu_->Allocate(bytes.size() + offset + 16);
    EXPECT_OK(buf);
    Status st = gpu_->Copy(buf->as<uint8_t>() + offset, bytes.data(), bytes.size(), CopyKind::kHostToDevice, nullptr);
    EXPECT_OK(st);
    return std::move(buf).value();
  }
  std::vector<uint8_t> FromGpu(const void* p, size_t bytes) {
    std::vector<uint8_t> out(bytes);
    Status st = gpu_->Copy(out.data(), p, bytes, CopyKind::kDeviceToHost, nullptr);
    EXPECT_OK(st);
    st = gpu_->SynchronizeStream(nullptr);
    EXPECT_OK(st);
    return out;
  }
  template <typename T>
  T ReadGpu(const void* p) {
    T v;
    std::vector<uint8_t> b = FromGpu(p, sizeof(T));
    std::memcpy(&v, b.data(), sizeof(T));
    return v;
  }
  template <typename T>
  void WriteGpu(void* p, T v) {
    ASSERT_OK(gpu_->Copy(p, &v, sizeof(T), CopyKind::kHostToDevice, nullptr));
    ASSERT_OK(gpu_->SynchronizeStream(nullptr));
  }

  CpuDevice cpu_;
  std::unique_ptr<CudaDevice> gpu_;
};

TEST_F(CudaDeviceTest, NameAndFactory) {
  EXPECT_EQ(gpu_->kind(), DeviceKind::kCuda);
  EXPECT_EQ(gpu_->name().rfind("cuda:0 (", 0), 0u) << gpu_->name();
  std::printf("device: %s, %d SMs\n", gpu_->name().c_str(), gpu_->multiprocessor_count());
  Result<std::unique_ptr<Device>> d = CreateDevice("cuda:0");
  ASSERT_OK(d);
  EXPECT_EQ((*d)->kind(), DeviceKind::kCuda);
  Result<std::unique_ptr<Device>> bad = CreateDevice("cuda:999");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status().ToString();
}

TEST_F(CudaDeviceTest, Fill) {
  for (DType t : kAllTypes) {
    for (size_t n : kSizes) {
      for (size_t off : kOffsets) {
        for (float value : {0.1f, -0.0f, 1e6f, NAN}) {
          std::vector<uint8_t> expect(n * SizeOf(t));
          ASSERT_OK(cpu_.Fill(expect.data(), t, n, value, nullptr));
          DeviceBuffer buf = ToGpu(std::vector<uint8_t>(n * SizeOf(t), 0x5a), off * SizeOf(t));
          void* p = buf.as<uint8_t>() + off * SizeOf(t);
          ASSERT_OK(gpu_->Fill(p, t, n, value, nullptr));
          ASSERT_EQ(Diff(FromGpu(p, n * SizeOf(t)), expect, SizeOf(t)), "") << Where(t, n, off) << " value " << value;
        }
      }
    }
  }
}

TEST_F(CudaDeviceTest, CastAllPairs) {
  for (DType st : kAllTypes) {
    for (DType dt : kAllTypes) {
      for (size_t n : kSizes) {
        for (size_t off : kOffsets) {
          std::vector<uint8_t> src = RandomBytes(st, n, 10 + n, /*specials=*/true, 8.0f);
          std::vector<uint8_t> expect(n * SizeOf(dt));
          ASSERT_OK(cpu_.Cast(src.data(), st, expect.data(), dt, n, nullptr));
          DeviceBuffer in = ToGpu(src, off * SizeOf(st));
          DeviceBuffer out = ToGpu(std::vector<uint8_t>(n * SizeOf(dt)));
          ASSERT_OK(gpu_->Cast(in.as<uint8_t>() + off * SizeOf(st), st, out.data(), dt, n, nullptr));
          ASSERT_EQ(Diff(FromGpu(out.data(), n * SizeOf(dt)), expect, SizeOf(dt)), "")
              << DTypeName(st) << "->" << Where(dt, n, off);
        }
      }
    }
  }
}

TEST_F(CudaDeviceTest, Accumulate) {
  for (DType st : kAllTypes) {
    for (size_t n : kSizes) {
      for (size_t off : kOffsets) {
        for (float scale : {1.0f, 0.37f}) {
          std::vector<uint8_t> acc = RandomBytes(DType::kF32, n, 20 + n, true);
          std::vector<uint8_t> src = RandomBytes(st, n, 30 + n, true);
          std::vector<uint8_t> expect = acc;
          ASSERT_OK(cpu_.Accumulate(reinterpret_cast<float*>(expect.data()), src.data(), st, n, scale, nullptr));
          DeviceBuffer a = ToGpu(acc, off * 4);
          DeviceBuffer s = ToGpu(src);
          float* ap = a.as<float>() + off;
          ASSERT_OK(gpu_->Accumulate(ap, s.data(), st, n, scale, nullptr));
          ASSERT_EQ(Diff(FromGpu(ap, n * 4), expect, 4), "") << Where(st, n, off) << " scale " << scale;
        }
      }
    }
  }
}

// AccumulateFirst: bitwise the CPU backend's (which equals Fill(0) + Accumulate: -0 -> +0, NaN
// canonical), whatever the accumulator held before, aligned and misaligned.
TEST_F(CudaDeviceTest, AccumulateFirst) {
  for (DType st : kAllTypes) {
    for (size_t n : kSizes) {
      for (size_t off : kOffsets) {
        for (float scale : {1.0f, 0.37f}) {
          std::vector<uint8_t> src = RandomBytes(st, n, 35 + n, true);
          StoreFromFloat(src.data(), st, 0, -0.0f);
          std::vector<uint8_t> expect(n * 4, 0);
          ASSERT_OK(cpu_.AccumulateFirst(reinterpret_cast<float*>(expect.data()), src.data(), st, n, scale, nullptr));
          DeviceBuffer a = ToGpu(RandomBytes(DType::kF32, n, 36 + n, true), off * 4);
          DeviceBuffer s = ToGpu(src, off * SizeOf(st));
          float* ap = a.as<float>() + off;
          const void* sp = s.as<uint8_t>() + off * SizeOf(st);
          ASSERT_OK(gpu_->AccumulateFirst(ap, sp, st, n, scale, nullptr));
          ASSERT_EQ(Diff(FromGpu(ap, n * 4), expect, 4), "") << Where(st, n, off) << " scale " << scale;
        }
      }
    }
  }
}

TEST_F(CudaDeviceTest, Scale) {
  for (DType t : kAllTypes) {
    for (size_t n : kSizes) {
      for (size_t off : kOffsets) {
        for (float s : {0.5f, 1.0f / 65536.0f, 300.0f}) {
          std::vector<uint8_t> x = RandomBytes(t, n, 40 + n, true);
          std::vector<uint8_t> expect = x;
          ASSERT_OK(cpu_.Scale(expect.data(), t, n, s, nullptr));
          DeviceBuffer buf = ToGpu(x, off * SizeOf(t));
          void* p = buf.as<uint8_t>() + off * SizeOf(t);
          ASSERT_OK(gpu_->Scale(p, t, n, s, nullptr));
          ASSERT_EQ(Diff(FromGpu(p, n * SizeOf(t)), expect, SizeOf(t)), "") << Where(t, n, off) << " s " << s;
        }
      }
    }
  }
}

TEST_F(CudaDeviceTest, FiniteCheck) {
  Result<DeviceBuffer> flag = gpu_->Allocate(4);
  ASSERT_OK(flag);
  int32_t* f = flag->as<int32_t>();
  for (DType t : kAllTypes) {
    for (size_t n : kSizes) {
      for (size_t off : kOffsets) {
        std::vector<uint8_t> x = RandomBytes(t, n, 50 + n, false, 1.0f);
        DeviceBuffer buf = ToGpu(x, off * SizeOf(t));
        void* p = buf.as<uint8_t>() + off * SizeOf(t);
        WriteGpu<int32_t>(f, 0);
        ASSERT_OK(gpu_->FiniteCheck(p, t, n, f, nullptr));
        EXPECT_EQ(ReadGpu<int32_t>(f), 0) << Where(t, n, off);
        WriteGpu<int32_t>(f, 1);  // never cleared
        ASSERT_OK(gpu_->FiniteCheck(p, t, n, f, nullptr));
        EXPECT_EQ(ReadGpu<int32_t>(f), 1) << Where(t, n, off);
        for (size_t at : {size_t{0}, n / 2, n - 1}) {
          for (float bad : {INFINITY, NAN}) {
            std::vector<uint8_t> y = x;
            StoreFromFloat(y.data(), t, at, bad);
            int32_t cpu_flag = 0;
            ASSERT_OK(cpu_.FiniteCheck(y.data(), t, n, &cpu_flag, nullptr));
            DeviceBuffer b2 = ToGpu(y, off * SizeOf(t));
            WriteGpu<int32_t>(f, 0);
            ASSERT_OK(gpu_->FiniteCheck(b2.as<uint8_t>() + off * SizeOf(t), t, n, f, nullptr));
            EXPECT_EQ(ReadGpu<int32_t>(f), cpu_flag) << Where(t, n, off) << " at " << at;
            EXPECT_EQ(cpu_flag, 1);
          }
        }
      }
    }
  }
}

TEST_F(CudaDeviceTest, SumOfSquares) {
  Result<DeviceBuffer> out = gpu_->Allocate(8);
  ASSERT_OK(out);
  double* o = out->as<double>();
  for (DType t : kAllTypes) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{3}, size_t{1000}, size_t{65537}, (size_t{1} << 20) + 3,
                     (size_t{5} << 20) + 1, size_t{20000003}}) {
      std::vector<uint8_t> x = RandomBytes(t, n, 60 + n, false, 2.0f);
      double expect = -1;
      ASSERT_OK(cpu_.SumOfSquares(x.data(), t, n, &expect, nullptr));
      double results[2];
      for (size_t off : kOffsets) {
        DeviceBuffer buf = ToGpu(x, off * SizeOf(t));
        const void* p = buf.as<uint8_t>() + off * SizeOf(t);
        ASSERT_OK(gpu_->SumOfSquares(p, t, n, o, nullptr));
        double got = ReadGpu<double>(o);
        // Deterministic: the same call again gives the same bits.
        ASSERT_OK(gpu_->SumOfSquares(p, t, n, o, nullptr));
        ASSERT_EQ(ReadGpu<double>(o), got) << Where(t, n, off);
        results[off] = got;
        if (n == 0) {
          EXPECT_EQ(got, 0.0);
        } else {
          EXPECT_LT(std::fabs(got - expect) / expect, 1e-12) << Where(t, n, off) << " gpu " << got << " cpu " << expect;
        }
      }
      // The summation order does not depend on the load width.
      EXPECT_EQ(results[0], results[1]) << DTypeName(t) << " n=" << n;
    }
  }
}

TEST_F(CudaDeviceTest, AdamWSeveralSteps) {
  for (size_t n : {size_t{1}, size_t{1001}, (size_t{3} << 20) + 5}) {
    for (size_t off : kOffsets) {
      for (bool w_mode : {true, false}) {
        std::vector<float> p = RandomFloats(n, 70 + n, 1.0f);
        std::vector<float> m(n, 0.0f), v(n, 0.0f);
        auto bytes = [n](const std::vector<float>& f) {
          std::vector<uint8_t> b(n * 4);
          std::memcpy(b.data(), f.data(), n * 4);
          return b;
        };
        DeviceBuffer dp = ToGpu(bytes(p), off * 4), dm = ToGpu(bytes(m), off * 4), dv = ToGpu(bytes(v), off * 4),
                     dg = ToGpu(bytes(v), off * 4);
        float* gp = dp.as<float>() + off;
        float* gm = dm.as<float>() + off;
        float* gv = dv.as<float>() + off;
        float* gg = dg.as<float>() + off;
        for (int step = 1; step <= 5; ++step) {
          std::vector<float> g = RandomFloats(n, 1000 * step + n, 3.0f);
          AdamWParams h = testing::AdamWStep(step, w_mode, step == 2 ? 0.125f : 1.0f);
          ASSERT_OK(cpu_.AdamW(p.data(), g.data(), m.data(), v.data(), n, h, nullptr));
          ASSERT_OK(gpu_->Copy(gg, g.data(), n * 4, CopyKind::kHostToDevice, nullptr));
          ASSERT_OK(gpu_->AdamW(gp, gg, gm, gv, n, h, nullptr));
          std::string where = "n=" + std::to_string(n) + " off=" + std::to_string(off) +
                              " adam_w_mode=" + std::to_string(w_mode) + " step " + std::to_string(step);
          ASSERT_EQ(Diff(FromGpu(gp, n * 4), bytes(p), 4), "") << "param " << where;
          ASSERT_EQ(Diff(FromGpu(gm, n * 4), bytes(m), 4), "") << "exp_avg " << where;
          ASSERT_EQ(Diff(FromGpu(gv, n * 4), bytes(v), 4), "") << "exp_avg_sq " << where;
        }
      }
    }
  }
}

// AdamWCast (AdamW + the new weights rounded to the model dtype, one kernel): param, moments and
// model bitwise the CPU backend's AdamWCast (itself checked against AdamW + Cast), every model
// dtype, both modes, aligned and misaligned; the last step's gradients carry Inf/NaN/-0.
TEST_F(CudaDeviceTest, AdamWCastSeveralSteps) {
  for (DType mt : kAllTypes) {
    for (size_t n : {size_t{1}, size_t{1001}, (size_t{3} << 20) + 5}) {
      for (size_t off : kOffsets) {
        for (bool w_mode : {true, false}) {
          std::vector<uint8_t> p = RandomBytes(DType::kF32, n, 80 + n, false, 1.0f);
          std::vector<uint8_t> m(n * 4, 0), v(n * 4, 0), model(n * SizeOf(mt), 0);
          DeviceBuffer dp = ToGpu(p, off * 4), dm = ToGpu(m, off * 4), dv = ToGpu(v, off * 4), dg = ToGpu(m, off * 4),
                       dmodel = ToGpu(std::vector<uint8_t>(n * SizeOf(mt), 0x5a), off * SizeOf(mt));
          float* gp = dp.as<float>() + off;
          float* gm = dm.as<float>() + off;
          float* gv = dv.as<float>() + off;
          float* gg = dg.as<float>() + off;
          void* gmodel = dmodel.as<uint8_t>() + off * SizeOf(mt);
          for (int step = 1; step <= 3; ++step) {
            std::vector<uint8_t> g = RandomBytes(DType::kF32, n, 2000 * step + n, step == 3, 3.0f);
            AdamWParams h = testing::AdamWStep(step, w_mode, step == 2 ? 0.125f : 1.0f);
            ASSERT_OK(cpu_.AdamWCast(reinterpret_cast<float*>(p.data()), reinterpret_cast<const float*>(g.data()),
                                     reinterpret_cast<float*>(m.data()), reinterpret_cast<float*>(v.data()), n, h,
                                     model.data(), mt, nullptr));
            ASSERT_OK(gpu_->Copy(gg, g.data(), n * 4, CopyKind::kHostToDevice, nullptr));
            ASSERT_OK(gpu_->AdamWCast(gp, gg, gm, gv, n, h, gmodel, mt, nullptr));
            std::string where =
                Where(mt, n, off) + " adam_w_mode=" + std::to_string(w_mode) + " step " + std::to_string(step);
            ASSERT_EQ(Diff(FromGpu(gp, n * 4), p, 4), "") << "param " << where;
            ASSERT_EQ(Diff(FromGpu(gm, n * 4), m, 4), "") << "exp_avg " << where;
            ASSERT_EQ(Diff(FromGpu(gv, n * 4), v, 4), "") << "exp_avg_sq " << where;
            ASSERT_EQ(Diff(FromGpu(gmodel, n * SizeOf(mt)), model, SizeOf(mt)), "") << "model " << where;
          }
        }
      }
    }
  }
}

// AdamWFromGradient (AdamW reading 16-bit or fp32 gradients in one kernel): param and moments
// bitwise the CPU backend's (itself checked against AccumulateFirst + AdamW), every gradient dtype,
// both modes, aligned and misaligned; the last step's gradients carry Inf/NaN/-0.
TEST_F(CudaDeviceTest, AdamWFromGradientSeveralSteps) {
  for (DType gt : kAllTypes) {
    for (size_t n : {size_t{1}, size_t{1001}, (size_t{3} << 20) + 5}) {
      for (size_t off : kOffsets) {
        for (bool w_mode : {true, false}) {
          std::vector<uint8_t> p = RandomBytes(DType::kF32, n, 90 + n, false, 1.0f);
          std::vector<uint8_t> m(n * 4, 0), v(n * 4, 0);
          DeviceBuffer dp = ToGpu(p, off * 4), dm = ToGpu(m, off * 4), dv = ToGpu(v, off * 4),
                       dg = ToGpu(std::vector<uint8_t>(n * SizeOf(gt), 0), off * SizeOf(gt));
          float* gp = dp.as<float>() + off;
          float* gm = dm.as<float>() + off;
          float* gv = dv.as<float>() + off;
          void* gg = dg.as<uint8_t>() + off * SizeOf(gt);
          for (int step = 1; step <= 3; ++step) {
            std::vector<uint8_t> g = RandomBytes(gt, n, 3000 * step + n, step == 3, 3.0f);
            AdamWParams h = testing::AdamWStep(step, w_mode, step == 2 ? 0.125f : 1.0f);
            ASSERT_OK(cpu_.AdamWFromGradient(reinterpret_cast<float*>(p.data()), g.data(), gt,
                                             reinterpret_cast<float*>(m.data()), reinterpret_cast<float*>(v.data()), n,
                                             h, nullptr));
            ASSERT_OK(gpu_->Copy(gg, g.data(), n * SizeOf(gt), CopyKind::kHostToDevice, nullptr));
            ASSERT_OK(gpu_->AdamWFromGradient(gp, gg, gt, gm, gv, n, h, nullptr));
            std::string where =
                Where(gt, n, off) + " adam_w_mode=" + std::to_string(w_mode) + " step " + std::to_string(step);
            ASSERT_EQ(Diff(FromGpu(gp, n * 4), p, 4), "") << "param " << where;
            ASSERT_EQ(Diff(FromGpu(gm, n * 4), m, 4), "") << "exp_avg " << where;
            ASSERT_EQ(Diff(FromGpu(gv, n * 4), v, 4), "") << "exp_avg_sq " << where;
          }
        }
      }
    }
  }
}

TEST_F(CudaDeviceTest, MemoryStatsAndOutOfMemory) {
  MemoryStats before = gpu_->memory_stats();
  {
    Result<DeviceBuffer> a = gpu_->Allocate(size_t{1} << 20);
    ASSERT_OK(a);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % 256, 0u);
    EXPECT_EQ(gpu_->memory_stats().in_use, before.in_use + (size_t{1} << 20));
    Result<PinnedBuffer> p = gpu_->AllocatePinned(size_t{1} << 20);
    ASSERT_OK(p);
    EXPECT_EQ(gpu_->memory_stats().in_use, before.in_use + (size_t{1} << 20));
  }
  EXPECT_EQ(gpu_->memory_stats().in_use, before.in_use);
  Result<DeviceBuffer> huge = gpu_->Allocate(size_t{1} << 50);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kResourceExhausted) << huge.status().ToString();
  EXPECT_NE(huge.status().message().find(std::to_string(size_t{1} << 50)), std::string::npos)
      << huge.status().ToString();
  std::printf("out of memory message: %s\n", huge.status().ToString().c_str());
  // The device still works after the failed allocation.
  Result<DeviceBuffer> small = gpu_->Allocate(64);
  ASSERT_OK(small);
  ASSERT_OK(gpu_->Fill(small->data(), DType::kF32, 16, 1.0f, nullptr));
  EXPECT_EQ(ReadGpu<float>(small->as<float>() + 15), 1.0f);
}

TEST_F(CudaDeviceTest, PinnedCopiesStreamsAndEvents) {
  const size_t n = size_t{16} << 20;  // 64 MiB of fp32: the kernel takes a while
  Result<PinnedBuffer> host_in = gpu_->AllocatePinned(n * 4), host_out = gpu_->AllocatePinned(n * 4);
  Result<DeviceBuffer> dev = gpu_->Allocate(n * 4);
  ASSERT_TRUE(host_in.ok() && host_out.ok() && dev.ok());
  for (size_t i = 0; i < n; ++i) host_in->as<float>()[i] = static_cast<float>(i % 1000);
  std::memset(host_out->data(), 0, n * 4);
  Result<std::unique_ptr<Stream>> compute = gpu_->CreateStream(), copy = gpu_->CreateStream();
  Result<std::unique_ptr<Event>> done = gpu_->CreateEvent();
  ASSERT_TRUE(compute.ok() && copy.ok() && done.ok());
  // H2D and a few kernels on `compute`; the D2H on `copy` waits on an event, not on the host.
  ASSERT_OK(gpu_->Copy(dev->data(), host_in->data(), n * 4, CopyKind::kHostToDevice, compute->get()));
  for (int i = 0; i < 8; ++i) ASSERT_OK(gpu_->Scale(dev->data(), DType::kF32, n, 2.0f, compute->get()));
  ASSERT_OK(gpu_->RecordEvent(done->get(), compute->get()));
  ASSERT_OK(gpu_->StreamWaitEvent(copy->get(), done->get()));
  ASSERT_OK(gpu_->Copy(host_out->data(), dev->data(), n * 4, CopyKind::kDeviceToHost, copy->get()));
  ASSERT_OK(gpu_->SynchronizeStream(copy->get()));
  for (size_t i = 0; i < n; i += 4099) {
    ASSERT_EQ(host_out->as<float>()[i], static_cast<float>(i % 1000) * 256.0f) << i;
  }
  ASSERT_EQ(host_out->as<float>()[n - 1], static_cast<float>((n - 1) % 1000) * 256.0f);
  ASSERT_OK(gpu_->SynchronizeEvent(done->get()));
  // Device-to-device and host-to-host copies.
  Result<DeviceBuffer> dev2 = gpu_->Allocate(n * 4);
  ASSERT_OK(dev2);
  ASSERT_OK(gpu_->Copy(dev2->data(), dev->data(), n * 4, CopyKind::kDeviceToDevice, copy->get()));
  ASSERT_OK(gpu_->Copy(host_in->data(), host_out->data(), n * 4, CopyKind::kHostToHost, copy->get()));
  ASSERT_OK(gpu_->Synchronize());
  EXPECT_EQ(std::memcmp(host_in->data(), host_out->data(), n * 4), 0);
  EXPECT_EQ(ReadGpu<float>(dev2->as<float>() + n - 1), static_cast<float>((n - 1) % 1000) * 256.0f);
  // Streams of another backend are refused.
  Result<std::unique_ptr<Stream>> cpu_stream = cpu_.CreateStream();
  ASSERT_OK(cpu_stream);
  EXPECT_EQ(gpu_->Fill(dev->data(), DType::kF32, n, 0.0f, cpu_stream->get()).code(), StatusCode::kInvalidArgument);
}

// Past 2^31 elements: a 32-bit index would miss the end.
TEST_F(CudaDeviceTest, MoreThan2To31Elements) {
  const size_t n = (size_t{1} << 31) + 77;
  Result<DeviceBuffer> x = gpu_->Allocate(n * 2);
  ASSERT_OK(x);
  Result<DeviceBuffer> scratch = gpu_->Allocate(16);
  ASSERT_OK(scratch);
  int32_t* flag = scratch->as<int32_t>();
  double* sum = reinterpret_cast<double*>(scratch->as<uint8_t>() + 8);
  uint16_t* p = x->as<uint16_t>();

  ASSERT_OK(gpu_->Fill(p, DType::kBF16, n, 1.5f, nullptr));
  EXPECT_EQ(ReadGpu<uint16_t>(p), FloatToBf16(1.5f));
  EXPECT_EQ(ReadGpu<uint16_t>(p + n - 1), FloatToBf16(1.5f));

  WriteGpu<int32_t>(flag, 0);
  ASSERT_OK(gpu_->FiniteCheck(p, DType::kBF16, n, flag, nullptr));
  EXPECT_EQ(ReadGpu<int32_t>(flag), 0);
  WriteGpu<uint16_t>(p + n - 1, FloatToBf16(INFINITY));
  ASSERT_OK(gpu_->FiniteCheck(p, DType::kBF16, n, flag, nullptr));
  EXPECT_EQ(ReadGpu<int32_t>(flag), 1) << "FiniteCheck missed the last element";
  WriteGpu<uint16_t>(p + n - 1, FloatToBf16(1.5f));

  ASSERT_OK(gpu_->Scale(p, DType::kBF16, n, 2.0f, nullptr));
  EXPECT_EQ(ReadGpu<uint16_t>(p), FloatToBf16(3.0f));
  EXPECT_EQ(ReadGpu<uint16_t>(p + (size_t{1} << 31)), FloatToBf16(3.0f));
  EXPECT_EQ(ReadGpu<uint16_t>(p + n - 1), FloatToBf16(3.0f)) << "Scale missed the last element";

  // 9 * n is exact in double, and so is every partial sum.
  ASSERT_OK(gpu_->SumOfSquares(p, DType::kBF16, n, sum, nullptr));
  EXPECT_EQ(ReadGpu<double>(sum), 9.0 * static_cast<double>(n));

  // Misaligned view (scalar path) of the last n - 1 elements.
  ASSERT_OK(gpu_->SumOfSquares(p + 1, DType::kBF16, n - 1, sum, nullptr));
  EXPECT_EQ(ReadGpu<double>(sum), 9.0 * static_cast<double>(n - 1));

  // fp32 accumulator past 2^31 elements (8.6 GB).
  Result<DeviceBuffer> acc = gpu_->Allocate(n * 4);
  if (acc.ok()) {
    float* a = acc->as<float>();
    ASSERT_OK(gpu_->Fill(a, DType::kF32, n, 0.5f, nullptr));
    ASSERT_OK(gpu_->Accumulate(a, p, DType::kBF16, n, 1.0f, nullptr));
    EXPECT_EQ(ReadGpu<float>(a + n - 1), 3.5f) << "Accumulate missed the last element";
    ASSERT_OK(gpu_->Cast(p, DType::kBF16, a, DType::kF32, n, nullptr));
    EXPECT_EQ(ReadGpu<float>(a + n - 1), 3.0f) << "Cast missed the last element";
  } else {
    std::printf("skipped the fp32 part: %s\n", acc.status().ToString().c_str());
  }
}

// Informative only: achieved bandwidth on 256M elements (no assertion on speed).
TEST_F(CudaDeviceTest, BandwidthReport) {
  const size_t n = size_t{256} << 20;
  Result<DeviceBuffer> p = gpu_->Allocate(n * 4), g = gpu_->Allocate(n * 4), m = gpu_->Allocate(n * 4),
                       v = gpu_->Allocate(n * 4), h = gpu_->Allocate(n * 2);
  ASSERT_TRUE(p.ok() && g.ok() && m.ok() && v.ok() && h.ok());
  ASSERT_OK(gpu_->Fill(p->data(), DType::kF32, n, 0.5f, nullptr));
  ASSERT_OK(gpu_->Fill(g->data(), DType::kF32, n, 0.01f, nullptr));
  ASSERT_OK(gpu_->Fill(m->data(), DType::kF32, n, 0.0f, nullptr));
  ASSERT_OK(gpu_->Fill(v->data(), DType::kF32, n, 0.0f, nullptr));
  ASSERT_OK(gpu_->Fill(h->data(), DType::kBF16, n, 0.25f, nullptr));
  auto time = [&](const char* what, double bytes_per_elem, auto&& call) {
    ASSERT_OK(call());  // warm-up
    ASSERT_OK(gpu_->Synchronize());
    const int iters = 10;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) ASSERT_OK(call());
    ASSERT_OK(gpu_->Synchronize());
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
    std::printf("bandwidth: %-28s n=%zu  %.3f ms  %.1f GB/s  %.1f Gelem/s\n", what, n, s * 1e3,
                bytes_per_elem * n / s / 1e9, n / s / 1e9);
  };
  time("Accumulate fp32 += bf16", 10,
       [&] { return gpu_->Accumulate(p->as<float>(), h->data(), DType::kBF16, n, 1.0f, nullptr); });
  time("Accumulate fp32 += fp32", 12,
       [&] { return gpu_->Accumulate(p->as<float>(), g->data(), DType::kF32, n, 1.0f, nullptr); });
  AdamWParams hp = testing::AdamWStep(1, true, 1.0f);
  time("AdamW fp32", 28,
       [&] { return gpu_->AdamW(p->as<float>(), g->as<float>(), m->as<float>(), v->as<float>(), n, hp, nullptr); });
  time("AdamWCast fp32 -> bf16", 30, [&] {
    return gpu_->AdamWCast(p->as<float>(), g->as<float>(), m->as<float>(), v->as<float>(), n, hp, h->data(),
                           DType::kBF16, nullptr);
  });
  time("AdamWFromGradient bf16 grad", 26, [&] {
    return gpu_->AdamWFromGradient(p->as<float>(), h->data(), DType::kBF16, m->as<float>(), v->as<float>(), n, hp,
                                   nullptr);
  });
  time("AccumulateFirst fp32 = bf16", 6,
       [&] { return gpu_->AccumulateFirst(p->as<float>(), h->data(), DType::kBF16, n, 1.0f, nullptr); });
  Result<DeviceBuffer> out = gpu_->Allocate(8);
  ASSERT_OK(out);
  time("SumOfSquares fp32", 4,
       [&] { return gpu_->SumOfSquares(p->data(), DType::kF32, n, out->as<double>(), nullptr); });
}

}  // namespace
}  // namespace zero
