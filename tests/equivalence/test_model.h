// The equivalence suite's model: a tiny multi-module network whose forward and backward run on the
// host in float, used identically by the engine-driven run and by the single-process reference.
//
// Modules (forward order) and parameters (registration order = index):
//   "embed":  0 embed.weight [d_in x h], 1 embed.bias [h]       a0 = tanh(x W0 + b0)
//   "block":  2 block.weight [h x h],   3 block.bias [h]        a1 = tanh(a0 W1 + b1) + a0
//   "head_a": 4 head_a.weight [h x o]                            u  = a1 Wa (if head A is used)
//   "head_b": 5 head_b.weight [h x o]                            u += a1 Wb (if head B is used)
//   "gain":   6 gain (a scalar, shape {})                        y  = g * u
// Loss: mean squared error over the batch and outputs, L = sum (y - t)^2 / (B*o). h is odd (13) so
// world sizes 2, 3 and 4 all need padding; the scalar needs padding at every world size above 1.
//
// Gradients: Backward seeds dL with `seed` (loss scale / the user's loss divisor) and writes the
// float gradients of the parameters of the used modules; those of an unused head are left out (the
// caller does not report them). Everything is a deterministic function of its inputs, computed in
// one fixed order, so the engine run and the reference produce the same bits from the same inputs.
// Owns no global state; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "runtime/dtype.h"

namespace zero::equivalence {

struct ModelDims {
  int d_in = 5;
  int hidden = 13;
  int out = 3;
  int batch = 4;  // per rank per micro step
};

enum ParamIndex : int {
  kEmbedW = 0,
  kEmbedB = 1,
  kBlockW = 2,
  kBlockB = 3,
  kHeadAW = 4,
  kHeadBW = 5,
  kGain = 6,
  kNumParams = 7,
};

// The parameters in registration order (engine ParamSpec: name, shape, module).
std::vector<ParamSpec> ModelParams(const ModelDims& dims);
// Modules in forward order, each with its parameter indices.
struct ModuleInfo {
  std::string name;
  std::vector<int> params;
};
std::vector<ModuleInfo> ModelModules();
int64_t Numel(const ParamSpec& spec);

// Full fp32 initial values of parameter `index` (deterministic, not representable in 16 bits in
// general, so the rounding of the initial model parameters matters).
void InitValues(const ModelDims& dims, int index, float* out);

struct Batch {
  std::vector<float> x;       // [B x d_in]
  std::vector<float> target;  // [B x o]
};
// Rank `rank`'s batch of micro step `micro` of window `window` (seeded by all three).
// `target_scale` multiplies the targets (a huge value forces an fp16 gradient overflow).
Batch MakeBatch(const ModelDims& dims, int rank, int window, int micro, float target_scale = 1.0f);

struct Heads {
  bool a = true;
  bool b = true;
};

// Forward and backward. params[i]: parameter i's values as float (read from the model dtype).
// grads: resized to kNumParams; gradients of parameters of used modules are written (float),
// those of an unused head are set empty. Returns the loss L (not multiplied by seed).
float ForwardBackward(const ModelDims& dims, const std::vector<std::vector<float>>& params, const Batch& batch,
                      Heads heads, float seed, std::vector<std::vector<float>>* grads);

// Whether parameter `index` receives a gradient with these heads.
bool ParamUsed(int index, Heads heads);

// What the harness and the reference need of a model: its parameters, modules, initial values, and
// one rank's forward/backward of one micro step. The same object drives the engine run and the
// reference, so both compute the same bits from the same inputs. Implementations are immutable
// after construction and thread-safe (engine ranks are threads).
class CellModel {
 public:
  virtual ~CellModel() = default;
  // Registration order = index.
  virtual std::vector<ParamSpec> Params() const = 0;
  // Modules in forward order with their parameter indices.
  virtual std::vector<ModuleInfo> Modules() const = 0;
  // Full fp32 initial values of parameter `index` (numel floats).
  virtual void InitValues(int index, float* out) const = 0;
  // Whether parameter `index` gets a gradient when `heads` are used (a model without optional
  // heads returns true).
  virtual bool ParamUsed(int index, Heads heads) const = 0;
  // Rank `rank`'s micro step `micro` of window `window`: the loss (not multiplied by `seed`) and
  // the float gradients of seed * loss (an unused parameter's entry is left empty). `target_scale`
  // 1 is a normal batch; a huge value (harness.h's kOverflowTargetScale) asks for gradients that overflow fp16 (models
  // without that case ignore it).
  virtual float ForwardBackward(const std::vector<std::vector<float>>& params, int rank, int window, int micro,
                                float target_scale, Heads heads, float seed,
                                std::vector<std::vector<float>>* grads) const = 0;
};

// The model above as a CellModel.
class MlpCellModel final : public CellModel {
 public:
  explicit MlpCellModel(const ModelDims& dims = ModelDims()) : dims_(dims) {}
  std::vector<ParamSpec> Params() const override { return ModelParams(dims_); }
  std::vector<ModuleInfo> Modules() const override { return ModelModules(); }
  void InitValues(int index, float* out) const override { equivalence::InitValues(dims_, index, out); }
  bool ParamUsed(int index, Heads heads) const override { return equivalence::ParamUsed(index, heads); }
  float ForwardBackward(const std::vector<std::vector<float>>& params, int rank, int window, int micro,
                        float target_scale, Heads heads, float seed,
                        std::vector<std::vector<float>>* grads) const override {
    return equivalence::ForwardBackward(dims_, params, MakeBatch(dims_, rank, window, micro, target_scale), heads, seed,
                                        grads);
  }

 private:
  ModelDims dims_;
};

}  // namespace zero::equivalence
