#include "engine/config/config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "engine/config/keys.h"

namespace zero {
namespace {

Result<Config> Parse(const std::string& text, int world_size = 1, bool strict = false) {
  ParseOptions options;
  options.world_size = world_size;
  options.strict = strict;
  return ParseConfig(text, options);
}

// Renders {"a.b.c": "1", "a.d": "true"} as nested JSON text; values are JSON texts.
std::string Nested(const std::map<std::string, std::string>& values) {
  struct Node {
    std::string value;
    std::vector<std::pair<std::string, Node>> children;
    Node& Child(const std::string& name) {
      for (auto& [n, c] : children) {
        if (n == name) return c;
      }
      children.emplace_back(name, Node());
      return children.back().second;
    }
    std::string Render() const {
      if (children.empty()) return value;
      std::string out = "{";
      for (size_t i = 0; i < children.size(); ++i) {
        if (i) out += ", ";
        out += "\"" + children[i].first + "\": " + children[i].second.Render();
      }
      return out + "}";
    }
  };
  Node root;
  for (const auto& [path, value] : values) {
    Node* node = &root;
    size_t start = 0;
    while (true) {
      const size_t dot = path.find('.', start);
      node = &node->Child(path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    node->value = value;
  }
  return root.Render();
}

// A config that parses, with `path` set to `value` (and what that key needs to be read at all).
std::string ConfigWith(const ConfigKeyInfo& key, const std::string& value) {
  std::map<std::string, std::string> values = {{"train_batch_size", "8"}};
  if (!key.only_for.empty()) {
    values["scheduler.type"] = "\"" + key.only_for[0] + "\"";
    if (key.only_for[0] != "WarmupLR") values["scheduler.params.total_num_steps"] = "100";
  }
  values[key.path] = value;
  return Nested(values);
}

std::string Message(const Result<Config>& r) { return r.ok() ? "(ok)" : r.status().message(); }

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

bool HasWarning(const Config& c, const std::string& needle) {
  for (const std::string& w : c.warnings) {
    if (Contains(w, needle)) return true;
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
// Table-driven: every key in the table, including keys added later.

TEST(ConfigKeyTableTest, TableIsNotEmptyAndPathsAreUnique) {
  const auto& table = ConfigKeyTable();
  ASSERT_GT(table.size(), 50u);
  for (size_t i = 0; i < table.size(); ++i) {
    for (size_t j = i + 1; j < table.size(); ++j) EXPECT_NE(table[i].path, table[j].path);
  }
}

TEST(ConfigKeyTableTest, EveryKeyRejectsValuesOfTheWrongType) {
  for (const ConfigKeyInfo& key : ConfigKeyTable()) {
    ASSERT_FALSE(key.wrong_type_values.empty()) << key.path;
    for (const std::string& bad : key.wrong_type_values) {
      const std::string text = ConfigWith(key, bad);
      auto r = Parse(text);
      ASSERT_FALSE(r.ok()) << key.path << " accepted " << bad << " in " << text;
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
      const std::string want = "<config>: " + key.path + ": expected " + key.expected + ", got " + bad;
      EXPECT_EQ(Message(r).substr(0, want.size()), want) << text;
    }
  }
}

TEST(ConfigKeyTableTest, EveryKeyRejectsValuesOutsideItsCheck) {
  int keys_with_checks = 0;
  for (const ConfigKeyInfo& key : ConfigKeyTable()) {
    if (!key.out_of_range_values.empty()) ++keys_with_checks;
    for (const std::string& bad : key.out_of_range_values) {
      const std::string text = ConfigWith(key, bad);
      auto r = Parse(text);
      ASSERT_FALSE(r.ok()) << key.path << " accepted " << bad << " in " << text;
      const std::string want = "<config>: " + key.path + ": expected " + key.expected + ", got " + bad;
      EXPECT_EQ(Message(r).substr(0, want.size()), want) << text;
    }
  }
  EXPECT_GT(keys_with_checks, 35);
}

TEST(ConfigKeyTableTest, EveryKeyAcceptsItsDefaultAndWritesItBack) {
  for (const ConfigKeyInfo& key : ConfigKeyTable()) {
    if (!key.has_default) continue;
    const std::string text = ConfigWith(key, key.default_json);
    auto r = Parse(text);
    ASSERT_TRUE(r.ok()) << key.path << ": " << Message(r);
    if (key.default_depends_on_other_keys) continue;
    EXPECT_EQ(ConfigValueAt(ConfigToJson(*r), key.path), key.default_json) << key.path;
  }
}

TEST(ConfigKeyTableTest, TableDefaultsEqualTheConfigStructDefaults) {
  // Code that builds a Config{} by hand must see the same defaults as a parsed file.
  for (const ConfigKeyInfo& key : ConfigKeyTable()) {
    if (!key.has_default || key.default_depends_on_other_keys) continue;
    Config c;
    if (!key.only_for.empty()) c.scheduler.type = key.only_for[0];
    EXPECT_EQ(ConfigValueAt(ConfigToJson(c), key.path), key.default_json) << key.path;
  }
}

TEST(ConfigKeyTableTest, ConfigToJsonWritesEveryKey) {
  for (const char* type : {"", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"}) {
    Config c;
    c.scheduler.type = type;
    const std::string json = ConfigToJson(c);
    for (const ConfigKeyInfo& key : ConfigKeyTable()) {
      bool applies = key.only_for.empty();
      for (const std::string& t : key.only_for) applies |= t == type;
      EXPECT_EQ(ConfigValueAt(json, key.path).empty(), !applies) << key.path << " with scheduler " << type;
    }
  }
}

TEST(ConfigKeyTableTest, AutoIsRejectedForEveryKeyWithAnExplanation) {
  for (const ConfigKeyInfo& key : ConfigKeyTable()) {
    auto r = Parse(ConfigWith(key, "\"auto\""));
    ASSERT_FALSE(r.ok()) << key.path;
    EXPECT_TRUE(Contains(Message(r), "Hugging Face Trainer placeholder")) << Message(r);
  }
}

// ---------------------------------------------------------------------------------------------
// Defaults.

TEST(ConfigDefaultsTest, DefaultsEqualDeepSpeeds) {
  auto r = Parse(R"({"train_batch_size": 8})");
  ASSERT_TRUE(r.ok()) << Message(r);
  const Config& c = *r;
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 8);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.gradient_clipping, 1.0);
  EXPECT_EQ(c.steps_per_print, 10);
  EXPECT_FALSE(c.wall_clock_breakdown);
  EXPECT_EQ(c.gradient_allreduce_op, "mean");
  EXPECT_FALSE(c.prescale_gradients);
  EXPECT_EQ(c.gradient_predivide_factor, 1.0);
  EXPECT_TRUE(c.managed_gradient_accumulation);
  EXPECT_FALSE(c.freeze_inactive_parameters);
  EXPECT_FALSE(c.has_communication_data_type);
  EXPECT_FALSE(c.has_grad_accum_dtype);

  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.loss_scale, 0.0);
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_EQ(c.fp16.hysteresis, 2);
  EXPECT_FALSE(c.fp16.consecutive_hysteresis);
  EXPECT_EQ(c.fp16.min_loss_scale, 1.0);
  EXPECT_FALSE(c.bf16_enabled);
  EXPECT_EQ(c.model_dtype(), DType::kF32);

  EXPECT_EQ(c.optimizer.type, "AdamW");
  EXPECT_EQ(c.optimizer.beta1, 0.9);
  EXPECT_EQ(c.optimizer.beta2, 0.999);
  EXPECT_EQ(c.optimizer.lr, 1e-3);
  EXPECT_EQ(c.optimizer.eps, 1e-8);
  EXPECT_EQ(c.optimizer.weight_decay, 0.0);  // DeepSpeed's FusedAdam, not torch.optim.AdamW's 0.01
  EXPECT_TRUE(c.optimizer.adam_w_mode);

  EXPECT_EQ(c.scheduler.type, "");
  EXPECT_EQ(c.scheduler.warmup_min_lr, 0.0);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 1000);
  EXPECT_EQ(c.scheduler.warmup_type, "log");
  EXPECT_EQ(c.scheduler.warmup_min_ratio, 0.0);
  EXPECT_EQ(c.scheduler.cos_min_ratio, 1e-4);

  EXPECT_EQ(c.zero.stage, 0);
  EXPECT_TRUE(c.zero.contiguous_gradients);
  EXPECT_TRUE(c.zero.reduce_scatter);
  EXPECT_EQ(c.zero.reduce_bucket_size, 500000000);
  EXPECT_EQ(c.zero.allgather_bucket_size, 500000000);
  EXPECT_FALSE(c.zero.overlap_comm);
  EXPECT_FALSE(c.zero.overlap_comm_set);
  EXPECT_EQ(c.zero.sub_group_size, 1000000000);
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 50000000);
  EXPECT_EQ(c.zero.stage3_param_persistence_threshold, 100000);
  EXPECT_EQ(c.zero.stage3_max_live_parameters, 1000000000);
  EXPECT_EQ(c.zero.stage3_max_reuse_distance, 1000000000);
  EXPECT_FALSE(c.zero.stage3_gather_16bit_weights_on_model_save);
  EXPECT_FALSE(c.zero.round_robin_gradients);
  EXPECT_TRUE(c.zero.ignore_unused_parameters);

  const OffloadOptimizerConfig& oo = c.zero.offload_optimizer;
  EXPECT_EQ(oo.device, OffloadDevice::kNone);
  EXPECT_EQ(oo.buffer_count, 4);
  EXPECT_FALSE(oo.pipeline_read);
  EXPECT_FALSE(oo.pipeline_write);
  EXPECT_FALSE(oo.fast_init);
  EXPECT_EQ(oo.ratio, 1.0);
  EXPECT_TRUE(oo.pin_memory);
  const OffloadParamConfig& op = c.zero.offload_param;
  EXPECT_EQ(op.device, OffloadDevice::kNone);
  EXPECT_EQ(op.buffer_count, 5);
  EXPECT_EQ(op.buffer_size, 100000000);
  EXPECT_EQ(op.max_in_cpu, 1000000000);
  EXPECT_TRUE(op.pin_memory);

  EXPECT_EQ(c.aio.block_size, 1048576);
  EXPECT_EQ(c.aio.queue_depth, 8);
  EXPECT_EQ(c.aio.intra_op_parallelism, 1);
  EXPECT_FALSE(c.aio.single_submit);
  EXPECT_TRUE(c.aio.overlap_events);
  EXPECT_FALSE(c.aio.use_gds);
  EXPECT_TRUE(c.warnings.empty());
}

// DeepSpeed 0.19.8's default of every key, as the JSON text zero's table would write for it, read from
// its sources (runtime/constants.py, zero/config.py, zero/offload_config.py, precision_config.py, the
// aio constants, lr_schedules.py, FusedAdam). "" marks a key DeepSpeed does not have or gives no
// default. A key added to the table fails here until its DeepSpeed default is recorded.
const std::map<std::string, std::string>& DeepSpeedDefaults() {
  static const auto* d = new std::map<std::string, std::string>{
      {"train_batch_size", "null"},
      {"train_micro_batch_size_per_gpu", "null"},
      {"gradient_accumulation_steps", "null"},
      {"gradient_clipping", "1.0"},
      {"steps_per_print", "null"},
      {"wall_clock_breakdown", "false"},
      {"zero_trace.enabled", ""},
      {"zero_trace.path", ""},
      {"zero_trace.first_step", ""},
      {"zero_trace.last_step", ""},
      {"gradient_allreduce_op", "\"mean\""},
      {"prescale_gradients", "false"},
      {"gradient_predivide_factor", "1.0"},
      {"communication_data_type", "null"},
      {"managed_gradient_accumulation", "true"},
      {"freeze_inactive_parameters", ""},
      {"stop_on_nonfinite", ""},
      {"data_types.grad_accum_dtype", "null (the model dtype)"},  // same spelling, other meaning: ours is fp32
      {"fp16.enabled", "false"},
      {"fp16.loss_scale", "0.0"},
      {"fp16.initial_scale_power", "16"},
      {"fp16.loss_scale_window", "1000"},
      {"fp16.hysteresis", "2"},
      {"fp16.consecutive_hysteresis", "false"},
      {"fp16.min_loss_scale", "1.0"},
      {"fp16.fp16_master_weights_and_grads", "false"},
      {"bf16.enabled", "false"},
      {"bf16.bf16_master_weights_and_grads", "false"},
      {"bf16.bf16_optimizer_states", "false"},
      {"optimizer.type", ""},
      {"optimizer.params.lr", "0.001"},
      {"optimizer.params.betas", "[0.9,0.999]"},
      {"optimizer.params.eps", "1e-08"},
      {"optimizer.params.weight_decay", "0.0"},
      {"optimizer.params.adam_w_mode", "true"},
      {"scheduler.type", "\"\""},  // no scheduler: constant lr
      {"scheduler.params.warmup_min_lr", "0.0"},
      {"scheduler.params.warmup_max_lr", "-1.0"},  // WarmupLR: the optimizer's lr; WarmupDecayLR: 0.001
      {"scheduler.params.warmup_num_steps", "1000"},
      {"scheduler.params.warmup_type", "\"log\""},
      {"scheduler.params.total_num_steps", "null"},
      {"scheduler.params.warmup_min_ratio", "0.0"},
      {"scheduler.params.cos_min_ratio", "0.0001"},
      {"zero_optimization.stage", "0"},
      {"zero_optimization.contiguous_gradients", "true"},
      {"zero_optimization.reduce_scatter", "true"},
      {"zero_optimization.reduce_bucket_size", "500000000"},
      {"zero_optimization.allgather_bucket_size", "500000000"},
      {"zero_optimization.overlap_comm", "false"},  // true at stage 3 (checked below)
      {"zero_optimization.sub_group_size", "1000000000"},
      {"zero_optimization.stage3_prefetch_bucket_size", "50000000"},
      {"zero_optimization.stage3_param_persistence_threshold", "100000"},
      {"zero_optimization.stage3_max_live_parameters", "1000000000"},
      {"zero_optimization.stage3_max_reuse_distance", "1000000000"},
      {"zero_optimization.stage3_gather_16bit_weights_on_model_save", "false"},
      {"zero_optimization.round_robin_gradients", "false"},
      {"zero_optimization.ignore_unused_parameters", "true"},
      {"zero_optimization.offload_grad_accumulation", ""},
      {"zero_optimization.legacy_stage1", "false"},
      {"zero_optimization.zero_hpz_partition_size", "1"},
      {"zero_optimization.zero_quantized_weights", "false"},
      {"zero_optimization.zero_quantized_nontrainable_weights", "false"},
      {"zero_optimization.zero_quantized_gradients", "false"},
      {"zero_optimization.zenflow", "null"},
      {"zero_optimization.offload_optimizer.device", "\"none\""},
      {"zero_optimization.offload_optimizer.nvme_path", "\"\""},  // theirs None: unset
      {"zero_optimization.offload_optimizer.buffer_count", "4"},
      {"zero_optimization.offload_optimizer.pin_memory", "true"},
      {"zero_optimization.offload_optimizer.pipeline_read", "false"},
      {"zero_optimization.offload_optimizer.pipeline_write", "false"},
      {"zero_optimization.offload_optimizer.fast_init", "false"},
      {"zero_optimization.offload_optimizer.ratio", "1.0"},
      {"zero_optimization.offload_optimizer.super_offload", "false"},
      {"zero_optimization.offload_optimizer.cpu_threads", ""},
      {"zero_optimization.offload_optimizer.pin_memory_fallback", ""},
      {"zero_optimization.offload_optimizer.host_memory_budget", ""},
      {"zero_optimization.offload_optimizer.update_device", ""},
      {"zero_optimization.offload_optimizer.chunk_size", ""},
      {"zero_optimization.offload_optimizer.chunk_buffers", ""},
      {"zero_optimization.offload_optimizer.overlap_step", ""},
      {"zero_optimization.offload_param.device", "\"none\""},
      {"zero_optimization.offload_param.nvme_path", "\"\""},
      {"zero_optimization.offload_param.buffer_count", "5"},
      {"zero_optimization.offload_param.buffer_size", "100000000"},
      {"zero_optimization.offload_param.max_in_cpu", "1000000000"},
      {"zero_optimization.offload_param.pin_memory", "true"},
      {"zero_optimization.offload_param.pin_memory_fallback", ""},
      {"aio.block_size", "1048576"},
      {"aio.queue_depth", "8"},
      {"aio.intra_op_parallelism", "1"},
      {"aio.single_submit", "false"},
      {"aio.overlap_events", "true"},
      {"aio.use_gds", "false"},
      {"aio.allow_buffered_fallback", ""},
  };
  return *d;
}

bool ListedAsDifference(const std::string& path) {
  for (const ConfigDifference& d : DeepSpeedDifferences()) {
    if (d.key == path) return true;
  }
  return false;
}

TEST(ConfigDefaultsTest, EveryDefaultIsDeepSpeedsOrAListedDifference) {
  int same = 0;
  for (const ConfigKeyInfo& key : ConfigKeyTable()) {
    const auto it = DeepSpeedDefaults().find(key.path);
    ASSERT_NE(it, DeepSpeedDefaults().end()) << key.path << ": record DeepSpeed 0.19.8's default in this test";
    const std::string ours = key.has_default ? key.default_json : "null";
    if (it->second == ours) {
      ++same;
      EXPECT_FALSE(ListedAsDifference(key.path))
          << key.path << " equals DeepSpeed's default " << ours << " but docs/config.md lists it as a difference";
    } else {
      EXPECT_TRUE(ListedAsDifference(key.path))
          << key.path << ": zero's default " << ours << " is not DeepSpeed 0.19.8's "
          << (it->second.empty() ? "(no such key)" : it->second) << " and is not listed in DeepSpeedDifferences()";
    }
  }
  EXPECT_EQ(DeepSpeedDefaults().size(), ConfigKeyTable().size()) << "a key in DeepSpeedDefaults() left the table";
  EXPECT_GT(same, 60);
  // The two defaults changed to DeepSpeed's, and the ones DeepSpeed resolves from other keys.
  EXPECT_FALSE(ListedAsDifference("optimizer.params.weight_decay"));
  EXPECT_FALSE(ListedAsDifference("zero_optimization.offload_optimizer.pin_memory"));
  EXPECT_FALSE(ListedAsDifference("zero_optimization.offload_param.pin_memory"));
  for (const char* type : {"Adam", "AdamW"}) {
    auto r = Parse(std::string(R"({"train_batch_size": 8, "optimizer": {"type": ")") + type + R"("},
                   "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                   "offload_param": {"device": "cpu"}}})");
    ASSERT_TRUE(r.ok()) << Message(r);
    EXPECT_EQ(r->optimizer.weight_decay, 0.0) << type;
    EXPECT_TRUE(r->zero.overlap_comm);
    EXPECT_TRUE(r->zero.offload_optimizer.pin_memory);
    EXPECT_TRUE(r->zero.offload_param.pin_memory);
  }
}

TEST(ConfigDefaultsTest, DifferencesAreDocumented) {
  const std::string md = ConfigReferenceMarkdown();
  ASSERT_TRUE(Contains(md, "\n## Differences from DeepSpeed 0.19.8\n"));
  ASSERT_GE(DeepSpeedDifferences().size(), 5u);
  for (const ConfigDifference& d : DeepSpeedDifferences()) {
    EXPECT_FALSE(d.theirs.empty() || d.ours.empty() || d.why.empty()) << d.key;
    EXPECT_TRUE(Contains(md, d.why)) << d.key;
  }
}

TEST(ConfigDefaultsTest, OverlapCommDefaultsToTrueAtStage3Only) {
  for (int stage = 0; stage <= 3; ++stage) {
    auto r = Parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": )" + std::to_string(stage) + "}}");
    ASSERT_TRUE(r.ok()) << Message(r);
    EXPECT_EQ(r->zero.overlap_comm, stage == 3) << stage;
    EXPECT_FALSE(r->zero.overlap_comm_set);
  }
  auto r = Parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "overlap_comm": false}})");
  ASSERT_TRUE(r.ok()) << Message(r);
  EXPECT_FALSE(r->zero.overlap_comm);
  EXPECT_TRUE(r->zero.overlap_comm_set);
  r = Parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "overlap_comm": true}})");
  ASSERT_TRUE(r.ok()) << Message(r);
  EXPECT_TRUE(r->zero.overlap_comm);
}

TEST(ConfigDefaultsTest, OffloadKeysOfZeros) {
  // Defaults: threads from the hardware, no fallback from a failed pin, no host tier, O_DIRECT required.
  auto d = Parse(R"({"train_batch_size": 8})");
  ASSERT_TRUE(d.ok()) << Message(d);
  EXPECT_EQ(d->zero.offload_optimizer.cpu_threads, 0);
  EXPECT_FALSE(d->zero.offload_optimizer.pin_memory_fallback);
  EXPECT_EQ(d->zero.offload_optimizer.host_memory_budget, 0);
  EXPECT_FALSE(d->zero.offload_param.pin_memory_fallback);
  EXPECT_FALSE(d->aio.allow_buffered_fallback);
  EXPECT_EQ(d->zero.offload_grad_accumulation, "cpu");
  // Each parsed into its own field (the two fallbacks independently of each other).
  auto r = Parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
                   "offload_optimizer": {"device": "nvme", "nvme_path": "/n", "cpu_threads": 7,
                                         "pin_memory": true, "pin_memory_fallback": true,
                                         "host_memory_budget": 8e9},
                   "offload_param": {"device": "cpu", "pin_memory": true}},
                   "aio": {"allow_buffered_fallback": true}})");
  ASSERT_TRUE(r.ok()) << Message(r);
  EXPECT_EQ(r->zero.offload_optimizer.cpu_threads, 7);
  EXPECT_TRUE(r->zero.offload_optimizer.pin_memory_fallback);
  EXPECT_FALSE(r->zero.offload_param.pin_memory_fallback);
  EXPECT_EQ(r->zero.offload_optimizer.host_memory_budget, 8000000000);
  EXPECT_TRUE(r->aio.allow_buffered_fallback);
  auto p = Parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
                   "offload_param": {"device": "cpu", "pin_memory_fallback": true}}})");
  ASSERT_TRUE(p.ok()) << Message(p);
  EXPECT_TRUE(p->zero.offload_param.pin_memory_fallback);
  EXPECT_FALSE(p->zero.offload_optimizer.pin_memory_fallback);
  // A budget beyond 32 bits is kept exactly (bytes of a large host).
  auto big = Parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 1,
                     "offload_optimizer": {"device": "nvme", "nvme_path": "/n",
                                           "host_memory_budget": 549755813888}}})");
  ASSERT_TRUE(big.ok()) << Message(big);
  EXPECT_EQ(big->zero.offload_optimizer.host_memory_budget, int64_t{1} << 39);
  // Bad types and values name the full path.
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 8, "zero_optimization": {"offload_optimizer":
                              {"cpu_threads": 2.5}}})")),
            "<config>: zero_optimization.offload_optimizer.cpu_threads: expected an integer in 0..1024, got 2.5");
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 8, "zero_optimization": {"offload_optimizer":
                              {"host_memory_budget": "64GB"}}})")),
            "<config>: zero_optimization.offload_optimizer.host_memory_budget: expected an integer in "
            "0..9007199254740991, got "
            "\"64GB\"");
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 8, "aio": {"allow_buffered_fallback": 1}})")),
            "<config>: aio.allow_buffered_fallback: expected true or false, got 1");
}

// update_device "gpu" (the chunked GPU update of host states): off by default, only with device
// "cpu", chunk sizes validated, every problem in one error.
TEST(ConfigDefaultsTest, ChunkedGpuUpdateKeys) {
  auto d = Parse(R"({"train_batch_size": 8})");
  ASSERT_TRUE(d.ok()) << Message(d);
  EXPECT_EQ(d->zero.offload_optimizer.update_device, "cpu");
  EXPECT_EQ(d->zero.offload_optimizer.chunk_size, int64_t{1} << 24);
  EXPECT_EQ(d->zero.offload_optimizer.chunk_buffers, 3);
  auto r = Parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2,
                   "offload_optimizer": {"device": "cpu", "update_device": "gpu", "chunk_size": 1000,
                                         "chunk_buffers": 2}}})");
  ASSERT_TRUE(r.ok()) << Message(r);
  EXPECT_EQ(r->zero.offload_optimizer.update_device, "gpu");
  EXPECT_EQ(r->zero.offload_optimizer.chunk_size, 1000);
  EXPECT_EQ(r->zero.offload_optimizer.chunk_buffers, 2);
  EXPECT_EQ(ConfigValueAt(ConfigToJson(*r), "zero_optimization.offload_optimizer.update_device"), "\"gpu\"");
  for (const char* device : {"none", "nvme"}) {
    const std::string m = Message(Parse(std::string(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2,
        "offload_optimizer": {"nvme_path": "/n", "update_device": "gpu", "device": ")") +
                                        device + "\"}}}"));
    EXPECT_TRUE(Contains(m,
                         "zero_optimization.offload_optimizer.update_device: expected \"cpu\" unless "
                         "zero_optimization.offload_optimizer.device is \"cpu\""))
        << m;
    EXPECT_TRUE(Contains(m, std::string("device is \"") + device + "\")")) << m;
  }
  const std::string bad = Message(Parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2,
      "offload_optimizer": {"device": "cpu", "update_device": "GPU", "chunk_size": 0, "chunk_buffers": 1}}})"));
  EXPECT_TRUE(Contains(bad, "zero_optimization.offload_optimizer.update_device")) << bad;
  EXPECT_TRUE(Contains(
      bad, "zero_optimization.offload_optimizer.chunk_size: expected an integer in 1..9007199254740991, got 0"))
      << bad;
  EXPECT_TRUE(Contains(bad, "zero_optimization.offload_optimizer.chunk_buffers: expected an integer in 2..1024, got 1"))
      << bad;
  const std::string md = ConfigReferenceMarkdown();
  EXPECT_TRUE(Contains(md, "| `zero_optimization.offload_optimizer.update_device` |")) << "docs/config.md";
  EXPECT_TRUE(Contains(md, "| `zero_optimization.offload_optimizer.chunk_size` |"));
  EXPECT_TRUE(Contains(md, "| `zero_optimization.offload_optimizer.chunk_buffers` |"));
}

// overlap_step: off by default, only with update_device "gpu", in the resolved JSON and the docs.
TEST(ConfigDefaultsTest, OverlapStepKey) {
  auto d = Parse(R"({"train_batch_size": 8})");
  ASSERT_TRUE(d.ok()) << Message(d);
  EXPECT_FALSE(d->zero.offload_optimizer.overlap_step);
  auto r = Parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
                   "offload_optimizer": {"device": "cpu", "update_device": "gpu", "overlap_step": true}}})");
  ASSERT_TRUE(r.ok()) << Message(r);
  EXPECT_TRUE(r->zero.offload_optimizer.overlap_step);
  EXPECT_EQ(ConfigValueAt(ConfigToJson(*r), "zero_optimization.offload_optimizer.overlap_step"), "true");
  for (const char* extra : {"", R"("device": "cpu", )"}) {
    const std::string m = Message(Parse(std::string(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
        "offload_optimizer": {)") + extra +
                                        R"("overlap_step": true}}})"));
    EXPECT_TRUE(Contains(m,
                         "zero_optimization.offload_optimizer.overlap_step: expected false unless "
                         "zero_optimization.offload_optimizer.update_device is \"gpu\""))
        << m;
    EXPECT_TRUE(Contains(m, "update_device is \"cpu\")")) << m;
  }
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 8, "zero_optimization": {"offload_optimizer":
                              {"overlap_step": 1}}})")),
            "<config>: zero_optimization.offload_optimizer.overlap_step: expected true or false, got 1");
  EXPECT_TRUE(Contains(ConfigReferenceMarkdown(), "| `zero_optimization.offload_optimizer.overlap_step` |"));
}

TEST(ConfigDefaultsTest, FreezeInactiveParameters) {
  auto r = Parse(R"({"train_batch_size": 8})");
  ASSERT_TRUE(r.ok()) << Message(r);
  EXPECT_FALSE(r->freeze_inactive_parameters);
  EXPECT_EQ(ConfigValueAt(ConfigToJson(*r), "freeze_inactive_parameters"), "false");
  for (const char* managed : {"true", "false"}) {
    r = Parse(std::string(R"({"train_batch_size": 8, "freeze_inactive_parameters": true,
                            "managed_gradient_accumulation": )") +
              managed + "}");
    ASSERT_TRUE(r.ok()) << Message(r);
    EXPECT_TRUE(r->freeze_inactive_parameters) << managed;
    EXPECT_EQ(ConfigValueAt(ConfigToJson(*r), "freeze_inactive_parameters"), "true");
  }
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 8, "freeze_inactive_parameters": "yes"})")),
            "<config>: freeze_inactive_parameters: expected true or false, got \"yes\"");
  EXPECT_TRUE(Contains(ConfigReferenceMarkdown(), "| `freeze_inactive_parameters` | boolean | `false` |"));
}

TEST(ConfigDefaultsTest, ModelDtypeFollowsFp16AndBf16) {
  auto r = Parse(R"({"train_batch_size": 8, "fp16": {"enabled": true}})");
  ASSERT_TRUE(r.ok()) << Message(r);
  EXPECT_EQ(r->model_dtype(), DType::kF16);
  r = Parse(R"({"train_batch_size": 8, "bf16": {"enabled": true}})");
  ASSERT_TRUE(r.ok()) << Message(r);
  EXPECT_EQ(r->model_dtype(), DType::kBF16);
}

// ---------------------------------------------------------------------------------------------
// Specific values and types.

TEST(ConfigValuesTest, IntegralFloatsAreIntegers) {
  auto r = Parse(R"({"train_batch_size": 8.0, "zero_optimization": {"reduce_bucket_size": 5e8,
                     "stage3_max_live_parameters": 1E9, "stage": 2.0}})");
  ASSERT_TRUE(r.ok()) << Message(r);
  EXPECT_EQ(r->train_batch_size, 8);
  EXPECT_EQ(r->zero.reduce_bucket_size, 500000000);
  EXPECT_EQ(r->zero.stage3_max_live_parameters, 1000000000);
  EXPECT_EQ(r->zero.stage, 2);
}

TEST(ConfigValuesTest, NonIntegralOrHugeNumbersAreNotIntegers) {
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 8.5})")),
            "<config>: train_batch_size: expected an integer in 1..9007199254740991, got 8.5");
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 8, "zero_optimization": {"reduce_bucket_size": 1e30}})")),
            "<config>: zero_optimization.reduce_bucket_size: expected an integer in 1..9007199254740991, got 1e+30");
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 8, "fp16": {"hysteresis": 3000000000}})")),
            "<config>: fp16.hysteresis: expected an integer >= 1, got 3000000000");
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 7}})")),
            "<config>: zero_optimization.stage: expected an integer in 0..3, got 7");
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": -1}})")),
            "<config>: zero_optimization.stage: expected an integer in 0..3, got -1");
}

TEST(ConfigValuesTest, TypeErrorsShowTheValue) {
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": "8"})")),
            "<config>: train_batch_size: expected an integer in 1..9007199254740991, got \"8\"");
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 8, "fp16": {"enabled": 1}})")),
            "<config>: fp16.enabled: expected true or false, got 1");
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 8, "zero_optimization": 2})")),
            "<config>: zero_optimization: expected an object, got 2");
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 8, "zero_optimization": {"offload_optimizer": {"device": "gpu"}}})")),
            "<config>: zero_optimization.offload_optimizer.device: expected one of \"none\", \"cpu\", \"nvme\", got "
            "\"gpu\"");
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 8, "optimizer": {"params": {"betas": [0.9, 1.5]}}})")),
            "<config>: optimizer.params.betas: expected [beta1, beta2] with each in [0, 1), got [0.9,1.5]");
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 8, "communication_data_type": "int8"})")),
            "<config>: communication_data_type: expected one of \"fp32\", \"fp16\", \"bf16\", or null, got "
            "\"int8\"");
}

TEST(ConfigValuesTest, DtypesAcceptAliasesAndNull) {
  auto r = Parse(R"({"train_batch_size": 8, "communication_data_type": "bfloat16",
                     "data_types": {"grad_accum_dtype": "float32"}})");
  ASSERT_TRUE(r.ok()) << Message(r);
  EXPECT_TRUE(r->has_communication_data_type);
  EXPECT_EQ(r->communication_data_type, DType::kBF16);
  EXPECT_TRUE(r->has_grad_accum_dtype);
  EXPECT_EQ(r->grad_accum_dtype, DType::kF32);
  r = Parse(R"({"train_batch_size": 8, "communication_data_type": null})");
  ASSERT_TRUE(r.ok()) << Message(r);
  EXPECT_FALSE(r->has_communication_data_type);
}

TEST(ConfigValuesTest, AutoNamesTheHuggingFaceTrainer) {
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": "auto"})")),
            "<config>: train_batch_size: expected an integer in 1..9007199254740991, got \"auto\" (\"auto\" is a "
            "Hugging Face "
            "Trainer placeholder: the Trainer replaces it with a number before DeepSpeed reads the config; "
            "replace it with the value you want)");
  EXPECT_TRUE(Contains(Message(Parse(R"({"train_batch_size": 8, "zero_optimization": "auto"})")),
                       "zero_optimization: expected an object, got \"auto\" (\"auto\" is a Hugging Face"));
}

// ---------------------------------------------------------------------------------------------
// Malformed JSON.

TEST(ConfigJsonTest, MalformedJsonReportsLineAndColumn) {
  const std::string text = "{\n  \"train_batch_size\": 8,\n  \"fp16\": {\"enabled\": tru}\n}\n";
  auto r = Parse(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(Message(r), "<config>: malformed JSON at line 3, column 26: ")) << Message(r);
  EXPECT_FALSE(Contains(Message(r), "[json.exception")) << Message(r);
}

TEST(ConfigJsonTest, TrailingCommaAndMissingBrace) {
  auto r = Parse("{\"train_batch_size\": 8,\n}");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(Message(r), "malformed JSON at line 2, column 1: ")) << Message(r);
  r = Parse("{\"train_batch_size\": 8,\n \"fp16\": {\"enabled\": true}\n");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(Message(r), "malformed JSON at line 3, column 1: ")) << Message(r);
  r = Parse("");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(Message(r), "malformed JSON at line 1, column 1: ")) << Message(r);
}

// ---------------------------------------------------------------------------------------------
// Hostile input (issue 23): each case is a clear error within seconds, never a signal or an abort.

double SecondsToParse(const std::string& text, Result<Config>* out, bool strict = false) {
  const auto t0 = std::chrono::steady_clock::now();
  *out = Parse(text, 1, strict);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// `head`, then 200k members "unknown_key_<i>": 1 (each after a comma), then `tail`: a file of many
// unknown keys, at the top level or inside a block.
std::string WithManyUnknownKeys(const std::string& head, const std::string& tail) {
  std::string text = head;
  for (int i = 0; i < 200000; ++i) text += ", \"unknown_key_" + std::to_string(i) + "\": 1";
  return text + tail;
}

TEST(ConfigHostileTest, DeepNestingIsAnErrorNotACrash) {
  // A value nested 100k levels used to crash (SIGSEGV) while the error message printed it.
  std::string text = "{\"train_batch_size\": ";
  for (int i = 0; i < 100000; ++i) text += "[";
  text += "8";
  for (int i = 0; i < 100000; ++i) text += "]";
  text += "}";
  Result<Config> r = InvalidArgumentError("unset");
  EXPECT_LT(SecondsToParse(text, &r), 5.0);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(Message(r), "<config>: JSON nested deeper than 100 levels at line 1, column 121 "))
      << Message(r);
}

TEST(ConfigHostileTest, NumberBeyondDoubleIsAnErrorNamingTheKey) {
  // 1e400 used to end the process with an uncaught std::out_of_range.
  auto r = Parse("{\"train_batch_size\": 8,\n \"optimizer\": {\"params\": {\"lr\": 1e400}}}");
  EXPECT_EQ(Message(r),
            "<config>: number 1e400 at line 2, column 33 (key 'optimizer.params.lr') is outside the range of a double "
            "(magnitude at most 1.8e308)");
  r = Parse("{\"train_batch_size\": -1" + std::string(400, '0') + "}");
  EXPECT_TRUE(Contains(Message(r), "at line 1, column 22 (key 'train_batch_size') is outside the range of a double"))
      << Message(r);
}

TEST(ConfigHostileTest, DuplicateKeyIsAnError) {
  // nlohmann kept the last of two values silently; DeepSpeed refuses duplicate keys.
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "stage": 0}})")),
            "<config>: duplicate key 'zero_optimization.stage': JSON gives a key one value (DeepSpeed refuses "
            "duplicate keys too); remove one of them");
}

TEST(ConfigHostileTest, ManyUnknownKeysParseInLinearTimeAndAreCounted) {
  // 200k unknown keys (4.7 MB) took minutes: nlohmann's ordered object searched every earlier key on
  // each insert, and each key's suggestion rebuilt the list of known names.
  const std::string text = WithManyUnknownKeys("{\"train_batch_size\": 8", "}");
  Result<Config> r = InvalidArgumentError("unset");
  EXPECT_LT(SecondsToParse(text, &r), 10.0) << text.size() << " bytes";
  ASSERT_TRUE(r.ok()) << Message(r);
  ASSERT_EQ(r->warnings.size(), 101u);
  EXPECT_EQ(r->warnings[0], "<config>: unknown key 'unknown_key_0'");
  EXPECT_EQ(r->warnings[100], "<config>: unknown keys: 199900 more not listed (200000 in all; the first 100 are)");
  EXPECT_LT(SecondsToParse(text, &r, /*strict=*/true), 10.0);
  EXPECT_TRUE(Contains(Message(r), "<config>: 101 problems in the config:\n  <config>: unknown key 'unknown_key_0'"))
      << Message(r).substr(0, 200);
  EXPECT_TRUE(Contains(Message(r), "\n  <config>: unknown keys: 199900 more not listed")) << Message(r).size();
}

TEST(ConfigHostileTest, BatchArithmeticIsCheckedNamingTheKey) {
  // gradient_accumulation_steps 2^62 at world size 4 overflowed train_batch_size to 0 and the job ran
  // forever making no progress.
  EXPECT_EQ(
      Message(Parse(R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4611686018427387904})", 4)),
      "<config>: gradient_accumulation_steps: expected an integer in 1..2147483647, got 4611686018427387904");
  // Each key within its bounds, their product beyond int64.
  EXPECT_EQ(
      Message(Parse(R"({"train_micro_batch_size_per_gpu": 2147483647, "gradient_accumulation_steps": 2147483647})", 4)),
      "<config>: train_batch_size: expected an integer in 1..9007199254740991 (it is derived: "
      "train_micro_batch_size_per_gpu x gradient_accumulation_steps x world_size = 2147483647 x 2147483647 x 4), "
      "got more than 9223372036854775807");
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2147483647,
                              "gradient_accumulation_steps": 2147483647})",
                          4)),
            "<config>: train_batch_size: expected train_micro_batch_size_per_gpu x gradient_accumulation_steps x "
            "world_size = 2147483647 x 2147483647 x 4 = more than 9223372036854775807, got 4");
  // train_batch_size 2^62 failed at the first batch with "batch must be >= 1 and step >= 0", naming no
  // key; 2^63 - 2 ended the ranks with length_error.
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 4611686018427387904})")),
            "<config>: train_batch_size: expected an integer in 1..9007199254740991, got 4611686018427387904");
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 9223372036854775806})")),
            "<config>: train_batch_size: expected an integer in 1..9007199254740991, got 9223372036854775806");
  // Within its own bounds, train_batch_size derives a micro batch beyond its bounds.
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 9007199254740990})", 2)),
            "<config>: train_micro_batch_size_per_gpu: expected an integer in 1..2147483647 (it is derived: "
            "train_batch_size / world_size = 9007199254740990 / 2), got 4503599627370495");
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 4294967296, "train_micro_batch_size_per_gpu": 1})")),
            "<config>: gradient_accumulation_steps: expected an integer in 1..2147483647 (it is derived: "
            "train_batch_size / (train_micro_batch_size_per_gpu x world_size) = 4294967296 / (1 x 1)), got 4294967296");
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 4294967296, "gradient_accumulation_steps": 1})")),
            "<config>: train_micro_batch_size_per_gpu: expected an integer in 1..2147483647 (it is derived: "
            "train_batch_size / (gradient_accumulation_steps x world_size) = 4294967296 / (1 x 1)), got 4294967296");
  // The largest values that fit still parse.
  auto r = Parse(R"({"train_micro_batch_size_per_gpu": 2147483647, "gradient_accumulation_steps": 4194304})");
  ASSERT_TRUE(r.ok()) << Message(r);
  EXPECT_EQ(r->train_batch_size, int64_t{2147483647} * 4194304);
}

TEST(ConfigHostileTest, AbsurdValuesAreRefusedAtTheirUpperBound) {
  // Each used to pass and then abort the ranks (bad_alloc starting 1e9 threads) or train into NaN
  // (eps 1e-320 is 0 in fp32; lr 1e308 is inf in fp32).
  EXPECT_EQ(
      Message(Parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 1,
                              "offload_optimizer": {"device": "cpu", "cpu_threads": 1000000000}}})")),
      "<config>: zero_optimization.offload_optimizer.cpu_threads: expected an integer in 0..1024, got 1000000000");
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 8, "optimizer": {"params": {"eps": 1e-320}}})")),
            "<config>: optimizer.params.eps: expected a number in [1e-37, 1e+38], got 1e-320");
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 8, "optimizer": {"params": {"lr": 1e308}}})")),
            "<config>: optimizer.params.lr: expected a number in [0, 1e+38], got 1e+308");
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 8, "aio": {"queue_depth": 1000000}})")),
            "<config>: aio.queue_depth: expected an integer in 1..65536, got 1000000");
}

TEST(ConfigJsonTest, TopLevelMustBeAnObject) {
  EXPECT_EQ(Message(Parse("[1, 2]")), "<config>: expected a JSON object at the top level, got [1,2]");
}

TEST(ConfigJsonTest, SourceNamesTheFile) {
  ParseOptions options;
  options.source = "ds_config.json";
  auto r = ParseConfig(R"({"train_batch_size": 0})", options);
  EXPECT_EQ(Message(r), "ds_config.json: train_batch_size: expected an integer in 1..9007199254740991, got 0");
}

TEST(ConfigJsonTest, LoadConfigFileUsesThePathAsSource) {
  auto r = LoadConfigFile("engine/config/testdata/does_not_exist.json", ParseOptions());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(Message(r), "engine/config/testdata/does_not_exist.json")) << Message(r);
  r = LoadConfigFile("engine/config/testdata/hf_trainer_auto.json", ParseOptions());
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(Message(r), "engine/config/testdata/hf_trainer_auto.json: fp16.enabled: ")) << Message(r);
}

TEST(ConfigJsonTest, ADirectoryOrAPipeIsNotAConfigFile) {
  // A directory was reported as malformed JSON; a named pipe blocked open() forever.
  auto r = LoadConfigFile("engine/config/testdata", ParseOptions());
  EXPECT_EQ(
      Message(r),
      "config engine/config/testdata: not a regular file (it is a directory); give the path of the JSON config file");
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string fifo = std::string(tmp != nullptr ? tmp : "/tmp") + "/config_fifo." + std::to_string(::getpid());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string message = "(hung)";
  std::thread reader([&] { message = Message(LoadConfigFile(fifo, ParseOptions())); });
  for (int i = 0; i < 500 && message == "(hung)"; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (message == "(hung)") {
    // Unblock the reader (an old build opened the pipe blocking) so that the test can end.
    const int fd = ::open(fifo.c_str(), O_WRONLY);
    if (fd >= 0) ::close(fd);
  }
  reader.join();
  ::unlink(fifo.c_str());
  EXPECT_EQ(message,
            "config " + fifo + ": not a regular file (it is a named pipe); give the path of the JSON config file");
}

// ---------------------------------------------------------------------------------------------
// Unknown keys.

TEST(ConfigUnknownKeysTest, WarningWithSuggestion) {
  // aio is not one of the blocks DeepSpeed validates strictly: an unknown key there is a warning.
  auto r = Parse(R"({"train_batch_size": 8, "aio": {"queue_dept": 2}})");
  ASSERT_TRUE(r.ok()) << Message(r);
  ASSERT_EQ(r->warnings.size(), 1u);
  EXPECT_EQ(r->warnings[0], "<config>: unknown key 'aio.queue_dept' (did you mean 'queue_depth'?)");
  EXPECT_EQ(r->aio.queue_depth, 8);
}

TEST(ConfigUnknownKeysTest, StrictMakesThemErrors) {
  auto r = Parse(R"({"train_batch_size": 8, "aio": {"queue_dept": 2}})", 1, /*strict=*/true);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(r), "<config>: unknown key 'aio.queue_dept' (did you mean 'queue_depth'?)");
}

TEST(ConfigUnknownKeysTest, KeyInTheWrongBlockSuggestsTheFullPath) {
  auto r = Parse(R"({"train_batch_size": 8, "stage": 2})");
  ASSERT_TRUE(r.ok()) << Message(r);
  ASSERT_EQ(r->warnings.size(), 1u);
  EXPECT_EQ(r->warnings[0], "<config>: unknown key 'stage' (did you mean 'zero_optimization.stage'?)");
}

TEST(ConfigUnknownKeysTest, NoSuggestionForUnrelatedNames) {
  auto r = Parse(R"({"train_batch_size": 8, "my_custom_block": {"x": 1}})");
  ASSERT_TRUE(r.ok()) << Message(r);
  ASSERT_EQ(r->warnings.size(), 1u);
  EXPECT_EQ(r->warnings[0], "<config>: unknown key 'my_custom_block'");
}

TEST(ConfigUnknownKeysTest, TyposInARealisticFile) {
  ParseOptions options;
  options.world_size = 2;
  // By default the top-level 'gradient_accumulation_step' (one edit from a key) is an error, and so
  // are the two unknown keys in zero_optimization (a block DeepSpeed validates); the rest are notes.
  EXPECT_EQ(Message(LoadConfigFile("engine/config/testdata/typos.json", options)),
            "engine/config/testdata/typos.json: 3 problems in the config:\n"
            "  engine/config/testdata/typos.json: unknown key 'zero_optimization.reduce_bucket_sze' (did you mean "
            "'reduce_bucket_size'?): an unknown key in 'zero_optimization' is an error (DeepSpeed 0.19.8 refuses it "
            "too)\n"
            "  engine/config/testdata/typos.json: unknown key 'zero_optimization.overlap_com' (did you mean "
            "'overlap_comm'?): an unknown key in 'zero_optimization' is an error (DeepSpeed 0.19.8 refuses it too)\n"
            "  engine/config/testdata/typos.json: unknown key 'gradient_accumulation_step' (did you mean "
            "'gradient_accumulation_steps'?): a top-level key one edit from a known one is an error, since everything "
            "under it would be ignored\n"
            "  note: engine/config/testdata/typos.json: unknown key 'optimizer.params.weight_decy' (did you mean "
            "'weight_decay'?)\n"
            "  note: engine/config/testdata/typos.json: unknown key 'stage3_prefetch_bucket_size' (did you mean "
            "'zero_optimization.stage3_prefetch_bucket_size'?)");
  options.top_level_typos_are_errors = false;
  options.unknown_keys_in_validated_blocks_are_errors = false;
  auto r = LoadConfigFile("engine/config/testdata/typos.json", options);
  ASSERT_TRUE(r.ok()) << Message(r);
  const std::string src = "engine/config/testdata/typos.json: ";
  EXPECT_EQ(r->warnings,
            (std::vector<std::string>{
                src + "unknown key 'zero_optimization.reduce_bucket_sze' (did you mean 'reduce_bucket_size'?)",
                src + "unknown key 'zero_optimization.overlap_com' (did you mean 'overlap_comm'?)",
                src + "unknown key 'optimizer.params.weight_decy' (did you mean 'weight_decay'?)",
                src + "unknown key 'stage3_prefetch_bucket_size' (did you mean "
                      "'zero_optimization.stage3_prefetch_bucket_size'?)",
                src + "unknown key 'gradient_accumulation_step' (did you mean 'gradient_accumulation_steps'?)",
            }));
  // The misspelled keys took no effect.
  EXPECT_EQ(r->gradient_accumulation_steps, 1);
  EXPECT_EQ(r->train_batch_size, 8);
  EXPECT_FALSE(r->zero.overlap_comm);
  // Strict: all five in one error.
  auto strict =
      LoadConfigFile("engine/config/testdata/typos.json", ParseOptions{2, true, "typos.json", false, true, false});
  EXPECT_EQ(Message(strict),
            "typos.json: 5 problems in the config:\n"
            "  typos.json: unknown key 'zero_optimization.reduce_bucket_sze' (did you mean 'reduce_bucket_size'?)\n"
            "  typos.json: unknown key 'zero_optimization.overlap_com' (did you mean 'overlap_comm'?)\n"
            "  typos.json: unknown key 'optimizer.params.weight_decy' (did you mean 'weight_decay'?)\n"
            "  typos.json: unknown key 'stage3_prefetch_bucket_size' (did you mean "
            "'zero_optimization.stage3_prefetch_bucket_size'?)\n"
            "  typos.json: unknown key 'gradient_accumulation_step' (did you mean 'gradient_accumulation_steps'?)");
}

TEST(ConfigUnknownKeysTest, TopLevelKeyOneEditFromAKnownOneIsAnError) {
  // 'zero_optimisation' only warned, and the job trained at stage 0.
  const std::string text = R"({"train_batch_size": 8, "zero_optimisation": {"stage": 3}})";
  EXPECT_EQ(Message(Parse(text)),
            "<config>: unknown key 'zero_optimisation' (did you mean 'zero_optimization'?): a top-level key one edit "
            "from a known one is an error, since everything under it would be ignored");
  EXPECT_TRUE(Contains(Message(Parse(R"({"train_batch_size": 8, "FP16": {"enabled": true}})")),
                       "unknown key 'FP16' (did you mean 'fp16'?): a top-level key one edit"));
  EXPECT_TRUE(Contains(Message(Parse(R"({"train_batch_size": 8, "steps_per_prnt": 5})")),
                       "unknown key 'steps_per_prnt' (did you mean 'steps_per_print'?): a top-level key one edit"));
  // The opt-out makes it a warning; farther names and nested typos stay warnings.
  ParseOptions lenient;
  lenient.top_level_typos_are_errors = false;
  auto r = ParseConfig(text, lenient);
  ASSERT_TRUE(r.ok()) << Message(r);
  EXPECT_EQ(r->zero.stage, 0);
  EXPECT_EQ(r->warnings, std::vector<std::string>{"<config>: unknown key 'zero_optimisation' (did you mean "
                                                  "'zero_optimization'?)"});
  EXPECT_TRUE(Parse(R"({"train_batch_size": 8, "zero_optimisaton": {}, "my_block": {}})").ok());
  EXPECT_TRUE(Parse(R"({"train_batch_size": 8, "optimizer": {"params": {"lrr": 1}}})").ok());
}

TEST(ConfigUnknownKeysTest, NestedBlockOneEditFromAKnownOneIsAnError) {
  // 'offload_optimiser' only warned, and the optimizer state stayed on the device.
  const std::string text =
      R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "offload_optimiser": {"device": "cpu"}}})";
  EXPECT_EQ(Message(Parse(text)),
            "<config>: unknown key 'zero_optimization.offload_optimiser' (did you mean 'offload_optimizer'?): a key "
            "one edit from a known block is an error, since everything under it would be ignored");
  EXPECT_TRUE(Contains(Message(Parse(R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "param": {}}})")),
                       "unknown key 'optimizer.param' (did you mean 'params'?): a key one edit from a known block"));
  // Under an alias of a block, the message names the user's spelling.
  EXPECT_TRUE(Contains(Message(Parse(R"({"train_batch_size": 8, "zero_optimization": {"Offload_Param": {}}})")),
                       "unknown key 'zero_optimization.Offload_Param' (did you mean 'offload_param'?)"));
  // The opt-out makes it a warning; a nested key one edit from a known scalar key stays a warning
  // (outside the blocks DeepSpeed validates, where every unknown key is an error).
  ParseOptions lenient;
  lenient.nested_block_typos_are_errors = false;
  lenient.unknown_keys_in_validated_blocks_are_errors = false;
  auto r = ParseConfig(text, lenient);
  ASSERT_TRUE(r.ok()) << Message(r);
  EXPECT_EQ(r->zero.offload_optimizer.device, OffloadDevice::kNone);
  EXPECT_EQ(r->warnings, std::vector<std::string>{"<config>: unknown key 'zero_optimization.offload_optimiser' (did "
                                                  "you mean 'offload_optimizer'?)"});
  EXPECT_TRUE(
      ParseConfig(R"({"train_batch_size": 8, "zero_optimization": {"stag": 1, "offload_optimizers_x": {}}})", lenient)
          .ok());
  EXPECT_TRUE(Parse(R"({"train_batch_size": 8, "optimizer": {"params": {"lrr": 1}}})").ok());
}

TEST(ConfigUnknownKeysTest, IgnoredDeepSpeedKeysWarnEvenWhenStrict) {
  auto r = Parse(R"({"train_batch_size": 8, "zero_optimization": {"allgather_partitions": true},
                     "tensorboard": {"enabled": true, "whatever": 1}})",
                 1, /*strict=*/true);
  ASSERT_TRUE(r.ok()) << Message(r);
  ASSERT_EQ(r->warnings.size(), 2u);
  EXPECT_TRUE(Contains(r->warnings[0], "'zero_optimization.allgather_partitions' is ignored")) << r->warnings[0];
  EXPECT_TRUE(Contains(r->warnings[1], "'tensorboard' is ignored")) << r->warnings[1];
}

// ---------------------------------------------------------------------------------------------
// The blocks DeepSpeed 0.19.8 validates with pydantic models that forbid extra keys.

// Every key DeepSpeed 0.19.8's pydantic models accept in those blocks, under its field name and under
// its alias (populate_by_name), deprecated ones included, each with a value DeepSpeed accepts (its
// default where that is a JSON value). Generated with Python's ast from DeepSpeed 0.19.8's
// DeepSpeedZeroConfig (runtime/zero/config.py), DeepSpeedZeroOffloadOptimizerConfig and
// DeepSpeedZeroOffloadParamConfig (runtime/zero/offload_config.py), DeepSpeedBF16Config and
// DeepSpeedFP16Config (runtime/precision_config.py); their base DeepSpeedConfigModel declares no field.
struct DeepSpeedKey {
  const char* path;
  const char* value;  // JSON text
};
constexpr DeepSpeedKey kDeepSpeedValidatedKeys[] = {
    {"zero_optimization.stage", "0"},
    {"zero_optimization.contiguous_gradients", "true"},
    {"zero_optimization.reduce_scatter", "true"},
    {"zero_optimization.reduce_bucket_size", "500000000"},
    {"zero_optimization.use_multi_rank_bucket_allreduce", "true"},
    {"zero_optimization.allgather_partitions", "true"},
    {"zero_optimization.allgather_bucket_size", "500000000"},
    {"zero_optimization.overlap_comm", "true"},
    {"zero_optimization.compute_grad_norm", "true"},
    {"zero_optimization.load_from_fp32_weights", "true"},
    {"zero_optimization.elastic_checkpoint", "false"},
    {"zero_optimization.offload_param", "{}"},
    {"zero_optimization.offload_optimizer", "{}"},
    {"zero_optimization.zenflow", "null"},
    {"zero_optimization.sub_group_size", "1000000000"},
    {"zero_optimization.cpu_offload_param", "false"},
    {"zero_optimization.cpu_offload_use_pin_memory", "false"},
    {"zero_optimization.cpu_offload", "false"},
    {"zero_optimization.prefetch_bucket_size", "50000000"},
    {"zero_optimization.stage3_prefetch_bucket_size", "50000000"},
    {"zero_optimization.param_persistence_threshold", "100000"},
    {"zero_optimization.stage3_param_persistence_threshold", "100000"},
    {"zero_optimization.model_persistence_threshold", "9223372036854775807"},
    {"zero_optimization.stage3_model_persistence_threshold", "9223372036854775807"},
    {"zero_optimization.max_live_parameters", "1000000000"},
    {"zero_optimization.stage3_max_live_parameters", "1000000000"},
    {"zero_optimization.max_reuse_distance", "1000000000"},
    {"zero_optimization.stage3_max_reuse_distance", "1000000000"},
    {"zero_optimization.gather_16bit_weights_on_model_save", "false"},
    {"zero_optimization.stage3_gather_16bit_weights_on_model_save", "false"},
    {"zero_optimization.module_granularity_threshold", "0"},
    {"zero_optimization.stage3_module_granularity_threshold", "0"},
    {"zero_optimization.use_all_reduce_for_fetch_params", "false"},
    {"zero_optimization.stage3_use_all_reduce_for_fetch_params", "false"},
    {"zero_optimization.allgather_sequential", "false"},
    {"zero_optimization.stage3_allgather_sequential", "false"},
    {"zero_optimization.stage3_gather_fp16_weights_on_model_save", "false"},
    {"zero_optimization.ignore_unused_parameters", "true"},
    {"zero_optimization.legacy_stage1", "false"},
    {"zero_optimization.round_robin_gradients", "false"},
    {"zero_optimization.parameter_alignment", "false"},
    {"zero_optimization.zero_hpz_partition_size", "1"},
    {"zero_optimization.zero_quantized_weights", "false"},
    {"zero_optimization.zero_quantized_nontrainable_weights", "false"},
    {"zero_optimization.zero_quantized_gradients", "false"},
    {"zero_optimization.memory_efficient_linear", "true"},
    {"zero_optimization.pipeline_loading_checkpoint", "false"},
    {"zero_optimization.override_module_apply", "true"},
    {"zero_optimization.log_trace_cache_warnings", "false"},
    {"zero_optimization.enable_sanity_checks", "false"},
    {"zero_optimization.save_muon_momentum_buffer_in_memory", "false"},
    {"zero_optimization.leaf_module", "{}"},
    {"zero_optimization.offload_optimizer.device", "\"none\""},
    {"zero_optimization.offload_optimizer.nvme_path", "\"\""},
    {"zero_optimization.offload_optimizer.buffer_count", "4"},
    {"zero_optimization.offload_optimizer.pin_memory", "true"},
    {"zero_optimization.offload_optimizer.pipeline_read", "false"},
    {"zero_optimization.offload_optimizer.pipeline_write", "false"},
    {"zero_optimization.offload_optimizer.fast_init", "false"},
    {"zero_optimization.offload_optimizer.ratio", "1.0"},
    {"zero_optimization.offload_optimizer.super_offload", "false"},
    {"zero_optimization.offload_optimizer.cpuadam_cores_perc", "0.8"},
    {"zero_optimization.offload_param.device", "\"none\""},
    {"zero_optimization.offload_param.nvme_path", "\"\""},
    {"zero_optimization.offload_param.buffer_count", "5"},
    {"zero_optimization.offload_param.buffer_size", "100000000"},
    {"zero_optimization.offload_param.max_in_cpu", "1000000000"},
    {"zero_optimization.offload_param.pin_memory", "true"},
    {"bf16.enabled", "false"},
    {"bf16.immediate_grad_update", "false"},
    {"bf16.check_grad_overflow", "true"},
    {"bf16.bf16_master_weights_and_grads", "false"},
    {"bf16.bf16_optimizer_states", "false"},
    {"fp16.enabled", "false"},
    {"fp16.auto_cast", "false"},
    {"fp16.loss_scale", "0"},
    {"fp16.initial_scale_power", "16"},
    {"fp16.loss_scale_window", "1000"},
    {"fp16.hysteresis", "2"},
    {"fp16.consecutive_hysteresis", "false"},
    {"fp16.min_loss_scale", "1"},
    {"fp16.fp16_master_weights_and_grads", "false"},
};

Status ValidateAll(const Config& c) { return Validate(c, ValidateOptions{1, "<config>", /*refuse_unbuilt=*/true}); }

bool IsTableKey(const std::string& path) {
  for (const ConfigKeyInfo& k : ConfigKeyTable()) {
    if (k.path == path) return true;
  }
  return false;
}

TEST(ConfigValidatedBlocksTest, EveryKeyDeepSpeedAcceptsParses) {
  EXPECT_EQ(std::size(kDeepSpeedValidatedKeys), 82u);
  for (const DeepSpeedKey& key : kDeepSpeedValidatedKeys) {
    const std::string text = Nested({{"train_batch_size", "8"}, {key.path, key.value}});
    auto r = Parse(text);
    ASSERT_TRUE(r.ok()) << key.path << ": " << Message(r);
    for (const std::string& w : r->warnings) EXPECT_FALSE(Contains(w, "unknown key")) << w;
    // A key zero reads is silent at DeepSpeed's default; the others (other spellings, deprecated and
    // ignored keys) say what became of them. Blocks (offload_optimizer: {}) are read too.
    const bool read = IsTableKey(key.path) || IsTableKey(std::string(key.path) + ".device");
    if (read) EXPECT_TRUE(r->warnings.empty()) << key.path << ": " << r->warnings[0];
    if (!read) EXPECT_FALSE(r->warnings.empty()) << key.path << " is neither read nor warned about";
    // At DeepSpeed's default, Engine::Create's checks accept it (a feature zero does not build included).
    EXPECT_TRUE(ValidateAll(*r).ok()) << key.path << ": " << ValidateAll(*r).message();
  }
}

TEST(ConfigValidatedBlocksTest, ATypoInEachBlockIsAnErrorNamingThePathAndTheKey) {
  const struct {
    const char* text;
    const char* message;
  } cases[] = {
      {R"("zero_optimization": {"stge": 3})",
       "<config>: unknown key 'zero_optimization.stge' (did you mean 'stage'?): an unknown key in 'zero_optimization' "
       "is an error (DeepSpeed 0.19.8 refuses it too)"},
      {R"("zero_optimization": {"stage": 2, "offload_optimizer": {"devcie": "cpu"}})",
       "<config>: unknown key 'zero_optimization.offload_optimizer.devcie' (did you mean 'device'?): an unknown key in "
       "'zero_optimization.offload_optimizer' is an error (DeepSpeed 0.19.8 refuses it too)"},
      {R"("zero_optimization": {"stage": 3, "offload_param": {"buffer_cont": 4}})",
       "<config>: unknown key 'zero_optimization.offload_param.buffer_cont' (did you mean 'buffer_count'?): an unknown "
       "key in 'zero_optimization.offload_param' is an error (DeepSpeed 0.19.8 refuses it too)"},
      {R"("bf16": {"enabld": true})",
       "<config>: unknown key 'bf16.enabld' (did you mean 'enabled'?): an unknown key in 'bf16' is an error "
       "(DeepSpeed 0.19.8 refuses it too)"},
      {R"("bfloat16": {"enabld": true})",
       "<config>: unknown key 'bfloat16.enabld' (did you mean 'enabled'?): an unknown key in 'bfloat16' is an error "
       "(DeepSpeed 0.19.8 refuses it too)"},
      {R"("fp16": {"enabled": true, "loss_scal": 128})",
       "<config>: unknown key 'fp16.loss_scal' (did you mean 'loss_scale'?): an unknown key in 'fp16' is an error "
       "(DeepSpeed 0.19.8 refuses it too)"},
  };
  for (const auto& c : cases) {
    auto r = Parse(std::string(R"({"train_batch_size": 8, )") + c.text + "}");
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(Message(r), c.message);
  }
  // Listed with every other problem of the file, in file order.
  auto r = Parse(R"({"train_batch_size": 8, "gradient_clipping": -1,
                     "zero_optimization": {"stage": 3, "stge": 2, "offload_optimizer": {"devcie": "cpu"},
                                           "offload_param": {"pin_memroy": true}},
                     "bf16": {"enabled": false, "immediate_grad_updat": true}, "fp16": {"hysterisis": 4}})");
  EXPECT_EQ(Message(r),
            "<config>: 6 problems in the config:\n"
            "  <config>: gradient_clipping: expected a number in [0, 1e+38], got -1\n"
            "  <config>: unknown key 'zero_optimization.stge' (did you mean 'stage'?): an unknown key in "
            "'zero_optimization' is an error (DeepSpeed 0.19.8 refuses it too)\n"
            "  <config>: unknown key 'zero_optimization.offload_optimizer.devcie' (did you mean 'device'?): an unknown "
            "key in 'zero_optimization.offload_optimizer' is an error (DeepSpeed 0.19.8 refuses it too)\n"
            "  <config>: unknown key 'zero_optimization.offload_param.pin_memroy' (did you mean 'pin_memory'?): an "
            "unknown key in 'zero_optimization.offload_param' is an error (DeepSpeed 0.19.8 refuses it too)\n"
            "  <config>: unknown key 'bf16.immediate_grad_updat' (did you mean 'immediate_grad_update'?): an unknown "
            "key in 'bf16' is an error (DeepSpeed 0.19.8 refuses it too)\n"
            "  <config>: unknown key 'fp16.hysterisis' (did you mean 'hysteresis'?): an unknown key in 'fp16' is an "
            "error (DeepSpeed 0.19.8 refuses it too)");
  // Only directly inside those blocks: below them (a leaf_module or zenflow block is not read) and
  // elsewhere an unknown key stays a warning.
  r = Parse(R"({"train_batch_size": 8, "zero_optimization": {"leaf_module": {"clases": []}},
                "optimizer": {"params": {"lrr": 1}}, "aio": {"queue_dept": 2}, "scheduler": {"kind": "x"},
                "zero_trace": {"enabld": false}, "my_block": {"x": 1}})");
  ASSERT_TRUE(r.ok()) << Message(r);
  EXPECT_EQ(r->warnings.size(), 6u);
}

TEST(ConfigValidatedBlocksTest, TheOptionFalseRestoresTheWarning) {
  ParseOptions lenient;
  lenient.unknown_keys_in_validated_blocks_are_errors = false;
  EXPECT_TRUE(ParseOptions().unknown_keys_in_validated_blocks_are_errors);
  auto r = ParseConfig(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "stge": 3,
                          "offload_optimizer": {"devcie": "cpu"}}, "fp16": {"enabld": true}})",
                       lenient);
  ASSERT_TRUE(r.ok()) << Message(r);
  EXPECT_EQ(r->zero.stage, 2);
  EXPECT_EQ(r->zero.offload_optimizer.device, OffloadDevice::kNone);
  EXPECT_FALSE(r->fp16.enabled);
  EXPECT_EQ(r->warnings, (std::vector<std::string>{
                             "<config>: unknown key 'zero_optimization.stge' (did you mean 'stage'?)",
                             "<config>: unknown key 'zero_optimization.offload_optimizer.devcie' (did you mean "
                             "'device'?)",
                             "<config>: unknown key 'fp16.enabld' (did you mean 'enabled'?)",
                         }));
  // strict still makes them errors, without the DeepSpeed sentence.
  lenient.strict = true;
  EXPECT_EQ(Message(ParseConfig(R"({"train_batch_size": 8, "bf16": {"enabld": true}})", lenient)),
            "<config>: unknown key 'bf16.enabld' (did you mean 'enabled'?)");
}

TEST(ConfigValidatedBlocksTest, ManyUnknownKeysInABlockAreCountedAsErrors) {
  const std::string text = WithManyUnknownKeys("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 1", "}}");
  Result<Config> r = InvalidArgumentError("unset");
  EXPECT_LT(SecondsToParse(text, &r), 10.0) << text.size() << " bytes";
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(Message(r),
                       "<config>: 101 problems in the config:\n  <config>: unknown key "
                       "'zero_optimization.unknown_key_0': an unknown key in 'zero_optimization'"))
      << Message(r).substr(0, 300);
  EXPECT_TRUE(Contains(Message(r), "\n  <config>: unknown keys: 199900 more not listed")) << Message(r).size();
}

TEST(ConfigValidatedBlocksTest, DeepSpeedFieldNamesSetTheSameFieldAsTheStage3Keys) {
  const struct {
    const char* name;
    const char* stage3_name;
    const char* value;
  } pairs[] = {
      {"prefetch_bucket_size", "stage3_prefetch_bucket_size", "1234"},
      {"param_persistence_threshold", "stage3_param_persistence_threshold", "77"},
      {"max_live_parameters", "stage3_max_live_parameters", "5555"},
      {"max_reuse_distance", "stage3_max_reuse_distance", "66"},
      {"gather_16bit_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save", "true"},
  };
  for (const auto& p : pairs) {
    const std::string head = R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, ")";
    auto by_name = Parse(head + p.name + "\": " + p.value + "}}");
    auto by_stage3 = Parse(head + p.stage3_name + "\": " + p.value + "}}");
    ASSERT_TRUE(by_name.ok()) << Message(by_name);
    ASSERT_TRUE(by_stage3.ok()) << Message(by_stage3);
    const std::string path = std::string("zero_optimization.") + p.stage3_name;
    EXPECT_EQ(ConfigValueAt(ConfigToJson(*by_name), path), p.value) << p.name;
    EXPECT_EQ(ConfigToJson(*by_name), ConfigToJson(*by_stage3)) << p.name;
    EXPECT_TRUE(by_stage3->warnings.empty());
    EXPECT_EQ(by_name->warnings, std::vector<std::string>{"<config>: 'zero_optimization." + std::string(p.name) +
                                                          "' is DeepSpeed's field name of '" + path + "'"});
    // Both spellings at once: one key given twice.
    EXPECT_TRUE(
        Contains(Message(Parse(head + p.name + "\": " + p.value + ", \"" + p.stage3_name + "\": " + p.value + "}}")),
                 path + ": expected one spelling of the key"))
        << p.name;
  }
}

TEST(ConfigValidatedBlocksTest, FeaturesZeroDoesNotBuildAreRefusedUnlessAtTheirDefault) {
  const struct {
    const char* path;
    const char* refused;   // JSON text
    const char* accepted;  // DeepSpeed's default (or another value that asks for nothing)
    const char* message;   // the whole UNIMPLEMENTED message
  } cases[] = {
      {"zero_optimization.legacy_stage1", "true", "false",
       "<config>: zero_optimization.legacy_stage1: DeepSpeed's legacy stage-1 implementation is not built (zero's "
       "stage 1 partitions the optimizer states as DeepSpeed's current stage 1 does); expected false, got true"},
      {"zero_optimization.zero_hpz_partition_size", "8", "1",
       "<config>: zero_optimization.zero_hpz_partition_size: ZeRO++ hierarchical partitioning (a secondary copy of "
       "the stage-3 parameters in groups of ranks) is not built (zero partitions parameters once over all "
       "data-parallel ranks); expected 0 or 1, got 8"},
      {"zero_optimization.zero_hpz_partition_size", "2", "0", nullptr},
      {"zero_optimization.zero_quantized_weights", "true", "false",
       "<config>: zero_optimization.zero_quantized_weights: ZeRO++ quantized parameter all-gather is not built (zero "
       "gathers parameters in the model dtype); expected false, got true"},
      {"zero_optimization.zero_quantized_nontrainable_weights", "true", "false",
       "<config>: zero_optimization.zero_quantized_nontrainable_weights: quantized storage of non-trainable "
       "parameters is not built (zero keeps every parameter in the model dtype); expected false, got true"},
      {"zero_optimization.zero_quantized_gradients", "true", "false",
       "<config>: zero_optimization.zero_quantized_gradients: ZeRO++ quantized gradient reduction is not built (zero "
       "reduces gradients unquantized); expected false, got true"},
      {"zero_optimization.zenflow", R"({"topk_ratio": 0.05, "update_interval": 4})", "null",
       "<config>: zero_optimization.zenflow: ZenFlow (top-k gradient columns updated each step, the rest later on the "
       "CPU) is not built (zero applies every gradient at every step); expected null or no zenflow block, got a "
       "block"},
      {"zero_optimization.zenflow", "{}", "null", nullptr},
      {"zero_optimization.offload_optimizer.super_offload", "true", "false",
       "<config>: zero_optimization.offload_optimizer.super_offload: SuperOffload (DeepSpeed's stage-3 offload "
       "optimizer for Superchips) is not built (zero's optimizer offload runs its CPU AdamW, or update_device "
       "\"gpu\"); expected false, got true"},
      {"bf16.bf16_master_weights_and_grads", "true", "false",
       "<config>: bf16.bf16_master_weights_and_grads: bf16 master weights and gradients is not built (zero keeps fp32 "
       "master weights and accumulates gradients in fp32); expected false, got true"},
      {"bf16.bf16_optimizer_states", "true", "false",
       "<config>: bf16.bf16_optimizer_states: bf16 optimizer states is not built (zero keeps AdamW's moments in "
       "fp32); expected false, got true"},
      {"fp16.fp16_master_weights_and_grads", "true", "false",
       "<config>: fp16.fp16_master_weights_and_grads: fp16 master weights and gradients is not built (zero keeps fp32 "
       "master weights); expected false, got true"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.path);
    std::map<std::string, std::string> values = {{"train_batch_size", "8"}, {"zero_optimization.stage", "3"}};
    values[c.path] = c.refused;
    // Read (and written back) by ParseConfig, refused by Engine::Create's checks.
    auto r = Parse(Nested(values));
    ASSERT_TRUE(r.ok()) << Message(r);
    EXPECT_TRUE(r->warnings.empty()) << r->warnings[0];
    const Status refused = ValidateAll(*r);
    EXPECT_EQ(refused.code(), StatusCode::kUnimplemented) << refused.message();
    if (c.message) EXPECT_EQ(refused.message(), c.message);
    EXPECT_TRUE(Contains(refused.message(), std::string("<config>: ") + c.path + ": ")) << refused.message();
    EXPECT_NE(ConfigValueAt(ConfigToJson(*r), c.path), c.accepted);
    // At the default: read, no warning, accepted.
    values[c.path] = c.accepted;
    r = Parse(Nested(values));
    ASSERT_TRUE(r.ok()) << Message(r);
    EXPECT_TRUE(r->warnings.empty()) << r->warnings[0];
    EXPECT_TRUE(ValidateAll(*r).ok()) << ValidateAll(*r).message();
  }
  // A zenflow block's own keys are not read: zero refuses the block whatever it holds.
  auto r = Parse(R"({"train_batch_size": 8, "zero_optimization": {"zenflow": {"anything": 1}}})");
  ASSERT_TRUE(r.ok()) << Message(r);
  EXPECT_TRUE(r->zero.zenflow);
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 8, "zero_optimization": {"zenflow": true}})")),
            "<config>: zero_optimization.zenflow: expected null or an object, got true");
}

TEST(ConfigValidatedBlocksTest, PerformanceAndLoggingKeysAreIgnoredWithAWarning) {
  auto r = Parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
                     "use_multi_rank_bucket_allreduce": false, "stage3_module_granularity_threshold": 5000,
                     "log_trace_cache_warnings": true, "enable_sanity_checks": true,
                     "offload_optimizer": {"device": "cpu", "cpuadam_cores_perc": 0.5}},
                     "bf16": {"enabled": true, "check_grad_overflow": false}})",
                 1, /*strict=*/true);
  ASSERT_TRUE(r.ok()) << Message(r);
  EXPECT_TRUE(ValidateAll(*r).ok()) << ValidateAll(*r).message();
  ASSERT_EQ(r->warnings.size(), 6u);
  EXPECT_TRUE(Contains(r->warnings[0], "'zero_optimization.use_multi_rank_bucket_allreduce' is ignored: "));
  EXPECT_TRUE(Contains(r->warnings[1], "'zero_optimization.stage3_module_granularity_threshold' is ignored: "));
  EXPECT_TRUE(Contains(r->warnings[4],
                       "'zero_optimization.offload_optimizer.cpuadam_cores_perc' is ignored: "
                       "SuperOffload's CPU share; zero sizes its CPU AdamW by "
                       "offload_optimizer.cpu_threads"));
  EXPECT_TRUE(Contains(r->warnings[5], "'bf16.check_grad_overflow' is ignored: zero never skips a bf16 step"));
}

// ---------------------------------------------------------------------------------------------
// Batch arithmetic.

TEST(ConfigBatchTest, AnyTwoDeriveTheThirdForWorldSizes1To4) {
  for (int world = 1; world <= 4; ++world) {
    const int64_t micro = 2, gas = 3, train = micro * gas * world;
    const std::string t = std::to_string(train), m = std::to_string(micro), g = std::to_string(gas);
    for (const std::string& text :
         {"{\"train_batch_size\": " + t + ", \"train_micro_batch_size_per_gpu\": " + m +
              ", \"gradient_accumulation_steps\": " + g + "}",
          "{\"train_batch_size\": " + t + ", \"train_micro_batch_size_per_gpu\": " + m + "}",
          "{\"train_batch_size\": " + t + ", \"gradient_accumulation_steps\": " + g + "}",
          "{\"train_micro_batch_size_per_gpu\": " + m + ", \"gradient_accumulation_steps\": " + g + "}"}) {
      auto r = Parse(text, world);
      ASSERT_TRUE(r.ok()) << text << " world " << world << ": " << Message(r);
      EXPECT_EQ(r->train_batch_size, train) << text;
      EXPECT_EQ(r->train_micro_batch_size_per_gpu, micro) << text;
      EXPECT_EQ(r->gradient_accumulation_steps, gas) << text;
    }
  }
}

TEST(ConfigBatchTest, OnlyOneGivenDerivesAsDeepSpeed) {
  for (int world = 1; world <= 4; ++world) {
    auto r = Parse("{\"train_batch_size\": " + std::to_string(12 * world) + "}", world);
    ASSERT_TRUE(r.ok()) << Message(r);
    EXPECT_EQ(r->train_micro_batch_size_per_gpu, 12);
    EXPECT_EQ(r->gradient_accumulation_steps, 1);
    r = Parse(R"({"train_micro_batch_size_per_gpu": 5})", world);
    ASSERT_TRUE(r.ok()) << Message(r);
    EXPECT_EQ(r->train_batch_size, 5 * world);
    EXPECT_EQ(r->gradient_accumulation_steps, 1);
  }
}

TEST(ConfigBatchTest, MismatchShowsTheNumbers) {
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4,
                              "gradient_accumulation_steps": 2})",
                          3)),
            "<config>: train_batch_size: expected train_micro_batch_size_per_gpu x gradient_accumulation_steps x "
            "world_size = 4 x 2 x 3 = 24, got 16");
  // The same file is right at another world size.
  EXPECT_TRUE(Parse(R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4,
                        "gradient_accumulation_steps": 2})",
                    2)
                  .ok());
}

TEST(ConfigBatchTest, DerivedValuesMustDivideExactly) {
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 3})")),
            "<config>: train_batch_size: expected a multiple of train_micro_batch_size_per_gpu x world_size = 3 x 1 "
            "= 3 (gradient_accumulation_steps is derived from it), got 10");
  EXPECT_TRUE(Contains(Message(Parse(R"({"train_batch_size": 12, "gradient_accumulation_steps": 4})", 2)),
                       "expected a multiple of gradient_accumulation_steps x world_size = 4 x 2 = 8"));
  EXPECT_TRUE(Contains(Message(Parse(R"({"train_batch_size": 8})", 3)), "expected a multiple of world_size 3"));
}

TEST(ConfigBatchTest, NeitherBatchKeyIsAnError) {
  EXPECT_TRUE(Contains(Message(Parse("{}")),
                       "train_batch_size: expected train_batch_size or "
                       "train_micro_batch_size_per_gpu to be given"));
  EXPECT_TRUE(
      Contains(Message(Parse(R"({"gradient_accumulation_steps": 4})")), "got only gradient_accumulation_steps"));
}

TEST(ConfigBatchTest, ZeroAndNegativeSizesAndBadWorldSize) {
  EXPECT_EQ(Message(Parse(R"({"train_micro_batch_size_per_gpu": 0})")),
            "<config>: train_micro_batch_size_per_gpu: expected an integer in 1..2147483647, got 0");
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 8, "gradient_accumulation_steps": -2})")),
            "<config>: gradient_accumulation_steps: expected an integer in 1..2147483647, got -2");
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 8})", 0)), "<config>: world_size: expected an integer >= 1, got 0");
}

// ---------------------------------------------------------------------------------------------
// Deprecated and other spellings.

TEST(ConfigSpellingsTest, CpuOffloadMapsToOffloadOptimizer) {
  auto r = Parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "cpu_offload": true}})");
  ASSERT_TRUE(r.ok()) << Message(r);
  EXPECT_EQ(r->zero.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_TRUE(r->zero.offload_optimizer.pin_memory);  // DeepSpeed's default
  EXPECT_TRUE(HasWarning(*r, "'zero_optimization.cpu_offload' is deprecated")) << r->warnings.size();
  r = Parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "cpu_offload": false}})");
  ASSERT_TRUE(r.ok()) << Message(r);
  EXPECT_EQ(r->zero.offload_optimizer.device, OffloadDevice::kNone);
  EXPECT_TRUE(HasWarning(*r, "deprecated"));
}

TEST(ConfigSpellingsTest, CpuOffloadParamAndPinMemory) {
  auto r = Parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "cpu_offload": true,
                     "cpu_offload_param": true, "cpu_offload_use_pin_memory": false}})");
  ASSERT_TRUE(r.ok()) << Message(r);
  EXPECT_EQ(r->zero.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_EQ(r->zero.offload_param.device, OffloadDevice::kCpu);
  EXPECT_FALSE(r->zero.offload_optimizer.pin_memory);
  EXPECT_FALSE(r->zero.offload_param.pin_memory);
  EXPECT_TRUE(HasWarning(*r, "'zero_optimization.cpu_offload_use_pin_memory' is deprecated"));
  // Deprecated param offload keeps the stage rule.
  EXPECT_TRUE(Contains(
      Message(Parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "cpu_offload_param": true}})")),
      "zero_optimization.offload_param.device: expected \"none\" below stage 3"));
}

TEST(ConfigSpellingsTest, OldAndNewSpellingTogetherIsAnError) {
  EXPECT_TRUE(Contains(Message(Parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2,
                                         "cpu_offload": true, "offload_optimizer": {"device": "cpu"}}})")),
                       "zero_optimization.cpu_offload: expected no value when "
                       "'zero_optimization.offload_optimizer' is given"));
  EXPECT_TRUE(Contains(Message(Parse(R"({"train_batch_size": 8, "aio": {"thread_count": 2,
                                         "intra_op_parallelism": 4}})")),
                       "aio.intra_op_parallelism: expected one spelling of the key, got it also as "
                       "'aio.thread_count'"));
  EXPECT_TRUE(Contains(Message(Parse(R"({"train_batch_size": 8, "bf16": {"enabled": true},
                                         "bfloat16": {"enabled": true}})")),
                       "bfloat16: expected one spelling of the block, got it also as 'bf16'"));
}

TEST(ConfigSpellingsTest, ThreadCountBfloat16AndFp16WeightsOnSave) {
  auto r = Parse(R"({"train_batch_size": 8, "aio": {"thread_count": 4}, "bfloat16": {"enabled": true},
                     "zero_optimization": {"stage": 3, "stage3_gather_fp16_weights_on_model_save": true}})");
  ASSERT_TRUE(r.ok()) << Message(r);
  EXPECT_EQ(r->aio.intra_op_parallelism, 4);
  EXPECT_TRUE(r->bf16_enabled);
  EXPECT_TRUE(r->zero.stage3_gather_16bit_weights_on_model_save);
  EXPECT_EQ(r->warnings.size(), 3u);
  EXPECT_TRUE(HasWarning(*r, "'aio.thread_count' is the older name of 'aio.intra_op_parallelism'"));
  EXPECT_TRUE(HasWarning(*r, "'bfloat16' is the older name of the 'bf16' block"));
  // Errors under an alias name the key as written.
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 8, "bfloat16": {"enabled": "yes"}})")),
            "<config>: bfloat16.enabled: expected true or false, got \"yes\"");
}

TEST(ConfigSpellingsTest, MaxGradNormPointsToGradientClipping) {
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 8, "optimizer": {"type": "AdamW",
                              "params": {"lr": 1e-3, "max_grad_norm": 1.0}}})")),
            "<config>: optimizer.params.max_grad_norm: expected no value (zero clips by the top-level "
            "\"gradient_clipping\"; move the value there), got 1.0");
}

// ---------------------------------------------------------------------------------------------
// Optimizer and scheduler.

TEST(ConfigOptimizerTest, TypesAreCaseInsensitiveAndWeightDecayIsZeroForBoth) {
  struct Case {
    const char* type;
    const char* normalized;
    double weight_decay;
  };
  // DeepSpeed's FusedAdam defaults weight_decay to 0 for both (torch.optim.AdamW's 0.01 only with torch_adam).
  for (const Case& c : {Case{"Adam", "Adam", 0.0}, Case{"adam", "Adam", 0.0}, Case{"ADAM", "Adam", 0.0},
                        Case{"AdamW", "AdamW", 0.0}, Case{"adamw", "AdamW", 0.0}, Case{"ADAMW", "AdamW", 0.0}}) {
    auto r = Parse(std::string(R"({"train_batch_size": 8, "optimizer": {"type": ")") + c.type + "\"}}");
    ASSERT_TRUE(r.ok()) << Message(r);
    EXPECT_EQ(r->optimizer.type, c.normalized);
    EXPECT_EQ(r->optimizer.weight_decay, c.weight_decay) << c.type;
    EXPECT_TRUE(r->optimizer.adam_w_mode);
  }
  auto r = Parse(R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"weight_decay": 0.1,
                     "adam_w_mode": false, "lr": 0.01, "betas": [0.8, 0.99], "eps": 1e-6}}})");
  ASSERT_TRUE(r.ok()) << Message(r);
  EXPECT_EQ(r->optimizer.weight_decay, 0.1);
  EXPECT_FALSE(r->optimizer.adam_w_mode);
  EXPECT_EQ(r->optimizer.lr, 0.01);
  EXPECT_EQ(r->optimizer.beta1, 0.8);
  EXPECT_EQ(r->optimizer.beta2, 0.99);
  EXPECT_EQ(r->optimizer.eps, 1e-6);
}

TEST(ConfigOptimizerTest, UnsupportedTypesListTheSupportedOnes) {
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 8, "optimizer": {"type": "Lamb"}})")),
            "<config>: optimizer.type: expected one of \"Adam\", \"AdamW\" (any case), got \"Lamb\" (a DeepSpeed "
            "choice zero does not implement)");
  EXPECT_TRUE(Contains(Message(Parse(R"({"train_batch_size": 8, "optimizer": {"type": "OneBitAdam"}})")),
                       "expected one of \"Adam\", \"AdamW\" (any case), got \"OneBitAdam\""));
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 8, "optimizer": {"type": "Adamm"}})")),
            "<config>: optimizer.type: expected one of \"Adam\", \"AdamW\" (any case), got \"Adamm\"");
}

TEST(ConfigOptimizerTest, AdamWWithAdamWModeFalseIsAContradiction) {
  EXPECT_TRUE(Contains(Message(Parse(R"({"train_batch_size": 8, "optimizer": {"type": "AdamW",
                                         "params": {"adam_w_mode": false}}})")),
                       "optimizer.params.adam_w_mode: expected true with optimizer.type \"AdamW\""));
}

TEST(ConfigSchedulerTest, WarmupMaxLrDefaults) {
  auto r = Parse(R"({"train_batch_size": 8, "optimizer": {"params": {"lr": 3e-4}},
                     "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}})");
  ASSERT_TRUE(r.ok()) << Message(r);
  EXPECT_EQ(r->scheduler.warmup_max_lr, 3e-4);
  EXPECT_EQ(r->scheduler.warmup_num_steps, 10);
  EXPECT_TRUE(r->warnings.empty());
  // -1 spelled out means the optimizer's lr too.
  r = Parse(R"({"train_batch_size": 8, "optimizer": {"params": {"lr": 3e-4}},
                "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": -1}}})");
  ASSERT_TRUE(r.ok()) << Message(r);
  EXPECT_EQ(r->scheduler.warmup_max_lr, 3e-4);
  // DeepSpeed's WarmupDecayLR constructor defaults to 0.001 whatever the optimizer's lr.
  r = Parse(R"({"train_batch_size": 8, "optimizer": {"params": {"lr": 3e-4}},
                "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 100}}})");
  ASSERT_TRUE(r.ok()) << Message(r);
  EXPECT_EQ(r->scheduler.warmup_max_lr, 0.001);
  EXPECT_TRUE(HasWarning(*r, "WarmupDecayLR peaks at 0.001"));
}

TEST(ConfigSchedulerTest, TotalNumStepsIsRequiredForDecayingSchedules) {
  for (const char* type : {"WarmupDecayLR", "WarmupCosineLR"}) {
    EXPECT_EQ(Message(Parse(std::string(R"({"train_batch_size": 8, "scheduler": {"type": ")") + type +
                            R"(", "params": {}}})")),
              std::string("<config>: scheduler.params.total_num_steps: expected an integer >= 1 (") + type +
                  " requires it), got nothing");
  }
}

TEST(ConfigSchedulerTest, ParametersOfAnotherScheduleAreErrors) {
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 8, "scheduler": {"type": "WarmupCosineLR",
                              "params": {"total_num_steps": 100, "warmup_min_lr": 0}}})")),
            "<config>: scheduler.params.warmup_min_lr: expected no value with scheduler.type \"WarmupCosineLR\" "
            "(it is a parameter of WarmupLR, WarmupDecayLR), got 0.0");
  EXPECT_TRUE(Contains(Message(Parse(R"({"train_batch_size": 8, "scheduler": {"params": {"warmup_num_steps": 5}}})")),
                       "scheduler.params.warmup_num_steps: expected no value with scheduler.type \"\""));
  EXPECT_TRUE(Contains(Message(Parse(R"({"train_batch_size": 8, "scheduler": {"type": "WarmupLR",
                                         "params": {"total_num_steps": 5}}})")),
                       "scheduler.params.total_num_steps: expected no value with scheduler.type \"WarmupLR\""));
}

TEST(ConfigSchedulerTest, UnsupportedSchedules) {
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 8, "scheduler": {"type": "OneCycle"}})")),
            "<config>: scheduler.type: expected one of \"\", \"WarmupLR\", \"WarmupDecayLR\", \"WarmupCosineLR\", "
            "got \"OneCycle\" (a DeepSpeed choice zero does not implement)");
  EXPECT_TRUE(Contains(Message(Parse(R"({"train_batch_size": 8, "scheduler": {"type": "WarmupLR",
                                         "params": {"warmup_type": "exp"}}})")),
                       "scheduler.params.warmup_type: expected one of \"log\", \"linear\", got \"exp\""));
}

// ---------------------------------------------------------------------------------------------
// Several problems in one file.

TEST(ConfigProblemsTest, EveryProblemIsListedInOneError) {
  // A bad type, an out-of-range value, an unknown key, a contradiction, a parameter of another schedule
  // and no batch size: each independent, each reported with its key path.
  const std::string text = R"({
    "gradient_clipping": "1.0",
    "zero_optimization": {"stage": 2, "stge": 3, "offload_param": {"device": "cpu"}},
    "fp16": {"hysteresis": 0},
    "scheduler": {"params": {"warmup_num_steps": 5}}
  })";
  ParseOptions options;
  options.strict = true;
  options.source = "ds_config.json";
  auto r = ParseConfig(text, options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(r),
            "ds_config.json: 6 problems in the config:\n"
            "  ds_config.json: gradient_clipping: expected a number in [0, 1e+38], got \"1.0\"\n"
            "  ds_config.json: unknown key 'zero_optimization.stge' (did you mean 'stage'?): an unknown key in "
            "'zero_optimization' is an error (DeepSpeed 0.19.8 refuses it too)\n"
            "  ds_config.json: fp16.hysteresis: expected an integer >= 1, got 0\n"
            "  ds_config.json: scheduler.params.warmup_num_steps: expected no value with scheduler.type \"\" (it is "
            "a parameter of WarmupLR, WarmupDecayLR, WarmupCosineLR), got 5\n"
            "  ds_config.json: train_batch_size: expected train_batch_size or train_micro_batch_size_per_gpu to be "
            "given (any two of train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps derive "
            "the third), got none of them\n"
            "  ds_config.json: zero_optimization.offload_param.device: expected \"none\" below stage 3 (parameter "
            "offload needs zero_optimization.stage 3; stage is 2), got \"cpu\"");
}

TEST(ConfigProblemsTest, UnknownKeysThatAreWarningsFollowAsNotes) {
  // Not strict: the misspelt batch key is a warning, and the error it causes says so.
  auto r = Parse(R"({"train_bacth_size": 8, "fp16": {"enabled": true}, "bf16": {"enabled": true}})");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(Message(r),
            "<config>: 2 problems in the config:\n"
            "  <config>: train_batch_size: expected train_batch_size or train_micro_batch_size_per_gpu to be given "
            "(any two of train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps derive the "
            "third), got none of them\n"
            "  <config>: bf16.enabled: expected false when fp16.enabled is true (pick one 16-bit type), got true\n"
            "  note: <config>: unknown key 'train_bacth_size' (did you mean 'train_batch_size'?)");
  // One problem keeps its one-line form, notes after it.
  r = Parse(R"({"train_micro_batch_size_per_gpu": 2, "zero_optimisaton": {"stage": 2}, "fp16": {"enabled": 3}})");
  EXPECT_EQ(Message(r),
            "<config>: fp16.enabled: expected true or false, got 3\n"
            "  note: <config>: unknown key 'zero_optimisaton' (did you mean 'zero_optimization'?)");
}

TEST(ConfigProblemsTest, ARefusedValueIsNotReportedAgainAsAConsequence) {
  // A bad stage keeps the default 0, which would contradict the offload block: that rule is skipped.
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 4,
                              "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}})")),
            "<config>: zero_optimization.stage: expected an integer in 0..3, got 4");
  // A bad batch key is not reported again by the batch arithmetic.
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 0, "gradient_accumulation_steps": 3})", 2)),
            "<config>: train_batch_size: expected an integer in 1..9007199254740991, got 0");
  // A bad total_num_steps is not also "required"; a bad scheduler type does not judge its parameters.
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 8, "scheduler": {"type": "WarmupDecayLR",
                              "params": {"total_num_steps": -1}}})")),
            "<config>: scheduler.params.total_num_steps: expected an integer in 1..9007199254740991, got -1");
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 8, "scheduler": {"type": "Cosine",
                              "params": {"total_num_steps": 10, "warmup_min_ratio": 0.1}}})")),
            "<config>: scheduler.type: expected one of \"\", \"WarmupLR\", \"WarmupDecayLR\", \"WarmupCosineLR\", "
            "got \"Cosine\"");
  // A block that is not an object: one problem, nothing under it judged.
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 8, "zero_optimization": [3], "fp16": {"enabled": true},
                              "bf16": {"enabled": 1}})")),
            "<config>: 2 problems in the config:\n"
            "  <config>: zero_optimization: expected an object, got [3]\n"
            "  <config>: bf16.enabled: expected true or false, got 1");
}

TEST(ConfigProblemsTest, BothNvmePathsMissingAreTwoProblems) {
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
                              "offload_optimizer": {"device": "nvme"}, "offload_param": {"device": "nvme"}}})")),
            "<config>: 2 problems in the config:\n"
            "  <config>: zero_optimization.offload_optimizer.nvme_path: expected a directory when "
            "offload_optimizer.device is \"nvme\", got nothing\n"
            "  <config>: zero_optimization.offload_param.nvme_path: expected a directory when offload_param.device "
            "is \"nvme\", got nothing");
}

TEST(ConfigProblemsTest, OffloadContradictionsAreListedTogether) {
  // Bad values in file order, then the rules between keys; each names its key. GPU accumulation with both
  // offloads given is no problem of its own, although parameter offload is refused at stage 2.
  EXPECT_EQ(
      Message(Parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2,
                              "offload_optimizer": {"device": "cpu", "cpu_threads": -1, "host_memory_budget": 10},
                              "offload_param": {"device": "cpu", "buffer_size": 0},
                              "offload_grad_accumulation": "gpu"}})")),
      "<config>: 4 problems in the config:\n"
      "  <config>: zero_optimization.offload_optimizer.cpu_threads: expected an integer in 0..1024, got -1\n"
      "  <config>: zero_optimization.offload_param.buffer_size: expected an integer in 1..9007199254740991, got 0\n"
      "  <config>: zero_optimization.offload_param.device: expected \"none\" below stage 3 (parameter offload "
      "needs zero_optimization.stage 3; stage is 2), got \"cpu\"\n"
      "  <config>: zero_optimization.offload_optimizer.host_memory_budget: expected 0 unless "
      "zero_optimization.offload_optimizer.device is \"nvme\" (the budget splits optimizer state between "
      "pinned host memory and NVMe; device is \"cpu\", which keeps all of it in host memory), got 10");
  // A refused device is not judged again by the rules that read it.
  EXPECT_EQ(Message(Parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
                              "offload_optimizer": {"device": "disk", "host_memory_budget": 10},
                              "offload_param": {"device": "cpu"}, "offload_grad_accumulation": "gpu"}})")),
            "<config>: zero_optimization.offload_optimizer.device: expected one of \"none\", \"cpu\", \"nvme\", "
            "got \"disk\"");
}

TEST(ConfigProblemsTest, MalformedJsonIsStillOneError) {
  auto r = Parse("{\"train_batch_size\": 0,\n \"fp16\": {\"enabled\": 1},\n}");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(Message(r), "<config>: malformed JSON at line 3, column 1: ")) << Message(r);
  EXPECT_FALSE(Contains(Message(r), "problems")) << Message(r);
  EXPECT_FALSE(Contains(Message(r), "\n")) << Message(r);
}

// ---------------------------------------------------------------------------------------------
// Contradictions between keys.

TEST(ConfigRulesTest, Contradictions) {
  struct Case {
    const char* json;
    const char* error;
  };
  const Case cases[] = {
      {R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})",
       "<config>: bf16.enabled: expected false when fp16.enabled is true (pick one 16-bit type), got true"},
      {R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})",
       "<config>: zero_optimization.offload_param.device: expected \"none\" below stage 3 (parameter offload "
       "needs zero_optimization.stage 3; stage is 2), got \"cpu\""},
      {R"({"zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}})",
       "<config>: zero_optimization.offload_optimizer.device: expected \"none\" at stage 0 (optimizer offload "
       "needs zero_optimization.stage 1, 2 or 3), got \"cpu\""},
      {R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}})",
       "<config>: zero_optimization.offload_optimizer.nvme_path: expected a directory when "
       "offload_optimizer.device is \"nvme\", got nothing"},
      {R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": ""}}})",
       "<config>: zero_optimization.offload_param.nvme_path: expected a directory when offload_param.device is "
       "\"nvme\", got nothing"},
      {R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.3}}})",
       "<config>: zero_optimization.offload_optimizer.ratio: expected 1 below stage 3 (partial optimizer offload "
       "needs zero_optimization.stage 3; stage is 2), got 0.3"},
      {R"({"managed_gradient_accumulation": false, "zero_optimization": {"stage": 1, "overlap_comm": true}})",
       "<config>: zero_optimization.overlap_comm: expected false when managed_gradient_accumulation is false at "
       "stage 1 (unmanaged accumulation reduces at step(); DeepSpeed refuses overlap_comm here), got true"},
      {R"({"managed_gradient_accumulation": false, "zero_optimization": {"overlap_comm": true}})",
       "<config>: zero_optimization.overlap_comm: expected false when managed_gradient_accumulation is false at "
       "stage 0"},
      {R"({"zero_optimization": {"stage": 2, "offload_grad_accumulation": "gpu"}})",
       "<config>: zero_optimization.offload_grad_accumulation: expected \"cpu\" unless both "
       "zero_optimization.offload_optimizer.device and zero_optimization.offload_param.device are \"cpu\" or "
       "\"nvme\" (GPU accumulation is for full offload; zero_optimization.offload_optimizer.device is \"none\" and "
       "zero_optimization.offload_param.device is \"none\"), got \"gpu\""},
      // Optimizer offload alone is not enough (stage 1 and stage 3), nor parameter offload alone.
      {R"({"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"},
           "offload_grad_accumulation": "gpu"}})",
       "<config>: zero_optimization.offload_grad_accumulation: expected \"cpu\" unless both "
       "zero_optimization.offload_optimizer.device and zero_optimization.offload_param.device are \"cpu\" or "
       "\"nvme\" (GPU accumulation is for full offload; zero_optimization.offload_param.device is \"none\"), got "
       "\"gpu\""},
      {R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/n"},
           "offload_grad_accumulation": "gpu"}})",
       "<config>: zero_optimization.offload_grad_accumulation: expected \"cpu\" unless both "
       "zero_optimization.offload_optimizer.device and zero_optimization.offload_param.device are \"cpu\" or "
       "\"nvme\" (GPU accumulation is for full offload; zero_optimization.offload_param.device is \"none\"), got "
       "\"gpu\""},
      {R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"},
           "offload_grad_accumulation": "gpu"}})",
       "<config>: zero_optimization.offload_grad_accumulation: expected \"cpu\" unless both "
       "zero_optimization.offload_optimizer.device and zero_optimization.offload_param.device are \"cpu\" or "
       "\"nvme\" (GPU accumulation is for full offload; zero_optimization.offload_optimizer.device is \"none\"), "
       "got \"gpu\""},
      // The tiered budget splits state between host and NVMe: only with device "nvme".
      {R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu",
           "host_memory_budget": 1000000}}})",
       "<config>: zero_optimization.offload_optimizer.host_memory_budget: expected 0 unless "
       "zero_optimization.offload_optimizer.device is \"nvme\" (the budget splits optimizer state between pinned "
       "host memory and NVMe; device is \"cpu\", which keeps all of it in host memory), got 1000000"},
      {R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"host_memory_budget": 4096}}})",
       "<config>: zero_optimization.offload_optimizer.host_memory_budget: expected 0 unless "
       "zero_optimization.offload_optimizer.device is \"nvme\" (the budget splits optimizer state between pinned "
       "host memory and NVMe; device is \"none\"), got 4096"},
      // Single-key checks of the offload blocks, named with their full path.
      {R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "cpu_threads": -2}}})",
       "<config>: zero_optimization.offload_optimizer.cpu_threads: expected an integer in 0..1024, got -2"},
      {R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "buffer_count": 0}}})",
       "<config>: zero_optimization.offload_optimizer.buffer_count: expected an integer in 1..2147483647, got 0"},
      {R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "buffer_count": 0}}})",
       "<config>: zero_optimization.offload_param.buffer_count: expected an integer in 1..2147483647, got 0"},
      {R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "buffer_size": 0}}})",
       "<config>: zero_optimization.offload_param.buffer_size: expected an integer in 1..9007199254740991, got 0"},
      {R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0}}})",
       "<config>: zero_optimization.offload_optimizer.ratio: expected a number in (0, 1], got 0"},
      {R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/n",
           "host_memory_budget": -1}}})",
       "<config>: zero_optimization.offload_optimizer.host_memory_budget: expected an integer in 0..9007199254740991, "
       "got -1"},
      {R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "pin_memory_fallback": "yes"}}})",
       "<config>: zero_optimization.offload_param.pin_memory_fallback: expected true or false, got \"yes\""},
  };
  for (const Case& c : cases) {
    std::string text = c.json;
    text.insert(1, "\"train_batch_size\": 8, ");
    const std::string m = Message(Parse(text));
    EXPECT_EQ(m.substr(0, std::string(c.error).size()), c.error) << text;
  }
}

TEST(ConfigRulesTest, AllowedCombinations) {
  for (const char* json : {
           // Unmanaged accumulation overlaps at stages 2 and 3, and at 0/1 without overlap.
           R"({"managed_gradient_accumulation": false, "zero_optimization": {"stage": 2, "overlap_comm": true}})",
           R"({"managed_gradient_accumulation": false, "zero_optimization": {"stage": 3}})",
           R"({"managed_gradient_accumulation": false, "zero_optimization": {"stage": 1}})",
           R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.3}}})",
           R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
               "offload_param": {"device": "cpu"}, "offload_grad_accumulation": "gpu"}})",
           R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/n"},
               "offload_param": {"device": "nvme", "nvme_path": "/n"}, "offload_grad_accumulation": "gpu"}})",
           // Tiered state at every stage with optimizer offload; a budget of 0 (all on NVMe) anywhere.
           R"({"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "nvme", "nvme_path": "/n",
               "host_memory_budget": 1}}})",
           R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/n",
               "host_memory_budget": 1e12}}})",
           R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "host_memory_budget": 0}}})",
           // Threads and the fallback are read with any device (they act only where a pool or a pin exists).
           R"({"zero_optimization": {"stage": 0, "offload_optimizer": {"cpu_threads": 3, "pin_memory_fallback": true},
               "offload_param": {"pin_memory_fallback": true}}})",
           R"({"fp16": {"enabled": true}, "bf16": {"enabled": false}})",
           R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/nvme"}}})",
       }) {
    std::string text = json;
    text.insert(1, "\"train_batch_size\": 8, ");
    auto r = Parse(text);
    EXPECT_TRUE(r.ok()) << text << ": " << Message(r);
  }
}

// ---------------------------------------------------------------------------------------------
// ConfigToJson.

Config WithoutParseOnlyState(Config c) {
  c.warnings.clear();
  // ConfigToJson writes the resolved overlap_comm, so it reads back as given.
  c.zero.overlap_comm_set = true;
  return c;
}

void ExpectRoundTrip(const Config& c, int world_size) {
  const std::string json = ConfigToJson(c);
  auto again = Parse(json, world_size, /*strict=*/true);
  ASSERT_TRUE(again.ok()) << Message(again) << "\n" << json;
  EXPECT_TRUE(again->warnings.empty()) << again->warnings[0];
  EXPECT_TRUE(WithoutParseOnlyState(*again) == WithoutParseOnlyState(c)) << json << "\n" << ConfigToJson(*again);
  EXPECT_EQ(ConfigToJson(*again), json);
}

TEST(ConfigToJsonTest, RoundTripOfASynthesizedConfig) {
  auto r = Parse(R"({
    "train_batch_size": 24, "gradient_accumulation_steps": 3, "gradient_clipping": 0.25,
    "steps_per_print": 7, "wall_clock_breakdown": true, "gradient_allreduce_op": "sum",
    "prescale_gradients": true, "gradient_predivide_factor": 4, "communication_data_type": "fp16",
    "managed_gradient_accumulation": false, "freeze_inactive_parameters": true,
    "data_types": {"grad_accum_dtype": "bf16"},
    "fp16": {"enabled": true, "loss_scale": 128, "initial_scale_power": 9, "loss_scale_window": 50,
             "hysteresis": 3, "consecutive_hysteresis": true, "min_loss_scale": 0.5,
             "fp16_master_weights_and_grads": true},
    "bf16": {"enabled": false, "bf16_master_weights_and_grads": true, "bf16_optimizer_states": true},
    "optimizer": {"type": "adam", "params": {"lr": 0.125, "betas": [0.5, 0.75], "eps": 1e-5,
                  "adam_w_mode": false}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0.01, "warmup_max_lr": 0.1,
                  "warmup_num_steps": 3, "warmup_type": "linear", "total_num_steps": 30}},
    "zero_optimization": {"stage": 3, "contiguous_gradients": false, "reduce_scatter": false,
      "reduce_bucket_size": 1000, "allgather_bucket_size": 2000, "sub_group_size": 3000,
      "stage3_prefetch_bucket_size": 0, "stage3_param_persistence_threshold": 0,
      "stage3_max_live_parameters": 5, "stage3_max_reuse_distance": 6,
      "stage3_gather_16bit_weights_on_model_save": true, "round_robin_gradients": true,
      "ignore_unused_parameters": false, "offload_grad_accumulation": "gpu",
      "legacy_stage1": true, "zero_hpz_partition_size": 4, "zero_quantized_weights": true,
      "zero_quantized_nontrainable_weights": true, "zero_quantized_gradients": true,
      "zenflow": {"topk_ratio": 0.25},
      "offload_optimizer": {"device": "nvme", "nvme_path": "/a", "buffer_count": 2, "pin_memory": false,
        "pipeline_read": true, "pipeline_write": true, "fast_init": true, "ratio": 0.5, "cpu_threads": 5,
        "pin_memory_fallback": true, "host_memory_budget": 123456789012, "super_offload": true},
      "offload_param": {"device": "nvme", "nvme_path": "/b", "buffer_count": 3, "buffer_size": 10,
        "max_in_cpu": 0, "pin_memory": false, "pin_memory_fallback": true}},
    "aio": {"block_size": 4096, "queue_depth": 2, "intra_op_parallelism": 3, "single_submit": true,
            "overlap_events": false, "use_gds": true, "allow_buffered_fallback": true}
  })",
                 4);
  ASSERT_TRUE(r.ok()) << Message(r);
  EXPECT_EQ(r->train_micro_batch_size_per_gpu, 2);
  EXPECT_EQ(r->zero.overlap_comm, true);
  EXPECT_EQ(r->zero.offload_optimizer.host_memory_budget, 123456789012);
  EXPECT_TRUE(r->zero.zenflow);
  EXPECT_EQ(r->zero.zero_hpz_partition_size, 4);
  ExpectRoundTrip(*r, 4);
}

TEST(ConfigToJsonTest, RoundTripOfEverySchedulerType) {
  for (const char* type : {"", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"}) {
    std::string text = std::string(R"({"train_batch_size": 8, "scheduler": {"type": ")") + type + "\"";
    if (std::string(type).find("Warmup") == 0 && std::string(type) != "WarmupLR") {
      text += R"(, "params": {"total_num_steps": 50})";
    }
    text += "}}";
    auto r = Parse(text);
    ASSERT_TRUE(r.ok()) << Message(r);
    ExpectRoundTrip(*r, 1);
  }
}

// ---------------------------------------------------------------------------------------------
// Realistic DeepSpeed files.

Result<Config> LoadTestdata(const std::string& name, int world_size) {
  ParseOptions options;
  options.world_size = world_size;
  return LoadConfigFile("engine/config/testdata/" + name, options);
}

TEST(ConfigFilesTest, Zero2CpuOffload) {
  auto r = LoadTestdata("zero2_cpu_offload.json", 4);
  ASSERT_TRUE(r.ok()) << Message(r);
  const Config& c = *r;
  EXPECT_EQ(c.train_batch_size, 64);
  EXPECT_EQ(c.model_dtype(), DType::kF16);
  EXPECT_EQ(c.fp16.loss_scale, 0.0);
  EXPECT_EQ(c.optimizer.type, "AdamW");
  EXPECT_EQ(c.optimizer.lr, 3e-5);
  EXPECT_EQ(c.optimizer.weight_decay, 3e-7);
  EXPECT_EQ(c.scheduler.type, "WarmupLR");
  EXPECT_EQ(c.scheduler.warmup_max_lr, 3e-5);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 500);
  EXPECT_EQ(c.zero.stage, 2);
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_EQ(c.zero.reduce_bucket_size, 200000000);
  EXPECT_EQ(c.zero.allgather_bucket_size, 200000000);
  EXPECT_TRUE(c.zero.overlap_comm);
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_TRUE(Contains(c.warnings[0], "'zero_optimization.allgather_partitions' is ignored"));
  // At world size 2 the same file's batch identity fails with the numbers.
  EXPECT_TRUE(Contains(Message(LoadTestdata("zero2_cpu_offload.json", 2)), "4 x 4 x 2 = 32, got 64"));
  ExpectRoundTrip(c, 4);
}

TEST(ConfigFilesTest, Zero3NvmeInfinity) {
  auto r = LoadTestdata("zero3_nvme_infinity.json", 8);
  ASSERT_TRUE(r.ok()) << Message(r);
  const Config& c = *r;
  EXPECT_EQ(c.train_batch_size, 64);
  EXPECT_EQ(c.model_dtype(), DType::kBF16);
  EXPECT_EQ(c.optimizer.type, "Adam");
  EXPECT_TRUE(c.optimizer.adam_w_mode);
  EXPECT_EQ(c.optimizer.beta2, 0.95);
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::kNvme);
  EXPECT_EQ(c.zero.offload_optimizer.nvme_path, "/local_nvme");
  EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::kNvme);
  EXPECT_EQ(c.zero.offload_param.buffer_size, 100000000);
  EXPECT_EQ(c.zero.offload_param.max_in_cpu, 1000000000);
  EXPECT_EQ(c.zero.stage3_param_persistence_threshold, 1000000);
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 500000000);
  EXPECT_TRUE(c.zero.stage3_gather_16bit_weights_on_model_save);
  EXPECT_EQ(c.aio.intra_op_parallelism, 1);
  EXPECT_EQ(c.aio.block_size, 1048576);
  EXPECT_EQ(c.gradient_clipping, 1.0);
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_TRUE(Contains(c.warnings[0], "'aio.thread_count' is the older name"));
  ExpectRoundTrip(c, 8);
}

TEST(ConfigFilesTest, Zero2NvmeTieredOffload) {
  auto r = LoadTestdata("zero2_nvme_tiered_offload.json", 2);
  ASSERT_TRUE(r.ok()) << Message(r);
  const Config& c = *r;
  EXPECT_EQ(c.train_batch_size, 16);
  EXPECT_EQ(c.zero.stage, 2);
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::kNvme);
  EXPECT_EQ(c.zero.offload_optimizer.nvme_path, "/local_nvme/zero");
  EXPECT_TRUE(c.zero.offload_optimizer.pin_memory);
  EXPECT_TRUE(c.zero.offload_optimizer.pin_memory_fallback);
  EXPECT_EQ(c.zero.offload_optimizer.cpu_threads, 14);
  EXPECT_EQ(c.zero.offload_optimizer.host_memory_budget, 64000000000);
  EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::kNone);
  EXPECT_FALSE(c.zero.offload_param.pin_memory_fallback);
  EXPECT_EQ(c.zero.sub_group_size, 100000000);
  EXPECT_EQ(c.aio.queue_depth, 32);
  EXPECT_FALSE(c.aio.allow_buffered_fallback);
  EXPECT_TRUE(c.warnings.empty());
  ExpectRoundTrip(c, 2);
}

TEST(ConfigFilesTest, Zero3Bf16WarmupCosine) {
  auto r = LoadTestdata("zero3_bf16_cosine.json", 8);
  ASSERT_TRUE(r.ok()) << Message(r);
  const Config& c = *r;
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 16);
  EXPECT_TRUE(c.bf16_enabled);
  EXPECT_TRUE(c.has_grad_accum_dtype);
  EXPECT_EQ(c.grad_accum_dtype, DType::kF32);
  EXPECT_EQ(c.communication_data_type, DType::kBF16);
  EXPECT_EQ(c.scheduler.type, "WarmupCosineLR");
  EXPECT_EQ(c.scheduler.total_num_steps, 10000);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 200);
  EXPECT_EQ(c.scheduler.cos_min_ratio, 0.1);
  EXPECT_EQ(c.scheduler.warmup_type, "linear");
  EXPECT_TRUE(c.zero.overlap_comm);  // stage 3 default
  EXPECT_FALSE(c.zero.overlap_comm_set);
  EXPECT_TRUE(c.warnings.empty());
  ExpectRoundTrip(c, 8);
}

TEST(ConfigFilesTest, Fp16DynamicLossScale) {
  auto r = LoadTestdata("fp16_dynamic_loss_scale.json", 2);
  ASSERT_TRUE(r.ok()) << Message(r);
  const Config& c = *r;
  EXPECT_EQ(c.train_batch_size, 32);
  EXPECT_TRUE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.initial_scale_power, 12);
  EXPECT_EQ(c.fp16.loss_scale_window, 500);
  EXPECT_EQ(c.fp16.hysteresis, 4);
  EXPECT_TRUE(c.fp16.consecutive_hysteresis);
  EXPECT_EQ(c.fp16.min_loss_scale, 0.25);
  EXPECT_EQ(c.gradient_clipping, 0.5);
  EXPECT_EQ(c.optimizer.type, "AdamW");
  EXPECT_EQ(c.optimizer.weight_decay, 0.01);
  EXPECT_EQ(c.optimizer.eps, 1e-6);
  EXPECT_EQ(c.scheduler.type, "WarmupDecayLR");
  EXPECT_EQ(c.scheduler.total_num_steps, 100000);
  EXPECT_TRUE(c.zero.round_robin_gradients);
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_TRUE(Contains(c.warnings[0], "'fp16.auto_cast' is ignored"));
  ExpectRoundTrip(c, 2);
}

TEST(ConfigFilesTest, Zero1Minimal) {
  auto r = LoadTestdata("zero1_minimal.json", 2);
  ASSERT_TRUE(r.ok()) << Message(r);
  const Config& c = *r;
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 16);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.zero.stage, 1);
  EXPECT_FALSE(c.zero.overlap_comm);
  EXPECT_EQ(c.optimizer.type, "Adam");
  EXPECT_EQ(c.optimizer.lr, 0.00015);
  EXPECT_EQ(c.optimizer.weight_decay, 0.0);
  EXPECT_EQ(c.model_dtype(), DType::kF32);
  EXPECT_TRUE(c.warnings.empty());
  ExpectRoundTrip(c, 2);
}

TEST(ConfigFilesTest, HuggingFaceAutoValuesAreRejected) {
  auto r = LoadTestdata("hf_trainer_auto.json", 1);
  ASSERT_FALSE(r.ok());
  // Every "auto" in the file, in file order, each with the explanation; no batch-size error on top of the
  // three refused batch keys.
  const std::string src = "engine/config/testdata/hf_trainer_auto.json: ";
  const std::string note =
      ", got \"auto\" (\"auto\" is a Hugging Face Trainer placeholder: the Trainer replaces it with a number "
      "before DeepSpeed reads the config; replace it with the value you want)";
  const std::vector<std::string> keys = {
      "fp16.enabled: expected true or false",
      "bf16.enabled: expected true or false",
      "optimizer.params.lr: expected a number in [0, 1e+38]",
      "optimizer.params.betas: expected [beta1, beta2] with each in [0, 1)",
      "optimizer.params.eps: expected a number in [1e-37, 1e+38]",
      "optimizer.params.weight_decay: expected a number in [0, 1e+38]",
      "scheduler.params.warmup_min_lr: expected a number in [0, 1e+38]",
      "scheduler.params.warmup_max_lr: expected a number in [0, 1e+38], or -1 for optimizer.params.lr",
      "scheduler.params.warmup_num_steps: expected an integer in 1..9007199254740991",
      "zero_optimization.reduce_bucket_size: expected an integer in 1..9007199254740991",
      "zero_optimization.stage3_prefetch_bucket_size: expected an integer in 0..9007199254740991",
      "zero_optimization.stage3_param_persistence_threshold: expected an integer in 0..9007199254740991",
      "gradient_accumulation_steps: expected an integer in 1..2147483647",
      "gradient_clipping: expected a number in [0, 1e+38]",
      "train_batch_size: expected an integer in 1..9007199254740991",
      "train_micro_batch_size_per_gpu: expected an integer in 1..2147483647",
  };
  std::string want = src + std::to_string(keys.size()) + " problems in the config:";
  for (const std::string& k : keys) want += "\n  " + src + k + note;
  EXPECT_EQ(Message(r), want);
}

TEST(ConfigFilesTest, LegacyCpuOffload) {
  auto r = LoadTestdata("legacy_cpu_offload.json", 4);
  ASSERT_TRUE(r.ok()) << Message(r);
  const Config& c = *r;
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
  EXPECT_TRUE(c.bf16_enabled);
  EXPECT_EQ(c.optimizer.weight_decay, 0.0);
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_FALSE(c.zero.offload_optimizer.pin_memory);
  EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::kNone);
  EXPECT_TRUE(c.zero.offload_param.pin_memory);  // the deprecated key sets only the blocks turned on
  EXPECT_TRUE(HasWarning(c, "'bfloat16' is the older name"));
  EXPECT_TRUE(HasWarning(c, "'zero_optimization.cpu_offload' is deprecated"));
  EXPECT_TRUE(HasWarning(c, "'zero_optimization.cpu_offload_use_pin_memory' is deprecated"));
  EXPECT_TRUE(HasWarning(c, "'zero_allow_untested_optimizer' is ignored"));
  EXPECT_TRUE(HasWarning(c, "'tensorboard' is ignored"));
  EXPECT_EQ(c.warnings.size(), 5u);
  ExpectRoundTrip(c, 4);
}

TEST(ConfigFilesTest, Zero3CpuOffloadUnmanaged) {
  auto r = LoadTestdata("zero3_cpu_offload_unmanaged.json", 3);
  ASSERT_TRUE(r.ok()) << Message(r);
  const Config& c = *r;
  EXPECT_EQ(c.train_batch_size, 6);
  EXPECT_FALSE(c.managed_gradient_accumulation);
  EXPECT_EQ(c.gradient_predivide_factor, 2.0);
  EXPECT_EQ(c.fp16.loss_scale, 1024.0);
  EXPECT_EQ(c.optimizer.type, "Adam");
  EXPECT_FALSE(c.optimizer.adam_w_mode);
  EXPECT_EQ(c.optimizer.weight_decay, 0.01);
  EXPECT_EQ(c.zero.offload_optimizer.ratio, 0.5);
  EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::kCpu);
  EXPECT_EQ(c.zero.offload_grad_accumulation, "gpu");
  EXPECT_EQ(c.zero.stage3_max_live_parameters, 300000000);
  EXPECT_EQ(c.zero.stage3_param_persistence_threshold, 0);
  EXPECT_TRUE(c.zero.overlap_comm);
  EXPECT_TRUE(c.warnings.empty());
  ExpectRoundTrip(c, 3);
}

}  // namespace
}  // namespace zero
