// The contract between a user's model code and the engine that owns its parameters and gradients.
//
// A model describes its parameters as a list of ModelParamSpec (name, shape, the module that uses it,
// how to initialize it) and never allocates or owns them. While it runs, it asks a ParamProvider
// for one module's parameters at a time (Acquire ... Release, so ZeRO stage 3 can gather a module
// just before it runs and free it after) and writes each gradient into the buffer a GradSink hands
// out, telling the sink as soon as that gradient is final (so reduction overlaps the rest of
// backward). Views are plain pointers plus a dtype: host pointers for the CPU model, device pointers
// for the CUDA model. This header also has the deterministic initializer every rank runs (the same
// values on every rank, for any slice of a tensor) and two trivial implementations of the
// interfaces for code that keeps every tensor resident (stages 0-2, tests, demos), plus an owning
// host tensor set for tests and demos. It must not touch engine internals: the engine adapts to it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/status.h"

namespace zero::examples {

enum class InitKind { kNormal, kZeros, kOnes };

// One parameter as the model declares it: the engine's zero::ParamSpec (name, shape, module) plus how
// to initialize it.
struct ModelParamSpec {
  std::string name;            // unique, e.g. "block0.fc1.weight"
  std::vector<int64_t> shape;  // row-major; a linear layer's weight is [in, out]
  std::string module;          // the unit that is acquired/released together, e.g. "block0"
  InitKind init = InitKind::kNormal;
  float init_std = 0.0f;  // kNormal only

  int64_t numel() const;
};

// Modules in forward order, each with the indices (into the ModelParamSpec list) of its parameters, in
// list order. Every parameter belongs to exactly one module.
struct ModuleSpec {
  std::string name;
  std::vector<int> params;
};
std::vector<ModuleSpec> GroupByModule(const std::vector<ModelParamSpec>& specs);

int64_t TotalNumel(const std::vector<ModelParamSpec>& specs);

// Fills out[0, count) with elements [begin, begin + count) of parameter `spec` for `seed`. Each
// element is a pure function of (seed, spec.name, element index), so every rank produces the same
// values and a rank may initialize only its own partition. Slices of more than 2^21 elements are
// filled by several threads (up to hardware_concurrency, 32 at most): the same values. REQUIRES:
// begin + count <= numel.
void InitParamSlice(const ModelParamSpec& spec, uint64_t seed, int64_t begin, int64_t count, float* out);
std::vector<float> InitParam(const ModelParamSpec& spec, uint64_t seed);

struct ParamView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
};

struct GradView {
  void* data = nullptr;
  DType dtype = DType::kF32;
};

// Supplies parameter tensors one module at a time.
//
// Acquire(module) returns one view per parameter of the module, in the order of ModuleSpec::params.
// The views stay valid until the matching Release(module). The model acquires each module once in
// forward (forward order) and once in backward (reverse order), holds at most one module at a time,
// and always releases what it acquired, also when it returns an error after a successful Acquire.
// CUDA models: the data must be ready for work enqueued on the model's stream after Acquire returns
// (the provider makes that stream wait for its gather); Release is called after the last work that
// reads the module is enqueued, so the provider must not reuse the memory before the stream passes
// that point (record an event on the model's stream in Release).
class ParamProvider {
 public:
  virtual ~ParamProvider() = default;
  virtual Result<std::vector<ParamView>> Acquire(const std::string& module) = 0;
  virtual Status Release(const std::string& module) = 0;
};

// Receives gradients. For every parameter, once per Backward: GradBuffer(i) returns where to write
// gradient i (numel elements of the view's dtype, which need not be the parameter's dtype); the
// model overwrites it (never accumulates) and then calls GradReady(i), after which it never touches
// that buffer again in this Backward. CUDA models: "ready" means the writes are enqueued on the
// model's stream; the sink records an event there before reducing.
class GradSink {
 public:
  virtual ~GradSink() = default;
  virtual Result<GradView> GradBuffer(int param_index) = 0;
  virtual Status GradReady(int param_index) = 0;
};

// Acquire ... Release of one module that releases on every path: the destructor releases (ignoring
// the error) if Close() was not called; Close() releases and reports the error.
class ModuleScope {
 public:
  ModuleScope(ParamProvider& provider, std::string module) : provider_(provider), module_(std::move(module)) {}
  ~ModuleScope();
  ModuleScope(const ModuleScope&) = delete;
  ModuleScope& operator=(const ModuleScope&) = delete;

  Result<std::vector<ParamView>> Acquire();
  Status Close();

 private:
  ParamProvider& provider_;
  std::string module_;
  bool held_ = false;
};

// Every tensor resident: Acquire returns fixed views. Counts calls and checks balance, which tests
// read. Not thread-safe.
class ResidentParams : public ParamProvider {
 public:
  ResidentParams(const std::vector<ModelParamSpec>& specs, std::vector<ParamView> views);

  Result<std::vector<ParamView>> Acquire(const std::string& module) override;
  Status Release(const std::string& module) override;

  int acquires() const { return acquires_; }
  int releases() const { return releases_; }
  // Modules in the order they were acquired, since construction.
  const std::vector<std::string>& acquire_log() const { return acquire_log_; }
  // The number of modules acquired and not yet released.
  int held() const { return static_cast<int>(held_.size()); }
  int max_held() const { return max_held_; }

 private:
  std::vector<ModuleSpec> modules_;
  std::vector<ParamView> views_;
  std::vector<std::string> held_;
  std::vector<std::string> acquire_log_;
  int acquires_ = 0;
  int releases_ = 0;
  int max_held_ = 0;
};

// Fixed gradient buffers indexed like the ModelParamSpec list; `on_ready` (may be empty) is called from
// GradReady. Counts GradReady per parameter.
class GradBuffers : public GradSink {
 public:
  explicit GradBuffers(std::vector<GradView> views, std::function<void(int)> on_ready = {});

  Result<GradView> GradBuffer(int param_index) override;
  Status GradReady(int param_index) override;

  const std::vector<int>& ready_count() const { return ready_count_; }
  const std::vector<int>& ready_order() const { return ready_order_; }

 private:
  std::vector<GradView> views_;
  std::function<void(int)> on_ready_;
  std::vector<int> ready_count_;
  std::vector<int> ready_order_;
};

// Owning host storage for one tensor per ModelParamSpec, all of one dtype (parameters or gradients of a
// test or demo). Not used by the models themselves.
class HostTensors {
 public:
  HostTensors(const std::vector<ModelParamSpec>& specs, DType dtype);

  DType dtype() const { return dtype_; }
  int size() const { return static_cast<int>(data_.size()); }
  int64_t numel(int i) const { return numel_[i]; }
  void* data(int i) { return data_[i].data(); }
  const void* data(int i) const { return data_[i].data(); }

  float Get(int i, int64_t j) const { return LoadAsFloat(data_[i].data(), dtype_, j); }
  void Set(int i, int64_t j, float v) { StoreFromFloat(data_[i].data(), dtype_, j, v); }
  // Rounds `values` (numel(i) of them) to the dtype.
  void SetAll(int i, const std::vector<float>& values);
  std::vector<float> GetAll(int i) const;
  // Every tensor from InitParam(spec, seed), rounded to the dtype.
  void Init(const std::vector<ModelParamSpec>& specs, uint64_t seed);

  std::vector<ParamView> ParamViews() const;
  std::vector<GradView> GradViews();

 private:
  DType dtype_;
  std::vector<int64_t> numel_;
  std::vector<std::vector<uint8_t>> data_;
};

}  // namespace zero::examples
