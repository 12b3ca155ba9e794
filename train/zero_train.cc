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
// and meets the others through comm/rendezvous.h. The rank's loop is the Trainer's
// (train/trainer.h); this file gives it the byte model, its data and its lines (ZeroTrainJob).
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/rendezvous.h"
#include "data/byte_data.h"
#include "data/data_file.h"
#include "engine/checkpoint/io.h"
#include "engine/config/config.h"
#include "engine/engine.h"
#include "models/byte/byte_lm.h"
#include "models/engine_adapters.h"
#include "models/model_api.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/status.h"
#include "tools/launcher.h"
#include "train/model_runner.h"
#include "train/trainer.h"
#include "train/trainer_launch.h"
#include "train/zero_train_options.h"
#include "train/zero_train_report.h"

#if defined(ZERO_EXAMPLES_HAS_CUDA)
#include <cuda_runtime_api.h>

#include "models/byte/byte_lm_cuda.h"
#include "runtime/cuda_device.h"
#endif

namespace zero::examples {
namespace {

// --- the model on the rank's device ---------------------------------------------------------------

// The byte model's micro step for the Trainer: the rows of the micro step (ByteDataset::FillBatch, a
// function of the seed and the micro step's index, so a resumed run continues the same batches),
// then the backend's forward of them. One predicted byte per row: CountedTargets is the rows.
class ByteRunner : public train::ModelRunner {
 public:
  Status Forward(ParamProvider& params, const train::MicroStep& at) final {
    const BatchSpec bs{.seed = seed_,
                       .step = at.index,
                       .rank = at.rank,
                       .world_size = at.world_size,
                       .batch = at.rows,
                       .context = context_};
    tokens_.resize(static_cast<size_t>(at.rows) * (context_ + 1));
    ZERO_RETURN_IF_ERROR(train_->FillBatch(bs, tokens_.data()));
    rows_ = at.rows;
    return ForwardRows(params, tokens_.data(), at.rows);
  }
  int64_t CountedTargets() final { return rows_; }

 protected:
  // `train` must outlive the runner.
  ByteRunner(const ByteDataset* train, uint64_t seed, int context) : train_(train), seed_(seed), context_(context) {}
  virtual Status ForwardRows(ParamProvider& params, const uint8_t* tokens, int batch) = 0;

 private:
  const ByteDataset* train_;
  uint64_t seed_;
  int context_;
  std::vector<uint8_t> tokens_;
  int rows_ = 0;
};

class CpuModelRunner final : public ByteRunner {
 public:
  CpuModelRunner(const ByteLmConfig& c, const ByteDataset* train, uint64_t seed)
      : ByteRunner(train, seed, c.context), model_(c) {}
  Status ForwardRows(ParamProvider& params, const uint8_t* tokens, int batch) override {
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
class CudaModelRunner final : public ByteRunner {
 public:
  static Result<std::unique_ptr<train::ModelRunner>> Create(const ByteLmConfig& c, Device* device,
                                                            const ByteDataset* train, uint64_t seed) {
    CudaDevice* cuda = device->AsCuda();
    if (cuda == nullptr) return InternalError("--device cuda: the rank's device is not a CudaDevice");
    if (cudaSetDevice(cuda->ordinal()) != cudaSuccess) {
      return InternalError("cudaSetDevice(" + std::to_string(cuda->ordinal()) + ") failed");
    }
    auto r = std::unique_ptr<CudaModelRunner>(new CudaModelRunner(c, train, seed));
    ZERO_ASSIGN_OR_RETURN(r->model_, ByteLmCuda::Create(c, device, /*stream=*/nullptr));
    return std::unique_ptr<train::ModelRunner>(std::move(r));
  }
  Status ForwardRows(ParamProvider& params, const uint8_t* tokens, int batch) override {
    return model_->Forward(params, tokens, batch, &acts_, nullptr);
  }
  Status Backward(ParamProvider& params, float loss_scale, GradSink& grads) override {
    return model_->Backward(params, &acts_, loss_scale, grads);
  }
  Result<double> Loss() override { return model_->ReadLoss(acts_); }

 private:
  CudaModelRunner(const ByteLmConfig& c, const ByteDataset* train, uint64_t seed)
      : ByteRunner(train, seed, c.context) {}
  std::unique_ptr<ByteLmCuda> model_;
  ByteLmCudaActivations acts_;
};
#endif

Result<std::unique_ptr<train::ModelRunner>> CreateModelRunner(const TrainOptions& o, Device* device,
                                                              const ByteDataset* train) {
  if (o.device == "cpu") return std::unique_ptr<train::ModelRunner>(new CpuModelRunner(o.model, train, o.seed));
#if defined(ZERO_EXAMPLES_HAS_CUDA)
  return CudaModelRunner::Create(o.model, device, train, o.seed);
#else
  return UnimplementedError("--device cuda: this zero_train was built without the CUDA toolkit");
#endif
}

// --- checkpoints ------------------------------------------------------------------------------------
// --save DIR writes a checkpoint (engine/checkpoint/checkpoint.h format, tag global_step<N>) every --save-every
// steps and after the last one; --resume DIR loads DIR's `latest` at whatever world size this run has,
// and the loop continues from the saved step (the data sampler is a function of the step, so the
// batches continue exactly as if the run had not stopped). The Trainer saves and resumes; the
// job checks the flags, holds the directory's lock and writes the client state.

Status CheckCheckpointFlags(const TrainOptions& o) {
  if (!o.save_dir.empty()) {
    // At the start, not at the first save: the directory must take a file. (Its lock: rank 0 holds
    // it for the run, see ZeroTrainJob::Prepare; the launching process probes it in ValidateInputs.)
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
  // A named pipe blocked the read forever, /dev/zero read until memory ran out, a directory read as
  // 0 bytes ("too short"): --data must be a regular file.
  ZERO_RETURN_IF_ERROR(data::CheckDataFile("--data", o.data, "a text file (the bytes the model trains on)"));
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

// The held-out evaluation reads at most this many windows (of holdout.size() - context, one per
// byte), spread evenly over the held-out text: a large --data gave tens of millions of windows and
// an evaluation that ran for hours without a line.
constexpr int64_t kMaxHoldoutWindows = int64_t{1} << 16;

// Mean loss over windows of the held-out text (every one, or kMaxHoldoutWindows spread over it)
// with the CPU model on full fp32 parameters, and the windows read of how many.
struct HoldoutResult {
  double loss = NAN;
  int64_t windows = 0, of = 0;
};
Result<HoldoutResult> HoldoutLoss(const ByteLmConfig& mc, const ByteDataset& holdout,
                                  const std::vector<ModelParamSpec>& specs, const std::vector<ParamView>& views) {
  ByteLmCpu model(mc);
  ResidentParams provider(specs, views);
  ByteLmActivations acts;
  HoldoutResult r;
  r.of = static_cast<int64_t>(holdout.size()) - mc.context;
  const int64_t windows = std::min(r.of, kMaxHoldoutWindows);
  const size_t row = static_cast<size_t>(mc.context) + 1;
  double sum = 0;
  constexpr int kBatch = 256;
  std::vector<uint8_t> rows;
  for (int64_t first = 0; first < windows; first += kBatch) {
    const int n = static_cast<int>(std::min<int64_t>(kBatch, windows - first));
    rows.resize(static_cast<size_t>(n) * row);
    for (int i = 0; i < n; ++i) {
      // Window w of `windows` starts at byte floor(w * of / windows) (w itself when all are read).
      const int64_t start = static_cast<int64_t>(static_cast<__int128>(first + i) * r.of / windows);
      std::memcpy(rows.data() + i * row, holdout.bytes().data() + start, row);
    }
    ZERO_ASSIGN_OR_RETURN(double loss, model.Forward(provider, rows.data(), n, &acts));
    sum += loss * n;
    r.windows += n;
  }
  if (r.windows > 0) r.loss = sum / static_cast<double>(r.windows);
  return r;
}

// --- the job the Trainer runs ------------------------------------------------------------------------

// The byte model's side of the Trainer: its config and data, its parameters and runners, its
// header and lines, the test hook, and the held-out loss and sample after training.
class ZeroTrainJob final : public train::TrainJob {
 public:
  explicit ZeroTrainJob(const TrainOptions& o) : o_(o) {}

  Result<Config> Prepare(int rank, int world_size) override {
    auto config_or = ResolveConfig(o_, world_size);
    if (!config_or.ok()) return config_or.status().WithContext("config");
    Config config = std::move(config_or).value();
    ZERO_RETURN_IF_ERROR(CheckBatchFitsInMemory(o_, config).WithContext("config"));
    ZERO_ASSIGN_OR_RETURN(auto data, LoadData(o_));
    train_.emplace(std::move(data.first));
    holdout_.emplace(std::move(data.second));
    ZERO_RETURN_IF_ERROR(CheckCheckpointFlags(o_));
    // Rank 0 holds the --save directory's lock for the whole run: a second job fails at its start.
    if (rank == 0 && !o_.save_dir.empty()) {
      auto lock = DirectoryLock::Acquire(o_.save_dir);
      if (!lock.ok()) return lock.status().WithContext("--save " + o_.save_dir);
      save_lock_ = std::move(lock).value();
    }
    stop_on_nonfinite_ = config.stop_on_nonfinite;
    exit_at_ = TestExitStep(rank);
    return config;
  }

  // The flags, then the text's identity: its training and held-out bytes, counted and hashed (one
  // file at different paths agrees, different files do not). The initial values the engine
  // compares across ranks itself (a function of --seed and the model flags).
  std::vector<train::RankAgreementItem> RankAgreement() override {
    std::vector<train::RankAgreementItem> items;
    for (auto& [flag, value] : AgreedFlags(o_)) items.push_back({flag, value, ""});
    const auto& tb = train_->bytes();
    const auto& hb = holdout_->bytes();
    items.push_back({"the data (--data)",
                     std::to_string(tb.size()) + " training + " + std::to_string(hb.size()) +
                         " held-out bytes, xxh64 " + train::HexHash(tb.data(), tb.size()) + " " +
                         train::HexHash(hb.data(), hb.size()),
                     o_.data});
    return items;
  }

  Result<std::vector<ModelParamSpec>> InitializeParameters(Engine* engine) override {
    std::vector<ModelParamSpec> specs = ByteLmParamSpecs(o_.model);
    ZERO_RETURN_IF_ERROR(RegisterAndInitialize(engine, specs, o_.seed).WithContext("registering the model"));
    return specs;
  }

  Result<std::unique_ptr<train::ModelRunner>> CreateRunner(Device* device) override {
    return CreateModelRunner(o_, device, &*train_);
  }

  void PrintHeader(const train::Trainer& t) override {
    const Config& config = t.config();
    examples::PrintHeader(o_, config, *train_, *holdout_, *t.comm(), *t.device());
    for (const std::string& w : config.warnings) std::printf("warning: %s\n", w.c_str());
    for (const std::string& n : ConfigNotes(o_, config)) std::printf("note: %s\n", n.c_str());
    if (UnderLauncher() && o_.nproc > 0 && o_.nproc != t.world_size()) {
      std::printf("note: --nproc %d is ignored under a launcher (world size %d)\n", o_.nproc, t.world_size());
    }
  }

  void BeforeStep(int rank, int64_t step) override {
    if (step != exit_at_) return;
    std::fprintf(stderr, "zero_train: rank %d exits at step %lld (ZERO_TRAIN_TEST_EXIT)\n", rank,
                 static_cast<long long>(step));
    std::fflush(nullptr);
    _exit(3);
  }

  Status CheckStep(const StepRecord& rec) override {
    if (stop_on_nonfinite_ && rec.applied && !std::isfinite(rec.loss)) {
      return FailedPreconditionError("step " + std::to_string(rec.step) + ": the mean loss is " +
                                     (std::isnan(rec.loss) ? "nan" : "inf") +
                                     " (some rank's batch gave a NaN or inf loss); stopping rather than training on "
                                     "it: look at optimizer.params.lr, or set stop_on_nonfinite: false to train on "
                                     "regardless");
    }
    return OkStatus();
  }

  std::string StepJson(const StepRecord& rec) override { return examples::StepJson(rec); }
  std::string WindowLine(const WindowSummary& w) override { return FormatWindow(w); }
  std::string CheckpointClientState(int64_t step) override {
    return "{\"zero_train_step\": " + std::to_string(step) + ", \"seed\": " + std::to_string(o_.seed) + "}";
  }

  // Evaluation and sampling on rank 0 with the CPU model over the full parameters (collective
  // gather on every rank).
  Status AfterTraining(train::Trainer& t) override {
    const ByteDataset& holdout = *holdout_;
    const bool want_full = o_.sample > 0 || holdout.size() > static_cast<size_t>(o_.model.context);
    std::vector<std::vector<float>> full;
    if (want_full) {
      auto full_or = GatherFullParams(t.engine());
      if (!full_or.ok()) return full_or.status().WithContext("gathering the trained parameters");
      full = std::move(full_or).value();
    }
    if (!t.lead()) return OkStatus();
    const int64_t done = o_.steps - t.start_step();
    const double train_seconds = t.train_seconds();
    const std::vector<double>& losses = t.losses();
    const size_t n = losses.size();
    const size_t tail = std::min<size_t>(n, static_cast<size_t>(t.print_every()));
    double last_loss = 0;
    for (size_t i = n - tail; i < n; ++i) last_loss += losses[i];
    last_loss = tail > 0 ? last_loss / tail : NAN;
    // A run resumed at --steps trained nothing (the Trainer said so): no loss to report.
    if (done > 0)
      std::printf(
          "done: %lld steps in %.1f s (%.1f steps/s, %s tok/s); loss %.4f at step %lld -> %.4f (mean of the "
          "last %zu steps)\n",
          static_cast<long long>(done), train_seconds, done / train_seconds,
          FormatCount(done * t.tokens_per_step() / train_seconds).c_str(), t.first_loss(),
          static_cast<long long>(t.start_step() + 1), last_loss, tail);
    const std::vector<ModelParamSpec>& specs = t.specs();
    std::vector<ParamView> views;
    for (const auto& v : full) views.push_back(ParamView{v.data(), DType::kF32});
    if (!full.empty() && holdout.size() > static_cast<size_t>(o_.model.context)) {
      ZERO_ASSIGN_OR_RETURN(HoldoutResult hl, HoldoutLoss(o_.model, holdout, specs, views));
      const std::string spread =
          hl.windows < hl.of ? " (spread over its " + std::to_string(hl.of) + ")" : std::string();
      std::printf("held-out loss %.4f (%.3f bits/byte) over %lld windows%s of the last %.0f%% of the text\n", hl.loss,
                  hl.loss / std::log(2.0), static_cast<long long>(hl.windows), spread.c_str(), o_.holdout * 100);
    }
    ZERO_RETURN_IF_ERROR(t.WriteLossPlot("zero_train: ByteLm " + o_.model.ToString() + ", ZeRO stage " +
                                         std::to_string(t.config().zero.stage) + ", " + std::to_string(t.world_size()) +
                                         " ranks"));
    if (!o_.log_json.empty()) std::printf("step log: %s\n", o_.log_json.c_str());
    if (o_.sample > 0) {
      ByteLmCpu sampler(o_.model);
      ResidentParams provider(specs, views);
      ZERO_ASSIGN_OR_RETURN(std::string text, sampler.Sample(provider, o_.prompt, o_.sample, o_.temperature, o_.seed));
      std::printf("sample (temperature %g):\n%s%s\n", o_.temperature, o_.prompt.c_str(), text.c_str());
    }
    std::fflush(stdout);
    return OkStatus();
  }

 private:
  const TrainOptions& o_;
  std::optional<ByteDataset> train_, holdout_;
  DirectoryLock save_lock_;
  bool stop_on_nonfinite_ = true;
  int64_t exit_at_ = -1;
};

train::TrainerOptions TrainerOptionsFor(const TrainOptions& o) {
  train::TrainerOptions t = train::TrainerOptionsFromFlags(o);
  t.default_timeout = std::chrono::seconds(120);
  t.print_every = 0;     // the config's steps_per_print
  t.tokens_per_row = 1;  // one predicted byte per row
  t.loss_average = train::LossAverage::kPerMicroStep;
  t.unmanaged_divides_by_gas = false;
  t.announce_checkpoints = true;
  t.trace = o.trace;
  t.loop_breakdown = true;
  t.progress_bar = o.progress;
  return t;
}

Status RunRank(const TrainOptions& o, train::RankContext* where) {
  ZeroTrainJob job(o);
  return train::Trainer(TrainerOptionsFor(o), &job).Run(where);
}

// --- the launching process ---------------------------------------------------------------------------

int Launch(const TrainOptions& o, int argc, char** argv) {
  int nproc = o.nproc;
  if (o.device == "cuda") {
#if !defined(ZERO_EXAMPLES_HAS_CUDA)
    std::fprintf(stderr, "zero_train: --device cuda: this zero_train was built without the CUDA toolkit\n");
    return 2;
#endif
    const int gpus = train::VisibleGpus();
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
  return train::RunOrLaunchRanks("zero_train", nproc, argc, argv,
                                 [&](train::RankContext* where) { return RunRank(o, where); });
}

int Main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  auto parsed = ParseTrainOptions(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "zero_train: %s\n", parsed.status().ToString().c_str());
    return 2;
  }
  TrainOptions& o = *parsed;
  train::ResolveUserPaths({&o.data, &o.config_path, &o.log_json, &o.plot, &o.save_dir, &o.resume_dir, &o.trace});
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
  return train::RunLaunchedRank("zero_train", [&](train::RankContext* where) { return RunRank(o, where); });
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
