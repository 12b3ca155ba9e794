// zero_llm: trains a Llama/Qwen3 transformer (models/llama) with the zero Engine: from a preset
// (from scratch) or a Hugging Face directory, on token ids, text or the reverse-text task, at ZeRO
// stages 0-3 over several data-parallel ranks, on the CPU (gloo) or one GPU per rank (NCCL).
// Prints loss, lr, grad norm, tokens/s, model TFLOPS and MFU (cuda) and memory per rank, writes a
// JSON line per step and the loss curve, evaluates held-out text, saves/resumes checkpoints (any
// world size) and exports the model as a Hugging Face directory. docs/llm.md is the manual.
//
// Process model (as zero_train): without RANK in the environment this process checks the flags and
// config, then starts --nproc ranks of itself (tools/launcher.h); with it, it is one rank. The
// rank's loop is the Trainer's (train/trainer.h); this file gives it the transformer, its data and
// its lines (ZeroLlmJob).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/data_file.h"
#include "data/token_data.h"
#include "engine/config/config.h"
#include "engine/engine.h"
#include "hf/bpe_tokenizer.h"
#include "hf/model_dir.h"
#include "models/engine_adapters.h"
#include "models/llama/config.h"
#include "models/llama/cpu_model.h"
#include "models/llama/params.h"
#include "runtime/device.h"
#include "runtime/hash.h"
#include "runtime/json_input.h"
#include "tools/launcher.h"
#include "train/model_runner.h"
#include "train/trainer.h"
#include "train/trainer_launch.h"
#include "train/zero_llm_data.h"
#include "train/zero_llm_options.h"
#include "train/zero_train_report.h"

#if defined(ZERO_EXAMPLES_HAS_CUDA)
#include <cuda_runtime_api.h>

#include "models/llama/cuda_model.h"
#include "runtime/cuda_device.h"
#endif

namespace zero::llm {
namespace {

// The H200's dense bf16 peak (the MFU denominator).
constexpr double kPeakTflopsPerGpu = 989.0;

// --- the model on the rank's device --------------------------------------------------------------

// The transformer's micro step for the Trainer: the micro step's rows (TrainRows: sampled, in file
// order, or the reverse-text task's) with its output head (--heads), then the backend's forward of
// them; evaluation gives ForwardBatch windows of its own.
class LlmRunner : public train::ModelRunner {
 public:
  Status Forward(examples::ParamProvider& params, const train::MicroStep& at) final;
  // Forward of `batch`. With `need_loss` false the loss may come from Backward (Loss() after it);
  // with true Loss() is the forward's own (evaluation, no backward).
  virtual Status ForwardBatch(examples::ParamProvider& params, const LlmBatch& batch, bool need_loss) = 0;

 protected:
  // `data` and `o` must outlive the runner.
  LlmRunner(const Data* data, const LlmTrainOptions* o) : data_(data), o_(o) {}

 private:
  const Data* data_;
  const LlmTrainOptions* o_;
};

class CpuRunner final : public LlmRunner {
 public:
  CpuRunner(const LlmConfig& c, const Data* data, const LlmTrainOptions* o) : LlmRunner(data, o), model_(c) {}
  Status ForwardBatch(examples::ParamProvider& params, const LlmBatch& batch, bool need_loss) override {
    ZERO_ASSIGN_OR_RETURN(loss_, model_.Forward(params, batch, &acts_));
    return OkStatus();
  }
  Status Backward(examples::ParamProvider& params, float loss_scale, examples::GradSink& grads) override {
    return model_.Backward(params, &acts_, loss_scale, grads);
  }
  Result<double> Loss() override { return loss_; }
  int64_t CountedTargets() override { return acts_.counted_targets(); }

 private:
  LlmCpu model_;
  LlmActivations acts_;
  double loss_ = 0;
};

#if defined(ZERO_EXAMPLES_HAS_CUDA)
// The CUDA model on the engine's compute stream (the CudaDevice's default stream).
class CudaRunner final : public LlmRunner {
 public:
  static Result<std::unique_ptr<LlmRunner>> Create(const LlmConfig& c, Device* device, bool checkpointing,
                                                   const std::string& attention, const Data* data,
                                                   const LlmTrainOptions* o) {
    CudaDevice* cuda = device->AsCuda();
    if (cuda == nullptr) return InternalError("--device cuda: the rank's device is not a CudaDevice");
    if (cudaSetDevice(cuda->ordinal()) != cudaSuccess) return InternalError("cudaSetDevice failed");
    auto r = std::unique_ptr<CudaRunner>(new CudaRunner(data, o));
    LlmCudaOptions opts;
    opts.activation_checkpointing = checkpointing;
    opts.attention = attention == "cudnn"    ? LlmAttention::kCudnn
                     : attention == "kernel" ? LlmAttention::kKernel
                                             : LlmAttention::kAuto;
    ZERO_ASSIGN_OR_RETURN(r->model_, LlmCuda::Create(c, device, /*stream=*/nullptr, opts));
    return std::unique_ptr<LlmRunner>(std::move(r));
  }
  // In training the loss is read after backward (Loss), so forward and backward queue without a
  // host wait; evaluation asks the forward for it.
  Status ForwardBatch(examples::ParamProvider& params, const LlmBatch& batch, bool need_loss) override {
    return model_->Forward(params, batch, &acts_, need_loss).status();
  }
  Status Backward(examples::ParamProvider& params, float loss_scale, examples::GradSink& grads) override {
    return model_->Backward(params, &acts_, loss_scale, grads);
  }
  Result<double> Loss() override { return model_->ReadLoss(acts_); }
  int64_t CountedTargets() override { return acts_.counted_targets(); }

 private:
  CudaRunner(const Data* data, const LlmTrainOptions* o) : LlmRunner(data, o) {}
  std::unique_ptr<LlmCuda> model_;
  LlmCudaActivations acts_;
};
#endif

Result<std::unique_ptr<LlmRunner>> CreateRunner(const LlmTrainOptions& o, const LlmConfig& c, Device* device,
                                                const Data* data) {
  if (o.device == "cpu") return std::unique_ptr<LlmRunner>(new CpuRunner(c, data, &o));
#if defined(ZERO_EXAMPLES_HAS_CUDA)
  return CudaRunner::Create(c, device, o.activation_checkpointing, o.attention, data, &o);
#else
  return UnimplementedError("--device cuda: this zero_llm was built without the CUDA toolkit");
#endif
}

Status LlmRunner::Forward(examples::ParamProvider& params, const train::MicroStep& at) {
  LlmBatch batch = TrainRows(*data_, *o_, at.rows, at.index, at.rank, at.world_size);
  batch.head = HeadForMicroStep(*o_, at.step, at.micro);
  return ForwardBatch(params, batch, /*need_loss=*/false);
}

// --- evaluation (collective: the engine gathers at stage 3) --------------------------------------------

struct EvalResult {
  double loss = 0;            // mean nats per counted target
  int64_t targets = 0;        // targets counted
  int64_t windows = 0;        // windows evaluated,
  int64_t of = 0;             // of this many the data has
  double standard_error = 0;  // of the mean of the windows' losses (0 with one window)
};

// `windows` (consecutive windows of seq + 1 tokens, or one per task example) evaluated, each rank
// taking every world-th one (a rank without a window in the last round runs window 0 and counts
// nothing). `what` names the data in errors: no window, or a loss that is not finite (NaN or inf
// weights, or a model that overflows), is an error rather than a number.
Result<EvalResult> EvaluateWindows(const std::vector<LlmBatch>& windows, int64_t of, const std::string& what,
                                   LlmRunner* model, examples::ParamProvider& params, Communicator* comm) {
  if (windows.empty()) return InvalidArgumentError(what + ": no window to evaluate");
  const int world = comm->world_size(), rank = comm->rank();
  double sums[5] = {0, 0, 0, 0, 0};  // loss * count, count, windows, sum and sum of squares of the windows' losses
  for (size_t base = 0; base < windows.size(); base += world) {
    const size_t i = base + rank;
    const bool mine = i < windows.size();
    ZERO_RETURN_IF_ERROR(model->ForwardBatch(params, windows[mine ? i : 0], /*need_loss=*/true)
                             .WithContext(what + ": window " + std::to_string(i)));
    ZERO_ASSIGN_OR_RETURN(double loss, model->Loss());
    if (mine) {
      const int64_t n = model->CountedTargets();
      sums[0] += loss * static_cast<double>(n);
      sums[1] += static_cast<double>(n);
      sums[2] += 1;
      sums[3] += loss;
      sums[4] += loss * loss;
    }
  }
  ZERO_RETURN_IF_ERROR(comm->AllReduceHost(sums, 5, ReduceOp::kSum).WithContext("summing the eval loss"));
  EvalResult r;
  r.targets = static_cast<int64_t>(sums[1]);
  r.windows = static_cast<int64_t>(sums[2]);
  r.of = of;
  r.loss = sums[1] > 0 ? sums[0] / sums[1] : NAN;
  if (!std::isfinite(r.loss)) {
    return FailedPreconditionError(what + ": the loss over " + std::to_string(r.windows) + " windows (" +
                                   std::to_string(r.targets) + " targets) is " + Printf("%g", r.loss) +
                                   ", not a number: the weights hold NaN or inf values, or the model overflows");
  }
  if (r.windows > 1) {
    const double mean = sums[3] / sums[2];
    const double var = std::max(0.0, (sums[4] - sums[2] * mean * mean) / (sums[2] - 1));
    r.standard_error = std::sqrt(var / sums[2]);
  }
  return r;
}

// The LM windows of `tokens` (at most max_windows, spread over them; 0: all) or the task's examples.
Result<EvalResult> Evaluate(const std::vector<int32_t>& tokens, const std::vector<ReverseTextExample>& examples,
                            const LlmTrainOptions& o, int64_t max_windows, const std::string& what, LlmRunner* model,
                            examples::ParamProvider& params, Communicator* comm) {
  const bool task = !o.task.empty();
  const std::vector<LlmBatch> windows =
      task ? ReverseTextEvalWindows(examples, o.seq, max_windows) : EvalWindows(tokens, o.seq, max_windows);
  const int64_t of = task ? static_cast<int64_t>(examples.size()) : EvalWindowCount(tokens.size(), o.seq);
  return EvaluateWindows(windows, of, what, model, params, comm);
}

std::string EvalLine(const char* key, const EvalResult& r, const std::string& what) {
  return Printf("%s=%.6f tokens=%lld (%s: %lld of its %lld windows, standard error %.4f)", key, r.loss,
                static_cast<long long>(r.targets), what.c_str(), static_cast<long long>(r.windows),
                static_cast<long long>(r.of), r.standard_error);
}

// --- weights in and out --------------------------------------------------------------------------------

// Initial values: the HF directory's tensors (at stage 3 with several ranks a rank reads only its
// partition: Engine::InitializeFromSlices) or the preset's deterministic initialization.
// Extra heads (--extra-heads) are not in the directory: they start from the preset initialization.
Status InitializeWeights(Engine* engine, const LlmTrainOptions& o, const LlmConfig& c,
                         const std::vector<examples::ModelParamSpec>& specs) {
  if (o.model_dir.empty()) return examples::RegisterAndInitialize(engine, specs, o.seed);
  const int hf_params = HfParamCount(c);
  ZERO_ASSIGN_OR_RETURN(HfWeights weights, HfWeights::Open(o.model_dir));
  std::set<std::string> ignorable;
  if (c.tie_word_embeddings) ignorable.insert("lm_head.weight");
  for (const std::string& n : weights.names()) {
    if (EndsWith(n, "rotary_emb.inv_freq")) ignorable.insert(n);
  }
  ZERO_RETURN_IF_ERROR(
      weights.Check(std::vector<examples::ModelParamSpec>(specs.begin(), specs.begin() + hf_params), ignorable));
  // A tied model computes its head from the embedding: an lm_head.weight beside it must be that copy.
  if (c.tie_word_embeddings) {
    ZERO_RETURN_IF_ERROR(weights.CheckTiedCopy("lm_head.weight", "model.embed_tokens.weight",
                                               o.model_dir + "/config.json: tie_word_embeddings is true"));
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    ZERO_ASSIGN_OR_RETURN(int index, engine->RegisterParameter({specs[i].name, specs[i].shape, specs[i].module}));
    if (index != static_cast<int>(i)) return InternalError("registration order");
  }
  // At stage 3 with several ranks each rank reads only its shard of every tensor.
  return engine->InitializeFromSlices([&](int index, int64_t begin, int64_t count, float* values) {
    if (index >= hf_params) {
      examples::InitParamSlice(specs[index], o.seed, begin, count, values);
      return OkStatus();
    }
    return weights.ReadSlice(specs[index].name, begin, count, values);
  });
}

Status Export(Engine* engine, const LlmTrainOptions& o, const LlmConfig& c,
              const std::vector<examples::ModelParamSpec>& specs, const std::string& tokenizer_json, bool lead) {
  // Every rank takes part in each gather; rank 0 writes. The extra heads are not Hugging Face's.
  const std::vector<examples::ModelParamSpec> hf(specs.begin(), specs.begin() + HfParamCount(c));
  std::vector<std::vector<float>> full(hf.size());
  for (size_t i = 0; i < hf.size(); ++i) {
    full[i].resize(static_cast<size_t>(hf[i].numel()));
    ZERO_RETURN_IF_ERROR(engine->GatherMasterWeights(static_cast<int>(i), full[i].data()));
  }
  if (!lead) return OkStatus();
  const DType dtype = c.torch_dtype == "float32"   ? DType::kF32
                      : c.torch_dtype == "float16" ? DType::kF16
                                                   : DType::kBF16;
  // The tokenizer files are part of the export: written, checked and published with the weights
  // (hf/model_dir.h: the directory is replaced whole, so an earlier export's tokenizer never stays).
  std::vector<ExportFile> extra;
  if (!tokenizer_json.empty()) {
    // tokenizer_config.json tells transformers' AutoTokenizer which class and special token to use.
    extra.push_back({"tokenizer.json", tokenizer_json});
    extra.push_back({"tokenizer_config.json",
                     std::string("{\"tokenizer_class\": \"PreTrainedTokenizerFast\", \"eos_token\": \"") + kEndOfText +
                         "\", \"pad_token\": \"" + kEndOfText +
                         "\", \"model_max_length\": " + std::to_string(c.max_position_embeddings) + "}\n"});
  }
  ZERO_RETURN_IF_ERROR(ExportHf(
      o.export_hf, ToHfConfigJson(c), hf, dtype,
      [&](int index, float* out) {
        std::copy(full[index].begin(), full[index].end(), out);
        return OkStatus();
      },
      5'000'000'000, extra));
  std::printf("exported the model to %s (Hugging Face directory, %s)\n", o.export_hf.c_str(), c.torch_dtype.c_str());
  return OkStatus();
}

// --- sizes ----------------------------------------------------------------------------------------------

// What the rank's device can hold: the host's physical memory on the CPU, the GPU's on cuda
// (device 0's total; 0: unknown).
double DeviceMemoryBytes(const LlmTrainOptions& o) {
#if defined(ZERO_EXAMPLES_HAS_CUDA)
  if (o.device == "cuda") {
    cudaDeviceProp prop{};
    return cudaGetDeviceProperties(&prop, 0) == cudaSuccess ? static_cast<double>(prop.totalGlobalMem) : 0.0;
  }
#endif
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
}

// A lower bound of one micro step's activations (cpu_model.h's memory note: per layer the [N, H]
// tensors, q/k/v and the attention output, the MLP's three [N, I], and the attention
// probabilities; once the logits and their gradient [N, V]; fp32 on the CPU; on cuda bf16 and,
// with activation checkpointing, only each layer's input) against the device's memory, before
// anything is allocated: an absurd --batch or --seq is an error naming them instead of a
// bad_alloc (or a machine swapping) in every rank.
Status CheckMicroBatchFits(const LlmTrainOptions& o, const LlmConfig& c, const Config& config) {
  const long double rows = static_cast<long double>(config.train_micro_batch_size_per_gpu);
  const long double n = rows * o.seq;
  const long double layers = static_cast<long double>(c.num_hidden_layers);
  const long double h = c.hidden_size, inter = c.intermediate_size, v = c.vocab_size;
  const long double qkv = (2.0L * c.num_attention_heads + 2.0L * c.num_key_value_heads) * c.head_dim;
  long double need = 0;
  if (o.device == "cuda") {
    need = 2.0L * n * ((o.activation_checkpointing ? layers * h : layers * (4 * h + qkv + 3 * inter)) + v);
  } else {
    need = 4.0L * (n * (layers * (4 * h + qkv + 3 * inter) + 2 * v + 2 * h) +
                   layers * rows * c.num_attention_heads * static_cast<long double>(o.seq) * o.seq);
  }
  const double have = DeviceMemoryBytes(o);
  if (have <= 0 || need <= have) return OkStatus();
  const std::string batch = o.config_path.empty() ? "--batch " + std::to_string(o.batch)
                                                  : "train_micro_batch_size_per_gpu " +
                                                        std::to_string(config.train_micro_batch_size_per_gpu) +
                                                        " (--config " + o.config_path + ")";
  return ResourceExhaustedError(batch + " x --seq " + std::to_string(o.seq) + " = " +
                                std::to_string(static_cast<long long>(n)) + " tokens per micro step need at least " +
                                examples::FormatBytes(static_cast<double>(need)) + " of activations per rank (" +
                                c.ToString() + ", vocabulary " + std::to_string(c.vocab_size) +
                                ": a lower bound), more than the " + examples::FormatBytes(have) + " of memory " +
                                (o.device == "cuda" ? "of one GPU" : "of this machine") +
                                "; lower --batch (and raise --gas for the same tokens per step) or --seq");
}

// --- the job the Trainer runs ------------------------------------------------------------------------

// The transformer's side of the Trainer: its model config, config and data, its weights (preset or
// Hugging Face) and runners, its header and lines, an evaluation-only run, and after training the
// held-out loss, the export and the weights' hash.
class ZeroLlmJob final : public train::TrainJob {
 public:
  explicit ZeroLlmJob(const LlmTrainOptions& o) : o_(o) {}

  Result<Config> Prepare(int rank, int world_size) override {
    world_size_ = world_size;
    world_rank_ = rank;
    ZERO_ASSIGN_OR_RETURN(mc_, ModelConfig(o_));
    auto config_or = ResolveLlmConfig(o_, world_size);
    if (!config_or.ok()) return config_or.status().WithContext("config");
    ZERO_RETURN_IF_ERROR(CheckMicroBatchFits(o_, mc_, *config_or));
    ZERO_ASSIGN_OR_RETURN(data_, LoadData(o_, mc_));
    agreement_.clear();
    for (auto& [flag, value] : LlmAgreedFlags(o_)) agreement_.push_back({flag, value, ""});
    agreement_.push_back({"the model", mc_.ToString(), ""});
    agreement_.push_back({"the data (--data)", DataIdentity(data_), o_.data.empty() ? "the built-in corpus" : o_.data});
    if (!o_.model_dir.empty()) {
      ZERO_ASSIGN_OR_RETURN(std::string weights, ModelDirIdentity(o_.model_dir));
      agreement_.push_back({"the initial weights (--model)", weights, o_.model_dir});
    }
    return std::move(config_or).value();
  }

  std::vector<train::RankAgreementItem> RankAgreement() override { return agreement_; }

  // A checkpoint records the tokenizer and the data it was trained with: resuming with another
  // tokenizer is refused (the token ids would mean other text), with other data it is said.
  std::string CheckpointClientState(int64_t step) override {
    nlohmann::json j;
    j["zero_llm_step"] = step;
    j["tokenizer"] = TokenizerIdentity();
    j["data"] = DataIdentity(data_);
    return j.dump();
  }
  Status CheckResumedClientState(const std::string& client_state) override {
    ZERO_ASSIGN_OR_RETURN(nlohmann::json j,
                          ParseJsonText<nlohmann::json>(client_state, "the checkpoint's client state"));
    if (!j.is_object() || !j.contains("tokenizer") || !j["tokenizer"].is_string()) {
      if (world_rank_ == 0) std::printf("  note: the checkpoint records no tokenizer (saved before zero_llm did)\n");
      return OkStatus();
    }
    const std::string saved = j["tokenizer"].get<std::string>(), mine = TokenizerIdentity();
    if (saved != mine) {
      return InvalidArgumentError("the checkpoint was trained with another tokenizer (" + saved +
                                  "; this run's: " + mine +
                                  "): its token ids would mean other text; resume with the same --tokenizer / "
                                  "--model / --tokenizer-vocab and data as the run that saved it");
    }
    if (world_rank_ == 0 && j.contains("data") && j["data"].is_string() &&
        j["data"].get<std::string>() != DataIdentity(data_)) {
      std::printf("  note: this run's data differs from the checkpoint's (%s; saved with %s)\n",
                  DataIdentity(data_).c_str(), j["data"].get<std::string>().c_str());
    }
    return OkStatus();
  }

  Result<std::vector<examples::ModelParamSpec>> InitializeParameters(Engine* engine) override {
    specs_ = LlmParamSpecs(mc_);
    ZERO_RETURN_IF_ERROR(InitializeWeights(engine, o_, mc_, specs_).WithContext("initial weights"));
    return specs_;
  }

  Result<std::unique_ptr<train::ModelRunner>> CreateRunner(Device* device) override {
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<LlmRunner> runner, llm::CreateRunner(o_, mc_, device, &data_));
    runner_ = runner.get();
    return std::unique_ptr<train::ModelRunner>(std::move(runner));
  }

  void PrintHeader(const train::Trainer& t) override {
    const Config& config = t.config();
    std::printf(
        "zero_llm: %s\n  data: %s\n  ZeRO stage %d, %s, %d rank(s) on %s, seq %d, micro batch %lld, GAS %lld: %lld "
        "tokens per step\n",
        mc_.ToString().c_str(), data_.source.c_str(), config.zero.stage, DTypeName(config.model_dtype()),
        t.world_size(), o_.device.c_str(), o_.seq, static_cast<long long>(config.train_micro_batch_size_per_gpu),
        static_cast<long long>(config.gradient_accumulation_steps),
        static_cast<long long>(config.train_batch_size * o_.seq));
    if (o_.extra_heads > 0) std::printf("  %d extra head(s), schedule %s\n", o_.extra_heads, o_.heads.c_str());
    if (!config.managed_gradient_accumulation) std::printf("  unmanaged gradient accumulation\n");
    for (const std::string& w : config.warnings) std::printf("warning: %s\n", w.c_str());
    if (!data_.held_out.empty()) std::printf("  %s\n", data_.held_out.c_str());
  }

  // --eval-only: every window of the data, with the weights of --model / the preset or, with
  // --resume DIR, of that checkpoint.
  Result<bool> RunWithoutTraining(train::Trainer& t) override {
    if (!o_.eval_only) return false;
    if (!o_.resume_dir.empty()) {
      Result<std::string> client_state = t.engine()->LoadCheckpoint(o_.resume_dir);
      ZERO_RETURN_IF_ERROR(client_state.status().WithContext("--resume " + o_.resume_dir));
      ZERO_RETURN_IF_ERROR(CheckResumedClientState(*client_state).WithContext("--resume " + o_.resume_dir));
      if (t.lead()) {
        std::printf("  evaluating the checkpoint %s (step %lld)\n", o_.resume_dir.c_str(),
                    static_cast<long long>(t.engine()->counters().global_steps));
      }
    }
    const std::string what = "--eval-only on " + (o_.data.empty() ? std::string("the built-in corpus") : o_.data);
    ZERO_ASSIGN_OR_RETURN(EvalResult ev,
                          Evaluate(data_.eval, data_.task_eval, o_, 0, what, runner_, t.params(), t.comm()));
    if (t.lead()) std::printf("%s\n", EvalLine("eval_loss", ev, "all of the data").c_str());
    return true;
  }

  Status CheckStep(const examples::StepRecord& rec) override {
    if (!std::isfinite(rec.loss) || !std::isfinite(rec.grad_norm)) {
      return InternalError("step " + std::to_string(rec.step) + ": the loss (" + std::to_string(rec.loss) +
                           ") or the gradient norm (" + std::to_string(rec.grad_norm) +
                           ") is not finite; lower the learning rate (--lr) or check the data");
    }
    return OkStatus();
  }

  std::string StepJson(const examples::StepRecord& rec) override {
    const double tokens = static_cast<double>(rec.tokens), seconds = rec.step_seconds;
    return Printf(
        "{\"step\":%lld,\"loss\":%.6f,\"lr\":%.6g,\"grad_norm\":%.6g,\"step_s\":%.6f,\"tokens\":%.0f,"
        "\"tokens_per_s\":%.1f,\"model_tflops\":%.3f}",
        static_cast<long long>(rec.step), rec.loss, rec.lr, rec.grad_norm, seconds, tokens, tokens / seconds,
        tokens * FlopsPerToken() / seconds / 1e12);
  }

  std::string WindowLine(const examples::WindowSummary& w) override {
    const double tps = static_cast<double>(w.tokens) / w.seconds;
    const double tflops = tps * FlopsPerToken() / 1e12;
    std::string mfu;
    if (o_.device == "cuda") mfu = Printf(", MFU %.1f%%", 100.0 * tflops / (kPeakTflopsPerGpu * world_size_));
    return Printf(
        "step %lld/%d  loss %.4f  lr %.3g  grad norm %.3g  %s tok/s  %.2f model TFLOPS%s  peak %s device, %s host "
        "per rank",
        static_cast<long long>(w.last.step), o_.steps, w.mean_loss, w.last.lr, w.last.grad_norm,
        examples::FormatCount(tps).c_str(), tflops, mfu.c_str(),
        examples::FormatBytes(static_cast<double>(w.memory_max.device_peak)).c_str(),
        examples::FormatBytes(w.host_peak_max).c_str());
  }

  Status AfterTraining(train::Trainer& t) override {
    const bool lead = t.lead();
    if (lead && o_.steps > t.start_step()) {
      std::printf("done: %lld steps in %.1f s\n", static_cast<long long>(o_.steps - t.start_step()), t.train_seconds());
    }
    if (!t.losses().empty()) {
      ZERO_RETURN_IF_ERROR(
          t.WriteLossPlot("zero_llm: " + mc_.ToString() + ", ZeRO stage " + std::to_string(t.config().zero.stage)));
    }
    ZERO_RETURN_IF_ERROR(EvaluateSplits(t));
    Engine* engine = t.engine();
    if (!o_.export_hf.empty()) {
      ZERO_RETURN_IF_ERROR(Export(engine, o_, mc_, specs_, data_.tokenizer_json, lead).WithContext("--export-hf"));
    }
    if (o_.hash_weights) {
      uint64_t h = 0;
      std::vector<float> v;
      for (size_t i = 0; i < specs_.size(); ++i) {
        v.resize(static_cast<size_t>(specs_[i].numel()));
        ZERO_RETURN_IF_ERROR(engine->GatherMasterWeights(static_cast<int>(i), v.data()));
        for (float x : v) {
          uint32_t bits;
          std::memcpy(&bits, &x, 4);
          h = SplitMix64(h ^ bits);
        }
      }
      if (lead) std::printf("master_weights_hash=%016llx\n", static_cast<unsigned long long>(h));
    }
    return OkStatus();
  }

 private:
  double FlopsPerToken() const { return mc_.TrainFlopsPerToken(o_.seq); }

  // After training: the held-out loss over up to --eval-windows windows spread over the held-out
  // split, and the training split's over as many windows with the same code, so the two compare.
  Status EvaluateSplits(train::Trainer& t) {
    if (o_.eval_windows <= 0) return OkStatus();
    const bool task = !o_.task.empty();
    const int64_t held =
        task ? static_cast<int64_t>(data_.task_eval.size()) : EvalWindowCount(data_.eval.size(), o_.seq);
    if (held < 1) {
      if (t.lead()) {
        std::printf("no held-out evaluation: %s\n",
                    o_.holdout <= 0      ? "--holdout 0"
                    : data_.eval.empty() ? "nothing was held out (see the header)"
                                         : "the held-out split is shorter than one window of --seq + 1 tokens");
      }
      return OkStatus();
    }
    const int64_t windows = std::min(o_.eval_windows, held);
    ZERO_ASSIGN_OR_RETURN(EvalResult train, Evaluate(data_.train, data_.task_train, o_, windows, "the training split",
                                                     runner_, t.params(), t.comm()));
    ZERO_ASSIGN_OR_RETURN(EvalResult eval, Evaluate(data_.eval, data_.task_eval, o_, windows, "the held-out split",
                                                    runner_, t.params(), t.comm()));
    if (t.lead()) {
      std::printf("%s\n", EvalLine("train_loss", train, "training split").c_str());
      std::printf("%s\n", EvalLine("eval_loss", eval, "held-out").c_str());
    }
    return OkStatus();
  }

  const LlmTrainOptions& o_;
  LlmConfig mc_;
  Data data_;
  std::vector<examples::ModelParamSpec> specs_;
  LlmRunner* runner_ = nullptr;  // owned by the Trainer
  // What the token ids mean: the tokenizer trained or loaded (its tokenizer.json, hashed), or, for
  // token-id data with no tokenizer, the vocabulary size alone.
  std::string TokenizerIdentity() const {
    char out[96];
    if (data_.tokenizer_json.empty()) {
      std::snprintf(out, sizeof(out), "token ids of a vocabulary of %lld, no tokenizer",
                    static_cast<long long>(mc_.vocab_size));
    } else {
      std::snprintf(
          out, sizeof(out), "tokenizer.json xxh64 %016llx",
          static_cast<unsigned long long>(XxHash64(data_.tokenizer_json.data(), data_.tokenizer_json.size())));
    }
    return out;
  }

  int world_size_ = 1;
  int world_rank_ = 0;
  std::vector<train::RankAgreementItem> agreement_;
};

train::TrainerOptions TrainerOptionsFor(const LlmTrainOptions& o) {
  train::TrainerOptions t = train::TrainerOptionsFromFlags(o);
  t.default_timeout = std::chrono::seconds(300);
  // With --config the file's steps_per_print, unless --print-every was given (and agrees with it).
  t.print_every = o.config_path.empty() || o.Given("print-every") ? o.print_every : 0;
  t.tokens_per_row = o.seq;
  t.loss_average = train::LossAverage::kPerTarget;
  t.unmanaged_divides_by_gas = true;
  if (!o.export_hf.empty()) {
    t.check_lead_outputs = [&o] { return CheckExportTarget(o.export_hf).WithContext("--export-hf " + o.export_hf); };
  }
  return t;
}

Status RunRank(const LlmTrainOptions& o, train::RankContext* where) {
  ZeroLlmJob job(o);
  return train::Trainer(TrainerOptionsFor(o), &job).Run(where);
}

// --- the launching process ---------------------------------------------------------------------------

// The files a run reads, checked before any rank starts: --data and --tokenizer regular files (a
// named pipe blocked the ranks forever, a directory read as 0 tokens), a text to tokenize with a
// tokenizer it may use, and --eval-only's --resume a directory.
Status CheckInputs(const LlmTrainOptions& o) {
  // The outputs first, so that a path the run cannot write fails now, not after training.
  ZERO_RETURN_IF_ERROR(train::CheckSaveDirectory(o.save_dir));
  if (!o.export_hf.empty()) {
    ZERO_RETURN_IF_ERROR(CheckExportTarget(o.export_hf).WithContext("--export-hf " + o.export_hf));
  }
  if (!o.data.empty()) ZERO_RETURN_IF_ERROR(data::CheckDataFile("--data", o.data, kDataExpected));
  if (!o.tokenizer.empty()) {
    ZERO_RETURN_IF_ERROR(data::CheckDataFile("--tokenizer", o.tokenizer, "a tokenizer.json file"));
  }
  ZERO_RETURN_IF_ERROR(CheckTokenizerSource(o));
  if (o.eval_only && !o.resume_dir.empty()) {
    struct stat st;
    if (::stat(o.resume_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return NotFoundError("--eval-only --resume " + o.resume_dir + ": no such checkpoint directory");
    }
  }
  return OkStatus();
}

int Launch(const LlmTrainOptions& o, int argc, char** argv) {
  int nproc = o.nproc;
  if (o.device == "cuda") {
    const int gpus = train::VisibleGpus();
    if (gpus == 0) {
      std::fprintf(stderr, "zero_llm: --device cuda: no GPU visible (or built without CUDA)\n");
      return 2;
    }
    if (nproc == 0) nproc = gpus;
  }
  if (nproc == 0) nproc = 2;
  auto mc = ModelConfig(o);
  if (!mc.ok()) {
    std::fprintf(stderr, "zero_llm: %s\n", mc.status().ToString().c_str());
    return 2;
  }
  if (o.seq > mc->max_position_embeddings) {
    std::fprintf(stderr, "zero_llm: --seq %d exceeds the model's max_position_embeddings %lld\n", o.seq,
                 static_cast<long long>(mc->max_position_embeddings));
    return 2;
  }
  auto config = ResolveLlmConfig(o, nproc);
  if (!config.ok()) {
    std::fprintf(stderr, "zero_llm: config error: %s\n", config.status().ToString().c_str());
    return 2;
  }
  if (o.print_config) {
    std::printf("%s\n", ConfigToJson(*config).c_str());
    return 0;
  }
  if (Status st = CheckMicroBatchFits(o, *mc, *config); !st.ok()) {
    std::fprintf(stderr, "zero_llm: %s\n", st.ToString().c_str());
    return 2;
  }
  if (Status st = CheckInputs(o); !st.ok()) {
    std::fprintf(stderr, "zero_llm: %s\n", st.ToString().c_str());
    return 2;
  }
  return train::RunOrLaunchRanks("zero_llm", nproc, argc, argv,
                                 [&](train::RankContext* where) { return RunRank(o, where); });
}

int Main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  std::vector<std::string> args(argv + 1, argv + argc);
  auto parsed = ParseLlmTrainOptions(args);
  if (!parsed.ok()) {
    std::fprintf(stderr, "zero_llm: %s\n", parsed.status().ToString().c_str());
    return 2;
  }
  LlmTrainOptions& o = *parsed;
  if (o.help) {
    std::printf("%s", LlmUsageText().c_str());
    return 0;
  }
  train::ResolveUserPaths({&o.data, &o.model_dir, &o.tokenizer, &o.config_path, &o.export_hf, &o.save_dir,
                           &o.resume_dir, &o.log_json, &o.plot});
  if (!UnderLauncher()) return Launch(o, argc, argv);
  return train::RunLaunchedRank("zero_llm", [&](train::RankContext* where) { return RunRank(o, where); });
}

}  // namespace
}  // namespace zero::llm

// The last net under absurd input that passes every check: an allocation the machine cannot
// satisfy ends the rank with a message and exit status 1, not an abort without one.
int main(int argc, char** argv) {
  try {
    return zero::llm::Main(argc, argv);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "zero_llm: out of host memory (std::bad_alloc): the model, --seq or the micro batch is too large for "
                 "this machine\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero_llm: unexpected exception: %s\n", e.what());
  }
  return 1;
}
