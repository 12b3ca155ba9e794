// The rules between keys, the rules of what is not built, CheckConfig and Validate (config_rules.h,
// config.h).
#include "engine/config/rules.h"

#include <algorithm>
#include <string>
#include <utility>

#include "engine/config/key_table.h"

namespace zero {
namespace config_internal {

namespace {

std::vector<Rule> TraceAndPrecisionRules() {
  return {
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
  };
}

std::vector<Rule> OffloadPlacementRules() {
  return {
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
  };
}

std::vector<Rule> GradientAccumulationRules() {
  return {
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
                         "full offload; " +
                             Join(missing, " and ") + ")",
                         "\"gpu\"");
       }},
  };
}

std::vector<Rule> OptimizerRules() {
  return {
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
                           "streamed GPU update is overlapped; update_device is " +
                               Quote(o.update_device) + ")",
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

  };
}

// Read, not built: refused by Engine::Create (Validate), accepted by ParseConfig.
std::vector<Rule> UnbuiltUpdateAndReductionRules() {
  return {
      {"`zero_optimization.offload_optimizer.ratio` below 1 with `update_device: \"gpu\"` (the chunked GPU AdamW) "
       "is not built: partial offload keeps its device share with the device AdamW and offloads the rest to the "
       "CPU AdamW.",
       {"zero_optimization.offload_optimizer.ratio", "zero_optimization.offload_optimizer.update_device",
        "zero_optimization.stage"},
       [](const Config& c, const std::string& s, int) {
         const OffloadOptimizerConfig& o = c.zero.offload_optimizer;
         // Below stage 3 the rule above refuses the ratio.
         if (o.device == OffloadDevice::kCpu && o.update_device == "gpu" && o.ratio != 1.0 && c.zero.stage >= 3) {
           return UnimplementedError(Where(s) +
                                     "zero_optimization.offload_optimizer.ratio: partial offload with "
                                     "update_device \"gpu\" is not built; expected 1.0 (or update_device \"cpu\"), "
                                     "got " +
                                     FormatNumber(o.ratio));
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
  };
}

std::vector<Rule> UnbuiltOverlapStepRules() {
  return {
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
               Where(s) +
               "zero_optimization.offload_optimizer.overlap_step: not with zero_optimization.offload_param.device "
               "\"" +
               std::string(OffloadDeviceName(c.zero.offload_param.device)) +
               "\" (the update writes the host shards through a device scratch); set one of them off");
         }
         return OkStatus();
       },
       true},
  };
}

// "<source>: <path>: <what> is not built (<instead>); expected <expected>, got <got>" (UNIMPLEMENTED).
Status NotBuilt(const std::string& source, const std::string& path, const std::string& what, const std::string& instead,
                const std::string& expected, const std::string& got) {
  return UnimplementedError(Where(source) + path + ": " + what + " is not built (" + instead + "); expected " +
                            expected + ", got " + got);
}

// A boolean DeepSpeed feature (default false) that zero reads and does not build.
Rule UnbuiltFlag(const char* doc, std::string path, bool (*field)(const Config&), std::string what,
                 std::string instead) {
  return {doc,
          {path},
          [path, field, what, instead](const Config& c, const std::string& s, int) {
            if (!field(c)) return OkStatus();
            return NotBuilt(s, path, what, instead, "false", "true");
          },
          true};
}

// DeepSpeed 0.19.8 keys of the blocks it validates (zero_optimization, offload_optimizer, bf16, fp16) that
// would change what is trained or how: read so that they are not ignored, refused unless at DeepSpeed's
// default.
std::vector<Rule> UnbuiltDeepSpeedFeatureRules() {
  return {
      UnbuiltFlag(
          "`zero_optimization.legacy_stage1: true` (DeepSpeed's pre-0.6 stage 1) is not built.",
          "zero_optimization.legacy_stage1", [](const Config& c) { return c.zero.legacy_stage1; },
          "DeepSpeed's legacy stage-1 implementation",
          "zero's stage 1 partitions the optimizer states as DeepSpeed's current stage 1 does"),
      {"`zero_optimization.zero_hpz_partition_size` above 1 (ZeRO++ hierarchical partitioning) is not built.",
       {"zero_optimization.zero_hpz_partition_size"},
       [](const Config& c, const std::string& s, int) {
         if (c.zero.zero_hpz_partition_size <= 1) return OkStatus();
         return NotBuilt(s, "zero_optimization.zero_hpz_partition_size",
                         "ZeRO++ hierarchical partitioning (a secondary copy of the stage-3 parameters in groups of "
                         "ranks)",
                         "zero partitions parameters once over all data-parallel ranks", "0 or 1",
                         std::to_string(c.zero.zero_hpz_partition_size));
       },
       true},
      UnbuiltFlag(
          "`zero_optimization.zero_quantized_weights: true` (ZeRO++ quantized weight gathers) is not built.",
          "zero_optimization.zero_quantized_weights", [](const Config& c) { return c.zero.zero_quantized_weights; },
          "ZeRO++ quantized parameter all-gather", "zero gathers parameters in the model dtype"),
      UnbuiltFlag(
          "`zero_optimization.zero_quantized_nontrainable_weights: true` is not built.",
          "zero_optimization.zero_quantized_nontrainable_weights",
          [](const Config& c) { return c.zero.zero_quantized_nontrainable_weights; },
          "quantized storage of non-trainable parameters", "zero keeps every parameter in the model dtype"),
      UnbuiltFlag(
          "`zero_optimization.zero_quantized_gradients: true` (ZeRO++ quantized gradient reduction) is not "
          "built.",
          "zero_optimization.zero_quantized_gradients", [](const Config& c) { return c.zero.zero_quantized_gradients; },
          "ZeRO++ quantized gradient reduction", "zero reduces gradients unquantized"),
      {"A `zero_optimization.zenflow` block (ZenFlow) is not built.",
       {"zero_optimization.zenflow"},
       [](const Config& c, const std::string& s, int) {
         if (!c.zero.zenflow) return OkStatus();
         return NotBuilt(s, "zero_optimization.zenflow",
                         "ZenFlow (top-k gradient columns updated each step, the rest later on the CPU)",
                         "zero applies every gradient at every step", "null or no zenflow block", "a block");
       },
       true},
      UnbuiltFlag(
          "`zero_optimization.offload_optimizer.super_offload: true` (SuperOffload) is not built.",
          "zero_optimization.offload_optimizer.super_offload",
          [](const Config& c) { return c.zero.offload_optimizer.super_offload; },
          "SuperOffload (DeepSpeed's stage-3 offload optimizer for Superchips)",
          "zero's optimizer offload runs its CPU AdamW, or update_device \"gpu\""),
      UnbuiltFlag(
          "`bf16.bf16_master_weights_and_grads: true` is not built (fp32 master weights and gradients).",
          "bf16.bf16_master_weights_and_grads", [](const Config& c) { return c.bf16_master_weights_and_grads; },
          "bf16 master weights and gradients", "zero keeps fp32 master weights and accumulates gradients in fp32"),
      UnbuiltFlag(
          "`bf16.bf16_optimizer_states: true` is not built (fp32 optimizer states).", "bf16.bf16_optimizer_states",
          [](const Config& c) { return c.bf16_optimizer_states; }, "bf16 optimizer states",
          "zero keeps AdamW's moments in fp32"),
      UnbuiltFlag(
          "`fp16.fp16_master_weights_and_grads: true` is not built (fp32 master weights).",
          "fp16.fp16_master_weights_and_grads", [](const Config& c) { return c.fp16.fp16_master_weights_and_grads; },
          "fp16 master weights and gradients", "zero keeps fp32 master weights"),
  };
}

}  // namespace

const std::vector<Rule>& Rules() {
  static const std::vector<Rule>* rules = [] {
    auto* all = new std::vector<Rule>;
    for (std::vector<Rule> (*group)() :
         {TraceAndPrecisionRules, OffloadPlacementRules, GradientAccumulationRules, OptimizerRules,
          UnbuiltUpdateAndReductionRules, UnbuiltOverlapStepRules, UnbuiltDeepSpeedFeatureRules}) {
      std::vector<Rule> part = group();
      all->insert(all->end(), part.begin(), part.end());
    }
    return all;
  }();
  return *rules;
}

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

void CheckConfig(const Config& c, const ValidateOptions& o, std::set<std::string>* bad, std::vector<Status>* problems) {
  for (const Key& k : Keys()) {
    if (IsBad(*bad, k.path)) continue;
    if (!k.only_for.empty() && std::find(k.only_for.begin(), k.only_for.end(), c.scheduler.type) == k.only_for.end()) {
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

}  // namespace config_internal

Status Validate(const Config& config, const ValidateOptions& options) {
  using config_internal::Where;
  if (options.world_size < 1) {
    return InvalidArgumentError(Where(options.source) + "world_size: expected an integer >= 1, got " +
                                std::to_string(options.world_size));
  }
  std::set<std::string> bad;
  std::vector<Status> problems;
  config_internal::CheckConfig(config, options, &bad, &problems);
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

}  // namespace zero
