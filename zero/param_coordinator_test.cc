#include "zero/param_coordinator.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/thread_ranks.h"
#include "runtime/cpu_device.h"
#include "testing/status_matchers.h"
#include "zero/partition.h"

namespace zero {
namespace {

// A small "model": modules of given parameter sizes; shard values encode (param, element) so a
// gathered parameter can be checked exactly.
struct Model {
  std::vector<int64_t> sizes;
  std::vector<int> module_of;
  std::vector<std::string> module_names;
  DeviceBuffer shards;  // fp32, per-param shards back to back
  std::vector<int64_t> shard_off;
  // ShardSource::kHost: the shards in host memory instead (shards stays empty).
  std::vector<float> host_shards;
  float* shard_data() { return host_shards.empty() ? shards.as<float>() : host_shards.data(); }
};

float Value(int param, int64_t e) { return 1000.0f * param + static_cast<float>(e); }

Result<std::unique_ptr<ParamCoordinator>> Build(Model& m, int rank, int world, Communicator* comm, Device* device,
                                                const ParamCoordinatorOptions& o, int64_t persistence_threshold) {
  int64_t total = 0;
  for (int64_t n : m.sizes) {
    m.shard_off.push_back(total);
    total += ShardNumel(n, world);
  }
  if (o.shard_source == ShardSource::kHost) {
    m.host_shards.assign(static_cast<size_t>(std::max<int64_t>(total, 1)), 0.0f);
  } else {
    ZERO_ASSIGN_OR_RETURN(m.shards, device->Allocate(std::max<int64_t>(total, 1) * 4));
  }
  float* s = m.shard_data();
  std::vector<CoordinatedParam> ps;
  for (size_t i = 0; i < m.sizes.size(); ++i) {
    const ShardSpec sp = MakeShardSpec(m.sizes[i], world, rank);
    for (int64_t k = 0; k < sp.shard; ++k) {
      s[m.shard_off[i] + k] = sp.begin + k < m.sizes[i] ? Value(i, sp.begin + k) : 0.0f;
    }
    CoordinatedParam c;
    c.name = "p" + std::to_string(i);
    c.numel = m.sizes[i];
    c.padded = sp.padded;
    c.shard = sp.shard;
    c.shard_data = s + m.shard_off[i];
    c.module = m.module_of[i];
    c.persistent = m.sizes[i] <= persistence_threshold;
    ps.push_back(c);
  }
  return std::make_unique<ParamCoordinator>(device, comm, device->default_stream(), DType::kF32, ps, m.module_names, o);
}

Status CheckGathered(ParamCoordinator& pc, const Model& m, int param) {
  ZERO_ASSIGN_OR_RETURN(const void* full, pc.Full(param));
  const float* f = static_cast<const float*>(full);
  for (int64_t e = 0; e < m.sizes[param]; ++e) {
    if (f[e] != Value(param, e)) {
      return InternalError("param " + std::to_string(param) + " element " + std::to_string(e) + " = " +
                           std::to_string(f[e]));
    }
  }
  return OkStatus();
}

Model FourBlocks() {
  Model m;
  // Module b<k> holds a big weight and a small (persistent when the threshold allows) bias.
  for (int k = 0; k < 4; ++k) {
    m.module_names.push_back("b" + std::to_string(k));
    m.sizes.push_back(101 + k);  // odd sizes: padding
    m.module_of.push_back(k);
    m.sizes.push_back(3);
    m.module_of.push_back(k);
  }
  return m;
}

TEST(ParamCoordinatorTest, GathersReleasesAndReturnsMemory) {
  Status s = RunThreadRanks(2, [](int rank, Communicator* comm, Device* device) -> Status {
    Model m = FourBlocks();
    ParamCoordinatorOptions o;
    ZERO_ASSIGN_OR_RETURN(auto pc, Build(m, rank, 2, comm, device, o, /*persistence=*/0));
    const size_t base = device->memory_stats().in_use;
    if (pc->Full(0).ok()) return InternalError("parameter readable before its gather");
    ZERO_RETURN_IF_ERROR(pc->Acquire(1));
    ZERO_RETURN_IF_ERROR(CheckGathered(*pc, m, 2));
    ZERO_RETURN_IF_ERROR(CheckGathered(*pc, m, 3));
    if (pc->live_numel() != 102 + 4) return InternalError("live " + std::to_string(pc->live_numel()));
    ZERO_RETURN_IF_ERROR(pc->Acquire(1));  // nested
    ZERO_RETURN_IF_ERROR(pc->Release(1));
    ZERO_RETURN_IF_ERROR(CheckGathered(*pc, m, 2));
    ZERO_RETURN_IF_ERROR(pc->Release(1));
    if (pc->Full(2).ok()) return InternalError("parameter readable after release");
    if (device->memory_stats().in_use != base) return InternalError("release kept memory");
    if (pc->Release(1).ok()) return InternalError("double release accepted");
    return OkStatus();
  });
  EXPECT_OK(s);
}

// Forward b0..b3 then backward b3..b0, one module held at a time; returns the peak live numel.
Status RunMicroStep(ParamCoordinator& pc, const Model& m, int64_t* peak_live) {
  std::vector<int> order = {0, 1, 2, 3, 3, 2, 1, 0};
  for (int mod : order) {
    ZERO_RETURN_IF_ERROR(pc.Acquire(mod));
    ZERO_RETURN_IF_ERROR(CheckGathered(pc, m, 2 * mod));
    ZERO_RETURN_IF_ERROR(CheckGathered(pc, m, 2 * mod + 1));
    *peak_live = std::max(*peak_live, pc.live_numel());
    ZERO_RETURN_IF_ERROR(pc.Release(mod));
  }
  return pc.EndMicroStep();
}

TEST(ParamCoordinatorTest, TracePrefetchWithinLimits) {
  Status s = RunThreadRanks(2, [](int rank, Communicator* comm, Device* device) -> Status {
    Model m = FourBlocks();
    ParamCoordinatorOptions o;
    o.prefetch_bucket_numel = 250;  // about two modules
    o.max_live_numel = 330;         // three modules of ~106 padded elements
    o.max_reuse_distance = 0;       // no keeping: only prefetch
    ZERO_ASSIGN_OR_RETURN(auto pc, Build(m, rank, 2, comm, device, o, /*persistence=*/3));
    int64_t peak = 0;
    ZERO_RETURN_IF_ERROR(RunMicroStep(*pc, m, &peak));
    if (pc->stats().prefetched_modules != 0) return InternalError("prefetch while recording");
    if (pc->trace().size() != 8 || !pc->trace_valid()) return InternalError("trace not recorded");
    for (int step = 0; step < 3; ++step) ZERO_RETURN_IF_ERROR(RunMicroStep(*pc, m, &peak));
    const ParamCoordinatorStats& st = pc->stats();
    if (st.prefetched_modules == 0 || st.prefetch_hits == 0) {
      return InternalError("no prefetch: " + std::to_string(st.prefetched_modules));
    }
    if (st.max_live_numel_seen > o.max_live_numel) {
      return InternalError("live " + std::to_string(st.max_live_numel_seen) + " over the limit");
    }
    if (st.trace_invalidations != 0) return InternalError("unexpected invalidation");
    return OkStatus();
  });
  EXPECT_OK(s);
}

// Modules larger than stage3_prefetch_bucket_size: the next one is still prefetched (one module
// ahead, as DeepSpeed and FSDP2 do), never two (what is already gathered ahead fills the bucket);
// the live limit holds; a bucket of 0 turns prefetching off.
TEST(ParamCoordinatorTest, ModulesLargerThanTheBucketArePrefetchedOneAhead) {
  for (int64_t bucket : {int64_t{50}, int64_t{0}}) {
    SCOPED_TRACE("bucket " + std::to_string(bucket));
    Status s = RunThreadRanks(2, [bucket](int rank, Communicator* comm, Device* device) -> Status {
      Model m = FourBlocks();
      ParamCoordinatorOptions o;
      o.prefetch_bucket_numel = bucket;  // below one module's ~106 padded elements
      o.max_reuse_distance = 0;          // no keeping: only prefetch
      ZERO_ASSIGN_OR_RETURN(auto pc, Build(m, rank, 2, comm, device, o, /*persistence=*/3));
      int64_t peak = 0;
      ZERO_RETURN_IF_ERROR(RunMicroStep(*pc, m, &peak));  // records the trace
      ZERO_RETURN_IF_ERROR(RunMicroStep(*pc, m, &peak));
      const ParamCoordinatorStats& st = pc->stats();
      if (bucket == 0) {
        if (st.prefetched_modules != 0) return InternalError("prefetched with a bucket of 0");
        return OkStatus();
      }
      // The trace is b0 b1 b2 b3 b3 b2 b1 b0: after most demands the next module is gathered ahead
      // (not after the last one, nor where the next is the module just demanded).
      if (st.prefetched_modules < 5) {
        return InternalError("prefetched " + std::to_string(st.prefetched_modules) +
                             " modules, expected one ahead of each demand");
      }
      if (st.prefetch_hits < 5) return InternalError("prefetch hits " + std::to_string(st.prefetch_hits));
      // One module held plus one ahead: never three modules' worth live.
      if (st.max_live_numel_seen > 2 * 106) {
        return InternalError("live " + std::to_string(st.max_live_numel_seen) + ": more than one module ahead");
      }
      return OkStatus();
    });
    EXPECT_OK(s);
  }
}

TEST(ParamCoordinatorTest, KeepsModulesReusedSoonAndEvictsForDemand) {
  Status s = RunThreadRanks(2, [](int rank, Communicator* comm, Device* device) -> Status {
    Model m = FourBlocks();
    ParamCoordinatorOptions o;
    o.prefetch_bucket_numel = 0;  // no prefetch
    o.max_live_numel = 220;       // two modules
    o.max_reuse_distance = 1 << 30;
    ZERO_ASSIGN_OR_RETURN(auto pc, Build(m, rank, 2, comm, device, o, 0));
    int64_t peak = 0;
    ZERO_RETURN_IF_ERROR(RunMicroStep(*pc, m, &peak));
    const int64_t gathers_first = pc->stats().gathered_params;
    ZERO_RETURN_IF_ERROR(RunMicroStep(*pc, m, &peak));
    const ParamCoordinatorStats& st = pc->stats();
    if (st.kept_modules == 0) return InternalError("nothing kept");
    // b3 is used twice in a row: kept, so the second micro step gathers less.
    if (st.gathered_params - gathers_first >= gathers_first) return InternalError("keeping saved no gathers");
    if (st.max_live_numel_seen > o.max_live_numel) return InternalError("over the live limit");
    if (st.evicted_modules == 0) return InternalError("no eviction");
    return OkStatus();
  });
  EXPECT_OK(s);
}

TEST(ParamCoordinatorTest, DemandOverTheLimitStillServed) {
  Status s = RunThreadRanks(2, [](int rank, Communicator* comm, Device* device) -> Status {
    Model m = FourBlocks();
    ParamCoordinatorOptions o;
    o.max_live_numel = 10;  // smaller than one module
    ZERO_ASSIGN_OR_RETURN(auto pc, Build(m, rank, 2, comm, device, o, 0));
    ZERO_RETURN_IF_ERROR(pc->Acquire(0));
    ZERO_RETURN_IF_ERROR(pc->Acquire(1));
    ZERO_RETURN_IF_ERROR(CheckGathered(*pc, m, 0));
    ZERO_RETURN_IF_ERROR(CheckGathered(*pc, m, 2));
    ZERO_RETURN_IF_ERROR(pc->Release(0));
    ZERO_RETURN_IF_ERROR(pc->Release(1));
    if (pc->live_numel() != 0) return InternalError("not freed");
    return OkStatus();
  });
  EXPECT_OK(s);
}

TEST(ParamCoordinatorTest, TraceMismatchInvalidatesAndReRecords) {
  Status s = RunThreadRanks(2, [](int rank, Communicator* comm, Device* device) -> Status {
    Model m = FourBlocks();
    ParamCoordinatorOptions o;
    o.prefetch_bucket_numel = 1000;
    ZERO_ASSIGN_OR_RETURN(auto pc, Build(m, rank, 2, comm, device, o, 0));
    int64_t peak = 0;
    ZERO_RETURN_IF_ERROR(RunMicroStep(*pc, m, &peak));
    // A different order: 0, 2, ...
    for (int mod : {0, 2, 1}) {
      ZERO_RETURN_IF_ERROR(pc->Acquire(mod));
      ZERO_RETURN_IF_ERROR(CheckGathered(*pc, m, 2 * mod));
      ZERO_RETURN_IF_ERROR(pc->Release(mod));
    }
    ZERO_RETURN_IF_ERROR(pc->EndMicroStep());
    if (pc->stats().trace_invalidations != 1 || pc->trace_valid()) return InternalError("not invalidated");
    for (int mod : {0, 2, 1}) {
      ZERO_RETURN_IF_ERROR(pc->Acquire(mod));
      ZERO_RETURN_IF_ERROR(pc->Release(mod));
    }
    ZERO_RETURN_IF_ERROR(pc->EndMicroStep());
    if (!pc->trace_valid() || pc->trace().size() != 3) return InternalError("not re-recorded");
    return OkStatus();
  });
  EXPECT_OK(s);
}

TEST(ParamCoordinatorTest, PersistentParamsStayAndRefreshAfterUpdate) {
  Status s = RunThreadRanks(2, [](int rank, Communicator* comm, Device* device) -> Status {
    Model m = FourBlocks();
    ParamCoordinatorOptions o;
    ZERO_ASSIGN_OR_RETURN(auto pc, Build(m, rank, 2, comm, device, o, /*persistence=*/3));
    ZERO_RETURN_IF_ERROR(pc->Acquire(0));
    ZERO_RETURN_IF_ERROR(pc->Acquire(2));
    ZERO_RETURN_IF_ERROR(pc->Release(0));
    ZERO_RETURN_IF_ERROR(CheckGathered(*pc, m, 1));  // persistent bias of b0 stays readable
    if (pc->Full(0).ok()) return InternalError("non-persistent weight readable");
    // An update changes every shard: x -> x + 0.5.
    ZERO_RETURN_IF_ERROR(pc->QuiesceForUpdate());
    float* sh = m.shards.as<float>();
    for (size_t i = 0; i < m.sizes.size(); ++i) {
      for (int64_t k = 0; k < ShardNumel(m.sizes[i], 2); ++k) sh[m.shard_off[i] + k] += 0.5f;
    }
    ZERO_RETURN_IF_ERROR(pc->AfterUpdate());
    if (pc->Full(1).ok()) return InternalError("stale persistent parameter readable");
    // Held module b2 was re-gathered with the new values.
    ZERO_ASSIGN_OR_RETURN(const void* w2, pc->Full(4));
    if (static_cast<const float*>(w2)[7] != Value(4, 7) + 0.5f) return InternalError("held module not refreshed");
    ZERO_RETURN_IF_ERROR(pc->Acquire(0));
    ZERO_ASSIGN_OR_RETURN(const void* b0, pc->Full(1));
    if (static_cast<const float*>(b0)[2] != Value(1, 2) + 0.5f) return InternalError("persistent not refreshed");
    ZERO_RETURN_IF_ERROR(pc->Release(0));
    ZERO_RETURN_IF_ERROR(pc->Release(2));
    return OkStatus();
  });
  EXPECT_OK(s);
}

// --- coalescing ----------------------------------------------------------------------------------

// Bytes of element e of parameter `param` (any dtype: compared bit for bit).
uint8_t PatternByte(int param, int64_t e, size_t b) {
  return static_cast<uint8_t>((param * 131 + e * 7 + static_cast<int64_t>(b) * 29 + 1) & 0xff);
}

// One module "m" of the given parameter sizes (plus nothing else), shards of dtype `t` filled with
// PatternByte (padding zero), gathered on `world` ranks: the module is one collective, the
// parameters are exactly the pattern, the staging buffer is gone afterwards and was counted live.
Status CheckOneModule(int rank, int world, Communicator* comm, Device* device, DType t,
                      const std::vector<int64_t>& sizes) {
  const size_t es = SizeOf(t);
  std::vector<int64_t> off;
  int64_t total = 0;
  for (int64_t n : sizes) {
    off.push_back(total);
    total += ShardNumel(n, world);
  }
  ZERO_ASSIGN_OR_RETURN(DeviceBuffer shards, device->Allocate(std::max<int64_t>(total, 1) * es));
  uint8_t* s = static_cast<uint8_t*>(shards.data());
  std::vector<CoordinatedParam> ps;
  int64_t padded_total = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const ShardSpec sp = MakeShardSpec(sizes[i], world, rank);
    for (int64_t k = 0; k < sp.shard; ++k) {
      for (size_t b = 0; b < es; ++b) {
        s[(off[i] + k) * es + b] = sp.begin + k < sizes[i] ? PatternByte(i, sp.begin + k, b) : 0;
      }
    }
    CoordinatedParam c;
    c.name = "p" + std::to_string(i);
    c.numel = sizes[i];
    c.padded = sp.padded;
    c.shard = sp.shard;
    c.shard_data = s + off[i] * es;
    c.module = 0;
    ps.push_back(c);
    padded_total += sp.padded;
  }
  ParamCoordinator pc(device, comm, device->default_stream(), t, ps, {"m"}, ParamCoordinatorOptions{});
  const size_t base = device->memory_stats().in_use;
  device->ResetPeak();
  ZERO_RETURN_IF_ERROR(pc.Acquire(0));
  int64_t nonzero = 0;
  for (int64_t n : sizes) nonzero += n > 0 ? 1 : 0;
  const ParamCoordinatorStats& st = pc.stats();
  const int64_t want_collectives = world > 1 && nonzero > 0 ? 1 : 0;
  if (st.allgathers != want_collectives) {
    return InternalError(std::to_string(sizes.size()) + " parameters took " + std::to_string(st.allgathers) +
                         " collectives");
  }
  if (st.gathered_params != nonzero) return InternalError("gathered " + std::to_string(st.gathered_params));
  for (size_t i = 0; i < sizes.size(); ++i) {
    ZERO_ASSIGN_OR_RETURN(const void* full, pc.Full(static_cast<int>(i)));
    const uint8_t* f = static_cast<const uint8_t*>(full);
    for (int64_t e = 0; e < PaddedNumel(sizes[i], world); ++e) {
      for (size_t b = 0; b < es; ++b) {
        const uint8_t want = e < sizes[i] ? PatternByte(static_cast<int>(i), e, b) : 0;
        if (f[e * es + b] != want) {
          return InternalError("param " + std::to_string(i) + " element " + std::to_string(e) + " byte " +
                               std::to_string(b));
        }
      }
    }
  }
  // The staging buffer (several parameters on several ranks) was counted live and is freed.
  const int64_t staging = world > 1 && nonzero >= 2 ? padded_total : 0;
  if (st.max_staging_numel != staging) return InternalError("staging " + std::to_string(st.max_staging_numel));
  if (st.max_live_numel_seen != padded_total + staging) {
    return InternalError("live high-water " + std::to_string(st.max_live_numel_seen));
  }
  if (pc.live_numel() != padded_total || pc.staging_bytes() != 0 || pc.flights_in_flight() != 0) {
    return InternalError("staging kept after the gather");
  }
  // With one rank the shards are read in place: no full buffers, no copies.
  const size_t resident = world > 1 ? static_cast<size_t>(padded_total) * es : 0;
  if (device->memory_stats().in_use - base != resident) {
    return InternalError("resident " + std::to_string(device->memory_stats().in_use - base));
  }
  if (world == 1) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      ZERO_ASSIGN_OR_RETURN(const void* full, pc.Full(static_cast<int>(i)));
      if (sizes[i] > 0 && full != ps[i].shard_data) return InternalError("one rank: not the shard itself");
    }
  }
  if (device->memory_stats().peak - base > static_cast<size_t>(padded_total + staging) * es + 1024) {
    return InternalError("peak " + std::to_string(device->memory_stats().peak - base));
  }
  ZERO_RETURN_IF_ERROR(pc.Release(0));
  if (device->memory_stats().in_use != base) return InternalError("release kept memory");
  return OkStatus();
}

TEST(ParamCoordinatorTest, ModuleOfKParametersIsOneCollective) {
  // Odd sizes (padding, tail ranks with only padding), an empty parameter, a scalar.
  const std::vector<std::vector<int64_t>> cases = {{101, 3, 64, 1, 0, 257, 2}, {5}, {7, 0}, {1, 1, 1, 1}, {1000, 999}};
  for (int world : {1, 2, 3, 4}) {
    for (DType t : {DType::kF32, DType::kBF16}) {
      for (const auto& sizes : cases) {
        Status s = RunThreadRanks(world, [&](int rank, Communicator* comm, Device* device) {
          return CheckOneModule(rank, world, comm, device, t, sizes);
        });
        EXPECT_OK(s) << "world " << world << " " << DTypeName(t) << " " << sizes.size() << " params";
      }
    }
  }
}

// The prefetch after a demand gathers the next modules of the trace in one collective, within the
// bucket size; their demands then issue none.
TEST(ParamCoordinatorTest, PrefetchOfSeveralModulesIsOneCollective) {
  for (int world : {2, 3}) {
    Status s = RunThreadRanks(world, [world](int rank, Communicator* comm, Device* device) -> Status {
      Model m = FourBlocks();
      ParamCoordinatorOptions o;
      // Module k needs 102..104 + 3 padded elements (world 2): the bucket takes modules 1 and 2.
      o.prefetch_bucket_numel = 250;
      o.max_reuse_distance = 0;
      ZERO_ASSIGN_OR_RETURN(auto pc, Build(m, rank, world, comm, device, o, /*persistence=*/0));
      int64_t peak = 0;
      ZERO_RETURN_IF_ERROR(RunMicroStep(*pc, m, &peak));  // records the trace
      // Recording: one collective per demand (8 demands, nothing kept or prefetched).
      if (pc->stats().allgathers != 8) return InternalError("recording: " + std::to_string(pc->stats().allgathers));
      const int64_t before = pc->stats().allgathers;
      ZERO_RETURN_IF_ERROR(pc->Acquire(0));
      // The demand of b0 and one prefetch of b1 and b2.
      if (pc->stats().allgathers - before != 2) {
        return InternalError("demand + prefetch took " + std::to_string(pc->stats().allgathers - before));
      }
      if (pc->stats().prefetched_modules != 2) {
        return InternalError("prefetched " + std::to_string(pc->stats().prefetched_modules));
      }
      const int64_t bucket = 2 * (PaddedNumel(3, world)) + PaddedNumel(102, world) + PaddedNumel(103, world);
      if (pc->stats().max_staging_numel != bucket) {
        return InternalError("staging " + std::to_string(pc->stats().max_staging_numel) + " vs " +
                             std::to_string(bucket));
      }
      if (pc->flights_in_flight() != 1) return InternalError("prefetch not in flight");
      ZERO_RETURN_IF_ERROR(CheckGathered(*pc, m, 0));
      ZERO_RETURN_IF_ERROR(pc->Release(0));
      const int64_t after_prefetch = pc->stats().allgathers;
      ZERO_RETURN_IF_ERROR(pc->Acquire(1));  // served by the prefetch: completes it, then prefetches
                                             // b3 and b0 (b2 is gathered), one collective
      ZERO_RETURN_IF_ERROR(CheckGathered(*pc, m, 2));
      ZERO_RETURN_IF_ERROR(CheckGathered(*pc, m, 3));
      // b1/b2's staging is freed; only the next prefetch's (b3 and b0, issued by this demand) is held.
      if (pc->flights_in_flight() != 1 ||
          pc->staging_bytes() > static_cast<size_t>(o.prefetch_bucket_numel) * sizeof(float)) {
        return InternalError("staging kept after the unpack: " + std::to_string(pc->staging_bytes()));
      }
      ZERO_RETURN_IF_ERROR(pc->Release(1));
      // None for the demand, one for the next prefetch.
      if (pc->stats().allgathers - after_prefetch != 1) {
        return InternalError("after the prefetch hit: " + std::to_string(pc->stats().allgathers - after_prefetch));
      }
      ZERO_RETURN_IF_ERROR(pc->Acquire(2));
      ZERO_RETURN_IF_ERROR(CheckGathered(*pc, m, 4));
      ZERO_RETURN_IF_ERROR(CheckGathered(*pc, m, 5));
      ZERO_RETURN_IF_ERROR(pc->Release(2));
      if (pc->stats().prefetch_hits != 2) return InternalError("hits " + std::to_string(pc->stats().prefetch_hits));
      // The rest of the micro step, then a whole one: every value right.
      for (int mod : {3, 3, 2, 1, 0}) {
        ZERO_RETURN_IF_ERROR(pc->Acquire(mod));
        ZERO_RETURN_IF_ERROR(CheckGathered(*pc, m, 2 * mod));
        ZERO_RETURN_IF_ERROR(CheckGathered(*pc, m, 2 * mod + 1));
        ZERO_RETURN_IF_ERROR(pc->Release(mod));
      }
      ZERO_RETURN_IF_ERROR(pc->EndMicroStep());
      ZERO_RETURN_IF_ERROR(RunMicroStep(*pc, m, &peak));
      // Fewer collectives than demands once prefetching coalesces.
      if (pc->stats().allgathers - before >= 16) return InternalError("no coalescing");
      if (pc->stats().trace_invalidations != 0) return InternalError("unexpected invalidation");
      return OkStatus();
    });
    EXPECT_OK(s) << "world " << world;
  }
}

// The live limit counts the staging buffer of a prefetch in flight: a limit that fits two modules
// but not two modules plus their staging prefetches one module at a time (one parameter each, no staging).
TEST(ParamCoordinatorTest, PrefetchStagingCountsAgainstTheLiveLimit) {
  Status s = RunThreadRanks(2, [](int rank, Communicator* comm, Device* device) -> Status {
    Model m = FourBlocks();
    ParamCoordinatorOptions o;
    o.prefetch_bucket_numel = 1000;
    o.max_live_numel = 3 * 108;  // three modules; two prefetched plus staging would be 4 * ~107
    o.max_reuse_distance = 0;
    ZERO_ASSIGN_OR_RETURN(auto pc, Build(m, rank, 2, comm, device, o, /*persistence=*/3));
    const size_t base = device->memory_stats().in_use;
    device->ResetPeak();
    int64_t peak = 0;
    for (int step = 0; step < 3; ++step) ZERO_RETURN_IF_ERROR(RunMicroStep(*pc, m, &peak));
    const ParamCoordinatorStats& st = pc->stats();
    if (st.max_live_numel_seen > o.max_live_numel) {
      return InternalError("live " + std::to_string(st.max_live_numel_seen) + " over the limit");
    }
    if (st.prefetched_modules == 0) return InternalError("nothing prefetched");
    // The real memory: gathered weights and staging within the limit (plus the 4 persistent biases).
    const size_t device_peak = device->memory_stats().peak - base;
    if (device_peak > static_cast<size_t>(o.max_live_numel + 4 * 4) * sizeof(float)) {
      return InternalError("device peak " + std::to_string(device_peak) + " bytes over the limit");
    }
    return OkStatus();
  });
  EXPECT_OK(s);
}

// A demand over the limit evicts a prefetched module whose (one-parameter) gather is still in flight:
// the eviction completes that flight first; everything stays right afterwards.
TEST(ParamCoordinatorTest, EvictionOfAModuleInFlight) {
  Status s = RunThreadRanks(2, [](int rank, Communicator* comm, Device* device) -> Status {
    Model m = FourBlocks();
    ParamCoordinatorOptions o;
    o.prefetch_bucket_numel = 110;  // one weight (biases are persistent)
    o.max_live_numel = 220;         // two weights
    o.max_reuse_distance = 0;
    ZERO_ASSIGN_OR_RETURN(auto pc, Build(m, rank, 2, comm, device, o, /*persistence=*/3));
    int64_t peak = 0;
    ZERO_RETURN_IF_ERROR(RunMicroStep(*pc, m, &peak));
    ZERO_RETURN_IF_ERROR(pc->Acquire(0));  // prefetches b1's weight: one parameter, in place
    if (pc->flights_in_flight() != 1 || pc->stats().prefetched_modules != 1) {
      return InternalError("expected one prefetch in flight");
    }
    ZERO_RETURN_IF_ERROR(pc->Acquire(3));  // off the trace, b0 held: b1 must go
    if (pc->stats().evicted_modules != 1 || pc->flights_in_flight() != 0) return InternalError("b1 not evicted");
    ZERO_RETURN_IF_ERROR(CheckGathered(*pc, m, 0));
    ZERO_RETURN_IF_ERROR(CheckGathered(*pc, m, 6));
    ZERO_RETURN_IF_ERROR(CheckGathered(*pc, m, 7));
    if (pc->live_numel() > o.max_live_numel) return InternalError("over the limit");
    ZERO_RETURN_IF_ERROR(pc->Release(3));
    ZERO_RETURN_IF_ERROR(pc->Release(0));
    ZERO_RETURN_IF_ERROR(pc->Acquire(1));
    ZERO_RETURN_IF_ERROR(CheckGathered(*pc, m, 2));
    ZERO_RETURN_IF_ERROR(CheckGathered(*pc, m, 3));
    ZERO_RETURN_IF_ERROR(pc->Release(1));
    ZERO_RETURN_IF_ERROR(pc->EndMicroStep());
    for (int step = 0; step < 2; ++step) ZERO_RETURN_IF_ERROR(RunMicroStep(*pc, m, &peak));
    if (pc->stats().max_live_numel_seen > o.max_live_numel) return InternalError("live over the limit");
    return OkStatus();
  });
  EXPECT_OK(s);
}

// A demand over the limit while a multi-parameter prefetch is in flight: completing that flight
// frees its staging, which is room enough: nothing is evicted.
TEST(ParamCoordinatorTest, DemandCompletesPrefetchStagingBeforeEvicting) {
  Status s = RunThreadRanks(2, [](int rank, Communicator* comm, Device* device) -> Status {
    Model m = FourBlocks();
    ParamCoordinatorOptions o;
    o.prefetch_bucket_numel = 220;  // up to two modules
    o.max_live_numel = 4 * 108;     // b0, then b1 and its staging: b2 does not fit with them
    o.max_reuse_distance = 0;
    ZERO_ASSIGN_OR_RETURN(auto pc, Build(m, rank, 2, comm, device, o, /*persistence=*/0));
    int64_t peak = 0;
    ZERO_RETURN_IF_ERROR(RunMicroStep(*pc, m, &peak));
    ZERO_RETURN_IF_ERROR(pc->Acquire(0));
    if (pc->flights_in_flight() != 1 || pc->stats().prefetched_modules != 1) {
      return InternalError("expected b1 in flight");
    }
    if (pc->live_numel() != 106 + 106 + 106) return InternalError("live " + std::to_string(pc->live_numel()));
    ZERO_RETURN_IF_ERROR(pc->Acquire(3));  // off the trace, b0 held: 108 + 108 staging more
    if (pc->flights_in_flight() != 0) return InternalError("prefetch staging not completed");
    if (pc->stats().evicted_modules != 0) return InternalError("evicted although completing sufficed");
    ZERO_RETURN_IF_ERROR(CheckGathered(*pc, m, 0));
    ZERO_RETURN_IF_ERROR(CheckGathered(*pc, m, 6));
    ZERO_RETURN_IF_ERROR(CheckGathered(*pc, m, 7));
    if (pc->stats().max_live_numel_seen > o.max_live_numel) return InternalError("over the limit");
    ZERO_RETURN_IF_ERROR(pc->Release(3));
    ZERO_RETURN_IF_ERROR(pc->Release(0));
    ZERO_RETURN_IF_ERROR(pc->Acquire(1));  // gathered by the completed prefetch
    ZERO_RETURN_IF_ERROR(CheckGathered(*pc, m, 2));
    ZERO_RETURN_IF_ERROR(pc->Release(1));
    return pc->EndMicroStep();
  });
  EXPECT_OK(s);
}

// After an update the held modules are re-gathered in one collective, the stale persistent
// parameters of unheld modules later with their module's next gather.
TEST(ParamCoordinatorTest, AfterUpdateRegathersHeldModulesInOneCollective) {
  Status s = RunThreadRanks(2, [](int rank, Communicator* comm, Device* device) -> Status {
    Model m = FourBlocks();
    ParamCoordinatorOptions o;
    ZERO_ASSIGN_OR_RETURN(auto pc, Build(m, rank, 2, comm, device, o, /*persistence=*/3));
    ZERO_RETURN_IF_ERROR(pc->Acquire(0));
    ZERO_RETURN_IF_ERROR(pc->Acquire(2));
    ZERO_RETURN_IF_ERROR(pc->Acquire(3));
    ZERO_RETURN_IF_ERROR(pc->Release(3));
    if (pc->stats().allgathers != 3) return InternalError("one collective per module demand");
    ZERO_RETURN_IF_ERROR(pc->QuiesceForUpdate());
    float* sh = m.shards.as<float>();
    for (size_t i = 0; i < m.sizes.size(); ++i) {
      for (int64_t k = 0; k < ShardNumel(m.sizes[i], 2); ++k) sh[m.shard_off[i] + k] += 0.25f;
    }
    ZERO_RETURN_IF_ERROR(pc->AfterUpdate());
    if (pc->stats().allgathers != 4)
      return InternalError("re-gather took " + std::to_string(pc->stats().allgathers - 3));
    for (int i : {0, 1, 4, 5}) {
      ZERO_ASSIGN_OR_RETURN(const void* full, pc->Full(i));
      const float* f = static_cast<const float*>(full);
      for (int64_t e = 0; e < m.sizes[i]; ++e) {
        if (f[e] != Value(i, e) + 0.25f) return InternalError("param " + std::to_string(i) + " not refreshed");
      }
    }
    ZERO_RETURN_IF_ERROR(pc->Acquire(3));  // b3's weight and its stale persistent bias: one collective
    if (pc->stats().allgathers != 5) return InternalError("b3 took " + std::to_string(pc->stats().allgathers - 4));
    ZERO_ASSIGN_OR_RETURN(const void* b3, pc->Full(7));
    if (static_cast<const float*>(b3)[1] != Value(7, 1) + 0.25f) return InternalError("b3 bias stale");
    for (int mod : {3, 2, 0}) ZERO_RETURN_IF_ERROR(pc->Release(mod));
    return OkStatus();
  });
  EXPECT_OK(s);
}

// --- host shards (offload_param.device "cpu") -------------------------------------------------

// A model with modules of k >= 2 parameters, of one parameter (in-place gather) and with an empty
// parameter.
Model MixedModules() {
  Model m = FourBlocks();
  m.module_names.push_back("single");
  m.sizes.push_back(57);
  m.module_of.push_back(4);
  m.module_names.push_back("with_empty");
  m.sizes.push_back(0);
  m.module_of.push_back(5);
  m.sizes.push_back(7);
  m.module_of.push_back(5);
  return m;
}

// Forward then backward over every module of MixedModules, checking every gathered value.
Status RunMixedMicroStep(ParamCoordinator& pc, const Model& m, float delta) {
  const int modules = static_cast<int>(m.module_names.size());
  std::vector<int> order;
  for (int k = 0; k < modules; ++k) order.push_back(k);
  for (int k = modules - 1; k >= 0; --k) order.push_back(k);
  for (int mod : order) {
    ZERO_RETURN_IF_ERROR(pc.Acquire(mod));
    for (size_t i = 0; i < m.sizes.size(); ++i) {
      if (m.module_of[i] != mod) continue;
      ZERO_ASSIGN_OR_RETURN(const void* full, pc.Full(static_cast<int>(i)));
      const float* f = static_cast<const float*>(full);
      for (int64_t e = 0; e < m.sizes[i]; ++e) {
        if (f[e] != Value(static_cast<int>(i), e) + delta) {
          return InternalError("module " + std::to_string(mod) + " param " + std::to_string(i) + " element " +
                               std::to_string(e) + " = " + std::to_string(f[e]) + ", expected " +
                               std::to_string(Value(static_cast<int>(i), e) + delta));
        }
      }
    }
    ZERO_RETURN_IF_ERROR(pc.Release(mod));
  }
  return pc.EndMicroStep();
}

// Adds `delta` to every shard element between QuiesceForUpdate and AfterUpdate (the update).
Status UpdateShards(ParamCoordinator& pc, Model& m, int world, float delta) {
  ZERO_RETURN_IF_ERROR(pc.QuiesceForUpdate());
  float* sh = m.shard_data();
  for (size_t i = 0; i < m.sizes.size(); ++i) {
    for (int64_t k = 0; k < ShardNumel(m.sizes[i], world); ++k) sh[m.shard_off[i] + k] += delta;
  }
  return pc.AfterUpdate();
}

// With one rank the host shard is uploaded into a real full buffer: Full() is not the shard, the
// buffer is device memory counted as resident and returned at release, and the gathered values are
// a copy (a change of the host shard outside the update protocol does not show).
TEST(ParamCoordinatorHostShardsTest, OneRankUploadsIntoRealBuffers) {
  Status s = RunThreadRanks(1, [](int rank, Communicator* comm, Device* device) -> Status {
    Model m = FourBlocks();
    ParamCoordinatorOptions o;
    o.shard_source = ShardSource::kHost;
    ZERO_ASSIGN_OR_RETURN(auto pc, Build(m, rank, 1, comm, device, o, /*persistence=*/0));
    const size_t base = device->memory_stats().in_use;
    ZERO_RETURN_IF_ERROR(pc->Acquire(1));
    ZERO_RETURN_IF_ERROR(CheckGathered(*pc, m, 2));
    ZERO_RETURN_IF_ERROR(CheckGathered(*pc, m, 3));
    ZERO_ASSIGN_OR_RETURN(const void* full, pc->Full(2));
    if (full == m.shard_data() + m.shard_off[2]) return InternalError("Full() aliases the host shard");
    if (pc->resident_bytes() != (102 + 3) * 4) return InternalError("resident " + std::to_string(pc->resident_bytes()));
    if (device->memory_stats().in_use - base != (102 + 3) * 4) return InternalError("full buffers not on the device");
    if (pc->stats().uploads != 2 || pc->stats().uploaded_bytes != (102 + 3) * 4 || pc->stats().allgathers != 0) {
      return InternalError("uploads " + std::to_string(pc->stats().uploads) + ", bytes " +
                           std::to_string(pc->stats().uploaded_bytes));
    }
    m.host_shards[m.shard_off[2]] = -1.0f;  // not through the protocol: the gathered copy keeps its value
    ZERO_RETURN_IF_ERROR(CheckGathered(*pc, m, 2));
    m.host_shards[m.shard_off[2]] = Value(2, 0);
    // The update: the held module is re-uploaded with the new values.
    ZERO_RETURN_IF_ERROR(UpdateShards(*pc, m, 1, 0.5f));
    ZERO_ASSIGN_OR_RETURN(const void* w, pc->Full(2));
    if (static_cast<const float*>(w)[5] != Value(2, 5) + 0.5f) return InternalError("held module not refreshed");
    ZERO_RETURN_IF_ERROR(pc->Release(1));
    if (pc->resident_bytes() != 0 || device->memory_stats().in_use != base) return InternalError("release kept memory");
    return OkStatus();
  });
  EXPECT_OK(s);
}

// Host shards give the same gathers as device shards: every value, collective count, prefetch and
// keep decision, at worlds 1-3, with modules of k >= 2 parameters (staged), one parameter (in
// place) and an empty parameter, across an update.
TEST(ParamCoordinatorHostShardsTest, SameGathersAsDeviceShards) {
  for (int world : {1, 2, 3}) {
    std::vector<ParamCoordinatorStats> stats[2];
    for (int host = 0; host < 2; ++host) {
      stats[host].resize(world);
      Status s = RunThreadRanks(world, [&](int rank, Communicator* comm, Device* device) -> Status {
        Model m = MixedModules();
        ParamCoordinatorOptions o;
        o.shard_source = host ? ShardSource::kHost : ShardSource::kDevice;
        o.prefetch_bucket_numel = 250;
        o.max_live_numel = 400;
        o.max_reuse_distance = 120;
        ZERO_ASSIGN_OR_RETURN(auto pc, Build(m, rank, world, comm, device, o, /*persistence=*/3));
        for (int step = 0; step < 3; ++step) ZERO_RETURN_IF_ERROR(RunMixedMicroStep(*pc, m, 0.0f));
        ZERO_RETURN_IF_ERROR(pc->Acquire(4));  // held across the update
        ZERO_RETURN_IF_ERROR(UpdateShards(*pc, m, world, 0.25f));
        ZERO_RETURN_IF_ERROR(pc->Release(4));
        for (int step = 0; step < 2; ++step) ZERO_RETURN_IF_ERROR(RunMixedMicroStep(*pc, m, 0.25f));
        if (host && pc->stats().uploads == 0) return InternalError("nothing uploaded");
        if (!host && pc->stats().uploads != 0) return InternalError("device shards uploaded");
        stats[host][rank] = pc->stats();
        return OkStatus();
      });
      ASSERT_OK(s) << "world " << world << (host ? " host" : " device") << " shards";
    }
    for (int r = 0; r < world; ++r) {
      const ParamCoordinatorStats& d = stats[0][r];
      const ParamCoordinatorStats& h = stats[1][r];
      EXPECT_EQ(h.allgathers, d.allgathers) << "world " << world << " rank " << r;
      EXPECT_EQ(h.gathered_params, d.gathered_params) << "world " << world << " rank " << r;
      EXPECT_EQ(h.prefetched_modules, d.prefetched_modules) << "world " << world << " rank " << r;
      EXPECT_EQ(h.prefetch_hits, d.prefetch_hits) << "world " << world << " rank " << r;
      EXPECT_EQ(h.kept_modules, d.kept_modules) << "world " << world << " rank " << r;
      EXPECT_EQ(h.max_live_numel_seen, d.max_live_numel_seen) << "world " << world << " rank " << r;
      EXPECT_GT(d.prefetched_modules, 0) << "the cell must prefetch";
      // Every gathered parameter of positive size uploaded its shard once.
      EXPECT_EQ(h.uploads, h.gathered_params) << "world " << world << " rank " << r;
    }
  }
}

// max_uploads_in_flight bounds the flights in flight: with 1, a prefetch is issued only when nothing
// else is in flight, and the values stay right.
TEST(ParamCoordinatorHostShardsTest, UploadsInFlightWithinTheLimit) {
  for (int world : {1, 2}) {
    for (int limit : {1, 2}) {
      Status s = RunThreadRanks(world, [&](int rank, Communicator* comm, Device* device) -> Status {
        Model m = MixedModules();
        ParamCoordinatorOptions o;
        o.shard_source = ShardSource::kHost;
        o.max_uploads_in_flight = limit;
        o.prefetch_bucket_numel = 120;  // one module per prefetch
        o.max_reuse_distance = 0;
        ZERO_ASSIGN_OR_RETURN(auto pc, Build(m, rank, world, comm, device, o, /*persistence=*/0));
        for (int step = 0; step < 3; ++step) ZERO_RETURN_IF_ERROR(RunMixedMicroStep(*pc, m, 0.0f));
        const ParamCoordinatorStats& st = pc->stats();
        if (st.prefetched_modules == 0) return InternalError("no prefetch");
        if (st.max_uploads_in_flight_seen > limit) {
          return InternalError(std::to_string(st.max_uploads_in_flight_seen) + " flights in flight, limit " +
                               std::to_string(limit));
        }
        if (pc->flights_in_flight() > static_cast<size_t>(limit)) return InternalError("over the limit at the end");
        return OkStatus();
      });
      EXPECT_OK(s) << "world " << world << " limit " << limit;
    }
  }
}

}  // namespace
}  // namespace zero
