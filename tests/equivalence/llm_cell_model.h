// The transformer (models/llama) as an equivalence-suite model: the same cells that run the small
// MLP run a Llama/Qwen3 decoder through the engine and through the plain data-parallel reference.
//
// Parameters, modules and initial values are the model's own (LlmParamSpecs, InitParam with a fixed
// seed); rank r's micro step m of window w reads a batch of token ids drawn from a keyed hash of
// (r, w, m), with some targets ignored (-100), and runs LlmCpu's fp32 forward and backward over the
// parameters as floats. The tied embedding is one parameter here, its gradient the sum of both uses
// (what the model hands the engine once). The model has no optional heads (every parameter gets a
// gradient in every micro step) and no fp16-overflow batch (target_scale is ignored).
// Immutable after construction; thread-safe (each call builds its own LlmCpu).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/llama/batch.h"
#include "models/llama/config.h"
#include "models/model_api.h"
#include "tests/equivalence/harness.h"
#include "tests/equivalence/test_model.h"

namespace zero::equivalence {

class LlmCellModel final : public CellModel {
 public:
  // REQUIRES: config.Validate().ok(), batch >= 1, 1 <= seq <= max_position_embeddings.
  LlmCellModel(const llm::LlmConfig& config, int batch, int seq, uint64_t seed = 1234);

  std::vector<ParamSpec> Params() const override;
  std::vector<ModuleInfo> Modules() const override;
  void InitValues(int index, float* out) const override;
  bool ParamUsed(int index, Heads heads) const override { return true; }
  float ForwardBackward(const std::vector<std::vector<float>>& params, int rank, int window, int micro,
                        float target_scale, Heads heads, float seed,
                        std::vector<std::vector<float>>* grads) const override;

  const llm::LlmConfig& config() const { return config_; }
  int64_t TotalNumel() const;
  // The batch rank `rank` uses in micro step `micro` of window `window`.
  llm::LlmBatch MakeBatch(int rank, int window, int micro) const;

 private:
  llm::LlmConfig config_;
  int batch_, seq_;
  uint64_t seed_;
  std::vector<examples::ModelParamSpec> specs_;
};

// The model of the transformer cells: the tiny preset, 2 rows of 16 tokens per rank and micro step.
const LlmCellModel& TinyLlmCellModel();

// A transformer cell: stage, world, GAS (1 when unmanaged), dtype, and `mode`: "none", "cpu" (CPU
// AdamW over host states), "nvme", "tiered", "gpuchunk" (chunked GPU AdamW, 4096 elements),
// "overlap" (the same with overlap_step), "paramcpu", "paramnvme", "gpuacc" (parameters and
// optimizer on the CPU, the fp32 gradient sum on the device). Clipping 1.0 at GAS > 1; buckets,
// persistence threshold and NVMe sub-groups sized for the transformer's tensors.
CellSpec LlmCellSpec(int stage, int world, int gas, const std::string& mode, bool managed, DType dtype);

// Managed: `steps` windows of GAS micro steps; unmanaged: windows of 2, 5 and 3 backwards, the user
// dividing the loss by the count.
Schedule LlmCellSchedule(const CellSpec& cell, int steps);

}  // namespace zero::equivalence
