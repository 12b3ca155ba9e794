// The shape of a decoder-only transformer of the Hugging Face LlamaForCausalLM / Qwen3ForCausalLM
// family, read from and written to Hugging Face's config.json.
//
// This file owns LlmConfig (the numbers that fix every tensor's shape and the few constants the math
// needs), its validation, its parameter and FLOP counts, the published presets, and the config.json
// reader and writer. It owns no tensors. The reader refuses, by key, every setting that would make
// the checkpoint's model compute something other than what models/llama implements (RoPE scaling,
// sliding-window attention, biases, an activation other than SiLU, quantized weights, dropout), so
// a config we accept is one we compute exactly; it never ignores such a key silently.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/status.h"

namespace zero::llm {

inline constexpr char kLlamaArchitecture[] = "LlamaForCausalLM";
inline constexpr char kQwen3Architecture[] = "Qwen3ForCausalLM";
// The most LlmConfig::extra_heads allowed.
inline constexpr int64_t kMaxExtraHeads = 8;
// Size limits Validate() enforces before anything is allocated. Each dimension is at most 2^24
// (16777216); num_hidden_layers at most kMaxLayers (32x the deepest published dense model, Llama 3.1
// 405B's 126); the parameter count (NumParams()) at most kMaxParams, 2^40 = 1.1e12 (2.7x Llama 3.1
// 405B), which also keeps every element and FLOP count far inside int64.
inline constexpr int64_t kMaxDimension = int64_t{1} << 24;
inline constexpr int64_t kMaxLayers = 4096;
inline constexpr int64_t kMaxParams = int64_t{1} << 40;

// RoPE frequency scaling. rope_type "" is none (transformers' "default"); "llama3" is Llama 3.1/3.2's:
// inverse frequencies whose wavelength 2 pi / f exceeds original_max_position_embeddings /
// low_freq_factor are divided by factor, those under original_max_position_embeddings /
// high_freq_factor kept, those between interpolated smoothly (transformers'
// _compute_llama3_parameters, in fp32 and its order of operations); no attention factor.
struct RopeScaling {
  std::string rope_type;  // "" or "llama3"
  double factor = 0.0;
  double low_freq_factor = 0.0;
  double high_freq_factor = 0.0;
  int64_t original_max_position_embeddings = 0;

  bool operator==(const RopeScaling&) const = default;
};

struct LlmConfig {
  std::string architecture;  // kLlamaArchitecture or kQwen3Architecture
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 0;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  double rms_norm_eps = 1e-6;
  double initializer_range = 0.02;
  bool tie_word_embeddings = false;
  int64_t bos_token_id = -1;             // -1: absent
  int64_t eos_token_id = -1;             // -1: absent (a list in config.json keeps its first id)
  std::string torch_dtype = "bfloat16";  // "bfloat16", "float16" or "float32"
  // Not Hugging Face's: untied output heads beside the model's own (zero_llm --extra-heads), each a
  // [vocab, hidden] weight "extra_heads.<k>.weight" in module "extra_head<k>"; a batch picks the
  // head its logits come from (LlmBatch::head). Never read from or written to config.json, and
  // left out of an HF export. They exist to train with parameters that get gradients only in some
  // micro steps or windows (the offload validations of docs/llm.md).
  int64_t extra_heads = 0;

  bool operator==(const LlmConfig&) const = default;

  // Qwen3 normalizes each head of q and k (q_norm, k_norm) before RoPE; Llama does not.
  bool qk_norm() const { return architecture == kQwen3Architecture; }

  // Every rule the model relies on, each error naming the key: a supported architecture, positive
  // sizes, num_attention_heads a multiple of num_key_value_heads, an even head_dim (RoPE rotates
  // pairs), positive rope_theta and rms_norm_eps, a known torch_dtype, bos/eos_token_id below
  // vocab_size; Llama also needs hidden_size a multiple of num_attention_heads (transformers'
  // LlamaConfig refuses anything else). Sizes are bounded (kMaxDimension, kMaxLayers, kMaxParams,
  // the message naming the key and the limit), so a valid config's counts fit int64 and nothing
  // absurd is allocated.
  Status Validate() const;

  // Every parameter element: embedding, per-layer norms and linears, final norm, lm_head when
  // untied, and the extra heads.
  int64_t NumParams() const;
  // Elements of every linear weight a token is multiplied by: q, k, v, o, gate, up, down per layer
  // and the lm_head (V x H, counted once also when it is the tied embedding; a batch multiplies by
  // one head, extra or not). Excludes the embedding lookup (no multiply) and the norm weights.
  int64_t MatmulParams() const;
  // Training FLOPs per token at sequence length `seq` (the "model TFLOPS" formula):
  //   6 * MatmulParams()                          forward 2 FLOPs per weight, backward 4
  //   + 6 * layers * seq * heads * head_dim       attention scores and weighted values: forward
  //                                               2 matmuls of 2 * seq * heads * head_dim FLOPs per
  //                                               token, halved by the causal mask, times 3 with the
  //                                               backward
  // Recomputation is not counted (the figure is model FLOPs, not hardware FLOPs).
  double TrainFlopsPerToken(int seq) const;

  // "Qwen3ForCausalLM V=512 H=64 I=192 L=2 heads=4/2 head_dim=16 tied params=131456"
  std::string ToString() const;
};

// Parses the text of a Hugging Face config.json. `source` (a path, or a name for text from
// elsewhere) starts every error message, followed by the key and what was expected. Reads
// architectures[0] (or model_type when architectures is absent; both must agree when present),
// the sizes, num_key_value_heads (default num_attention_heads), head_dim (default: Llama
// hidden_size / num_attention_heads, Qwen3 128, as transformers' config classes), rope_theta (top
// level or rope_parameters.rope_theta; default 10000), rms_norm_eps (default 1e-6),
// initializer_range (default 0.02), tie_word_embeddings (default false for both classes),
// bos/eos_token_id (an int, null, or for eos a list whose first id is kept; every id of the list
// must be below vocab_size) and torch_dtype or dtype. Required: vocab_size, hidden_size, intermediate_size,
// num_hidden_layers, num_attention_heads, max_position_embeddings. rope_scaling (4.x) or rope_parameters (5.x) of
// rope_type "llama3" with factor, low_freq_factor, high_freq_factor and
// original_max_position_embeddings is read into rope_scaling. Refused by key: any other RoPE type
// (linear, dynamic, yarn, longrope, ...) or key, partial_rotary_factor other than 1.0 (top level
// or in rope_parameters), use_sliding_window true, layer_types with a sliding layer or with a
// length other than num_hidden_layers, attention_bias or mlp_bias true, hidden_act other than
// "silu", attention_dropout not 0, quantization_config, an unsupported architecture, and everything
// Validate() refuses. The text goes through runtime/json_input.h (nesting, numbers beyond double,
// duplicate keys are errors naming `source`, line and column). Other keys are ignored
// (transformers_version, max_window_layers, an unused sliding_window, ...).
Result<LlmConfig> ParseHfConfig(std::string_view json_text, const std::string& source);

// Reads `path`: a config.json file, or a directory holding one (a Hugging Face checkpoint folder).
Result<LlmConfig> LoadHfConfig(const std::string& path);

// A config.json that transformers (4.4x and 5.x) from_pretrained loads as the config's class:
// model_type, architectures, every size, hidden_act "silu", no biases, rope_scaling (null, or the
// llama3 object) and rope_parameters {rope_type, rope_theta, and llama3's keys} (5.x's form) next to
// the top-level rope_theta (4.x's), use_cache, both dtype keys. ParseHfConfig(ToHfConfigJson(c)) == c for every valid
// c. REQUIRES: config.Validate().ok().
std::string ToHfConfigJson(const LlmConfig& config);

// Published model shapes (the numbers of each model's config.json) and "tiny", a 131k-parameter
// Qwen3-shaped model for CI and CPU tests. The llama presets leave out the checkpoints' rope_scaling
// ("llama3"): they describe the shapes for runs from random initial values (and the benchmark's
// peers build the same model); a checkpoint's own config.json (--model DIR) brings its scaling.
Result<LlmConfig> Preset(std::string_view name);
std::vector<std::string> PresetNames();

}  // namespace zero::llm
