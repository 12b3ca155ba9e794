// The key table (key_table.h): the Key builders and every key of the config with its default,
// check and doc, in the order docs/config.md lists them. The value checks and texts and the
// table's view for tests and tools (keys.h) are in key_checks.cc.
#include "engine/config/key_table.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>

#include "engine/config/keys.h"

namespace zero {
namespace config_internal {
namespace {

// FIELD(zero.stage) is a function returning a reference to that Config member.
#define FIELD(member) (+[](Config & c) -> auto& { return c.member; })

template <typename T>
Key IntKey(std::string path, T& (*field)(Config&), int64_t def) {
  Key k;
  k.path = std::move(path);
  k.kind = Kind::kInt;
  k.default_value = def;
  k.min = static_cast<double>(std::numeric_limits<T>::min());
  k.max = static_cast<double>(std::numeric_limits<T>::max());
  k.type_min = *k.min;
  k.type_max = *k.max;
  k.set = [field](Config& c, const Json& v) { field(c) = static_cast<T>(v.get<int64_t>()); };
  k.get = [field](const Config& c) { return Json(static_cast<int64_t>(field(const_cast<Config&>(c)))); };
  return k;
}

Key NumberKey(std::string path, double& (*field)(Config&), double def) {
  Key k;
  k.path = std::move(path);
  k.kind = Kind::kNumber;
  k.default_value = def;
  k.set = [field](Config& c, const Json& v) { field(c) = v.get<double>(); };
  k.get = [field](const Config& c) { return Json(field(const_cast<Config&>(c))); };
  return k;
}

Key BoolKey(std::string path, bool& (*field)(Config&), bool def) {
  Key k;
  k.path = std::move(path);
  k.kind = Kind::kBool;
  k.default_value = def;
  k.set = [field](Config& c, const Json& v) { field(c) = v.get<bool>(); };
  k.get = [field](const Config& c) { return Json(field(const_cast<Config&>(c))); };
  return k;
}

Key StringKey(std::string path, std::string& (*field)(Config&), std::string def) {
  Key k;
  k.path = std::move(path);
  k.kind = Kind::kString;
  k.default_value = def;
  k.set = [field](Config& c, const Json& v) { field(c) = v.get<std::string>(); };
  k.get = [field](const Config& c) { return Json(field(const_cast<Config&>(c))); };
  return k;
}

Key DeviceKey(std::string path, OffloadDevice& (*field)(Config&)) {
  Key k;
  k.path = std::move(path);
  k.kind = Kind::kString;
  k.default_value = "none";
  k.choices = {"none", "cpu", "nvme"};
  k.set = [field](Config& c, const Json& v) {
    const std::string s = v.get<std::string>();
    field(c) = s == "cpu" ? OffloadDevice::kCpu : s == "nvme" ? OffloadDevice::kNvme : OffloadDevice::kNone;
  };
  k.get = [field](const Config& c) { return Json(OffloadDeviceName(field(const_cast<Config&>(c)))); };
  return k;
}

// A dtype that may be unset (null): `has` says whether it is set.
Key DTypeKey(std::string path, DType& (*field)(Config&), bool& (*has)(Config&)) {
  Key k;
  k.path = std::move(path);
  k.kind = Kind::kDType;
  k.nullable = true;
  k.default_value = Json();
  k.set = [field, has](Config& c, const Json& v) {
    has(c) = !v.is_null();
    if (v.is_null()) {
      field(c) = DType::kF32;
      return;
    }
    DType t = DType::kF32;
    ParseDType(v.get<std::string>(), &t);
    field(c) = t;
  };
  k.get = [field, has](const Config& c) {
    Config& m = const_cast<Config&>(c);
    return has(m) ? Json(DTypeName(field(m))) : Json();
  };
  return k;
}

// A block whose presence is the setting: `field` is true when an object is given, false for null.
Key PresenceKey(std::string path, bool& (*field)(Config&)) {
  Key k;
  k.path = std::move(path);
  k.kind = Kind::kPresence;
  k.nullable = true;
  k.default_value = Json();
  k.set = [field](Config& c, const Json& v) { field(c) = v.is_object(); };
  k.get = [field](const Config& c) { return field(const_cast<Config&>(c)) ? Json::object() : Json(); };
  return k;
}

Key BetasKey(std::string path) {
  Key k;
  k.path = std::move(path);
  k.kind = Kind::kBetas;
  k.default_value = Json::array({0.9, 0.999});
  k.set = [](Config& c, const Json& v) {
    c.optimizer.beta1 = v[0].get<double>();
    c.optimizer.beta2 = v[1].get<double>();
  };
  k.get = [](const Config& c) { return Json::array({c.optimizer.beta1, c.optimizer.beta2}); };
  return k;
}

// Upper bounds (issue 23): every number has one, derived from what the code that reads it can hold,
// so that an absurd value is an error naming its key here rather than an overflow, a bad_alloc or a
// NaN later.
// Counts of elements, bytes and steps: the largest integer a JSON number (a double) holds exactly;
// 16 bytes per element of optimizer state still fit int64 far below it.
constexpr double kMaxCount = 9007199254740991.0;  // 2^53 - 1
// Counts handed to int (micro batch rows, micro steps, buffer and thread counts).
constexpr double kMaxInt = 2147483647.0;
// Reals used in the fp32 arithmetic of the update (lr, eps, weight decay, loss scale, clipping):
// within fp32's range (3.4e38; eps at least fp32's smallest normal 1.2e-38, below which the
// update's division may be by zero).
constexpr double kMaxReal = 1e38;
constexpr double kMinEps = 1e-37;

void AddBatchAndLoggingKeys(std::vector<Key>* t) {
  // Batch arithmetic: any two derive the third (see ResolveBatch).
  t->push_back(IntKey("train_batch_size", FIELD(train_batch_size), 0)
                   .AtMost(kMaxCount)
                   .AtLeast(1)
                   .NoDefault("derived")
                   .Doc("Samples per optimizer step over all ranks: train_micro_batch_size_per_gpu x "
                        "gradient_accumulation_steps x world size."));
  t->push_back(IntKey("train_micro_batch_size_per_gpu", FIELD(train_micro_batch_size_per_gpu), 0)
                   .AtMost(kMaxInt)
                   .AtLeast(1)
                   .NoDefault("derived")
                   .Doc("Samples per rank in one forward/backward (one micro step)."));
  t->push_back(IntKey("gradient_accumulation_steps", FIELD(gradient_accumulation_steps), 0)
                   .AtMost(kMaxInt)
                   .AtLeast(1)
                   .NoDefault("derived")
                   .Doc("Micro steps per optimizer step in managed accumulation; backward divides "
                        "gradients by it."));
  t->push_back(NumberKey("gradient_clipping", FIELD(gradient_clipping), 1.0)
                   .AtMost(kMaxReal)
                   .AtLeast(0)
                   .Doc("Clip the global gradient norm to this value; 0 turns clipping off."));
  t->push_back(IntKey("steps_per_print", FIELD(steps_per_print), 10)
                   .AtMost(kMaxCount)
                   .AtLeast(1)
                   .Doc("Log progress every this many optimizer steps."));
  t->push_back(BoolKey("wall_clock_breakdown", FIELD(wall_clock_breakdown), false)
                   .Doc("The engine times forward, backward, step, communication and offload (synchronizing the "
                        "device at each phase boundary) and rank 0 prints their means per step every "
                        "steps_per_print steps (docs/timeline.md)."));
}

void AddTraceKeys(std::vector<Key>* t) {
  t->push_back(BoolKey("zero_trace.enabled", FIELD(zero_trace.enabled), false)
                   .Doc("Write a Chrome trace (chrome://tracing, Perfetto) of optimizer steps first_step..last_step: "
                        "one track per stream (compute, communication, host->device, device->host, CPU optimizer, "
                        "I/O; docs/timeline.md)."));
  t->push_back(StringKey("zero_trace.path", FIELD(zero_trace.path), "zero_trace.json")
                   .Doc("The trace file of rank 0 (rank r writes <path>.rank<r>), written atomically after "
                        "last_step; its directory must exist."));
  t->push_back(IntKey("zero_trace.first_step", FIELD(zero_trace.first_step), 2)
                   .AtMost(kMaxCount)
                   .AtLeast(1)
                   .Doc("The first traced optimizer step of the run (from 1; the first step warms up)."));
  t->push_back(IntKey("zero_trace.last_step", FIELD(zero_trace.last_step), 4)
                   .AtMost(kMaxCount)
                   .AtLeast(1)
                   .Doc("The last traced optimizer step (>= first_step)."));
}

void AddGradientKeys(std::vector<Key>* t) {
  t->push_back(StringKey("gradient_allreduce_op", FIELD(gradient_allreduce_op), "mean")
                   .Choices({"mean", "sum"})
                   .Doc("How gradients are combined across data-parallel ranks."));
  t->push_back(BoolKey("prescale_gradients", FIELD(prescale_gradients), false)
                   .Doc("Divide gradients by the world size before the reduction instead of after."));
  t->push_back(NumberKey("gradient_predivide_factor", FIELD(gradient_predivide_factor), 1.0)
                   .AtMost(kMaxReal)
                   .Above(0)
                   .Doc("Divide gradients by this factor before the reduction and by world size / "
                        "factor after it."));
  t->push_back(DTypeKey("communication_data_type", FIELD(communication_data_type), FIELD(has_communication_data_type))
                   .DefaultDoc("null (the gradient dtype)")
                   .Doc("Element type of gradient reductions; null: the gradients' own type."));
  t->push_back(BoolKey("managed_gradient_accumulation", FIELD(managed_gradient_accumulation), true)
                   .Doc("true: the engine counts micro steps and steps every gradient_accumulation_steps; "
                        "false: the user calls backward any number of times and steps when they choose."));
  t->push_back(BoolKey("freeze_inactive_parameters", FIELD(freeze_inactive_parameters), false)
                   .Doc("A parameter that received no gradient on any rank in an accumulation window: false "
                        "(DeepSpeed's behaviour) steps it with a zero gradient (its moments decay; weight decay and "
                        "momentum move it); true keeps its weights and AdamW moments unchanged (PyTorch's "
                        "set_to_none behaviour). The same in managed and unmanaged mode."));
  t->push_back(BoolKey("stop_on_nonfinite", FIELD(stop_on_nonfinite), true)
                   .Doc("A NaN or inf global gradient norm on a step that would be applied (fp16's overflow steps are "
                        "skipped as before) ends Step() with an error naming the step. With gradient_clipping or fp16 "
                        "the norm is known before the update and nothing is changed; otherwise the step was applied "
                        "and the engine is unusable. false: the step is applied and training goes on (DeepSpeed "
                        "0.19.8 instead skips such a step with bf16, and with fp32 at stages 1-3: see the "
                        "differences below). train/zero_train also stops on a NaN or inf loss."));
  t->push_back(DTypeKey("data_types.grad_accum_dtype", FIELD(grad_accum_dtype), FIELD(has_grad_accum_dtype))
                   .DefaultDoc("null (fp32)")
                   .Doc("Element type gradients are accumulated in across micro steps; null: fp32."));
}

// fp16 and bf16.
void AddPrecisionKeys(std::vector<Key>* t) {
  t->push_back(BoolKey("fp16.enabled", FIELD(fp16.enabled), false)
                   .Doc("Train with fp16 parameters and gradients, fp32 master weights and loss scaling."));
  t->push_back(NumberKey("fp16.loss_scale", FIELD(fp16.loss_scale), 0.0)
                   .AtMost(kMaxReal)
                   .AtLeast(0)
                   .Doc("Static loss scale; 0 selects dynamic loss scaling."));
  t->push_back(IntKey("fp16.initial_scale_power", FIELD(fp16.initial_scale_power), 16)
                   .Range(0, 127)
                   .Doc("Dynamic scaling starts at 2^initial_scale_power."));
  t->push_back(IntKey("fp16.loss_scale_window", FIELD(fp16.loss_scale_window), 1000)
                   .AtLeast(1)
                   .Doc("Steps without overflow after which the dynamic scale doubles."));
  t->push_back(IntKey("fp16.hysteresis", FIELD(fp16.hysteresis), 2)
                   .AtLeast(1)
                   .Doc("Overflows tolerated before the dynamic scale is halved (delayed shift)."));
  t->push_back(BoolKey("fp16.consecutive_hysteresis", FIELD(fp16.consecutive_hysteresis), false)
                   .Doc("Refill the hysteresis after every step without overflow, not only when the scale "
                        "grows."));
  t->push_back(NumberKey("fp16.min_loss_scale", FIELD(fp16.min_loss_scale), 1.0)
                   .AtMost(kMaxReal)
                   .Above(0)
                   .Doc("The dynamic scale never goes below this."));
  t->push_back(BoolKey("fp16.fp16_master_weights_and_grads", FIELD(fp16.fp16_master_weights_and_grads), false)
                   .Doc("DeepSpeed: fp16 master weights and gradients in the optimizer (DeepSpeedCPUAdam). Not "
                        "built: zero keeps fp32 master weights; true is refused."));
  t->push_back(BoolKey("bf16.enabled", FIELD(bf16_enabled), false)
                   .Doc("Train with bf16 parameters and gradients and fp32 master weights (no loss "
                        "scaling). The block may also be spelled \"bfloat16\"."));
  t->push_back(BoolKey("bf16.bf16_master_weights_and_grads", FIELD(bf16_master_weights_and_grads), false)
                   .Doc("DeepSpeed: bf16 master weights and gradients in the ZeRO optimizer. Not built: zero keeps "
                        "fp32 master weights and accumulates gradients in fp32; true is refused."));
  t->push_back(BoolKey("bf16.bf16_optimizer_states", FIELD(bf16_optimizer_states), false)
                   .Doc("DeepSpeed: bf16 optimizer states (with bf16_master_weights_and_grads). Not built: zero "
                        "keeps AdamW's moments in fp32; true is refused."));
}

void AddOptimizerKeys(std::vector<Key>* t) {
  t->push_back(StringKey("optimizer.type", FIELD(optimizer.type), "AdamW")
                   .Choices({"Adam", "AdamW"})
                   .CaseInsensitive()
                   .NotImplemented({"Lamb", "OneBitAdam", "ZeroOneAdam", "OneBitLamb", "Adagrad", "Lion", "MuAdam",
                                    "MuAdamW", "MuSGD", "SGD", "FusedAdam", "DeepSpeedCPUAdam"})
                   .Doc("\"AdamW\", or \"Adam\": decoupled weight decay (AdamW) unless "
                        "optimizer.params.adam_w_mode is false."));
  t->push_back(NumberKey("optimizer.params.lr", FIELD(optimizer.lr), 1e-3)
                   .AtMost(kMaxReal)
                   .AtLeast(0)
                   .Doc("Learning rate (the base the scheduler scales)."));
  t->push_back(
      BetasKey("optimizer.params.betas").Doc("[beta1, beta2]: decay rates of the first and second moment estimates."));
  t->push_back(NumberKey("optimizer.params.eps", FIELD(optimizer.eps), 1e-8)
                   .Range(kMinEps, kMaxReal)
                   .Doc("Added to the denominator for numerical stability."));
  t->push_back(NumberKey("optimizer.params.weight_decay", FIELD(optimizer.weight_decay), 0.0)
                   .AtMost(kMaxReal)
                   .AtLeast(0)
                   .Doc("Weight decay: decoupled (AdamW) or added to the gradient as L2 (classic Adam). 0 for "
                        "both types, as DeepSpeed's FusedAdam (torch.optim.AdamW's 0.01 applies in DeepSpeed only "
                        "with torch_adam: true)."));
  t->push_back(BoolKey("optimizer.params.adam_w_mode", FIELD(optimizer.adam_w_mode), true)
                   .Doc("With type \"Adam\": false selects classic Adam (L2 weight decay in the "
                        "gradient)."));
}

void AddSchedulerKeys(std::vector<Key>* t) {
  t->push_back(StringKey("scheduler.type", FIELD(scheduler.type), "")
                   .Choices({"", kWarmupLR, kWarmupDecayLR, kWarmupCosineLR})
                   .NotImplemented({"OneCycle", "LRRangeTest"})
                   .DefaultDoc("\"\" (constant lr)")
                   .Doc("Learning-rate schedule; \"\" or no scheduler block keeps optimizer.params.lr."));
  t->push_back(NumberKey("scheduler.params.warmup_min_lr", FIELD(scheduler.warmup_min_lr), 0.0)
                   .AtMost(kMaxReal)
                   .AtLeast(0)
                   .OnlyFor({kWarmupLR, kWarmupDecayLR})
                   .Doc("Learning rate at the start of warmup."));
  {
    Key k = NumberKey("scheduler.params.warmup_max_lr", FIELD(scheduler.warmup_max_lr), -1.0)
                .Range(-1, kMaxReal)
                .OnlyFor({kWarmupLR, kWarmupDecayLR})
                .DependsOn("optimizer.params.lr for WarmupLR; 0.001 for WarmupDecayLR (as DeepSpeed)")
                .Doc("Learning rate at the end of warmup; -1 means optimizer.params.lr.");
    k.expected_override = "a number in [0, 1e+38], or -1 for optimizer.params.lr";
    k.also_ok = [](double v) { return v == -1.0 || v >= 0.0; };
    k.extra_bad = {"-0.5"};
    t->push_back(std::move(k));
  }
  t->push_back(IntKey("scheduler.params.warmup_num_steps", FIELD(scheduler.warmup_num_steps), 1000)
                   .AtMost(kMaxCount)
                   .AtLeast(1)
                   .OnlyFor({kWarmupLR, kWarmupDecayLR, kWarmupCosineLR})
                   .Doc("Optimizer steps of warmup (values below 2 act as 2, as in DeepSpeed)."));
  t->push_back(StringKey("scheduler.params.warmup_type", FIELD(scheduler.warmup_type), "log")
                   .Choices({"log", "linear"})
                   .OnlyFor({kWarmupLR, kWarmupDecayLR, kWarmupCosineLR})
                   .Doc("Warmup curve: log(step + 1) / log(warmup_num_steps), or step / warmup_num_steps."));
  t->push_back(IntKey("scheduler.params.total_num_steps", FIELD(scheduler.total_num_steps), 0)
                   .AtMost(kMaxCount)
                   .AtLeast(1)
                   .NoDefault("required")
                   .OnlyFor({kWarmupDecayLR, kWarmupCosineLR})
                   .Doc("Optimizer steps of the whole run; the decay ends here."));
  t->push_back(NumberKey("scheduler.params.warmup_min_ratio", FIELD(scheduler.warmup_min_ratio), 0.0)
                   .Range(0, 1)
                   .OnlyFor({kWarmupCosineLR})
                   .Doc("Warmup starts at this fraction of optimizer.params.lr."));
  t->push_back(NumberKey("scheduler.params.cos_min_ratio", FIELD(scheduler.cos_min_ratio), 1e-4)
                   .Range(0, 1)
                   .OnlyFor({kWarmupCosineLR})
                   .Doc("The cosine decay ends at this fraction of optimizer.params.lr."));
}

void AddZeroKeys(std::vector<Key>* t) {
  t->push_back(IntKey("zero_optimization.stage", FIELD(zero.stage), 0)
                   .Range(0, 3)
                   .Doc("0: plain data parallelism; 1: optimizer states partitioned; 2: + gradients; "
                        "3: + parameters."));
  t->push_back(BoolKey("zero_optimization.contiguous_gradients", FIELD(zero.contiguous_gradients), true)
                   .Doc("Pack gradients into contiguous bucket buffers, one collective per bucket; false: one "
                        "collective per parameter straight from its gradient buffer (no copy, no bucket memory)."));
  t->push_back(BoolKey("zero_optimization.reduce_scatter", FIELD(zero.reduce_scatter), true)
                   .Doc("Reduce gradients with reduce-scatter (stages 1-3); false: all-reduce and keep the own shard "
                        "(same values, more traffic)."));
  t->push_back(IntKey("zero_optimization.reduce_bucket_size", FIELD(zero.reduce_bucket_size), 500000000)
                   .AtMost(kMaxCount)
                   .AtLeast(1)
                   .Doc("Elements reduced at once (gradient bucket)."));
  t->push_back(IntKey("zero_optimization.allgather_bucket_size", FIELD(zero.allgather_bucket_size), 500000000)
                   .AtMost(kMaxCount)
                   .AtLeast(1)
                   .Doc("Gathered elements per all-gather of updated weights (stages 1/2); a larger parameter is "
                        "gathered alone."));
  t->push_back(BoolKey("zero_optimization.overlap_comm", FIELD(zero.overlap_comm), false)
                   .DependsOn("true at stage 3, false otherwise")
                   .Doc("Reduce gradient buckets on a communication stream, overlapped with backward."));
  t->push_back(IntKey("zero_optimization.sub_group_size", FIELD(zero.sub_group_size), 1000000000)
                   .AtMost(kMaxCount)
                   .AtLeast(1)
                   .Doc("Elements per optimizer sub-group (the unit of the optimizer step and of NVMe "
                        "swapping)."));
  t->push_back(
      IntKey("zero_optimization.stage3_prefetch_bucket_size", FIELD(zero.stage3_prefetch_bucket_size), 50000000)
          .AtMost(kMaxCount)
          .AtLeast(0)
          .Doc("Stage 3: elements of parameters fetched ahead of use."));
  t->push_back(IntKey("zero_optimization.stage3_param_persistence_threshold",
                      FIELD(zero.stage3_param_persistence_threshold), 100000)
                   .AtMost(kMaxCount)
                   .AtLeast(0)
                   .Doc("Stage 3: parameters with fewer elements stay gathered."));
  t->push_back(
      IntKey("zero_optimization.stage3_max_live_parameters", FIELD(zero.stage3_max_live_parameters), 1000000000)
          .AtMost(kMaxCount)
          .AtLeast(0)
          .Doc("Stage 3: most elements kept gathered at once."));
  t->push_back(IntKey("zero_optimization.stage3_max_reuse_distance", FIELD(zero.stage3_max_reuse_distance), 1000000000)
                   .AtMost(kMaxCount)
                   .AtLeast(0)
                   .Doc("Stage 3: a parameter reused within this many elements is not released."));
  t->push_back(BoolKey("zero_optimization.stage3_gather_16bit_weights_on_model_save",
                       FIELD(zero.stage3_gather_16bit_weights_on_model_save), false)
                   .Doc("Stage 3: gather full 16-bit weights when the model is saved."));
  t->push_back(BoolKey("zero_optimization.round_robin_gradients", FIELD(zero.round_robin_gradients), false)
                   .Doc("Stages 1/2 with offload: spread gradient copies across ranks round-robin."));
  t->push_back(BoolKey("zero_optimization.ignore_unused_parameters", FIELD(zero.ignore_unused_parameters), true)
                   .Doc("Stage 2/3: parameters that get no gradient are not an error."));
  t->push_back(StringKey("zero_optimization.offload_grad_accumulation", FIELD(zero.offload_grad_accumulation), "cpu")
                   .Choices({"cpu", "gpu"})
                   .Doc("With both offloads (optimizer and parameters, so stage 3): sum micro-step gradients on "
                        "the host (\"cpu\") or in FP32 on the GPU, crossing PCIe once per step (\"gpu\")."));
}

// DeepSpeed features of the zero_optimization block that zero reads and does not build: only their
// defaults are accepted by Engine::Create (config_rules.cc), since each changes what is trained or how.
void AddZeroUnbuiltKeys(std::vector<Key>* t) {
  t->push_back(BoolKey("zero_optimization.legacy_stage1", FIELD(zero.legacy_stage1), false)
                   .Doc("DeepSpeed: its pre-0.6 stage-1 implementation. Not built; true is refused."));
  t->push_back(IntKey("zero_optimization.zero_hpz_partition_size", FIELD(zero.zero_hpz_partition_size), 1)
                   .AtMost(kMaxInt)
                   .AtLeast(0)
                   .Doc("DeepSpeed (ZeRO++ hpZ): ranks of a secondary stage-3 parameter partition. Not built: zero "
                        "partitions parameters once over all data-parallel ranks; above 1 is refused."));
  t->push_back(BoolKey("zero_optimization.zero_quantized_weights", FIELD(zero.zero_quantized_weights), false)
                   .Doc("DeepSpeed (ZeRO++ qwZ): quantized parameter all-gathers. Not built: zero gathers "
                        "parameters in the model dtype; true is refused."));
  t->push_back(BoolKey("zero_optimization.zero_quantized_nontrainable_weights",
                       FIELD(zero.zero_quantized_nontrainable_weights), false)
                   .Doc("DeepSpeed: frozen parameters stored quantized. Not built; true is refused."));
  t->push_back(BoolKey("zero_optimization.zero_quantized_gradients", FIELD(zero.zero_quantized_gradients), false)
                   .Doc("DeepSpeed (ZeRO++ qgZ): quantized gradient reduction. Not built: zero reduces gradients "
                        "unquantized; true is refused."));
  t->push_back(PresenceKey("zero_optimization.zenflow", FIELD(zero.zenflow))
                   .DefaultDoc("`null` (off)")
                   .Doc("DeepSpeed's ZenFlow block (top-k gradient columns updated each step, the rest later on "
                        "the CPU). Not built: zero applies every gradient at every step; a block (even `{}`) is "
                        "refused, its keys are not read."));
}

void AddOffloadOptimizerKeys(std::vector<Key>* t) {
  t->push_back(DeviceKey("zero_optimization.offload_optimizer.device", FIELD(zero.offload_optimizer.device))
                   .Doc("Where FP32 master weights and optimizer states live: GPU (\"none\"), host "
                        "memory, or NVMe."));
  t->push_back(StringKey("zero_optimization.offload_optimizer.nvme_path", FIELD(zero.offload_optimizer.nvme_path), "")
                   .Doc("Directory for the swap files when device is \"nvme\"."));
  t->push_back(IntKey("zero_optimization.offload_optimizer.buffer_count", FIELD(zero.offload_optimizer.buffer_count), 4)
                   .AtMost(kMaxInt)
                   .AtLeast(1)
                   .Doc("Pinned buffers for NVMe swapping of optimizer states."));
  t->push_back(
      BoolKey("zero_optimization.offload_optimizer.pin_memory", FIELD(zero.offload_optimizer.pin_memory), true)
          .Doc("Keep offloaded states in pinned (page-locked) host memory: the host slab is registered with "
               "cudaHostRegister (CUDA backend) or mlock'ed within RLIMIT_MEMLOCK (CPU backend); a failed pin "
               "is an error unless pin_memory_fallback. false: pageable memory, for hosts with a tight memlock "
               "limit; copies are slower and overlap less."));
  t->push_back(
      BoolKey("zero_optimization.offload_optimizer.pipeline_read", FIELD(zero.offload_optimizer.pipeline_read), false)
          .Doc("NVMe: overlap reading the next sub-group with the step."));
  t->push_back(
      BoolKey("zero_optimization.offload_optimizer.pipeline_write", FIELD(zero.offload_optimizer.pipeline_write), false)
          .Doc("NVMe: overlap writing the previous sub-group with the step."));
  t->push_back(BoolKey("zero_optimization.offload_optimizer.fast_init", FIELD(zero.offload_optimizer.fast_init), false)
                   .Doc("NVMe: skip writing initial optimizer states through the swapper."));
  t->push_back(NumberKey("zero_optimization.offload_optimizer.ratio", FIELD(zero.offload_optimizer.ratio), 1.0)
                   .Range(0, 1)
                   .Above(0)
                   .Doc("Stage 3: fraction of the optimizer states offloaded (the partition's last elements); the "
                        "first 1 - ratio stay on the GPU with the device AdamW (DeepSpeed's partial offload)."));
  t->push_back(IntKey("zero_optimization.offload_optimizer.cpu_threads", FIELD(zero.offload_optimizer.cpu_threads), 0)
                   .AtMost(1024)
                   .AtLeast(0)
                   .DefaultDoc("`0` (the hardware threads)")
                   .Doc("Threads of the CPU AdamW that updates offloaded states (device \"cpu\" or \"nvme\"), the "
                        "calling thread included; 0: std::thread::hardware_concurrency(). Per rank: with several "
                        "ranks on a host, give each its share of the cores. The result does not depend on it."));
  t->push_back(BoolKey("zero_optimization.offload_optimizer.pin_memory_fallback",
                       FIELD(zero.offload_optimizer.pin_memory_fallback), false)
                   .Doc("With pin_memory true: when pinning the offloaded states fails (RLIMIT_MEMLOCK, the CUDA "
                        "host allocator), keep them in pageable memory and print one warning instead of failing "
                        "create. Pageable copies are slower and do not overlap."));
  t->push_back(IntKey("zero_optimization.offload_optimizer.host_memory_budget",
                      FIELD(zero.offload_optimizer.host_memory_budget), 0)
                   .AtMost(kMaxCount)
                   .AtLeast(0)
                   .DefaultDoc("`0` (all states on NVMe)")
                   .Doc("Tiered state, device \"nvme\" only: bytes of this rank's optimizer state (FP32 master "
                        "weights and both moments, 12 bytes per element) kept in pinned host memory; the rest is "
                        "swapped to nvme_path. The swap buffers are not part of it. 0: every state on NVMe "
                        "(DeepSpeed's behaviour); a budget that holds the whole state keeps all of it in host memory. "
                        "Per rank: ranks on one host each pin this much."));
  t->push_back(
      BoolKey("zero_optimization.offload_optimizer.super_offload", FIELD(zero.offload_optimizer.super_offload), false)
          .Doc("DeepSpeed: SuperOffload, its stage-3 offload optimizer for Superchips. Not built: zero's offload "
               "runs its CPU AdamW (or update_device \"gpu\"); true is refused."));
}

// offload_optimizer.update_device and what the streamed GPU update reads.
void AddOffloadOptimizerGpuUpdateKeys(std::vector<Key>* t) {
  t->push_back(
      StringKey("zero_optimization.offload_optimizer.update_device", FIELD(zero.offload_optimizer.update_device), "cpu")
          .Choices({"cpu", "gpu"})
          .Doc("Device \"cpu\" only: where AdamW over the offloaded states runs. \"cpu\": the CPU AdamW "
               "on the host. \"gpu\": the FP32 master weights and moments stay in pinned host memory and "
               "are streamed through the GPU in chunks (host->device copy of one chunk, AdamW of the "
               "previous and device->host copy of the one before at once): 12 bytes per element each way "
               "over PCIe per step, chunk_buffers * chunk_size * 12 bytes of GPU memory. The same bits as "
               "no offload."));
  t->push_back(IntKey("zero_optimization.offload_optimizer.chunk_size", FIELD(zero.offload_optimizer.chunk_size),
                      int64_t{1} << 24)
                   .AtMost(kMaxCount)
                   .AtLeast(1)
                   .Doc("update_device \"gpu\": elements per streamed chunk (each of the three states). The "
                        "result does not depend on it."));
  t->push_back(
      IntKey("zero_optimization.offload_optimizer.chunk_buffers", FIELD(zero.offload_optimizer.chunk_buffers), 3)
          .AtMost(1024)
          .AtLeast(2)
          .Doc("update_device \"gpu\": GPU staging sets the chunks rotate through (2: upload and "
               "update overlap; 3: the download overlaps too)."));
  t->push_back(
      BoolKey("zero_optimization.offload_optimizer.overlap_step", FIELD(zero.offload_optimizer.overlap_step), false)
          .Doc("update_device \"gpu\" only: overlap the streamed update with the next forward. Step() "
               "queues the first chunk_buffers chunks and returns; the rest are queued as the next "
               "forward's GatherModule reaches the modules that own them (plus chunk_buffers chunks "
               "ahead), and each GatherModule makes the compute stream wait only for the chunks holding "
               "its parameters. At stages 0-2 the forward must then reach every parameter through "
               "GatherModule (param() of a parameter whose module was not gathered since the step is "
               "an error). Everything left is queued before the next backward's first gradient; "
               "Engine::WaitForOptimizerStep() completes the step. One data-parallel rank, no "
               "offload_param. The same bits as the synchronous step."));
}

void AddOffloadParamKeys(std::vector<Key>* t) {
  t->push_back(DeviceKey("zero_optimization.offload_param.device", FIELD(zero.offload_param.device))
                   .Doc("Stage 3: where partitioned 16-bit parameters live between uses."));
  t->push_back(StringKey("zero_optimization.offload_param.nvme_path", FIELD(zero.offload_param.nvme_path), "")
                   .Doc("Directory for the swap files when device is \"nvme\"."));
  t->push_back(
      IntKey("zero_optimization.offload_param.buffer_count", FIELD(zero.offload_param.buffer_count), 5)
          .AtMost(kMaxInt)
          .AtLeast(1)
          .Doc(
              "device \"cpu\": the most stage-3 gathers whose shard uploads are in flight at once (docs/offload.md)."));
  t->push_back(
      IntKey("zero_optimization.offload_param.buffer_size", FIELD(zero.offload_param.buffer_size), 100000000)
          .AtMost(kMaxCount)
          .AtLeast(1)
          .Doc("device \"cpu\": the largest shard (elements) of one parameter; a larger one is an Initialize error."));
  t->push_back(IntKey("zero_optimization.offload_param.max_in_cpu", FIELD(zero.offload_param.max_in_cpu), 1000000000)
                   .AtMost(kMaxCount)
                   .AtLeast(0)
                   .Doc("Elements of parameters kept in host memory when device is \"nvme\"."));
  t->push_back(BoolKey("zero_optimization.offload_param.pin_memory", FIELD(zero.offload_param.pin_memory), true)
                   .Doc("Keep offloaded parameters in pinned (page-locked) host memory. false: pageable memory, "
                        "for hosts with a tight memlock limit; copies are slower and overlap less."));
  t->push_back(BoolKey("zero_optimization.offload_param.pin_memory_fallback",
                       FIELD(zero.offload_param.pin_memory_fallback), false)
                   .Doc("With pin_memory true: when pinning the offloaded parameters fails, keep them in pageable "
                        "memory and print one warning instead of failing create."));
}

// Asynchronous I/O for NVMe.
void AddAioKeys(std::vector<Key>* t) {
  t->push_back(IntKey("aio.block_size", FIELD(aio.block_size), 1048576)
                   .AtMost(1 << 30)
                   .AtLeast(1)
                   .Doc("Bytes per I/O request."));
  t->push_back(IntKey("aio.queue_depth", FIELD(aio.queue_depth), 8)
                   .AtMost(65536)
                   .AtLeast(1)
                   .Doc("Requests in flight per I/O thread."));
  t->push_back(IntKey("aio.intra_op_parallelism", FIELD(aio.intra_op_parallelism), 1)
                   .AtMost(1024)
                   .AtLeast(1)
                   .Doc("I/O threads per read or write (older name: thread_count)."));
  t->push_back(BoolKey("aio.single_submit", FIELD(aio.single_submit), false)
                   .Doc("Submit requests one at a time rather than in batches."));
  t->push_back(BoolKey("aio.overlap_events", FIELD(aio.overlap_events), true)
                   .Doc("Submit new requests while waiting for completions."));
  t->push_back(BoolKey("aio.use_gds", FIELD(aio.use_gds), false).Doc("Use GPUDirect Storage."));
  t->push_back(BoolKey("aio.allow_buffered_fallback", FIELD(aio.allow_buffered_fallback), false)
                   .Doc("When nvme_path's filesystem refuses O_DIRECT (tmpfs, some FUSE and network filesystems): "
                        "false fails create naming the filesystem; true swaps through the page cache instead "
                        "(costs host memory, no overlap: for tests and small runs)."));
}

// In the order docs/config.md lists them.
std::vector<Key> BuildKeys() {
  std::vector<Key> t;
  AddBatchAndLoggingKeys(&t);
  AddTraceKeys(&t);
  AddGradientKeys(&t);
  AddPrecisionKeys(&t);
  AddOptimizerKeys(&t);
  AddSchedulerKeys(&t);
  AddZeroKeys(&t);
  AddZeroUnbuiltKeys(&t);
  AddOffloadOptimizerKeys(&t);
  AddOffloadOptimizerGpuUpdateKeys(&t);
  AddOffloadParamKeys(&t);
  AddAioKeys(&t);
  return t;
}

#undef FIELD

}  // namespace

const std::vector<Key>& Keys() {
  static const std::vector<Key>* keys = new std::vector<Key>(BuildKeys());
  return *keys;
}

const Key* FindKey(const std::string& path) {
  for (const Key& k : Keys()) {
    if (k.path == path) return &k;
  }
  return nullptr;
}

bool IsBlock(const std::string& path) {
  const std::string prefix = path + ".";
  for (const Key& k : Keys()) {
    if (k.path.compare(0, prefix.size(), prefix) == 0) return true;
  }
  return false;
}

}  // namespace config_internal
}  // namespace zero
