// LlmCuda against LlmCpu on the same parameters and batch (its kernels are tested on their own in
// cuda_kernels_test.cc, linked into the same binary).
//
// Bounds (LlmCpu computes in fp32):
// - fp32 parameters, fp32 compute: the loss within 1e-5 relative, every gradient within 1e-4
//   relative L2 (cuBLAS's blocked sums, fused multiply-adds and the flash attention's online
//   softmax against the CPU's sequential sums, through a few layers).
// - bf16 parameters and gradients, fp32 compute: the loss within 1e-5; gradients within 1e-2
//   (the fp32 results as above, then rounded to bf16 on both sides: a value near a rounding
//   boundary lands one bf16 ulp, 2^-8 relative, apart; in a 96-element norm-weight gradient a few
//   such flips make up 2.3e-3, the worst seen on the H200).
// - bf16 parameters and gradients, bf16 compute (the main case), parameter noise 0.1: the loss
//   within 1e-2 relative and every gradient within 5e-2 relative L2: every product input
//   (normalized activations, q/k/v, attention output, SwiGLU product, the gradients fed to
//   products, dlogits) is rounded to bf16 (2^-9 relative each, compounding through the layers and
//   the backward), where the CPU keeps fp32 throughout. Worst seen on the H200: loss 1.1e-4,
//   gradients 2.3e-2 (Qwen3's q/k-norm weights: sums over every row and head of products with the
//   bf16-rounded q/k projections, with cancellation), 1.8e-2 elsewhere.
// Observed on the H200 for the others: fp32 loss <= 7.2e-8, gradients <= 2.1e-5; bf16 parameters
// with fp32 compute loss <= 5.3e-8, gradients <= 2.3e-3.
// Exact properties are checked bitwise: two runs, activation checkpointing against none, loss
// scaling by a power of two. The protocol (acquire/release order, GradReady once per parameter
// while its module is held) is checked on a logging provider and sink, and the model's memory
// against its Device's memory_stats() and arena tally. The printed lines give the observed errors,
// so the bounds can be judged against them.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/device_tensors_testing.h"
#include "models/llama/attention_cudnn.h"
#include "models/llama/batch.h"
#include "models/llama/config.h"
#include "models/llama/cpu_model.h"
#include "models/llama/cuda_model.h"
#include "models/llama/cuda_test_util.h"
#include "models/llama/params.h"
#include "models/model_api.h"
#include "models/model_api_testing.h"
#include "runtime/cpu_device.h"
#include "runtime/cuda_device.h"
#include "runtime/device.h"
#include "runtime/device_arena.h"
#include "runtime/dtype.h"
#include "runtime/gpu_test_util.h"
#include "runtime/status.h"
#include "testing/status_matchers.h"

namespace zero::llm {
namespace {

using cuda_test::Next;
using cuda_test::RelL2;
using examples::DeviceTensors;
using examples::GradBuffers;
using examples::GradView;
using examples::HostTensors;
using examples::InitKind;
using examples::InitParam;
using examples::ModelParamSpec;
using examples::ParamView;
using examples::RandomParams;
using examples::ResidentParams;
using examples::SameBits;

// ---- The model against LlmCpu. ------------------------------------------------------------------

LlmConfig Shape(const char* arch, bool tied, int64_t vocab, int64_t hidden, int64_t inter, int64_t layers,
                int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t max_pos) {
  LlmConfig c;
  c.architecture = arch;
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.intermediate_size = inter;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = head_dim;
  c.max_position_embeddings = max_pos;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = tied;
  EXPECT_OK(c.Validate());
  return c;
}

struct ModelCase {
  std::string name;
  LlmConfig config;
  int batch, seq;
};

std::vector<ModelCase> ModelCases() {
  auto tiny = Preset("tiny");
  EXPECT_OK(tiny);
  return {
      {"tiny", *tiny, 2, 16},
      // seq 256 (8 attention tiles), GQA 8/2, head_dim 32, tied and untied, both architectures;
      // widths off the tiles (H = 96, I = 200, V = 777).
      {"qwen3_tied_s256", Shape(kQwen3Architecture, true, 777, 96, 200, 2, 8, 2, 32, 512), 2, 256},
      {"qwen3_untied_s256", Shape(kQwen3Architecture, false, 777, 96, 200, 2, 8, 2, 32, 512), 2, 256},
      {"llama_tied_s256", Shape(kLlamaArchitecture, true, 777, 96, 200, 2, 8, 2, 12, 512), 2, 256},
      {"llama_untied_s256", Shape(kLlamaArchitecture, false, 777, 96, 200, 2, 8, 4, 12, 512), 1, 256},
  };
}

// Random ids; every 4th target ignored.
LlmBatch RandomBatch(const LlmConfig& c, int batch, int seq, uint64_t seed) {
  LlmBatch b;
  b.batch = batch;
  b.seq = seq;
  uint64_t s = seed;
  for (int i = 0; i < batch * seq; ++i) {
    b.inputs.push_back(static_cast<int32_t>(Next(&s) % c.vocab_size));
    b.targets.push_back(i % 4 == 1 ? kIgnoreIndex : static_cast<int32_t>(Next(&s) % c.vocab_size));
  }
  return b;
}

struct RunResult {
  double loss = 0;
  HostTensors grads;
};

RunResult CpuRun(const LlmConfig& c, const HostTensors& params, const LlmBatch& batch, float loss_scale) {
  LlmCpu model(c);
  RunResult r{0, HostTensors(model.specs(), params.dtype())};
  ResidentParams provider(model.specs(), params.ParamViews());
  GradBuffers sink(r.grads.GradViews());
  LlmActivations acts;
  auto loss = model.Forward(provider, batch, &acts);
  EXPECT_OK(loss);
  r.loss = loss.ok() ? *loss : 0;
  Status st = model.Backward(provider, &acts, loss_scale, sink);
  EXPECT_OK(st);
  return r;
}

// The GPU the model tests run on (GPU 0), opened once and never closed; null (after a failed
// expectation) when it cannot be opened.
CudaDevice* Gpu() {
  static CudaDevice* const device = [] {
    Result<std::unique_ptr<CudaDevice>> d = CudaDevice::Create(0);
    EXPECT_OK(d);
    return d.ok() ? std::move(d).value().release() : nullptr;
  }();
  return device;
}

// A new stream of `device` (null, after a failed expectation, when it cannot be made: the model
// then runs on the default stream).
std::unique_ptr<Stream> NewStream(Device* device) {
  Result<std::unique_ptr<Stream>> s = device->CreateStream();
  EXPECT_OK(s);
  return s.ok() ? std::move(s).value() : nullptr;
}

// expected_ready: how often each gradient is reported (empty: once each).
RunResult GpuRun(const LlmConfig& c, const HostTensors& params, const LlmBatch& batch, float loss_scale,
                 LlmCudaOptions options = {}, std::vector<int> expected_ready = {}) {
  RunResult r{0, HostTensors(LlmParamSpecs(c), params.dtype())};
  CudaDevice* device = Gpu();
  if (device == nullptr) return r;
  const std::unique_ptr<Stream> stream = NewStream(device);
  auto model = LlmCuda::Create(c, device, stream.get(), options);
  EXPECT_OK(model);
  if (!model.ok()) return r;
  {
    DeviceTensors dparams(device, params);
    DeviceTensors dgrads(device, r.grads);
    ResidentParams provider((*model)->specs(), dparams.ParamViews());
    GradBuffers sink(dgrads.GradViews());
    LlmCudaActivations acts;
    auto loss = (*model)->Forward(provider, batch, &acts);
    EXPECT_OK(loss);
    r.loss = loss.ok() ? *loss : 0;
    Status st = (*model)->Backward(provider, &acts, loss_scale, sink);
    EXPECT_OK(st);
    EXPECT_OK(device->SynchronizeStream(stream.get()));
    dgrads.CopyTo(&r.grads);
    EXPECT_EQ(provider.acquires(), provider.releases());
    EXPECT_EQ(provider.held(), 0);
    if (expected_ready.empty()) expected_ready.assign(r.grads.size(), 1);
    EXPECT_EQ(sink.ready_count(), expected_ready);
  }
  model->reset();
  return r;
}

// Relative L2 error of every gradient; prints the worst.
void ExpectClose(const std::string& label, const std::vector<ModelParamSpec>& specs, const RunResult& gpu,
                 const RunResult& cpu, double loss_tol, double grad_tol) {
  const double loss_err = std::abs(gpu.loss - cpu.loss) / std::abs(cpu.loss);
  EXPECT_LE(loss_err, loss_tol) << label << ": loss " << gpu.loss << " vs " << cpu.loss;
  double worst = 0;
  std::string worst_name;
  for (int i = 0; i < cpu.grads.size(); ++i) {
    const std::vector<float> want = cpu.grads.GetAll(i);
    double norm = 0;
    for (float x : want) norm += double(x) * x;
    EXPECT_GT(norm, 0.0) << label << ": " << specs[i].name << " has a zero gradient on the CPU";
    const double err = RelL2(gpu.grads.GetAll(i), want);
    EXPECT_LE(err, grad_tol) << label << ": " << specs[i].name;
    if (err > worst) {
      worst = err;
      worst_name = specs[i].name;
    }
  }
  std::printf("%s: loss %.9g vs %.9g (relative %.2g); worst gradient relative L2 %.2g (%s)\n", label.c_str(), gpu.loss,
              cpu.loss, loss_err, worst, worst_name.c_str());
}

class LlmCudaModelTest : public ::testing::Test {
 protected:
  void SetUp() override { ZERO_SKIP_WITHOUT_CUDA_DEVICES(1); }
};

TEST_F(LlmCudaModelTest, Fp32MatchesCpu) {
  for (const ModelCase& m : ModelCases()) {
    SCOPED_TRACE(m.name);
    const auto specs = LlmParamSpecs(m.config);
    const HostTensors params = RandomParams(specs, DType::kF32, 1);
    const LlmBatch batch = RandomBatch(m.config, m.batch, m.seq, 2);
    ExpectClose("fp32 " + m.name, specs, GpuRun(m.config, params, batch, 1.0f), CpuRun(m.config, params, batch, 1.0f),
                1e-5, 1e-4);
  }
}

TEST_F(LlmCudaModelTest, Bf16ParamsWithFp32ComputeMatchCpu) {
  LlmCudaOptions options;
  options.compute = DType::kF32;
  for (const ModelCase& m : ModelCases()) {
    SCOPED_TRACE(m.name);
    const auto specs = LlmParamSpecs(m.config);
    const HostTensors params = RandomParams(specs, DType::kBF16, 3);
    const LlmBatch batch = RandomBatch(m.config, m.batch, m.seq, 4);
    ExpectClose("bf16 params, fp32 compute " + m.name, specs, GpuRun(m.config, params, batch, 1.0f, options),
                CpuRun(m.config, params, batch, 1.0f), 1e-5, 1e-2);
  }
}

// A batch with head 2 takes its logits from extra head 1: the CPU model's loss and gradients
// (fp32 bounds as Fp32MatchesCpu), extra head 1's gradient reported, the model's own untied lm_head
// and extra head 0 not (their buffers stay zero), the tied embedding's gradient the lookup's only.
TEST_F(LlmCudaModelTest, ExtraHeadMatchesCpu) {
  for (ModelCase m : ModelCases()) {
    SCOPED_TRACE(m.name);
    m.config.extra_heads = 2;
    const auto specs = LlmParamSpecs(m.config);
    const HostTensors params = RandomParams(specs, DType::kF32, 7);
    LlmBatch batch = RandomBatch(m.config, m.batch, m.seq, 8);
    batch.head = 2;
    std::vector<int> ready(specs.size(), 1);
    ready[ExtraHeadIndex(m.config, 0)] = 0;
    if (!m.config.tie_word_embeddings) ready[LmHeadIndex(m.config)] = 0;
    const RunResult gpu = GpuRun(m.config, params, batch, 1.0f, {}, ready);
    const RunResult cpu = CpuRun(m.config, params, batch, 1.0f);
    EXPECT_LE(std::abs(gpu.loss - cpu.loss) / std::abs(cpu.loss), 1e-5) << gpu.loss << " vs " << cpu.loss;
    double worst = 0;
    for (int i = 0; i < cpu.grads.size(); ++i) {
      const std::vector<float> want = cpu.grads.GetAll(i), got = gpu.grads.GetAll(i);
      if (ready[i] == 0) {
        EXPECT_EQ(got, std::vector<float>(got.size(), 0.0f)) << specs[i].name;
        EXPECT_EQ(want, std::vector<float>(want.size(), 0.0f)) << specs[i].name;
        continue;
      }
      const double err = RelL2(got, want);
      EXPECT_LE(err, 1e-4) << specs[i].name;
      worst = std::max(worst, err);
    }
    std::printf("extra head %s: loss %.9g vs %.9g; worst gradient relative L2 %.2g\n", m.name.c_str(), gpu.loss,
                cpu.loss, worst);
  }
}

TEST_F(LlmCudaModelTest, Bf16MatchesCpu) {
  // Noise 0.1, not 0.3: with 0.3 Llama's q and k (no qk-norm) reach attention scores of std ~9,
  // where the bf16 rounding of q and k alone moves the softmax by a few percent and the gradients
  // by ~20% (observed on the H200), a property of that conditioning, not of the code (the same
  // parameters match at 2e-3 with fp32 compute). 0.1 gives scores of std ~1, still far from
  // uniform attention.
  for (const ModelCase& m : ModelCases()) {
    SCOPED_TRACE(m.name);
    const auto specs = LlmParamSpecs(m.config);
    const HostTensors params = RandomParams(specs, DType::kBF16, 5, 0.1f);
    const LlmBatch batch = RandomBatch(m.config, m.batch, m.seq, 6);
    ExpectClose("bf16 " + m.name, specs, GpuRun(m.config, params, batch, 1.0f), CpuRun(m.config, params, batch, 1.0f),
                1e-2, 5e-2);
  }
}

TEST_F(LlmCudaModelTest, CudnnAttentionMatchesTheModelsOwnKernels) {
  // bf16, kAuto (cuDNN where it has a plan: head_dim 32 here; 12 falls back) against kKernel.
  LlmCudaOptions own;
  own.attention = LlmAttention::kKernel;
  for (const ModelCase& m : ModelCases()) {
    SCOPED_TRACE(m.name);
    const auto specs = LlmParamSpecs(m.config);
    const HostTensors params = RandomParams(specs, DType::kBF16, 5, 0.1f);
    const LlmBatch batch = RandomBatch(m.config, m.batch, m.seq, 6);
    const RunResult kernel = GpuRun(m.config, params, batch, 1.0f, own);
    RunResult as_ref{kernel.loss, HostTensors(specs, DType::kF32)};
    for (int i = 0; i < kernel.grads.size(); ++i) as_ref.grads.SetAll(i, kernel.grads.GetAll(i));
    ExpectClose("auto (cuDNN) vs own attention, bf16 " + m.name, specs, GpuRun(m.config, params, batch, 1.0f), as_ref,
                1e-2, 5e-2);
  }
  if (CudnnAttention::Built()) {
    // The backend the model reports, and kCudnn's refusals.
    CudaDevice* device = Gpu();
    ASSERT_NE(device, nullptr);
    const std::unique_ptr<Stream> stream = NewStream(device);
    const ModelCase m = ModelCases()[1];  // head_dim 32
    LlmCudaOptions force;
    force.attention = LlmAttention::kCudnn;
    auto model = LlmCuda::Create(m.config, device, stream.get(), force);
    ASSERT_OK(model);
    const auto specs = LlmParamSpecs(m.config);
    const HostTensors params = RandomParams(specs, DType::kBF16, 5, 0.1f);
    {
      DeviceTensors dparams(device, params);
      ResidentParams provider(specs, dparams.ParamViews());
      LlmCudaActivations acts;
      auto loss = (*model)->Forward(provider, RandomBatch(m.config, m.batch, m.seq, 6), &acts);
      EXPECT_OK(loss);
      EXPECT_EQ((*model)->attention_backend(), "cudnn");
    }
    const ModelCase odd = ModelCases()[3];  // head_dim 12: no cuDNN plan, named
    auto model12 = LlmCuda::Create(odd.config, device, stream.get(), force);
    ASSERT_OK(model12);
    {
      const auto specs12 = LlmParamSpecs(odd.config);
      const HostTensors params12 = RandomParams(specs12, DType::kBF16, 5, 0.1f);
      DeviceTensors dparams(device, params12);
      ResidentParams provider(specs12, dparams.ParamViews());
      LlmCudaActivations acts;
      auto loss = (*model12)->Forward(provider, RandomBatch(odd.config, odd.batch, odd.seq, 6), &acts);
      EXPECT_FALSE(loss.ok());
      EXPECT_NE(loss.status().message().find("head_dim 12"), std::string::npos) << loss.status().ToString();
      EXPECT_EQ(provider.held(), 0);
    }
    model->reset();
    model12->reset();
  }
}

TEST_F(LlmCudaModelTest, FewRowsPerLogitsChunkMatchesOneChunk) {
  // 7 rows per chunk: the lm_head gradient summed over 74 chunks (fp32 buffer, tied scratch, and
  // the bf16 buffer's fp32 stage).
  for (const ModelCase& m : {ModelCases()[1], ModelCases()[2]}) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(m.name + " " + DTypeName(dt));
      const auto specs = LlmParamSpecs(m.config);
      const HostTensors params = RandomParams(specs, dt, 7);
      const LlmBatch batch = RandomBatch(m.config, m.batch, m.seq, 8);
      LlmCudaOptions chunked;
      chunked.logits_chunk_bytes = 7 * m.config.vocab_size * 4;
      const RunResult whole = GpuRun(m.config, params, batch, 1.0f);
      const RunResult parts = GpuRun(m.config, params, batch, 1.0f, chunked);
      RunResult as_ref{whole.loss, HostTensors(specs, dt)};
      for (int i = 0; i < whole.grads.size(); ++i) as_ref.grads.SetAll(i, whole.grads.GetAll(i));
      ExpectClose(std::string("chunked vs whole ") + DTypeName(dt) + " " + m.name, specs, parts, as_ref, 1e-6,
                  dt == DType::kF32 ? 1e-5 : 1e-2);
    }
  }
}

TEST_F(LlmCudaModelTest, CheckpointingAndRepeatedRunsGiveIdenticalBits) {
  for (const ModelCase& m : {ModelCases()[0], ModelCases()[3]}) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(m.name + " " + DTypeName(dt));
      const auto specs = LlmParamSpecs(m.config);
      const HostTensors params = RandomParams(specs, dt, 9);
      const LlmBatch batch = RandomBatch(m.config, m.batch, m.seq, 10);
      LlmCudaOptions ckpt;
      ckpt.activation_checkpointing = true;
      const RunResult a = GpuRun(m.config, params, batch, 1.0f);
      const RunResult b = GpuRun(m.config, params, batch, 1.0f);
      const RunResult c = GpuRun(m.config, params, batch, 1.0f, ckpt);
      EXPECT_EQ(a.loss, b.loss);
      EXPECT_EQ(a.loss, c.loss);
      EXPECT_TRUE(SameBits(a.grads, b.grads)) << "two runs differ";
      EXPECT_TRUE(SameBits(a.grads, c.grads)) << "checkpointing changes the gradients";
    }
  }
}

TEST_F(LlmCudaModelTest, LossScaleByAPowerOfTwoIsExact) {
  const ModelCase m = ModelCases()[2];
  const auto specs = LlmParamSpecs(m.config);
  const HostTensors params = RandomParams(specs, DType::kF32, 11);
  const LlmBatch batch = RandomBatch(m.config, m.batch, m.seq, 12);
  const RunResult a = GpuRun(m.config, params, batch, 1.0f);
  const RunResult s = GpuRun(m.config, params, batch, 1024.0f);
  EXPECT_EQ(a.loss, s.loss);
  for (int i = 0; i < a.grads.size(); ++i) {
    for (int64_t j = 0; j < a.grads.numel(i); ++j) {
      ASSERT_EQ(s.grads.Get(i, j), 1024.0f * a.grads.Get(i, j)) << specs[i].name << "[" << j << "]";
    }
  }
}

// ---- Protocol. ----------------------------------------------------------------------------------

// Logs "A:<module>" / "R:<module>" and checks every GradReady happens while the gradient's module
// is held.
class LoggingProvider : public ResidentParams {
 public:
  LoggingProvider(const std::vector<ModelParamSpec>& specs, std::vector<ParamView> views, std::vector<std::string>* log,
                  std::multiset<std::string>* held)
      : ResidentParams(specs, std::move(views)), log_(log), held_(held) {}
  Result<std::vector<ParamView>> Acquire(const std::string& module) override {
    log_->push_back("A:" + module);
    held_->insert(module);
    return ResidentParams::Acquire(module);
  }
  Status Release(const std::string& module) override {
    log_->push_back("R:" + module);
    held_->erase(held_->find(module));
    return ResidentParams::Release(module);
  }

 private:
  std::vector<std::string>* log_;
  std::multiset<std::string>* held_;
};

class LoggingSink : public GradBuffers {
 public:
  LoggingSink(const std::vector<ModelParamSpec>& specs, std::vector<GradView> views, std::vector<std::string>* log,
              std::multiset<std::string>* held)
      : GradBuffers(std::move(views)), specs_(specs), log_(log), held_(held) {}
  Status GradReady(int i) override {
    EXPECT_EQ(held_->count(specs_[i].module), 1u) << specs_[i].name << " ready while its module is not held";
    log_->push_back("G:" + std::to_string(i));
    return GradBuffers::GradReady(i);
  }

 private:
  const std::vector<ModelParamSpec>& specs_;
  std::vector<std::string>* log_;
  std::multiset<std::string>* held_;
};

TEST_F(LlmCudaModelTest, ModuleOrderAndGradReadyFollowTheContract) {
  for (bool tied : {true, false}) {
    const LlmConfig c = Shape(kQwen3Architecture, tied, 101, 32, 48, 2, 4, 2, 8, 64);
    const auto specs = LlmParamSpecs(c);
    const HostTensors params = RandomParams(specs, DType::kBF16, 13);
    HostTensors host_grads(specs, DType::kBF16);
    CudaDevice* device = Gpu();
    ASSERT_NE(device, nullptr);
    DeviceTensors dparams(device, params), dgrads(device, host_grads);
    std::vector<std::string> log;
    std::multiset<std::string> held;
    LoggingProvider provider(specs, dparams.ParamViews(), &log, &held);
    LoggingSink sink(specs, dgrads.GradViews(), &log, &held);
    const std::unique_ptr<Stream> stream = NewStream(device);
    auto model = LlmCuda::Create(c, device, stream.get());
    ASSERT_OK(model);
    LlmCudaActivations acts;
    ASSERT_OK((*model)->Forward(provider, RandomBatch(c, 2, 8, 14), &acts));
    ASSERT_OK((*model)->Backward(provider, &acts, 1.0f, sink));
    ASSERT_OK(device->SynchronizeStream(stream.get()));
    std::vector<std::string> modules;
    for (const std::string& e : log) {
      if (e[0] != 'G') modules.push_back(e);
    }
    std::vector<std::string> expected;
    if (tied) {
      expected = {"A:embed",  "R:embed",  "A:layer0", "R:layer0", "A:layer1", "R:layer1", "A:head",
                  "A:embed",  "R:embed",  "R:head",   "A:head",   "A:embed",  "R:embed",  "R:head",
                  "A:layer1", "R:layer1", "A:layer0", "R:layer0", "A:embed",  "R:embed"};
    } else {
      expected = {"A:embed", "R:embed", "A:layer0", "R:layer0", "A:layer1", "R:layer1", "A:head",  "R:head",
                  "A:head",  "R:head",  "A:layer1", "R:layer1", "A:layer0", "R:layer0", "A:embed", "R:embed"};
    }
    EXPECT_EQ(modules, expected) << (tied ? "tied" : "untied");
    EXPECT_EQ(provider.max_held(), tied ? 2 : 1);
    EXPECT_EQ(provider.held(), 0);
    EXPECT_EQ(sink.ready_count(), std::vector<int>(specs.size(), 1));
    // The embedding's gradient is the last one, in the final "embed" phase.
    ASSERT_GE(log.size(), 2u);
    EXPECT_EQ(log[log.size() - 2], "G:0");
    model->reset();
  }
}

TEST_F(LlmCudaModelTest, LossWithoutWaitingComesFromBackward) {
  const ModelCase m = ModelCases()[0];
  const auto specs = LlmParamSpecs(m.config);
  const HostTensors params = RandomParams(specs, DType::kBF16, 15);
  HostTensors host_grads(specs, DType::kBF16);
  CudaDevice* device = Gpu();
  ASSERT_NE(device, nullptr);
  DeviceTensors dparams(device, params), dgrads(device, host_grads);
  ResidentParams provider(specs, dparams.ParamViews());
  GradBuffers sink(dgrads.GradViews());
  const std::unique_ptr<Stream> stream = NewStream(device);
  auto model = LlmCuda::Create(m.config, device, stream.get());
  ASSERT_OK(model);
  const LlmBatch batch = RandomBatch(m.config, m.batch, m.seq, 16);
  LlmCudaActivations acts;
  auto with = (*model)->Forward(provider, batch, &acts, /*want_loss=*/true);
  ASSERT_OK(with);
  auto without = (*model)->Forward(provider, batch, &acts, /*want_loss=*/false);
  ASSERT_OK(without);
  EXPECT_TRUE(std::isnan(*without));
  EXPECT_EQ((*model)->ReadLoss(acts).status().code(), StatusCode::kFailedPrecondition);
  ASSERT_OK((*model)->Backward(provider, &acts, 1.0f, sink));
  auto later = (*model)->ReadLoss(acts);
  ASSERT_OK(later);
  EXPECT_NEAR(*later, *with, 1e-6 * *with);
  EXPECT_EQ(acts.counted_targets(), m.batch * m.seq - (m.batch * m.seq + 2) / 4);
  model->reset();
}

TEST_F(LlmCudaModelTest, AllTargetsIgnoredGivesZeroLossAndGradients) {
  const ModelCase m = ModelCases()[0];
  const auto specs = LlmParamSpecs(m.config);
  const HostTensors params = RandomParams(specs, DType::kF32, 17);
  LlmBatch batch = RandomBatch(m.config, m.batch, m.seq, 18);
  std::fill(batch.targets.begin(), batch.targets.end(), kIgnoreIndex);
  const RunResult r = GpuRun(m.config, params, batch, 1.0f);
  EXPECT_EQ(r.loss, 0.0);
  for (int i = 0; i < r.grads.size(); ++i) {
    for (int64_t j = 0; j < r.grads.numel(i); ++j) ASSERT_EQ(r.grads.Get(i, j), 0.0f) << specs[i].name;
  }
}

TEST_F(LlmCudaModelTest, ErrorsNameTheProblemAndReleaseEverything) {
  const ModelCase m = ModelCases()[0];
  const auto specs = LlmParamSpecs(m.config);
  const HostTensors params = RandomParams(specs, DType::kBF16, 19);
  HostTensors host_grads(specs, DType::kBF16);
  CudaDevice* device = Gpu();
  ASSERT_NE(device, nullptr);
  DeviceTensors dparams(device, params), dgrads(device, host_grads);
  ResidentParams provider(specs, dparams.ParamViews());
  GradBuffers sink(dgrads.GradViews());
  const std::unique_ptr<Stream> stream = NewStream(device);
  auto model = LlmCuda::Create(m.config, device, stream.get());
  ASSERT_OK(model);
  LlmCudaActivations acts;
  EXPECT_EQ((*model)->Backward(provider, &acts, 1.0f, sink).code(), StatusCode::kFailedPrecondition);
  LlmBatch bad = RandomBatch(m.config, 2, 8, 20);
  bad.inputs[11] = static_cast<int32_t>(m.config.vocab_size);
  auto loss = (*model)->Forward(provider, bad, &acts);
  ASSERT_FALSE(loss.ok());
  EXPECT_NE(loss.status().message().find("row 1, position 3"), std::string::npos) << loss.status().ToString();
  EXPECT_EQ(provider.held(), 0);
  LlmCudaOptions options;
  options.compute = DType::kF16;
  EXPECT_EQ(LlmCuda::Create(m.config, device, stream.get(), options).status().code(), StatusCode::kInvalidArgument);
  LlmConfig wide = m.config;
  wide.head_dim = 512;
  EXPECT_EQ(LlmCuda::Create(wide, device, stream.get()).status().code(), StatusCode::kUnimplemented);
  model->reset();
}

// Every buffer the model and its activations hold is an arena of the model's Device: the device's
// in-use bytes grow by exactly the arenas' tally ("activations": what Forward saves; "workspace":
// the backward's scratch and the model's), and return when they are freed. bf16 parameters and
// gradients with fp32 compute and tied embeddings make every lazily allocated scratch appear (the
// converted weights, the fp32 gradient stage, the [V, H] tied gradient).
TEST_F(LlmCudaModelTest, BuffersComeFromTheDeviceAndCountInItsMemoryStats) {
  const ModelCase m = ModelCases()[1];  // tied
  ASSERT_TRUE(m.config.tie_word_embeddings);
  Result<std::unique_ptr<CudaDevice>> opened = CudaDevice::Create(0);  // its own memory statistics
  ASSERT_OK(opened);
  CudaDevice* device = opened->get();
  const auto specs = LlmParamSpecs(m.config);
  const HostTensors params = RandomParams(specs, DType::kBF16, 21);
  HostTensors host_grads(specs, DType::kBF16);
  DeviceTensors dparams(device, params), dgrads(device, host_grads);
  ResidentParams provider(specs, dparams.ParamViews());
  GradBuffers sink(dgrads.GradViews());
  const size_t base = device->memory_stats().in_use;
  EXPECT_EQ(DeviceArenaBytes(device), 0u);
  LlmCudaOptions options;
  options.compute = DType::kF32;
  {
    auto model = LlmCuda::Create(m.config, device, nullptr, options);
    ASSERT_OK(model);
    EXPECT_EQ((*model)->device(), device);
    EXPECT_EQ((*model)->stream(), device->native_stream(nullptr));
    LlmCudaActivations acts;
    ASSERT_OK((*model)->Forward(provider, RandomBatch(m.config, m.batch, m.seq, 22), &acts));
    const size_t after_forward = DeviceArenaBytes(device, "activations");
    EXPECT_GT(acts.activation_bytes(), 0);
    EXPECT_EQ(after_forward, static_cast<size_t>(acts.activation_bytes()));
    ASSERT_OK((*model)->Backward(provider, &acts, 1.0f, sink));
    ASSERT_OK(device->Synchronize());
    const size_t arenas = DeviceArenaBytes(device);
    const size_t workspace = DeviceArenaBytes(device, "workspace");
    EXPECT_EQ(arenas, after_forward + workspace);
    EXPECT_EQ(device->memory_stats().in_use - base, arenas);
    // The activations' workspace plus the model's converted weights and gradient stage.
    EXPECT_GT(workspace, static_cast<size_t>(acts.bytes() - acts.activation_bytes()));
    EXPECT_GE(acts.bytes() - acts.activation_bytes(),
              m.config.vocab_size * m.config.hidden_size * 4);  // the [V, H] tied gradient
    std::printf("memory of %s: activations %zu bytes, workspace %zu bytes (of which the activations' %lld)\n",
                m.name.c_str(), after_forward, workspace,
                static_cast<long long>(acts.bytes() - acts.activation_bytes()));
    model->reset();
    EXPECT_EQ(DeviceArenaBytes(device, "workspace"), static_cast<size_t>(acts.bytes() - acts.activation_bytes()));
  }
  EXPECT_EQ(DeviceArenaBytes(device), 0u);
  EXPECT_EQ(device->memory_stats().in_use, base);
}

// Runs without a GPU: the device is checked before anything touches CUDA.
TEST(LlmCudaCreateTest, RefusesADeviceThatIsNotCuda) {
  auto tiny = Preset("tiny");
  ASSERT_OK(tiny);
  CpuDevice cpu;
  const auto on_cpu = LlmCuda::Create(*tiny, &cpu, nullptr);
  EXPECT_EQ(on_cpu.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(on_cpu.status().message().find("device cpu is not a CUDA device"), std::string::npos)
      << on_cpu.status().ToString();
  EXPECT_EQ(LlmCuda::Create(*tiny, nullptr, nullptr).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zero::llm
