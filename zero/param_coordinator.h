// ParamCoordinator: stage 3's gathering of partitioned model parameters, module by module.
//
// Owns the full (gathered) parameter buffers, the in-flight all-gathers and the module trace (and,
// with host shards, an upload stream). It does not own the shards it gathers from (the engine's
// partition store: their contents change only between QuiesceForUpdate() and AfterUpdate()), nor
// the Device/Communicator.
//
// Acquire(m) (GatherModule) gathers every parameter of module m that is not resident: a full
// buffer of n_pad elements (model dtype) from the pool for each, and ONE AllGather for all of them
// (see Coalescing; with one rank neither: the shard is the full parameter), issued with `after` = the compute stream;
// then the compute stream waits for that gather (never the host on CUDA). Modules are reference counted; Release(m) at
// count 0 frees the module's non-persistent parameters, unless the module is used again soon (see below). Persistent
// parameters (numel <= stage3_param_persistence_threshold) are gathered on first use after each optimizer step and then
// kept; they are not counted as live.
//
// Coalescing: every gather (a demand, a prefetch of one or several modules, the re-gather of held
// modules after an update) of parameters p1..pk is one "flight" and one collective:
//   - k >= 2 (and N >= 2): a staging buffer of N*S elements, S = sum of shard_j, from its own pool;
//     this rank's shards are packed into its segment at offsets sum_{l<j} shard_l, one in-place
//     AllGather of the segment gives [rank 0: shards of p1..pk | rank 1: ... | ...], and when the
//     flight completes each rank's shard of each parameter is copied to [r*shard_j, (r+1)*shard_j)
//     of pj's full buffer (the unpack, N*k copies on the compute stream), after which the staging
//     buffer goes back to its pool at once. The unpack cannot be avoided: param(i) must be one
//     contiguous padded buffer, and the all-gather's output interleaves the ranks' segments, so
//     for k >= 2 no placement of the full buffers inside the gathered buffer makes them
//     contiguous. The pack is k copies of this rank's shards (a copy per parameter instead of a
//     collective per parameter).
//   - k == 1: no staging: the AllGather writes straight into the full buffer (no pack, no unpack).
//   - N == 1 (device shards; for host shards see Shard source): no collective, no copy and no buffer: the one shard is
//   the whole padded parameter,
//     and Full() points at it (the caller's shard storage; it changes in place between
//     QuiesceForUpdate() and AfterUpdate()). Such parameters still count as live elements, so
//     the limits, the trace and the statistics behave as with more ranks; they hold no memory.
// Values are only moved, so the gathered parameters are bitwise what per-parameter gathers gave.
//
// Shard source (ParamCoordinatorOptions::shard_source): where this rank's shards live. kDevice
// (default): device memory, as above. kHost (offload_param.device "cpu"): pinned host memory; each
// flight first uploads the shards it needs host->device on the coordinator's upload stream (after
// an event of the compute stream, so the destination buffers are free), straight into the buffers
// the gather uses anyway: this rank's segment of the staging buffer (k >= 2; it replaces the pack),
// this rank's segment of the full buffer (k == 1; the all-gather is then in place), and with ONE
// rank into a real full buffer (Full() no longer aliases the shard: N == 1 allocates full buffers
// and counts them as resident, and a flight waits for its upload event on the compute stream). The
// collective is issued after the upload stream, so a prefetched flight's upload and collective
// overlap the compute of the modules before it. No extra device buffer exists for the uploads: they
// count against the same limits as the gathers. At most max_uploads_in_flight flights are in flight
// (prefetch stops there; a demand first completes the oldest). QuiesceForUpdate() also waits (on
// the host) for the upload stream, since the caller then rewrites the host shards.
// Module store (ParamCoordinatorOptions::module_store, with kHost; offload_param.device "nvme"):
// the host shards are not all in host memory at once. Before a flight uploads the shards of a
// module it asks the store for them (Load: blocking until they are in a host buffer; the shards of
// the module's parameters one after another in parameter order, each `shard` elements; shard_data
// is unused), enqueues that module's copies, then tells the store (Uploaded) on which stream they
// read the buffer, so the store reuses it only after them. Each time it prefetches along the
// trace (and after each demand on the trace) it also asks the store to start reading the next
// modules of the trace that are not gathered or in flight (ModuleShardStore::Prefetch, at most
// max_store_read_ahead, stopping at the first the store has no buffer for), so the disk reads run
// ahead of the gathers. The store bounds its own buffers; the coordinator never waits for one
// except inside Load.
// A flight completes as a whole (the compute stream waits for its collective, then unpacks) when
// any of its parameters is needed: a demand of one of its modules, an eviction, QuiesceForUpdate.
// The staging buffer of a flight counts as live elements (N*S) from launch to completion, so
// max_live_numel bounds gathered parameters plus staging in flight.
//
// Trace and prefetch: the sequence of Acquire calls of one micro step (from one EndMicroStep to
// the next; forward then backward) is recorded during the first micro step. In later micro steps,
// after serving the demand at trace position i, the coordinator issues the gathers of the modules
// at positions i+1, i+2, ... while the elements they need, plus those of modules already gathered
// ahead, stay within prefetch_bucket_numel (the first module ahead is gathered even when it alone
// is larger, as DeepSpeed and FSDP2 do; a bucket of 0 prefetches nothing) and the live elements
// within max_live_numel; all the modules one such step issues are one flight (so
// one collective, of at most prefetch_bucket_numel elements). A demanded module waits only for its
// own flights. A module whose count drops to 0 stays gathered
// if the trace uses it again within max_reuse_distance elements (of the modules in between) and
// the live limit holds. A call that departs from the trace invalidates it: no prefetching for the
// rest of that micro step, and the next micro step is recorded as the new trace.
//
// Live limit: live elements are the non-persistent parameters gathered or in flight plus the
// staging buffers of flights in flight. Prefetches and kept modules never make them exceed
// max_live_numel. A demanded gather that would first completes earlier flights that hold staging
// (oldest first; their collectives precede the demand's anyway), then evicts unheld gathered
// modules (the one used farthest ahead first); if the modules held by the user plus the demanded
// one (and its staging) still exceed the limit, the gather proceeds anyway (the model needs it), so
// the bound is max(max_live, held + one module + its staging); the demand's staging is freed
// right after its unpack, before Acquire returns.
//
// Every rank must make the same calls in the same order (gathers are matched by order); the
// coordinator's decisions depend only on those calls, so they are the same on every rank.
// After an error the coordinator is unusable. Thread safety: none.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/status.h"
#include "zero/buffer_pool.h"
#include "zero/trace_observer.h"

namespace zero {

struct CoordinatedParam {
  std::string name;
  int64_t numel = 0;
  int64_t padded = 0;  // n_pad
  int64_t shard = 0;   // n_pad / N
  // This rank's shard (model dtype): device memory, or host memory (pinned for speed) with
  // ShardSource::kHost.
  const void* shard_data = nullptr;
  int module = -1;
  bool persistent = false;
};

enum class ShardSource { kDevice, kHost };

// Host shards brought into host memory module by module (see "Module store" above). Implemented
// by NvmeParamStore (nvme_param_store.h). Errors are the store's (it names the file and what to
// do); the coordinator fails with them.
class ModuleShardStore {
 public:
  virtual ~ModuleShardStore() = default;
  // Host address of module m's shards (in parameter order), read in if needed (blocking). Valid
  // until the next call of any method of the store; the coordinator enqueues its copies from it
  // at once and then calls Uploaded(m, stream).
  virtual Result<const void*> Load(int module) = 0;
  // The copies from Load(m)'s memory are enqueued on `stream`: the memory is not reused before
  // the stream has passed this point.
  virtual Status Uploaded(int module, Stream* stream) = 0;
  // Starts reading module m's shards into a free host buffer without waiting for the read. true:
  // m is in host memory or being read now; false: no buffer is free for it (nothing done).
  virtual Result<bool> Prefetch(int module) = 0;
  // The shards were rewritten (QuiesceForUpdate .. AfterUpdate): write back what changed.
  virtual Status AfterWrites() = 0;
};

struct ParamCoordinatorOptions {
  ShardSource shard_source = ShardSource::kDevice;
  // kHost: flights (each with its upload) in flight at once, >= 1 (offload_param.buffer_count).
  int max_uploads_in_flight = 5;
  // kHost: when set, the shards come from this store module by module (not owned; outlives the
  // coordinator), and up to max_store_read_ahead modules are read ahead along the trace.
  ModuleShardStore* module_store = nullptr;
  int max_store_read_ahead = 4;
  int64_t prefetch_bucket_numel = 50000000;
  int64_t max_live_numel = 1000000000;
  int64_t max_reuse_distance = 1000000000;
  // Free full buffers kept for reuse (BufferPool cap); 0 returns memory on release.
  size_t pool_free_bytes = 0;
  // Free staging buffers kept for reuse (their own BufferPool's cap); 0 frees each right after its
  // unpack. ~0 keeps no more than were in flight at once, plus one (AcquireAtLeast).
  size_t staging_free_bytes = 0;
};

struct ParamCoordinatorStats {
  int64_t allgathers = 0;          // all-gather collectives issued (one per flight; 0 with one rank)
  int64_t gathered_params = 0;     // parameters gathered (one flight gathers one or more)
  int64_t prefetched_modules = 0;  // modules whose gathers were issued ahead of demand
  int64_t prefetch_hits = 0;       // demands served (partly) by a prefetch
  int64_t kept_modules = 0;        // releases that kept the module for reuse
  int64_t evicted_modules = 0;     // unheld modules freed to make room for a demand
  int64_t trace_invalidations = 0;
  int64_t max_live_numel_seen = 0;  // high-water mark of live elements (staging in flight included)
  int64_t max_staging_numel = 0;    // largest staging buffer (elements) of one flight
  // ShardSource::kHost: host->device shard copies issued, their bytes, and the most flights in
  // flight at once (<= max_uploads_in_flight).
  int64_t uploads = 0;
  int64_t uploaded_bytes = 0;
  int64_t max_uploads_in_flight_seen = 0;
  // Module store: Prefetch calls that found the module in host memory or started its read.
  int64_t store_read_aheads = 0;
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
  // Non-persistent parameters gathered or in flight, plus the staging buffers of flights in flight.
  int64_t live_numel() const { return live_numel_; }
  // Device bytes held: full buffers (gathered or in flight, persistent included, pooled free) and
  // staging buffers (in flight or pooled free). None with one rank and device shards.
  size_t resident_bytes() const { return pool_.bytes() + staging_pool_.bytes(); }
  // Of resident_bytes(): the staging buffers.
  size_t staging_bytes() const { return staging_pool_.bytes(); }
  // Flights (collectives, or world-1 copies never are) not yet completed.
  size_t flights_in_flight() const { return flights_.size(); }
  const ParamCoordinatorStats& stats() const { return stats_; }
  const std::vector<int>& trace() const { return trace_; }
  bool trace_valid() const { return trace_valid_; }
  // The per-stream trace's hook (zero/trace_observer.h; null: none): each all-gather is a span on
  // the communication track from its launch to where the compute stream waits for it, each
  // host-shard upload one on the host->device track (the upload stream).
  void set_observer(StreamObserver* o) { observer_ = o; }

 private:
  enum class State { kReleased, kInFlight, kReady };
  struct Param {
    CoordinatedParam spec;
    State state = State::kReleased;
    bool stale = false;  // kReady persistent parameter whose shards changed since its gather
    DeviceBuffer full;
    int64_t flight = -1;  // kInFlight: the flight gathering it (-1 while its flight is being built)
  };
  struct Module {
    std::string name;
    std::vector<int> params;
    int ref = 0;
    bool prefetched = false;  // gathers issued ahead of demand, not yet demanded
  };
  // One coalesced gather (see Coalescing in the file comment).
  struct Flight {
    std::vector<int> params;          // in claim order: their shards' order in a segment
    std::vector<int64_t> offset;      // of params[j] in a segment
    int64_t segment = 0;              // S = sum of shards
    int64_t staging_numel = 0;        // N*S with a staging buffer (counted live until completion), else 0
    DeviceBuffer staging;             // empty: in place (one parameter)
    std::unique_ptr<Work> work;       // null: nothing to wait for
    std::unique_ptr<Event> uploaded;  // host shards, one rank: recorded after the uploads
    StreamObserver::SpanId span = 0;  // the all-gather's trace span
  };
  // What gathering a module would take: the padded elements of its parameters that need a gather,
  // the non-persistent (live-counted) part of those, and how many parameters they are.
  struct Need {
    int64_t all = 0;
    int64_t live = 0;
    int64_t count = 0;
  };

  bool NeedsGather(const Param& p) const;
  // One rank with device shards: the shard is the full parameter (no buffer, no copy).
  bool Aliases() const { return comm_->world_size() == 1 && !host_; }
  // Where a gathered parameter's full values are: its buffer, or (Aliases) its shard.
  const void* Data(const Param& p) const {
    return Aliases() ? p.spec.shard_data : static_cast<const void*>(p.full.data());
  }
  Need NeededBy(int module) const;
  // The padded elements of all of `module`'s parameters.
  int64_t ModuleNumel(int module) const;
  // Staging elements a flight of `count` parameters and `all` padded elements needs.
  int64_t StagingNumel(int64_t all, int64_t count) const;
  // Adds the parameters of `module` that need a gather to the flight being built: allocates their
  // full buffers (live-counted when not persistent) and marks them in flight.
  Status Claim(int module, Flight* f);
  // Issues the flight's one collective (or, with one rank, its copies) and records it.
  Status Launch(Flight f);
  // Host shards: copies this rank's shard of f.params[j] to dst(j) on the upload stream, after the
  // compute stream's work so far.
  Status Upload(Flight& f, const std::vector<void*>& dst);
  // Waits for flight `id` on the compute stream, unpacks, frees its staging buffer.
  Status Complete(int64_t id);
  Status CompleteAll();
  Status WaitModule(int module);
  Status WaitParam(Param& p);
  Status FreeParam(Param& p);
  Status FreeModule(int module);
  Status Prefetch();
  // Module store: asks it to read ahead the next modules of the trace (see Module store).
  Status ReadAhead();
  Status MakeRoom(int64_t needed_live, int demanded);
  // Trace position of m's next use at or after the cursor (-1: none) and the elements of the
  // modules in between.
  int NextUse(int module, int64_t* distance) const;
  std::string Describe(const Flight& f) const;
  Status Fail(Status s);

  Device* device_;
  Communicator* comm_;
  Stream* compute_;
  DType dtype_;
  ParamCoordinatorOptions options_;
  bool host_ = false;                      // ShardSource::kHost
  std::unique_ptr<Stream> upload_stream_;  // host shards: created on the first upload
  std::unique_ptr<Event> compute_mark_;    // recorded on compute_ before each upload
  std::vector<std::unique_ptr<Event>> free_events_;
  std::vector<Param> params_;
  std::vector<int64_t> module_offset_;  // module store: a parameter's shard offset in its module
  std::vector<Module> modules_;
  BufferPool pool_;                    // full buffers
  BufferPool staging_pool_;            // flights' staging buffers
  std::map<int64_t, Flight> flights_;  // in flight, by launch order
  int64_t next_flight_ = 0;
  int64_t live_numel_ = 0;

  bool recording_ = true;     // this micro step's calls become the trace
  bool record_next_ = false;  // the trace broke: record the next micro step
  bool trace_valid_ = false;
  std::vector<int> recorded_;
  std::vector<int> trace_;
  size_t cursor_ = 0;

  ParamCoordinatorStats stats_;
  Status failed_;
  StreamObserver* observer_ = nullptr;
};

}  // namespace zero
