#include "tests/equivalence/harness.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>

#include <unistd.h>

#include "testing/scratch_dir.h"

namespace zero::equivalence {

Schedule ManagedSchedule(int steps, int gas) {
  Schedule s;
  s.managed = true;
  for (int w = 0; w < steps; ++w) {
    Window win;
    for (int j = 0; j < gas; ++j) {
      MicroSpec m;
      m.heads.a = true;
      m.heads.b = ((w * gas + j) % 2) == 0;
      win.micros.push_back(m);
    }
    s.windows.push_back(win);
  }
  return s;
}

int64_t TotalNumel(const ModelDims& dims) {
  int64_t n = 0;
  for (const ParamSpec& p : ModelParams(dims)) n += Numel(p);
  return n;
}

namespace {

// Reads parameter `index` (model dtype, on the device) into host floats.
Status ReadParam(Engine* engine, Device* device, DType dtype, int index, int64_t numel, std::vector<float>* out,
                 bool sync_device) {
  ZERO_ASSIGN_OR_RETURN(const void* ptr, engine->param(index));
  if (sync_device) ZERO_RETURN_IF_ERROR(device->Synchronize());
  std::vector<uint8_t> host(static_cast<size_t>(numel) * SizeOf(dtype));
  ZERO_RETURN_IF_ERROR(device->Copy(host.data(), ptr, host.size(), CopyKind::kDeviceToHost, nullptr));
  ZERO_RETURN_IF_ERROR(device->SynchronizeStream(nullptr));
  out->resize(numel);
  for (int64_t i = 0; i < numel; ++i) (*out)[i] = LoadAsFloat(host.data(), dtype, i);
  return OkStatus();
}

Status WriteGrad(Engine* engine, Device* device, DType dtype, int index, const std::vector<float>& grad,
                 bool sync_device) {
  ZERO_ASSIGN_OR_RETURN(void* ptr, engine->grad_buffer(index));
  std::vector<uint8_t> host(grad.size() * SizeOf(dtype));
  for (size_t i = 0; i < grad.size(); ++i) StoreFromFloat(host.data(), dtype, i, grad[i]);
  ZERO_RETURN_IF_ERROR(device->Copy(ptr, host.data(), host.size(), CopyKind::kHostToDevice, nullptr));
  ZERO_RETURN_IF_ERROR(device->SynchronizeStream(nullptr));
  if (sync_device) ZERO_RETURN_IF_ERROR(device->Synchronize());
  return engine->GradReady(index);
}

Status GatherAll(Engine* engine, int n, const std::vector<int64_t>& numel, bool master, Tensors* out) {
  out->assign(n, {});
  for (int i = 0; i < n; ++i) {
    (*out)[i].resize(numel[i]);
    if (master) {
      ZERO_RETURN_IF_ERROR(engine->GatherMasterWeights(i, (*out)[i].data()));
    } else {
      ZERO_RETURN_IF_ERROR(engine->GatherModelParam(i, (*out)[i].data()));
    }
  }
  return OkStatus();
}

Status GatherMoments(Engine* engine, int n, const std::vector<int64_t>& numel, Tensors* m, Tensors* v) {
  m->assign(n, {});
  v->assign(n, {});
  for (int i = 0; i < n; ++i) {
    (*m)[i].resize(numel[i]);
    (*v)[i].resize(numel[i]);
    ZERO_RETURN_IF_ERROR(engine->GatherOptimizerState(i, (*m)[i].data(), (*v)[i].data()));
  }
  return OkStatus();
}

bool ModuleUsed(const CellModel& model, const ModuleInfo& m, Heads heads) {
  for (int p : m.params) {
    if (!model.ParamUsed(p, heads)) return false;
  }
  return true;
}

}  // namespace

Status RunEngineRank(const Config& config, const ModelDims& dims, const Schedule& schedule, Device* device,
                     Communicator* comm, RankTrace* out, const DriverOptions& options) {
  return RunEngineRank(config, MlpCellModel(dims), schedule, device, comm, out, options);
}

Status RunEngineRank(const Config& config, const CellModel& model, const Schedule& schedule, Device* device,
                     Communicator* comm, RankTrace* out, const DriverOptions& options) {
  const int rank = comm->rank();
  const DType dtype = config.model_dtype();
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(config, device, comm));
  const std::vector<ParamSpec> specs = model.Params();
  std::vector<int64_t> numel;
  for (size_t i = 0; i < specs.size(); ++i) {
    ZERO_ASSIGN_OR_RETURN(int index, engine->RegisterParameter(specs[i]));
    if (index != static_cast<int>(i)) {
      return InternalError("RegisterParameter returned index " + std::to_string(index) + " for " + specs[i].name +
                           ", expected " + std::to_string(i));
    }
    numel.push_back(Numel(specs[i]));
  }
  ZERO_RETURN_IF_ERROR(engine->Initialize([&](int index, float* values) { model.InitValues(index, values); }));
  const int n = static_cast<int>(specs.size());
  ZERO_RETURN_IF_ERROR(GatherAll(engine.get(), n, numel, true, &out->initial_master));
  ZERO_RETURN_IF_ERROR(GatherAll(engine.get(), n, numel, false, &out->initial_model));

  const std::vector<ModuleInfo> modules = model.Modules();
  auto note = [&](const std::string& s) { out->notes.push_back("rank " + std::to_string(rank) + ": " + s); };

  for (size_t w = 0; w < schedule.windows.size(); ++w) {
    const Window& win = schedule.windows[w];
    StepRecord rec;
    rec.loss_scale_used = engine->loss_scale();
    rec.lr_used = engine->lr();
    out->losses.emplace_back();
    for (size_t j = 0; j < win.micros.size(); ++j) {
      const MicroSpec& micro = win.micros[j];
      if (engine->loss_scale() != rec.loss_scale_used) {
        note("loss scale changed inside window " + std::to_string(w));
      }
      // Forward: gather each used module, read its parameters, release it.
      const Heads own = HeadsOf(micro, rank);
      const Heads any = UnionHeads(micro);
      std::vector<std::vector<float>> params(n);
      for (const ModuleInfo& m : modules) {
        if (!ModuleUsed(model, m, any)) continue;
        ZERO_ASSIGN_OR_RETURN(ModuleHandle h, engine->GatherModule(m.name));
        for (int p : m.params) {
          ZERO_RETURN_IF_ERROR(ReadParam(engine.get(), device, dtype, p, numel[p], &params[p], options.sync_device));
        }
        ZERO_RETURN_IF_ERROR(h.Release());
      }
      for (int p = 0; p < n; ++p) {
        if (params[p].empty()) params[p].assign(numel[p], 0.0f);  // an unused head: never read
      }
      const float target_scale = micro.overflow_rank == rank ? kOverflowTargetScale : 1.0f;
      const float seed = engine->gradient_scale() / micro.loss_divisor;
      std::vector<std::vector<float>> grads;
      out->losses.back().push_back(model.ForwardBackward(params, rank, static_cast<int>(w), static_cast<int>(j),
                                                         target_scale, own, seed, &grads));
      // Backward: modules in reverse order, gathered again (stage 3 re-gathers what it released;
      // gathers are collective, so every rank gathers in the same order), each module's
      // gradients written and reported in reverse registration order. With
      // odd_ranks_report_forward, odd ranks report after the loop instead, in forward order.
      const bool forward_order =
          (schedule.odd_ranks_report_forward && rank % 2 == 1) || schedule.every_rank_reports_after_gathers;
      const bool params_forward = forward_order || (schedule.odd_ranks_report_params_forward && rank % 2 == 1);
      auto report = [&](const ModuleInfo& m) -> Status {
        if (!ModuleUsed(model, m, own)) return OkStatus();
        std::vector<int> ps(m.params.rbegin(), m.params.rend());
        if (params_forward) ps.assign(m.params.begin(), m.params.end());
        for (int p : ps) {
          ZERO_RETURN_IF_ERROR(WriteGrad(engine.get(), device, dtype, p, grads[p], options.sync_device));
        }
        return OkStatus();
      };
      for (auto it = modules.rbegin(); it != modules.rend(); ++it) {
        if (!ModuleUsed(model, *it, any)) continue;
        ZERO_ASSIGN_OR_RETURN(ModuleHandle h, engine->GatherModule(it->name));
        for (int p : it->params) {
          std::vector<float> again;
          ZERO_RETURN_IF_ERROR(ReadParam(engine.get(), device, dtype, p, numel[p], &again, options.sync_device));
          if (std::memcmp(again.data(), params[p].data(), again.size() * sizeof(float)) != 0) {
            note("parameter " + specs[p].name + " gathered in backward differs from forward, window " +
                 std::to_string(w) + " micro " + std::to_string(j));
          }
        }
        if (!forward_order) ZERO_RETURN_IF_ERROR(report(*it));
        ZERO_RETURN_IF_ERROR(h.Release());
      }
      if (forward_order) {
        for (const ModuleInfo& m : modules) ZERO_RETURN_IF_ERROR(report(m));
      }
      const bool boundary_expected = j + 1 == win.micros.size();
      if (schedule.managed && engine->is_gradient_accumulation_boundary() != boundary_expected) {
        note("is_gradient_accumulation_boundary() before Backward() of window " + std::to_string(w) + " micro " +
             std::to_string(j) + " is " + (engine->is_gradient_accumulation_boundary() ? "true" : "false"));
      }
      ZERO_RETURN_IF_ERROR(engine->Backward());
      if (schedule.managed) {
        ZERO_RETURN_IF_ERROR(engine->Step());
        if (!boundary_expected && engine->was_step_applied()) {
          note("was_step_applied() true off the boundary, window " + std::to_string(w) + " micro " + std::to_string(j));
        }
      }
    }
    if (!schedule.managed) {
      if (!engine->is_gradient_accumulation_boundary()) {
        note("unmanaged: is_gradient_accumulation_boundary() false before Step()");
      }
      ZERO_RETURN_IF_ERROR(engine->Step());
    }
    rec.applied = engine->was_step_applied();
    rec.grad_norm = engine->global_grad_norm();
    rec.loss_scale_after = engine->loss_scale();
    rec.global_steps = engine->counters().global_steps;
    rec.skipped_steps = engine->counters().skipped_steps;
    rec.adam_step = engine->counters().adam_step;
    out->steps.push_back(rec);
    if (schedule.snapshots) {
      out->master_snapshots.emplace_back();
      out->model_snapshots.emplace_back();
      ZERO_RETURN_IF_ERROR(GatherAll(engine.get(), n, numel, true, &out->master_snapshots.back()));
      ZERO_RETURN_IF_ERROR(GatherAll(engine.get(), n, numel, false, &out->model_snapshots.back()));
      out->exp_avg_snapshots.emplace_back();
      out->exp_avg_sq_snapshots.emplace_back();
      ZERO_RETURN_IF_ERROR(
          GatherMoments(engine.get(), n, numel, &out->exp_avg_snapshots.back(), &out->exp_avg_sq_snapshots.back()));
    }
  }
  out->memory = engine->memory();
  ZERO_RETURN_IF_ERROR(GatherAll(engine.get(), n, numel, true, &out->master));
  ZERO_RETURN_IF_ERROR(GatherAll(engine.get(), n, numel, false, &out->model));
  ZERO_RETURN_IF_ERROR(GatherMoments(engine.get(), n, numel, &out->exp_avg, &out->exp_avg_sq));
  return OkStatus();
}

int64_t UlpDistance(float a, float b) {
  uint32_t ua = FloatBits(a), ub = FloatBits(b);
  if (ua == ub) return 0;
  if (!std::isfinite(a) || !std::isfinite(b)) return std::numeric_limits<int64_t>::max();
  auto ordered = [](uint32_t u) -> int64_t {
    return (u & 0x80000000u) ? -static_cast<int64_t>(u & 0x7fffffffu) : static_cast<int64_t>(u);
  };
  int64_t d = ordered(ua) - ordered(ub);
  return d < 0 ? -d : d;
}

std::string FloatBitsString(float f) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g (0x%08x)", f, FloatBits(f));
  return buf;
}

namespace {

std::string DoubleString(double d) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", d);
  return buf;
}

// Compares two tensor sets; reports the first differing element of each differing tensor.
int CompareTensors(const std::string& what, const Tensors& ref, const Tensors& got, int ulps,
                   const std::vector<std::string>& names, std::vector<std::string>* out) {
  int bad = 0;
  if (ref.size() != got.size()) {
    out->push_back(what + ": " + std::to_string(got.size()) + " tensors, reference has " + std::to_string(ref.size()));
    return 1;
  }
  for (size_t p = 0; p < ref.size(); ++p) {
    if (ref[p].size() != got[p].size()) {
      out->push_back(what + " " + names[p] + ": size differs");
      ++bad;
      continue;
    }
    int64_t worst = 0;
    size_t first = ref[p].size(), count = 0;
    for (size_t i = 0; i < ref[p].size(); ++i) {
      int64_t d = UlpDistance(ref[p][i], got[p][i]);
      if (d > ulps) {
        if (first == ref[p].size()) first = i;
        ++count;
      }
      if (d > worst) worst = d;
    }
    if (count > 0) {
      ++bad;
      std::ostringstream s;
      s << what << " " << names[p] << ": " << count << "/" << ref[p].size() << " elements differ (allowed " << ulps
        << " ulp), first [" << first << "] engine " << FloatBitsString(got[p][first]) << " reference "
        << FloatBitsString(ref[p][first]) << ", worst " << worst << " ulp";
      out->push_back(s.str());
    }
  }
  return bad;
}

}  // namespace

int CompareRankTrace(const RefTrace& ref, int rank, const RankTrace& got, const Tolerance& tol,
                     std::vector<std::string>* out) {
  int bad = 0;
  const std::string r = "rank " + std::to_string(rank) + ": ";
  for (const std::string& n : got.notes) {
    out->push_back(n);
    ++bad;
  }
  std::vector<std::string> names = ref.names;
  if (names.empty()) {
    for (const ParamSpec& p : ModelParams(ModelDims())) names.push_back(p.name);
  }

  if (got.losses.size() != ref.losses.size()) {
    out->push_back(r + "number of windows differs");
    return bad + 1;
  }
  for (size_t w = 0; w < ref.losses.size(); ++w) {
    for (size_t j = 0; j < ref.losses[w].size(); ++j) {
      float e = got.losses[w][j], f = ref.losses[w][j][rank];
      if (UlpDistance(e, f) > tol.loss_ulps) {
        out->push_back(r + "loss window " + std::to_string(w) + " micro " + std::to_string(j) + ": engine " +
                       FloatBitsString(e) + " reference " + FloatBitsString(f));
        ++bad;
      }
    }
  }
  for (size_t w = 0; w < ref.steps.size(); ++w) {
    const StepRecord& a = got.steps[w];
    const StepRecord& b = ref.steps[w];
    const std::string at = r + "step " + std::to_string(w) + ": ";
    auto mismatch = [&](const std::string& what, const std::string& e, const std::string& f) {
      out->push_back(at + what + " engine " + e + " reference " + f);
      ++bad;
    };
    if (a.applied != b.applied)
      mismatch("was_step_applied", a.applied ? "true" : "false", b.applied ? "true" : "false");
    if (FloatBits(a.loss_scale_used) != FloatBits(b.loss_scale_used)) {
      mismatch("loss scale used", FloatBitsString(a.loss_scale_used), FloatBitsString(b.loss_scale_used));
    }
    if (FloatBits(a.loss_scale_after) != FloatBits(b.loss_scale_after)) {
      mismatch("loss scale after", FloatBitsString(a.loss_scale_after), FloatBitsString(b.loss_scale_after));
    }
    if (a.lr_used != b.lr_used) mismatch("lr()", DoubleString(a.lr_used), DoubleString(b.lr_used));
    if (a.global_steps != b.global_steps) {
      mismatch("global_steps", std::to_string(a.global_steps), std::to_string(b.global_steps));
    }
    if (a.skipped_steps != b.skipped_steps) {
      mismatch("skipped_steps", std::to_string(a.skipped_steps), std::to_string(b.skipped_steps));
    }
    if (a.adam_step != b.adam_step) mismatch("adam_step", std::to_string(a.adam_step), std::to_string(b.adam_step));
    if (b.applied) {
      bool ok = std::fabs(a.grad_norm - b.grad_norm) <= tol.norm_rel * std::fabs(b.grad_norm);
      if (!ok) mismatch("global_grad_norm", DoubleString(a.grad_norm), DoubleString(b.grad_norm));
    } else if (!(a.grad_norm == b.grad_norm)) {
      // A skipped (fp16 overflow) boundary: +Inf (engine.h).
      mismatch("global_grad_norm (overflow step)", DoubleString(a.grad_norm), DoubleString(b.grad_norm));
    }
  }
  bad += CompareTensors(r + "initial master", ref.initial_master, got.initial_master, 0, names, out);
  bad += CompareTensors(r + "initial model param", ref.initial_model, got.initial_model, 0, names, out);
  bad += CompareTensors(r + "master", ref.master, got.master, tol.weight_ulps, names, out);
  bad += CompareTensors(r + "model param", ref.model, got.model, tol.weight_ulps, names, out);
  bad += CompareTensors(r + "exp_avg", ref.exp_avg, got.exp_avg, tol.weight_ulps, names, out);
  bad += CompareTensors(r + "exp_avg_sq", ref.exp_avg_sq, got.exp_avg_sq, tol.weight_ulps, names, out);
  for (size_t w = 0; w < ref.master_snapshots.size() && w < got.master_snapshots.size(); ++w) {
    bad += CompareTensors(r + "master after window " + std::to_string(w), ref.master_snapshots[w],
                          got.master_snapshots[w], tol.weight_ulps, names, out);
    bad += CompareTensors(r + "model param after window " + std::to_string(w), ref.model_snapshots[w],
                          got.model_snapshots[w], tol.weight_ulps, names, out);
    bad += CompareTensors(r + "exp_avg after window " + std::to_string(w), ref.exp_avg_snapshots[w],
                          got.exp_avg_snapshots[w], tol.weight_ulps, names, out);
    bad += CompareTensors(r + "exp_avg_sq after window " + std::to_string(w), ref.exp_avg_sq_snapshots[w],
                          got.exp_avg_sq_snapshots[w], tol.weight_ulps, names, out);
  }
  if (ref.master_snapshots.size() != got.master_snapshots.size()) {
    out->push_back(r + "snapshot count differs");
    ++bad;
  }
  return bad;
}

Heads HeadsOf(const MicroSpec& m, int rank) {
  return m.rank_heads.empty() ? m.heads : m.rank_heads[static_cast<size_t>(rank) % m.rank_heads.size()];
}

Heads UnionHeads(const MicroSpec& m) {
  if (m.rank_heads.empty()) return m.heads;
  Heads u{false, false};
  for (const Heads& h : m.rank_heads) {
    u.a = u.a || h.a;
    u.b = u.b || h.b;
  }
  return u;
}

// Where nvme cells put their swap files: one ScratchDir (O_DIRECT) per process, so parallel test
// targets do not meet, removed at exit; the engine makes a folder per rank below it and removes it.
// Without any O_DIRECT directory the cells' engines report it.
std::string NvmeTestDir() {
  static const Result<ScratchDir> dir = ScratchDir::CreateWithDirectIo("zero_nvme_cells");
  return dir.ok() ? dir->path() : "/var/tmp/zero_nvme_cells (" + dir.status().ToString() + ")";
}

std::string CellSpec::Name() const {
  std::string s = "s" + std::to_string(stage) + "_w" + std::to_string(world) + "_" + DTypeName(dtype) + "_gas" +
                  std::to_string(gas) + (clip > 0 ? "_clip" : "_noclip");
  if (!managed) s += "_unmanaged";
  if (freeze_inactive) s += "_freeze";
  if (offload_optimizer) {
    s += nvme                   ? (host_memory_budget > 0 ? "_tiered" : "_nvme")
         : gpu_update_chunk > 0 ? (overlap_step ? "_gpuoverlap" : "_gpuchunk")
                                : "_offload";
  }
  if (offload_optimizer && offload_ratio < 1.0) s += "_r" + std::to_string(std::lround(offload_ratio * 100));
  if (offload_param) s += nvme_param ? "_paramnvme" : "_paramoffload";
  if (gpu_grad_accumulation) s += "_gpuacc";
  return s;
}

std::string CellConfigJson(const CellSpec& c) {
  // Every offload block says pin_memory true (DeepSpeed's default, as zero's): the offload cells mean
  // pinned host states and shards (gpu_equivalence_main.cc; the CPU backend mlocks them), with
  // pin_memory_fallback true: where RLIMIT_MEMLOCK is too small for them (a normal user's default
  // `ulimit -l` of 8192 KiB) they stay pageable with one warning; the arithmetic is the same.
  // offload_optimizer.ratio (partial offload), inside offload_optimizer, only below 1.
  std::string ratio;
  if (c.offload_optimizer && c.offload_ratio < 1.0) {
    std::ostringstream r;
    r.precision(17);
    r << ", \"ratio\": " << c.offload_ratio;
    ratio = r.str();
  }
  std::ostringstream j;
  j.precision(17);
  j << "{\n"
    << "  \"train_micro_batch_size_per_gpu\": " << c.micro_batch << ",\n"
    << "  \"gradient_accumulation_steps\": " << c.gas << ",\n"
    << "  \"gradient_clipping\": " << c.clip << ",\n"
    << "  \"managed_gradient_accumulation\": " << (c.managed ? "true" : "false") << ",\n"
    << (c.freeze_inactive ? "  \"freeze_inactive_parameters\": true,\n" : "")
    << "  \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"betas\": [0.9, 0.999], "
       "\"eps\": 1e-08, \"weight_decay\": 0.1}},\n"
    << "  \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_min_lr\": 0.001, "
       "\"warmup_max_lr\": 0.01, \"warmup_num_steps\": 3, \"warmup_type\": \"linear\"}},\n"
    << "  \"fp16\": {\"enabled\": " << (c.dtype == DType::kF16 ? "true" : "false")
    << ", \"initial_scale_power\": " << c.initial_scale_power << ", \"loss_scale_window\": " << c.loss_scale_window
    << ", \"hysteresis\": " << c.hysteresis << "},\n"
    << "  \"bf16\": {\"enabled\": " << (c.dtype == DType::kBF16 ? "true" : "false") << "},\n"
    << "  \"zero_optimization\": {\"stage\": " << c.stage << ", \"reduce_bucket_size\": " << c.reduce_bucket_size
    << ", \"allgather_bucket_size\": " << c.reduce_bucket_size
    << ", \"stage3_param_persistence_threshold\": " << c.persistence_threshold
    << ", \"stage3_prefetch_bucket_size\": " << 2 * c.reduce_bucket_size
    << (c.offload_optimizer && !c.nvme ? ", \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true, "
                                         "\"pin_memory_fallback\": true, \"cpu_threads\": 2"
                                       : "")
    << (c.offload_optimizer && !c.nvme && c.gpu_update_chunk > 0
            ? ", \"update_device\": \"gpu\", \"chunk_size\": " + std::to_string(c.gpu_update_chunk) +
                  ", \"chunk_buffers\": 3" + (c.overlap_step ? ", \"overlap_step\": true" : "")
            : "")
    << (c.offload_optimizer && !c.nvme ? ratio + "}" : "")
    << (c.offload_param && !c.nvme_param ? ", \"offload_param\": {\"device\": \"cpu\", \"pin_memory\": true, "
                                           "\"pin_memory_fallback\": true, \"buffer_count\": 2}"
                                         : "")
    << (c.offload_param && c.nvme_param
            ? ", \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"" + NvmeTestDir() +
                  "\", \"pin_memory\": true, \"pin_memory_fallback\": true, \"buffer_count\": 2, \"max_in_cpu\": 0}"
            : "")
    << (c.gpu_grad_accumulation ? ", \"offload_grad_accumulation\": \"gpu\"" : "")
    << (c.offload_optimizer && c.nvme
            ? ", \"sub_group_size\": " + std::to_string(c.sub_group_size) +
                  ", \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"" + NvmeTestDir() +
                  "\", \"pin_memory\": true, \"pin_memory_fallback\": true, \"buffer_count\": 2, \"cpu_threads\": 2, "
                  "\"host_memory_budget\": " +
                  std::to_string(c.host_memory_budget) + ratio + "}"
            : "")
    << "}"
    << ((c.offload_optimizer && c.nvme) || c.nvme_param ? ",\n  \"aio\": {\"block_size\": 4096, \"queue_depth\": 4}"
                                                        : "")
    << "\n"
    << "}\n";
  return j.str();
}

}  // namespace zero::equivalence
