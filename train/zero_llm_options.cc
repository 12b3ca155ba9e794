#include "train/zero_llm_options.h"

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

}  // namespace

Result<LlmTrainOptions> ParseLlmTrainOptions(const std::vector<std::string>& args) {
  LlmTrainOptions o;
  std::vector<std::string> a;
  for (const std::string& s : args) a.push_back(s == "-h" ? "--help" : s);
  ZERO_RETURN_IF_ERROR(Flags().Parse(a, &o));
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
    return LoadConfigFile(o.config_path, po);
  }
  po.source = "zero_llm's built-in config";
  po.strict = true;
  return ParseConfig(LlmBuiltinConfigJson(o), po);
}

}  // namespace zero::llm
