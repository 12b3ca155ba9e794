#include "tests/equivalence/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/engine.h"
#include "engine/lr_scheduler.h"
#include "runtime/device.h"
#include "zero/loss_scaler.h"

namespace zero::equivalence {

ReductionOrder OrderOfStage(int stage) { return stage <= 1 ? ReductionOrder::kRankFirst : ReductionOrder::kMicroFirst; }

namespace {

float RoundTo(DType t, float v) {
  uint32_t buf = 0;
  StoreFromFloat(&buf, t, 0, v);
  return LoadAsFloat(&buf, t, 0);
}

// Mean over ranks of element i: fp32 sum in rank order, / N, rounded once to `t`.
float RankMean(const std::vector<const float*>& per_rank, size_t i, DType t) {
  float s = per_rank[0][i];
  for (size_t r = 1; r < per_rank.size(); ++r) s += per_rank[r][i];
  return RoundTo(t, s / static_cast<float>(per_rank.size()));
}

// CpuDevice::SumOfSquares (cpu_device.h): element k squared in double into lane k mod 8, in
// increasing k, lanes combined as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)).
// CpuDevice::SumOfSquares' documented order (cpu_device.h): blocks of 1024 elements, in a block
// lane k % 8 and a fixed tree over the lanes, block sums combined pairwise like a binary counter.
double LaneSumOfSquares(const float* x, size_t n) {
  constexpr size_t kBlock = 1024;
  double level_sum[64];
  size_t blocks = 0;
  for (size_t b = 0; b < n; b += kBlock) {
    double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (size_t k = b; k < std::min(n, b + kBlock); ++k) {
      lane[(k - b) % 8] += static_cast<double>(x[k]) * static_cast<double>(x[k]);
    }
    double carry = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    int level = 0;
    for (size_t k = blocks; k & 1; k >>= 1, ++level) carry = level_sum[level] + carry;
    level_sum[level] = carry;
    ++blocks;
  }
  double total = 0.0;
  for (int level = 0; level < 64; ++level) {
    if ((blocks >> level) & 1) total = level_sum[level] + total;
  }
  return total;
}

// The contract's norm order: per parameter, the sum of squares of this rank's partition of the
// fp32 accumulator (stage 0: the whole parameter), added in parameter order; the ranks' sums added
// in rank order (stages 1-3 with N > 1). Padding elements are zero.
double ContractSumOfSquares(const Tensors& acc, int stage, int world) {
  if (stage == 0 || world == 1) {  // one partition: the whole parameter on every rank
    double total = 0.0;
    for (const std::vector<float>& a : acc) total += LaneSumOfSquares(a.data(), a.size());
    return total;
  }
  double all = 0.0;
  for (int r = 0; r < world; ++r) {
    double total = 0.0;
    for (const std::vector<float>& a : acc) {
      const size_t n = a.size();
      const size_t shard = (n + world - 1) / world;
      std::vector<float> mine(shard, 0.0f);
      for (size_t k = 0; k < shard; ++k) {
        const size_t i = r * shard + k;
        if (i < n) mine[k] = a[i];
      }
      total += LaneSumOfSquares(mine.data(), mine.size());
    }
    all = r == 0 ? total : all + total;
  }
  return all;
}

}  // namespace

Result<RefTrace> RunReference(const Config& config, int world, ReductionOrder order, const ModelDims& dims,
                              const Schedule& schedule) {
  return RunReference(config, world, order, MlpCellModel(dims), schedule);
}

Result<RefTrace> RunReference(const Config& config, int world, ReductionOrder order, const CellModel& cell_model,
                              const Schedule& schedule) {
  const DType dtype = config.model_dtype();
  const bool fp16 = config.fp16.enabled;
  const bool managed = config.managed_gradient_accumulation;
  if (managed != schedule.managed) return InvalidArgumentError("schedule and config disagree on managed mode");
  const double gas = managed ? static_cast<double>(config.gradient_accumulation_steps) : 1.0;
  const std::vector<ParamSpec> specs = cell_model.Params();
  const int n = static_cast<int>(specs.size());
  std::vector<size_t> numel(n);
  for (int p = 0; p < n; ++p) numel[p] = static_cast<size_t>(Numel(specs[p]));

  RefTrace trace;
  for (const ParamSpec& p : specs) trace.names.push_back(p.name);
  Tensors master(n), model(n), exp_avg(n), exp_avg_sq(n);
  for (int p = 0; p < n; ++p) {
    master[p].resize(numel[p]);
    cell_model.InitValues(p, master[p].data());
    model[p].resize(numel[p]);
    for (size_t i = 0; i < numel[p]; ++i) model[p][i] = RoundTo(dtype, master[p][i]);
    exp_avg[p].assign(numel[p], 0.0f);
    exp_avg_sq[p].assign(numel[p], 0.0f);
  }
  trace.initial_master = master;
  trace.initial_model = model;

  ZERO_ASSIGN_OR_RETURN(LossScaler scaler, CreateLossScaler(config));
  ZERO_ASSIGN_OR_RETURN(LrScheduler sched, LrScheduler::Create(config.scheduler, config.optimizer.lr));
  int64_t adam_step = 0, global_steps = 0, skipped_steps = 0;

  for (size_t w = 0; w < schedule.windows.size(); ++w) {
    const Window& win = schedule.windows[w];
    if (managed && static_cast<int64_t>(win.micros.size()) != config.gradient_accumulation_steps) {
      return InvalidArgumentError("managed window " + std::to_string(w) + " has " + std::to_string(win.micros.size()) +
                                  " micro steps, GAS is " + std::to_string(config.gradient_accumulation_steps));
    }
    StepRecord rec;
    rec.loss_scale_used = fp16 ? scaler.scale() : 1.0f;
    rec.lr_used = sched.lr();
    // Accumulators: per rank (kRankFirst) or one (kMicroFirst).
    std::vector<Tensors> acc_rank(order == ReductionOrder::kRankFirst ? world : 0);
    for (Tensors& a : acc_rank) {
      a.resize(n);
      for (int p = 0; p < n; ++p) a[p].assign(numel[p], 0.0f);
    }
    Tensors acc(n);
    for (int p = 0; p < n; ++p) acc[p].assign(numel[p], 0.0f);
    std::vector<bool> active(n, false);

    trace.losses.emplace_back();
    for (size_t j = 0; j < win.micros.size(); ++j) {
      const MicroSpec& micro = win.micros[j];
      // The engine's gradient_scale(): the loss scale, divided by GAS in managed mode.
      const float seed = rec.loss_scale_used / static_cast<float>(gas) / micro.loss_divisor;
      std::vector<Tensors> g(world);  // [rank][param], rounded to the model dtype
      std::vector<float> losses(world);
      for (int r = 0; r < world; ++r) {
        const float target_scale = micro.overflow_rank == r ? kOverflowTargetScale : 1.0f;
        const Heads own = HeadsOf(micro, r);
        losses[r] = cell_model.ForwardBackward(model, r, static_cast<int>(w), static_cast<int>(j), target_scale, own,
                                               seed, &g[r]);
        for (int p = 0; p < n; ++p) {
          // A parameter this rank does not use: not reported, it contributes zeros.
          if (!cell_model.ParamUsed(p, own)) g[r][p].assign(numel[p], 0.0f);
          for (float& x : g[r][p]) x = RoundTo(dtype, x);
        }
      }
      trace.losses.back().push_back(losses);
      for (int p = 0; p < n; ++p) {
        if (!cell_model.ParamUsed(p, UnionHeads(micro))) continue;  // no rank reported it: zero / inactive
        active[p] = true;
        if (order == ReductionOrder::kRankFirst) {
          for (int r = 0; r < world; ++r) {
            for (size_t i = 0; i < numel[p]; ++i) acc_rank[r][p][i] += g[r][p][i];
          }
        } else {
          std::vector<const float*> per_rank(world);
          for (int r = 0; r < world; ++r) per_rank[r] = g[r][p].data();
          for (size_t i = 0; i < numel[p]; ++i) acc[p][i] += RankMean(per_rank, i, dtype);
        }
      }
    }

    // The boundary.
    if (order == ReductionOrder::kRankFirst) {
      for (int p = 0; p < n; ++p) {
        std::vector<const float*> per_rank(world);
        for (int r = 0; r < world; ++r) per_rank[r] = acc_rank[r][p].data();
        for (size_t i = 0; i < numel[p]; ++i) acc[p][i] = RankMean(per_rank, i, DType::kF32);
      }
    }
    const double sumsq = ContractSumOfSquares(acc, config.zero.stage, world);
    bool finite = true;
    for (int p = 0; p < n; ++p) {
      for (size_t i = 0; i < numel[p]; ++i) {
        if (!std::isfinite(acc[p][i])) finite = false;
      }
    }
    const bool overflow = fp16 && !finite;
    const double loss_scale = rec.loss_scale_used;
    if (fp16) scaler.Update(overflow);
    ++global_steps;
    if (overflow) {
      ++skipped_steps;
      ++trace.overflow_steps;
      rec.applied = false;
      rec.grad_norm = std::numeric_limits<double>::infinity();
    } else {
      const double norm = std::sqrt(sumsq);
      double clip_coef = 1.0;
      if (config.gradient_clipping > 0.0) {
        clip_coef = std::max(1.0, (norm / loss_scale + 1e-6) / config.gradient_clipping);
      }
      if (clip_coef > 1.0) ++trace.clipped_steps;
      ++adam_step;
      AdamWParams h;
      h.lr = static_cast<float>(sched.lr());
      h.beta1 = static_cast<float>(config.optimizer.beta1);
      h.beta2 = static_cast<float>(config.optimizer.beta2);
      h.eps = static_cast<float>(config.optimizer.eps);
      h.weight_decay = static_cast<float>(config.optimizer.weight_decay);
      h.adam_w_mode = config.optimizer.adam_w_mode;
      h.bias_correction1 = static_cast<float>(1.0 - std::pow(config.optimizer.beta1, static_cast<double>(adam_step)));
      h.bias_correction2 = static_cast<float>(1.0 - std::pow(config.optimizer.beta2, static_cast<double>(adam_step)));
      h.grad_scale = static_cast<float>(1.0 / (loss_scale * clip_coef));
      for (int p = 0; p < n; ++p) {
        if (config.freeze_inactive_parameters && !active[p]) continue;
        for (size_t i = 0; i < numel[p]; ++i) {
          AdamWReference(&master[p][i], acc[p][i], &exp_avg[p][i], &exp_avg_sq[p][i], h);
          model[p][i] = RoundTo(dtype, master[p][i]);
        }
      }
      sched.Step();
      rec.applied = true;
      rec.grad_norm = norm / loss_scale;
    }
    rec.loss_scale_after = fp16 ? scaler.scale() : 1.0f;
    rec.global_steps = global_steps;
    rec.skipped_steps = skipped_steps;
    rec.adam_step = adam_step;
    trace.steps.push_back(rec);
    if (schedule.snapshots) {
      trace.master_snapshots.push_back(master);
      trace.model_snapshots.push_back(model);
      trace.exp_avg_snapshots.push_back(exp_avg);
      trace.exp_avg_sq_snapshots.push_back(exp_avg_sq);
    }
  }
  trace.master = master;
  trace.model = model;
  trace.exp_avg = exp_avg;
  trace.exp_avg_sq = exp_avg_sq;
  return trace;
}

}  // namespace zero::equivalence
