// ParamCoordinator: stage 3's gathering of partitioned model parameters, module by module.
//
// Owns the full (gathered) parameter buffers, the in-flight all-gathers and the module trace. It
// does not own the shards it gathers from (the engine's partition buffer: their contents change
// only between QuiesceForUpdate() and AfterUpdate()), nor the Device/Communicator.
//
// Acquire(m) (GatherModule) gathers every parameter of module m that is not resident: a full
// buffer of n_pad elements (model dtype) from the pool and one AllGather of the ranks' shards into
// it, issued with `after` = the compute stream; then the compute stream waits for those gathers
// (never the host on CUDA). Modules are reference counted; Release(m) at count 0 frees the
// module's non-persistent parameters, unless the module is used again soon (see below).
// Persistent parameters (numel <= stage3_param_persistence_threshold) are gathered on first use
// after each optimizer step and then kept; they are not counted as live.
//
// Trace and prefetch: the sequence of Acquire calls of one micro step (from one EndMicroStep to
// the next; forward then backward) is recorded during the first micro step. In later micro steps,
// after serving the demand at trace position i, the coordinator issues the gathers of the modules
// at positions i+1, i+2, ... while the elements they need stay within prefetch_bucket_numel and
// the live elements (non-persistent parameters gathered or in flight) within max_live_numel. A
// demanded module waits only for its own gathers. A module whose count drops to 0 stays gathered
// if the trace uses it again within max_reuse_distance elements (of the modules in between) and
// the live limit holds. A call that departs from the trace invalidates it: no prefetching for the
// rest of that micro step, and the next micro step is recorded as the new trace.
//
// Live limit: prefetches and kept modules never make live elements exceed max_live_numel. A
// demanded gather first evicts unheld gathered modules (the one used farthest ahead first); if the
// modules held by the user plus the demanded one still exceed the limit, the gather proceeds
// anyway (the model needs it), so the bound is max(max_live, held + one module).
//
// Every rank must make the same calls in the same order (gathers are matched by order); the
// coordinator's decisions depend only on those calls, so they are the same on every rank.
// After an error the coordinator is unusable. Thread safety: none.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/status.h"
#include "zero/buffer_pool.h"

namespace zero {

struct CoordinatedParam {
  std::string name;
  int64_t numel = 0;
  int64_t padded = 0;  // n_pad
  int64_t shard = 0;   // n_pad / N
  const void* shard_data = nullptr;  // this rank's shard (model dtype, device memory)
  int module = -1;
  bool persistent = false;
};

struct ParamCoordinatorOptions {
  int64_t prefetch_bucket_numel = 50000000;
  int64_t max_live_numel = 1000000000;
  int64_t max_reuse_distance = 1000000000;
  // Free full buffers kept for reuse (BufferPool cap); 0 returns memory on release.
  size_t pool_free_bytes = 0;
};

struct ParamCoordinatorStats {
  int64_t gathers = 0;             // all-gathers issued (one per parameter gathered)
  int64_t prefetched_modules = 0;  // modules whose gathers were issued ahead of demand
  int64_t prefetch_hits = 0;       // demands served (partly) by a prefetch
  int64_t kept_modules = 0;        // releases that kept the module for reuse
  int64_t evicted_modules = 0;     // unheld modules freed to make room for a demand
  int64_t trace_invalidations = 0;
  int64_t max_live_numel_seen = 0;  // high-water mark of live elements
};

class ParamCoordinator {
 public:
  ParamCoordinator(Device* device, Communicator* comm, Stream* compute, DType dtype,
                   std::vector<CoordinatedParam> params, std::vector<std::string> module_names,
                   const ParamCoordinatorOptions& options);
  ~ParamCoordinator();
  ParamCoordinator(const ParamCoordinator&) = delete;
  ParamCoordinator& operator=(const ParamCoordinator&) = delete;

  // Gathers module m (collective), increments its count, then prefetches along the trace.
  Status Acquire(int module);
  // Decrements m's count; at 0 frees or keeps its parameters. Local (issues no collective).
  Status Release(int module);
  // The end of a micro step's backward: adopts a recorded trace, rewinds the trace position.
  Status EndMicroStep();
  // Before the shards change: completes every gather in flight (compute-stream order).
  Status QuiesceForUpdate();
  // After the shards changed: frees unheld modules' parameters, marks persistent ones stale and
  // re-gathers the parameters of held modules (collective).
  Status AfterUpdate();

  // The full buffer of `param` if the user may read it now (its module is held, or it is a fresh
  // persistent parameter); otherwise FailedPrecondition naming the parameter and module.
  Result<const void*> Full(int param) const;

  int ref_count(int module) const { return modules_[module].ref; }
  int64_t live_numel() const { return live_numel_; }
  // Device bytes of full buffers held (gathered or in flight, persistent included, pooled free).
  size_t resident_bytes() const { return pool_.bytes(); }
  const ParamCoordinatorStats& stats() const { return stats_; }
  const std::vector<int>& trace() const { return trace_; }
  bool trace_valid() const { return trace_valid_; }

 private:
  enum class State { kReleased, kInFlight, kReady };
  struct Param {
    CoordinatedParam spec;
    State state = State::kReleased;
    bool stale = false;  // kReady persistent parameter whose shards changed since its gather
    DeviceBuffer full;
    std::unique_ptr<Work> work;
  };
  struct Module {
    std::string name;
    std::vector<int> params;
    int ref = 0;
    bool prefetched = false;  // gathers issued ahead of demand, not yet demanded
  };

  bool NeedsGather(const Param& p) const;
  // Elements module m needs gathered: all, and the non-persistent (live-counted) part.
  void NeededNumel(int module, int64_t* all, int64_t* live) const;
  Status IssueGathers(int module);
  Status WaitModule(int module);
  Status WaitParam(Param& p);
  Status FreeParam(Param& p);
  Status FreeModule(int module);
  Status Prefetch();
  Status MakeRoom(int64_t needed_live, int demanded);
  // Trace position of m's next use at or after the cursor (-1: none) and the elements of the
  // modules in between.
  int NextUse(int module, int64_t* distance) const;
  Status Fail(Status s);

  Device* device_;
  Communicator* comm_;
  Stream* compute_;
  DType dtype_;
  ParamCoordinatorOptions options_;
  std::vector<Param> params_;
  std::vector<Module> modules_;
  BufferPool pool_;
  int64_t live_numel_ = 0;

  bool recording_ = true;        // this micro step's calls become the trace
  bool record_next_ = false;     // the trace broke: record the next micro step
  bool trace_valid_ = false;
  std::vector<int> recorded_;
  std::vector<int> trace_;
  size_t cursor_ = 0;

  ParamCoordinatorStats stats_;
  Status failed_;
};

}  // namespace zero
