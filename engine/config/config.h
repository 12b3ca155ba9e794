// Config: the DeepSpeed-style JSON that configures an Engine, parsed and validated.
//
// Every key is declared once in config_key_table.cc's table (JSON path, type, default, check, one-line
// doc); the same table drives parsing, defaults, validation and docs/config.md (written by
// //engine/config:config_doc). Errors name the key's full path ("zero_optimization.offload_optimizer.
// device"), the value seen and what was expected; malformed JSON reports line and column. Unknown
// keys are collected as warnings, or errors when `strict` is set; inside the five blocks DeepSpeed
// 0.19.8 validates with pydantic models that forbid extra keys (zero_optimization, its offload_optimizer
// and offload_param, bf16, fp16) an unknown key is an error, as DeepSpeed refuses to start on it
// (ParseOptions::unknown_keys_in_validated_blocks_are_errors). Every key DeepSpeed accepts there is
// known: read, mapped to another spelling, or ignored with a warning. The batch identity and Validate's
// rules between keys (param offload below stage 3, nvme without nvme_path, fp16 and bf16 both on,
// offload_grad_accumulation "gpu" without both offloads, a host_memory_budget without device "nvme",
// ...) run after the keys are read; Engine::Create runs Validate too. Parsing does not stop at the
// first problem: every bad value, unknown key that is an error, contradiction and missing batch size is
// listed in one error; only malformed JSON stops at once.
// Defaults are DeepSpeed 0.19.8's; docs/config.md lists where they differ. A Config is a plain
// value: copyable, no resources, safe to share read-only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/status.h"

namespace zero {

enum class OffloadDevice { kNone, kCpu, kNvme };
const char* OffloadDeviceName(OffloadDevice d);

struct OffloadOptimizerConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::string nvme_path;
  int64_t buffer_count = 4;
  bool pin_memory = true;
  bool pipeline_read = false;
  bool pipeline_write = false;
  bool fast_init = false;
  double ratio = 1.0;
  bool super_offload = false;  // DeepSpeed's SuperOffload: read, not built (Validate refuses true)
  // zero's own keys (not DeepSpeed's): see docs/config.md.
  int cpu_threads = 0;               // threads of the CPU AdamW; 0: std::thread::hardware_concurrency()
  bool pin_memory_fallback = false;  // a failed pin falls back to pageable memory with one warning
  int64_t host_memory_budget = 0;    // device "nvme": bytes of state per rank kept in pinned host memory
  // device "cpu": where AdamW runs. "cpu": the CPU AdamW on the host states; "gpu": the states are
  // streamed to the device in chunks of chunk_size elements through chunk_buffers staging sets
  // (zero/chunked_optimizer_states.h).
  std::string update_device = "cpu";
  int64_t chunk_size = int64_t{1} << 24;
  int64_t chunk_buffers = 3;
  // update_device "gpu": Step() queues the first chunks and returns; the rest are queued as the next
  // forward's GatherModule reaches their modules (docs/offload.md, "Overlap with the next forward").
  bool overlap_step = false;

  friend bool operator==(const OffloadOptimizerConfig&, const OffloadOptimizerConfig&) = default;
};

struct OffloadParamConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::string nvme_path;
  int64_t buffer_count = 5;
  int64_t buffer_size = 100000000;
  int64_t max_in_cpu = 1000000000;
  bool pin_memory = true;
  bool pin_memory_fallback = false;  // zero's own key: a failed pin falls back to pageable memory

  friend bool operator==(const OffloadParamConfig&, const OffloadParamConfig&) = default;
};

struct AioConfig {
  int64_t block_size = 1048576;
  int64_t queue_depth = 8;
  int64_t intra_op_parallelism = 1;  // older name: thread_count
  bool single_submit = false;
  bool overlap_events = true;
  bool use_gds = false;
  bool allow_buffered_fallback = false;  // zero's own key: no O_DIRECT on nvme_path's filesystem -> page cache

  friend bool operator==(const AioConfig&, const AioConfig&) = default;
};

struct ZeroConfig {
  int stage = 0;
  bool contiguous_gradients = true;
  bool reduce_scatter = true;
  int64_t reduce_bucket_size = 500000000;
  int64_t allgather_bucket_size = 500000000;
  bool overlap_comm = false;  // default depends on stage: true for stage 3 (set when not given)
  bool overlap_comm_set = false;
  int64_t sub_group_size = 1000000000;
  int64_t stage3_prefetch_bucket_size = 50000000;
  int64_t stage3_param_persistence_threshold = 100000;
  int64_t stage3_max_live_parameters = 1000000000;
  int64_t stage3_max_reuse_distance = 1000000000;
  bool stage3_gather_16bit_weights_on_model_save = false;
  bool round_robin_gradients = false;
  bool ignore_unused_parameters = true;
  std::string offload_grad_accumulation = "cpu";  // "cpu" | "gpu"
  // DeepSpeed features read and not built: Validate refuses anything but these (DeepSpeed's) defaults.
  bool legacy_stage1 = false;
  int64_t zero_hpz_partition_size = 1;  // 0 and 1: no secondary partition
  bool zero_quantized_weights = false;
  bool zero_quantized_nontrainable_weights = false;
  bool zero_quantized_gradients = false;
  bool zenflow = false;  // a "zenflow" block was given (not null)
  OffloadOptimizerConfig offload_optimizer;
  OffloadParamConfig offload_param;

  friend bool operator==(const ZeroConfig&, const ZeroConfig&) = default;
};

struct Fp16Config {
  bool enabled = false;
  double loss_scale = 0.0;  // 0 = dynamic
  int initial_scale_power = 16;
  int loss_scale_window = 1000;
  int hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1.0;
  bool fp16_master_weights_and_grads = false;  // read, not built (Validate refuses true)

  friend bool operator==(const Fp16Config&, const Fp16Config&) = default;
};

struct OptimizerConfig {
  std::string type = "AdamW";  // "Adam" | "AdamW" (case-insensitive on input, normalized)
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // DeepSpeed's FusedAdam default, for Adam and AdamW
  bool adam_w_mode = true;    // "Adam" with adam_w_mode false is classic Adam (L2)

  friend bool operator==(const OptimizerConfig&, const OptimizerConfig&) = default;
};

struct SchedulerConfig {
  std::string type;  // "" (constant lr), "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"
  double warmup_min_lr = 0.0;
  double warmup_max_lr = -1.0;  // -1: the optimizer's lr
  int64_t warmup_num_steps = 1000;
  std::string warmup_type = "log";  // "log" | "linear"
  int64_t total_num_steps = 0;      // WarmupDecayLR, WarmupCosineLR
  double warmup_min_ratio = 0.0;    // WarmupCosineLR
  double cos_min_ratio = 1e-4;      // WarmupCosineLR

  friend bool operator==(const SchedulerConfig&, const SchedulerConfig&) = default;
};

// zero_trace (docs/timeline.md): a Chrome trace of optimizer steps [first_step, last_step] of the run.
struct TraceConfig {
  bool enabled = false;
  std::string path = "zero_trace.json";  // rank r > 0 writes "<path>.rank<r>"
  int64_t first_step = 2;
  int64_t last_step = 4;

  friend bool operator==(const TraceConfig&, const TraceConfig&) = default;
};

struct Config {
  // Batch arithmetic (resolved: all three set and consistent with world_size after Parse).
  int64_t train_batch_size = 0;
  int64_t train_micro_batch_size_per_gpu = 0;
  int64_t gradient_accumulation_steps = 0;

  double gradient_clipping = 1.0;  // 0 = off
  int64_t steps_per_print = 10;
  bool wall_clock_breakdown = false;
  TraceConfig zero_trace;
  std::string gradient_allreduce_op = "mean";  // "mean" | "sum"
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  bool managed_gradient_accumulation = true;
  // A parameter no rank reported a gradient for in an accumulation window: false (DeepSpeed) steps it
  // with a zero gradient; true leaves its weights and optimizer moments unchanged.
  bool freeze_inactive_parameters = false;
  // A NaN or inf global gradient norm on a step that would be applied (fp16's overflow steps are
  // skipped instead) ends Step() with an error naming the step. false: DeepSpeed's behaviour (the
  // step is applied and training goes on).
  bool stop_on_nonfinite = true;
  bool has_communication_data_type = false;
  DType communication_data_type = DType::kF32;
  bool has_grad_accum_dtype = false;
  DType grad_accum_dtype = DType::kF32;

  Fp16Config fp16;
  bool bf16_enabled = false;
  bool bf16_master_weights_and_grads = false;  // read, not built (Validate refuses true)
  bool bf16_optimizer_states = false;          // read, not built (Validate refuses true)
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  ZeroConfig zero;
  AioConfig aio;

  std::vector<std::string> warnings;  // unknown keys, deprecated spellings mapped

  // The model dtype implied by fp16/bf16 (fp32 when neither is enabled).
  DType model_dtype() const;

  // Field-by-field, warnings included.
  friend bool operator==(const Config&, const Config&) = default;
};

struct ParseOptions {
  int world_size = 1;               // for the batch identity
  bool strict = false;              // unknown keys are errors rather than warnings
  std::string source = "<config>";  // file name used in messages
  // A top-level unknown key one edit (case aside) from a known one ("zero_optimisation", "FP16") is an
  // error even without `strict`: everything under it would be ignored and the job would train with
  // the defaults (stage 0). false makes it a warning like other unknown keys.
  bool top_level_typos_are_errors = true;
  // Likewise a nested unknown key one edit (case aside) from a block under the same parent
  // ("zero_optimization.offload_optimiser", "optimizer.param"): the block's settings would be ignored.
  // false makes it a warning. A nested key one edit from a scalar key ("zero_optimization.stge")
  // stays a warning (an error only with `strict`) unless the next option makes it an error.
  bool nested_block_typos_are_errors = true;
  // An unknown key directly inside zero_optimization, zero_optimization.offload_optimizer,
  // zero_optimization.offload_param, bf16 (or bfloat16) or fp16 is an error: DeepSpeed 0.19.8 validates
  // these blocks with pydantic models that forbid extra keys, so it refuses them too, and a typo there
  // ("offload_optimizer.devcie", "zero_optimization.stge") would otherwise train with the default.
  // false makes it a warning. Unknown keys elsewhere (top level, optimizer.params, scheduler, aio, ...)
  // are not affected.
  bool unknown_keys_in_validated_blocks_are_errors = true;
};

// Every rule a Config must satisfy, in one place: each key's own check (type, range, choices, as the
// key table declares it; the batch sizes each >= 1), the rules between keys, and what a DeepSpeed file
// may ask for that the engine does not build (partial optimizer offload, prescaled gradients, 16-bit
// accumulation, ZeRO++ quantization and hierarchical partitioning, ZenFlow, 16-bit master weights, ...). ParseConfig
// runs it on what it read (without the last group, so such a file still reads and round-trips through ConfigToJson);
// Engine::Create runs all of it, so a Config built in code meets the same rules, with the same messages, as one read
// from a file.
struct ValidateOptions {
  int world_size = 1;  // data-parallel ranks, for the rules that depend on them
  // Prefixed to every message as "<source>: "; empty (Engine::Create): no prefix.
  std::string source;
  // false: accept what is read but not built (ParseConfig); those problems are UNIMPLEMENTED.
  bool refuse_unbuilt = true;
};

// OK, or the problem (its own code: INVALID_ARGUMENT, or UNIMPLEMENTED for what is not built); several
// problems are one INVALID_ARGUMENT (unless all share another code) listing them as ParseConfig does:
// "<source>: N problems in the config:" and one line each. One problem is
// "<source>: <key path>: expected <what>, got <value>", the text ParseConfig gives for it.
Status Validate(const Config& config, const ValidateOptions& options = {});

// Parses and validates `json_text`: the batch sizes are derived for options.world_size (train_batch_size
// = train_micro_batch_size_per_gpu x gradient_accumulation_steps x world_size, DeepSpeed's arithmetic),
// then Validate runs without refuse_unbuilt. On failure the InvalidArgument error lists every problem: one
// problem is "<source>: <key path>: expected <what>, got <value>"; several are a first line
// "<source>: N problems in the config:" followed by one such line each (indented), then unknown keys
// that were only warnings as "note:" lines. Malformed JSON is one error with line and column.
Result<Config> ParseConfig(const std::string& json_text, const ParseOptions& options);
Result<Config> LoadConfigFile(const std::string& path, const ParseOptions& options);

// The config reference (markdown) generated from the key table.
std::string ConfigReferenceMarkdown();
// The resolved config as JSON (for checkpoints and logs).
std::string ConfigToJson(const Config& config);

// Levenshtein distance between `a` and `b`: the "did you mean" of an unknown config key (and of
// zero_train's unknown flags).
size_t EditDistance(const std::string& a, const std::string& b);

}  // namespace zero
