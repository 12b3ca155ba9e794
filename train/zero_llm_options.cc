#include "train/zero_llm_options.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "train/cli_flags.h"

namespace zero::llm {
namespace {

const examples::FlagSet<LlmTrainOptions>& Flags() {
  using O = LlmTrainOptions;
  static const auto* flags = [] {
    auto* f = new examples::FlagSet<O>("zero_llm");
    f->String("preset", "NAME", &O::preset, "model shape to train from scratch (tiny, qwen3-0.6b, llama-3.2-1b, ...)")
        .String("model", "DIR", &O::model_dir, "start from a Hugging Face directory (config.json + safetensors)")
        .String("data", "FILE", &O::data, "token ids (.bin, little-endian uint32) or a text file")
        .Choice("task", &O::task, {"reverse-text"}, "the reverse-text SFT task on the corpus (loss on targets only)")
        .String("tokenizer", "FILE", &O::tokenizer, "tokenizer.json (default: the model's, else trained on the text)")
        .Int("tokenizer-vocab", "N", &O::tokenizer_vocab, 260, 1 << 20, "vocabulary of a trained tokenizer")
        .Int("corpus-bytes", "N", &O::corpus_bytes, 1 << 10, int64_t{1} << 34, "bytes of the built-in corpus")
        .Double("holdout", "F", &O::holdout, 0.0, 0.5, "share of the data held out for eval, in whole files")
        .Int("seq", "N", &O::seq, 1, 1 << 20, "tokens per row (<= max_position_embeddings)")
        .Int("batch", "N", &O::batch, 1, 1 << 16, "rows per rank per micro step (built-in config)")
        .Int("gas", "N", &O::gas, 1, 1 << 16, "gradient accumulation steps (built-in config)")
        .Int("stage", "N", &O::stage, 0, 3, "ZeRO stage (built-in config)")
        .Double("lr", "X", &O::lr, 0.0, 10.0, "peak learning rate (built-in config)")
        .String("config", "FILE", &O::config_path, "DeepSpeed-style JSON config instead of the built-in one")
        .Choice("device", &O::device, {"cpu", "cuda"}, "cpu (gloo) or cuda (one GPU per rank, NCCL)")
        .Int("nproc", "N", &O::nproc, 1, 4096, "ranks to start (default 2 on cpu, every GPU on cuda)")
        .Int("steps", "N", &O::steps, 0, 1 << 30, "optimizer steps")
        .Int("seed", "N", &O::seed, 0, INT64_MAX, "initial weights and data order")
        .Double("timeout", "S", &O::timeout_s, 0.0, 86400.0, "communicator timeout in seconds")
        .Switch("activation-checkpointing", &O::activation_checkpointing, "recompute each layer in backward (cuda)")
        .Choice("attention", &O::attention, {"auto", "kernel", "cudnn"},
                "cuda attention: cuDNN's fused kernels where they can (auto), the model's own, or cuDNN only")
        .Switch("sequential-data", &O::sequential_data, "training rows in file order (for outside comparisons)")
        .Switch("hash-weights", &O::hash_weights, "print a hash of the fp32 master weights after training")
        .Int("extra-heads", "N", &O::extra_heads, 0, 8, "untied output heads beside the model's own (not exported)")
        .Choice("heads", &O::heads, {"main", "alternate", "first-micro"},
                "which head each micro step uses: the model's own, one per window in turn, or extra head 1 in "
                "micro step 0")
        .Switch("eval-only", &O::eval_only,
                "print eval_loss over all of --data (the weights of --model, or of --resume DIR) and exit")
        .Int("eval-windows", "N", &O::eval_windows, 0, INT64_MAX,
             "held-out windows evaluated after training, and as many training ones")
        .String("export-hf", "DIR", &O::export_hf, "write the trained model as a Hugging Face directory")
        .String("save", "DIR", &O::save_dir, "checkpoint directory")
        .Int("save-every", "N", &O::save_every, 0, 1 << 30, "steps between checkpoints (0: at the end)")
        .String("resume", "DIR", &O::resume_dir, "resume from a checkpoint directory (any world size)")
        .String("log-json", "FILE", &O::log_json, "one JSON line per step")
        .String("plot", "FILE", &O::plot, "loss curve as SVG ('none': no plot)")
        .Int("print-every", "N", &O::print_every, 1, 1 << 30, "steps between progress lines")
        .Switch("print-config", &O::print_config, "print the resolved engine config and exit")
        .Switch("help", &O::help, "this text");
    return f;
  }();
  return *flags;
}

// The flag names in `args` as FlagSet::Parse reads them: "--name" or "--name=value", '_' as '-'.
// (A value that itself looks like a flag, "--prompt --stage", is counted too: harmless here.)
std::vector<std::string> GivenFlags(const std::vector<std::string>& args) {
  std::vector<std::string> given;
  for (const std::string& a : args) {
    if (a.rfind("--", 0) != 0 || a.size() == 2) continue;
    std::string name = a.substr(2, a.find('=') == std::string::npos ? std::string::npos : a.find('=') - 2);
    std::replace(name.begin(), name.end(), '_', '-');
    given.push_back(name);
  }
  return given;
}

// The shortest of %.15g and %.17g that reads back as `v`.
std::string Num(double v) {
  char b[40];
  std::snprintf(b, sizeof(b), "%.15g", v);
  if (std::strtod(b, nullptr) != v) std::snprintf(b, sizeof(b), "%.17g", v);
  return b;
}

// A flag given with --config that disagrees with the file's key.
Status FlagAgainstFile(const LlmTrainOptions& o, const std::string& flag, const std::string& flag_value,
                       const std::string& key, const std::string& file_value) {
  if (!o.Given(flag) || flag_value == file_value) return OkStatus();
  return InvalidArgumentError("--" + flag + " " + flag_value + " disagrees with --config " + o.config_path + ": " +
                              key + " is " + file_value + " there (the file's keys set the run; give the flag " +
                              "the file's value, or leave it out)");
}

}  // namespace

bool LlmTrainOptions::Given(const std::string& flag) const {
  return std::find(given.begin(), given.end(), flag) != given.end();
}

Result<LlmTrainOptions> ParseLlmTrainOptions(const std::vector<std::string>& args) {
  LlmTrainOptions o;
  std::vector<std::string> a;
  for (const std::string& s : args) a.push_back(s == "-h" ? "--help" : s);
  ZERO_RETURN_IF_ERROR(Flags().Parse(a, &o));
  o.given = GivenFlags(a);
  if (o.plot == "none") o.plot.clear();
  if (o.save_every > 0 && o.save_dir.empty()) {
    return InvalidArgumentError("--save-every " + std::to_string(o.save_every) + " needs --save DIR");
  }
  if (!o.task.empty() && !o.data.empty()) {
    return InvalidArgumentError("--task " + o.task + " and --data " + o.data + ": give one of them");
  }
  if (o.heads != "main" && o.extra_heads < 1) {
    return InvalidArgumentError("--heads " + o.heads + " needs --extra-heads 1 or more (it uses the extra heads)");
  }
  if (o.eval_only && o.data.empty() && o.task.empty() && o.model_dir.empty() && o.resume_dir.empty()) {
    return InvalidArgumentError(
        "--eval-only needs a trained model (--model DIR or --resume CHECKPOINT) or --data to evaluate");
  }
  // --eval-only trains nothing and writes nothing: a flag that writes would be ignored.
  if (o.eval_only && !o.save_dir.empty()) {
    return InvalidArgumentError("--eval-only and --save " + o.save_dir +
                                ": an evaluation changes no weight, so there is nothing new to save; drop --save");
  }
  if (o.eval_only && !o.export_hf.empty()) {
    return InvalidArgumentError("--eval-only and --export-hf " + o.export_hf +
                                ": --eval-only writes nothing; to export without training use --steps 0 --export-hf "
                                "DIR (with --resume CHECKPOINT to export a checkpoint)");
  }
  return o;
}

int HeadForMicroStep(const LlmTrainOptions& o, int64_t step, int64_t micro) {
  if (o.heads == "alternate") return static_cast<int>(step % (o.extra_heads + 1));
  if (o.heads == "first-micro") return micro == 0 ? 1 : 0;
  return 0;
}

std::string LlmUsageText() {
  std::ostringstream s;
  s << "zero_llm: trains a Llama/Qwen3 transformer with the zero engine (ZeRO stages 0-3).\n\n"
       "  zero_llm                                   # the tiny preset on the built-in corpus, 2 CPU ranks\n"
       "  zero_llm --device cuda --preset qwen3-0.6b --seq 2048 --batch 8\n"
       "  zero_llm --model HF_DIR --data tokens.bin --eval-only\n"
       "  zero_llm --model HF_DIR --task reverse-text --steps 10 --export-hf out/\n\n"
       "Flags:\n"
    << Flags().Help();
  return s.str();
}

std::string LlmBuiltinConfigJson(const LlmTrainOptions& o) {
  std::ostringstream j;
  j.precision(17);
  const int warmup = std::max(1, o.steps / 10);
  j << "{\n"
    << "  \"train_micro_batch_size_per_gpu\": " << o.batch << ",\n"
    << "  \"gradient_accumulation_steps\": " << o.gas << ",\n"
    << "  \"gradient_clipping\": 1.0,\n"
    << "  \"steps_per_print\": " << o.print_every << ",\n"
    << "  \"bf16\": {\"enabled\": " << (o.device == "cuda" ? "true" : "false") << "},\n"
    << "  \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": " << o.lr
    << ", \"betas\": [0.9, 0.95], \"eps\": 1e-8, \"weight_decay\": 0.1}},\n"
    << "  \"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\"total_num_steps\": " << std::max(o.steps, 1)
    << ", \"warmup_num_steps\": " << warmup << ", \"warmup_type\": \"linear\", \"cos_min_ratio\": 0.1}},\n"
    << "  \"zero_optimization\": {\"stage\": " << o.stage << "}\n"
    << "}\n";
  return j.str();
}

Result<Config> ResolveLlmConfig(const LlmTrainOptions& o, int world_size) {
  ParseOptions po;
  po.world_size = world_size;
  if (!o.config_path.empty()) {
    po.source = o.config_path;
    ZERO_ASSIGN_OR_RETURN(Config c, LoadConfigFile(o.config_path, po));
    ZERO_RETURN_IF_ERROR(
        FlagAgainstFile(o, "stage", std::to_string(o.stage), "zero_optimization.stage", std::to_string(c.zero.stage)));
    ZERO_RETURN_IF_ERROR(FlagAgainstFile(o, "batch", std::to_string(o.batch), "train_micro_batch_size_per_gpu",
                                         std::to_string(c.train_micro_batch_size_per_gpu)));
    ZERO_RETURN_IF_ERROR(FlagAgainstFile(o, "gas", std::to_string(o.gas), "gradient_accumulation_steps",
                                         std::to_string(c.gradient_accumulation_steps)));
    ZERO_RETURN_IF_ERROR(FlagAgainstFile(o, "lr", Num(o.lr), "optimizer.params.lr", Num(c.optimizer.lr)));
    ZERO_RETURN_IF_ERROR(FlagAgainstFile(o, "print-every", std::to_string(o.print_every), "steps_per_print",
                                         std::to_string(c.steps_per_print)));
    return c;
  }
  po.source = "zero_llm's built-in config";
  po.strict = true;
  return ParseConfig(LlmBuiltinConfigJson(o), po);
}

}  // namespace zero::llm

namespace zero::llm {

std::vector<std::pair<std::string, std::string>> LlmAgreedFlags(const LlmTrainOptions& o) {
  auto given = [](const std::string& path) { return std::string(path.empty() ? "not given" : "given"); };
  auto yes = [](bool b) { return std::string(b ? "on" : "off"); };
  return {
      {"--preset", o.preset},
      {"--model", given(o.model_dir)},
      {"--data", given(o.data)},
      {"--task", o.task},
      {"--tokenizer", given(o.tokenizer)},
      {"--tokenizer-vocab", std::to_string(o.tokenizer_vocab)},
      {"--corpus-bytes", std::to_string(o.corpus_bytes)},
      {"--holdout", Num(o.holdout)},
      {"--seq", std::to_string(o.seq)},
      {"--batch", std::to_string(o.batch)},
      {"--gas", std::to_string(o.gas)},
      {"--stage", std::to_string(o.stage)},
      {"--lr", Num(o.lr)},
      {"--config", given(o.config_path)},
      {"--device", o.device},
      {"--steps", std::to_string(o.steps)},
      {"--seed", std::to_string(o.seed)},
      {"--activation-checkpointing", yes(o.activation_checkpointing)},
      {"--attention", o.attention},
      {"--sequential-data", yes(o.sequential_data)},
      {"--hash-weights", yes(o.hash_weights)},
      {"--extra-heads", std::to_string(o.extra_heads)},
      {"--heads", o.heads},
      {"--eval-only", yes(o.eval_only)},
      {"--eval-windows", std::to_string(o.eval_windows)},
      {"--export-hf", given(o.export_hf)},
      {"--save", given(o.save_dir)},
      {"--save-every", std::to_string(o.save_every)},
      {"--resume", given(o.resume_dir)},
      {"--print-every", std::to_string(o.print_every)},
  };
}

const std::vector<std::string>& LlmPerRankFlags() {
  // --nproc is ignored under a launcher, --timeout is each rank's own wait, the outputs are rank 0's.
  static const auto* flags =
      new std::vector<std::string>{"nproc", "timeout", "log-json", "plot", "print-config", "help"};
  return *flags;
}

}  // namespace zero::llm
