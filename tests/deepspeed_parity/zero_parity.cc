// zero_parity: the zero side of the DeepSpeed parity suite (docs/deepspeed_parity.md).
//
// Reads the cells file written by cells.py (the model's parameter specs and, per cell, a DeepSpeed
// JSON config and a schedule of windows of micro steps), runs each cell through one Engine on one
// rank (device cpu or cuda:0, a one-rank gloo or NCCL communicator) and writes
// OUT/<cell>.zero.json: per step the lr and loss scale before it, was_step_applied(), the skipped
// and global step counters and global_grad_norm() after it; at the end the fp32 master weights,
// exp_avg, exp_avg_sq and the model parameters (little-endian float32, base64) of every parameter.
//
// The initial values and the gradients G(step, micro, param) come from the SplitMix64 generators
// that cells.py defines (the same bits on both sides). The gradient written into grad_buffer(p) is
// round_to_model_dtype(G * f), f = gradient_scale() (managed) or gradient_scale() / n (unmanaged,
// n backward calls in the window: the user averages the loss), the fp32 product rounded once; an
// overflow micro step puts +Inf into G of parameter 0.
//
// Usage: zero_parity --cells CELLS.json --out DIR [--device cpu|cuda] [--filter SUBSTRING]
// Prints one line per cell; exit status 1 if any cell failed to run (its JSON then holds "error").
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/rendezvous.h"
#include "engine/config/config.h"
#include "engine/engine.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/hash.h"
#include "runtime/status.h"

namespace zero::parity {
namespace {

using nlohmann::json;

// cells.py's init_key / grad_key.
uint64_t InitKey(int p) { return SplitMix64(0x1417000000000000ull | static_cast<uint64_t>(p)); }
uint64_t GradKey(int step, int micro, int p) {
  return SplitMix64(0x6ad0000000000000ull | (static_cast<uint64_t>(step) << 24) | (static_cast<uint64_t>(micro) << 8) |
                    static_cast<uint64_t>(p));
}

struct ParamInfo {
  ParamSpec spec;
  int64_t numel = 1;
  float init_scale = 1;
  float grad_scale = 1;
};

// An 8-bit integer times 2^-7 times the init scale (exact in fp32, bf16 and fp16).
void InitValues(const ParamInfo& p, int index, float* out) {
  const uint64_t key = InitKey(index);
  for (int64_t i = 0; i < p.numel; ++i) {
    const uint64_t x = SplitMix64(key + static_cast<uint64_t>(i) * kSplitMix64Gamma);
    const int k = static_cast<int>(x >> 56) - 128;
    out[i] = (static_cast<float>(k) * 0x1p-7f) * p.init_scale;
  }
}

// G = (u * 2^-24 * 2 - 1) * grad scale, u a 24-bit integer.
void GradValues(const ParamInfo& p, int step, int micro, int index, std::vector<float>* out) {
  const uint64_t key = GradKey(step, micro, index);
  out->resize(p.numel);
  for (int64_t i = 0; i < p.numel; ++i) {
    const uint64_t x = SplitMix64(key + static_cast<uint64_t>(i) * kSplitMix64Gamma);
    const float u = static_cast<float>(x >> 40);
    (*out)[i] = ((u * 0x1p-24f) * 2.0f - 1.0f) * p.grad_scale;
  }
}

std::string Base64(const void* data, size_t n) {
  static const char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const auto* b = static_cast<const uint8_t*>(data);
  std::string s;
  s.reserve((n + 2) / 3 * 4);
  for (size_t i = 0; i < n; i += 3) {
    const uint32_t v = (static_cast<uint32_t>(b[i]) << 16) | (i + 1 < n ? static_cast<uint32_t>(b[i + 1]) << 8 : 0) |
                       (i + 2 < n ? static_cast<uint32_t>(b[i + 2]) : 0);
    s += kAlphabet[(v >> 18) & 63];
    s += kAlphabet[(v >> 12) & 63];
    s += i + 1 < n ? kAlphabet[(v >> 6) & 63] : '=';
    s += i + 2 < n ? kAlphabet[v & 63] : '=';
  }
  return s;
}

// float32 little-endian (x86-64: the native layout).
std::string FloatsBase64(const std::vector<float>& v) { return Base64(v.data(), v.size() * sizeof(float)); }

// A JSON number, or a string for non-finite values ("inf", "-inf", "nan"; JSON has none).
json Number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

Status WriteGrad(Engine* engine, Device* device, DType dtype, int index, const std::vector<float>& g, float f) {
  ZERO_ASSIGN_OR_RETURN(void* ptr, engine->grad_buffer(index));
  std::vector<uint8_t> host(g.size() * SizeOf(dtype));
  for (size_t i = 0; i < g.size(); ++i) StoreFromFloat(host.data(), dtype, i, g[i] * f);
  ZERO_RETURN_IF_ERROR(device->Copy(ptr, host.data(), host.size(), CopyKind::kHostToDevice, nullptr));
  ZERO_RETURN_IF_ERROR(device->SynchronizeStream(nullptr));
  return engine->GradReady(index);
}

Status RunCell(const json& cell, const std::vector<ParamInfo>& params, Device* device, Communicator* comm, json* out) {
  const std::string name = cell.at("name").get<std::string>();
  ParseOptions po;
  po.world_size = 1;
  po.source = name + ".config";
  ZERO_ASSIGN_OR_RETURN(Config config, ParseConfig(cell.at("config").dump(), po));
  const DType dtype = config.model_dtype();
  const bool managed = config.managed_gradient_accumulation;
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(config, device, comm));
  for (size_t i = 0; i < params.size(); ++i) {
    ZERO_ASSIGN_OR_RETURN(int index, engine->RegisterParameter(params[i].spec));
    if (index != static_cast<int>(i)) {
      return InternalError("RegisterParameter(" + params[i].spec.name + ") returned " + std::to_string(index) +
                           ", expected " + std::to_string(i));
    }
  }
  ZERO_RETURN_IF_ERROR(engine->Initialize([&](int index, float* v) { InitValues(params[index], index, v); }));
  // Modules in first-use order, each with its parameters in registration order.
  std::vector<std::string> modules;
  std::vector<std::vector<int>> module_params;
  for (size_t i = 0; i < params.size(); ++i) {
    size_t m = 0;
    while (m < modules.size() && modules[m] != params[i].spec.module) ++m;
    if (m == modules.size()) {
      modules.push_back(params[i].spec.module);
      module_params.emplace_back();
    }
    module_params[m].push_back(static_cast<int>(i));
  }

  json steps = json::array();
  const json& windows = cell.at("windows");
  for (size_t s = 0; s < windows.size(); ++s) {
    json rec;
    rec["lr"] = Number(engine->lr());
    rec["loss_scale"] = Number(engine->loss_scale());
    const json& micros = windows[s].at("micros");
    for (size_t j = 0; j < micros.size(); ++j) {
      const json& micro = micros[j];
      std::vector<bool> active(params.size(), false);
      for (int p : micro.at("params").get<std::vector<int>>()) {
        if (p < 0 || p >= static_cast<int>(params.size())) {
          return InvalidArgumentError(name + ": window " + std::to_string(s) + " micro " + std::to_string(j) +
                                      ": parameter index " + std::to_string(p) + " out of range");
        }
        active[p] = true;
      }
      const int divisor = micro.value("divisor", 1);
      const bool overflow = micro.value("overflow", false);
      // The factor the user multiplies into G (engine.h's gradient_scale()), averaged by hand over
      // the window's backward calls in unmanaged mode (fp32 division, as the loss / n of the
      // DeepSpeed side).
      float f = engine->gradient_scale();
      if (divisor != 1) f = f / static_cast<float>(divisor);
      // Backward: modules in reverse order, each gathered (stage 3), its active parameters'
      // gradients written in reverse registration order.
      for (size_t m = modules.size(); m-- > 0;) {
        bool any = false;
        for (int p : module_params[m]) any = any || active[p];
        if (!any) continue;
        ZERO_ASSIGN_OR_RETURN(ModuleHandle h, engine->GatherModule(modules[m]));
        for (auto it = module_params[m].rbegin(); it != module_params[m].rend(); ++it) {
          const int p = *it;
          if (!active[p]) continue;
          std::vector<float> g;
          GradValues(params[p], static_cast<int>(s), static_cast<int>(j), p, &g);
          if (overflow && p == 0) g[0] = std::numeric_limits<float>::infinity();
          ZERO_RETURN_IF_ERROR(WriteGrad(engine.get(), device, dtype, p, g, f));
        }
        ZERO_RETURN_IF_ERROR(h.Release());
      }
      ZERO_RETURN_IF_ERROR(engine->Backward());
      if (managed) ZERO_RETURN_IF_ERROR(engine->Step());
    }
    if (!managed) ZERO_RETURN_IF_ERROR(engine->Step());
    rec["applied"] = engine->was_step_applied();
    rec["skipped_steps"] = engine->counters().skipped_steps;
    rec["global_steps"] = engine->counters().global_steps;
    rec["grad_norm"] = Number(engine->global_grad_norm());
    rec["loss_scale_after"] = Number(engine->loss_scale());
    steps.push_back(rec);
  }
  (*out)["steps"] = steps;

  json fin = json::object();
  for (const char* k : {"init", "master", "exp_avg", "exp_avg_sq", "model"}) fin[k] = json::array();
  for (size_t i = 0; i < params.size(); ++i) {
    const size_t n = params[i].numel;
    std::vector<float> init(n), master(n), m(n), v(n), model(n);
    InitValues(params[i], static_cast<int>(i), init.data());
    ZERO_RETURN_IF_ERROR(engine->GatherMasterWeights(static_cast<int>(i), master.data()));
    ZERO_RETURN_IF_ERROR(engine->GatherOptimizerState(static_cast<int>(i), m.data(), v.data()));
    ZERO_RETURN_IF_ERROR(engine->GatherModelParam(static_cast<int>(i), model.data()));
    fin["init"].push_back(FloatsBase64(init));
    fin["master"].push_back(FloatsBase64(master));
    fin["exp_avg"].push_back(FloatsBase64(m));
    fin["exp_avg_sq"].push_back(FloatsBase64(v));
    fin["model"].push_back(FloatsBase64(model));
  }
  (*out)["final"] = fin;
  return OkStatus();
}

Result<std::string> ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return NotFoundError("cannot open cells file " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int Main(int argc, char** argv) {
  std::string cells_path, out_dir, device_name = "cpu", filter;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](std::string* dst) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "zero_parity: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      *dst = argv[++i];
    };
    if (a == "--cells") {
      value(&cells_path);
    } else if (a == "--out") {
      value(&out_dir);
    } else if (a == "--device") {
      value(&device_name);
    } else if (a == "--filter") {
      value(&filter);
    } else {
      std::fprintf(stderr, "zero_parity: unknown flag %s (expected --cells, --out, --device, --filter)\n", a.c_str());
      return 2;
    }
  }
  if (cells_path.empty() || out_dir.empty()) {
    std::fprintf(stderr, "usage: zero_parity --cells CELLS.json --out DIR [--device cpu|cuda] [--filter S]\n");
    return 2;
  }
  if (device_name != "cpu" && device_name != "cuda") {
    std::fprintf(stderr, "zero_parity: --device %s: expected cpu or cuda\n", device_name.c_str());
    return 2;
  }
  Result<std::string> text = ReadFile(cells_path);
  if (!text.ok()) {
    std::fprintf(stderr, "zero_parity: %s\n", text.status().ToString().c_str());
    return 1;
  }
  json doc;
  try {
    doc = json::parse(*text);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero_parity: %s is not valid JSON: %s\n", cells_path.c_str(), e.what());
    return 1;
  }
  std::vector<ParamInfo> params;
  for (const json& p : doc.at("model")) {
    ParamInfo info;
    info.spec.name = p.at("name").get<std::string>();
    info.spec.shape = p.at("shape").get<std::vector<int64_t>>();
    info.spec.module = p.at("module").get<std::string>();
    info.init_scale = p.at("init_scale").get<float>();
    info.grad_scale = p.at("grad_scale").get<float>();
    for (int64_t d : info.spec.shape) info.numel *= d;
    params.push_back(info);
  }

  Result<std::unique_ptr<Device>> device = CreateDevice(device_name == "cpu" ? "cpu" : "cuda:0");
  if (!device.ok()) {
    std::fprintf(stderr, "zero_parity: device %s: %s\n", device_name.c_str(), device.status().ToString().c_str());
    return 1;
  }
  RendezvousOptions ro;
  ro.prefix = "zero_parity";
  Result<std::unique_ptr<Communicator>> comm =
      CreateCommunicator(device_name == "cpu" ? "gloo" : "nccl", device->get(), ro);
  if (!comm.ok()) {
    std::fprintf(stderr, "zero_parity: communicator: %s\n", comm.status().ToString().c_str());
    return 1;
  }

  int ran = 0, failed = 0;
  for (const json& cell : doc.at("cells")) {
    const std::string name = cell.at("name").get<std::string>();
    if (!filter.empty() && name.find(filter) == std::string::npos) continue;
    json out;
    out["name"] = name;
    out["side"] = "zero";
    out["device"] = (*device)->name();
    Status st;
    try {
      st = RunCell(cell, params, device->get(), comm->get(), &out);
    } catch (const std::exception& e) {
      st = InvalidArgumentError(name + ": malformed cell: " + e.what());
    }
    ++ran;
    if (!st.ok()) {
      ++failed;
      out["error"] = st.ToString();
      out.erase("final");
    }
    std::printf("%-44s %s\n", name.c_str(), st.ok() ? "ok" : st.ToString().c_str());
    std::fflush(stdout);
    const std::string path = out_dir + "/" + name + ".zero.json";
    std::ofstream f(path);
    f << out.dump() << "\n";
    if (!f) {
      std::fprintf(stderr, "zero_parity: cannot write %s\n", path.c_str());
      return 1;
    }
  }
  std::printf("zero_parity: %d cells, %d failed\n", ran, failed);
  if (ran == 0) {
    std::fprintf(stderr, "zero_parity: no cell matched --filter '%s'\n", filter.c_str());
    return 1;
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace
}  // namespace zero::parity

int main(int argc, char** argv) { return zero::parity::Main(argc, argv); }
