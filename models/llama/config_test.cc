#include "models/llama/config.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/llama/params.h"
#include "models/model_api.h"
#include "testing/scratch_dir.h"
#include "testing/status_matchers.h"

namespace zero::llm {
namespace {

using Json = nlohmann::json;

// Qwen/Qwen3-0.6B's config.json (the published values, transformers 4.51 form).
const char kQwen3_06B[] = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// meta-llama/Llama-3.1-8B-Instruct's config.json (published values), rope_scaling included.
const char kLlama31_8B[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009],
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

LlmConfig PresetOrDie(const char* name) {
  auto c = Preset(name);
  EXPECT_OK(c);
  return c.ok() ? *c : LlmConfig{};
}

Result<LlmConfig> ParseEdited(const char* base, const std::function<void(Json&)>& edit) {
  Json j = Json::parse(base);
  edit(j);
  return ParseHfConfig(j.dump(), "edited.json");
}

void WriteText(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  std::fwrite(text.data(), 1, text.size(), f);
  std::fclose(f);
}

TEST(LlmConfigTest, ParsesQwen3_06BAsItsPreset) {
  auto c = ParseHfConfig(kQwen3_06B, "qwen3.json");
  ASSERT_OK(c);
  EXPECT_EQ(*c, PresetOrDie("qwen3-0.6b")) << c->ToString();
  EXPECT_TRUE(c->qk_norm());
  EXPECT_EQ(c->bos_token_id, 151643);
  EXPECT_EQ(c->eos_token_id, 151645);
  EXPECT_EQ(c->rope_theta, 1e6);
  EXPECT_EQ(c->rms_norm_eps, 1e-6);
}

TEST(LlmConfigTest, Llama31ReadsItsLlama3RopeScalingAndWritesItBack) {
  auto c = ParseHfConfig(kLlama31_8B, "llama.json");
  ASSERT_OK(c);
  EXPECT_EQ(c->rope_scaling.rope_type, "llama3");
  EXPECT_EQ(c->rope_scaling.factor, 8.0);
  EXPECT_EQ(c->rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(c->rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_FALSE(c->qk_norm());
  EXPECT_EQ(c->head_dim, 128);         // hidden_size / num_attention_heads: the config has no head_dim
  EXPECT_EQ(c->eos_token_id, 128001);  // the first of the list
  // The preset is the shape without the scaling.
  LlmConfig unscaled = *c;
  unscaled.rope_scaling = RopeScaling{};
  EXPECT_EQ(unscaled, PresetOrDie("llama-3.1-8b")) << c->ToString();
  // Written back in both of transformers' forms, and read back equal.
  const std::string text = ToHfConfigJson(*c);
  const Json j = Json::parse(text);
  EXPECT_EQ(j["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(j["rope_parameters"]["rope_type"], "llama3");
  EXPECT_EQ(j["rope_parameters"]["factor"], 8.0);
  auto back = ParseHfConfig(text, "written");
  ASSERT_OK(back);
  EXPECT_EQ(*back, *c);
  // 5.x's form alone (rope_parameters, no rope_scaling) reads the same.
  auto v5 = ParseEdited(kLlama31_8B, [](Json& e) {
    e["rope_parameters"] = e["rope_scaling"];
    e["rope_parameters"]["rope_theta"] = e["rope_theta"];
    e.erase("rope_scaling");
  });
  ASSERT_OK(v5);
  EXPECT_EQ(*v5, *c);
  // Without rope_scaling: the preset itself.
  auto plain = ParseEdited(kLlama31_8B, [](Json& e) { e["rope_scaling"] = nullptr; });
  ASSERT_OK(plain);
  EXPECT_EQ(*plain, PresetOrDie("llama-3.1-8b"));
}

TEST(LlmConfigTest, Llama3RopeScalingErrorsNameTheKey) {
  struct Case {
    std::function<void(Json&)> edit;
    std::string key, expected;
  };
  const std::vector<Case> cases = {
      {[](Json& j) { j["rope_scaling"].erase("factor"); }, "rope_scaling.factor", "llama3 RoPE needs it"},
      {[](Json& j) { j["rope_scaling"]["factor"] = 0.5; }, "rope_scaling.factor", ">= 1"},
      {[](Json& j) { j["rope_scaling"]["high_freq_factor"] = 0.5; }, "rope_scaling.high_freq_factor", "above"},
      {[](Json& j) { j["rope_scaling"]["beta_fast"] = 32; }, "rope_scaling.beta_fast", "no such key"},
      {[](Json& j) { j["rope_scaling"]["rope_type"] = "dynamic"; }, "rope_scaling.rope_type", "llama3"},
      {[](Json& j) { j["rope_scaling"]["original_max_position_embeddings"] = 0; },
       "rope_scaling.original_max_position_embeddings", "positive"},
      {[](Json& j) {
         j["rope_parameters"] = j["rope_scaling"];
         j["rope_parameters"]["factor"] = 16.0;
       },
       "rope_parameters", "the same llama3 scaling"},
  };
  for (const Case& k : cases) {
    auto c = ParseEdited(kLlama31_8B, k.edit);
    ASSERT_FALSE(c.ok()) << k.key;
    EXPECT_NE(c.status().message().find("edited.json: " + k.key), std::string::npos) << c.status().message();
    EXPECT_NE(c.status().message().find(k.expected), std::string::npos) << c.status().message();
  }
}

TEST(LlmConfigTest, DefaultsFollowTransformersConfigClasses) {
  auto llama = ParseEdited(kLlama31_8B, [](Json& j) {
    j.erase("rope_scaling");
    j.erase("num_key_value_heads");
    j.erase("tie_word_embeddings");
    j.erase("rope_theta");
    j.erase("rms_norm_eps");
    j.erase("bos_token_id");
    j.erase("eos_token_id");
    j.erase("torch_dtype");
    j.erase("initializer_range");
  });
  ASSERT_OK(llama);
  EXPECT_EQ(llama->num_key_value_heads, 32);
  EXPECT_EQ(llama->head_dim, 128);
  EXPECT_FALSE(llama->tie_word_embeddings);
  EXPECT_EQ(llama->rope_theta, 10000.0);
  EXPECT_EQ(llama->rms_norm_eps, 1e-6);
  EXPECT_EQ(llama->bos_token_id, -1);
  EXPECT_EQ(llama->eos_token_id, -1);
  EXPECT_EQ(llama->torch_dtype, "bfloat16");
  EXPECT_EQ(llama->initializer_range, 0.02);

  // Qwen3Config's head_dim defaults to 128 whatever hidden_size / heads is.
  auto qwen = ParseEdited(kQwen3_06B, [](Json& j) {
    j.erase("head_dim");
    j.erase("tie_word_embeddings");
    j["hidden_size"] = 512;
  });
  ASSERT_OK(qwen);
  EXPECT_EQ(qwen->head_dim, 128);
  EXPECT_FALSE(qwen->tie_word_embeddings);

  // model_type alone names the class.
  auto by_type = ParseEdited(kQwen3_06B, [](Json& j) { j.erase("architectures"); });
  ASSERT_OK(by_type);
  EXPECT_EQ(by_type->architecture, kQwen3Architecture);
}

// transformers 5.x writes rope_parameters and dtype instead of rope_theta and torch_dtype.
TEST(LlmConfigTest, ReadsTransformers5Keys) {
  auto c = ParseEdited(kQwen3_06B, [](Json& j) {
    j.erase("rope_theta");
    j.erase("rope_scaling");
    j.erase("torch_dtype");
    j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 250000.0}};
    j["dtype"] = "float32";
  });
  ASSERT_OK(c);
  EXPECT_EQ(c->rope_theta, 250000.0);
  EXPECT_EQ(c->torch_dtype, "float32");
}

struct Refusal {
  const char* base;
  std::function<void(Json&)> edit;
  std::string key;  // must appear as "edited.json: <key>"
};

TEST(LlmConfigTest, EveryRefusalNamesSourceAndKey) {
  const std::vector<Refusal> cases = {
      {kQwen3_06B,
       [](Json& j) {
         j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
       },
       "rope_scaling.rope_type"},
      {kQwen3_06B,
       [](Json& j) {
         j["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 2.0}};
       },
       "rope_parameters.rope_type"},
      {kQwen3_06B,
       [](Json& j) {
         j["rope_parameters"] = {{"rope_type", "default"}, {"factor", 2.0}};
       },
       "rope_parameters.factor"},
      {kQwen3_06B,
       [](Json& j) {
         j["rope_parameters"] = {{"rope_theta", 5.0}};
       },
       "rope_parameters.rope_theta"},
      {kQwen3_06B, [](Json& j) { j["use_sliding_window"] = true; }, "use_sliding_window"},
      {kQwen3_06B,
       [](Json& j) {
         j["layer_types"] = {"full_attention", "sliding_attention"};
       },
       "layer_types[1]"},
      {kQwen3_06B, [](Json& j) { j["attention_bias"] = true; }, "attention_bias"},
      {kLlama31_8B,
       [](Json& j) {
         j["rope_scaling"] = nullptr;
         j["mlp_bias"] = true;
       },
       "mlp_bias"},
      {kQwen3_06B, [](Json& j) { j["hidden_act"] = "gelu"; }, "hidden_act"},
      {kQwen3_06B, [](Json& j) { j["attention_dropout"] = 0.1; }, "attention_dropout"},
      {kQwen3_06B,
       [](Json& j) {
         j["quantization_config"] = {{"quant_method", "awq"}};
       },
       "quantization_config"},
      {kQwen3_06B,
       [](Json& j) {
         j["architectures"] = {"MistralForCausalLM"};
         j.erase("model_type");
       },
       "architectures[0]"},
      {kQwen3_06B,
       [](Json& j) {
         j["architectures"] = {"Qwen3ForCausalLM", "X"};
       },
       "architectures"},
      {kQwen3_06B, [](Json& j) { j["model_type"] = "llama"; }, "model_type"},
      {kQwen3_06B,
       [](Json& j) {
         j.erase("architectures");
         j.erase("model_type");
       },
       "architectures"},
      {kQwen3_06B, [](Json& j) { j.erase("hidden_size"); }, "hidden_size"},
      {kQwen3_06B, [](Json& j) { j.erase("vocab_size"); }, "vocab_size"},
      {kQwen3_06B, [](Json& j) { j.erase("intermediate_size"); }, "intermediate_size"},
      {kQwen3_06B, [](Json& j) { j.erase("num_hidden_layers"); }, "num_hidden_layers"},
      {kQwen3_06B, [](Json& j) { j.erase("num_attention_heads"); }, "num_attention_heads"},
      {kQwen3_06B, [](Json& j) { j.erase("max_position_embeddings"); }, "max_position_embeddings"},
      {kQwen3_06B, [](Json& j) { j["hidden_size"] = 0; }, "hidden_size"},
      {kQwen3_06B, [](Json& j) { j["vocab_size"] = -3; }, "vocab_size"},
      {kQwen3_06B, [](Json& j) { j["num_hidden_layers"] = 0; }, "num_hidden_layers"},
      {kQwen3_06B, [](Json& j) { j["intermediate_size"] = 0; }, "intermediate_size"},
      {kQwen3_06B, [](Json& j) { j["hidden_size"] = "1024"; }, "hidden_size"},
      {kQwen3_06B, [](Json& j) { j["hidden_size"] = 1024.5; }, "hidden_size"},
      {kQwen3_06B, [](Json& j) { j["num_key_value_heads"] = 5; }, "num_key_value_heads"},
      {kQwen3_06B, [](Json& j) { j["head_dim"] = 127; }, "head_dim"},
      {kLlama31_8B,
       [](Json& j) {
         j["rope_scaling"] = nullptr;
         j["num_attention_heads"] = 24;
         j["head_dim"] = 128;
       },
       "hidden_size"},
      {kQwen3_06B, [](Json& j) { j["rope_theta"] = -1.0; }, "rope_theta"},
      {kQwen3_06B, [](Json& j) { j["rms_norm_eps"] = 0.0; }, "rms_norm_eps"},
      {kQwen3_06B, [](Json& j) { j["tie_word_embeddings"] = 1; }, "tie_word_embeddings"},
      {kQwen3_06B, [](Json& j) { j["eos_token_id"] = "x"; }, "eos_token_id"},
      {kQwen3_06B,
       [](Json& j) {
         j["eos_token_id"] = {1, "x"};
       },
       "eos_token_id[1]"},
      {kQwen3_06B, [](Json& j) { j["torch_dtype"] = "int8"; }, "torch_dtype"},
      // Issue 35: keys that were ignored or unchecked.
      {kQwen3_06B, [](Json& j) { j["partial_rotary_factor"] = 0.5; }, "partial_rotary_factor"},
      {kQwen3_06B, [](Json& j) { j["partial_rotary_factor"] = "1"; }, "partial_rotary_factor"},
      {kQwen3_06B, [](Json& j) { j["eos_token_id"] = 151936; }, "eos_token_id"},
      {kQwen3_06B, [](Json& j) { j["bos_token_id"] = 200000; }, "bos_token_id"},
      {kLlama31_8B,
       [](Json& j) {
         j["eos_token_id"] = {128001, 128256};
       },
       "eos_token_id[1]"},
      {kLlama31_8B,
       [](Json& j) {
         j["eos_token_id"] = {128001, -5};
       },
       "eos_token_id[1]"},
      {kQwen3_06B,
       [](Json& j) {
         j["layer_types"] = Json::array({"full_attention", "full_attention"});
       },
       "layer_types"},
      {kQwen3_06B, [](Json& j) { j["num_hidden_layers"] = 16777216; }, "num_hidden_layers"},
      {kQwen3_06B, [](Json& j) { j["num_hidden_layers"] = 4097; }, "num_hidden_layers"},
      {kQwen3_06B, [](Json& j) { j["dtype"] = "float32"; }, "dtype"},
  };
  for (const Refusal& r : cases) {
    auto c = ParseEdited(r.base, r.edit);
    ASSERT_FALSE(c.ok()) << r.key;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status().ToString();
    EXPECT_NE(c.status().message().find("edited.json: " + r.key + ": expected"), std::string::npos)
        << "key " << r.key << ": " << c.status().message();
  }
  // The unsupported architecture's message lists the supported ones.
  auto mistral = ParseEdited(kQwen3_06B, [](Json& j) {
    j["architectures"] = {"MistralForCausalLM"};
    j.erase("model_type");
  });
  EXPECT_NE(mistral.status().message().find("LlamaForCausalLM"), std::string::npos);
  EXPECT_NE(mistral.status().message().find("Qwen3ForCausalLM"), std::string::npos);
  EXPECT_NE(mistral.status().message().find("MistralForCausalLM"), std::string::npos);
}

// Issue 35: the keys above that are accepted in their harmless form.
TEST(LlmConfigTest, HarmlessFormsOfCheckedKeysAreAccepted) {
  auto full = ParseEdited(kQwen3_06B, [](Json& j) {
    j["partial_rotary_factor"] = 1.0;
    j["layer_types"] = Json::array();
    for (int i = 0; i < 28; ++i) j["layer_types"].push_back("full_attention");
    j["eos_token_id"] = {151645, 151935};  // every id below vocab_size
    j["bos_token_id"] = 0;
  });
  ASSERT_OK(full);
  EXPECT_EQ(full->eos_token_id, 151645);
  auto four_k = ParseEdited(kQwen3_06B, [](Json& j) { j["num_hidden_layers"] = kMaxLayers; });
  ASSERT_OK(four_k);
}

// Sizes are bounded before anything is allocated: num_hidden_layers 16777216 (the old per-dimension
// limit) used to pass and end in std::bad_alloc after 18 s; each dimension may still be below its
// limit while their product is absurd, so the parameter count has a limit of its own.
TEST(LlmConfigTest, SizesAreBoundedNamingTheKeyAndTheLimit) {
  auto layers = ParseEdited(kQwen3_06B, [](Json& j) { j["num_hidden_layers"] = 16777216; });
  ASSERT_FALSE(layers.ok());
  EXPECT_NE(layers.status().message().find("num_hidden_layers: expected at most " + std::to_string(kMaxLayers)),
            std::string::npos)
      << layers.status().message();
  auto huge = ParseEdited(kQwen3_06B, [](Json& j) {
    j["vocab_size"] = 16777216;
    j["hidden_size"] = 16777216;
  });
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("edited.json: vocab_size, hidden_size, intermediate_size, num_hidden_layers"),
            std::string::npos)
      << huge.status().message();
  EXPECT_NE(huge.status().message().find(std::to_string(kMaxParams)), std::string::npos) << huge.status().message();
  // The product of the largest allowed dimensions overflows int64: still a clear error.
  LlmConfig c = PresetOrDie("tiny");
  c.num_attention_heads = c.num_key_value_heads = c.head_dim = c.hidden_size = c.intermediate_size = 1 << 24;
  c.num_hidden_layers = kMaxLayers;
  EXPECT_NE(c.Validate().message().find("parameters"), std::string::npos) << c.Validate().message();
  // The largest preset is far below the limit.
  EXPECT_LT(PresetOrDie("llama-2-13b").NumParams(), kMaxParams / 50);
}

// Hostile JSON (issue 35): what crashed nlohmann's parse now gives an error naming the file.
TEST(LlmConfigTest, HostileJsonIsAnErrorNamingTheFile) {
  const std::string deep = "{\"vocab_size\": 5, \"x\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  auto nested = ParseHfConfig(deep, "deep/config.json");
  ASSERT_FALSE(nested.ok());
  EXPECT_EQ(nested.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(nested.status().message().rfind("deep/config.json: JSON nested deeper than 100 levels at line 1", 0), 0u)
      << nested.status().message();
  // Under a key whose wrong value the error message shows (this one crashed with SIGSEGV).
  auto shown = ParseHfConfig("{\"architectures\": " + std::string(100000, '[') + std::string(100000, ']') + "}",
                             "deep/config.json");
  ASSERT_FALSE(shown.ok());
  EXPECT_NE(shown.status().message().find("JSON nested deeper than 100 levels"), std::string::npos)
      << shown.status().message();

  const std::string text = kQwen3_06B;
  for (const std::string key : {"rope_theta", "some_unknown_key"}) {
    std::string big = text;
    big.insert(1, "\"" + key + "\": 1e400,");
    const std::string known = "\"rope_theta\": 1000000,";
    if (key == "rope_theta") big.erase(big.find(known), known.size());
    auto r = ParseHfConfig(big, "big/config.json");
    ASSERT_FALSE(r.ok()) << key;
    EXPECT_NE(r.status().message().find("big/config.json: number 1e400"), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("(key '" + key + "') is outside the range of a double"), std::string::npos)
        << r.status().message();
  }

  std::string twice = text;
  twice.insert(1, "\"hidden_size\": 2048,");
  auto dup = ParseHfConfig(twice, "dup/config.json");
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("dup/config.json: duplicate key 'hidden_size'"), std::string::npos)
      << dup.status().message();
  std::string nested_twice = kLlama31_8B;
  nested_twice.insert(nested_twice.find("\"factor\""), "\"factor\": 2.0, ");
  auto dup2 = ParseHfConfig(nested_twice, "dup/config.json");
  ASSERT_FALSE(dup2.ok());
  EXPECT_NE(dup2.status().message().find("duplicate key 'rope_scaling.factor'"), std::string::npos)
      << dup2.status().message();

  // Through LoadHfConfig the message names the file's path.
  ASSERT_OK_AND_ASSIGN(ScratchDir scratch, ScratchDir::Create("llm_config_hostile"));
  const std::string path = scratch.File("config.json");
  ASSERT_NO_FATAL_FAILURE(WriteText(path, deep));
  auto loaded = LoadHfConfig(path);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().message().rfind(path + ": JSON nested deeper", 0), 0u) << loaded.status().message();
}

TEST(LlmConfigTest, MalformedTextNamesTheSource) {
  for (const char* text : {"{\"hidden_size\": ", "", "[1, 2]", "nonsense"}) {
    auto c = ParseHfConfig(text, "bad.json");
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_EQ(c.status().message().rfind("bad.json: ", 0), 0u) << c.status().message();
  }
}

TEST(LlmConfigTest, RoundTripsThroughConfigJson) {
  std::vector<LlmConfig> configs;
  for (const std::string& name : PresetNames()) configs.push_back(PresetOrDie(name.c_str()));
  LlmConfig odd = PresetOrDie("tiny");
  odd.tie_word_embeddings = false;
  odd.rope_theta = 123456.789;
  odd.rms_norm_eps = 3.3e-7;
  odd.initializer_range = 0.0125;
  odd.bos_token_id = 7;
  odd.torch_dtype = "float32";
  configs.push_back(odd);
  LlmConfig llama = PresetOrDie("llama-3.2-1b");
  llama.head_dim = 48;  // explicit head_dim other than hidden / heads
  llama.eos_token_id = -1;
  configs.push_back(llama);
  for (const LlmConfig& c : configs) {
    const std::string text = ToHfConfigJson(c);
    auto back = ParseHfConfig(text, "written.json");
    ASSERT_OK(back) << "\n" << text;
    EXPECT_EQ(*back, c) << c.ToString() << "\n" << text;
    const Json j = Json::parse(text);
    EXPECT_EQ(j["model_type"], c.qk_norm() ? "qwen3" : "llama");
    EXPECT_EQ(j["hidden_act"], "silu");
    EXPECT_TRUE(j["rope_scaling"].is_null());
    EXPECT_EQ(j["attention_bias"], false);
    EXPECT_EQ(j["use_cache"], true);
    EXPECT_EQ(j["rope_parameters"]["rope_type"], "default");
  }
}

TEST(LlmConfigTest, LoadsFileOrDirectoryWithClearErrors) {
  ASSERT_OK_AND_ASSIGN(ScratchDir scratch, ScratchDir::Create("llm_config_test"));
  const std::string dir = scratch.File("ckpt");
  ::mkdir(dir.c_str(), 0755);
  ASSERT_NO_FATAL_FAILURE(WriteText(dir + "/config.json", kQwen3_06B));
  for (const std::string& path : {dir, dir + "/", dir + "/config.json"}) {
    auto c = LoadHfConfig(path);
    ASSERT_OK(c) << path;
    EXPECT_EQ(*c, PresetOrDie("qwen3-0.6b"));
  }
  auto missing = LoadHfConfig(dir + "/nope.json");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope.json"), std::string::npos);

  const std::string empty = scratch.File("empty");
  ::mkdir(empty.c_str(), 0755);
  auto no_config = LoadHfConfig(empty);
  EXPECT_EQ(no_config.status().code(), StatusCode::kNotFound);
  EXPECT_NE(no_config.status().message().find("without config.json"), std::string::npos)
      << no_config.status().message();

  const std::string junk = scratch.File("junk.json");
  ASSERT_NO_FATAL_FAILURE(WriteText(junk, "{ not json"));
  auto bad = LoadHfConfig(junk);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(junk + ": malformed JSON at line 1, column 4"), std::string::npos)
      << bad.status().message();

  // A field error from a file names the file.
  ASSERT_NO_FATAL_FAILURE(WriteText(junk, "{\"architectures\": [\"Qwen3ForCausalLM\"]}"));
  auto incomplete = LoadHfConfig(junk);
  EXPECT_NE(incomplete.status().message().find(junk + ": vocab_size"), std::string::npos)
      << incomplete.status().message();
}

TEST(LlmConfigTest, PresetsAndCounts) {
  // qwen3-0.6b by hand: embedding 151936*1024 = 155582464 (tied: once); per layer q 2048*1024 +
  // k, v 1024*1024 each + o 1024*2048 = 6291456, MLP 3*3072*1024 = 9437184, norms 2*1024 + 2*128 =
  // 2304, so 15730944 per layer, 440466432 for 28; plus the final norm 1024: 596049920.
  EXPECT_EQ(PresetOrDie("qwen3-0.6b").NumParams(), 596049920);
  EXPECT_EQ(PresetOrDie("llama-3.2-3b").NumParams(), 3212749824);
  EXPECT_EQ(PresetOrDie("llama-3.1-8b").NumParams(), 8030261248);
  // The published counts: Qwen3-4B 4,022,468,096 and Llama-2-13b 13,015,864,320 (its untied
  // 32000 x 5120 embedding and lm_head, 40 layers of 317,204,480, the final norm).
  EXPECT_EQ(PresetOrDie("qwen3-4b").NumParams(), 4022468096);
  EXPECT_EQ(PresetOrDie("llama-2-13b").NumParams(), 13015864320);
  for (const std::string& name : PresetNames()) {
    const LlmConfig c = PresetOrDie(name.c_str());
    ASSERT_OK(c.Validate()) << name << ": " << c.Validate().ToString();
    const std::vector<examples::ModelParamSpec> specs = LlmParamSpecs(c);
    EXPECT_EQ(c.NumParams(), examples::TotalNumel(specs)) << name;
    // MatmulParams: every 2-D tensor but the embedding, plus the embedding once more when tied
    // (then it is also the lm_head).
    int64_t matmul = 0;
    for (size_t i = 1; i < specs.size(); ++i) {
      if (specs[i].shape.size() == 2) matmul += specs[i].numel();
    }
    if (c.tie_word_embeddings) matmul += specs[0].numel();
    EXPECT_EQ(c.MatmulParams(), matmul) << name;
  }
  const LlmConfig tiny = PresetOrDie("tiny");
  EXPECT_EQ(tiny.NumParams(), 131456);
  EXPECT_EQ(tiny.TrainFlopsPerToken(128), 6.0 * tiny.MatmulParams() + 6.0 * 2 * 128 * 4 * 16);
  auto unknown = Preset("gpt-5");
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
  EXPECT_NE(unknown.status().message().find("qwen3-0.6b"), std::string::npos) << unknown.status().message();
  EXPECT_EQ(tiny.ToString(), "Qwen3ForCausalLM V=512 H=64 I=192 L=2 heads=4/2 head_dim=16 tied params=131456");
}

TEST(LlmConfigTest, ValidateNamesTheKey) {
  LlmConfig c = PresetOrDie("tiny");
  c.num_key_value_heads = 3;
  EXPECT_NE(c.Validate().message().find("num_key_value_heads"), std::string::npos);
  c = PresetOrDie("tiny");
  c.architecture = "GPT2LMHeadModel";
  EXPECT_NE(c.Validate().message().find("GPT2LMHeadModel"), std::string::npos);
  c = PresetOrDie("tiny");
  c.max_position_embeddings = 0;
  EXPECT_NE(c.Validate().message().find("max_position_embeddings"), std::string::npos);
}

// ---- Parameter list. -------------------------------------------------------------------------------

std::vector<std::string> Names(const std::vector<examples::ModelParamSpec>& specs) {
  std::vector<std::string> n;
  for (const auto& s : specs) n.push_back(s.name);
  return n;
}

TEST(LlmParamsTest, Qwen3TiedNamesShapesModules) {
  LlmConfig c = PresetOrDie("tiny");
  const auto specs = LlmParamSpecs(c);
  ASSERT_EQ(specs.size(), 1u + 2 * 11 + 1);
  const std::vector<std::string> layer0 = {
      "model.layers.0.input_layernorm.weight",  "model.layers.0.self_attn.q_proj.weight",
      "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight",
      "model.layers.0.self_attn.o_proj.weight", "model.layers.0.self_attn.q_norm.weight",
      "model.layers.0.self_attn.k_norm.weight", "model.layers.0.post_attention_layernorm.weight",
      "model.layers.0.mlp.gate_proj.weight",    "model.layers.0.mlp.up_proj.weight",
      "model.layers.0.mlp.down_proj.weight"};
  const auto names = Names(specs);
  EXPECT_EQ(names[0], "model.embed_tokens.weight");
  EXPECT_EQ(std::vector<std::string>(names.begin() + 1, names.begin() + 12), layer0);
  EXPECT_EQ(names[12], "model.layers.1.input_layernorm.weight");
  EXPECT_EQ(names.back(), "model.norm.weight");
  EXPECT_EQ(specs[0].shape, (std::vector<int64_t>{512, 64}));
  EXPECT_EQ(specs[2].shape, (std::vector<int64_t>{64, 64}));    // q: 4 heads * 16
  EXPECT_EQ(specs[3].shape, (std::vector<int64_t>{32, 64}));    // k: 2 kv heads * 16
  EXPECT_EQ(specs[5].shape, (std::vector<int64_t>{64, 64}));    // o
  EXPECT_EQ(specs[6].shape, (std::vector<int64_t>{16}));        // q_norm
  EXPECT_EQ(specs[9].shape, (std::vector<int64_t>{192, 64}));   // gate
  EXPECT_EQ(specs[11].shape, (std::vector<int64_t>{64, 192}));  // down
  EXPECT_EQ(specs[1].init, examples::InitKind::kOnes);
  EXPECT_EQ(specs[6].init, examples::InitKind::kOnes);
  EXPECT_EQ(specs[2].init, examples::InitKind::kNormal);
  EXPECT_FLOAT_EQ(specs[2].init_std, 0.02f);
  EXPECT_EQ(specs[0].init, examples::InitKind::kNormal);

  const auto modules = examples::GroupByModule(specs);
  ASSERT_EQ(modules.size(), 4u);
  EXPECT_EQ(modules[0].name, "embed");
  EXPECT_EQ(modules[0].params, std::vector<int>{0});
  EXPECT_EQ(modules[1].name, "layer0");
  EXPECT_EQ(modules[2].name, "layer1");
  EXPECT_EQ(modules[3].name, "head");
  EXPECT_EQ(modules[3].params, std::vector<int>{23});
  EXPECT_EQ(FinalNormIndex(c), 23);
  EXPECT_EQ(LmHeadIndex(c), -1);
  EXPECT_EQ(OutputWeightIndex(c), 0);

  const LayerParamIndex l1 = LayerParams(c, 1);
  EXPECT_EQ(l1.first, 12);
  EXPECT_EQ(l1.count, 11);
  EXPECT_EQ(modules[2].params.front(), l1.first);
  EXPECT_EQ(names[l1.q_norm], "model.layers.1.self_attn.q_norm.weight");
  EXPECT_EQ(names[l1.k_norm], "model.layers.1.self_attn.k_norm.weight");
  EXPECT_EQ(names[l1.post_norm], "model.layers.1.post_attention_layernorm.weight");
  EXPECT_EQ(names[l1.down], "model.layers.1.mlp.down_proj.weight");
}

TEST(LlmParamsTest, LlamaUntiedAndTied) {
  LlmConfig c = PresetOrDie("tiny");
  c.architecture = kLlamaArchitecture;
  c.tie_word_embeddings = false;
  auto specs = LlmParamSpecs(c);
  ASSERT_EQ(specs.size(), 1u + 2 * 9 + 2);
  const auto names = Names(specs);
  EXPECT_EQ(names[5], "model.layers.0.self_attn.o_proj.weight");
  EXPECT_EQ(names[6], "model.layers.0.post_attention_layernorm.weight");
  EXPECT_EQ(names[19], "model.norm.weight");
  EXPECT_EQ(names[20], "lm_head.weight");
  EXPECT_EQ(specs[20].shape, (std::vector<int64_t>{512, 64}));
  EXPECT_EQ(specs[20].module, "head");
  EXPECT_EQ(LmHeadIndex(c), 20);
  EXPECT_EQ(OutputWeightIndex(c), 20);
  const LayerParamIndex l0 = LayerParams(c, 0);
  EXPECT_EQ(l0.q_norm, -1);
  EXPECT_EQ(l0.k_norm, -1);
  EXPECT_EQ(names[l0.gate], "model.layers.0.mlp.gate_proj.weight");
  const auto modules = examples::GroupByModule(specs);
  EXPECT_EQ(modules.back().params, (std::vector<int>{19, 20}));
  for (int l = 0; l < 2; ++l) {
    EXPECT_EQ(modules[1 + l].params.size(), 9u);
    EXPECT_EQ(modules[1 + l].params.front(), LayerParams(c, l).first);
  }
  EXPECT_EQ(c.NumParams(), examples::TotalNumel(specs));

  c.tie_word_embeddings = true;
  specs = LlmParamSpecs(c);
  EXPECT_EQ(specs.size(), 1u + 2 * 9 + 1);
  EXPECT_EQ(specs.back().name, "model.norm.weight");
  EXPECT_EQ(c.NumParams(), examples::TotalNumel(specs));
}

}  // namespace
}  // namespace zero::llm
