// zero_llm's command line: the flags, their defaults and checks, the built-in engine config, and the
// Config a run uses (built in, or --config FILE) for a world size.
//
// Owns only parsing and validation of user input, so every mistake is reported before any rank
// starts, naming the flag (or the config key path) and what was expected. Touches no device,
// communicator or file other than reading --config. Pure functions; thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/config/config.h"
#include "runtime/status.h"

namespace zero::llm {

struct LlmTrainOptions {
  // Model: a preset (from scratch) or a Hugging Face directory (config.json + safetensors).
  std::string preset = "tiny";
  std::string model_dir;
  // Data: --data FILE (.bin of little-endian uint32 token ids, or text tokenized with the
  // tokenizer), or --task reverse-text; neither: the built-in corpus (data/token_data.h).
  std::string data;
  std::string task;         // "" or "reverse-text"
  std::string tokenizer;    // tokenizer.json; "": the model directory's, else trained on the text
  int tokenizer_vocab = 0;  // vocabulary of a trained tokenizer; 0: min(model vocab, 4096)
  int64_t corpus_bytes = 4 << 20;
  // The share of the data held out for eval (training runs only), in whole files or pieces drawn
  // from the seed across the data (data/token_data.h, HeldOutDocuments; the tail with
  // --sequential-data).
  double holdout = 0.05;

  int seq = 128;
  int batch = 8;            // micro batch per rank (the built-in config's train_micro_batch_size_per_gpu)
  int gas = 1;              // gradient_accumulation_steps of the built-in config
  int stage = 3;            // zero_optimization.stage of the built-in config
  double lr = 3e-3;         // the built-in config's peak lr
  std::string config_path;  // a DeepSpeed-style JSON instead of the built-in config
  std::string device = "cpu";
  int nproc = 0;  // 0: 2 on cpu, every visible GPU on cuda
  int steps = 400;
  uint64_t seed = 1;
  double timeout_s = 0;
  bool activation_checkpointing = false;
  std::string attention = "auto";  // LlmAttention: auto, kernel or cudnn
  // Training rows in file order instead of sampled: step s, rank r, row i reads window
  // ((s * GAS + m) * world + r) * batch + i of the consecutive seq+1 windows (wrapping), so an outside
  // script (bench/, the Hugging Face comparison) can feed another trainer the same rows.
  bool sequential_data = false;
  // After training, print master_weights_hash=<16 hex digits> (SplitMix64 over the fp32 master bits of
  // every parameter in order): two runs that must agree bitwise compare one line.
  bool hash_weights = false;
  // Untied output heads beside the model's own (LlmConfig::extra_heads) and which head each micro
  // step's logits come from: "main" (the model's own, always), "alternate" (window s uses head
  // s mod (extra_heads + 1) in every micro step) or "first-micro" (micro step 0 of each window uses
  // extra head 1, the others the model's own). For the offload validations (docs/llm.md):
  // parameters that get gradients only in some micro steps or windows.
  int extra_heads = 0;
  std::string heads = "main";

  bool eval_only = false;
  // Windows of the held-out split evaluated after training, spread over it, and as many of the
  // training split (0: none). 512 windows of 128 tokens: a standard error of about 0.02 nats on the
  // default run, against 0.06 with 64.
  int64_t eval_windows = 512;
  std::string export_hf;  // write the trained model as an HF directory here
  std::string save_dir, resume_dir;
  int save_every = 0;
  std::string log_json;
  std::string plot = "zero_llm_loss.svg";
  int print_every = 10;
  bool print_config = false;
  bool help = false;

  // The flags given on the command line ("stage", "print-every", ...), whatever their values: a
  // flag given with --config must agree with the file (ResolveLlmConfig).
  std::vector<std::string> given;
  bool Given(const std::string& flag) const;
};

Result<LlmTrainOptions> ParseLlmTrainOptions(const std::vector<std::string>& args);
// The head (LlmBatch::head) of micro step `micro` of window `step` under o.heads.
int HeadForMicroStep(const LlmTrainOptions& o, int64_t step, int64_t micro);
std::string LlmUsageText();

// The built-in engine config: ZeRO `stage`, bf16 on cuda and fp32 on cpu, AdamW(lr, betas 0.9/0.95,
// wd 0.1), WarmupCosineLR over `steps` (warmup a tenth), clipping 1.0, micro batch and GAS from
// the flags.
std::string LlmBuiltinConfigJson(const LlmTrainOptions& o);

// --config FILE parsed for `world_size` (batch keys resolved against it) or the built-in one. With
// --config, a flag the built-in config takes (--stage, --batch, --gas, --lr, --print-every) given
// on the command line must agree with the file's key: otherwise an error naming the flag, the key
// path and both values (a flag cannot override the file, and the file silently overriding it was
// the bug).
Result<Config> ResolveLlmConfig(const LlmTrainOptions& o, int world_size);

// What every rank of a run must be started with alike (the Trainer compares them,
// train/trainer.h): ("--flag", value) for every flag but LlmPerRankFlags(); a path flag (--data,
// --model, --config, ...) as "given" or "not given", since what the path holds is compared instead
// (the tokens, the weights, the resolved config) and may live at different paths on different
// machines.
std::vector<std::pair<std::string, std::string>> LlmAgreedFlags(const LlmTrainOptions& o);
// The flags that may differ between ranks (without "--"): per machine or rank 0's only.
const std::vector<std::string>& LlmPerRankFlags();

}  // namespace zero::llm
