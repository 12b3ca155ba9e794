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
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

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
#include "tools/launcher.h"
#include "train/model_runner.h"
#include "train/trainer.h"
#include "train/trainer_launch.h"
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

struct Data;

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

// --- model and data ----------------------------------------------------------------------------------

Result<LlmConfig> ModelConfig(const LlmTrainOptions& o) {
  LlmConfig c;
  if (!o.model_dir.empty()) {
    ZERO_ASSIGN_OR_RETURN(c, LoadHfConfig(o.model_dir));
  } else {
    auto p = Preset(o.preset);
    if (!p.ok()) return p.status().WithContext("--preset");
    c = *p;
  }
  c.extra_heads = o.extra_heads;
  return c;
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

Result<std::string> ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError("--data " + path + ": cannot open");
  std::stringstream s;
  s << in.rdbuf();
  if (in.bad()) return DataLossError("--data " + path + ": read error");
  return s.str();
}

// Everything a rank trains and evaluates on: token ids (or, for the task, prepared rows).
struct Data {
  std::string source;                                     // for the header line
  std::vector<int32_t> train, eval;                       // token streams (LM data)
  std::vector<ReverseTextExample> task_train, task_eval;  // the reverse-text task
  std::string tokenizer_json;                             // the tokenizer used (empty for .bin data)
};

Result<BpeTokenizer> TokenizerFor(const LlmTrainOptions& o, const LlmConfig& c, const std::string& text) {
  std::string path = o.tokenizer;
  if (path.empty() && !o.model_dir.empty() && access((o.model_dir + "/tokenizer.json").c_str(), R_OK) == 0) {
    path = o.model_dir + "/tokenizer.json";
  }
  if (!path.empty()) {
    ZERO_ASSIGN_OR_RETURN(BpeTokenizer t, BpeTokenizer::Load(path));
    if (t.vocab_size() > c.vocab_size) {
      return InvalidArgumentError("tokenizer " + path + " has " + std::to_string(t.vocab_size()) +
                                  " tokens, more than the model's vocab_size " + std::to_string(c.vocab_size));
    }
    return t;
  }
  const int vocab = o.tokenizer_vocab > 0 ? o.tokenizer_vocab : static_cast<int>(std::min<int64_t>(c.vocab_size, 4096));
  if (vocab > c.vocab_size) {
    return InvalidArgumentError("--tokenizer-vocab " + std::to_string(vocab) + " exceeds the model's vocab_size " +
                                std::to_string(c.vocab_size));
  }
  return BpeTokenizer::Train(text, vocab);
}

Result<Data> LoadData(const LlmTrainOptions& o, const LlmConfig& c) {
  Data d;
  if (!o.data.empty() && EndsWith(o.data, ".bin")) {
    ZERO_ASSIGN_OR_RETURN(std::vector<int32_t> ids, ReadTokenBin(o.data, c.vocab_size));
    d.source = o.data + " (" + std::to_string(ids.size()) + " token ids)";
    d.train = std::move(ids);
  } else {
    std::string text;
    if (!o.data.empty()) {
      ZERO_ASSIGN_OR_RETURN(text, ReadTextFile(o.data));
      d.source = o.data;
    } else {
      CorpusOptions co;
      co.max_bytes = o.corpus_bytes;
      ZERO_ASSIGN_OR_RETURN(text, LoadCorpus(co));
      d.source = "the built-in corpus (" + std::to_string(text.size()) + " bytes)";
    }
    ZERO_ASSIGN_OR_RETURN(BpeTokenizer tok, TokenizerFor(o, c, text));
    d.tokenizer_json = tok.ToJson();
    if (o.task == "reverse-text") {
      ZERO_ASSIGN_OR_RETURN(std::vector<ReverseTextExample> ex,
                            ReverseTextExamples(text, tok, /*count=*/4096, o.seed, /*max_snippet_chars=*/
                                                std::max(8, o.seq / 3)));
      const size_t hold = std::max<size_t>(1, static_cast<size_t>(ex.size() * o.holdout));
      d.task_eval.assign(ex.end() - hold, ex.end());
      ex.resize(ex.size() - hold);
      d.task_train = std::move(ex);
      d.source += ", reverse-text task: " + std::to_string(d.task_train.size()) + " examples";
      return d;
    }
    d.train = tok.Encode(text);
    d.source += ", " + std::to_string(d.train.size()) + " tokens (vocabulary " + std::to_string(tok.vocab_size()) + ")";
  }
  if (!o.eval_only && o.holdout > 0) {
    const size_t hold = static_cast<size_t>(d.train.size() * o.holdout);
    d.eval.assign(d.train.end() - hold, d.train.end());
    d.train.resize(d.train.size() - hold);
  } else if (o.eval_only) {
    d.eval = d.train;
  }
  if (!o.eval_only && d.train.size() < static_cast<size_t>(o.seq) + 1) {
    return InvalidArgumentError("the training data holds " + std::to_string(d.train.size()) +
                                " tokens, fewer than --seq + 1 = " + std::to_string(o.seq + 1));
  }
  return d;
}

LlmBatch TrainRows(const Data& d, const LlmTrainOptions& o, int batch, int64_t micro_index, int rank, int world) {
  if (!d.task_train.empty()) return ReverseTextBatch(d.task_train, o.seq, batch, micro_index, rank, world, o.seed);
  if (!o.sequential_data) return TrainBatch(d.train, o.seq, batch, micro_index, rank, world, o.seed);
  LlmBatch b;
  b.batch = batch;
  b.seq = o.seq;
  const int64_t windows = static_cast<int64_t>(d.train.size()) / (o.seq + 1);
  for (int i = 0; i < batch; ++i) {
    const int64_t w = ((micro_index * world + rank) * batch + i) % windows;
    const int32_t* p = d.train.data() + w * (o.seq + 1);
    b.inputs.insert(b.inputs.end(), p, p + o.seq);
    b.targets.insert(b.targets.end(), p + 1, p + o.seq + 1);
  }
  return b;
}

Status LlmRunner::Forward(examples::ParamProvider& params, const train::MicroStep& at) {
  LlmBatch batch = TrainRows(*data_, *o_, at.rows, at.index, at.rank, at.world_size);
  batch.head = HeadForMicroStep(*o_, at.step, at.micro);
  return ForwardBatch(params, batch, /*need_loss=*/false);
}

// --- evaluation (collective: the engine gathers at stage 3) --------------------------------------------

// Mean nats per counted target over the eval windows (each rank takes every world-th window; a
// rank without a window in the last round runs window 0 and counts nothing), and the count.
Result<std::pair<double, int64_t>> Evaluate(const Data& d, const LlmTrainOptions& o, int64_t max_windows,
                                            LlmRunner* model, examples::ParamProvider& params, Communicator* comm) {
  std::vector<LlmBatch> windows;
  if (!d.task_eval.empty()) {
    windows = ReverseTextEvalWindows(d.task_eval, o.seq);
  } else {
    windows = EvalWindows(d.eval, o.seq);
  }
  if (max_windows > 0 && static_cast<int64_t>(windows.size()) > max_windows) windows.resize(max_windows);
  const int world = comm->world_size(), rank = comm->rank();
  double sums[2] = {0, 0};  // loss * count, count
  for (size_t base = 0; base < windows.size(); base += world) {
    const size_t i = base + rank;
    const bool mine = i < windows.size();
    ZERO_RETURN_IF_ERROR(model->ForwardBatch(params, windows[mine ? i : 0], /*need_loss=*/true)
                             .WithContext("eval window " + std::to_string(i)));
    ZERO_ASSIGN_OR_RETURN(double loss, model->Loss());
    if (mine) {
      const int64_t n = model->CountedTargets();
      sums[0] += loss * static_cast<double>(n);
      sums[1] += static_cast<double>(n);
    }
  }
  ZERO_RETURN_IF_ERROR(comm->AllReduceHost(sums, 2, ReduceOp::kSum).WithContext("summing the eval loss"));
  return std::make_pair(sums[1] > 0 ? sums[0] / sums[1] : 0.0, static_cast<int64_t>(sums[1]));
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
  ZERO_RETURN_IF_ERROR(ExportHf(o.export_hf, ToHfConfigJson(c), hf, dtype, [&](int index, float* out) {
    std::copy(full[index].begin(), full[index].end(), out);
    return OkStatus();
  }));
  if (!tokenizer_json.empty()) {
    // tokenizer_config.json tells transformers' AutoTokenizer which class and special token to use.
    std::ofstream(o.export_hf + "/tokenizer.json") << tokenizer_json;
    std::ofstream(o.export_hf + "/tokenizer_config.json")
        << "{\"tokenizer_class\": \"PreTrainedTokenizerFast\", \"eos_token\": \"" << kEndOfText
        << "\", \"pad_token\": \"" << kEndOfText << "\", \"model_max_length\": " << c.max_position_embeddings << "}\n";
  }
  std::printf("exported the model to %s (Hugging Face directory, %s)\n", o.export_hf.c_str(), c.torch_dtype.c_str());
  return OkStatus();
}

// printf into a string.
std::string Printf(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string Printf(const char* format, ...) {
  va_list args, copy;
  va_start(args, format);
  va_copy(copy, args);
  const int n = std::vsnprintf(nullptr, 0, format, copy);
  va_end(copy);
  std::string out(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, format, args);
  va_end(args);
  return out;
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
    ZERO_ASSIGN_OR_RETURN(mc_, ModelConfig(o_));
    auto config_or = ResolveLlmConfig(o_, world_size);
    if (!config_or.ok()) return config_or.status().WithContext("config");
    ZERO_ASSIGN_OR_RETURN(data_, LoadData(o_, mc_));
    return std::move(config_or).value();
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
  }

  Result<bool> RunWithoutTraining(train::Trainer& t) override {
    if (!o_.eval_only) return false;
    ZERO_ASSIGN_OR_RETURN(auto ev, Evaluate(data_, o_, 0, runner_, t.params(), t.comm()));
    if (t.lead()) std::printf("eval_loss=%.6f tokens=%lld\n", ev.first, static_cast<long long>(ev.second));
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
    if (o_.eval_windows > 0 && (!data_.eval.empty() || !data_.task_eval.empty())) {
      ZERO_ASSIGN_OR_RETURN(auto ev, Evaluate(data_, o_, o_.eval_windows, runner_, t.params(), t.comm()));
      if (lead) std::printf("eval_loss=%.6f tokens=%lld (held-out)\n", ev.first, static_cast<long long>(ev.second));
    }
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

  const LlmTrainOptions& o_;
  LlmConfig mc_;
  Data data_;
  std::vector<examples::ModelParamSpec> specs_;
  LlmRunner* runner_ = nullptr;  // owned by the Trainer
  int world_size_ = 1;
};

train::TrainerOptions TrainerOptionsFor(const LlmTrainOptions& o) {
  train::TrainerOptions t = train::TrainerOptionsFromFlags(o);
  t.default_timeout = std::chrono::seconds(300);
  t.print_every = o.print_every;
  t.tokens_per_row = o.seq;
  t.loss_average = train::LossAverage::kPerTarget;
  t.unmanaged_divides_by_gas = true;
  return t;
}

Status RunRank(const LlmTrainOptions& o, train::RankContext* where) {
  ZeroLlmJob job(o);
  return train::Trainer(TrainerOptionsFor(o), &job).Run(where);
}

// --- the launching process ---------------------------------------------------------------------------

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

int main(int argc, char** argv) { return zero::llm::Main(argc, argv); }
