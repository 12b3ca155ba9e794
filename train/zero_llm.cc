// zero_llm: trains a Llama/Qwen3 transformer (models/llama) with the zero Engine: from a preset
// (from scratch) or a Hugging Face directory, on token ids, text or the reverse-text task, at ZeRO
// stages 0-3 over several data-parallel ranks, on the CPU (gloo) or one GPU per rank (NCCL).
// Prints loss, lr, grad norm, tokens/s, model TFLOPS and MFU (cuda) and memory per rank, writes a
// JSON line per step and the loss curve, evaluates held-out text, saves/resumes checkpoints (any
// world size) and exports the model as a Hugging Face directory. docs/llm.md is the manual.
//
// Process model (as zero_train): without RANK in the environment this process checks the flags and
// config, then starts --nproc ranks of itself (tools/launcher.h); with it, it is one rank.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "comm/rendezvous.h"
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
#include "train/loss_plot.h"
#include "train/zero_llm_options.h"
#include "train/zero_train_report.h"

#if defined(ZERO_EXAMPLES_HAS_CUDA)
#include <cuda_runtime_api.h>

#include "models/llama/cuda_model.h"
#include "runtime/cuda_device.h"
#endif

namespace zero::llm {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The H200's dense bf16 peak (the MFU denominator).
constexpr double kPeakTflopsPerGpu = 989.0;

// --- the model on the rank's device --------------------------------------------------------------

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  // Forward of `batch`. With `need_loss` false the loss may come from Backward (Loss() after it);
  // with true Loss() is the forward's own (evaluation, no backward).
  virtual Status Forward(examples::ParamProvider& params, const LlmBatch& batch, bool need_loss) = 0;
  virtual Status Backward(examples::ParamProvider& params, float loss_scale, examples::GradSink& grads) = 0;
  virtual Result<double> Loss() = 0;
  virtual int64_t CountedTargets() = 0;
};

class CpuRunner final : public ModelRunner {
 public:
  explicit CpuRunner(const LlmConfig& c) : model_(c) {}
  Status Forward(examples::ParamProvider& params, const LlmBatch& batch, bool need_loss) override {
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
class CudaRunner final : public ModelRunner {
 public:
  static Result<std::unique_ptr<ModelRunner>> Create(const LlmConfig& c, Device* device, bool checkpointing,
                                                     const std::string& attention) {
    CudaDevice* cuda = device->AsCuda();
    if (cuda == nullptr) return InternalError("--device cuda: the rank's device is not a CudaDevice");
    if (cudaSetDevice(cuda->ordinal()) != cudaSuccess) return InternalError("cudaSetDevice failed");
    auto r = std::unique_ptr<CudaRunner>(new CudaRunner());
    LlmCudaOptions opts;
    opts.activation_checkpointing = checkpointing;
    opts.attention = attention == "cudnn"    ? LlmAttention::kCudnn
                     : attention == "kernel" ? LlmAttention::kKernel
                                             : LlmAttention::kAuto;
    ZERO_ASSIGN_OR_RETURN(r->model_, LlmCuda::Create(c, device, /*stream=*/nullptr, opts));
    return std::unique_ptr<ModelRunner>(std::move(r));
  }
  // In training the loss is read after backward (Loss), so forward and backward queue without a
  // host wait; evaluation asks the forward for it.
  Status Forward(examples::ParamProvider& params, const LlmBatch& batch, bool need_loss) override {
    return model_->Forward(params, batch, &acts_, need_loss).status();
  }
  Status Backward(examples::ParamProvider& params, float loss_scale, examples::GradSink& grads) override {
    return model_->Backward(params, &acts_, loss_scale, grads);
  }
  Result<double> Loss() override { return model_->ReadLoss(acts_); }
  int64_t CountedTargets() override { return acts_.counted_targets(); }

 private:
  CudaRunner() = default;
  std::unique_ptr<LlmCuda> model_;
  LlmCudaActivations acts_;
};
#endif

Result<std::unique_ptr<ModelRunner>> CreateRunner(const LlmTrainOptions& o, const LlmConfig& c, Device* device) {
  if (o.device == "cpu") return std::unique_ptr<ModelRunner>(new CpuRunner(c));
#if defined(ZERO_EXAMPLES_HAS_CUDA)
  return CudaRunner::Create(c, device, o.activation_checkpointing, o.attention);
#else
  return UnimplementedError("--device cuda: this zero_llm was built without the CUDA toolkit");
#endif
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

// --- evaluation (collective: the engine gathers at stage 3) --------------------------------------------

// Mean nats per counted target over the eval windows (each rank takes every world-th window; a
// rank without a window in the last round runs window 0 and counts nothing), and the count.
Result<std::pair<double, int64_t>> Evaluate(const Data& d, const LlmTrainOptions& o, int64_t max_windows,
                                            ModelRunner* model, examples::ParamProvider& params, Communicator* comm) {
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
    ZERO_RETURN_IF_ERROR(model->Forward(params, windows[mine ? i : 0], /*need_loss=*/true)
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

// --- one rank ----------------------------------------------------------------------------------------

double HostPeakBytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) * 1024.0;
}

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

struct RankContext {
  int rank = 0;
  int world = 1;
};

Status RunRank(const LlmTrainOptions& o, RankContext* ctx) {
  const Clock::time_point t_start = Clock::now();
  ZERO_ASSIGN_OR_RETURN(RendezvousOptions ro, RendezvousFromEnv());
  ctx->rank = ro.rank;
  ctx->world = ro.world_size;
  if (o.timeout_s > 0) {
    ro.comm.timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  } else if (std::getenv("ZERO_COMM_TIMEOUT_MS") == nullptr) {
    ro.comm.timeout = std::chrono::seconds(300);
  }
  const bool lead = ro.rank == 0;
  ZERO_ASSIGN_OR_RETURN(const LlmConfig mc, ModelConfig(o));
  auto config_or = ResolveLlmConfig(o, ro.world_size);
  if (!config_or.ok()) return config_or.status().WithContext("config");
  const Config config = std::move(config_or).value();
  ZERO_ASSIGN_OR_RETURN(const Data data, LoadData(o, mc));

  const int ordinal = o.device == "cuda" && VisibleGpus() == 1 ? 0 : ro.local_rank;
  const std::string device_name = o.device == "cpu" ? "cpu" : "cuda:" + std::to_string(ordinal);
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Device> device, CreateDevice(device_name));
  auto comm_or = CreateCommunicator(o.device == "cpu" ? "gloo" : "nccl", device.get(), ro);
  if (!comm_or.ok()) return comm_or.status().WithContext("rendezvous of " + std::to_string(ro.world_size) + " ranks");
  std::unique_ptr<Communicator> comm = std::move(comm_or).value();

  EngineEnv env;
  env.log_sink = [](const std::string& line) { std::printf("engine %s\n", line.c_str()); };
  auto engine_or = Engine::Create(config, device.get(), comm.get(), env);
  if (!engine_or.ok()) return engine_or.status().WithContext("creating the engine");
  std::unique_ptr<Engine> engine = std::move(engine_or).value();
  const std::vector<examples::ModelParamSpec> specs = LlmParamSpecs(mc);
  ZERO_RETURN_IF_ERROR(InitializeWeights(engine.get(), o, mc, specs).WithContext("initial weights"));
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> model, CreateRunner(o, mc, device.get()));
  examples::EngineParams params(engine.get(), specs);
  examples::EngineGrads grads(engine.get());

  if (lead) {
    std::printf(
        "zero_llm: %s\n  data: %s\n  ZeRO stage %d, %s, %d rank(s) on %s, seq %d, micro batch %lld, GAS %lld: %lld "
        "tokens per step\n",
        mc.ToString().c_str(), data.source.c_str(), config.zero.stage, DTypeName(config.model_dtype()), ro.world_size,
        o.device.c_str(), o.seq, static_cast<long long>(config.train_micro_batch_size_per_gpu),
        static_cast<long long>(config.gradient_accumulation_steps),
        static_cast<long long>(config.train_batch_size * o.seq));
    if (o.extra_heads > 0) std::printf("  %d extra head(s), schedule %s\n", o.extra_heads, o.heads.c_str());
    if (!config.managed_gradient_accumulation) std::printf("  unmanaged gradient accumulation\n");
    for (const std::string& w : config.warnings) std::printf("warning: %s\n", w.c_str());
  }

  if (o.eval_only) {
    ZERO_ASSIGN_OR_RETURN(auto ev, Evaluate(data, o, 0, model.get(), params, comm.get()));
    if (lead) std::printf("eval_loss=%.6f tokens=%lld\n", ev.first, static_cast<long long>(ev.second));
    return comm->Barrier().WithContext("final barrier");
  }

  int64_t start_step = 0;
  if (!o.resume_dir.empty()) {
    ZERO_RETURN_IF_ERROR(engine->LoadCheckpoint(o.resume_dir).status().WithContext("--resume " + o.resume_dir));
    start_step = engine->counters().global_steps;
    if (lead) std::printf("  resumed from %s at step %lld\n", o.resume_dir.c_str(), static_cast<long long>(start_step));
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

  const int micro = static_cast<int>(config.train_micro_batch_size_per_gpu);
  const int64_t gas = config.gradient_accumulation_steps;
  // Unmanaged accumulation (managed_gradient_accumulation false): every Step() is a boundary and the
  // user divides by the micro steps; loss_scale / GAS is the factor the managed engine applies.
  const bool managed = config.managed_gradient_accumulation;
  const double flops_per_token = mc.TrainFlopsPerToken(o.seq);
  std::vector<double> plot_steps, plot_losses;
  double window_loss = 0, window_seconds = 0, window_tokens = 0;
  int window_steps = 0;
  const Clock::time_point t_train = Clock::now();
  if (lead) std::printf("  set-up %.2f s; training\n", Since(t_start));
  for (int64_t step = start_step; step < o.steps; ++step) {
    const Clock::time_point t0 = Clock::now();
    double sums[2] = {0, 0};  // loss * targets, targets
    for (int64_t m = 0; m < gas; ++m) {
      LlmBatch batch = TrainRows(data, o, micro, step * gas + m, ro.rank, ro.world_size);
      batch.head = HeadForMicroStep(o, step, m);
      const std::string where = "step " + std::to_string(step + 1) + " micro step " + std::to_string(m);
      ZERO_RETURN_IF_ERROR(model->Forward(params, batch, /*need_loss=*/false).WithContext(where + " forward"));
      const float scale = managed ? engine->gradient_scale() : engine->loss_scale() / static_cast<float>(gas);
      ZERO_RETURN_IF_ERROR(model->Backward(params, scale, grads).WithContext(where + " backward"));
      ZERO_RETURN_IF_ERROR(engine->Backward().WithContext(where));
      ZERO_ASSIGN_OR_RETURN(double loss, model->Loss());
      const int64_t n = model->CountedTargets();
      sums[0] += loss * static_cast<double>(n);
      sums[1] += static_cast<double>(n);
    }
    const double lr = engine->lr();
    ZERO_RETURN_IF_ERROR(engine->Step().WithContext("step " + std::to_string(step + 1)));
    ZERO_RETURN_IF_ERROR(comm->AllReduceHost(sums, 2, ReduceOp::kSum).WithContext("averaging the loss"));
    const double mean_loss = sums[1] > 0 ? sums[0] / sums[1] : 0.0;
    if (!std::isfinite(mean_loss) || !std::isfinite(engine->global_grad_norm())) {
      return InternalError("step " + std::to_string(step + 1) + ": the loss (" + std::to_string(mean_loss) +
                           ") or the gradient norm (" + std::to_string(engine->global_grad_norm()) +
                           ") is not finite; lower the learning rate (--lr) or check the data");
    }
    const double seconds = Since(t0);
    const double tokens = static_cast<double>(config.train_batch_size) * o.seq;
    plot_steps.push_back(static_cast<double>(step + 1));
    plot_losses.push_back(mean_loss);
    window_loss += mean_loss;
    window_seconds += seconds;
    window_tokens += tokens;
    ++window_steps;
    if (log_json != nullptr) {
      std::fprintf(log_json,
                   "{\"step\":%lld,\"loss\":%.6f,\"lr\":%.6g,\"grad_norm\":%.6g,\"step_s\":%.6f,\"tokens\":%.0f,"
                   "\"tokens_per_s\":%.1f,\"model_tflops\":%.3f}\n",
                   static_cast<long long>(step + 1), mean_loss, lr, engine->global_grad_norm(), seconds, tokens,
                   tokens / seconds, tokens * flops_per_token / seconds / 1e12);
      std::fflush(log_json);
    }
    const bool last = step + 1 == o.steps;
    if ((step + 1) % o.print_every == 0 || last) {
      const EngineMemory mem = engine->memory();
      double peaks[2] = {static_cast<double>(mem.device_peak), HostPeakBytes()};
      ZERO_RETURN_IF_ERROR(comm->AllReduceHost(peaks, 2, ReduceOp::kMax).WithContext("gathering memory use"));
      if (lead) {
        const double tps = window_tokens / window_seconds;
        const double tflops = tps * flops_per_token / 1e12;
        std::string mfu;
        if (o.device == "cuda") {
          char b[64];
          std::snprintf(b, sizeof(b), ", MFU %.1f%%", 100.0 * tflops / (kPeakTflopsPerGpu * ro.world_size));
          mfu = b;
        }
        std::printf(
            "step %lld/%d  loss %.4f  lr %.3g  grad norm %.3g  %s tok/s  %.2f model TFLOPS%s  peak %s device, %s host "
            "per rank\n",
            static_cast<long long>(step + 1), o.steps, window_loss / window_steps, lr, engine->global_grad_norm(),
            examples::FormatCount(tps).c_str(), tflops, mfu.c_str(), examples::FormatBytes(peaks[0]).c_str(),
            examples::FormatBytes(peaks[1]).c_str());
        std::fflush(stdout);
      }
      window_loss = window_seconds = window_tokens = 0;
      window_steps = 0;
    }
    if (!o.save_dir.empty() && ((o.save_every > 0 && (step + 1) % o.save_every == 0) || last)) {
      ZERO_RETURN_IF_ERROR(engine->SaveCheckpoint(o.save_dir).WithContext("--save " + o.save_dir));
    }
  }
  if (lead && o.steps > start_step) {
    std::printf("done: %lld steps in %.1f s\n", static_cast<long long>(o.steps - start_step), Since(t_train));
  }
  if (lead && !o.plot.empty() && !plot_losses.empty()) {
    LossPlotOptions po;
    po.title = "zero_llm: " + mc.ToString() + ", ZeRO stage " + std::to_string(config.zero.stage);
    po.smooth_window = static_cast<int>(std::clamp<int64_t>(o.steps / 30, 1, 50));
    ZERO_RETURN_IF_ERROR(WriteLossSvg(o.plot, plot_steps, plot_losses, po).WithContext("--plot"));
    std::printf("loss curve: %s\n", o.plot.c_str());
  }
  if (o.eval_windows > 0 && (!data.eval.empty() || !data.task_eval.empty())) {
    ZERO_ASSIGN_OR_RETURN(auto ev, Evaluate(data, o, o.eval_windows, model.get(), params, comm.get()));
    if (lead) std::printf("eval_loss=%.6f tokens=%lld (held-out)\n", ev.first, static_cast<long long>(ev.second));
  }
  if (!o.export_hf.empty()) {
    ZERO_RETURN_IF_ERROR(Export(engine.get(), o, mc, specs, data.tokenizer_json, lead).WithContext("--export-hf"));
  }
  if (o.hash_weights) {
    uint64_t h = 0;
    std::vector<float> v;
    for (size_t i = 0; i < specs.size(); ++i) {
      v.resize(static_cast<size_t>(specs[i].numel()));
      ZERO_RETURN_IF_ERROR(engine->GatherMasterWeights(static_cast<int>(i), v.data()));
      for (float x : v) {
        uint32_t bits;
        std::memcpy(&bits, &x, 4);
        h = SplitMix64(h ^ bits);
      }
    }
    if (lead) std::printf("master_weights_hash=%016llx\n", static_cast<unsigned long long>(h));
  }
  return comm->Barrier().WithContext("final barrier");
}

// --- the launching process ---------------------------------------------------------------------------

int Launch(const LlmTrainOptions& o, int argc, char** argv) {
  int nproc = o.nproc;
  if (o.device == "cuda") {
    const int gpus = VisibleGpus();
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
  if (nproc == 1) {
    RankContext ctx;
    Status st = RunRank(o, &ctx);
    if (!st.ok()) {
      std::fprintf(stderr, "zero_llm: %s\n", st.ToString().c_str());
      return 1;
    }
    return 0;
  }
  LaunchOptions lo;
  lo.nproc = nproc;
  Status st = LaunchSelf(argc, argv, lo);
  if (!st.ok()) {
    std::fprintf(stderr, "zero_llm: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
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
  if (const char* wd = std::getenv("BUILD_WORKING_DIRECTORY"); wd != nullptr && *wd != '\0') {
    for (std::string* p : {&o.data, &o.model_dir, &o.tokenizer, &o.config_path, &o.export_hf, &o.save_dir,
                           &o.resume_dir, &o.log_json, &o.plot}) {
      if (!p->empty() && (*p)[0] != '/') *p = std::string(wd) + "/" + *p;
    }
  }
  if (!UnderLauncher()) return Launch(o, argc, argv);
  RankContext ctx;
  Status st = RunRank(o, &ctx);
  if (!st.ok()) {
    std::fprintf(stderr, "zero_llm: rank %d of %d: %s\n", ctx.rank, ctx.world, st.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace zero::llm

int main(int argc, char** argv) { return zero::llm::Main(argc, argv); }
