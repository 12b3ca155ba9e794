#include "models/llama/config.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>
#include <vector>

#include "runtime/json_input.h"

namespace zero::llm {
namespace {

using Json = nlohmann::json;

std::string Shown(const Json& v) {
  std::string s = v.dump();
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

Status KeyError(const std::string& source, const std::string& key, const std::string& expected,
                const std::string& got) {
  return InvalidArgumentError(source + ": " + key + ": expected " + expected + ", got " + got);
}

// NumParams() in double: exact enough to compare with kMaxParams, and free of int64 overflow.
double ParamCountEstimate(const LlmConfig& c) {
  const double H = static_cast<double>(c.hidden_size), hd = static_cast<double>(c.head_dim);
  const double q = static_cast<double>(c.num_attention_heads) * hd,
               kv = static_cast<double>(c.num_key_value_heads) * hd;
  const double per_layer = 2 * H + H * q + 2 * H * kv + q * H + (c.qk_norm() ? 2 * hd : 0) +
                           3 * H * static_cast<double>(c.intermediate_size);
  return static_cast<double>(c.vocab_size) * H *
             static_cast<double>((c.tie_word_embeddings ? 1 : 2) + std::max<int64_t>(c.extra_heads, 0)) +
         static_cast<double>(c.num_hidden_layers) * per_layer + H;
}

// Shape and rule checks shared by Validate() and the parser; `source` starts each message.
Status ValidateFrom(const LlmConfig& c, const std::string& source) {
  if (c.architecture != kLlamaArchitecture && c.architecture != kQwen3Architecture) {
    return KeyError(source, "architectures[0]",
                    std::string("one of the supported architectures \"") + kLlamaArchitecture + "\", \"" +
                        kQwen3Architecture + "\"",
                    "\"" + c.architecture + "\"");
  }
  const std::pair<const char*, int64_t> sizes[] = {
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"head_dim", c.head_dim},
      {"max_position_embeddings", c.max_position_embeddings},
  };
  for (const auto& [key, v] : sizes) {
    if (v < 1) return KeyError(source, key, "a positive integer", std::to_string(v));
  }
  // Sizes multiply into tensor element counts: bounded here, before anything is allocated.
  for (const auto& [key, v] : sizes) {
    if (v > kMaxDimension) {
      return KeyError(source, key, "at most " + std::to_string(kMaxDimension) + " (2^24, zero's limit on a dimension)",
                      std::to_string(v));
    }
  }
  if (c.num_hidden_layers > kMaxLayers) {
    return KeyError(source, "num_hidden_layers",
                    "at most " + std::to_string(kMaxLayers) + " (zero's limit; the deepest published models have 126)",
                    std::to_string(c.num_hidden_layers));
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return KeyError(source, "num_key_value_heads",
                    "a divisor of num_attention_heads (" + std::to_string(c.num_attention_heads) + ")",
                    std::to_string(c.num_key_value_heads));
  }
  if (c.head_dim % 2 != 0) {
    return KeyError(source, "head_dim", "an even number (RoPE rotates pairs of elements)", std::to_string(c.head_dim));
  }
  if (c.architecture == kLlamaArchitecture && c.hidden_size % c.num_attention_heads != 0) {
    return KeyError(source, "hidden_size",
                    "a multiple of num_attention_heads (" + std::to_string(c.num_attention_heads) +
                        ", as transformers' LlamaConfig requires)",
                    std::to_string(c.hidden_size));
  }
  if (!(c.rope_theta > 0.0) || !std::isfinite(c.rope_theta)) {
    return KeyError(source, "rope_theta", "a positive number", std::to_string(c.rope_theta));
  }
  if (c.rope_scaling.rope_type == "llama3") {
    const RopeScaling& rs = c.rope_scaling;
    if (!(rs.factor >= 1.0) || !std::isfinite(rs.factor)) {
      return KeyError(source, "rope_scaling.factor", "a number >= 1", std::to_string(rs.factor));
    }
    if (!(rs.low_freq_factor > 0.0) || !std::isfinite(rs.low_freq_factor)) {
      return KeyError(source, "rope_scaling.low_freq_factor", "a positive number", std::to_string(rs.low_freq_factor));
    }
    if (!(rs.high_freq_factor > rs.low_freq_factor) || !std::isfinite(rs.high_freq_factor)) {
      return KeyError(source, "rope_scaling.high_freq_factor",
                      "a number above low_freq_factor (" + std::to_string(rs.low_freq_factor) + ")",
                      std::to_string(rs.high_freq_factor));
    }
    if (rs.original_max_position_embeddings < 1) {
      return KeyError(source, "rope_scaling.original_max_position_embeddings", "a positive integer",
                      std::to_string(rs.original_max_position_embeddings));
    }
  } else if (!c.rope_scaling.rope_type.empty()) {
    return KeyError(source, "rope_scaling.rope_type", "\"llama3\" or none", "\"" + c.rope_scaling.rope_type + "\"");
  }
  if (!(c.rms_norm_eps > 0.0) || !std::isfinite(c.rms_norm_eps)) {
    return KeyError(source, "rms_norm_eps", "a positive number", std::to_string(c.rms_norm_eps));
  }
  if (!(c.initializer_range >= 0.0) || !std::isfinite(c.initializer_range)) {
    return KeyError(source, "initializer_range", "a number >= 0", std::to_string(c.initializer_range));
  }
  if (c.bos_token_id < -1)
    return KeyError(source, "bos_token_id", "an id >= 0 or absent", std::to_string(c.bos_token_id));
  if (c.eos_token_id < -1)
    return KeyError(source, "eos_token_id", "an id >= 0 or absent", std::to_string(c.eos_token_id));
  if (c.torch_dtype != "bfloat16" && c.torch_dtype != "float16" && c.torch_dtype != "float32") {
    return KeyError(source, "torch_dtype", "\"bfloat16\", \"float16\" or \"float32\"", "\"" + c.torch_dtype + "\"");
  }
  if (c.extra_heads < 0 || c.extra_heads > kMaxExtraHeads) {
    return KeyError(source, "extra_heads (zero_llm --extra-heads)", "0.." + std::to_string(kMaxExtraHeads),
                    std::to_string(c.extra_heads));
  }
  // The parameter count, in double (each factor is bounded above, their product may not fit int64).
  const double params = ParamCountEstimate(c);
  if (params > static_cast<double>(kMaxParams)) {
    char got[64];
    std::snprintf(got, sizeof(got), "%.4g parameters", params);
    return KeyError(source, "vocab_size, hidden_size, intermediate_size, num_hidden_layers",
                    "a model of at most " + std::to_string(kMaxParams) + " (2^40, zero's limit) parameters", got);
  }
  for (const auto& [key, id] : {std::pair<const char*, int64_t>{"bos_token_id", c.bos_token_id},
                                std::pair<const char*, int64_t>{"eos_token_id", c.eos_token_id}}) {
    if (id >= c.vocab_size) {
      return KeyError(source, key, "an id below vocab_size (" + std::to_string(c.vocab_size) + ")", std::to_string(id));
    }
  }
  return OkStatus();
}

// Typed reads of one top-level key. Absent and null both mean "not given" (HF writes null for
// unset optional values).
class Reader {
 public:
  Reader(const Json& j, const std::string& source) : j_(j), source_(source) {}

  bool Has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  const Json& At(const char* key) const { return j_.at(key); }

  Status Int(const char* key, bool required, int64_t* out) const {
    if (!Has(key)) {
      return required ? KeyError(source_, key, "an integer (a required key)", "nothing") : OkStatus();
    }
    return IntValue(key, j_.at(key), out);
  }

  Status IntValue(const std::string& key, const Json& v, int64_t* out) const {
    if (v.is_number_integer()) {
      if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
        return KeyError(source_, key, "an integer that fits int64", Shown(v));
      }
      *out = v.get<int64_t>();
      return OkStatus();
    }
    if (v.is_number_float()) {  // 1024.0 is an integer written by a float-minded tool
      const double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::abs(d) < 9.0e15) {
        *out = static_cast<int64_t>(d);
        return OkStatus();
      }
    }
    return KeyError(source_, key, "an integer", Shown(v));
  }

  Status Double(const char* key, double* out) const {
    if (!Has(key)) return OkStatus();
    return DoubleValue(key, j_.at(key), out);
  }

  Status DoubleValue(const std::string& key, const Json& v, double* out) const {
    if (!v.is_number()) return KeyError(source_, key, "a number", Shown(v));
    *out = v.get<double>();
    return OkStatus();
  }

  Status Bool(const char* key, bool* out) const {
    if (!Has(key)) return OkStatus();
    const Json& v = j_.at(key);
    if (!v.is_boolean()) return KeyError(source_, key, "true or false", Shown(v));
    *out = v.get<bool>();
    return OkStatus();
  }

  Status String(const char* key, std::string* out) const {
    if (!Has(key)) return OkStatus();
    const Json& v = j_.at(key);
    if (!v.is_string()) return KeyError(source_, key, "a string", Shown(v));
    *out = v.get<std::string>();
    return OkStatus();
  }

  // A key whose only supported value is `allowed` (absent/null also accepted).
  Status MustBe(const char* key, const Json& allowed, const std::string& why) const {
    if (!Has(key)) return OkStatus();
    if (j_.at(key) != allowed) {
      return KeyError(source_, key, Shown(allowed) + " (" + why + ")", Shown(j_.at(key)));
    }
    return OkStatus();
  }

 private:
  const Json& j_;
  const std::string& source_;
};

const char* ModelTypeOf(const std::string& architecture) {
  if (architecture == kLlamaArchitecture) return "llama";
  if (architecture == kQwen3Architecture) return "qwen3";
  return "";
}

// The rope settings: rope_theta at the top level (transformers 4.x) and/or rope_parameters
// {"rope_type": "default" | "llama3", "rope_theta": ..., llama3's keys} (5.x), and 4.x's
// rope_scaling {"rope_type" (or "type"): "llama3", ...}. Any other rope type or key changes the
// math and is refused by name.
Status ReadRopeObject(const Reader& r, const std::string& source, const char* name, const Json& p, bool top_given,
                      double* theta, RopeScaling* scaling) {
  if (!p.is_object()) return KeyError(source, name, "an object", Shown(p));
  const std::string prefix = std::string(name) + ".";
  // The type first: it says more than whichever unknown key sorts before it.
  std::string type = "default";
  for (const char* k : {"rope_type", "type"}) {
    if (!p.contains(k)) continue;
    if (!p.at(k).is_string() || (p.at(k) != "default" && p.at(k) != "llama3")) {
      return KeyError(source, prefix + k, "\"default\" or \"llama3\" (other RoPE types are not implemented)",
                      Shown(p.at(k)));
    }
    type = p.at(k).get<std::string>();
  }
  const bool llama3 = type == "llama3";
  if (std::string(name) == "rope_scaling" && !llama3) {
    return KeyError(source, "rope_scaling.rope_type", "\"llama3\" (or rope_scaling null)",
                    p.contains("rope_type") ? Shown(p.at("rope_type")) : "nothing");
  }
  RopeScaling rs;
  if (llama3) rs.rope_type = "llama3";
  bool seen[4] = {false, false, false, false};
  for (const auto& [k, v] : p.items()) {
    const std::string key = prefix + k;
    if (k == "rope_type" || k == "type") {
      // checked above
    } else if (k == "rope_theta") {
      double t = 0;
      ZERO_RETURN_IF_ERROR(r.DoubleValue(key, v, &t));
      if (top_given && t != *theta) {
        return KeyError(source, key, "the top-level rope_theta (" + Shown(r.At("rope_theta")) + ")", Shown(v));
      }
      *theta = t;
    } else if (k == "partial_rotary_factor" && v.is_number() && v.get<double>() == 1.0) {
      // the whole head rotates: the default
    } else if (llama3 && k == "factor") {
      ZERO_RETURN_IF_ERROR(r.DoubleValue(key, v, &rs.factor));
      seen[0] = true;
    } else if (llama3 && k == "low_freq_factor") {
      ZERO_RETURN_IF_ERROR(r.DoubleValue(key, v, &rs.low_freq_factor));
      seen[1] = true;
    } else if (llama3 && k == "high_freq_factor") {
      ZERO_RETURN_IF_ERROR(r.DoubleValue(key, v, &rs.high_freq_factor));
      seen[2] = true;
    } else if (llama3 && k == "original_max_position_embeddings") {
      ZERO_RETURN_IF_ERROR(r.IntValue(key, v, &rs.original_max_position_embeddings));
      seen[3] = true;
    } else {
      return KeyError(source, key,
                      llama3 ? "no such key (llama3 RoPE takes rope_type, rope_theta, factor, low_freq_factor, "
                               "high_freq_factor, original_max_position_embeddings)"
                             : "no such key (only rope_type \"default\" and rope_theta are implemented)",
                      Shown(v));
    }
  }
  if (llama3) {
    const char* keys[4] = {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"};
    for (int i = 0; i < 4; ++i) {
      if (!seen[i]) return KeyError(source, prefix + keys[i], "a number (llama3 RoPE needs it)", "nothing");
    }
    if (!scaling->rope_type.empty() && !(*scaling == rs)) {
      return KeyError(source, name, "the same llama3 scaling as rope_scaling", Shown(p));
    }
    *scaling = rs;
  }
  return OkStatus();
}

Status ReadRope(const Reader& r, const std::string& source, double* theta, RopeScaling* scaling) {
  const bool top_given = r.Has("rope_theta");
  ZERO_RETURN_IF_ERROR(r.Double("rope_theta", theta));
  if (r.Has("rope_scaling")) {
    ZERO_RETURN_IF_ERROR(ReadRopeObject(r, source, "rope_scaling", r.At("rope_scaling"), top_given, theta, scaling));
  }
  if (r.Has("rope_parameters")) {
    const RopeScaling before = *scaling;
    ZERO_RETURN_IF_ERROR(
        ReadRopeObject(r, source, "rope_parameters", r.At("rope_parameters"), top_given, theta, scaling));
    if (!before.rope_type.empty() && scaling->rope_type.empty()) {
      return KeyError(source, "rope_parameters.rope_type", "\"llama3\" like rope_scaling", "\"default\"");
    }
  }
  return OkStatus();
}

Result<LlmConfig> ParseObject(const Json& j, const std::string& source) {
  if (!j.is_object()) return KeyError(source, "(top level)", "a JSON object", Shown(j));
  Reader r(j, source);
  LlmConfig c;

  // Architecture: architectures[0], checked against model_type when both are given.
  std::string model_type;
  ZERO_RETURN_IF_ERROR(r.String("model_type", &model_type));
  if (r.Has("architectures")) {
    const Json& a = r.At("architectures");
    if (!a.is_array() || a.empty() || !a[0].is_string()) {
      return KeyError(source, "architectures", "a list holding one class name", Shown(a));
    }
    if (a.size() > 1) return KeyError(source, "architectures", "one class name", Shown(a));
    c.architecture = a[0].get<std::string>();
  } else if (model_type == "llama") {
    c.architecture = kLlamaArchitecture;
  } else if (model_type == "qwen3") {
    c.architecture = kQwen3Architecture;
  } else {
    return KeyError(source, "architectures",
                    std::string("[\"") + kLlamaArchitecture + "\"] or [\"" + kQwen3Architecture +
                        "\"] (or model_type \"llama\"/\"qwen3\")",
                    model_type.empty() ? "nothing" : "model_type \"" + model_type + "\"");
  }
  if (c.architecture != kLlamaArchitecture && c.architecture != kQwen3Architecture) {
    return KeyError(source, "architectures[0]",
                    std::string("one of the supported architectures \"") + kLlamaArchitecture + "\", \"" +
                        kQwen3Architecture + "\"",
                    "\"" + c.architecture + "\"");
  }
  const bool qwen3 = c.architecture == kQwen3Architecture;
  if (!model_type.empty() && model_type != ModelTypeOf(c.architecture)) {
    return KeyError(source, "model_type",
                    std::string("\"") + ModelTypeOf(c.architecture) + "\" (architectures[0] is " + c.architecture + ")",
                    "\"" + model_type + "\"");
  }

  // Settings that change the math: refused, by key.
  if (r.Has("quantization_config")) {
    return KeyError(source, "quantization_config", "absent (quantized weights are not supported)",
                    Shown(r.At("quantization_config")));
  }
  ZERO_RETURN_IF_ERROR(r.MustBe("hidden_act", "silu", "the only activation implemented"));
  ZERO_RETURN_IF_ERROR(r.MustBe("attention_bias", false, "the projections have no bias"));
  ZERO_RETURN_IF_ERROR(r.MustBe("mlp_bias", false, "the MLP has no bias"));
  if (r.Has("attention_dropout")) {
    const Json& v = r.At("attention_dropout");
    if (!v.is_number() || v.get<double>() != 0.0) {
      return KeyError(source, "attention_dropout", "0 (dropout is not implemented)", Shown(v));
    }
  }
  ZERO_RETURN_IF_ERROR(r.MustBe("use_sliding_window", false, "sliding-window attention is not implemented"));
  if (r.Has("layer_types")) {
    const Json& v = r.At("layer_types");
    if (!v.is_array()) return KeyError(source, "layer_types", "a list", Shown(v));
    for (size_t i = 0; i < v.size(); ++i) {
      if (v[i] != "full_attention") {
        return KeyError(source, "layer_types[" + std::to_string(i) + "]",
                        "\"full_attention\" (sliding-window attention is not implemented)", Shown(v[i]));
      }
    }
  }
  // Top level (GPT-NeoX, Phi, GLM style) as well as inside rope_parameters (ReadRopeObject): a
  // fraction of each head rotated by RoPE. Only the whole head is implemented.
  if (r.Has("partial_rotary_factor")) {
    const Json& v = r.At("partial_rotary_factor");
    if (!v.is_number() || v.get<double>() != 1.0) {
      return KeyError(source, "partial_rotary_factor",
                      "1.0 (RoPE rotates the whole head; partial RoPE is not implemented)", Shown(v));
    }
  }
  ZERO_RETURN_IF_ERROR(ReadRope(r, source, &c.rope_theta, &c.rope_scaling));

  // Shapes.
  ZERO_RETURN_IF_ERROR(r.Int("vocab_size", true, &c.vocab_size));
  ZERO_RETURN_IF_ERROR(r.Int("hidden_size", true, &c.hidden_size));
  ZERO_RETURN_IF_ERROR(r.Int("intermediate_size", true, &c.intermediate_size));
  ZERO_RETURN_IF_ERROR(r.Int("num_hidden_layers", true, &c.num_hidden_layers));
  ZERO_RETURN_IF_ERROR(r.Int("num_attention_heads", true, &c.num_attention_heads));
  ZERO_RETURN_IF_ERROR(r.Int("max_position_embeddings", true, &c.max_position_embeddings));
  c.num_key_value_heads = c.num_attention_heads;
  ZERO_RETURN_IF_ERROR(r.Int("num_key_value_heads", false, &c.num_key_value_heads));
  if (qwen3) {
    c.head_dim = 128;  // Qwen3Config's default
  } else if (c.num_attention_heads > 0) {
    c.head_dim = c.hidden_size / c.num_attention_heads;  // LlamaConfig's default
  }
  ZERO_RETURN_IF_ERROR(r.Int("head_dim", false, &c.head_dim));
  ZERO_RETURN_IF_ERROR(r.Double("rms_norm_eps", &c.rms_norm_eps));
  ZERO_RETURN_IF_ERROR(r.Double("initializer_range", &c.initializer_range));
  ZERO_RETURN_IF_ERROR(r.Bool("tie_word_embeddings", &c.tie_word_embeddings));

  // Token ids. Every id of an eos list must be a token (checked once vocab_size is known valid).
  ZERO_RETURN_IF_ERROR(r.Int("bos_token_id", false, &c.bos_token_id));
  std::vector<int64_t> eos_list;
  if (r.Has("eos_token_id")) {
    const Json& v = r.At("eos_token_id");
    if (v.is_array()) {
      if (v.empty()) return KeyError(source, "eos_token_id", "an id or a non-empty list of ids", Shown(v));
      for (size_t i = 0; i < v.size(); ++i) {
        int64_t id = 0;
        ZERO_RETURN_IF_ERROR(r.IntValue("eos_token_id[" + std::to_string(i) + "]", v[i], &id));
        eos_list.push_back(id);
      }
      c.eos_token_id = eos_list[0];
    } else {
      ZERO_RETURN_IF_ERROR(r.IntValue("eos_token_id", v, &c.eos_token_id));
    }
  }

  // dtype: transformers 5.x writes "dtype", 4.x "torch_dtype".
  std::string dtype, torch_dtype;
  ZERO_RETURN_IF_ERROR(r.String("dtype", &dtype));
  ZERO_RETURN_IF_ERROR(r.String("torch_dtype", &torch_dtype));
  if (!dtype.empty() && !torch_dtype.empty() && dtype != torch_dtype) {
    return KeyError(source, "dtype", "the same value as torch_dtype (\"" + torch_dtype + "\")", "\"" + dtype + "\"");
  }
  if (!torch_dtype.empty()) c.torch_dtype = torch_dtype;
  if (!dtype.empty()) c.torch_dtype = dtype;

  ZERO_RETURN_IF_ERROR(ValidateFrom(c, source));
  for (size_t i = 0; i < eos_list.size(); ++i) {
    if (eos_list[i] < 0 || eos_list[i] >= c.vocab_size) {
      return KeyError(source, "eos_token_id[" + std::to_string(i) + "]",
                      "an id in [0, vocab_size) = [0, " + std::to_string(c.vocab_size) + ")",
                      std::to_string(eos_list[i]));
    }
  }
  // transformers' layer_type_validation: one entry per layer.
  if (r.Has("layer_types") && static_cast<int64_t>(r.At("layer_types").size()) != c.num_hidden_layers) {
    return KeyError(source, "layer_types",
                    "a list of num_hidden_layers (" + std::to_string(c.num_hidden_layers) + ") entries",
                    "a list of " + std::to_string(r.At("layer_types").size()));
  }
  return c;
}

struct PresetEntry {
  const char* name;
  LlmConfig config;
};

LlmConfig Shape(const char* arch, int64_t V, int64_t H, int64_t I, int64_t L, int64_t nh, int64_t nkv, int64_t hd,
                double theta, double eps, bool tied, int64_t maxpos, int64_t bos, int64_t eos) {
  LlmConfig c;
  c.architecture = arch;
  c.vocab_size = V;
  c.hidden_size = H;
  c.intermediate_size = I;
  c.num_hidden_layers = L;
  c.num_attention_heads = nh;
  c.num_key_value_heads = nkv;
  c.head_dim = hd;
  c.rope_theta = theta;
  c.rms_norm_eps = eps;
  c.tie_word_embeddings = tied;
  c.max_position_embeddings = maxpos;
  c.bos_token_id = bos;
  c.eos_token_id = eos;
  return c;
}

const std::vector<PresetEntry>& Presets() {
  static const auto* presets = new std::vector<PresetEntry>{
      {"tiny", Shape(kQwen3Architecture, 512, 64, 192, 2, 4, 2, 16, 10000.0, 1e-6, true, 512, -1, -1)},
      {"qwen3-0.6b",
       Shape(kQwen3Architecture, 151936, 1024, 3072, 28, 16, 8, 128, 1e6, 1e-6, true, 40960, 151643, 151645)},
      {"qwen3-4b",
       Shape(kQwen3Architecture, 151936, 2560, 9728, 36, 32, 8, 128, 1e6, 1e-6, true, 40960, 151643, 151645)},
      {"qwen3-8b",
       Shape(kQwen3Architecture, 151936, 4096, 12288, 36, 32, 8, 128, 1e6, 1e-6, false, 40960, 151643, 151645)},
      {"qwen3-14b",
       Shape(kQwen3Architecture, 151936, 5120, 17408, 40, 40, 8, 128, 1e6, 1e-6, false, 40960, 151643, 151645)},
      // Llama 2 13B (meta-llama/Llama-2-13b-hf): full multi-head attention, a 32000-id vocabulary.
      {"llama-2-13b", Shape(kLlamaArchitecture, 32000, 5120, 13824, 40, 40, 40, 128, 10000.0, 1e-5, false, 4096, 1, 2)},
      // Llama 3.x: the published shapes; the checkpoints' rope_scaling "llama3" is not part of them.
      {"llama-3.2-1b",
       Shape(kLlamaArchitecture, 128256, 2048, 8192, 16, 32, 8, 64, 500000.0, 1e-5, true, 131072, 128000, 128001)},
      {"llama-3.2-3b",
       Shape(kLlamaArchitecture, 128256, 3072, 8192, 28, 24, 8, 128, 500000.0, 1e-5, true, 131072, 128000, 128001)},
      {"llama-3.1-8b",
       Shape(kLlamaArchitecture, 128256, 4096, 14336, 32, 32, 8, 128, 500000.0, 1e-5, false, 131072, 128000, 128001)},
  };
  return *presets;
}

}  // namespace

Status LlmConfig::Validate() const { return ValidateFrom(*this, "llm config"); }

int64_t LlmConfig::NumParams() const {
  const int64_t H = hidden_size, q = num_attention_heads * head_dim, kv = num_key_value_heads * head_dim;
  const int64_t per_layer = 2 * H                             // input and post-attention norms
                            + H * q + 2 * H * kv + q * H      // q, k, v, o
                            + (qk_norm() ? 2 * head_dim : 0)  // q_norm, k_norm
                            + 3 * H * intermediate_size;      // gate, up, down
  return vocab_size * H * ((tie_word_embeddings ? 1 : 2) + extra_heads) + num_hidden_layers * per_layer + H;
}

int64_t LlmConfig::MatmulParams() const {
  const int64_t H = hidden_size, q = num_attention_heads * head_dim, kv = num_key_value_heads * head_dim;
  const int64_t per_layer = H * q + 2 * H * kv + q * H + 3 * H * intermediate_size;
  return num_hidden_layers * per_layer + vocab_size * H;
}

double LlmConfig::TrainFlopsPerToken(int seq) const {
  return 6.0 * static_cast<double>(MatmulParams()) +
         6.0 * static_cast<double>(num_hidden_layers) * seq * static_cast<double>(num_attention_heads * head_dim);
}

std::string LlmConfig::ToString() const {
  std::ostringstream s;
  s << architecture << " V=" << vocab_size << " H=" << hidden_size << " I=" << intermediate_size
    << " L=" << num_hidden_layers << " heads=" << num_attention_heads << "/" << num_key_value_heads
    << " head_dim=" << head_dim << (tie_word_embeddings ? " tied" : " untied") << " params=" << NumParams();
  if (!rope_scaling.rope_type.empty()) s << " rope=" << rope_scaling.rope_type << "x" << rope_scaling.factor;
  if (extra_heads > 0) s << " extra_heads=" << extra_heads;
  return s.str();
}

Result<LlmConfig> ParseHfConfig(std::string_view json_text, const std::string& source) {
  // Nesting, number range, duplicate keys and linear time: runtime/json_input.h.
  ZERO_ASSIGN_OR_RETURN(Json j, ParseJsonText<Json>(json_text, source));
  try {
    return ParseObject(j, source);
  } catch (const Json::exception& e) {  // a type mismatch the checks above missed: still an error, not a crash
    return InvalidArgumentError(source + ": unexpected value: " + e.what());
  }
}

Result<LlmConfig> LoadHfConfig(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT)
      return NotFoundError(path + ": no such file or directory (expected a config.json or a folder holding one)");
    return ErrnoError("stat", path, err);
  }
  std::string file = path;
  if (S_ISDIR(st.st_mode)) {
    file = path + (path.empty() || path.back() == '/' ? "" : "/") + "config.json";
    if (::stat(file.c_str(), &st) != 0) {
      const int err = errno;
      if (err == ENOENT) return NotFoundError(path + ": a directory without config.json");
      return ErrnoError("stat", file, err);
    }
  }
  if (!S_ISREG(st.st_mode)) return InvalidArgumentError(file + ": not a regular file (expected a config.json)");
  std::FILE* f = std::fopen(file.c_str(), "rb");
  if (f == nullptr) return ErrnoError("open", file, errno);
  std::string text;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  const int err = errno;
  std::fclose(f);
  if (failed) return ErrnoError("read", file, err);
  return ParseHfConfig(text, file);
}

std::string ToHfConfigJson(const LlmConfig& c) {
  ZERO_CHECK_MSG(c.Validate().ok(), c.Validate().ToString());
  nlohmann::ordered_json j;
  j["architectures"] = {c.architecture};
  j["model_type"] = ModelTypeOf(c.architecture);
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["initializer_range"] = c.initializer_range;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  if (c.rope_scaling.rope_type == "llama3") {
    const RopeScaling& rs = c.rope_scaling;
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", rs.factor},
                         {"low_freq_factor", rs.low_freq_factor},
                         {"high_freq_factor", rs.high_freq_factor},
                         {"original_max_position_embeddings", rs.original_max_position_embeddings}};
    j["rope_parameters"] = {{"rope_type", "llama3"},
                            {"rope_theta", c.rope_theta},
                            {"factor", rs.factor},
                            {"low_freq_factor", rs.low_freq_factor},
                            {"high_freq_factor", rs.high_freq_factor},
                            {"original_max_position_embeddings", rs.original_max_position_embeddings}};
  } else {
    j["rope_scaling"] = nullptr;
    j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", c.rope_theta}};
  }
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  if (c.qk_norm()) {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
  } else {
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
  }
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["bos_token_id"] = c.bos_token_id >= 0 ? nlohmann::ordered_json(c.bos_token_id) : nlohmann::ordered_json();
  j["eos_token_id"] = c.eos_token_id >= 0 ? nlohmann::ordered_json(c.eos_token_id) : nlohmann::ordered_json();
  j["use_cache"] = true;
  j["torch_dtype"] = c.torch_dtype;
  j["dtype"] = c.torch_dtype;
  return j.dump(2) + "\n";
}

Result<LlmConfig> Preset(std::string_view name) {
  for (const PresetEntry& p : Presets()) {
    if (name == p.name) return p.config;
  }
  std::string known;
  for (const std::string& n : PresetNames()) known += (known.empty() ? "" : ", ") + n;
  return NotFoundError("no model preset named \"" + std::string(name) + "\" (known: " + known + ")");
}

std::vector<std::string> PresetNames() {
  std::vector<std::string> names;
  for (const PresetEntry& p : Presets()) names.push_back(p.name);
  return names;
}

}  // namespace zero::llm
