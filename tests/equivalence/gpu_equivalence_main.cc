// gpu_equivalence: the equivalence suite on the CUDA backend (docs/equivalence.md, "GPU").
//
// Runs the engine on `--world` ranks, one thread each, through the same cells as the CPU suite at
// that world size. --comm nccl (the default): rank r on GPU cuda:r with an NCCL communicator from
// comm/rendezvous.h (world 1 needs no store). --comm same_device: every rank on the one GPU
// cuda:0 (each rank its own CudaDevice object, so its own default/compute stream and streams),
// connected by comm/same_device_communicator.h (collectives built from device copies and the
// rank-order reduction kernel on each rank's comm stream; worlds up to 64 on one GPU, where NCCL
// takes one rank per GPU). The cells: stages 0-3 x {fp32, bf16, fp16} x GAS {1, 4} x clipping {off, 0.05}, the fp16
// overflow cells and the unmanaged-accumulation cells (with and without offload), and at world > 1
// the different-heads cells (ranks using different parameters in one micro step, managed and
// unmanaged, stages 0-3, stage 3 also with param/optimizer offload). The model math stays on the host: the
// harness copies parameters device->host and gradients host->device with Device::Copy. Each rank
// is compared with the host reference (reference.h).
//
// World 1, and any world with --comm same_device (rank-order fp32 sums, as the reference): bitwise
// (weights, moments, losses, counters, loss scale, lr); the grad norm within 2(n-1)2^-53 relative
// (CUDA's SumOfSquares sums in its own order). World > 1 with NCCL: NCCL sums in its own order, so
// weights and losses are compared with the dtype-derived tolerance of the cross-order check (the
// change of each tensor over the run within 4u (16-bit) or 2^-18 (fp32) relative in norm, losses
// and norms within the same relative bound); step decisions and counters stay exact.
//
// Prints one line per cell and ends with "N passed, M failed"; exit status 1 on any failure, 2 on
// a usage error (a bad flag, or a --filter that matches no cell). Under `bazel test`
// (XML_OUTPUT_FILE set) it also writes one JUnit test case per cell there, so tools/count_tests.py
// counts cells, not one pass for the whole binary.
// Flags: --world N (default 1), --comm nccl|same_device (default nccl; see above), --device_prefix
// cuda (cuda:r per rank, cuda:0 for every rank with same_device; "cpu" runs the same driver on the
// CPU backend for a dry run, over Gloo, or over the same-device communicator with --comm
// same_device), --filter SUBSTRING (cells whose name contains it),
// --list (print the selected cells' names and exit; touches no device), --sync_device
// (synchronize the whole device around host reads/writes; for diagnosing an ordering problem),
// --port P (TCP store port for world > 1 with NCCL, default 29517), --skip_without_gpu (with fewer
// than the CUDA devices the run needs (--world, or 1 with same_device), report every cell skipped and exit 0 instead of
// failing at set-up; the `bazel test` target passes it; ZERO_REQUIRE_GPU=1 overrides it, as in
// runtime/gpu_test_util.h).
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/rendezvous.h"
#include "comm/same_device_communicator.h"
#include "engine/config/config.h"
#include "runtime/device.h"
#include "runtime/gpu_test_util.h"
#include "tests/equivalence/harness.h"
#include "tests/equivalence/llm_cell_model.h"
#include "tests/equivalence/reference.h"
#include "tests/equivalence/test_model.h"

namespace zero::equivalence {
namespace {

struct Flags {
  int world = 1;
  std::string comm = "nccl";  // or "same_device"
  std::string device_prefix = "cuda";
  std::string filter;
  bool list = false;
  bool skip_without_gpu = false;
  int port = 29517;
  DriverOptions driver;
};

struct Cell {
  CellSpec spec;
  Schedule schedule;
  std::string name;
  bool llm = false;  // the transformer (TinyLlmCellModel) instead of the small MLP
};

// The transformer's cells ("llm/..."): its tensors (a 32768-element embedding, 64-element norms)
// through the engine's device paths at every stage and with each offload mode; bf16.
void AddLlmCells(int world, std::vector<Cell>* cells) {
  auto add = [&](int stage, int gas, const std::string& mode, bool managed) {
    Cell c;
    c.spec = LlmCellSpec(stage, world, gas, mode, managed, DType::kBF16);
    c.schedule = LlmCellSchedule(c.spec, 3);
    c.name = "llm/" + c.spec.Name() + "_" + mode;
    c.llm = true;
    cells->push_back(c);
  };
  for (int stage = 0; stage <= 3; ++stage) {
    for (int gas : {1, 4}) add(stage, gas, "none", true);
    add(stage, 1, "none", false);
  }
  for (int stage = 1; stage <= 3; ++stage) {
    add(stage, 4, "cpu", true);
    add(stage, 4, "gpuchunk", true);
    add(stage, 1, "cpu", false);
    if (world == 1) add(stage, 4, "overlap", true);
  }
  add(2, 4, "nvme", true);
  add(3, 4, "tiered", true);
  for (const char* mode : {"paramcpu", "paramnvme", "gpuacc"}) {
    add(3, 4, mode, true);
    add(3, 1, mode, false);
  }
}

std::vector<Cell> AllCells(int world, bool with_llm) {
  std::vector<Cell> cells;
  for (int stage = 0; stage <= 3; ++stage) {
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (int gas : {1, 4}) {
        for (bool clip : {false, true}) {
          Cell c;
          c.spec.stage = stage;
          c.spec.world = world;
          c.spec.dtype = dt;
          c.spec.gas = gas;
          c.spec.clip = clip ? 0.05 : 0.0;
          c.schedule = ManagedSchedule(4, gas);
          c.name = "matrix/" + c.spec.Name();
          cells.push_back(c);
          if (stage >= 1) {
            // offload_optimizer.device "cpu": host states, pinned copies, the CPU AdamW.
            c.spec.offload_optimizer = true;
            c.name = "offload/" + c.spec.Name();
            cells.push_back(c);
            // update_device "gpu": the same host states streamed through the GPU in chunks
            // (3 staging sets of 37 elements: several chunks per call), AdamW on the GPU.
            c.spec.gpu_update_chunk = 37;
            c.name = "gpuchunk/" + c.spec.Name();
            cells.push_back(c);
            if (world == 1) {
              // overlap_step: the chunks queued under the next forward (one rank only), over a
              // schedule where head B first gets a gradient in window 2.
              Cell o = c;
              o.spec.overlap_step = true;
              for (size_t w = 0; w < o.schedule.windows.size(); ++w) {
                for (size_t j = 0; j < o.schedule.windows[w].micros.size(); ++j) {
                  o.schedule.windows[w].micros[j].heads.b = w >= 2 && j == 0;
                }
              }
              o.name = "gpuoverlap/" + o.spec.Name();
              cells.push_back(o);
            }
            c.spec.gpu_update_chunk = 0;
          }
          if (stage == 3 && world == 1 && dt != DType::kF16) {
            // Partial offload (offload_optimizer.ratio 0.5): the first half of the partition's
            // states on the GPU with the device AdamW, the rest with "cpu" on the host (CPU AdamW)
            // and, in bf16, tiered: a quarter of the partition in pinned host memory, the rest on
            // NVMe (three tiers). As the CPU suite's RatioMatrixTest and TieredRatioMatrixTest.
            Cell r = c;
            r.spec.offload_optimizer = true;
            r.spec.offload_ratio = 0.5;
            r.name = "ratio/" + r.spec.Name();
            cells.push_back(r);
            if (dt == DType::kBF16) {
              r.spec.nvme = true;
              r.spec.host_memory_budget = 12 * (TotalNumel(ModelDims()) / (4 * world));
              r.name = "ratio/" + r.spec.Name();
              cells.push_back(r);
            }
          }
          if (stage == 3) {
            // offload_param.device "cpu": the shards in pinned host memory, uploaded on the
            // coordinator's own stream for every gather; with device and with host states.
            c.spec.offload_param = true;
            c.spec.offload_optimizer = false;
            c.name = "paramoffload/" + c.spec.Name();
            cells.push_back(c);
            c.spec.offload_optimizer = true;
            c.name = "paramoffload/" + c.spec.Name();
            cells.push_back(c);
            // offload_grad_accumulation "gpu": the fp32 sum on the device, to the host once a step.
            c.spec.gpu_grad_accumulation = true;
            c.name = "gpuacc/" + c.spec.Name();
            cells.push_back(c);
            c.spec.gpu_grad_accumulation = false;
            // offload_param.device "nvme": every gather reads its module from the swap file.
            c.spec.nvme_param = true;
            c.name = "paramnvme/" + c.spec.Name();
            cells.push_back(c);
            c.spec.nvme_param = false;
            c.spec.offload_param = false;
            c.spec.offload_optimizer = false;
          }
        }
      }
    }
    for (int gas : {1, 4}) {
      Cell c;
      c.spec.stage = stage;
      c.spec.world = world;
      c.spec.dtype = DType::kF16;
      c.spec.gas = gas;
      c.spec.clip = 0.05;
      c.spec.loss_scale_window = 2;
      c.schedule = ManagedSchedule(7, gas);
      c.schedule.windows[1].micros[0].overflow_rank = world - 1;
      c.schedule.windows[2].micros[0].overflow_rank = world - 1;
      c.name = "overflow/" + c.spec.Name();
      cells.push_back(c);
    }
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
      Cell c;
      c.spec.stage = stage;
      c.spec.world = world;
      c.spec.dtype = dt;
      c.spec.managed = false;
      c.spec.clip = 0.05;
      c.schedule.managed = false;
      c.schedule.snapshots = true;
      const int counts[3] = {2, 5, 3};
      for (int w = 0; w < 3; ++w) {
        Window win;
        for (int i = 0; i < counts[w]; ++i) {
          MicroSpec m;
          m.heads = w == 1 ? Heads{false, true} : Heads{true, false};
          m.loss_divisor = static_cast<float>(counts[w]);
          win.micros.push_back(m);
        }
        c.schedule.windows.push_back(win);
      }
      c.name = "unmanaged/" + c.spec.Name();
      cells.push_back(c);
      // The same windows with offload (tests/equivalence's unmanaged offload cells): host states
      // (stages 1-3) and the chunked GPU update over them (overlapped with the next window's
      // forward at world 1, without the per-window snapshots whose gathers would wait for it);
      // stage 3: param + optimizer offload "cpu", and the shards in an NVMe swap file.
      if (stage >= 1) {
        Cell o = c;
        o.spec.offload_optimizer = true;
        o.name = "unmanaged_offload/" + o.spec.Name();
        cells.push_back(o);
        o.spec.gpu_update_chunk = 37;
        o.name = "unmanaged_offload/" + o.spec.Name();
        cells.push_back(o);
        if (world == 1) {
          Cell v = o;
          v.spec.overlap_step = true;
          v.schedule.snapshots = false;
          v.name = "unmanaged_offload/" + v.spec.Name();
          cells.push_back(v);
        }
        // NVMe optimizer states (swap files under NvmeTestDir(), real O_DIRECT I/O), and tiered:
        // half of the rank's states in pinned host memory, the rest on NVMe.
        o.spec.gpu_update_chunk = 0;
        o.spec.nvme = true;
        o.name = "unmanaged_offload/" + o.spec.Name();
        cells.push_back(o);
        o.spec.host_memory_budget = 12 * (TotalNumel(ModelDims()) / (2 * world));
        o.name = "unmanaged_offload/" + o.spec.Name();
        cells.push_back(o);
      }
      if (stage == 3) {
        Cell o = c;
        o.spec.offload_param = true;
        o.spec.offload_optimizer = true;
        o.name = "unmanaged_offload/" + o.spec.Name();
        cells.push_back(o);
        o.spec.offload_optimizer = false;
        o.spec.nvme_param = true;
        o.name = "unmanaged_offload/" + o.spec.Name();
        cells.push_back(o);
      }
    }
  }
  if (world > 1) {
    // Ranks using different heads in one micro step (rank r: pattern r mod 3), odd ranks reporting
    // in forward order (stage 3: each module's parameters while it is gathered), managed (GAS 2)
    // and unmanaged; stage 3 also with offload_param "cpu", offload_optimizer "cpu" and both. As the
    // CPU suite's DifferentHeads cells.
    const Heads a{true, false}, b{false, true}, both{true, true};
    const std::vector<std::vector<std::vector<Heads>>> windows = {
        {{a, b, both}, {b, a, a}}, {{a, b, b}, {a, b, both}}, {{b, a, both}, {both, b, a}}};
    for (int stage = 0; stage <= 3; ++stage) {
      for (DType dt : {DType::kF32, DType::kBF16}) {
        for (bool managed : {true, false}) {
          for (int offload = 0; offload < (stage == 3 ? 4 : 1); ++offload) {
            Cell c;
            c.spec.stage = stage;
            c.spec.world = world;
            c.spec.dtype = dt;
            c.spec.managed = managed;
            c.spec.gas = managed ? 2 : 1;
            c.spec.clip = 0.05;
            c.spec.offload_param = offload == 1 || offload == 3;
            c.spec.offload_optimizer = offload == 2 || offload == 3;
            c.schedule.managed = managed;
            c.schedule.odd_ranks_report_forward = stage < 3;
            c.schedule.odd_ranks_report_params_forward = stage == 3;
            for (const auto& win : windows) {
              Window w;
              for (const auto& per_rank : win) {
                MicroSpec m;
                m.rank_heads = per_rank;
                if (!managed) m.loss_divisor = static_cast<float>(win.size());
                w.micros.push_back(m);
              }
              c.schedule.windows.push_back(w);
            }
            c.name = "diffheads/" + c.spec.Name();
            cells.push_back(c);
          }
        }
      }
    }
  }
  if (with_llm) AddLlmCells(world, &cells);
  return cells;
}

// The cells whose name contains `filter` (all of them for an empty filter). The transformer's cells
// are compared bitwise only (one rank, or rank-order sums): with_llm is false over NCCL at world > 1.
std::vector<Cell> SelectCells(int world, bool with_llm, const std::string& filter) {
  std::vector<Cell> out;
  for (Cell& c : AllCells(world, with_llm)) {
    if (filter.empty() || c.name.find(filter) != std::string::npos) out.push_back(std::move(c));
  }
  return out;
}

std::string XmlEscape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20 && ch != '\n' && ch != '\t') {
          out += '?';
        } else {
          out += ch;
        }
    }
  }
  return out;
}

// One cell's outcome for the JUnit report.
struct CellResult {
  std::string name;
  std::string failure;  // empty: passed (or skipped, with `skip`)
  std::string skip;
};

// Writes the JUnit XML report Bazel reads from $XML_OUTPUT_FILE (nothing when it is unset: not
// under `bazel test`). Returns false, with a message on stderr, when the file cannot be written.
bool WriteJUnitReport(const std::vector<CellResult>& results) {
  const char* path = std::getenv("XML_OUTPUT_FILE");
  if (path == nullptr || path[0] == '\0') return true;
  std::FILE* f = std::fopen(path, "w");
  if (f == nullptr) {
    std::fprintf(stderr, "gpu_equivalence: cannot write the test report %s: %s\n", path, std::strerror(errno));
    return false;
  }
  int failures = 0, skipped = 0;
  for (const CellResult& r : results) {
    failures += !r.failure.empty();
    skipped += !r.skip.empty();
  }
  std::fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites tests=\"%zu\" failures=\"%d\">\n",
               results.size(), failures);
  std::fprintf(f, "  <testsuite name=\"GpuEquivalence\" tests=\"%zu\" failures=\"%d\" skipped=\"%d\">\n",
               results.size(), failures, skipped);
  for (const CellResult& r : results) {
    std::fprintf(f, "    <testcase name=\"%s\" classname=\"GpuEquivalence\"", XmlEscape(r.name).c_str());
    if (!r.failure.empty()) {
      std::fprintf(f, "><failure message=\"%s\"/></testcase>\n", XmlEscape(r.failure).c_str());
    } else if (!r.skip.empty()) {
      std::fprintf(f, " result=\"skipped\"><skipped message=\"%s\"/></testcase>\n", XmlEscape(r.skip).c_str());
    } else {
      std::fprintf(f, "/>\n");
    }
  }
  std::fprintf(f, "  </testsuite>\n</testsuites>\n");
  const bool ok = std::fclose(f) == 0;
  if (!ok) std::fprintf(stderr, "gpu_equivalence: writing the test report %s failed\n", path);
  return ok;
}

double UnitRoundoff(DType t) {
  return t == DType::kF32 ? std::ldexp(1.0, -24) : t == DType::kBF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
}

// World > 1 (NCCL's summation order): the cross-order tolerance.
void CompareLoose(const RefTrace& ref, int rank, const RankTrace& got, DType dtype, std::vector<std::string>* out) {
  const double tol = dtype == DType::kF32 ? std::ldexp(1.0, -18) : 4.0 * UnitRoundoff(dtype);
  const std::string r = "rank " + std::to_string(rank) + ": ";
  for (const std::string& n : got.notes) out->push_back(n);
  for (size_t w = 0; w < ref.steps.size() && w < got.steps.size(); ++w) {
    const StepRecord& a = got.steps[w];
    const StepRecord& b = ref.steps[w];
    if (a.applied != b.applied || a.loss_scale_used != b.loss_scale_used || a.loss_scale_after != b.loss_scale_after ||
        a.global_steps != b.global_steps || a.skipped_steps != b.skipped_steps || a.adam_step != b.adam_step ||
        a.lr_used != b.lr_used) {
      out->push_back(r + "step " + std::to_string(w) + ": step decision, loss scale, lr or counters differ");
    }
    if (b.applied && std::fabs(a.grad_norm - b.grad_norm) > tol * b.grad_norm) {
      out->push_back(r + "step " + std::to_string(w) + ": grad norm " + std::to_string(a.grad_norm) + " vs " +
                     std::to_string(b.grad_norm));
    }
  }
  for (size_t w = 0; w < ref.losses.size() && w < got.losses.size(); ++w) {
    for (size_t j = 0; j < ref.losses[w].size(); ++j) {
      const float e = got.losses[w][j], f = ref.losses[w][j][rank];
      if (!(std::fabs(e - f) <= tol * std::fabs(f)) && !(std::isinf(e) && e == f)) {
        out->push_back(r + "loss window " + std::to_string(w) + " micro " + std::to_string(j) + ": " +
                       FloatBitsString(e) + " vs " + FloatBitsString(f));
      }
    }
  }
  const std::vector<ParamSpec> specs = ModelParams(ModelDims());
  for (int p = 0; p < kNumParams; ++p) {
    double diff = 0, base = 0;
    for (size_t i = 0; i < ref.master[p].size(); ++i) {
      const double da = static_cast<double>(got.master[p][i]) - ref.initial_master[p][i];
      const double db = static_cast<double>(ref.master[p][i]) - ref.initial_master[p][i];
      diff += (da - db) * (da - db);
      base += db * db;
    }
    if (!(std::sqrt(diff) <= tol * std::sqrt(base))) {
      out->push_back(r + specs[p].name + ": relative change difference " + std::to_string(std::sqrt(diff / base)) +
                     " > " + std::to_string(tol));
    }
  }
}

int Main(const Flags& flags) {
  const int world = flags.world;
  // The transformer's cells where the comparison is bitwise (see `exact` below).
  const bool with_llm = world == 1 || flags.comm == "same_device" || flags.device_prefix == "cpu";
  const std::vector<Cell> cells = SelectCells(world, with_llm, flags.filter);
  if (cells.empty()) {
    std::fprintf(stderr,
                 "gpu_equivalence: --filter \"%s\" matches none of the %zu cells at world %d (names look like "
                 "\"%s\"; --list prints them all)\n",
                 flags.filter.c_str(), AllCells(world, with_llm).size(), world,
                 AllCells(world, with_llm)[0].name.c_str());
    return 2;
  }
  if (flags.list) {
    for (const Cell& c : cells) std::printf("%s\n", c.name.c_str());
    return 0;
  }
  const bool same_device = flags.comm == "same_device";
  if (flags.skip_without_gpu && flags.device_prefix == "cuda" && !zero::testing::GpuRequired()) {
    const std::string missing = zero::testing::MissingCudaDevices(same_device ? 1 : world);
    if (!missing.empty()) {
      std::vector<CellResult> results;
      for (const Cell& c : cells) results.push_back({c.name, "", missing});
      std::printf("gpu_equivalence: SKIPPED %zu cells: %s\n0 passed, 0 failed, %zu skipped\n", cells.size(),
                  missing.c_str(), cells.size());
      return WriteJUnitReport(results) ? 0 : 1;
    }
  }
  // Devices and communicators once, reused by every cell (the engine owns neither). With
  // same_device, one group; each rank opens its own Device object on the one GPU (cuda:0), so each
  // has its own default (compute) stream and creates its own streams.
  std::shared_ptr<SameDeviceGroup> group;
  if (same_device) {
    SameDeviceOptions o;
    // A collective that waits a minute for a rank is a hang: fail it, naming the rank.
    o.comm.timeout = std::chrono::milliseconds(60000);
    Result<std::shared_ptr<SameDeviceGroup>> g = SameDeviceGroup::Create(world, o);
    if (!g.ok()) {
      std::printf("set-up failed: %s\n0 passed, 1 failed\n", g.status().ToString().c_str());
      WriteJUnitReport({{"set-up", g.status().ToString(), ""}});
      return 1;
    }
    group = *g;
  }
  std::vector<std::unique_ptr<Device>> devices(world);
  std::vector<std::unique_ptr<Communicator>> comms(world);
  std::vector<Status> init(world);
  {
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        const std::string name = flags.device_prefix == "cpu" ? "cpu"
                                 : same_device                ? flags.device_prefix + ":0"
                                                              : flags.device_prefix + ":" + std::to_string(r);
        Result<std::unique_ptr<Device>> d = CreateDevice(name);
        if (!d.ok()) {
          init[r] = d.status();
          if (group != nullptr) group->Fail(UnavailableError("rank " + std::to_string(r) + " has no device"));
          return;
        }
        devices[r] = std::move(*d);
        if (same_device) {
          Result<std::unique_ptr<SameDeviceCommunicator>> c = group->Join(r, devices[r].get());
          if (!c.ok()) {
            init[r] = c.status();
            return;
          }
          comms[r] = std::move(*c);
          return;
        }
        RendezvousOptions o;
        o.rank = r;
        o.world_size = world;
        o.local_rank = r;
        o.master_port = flags.port;
        o.prefix = "gpu_equivalence";
        Result<std::unique_ptr<Communicator>> c =
            CreateCommunicator(flags.device_prefix == "cpu" ? "gloo" : "nccl", devices[r].get(), o);
        if (!c.ok()) {
          init[r] = c.status();
          return;
        }
        comms[r] = std::move(*c);
      });
    }
    for (std::thread& t : threads) t.join();
  }
  for (int r = 0; r < world; ++r) {
    if (!init[r].ok()) {
      std::printf("rank %d: set-up failed: %s\n0 passed, 1 failed\n", r, init[r].ToString().c_str());
      WriteJUnitReport({{"set-up", "rank " + std::to_string(r) + ": " + init[r].ToString(), ""}});
      return 1;
    }
  }
  std::printf("gpu_equivalence: world %d, device %s, communicator %s\n", world, devices[0]->name().c_str(),
              comms[0]->backend().c_str());

  // Rank-order sums (Gloo, same_device) or a single rank: bitwise; NCCL's own summation order:
  // tolerance.
  const bool exact = world == 1 || comms[0]->backend() == "gloo" || comms[0]->backend() == "same_device";
  int passed = 0, failed = 0;
  std::vector<CellResult> results;
  const auto start = std::chrono::steady_clock::now();
  for (const Cell& cell : cells) {
    ParseOptions po;
    po.world_size = world;
    po.strict = true;
    Result<Config> config = ParseConfig(CellConfigJson(cell.spec), po);
    std::vector<std::string> lines;
    if (!config.ok()) {
      lines.push_back("config: " + config.status().ToString());
    } else {
      const MlpCellModel mlp;
      const CellModel& model = cell.llm ? static_cast<const CellModel&>(TinyLlmCellModel()) : mlp;
      int64_t total_numel = 0;
      for (const ParamSpec& p : model.Params()) total_numel += Numel(p);
      Result<RefTrace> ref = RunReference(*config, world, OrderOfStage(cell.spec.stage), model, cell.schedule);
      if (!ref.ok()) {
        lines.push_back("reference: " + ref.status().ToString());
      } else {
        std::vector<RankTrace> traces(world);
        std::vector<Status> st(world);
        std::vector<std::thread> threads;
        for (int r = 0; r < world; ++r) {
          threads.emplace_back([&, r] {
            st[r] = RunEngineRank(*config, model, cell.schedule, devices[r].get(), comms[r].get(), &traces[r],
                                  flags.driver);
          });
        }
        for (std::thread& t : threads) t.join();
        for (int r = 0; r < world; ++r) {
          if (!st[r].ok()) lines.push_back("rank " + std::to_string(r) + ": " + st[r].ToString());
        }
        if (lines.empty()) {
          // CPU backend: bitwise, the norm included. CUDA: SumOfSquares sums in its own order.
          Tolerance tol;
          if (devices[0]->kind() != DeviceKind::kCpu) {
            tol.norm_rel = 2.0 * static_cast<double>(total_numel - 1) * std::ldexp(1.0, -53);
          }
          for (int r = 0; r < world; ++r) {
            if (exact) {
              CompareRankTrace(*ref, r, traces[r], tol, &lines);
            } else {
              CompareLoose(*ref, r, traces[r], cell.spec.dtype, &lines);
            }
          }
          // Partial offload (ratio/ cells): some masters and moments on the GPU, the rest
          // offloaded (a ratio that sent every state to the host fails here).
          for (int r = 0; r < world && cell.spec.offload_optimizer && cell.spec.offload_ratio < 1.0; ++r) {
            const EngineMemory& m = traces[r].memory;
            if (m.master_params == 0 || m.optimizer_states == 0 || m.host_states == 0) {
              lines.push_back("rank " + std::to_string(r) + ": states not split by offload_optimizer.ratio: " +
                              std::to_string(m.master_params) + " master and " + std::to_string(m.optimizer_states) +
                              " moment bytes on the device, " + std::to_string(m.host_states) + " host bytes");
            }
          }
        }
      }
    }
    results.push_back({cell.name, "", ""});
    if (lines.empty()) {
      ++passed;
      std::printf("PASS %s\n", cell.name.c_str());
    } else {
      ++failed;
      for (size_t i = 0; i < lines.size() && i < 20; ++i) results.back().failure += lines[i] + "\n";
      std::printf("FAIL %s\n", cell.name.c_str());
      for (size_t i = 0; i < lines.size() && i < 20; ++i) std::printf("    %s\n", lines[i].c_str());
    }
    std::fflush(stdout);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s comparison, %.1f s\n%d passed, %d failed\n", exact ? "bitwise" : "tolerance", secs, passed, failed);
  const bool reported = WriteJUnitReport(results);
  return failed == 0 && reported ? 0 : 1;
}

}  // namespace
}  // namespace zero::equivalence

int main(int argc, char** argv) {
  zero::equivalence::Flags flags;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* name) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", name);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--world") {
      flags.world = std::atoi(value("--world"));
    } else if (a == "--comm") {
      flags.comm = value("--comm");
      if (flags.comm != "nccl" && flags.comm != "same_device") {
        std::fprintf(stderr, "--comm must be nccl or same_device, got \"%s\"\n", flags.comm.c_str());
        return 2;
      }
    } else if (a == "--device_prefix") {
      flags.device_prefix = value("--device_prefix");
    } else if (a == "--filter") {
      flags.filter = value("--filter");
    } else if (a == "--list") {
      flags.list = true;
    } else if (a == "--skip_without_gpu") {
      flags.skip_without_gpu = true;
    } else if (a == "--sync_device") {
      flags.driver.sync_device = true;
    } else if (a == "--port") {
      flags.port = std::atoi(value("--port"));
    } else {
      std::fprintf(stderr,
                   "unknown flag %s (flags: --world N --comm nccl|same_device --device_prefix cuda|cpu --filter S "
                   "--list --sync_device --port P --skip_without_gpu)\n",
                   a.c_str());
      return 2;
    }
  }
  if (flags.world < 1) {
    std::fprintf(stderr, "--world must be >= 1\n");
    return 2;
  }
  return zero::equivalence::Main(flags);
}
