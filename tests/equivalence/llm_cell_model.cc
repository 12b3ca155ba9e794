#include "tests/equivalence/llm_cell_model.h"

#include <algorithm>

#include "models/llama/cpu_model.h"
#include "models/llama/params.h"
#include "runtime/hash.h"
#include "runtime/status.h"

namespace zero::equivalence {

LlmCellModel::LlmCellModel(const llm::LlmConfig& config, int batch, int seq, uint64_t seed)
    : config_(config), batch_(batch), seq_(seq), seed_(seed), specs_(llm::LlmParamSpecs(config)) {}

std::vector<ParamSpec> LlmCellModel::Params() const {
  std::vector<ParamSpec> out;
  for (const examples::ModelParamSpec& s : specs_) out.push_back(ParamSpec{s.name, s.shape, s.module});
  return out;
}

std::vector<ModuleInfo> LlmCellModel::Modules() const {
  std::vector<ModuleInfo> out;
  for (const examples::ModuleSpec& m : examples::GroupByModule(specs_)) out.push_back(ModuleInfo{m.name, m.params});
  return out;
}

void LlmCellModel::InitValues(int index, float* out) const {
  const std::vector<float> v = examples::InitParam(specs_[index], seed_);
  std::copy(v.begin(), v.end(), out);
}

int64_t LlmCellModel::TotalNumel() const { return examples::TotalNumel(specs_); }

llm::LlmBatch LlmCellModel::MakeBatch(int rank, int window, int micro) const {
  llm::LlmBatch b;
  b.batch = batch_;
  b.seq = seq_;
  const size_t n = static_cast<size_t>(batch_) * seq_;
  b.inputs.resize(n);
  b.targets.resize(n);
  const uint64_t key = SplitMix64(SplitMix64(SplitMix64(seed_ ^ (rank + 1)) ^ (window + 1)) ^ (micro + 1));
  // One stream of seq+1 ids per row: inputs are its first seq, targets its last seq; every 7th
  // target (offset by the row) is ignored, so the loss counts a different number per row.
  for (int r = 0; r < batch_; ++r) {
    std::vector<int32_t> ids(seq_ + 1);
    for (int t = 0; t <= seq_; ++t) {
      ids[t] = static_cast<int32_t>(SplitMix64(key ^ (static_cast<uint64_t>(r) << 32 | t)) %
                                    static_cast<uint64_t>(config_.vocab_size));
    }
    for (int t = 0; t < seq_; ++t) {
      b.inputs[r * seq_ + t] = ids[t];
      b.targets[r * seq_ + t] = (t + r) % 7 == 3 ? llm::kIgnoreIndex : ids[t + 1];
    }
  }
  return b;
}

float LlmCellModel::ForwardBackward(const std::vector<std::vector<float>>& params, int rank, int window, int micro,
                                    float target_scale, Heads heads, float seed,
                                    std::vector<std::vector<float>>* grads) const {
  const int n = static_cast<int>(specs_.size());
  std::vector<examples::ParamView> views(n);
  for (int i = 0; i < n; ++i) views[i] = examples::ParamView{params[i].data(), DType::kF32};
  examples::ResidentParams provider(specs_, views);
  grads->assign(n, {});
  std::vector<examples::GradView> gviews(n);
  for (int i = 0; i < n; ++i) {
    (*grads)[i].assign(params[i].size(), 0.0f);
    gviews[i] = examples::GradView{(*grads)[i].data(), DType::kF32};
  }
  examples::GradBuffers sink(gviews);
  llm::LlmCpu model(config_);
  llm::LlmActivations acts;
  const llm::LlmBatch batch = MakeBatch(rank, window, micro);
  Result<double> loss = model.Forward(provider, batch, &acts);
  ZERO_CHECK_MSG(loss.ok(), loss.status().ToString().c_str());
  Status st = model.Backward(provider, &acts, seed, sink);
  ZERO_CHECK_MSG(st.ok(), st.ToString().c_str());
  return static_cast<float>(*loss);
}

const LlmCellModel& TinyLlmCellModel() {
  static const LlmCellModel* model = [] {
    Result<llm::LlmConfig> c = llm::Preset("tiny");
    ZERO_CHECK_MSG(c.ok(), c.status().ToString().c_str());
    return new LlmCellModel(*c, /*batch=*/2, /*seq=*/16, /*seed=*/1234);
  }();
  return *model;
}

CellSpec LlmCellSpec(int stage, int world, int gas, const std::string& mode, bool managed, DType dtype) {
  CellSpec c;
  c.stage = stage;
  c.world = world;
  c.managed = managed;
  c.gas = managed ? gas : 1;
  c.dtype = dtype;
  c.clip = c.gas > 1 ? 1.0 : 0.0;
  c.micro_batch = 2;
  c.reduce_bucket_size = 20000;
  c.persistence_threshold = 64;
  c.sub_group_size = 16384;
  const int64_t numel = TinyLlmCellModel().TotalNumel();
  if (mode == "cpu" || mode == "gpuacc" || mode == "gpuchunk" || mode == "overlap") c.offload_optimizer = true;
  if (mode == "nvme" || mode == "tiered") c.offload_optimizer = c.nvme = true;
  if (mode == "tiered") c.host_memory_budget = 12 * (numel / (2 * c.world));
  if (mode == "paramcpu" || mode == "paramnvme" || mode == "gpuacc") c.offload_param = true;
  if (mode == "paramnvme") c.nvme_param = true;
  if (mode == "gpuacc") c.gpu_grad_accumulation = true;
  if (mode == "gpuchunk" || mode == "overlap") c.gpu_update_chunk = 4096;
  if (mode == "overlap") c.overlap_step = true;
  return c;
}

Schedule LlmCellSchedule(const CellSpec& cell, int steps) {
  if (cell.managed) return ManagedSchedule(steps, cell.gas);
  Schedule s;
  s.managed = false;
  for (int count : {2, 5, 3}) {
    Window w;
    for (int i = 0; i < count; ++i) {
      MicroSpec m;
      m.loss_divisor = static_cast<float>(count);
      w.micros.push_back(m);
    }
    s.windows.push_back(w);
  }
  return s;
}

}  // namespace zero::equivalence
