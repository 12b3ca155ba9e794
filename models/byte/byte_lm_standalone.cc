// byte_lm_standalone: trains ByteLm on one process without the engine (fp32 master weights and
// AdamW on the host, the model on the CPU or one GPU), prints the loss and speed, and samples text.
// It is the reference the engine's zero_train is compared with, and the quickest check that the
// model learns.
//
//   bazel run -c opt //models/byte:byte_lm_standalone -- --steps=300 --batch=64
//   flags: --data=PATH --steps --batch --lr --seed --context --embed --hidden --ffn --layers
//          --dtype=fp32|bf16 --device=cpu|cuda --log_every --holdout --sample --temperature --prompt
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "data/byte_data.h"
#include "models/byte/byte_lm.h"
#include "models/model_api.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/status.h"

#if defined(ZERO_EXAMPLES_HAS_CUDA)
#include <cuda_runtime_api.h>

#include "models/byte/byte_lm_cuda.h"
#include "runtime/cuda_device.h"
#endif

namespace zero::examples {
namespace {

struct Flags {
  std::map<std::string, std::string> values;
  std::string Get(const std::string& k, const std::string& def) const {
    auto it = values.find(k);
    return it == values.end() ? def : it->second;
  }
  int Int(const std::string& k, int def) const { return std::stoi(Get(k, std::to_string(def))); }
  double Double(const std::string& k, double def) const { return std::stod(Get(k, std::to_string(def))); }
};

Result<Flags> ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0 || a.find('=') == std::string::npos) {
      return InvalidArgumentError("expected --name=value, got " + a);
    }
    const size_t eq = a.find('=');
    f.values[a.substr(2, eq - 2)] = a.substr(eq + 1);
  }
  return f;
}

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// One forward+backward on whichever device; params/grads are host tensors of the model dtype.
class Runner {
 public:
  virtual ~Runner() = default;
  virtual Result<double> Step(const HostTensors& params, const uint8_t* tokens, int batch, HostTensors* grads) = 0;
  virtual Result<double> Loss(const HostTensors& params, const uint8_t* tokens, int batch) = 0;
};

class CpuRunner : public Runner {
 public:
  explicit CpuRunner(const ByteLmConfig& c) : model_(c) {}
  Result<double> Step(const HostTensors& params, const uint8_t* tokens, int batch, HostTensors* grads) override {
    ResidentParams provider(model_.specs(), params.ParamViews());
    GradBuffers sink(grads->GradViews());
    ZERO_ASSIGN_OR_RETURN(double loss, model_.Forward(provider, tokens, batch, &acts_));
    ZERO_RETURN_IF_ERROR(model_.Backward(provider, &acts_, 1.0f, sink));
    return loss;
  }
  Result<double> Loss(const HostTensors& params, const uint8_t* tokens, int batch) override {
    ResidentParams provider(model_.specs(), params.ParamViews());
    return model_.Forward(provider, tokens, batch, &acts_);
  }

 private:
  ByteLmCpu model_;
  ByteLmActivations acts_;
};

#if defined(ZERO_EXAMPLES_HAS_CUDA)
class CudaRunner : public Runner {
 public:
  static Result<std::unique_ptr<CudaRunner>> Create(const ByteLmConfig& c, DType dtype) {
    auto r = std::unique_ptr<CudaRunner>(new CudaRunner());
    ZERO_ASSIGN_OR_RETURN(r->device_, CudaDevice::Create(0));
    r->stream_ = r->device_->native_stream(nullptr);  // the model's: its device's default stream
    ZERO_ASSIGN_OR_RETURN(r->model_, ByteLmCuda::Create(c, r->device_.get(), nullptr));
    for (const ModelParamSpec& s : r->model_->specs()) {
      const size_t bytes = s.numel() * SizeOf(dtype);
      ZERO_ASSIGN_OR_RETURN(DeviceBuffer p, r->device_->Allocate(bytes));
      ZERO_ASSIGN_OR_RETURN(DeviceBuffer g, r->device_->Allocate(bytes));
      r->params_.push_back({p.data(), dtype});
      r->grads_.push_back({g.data(), dtype});
      r->bytes_.push_back(bytes);
      r->buffers_.push_back(std::move(p));
      r->buffers_.push_back(std::move(g));
    }
    return r;
  }
  ~CudaRunner() override { model_.reset(); }
  Result<double> Step(const HostTensors& params, const uint8_t* tokens, int batch, HostTensors* grads) override {
    ZERO_RETURN_IF_ERROR(Upload(params));
    ResidentParams provider(model_->specs(), params_);
    GradBuffers sink(grads_);
    double loss = 0;
    ZERO_RETURN_IF_ERROR(model_->Forward(provider, tokens, batch, &acts_, nullptr));
    ZERO_RETURN_IF_ERROR(model_->Backward(provider, &acts_, 1.0f, sink));
    ZERO_ASSIGN_OR_RETURN(loss, model_->ReadLoss(acts_));
    for (size_t i = 0; i < grads_.size(); ++i) {
      if (cudaMemcpy(grads->data(i), grads_[i].data, bytes_[i], cudaMemcpyDeviceToHost) != cudaSuccess) {
        return InternalError("gradient download failed");
      }
    }
    return loss;
  }
  Result<double> Loss(const HostTensors& params, const uint8_t* tokens, int batch) override {
    ZERO_RETURN_IF_ERROR(Upload(params));
    ResidentParams provider(model_->specs(), params_);
    double loss = 0;
    ZERO_RETURN_IF_ERROR(model_->Forward(provider, tokens, batch, &acts_, &loss));
    return loss;
  }

 private:
  CudaRunner() = default;
  Status Upload(const HostTensors& params) {
    for (size_t i = 0; i < params_.size(); ++i) {
      if (cudaMemcpyAsync(const_cast<void*>(params_[i].data), params.data(i), bytes_[i], cudaMemcpyHostToDevice,
                          stream_) != cudaSuccess) {
        return InternalError("parameter upload failed");
      }
    }
    return OkStatus();
  }
  std::unique_ptr<CudaDevice> device_;  // outlives the model, its activations and buffers_
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<ByteLmCuda> model_;
  ByteLmCudaActivations acts_;
  std::vector<ParamView> params_;
  std::vector<GradView> grads_;
  std::vector<size_t> bytes_;
  std::vector<DeviceBuffer> buffers_;  // the parameters' and gradients' device memory, from device_
};
#endif

Status Main(int argc, char** argv) {
  ZERO_ASSIGN_OR_RETURN(Flags flags, ParseFlags(argc, argv));
  ByteLmConfig c;
  c.context = flags.Int("context", c.context);
  c.embed_dim = flags.Int("embed", c.embed_dim);
  c.hidden = flags.Int("hidden", c.hidden);
  c.ffn = flags.Int("ffn", c.ffn);
  c.layers = flags.Int("layers", c.layers);
  ZERO_RETURN_IF_ERROR(c.Validate());
  const int steps = flags.Int("steps", 300), batch = flags.Int("batch", 64);
  const int log_every = flags.Int("log_every", 50);
  const uint64_t seed = flags.Int("seed", 1);
  DType dtype;
  if (!ParseDType(flags.Get("dtype", "fp32"), &dtype) || dtype == DType::kF16) {
    return InvalidArgumentError("--dtype: expected fp32 or bf16 (fp16 needs loss scaling: use the engine)");
  }
  AdamWParams adam;
  adam.lr = static_cast<float>(flags.Double("lr", 3e-3));
  adam.beta2 = 0.99f;
  adam.weight_decay = static_cast<float>(flags.Double("weight_decay", 0.0));

  ZERO_ASSIGN_OR_RETURN(ByteDataset all, ByteDataset::FromFile(flags.Get("data", kDefaultCorpusPath)));
  auto [train, holdout] = all.Split(flags.Double("holdout", 0.05));

  const std::string device = flags.Get("device", "cpu");
  std::unique_ptr<Runner> runner;
  if (device == "cpu") {
    runner = std::make_unique<CpuRunner>(c);
  } else if (device == "cuda") {
#if defined(ZERO_EXAMPLES_HAS_CUDA)
    ZERO_ASSIGN_OR_RETURN(runner, CudaRunner::Create(c, dtype));
#else
    return UnimplementedError("--device=cuda: built without the CUDA toolkit");
#endif
  } else {
    return InvalidArgumentError("--device: expected cpu or cuda, got " + device);
  }

  const std::vector<ModelParamSpec> specs = ByteLmParamSpecs(c);
  HostTensors master(specs, DType::kF32);
  master.Init(specs, seed);
  HostTensors model_params(specs, dtype), grads(specs, dtype);
  std::vector<std::vector<float>> m(specs.size()), v(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    m[i].assign(specs[i].numel(), 0.0f);
    v[i].assign(specs[i].numel(), 0.0f);
  }
  std::printf("byte_lm %s: %lld parameters, data %s (%zu bytes train, %zu holdout), batch %d, %s %s\n",
              c.ToString().c_str(), static_cast<long long>(c.NumParams()), all.name().c_str(), train.size(),
              holdout.size(), batch, device.c_str(), DTypeName(dtype));

  std::vector<uint8_t> tokens(static_cast<size_t>(batch) * (c.context + 1));
  double model_seconds = 0, window_loss = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int step = 0; step < steps; ++step) {
    ZERO_RETURN_IF_ERROR(train.FillBatch(
        BatchSpec{.seed = seed, .step = step, .rank = 0, .world_size = 1, .batch = batch, .context = c.context},
        tokens.data()));
    for (int i = 0; i < master.size(); ++i) {
      if (dtype == DType::kF32) {
        std::memcpy(model_params.data(i), master.data(i), master.numel(i) * 4);
      } else {
        model_params.SetAll(i, master.GetAll(i));
      }
    }
    const auto m0 = std::chrono::steady_clock::now();
    ZERO_ASSIGN_OR_RETURN(double loss, runner->Step(model_params, tokens.data(), batch, &grads));
    model_seconds += Seconds(m0, std::chrono::steady_clock::now());
    adam.bias_correction1 = 1.0f - std::pow(adam.beta1, step + 1);
    adam.bias_correction2 = 1.0f - std::pow(adam.beta2, step + 1);
    for (int i = 0; i < master.size(); ++i) {
      float* p = static_cast<float*>(master.data(i));
      for (int64_t j = 0; j < master.numel(i); ++j) AdamWReference(&p[j], grads.Get(i, j), &m[i][j], &v[i][j], adam);
    }
    window_loss += loss;
    if ((step + 1) % log_every == 0 || step + 1 == steps) {
      const int n = (step + 1) % log_every == 0 ? log_every : (step + 1) % log_every;
      std::printf("step %5d  loss %.4f  (%.3f bits/byte)\n", step + 1, window_loss / n,
                  window_loss / n / std::log(2.0));
      window_loss = 0;
    }
  }
  const double total = Seconds(t0, std::chrono::steady_clock::now());
  std::printf(
      "%d steps in %.2f s: %.1f steps/s, %.0f tokens/s overall; forward+backward alone %.1f steps/s, "
      "%.0f tokens/s\n",
      steps, total, steps / total, double(steps) * batch / total, steps / model_seconds,
      double(steps) * batch / model_seconds);

  for (int i = 0; i < master.size(); ++i) model_params.SetAll(i, master.GetAll(i));
  if (holdout.size() > static_cast<size_t>(c.context) + 1) {
    const int64_t windows = static_cast<int64_t>(holdout.size()) - c.context;
    double sum = 0;
    int64_t count = 0;
    for (int64_t first = 0; first < windows; first += batch) {
      const int n = static_cast<int>(std::min<int64_t>(batch, windows - first));
      ZERO_ASSIGN_OR_RETURN(std::vector<uint8_t> rows, holdout.SequentialBatch(first, n, c.context));
      ZERO_ASSIGN_OR_RETURN(double loss, runner->Loss(model_params, rows.data(), n));
      sum += loss * n;
      count += n;
    }
    std::printf("holdout loss %.4f (%.3f bits/byte) over %lld windows\n", sum / count, sum / count / std::log(2.0),
                static_cast<long long>(count));
  }

  const int sample = flags.Int("sample", 200);
  if (sample > 0) {
    HostTensors fp32(specs, DType::kF32);
    for (int i = 0; i < master.size(); ++i) fp32.SetAll(i, model_params.GetAll(i));
    ByteLmCpu sampler(c);
    ResidentParams provider(specs, fp32.ParamViews());
    const std::string prompt = flags.Get("prompt", "The ");
    ZERO_ASSIGN_OR_RETURN(std::string text,
                          sampler.Sample(provider, prompt, sample, flags.Double("temperature", 0.8), seed));
    std::printf("sample: %s%s\n", prompt.c_str(), text.c_str());
  }
  return OkStatus();
}

}  // namespace
}  // namespace zero::examples

int main(int argc, char** argv) {
  zero::Status st = zero::examples::Main(argc, argv);
  if (!st.ok()) {
    std::fprintf(stderr, "byte_lm_standalone: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
