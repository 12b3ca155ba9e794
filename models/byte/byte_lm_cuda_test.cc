// ByteLmCuda against ByteLmCpu on the same parameters and batch.
//
// Tolerances, and why:
// - fp32: the loss within 1e-5 relative and every gradient element within 1e-4 of its tensor's
//   largest magnitude. Both sides round every operation to fp32 but sum in different orders
//   (cuBLAS's blocked/split reductions vs the CPU's sequential ones, warp-shuffle vs sequential
//   LayerNorm and column sums), and expf/erff/logf differ from glibc's by an ulp or two. Such
//   differences are ~1e-6 relative per value; chained through a few layers they stay well under
//   1e-4 of each tensor's scale. Elements near zero carry absolute, not relative, error, hence the
//   per-tensor scale.
// - bf16 and fp16 (parameters and gradients in that dtype, math in fp32 on both sides): the fp32
//   results differ as above, and rounding to 16 bits can then land one ulp apart where a value sits
//   near a rounding boundary: one ulp is 2^-8 (bf16) / 2^-11 (fp16) relative to the value, so the
//   bound is 1e-2 (bf16) / 2e-3 (fp16) of the tensor's largest magnitude.
// Exact properties (loss scaling by a power of two, run-to-run determinism) are checked bitwise.
// Observed on an H200: 1.3e-6 (fp32), 2.3e-3 (bf16), 3.9e-4 (fp16) of the tensor's scale.
#include "models/byte/byte_lm_cuda.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/byte/byte_lm.h"
#include "models/device_tensors_testing.h"
#include "models/model_api.h"
#include "models/model_api_testing.h"
#include "runtime/cpu_device.h"
#include "runtime/cuda_device.h"
#include "runtime/device.h"
#include "runtime/device_arena.h"
#include "runtime/gpu_test_util.h"
#include "testing/status_matchers.h"

namespace zero::examples {
namespace {

std::vector<uint8_t> RandomTokens(int batch, int context, uint64_t seed) {
  std::vector<uint8_t> t(static_cast<size_t>(batch) * (context + 1));
  uint64_t s = seed;
  for (auto& b : t) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    b = static_cast<uint8_t>(32 + (s >> 58) % 60);
  }
  return t;
}

struct RunResult {
  double loss = 0;
  HostTensors grads;
};

RunResult CpuRun(const ByteLmConfig& c, const HostTensors& params, const std::vector<uint8_t>& tokens, int batch,
                 float loss_scale) {
  ByteLmCpu model(c);
  RunResult r{0, HostTensors(model.specs(), params.dtype())};
  ResidentParams provider(model.specs(), params.ParamViews());
  GradBuffers sink(r.grads.GradViews());
  ByteLmActivations acts;
  auto loss = model.Forward(provider, tokens.data(), batch, &acts);
  EXPECT_OK(loss);
  r.loss = loss.ok() ? *loss : 0;
  Status st = model.Backward(provider, &acts, loss_scale, sink);
  EXPECT_OK(st);
  return r;
}

// The GPU the tests run on (GPU 0), opened once and never closed.
CudaDevice* Gpu() {
  static CudaDevice* const device = [] {
    Result<std::unique_ptr<CudaDevice>> d = CudaDevice::Create(0);
    EXPECT_OK(d);
    return d.ok() ? std::move(d).value().release() : nullptr;
  }();
  return device;
}

RunResult GpuRun(const ByteLmConfig& c, const HostTensors& params, const std::vector<uint8_t>& tokens, int batch,
                 float loss_scale, GradBuffers** sink_out = nullptr, ResidentParams** provider_out = nullptr) {
  CudaDevice* device = Gpu();
  if (device == nullptr) return RunResult{0, HostTensors(ByteLmParamSpecs(c), params.dtype())};
  Result<std::unique_ptr<Stream>> stream = device->CreateStream();
  EXPECT_OK(stream);
  auto model = ByteLmCuda::Create(c, device, stream.ok() ? stream->get() : nullptr);
  EXPECT_OK(model);
  RunResult r{0, HostTensors((*model)->specs(), params.dtype())};
  DeviceTensors dparams(device, params);
  DeviceTensors dgrads(device, r.grads);
  ResidentParams provider((*model)->specs(), dparams.ParamViews());
  GradBuffers sink(dgrads.GradViews());
  ByteLmCudaActivations acts;
  Status st = (*model)->Forward(provider, tokens.data(), batch, &acts, &r.loss);
  EXPECT_OK(st);
  st = (*model)->Backward(provider, &acts, loss_scale, sink);
  EXPECT_OK(st);
  EXPECT_OK(device->SynchronizeStream(stream.ok() ? stream->get() : nullptr));
  dgrads.CopyTo(&r.grads);
  EXPECT_EQ(provider.acquires(), provider.releases());
  EXPECT_EQ(provider.max_held(), 1);
  for (int i = 0; i < static_cast<int>(sink.ready_count().size()); ++i) EXPECT_EQ(sink.ready_count()[i], 1);
  model->reset();
  return r;
}

// Also prints the observed errors, so the tolerances can be judged against them.
void ExpectClose(const std::string& label, const std::vector<ModelParamSpec>& specs, const RunResult& gpu,
                 const RunResult& cpu, double loss_tol, double grad_tol) {
  EXPECT_NEAR(gpu.loss, cpu.loss, loss_tol * std::abs(cpu.loss));
  double worst = 0;
  std::string worst_name;
  for (int i = 0; i < cpu.grads.size(); ++i) {
    float scale = 0;
    double err = 0;
    for (int64_t j = 0; j < cpu.grads.numel(i); ++j) scale = std::max(scale, std::abs(cpu.grads.Get(i, j)));
    for (int64_t j = 0; j < cpu.grads.numel(i); ++j) {
      err = std::max(err, double(std::abs(gpu.grads.Get(i, j) - cpu.grads.Get(i, j))));
    }
    EXPECT_GT(scale, 0.0f) << specs[i].name;
    EXPECT_LE(err, grad_tol * scale) << specs[i].name << ": max error " << err << ", scale " << scale;
    if (scale > 0 && err / scale > worst) {
      worst = err / scale;
      worst_name = specs[i].name;
    }
  }
  std::printf("%s: loss %.9g vs %.9g (relative %.2g); worst gradient error %.2g of its tensor's scale (%s)\n",
              label.c_str(), gpu.loss, cpu.loss, std::abs(gpu.loss - cpu.loss) / std::abs(cpu.loss), worst,
              worst_name.c_str());
}

struct Case {
  ByteLmConfig config;
  int batch;
};

std::vector<Case> Cases() {
  ByteLmConfig odd;  // widths that are not multiples of the kernels' tiles
  odd.context = 3;
  odd.embed_dim = 5;
  odd.hidden = 24;
  odd.ffn = 40;
  odd.layers = 2;
  return {{ByteLmConfig{}, 64}, {odd, 7}, {ByteLmConfig{}, 300}};
}

TEST(ByteLmCudaTest, Fp32MatchesCpu) {
  ZERO_SKIP_WITHOUT_CUDA_DEVICES(1);
  for (const Case& t : Cases()) {
    const std::string label = "fp32 " + t.config.ToString() + " B=" + std::to_string(t.batch);
    SCOPED_TRACE(label);
    const auto specs = ByteLmParamSpecs(t.config);
    HostTensors params = RandomParams(specs, DType::kF32, 3, 0.2f);
    const auto tokens = RandomTokens(t.batch, t.config.context, 5);
    ExpectClose(label, specs, GpuRun(t.config, params, tokens, t.batch, 1.0f),
                CpuRun(t.config, params, tokens, t.batch, 1.0f), 1e-5, 1e-4);
  }
}

TEST(ByteLmCudaTest, SixteenBitMatchesCpu) {
  ZERO_SKIP_WITHOUT_CUDA_DEVICES(1);
  for (DType dt : {DType::kBF16, DType::kF16}) {
    for (const Case& t : Cases()) {
      const std::string label =
          std::string(DTypeName(dt)) + " " + t.config.ToString() + " B=" + std::to_string(t.batch);
      SCOPED_TRACE(label);
      const auto specs = ByteLmParamSpecs(t.config);
      HostTensors params = RandomParams(specs, dt, 4, 0.2f);
      const auto tokens = RandomTokens(t.batch, t.config.context, 6);
      const float scale = dt == DType::kF16 ? 1024.0f : 1.0f;  // keeps fp16 gradients out of subnormals
      ExpectClose(label, specs, GpuRun(t.config, params, tokens, t.batch, scale),
                  CpuRun(t.config, params, tokens, t.batch, scale), 1e-5, dt == DType::kBF16 ? 1e-2 : 2e-3);
    }
  }
}

TEST(ByteLmCudaTest, LossScaleExactAndRunsReproducible) {
  ZERO_SKIP_WITHOUT_CUDA_DEVICES(1);
  const ByteLmConfig c;
  const auto specs = ByteLmParamSpecs(c);
  HostTensors params = RandomParams(specs, DType::kF32, 7, 0.2f);
  const auto tokens = RandomTokens(128, c.context, 8);
  RunResult a = GpuRun(c, params, tokens, 128, 1.0f);
  RunResult b = GpuRun(c, params, tokens, 128, 1.0f);
  RunResult s = GpuRun(c, params, tokens, 128, 4096.0f);
  EXPECT_EQ(a.loss, b.loss);
  for (int i = 0; i < a.grads.size(); ++i) {
    for (int64_t j = 0; j < a.grads.numel(i); ++j) {
      ASSERT_EQ(a.grads.Get(i, j), b.grads.Get(i, j)) << specs[i].name << "[" << j << "]";
      ASSERT_EQ(s.grads.Get(i, j), 4096.0f * a.grads.Get(i, j)) << specs[i].name << "[" << j << "]";
    }
  }
}

TEST(ByteLmCudaTest, SgdOnDeviceReducesTheLoss) {
  ZERO_SKIP_WITHOUT_CUDA_DEVICES(1);
  ByteLmConfig c;
  CudaDevice* device = Gpu();
  ASSERT_NE(device, nullptr);
  auto model = ByteLmCuda::Create(c, device, nullptr);
  ASSERT_OK(model);
  HostTensors host(ByteLmParamSpecs(c), DType::kF32);
  host.Init(ByteLmParamSpecs(c), 1);
  DeviceTensors params(device, host);
  HostTensors host_grads(ByteLmParamSpecs(c), DType::kF32);
  DeviceTensors grads(device, host_grads);
  ResidentParams provider((*model)->specs(), params.ParamViews());
  GradBuffers sink(grads.GradViews());
  ByteLmCudaActivations acts;
  const std::string text =
      "the quick brown fox jumps over the lazy dog; the lazy dog sleeps while the quick fox runs. ";
  const int batch = 128, k = c.context;
  std::vector<uint8_t> tokens(batch * (k + 1));
  double first = 0, last = 0;
  for (int step = 0; step < 40; ++step) {
    for (int b = 0; b < batch; ++b) {
      const size_t start = (step * 131 + b * 17) % (text.size() - k);
      std::memcpy(&tokens[b * (k + 1)], text.data() + start, k + 1);
    }
    double loss = 0;
    ASSERT_OK((*model)->Forward(provider, tokens.data(), batch, &acts, &loss));
    ASSERT_OK((*model)->Backward(provider, &acts, 1.0f, sink));
    // SGD on the host copies (small model; keeps the test free of extra kernels).
    grads.CopyTo(&host_grads);
    for (int i = 0; i < host.size(); ++i) {
      float* p = static_cast<float*>(host.data(i));
      const float* g = static_cast<const float*>(host_grads.data(i));
      for (int64_t j = 0; j < host.numel(i); ++j) p[j] -= 0.3f * g[j];
    }
    params.CopyFrom(host);
    if (step == 0) first = loss;
    last = loss;
  }
  EXPECT_LT(last, first - 1.5) << "first " << first << " last " << last;
  model->reset();
}

// The model's and its activations' device memory are arenas of its Device: the in-use bytes grow
// by the arenas' tally and return when they are freed; a larger batch regrows the activations.
TEST(ByteLmCudaTest, BuffersComeFromTheDeviceAndCountInItsMemoryStats) {
  ZERO_SKIP_WITHOUT_CUDA_DEVICES(1);
  Result<std::unique_ptr<CudaDevice>> opened = CudaDevice::Create(0);  // its own memory statistics
  ASSERT_OK(opened);
  CudaDevice* device = opened->get();
  const ByteLmConfig c;
  const auto specs = ByteLmParamSpecs(c);
  HostTensors host = RandomParams(specs, DType::kBF16, 9, 0.2f);
  HostTensors host_grads(specs, DType::kBF16);
  DeviceTensors params(device, host), grads(device, host_grads);
  ResidentParams provider(specs, params.ParamViews());
  GradBuffers sink(grads.GradViews());
  const size_t base = device->memory_stats().in_use;
  {
    auto model = ByteLmCuda::Create(c, device, nullptr);
    ASSERT_OK(model);
    EXPECT_EQ((*model)->device(), device);
    const size_t workspace = DeviceArenaBytes(device, "workspace");
    EXPECT_GT(workspace, 0u);  // the fp32 copies of one module's parameters and gradients
    EXPECT_EQ(device->memory_stats().in_use - base, workspace);
    ByteLmCudaActivations acts;
    size_t last = 0;
    for (int batch : {16, 64, 8}) {
      SCOPED_TRACE(batch);
      const auto tokens = RandomTokens(batch, c.context, 10);
      ASSERT_OK((*model)->Forward(provider, tokens.data(), batch, &acts, nullptr));
      ASSERT_OK((*model)->Backward(provider, &acts, 1.0f, sink));
      ASSERT_OK(device->Synchronize());
      EXPECT_GT(DeviceArenaBytes(device, "activations"), 0u);
      EXPECT_EQ(DeviceArenaBytes(device), workspace + static_cast<size_t>(acts.bytes()));
      EXPECT_EQ(device->memory_stats().in_use - base, DeviceArenaBytes(device));
      if (batch == 8) {
        EXPECT_EQ(static_cast<size_t>(acts.bytes()), last);  // kept for a smaller batch
      }
      last = acts.bytes();
    }
    model->reset();
    EXPECT_EQ(DeviceArenaBytes(device), static_cast<size_t>(acts.bytes()));
  }
  EXPECT_EQ(DeviceArenaBytes(device), 0u);
  EXPECT_EQ(device->memory_stats().in_use, base);
}

// Runs without a GPU: the device is checked before anything touches CUDA.
TEST(ByteLmCudaTest, RefusesADeviceThatIsNotCuda) {
  CpuDevice cpu;
  const auto model = ByteLmCuda::Create(ByteLmConfig{}, &cpu, nullptr);
  EXPECT_EQ(model.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(model.status().message().find("device cpu is not a CUDA device"), std::string::npos)
      << model.status().ToString();
}

}  // namespace
}  // namespace zero::examples
