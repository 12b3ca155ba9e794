#include "engine/config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "engine/config_keys.h"
#include "engine/json_input.h"

namespace zero {

const char* OffloadDeviceName(OffloadDevice d) {
  switch (d) {
    case OffloadDevice::kNone: return "none";
    case OffloadDevice::kCpu: return "cpu";
    case OffloadDevice::kNvme: return "nvme";
  }
  return "?";
}

DType Config::model_dtype() const {
  if (fp16.enabled) return DType::kF16;
  if (bf16_enabled) return DType::kBF16;
  return DType::kF32;
}

namespace {

// Ordered so that warnings come in file order and ConfigToJson follows the table.
using Json = nlohmann::ordered_json;

// ---------------------------------------------------------------------------------------------
// The key table.

enum class Kind { kBool, kInt, kNumber, kString, kDType, kBetas };

struct Key {
  std::string path;
  Kind kind = Kind::kBool;
  Json default_value;        // null: no default (derived or required) unless `nullable`
  bool nullable = false;     // null is a value: "not set"
  std::optional<double> min, max;
  // kInt: the field's own type limits; a min/max at them is not shown as a bound.
  double type_min = -std::numeric_limits<double>::infinity();
  double type_max = std::numeric_limits<double>::infinity();
  bool min_exclusive = false;
  bool max_exclusive = false;
  std::vector<std::string> choices;  // kString: allowed values (canonical spelling)
  bool case_insensitive = false;
  std::string expected_override;     // replaces the generated "expected ..." text
  std::function<bool(double)> also_ok;  // kNumber: an extra check after the range
  std::vector<std::string> extra_bad;   // JSON texts failing `also_ok`, for the tests
  std::string default_doc;  // shown instead of default_value in the reference
  bool default_depends = false;  // the default is resolved from other keys after parsing
  std::vector<std::string> not_implemented;  // DeepSpeed values zero refuses, named in the error
  std::string doc;
  std::vector<std::string> only_for;  // scheduler types reading this key; empty: always
  std::function<void(Config&, const Json&)> set;
  std::function<Json(const Config&)> get;

  Key& Range(double lo, double hi) { min = lo; max = hi; return *this; }
  Key& AtLeast(double lo) { min = lo; min_exclusive = false; return *this; }
  Key& Above(double lo) { min = lo; min_exclusive = true; return *this; }
  Key& Below(double hi) { max = hi; max_exclusive = true; return *this; }
  Key& AtMost(double hi) { max = hi; max_exclusive = false; return *this; }
  Key& Choices(std::vector<std::string> c) { choices = std::move(c); return *this; }
  Key& CaseInsensitive() { case_insensitive = true; return *this; }
  Key& Nullable() { nullable = true; return *this; }
  Key& NoDefault(std::string text) { default_value = Json(); default_doc = std::move(text); return *this; }
  Key& DefaultDoc(std::string text) { default_doc = std::move(text); return *this; }
  Key& DependsOn(std::string text) { default_doc = std::move(text); default_depends = true; return *this; }
  Key& NotImplemented(std::vector<std::string> v) { not_implemented = std::move(v); return *this; }
  Key& OnlyFor(std::vector<std::string> types) { only_for = std::move(types); return *this; }
  Key& Doc(std::string text) { doc = std::move(text); return *this; }
};

// FIELD(zero.stage) is a function returning a reference to that Config member.
#define FIELD(member) (+[](Config& c) -> auto& { return c.member; })

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

const char* const kWarmupLR = "WarmupLR";
const char* const kWarmupDecayLR = "WarmupDecayLR";
const char* const kWarmupCosineLR = "WarmupCosineLR";

std::vector<Key> BuildKeys() {
  std::vector<Key> t;

  // Batch arithmetic: any two derive the third (see ResolveBatch).
  t.push_back(IntKey("train_batch_size", FIELD(train_batch_size), 0)
                  .AtMost(kMaxCount)
                  .AtLeast(1)
                  .NoDefault("derived")
                  .Doc("Samples per optimizer step over all ranks: train_micro_batch_size_per_gpu x "
                       "gradient_accumulation_steps x world size."));
  t.push_back(IntKey("train_micro_batch_size_per_gpu", FIELD(train_micro_batch_size_per_gpu), 0)
                  .AtMost(kMaxInt)
                  .AtLeast(1)
                  .NoDefault("derived")
                  .Doc("Samples per rank in one forward/backward (one micro step)."));
  t.push_back(IntKey("gradient_accumulation_steps", FIELD(gradient_accumulation_steps), 0)
                  .AtMost(kMaxInt)
                  .AtLeast(1)
                  .NoDefault("derived")
                  .Doc("Micro steps per optimizer step in managed accumulation; backward divides "
                       "gradients by it."));
  t.push_back(NumberKey("gradient_clipping", FIELD(gradient_clipping), 1.0)
                  .AtMost(kMaxReal)
                  .AtLeast(0)
                  .Doc("Clip the global gradient norm to this value; 0 turns clipping off."));
  t.push_back(IntKey("steps_per_print", FIELD(steps_per_print), 10)
                  .AtMost(kMaxCount)
                  .AtLeast(1)
                  .Doc("Log progress every this many optimizer steps."));
  t.push_back(BoolKey("wall_clock_breakdown", FIELD(wall_clock_breakdown), false)
                  .Doc("The engine times forward, backward, step, communication and offload (synchronizing the "
                       "device at each phase boundary) and rank 0 prints their means per step every "
                       "steps_per_print steps (docs/timeline.md)."));
  t.push_back(BoolKey("zero_trace.enabled", FIELD(zero_trace.enabled), false)
                  .Doc("Write a Chrome trace (chrome://tracing, Perfetto) of optimizer steps first_step..last_step: "
                       "one track per stream (compute, communication, host->device, device->host, CPU optimizer, "
                       "I/O; docs/timeline.md)."));
  t.push_back(StringKey("zero_trace.path", FIELD(zero_trace.path), "zero_trace.json")
                  .Doc("The trace file of rank 0 (rank r writes <path>.rank<r>), written atomically after "
                       "last_step; its directory must exist."));
  t.push_back(IntKey("zero_trace.first_step", FIELD(zero_trace.first_step), 2)
                  .AtMost(kMaxCount)
                  .AtLeast(1)
                  .Doc("The first traced optimizer step of the run (from 1; the first step warms up)."));
  t.push_back(IntKey("zero_trace.last_step", FIELD(zero_trace.last_step), 4)
                  .AtMost(kMaxCount)
                  .AtLeast(1)
                  .Doc("The last traced optimizer step (>= first_step)."));
  t.push_back(StringKey("gradient_allreduce_op", FIELD(gradient_allreduce_op), "mean")
                  .Choices({"mean", "sum"})
                  .Doc("How gradients are combined across data-parallel ranks."));
  t.push_back(BoolKey("prescale_gradients", FIELD(prescale_gradients), false)
                  .Doc("Divide gradients by the world size before the reduction instead of after."));
  t.push_back(NumberKey("gradient_predivide_factor", FIELD(gradient_predivide_factor), 1.0)
                  .AtMost(kMaxReal)
                  .Above(0)
                  .Doc("Divide gradients by this factor before the reduction and by world size / "
                       "factor after it."));
  t.push_back(DTypeKey("communication_data_type", FIELD(communication_data_type),
                       FIELD(has_communication_data_type))
                  .DefaultDoc("null (the gradient dtype)")
                  .Doc("Element type of gradient reductions; null: the gradients' own type."));
  t.push_back(BoolKey("managed_gradient_accumulation", FIELD(managed_gradient_accumulation), true)
                  .Doc("true: the engine counts micro steps and steps every gradient_accumulation_steps; "
                       "false: the user calls backward any number of times and steps when they choose."));
  t.push_back(BoolKey("freeze_inactive_parameters", FIELD(freeze_inactive_parameters), false)
                  .Doc("A parameter that received no gradient on any rank in an accumulation window: false "
                       "(DeepSpeed's behaviour) steps it with a zero gradient (its moments decay; weight decay and "
                       "momentum move it); true keeps its weights and AdamW moments unchanged (PyTorch's "
                       "set_to_none behaviour). The same in managed and unmanaged mode."));
  t.push_back(BoolKey("stop_on_nonfinite", FIELD(stop_on_nonfinite), true)
                  .Doc("A NaN or inf global gradient norm on a step that would be applied (fp16's overflow steps are "
                       "skipped as before) ends Step() with an error naming the step. With gradient_clipping or fp16 "
                       "the norm is known before the update and nothing is changed; otherwise the step was applied "
                       "and the engine is unusable. false: DeepSpeed's behaviour (the step is applied and training "
                       "goes on). examples/zero_train also stops on a NaN or inf loss."));
  t.push_back(DTypeKey("data_types.grad_accum_dtype", FIELD(grad_accum_dtype), FIELD(has_grad_accum_dtype))
                  .DefaultDoc("null (fp32)")
                  .Doc("Element type gradients are accumulated in across micro steps; null: fp32."));

  // fp16 and bf16.
  t.push_back(BoolKey("fp16.enabled", FIELD(fp16.enabled), false)
                  .Doc("Train with fp16 parameters and gradients, fp32 master weights and loss scaling."));
  t.push_back(NumberKey("fp16.loss_scale", FIELD(fp16.loss_scale), 0.0)
                  .AtMost(kMaxReal)
                  .AtLeast(0)
                  .Doc("Static loss scale; 0 selects dynamic loss scaling."));
  t.push_back(IntKey("fp16.initial_scale_power", FIELD(fp16.initial_scale_power), 16)
                  .Range(0, 127)
                  .Doc("Dynamic scaling starts at 2^initial_scale_power."));
  t.push_back(IntKey("fp16.loss_scale_window", FIELD(fp16.loss_scale_window), 1000)
                  .AtLeast(1)
                  .Doc("Steps without overflow after which the dynamic scale doubles."));
  t.push_back(IntKey("fp16.hysteresis", FIELD(fp16.hysteresis), 2)
                  .AtLeast(1)
                  .Doc("Overflows tolerated before the dynamic scale is halved (delayed shift)."));
  t.push_back(BoolKey("fp16.consecutive_hysteresis", FIELD(fp16.consecutive_hysteresis), false)
                  .Doc("Refill the hysteresis after every step without overflow, not only when the scale "
                       "grows."));
  t.push_back(NumberKey("fp16.min_loss_scale", FIELD(fp16.min_loss_scale), 1.0)
                  .AtMost(kMaxReal)
                  .Above(0)
                  .Doc("The dynamic scale never goes below this."));
  t.push_back(BoolKey("bf16.enabled", FIELD(bf16_enabled), false)
                  .Doc("Train with bf16 parameters and gradients and fp32 master weights (no loss "
                       "scaling). The block may also be spelled \"bfloat16\"."));

  // Optimizer.
  t.push_back(StringKey("optimizer.type", FIELD(optimizer.type), "AdamW")
                  .Choices({"Adam", "AdamW"})
                  .CaseInsensitive()
                  .NotImplemented({"Lamb", "OneBitAdam", "ZeroOneAdam", "OneBitLamb", "Adagrad", "Lion",
                                   "MuAdam", "MuAdamW", "MuSGD", "SGD", "FusedAdam", "DeepSpeedCPUAdam"})
                  .Doc("\"AdamW\", or \"Adam\": decoupled weight decay (AdamW) unless "
                       "optimizer.params.adam_w_mode is false."));
  t.push_back(NumberKey("optimizer.params.lr", FIELD(optimizer.lr), 1e-3)
                  .AtMost(kMaxReal)
                  .AtLeast(0)
                  .Doc("Learning rate (the base the scheduler scales)."));
  t.push_back(BetasKey("optimizer.params.betas")
                  .Doc("[beta1, beta2]: decay rates of the first and second moment estimates."));
  t.push_back(NumberKey("optimizer.params.eps", FIELD(optimizer.eps), 1e-8)
                  .Range(kMinEps, kMaxReal)
                  .Doc("Added to the denominator for numerical stability."));
  t.push_back(NumberKey("optimizer.params.weight_decay", FIELD(optimizer.weight_decay), 0.0)
                  .AtMost(kMaxReal)
                  .AtLeast(0)
                  .Doc("Weight decay: decoupled (AdamW) or added to the gradient as L2 (classic Adam). 0 for "
                       "both types, as DeepSpeed's FusedAdam (torch.optim.AdamW's 0.01 applies in DeepSpeed only "
                       "with torch_adam: true)."));
  t.push_back(BoolKey("optimizer.params.adam_w_mode", FIELD(optimizer.adam_w_mode), true)
                  .Doc("With type \"Adam\": false selects classic Adam (L2 weight decay in the "
                       "gradient)."));

  // Scheduler.
  t.push_back(StringKey("scheduler.type", FIELD(scheduler.type), "")
                  .Choices({"", kWarmupLR, kWarmupDecayLR, kWarmupCosineLR})
                  .NotImplemented({"OneCycle", "LRRangeTest"})
                  .DefaultDoc("\"\" (constant lr)")
                  .Doc("Learning-rate schedule; \"\" or no scheduler block keeps optimizer.params.lr."));
  t.push_back(NumberKey("scheduler.params.warmup_min_lr", FIELD(scheduler.warmup_min_lr), 0.0)
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
    t.push_back(std::move(k));
  }
  t.push_back(IntKey("scheduler.params.warmup_num_steps", FIELD(scheduler.warmup_num_steps), 1000)
                  .AtMost(kMaxCount)
                  .AtLeast(1)
                  .OnlyFor({kWarmupLR, kWarmupDecayLR, kWarmupCosineLR})
                  .Doc("Optimizer steps of warmup (values below 2 act as 2, as in DeepSpeed)."));
  t.push_back(StringKey("scheduler.params.warmup_type", FIELD(scheduler.warmup_type), "log")
                  .Choices({"log", "linear"})
                  .OnlyFor({kWarmupLR, kWarmupDecayLR, kWarmupCosineLR})
                  .Doc("Warmup curve: log(step + 1) / log(warmup_num_steps), or step / warmup_num_steps."));
  t.push_back(IntKey("scheduler.params.total_num_steps", FIELD(scheduler.total_num_steps), 0)
                  .AtMost(kMaxCount)
                  .AtLeast(1)
                  .NoDefault("required")
                  .OnlyFor({kWarmupDecayLR, kWarmupCosineLR})
                  .Doc("Optimizer steps of the whole run; the decay ends here."));
  t.push_back(NumberKey("scheduler.params.warmup_min_ratio", FIELD(scheduler.warmup_min_ratio), 0.0)
                  .Range(0, 1)
                  .OnlyFor({kWarmupCosineLR})
                  .Doc("Warmup starts at this fraction of optimizer.params.lr."));
  t.push_back(NumberKey("scheduler.params.cos_min_ratio", FIELD(scheduler.cos_min_ratio), 1e-4)
                  .Range(0, 1)
                  .OnlyFor({kWarmupCosineLR})
                  .Doc("The cosine decay ends at this fraction of optimizer.params.lr."));

  // ZeRO.
  t.push_back(IntKey("zero_optimization.stage", FIELD(zero.stage), 0)
                  .Range(0, 3)
                  .Doc("0: plain data parallelism; 1: optimizer states partitioned; 2: + gradients; "
                       "3: + parameters."));
  t.push_back(BoolKey("zero_optimization.contiguous_gradients", FIELD(zero.contiguous_gradients), true)
                  .Doc("Pack gradients into contiguous bucket buffers, one collective per bucket; false: one "
                       "collective per parameter straight from its gradient buffer (no copy, no bucket memory)."));
  t.push_back(BoolKey("zero_optimization.reduce_scatter", FIELD(zero.reduce_scatter), true)
                  .Doc("Reduce gradients with reduce-scatter (stages 1-3); false: all-reduce and keep the own shard "
                       "(same values, more traffic)."));
  t.push_back(IntKey("zero_optimization.reduce_bucket_size", FIELD(zero.reduce_bucket_size), 500000000)
                  .AtMost(kMaxCount)
                  .AtLeast(1)
                  .Doc("Elements reduced at once (gradient bucket)."));
  t.push_back(IntKey("zero_optimization.allgather_bucket_size", FIELD(zero.allgather_bucket_size), 500000000)
                  .AtMost(kMaxCount)
                  .AtLeast(1)
                  .Doc("Gathered elements per all-gather of updated weights (stages 1/2); a larger parameter is "
                       "gathered alone."));
  t.push_back(BoolKey("zero_optimization.overlap_comm", FIELD(zero.overlap_comm), false)
                  .DependsOn("true at stage 3, false otherwise")
                  .Doc("Reduce gradient buckets on a communication stream, overlapped with backward."));
  t.push_back(IntKey("zero_optimization.sub_group_size", FIELD(zero.sub_group_size), 1000000000)
                  .AtMost(kMaxCount)
                  .AtLeast(1)
                  .Doc("Elements per optimizer sub-group (the unit of the optimizer step and of NVMe "
                       "swapping)."));
  t.push_back(IntKey("zero_optimization.stage3_prefetch_bucket_size",
                     FIELD(zero.stage3_prefetch_bucket_size), 50000000)
                  .AtMost(kMaxCount)
                  .AtLeast(0)
                  .Doc("Stage 3: elements of parameters fetched ahead of use."));
  t.push_back(IntKey("zero_optimization.stage3_param_persistence_threshold",
                     FIELD(zero.stage3_param_persistence_threshold), 100000)
                  .AtMost(kMaxCount)
                  .AtLeast(0)
                  .Doc("Stage 3: parameters with fewer elements stay gathered."));
  t.push_back(IntKey("zero_optimization.stage3_max_live_parameters",
                     FIELD(zero.stage3_max_live_parameters), 1000000000)
                  .AtMost(kMaxCount)
                  .AtLeast(0)
                  .Doc("Stage 3: most elements kept gathered at once."));
  t.push_back(IntKey("zero_optimization.stage3_max_reuse_distance",
                     FIELD(zero.stage3_max_reuse_distance), 1000000000)
                  .AtMost(kMaxCount)
                  .AtLeast(0)
                  .Doc("Stage 3: a parameter reused within this many elements is not released."));
  t.push_back(BoolKey("zero_optimization.stage3_gather_16bit_weights_on_model_save",
                      FIELD(zero.stage3_gather_16bit_weights_on_model_save), false)
                  .Doc("Stage 3: gather full 16-bit weights when the model is saved."));
  t.push_back(BoolKey("zero_optimization.round_robin_gradients", FIELD(zero.round_robin_gradients), false)
                  .Doc("Stages 1/2 with offload: spread gradient copies across ranks round-robin."));
  t.push_back(BoolKey("zero_optimization.ignore_unused_parameters", FIELD(zero.ignore_unused_parameters), true)
                  .Doc("Stage 2/3: parameters that get no gradient are not an error."));
  t.push_back(StringKey("zero_optimization.offload_grad_accumulation", FIELD(zero.offload_grad_accumulation),
                        "cpu")
                  .Choices({"cpu", "gpu"})
                  .Doc("With both offloads (optimizer and parameters, so stage 3): sum micro-step gradients on "
                       "the host (\"cpu\") or in FP32 on the GPU, crossing PCIe once per step (\"gpu\")."));

  t.push_back(DeviceKey("zero_optimization.offload_optimizer.device", FIELD(zero.offload_optimizer.device))
                  .Doc("Where FP32 master weights and optimizer states live: GPU (\"none\"), host "
                       "memory, or NVMe."));
  t.push_back(StringKey("zero_optimization.offload_optimizer.nvme_path",
                        FIELD(zero.offload_optimizer.nvme_path), "")
                  .Doc("Directory for the swap files when device is \"nvme\"."));
  t.push_back(IntKey("zero_optimization.offload_optimizer.buffer_count",
                     FIELD(zero.offload_optimizer.buffer_count), 4)
                  .AtMost(kMaxInt)
                  .AtLeast(1)
                  .Doc("Pinned buffers for NVMe swapping of optimizer states."));
  t.push_back(BoolKey("zero_optimization.offload_optimizer.pin_memory",
                      FIELD(zero.offload_optimizer.pin_memory), false)
                  .Doc("Keep offloaded states in pinned (page-locked) host memory."));
  t.push_back(BoolKey("zero_optimization.offload_optimizer.pipeline_read",
                      FIELD(zero.offload_optimizer.pipeline_read), false)
                  .Doc("NVMe: overlap reading the next sub-group with the step."));
  t.push_back(BoolKey("zero_optimization.offload_optimizer.pipeline_write",
                      FIELD(zero.offload_optimizer.pipeline_write), false)
                  .Doc("NVMe: overlap writing the previous sub-group with the step."));
  t.push_back(BoolKey("zero_optimization.offload_optimizer.fast_init", FIELD(zero.offload_optimizer.fast_init),
                      false)
                  .Doc("NVMe: skip writing initial optimizer states through the swapper."));
  t.push_back(NumberKey("zero_optimization.offload_optimizer.ratio", FIELD(zero.offload_optimizer.ratio), 1.0)
                  .Range(0, 1)
                  .Above(0)
                  .Doc("Stage 3: fraction of the optimizer step offloaded to the CPU."));
  t.push_back(IntKey("zero_optimization.offload_optimizer.cpu_threads",
                     FIELD(zero.offload_optimizer.cpu_threads), 0)
                  .AtMost(1024)
                  .AtLeast(0)
                  .DefaultDoc("`0` (the hardware threads)")
                  .Doc("Threads of the CPU AdamW that updates offloaded states (device \"cpu\" or \"nvme\"), the "
                       "calling thread included; 0: std::thread::hardware_concurrency(). Per rank: with several "
                       "ranks on a host, give each its share of the cores. The result does not depend on it."));
  t.push_back(BoolKey("zero_optimization.offload_optimizer.pin_memory_fallback",
                      FIELD(zero.offload_optimizer.pin_memory_fallback), false)
                  .Doc("With pin_memory true: when pinning the offloaded states fails (RLIMIT_MEMLOCK, the CUDA "
                       "host allocator), keep them in pageable memory and print one warning instead of failing "
                       "create. Pageable copies are slower and do not overlap."));
  t.push_back(IntKey("zero_optimization.offload_optimizer.host_memory_budget",
                     FIELD(zero.offload_optimizer.host_memory_budget), 0)
                  .AtMost(kMaxCount)
                  .AtLeast(0)
                  .DefaultDoc("`0` (all states on NVMe)")
                  .Doc("Tiered state, device \"nvme\" only: bytes of this rank's optimizer state (FP32 master "
                       "weights and both moments, 12 bytes per element) kept in pinned host memory; the rest is "
                       "swapped to nvme_path. The swap buffers are not part of it. 0: every state on NVMe "
                       "(DeepSpeed's behaviour); a budget that holds the whole state keeps all of it in host memory. "
                       "Per rank: ranks on one host each pin this much."));
  t.push_back(StringKey("zero_optimization.offload_optimizer.update_device",
                        FIELD(zero.offload_optimizer.update_device), "cpu")
                  .Choices({"cpu", "gpu"})
                  .Doc("Device \"cpu\" only: where AdamW over the offloaded states runs. \"cpu\": the CPU AdamW "
                       "on the host. \"gpu\": the FP32 master weights and moments stay in pinned host memory and "
                       "are streamed through the GPU in chunks (host->device copy of one chunk, AdamW of the "
                       "previous and device->host copy of the one before at once): 12 bytes per element each way "
                       "over PCIe per step, chunk_buffers * chunk_size * 12 bytes of GPU memory. The same bits as "
                       "no offload."));
  t.push_back(IntKey("zero_optimization.offload_optimizer.chunk_size",
                     FIELD(zero.offload_optimizer.chunk_size), int64_t{1} << 24)
                  .AtMost(kMaxCount)
                  .AtLeast(1)
                  .Doc("update_device \"gpu\": elements per streamed chunk (each of the three states). The "
                       "result does not depend on it."));
  t.push_back(IntKey("zero_optimization.offload_optimizer.chunk_buffers",
                     FIELD(zero.offload_optimizer.chunk_buffers), 3)
                  .AtMost(1024)
                  .AtLeast(2)
                  .Doc("update_device \"gpu\": GPU staging sets the chunks rotate through (2: upload and "
                       "update overlap; 3: the download overlaps too)."));
  t.push_back(BoolKey("zero_optimization.offload_optimizer.overlap_step",
                      FIELD(zero.offload_optimizer.overlap_step), false)
                  .Doc("update_device \"gpu\" only: overlap the streamed update with the next forward. Step() "
                       "queues the first chunk_buffers chunks and returns; the rest are queued as the next "
                       "forward's GatherModule reaches the modules that own them (plus chunk_buffers chunks "
                       "ahead), and each GatherModule makes the compute stream wait only for the chunks holding "
                       "its parameters. At stages 0-2 the forward must then reach every parameter through "
                       "GatherModule (param() of a parameter whose module was not gathered since the step is "
                       "an error). Everything left is queued before the next backward's first gradient; "
                       "Engine::WaitForOptimizerStep() completes the step. One data-parallel rank, no "
                       "offload_param. The same bits as the synchronous step."));

  t.push_back(DeviceKey("zero_optimization.offload_param.device", FIELD(zero.offload_param.device))
                  .Doc("Stage 3: where partitioned 16-bit parameters live between uses."));
  t.push_back(StringKey("zero_optimization.offload_param.nvme_path", FIELD(zero.offload_param.nvme_path), "")
                  .Doc("Directory for the swap files when device is \"nvme\"."));
  t.push_back(IntKey("zero_optimization.offload_param.buffer_count", FIELD(zero.offload_param.buffer_count), 5)
                  .AtMost(kMaxInt)
                  .AtLeast(1)
                  .Doc("device \"cpu\": the most stage-3 gathers whose shard uploads are in flight at once (docs/offload.md)."));
  t.push_back(IntKey("zero_optimization.offload_param.buffer_size", FIELD(zero.offload_param.buffer_size),
                     100000000)
                  .AtMost(kMaxCount)
                  .AtLeast(1)
                  .Doc("device \"cpu\": the largest shard (elements) of one parameter; a larger one is an Initialize error."));
  t.push_back(IntKey("zero_optimization.offload_param.max_in_cpu", FIELD(zero.offload_param.max_in_cpu),
                     1000000000)
                  .AtMost(kMaxCount)
                  .AtLeast(0)
                  .Doc("Elements of parameters kept in host memory when device is \"nvme\"."));
  t.push_back(BoolKey("zero_optimization.offload_param.pin_memory", FIELD(zero.offload_param.pin_memory), false)
                  .Doc("Keep offloaded parameters in pinned host memory."));
  t.push_back(BoolKey("zero_optimization.offload_param.pin_memory_fallback",
                      FIELD(zero.offload_param.pin_memory_fallback), false)
                  .Doc("With pin_memory true: when pinning the offloaded parameters fails, keep them in pageable "
                       "memory and print one warning instead of failing create."));

  // Asynchronous I/O for NVMe.
  t.push_back(IntKey("aio.block_size", FIELD(aio.block_size), 1048576)
                  .AtMost(1 << 30)
                  .AtLeast(1)
                  .Doc("Bytes per I/O request."));
  t.push_back(IntKey("aio.queue_depth", FIELD(aio.queue_depth), 8)
                  .AtMost(65536)
                  .AtLeast(1)
                  .Doc("Requests in flight per I/O thread."));
  t.push_back(IntKey("aio.intra_op_parallelism", FIELD(aio.intra_op_parallelism), 1)
                  .AtMost(1024)
                  .AtLeast(1)
                  .Doc("I/O threads per read or write (older name: thread_count)."));
  t.push_back(BoolKey("aio.single_submit", FIELD(aio.single_submit), false)
                  .Doc("Submit requests one at a time rather than in batches."));
  t.push_back(BoolKey("aio.overlap_events", FIELD(aio.overlap_events), true)
                  .Doc("Submit new requests while waiting for completions."));
  t.push_back(BoolKey("aio.use_gds", FIELD(aio.use_gds), false)
                  .Doc("Use GPUDirect Storage."));
  t.push_back(BoolKey("aio.allow_buffered_fallback", FIELD(aio.allow_buffered_fallback), false)
                  .Doc("When nvme_path's filesystem refuses O_DIRECT (tmpfs, some FUSE and network filesystems): "
                       "false fails create naming the filesystem; true swaps through the page cache instead "
                       "(costs host memory, no overlap: for tests and small runs)."));
  return t;
}

#undef FIELD

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

// Other spellings of keys and blocks. Each maps to its canonical path with a warning.
struct Alias {
  const char* path;
  const char* canonical;
  const char* note;
};
const Alias kAliases[] = {
    {"bfloat16", "bf16", "the older name of the 'bf16' block"},
    {"aio.thread_count", "aio.intra_op_parallelism", "the older name of 'aio.intra_op_parallelism'"},
    {"zero_optimization.stage3_gather_fp16_weights_on_model_save",
     "zero_optimization.stage3_gather_16bit_weights_on_model_save",
     "deprecated; use 'zero_optimization.stage3_gather_16bit_weights_on_model_save'"},
};

// Deprecated booleans that map onto the offload blocks (handled in ApplyDeprecatedOffload).
struct Deprecated {
  const char* path;
  const char* doc;
};
const Deprecated kDeprecated[] = {
    {"zero_optimization.cpu_offload",
     "true: zero_optimization.offload_optimizer.device = \"cpu\""},
    {"zero_optimization.cpu_offload_param", "true: zero_optimization.offload_param.device = \"cpu\""},
    {"zero_optimization.cpu_offload_use_pin_memory",
     "sets pin_memory of the offload blocks turned on by cpu_offload / cpu_offload_param"},
};

// DeepSpeed keys and blocks zero knows and does not act on: a warning, never an error.
struct Ignored {
  const char* path;
  const char* why;
};
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

// Where zero's defaults or readings are not DeepSpeed 0.19.8's (checked against its sources:
// runtime/constants.py, runtime/zero/config.py, runtime/zero/offload_config.py, precision_config.py,
// swap_tensor/aio config, lr_schedules.py, ops/adam/fused_adam.py). config_test asserts every key's
// default against DeepSpeed's and that each difference in a default is listed here.
const std::vector<ConfigDifference>& Differences() {
  static const std::vector<ConfigDifference>* d = new std::vector<ConfigDifference>{
      {"steps_per_print", "`null` (no periodic progress line)", "`10`",
       "The engine prints only the wall_clock_breakdown line itself, every steps_per_print steps; the key also "
       "sets how often examples/zero_train prints progress, and an integer keeps it simple. `null` is refused."},
      {"zero_trace.enabled", "no such key (DeepSpeed's timeline is the PyTorch profiler's)", "`false`",
       "zero's own key: the engine writes a Chrome trace of the chosen steps (docs/timeline.md)."},
      {"zero_trace.path", "no such key", "`\"zero_trace.json\"`", "zero's own key: where zero_trace writes."},
      {"zero_trace.first_step", "no such key", "`2`", "zero's own key: the first traced step (the first warms up)."},
      {"zero_trace.last_step", "no such key", "`4`", "zero's own key: the last traced step."},
      {"optimizer.type", "none: without an optimizer block the client passes its own optimizer",
       "`\"AdamW\"`",
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
      {"freeze_inactive_parameters", "no such key (inactive parameters are stepped with a zero gradient)",
       "`false`", "zero's own key; its default is DeepSpeed's behaviour."},
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
      {"zero_optimization.offload_optimizer.overlap_step", "no such key (the step completes inside step())",
       "`false`",
       "zero's own key (update_device \"gpu\"): the streamed update runs under the next forward."},
      {"aio.allow_buffered_fallback", "no such key (O_DIRECT is required)", "`false`",
       "zero's own key; its default is DeepSpeed's behaviour (a filesystem without O_DIRECT is an error)."},
      {"`zero_optimization.reduce_bucket_size`, `allgather_bucket_size`, `sub_group_size`, the offload blocks' "
       "`buffer_count` and `offload_param.buffer_size` (accepted values)",
       "0 accepted", "at least 1", "A bucket or buffer of 0 elements cannot hold anything; zero refuses it "
       "when the file is read rather than failing later."},
      {"`fp16.min_loss_scale` (accepted values)", "an integer", "any number > 0",
       "A fraction (0.25) is accepted: it only bounds the dynamic scale from below."},
  };
  return *d;
}

const char* const kAutoNote =
    " (\"auto\" is a Hugging Face Trainer placeholder: the Trainer replaces it with a number before "
    "DeepSpeed reads the config; replace it with the value you want)";

// ---------------------------------------------------------------------------------------------
// Helpers.

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string Quote(const std::string& s) { return "\"" + s + "\""; }

std::string ShowValue(const Json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

std::string FormatNumber(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.0f", v);
    return buf;
  }
  return Json(v).dump();
}

std::string Join(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += items[i];
  }
  return out;
}

std::string ChoicesText(const std::vector<std::string>& choices) {
  std::vector<std::string> q;
  for (const std::string& c : choices) q.push_back(Quote(c));
  return Join(q, ", ");
}

bool IsIntType(const Key& k) { return k.kind == Kind::kInt; }

std::string RangeText(const Key& k) {
  const bool is_int = IsIntType(k);
  const bool has_min = k.min && *k.min > k.type_min;
  const bool has_max = k.max && *k.max < k.type_max;
  // Integer bounds in full (2^53 - 1, not 9.007e+15).
  auto show = [&](double v) { return is_int ? std::to_string(static_cast<int64_t>(v)) : FormatNumber(v); };
  if (has_min && has_max) {
    if (is_int) return " in " + show(*k.min) + ".." + show(*k.max);
    return std::string(" in ") + (k.min_exclusive ? "(" : "[") + show(*k.min) + ", " + show(*k.max) +
           (k.max_exclusive ? ")" : "]");
  }
  if (has_min) return (k.min_exclusive ? " > " : " >= ") + show(*k.min);
  if (has_max) return (k.max_exclusive ? " < " : " <= ") + show(*k.max);
  return "";
}

std::string Expected(const Key& k) {
  if (!k.expected_override.empty()) return k.expected_override;
  switch (k.kind) {
    case Kind::kBool: return "true or false";
    case Kind::kInt: return "an integer" + RangeText(k);
    case Kind::kNumber: return "a number" + RangeText(k);
    case Kind::kString:
      if (k.choices.empty()) return "a string";
      return "one of " + ChoicesText(k.choices) + (k.case_insensitive ? " (any case)" : "");
    case Kind::kDType: return "one of \"fp32\", \"fp16\", \"bf16\", or null";
    case Kind::kBetas: return "[beta1, beta2] with each in [0, 1)";
  }
  return "?";
}

std::string TypeName(const Key& k) {
  switch (k.kind) {
    case Kind::kBool: return "boolean";
    case Kind::kInt: return "integer";
    case Kind::kNumber: return "number";
    case Kind::kString: return "string";
    case Kind::kDType: return "dtype or null";
    case Kind::kBetas: return "[number, number]";
  }
  return "?";
}

// "<source>: ", or nothing for an empty source (a Config built in code, checked by Engine::Create).
std::string Where(const std::string& source) { return source.empty() ? "" : source + ": "; }

Status KeyError(const std::string& source, const std::string& path, const std::string& expected,
                const std::string& got) {
  return InvalidArgumentError(Where(source) + path + ": expected " + expected + ", got " + got);
}

bool InRange(const Key& k, double v) {
  if (k.min && (k.min_exclusive ? v <= *k.min : v < *k.min)) return false;
  if (k.max && (k.max_exclusive ? v >= *k.max : v > *k.max)) return false;
  if (k.also_ok && !k.also_ok(v)) return false;
  return true;
}

// Checks `v` against the key and returns its canonical form in *out.
Status ReadValue(const Key& k, const Json& v, const std::string& user_path, const std::string& source,
                 Json* out) {
  auto fail = [&](std::string extra = "") {
    return KeyError(source, user_path, Expected(k), ShowValue(v) + extra);
  };
  if (v.is_string() && v.get<std::string>() == "auto") return fail(kAutoNote);
  if (v.is_null() && k.nullable) {
    *out = Json();
    return OkStatus();
  }
  switch (k.kind) {
    case Kind::kBool:
      if (!v.is_boolean()) return fail();
      *out = v;
      return OkStatus();
    case Kind::kInt: {
      int64_t i = 0;
      if (v.is_number_unsigned()) {
        if (v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return fail();
        i = static_cast<int64_t>(v.get<uint64_t>());
      } else if (v.is_number_integer()) {
        i = v.get<int64_t>();
      } else if (v.is_number_float()) {
        // 5e8 and 1000.0 are integers written as floats: accepted when integral.
        const double d = v.get<double>();
        if (!std::isfinite(d) || d != std::floor(d) || d < -9.2e18 || d > 9.2e18) return fail();
        i = static_cast<int64_t>(d);
      } else {
        return fail();
      }
      if (!InRange(k, static_cast<double>(i))) return fail();
      *out = i;
      return OkStatus();
    }
    case Kind::kNumber: {
      if (!v.is_number()) return fail();
      const double d = v.get<double>();
      if (!std::isfinite(d) || !InRange(k, d)) return fail();
      *out = d;
      return OkStatus();
    }
    case Kind::kString: {
      if (!v.is_string()) return fail();
      const std::string s = v.get<std::string>();
      if (k.choices.empty()) {
        *out = s;
        return OkStatus();
      }
      for (const std::string& c : k.choices) {
        if (s == c || (k.case_insensitive && Lower(s) == Lower(c))) {
          *out = c;
          return OkStatus();
        }
      }
      for (const std::string& n : k.not_implemented) {
        if (Lower(s) == Lower(n)) return fail(" (a DeepSpeed choice zero does not implement)");
      }
      return fail();
    }
    case Kind::kDType: {
      DType t;
      if (!v.is_string() || !ParseDType(v.get<std::string>(), &t)) return fail();
      *out = DTypeName(t);
      return OkStatus();
    }
    case Kind::kBetas: {
      if (!v.is_array() || v.size() != 2) return fail();
      for (const Json& b : v) {
        if (!b.is_number() || !(b.get<double>() >= 0.0 && b.get<double>() < 1.0)) return fail();
      }
      *out = Json::array({v[0].get<double>(), v[1].get<double>()});
      return OkStatus();
    }
  }
  return fail();
}

std::string LastComponent(const std::string& path) {
  const size_t dot = path.rfind('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}

std::string ParentOf(const std::string& path) {
  const size_t dot = path.rfind('.');
  return dot == std::string::npos ? "" : path.substr(0, dot);
}

// Every name zero knows directly under each block ("" = top level), in table order. Built once:
// an unknown key's suggestion must not rebuild it (a file of 200k unknown keys asks 200k times).
const std::map<std::string, std::vector<std::string>>& NamesByBlock() {
  static const auto* names = [] {
    auto* out = new std::map<std::string, std::vector<std::string>>();
    std::vector<std::string> all;
    for (const Key& k : Keys()) all.push_back(k.path);
    for (const Alias& a : kAliases) all.push_back(a.path);
    for (const Deprecated& d : kDeprecated) all.push_back(d.path);
    for (const Ignored& i : kIgnored) all.push_back(i.path);
    for (const std::string& p : all) {
      for (size_t start = 0;;) {
        const size_t dot = p.find('.', start);
        const std::string parent = start == 0 ? "" : p.substr(0, start - 1);
        const std::string name = p.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
        std::vector<std::string>& v = (*out)[parent];
        if (std::find(v.begin(), v.end(), name) == v.end()) v.push_back(name);
        if (dot == std::string::npos) break;
        start = dot + 1;
      }
    }
    return out;
  }();
  return *names;
}

const std::vector<std::string>& NamesUnder(const std::string& parent) {
  static const std::vector<std::string> kNone;
  const auto it = NamesByBlock().find(parent);
  return it == NamesByBlock().end() ? kNone : it->second;
}

// The known name under `parent` closest to `name` (case-insensitive edit distance), and that
// distance; names further than `limit` are skipped (distance >= length difference, so they are
// not even compared) and give {"", npos}.
std::pair<std::string, size_t> Nearest(const std::string& parent, const std::string& name, size_t limit) {
  std::string best;
  size_t best_d = std::string::npos;
  const std::string lower = Lower(name);
  for (const std::string& n : NamesUnder(parent)) {
    const size_t gap = n.size() > name.size() ? n.size() - name.size() : name.size() - n.size();
    if (gap > limit) continue;
    const size_t d = EditDistance(lower, Lower(n));
    if (d <= limit && d < best_d) {
      best_d = d;
      best = n;
    }
  }
  return {best, best_d};
}

// A block directly under `parent` (not a scalar key) one edit (case aside) from `name`, or "".
// Cheap for the many unknown keys of a hostile file: IsBlock runs only for names one edit away.
std::string NearestBlock(const std::string& parent, const std::string& name) {
  const std::string lower = Lower(name);
  for (const std::string& n : NamesUnder(parent)) {
    const size_t gap = n.size() > name.size() ? n.size() - name.size() : name.size() - n.size();
    if (gap > 1 || EditDistance(lower, Lower(n)) > 1) continue;
    if (IsBlock(parent + "." + n)) return n;
  }
  return "";
}

std::string Suggestion(const std::string& parent, const std::string& name) {
  const size_t limit = std::max<size_t>(1, std::min<size_t>(3, name.size() / 3));
  const auto [best, best_d] = Nearest(parent, name, limit);
  if (!best.empty()) return " (did you mean '" + best + "'?)";
  // The right name in the wrong block: suggest the full path.
  for (const Key& k : Keys()) {
    if (LastComponent(k.path) == name && ParentOf(k.path) != parent) {
      return " (did you mean '" + k.path + "'?)";
    }
  }
  return "";
}

// ---------------------------------------------------------------------------------------------
// Parsing.

// Parsing goes on past a problem so that one error lists them all: a key whose value is refused is
// left at its default and recorded in `bad`, and every later check that reads a bad key (the batch
// arithmetic, the scheduler's parameters, the rules between keys) is skipped rather than reporting a
// consequence of the first problem.
struct ParseState {
  const ParseOptions& options;
  Config config;
  std::map<std::string, std::string> given;  // canonical path -> path as written
  std::map<std::string, bool> deprecated;    // deprecated boolean keys as given
  std::vector<std::string> errors;           // every problem, in file order, then the cross-key checks
  std::set<std::string> bad;                 // canonical paths of keys and blocks with a problem
  int64_t unknown_keys = 0;                  // all of them; only the first kUnknownKeysListed are listed
};

// A file of many unknown keys (a wrong file, a generated one) lists this many and counts the rest,
// so that its message stays readable and its size does not grow with the file.
constexpr int64_t kUnknownKeysListed = 100;

// Records the problem `s` (an error Status) about the key or block `path` ("" for none).
void Problem(ParseState* st, const std::string& path, const Status& s) {
  st->errors.push_back(std::string(s.message()));
  if (!path.empty()) st->bad.insert(path);
}

// Whether `path`, or a block above it, had a problem.
bool IsBad(const std::set<std::string>& bad, const std::string& path) {
  for (std::string p = path;; p = p.substr(0, p.rfind('.'))) {
    if (bad.count(p)) return true;
    if (p.find('.') == std::string::npos) return false;
  }
}

bool AnyBad(const std::set<std::string>& bad, const std::vector<std::string>& paths) {
  for (const std::string& p : paths) {
    if (IsBad(bad, p)) return true;
  }
  return false;
}

const Alias* FindAlias(const std::string& path) {
  for (const Alias& a : kAliases) {
    if (path == a.path) return &a;
  }
  return nullptr;
}

void Walk(const Json& obj, const std::string& canonical_prefix, const std::string& user_prefix,
          ParseState* st) {
  const std::string& source = st->options.source;
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    const std::string& name = it.key();
    const Json& value = it.value();
    const std::string user_path = user_prefix.empty() ? name : user_prefix + "." + name;
    std::string path = canonical_prefix.empty() ? name : canonical_prefix + "." + name;
    if (const Alias* a = FindAlias(path)) {
      st->config.warnings.push_back(source + ": '" + user_path + "' is " + a->note);
      path = a->canonical;
    }
    if (path == "optimizer.params.max_grad_norm") {
      Problem(st, "",
              KeyError(source, user_path,
                       "no value (zero clips by the top-level \"gradient_clipping\"; move the value there)",
                       ShowValue(value)));
      continue;
    }
    if (const Key* k = FindKey(path)) {
      auto prior = st->given.find(path);
      if (prior != st->given.end()) {
        Problem(st, path,
                KeyError(source, user_path, "one spelling of the key", "it also as '" + prior->second + "'"));
        continue;
      }
      st->given[path] = user_path;
      Json canonical;
      const Status read = ReadValue(*k, value, user_path, source, &canonical);
      if (!read.ok()) {
        Problem(st, path, read);
        continue;
      }
      k->set(st->config, canonical);
      continue;
    }
    if (IsBlock(path)) {
      if (value.is_string() && value.get<std::string>() == "auto") {
        Problem(st, path, KeyError(source, user_path, "an object", ShowValue(value) + kAutoNote));
        continue;
      }
      if (!value.is_object()) {
        Problem(st, path, KeyError(source, user_path, "an object", ShowValue(value)));
        continue;
      }
      if (st->given.count(path)) {
        Problem(st, path,
                KeyError(source, user_path, "one spelling of the block", "it also as '" + st->given[path] + "'"));
        continue;
      }
      st->given[path] = user_path;
      Walk(value, path, user_path, st);
      continue;
    }
    bool handled = false;
    for (const Deprecated& d : kDeprecated) {
      if (path != d.path) continue;
      handled = true;
      if (!value.is_boolean()) {
        Problem(st, path, KeyError(source, user_path, "true or false", ShowValue(value)));
        continue;
      }
      st->deprecated[path] = value.get<bool>();
    }
    for (const Ignored& i : kIgnored) {
      if (path != i.path) continue;
      st->config.warnings.push_back(source + ": '" + user_path + "' is ignored: " + i.why);
      handled = true;
    }
    if (handled) continue;
    if (canonical_prefix.empty() && st->options.top_level_typos_are_errors) {
      const std::string near = Nearest("", name, 1).first;
      if (!near.empty()) {
        Problem(st, "",
                InvalidArgumentError(source + ": unknown key '" + user_path + "' (did you mean '" + near +
                                     "'?): a top-level key one edit from a known one is an error, since "
                                     "everything under it would be ignored"));
        continue;
      }
    }
    if (!canonical_prefix.empty() && st->options.nested_block_typos_are_errors) {
      const std::string near = NearestBlock(canonical_prefix, name);
      if (!near.empty()) {
        Problem(st, "",
                InvalidArgumentError(source + ": unknown key '" + user_path + "' (did you mean '" + near +
                                     "'?): a key one edit from a known block is an error, since everything "
                                     "under it would be ignored"));
        continue;
      }
    }
    if (++st->unknown_keys > kUnknownKeysListed) continue;
    const std::string message = source + ": unknown key '" + user_path + "'" + Suggestion(canonical_prefix, name);
    if (st->options.strict) {
      st->errors.push_back(message);
    } else {
      st->config.warnings.push_back(message);
    }
  }
}

bool Given(const ParseState& st, const std::string& path) { return st.given.count(path) > 0; }

bool AnyGivenUnder(const ParseState& st, const std::string& block) {
  const std::string prefix = block + ".";
  for (const auto& [path, user] : st.given) {
    if (path.compare(0, prefix.size(), prefix) == 0) return true;
  }
  return false;
}

void ApplyDeprecatedOffload(ParseState* st) {
  const std::string& source = st->options.source;
  Config& c = st->config;
  struct Mapping {
    const char* old_key;
    const char* block;
    OffloadDevice* device;
    bool* pin_memory;
  };
  const Mapping mappings[] = {
      {"zero_optimization.cpu_offload", "zero_optimization.offload_optimizer", &c.zero.offload_optimizer.device,
       &c.zero.offload_optimizer.pin_memory},
      {"zero_optimization.cpu_offload_param", "zero_optimization.offload_param", &c.zero.offload_param.device,
       &c.zero.offload_param.pin_memory},
  };
  const auto pin = st->deprecated.find("zero_optimization.cpu_offload_use_pin_memory");
  for (const Mapping& m : mappings) {
    const auto it = st->deprecated.find(m.old_key);
    if (it == st->deprecated.end()) continue;
    if (AnyGivenUnder(*st, m.block)) {
      Problem(st, m.old_key,
              KeyError(source, m.old_key,
                       std::string("no value when '") + m.block + "' is given (it is the deprecated spelling of " +
                           m.block + ".device)",
                       it->second ? "true" : "false"));
      continue;
    }
    c.warnings.push_back(source + ": '" + m.old_key + "' is deprecated; use '" + m.block + "'" +
                         (it->second ? std::string(" (mapped to ") + m.block + ".device = \"cpu\")" : ""));
    if (!it->second) continue;
    *m.device = OffloadDevice::kCpu;
    st->given[std::string(m.block) + ".device"] = m.old_key;
    if (pin != st->deprecated.end()) {
      *m.pin_memory = pin->second;
      st->given[std::string(m.block) + ".pin_memory"] = pin->first;
    }
  }
  if (pin != st->deprecated.end()) {
    c.warnings.push_back(source + ": '" + pin->first +
                         "' is deprecated; use pin_memory in zero_optimization.offload_optimizer / offload_param");
  }
}

// Defaults that depend on other keys, and the scheduler's per-type parameters.
void ResolveDependentDefaults(ParseState* st) {
  const std::string& source = st->options.source;
  Config& c = st->config;
  c.zero.overlap_comm_set = Given(*st, "zero_optimization.overlap_comm");
  if (!c.zero.overlap_comm_set) c.zero.overlap_comm = c.zero.stage == 3;

  // The scheduler's parameters depend on its type: nothing to check against when the type is bad.
  if (IsBad(st->bad, "scheduler.type")) return;
  const std::string& type = c.scheduler.type;
  for (const Key& k : Keys()) {
    if (k.only_for.empty() || !Given(*st, k.path) || IsBad(st->bad, k.path)) continue;
    if (std::find(k.only_for.begin(), k.only_for.end(), type) == k.only_for.end()) {
      Problem(st, k.path,
              KeyError(source, st->given[k.path],
                       "no value with scheduler.type " + Quote(type) + " (it is a parameter of " +
                           Join(k.only_for, ", ") + ")",
                       ShowValue(k.get(c))));
    }
  }
  if ((type == kWarmupDecayLR || type == kWarmupCosineLR) && !Given(*st, "scheduler.params.total_num_steps")) {
    Problem(st, "scheduler.params.total_num_steps",
            KeyError(source, "scheduler.params.total_num_steps", "an integer >= 1 (" + type + " requires it)",
                     "nothing"));
  }
  if (type == kWarmupDecayLR && !Given(*st, "scheduler.params.warmup_max_lr")) {
    // DeepSpeed's WarmupDecayLR constructor defaults warmup_max_lr to 0.001 (WarmupLR's to the lr).
    c.scheduler.warmup_max_lr = 0.001;
    if (c.optimizer.lr != 0.001) {
      c.warnings.push_back(source +
                           ": 'scheduler.params.warmup_max_lr' not given: WarmupDecayLR peaks at 0.001 (as "
                           "DeepSpeed does), not at optimizer.params.lr " + FormatNumber(c.optimizer.lr));
    }
  }
  if ((type == kWarmupLR || type == kWarmupDecayLR) && c.scheduler.warmup_max_lr == -1.0) {
    c.scheduler.warmup_max_lr = c.optimizer.lr;
  }
}

std::string Product(int64_t a, int64_t b, int64_t w) {
  return std::to_string(a) + " x " + std::to_string(b) + " x " + std::to_string(w);
}

// a x b x c, or nullopt when it does not fit int64 (each key is bounded, their product is not).
std::optional<int64_t> CheckedProduct(int64_t a, int64_t b, int64_t c) {
  int64_t ab = 0, abc = 0;
  if (__builtin_mul_overflow(a, b, &ab) || __builtin_mul_overflow(ab, c, &abc)) return std::nullopt;
  return abc;
}

std::string ProductText(int64_t a, int64_t b, int64_t c) {
  const std::optional<int64_t> p = CheckedProduct(a, b, c);
  return Product(a, b, c) + " = " + (p ? std::to_string(*p) : std::string("more than 9223372036854775807"));
}

// A batch value derived from the other two must be within its own key's bounds, like a given one.
Status CheckDerived(const std::string& source, const std::string& path, std::optional<int64_t> value,
                    const std::string& how) {
  const Key* k = FindKey(path);
  if (value && *value >= *k->min && *value <= *k->max) return OkStatus();
  return KeyError(source, path, Expected(*k) + " (it is derived: " + how + ")",
                  value ? std::to_string(*value) : "more than 9223372036854775807");
}

// DeepSpeed's batch arithmetic: any two of the three derive the third, then the identity must hold.
// Every product is checked for overflow and every derived value against its key's bounds.
Status ResolveBatchSizes(ParseState* st) {
  const std::string& source = st->options.source;
  Config& c = st->config;
  const int64_t world = st->options.world_size;
  const bool has_train = Given(*st, "train_batch_size");
  const bool has_micro = Given(*st, "train_micro_batch_size_per_gpu");
  const bool has_gas = Given(*st, "gradient_accumulation_steps");
  int64_t& train = c.train_batch_size;
  int64_t& micro = c.train_micro_batch_size_per_gpu;
  int64_t& gas = c.gradient_accumulation_steps;
  const std::string w = std::to_string(world);
  // Each of micro, gas and world is below 2^31, so a product of two of them fits int64.

  if (has_train && has_micro && has_gas) {
    const std::optional<int64_t> product = CheckedProduct(micro, gas, world);
    if (!product || train != *product) {
      return KeyError(source, "train_batch_size",
                      "train_micro_batch_size_per_gpu x gradient_accumulation_steps x world_size = " +
                          ProductText(micro, gas, world),
                      std::to_string(train));
    }
    return OkStatus();
  }
  if (has_train && has_micro) {
    if (train % (micro * world) != 0) {
      return KeyError(source, "train_batch_size",
                      "a multiple of train_micro_batch_size_per_gpu x world_size = " + std::to_string(micro) +
                          " x " + w + " = " + std::to_string(micro * world) +
                          " (gradient_accumulation_steps is derived from it)",
                      std::to_string(train));
    }
    gas = train / (micro * world);
    return CheckDerived(source, "gradient_accumulation_steps", gas,
                        "train_batch_size / (train_micro_batch_size_per_gpu x world_size) = " + std::to_string(train) +
                            " / (" + std::to_string(micro) + " x " + w + ")");
  }
  if (has_train && has_gas) {
    if (train % (gas * world) != 0) {
      return KeyError(source, "train_batch_size",
                      "a multiple of gradient_accumulation_steps x world_size = " + std::to_string(gas) + " x " +
                          w + " = " + std::to_string(gas * world) +
                          " (train_micro_batch_size_per_gpu is derived from it)",
                      std::to_string(train));
    }
    micro = train / (gas * world);
    return CheckDerived(source, "train_micro_batch_size_per_gpu", micro,
                        "train_batch_size / (gradient_accumulation_steps x world_size) = " + std::to_string(train) +
                            " / (" + std::to_string(gas) + " x " + w + ")");
  }
  if (has_micro && has_gas) {
    const std::optional<int64_t> product = CheckedProduct(micro, gas, world);
    if (product) train = *product;
    return CheckDerived(source, "train_batch_size", product,
                        "train_micro_batch_size_per_gpu x gradient_accumulation_steps x world_size = " +
                            Product(micro, gas, world));
  }
  if (has_train) {
    if (train % world != 0) {
      return KeyError(source, "train_batch_size",
                      "a multiple of world_size " + w +
                          " (train_micro_batch_size_per_gpu = train_batch_size / world_size when "
                          "gradient_accumulation_steps is not given)",
                      std::to_string(train));
    }
    micro = train / world;
    gas = 1;
    return CheckDerived(source, "train_micro_batch_size_per_gpu", micro,
                        "train_batch_size / world_size = " + std::to_string(train) + " / " + w);
  }
  if (has_micro) {
    gas = 1;
    const std::optional<int64_t> product = CheckedProduct(micro, 1, world);
    if (product) train = *product;
    return CheckDerived(source, "train_batch_size", product,
                        "train_micro_batch_size_per_gpu x world_size = " + std::to_string(micro) + " x " + w);
  }
  return KeyError(source, "train_batch_size",
                  "train_batch_size or train_micro_batch_size_per_gpu to be given (any two of train_batch_size, "
                  "train_micro_batch_size_per_gpu, gradient_accumulation_steps derive the third)",
                  has_gas ? "only gradient_accumulation_steps" : "none of them");
}

const std::vector<std::string> kBatchKeys = {"train_batch_size", "train_micro_batch_size_per_gpu",
                                             "gradient_accumulation_steps"};

void ResolveBatch(ParseState* st) {
  // A refused batch key is reported already; the arithmetic on the others would only repeat it. Either
  // way all three are marked, so that Validate does not report the ones left unresolved (0).
  if (AnyBad(st->bad, kBatchKeys)) {
    st->bad.insert(kBatchKeys.begin(), kBatchKeys.end());
    return;
  }
  const Status s = ResolveBatchSizes(st);
  if (!s.ok()) {
    Problem(st, "train_batch_size", s);
    st->bad.insert(kBatchKeys.begin(), kBatchKeys.end());
  }
}

// Cross-key rules: each documented once and checked after all keys are read, unless one of the keys
// it reads had a problem of its own. An `unbuilt` rule refuses what a DeepSpeed file may ask for but
// the engine does not build (UNIMPLEMENTED): Engine::Create checks it, ParseConfig does not.
struct Rule {
  const char* doc;
  std::vector<std::string> reads;  // canonical paths the check reads
  std::function<Status(const Config&, const std::string& source, int world_size)> check;
  bool unbuilt = false;
};

const std::vector<Rule>& Rules() {
  static const std::vector<Rule>* rules = new std::vector<Rule>{
      {"`zero_trace.path` is not empty when `zero_trace.enabled` is true.",
       {"zero_trace.enabled", "zero_trace.path"},
       [](const Config& c, const std::string& s, int) {
         if (c.zero_trace.enabled && c.zero_trace.path.empty()) {
           return KeyError(s, "zero_trace.path", "a file path when zero_trace.enabled is true", "\"\"");
         }
         return OkStatus();
       }},
      {"`zero_trace.last_step` is at least `zero_trace.first_step`.",
       {"zero_trace.first_step", "zero_trace.last_step"},
       [](const Config& c, const std::string& s, int) {
         if (c.zero_trace.last_step < c.zero_trace.first_step) {
           return KeyError(s, "zero_trace.last_step",
                           "a step >= zero_trace.first_step (" + std::to_string(c.zero_trace.first_step) + ")",
                           std::to_string(c.zero_trace.last_step));
         }
         return OkStatus();
       }},
      {"`fp16.enabled` and `bf16.enabled` are not both true.",
       {"fp16.enabled", "bf16.enabled"},
       [](const Config& c, const std::string& s, int) {
         if (c.fp16.enabled && c.bf16_enabled) {
           return KeyError(s, "bf16.enabled", "false when fp16.enabled is true (pick one 16-bit type)", "true");
         }
         return OkStatus();
       }},
      {"`zero_optimization.offload_param.device` other than \"none\" needs stage 3.",
       {"zero_optimization.offload_param.device", "zero_optimization.stage"},
       [](const Config& c, const std::string& s, int) {
         if (c.zero.offload_param.device != OffloadDevice::kNone && c.zero.stage < 3) {
           return KeyError(s, "zero_optimization.offload_param.device",
                           "\"none\" below stage 3 (parameter offload needs zero_optimization.stage 3; stage is " +
                               std::to_string(c.zero.stage) + ")",
                           Quote(OffloadDeviceName(c.zero.offload_param.device)));
         }
         return OkStatus();
       }},
      {"`zero_optimization.offload_optimizer.device` other than \"none\" needs stage 1, 2 or 3.",
       {"zero_optimization.offload_optimizer.device", "zero_optimization.stage"},
       [](const Config& c, const std::string& s, int) {
         if (c.zero.offload_optimizer.device != OffloadDevice::kNone && c.zero.stage == 0) {
           return KeyError(s, "zero_optimization.offload_optimizer.device",
                           "\"none\" at stage 0 (optimizer offload needs zero_optimization.stage 1, 2 or 3)",
                           Quote(OffloadDeviceName(c.zero.offload_optimizer.device)));
         }
         return OkStatus();
       }},
      {"`zero_optimization.offload_optimizer.device` \"nvme\" needs a non-empty `nvme_path` in that block.",
       {"zero_optimization.offload_optimizer.device", "zero_optimization.offload_optimizer.nvme_path"},
       [](const Config& c, const std::string& s, int) {
         if (c.zero.offload_optimizer.device == OffloadDevice::kNvme && c.zero.offload_optimizer.nvme_path.empty()) {
           return KeyError(s, "zero_optimization.offload_optimizer.nvme_path",
                           "a directory when offload_optimizer.device is \"nvme\"", "nothing");
         }
         return OkStatus();
       }},
      {"`zero_optimization.offload_param.device` \"nvme\" needs a non-empty `nvme_path` in that block.",
       {"zero_optimization.offload_param.device", "zero_optimization.offload_param.nvme_path"},
       [](const Config& c, const std::string& s, int) {
         if (c.zero.offload_param.device == OffloadDevice::kNvme && c.zero.offload_param.nvme_path.empty()) {
           return KeyError(s, "zero_optimization.offload_param.nvme_path",
                           "a directory when offload_param.device is \"nvme\"", "nothing");
         }
         return OkStatus();
       }},
      {"`zero_optimization.offload_optimizer.ratio` below 1 needs stage 3.",
       {"zero_optimization.offload_optimizer.ratio", "zero_optimization.stage"},
       [](const Config& c, const std::string& s, int) {
         if (c.zero.offload_optimizer.ratio < 1.0 && c.zero.stage < 3) {
           return KeyError(s, "zero_optimization.offload_optimizer.ratio",
                           "1 below stage 3 (partial optimizer offload needs zero_optimization.stage 3; stage is " +
                               std::to_string(c.zero.stage) + ")",
                           FormatNumber(c.zero.offload_optimizer.ratio));
         }
         return OkStatus();
       }},
      {"`managed_gradient_accumulation: false` refuses `zero_optimization.overlap_comm: true` at stages 0 "
       "and 1 (as DeepSpeed does).",
       {"managed_gradient_accumulation", "zero_optimization.overlap_comm", "zero_optimization.stage"},
       [](const Config& c, const std::string& s, int) {
         if (!c.managed_gradient_accumulation && c.zero.overlap_comm && c.zero.stage <= 1) {
           return KeyError(s, "zero_optimization.overlap_comm",
                           "false when managed_gradient_accumulation is false at stage " +
                               std::to_string(c.zero.stage) +
                               " (unmanaged accumulation reduces at step(); DeepSpeed refuses overlap_comm here)",
                           "true");
         }
         return OkStatus();
       }},
      {"`zero_optimization.offload_grad_accumulation: \"gpu\"` needs both offloads: "
       "`zero_optimization.offload_optimizer.device` and `zero_optimization.offload_param.device` each \"cpu\" or "
       "\"nvme\" (so stage 3).",
       {"zero_optimization.offload_grad_accumulation", "zero_optimization.offload_optimizer.device",
        "zero_optimization.offload_param.device"},
       [](const Config& c, const std::string& s, int) {
         if (c.zero.offload_grad_accumulation != "gpu") return OkStatus();
         std::vector<std::string> missing;
         for (const auto& [name, device] :
              {std::pair<std::string, OffloadDevice>{"offload_optimizer", c.zero.offload_optimizer.device},
               {"offload_param", c.zero.offload_param.device}}) {
           if (device == OffloadDevice::kNone) missing.push_back("zero_optimization." + name + ".device is \"none\"");
         }
         if (missing.empty()) return OkStatus();
         return KeyError(s, "zero_optimization.offload_grad_accumulation",
                         "\"cpu\" unless both zero_optimization.offload_optimizer.device and "
                         "zero_optimization.offload_param.device are \"cpu\" or \"nvme\" (GPU accumulation is for "
                         "full offload; " + Join(missing, " and ") + ")",
                         "\"gpu\"");
       }},
      {"`zero_optimization.offload_optimizer.host_memory_budget` above 0 needs `offload_optimizer.device` "
       "\"nvme\" (it splits the state between host memory and NVMe).",
       {"zero_optimization.offload_optimizer.host_memory_budget", "zero_optimization.offload_optimizer.device"},
       [](const Config& c, const std::string& s, int) {
         const OffloadOptimizerConfig& o = c.zero.offload_optimizer;
         if (o.host_memory_budget > 0 && o.device != OffloadDevice::kNvme) {
           return KeyError(s, "zero_optimization.offload_optimizer.host_memory_budget",
                           std::string("0 unless zero_optimization.offload_optimizer.device is \"nvme\" (the budget "
                                       "splits optimizer state between pinned host memory and NVMe; device is ") +
                               Quote(OffloadDeviceName(o.device)) +
                               (o.device == OffloadDevice::kCpu ? ", which keeps all of it in host memory)" : ")"),
                           std::to_string(o.host_memory_budget));
         }
         return OkStatus();
       }},
      {"`zero_optimization.offload_optimizer.update_device` \"gpu\" needs `offload_optimizer.device` \"cpu\" (it "
       "streams host states through the GPU).",
       {"zero_optimization.offload_optimizer.update_device", "zero_optimization.offload_optimizer.device"},
       [](const Config& c, const std::string& s, int) {
         const OffloadOptimizerConfig& o = c.zero.offload_optimizer;
         if (o.update_device == "gpu" && o.device != OffloadDevice::kCpu) {
           return KeyError(s, "zero_optimization.offload_optimizer.update_device",
                           std::string("\"cpu\" unless zero_optimization.offload_optimizer.device is \"cpu\" (the GPU "
                                       "update streams states kept in pinned host memory; device is ") +
                               Quote(OffloadDeviceName(o.device)) + ")",
                           "\"gpu\"");
         }
         return OkStatus();
       }},
      {"`zero_optimization.offload_optimizer.overlap_step` needs `offload_optimizer.update_device` \"gpu\" (it "
       "overlaps the streamed GPU update with the next forward).",
       {"zero_optimization.offload_optimizer.overlap_step", "zero_optimization.offload_optimizer.update_device"},
       [](const Config& c, const std::string& s, int) {
         const OffloadOptimizerConfig& o = c.zero.offload_optimizer;
         if (o.overlap_step && o.update_device != "gpu") {
           return KeyError(s, "zero_optimization.offload_optimizer.overlap_step",
                           "false unless zero_optimization.offload_optimizer.update_device is \"gpu\" (only the "
                           "streamed GPU update is overlapped; update_device is " + Quote(o.update_device) + ")",
                           "true");
         }
         return OkStatus();
       }},
      {"`optimizer.params.adam_w_mode: false` needs `optimizer.type` \"Adam\" (\"AdamW\" always decouples "
       "weight decay).",
       {"optimizer.params.adam_w_mode", "optimizer.type"},
       [](const Config& c, const std::string& s, int) {
         if (!c.optimizer.adam_w_mode && c.optimizer.type == "AdamW") {
           return KeyError(s, "optimizer.params.adam_w_mode",
                           "true with optimizer.type \"AdamW\" (use type \"Adam\" for classic Adam with L2 weight "
                           "decay)",
                           "false");
         }
         return OkStatus();
       }},

      // Read, not built: refused by Engine::Create (Validate), accepted by ParseConfig.
      {"`zero_optimization.offload_optimizer.ratio` below 1 with optimizer offload at stage 3: partial offload is "
       "not built.",
       {"zero_optimization.offload_optimizer.ratio", "zero_optimization.offload_optimizer.device",
        "zero_optimization.stage"},
       [](const Config& c, const std::string& s, int) {
         const OffloadOptimizerConfig& o = c.zero.offload_optimizer;
         // Below stage 3 the rule above refuses the ratio.
         if (o.device != OffloadDevice::kNone && o.ratio != 1.0 && c.zero.stage >= 3) {
           return UnimplementedError(Where(s) +
                                     "zero_optimization.offload_optimizer.ratio: partial offload is not built; "
                                     "expected 1.0, got " + std::to_string(o.ratio));
         }
         return OkStatus();
       },
       true},
      {"`prescale_gradients: true` and `gradient_predivide_factor` other than 1 are not built.",
       {"prescale_gradients", "gradient_predivide_factor"},
       [](const Config& c, const std::string& s, int) {
         if (c.prescale_gradients || c.gradient_predivide_factor != 1.0) {
           return UnimplementedError(Where(s) +
                                     "prescale_gradients / gradient_predivide_factor: not supported (expected false "
                                     "/ 1.0)");
         }
         return OkStatus();
       },
       true},
      {"`data_types.grad_accum_dtype` other than null or \"fp32\" is not built (gradients accumulate in fp32).",
       {"data_types.grad_accum_dtype"},
       [](const Config& c, const std::string& s, int) {
         if (c.has_grad_accum_dtype && c.grad_accum_dtype != DType::kF32) {
           return UnimplementedError(Where(s) + "data_types.grad_accum_dtype: gradients are accumulated in fp32; got " +
                                     DTypeName(c.grad_accum_dtype));
         }
         return OkStatus();
       },
       true},
      {"`communication_data_type` other than null or \"fp32\" at stages 0 and 1 is not built (they reduce fp32 "
       "accumulators).",
       {"communication_data_type", "zero_optimization.stage"},
       [](const Config& c, const std::string& s, int) {
         if (c.has_communication_data_type && c.zero.stage <= 1 && c.communication_data_type != DType::kF32) {
           return UnimplementedError(Where(s) + "communication_data_type: stages 0/1 reduce fp32 accumulators; got " +
                                     DTypeName(c.communication_data_type));
         }
         return OkStatus();
       },
       true},
      {"`zero_optimization.offload_optimizer.overlap_step` with more than one data-parallel rank is not built.",
       {"zero_optimization.offload_optimizer.overlap_step"},
       [](const Config& c, const std::string& s, int world_size) {
         if (c.zero.offload_optimizer.overlap_step && world_size != 1) {
           return UnimplementedError(
               Where(s) + "zero_optimization.offload_optimizer.overlap_step: needs one data-parallel rank, got " +
               std::to_string(world_size) +
               " (stages 1/2 all-gather the new weights right after the update and stage 3's gathers and "
               "prefetches read the shards, so with several ranks there is nothing left to overlap without "
               "per-chunk gathers; docs/offload.md); set it to false");
         }
         return OkStatus();
       },
       true},
      {"`zero_optimization.offload_optimizer.overlap_step` with `offload_param.device` other than \"none\" is not "
       "built.",
       {"zero_optimization.offload_optimizer.overlap_step", "zero_optimization.offload_param.device"},
       [](const Config& c, const std::string& s, int world_size) {
         // With several ranks the rule above says why already.
         if (c.zero.offload_optimizer.overlap_step && world_size == 1 &&
             c.zero.offload_param.device != OffloadDevice::kNone) {
           return UnimplementedError(
               Where(s) + "zero_optimization.offload_optimizer.overlap_step: not with zero_optimization.offload_param.device "
               "\"" + std::string(OffloadDeviceName(c.zero.offload_param.device)) +
               "\" (the update writes the host shards through a device scratch); set one of them off");
         }
         return OkStatus();
       },
       true},
  };
  return *rules;
}

// Appends every problem of `c` to *problems: each key's own check (keys of another scheduler type
// skipped), then the rules. The batch identity is not among them: ParseConfig derives the batch sizes
// for its world_size, and the engine reads only gradient_accumulation_steps. A key or rule that reads a path in *bad, or under a bad
// block, is skipped (ParseConfig passes the keys it already refused); a key failing its check is
// added to *bad.
void CheckConfig(const Config& c, const ValidateOptions& o, std::set<std::string>* bad,
                 std::vector<Status>* problems) {
  for (const Key& k : Keys()) {
    if (IsBad(*bad, k.path)) continue;
    if (!k.only_for.empty() &&
        std::find(k.only_for.begin(), k.only_for.end(), c.scheduler.type) == k.only_for.end()) {
      continue;
    }
    Json canonical;
    const Status s = ReadValue(k, k.get(c), k.path, o.source, &canonical);
    if (!s.ok()) {
      problems->push_back(s);
      bad->insert(k.path);
    }
  }
  for (const Rule& r : Rules()) {
    if ((r.unbuilt && !o.refuse_unbuilt) || AnyBad(*bad, r.reads)) continue;
    const Status s = r.check(c, o.source, o.world_size);
    if (!s.ok()) problems->push_back(s);
  }
}

// One problem: its message alone. Several: a count, then one problem per line. Unknown keys that were
// only warnings follow as notes, since a misspelt key is often why a value is missing.
std::string ProblemsMessage(const ParseState& st) {
  const std::string& source = st.options.source;
  std::string out;
  if (st.errors.size() == 1) {
    out = st.errors[0];
  } else {
    out = source + ": " + std::to_string(st.errors.size()) + " problems in the config:";
    for (const std::string& e : st.errors) out += "\n  " + e;
  }
  const std::string unknown = source + ": unknown key";  // "unknown key '...'" and "unknown keys: N more"
  for (const std::string& w : st.config.warnings) {
    if (w.compare(0, unknown.size(), unknown) == 0) out += "\n  note: " + w;
  }
  return out;
}

std::string ListOnlyFor(const Key& k) { return Join(k.only_for, ", "); }

std::string DefaultText(const Key& k) {
  if (!k.default_doc.empty()) return k.default_doc;
  return "`" + k.default_value.dump() + "`";
}

}  // namespace

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

Status Validate(const Config& config, const ValidateOptions& options) {
  if (options.world_size < 1) {
    return InvalidArgumentError(Where(options.source) + "world_size: expected an integer >= 1, got " +
                                std::to_string(options.world_size));
  }
  std::set<std::string> bad;
  std::vector<Status> problems;
  CheckConfig(config, options, &bad, &problems);
  if (problems.empty()) return OkStatus();
  if (problems.size() == 1) return problems[0];
  StatusCode code = problems[0].code();
  std::string message = Where(options.source) + std::to_string(problems.size()) + " problems in the config:";
  for (const Status& s : problems) {
    if (s.code() != code) code = StatusCode::kInvalidArgument;
    message += "\n  " + s.message();
  }
  return Status(code, message);
}

Result<Config> ParseConfig(const std::string& json_text, const ParseOptions& options) {
  const std::string& source = options.source;
  if (options.world_size < 1) {
    return InvalidArgumentError(source + ": world_size: expected an integer >= 1, got " +
                                std::to_string(options.world_size));
  }
  // Depth, number range, duplicate keys and linear time are ParseJsonText's (engine/json_input.h).
  ZERO_ASSIGN_OR_RETURN(Json root, ParseJsonText<Json>(json_text, source));
  if (!root.is_object()) {
    return InvalidArgumentError(source + ": expected a JSON object at the top level, got " + ShowValue(root));
  }

  ParseState st{options, Config(), {}, {}, {}, {}};
  for (const Key& k : Keys()) {
    if (!k.default_value.is_null() || k.nullable) k.set(st.config, k.default_value);
  }
  try {
    Walk(root, "", "", &st);
    if (st.unknown_keys > kUnknownKeysListed) {
      const std::string more = source + ": unknown keys: " + std::to_string(st.unknown_keys - kUnknownKeysListed) +
                               " more not listed (" + std::to_string(st.unknown_keys) + " in all; the first " +
                               std::to_string(kUnknownKeysListed) + " are)";
      (options.strict ? st.errors : st.config.warnings).push_back(more);
    }
    ApplyDeprecatedOffload(&st);
    ResolveDependentDefaults(&st);
    ResolveBatch(&st);
  } catch (const Json::exception& e) {
    // Values are type-checked before use, so this is a bug in the table.
    return InternalError(source + ": config table: " + e.what());
  }
  std::vector<Status> problems;
  CheckConfig(st.config, ValidateOptions{options.world_size, source, /*refuse_unbuilt=*/false}, &st.bad, &problems);
  for (const Status& s : problems) st.errors.push_back(s.message());
  if (!st.errors.empty()) return InvalidArgumentError(ProblemsMessage(st));
  return std::move(st.config);
}

Result<Config> LoadConfigFile(const std::string& path, const ParseOptions& options) {
  // O_NONBLOCK and fstat: a named pipe would block open() forever, and a directory used to be read
  // as empty text ("malformed JSON").
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return ErrnoError("open config", path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError("stat config", path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    const char* kind = S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a named pipe" : "not a regular file";
    return InvalidArgumentError("config " + path + ": not a regular file (it is " + std::string(kind) +
                                "); give the path of the JSON config file");
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  std::string text;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return ErrnoError("read config", path, err);
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  ParseOptions opts = options;
  if (opts.source == ParseOptions().source) opts.source = path;
  return ParseConfig(text, opts);
}

std::string ConfigToJson(const Config& config) {
  Json out = Json::object();
  for (const Key& k : Keys()) {
    if (!k.only_for.empty() &&
        std::find(k.only_for.begin(), k.only_for.end(), config.scheduler.type) == k.only_for.end()) {
      continue;
    }
    std::string pointer = "/" + k.path;
    std::replace(pointer.begin(), pointer.end(), '.', '/');
    out[Json::json_pointer(pointer)] = k.get(config);
  }
  return out.dump(2) + "\n";
}

std::string ConfigReferenceMarkdown() {
  std::ostringstream md;
  md << "# Config reference\n\n"
     << "<!-- Generated from the key table in engine/config.cc by\n"
     << "     `bazel run //engine:config_doc -- --output=docs/config.md`; do not edit by hand.\n"
     << "     //engine:config_doc_test fails when this file and the table differ. -->\n\n"
     << "_Generated from the key table in `engine/config.cc` by\n"
     << "`bazel run //engine:config_doc -- --output=docs/config.md` (run from the workspace root);\n"
     << "`//engine:config_doc_test` fails when this page is out of date._\n\n"
     << "zero reads a DeepSpeed-style JSON config: the same key names, defaults and batch arithmetic as\n"
     << "DeepSpeed for everything zero implements. Every key below is declared once in\n"
     << "`engine/config.cc`; that declaration drives parsing, defaults, validation, `ConfigToJson` and this\n"
     << "page.\n\n"
     << "## Errors and warnings\n\n"
     << "- A bad value names the key's full path, what was expected and what was found:\n"
     << "  `ds_config.json: zero_optimization.stage: expected an integer in 0..3, got 4`.\n"
     << "- Malformed JSON reports the line and column: `ds_config.json: malformed JSON at line 7, column 5: ...`.\n"
     << "- Integer keys accept integral numbers written as floats (`5e8`).\n"
     << "- `\"auto\"` (a Hugging Face Trainer placeholder the Trainer fills in) is an error for every key:\n"
     << "  replace it with a value.\n"
     << "- Unknown keys are warnings with a suggestion (`unknown key 'zero_optimization.stge' (did you mean\n"
     << "  'stage'?)`), or errors with `ParseOptions::strict`. Past 100 unknown keys, one line counts the rest.\n"
     << "  A top-level unknown key one edit from a known one (`zero_optimisation`, `FP16`) is an error even so,\n"
     << "  since everything under it would be ignored (`ParseOptions::top_level_typos_are_errors = false` makes\n"
     << "  it a warning). So is a nested key one edit from a known block (`zero_optimization.offload_optimiser`)\n"
     << "  (`ParseOptions::nested_block_typos_are_errors = false` makes it a warning); a nested key one edit\n"
     << "  from a known scalar key (`zero_optimization.stge`) is a warning.\n"
     << "- Hostile or broken files end in an error, in time linear in the file's size: JSON nested deeper than\n"
     << "  100 levels and a number beyond a double's range (`1e400`) name the line and column (and the key);\n"
     << "  a key given twice in one object is an error naming it (as DeepSpeed refuses duplicate keys).\n"
     << "- Every number has an upper bound as well (the Accepts column): counts of elements, bytes and steps at\n"
     << "  most 2^53 - 1 (the largest integer a double holds exactly), counts kept in an `int` (micro batch,\n"
     << "  accumulation steps, buffer counts) at most 2^31 - 1, thread counts at most 1024, reals of the fp32\n"
     << "  update at most 1e38 (`eps` at least 1e-37: fp32 flushes smaller values to 0). A batch size derived from\n"
     << "  the other two is checked against the same bounds, and their product for overflow.\n"
     << "- Every problem in a file is reported at once, in file order and then the rules between keys: one\n"
     << "  error whose first line counts them (`ds_config.json: 3 problems in the config:`) and then one line\n"
     << "  per problem, each as above. A key whose value is refused keeps its default and the checks that\n"
     << "  read it are skipped, so no problem is reported only as a consequence of another; a missing batch\n"
     << "  size does not hide a contradiction elsewhere. Unknown keys that are only warnings follow as\n"
     << "  `note:` lines (a misspelt key is often why a value is missing). Malformed JSON is one error:\n"
     << "  parsing cannot continue.\n\n"
     << "## Batch size\n\n"
     << "`train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x world_size`.\n"
     << "Any two of the three derive the third; all three given must satisfy the identity. With only\n"
     << "`train_batch_size`: micro batch = train_batch_size / world_size and gradient_accumulation_steps = 1.\n"
     << "With only `train_micro_batch_size_per_gpu`: gradient_accumulation_steps = 1. At least one of\n"
     << "`train_batch_size` and `train_micro_batch_size_per_gpu` is required. A derived value must divide\n"
     << "exactly.\n\n"
     << "## Learning-rate schedule steps\n\n"
     << "As in DeepSpeed, the scheduler advances once after every optimizer step that was applied (a step\n"
     << "skipped for an fp16 overflow does not count), so the t-th applied update uses the schedule's value\n"
     << "after t - 1 advances: the first update uses `warmup_min_lr` (WarmupLR, WarmupDecayLR) or 0\n"
     << "(WarmupCosineLR). `warmup_num_steps` below 2 acts as 2. The formulas are in\n"
     << "`engine/lr_scheduler.h`.\n\n";

  // One table per block, in table order.
  std::vector<std::string> blocks;
  for (const Key& k : Keys()) {
    const std::string b = ParentOf(k.path);
    if (std::find(blocks.begin(), blocks.end(), b) == blocks.end()) blocks.push_back(b);
  }
  for (const std::string& b : blocks) {
    md << "## " << (b.empty() ? "Top level" : "`" + b + "`") << "\n\n";
    md << "| Key | Type | Default | Accepts | Description |\n| --- | --- | --- | --- | --- |\n";
    for (const Key& k : Keys()) {
      if (ParentOf(k.path) != b) continue;
      std::string doc = k.doc;
      if (!k.only_for.empty()) doc += " Read by " + ListOnlyFor(k) + ".";
      std::string def = DefaultText(k);
      md << "| `" << LastComponent(k.path) << "` | " << TypeName(k) << " | " << def << " | " << Expected(k)
         << " | " << doc << " |\n";
    }
    md << "\n";
  }

  md << "## Rules between keys\n\n";
  for (const Rule& r : Rules()) {
    if (!r.unbuilt) md << "- " << r.doc << "\n";
  }
  md << "- `scheduler.params` keys belong to the schedules listed with them; another schedule's key is an error "
        "(DeepSpeed's constructors refuse them too).\n"
     << "- WarmupDecayLR and WarmupCosineLR require `scheduler.params.total_num_steps`.\n"
     << "- `optimizer.params.max_grad_norm` is an error: use the top-level `gradient_clipping`.\n"
     << "- `optimizer.type` other than Adam/AdamW (Lamb, OneBitAdam, ...) and `scheduler.type` OneCycle or\n"
     << "  LRRangeTest are errors: zero does not implement them.\n\n";

  md << "## Read but not built\n\n"
     << "A file may ask for these (DeepSpeed builds them) and is read as usual; `Engine::Create` refuses\n"
     << "them with UNIMPLEMENTED, naming the key. `Validate` (engine/config.h) holds these rules with the\n"
     << "ones above, so a `Config` built in code is held to the same rules, with the same messages.\n\n";
  for (const Rule& r : Rules()) {
    if (r.unbuilt) md << "- " << r.doc << "\n";
  }
  md << "\n## Other spellings\n\n"
     << "Accepted with a warning and mapped onto the keys above; giving both spellings is an error.\n\n"
     << "| Spelling | Means |\n| --- | --- |\n";
  for (const Alias& a : kAliases) md << "| `" << a.path << "` | `" << a.canonical << "` |\n";
  for (const Deprecated& d : kDeprecated) md << "| `" << d.path << "` (boolean) | " << d.doc << " |\n";
  md << "\n## Differences from DeepSpeed 0.19.8\n\n"
     << "Every default above is DeepSpeed 0.19.8's (its `runtime/constants.py`, `runtime/zero/config.py`,\n"
     << "`runtime/zero/offload_config.py`, `runtime/precision_config.py`, the aio config, `lr_schedules.py`\n"
     << "and FusedAdam), except the rows below; `//engine:config_test` checks every key's default against\n"
     << "DeepSpeed's. Matched in this version: `optimizer.params.weight_decay` is 0 for AdamW too (was\n"
     << "0.01, torch's), and `pin_memory` of both offload blocks is false (was true). Behaviour beyond the\n"
     << "config (numerics, inactive parameters, fp16 loss scale with accumulation) is in\n"
     << "`docs/deepspeed_parity.md`.\n\n"
     << "| Key | DeepSpeed 0.19.8 | zero | Why |\n| --- | --- | --- | --- |\n";
  for (const ConfigDifference& d : Differences()) {
    const std::string key = d.key.find('`') == std::string::npos ? "`" + d.key + "`" : d.key;
    md << "| " << key << " | " << d.theirs << " | " << d.ours << " | " << d.why << " |\n";
  }
  md << "\n## Keys read and ignored\n\n"
     << "DeepSpeed keys zero knows and does not act on. Each gives a warning (also with `strict`).\n\n"
     << "| Key | Why |\n| --- | --- |\n";
  for (const Ignored& i : kIgnored) md << "| `" << i.path << "` | " << i.why << " |\n";
  return md.str();
}

const std::vector<ConfigKeyInfo>& ConfigKeyTable() {
  static const std::vector<ConfigKeyInfo>* table = [] {
    auto* out = new std::vector<ConfigKeyInfo>();
    for (const Key& k : Keys()) {
      ConfigKeyInfo info;
      info.path = k.path;
      info.expected = Expected(k);
      info.has_default = !k.default_value.is_null() || k.nullable;
      info.default_json = k.default_value.dump();
      info.default_depends_on_other_keys = k.default_depends;
      info.only_for = k.only_for;
      switch (k.kind) {
        case Kind::kBool: info.wrong_type_values = {"1", "\"true\"", "null", "[]"}; break;
        case Kind::kInt: info.wrong_type_values = {"\"8\"", "true", "1.5", "null", "{}"}; break;
        case Kind::kNumber: info.wrong_type_values = {"\"0.5\"", "false", "null", "[1]"}; break;
        case Kind::kString: info.wrong_type_values = {"3", "true", "null", "[\"cpu\"]"}; break;
        case Kind::kDType: info.wrong_type_values = {"16", "true", "{}"}; break;
        case Kind::kBetas: info.wrong_type_values = {"0.9", "\"0.9,0.999\"", "null", "{}"}; break;
      }
      info.wrong_type_values.push_back("\"auto\"");
      if (k.kind == Kind::kInt) {
        // Integers as integer texts: max + 1 of a bound near 2^53 is not a distinct double.
        if (k.min && *k.min > k.type_min) {
          info.out_of_range_values.push_back(std::to_string(static_cast<int64_t>(*k.min) - 1));
        }
        if (k.max && *k.max < k.type_max) {
          info.out_of_range_values.push_back(std::to_string(static_cast<int64_t>(*k.max) + 1));
        }
      } else if (k.kind == Kind::kNumber) {
        if (k.min) {
          const double below = k.min_exclusive ? *k.min : *k.min > 0 && *k.min < 1e-6 ? *k.min / 2 : *k.min - 0.5;
          info.out_of_range_values.push_back(FormatNumber(below));
        }
        if (k.max) {
          const double above = k.max_exclusive ? *k.max : *k.max > 1e6 ? *k.max * 2 : *k.max + 0.5;
          info.out_of_range_values.push_back(FormatNumber(above));
        }
      } else if (k.kind == Kind::kString && !k.choices.empty()) {
        info.out_of_range_values = {"\"bogus\"", "\"\""};
        if (std::find(k.choices.begin(), k.choices.end(), "") != k.choices.end()) {
          info.out_of_range_values = {"\"bogus\""};
        }
      } else if (k.kind == Kind::kDType) {
        info.out_of_range_values = {"\"int8\"", "\"\""};
      } else if (k.kind == Kind::kBetas) {
        info.out_of_range_values = {"[0.9]", "[0.9,1.0]", "[-0.1,0.9]", "[0.9,0.99,0.999]"};
      }
      for (const std::string& s : k.extra_bad) info.out_of_range_values.push_back(s);
      out->push_back(std::move(info));
    }
    return out;
  }();
  return *table;
}

const std::vector<ConfigDifference>& DeepSpeedDifferences() { return Differences(); }

std::string ConfigValueAt(const std::string& config_json, const std::string& path) {
  Json root = Json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return "";
  std::string pointer = "/" + path;
  std::replace(pointer.begin(), pointer.end(), '.', '/');
  const Json::json_pointer ptr(pointer);
  if (!root.contains(ptr)) return "";
  return root.at(ptr).dump();
}

}  // namespace zero
