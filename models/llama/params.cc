#include "models/llama/params.h"

#include <utility>

namespace zero::llm {

using examples::InitKind;
using examples::ModelParamSpec;

std::string LayerModule(int64_t layer) { return "layer" + std::to_string(layer); }
std::string ExtraHeadModule(int64_t k) { return "extra_head" + std::to_string(k); }

int ParamsPerLayer(const LlmConfig& config) { return config.qk_norm() ? 11 : 9; }

LayerParamIndex LayerParams(const LlmConfig& config, int64_t layer) {
  LayerParamIndex x;
  x.count = ParamsPerLayer(config);
  x.first = 1 + static_cast<int>(layer) * x.count;
  int i = x.first;
  x.input_norm = i++;
  x.q = i++;
  x.k = i++;
  x.v = i++;
  x.o = i++;
  if (config.qk_norm()) {
    x.q_norm = i++;
    x.k_norm = i++;
  }
  x.post_norm = i++;
  x.gate = i++;
  x.up = i++;
  x.down = i++;
  return x;
}

int FinalNormIndex(const LlmConfig& config) {
  return 1 + static_cast<int>(config.num_hidden_layers) * ParamsPerLayer(config);
}

int LmHeadIndex(const LlmConfig& config) { return config.tie_word_embeddings ? -1 : FinalNormIndex(config) + 1; }

int OutputWeightIndex(const LlmConfig& config) {
  return config.tie_word_embeddings ? EmbedIndex() : LmHeadIndex(config);
}

int HfParamCount(const LlmConfig& config) { return FinalNormIndex(config) + (config.tie_word_embeddings ? 1 : 2); }

int ExtraHeadIndex(const LlmConfig& config, int64_t k) { return HfParamCount(config) + static_cast<int>(k); }

Result<OutputHead> SelectOutputHead(const LlmConfig& config, int head) {
  if (head < 0 || head > config.extra_heads) {
    return InvalidArgumentError("llm batch: head " + std::to_string(head) + ": expected 0 (the model's own) .. " +
                                std::to_string(config.extra_heads) + " (--extra-heads " +
                                std::to_string(config.extra_heads) + ")");
  }
  OutputHead h;
  if (head == 0) {
    h.weight = OutputWeightIndex(config);
    h.tied = config.tie_word_embeddings;
  } else {
    h.weight = ExtraHeadIndex(config, head - 1);
    h.module = ExtraHeadModule(head - 1);
  }
  return h;
}

std::vector<ModelParamSpec> LlmParamSpecs(const LlmConfig& c) {
  ZERO_CHECK_MSG(c.Validate().ok(), c.Validate().ToString());
  const float init_std = static_cast<float>(c.initializer_range);
  const int64_t V = c.vocab_size, H = c.hidden_size, I = c.intermediate_size;
  const int64_t q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  auto linear = [&](std::string name, std::vector<int64_t> shape, const std::string& module) {
    return ModelParamSpec{std::move(name), std::move(shape), module, InitKind::kNormal, init_std};
  };
  auto norm = [](std::string name, int64_t n, const std::string& module) {
    return ModelParamSpec{std::move(name), {n}, module, InitKind::kOnes, 0.0f};
  };
  std::vector<ModelParamSpec> p;
  p.push_back(linear("model.embed_tokens.weight", {V, H}, kEmbedModule));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string m = LayerModule(l);
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    p.push_back(norm(pre + "input_layernorm.weight", H, m));
    p.push_back(linear(pre + "self_attn.q_proj.weight", {q, H}, m));
    p.push_back(linear(pre + "self_attn.k_proj.weight", {kv, H}, m));
    p.push_back(linear(pre + "self_attn.v_proj.weight", {kv, H}, m));
    p.push_back(linear(pre + "self_attn.o_proj.weight", {H, q}, m));
    if (c.qk_norm()) {
      p.push_back(norm(pre + "self_attn.q_norm.weight", c.head_dim, m));
      p.push_back(norm(pre + "self_attn.k_norm.weight", c.head_dim, m));
    }
    p.push_back(norm(pre + "post_attention_layernorm.weight", H, m));
    p.push_back(linear(pre + "mlp.gate_proj.weight", {I, H}, m));
    p.push_back(linear(pre + "mlp.up_proj.weight", {I, H}, m));
    p.push_back(linear(pre + "mlp.down_proj.weight", {H, I}, m));
  }
  p.push_back(norm("model.norm.weight", H, kHeadModule));
  if (!c.tie_word_embeddings) p.push_back(linear("lm_head.weight", {V, H}, kHeadModule));
  for (int64_t k = 0; k < c.extra_heads; ++k) {
    p.push_back(linear("extra_heads." + std::to_string(k) + ".weight", {V, H}, ExtraHeadModule(k)));
  }
  return p;
}

}  // namespace zero::llm
