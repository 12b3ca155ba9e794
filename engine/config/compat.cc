// The config's DeepSpeed compatibility tables (config_compat.h) and DeepSpeedDifferences (config_keys.h).
#include "engine/config/compat.h"

#include <vector>

#include "engine/config/keys.h"

namespace zero {
namespace config_internal {
namespace {

// Other spellings of keys and blocks. Each maps to its canonical path with a warning.
const Alias kAliases[] = {
    {"bfloat16", "bf16", "the older name of the 'bf16' block"},
    {"aio.thread_count", "aio.intra_op_parallelism", "the older name of 'aio.intra_op_parallelism'"},
    {"zero_optimization.stage3_gather_fp16_weights_on_model_save",
     "zero_optimization.stage3_gather_16bit_weights_on_model_save",
     "deprecated; use 'zero_optimization.stage3_gather_16bit_weights_on_model_save'"},
    // DeepSpeed's field names of the keys its JSON spells with "stage3_" (their pydantic aliases).
    {"zero_optimization.prefetch_bucket_size", "zero_optimization.stage3_prefetch_bucket_size",
     "DeepSpeed's field name of 'zero_optimization.stage3_prefetch_bucket_size'"},
    {"zero_optimization.param_persistence_threshold", "zero_optimization.stage3_param_persistence_threshold",
     "DeepSpeed's field name of 'zero_optimization.stage3_param_persistence_threshold'"},
    {"zero_optimization.max_live_parameters", "zero_optimization.stage3_max_live_parameters",
     "DeepSpeed's field name of 'zero_optimization.stage3_max_live_parameters'"},
    {"zero_optimization.max_reuse_distance", "zero_optimization.stage3_max_reuse_distance",
     "DeepSpeed's field name of 'zero_optimization.stage3_max_reuse_distance'"},
    {"zero_optimization.gather_16bit_weights_on_model_save",
     "zero_optimization.stage3_gather_16bit_weights_on_model_save",
     "DeepSpeed's field name of 'zero_optimization.stage3_gather_16bit_weights_on_model_save'"},
};

// Deprecated booleans that map onto the offload blocks (handled in ApplyDeprecatedOffload).
const Deprecated kDeprecated[] = {
    {"zero_optimization.cpu_offload", "true: zero_optimization.offload_optimizer.device = \"cpu\""},
    {"zero_optimization.cpu_offload_param", "true: zero_optimization.offload_param.device = \"cpu\""},
    {"zero_optimization.cpu_offload_use_pin_memory",
     "sets pin_memory of the offload blocks turned on by cpu_offload / cpu_offload_param"},
};

// DeepSpeed keys and blocks zero knows and does not act on: a warning, never an error.
const Ignored kIgnored[] = {
    {"zero_allow_untested_optimizer", "zero runs only its own Adam/AdamW"},
    {"fp16.auto_cast", "zero does not cast the user's forward"},
    {"zero_optimization.allgather_partitions", "zero always all-gathers updated partitions"},
    {"zero_optimization.load_from_fp32_weights", "zero restores the FP32 master weights of its checkpoints"},
    // The rest of DeepSpeed 0.19.8's zero_optimization, offload_optimizer and bf16 keys that change speed,
    // memory or logging, not what is trained (those that would are keys, refused unless at their default).
    {"zero_optimization.use_multi_rank_bucket_allreduce",
     "a DeepSpeed communication pattern; zero reduces each bucket with one collective (same result)"},
    {"zero_optimization.compute_grad_norm",
     "zero always computes the global gradient norm (gradient_clipping and stop_on_nonfinite read it); the "
     "update is the same"},
    {"zero_optimization.elastic_checkpoint",
     "DeepSpeed's legacy checkpoint layout; zero's checkpoints load at another data-parallel size anyway"},
    {"zero_optimization.model_persistence_threshold",
     "a DeepSpeed stage-3 memory bound on persistent parameters; zero has none (memory, not results)"},
    {"zero_optimization.stage3_model_persistence_threshold",
     "a DeepSpeed stage-3 memory bound on persistent parameters; zero has none (memory, not results)"},
    {"zero_optimization.module_granularity_threshold",
     "DeepSpeed's stage-3 fetch granularity; zero gathers by the modules the model declares (speed, not results)"},
    {"zero_optimization.stage3_module_granularity_threshold",
     "DeepSpeed's stage-3 fetch granularity; zero gathers by the modules the model declares (speed, not results)"},
    {"zero_optimization.use_all_reduce_for_fetch_params",
     "zero gathers stage-3 parameters with all-gather (the collective changes speed, not results)"},
    {"zero_optimization.stage3_use_all_reduce_for_fetch_params",
     "zero gathers stage-3 parameters with all-gather (the collective changes speed, not results)"},
    {"zero_optimization.allgather_sequential",
     "zero coalesces the parameters of each stage-3 gather into one all-gather (speed and memory, not "
     "results)"},
    {"zero_optimization.stage3_allgather_sequential",
     "zero coalesces the parameters of each stage-3 gather into one all-gather (speed and memory, not "
     "results)"},
    {"zero_optimization.parameter_alignment",
     "padding of DeepSpeed's stage 1/2 flat buffers; zero lays out its own (memory, not results)"},
    {"zero_optimization.memory_efficient_linear",
     "DeepSpeed replaces torch's linear layers at stage 3; zero does not touch the model's layers"},
    {"zero_optimization.pipeline_loading_checkpoint", "zero has no pipeline parallelism"},
    {"zero_optimization.override_module_apply", "zero does not wrap torch's nn.Module.apply"},
    {"zero_optimization.log_trace_cache_warnings", "logging only (warnings of DeepSpeed's stage-3 trace cache)"},
    {"zero_optimization.enable_sanity_checks", "DeepSpeed's internal debug checks"},
    {"zero_optimization.save_muon_momentum_buffer_in_memory",
     "only for DeepSpeed's Muon optimizer; zero runs only Adam/AdamW"},
    {"zero_optimization.leaf_module",
     "DeepSpeed's stage-3 hook placement; zero gathers by the modules the model declares (speed, not results)"},
    {"zero_optimization.offload_optimizer.cpuadam_cores_perc",
     "SuperOffload's CPU share; zero sizes its CPU AdamW by offload_optimizer.cpu_threads"},
    {"bf16.immediate_grad_update",
     "when DeepSpeed's BF16_Optimizer adds a micro step's gradient to its fp32 buffer; zero accumulates in fp32 "
     "either way"},
    {"bf16.check_grad_overflow",
     "zero never skips a bf16 step: a NaN or inf gradient norm stops the job (stop_on_nonfinite, default true) "
     "or is applied (false); DeepSpeed 0.19.8 skips such a step at stages 1/2 while this key is true (and always "
     "at stages 0 and 3 and in BF16_Optimizer, stage 1 with fp32 gradient accumulation)"},
    {"activation_checkpointing", "activation checkpointing belongs to the user's model"},
    {"flops_profiler", "zero has no flops profiler"},
    {"tensorboard", "zero has no monitor backends"},
    {"wandb", "zero has no monitor backends"},
    {"csv_monitor", "zero has no monitor backends"},
    {"comms_logger", "zero has no communication logger"},
};

// runtime/zero/config.py DeepSpeedZeroConfig, runtime/zero/offload_config.py, runtime/precision_config.py:
// DeepSpeedConfigModel's extra="forbid" (runtime/config_utils.py).
const char* const kValidatedBlocks[] = {
    "zero_optimization", "zero_optimization.offload_optimizer", "zero_optimization.offload_param", "bf16", "fp16",
};

}  // namespace

std::span<const Alias> Aliases() { return kAliases; }
std::span<const char* const> ValidatedBlocks() { return kValidatedBlocks; }

bool IsValidatedBlock(const std::string& path) {
  for (const char* b : kValidatedBlocks) {
    if (path == b) return true;
  }
  return false;
}
std::span<const Deprecated> DeprecatedKeys() { return kDeprecated; }
std::span<const Ignored> IgnoredKeys() { return kIgnored; }

const Alias* FindAlias(const std::string& path) {
  for (const Alias& a : kAliases) {
    if (path == a.path) return &a;
  }
  return nullptr;
}

}  // namespace config_internal

// Where zero's defaults or readings are not DeepSpeed 0.19.8's (checked against its sources:
// runtime/constants.py, runtime/zero/config.py, runtime/zero/offload_config.py, precision_config.py,
// swap_tensor/aio config, lr_schedules.py, ops/adam/fused_adam.py). config_test asserts every key's
// default against DeepSpeed's and that each difference in a default is listed here.
const std::vector<ConfigDifference>& DeepSpeedDifferences() {
  static const std::vector<ConfigDifference>* d = new std::vector<ConfigDifference>{
      {"steps_per_print", "`null` (no periodic progress line)", "`10`",
       "The engine prints only the wall_clock_breakdown line itself, every steps_per_print steps; the key also "
       "sets how often train/zero_train prints progress, and an integer keeps it simple. `null` is refused."},
      {"zero_trace.enabled", "no such key (DeepSpeed's timeline is the PyTorch profiler's)", "`false`",
       "zero's own key: the engine writes a Chrome trace of the chosen steps (docs/timeline.md)."},
      {"zero_trace.path", "no such key", "`\"zero_trace.json\"`", "zero's own key: where zero_trace writes."},
      {"zero_trace.first_step", "no such key", "`2`", "zero's own key: the first traced step (the first warms up)."},
      {"zero_trace.last_step", "no such key", "`4`", "zero's own key: the last traced step."},
      {"optimizer.type", "none: without an optimizer block the client passes its own optimizer", "`\"AdamW\"`",
       "zero runs only its own Adam/AdamW, so a config without an optimizer block gets AdamW with FusedAdam's "
       "defaults (lr 0.001, betas [0.9, 0.999], eps 1e-8, weight_decay 0)."},
      {"data_types.grad_accum_dtype",
       "`null`: at ZeRO stages 1-3 micro-step gradients accumulate in the model dtype (bf16/fp16)",
       "`null`: they accumulate in fp32",
       "More precise at gradient_accumulation_steps > 1 (measured: DeepSpeed's 16-bit accumulation moves "
       "weights by 2e-3 (bf16) and 3e-4 (fp16) relative to fp32 accumulation)."},
      {"zero_optimization.cpu_offload_use_pin_memory", "read and ignored (the deprecated key sets nothing)",
       "sets pin_memory of the blocks that cpu_offload / cpu_offload_param turn on",
       "The file asks for it; a warning names the new spelling either way."},
      {"stop_on_nonfinite",
       "no such key: a step with a NaN or inf gradient is skipped and training goes on with fp16; with bf16 "
       "(stage 0, stage 3 and BF16_Optimizer always; stages 1/2 while `bf16.check_grad_overflow` is true, its "
       "default); and with fp32 at stages 1-3 (stages 1/2 while `zero_optimization.compute_grad_norm` is true, "
       "its default). It is applied only with fp32 at stage 0, or with one of those two keys false",
       "`true`",
       "zero's own key. zero skips only fp16 overflow steps (as DeepSpeed); with bf16 or fp32 a NaN or inf "
       "global gradient norm on a step that would be applied stops the job with an error naming the step "
       "(before the update when clipping or fp16 reads the norm first; otherwise after it, and the error says "
       "the weights hold it), and false applies the step and trains on. Neither setting skips the step as "
       "DeepSpeed does with bf16 (and fp32 at stages 1-3)."},
      {"zero_optimization.offload_grad_accumulation", "no such key (host accumulation)", "`\"cpu\"`",
       "zero's own key; its default is DeepSpeed's behaviour."},
      {"freeze_inactive_parameters", "no such key (inactive parameters are stepped with a zero gradient)", "`false`",
       "zero's own key; its default is DeepSpeed's behaviour."},
      {"zero_optimization.offload_optimizer.cpu_threads",
       "no such key (DeepSpeedCPUAdam runs on torch's OpenMP threads, OMP_NUM_THREADS)", "`0` (the hardware threads)",
       "zero's own key: the CPU AdamW runs on a thread pool of the engine's, sized here."},
      {"zero_optimization.offload_optimizer.pin_memory_fallback", "no such key (a failed pin is an error)", "`false`",
       "zero's own key; its default is DeepSpeed's behaviour (a failed pin is an error naming the size and the "
       "settings to change)."},
      {"zero_optimization.offload_param.pin_memory_fallback", "no such key (a failed pin is an error)", "`false`",
       "zero's own key for the parameter block; its default is DeepSpeed's behaviour."},
      {"zero_optimization.offload_optimizer.host_memory_budget",
       "no such key (all of a state on one device: host memory or NVMe)", "`0` (all states on NVMe)",
       "zero's own key (tiered state): with device \"nvme\", as much state as the budget allows stays in pinned "
       "host memory and the rest goes to disk; 0 is DeepSpeed's behaviour."},
      {"zero_optimization.offload_optimizer.update_device", "no such key (the CPU AdamW)", "`\"cpu\"`",
       "zero's own key; its default is DeepSpeed's behaviour. \"gpu\" streams the offloaded states through the "
       "GPU in chunks and runs AdamW there."},
      {"zero_optimization.offload_optimizer.chunk_size", "no such key", "`16777216` (elements)",
       "zero's own key (update_device \"gpu\"): the chunk the states are streamed in."},
      {"zero_optimization.offload_optimizer.chunk_buffers", "no such key", "`3`",
       "zero's own key (update_device \"gpu\"): the GPU staging sets of the streamed update."},
      {"zero_optimization.offload_optimizer.overlap_step", "no such key (the step completes inside step())", "`false`",
       "zero's own key (update_device \"gpu\"): the streamed update runs under the next forward."},
      {"aio.allow_buffered_fallback", "no such key (O_DIRECT is required)", "`false`",
       "zero's own key; its default is DeepSpeed's behaviour (a filesystem without O_DIRECT is an error)."},
      {"`zero_optimization.reduce_bucket_size`, `allgather_bucket_size`, `sub_group_size`, the offload blocks' "
       "`buffer_count` and `offload_param.buffer_size` (accepted values)",
       "0 accepted", "at least 1",
       "A bucket or buffer of 0 elements cannot hold anything; zero refuses it "
       "when the file is read rather than failing later."},
      {"`fp16.min_loss_scale` (accepted values)", "an integer", "any number > 0",
       "A fraction (0.25) is accepted: it only bounds the dynamic scale from below."},
  };
  return *d;
}

}  // namespace zero
