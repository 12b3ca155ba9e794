// The transformer's CPU implementation: forward, loss, backward and next-token logits of a
// LlamaForCausalLM / Qwen3ForCausalLM (llm_config.h), single-threaded and deterministic.
//
// This file owns LlmCpu (the math) and LlmActivations (what a forward saves for its backward, plus
// backward's scratch, including the tied embedding's gradient scratch). It owns no parameters or
// gradients: it reads parameters through a ParamProvider and writes gradients through a GradSink
// (models/model_api.h), parameters and gradients in any of fp32, bf16, fp16, doing the math in
// fp32 (kFloat) or double (kDouble, for gradient checks). It is the reference the CUDA model is
// checked against, and fast enough to train the "tiny" preset in CI.
//
// Module protocol (the contract of models/llama): Forward acquires "embed", "layer0" ...
// "layer<L-1>", then "head" (and, when tie_word_embeddings, "embed" again while "head" is held;
// released in the order embed, head). Backward acquires "head" (+ "embed" when tied), the layers
// in reverse, then "embed". Every gradient is written and GradReady'd once, before its module is
// released; when tied, the lm_head's part of the embedding gradient waits in an fp32 (double for
// kDouble) scratch [V, H] in LlmActivations until the lookup's part is added, and
// GradReady(0) comes once, at the end. Every acquisition is released on every path (ModuleScope).
// A batch whose LlmBatch::head is k >= 1 takes its logits from extra head k-1 instead: module
// "extra_head<k-1>" is acquired while "head" is held (in place of "embed" when tied), the extra
// head's gradient is reported, and the model's own output weight gets none from this batch (the
// embedding's gradient is then the lookup's part only; an untied lm_head is not reported).
//
// Determinism: one thread, every sum in a fixed order, so the same inputs give the same bits on
// every run; no -ffast-math (no reassociation) and no FMA contraction (x86-64-v2 has none).
//
// Memory of LlmActivations for N = batch * seq tokens, per layer: the layer input, both RMSNorm
// outputs and the residual after attention ([N, H] each: 4 N H), q, k, v after RoPE and the
// attention output (N (2 nh + 2 nkv) hd), with qk_norm also q and k before their norm and the
// per-head statistics, the attention probabilities [batch, nh, seq, seq] (fine for the seq <= 512
// used on the CPU), the gate and up projections and their SwiGLU product (3 N I); once: the final
// norm's input and output, the logits [N, V] and their log-sum-exp, and backward scratch of a
// few [N, max(H, I, nh hd)] buffers, dlogits [N, V] and, when tied, the [V, H] scratch.
// Scaling: Backward computes the gradient of loss_scale * loss; all else belongs to the engine.
// An LlmCpu is not thread-safe; use one per thread.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "models/llama/batch.h"
#include "models/llama/config.h"
#include "models/model_api.h"
#include "runtime/status.h"

namespace zero::llm {

enum class CpuMath { kFloat, kDouble };

// RoPE as the contract (and transformers' default rotary embedding) defines it:
// inv_freq[i] = 1 / theta^(float(2i) / head_dim) in fp32, angle = float(pos) * inv_freq[i] in
// fp32, cos/sin of that angle correctly rounded to fp32. Tables are [seq, head_dim / 2] row-major.
// The CUDA model uses the same tables, so both rotate by identical numbers.
// With a RopeScaling of rope_type "llama3" the inverse frequencies are then adjusted as
// transformers' _compute_llama3_parameters does, in fp32 and in its order of operations
// (wavelength = fp32(1 / f) * fp32(2 pi), ...).
std::vector<float> RopeInverseFrequencies(int64_t head_dim, double theta, const RopeScaling& scaling = {});
void RopeTables(int64_t head_dim, double theta, int seq, std::vector<float>* cos, std::vector<float>* sin,
                const RopeScaling& scaling = {});
// Rotates one head vector x[head_dim] in place by one position's table row (rotate-half layout:
// element i pairs with i + head_dim / 2).
void ApplyRope(int64_t head_dim, const float* cos_row, const float* sin_row, float* x);

// What Forward saves for Backward (activations and the batch) and Backward's scratch. Sized by
// Forward for its batch; reusable across steps. Belongs to one LlmCpu at a time.
class LlmActivations {
 public:
  LlmActivations();
  ~LlmActivations();
  LlmActivations(LlmActivations&&) noexcept;
  LlmActivations& operator=(LlmActivations&&) noexcept;

  int batch() const;
  int seq() const;
  // The loss of the last successful Forward, and the number of targets it averaged over.
  double loss() const;
  int64_t counted_targets() const;
  // Bytes of saved activations and scratch held now.
  int64_t bytes() const;

  struct State;  // defined in llm_cpu.cc

 private:
  friend class LlmCpu;
  std::unique_ptr<State> state_;
};

class LlmCpu {
 public:
  // REQUIRES: config.Validate().ok() (checked; a bad config aborts, so validate user input first).
  explicit LlmCpu(const LlmConfig& config, CpuMath math = CpuMath::kFloat);
  ~LlmCpu();
  LlmCpu(const LlmCpu&) = delete;
  LlmCpu& operator=(const LlmCpu&) = delete;

  const LlmConfig& config() const { return config_; }
  CpuMath math() const { return math_; }
  const std::vector<examples::ModelParamSpec>& specs() const { return specs_; }
  const std::vector<examples::ModuleSpec>& modules() const { return modules_; }

  // Mean cross-entropy (nats) over the targets that are not kIgnoreIndex (0 when none is), saving
  // what Backward needs in `acts`. Errors: a batch that fails batch.Validate(vocab_size,
  // max_position_embeddings) (naming row and position), a provider error, views that do not match
  // the module (count, null data).
  Result<double> Forward(examples::ParamProvider& params, const LlmBatch& batch, LlmActivations* acts);

  // Gradients of loss_scale * loss for the batch of the last Forward on `acts` (which it reads and
  // does not consume: calling it twice gives the same gradients). Each gradient buffer is
  // overwritten, converted to the buffer's dtype with round-to-nearest-even. On error some
  // gradients may have been written and reported ready. REQUIRES: Forward on `acts` by an LlmCpu
  // of this config and math (checked: FailedPrecondition).
  Status Backward(examples::ParamProvider& params, LlmActivations* acts, float loss_scale, examples::GradSink& grads);

  // The logits [vocab_size] of the next token after `ids` (the last position's), for a greedy or
  // sampling decoder. Runs a full forward over ids (no cache), acquiring modules as Forward does.
  // Errors: empty ids, an id out of range, more ids than max_position_embeddings.
  Result<std::vector<float>> Logits(examples::ParamProvider& params, const std::vector<int32_t>& ids);

  class Impl;  // the math, templated on float/double in llm_cpu.cc

 private:
  LlmConfig config_;
  CpuMath math_;
  std::vector<examples::ModelParamSpec> specs_;
  std::vector<examples::ModuleSpec> modules_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zero::llm
