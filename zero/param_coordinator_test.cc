#include "zero/param_coordinator.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/thread_ranks.h"
#include "runtime/cpu_device.h"
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
};

float Value(int param, int64_t e) { return 1000.0f * param + static_cast<float>(e); }

Result<std::unique_ptr<ParamCoordinator>> Build(Model& m, int rank, int world, Communicator* comm,
                                                Device* device, const ParamCoordinatorOptions& o,
                                                int64_t persistence_threshold) {
  int64_t total = 0;
  for (int64_t n : m.sizes) {
    m.shard_off.push_back(total);
    total += ShardNumel(n, world);
  }
  ZERO_ASSIGN_OR_RETURN(m.shards, device->Allocate(std::max<int64_t>(total, 1) * 4));
  float* s = m.shards.as<float>();
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
  return std::make_unique<ParamCoordinator>(device, comm, device->default_stream(), DType::kF32, ps,
                                            m.module_names, o);
}

Status CheckGathered(ParamCoordinator& pc, const Model& m, int param) {
  ZERO_ASSIGN_OR_RETURN(const void* full, pc.Full(param));
  const float* f = static_cast<const float*>(full);
  for (int64_t e = 0; e < m.sizes[param]; ++e) {
    if (f[e] != Value(param, e)) {
      return InternalError("param " + std::to_string(param) + " element " + std::to_string(e) +
                           " = " + std::to_string(f[e]));
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
  EXPECT_TRUE(s.ok()) << s.ToString();
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
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST(ParamCoordinatorTest, KeepsModulesReusedSoonAndEvictsForDemand) {
  Status s = RunThreadRanks(2, [](int rank, Communicator* comm, Device* device) -> Status {
    Model m = FourBlocks();
    ParamCoordinatorOptions o;
    o.prefetch_bucket_numel = 0;    // no prefetch
    o.max_live_numel = 220;         // two modules
    o.max_reuse_distance = 1 << 30;
    ZERO_ASSIGN_OR_RETURN(auto pc, Build(m, rank, 2, comm, device, o, 0));
    int64_t peak = 0;
    ZERO_RETURN_IF_ERROR(RunMicroStep(*pc, m, &peak));
    const int64_t gathers_first = pc->stats().gathers;
    ZERO_RETURN_IF_ERROR(RunMicroStep(*pc, m, &peak));
    const ParamCoordinatorStats& st = pc->stats();
    if (st.kept_modules == 0) return InternalError("nothing kept");
    // b3 is used twice in a row: kept, so the second micro step gathers less.
    if (st.gathers - gathers_first >= gathers_first) return InternalError("keeping saved no gathers");
    if (st.max_live_numel_seen > o.max_live_numel) return InternalError("over the live limit");
    if (st.evicted_modules == 0) return InternalError("no eviction");
    return OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s.ToString();
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
  EXPECT_TRUE(s.ok()) << s.ToString();
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
  EXPECT_TRUE(s.ok()) << s.ToString();
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
  EXPECT_TRUE(s.ok()) << s.ToString();
}

}  // namespace
}  // namespace zero
