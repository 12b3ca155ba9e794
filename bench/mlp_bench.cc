// mlp_bench: times training steps of a residual-MLP stack (bench/mlp_cuda.h; by default the
// 1.07B-parameter job of ../shared/DEVICE.md: 8 blocks of Linear 4096x16384 -> ReLU ->
// Linear 16384x4096 + residual, 8192 tokens, bf16 parameters, fp32 master weights, AdamW) driven
// through the Engine exactly as a user would: GatherModule per block, param(i), then
// grad_buffer(i)/GradReady(i) in reverse order, Backward(), Step(). bench/fsdp2_reference.py is
// the same job in PyTorch FSDP2; bench/run_fsdp_compare.sh runs both and prints the table
// (docs/performance.md).
//
//   mlp_bench [--impl zero|none] [--stage N] [--tokens N] [--steps N] [--label NAME] ...
//   mlp_bench --dry-run ...   checks the flags and the engine config on the CPU (no GPU), prints
//                             the PCIe count, exits
//
// --impl none runs the same forward/backward without the Engine (plain bf16 buffers, no
// optimizer): the compute floor of our kernels. Output: one line per run,
//   BENCH impl=.. config=.. tokens=.. params=.. steps=.. init_s=.. fwd_s=.. fwd_bwd_s=.. step_s=..
//         peak_gib=.. gpu_used_gib=.. loss_first=.. loss_last=.. gas=.. clip=..
//         pcie_h2d_gb=.. pcie_d2h_gb=.. pcie_param_up_min_gb=.. pcie_param_up_max_gb=..
// (times: per optimizer step, median over steps 2..N of wall time after a device synchronize;
// fwd_s by CUDA events, summed over the step's micro steps; peak_gib: the Device's allocation
// high-water mark over the timed steps, engine state plus activations; gpu_used_gib:
// cudaMemGetInfo's used memory after the last step, context included; pcie_*: see below),
// preceded by '#' lines with the per-step times and the engine's memory breakdown.
//
// Gradient accumulation (--gas N): the engine's managed mode (gradient_accumulation_steps N): each
// optimizer step is N micro steps (forward, backward, Backward()) of the same batch, then one
// Step(); the loss gradient is multiplied by gradient_scale() (1/N) as the engine asks. --clip X sets
// gradient_clipping (0: off). Either one turns the update in backward off (docs/zero.md, "Update in backward").
//
// PCIe bytes per optimizer step (PcieCount; world 1, bf16 parameters, E = parameter count; what the
// configuration implies by docs/offload.md's data paths, counted, not measured; GB = 1e9 bytes):
//   no offload                                   0 (stage 3 with one rank gathers nothing)
//   offload_optimizer cpu, CPU AdamW (update_device cpu):
//     update in backward (GAS 1, no clip, st 2/3) down 2E (bf16 gradients), up 2E (bf16 weights)
//     stages 2/3, offload_grad_accumulation cpu  down GAS x 2E (each micro step's bf16 gradients)
//     stages 2/3, offload_grad_accumulation gpu  down 4E (the fp32 sum, once per step)
//     stage 1 (fp32 accumulators on the GPU)      down 4E
//     new weights                                up 2E; 0 with offload_param cpu (the host shards
//                                                are written on the host)
//   offload_optimizer cpu, update_device gpu     up 12E, down 12E (fp32 master, exp_avg,
//     (chunked)                                  exp_avg_sq); with the update in backward 2E
//                                                more each way (the bf16 weights down into the
//                                                host model copy, up into the model at Step)
//   offload_param cpu (stage 3), on top          up between 2E (every shard once: the step
//                                                changed them) and GAS x 2 x 2E (one upload per
//                                                GatherModule, forward and backward): the
//                                                coordinator keeps modules gathered within
//                                                stage3_max_live_parameters, and the engine does
//                                                not report its upload count (pcie_param_up_*)
//   offload_optimizer nvme, or offload_param without offload_optimizer cpu: not counted (na)
// pcie_h2d_gb excludes the parameter uploads; the PCIe floor of a step is the bytes over the
// pinned bandwidth bench/pcie_bench measures in the same run.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_flags.h"
#include "comm/communicator.h"
#include "comm/rendezvous.h"
#include "engine/config/config.h"
#include "engine/engine.h"
#include "runtime/device.h"
#include "runtime/status.h"

#if defined(ZERO_BENCH_HAS_CUDA)
#include <cuda_runtime_api.h>

#include "bench/mlp_cuda.h"
#include "runtime/cuda_device.h"
#include "runtime/cuda_status.h"
#include "runtime/device_arena.h"
#endif

namespace zero::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string impl = "zero";  // "zero" | "none"
  int stage = 3;
  std::string comm_dtype = "fp32";  // "fp32" | "bf16" | "none" (the key left out)
  int64_t tokens = 8192;
  int64_t dim = 4096;
  int64_t ffn = 16384;
  int blocks = 8;
  int steps = 5;
  double lr = 1e-4;
  double weight_decay = 0.01;
  std::string label;
  std::string device = "cuda:0";
  std::string offload_optimizer = "none";  // "none" | "cpu" | "nvme"
  std::string nvme_path;                   // with "nvme"
  int64_t sub_group_size = 100000000;      // with "nvme"
  int64_t host_memory_budget = 0;          // with "nvme": > 0 keeps that many bytes of state on the host (tiered)
  int64_t buffer_count = 4;                // with "nvme": offload_optimizer.buffer_count
  int64_t aio_block_size = 1048576;        // with "nvme": aio.block_size
  int64_t aio_queue_depth = 8;             // with "nvme": aio.queue_depth
  int64_t aio_threads = 1;                 // with "nvme": aio.intra_op_parallelism
  int64_t prefetch_bucket = 0;             // > 0: zero_optimization.stage3_prefetch_bucket_size
  std::string offload_param = "none";      // "none" | "cpu" (stage 3)
  std::string update_device = "cpu";       // with "cpu": offload_optimizer.update_device (gpu: chunked)
  int64_t chunk_size = int64_t{1} << 24;   // with update_device gpu
  int64_t chunk_buffers = 3;
  bool overlap_step = false;              // with update_device gpu: offload_optimizer.overlap_step
  int gas = 1;                            // gradient_accumulation_steps (managed mode)
  double clip = 0.0;                      // gradient_clipping (0: off)
  std::string offload_grad_accumulation;  // "" (key left out) | "cpu" | "gpu"
  bool pin_memory = true;
  std::string trace;  // non-empty: zero_trace of the last step into this file
  bool dry_run = false;
};

const char kUsage[] =
    "usage: mlp_bench [--impl zero|none] [--stage 0..3] [--comm-dtype fp32|bf16|none]\n"
    "                 [--tokens N] [--dim N] [--ffn N] [--blocks N] [--steps N>=2]\n"
    "                 [--lr X] [--weight-decay X] [--label NAME] [--device cuda:N] [--dry-run]\n"
    "                 [--offload-optimizer none|cpu|nvme] [--nvme-path DIR] [--sub-group-size N] [--pin-memory 0|1]\n"
    "                 [--host-memory-budget BYTES] [--buffer-count N] [--aio-block-size N] [--aio-queue-depth N] "
    "[--aio-threads N]\n"
    "                 [--prefetch-bucket N]\n"
    "                 [--update-device cpu|gpu] [--chunk-size N] [--chunk-buffers N] [--offload-param none|cpu]\n"
    "                 [--overlap-step 0|1] [--gas N] [--clip X]\n"
    "                 [--offload-grad-accumulation cpu|gpu] [--trace FILE]\n";

Result<Options> ParseFlags(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    if (f == "--help" || f == "-h") return HelpRequested();
    if (f == "--dry-run") {
      o.dry_run = true;
      continue;
    }
    if (i + 1 >= argc) return InvalidArgumentError(f + ": missing value (or unknown flag)");
    const char* v = argv[++i];
    int64_t n = 0;
    if (f == "--impl") {
      o.impl = v;
      if (o.impl != "zero" && o.impl != "none")
        return InvalidArgumentError("--impl: expected zero or none, got '" + o.impl + "'");
    } else if (f == "--stage") {
      ZERO_RETURN_IF_ERROR(ParseInt(f, v, 0, &n));
      if (n > 3) return InvalidArgumentError("--stage: expected 0..3, got " + std::to_string(n));
      o.stage = static_cast<int>(n);
    } else if (f == "--comm-dtype") {
      o.comm_dtype = v;
      if (o.comm_dtype != "fp32" && o.comm_dtype != "bf16" && o.comm_dtype != "none") {
        return InvalidArgumentError("--comm-dtype: expected fp32, bf16 or none, got '" + o.comm_dtype + "'");
      }
    } else if (f == "--tokens") {
      ZERO_RETURN_IF_ERROR(ParseInt(f, v, 1, &o.tokens));
    } else if (f == "--dim") {
      ZERO_RETURN_IF_ERROR(ParseInt(f, v, 64, &o.dim));
    } else if (f == "--ffn") {
      ZERO_RETURN_IF_ERROR(ParseInt(f, v, 64, &o.ffn));
    } else if (f == "--blocks") {
      ZERO_RETURN_IF_ERROR(ParseInt(f, v, 1, &n));
      o.blocks = static_cast<int>(n);
    } else if (f == "--steps") {
      ZERO_RETURN_IF_ERROR(ParseInt(f, v, 2, &n));
      o.steps = static_cast<int>(n);
    } else if (f == "--lr") {
      ZERO_RETURN_IF_ERROR(ParseDouble(f, v, &o.lr));
    } else if (f == "--weight-decay") {
      ZERO_RETURN_IF_ERROR(ParseDouble(f, v, &o.weight_decay));
    } else if (f == "--label") {
      o.label = v;
    } else if (f == "--device") {
      o.device = v;
    } else if (f == "--offload-optimizer") {
      o.offload_optimizer = v;
      if (o.offload_optimizer != "none" && o.offload_optimizer != "cpu" && o.offload_optimizer != "nvme") {
        return InvalidArgumentError("--offload-optimizer: expected none, cpu or nvme, got '" + o.offload_optimizer +
                                    "'");
      }
    } else if (f == "--nvme-path") {
      o.nvme_path = v;
    } else if (f == "--sub-group-size") {
      ZERO_RETURN_IF_ERROR(ParseInt(f, v, 1, &o.sub_group_size));
    } else if (f == "--offload-param") {
      o.offload_param = v;
      if (o.offload_param != "none" && o.offload_param != "cpu") {
        return InvalidArgumentError("--offload-param: expected none or cpu, got '" + o.offload_param + "'");
      }
    } else if (f == "--update-device") {
      o.update_device = v;
      if (o.update_device != "cpu" && o.update_device != "gpu") {
        return InvalidArgumentError("--update-device: expected cpu or gpu, got '" + o.update_device + "'");
      }
    } else if (f == "--overlap-step") {
      int64_t b = 0;
      ZERO_RETURN_IF_ERROR(ParseInt(f, v, 0, &b));
      o.overlap_step = b != 0;
    } else if (f == "--gas") {
      ZERO_RETURN_IF_ERROR(ParseInt(f, v, 1, &n));
      o.gas = static_cast<int>(n);
    } else if (f == "--clip") {
      ZERO_RETURN_IF_ERROR(ParseDouble(f, v, &o.clip));
    } else if (f == "--offload-grad-accumulation") {
      o.offload_grad_accumulation = v;
      if (o.offload_grad_accumulation != "cpu" && o.offload_grad_accumulation != "gpu") {
        return InvalidArgumentError("--offload-grad-accumulation: expected cpu or gpu, got '" +
                                    o.offload_grad_accumulation + "'");
      }
    } else if (f == "--chunk-size") {
      ZERO_RETURN_IF_ERROR(ParseInt(f, v, 1, &o.chunk_size));
    } else if (f == "--chunk-buffers") {
      ZERO_RETURN_IF_ERROR(ParseInt(f, v, 2, &o.chunk_buffers));
    } else if (f == "--host-memory-budget") {
      ZERO_RETURN_IF_ERROR(ParseInt(f, v, 0, &o.host_memory_budget));
    } else if (f == "--buffer-count") {
      ZERO_RETURN_IF_ERROR(ParseInt(f, v, 1, &o.buffer_count));
    } else if (f == "--aio-block-size") {
      ZERO_RETURN_IF_ERROR(ParseInt(f, v, 4096, &o.aio_block_size));
    } else if (f == "--aio-queue-depth") {
      ZERO_RETURN_IF_ERROR(ParseInt(f, v, 1, &o.aio_queue_depth));
    } else if (f == "--prefetch-bucket") {
      ZERO_RETURN_IF_ERROR(ParseInt(f, v, 1, &o.prefetch_bucket));
    } else if (f == "--aio-threads") {
      ZERO_RETURN_IF_ERROR(ParseInt(f, v, 1, &o.aio_threads));
    } else if (f == "--trace") {
      o.trace = v;
    } else if (f == "--pin-memory") {
      ZERO_RETURN_IF_ERROR(ParseInt(f, v, 0, &n));
      o.pin_memory = n != 0;
    } else {
      return InvalidArgumentError("unknown flag '" + f + "'");
    }
  }
  if (o.dim % 64 != 0 || o.ffn % 64 != 0) return InvalidArgumentError("--dim and --ffn must be multiples of 64");
  if (o.label.empty()) o.label = o.impl == "none" ? "compute" : "stage" + std::to_string(o.stage);
  return o;
}

// The DeepSpeed-style config of the run: bf16 model, fp32 master weights, AdamW, gradient_clipping
// --clip (default 0: the FSDP2 reference has none), --gas micro steps per optimizer step.
std::string ConfigJson(const Options& o) {
  char buf[4096];
  const bool nvme = o.offload_optimizer == "nvme";
  const std::string nvme_keys =
      nvme ? ", \"nvme_path\": \"" + o.nvme_path + "\", \"buffer_count\": " + std::to_string(o.buffer_count) +
                 (o.host_memory_budget > 0 ? ", \"host_memory_budget\": " + std::to_string(o.host_memory_budget)
                                           : std::string())
           : std::string();
  const std::string chunk_keys = o.offload_optimizer == "cpu" && o.update_device == "gpu"
                                     ? ", \"update_device\": \"gpu\", \"chunk_size\": " + std::to_string(o.chunk_size) +
                                           ", \"chunk_buffers\": " + std::to_string(o.chunk_buffers) +
                                           (o.overlap_step ? ", \"overlap_step\": true" : "")
                                     : std::string();
  const std::string offload =
      o.offload_optimizer == "none"
          ? std::string()
          : ", \"offload_optimizer\": {\"device\": \"" + o.offload_optimizer +
                "\", \"pin_memory\": " + (o.pin_memory ? "true" : "false") + nvme_keys + chunk_keys + "}" +
                (nvme ? ", \"sub_group_size\": " + std::to_string(o.sub_group_size) : std::string());
  const std::string prefetch =
      o.prefetch_bucket > 0 ? ", \"stage3_prefetch_bucket_size\": " + std::to_string(o.prefetch_bucket) : std::string();
  const std::string param_offload =
      o.offload_param == "cpu" ? ", \"offload_param\": {\"device\": \"cpu\", \"pin_memory\": " +
                                     std::string(o.pin_memory ? "true" : "false") + ", \"buffer_size\": 1000000000}"
                               : std::string();
  const std::string grad_acc = o.offload_grad_accumulation.empty()
                                   ? std::string()
                                   : ", \"offload_grad_accumulation\": \"" + o.offload_grad_accumulation + "\"";
  const std::string aio = nvme ? "\"aio\": {\"block_size\": " + std::to_string(o.aio_block_size) +
                                     ", \"queue_depth\": " + std::to_string(o.aio_queue_depth) +
                                     ", \"intra_op_parallelism\": " + std::to_string(o.aio_threads) + "}, "
                               : std::string();
  // zero_trace of the last step only (docs/timeline.md): steady state, one step's spans.
  const std::string trace = o.trace.empty() ? std::string()
                                            : "\"zero_trace\": {\"enabled\": true, \"path\": \"" + o.trace +
                                                  "\", \"first_step\": " + std::to_string(o.steps) +
                                                  ", \"last_step\": " + std::to_string(o.steps) + "}, ";
  std::snprintf(buf, sizeof(buf),
                "{%s\"train_batch_size\": %d, \"train_micro_batch_size_per_gpu\": 1, "
                "\"gradient_accumulation_steps\": %d, \"gradient_clipping\": %.17g, "
                "\"bf16\": {\"enabled\": true}, %s%s"
                "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": %.17g, \"betas\": [0.9, 0.999], "
                "\"eps\": 1e-8, \"weight_decay\": %.17g}}, "
                "\"zero_optimization\": {\"stage\": %d%s%s%s%s}}",
                trace.c_str(), o.gas, o.gas, o.clip, aio.c_str(),
                o.comm_dtype == "none" ? "" : ("\"communication_data_type\": \"" + o.comm_dtype + "\", ").c_str(), o.lr,
                o.weight_decay, o.stage, offload.c_str(), param_offload.c_str(), grad_acc.c_str(), prefetch.c_str());
  return buf;
}

// Parameters in block order, each block fc1.weight, fc1.bias, fc2.weight, fc2.bias; module
// "block<l>" (the unit of stage-3 gathering, as fully_shard(block) is FSDP2's).
std::vector<ParamSpec> Specs(const Options& o) {
  std::vector<ParamSpec> s;
  for (int l = 0; l < o.blocks; ++l) {
    const std::string m = "block" + std::to_string(l);
    s.push_back({m + ".fc1.weight", {o.ffn, o.dim}, m});
    s.push_back({m + ".fc1.bias", {o.ffn}, m});
    s.push_back({m + ".fc2.weight", {o.dim, o.ffn}, m});
    s.push_back({m + ".fc2.bias", {o.dim}, m});
  }
  return s;
}

int64_t Numel(const ParamSpec& s) {
  int64_t n = 1;
  for (int64_t d : s.shape) n *= d;
  return n;
}

int64_t TotalParams(const Options& o) {
  int64_t n = 0;
  for (const ParamSpec& s : Specs(o)) n += Numel(s);
  return n;
}

// nn.Linear's default bound, 1/sqrt(fan_in), for the weight and the bias.
float Bound(const Options& o, int index) { return 1.0f / std::sqrt(static_cast<float>(index % 4 < 2 ? o.dim : o.ffn)); }

constexpr uint32_t kInputStream = 1000;  // the hash stream of the input (parameters: their index)

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double GiB(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }

// PCIe bytes of one optimizer step as the configuration implies them (the table in the header
// comment; world 1, bf16 parameters). `counted` false: a data path this count does not model.
struct PcieCount {
  bool counted = false;
  double h2d = 0;           // host->device, parameter uploads excluded
  double d2h = 0;           // device->host
  double param_up_min = 0;  // offload_param cpu: shard uploads, lower and upper bound
  double param_up_max = 0;
  std::string how;  // the terms, for the '#' line
};

PcieCount CountPcie(const Options& o) {
  PcieCount c;
  const double e = static_cast<double>(TotalParams(o));
  const bool param_cpu = o.offload_param == "cpu";
  if (o.impl == "none" || (o.offload_optimizer == "none" && !param_cpu)) {
    c.counted = true;
    c.how = "no offload: nothing crosses PCIe";
    return c;
  }
  if (o.offload_optimizer != "cpu") {
    c.how = o.offload_optimizer == "nvme" ? "offload_optimizer nvme: not counted"
                                          : "offload_param without offload_optimizer cpu: not counted";
    return c;
  }
  c.counted = true;
  // docs/zero.md, "Update in backward": managed, GAS 1, one rank, stages 2/3, no clipping (bf16: no fp16).
  const bool in_backward = o.gas == 1 && o.stage >= 2 && o.clip == 0.0;
  if (o.update_device == "gpu") {
    c.h2d = 12 * e + (in_backward ? 2 * e : 0);
    c.d2h = 12 * e + (in_backward ? 2 * e : 0);
    c.how = std::string("chunked GPU AdamW: up 12E states") +
            (in_backward ? " + 2E bf16 host model copy (update in backward)" : "") + ", down 12E states" +
            (in_backward ? " + 2E bf16 host model copy" : "");
  } else {
    std::string grads;
    if (in_backward) {
      c.d2h = 2 * e;
      grads = "down 2E bf16 gradients (update in backward)";
    } else if (o.stage == 1) {
      c.d2h = 4 * e;
      grads = "down 4E fp32 gradients (stage 1: device accumulators)";
    } else if (o.offload_grad_accumulation == "gpu") {
      c.d2h = 4 * e;
      grads = "down 4E fp32 gradient sum (offload_grad_accumulation gpu)";
    } else {
      c.d2h = 2.0 * o.gas * e;
      grads = "down GAS x 2E bf16 gradients (offload_grad_accumulation cpu, GAS " + std::to_string(o.gas) + ")";
    }
    c.h2d = param_cpu ? 0 : 2 * e;
    c.how =
        "CPU AdamW: " + grads + (param_cpu ? ", new weights into the host shards (no upload)" : ", up 2E bf16 weights");
  }
  if (param_cpu) {
    c.param_up_min = 2 * e;
    c.param_up_max = 2.0 * 2.0 * o.gas * e;
    c.how += "; offload_param cpu: shard uploads 2E .. GAS x 2 x 2E";
  }
  return c;
}

// The BENCH line's PCIe fields.
std::string PcieFields(const Options& o) {
  const PcieCount c = CountPcie(o);
  if (!c.counted) return "pcie_h2d_gb=na pcie_d2h_gb=na pcie_param_up_min_gb=na pcie_param_up_max_gb=na";
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "pcie_h2d_gb=%.3f pcie_d2h_gb=%.3f pcie_param_up_min_gb=%.3f pcie_param_up_max_gb=%.3f", c.h2d / 1e9,
                c.d2h / 1e9, c.param_up_min / 1e9, c.param_up_max / 1e9);
  return buf;
}

void PrintPcie(const Options& o) {
  std::printf("# pcie per optimizer step (counted from the config, E = %lld): %s; %s\n",
              static_cast<long long>(TotalParams(o)), CountPcie(o).how.c_str(), PcieFields(o).c_str());
}

Status DryRun(const Options& o) {
  ParseOptions po;
  ZERO_ASSIGN_OR_RETURN(Config config, ParseConfig(ConfigJson(o), po));
  std::printf("# config: %s\n", ConfigJson(o).c_str());
  const std::vector<ParamSpec> specs = Specs(o);
  const int64_t params = TotalParams(o);
  if (o.impl == "zero") {
    // The engine accepts this config and these parameters (on the CPU; nothing is allocated).
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Device> cpu, CreateDevice("cpu"));
    RendezvousOptions ro;
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm, CreateCommunicator("gloo", cpu.get(), ro));
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(config, cpu.get(), comm.get()));
    for (const ParamSpec& s : specs) ZERO_RETURN_IF_ERROR(engine->RegisterParameter(s).status());
  }
  const double acts =
      2.0 * ((o.blocks + 1) * o.tokens * o.dim + o.blocks * o.tokens * o.ffn + o.tokens * o.dim + o.tokens * o.ffn);
  PrintPcie(o);
  std::printf("dry run ok: impl=%s config=%s stage=%d params=%lld tokens=%lld gas=%d clip=%g activations_gib=%.2f\n",
              o.impl.c_str(), o.label.c_str(), o.stage, static_cast<long long>(params),
              static_cast<long long>(o.tokens), o.gas, o.clip, GiB(acts));
  return OkStatus();
}

#if defined(ZERO_BENCH_HAS_CUDA)

struct StepTimes {
  std::vector<double> fwd, fwd_bwd, step, loss;
};

Status CheckAligned(const void* p, const std::string& what) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return InternalError(what + ": not 16-byte aligned");
  return OkStatus();
}

// One training step's forward and backward through the Engine.
class EngineDriver {
 public:
  EngineDriver(Engine* engine, MlpCuda* model, int blocks) : engine_(engine), model_(model), blocks_(blocks) {}

  // The loss gradient carries gradient_scale() (1/GAS in managed accumulation).
  Status Forward() {
    for (int l = 0; l < blocks_; ++l) {
      ZERO_ASSIGN_OR_RETURN(ModuleHandle h, engine_->GatherModule("block" + std::to_string(l)));
      ZERO_ASSIGN_OR_RETURN(MlpBlockParams p, Params(l));
      ZERO_RETURN_IF_ERROR(model_->ForwardBlock(l, p));
      ZERO_RETURN_IF_ERROR(h.Release());
    }
    return model_->Loss(engine_->gradient_scale());
  }

  Status Backward() {
    for (int l = blocks_ - 1; l >= 0; --l) {
      ZERO_ASSIGN_OR_RETURN(ModuleHandle h, engine_->GatherModule("block" + std::to_string(l)));
      ZERO_ASSIGN_OR_RETURN(MlpBlockParams p, Params(l));
      const int w1 = 4 * l, b1 = w1 + 1, w2 = w1 + 2, b2 = w1 + 3;
      ZERO_ASSIGN_OR_RETURN(void* gb2, Grad(b2));
      ZERO_ASSIGN_OR_RETURN(void* gw2, Grad(w2));
      ZERO_RETURN_IF_ERROR(model_->BackwardFc2(l, p, gb2, gw2));
      ZERO_RETURN_IF_ERROR(engine_->GradReady(b2));
      ZERO_RETURN_IF_ERROR(engine_->GradReady(w2));
      ZERO_ASSIGN_OR_RETURN(void* gb1, Grad(b1));
      ZERO_ASSIGN_OR_RETURN(void* gw1, Grad(w1));
      ZERO_RETURN_IF_ERROR(model_->BackwardFc1(l, p, gb1, gw1));
      ZERO_RETURN_IF_ERROR(engine_->GradReady(b1));
      ZERO_RETURN_IF_ERROR(engine_->GradReady(w1));
      if (l > 0) ZERO_RETURN_IF_ERROR(model_->BackwardInput(l, p));
      ZERO_RETURN_IF_ERROR(h.Release());
    }
    return engine_->Backward();
  }

 private:
  Result<MlpBlockParams> Params(int l) {
    MlpBlockParams p;
    const void** slots[] = {&p.w1, &p.b1, &p.w2, &p.b2};
    for (int j = 0; j < 4; ++j) {
      ZERO_ASSIGN_OR_RETURN(*slots[j], engine_->param(4 * l + j));
      ZERO_RETURN_IF_ERROR(CheckAligned(*slots[j], "param(" + std::to_string(4 * l + j) + ")"));
    }
    return p;
  }
  Result<void*> Grad(int i) {
    ZERO_ASSIGN_OR_RETURN(void* g, engine_->grad_buffer(i));
    ZERO_RETURN_IF_ERROR(CheckAligned(g, "grad_buffer(" + std::to_string(i) + ")"));
    return g;
  }

  Engine* engine_;
  MlpCuda* model_;
  int blocks_;
};

// The host side of Engine::Initialize: the hash values of parameter `index`, on all cores.
void FillParam(const Options& o, int index, float* values, int64_t n) {
  const uint32_t key = HashKey(static_cast<uint32_t>(index));
  const float bound = Bound(o, index);
  const int threads = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([=]() {
      const int64_t begin = n * t / threads, end = n * (t + 1) / threads;
      for (int64_t i = begin; i < end; ++i) values[i] = HashUniform(key, static_cast<uint32_t>(i), bound);
    });
  }
  for (std::thread& th : pool) th.join();
}

Status Run(const Options& o) {
  const Clock::time_point t_start = Clock::now();
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Device> device, CreateDevice(o.device));
  CudaDevice* cuda = device->AsCuda();
  if (cuda == nullptr) return InvalidArgumentError("--device " + o.device + ": not a CUDA device");
  ZERO_ASSIGN_OR_RETURN(Config config, ParseConfig(ConfigJson(o), ParseOptions()));
  std::printf("# device: %s\n# config: %s\n", device->name().c_str(), ConfigJson(o).c_str());
  const cudaStream_t stream = cuda->native_stream(nullptr);  // the engine's compute stream

  const MlpShape shape{o.tokens, o.dim, o.ffn, o.blocks};
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<MlpCuda> model, MlpCuda::Create(shape, device.get(), /*stream=*/nullptr));
  const std::vector<ParamSpec> specs = Specs(o);

  std::unique_ptr<Communicator> comm;
  std::unique_ptr<Engine> engine;
  std::vector<DeviceBuffer> plain_params, plain_grads;  // --impl none
  if (o.impl == "zero") {
    RendezvousOptions ro;  // world 1, as FSDP2's one-rank process group
    ZERO_ASSIGN_OR_RETURN(comm, CreateCommunicator("nccl", device.get(), ro));
    ZERO_ASSIGN_OR_RETURN(engine, Engine::Create(config, device.get(), comm.get()));
    for (const ParamSpec& s : specs) ZERO_RETURN_IF_ERROR(engine->RegisterParameter(s).status());
    ZERO_RETURN_IF_ERROR(
        engine->Initialize([&](int index, float* values) { FillParam(o, index, values, Numel(specs[index])); }));
  } else {
    for (size_t i = 0; i < specs.size(); ++i) {
      const size_t n = static_cast<size_t>(Numel(specs[i]));
      ZERO_ASSIGN_OR_RETURN(DeviceBuffer p, device->Allocate(2 * n));
      ZERO_ASSIGN_OR_RETURN(DeviceBuffer g, device->Allocate(2 * n));
      ZERO_RETURN_IF_ERROR(model->FillUniform(p.data(), n, static_cast<uint32_t>(i), Bound(o, static_cast<int>(i))));
      plain_params.push_back(std::move(p));
      plain_grads.push_back(std::move(g));
    }
  }
  DeviceArena acts("activations");  // one region: the model's layout (ActivationBytes)
  void* activations = nullptr;
  acts.ReserveBytes(&activations, MlpCuda::ActivationBytes(shape), "mlp activations");
  ZERO_RETURN_IF_ERROR(acts.Allocate(device.get()));
  ZERO_RETURN_IF_ERROR(model->Bind(activations, acts.bytes()));
  ZERO_RETURN_IF_ERROR(model->FillInput(kInputStream));
  ZERO_RETURN_IF_ERROR(device->Synchronize());
  const double init_s = std::chrono::duration<double>(Clock::now() - t_start).count();
  device->ResetPeak();

  cudaEvent_t ev0 = nullptr, ev1 = nullptr;
  ZERO_CUDA_RETURN_IF_ERROR(cudaEventCreate(&ev0));
  ZERO_CUDA_RETURN_IF_ERROR(cudaEventCreate(&ev1));
  EngineDriver driver(engine.get(), model.get(), o.blocks);
  auto plain = [&](int l) {
    return MlpBlockParams{plain_params[4 * l].data(), plain_params[4 * l + 1].data(), plain_params[4 * l + 2].data(),
                          plain_params[4 * l + 3].data()};
  };
  StepTimes t;
  int64_t uploaded_after_first = 0;  // EngineStats::param_uploaded_bytes after step 1
  for (int s = 0; s < o.steps; ++s) {
    if (engine && s == 1) uploaded_after_first = engine->stats().param_uploaded_bytes;
    ZERO_RETURN_IF_ERROR(device->Synchronize());
    const Clock::time_point t0 = Clock::now();
    double fwd_s = 0.0;  // summed over the micro steps
    for (int micro = 0; micro < o.gas; ++micro) {
      if (engine && engine->is_gradient_accumulation_boundary() != (micro + 1 == o.gas)) {
        return InternalError("step " + std::to_string(s + 1) + ", micro step " + std::to_string(micro + 1) + " of " +
                             std::to_string(o.gas) +
                             ": the engine's accumulation boundary is not where mlp_bench "
                             "expects it (managed mode, gradient_accumulation_steps " +
                             std::to_string(o.gas) + ")");
      }
      ZERO_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev0, stream));
      if (engine) {
        ZERO_RETURN_IF_ERROR(driver.Forward());
      } else {
        for (int l = 0; l < o.blocks; ++l) ZERO_RETURN_IF_ERROR(model->ForwardBlock(l, plain(l)));
        ZERO_RETURN_IF_ERROR(model->Loss());
      }
      ZERO_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev1, stream));
      if (engine) {
        ZERO_RETURN_IF_ERROR(driver.Backward());
      } else {
        for (int l = o.blocks - 1; l >= 0; --l) {
          const MlpBlockParams p = plain(l);
          ZERO_RETURN_IF_ERROR(model->BackwardFc2(l, p, plain_grads[4 * l + 3].data(), plain_grads[4 * l + 2].data()));
          ZERO_RETURN_IF_ERROR(model->BackwardFc1(l, p, plain_grads[4 * l + 1].data(), plain_grads[4 * l].data()));
          if (l > 0) ZERO_RETURN_IF_ERROR(model->BackwardInput(l, p));
        }
      }
      ZERO_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(ev1));
      float fwd_ms = 0.0f;
      ZERO_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&fwd_ms, ev0, ev1));
      fwd_s += fwd_ms / 1e3;
    }
    ZERO_RETURN_IF_ERROR(device->Synchronize());
    const Clock::time_point t1 = Clock::now();
    if (engine) {
      ZERO_RETURN_IF_ERROR(engine->Step());
      if (!engine->was_step_applied()) return InternalError("step " + std::to_string(s) + " was not applied");
    }
    ZERO_RETURN_IF_ERROR(device->Synchronize());
    const Clock::time_point t2 = Clock::now();
    ZERO_ASSIGN_OR_RETURN(double loss, model->ReadLoss());  // the last micro step's
    t.fwd.push_back(fwd_s);
    t.fwd_bwd.push_back(std::chrono::duration<double>(t1 - t0).count());
    t.step.push_back(std::chrono::duration<double>(t2 - t1).count());
    t.loss.push_back(loss);
    std::printf("# step %d: fwd %.4f s, fwd+bwd %.4f s, step %.4f s, loss %.6g\n", s + 1, t.fwd.back(),
                t.fwd_bwd.back(), t.step.back(), loss);
    if (!std::isfinite(loss)) return InternalError("loss is not finite at step " + std::to_string(s + 1));
  }
  size_t free_b = 0, total_b = 0;
  ZERO_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_b, &total_b));
  cudaEventDestroy(ev0);
  cudaEventDestroy(ev1);
  const MemoryStats ms = device->memory_stats();
  if (engine) {
    const EngineMemory m = engine->memory();
    std::printf(
        "# engine memory GiB: model_params %.2f, master %.2f, optimizer %.2f, gradients %.2f "
        "(accumulators %.2f, bucket staging %.2f), activations %.2f; device in use %.2f, peak %.2f; "
        "host: states %.2f, params %.2f, gradients %.2f\n",
        GiB(m.model_params), GiB(m.master_params), GiB(m.optimizer_states), GiB(m.gradients),
        GiB(m.gradient_accumulators), GiB(m.bucket_staging), GiB(acts.bytes()), GiB(ms.in_use), GiB(ms.peak),
        GiB(m.host_states), GiB(m.host_params), GiB(m.host_gradients));
  }
  auto tail = [](const std::vector<double>& v) { return std::vector<double>(v.begin() + 1, v.end()); };
  PrintPcie(o);
  // Measured: the parameter shards uploaded per step over steps 2..N (offload_param only).
  const double param_up_gb =
      engine && o.steps > 1
          ? static_cast<double>(engine->stats().param_uploaded_bytes - uploaded_after_first) / (o.steps - 1) / 1e9
          : 0.0;
  std::printf("# parameter shard uploads measured: %.3f GB per step (EngineStats::param_uploaded_bytes)\n",
              param_up_gb);
  std::printf(
      "BENCH impl=%s config=%s tokens=%lld params=%lld steps=%d init_s=%.2f fwd_s=%.4f fwd_bwd_s=%.4f "
      "step_s=%.4f peak_gib=%.2f gpu_used_gib=%.2f loss_first=%.6g loss_last=%.6g gas=%d clip=%g %s param_up_gb=%.3f\n",
      o.impl == "zero" ? "zero" : "zero-compute", o.label.c_str(), static_cast<long long>(o.tokens),
      static_cast<long long>(TotalParams(o)), o.steps, init_s, Median(tail(t.fwd)), Median(tail(t.fwd_bwd)),
      Median(tail(t.step)), GiB(ms.peak), GiB(double(total_b - free_b)), t.loss.front(), t.loss.back(), o.gas, o.clip,
      PcieFields(o).c_str(), param_up_gb);
  std::fflush(stdout);
  return OkStatus();
}

#else  // !ZERO_BENCH_HAS_CUDA

Status Run(const Options& o) {
  return UnimplementedError("this mlp_bench was built without the CUDA toolkit; only --dry-run works");
}

#endif

}  // namespace
}  // namespace zero::bench

int main(int argc, char** argv) {
  return zero::bench::BenchMain(
      "mlp_bench", zero::bench::kUsage, zero::bench::ParseFlags(argc, argv),
      [](const zero::bench::Options& o) { return o.dry_run ? zero::bench::DryRun(o) : zero::bench::Run(o); });
}
