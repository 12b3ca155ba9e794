// Engine: the user's handle on ZeRO training (DeepSpeed's engine, for C++ training loops).
//
// The Engine owns every piece of training state of the parameters registered with it: the model
// parameters in the model dtype (full, or this rank's shard at stage 3), the fp32 master weights,
// the AdamW moments, the gradient accumulators and reduction buckets, the loss scaler, the LR
// scheduler and the step counters. It does not own the Device or the Communicator it is given
// (they must outlive it), nor the user's activations.
//
// Lifecycle (every rank makes the same calls in the same order; all calls below are collective
// unless marked local):
//   auto engine = Engine::Create(config, device, comm);
//   for each parameter: engine->RegisterParameter({name, shape, module});         (local)
//   engine->Initialize(init);       // init(index, float* host) fills full fp32 values, same on all ranks
//   loop:
//     forward:  { auto h = engine->GatherModule("block0"); use engine->param(i) ... }  // h releases
//     backward: per parameter, write its gradient into engine->grad_buffer(i), then GradReady(i);
//               engine->Backward();  // ends this micro step's backward
//     engine->Step();               // optimizer step at the accumulation boundary
//   between windows: engine->SaveCheckpoint(dir); after Initialize(): engine->LoadCheckpoint(dir)
//     (any world size and stage; docs/checkpoints.md)
//
// What each stage keeps on a rank, how gradients are reduced and parameters gathered, the
// arithmetic contract the equivalence suite checks bitwise, the update in backward and the modes
// (collective shapes, accumulation, ranks reporting different parameters): docs/zero.md. Offload:
// docs/offload.md and docs/nvme.md; accumulation windows: docs/accumulation.md.
//
// Threading: an Engine is used from one thread. Errors: every call returns a Status naming the
// parameter, module, key or rank at fault; after a communication error the engine is unusable.
// One rank's fault reaches every rank: an error that makes the engine unusable on one rank only (a
// swap file's read in a stage-3 gather, a device error in GradReady or Step, a state read in
// SaveCheckpoint, LoadCheckpoint's install), and an error of the user's own forward or backward
// given to ReportFault, is reported through Communicator::ReportFault. With a communicator from
// CreateCommunicator over a TcpStore, every other rank's collective in progress, or its next one,
// then fails within milliseconds with kUnavailable "rank R failed: <R's error>" (instead of after
// the communicator's timeout), while rank R returns its own error. Errors every rank returns at the
// same call (a non-finite norm, a failed optimizer update agreed on with offload, a late gradient
// report, initial values that differ, a failed collective checkpoint save or load) are not
// reported: every rank already knows. A checkpoint save interrupted this way publishes nothing
// (the tag and `latest` stay as they were; checkpoint.h).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "engine/config/config.h"
#include "nvme/aio_engine.h"
#include "runtime/device.h"
#include "runtime/file_system.h"
#include "runtime/status.h"
#include "zero/loss_scaler.h"

namespace zero {

struct ParamSpec {
  std::string name;            // unique, e.g. "block0.fc1.weight"
  std::vector<int64_t> shape;  // numel = product; scalars have shape {}
  std::string module;          // unit of stage-3 gathering, e.g. "block0"
};

class Engine;

// Scoped gather of one module's parameters (stage 3); a no-op handle at stages 0-2. Releases on
// destruction (or Release()). Move-only. Must not outlive the Engine.
class ModuleHandle {
 public:
  ModuleHandle() = default;
  ModuleHandle(Engine* engine, int module_id) : engine_(engine), module_id_(module_id) {}
  ~ModuleHandle();
  ModuleHandle(ModuleHandle&& o) noexcept;
  ModuleHandle& operator=(ModuleHandle&& o) noexcept;
  ModuleHandle(const ModuleHandle&) = delete;
  ModuleHandle& operator=(const ModuleHandle&) = delete;
  Status Release();

 private:
  Engine* engine_ = nullptr;
  int module_id_ = -1;
};

// Per-rank memory held by the engine, in bytes of device memory (for tests and logs).
struct EngineMemory {
  size_t model_params = 0;   // model-dtype parameters resident (full, or shards + gathered at stage 3,
                             // with the stage-3 all-gather staging buffers)
  size_t master_params = 0;  // fp32 master weights
  size_t optimizer_states = 0;
  size_t gradients = 0;              // accumulators + reduction buckets + gradient buffers handed out
                                     // (+ the host gradient partition's device staging slots)
  size_t gradient_accumulators = 0;  // of `gradients`: the fp32 accumulators / gradient partition
  size_t device_peak = 0;            // Device::memory_stats().peak
  // Offloaded optimizer states (not device memory): host bytes (pinned slabs: states, buffers, the
  // host model copy) and bytes of NVMe swap files.
  size_t host_states = 0;
  size_t nvme_states = 0;
  // offload_param.device "cpu" (stage 3): host bytes of this rank's model-dtype shards (one slab);
  // model_params then holds no shards, only the gathered buffers and the store's device scratch.
  size_t host_params = 0;
  // Host bytes of the fp32 gradient partition (optimizer offload "cpu": pinned, with its staging
  // slots; zero/grad_partition.h). With offload_grad_accumulation "gpu" the device sum (4 bytes per
  // partition element) is in gradient_accumulators.
  size_t host_gradients = 0;
  // Of `gradients`: the reduction buckets' staging buffers (held for reuse). 0 with
  // contiguous_gradients false (unless communication_data_type differs from the model dtype,
  // which needs a conversion buffer per reduction in flight). 0 with one rank (nothing is
  // reduced), unless communication_data_type is 16-bit and differs from the model dtype (a
  // rounding conversion, still made).
  size_t bucket_staging = 0;
  // Stages 1/2: all-gather bucket buffers held for reuse (not in the fields above; CUDA keeps up to
  // two of the largest bucket, the CPU backend frees them after each step).
  size_t allgather_staging = 0;
  // Device memory the model holds outside the engine's buffers, in runtime/device_arena.h arenas on
  // the engine's device (counted in device_peak too): what its forward keeps for backward
  // ("activations") and its scratch ("workspace"), as allocated when memory() is called.
  size_t activations = 0;
  size_t workspace = 0;
};

// Debug counters of the collectives the engine issued since creation (tests and logs; not saved in
// checkpoints). With one rank no collective is issued and all stay 0.
struct EngineStats {
  // Gradient reductions (reduce-scatter or all-reduce): one per bucket, or one per parameter with
  // contiguous_gradients false (stages 0/1: at the boundary; stages 2/3: every micro step).
  int64_t gradient_collectives = 0;
  // Stages 1/2: all-gathers of updated parameters (one per allgather bucket, at every applied step
  // and at LoadCheckpoint). Stage 3's gathers are counted in param_allgathers.
  int64_t weight_allgathers = 0;
  // Stage 3: the parameter coordinator's all-gathers. Each gather is coalesced into one collective:
  // a GatherModule of a module with k parameters to gather, one prefetch step (one or several
  // modules, at most stage3_prefetch_bucket_size elements), the re-gather of held modules after
  // Step().
  int64_t param_allgathers = 0;
  // Stage 3 with offload_param: host->device shard uploads the coordinator made (one per flight that
  // needed host shards) and their bytes (the PCIe traffic of parameter offload).
  int64_t param_uploads = 0;
  int64_t param_uploaded_bytes = 0;
};

// The step counters (saved in checkpoints and restored by LoadCheckpoint).
struct EngineCounters {
  int64_t global_steps = 0;   // optimizer steps applied or skipped (DeepSpeed's global_steps)
  int64_t skipped_steps = 0;  // fp16 overflow skips
  int64_t micro_steps = 0;    // Backward() calls since creation
  int64_t adam_step = 0;      // t of the last applied AdamW update
};

// What an Engine takes from its environment besides the config (leveldb's Options::env): the
// default is the real thing. Tests pass fault-injecting pieces here; the Config stays a plain value.
struct EngineEnv {
  // Makes the aio engine of offload_optimizer.device "nvme" (empty: LibaioEngine). Called once per
  // rank at Initialize with the `aio` block's options.
  AioEngineFactory aio_engine_factory;
  // Receives the wall_clock_breakdown line (rank 0 only, every steps_per_print optimizer steps;
  // docs/timeline.md). Empty: printed to stdout.
  std::function<void(const std::string& line)> log_sink;
  // Every file operation of SaveCheckpoint / LoadCheckpoint (engine/checkpoint/checkpoint.h) and the NVMe swap
  // files' creation, preallocation and removal; a test's FaultyFileSystem fails chosen calls or ends
  // the process at the save's crash points.
  FileSystem* file_system = nullptr;  // null: the POSIX one
};

class Engine {
 public:
  static Result<std::unique_ptr<Engine>> Create(const Config& config, Device* device, Communicator* comm,
                                                const EngineEnv& env = {});
  ~Engine();

  // --- set-up --------------------------------------------------------------------------------
  // Local. Returns the parameter's index (0, 1, ... in registration order). Names must be unique.
  Result<int> RegisterParameter(const ParamSpec& spec);
  // Allocates and partitions everything; init(index, values) writes the parameter's full fp32
  // initial values into `values` (host memory, numel floats, zeroed before the call) and must give
  // the same values on every rank (checked with several ranks: a 52-bit hash of each parameter's
  // values, taken over 64-bit words, is compared across ranks, and an error names the first
  // parameter that differs; with one rank nothing is hashed or compared).
  Status Initialize(const std::function<void(int index, float* values)>& init);
  // Initialize for values read from files (a Hugging Face checkpoint): read(index, begin, count,
  // values) writes elements [begin, begin + count) of parameter `index` (fp32) into values[0, count)
  // and returns an error naming what it could not read (Initialize then fails with it). At stage 3
  // with several ranks only this rank's shard of each parameter is asked for, so a rank reads only
  // its partition; otherwise the whole parameter (begin 0, count numel). Ranks are not compared:
  // every rank must read the same files.
  Status InitializeFromSlices(
      const std::function<Status(int index, int64_t begin, int64_t count, float* values)>& read);

  // --- forward -------------------------------------------------------------------------------
  Result<ModuleHandle> GatherModule(const std::string& module);
  // With overlap_step, while a step is in flight, param() of a parameter whose module was not
  // gathered since that Step() is FailedPrecondition (at every stage: GatherModule is what makes
  // the compute stream wait for the parameter's chunks).
  // Device pointer to parameter `index` in the model dtype, full shape. Local. Valid while the
  // parameter is gathered (stages 0-2: always, until the next Step() rewrites it in place; stage 3
  // with one rank: it points at the rank's own shard, which is the whole parameter, and Step()
  // rewrites it in place too; with offload_param "cpu" at a gathered copy, re-gathered at Step()).
  Result<const void*> param(int index) const;

  // --- backward ------------------------------------------------------------------------------
  // Local. Device buffer (model dtype, full shape) for parameter `index`'s gradient of this
  // micro step. The user overwrites it (not accumulates), then calls GradReady(index). With
  // contiguous_gradients false at stages 2/3 the buffer is longer (n_pad elements, possibly
  // followed by a receive area): the user writes the first numel elements, the rest is the
  // engine's (zero padding, reduced in place).
  Result<void*> grad_buffer(int index);
  // The gradient is written: it is queued for accumulation/reduction and the buffer must not be
  // touched again. Reporting a parameter twice in one backward is an error naming it. Ranks may
  // report different parameters in different orders; at stage 3 with several ranks a module's
  // gradients must be reported before the gather that follows its release (or by every rank only
  // after its last gather), else Backward() fails on every rank naming the late one (docs/zero.md,
  // "Ranks that use different parameters").
  Status GradReady(int index);
  // Ends the current micro step's backward: flushes partial buckets, waits for this micro step's
  // reductions, advances micro_steps. Parameters not reported received no gradient (treated as zero
  // in managed mode; not active in unmanaged mode).
  Status Backward();

  // --- step ----------------------------------------------------------------------------------
  // True when the next Backward() is (managed) / the next Step() is (unmanaged) a boundary.
  bool is_gradient_accumulation_boundary() const;
  // With stop_on_nonfinite (the default), a NaN or inf global gradient norm on a step that would be
  // applied is FAILED_PRECONDITION naming the step, and the engine is unusable afterwards.
  Status Step();
  bool was_step_applied() const;  // false off-boundary or on fp16 overflow
  // Unscaled global norm of the last boundary (-1 if none; +Inf after an fp16 overflow); a plain
  // read, valid when Step() returns. When neither fp16 (overflow check) nor gradient_clipping needs the norm before
  // AdamW, Step() enqueues its sums of squares, then AdamW and the weight publication, and only then waits (once) for
  // the norm at its end; otherwise it waits for it before AdamW. Same value either way.
  double global_grad_norm() const;
  float loss_scale() const;  // current loss scale (1 without fp16)
  // The factor the user multiplies into every gradient written to grad_buffer() (as a PyTorch
  // user multiplies it into the loss before backward): loss_scale() / gradient_accumulation_steps
  // in managed mode (DeepSpeed's engine.backward divides the loss by GAS before scaling it, so the
  // fp16 gradients checked for overflow are GAS times smaller and the dynamic scale follows
  // DeepSpeed's trajectory), loss_scale() in unmanaged mode (the user divides by what they like).
  // The engine itself then divides by the loss scale only; gradients still accumulate in fp32.
  float gradient_scale() const;
  double lr() const;  // lr the next applied step will use
  // Stage 0/1 only: while on, Step() at a boundary is refused (no_sync must end before the boundary).
  Status SetNoSync(bool on);
  // Drops accumulated gradients of the current window. Refused after a Backward() whose update
  // already ran in backward (docs/zero.md, "Update in backward").
  Status ZeroGrad();
  // zero_optimization.offload_optimizer.overlap_step (docs/offload.md, "Overlap with the next
  // forward"): Step() queues only the first chunks of the streamed GPU update and returns; the rest
  // are queued as the next forward's GatherModule reaches their modules. This completes the step:
  // every chunk left is queued and the host waits until all of them have run (host states final,
  // the model copy written). At once when no step is in flight (or without overlap_step). Called
  // first by every call that reads or writes parameters or states outside the forward:
  // SaveCheckpoint, LoadCheckpoint, GatherMasterWeights, GatherModelParam, GatherOptimizerState,
  // ZeroGrad and the destructor. The next backward's first grad_buffer()/GradReady() and the next
  // Step() queue what is left and order the compute stream after it without a host wait.
  Status WaitForOptimizerStep();

  // Local. For the user's own failures between engine calls (an error in the forward or the backward
  // on this rank): makes the engine unusable and tells the other ranks (see Errors above), so that
  // they stop within seconds naming this rank and `error` instead of waiting in their next
  // collective for the communicator's timeout. Returns `error`. REQUIRES: !error.ok().
  Status ReportFault(Status error);

  const Config& config() const;
  const EngineCounters& counters() const;
  int num_params() const;
  const ParamSpec& param_spec(int index) const;
  EngineMemory memory() const;
  EngineStats stats() const;
  // wall_clock_breakdown: the mean per optimizer step (ms) of each of forward, backward, step,
  // communication and offload that had time in the last printed window (every rank; empty before
  // the first window or without wall_clock_breakdown). Local.
  std::map<std::string, double> wall_clock_breakdown() const;

  // --- state access (collective; tests, checkpoints, consolidation) ---------------------------
  // Full fp32 master weights of parameter `index` into host `out` (numel floats), on every rank.
  Status GatherMasterWeights(int index, float* out);
  // Full model-dtype parameter `index` as float into host `out`, on every rank.
  Status GatherModelParam(int index, float* out);
  // Full fp32 AdamW moments of parameter `index` into host `exp_avg` and `exp_avg_sq` (numel
  // floats each, both non-null), on every rank.
  Status GatherOptimizerState(int index, float* exp_avg, float* exp_avg_sq);

  // --- checkpoints (collective; engine/checkpoint/checkpoint.h, docs/checkpoints.md) ----------------------
  // Saves <dir>/<tag> (tag "": DefaultTag(global_steps), "global_step<N>") and then <dir>/latest:
  // this rank's fp32 master weights and AdamW moments (its partition; stage 0 writes the same
  // slice of its full copy, so every stage writes the same files), the counters, the loss scaler,
  // the scheduler position, the model dtype, stage, world size, the resolved config and
  // `client_state_json` (the caller's own JSON, "" for {}; rank 0's copy is the one kept). Every
  // rank must call it at the same point: called on some ranks only, the callers fail after the
  // communicator's timeout (DEADLINE_EXCEEDED/UNAVAILABLE, "not every rank joined the save") and
  // nothing is written. Refused (FAILED_PRECONDITION, nothing written) inside a gradient
  // accumulation window, i.e. after a Backward() whose window has not been closed by Step(),
  // since accumulated gradients are not saved. The training state is not changed; an I/O error
  // does not make the engine unusable.
  Status SaveCheckpoint(const std::string& dir, const std::string& tag = "", const std::string& client_state_json = "");
  // After Initialize(), every rank: loads <dir>/<tag> (tag "": the tag in <dir>/latest) saved at
  // any stage and data-parallel world size into this engine's partitions, re-derives the model
  // parameters (cast to the model dtype; gathered at stages 0-2; stage 3 drops every gathered
  // and persistent buffer, so they are re-gathered from the new shards), and restores the counters,
  // the loss scaler (when both this config and the checkpoint use a dynamic fp16 scale) and the
  // scheduler position (the lr follows the applied-step count). Returns the saved client state
  // (JSON text, re-serialized compactly). The parameters must match by name and shape (errors list
  // each difference); the model dtype may differ (masters are fp32). Refused like
  // SaveCheckpoint inside an accumulation window. Errors found before any state changed (missing,
  // corrupt or mismatched checkpoints) leave the engine as it was; a failure while installing the
  // state makes it unusable.
  Result<std::string> LoadCheckpoint(const std::string& dir, const std::string& tag = "");

  struct Impl;

 private:
  friend class ModuleHandle;
  explicit Engine(std::unique_ptr<Impl> impl);
  Status ReleaseModule(int module_id);
  Status InitializeWith(const std::function<Status(int, int64_t, int64_t, float*)>& fill, bool partition_reads);
  std::unique_ptr<Impl> impl_;
};

// The loss scaler a config asks for: static (fp16.loss_scale > 0), dynamic (fp16 with loss_scale 0)
// or none (scale 1, without fp16). The Engine and the equivalence reference both build theirs here.
Result<LossScaler> CreateLossScaler(const Config& config);

}  // namespace zero
