// ByteLm: the small byte-level language model the examples train, and its CPU implementation.
//
// The model predicts the next byte from the previous `context` bytes:
//   x0 = concat_j E[byte_j]                      (E: [256, d], shared by the k positions; position
//                                                 is carried by which rows of W_in a slot meets)
//   r0 = x0 W_in + b_in                          (W_in: [k*d, h])
//   r_{l+1} = r_l + gelu(LN_l(r_l) W1_l + b1_l) W2_l + b2_l     for l = 0..L-1 (W1: [h, f], W2: [f, h])
//   logits = LN_f(r_L) W_out + b_out             (W_out: [h, 256])
//   loss = mean over the batch of -log softmax(logits)[next byte]
// LN is LayerNorm with gain and bias (eps 1e-5), gelu the exact erf form. docs/model.md has the
// parameter count formula and the defaults.
//
// This file owns the model description (ByteLmConfig, ByteLmParamSpecs) and ByteLmCpu, a plain
// single-threaded implementation (each data-parallel rank of the CPU demo gets one core). It owns
// no parameters or gradients: it reads parameters through a ParamProvider and writes gradients
// through a GradSink (model_api.h), in any dtype (fp32, bf16, fp16), doing all math in fp32
// (kFloat) or double (kDouble, for gradient checks). Scaling: Backward multiplies dL/dlogits by
// `loss_scale` (the fp16 loss scale, optionally times 1/gradient_accumulation_steps); every other
// scaling, clipping and unscaling belongs to the engine.
//
// Module order: "embed", "in_proj", "block0" ... "block{L-1}", "head". Forward acquires them in
// that order and Backward in reverse, one at a time; Backward calls GradReady for each parameter of
// a module before it releases that module. A ByteLmCpu is not thread-safe; use one per thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "models/model_api.h"
#include "runtime/status.h"

namespace zero::examples {

inline constexpr int kByteVocab = 256;

struct ByteLmConfig {
  int context = 8;     // k: input bytes per prediction
  int embed_dim = 32;  // d
  int hidden = 128;    // h: width of the residual stream
  int ffn = 512;       // f: inner width of each MLP block
  int layers = 2;      // L
  float layer_norm_eps = 1e-5f;

  Status Validate() const;
  // 256 d + (k d + 1) h + L (2 h f + f + 3 h) + 258 h + 256
  int64_t NumParams() const;
  std::string ToString() const;  // "k=8 d=32 h=128 f=512 L=2"
};

// Parameters in the order the gradients and views are indexed:
//   0 embed.table [256, d]                            module "embed"
//   1 in_proj.weight [k d, h], 2 in_proj.bias [h]     module "in_proj"
//   3 + 6 l + {0..5}: block{l}.ln.gain [h], .ln.bias [h], .fc1.weight [h, f], .fc1.bias [f],
//                     .fc2.weight [f, h], .fc2.bias [h]                       module "block{l}"
//   3 + 6 L + {0..3}: head.ln.gain [h], head.ln.bias [h], head.out.weight [h, 256],
//                     head.out.bias [256]                                      module "head"
// Initialization: normal(0, 1) for the table, normal(0, 1/sqrt(fan_in)) for weights (fc2 also
// divided by sqrt(2 L), the out projection by 2), zeros for biases, ones for LayerNorm gains.
std::vector<ModelParamSpec> ByteLmParamSpecs(const ByteLmConfig& config);

enum class CpuMath { kFloat, kDouble };

// What Forward saves for Backward (activations and the batch), plus Backward's scratch. Sized by
// Forward for its batch; reusable across steps. Belongs to one ByteLmCpu at a time.
class ByteLmActivations {
 public:
  ByteLmActivations();
  ~ByteLmActivations();
  ByteLmActivations(ByteLmActivations&&) noexcept;
  ByteLmActivations& operator=(ByteLmActivations&&) noexcept;

  int batch() const;
  // The loss of the last successful Forward.
  double loss() const;

  struct State;  // defined in byte_lm.cc

 private:
  friend class ByteLmCpu;
  std::unique_ptr<State> state_;
};

class ByteLmCpu {
 public:
  // REQUIRES: config.Validate().ok() (checked; a bad config aborts, so validate user input first).
  explicit ByteLmCpu(const ByteLmConfig& config, CpuMath math = CpuMath::kFloat);
  ~ByteLmCpu();
  ByteLmCpu(const ByteLmCpu&) = delete;
  ByteLmCpu& operator=(const ByteLmCpu&) = delete;

  const ByteLmConfig& config() const { return config_; }
  const std::vector<ModelParamSpec>& specs() const { return specs_; }
  const std::vector<ModuleSpec>& modules() const { return modules_; }

  // tokens: `batch` rows of context+1 bytes each (the inputs, then the byte to predict). Returns the
  // mean cross-entropy (nats) and saves what Backward needs in `acts`.
  Result<double> Forward(ParamProvider& params, const uint8_t* tokens, int batch, ByteLmActivations* acts);

  // Gradients of loss_scale * loss with respect to every parameter, for the batch of the last
  // Forward on `acts` (which it reads and does not consume: calling it twice gives the same
  // gradients). Each gradient buffer is overwritten, converted to the buffer's dtype with
  // round-to-nearest-even. On error some gradients may have been written and reported ready.
  Status Backward(ParamProvider& params, ByteLmActivations* acts, float loss_scale, GradSink& grads);

  // Generates n bytes after `prompt` (left-padded with spaces to the context length). temperature
  // <= 0 picks the most likely byte; otherwise samples from softmax(logits / temperature) with a
  // generator seeded by `seed`. Returns the generated bytes only.
  Result<std::string> Sample(ParamProvider& params, std::string_view prompt, int n, float temperature, uint64_t seed);

  class Impl;  // the math, templated on float/double in byte_lm.cc

 private:
  ByteLmConfig config_;
  CpuMath math_;
  std::vector<ModelParamSpec> specs_;
  std::vector<ModuleSpec> modules_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zero::examples
