// zero_train: trains the byte-level language model (byte_lm.h) with the zero Engine on a text file:
// ZeRO stages 0-3 over several data-parallel ranks, on the CPU (gloo) by default or one GPU per rank
// (--device cuda, NCCL). Prints the loss, lr, gradient norm, throughput and memory per rank every
// steps_per_print steps, draws a progress bar on a terminal, writes a JSON line per step
// (--log-json), the loss curve as SVG (--plot) and, at the end, the held-out loss and a sample of
// generated text. docs/zero_train.md is the manual.
//
//   bazel run -c opt //train:zero_train                      # 2 CPU ranks, stage 3, GPL-3 text
//   bazel-bin/train/zero_train --config my_ds.json --steps 2000 --log-json log.jsonl
//   bazel-bin/tools/launch --nproc 4 -- bazel-bin/train/zero_train --device cuda
//
// Process model: without RANK (or OMPI_COMM_WORLD_RANK / SLURM_PROCID) in the environment this
// process validates the flags, config and data, then starts --nproc ranks of itself with
// tools/launcher.h and waits for them (one failing rank stops the others); with them it is one rank
// and meets the others through comm/rendezvous.h.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/rendezvous.h"
#include "data/byte_data.h"
#include "engine/checkpoint/io.h"
#include "engine/config/config.h"
#include "engine/engine.h"
#include "models/byte/byte_lm.h"
#include "models/engine_adapters.h"
#include "models/model_api.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/status.h"
#include "runtime/step_timers.h"
#include "runtime/timeline.h"
#include "tools/launcher.h"
#include "train/loss_plot.h"
#include "train/zero_train_options.h"
#include "train/zero_train_report.h"

#if defined(ZERO_EXAMPLES_HAS_CUDA)
#include <cuda_runtime_api.h>

#include "models/byte/byte_lm_cuda.h"
#include "runtime/cuda_device.h"
#endif

namespace zero::examples {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// --- the model on the rank's device ---------------------------------------------------------------

// One micro step of the model: forward, then backward of the same batch against the engine's
// parameters and gradient buffers, then Loss (this rank's mean loss of the batch; may wait for the
// device). Separate calls so the loop can time and trace each.
class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual Status Forward(ParamProvider& params, const uint8_t* tokens, int batch) = 0;
  virtual Status Backward(ParamProvider& params, float loss_scale, GradSink& grads) = 0;
  virtual Result<double> Loss() = 0;
};

class CpuModelRunner final : public ModelRunner {
 public:
  explicit CpuModelRunner(const ByteLmConfig& c) : model_(c) {}
  Status Forward(ParamProvider& params, const uint8_t* tokens, int batch) override {
    ZERO_ASSIGN_OR_RETURN(loss_, model_.Forward(params, tokens, batch, &acts_));
    return OkStatus();
  }
  Status Backward(ParamProvider& params, float loss_scale, GradSink& grads) override {
    return model_.Backward(params, &acts_, loss_scale, grads);
  }
  Result<double> Loss() override { return loss_; }

 private:
  ByteLmCpu model_;
  ByteLmActivations acts_;
  double loss_ = 0;
};

#if defined(ZERO_EXAMPLES_HAS_CUDA)
// The CUDA model on the engine's compute stream (the CudaDevice's default stream): the engine's
// gathers, gradient reads and releases are ordered with the model's kernels by the stream itself.
class CudaModelRunner final : public ModelRunner {
 public:
  static Result<std::unique_ptr<ModelRunner>> Create(const ByteLmConfig& c, Device* device) {
    CudaDevice* cuda = device->AsCuda();
    if (cuda == nullptr) return InternalError("--device cuda: the rank's device is not a CudaDevice");
    if (cudaSetDevice(cuda->ordinal()) != cudaSuccess) {
      return InternalError("cudaSetDevice(" + std::to_string(cuda->ordinal()) + ") failed");
    }
    auto r = std::unique_ptr<CudaModelRunner>(new CudaModelRunner());
    ZERO_ASSIGN_OR_RETURN(r->model_, ByteLmCuda::Create(c, cuda->native_stream(nullptr)));
    return std::unique_ptr<ModelRunner>(std::move(r));
  }
  Status Forward(ParamProvider& params, const uint8_t* tokens, int batch) override {
    return model_->Forward(params, tokens, batch, &acts_, nullptr);
  }
  Status Backward(ParamProvider& params, float loss_scale, GradSink& grads) override {
    return model_->Backward(params, &acts_, loss_scale, grads);
  }
  Result<double> Loss() override { return model_->ReadLoss(acts_); }

 private:
  CudaModelRunner() = default;
  std::unique_ptr<ByteLmCuda> model_;
  ByteLmCudaActivations acts_;
};
#endif

Result<std::unique_ptr<ModelRunner>> CreateModelRunner(const TrainOptions& o, Device* device) {
  if (o.device == "cpu") return std::unique_ptr<ModelRunner>(new CpuModelRunner(o.model));
#if defined(ZERO_EXAMPLES_HAS_CUDA)
  return CudaModelRunner::Create(o.model, device);
#else
  return UnimplementedError("--device cuda: this zero_train was built without the CUDA toolkit");
#endif
}

// --- checkpoints ------------------------------------------------------------------------------------
// --save DIR writes a checkpoint (engine/checkpoint/checkpoint.h format, tag global_step<N>) every --save-every
// steps and after the last one; --resume DIR loads DIR's `latest` at whatever world size this run has,
// and the loop continues from the saved step (the data sampler is a function of the step, so the
// batches continue exactly as if the run had not stopped).

Status CheckCheckpointFlags(const TrainOptions& o) {
  if (!o.save_dir.empty()) {
    // At the start, not at the first save: the directory must take a file. (Its lock: rank 0 holds
    // it for the run, see RunRank; the launching process probes it in ValidateInputs.)
    ZERO_RETURN_IF_ERROR(CheckWritableDirectory(o.save_dir).WithContext("--save " + o.save_dir));
  }
  if (!o.resume_dir.empty()) {
    const std::string latest = o.resume_dir + "/latest";
    if (access(latest.c_str(), R_OK) != 0) {
      return ErrnoError(
          "--resume: no checkpoint to resume from (" + latest + " is missing; give the directory passed to --save):",
          latest, errno);
    }
  }
  return OkStatus();
}

// Restores engine state from --resume and returns the number of optimizer steps already done.
// Collective.
Result<int64_t> ResumeFromCheckpoint(Engine* engine, const TrainOptions& o, bool lead) {
  if (o.resume_dir.empty()) return int64_t{0};
  auto client = engine->LoadCheckpoint(o.resume_dir);
  if (!client.ok()) return client.status().WithContext("--resume " + o.resume_dir);
  const int64_t step = engine->counters().global_steps;
  if (lead) {
    std::printf("  resumed from %s at step %lld\n", o.resume_dir.c_str(), static_cast<long long>(step));
  }
  if (step > o.steps) {
    return InvalidArgumentError("--resume " + o.resume_dir + ": the checkpoint is at step " + std::to_string(step) +
                                ", past --steps " + std::to_string(o.steps));
  }
  return step;
}

// Called after every optimizer step (step = steps done) and once after the last. Collective.
Status MaybeSaveCheckpoint(Engine* engine, const TrainOptions& o, int64_t step, bool final_step, bool lead) {
  if (o.save_dir.empty()) return OkStatus();
  const bool periodic = o.save_every > 0 && step % o.save_every == 0;
  if (final_step ? periodic : !periodic) return OkStatus();  // the last step's periodic save is the final one
  const std::string client =
      "{\"zero_train_step\": " + std::to_string(step) + ", \"seed\": " + std::to_string(o.seed) + "}";
  Status st = engine->SaveCheckpoint(o.save_dir, "", client);
  if (!st.ok()) return st.WithContext("--save " + o.save_dir + " at step " + std::to_string(step));
  if (lead) std::printf("  checkpoint saved: %s/global_step%lld\n", o.save_dir.c_str(), static_cast<long long>(step));
  return OkStatus();
}

// --- timing: wall_clock_breakdown and --trace (docs/timeline.md) ------------------------------------
// The user side of the step timeline: what the loop can see without the engine's help. The
// breakdown times forward, backward (the model's and Engine::Backward's reduction) and step on the
// host, synchronizing the device before each stop as DeepSpeed's synchronized timers do; the trace
// records steps 2-4 (the first warms up) as host spans on a "train loop" track and the model's
// forward and backward as device spans on the compute track.

std::string TracePathForRank(const std::string& path, int rank) {
  return rank == 0 ? path : path + ".rank" + std::to_string(rank);
}

class LoopTiming {
 public:
  static Result<std::unique_ptr<LoopTiming>> Create(const TrainOptions& o, const Config& c, Device* device, int rank,
                                                    int64_t start_step) {
    auto t = std::unique_ptr<LoopTiming>(new LoopTiming());
    t->device_ = device;
    if (c.wall_clock_breakdown) t->timers_ = std::make_unique<StepTimers>();
    if (!o.trace.empty()) {
      t->path_ = TracePathForRank(o.trace, rank);
      TimelineOptions to;
      to.pid = rank;
      to.process_name = "rank " + std::to_string(rank);
      to.enabled = false;
      t->timeline_ = std::make_unique<Timeline>(std::move(to));
      ZERO_RETURN_IF_ERROR(t->timeline_->AttachDevice(device).WithContext("--trace"));
      t->loop_track_ = t->timeline_->AddTrack("train loop");
      const int64_t run = o.steps - start_step;
      t->first_ = start_step + (run >= 2 ? 2 : 1);
      t->last_ = std::min<int64_t>(start_step + 4, o.steps);
    }
    return t;
  }

  // Steps are numbered from 1 (the step about to run).
  void BeginStep(int64_t step) {
    if (timeline_ == nullptr) return;
    timeline_->set_enabled(step >= first_ && step <= last_);
    step_begin_ns_ = timeline_->Now();
  }

  // A phase of the step: timer `name` (if the breakdown is on) and a host span on the loop track
  // (micro >= 0: the micro step, as an arg). End it with EndPhase.
  struct Phase {
    std::string name;
    int64_t begin_ns = 0;
  };
  Result<Phase> BeginPhase(const std::string& name) {
    Phase p;
    p.name = name;
    if (timers_ != nullptr) ZERO_RETURN_IF_ERROR(timers_->Start(name));
    if (timeline_ != nullptr) p.begin_ns = timeline_->Now();
    return p;
  }
  // The model's own work on the compute stream (the device's default stream), as a device span.
  Result<Timeline::DeviceSpan> BeginCompute(const std::string& name, int64_t micro) {
    if (timeline_ == nullptr) return Timeline::DeviceSpan();
    return timeline_->BeginDeviceSpan(kTrackCompute, name, nullptr, {{"micro", micro}});
  }
  Status EndCompute(Timeline::DeviceSpan span) {
    if (timeline_ == nullptr) return OkStatus();
    return timeline_->EndDeviceSpan(std::move(span), nullptr);
  }
  Status EndPhase(Phase p, int64_t micro) {
    if (timers_ != nullptr) {
      ZERO_RETURN_IF_ERROR(device_->SynchronizeStream(nullptr));
      ZERO_RETURN_IF_ERROR(timers_->Stop(p.name));
    }
    if (timeline_ != nullptr) {
      SpanArgs args;
      if (micro >= 0) args.push_back({"micro", micro});
      timeline_->AddSpan(loop_track_, p.name, p.begin_ns, timeline_->Now(), std::move(args));
    }
    return OkStatus();
  }

  // After the step: closes its span; prints the breakdown (lead) every print_every steps; writes
  // the trace after its last step.
  Status EndStep(int64_t step, bool print_now, bool lead) {
    if (timeline_ != nullptr) {
      timeline_->AddSpan(loop_track_, "step " + std::to_string(step), step_begin_ns_, timeline_->Now(),
                         {{"step", step}});
      ZERO_RETURN_IF_ERROR(timeline_->ResolveDeviceSpans().status().WithContext("--trace"));
      if (step == last_) {
        timeline_->set_enabled(false);
        ZERO_RETURN_IF_ERROR(timeline_->WriteChromeTrace(path_).WithContext("--trace"));
        if (lead) {
          std::printf("  trace of steps %lld-%lld: %s\n", static_cast<long long>(first_), static_cast<long long>(last_),
                      path_.c_str());
        }
      }
    }
    if (timers_ != nullptr) {
      timers_->EndStep();
      if (print_now) {
        if (lead) std::printf("%s\n", timers_->Format(BreakdownTimerNames()).c_str());
        timers_->Reset();
      }
    }
    return OkStatus();
  }

 private:
  LoopTiming() = default;
  Device* device_ = nullptr;
  std::unique_ptr<StepTimers> timers_;
  std::unique_ptr<Timeline> timeline_;
  std::string path_;
  TrackId loop_track_ = 0;
  int64_t first_ = 0, last_ = -1;
  int64_t step_begin_ns_ = 0;
};

// --- checks shared by the launcher process and every rank ---------------------------------------

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

Status CheckWritable(const std::string& flag, const std::string& path) {
  if (path.empty()) return OkStatus();
  const std::string dir = DirOf(path);
  if (access(dir.c_str(), W_OK) != 0) {
    return ErrnoError(flag + ": directory of " + path + " is not writable:", dir, errno);
  }
  return OkStatus();
}

// Loads the text and splits off the holdout; errors name --data and what is wrong with it.
Result<std::pair<ByteDataset, ByteDataset>> LoadData(const TrainOptions& o) {
  auto all = ByteDataset::FromFile(o.data);
  if (!all.ok()) return all.status().WithContext("--data " + o.data);
  auto split = all->Split(o.holdout);
  const size_t need = static_cast<size_t>(o.model.context) + 2;
  if (split.first.size() < need) {
    return InvalidArgumentError("--data " + o.data + ": " + std::to_string(all->size()) + " bytes" +
                                (o.holdout > 0 ? " (" + std::to_string(split.first.size()) + " after --holdout)" : "") +
                                " is too short for the model's context of " + std::to_string(o.model.context) +
                                " bytes; give a longer text or a smaller --context");
  }
  return split;
}

// A lower bound of the host memory one micro batch takes (the rows' bytes and the fp32 activations
// Forward keeps per row), against the machine's memory: an absurd micro batch that passes the
// config's bounds (1e9 rows) is an error naming the key instead of a bad_alloc in every rank.
Status CheckBatchFitsInMemory(const TrainOptions& o, const Config& c) {
  const ByteLmConfig& m = o.model;
  const int64_t floats_per_row = int64_t{m.context} * m.embed_dim + 2 * int64_t{m.hidden} +
                                 int64_t{m.layers} * (3 * int64_t{m.hidden} + 2 * int64_t{m.ffn}) + 2 * kByteVocab;
  const int64_t row_bytes = 4 * floats_per_row + m.context + 1;
  int64_t need = 0;
  const bool overflow = __builtin_mul_overflow(c.train_micro_batch_size_per_gpu, row_bytes, &need);
  const int64_t pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  const int64_t have = pages > 0 && page > 0 ? pages * page : 0;
  if (overflow || (have > 0 && need > have)) {
    return InvalidArgumentError(
        "train_micro_batch_size_per_gpu " + std::to_string(c.train_micro_batch_size_per_gpu) + " rows of at least " +
        std::to_string(row_bytes) + " bytes each (the batch and the activations of " + m.ToString() + ") need " +
        (overflow ? std::string("more than 2^63 bytes") : FormatBytes(static_cast<double>(need))) +
        " per rank, more than this machine's " + FormatBytes(static_cast<double>(have)) +
        " of memory; lower train_micro_batch_size_per_gpu (and raise gradient_accumulation_steps)");
  }
  return OkStatus();
}

// In the launching process, before any rank starts.
Status ValidateInputs(const TrainOptions& o) {
  ZERO_RETURN_IF_ERROR(CheckCheckpointFlags(o));
  if (!o.save_dir.empty()) {
    // Another job saving into --save: refused now rather than at rank 0's start (probed and released:
    // the ranks are other processes).
    ZERO_RETURN_IF_ERROR(DirectoryLock::Acquire(o.save_dir).status().WithContext("--save " + o.save_dir));
  }
  ZERO_RETURN_IF_ERROR(LoadData(o).status());
  ZERO_RETURN_IF_ERROR(CheckWritable("--log-json", o.log_json));
  ZERO_RETURN_IF_ERROR(CheckWritable("--plot", o.plot));
  ZERO_RETURN_IF_ERROR(CheckWritable("--trace", o.trace));
  return OkStatus();
}

int VisibleGpus() {
#if defined(ZERO_EXAMPLES_HAS_CUDA)
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
#else
  return 0;
#endif
}

// --- one rank ----------------------------------------------------------------------------------------

// Fault injection for the tests: ZERO_TRAIN_TEST_EXIT="R:S" makes rank R die (exit status 3,
// without any cleanup) at the start of optimizer step S. Returns S for this rank, or -1.
int64_t TestExitStep(int rank) {
  const char* v = std::getenv("ZERO_TRAIN_TEST_EXIT");
  int r = -1;
  long long s = -1;
  if (v == nullptr || std::sscanf(v, "%d:%lld", &r, &s) != 2 || r != rank) return -1;
  return s;
}

struct RankContext {
  int rank = 0;
  int world = 1;
};

// The rank and world size as the launcher set them, read before RendezvousFromEnv (which may refuse
// the environment, e.g. a short ZERO_JOB_SECRET), so that each rank's error names its own rank
// instead of "rank 0 of 1". -1: not set, or not a number.
RankContext RankFromEnv() {
  auto first = [](std::initializer_list<const char*> names) -> int {
    for (const char* n : names) {
      const char* v = std::getenv(n);
      if (v == nullptr || *v == '\0') continue;
      char* end = nullptr;
      errno = 0;
      const long x = std::strtol(v, &end, 10);
      return *end == '\0' && errno == 0 && x >= 0 && x <= INT_MAX ? static_cast<int>(x) : -1;
    }
    return -1;
  };
  return RankContext{first({"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}),
                     first({"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"})};
}

std::string RankName(const RankContext& c) {
  auto n = [](int v) { return v < 0 ? std::string("?") : std::to_string(v); };
  return "rank " + n(c.rank) + " of " + n(c.world);
}

void PrintHeader(const TrainOptions& o, const Config& c, const ByteDataset& train, const ByteDataset& holdout,
                 const Communicator& comm, const Device& device) {
  std::printf("zero_train: ByteLm %s, %lld parameters; data %s (%zu bytes train, %zu held out)\n",
              o.model.ToString().c_str(), static_cast<long long>(o.model.NumParams()), o.data.c_str(), train.size(),
              holdout.size());
  std::printf(
      "  %d rank%s on %s (%s) | ZeRO stage %d | %s | batch %lld rows/rank x %lld accumulation x %d = %lld "
      "rows per step (%d context bytes + 1 predicted)\n",
      comm.world_size(), comm.world_size() == 1 ? "" : "s", device.name().c_str(), comm.backend().c_str(), c.zero.stage,
      DTypeName(c.model_dtype()), static_cast<long long>(c.train_micro_batch_size_per_gpu),
      static_cast<long long>(c.gradient_accumulation_steps), comm.world_size(),
      static_cast<long long>(c.train_batch_size), o.model.context);
  std::string sched = c.scheduler.type.empty() ? std::string("constant lr") : c.scheduler.type;
  if (!c.scheduler.type.empty()) {
    sched += " (warmup " + std::to_string(c.scheduler.warmup_num_steps);
    if (c.scheduler.total_num_steps > 0) sched += ", total " + std::to_string(c.scheduler.total_num_steps);
    sched += ")";
  }
  std::printf("  %s lr %g wd %g | %s | clip %g | %d steps | config: %s\n", c.optimizer.type.c_str(), c.optimizer.lr,
              c.optimizer.weight_decay, sched.c_str(), c.gradient_clipping, o.steps,
              o.config_path.empty() ? "built-in (--print-config shows it)" : o.config_path.c_str());
}

// Mean loss over `rows` windows of the held-out text with the CPU model on full fp32 parameters.
Result<std::pair<double, int64_t>> HoldoutLoss(const ByteLmConfig& mc, const ByteDataset& holdout,
                                               const std::vector<ModelParamSpec>& specs,
                                               const std::vector<ParamView>& views) {
  ByteLmCpu model(mc);
  ResidentParams provider(specs, views);
  ByteLmActivations acts;
  const int64_t windows = static_cast<int64_t>(holdout.size()) - mc.context;
  double sum = 0;
  int64_t count = 0;
  constexpr int kBatch = 256;
  for (int64_t first = 0; first < windows; first += kBatch) {
    const int n = static_cast<int>(std::min<int64_t>(kBatch, windows - first));
    ZERO_ASSIGN_OR_RETURN(std::vector<uint8_t> rows, holdout.SequentialBatch(first, n, mc.context));
    ZERO_ASSIGN_OR_RETURN(double loss, model.Forward(provider, rows.data(), n, &acts));
    sum += loss * n;
    count += n;
  }
  return std::make_pair(count > 0 ? sum / count : NAN, count);
}

Status RunRank(const TrainOptions& o, RankContext* ctx) {
  const Clock::time_point t_start = Clock::now();
  ZERO_ASSIGN_OR_RETURN(RendezvousOptions ro, RendezvousFromEnv());
  ctx->rank = ro.rank;
  ctx->world = ro.world_size;
  if (o.timeout_s > 0) {
    ro.comm.timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  } else if (std::getenv("ZERO_COMM_TIMEOUT_MS") == nullptr) {
    ro.comm.timeout = std::chrono::seconds(120);
  }
  const bool lead = ro.rank == 0;

  auto config_or = ResolveConfig(o, ro.world_size);
  if (!config_or.ok()) return config_or.status().WithContext("config");
  const Config config = std::move(config_or).value();
  ZERO_RETURN_IF_ERROR(CheckBatchFitsInMemory(o, config).WithContext("config"));
  ZERO_ASSIGN_OR_RETURN(auto data, LoadData(o));
  const ByteDataset& train = data.first;
  const ByteDataset& holdout = data.second;
  ZERO_RETURN_IF_ERROR(CheckCheckpointFlags(o));
  // Rank 0 holds the --save directory's lock for the whole run: a second job fails at its start.
  DirectoryLock save_lock;
  if (lead && !o.save_dir.empty()) {
    auto lock = DirectoryLock::Acquire(o.save_dir);
    if (!lock.ok()) return lock.status().WithContext("--save " + o.save_dir);
    save_lock = std::move(lock).value();
  }

  // Device and communicator: one GPU per rank, picked by the local rank.
  // A launcher that gives each rank one visible GPU (CUDA_VISIBLE_DEVICES per task) leaves only
  // cuda:0 whatever the local rank.
  const int ordinal = o.device == "cuda" && VisibleGpus() == 1 ? 0 : ro.local_rank;
  const std::string device_name = o.device == "cpu" ? "cpu" : "cuda:" + std::to_string(ordinal);
  auto device_or = CreateDevice(device_name);
  if (!device_or.ok()) {
    return device_or.status().WithContext("--device " + o.device + " (device " + device_name + " for local rank " +
                                          std::to_string(ro.local_rank) + ")");
  }
  std::unique_ptr<Device> device = std::move(device_or).value();
  auto comm_or = CreateCommunicator(o.device == "cpu" ? "gloo" : "nccl", device.get(), ro);
  if (!comm_or.ok()) {
    return comm_or.status().WithContext("rendezvous of " + std::to_string(ro.world_size) + " ranks at " +
                                        ro.master_addr + ":" + std::to_string(ro.master_port));
  }
  std::unique_ptr<Communicator> comm = std::move(comm_or).value();

  // The engine's own breakdown line (its view: GatherModule to GradReady, waits on collectives and
  // offload) under the loop's, marked so the two are told apart.
  EngineEnv env;
  env.log_sink = [](const std::string& line) { std::printf("engine %s\n", line.c_str()); };
  auto engine_or = Engine::Create(config, device.get(), comm.get(), env);
  if (!engine_or.ok()) return engine_or.status().WithContext("creating the engine");
  std::unique_ptr<Engine> engine = std::move(engine_or).value();
  const std::vector<ModelParamSpec> specs = ByteLmParamSpecs(o.model);
  ZERO_RETURN_IF_ERROR(RegisterAndInitialize(engine.get(), specs, o.seed).WithContext("registering the model"));
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> model, CreateModelRunner(o, device.get()));
  EngineParams params(engine.get(), specs);
  EngineGrads grads(engine.get());

  if (lead) {
    PrintHeader(o, config, train, holdout, *comm, *device);
    for (const std::string& w : config.warnings) std::printf("warning: %s\n", w.c_str());
    for (const std::string& n : ConfigNotes(o, config)) std::printf("note: %s\n", n.c_str());
    if (UnderLauncher() && o.nproc > 0 && o.nproc != ro.world_size) {
      std::printf("note: --nproc %d is ignored under a launcher (world size %d)\n", o.nproc, ro.world_size);
    }
  }
  FILE* log_json = nullptr;
  if (lead && !o.log_json.empty()) {
    log_json = std::fopen(o.log_json.c_str(), "w");
    if (log_json == nullptr) return ErrnoError("--log-json: open", o.log_json, errno);
  }
  struct Closer {
    FILE*& f;
    ~Closer() {
      if (f != nullptr) std::fclose(f);
    }
  } closer{log_json};

  ZERO_ASSIGN_OR_RETURN(const int64_t start_step, ResumeFromCheckpoint(engine.get(), o, lead));

  const int micro = static_cast<int>(config.train_micro_batch_size_per_gpu);
  const int64_t gas = config.gradient_accumulation_steps;
  const int64_t tokens_per_step = config.train_batch_size;
  const int64_t print_every = std::max<int64_t>(1, config.steps_per_print);
  const bool fp16 = config.fp16.enabled;
  std::vector<uint8_t> tokens(static_cast<size_t>(micro) * (o.model.context + 1));
  std::vector<double> plot_steps, plot_losses;
  ProgressBar bar(stdout, o.steps, lead && o.progress && isatty(STDOUT_FILENO));
  WindowSummary window;
  window.total_steps = o.steps;
  double first_loss = NAN;
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<LoopTiming> timing,
                        LoopTiming::Create(o, config, device.get(), ro.rank, start_step));
  const Clock::time_point t_train = Clock::now();
  if (lead) std::printf("  set-up %.2f s; training\n", Since(t_start));

  const int64_t exit_at = TestExitStep(ro.rank);
  for (int64_t step = start_step; step < o.steps; ++step) {
    if (step + 1 == exit_at) {
      std::fprintf(stderr, "zero_train: rank %d exits at step %lld (ZERO_TRAIN_TEST_EXIT)\n", ro.rank,
                   static_cast<long long>(step + 1));
      std::fflush(nullptr);
      _exit(3);
    }
    const Clock::time_point t0 = Clock::now();
    timing->BeginStep(step + 1);
    const float loss_scale = engine->loss_scale();
    const float grad_scale = engine->gradient_scale();  // loss scale / GAS (managed)
    double loss_sum = 0;
    for (int64_t m = 0; m < gas; ++m) {
      const BatchSpec bs{.seed = o.seed,
                         .step = step * gas + m,
                         .rank = ro.rank,
                         .world_size = ro.world_size,
                         .batch = micro,
                         .context = o.model.context};
      ZERO_RETURN_IF_ERROR(train.FillBatch(bs, tokens.data()));
      const std::string where = "step " + std::to_string(step + 1) + " micro step " + std::to_string(m);
      // forward: the model's; backward: the model's and Engine::Backward (gradient reduction), as
      // DeepSpeed's "backward" includes its all-reduce.
      ZERO_ASSIGN_OR_RETURN(LoopTiming::Phase fwd, timing->BeginPhase("forward"));
      ZERO_ASSIGN_OR_RETURN(Timeline::DeviceSpan fwd_dev, timing->BeginCompute("forward", m));
      ZERO_RETURN_IF_ERROR(model->Forward(params, tokens.data(), micro).WithContext(where + " forward"));
      ZERO_RETURN_IF_ERROR(timing->EndCompute(std::move(fwd_dev)));
      ZERO_RETURN_IF_ERROR(timing->EndPhase(std::move(fwd), m));
      ZERO_ASSIGN_OR_RETURN(LoopTiming::Phase bwd, timing->BeginPhase("backward"));
      ZERO_ASSIGN_OR_RETURN(Timeline::DeviceSpan bwd_dev, timing->BeginCompute("backward", m));
      ZERO_RETURN_IF_ERROR(model->Backward(params, grad_scale, grads).WithContext(where + " backward"));
      ZERO_RETURN_IF_ERROR(timing->EndCompute(std::move(bwd_dev)));
      ZERO_ASSIGN_OR_RETURN(LoopTiming::Phase reduce, timing->BeginPhase("Engine::Backward"));
      ZERO_RETURN_IF_ERROR(engine->Backward());
      ZERO_RETURN_IF_ERROR(timing->EndPhase(std::move(reduce), m));
      ZERO_RETURN_IF_ERROR(timing->EndPhase(std::move(bwd), m));
      auto loss = model->Loss();
      if (!loss.ok()) return loss.status().WithContext(where);
      loss_sum += *loss;
    }
    const double lr = engine->lr();
    ZERO_ASSIGN_OR_RETURN(LoopTiming::Phase step_phase, timing->BeginPhase("step"));
    ZERO_RETURN_IF_ERROR(engine->Step());
    ZERO_RETURN_IF_ERROR(timing->EndPhase(std::move(step_phase), -1));
    double mean_loss = loss_sum / static_cast<double>(gas);
    ZERO_RETURN_IF_ERROR(comm->AllReduceHost(&mean_loss, 1, ReduceOp::kSum).WithContext("averaging the loss"));
    mean_loss /= ro.world_size;
    // Every rank holds the same mean, so every rank stops at the same step.
    if (config.stop_on_nonfinite && engine->was_step_applied() && !std::isfinite(mean_loss)) {
      return FailedPreconditionError("step " + std::to_string(step + 1) + ": the mean loss is " +
                                     (std::isnan(mean_loss) ? "nan" : "inf") +
                                     " (some rank's batch gave a NaN or inf loss); stopping rather than training on "
                                     "it: look at optimizer.params.lr, or set stop_on_nonfinite: false to train on "
                                     "regardless");
    }
    const double step_seconds = Since(t0);

    StepRecord rec;
    rec.step = step + 1;
    rec.loss = mean_loss;
    rec.lr = lr;
    rec.grad_norm = engine->global_grad_norm();
    rec.loss_scale = loss_scale;
    rec.fp16 = fp16;
    rec.applied = engine->was_step_applied();
    rec.step_seconds = step_seconds;
    rec.tokens = tokens_per_step;
    rec.elapsed_seconds = Since(t_train);
    rec.memory = engine->memory();
    if (std::isnan(first_loss)) first_loss = mean_loss;
    plot_steps.push_back(static_cast<double>(rec.step));
    plot_losses.push_back(mean_loss);
    if (log_json != nullptr) {
      std::fprintf(log_json, "%s\n", StepJson(rec).c_str());
      std::fflush(log_json);
    }

    window.last = rec;
    window.mean_loss += mean_loss;
    window.seconds += step_seconds;
    window.steps += 1;
    window.tokens += tokens_per_step;
    if (rec.step % print_every == 0 || rec.step == o.steps) {
      // Collective on every rank at the same steps: the largest memory of any rank.
      const EngineMemory mine = engine->memory();
      double mem[5] = {double(mine.model_params), double(mine.master_params), double(mine.optimizer_states),
                       double(mine.gradients), double(mine.device_peak)};
      ZERO_RETURN_IF_ERROR(comm->AllReduceHost(mem, 5, ReduceOp::kMax).WithContext("gathering memory use"));
      if (lead) {
        window.mean_loss /= static_cast<double>(window.steps);
        window.skipped = engine->counters().skipped_steps;
        // By name: EngineMemory's fifth field is gradient_accumulators, not device_peak.
        window.memory_max = EngineMemory{.model_params = size_t(mem[0]),
                                         .master_params = size_t(mem[1]),
                                         .optimizer_states = size_t(mem[2]),
                                         .gradients = size_t(mem[3]),
                                         .device_peak = size_t(mem[4])};
        bar.Clear();
        std::printf("%s\n", FormatWindow(window).c_str());
        std::fflush(stdout);
      }
      window = WindowSummary{};
      window.total_steps = o.steps;
    }
    ZERO_RETURN_IF_ERROR(timing->EndStep(rec.step, rec.step % print_every == 0 || rec.step == o.steps, lead));
    if (lead) bar.Update(rec.step, mean_loss, rec.elapsed_seconds);
    ZERO_RETURN_IF_ERROR(MaybeSaveCheckpoint(engine.get(), o, rec.step, false, lead));
  }
  bar.Finish();
  const double train_seconds = Since(t_train);
  ZERO_RETURN_IF_ERROR(MaybeSaveCheckpoint(engine.get(), o, o.steps, true, lead));

  // Evaluation and sampling on rank 0 with the CPU model over the full parameters (collective
  // gather on every rank).
  const bool want_full = o.sample > 0 || holdout.size() > static_cast<size_t>(o.model.context);
  std::vector<std::vector<float>> full;
  if (want_full) {
    auto full_or = GatherFullParams(engine.get());
    if (!full_or.ok()) return full_or.status().WithContext("gathering the trained parameters");
    full = std::move(full_or).value();
  }
  if (lead) {
    const int64_t done = o.steps - start_step;
    const size_t n = plot_losses.size();
    const size_t tail = std::min<size_t>(n, static_cast<size_t>(print_every));
    double last_loss = 0;
    for (size_t i = n - tail; i < n; ++i) last_loss += plot_losses[i];
    last_loss = tail > 0 ? last_loss / tail : NAN;
    std::printf(
        "done: %lld steps in %.1f s (%.1f steps/s, %s tok/s); loss %.4f at step %lld -> %.4f (mean of the "
        "last %zu steps)\n",
        static_cast<long long>(done), train_seconds, done / train_seconds,
        FormatCount(done * tokens_per_step / train_seconds).c_str(), first_loss, static_cast<long long>(start_step + 1),
        last_loss, tail);
    std::vector<ParamView> views;
    for (const auto& v : full) views.push_back(ParamView{v.data(), DType::kF32});
    if (!full.empty() && holdout.size() > static_cast<size_t>(o.model.context)) {
      ZERO_ASSIGN_OR_RETURN(auto hl, HoldoutLoss(o.model, holdout, specs, views));
      std::printf("held-out loss %.4f (%.3f bits/byte) over %lld windows of the last %.0f%% of the text\n", hl.first,
                  hl.first / std::log(2.0), static_cast<long long>(hl.second), o.holdout * 100);
    }
    if (!o.plot.empty()) {
      LossPlotOptions po;
      po.title = "zero_train: ByteLm " + o.model.ToString() + ", ZeRO stage " + std::to_string(config.zero.stage) +
                 ", " + std::to_string(ro.world_size) + " ranks";
      po.smooth_window = static_cast<int>(std::clamp<int64_t>(o.steps / 30, 1, 50));
      ZERO_RETURN_IF_ERROR(WriteLossSvg(o.plot, plot_steps, plot_losses, po).WithContext("--plot"));
      std::printf("loss curve: %s\n", o.plot.c_str());
    }
    if (!o.log_json.empty()) std::printf("step log: %s\n", o.log_json.c_str());
    if (o.sample > 0) {
      ByteLmCpu sampler(o.model);
      ResidentParams provider(specs, views);
      ZERO_ASSIGN_OR_RETURN(std::string text, sampler.Sample(provider, o.prompt, o.sample, o.temperature, o.seed));
      std::printf("sample (temperature %g):\n%s%s\n", o.temperature, o.prompt.c_str(), text.c_str());
    }
    std::fflush(stdout);
  }
  // Everyone leaves together, so no rank tears its connections down under a peer still working.
  return comm->Barrier().WithContext("final barrier");
}

// --- the launching process ---------------------------------------------------------------------------

int Launch(const TrainOptions& o, int argc, char** argv) {
  int nproc = o.nproc;
  if (o.device == "cuda") {
#if !defined(ZERO_EXAMPLES_HAS_CUDA)
    std::fprintf(stderr, "zero_train: --device cuda: this zero_train was built without the CUDA toolkit\n");
    return 2;
#endif
    const int gpus = VisibleGpus();
    if (gpus == 0) {
      std::fprintf(stderr, "zero_train: --device cuda: no GPU visible (cudaGetDeviceCount)\n");
      return 2;
    }
    if (nproc == 0) nproc = gpus;
    if (nproc > gpus) {
      std::fprintf(stderr, "zero_train: --nproc %d with --device cuda needs %d GPUs, %d visible\n", nproc, nproc, gpus);
      return 2;
    }
  }
  if (nproc == 0) nproc = kDefaultNproc;
  auto config = ResolveConfig(o, nproc);
  if (!config.ok()) {
    std::fprintf(stderr, "zero_train: config error: %s\n", config.status().ToString().c_str());
    return 2;
  }
  if (o.print_config) {
    std::printf("%s\n", ConfigToJson(*config).c_str());
    return 0;
  }
  if (Status st = ValidateInputs(o); !st.ok()) {
    std::fprintf(stderr, "zero_train: %s\n", st.ToString().c_str());
    return 2;
  }
  if (Status st = CheckBatchFitsInMemory(o, *config); !st.ok()) {
    std::fprintf(stderr, "zero_train: config error: %s\n", st.ToString().c_str());
    return 2;
  }
  if (nproc == 1) {
    // One rank: run in this process (a world of one needs no rendezvous).
    RankContext ctx;
    Status st = RunRank(o, &ctx);
    if (!st.ok()) {
      std::fprintf(stderr, "zero_train: %s\n", st.ToString().c_str());
      return 1;
    }
    return 0;
  }
  LaunchOptions lo;
  lo.nproc = nproc;
  Status st = LaunchSelf(argc, argv, lo);
  if (!st.ok()) {
    // The launcher's message says where the rank's reason is (above, or none: killed by a signal).
    std::fprintf(stderr, "zero_train: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}

// `bazel run` starts the binary in its runfiles tree; relative paths the user typed are relative
// to the directory bazel was run from (BUILD_WORKING_DIRECTORY).
void ResolveUserPaths(TrainOptions* o) {
  const char* wd = std::getenv("BUILD_WORKING_DIRECTORY");
  if (wd == nullptr || *wd == '\0') return;
  for (std::string* p : {&o->data, &o->config_path, &o->log_json, &o->plot, &o->save_dir, &o->resume_dir, &o->trace}) {
    if (!p->empty() && (*p)[0] != '/') *p = std::string(wd) + "/" + *p;
  }
}

int Main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  auto parsed = ParseTrainOptions(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "zero_train: %s\n", parsed.status().ToString().c_str());
    return 2;
  }
  TrainOptions& o = *parsed;
  ResolveUserPaths(&o);
  if (o.help) {
    std::printf("%s", UsageText().c_str());
    return 0;
  }
  if (!UnderLauncher()) return Launch(o, argc, argv);
  if (o.print_config) {
    auto ro = RendezvousFromEnv();
    auto config = ResolveConfig(o, ro.ok() ? ro->world_size : 1);
    if (!config.ok()) {
      std::fprintf(stderr, "zero_train: config error: %s\n", config.status().ToString().c_str());
      return 2;
    }
    std::printf("%s\n", ConfigToJson(*config).c_str());
    return 0;
  }
  RankContext ctx = RankFromEnv();
  Status st = RunRank(o, &ctx);
  if (!st.ok()) {
    std::fprintf(stderr, "zero_train: %s: %s\n", RankName(ctx).c_str(), st.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace zero::examples

// The last net under absurd input that passes every check (issue 23): an allocation the machine
// cannot satisfy ends the rank with a message and exit status 1, not an abort without one.
int main(int argc, char** argv) {
  try {
    return zero::examples::Main(argc, argv);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "zero_train: out of host memory (std::bad_alloc): the model, --context or "
                 "train_micro_batch_size_per_gpu is too large for this machine\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero_train: unexpected exception: %s\n", e.what());
  }
  return 1;
}
