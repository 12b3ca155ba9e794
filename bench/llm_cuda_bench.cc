// llm_cuda_bench: forward + backward throughput of LlmCuda on one GPU, with every parameter and
// gradient resident (no engine, no optimizer step). Parameters are random (a tiled block of
// normal(0, 0.02) values; norm weights 1); the batch is random ids. Prints tokens/s and the model
// TFLOPS of LlmConfig::TrainFlopsPerToken (recomputation not counted).
//
//   llm_cuda_bench --preset=qwen3-0.6b --seq=2048 --batch=4 [--layers=N] [--dtype=bf16|fp32]
//                  [--checkpointing] [--profile] [--steps=10] [--warmup=2] [--logits-chunk-mib=1024]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench/bench_flags.h"
#include "models/llama/batch.h"
#include "models/llama/config.h"
#include "models/llama/cuda_model.h"
#include "models/llama/params.h"
#include "models/model_api.h"
#include "runtime/cuda_device.h"
#include "runtime/cuda_status.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/status.h"

namespace zero::llm {
namespace {

const char kUsage[] =
    "usage: llm_cuda_bench [--preset=NAME] [--seq=S] [--batch=B] [--layers=L] [--dtype=bf16|fp32]\n"
    "                      [--checkpointing] [--profile] [--attention=auto|kernel|cudnn] [--steps=N] [--warmup=N] "
    "[--logits-chunk-mib=M]\n"
    "  --preset           a preset of llm_config.h (default tiny)\n"
    "  --layers           override num_hidden_layers (to fit a large preset on one GPU)\n"
    "  --dtype            parameters, gradients and compute (default bf16)\n"
    "  --checkpointing    recompute each layer's forward in backward\n"
    "  --attention        auto (cuDNN's fused attention where it can, default), kernel (the model's own), cudnn\n"
    "  --profile          after the timed steps, one more step with every operation timed on the device\n";

struct Options {
  std::string preset = "tiny";
  int64_t seq = 512, batch = 8, layers = 0, steps = 10, warmup = 2, chunk_mib = 1024;
  DType dtype = DType::kBF16;
  bool checkpointing = false;
  bool profile = false;
  LlmAttention attention = LlmAttention::kAuto;
};

Result<Options> Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") return bench::HelpRequested();
    if (arg == "--checkpointing") {
      o.checkpointing = true;
      continue;
    }
    if (arg == "--profile") {
      o.profile = true;
      continue;
    }
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos) {
      return InvalidArgumentError("unexpected argument '" + arg + "'");
    }
    const std::string flag = arg.substr(0, eq), v = arg.substr(eq + 1);
    if (flag == "--preset") {
      o.preset = v;
    } else if (flag == "--seq") {
      ZERO_RETURN_IF_ERROR(bench::ParseInt(flag, v, 1, 1 << 20, &o.seq));
    } else if (flag == "--batch") {
      ZERO_RETURN_IF_ERROR(bench::ParseInt(flag, v, 1, 1 << 16, &o.batch));
    } else if (flag == "--layers") {
      ZERO_RETURN_IF_ERROR(bench::ParseInt(flag, v, 1, 1000, &o.layers));
    } else if (flag == "--steps") {
      ZERO_RETURN_IF_ERROR(bench::ParseInt(flag, v, 1, 100000, &o.steps));
    } else if (flag == "--warmup") {
      ZERO_RETURN_IF_ERROR(bench::ParseInt(flag, v, 0, 100000, &o.warmup));
    } else if (flag == "--logits-chunk-mib") {
      ZERO_RETURN_IF_ERROR(bench::ParseInt(flag, v, 1, 1 << 20, &o.chunk_mib));
    } else if (flag == "--attention") {
      if (v == "auto") {
        o.attention = LlmAttention::kAuto;
      } else if (v == "kernel") {
        o.attention = LlmAttention::kKernel;
      } else if (v == "cudnn") {
        o.attention = LlmAttention::kCudnn;
      } else {
        return InvalidArgumentError("--attention: expected auto, kernel or cudnn, got '" + v + "'");
      }
    } else if (flag == "--dtype") {
      if (!ParseDType(v, &o.dtype) || o.dtype == DType::kF16) {
        return InvalidArgumentError("--dtype: expected bf16 or fp32, got '" + v + "'");
      }
    } else {
      return InvalidArgumentError("unknown flag " + flag);
    }
  }
  return o;
}

Status Run(const Options& o) {
  ZERO_ASSIGN_OR_RETURN(LlmConfig c, Preset(o.preset));
  if (o.layers > 0) c.num_hidden_layers = o.layers;
  c.max_position_embeddings = std::max<int64_t>(c.max_position_embeddings, o.seq);
  ZERO_RETURN_IF_ERROR(c.Validate());
  const std::vector<examples::ModelParamSpec> specs = LlmParamSpecs(c);
  const size_t es = SizeOf(o.dtype);

  // A block of random values in the dtype, tiled into every matrix; ones into every norm weight.
  constexpr int64_t kBlock = 1 << 20;
  std::vector<uint8_t> host_block(kBlock * es), host_ones(kBlock * es);
  {
    uint64_t s = 1;
    for (int64_t i = 0; i < kBlock; ++i) {
      double acc = 0;
      for (int k = 0; k < 4; ++k) {  // sum of 4 uniforms: near-normal, std 1/sqrt(3)
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        acc += static_cast<double>(s >> 11) / 9007199254740992.0 - 0.5;
      }
      StoreFromFloat(host_block.data(), o.dtype, i, static_cast<float>(acc * 0.02 * 1.7320508));
      StoreFromFloat(host_ones.data(), o.dtype, i, 1.0f);
    }
  }
  // Everything (parameters, gradients, the model's buffers) is memory of GPU 0 through its Device;
  // the copies and the model run on its default stream.
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<CudaDevice> device, CudaDevice::Create(0));
  ZERO_ASSIGN_OR_RETURN(DeviceBuffer d_block, device->Allocate(host_block.size()));
  ZERO_ASSIGN_OR_RETURN(DeviceBuffer d_ones, device->Allocate(host_ones.size()));
  ZERO_RETURN_IF_ERROR(
      device->Copy(d_block.data(), host_block.data(), host_block.size(), CopyKind::kHostToDevice, nullptr));
  ZERO_RETURN_IF_ERROR(
      device->Copy(d_ones.data(), host_ones.data(), host_ones.size(), CopyKind::kHostToDevice, nullptr));
  std::vector<DeviceBuffer> params, grads;
  std::vector<examples::ParamView> pviews;
  std::vector<examples::GradView> gviews;
  for (const examples::ModelParamSpec& spec : specs) {
    const int64_t n = spec.numel();
    ZERO_ASSIGN_OR_RETURN(DeviceBuffer p, device->Allocate(n * es));
    ZERO_ASSIGN_OR_RETURN(DeviceBuffer g, device->Allocate(n * es));
    const void* src = spec.init == examples::InitKind::kOnes ? d_ones.data() : d_block.data();
    for (int64_t at = 0; at < n; at += kBlock) {
      const int64_t len = std::min(kBlock, n - at);
      ZERO_RETURN_IF_ERROR(device->Copy(p.as<char>() + at * es, src, len * es, CopyKind::kDeviceToDevice, nullptr));
    }
    pviews.push_back({p.data(), o.dtype});
    gviews.push_back({g.data(), o.dtype});
    params.push_back(std::move(p));
    grads.push_back(std::move(g));
  }
  ZERO_RETURN_IF_ERROR(device->SynchronizeStream(nullptr));
  examples::ResidentParams provider(specs, pviews);
  examples::GradBuffers sink(gviews);

  LlmBatch batch;
  batch.batch = static_cast<int>(o.batch);
  batch.seq = static_cast<int>(o.seq);
  uint64_t s = 7;
  for (int64_t i = 0; i < o.batch * o.seq; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    batch.inputs.push_back(static_cast<int32_t>((s >> 33) % c.vocab_size));
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    batch.targets.push_back(static_cast<int32_t>((s >> 33) % c.vocab_size));
  }

  LlmCudaOptions options;
  options.activation_checkpointing = o.checkpointing;
  options.logits_chunk_bytes = o.chunk_mib << 20;
  options.profile = o.profile;
  options.attention = o.attention;
  Status status = [&]() -> Status {
    ZERO_ASSIGN_OR_RETURN(auto model, LlmCuda::Create(c, device.get(), /*stream=*/nullptr, options));
    LlmCudaActivations acts;
    double loss = 0;
    auto step = [&]() -> Status {
      ZERO_ASSIGN_OR_RETURN(double unused, model->Forward(provider, batch, &acts, /*want_loss=*/false));
      (void)unused;
      ZERO_RETURN_IF_ERROR(model->Backward(provider, &acts, 1.0f, sink));
      return OkStatus();
    };
    for (int64_t i = 0; i < o.warmup; ++i) ZERO_RETURN_IF_ERROR(step());
    ZERO_RETURN_IF_ERROR(device->SynchronizeStream(nullptr));
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < o.steps; ++i) ZERO_RETURN_IF_ERROR(step());
    ZERO_RETURN_IF_ERROR(device->SynchronizeStream(nullptr));
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ZERO_ASSIGN_OR_RETURN(loss, model->ReadLoss(acts));
    size_t free_bytes = 0, total_bytes = 0;
    ZERO_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
    const double tokens = static_cast<double>(o.batch * o.seq) * o.steps;
    const double tps = tokens / secs;
    const double tflops = tps * c.TrainFlopsPerToken(static_cast<int>(o.seq)) / 1e12;
    std::printf("%s\n", c.ToString().c_str());
    std::printf(
        "dtype %s batch %lld seq %lld checkpointing %s attention %s: %.2f ms/step, %.0f tokens/s, %.1f model TFLOPS "
        "(%.3g FLOPs/token); activations %.2f GiB, device memory in use %.2f GiB; loss %.4f\n",
        DTypeName(o.dtype), static_cast<long long>(o.batch), static_cast<long long>(o.seq),
        o.checkpointing ? "on" : "off", model->attention_backend().c_str(), 1e3 * secs / o.steps, tps, tflops,
        c.TrainFlopsPerToken(static_cast<int>(o.seq)), acts.bytes() / 1073741824.0,
        (total_bytes - free_bytes) / 1073741824.0, loss);
    if (!model->attention_note().empty()) std::printf("attention note: %s\n", model->attention_note().c_str());
    if (o.profile) {
      // The timed steps' marks are dropped; one more step is profiled on its own.
      ZERO_RETURN_IF_ERROR(model->TakeProfile().status());
      ZERO_RETURN_IF_ERROR(step());
      ZERO_ASSIGN_OR_RETURN(std::vector<LlmOpTime> ops, model->TakeProfile());
      double total = 0;
      for (const LlmOpTime& op : ops) total += op.ms;
      std::sort(ops.begin(), ops.end(), [](const LlmOpTime& a, const LlmOpTime& b) { return a.ms > b.ms; });
      std::printf("profile of one step (device time between marks, %.2f ms in all):\n", total);
      for (const LlmOpTime& op : ops) {
        std::printf("  %-20s %9.3f ms %5.1f%% %6lld calls\n", op.name.c_str(), op.ms, 100.0 * op.ms / total,
                    static_cast<long long>(op.count));
      }
    }
    return OkStatus();
  }();
  return status;
}

}  // namespace
}  // namespace zero::llm

int main(int argc, char** argv) {
  return zero::bench::BenchMain("llm_cuda_bench", zero::llm::kUsage, zero::llm::Parse(argc, argv),
                                [](const zero::llm::Options& o) { return zero::llm::Run(o); });
}
