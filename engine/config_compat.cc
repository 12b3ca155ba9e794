// The config's DeepSpeed compatibility tables (config_compat.h) and DeepSpeedDifferences (config_keys.h).
#include "engine/config_compat.h"

#include <vector>

#include "engine/config_keys.h"

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
    {"activation_checkpointing", "activation checkpointing belongs to the user's model"},
    {"flops_profiler", "zero has no flops profiler"},
    {"tensorboard", "zero has no monitor backends"},
    {"wandb", "zero has no monitor backends"},
    {"csv_monitor", "zero has no monitor backends"},
    {"comms_logger", "zero has no communication logger"},
};

}  // namespace

std::span<const Alias> Aliases() { return kAliases; }
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
       "sets how often examples/zero_train prints progress, and an integer keeps it simple. `null` is refused."},
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
      {"stop_on_nonfinite", "no such key (a NaN or inf gradient outside fp16 is applied and training goes on)",
       "`true`",
       "zero's own key: a NaN or inf global gradient norm on a step that would be applied stops the job with an "
       "error naming the step (before the update when clipping or fp16 reads the norm first); false is "
       "DeepSpeed's behaviour."},
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
