// The transformer's parameter list (names, shapes, modules, order, initialization) and the index
// arithmetic every implementation of the model shares.
//
// The list is the engine's registration order and the order of gradient indices, and the names are
// Hugging Face's state-dict keys, so a checkpoint maps onto it by name. Modules: "embed" (the
// embedding), "layer<l>" (one decoder layer each), "head" (final norm and, when untied, lm_head).
// This file owns no tensors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/llama/config.h"
#include "models/model_api.h"
#include "runtime/status.h"

namespace zero::llm {

inline constexpr char kEmbedModule[] = "embed";
inline constexpr char kHeadModule[] = "head";
std::string LayerModule(int64_t layer);  // "layer<l>"
std::string ExtraHeadModule(int64_t k);  // "extra_head<k>"

// In order (REQUIRES: config.Validate().ok()):
//   0 model.embed_tokens.weight [V, H]                                            module "embed"
//   per layer l, prefix model.layers.<l>.                                         module "layer<l>"
//     input_layernorm.weight [H], self_attn.q_proj.weight [nh*hd, H], k_proj [nkv*hd, H],
//     v_proj [nkv*hd, H], o_proj [H, nh*hd], (Qwen3) self_attn.q_norm.weight [hd],
//     self_attn.k_norm.weight [hd], post_attention_layernorm.weight [H], mlp.gate_proj [I, H],
//     mlp.up_proj [I, H], mlp.down_proj [H, I]
//   model.norm.weight [H], (untied) lm_head.weight [V, H]                         module "head"
//   per extra head k (LlmConfig::extra_heads): extra_heads.<k>.weight [V, H]      module "extra_head<k>"
// Norm weights start at ones; the embedding and every linear at normal(0, initializer_range).
std::vector<examples::ModelParamSpec> LlmParamSpecs(const LlmConfig& config);

// Global parameter indices of one layer's tensors; q_norm and k_norm are -1 without qk_norm.
struct LayerParamIndex {
  int input_norm = -1;
  int q = -1, k = -1, v = -1, o = -1;
  int q_norm = -1, k_norm = -1;
  int post_norm = -1;
  int gate = -1, up = -1, down = -1;
  int first = -1;  // = input_norm: subtract it for the position in the module's Acquire() views
  int count = 0;   // parameters in the layer: 9, or 11 with qk_norm
};

int ParamsPerLayer(const LlmConfig& config);
LayerParamIndex LayerParams(const LlmConfig& config, int64_t layer);
inline constexpr int EmbedIndex() { return 0; }
int FinalNormIndex(const LlmConfig& config);
int LmHeadIndex(const LlmConfig& config);  // -1 when tie_word_embeddings
// The index of the tensor that multiplies into the logits: LmHeadIndex, or EmbedIndex when tied.
int OutputWeightIndex(const LlmConfig& config);
// Extra head k (0 <= k < config.extra_heads): after every other parameter.
int ExtraHeadIndex(const LlmConfig& config, int64_t k);
// The parameters of the model as Hugging Face has it: all but the extra heads (they come last).
int HfParamCount(const LlmConfig& config);

// Which output weight a batch's logits come from (LlmBatch::head): 0 the model's own
// (OutputWeightIndex), k >= 1 extra head k-1.
struct OutputHead {
  int weight = -1;     // its parameter index
  bool tied = false;   // it is the embedding (head 0 of a tied model)
  std::string module;  // the module to acquire for it besides "head": "" (own head), "extra_head<k>"
};
// InvalidArgument naming the head and the range when head is not in 0..extra_heads.
Result<OutputHead> SelectOutputHead(const LlmConfig& config, int head);

}  // namespace zero::llm
