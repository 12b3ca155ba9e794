#include "zero/allgather_bucket.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/thread_ranks.h"
#include "runtime/cpu_device.h"
#include "runtime/dtype.h"
#include "testing/status_matchers.h"
#include "zero/partition.h"

namespace zero {
namespace {

TEST(BucketedAllGatherTest, PlanGroupsGreedilyAndNeverSplits) {
  using Buckets = std::vector<std::pair<size_t, size_t>>;
  // World 2, shards 3, 1, 4, 10, 2: gathered 6, 2, 8, 20, 4.
  const std::vector<int64_t> shards = {3, 1, 4, 10, 2};
  EXPECT_EQ(BucketedAllGather::Plan(shards, 2, 1000), (Buckets{{0, 5}}));
  EXPECT_EQ(BucketedAllGather::Plan(shards, 2, 16), (Buckets{{0, 3}, {3, 4}, {4, 5}}));
  EXPECT_EQ(BucketedAllGather::Plan(shards, 2, 8), (Buckets{{0, 2}, {2, 3}, {3, 4}, {4, 5}}));
  EXPECT_EQ(BucketedAllGather::Plan(shards, 2, 1), (Buckets{{0, 1}, {1, 2}, {2, 3}, {3, 4}, {4, 5}}));
  EXPECT_TRUE(BucketedAllGather::Plan({}, 2, 10).empty());
}

// Every rank ends with every parameter in full, whatever the bucket size, in fp32 and bf16.
TEST(BucketedAllGatherTest, EveryRankGetsEveryFullParameter) {
  const std::vector<int64_t> sizes = {7, 1, 30, 4, 0, 11, 2};
  for (int world : {1, 2, 3}) {
    for (DType t : {DType::kF32, DType::kBF16}) {
      for (int64_t bucket : {1, 9, 40, 1000}) {
        std::vector<int64_t> collectives(world, 0);
        Status s = RunThreadRanks(world, [&](int rank, Communicator* comm, Device* device) -> Status {
          BucketedAllGatherOptions o;
          o.dtype = t;
          o.bucket_numel = bucket;
          BucketedAllGather gather(device, comm, device->default_stream(), o);
          // Full padded parameters, garbage everywhere but this rank's shard (written by fill).
          std::vector<std::vector<uint8_t>> full(sizes.size());
          std::vector<AllGatherItem> items;
          for (size_t i = 0; i < sizes.size(); ++i) {
            const ShardSpec sp = MakeShardSpec(sizes[i], world, rank);
            full[i].assign(static_cast<size_t>(sp.padded) * SizeOf(t), 0xAB);
            items.push_back({static_cast<int>(i), full[i].data(), sp.shard});
          }
          auto value = [](size_t i, int64_t e) { return 0.5f * static_cast<float>(e) + 100.0f * i; };
          auto fill = [&](int param, void* dst) -> Status {
            const ShardSpec sp = MakeShardSpec(sizes[param], world, rank);
            for (int64_t k = 0; k < sp.shard; ++k) {
              const int64_t e = sp.begin + k;
              StoreFromFloat(dst, t, k, e < sizes[param] ? value(param, e) : 0.0f);
            }
            return OkStatus();
          };
          for (int round = 0; round < 2; ++round) {  // the second reuses the pooled buffers
            ZERO_RETURN_IF_ERROR(gather.Run(items, fill));
            ZERO_RETURN_IF_ERROR(device->SynchronizeStream(device->default_stream()));
            for (size_t i = 0; i < sizes.size(); ++i) {
              const int64_t padded = PaddedNumel(sizes[i], world);
              for (int64_t e = 0; e < padded; ++e) {
                const float want = e < sizes[i] ? value(i, e) : 0.0f;
                const float got = LoadAsFloat(full[i].data(), t, e);
                uint8_t rounded[4];
                StoreFromFloat(rounded, t, 0, want);
                if (FloatBits(got) != FloatBits(LoadAsFloat(rounded, t, 0))) {
                  return InternalError("param " + std::to_string(i) + " elem " + std::to_string(e) + " got " +
                                       std::to_string(got) + " want " + std::to_string(want));
                }
              }
            }
          }
          collectives[rank] = gather.collectives_issued();
          return OkStatus();
        });
        SCOPED_TRACE("world " + std::to_string(world) + " " + DTypeName(t) + " bucket " + std::to_string(bucket));
        EXPECT_OK(s);
        if (world == 1) {
          EXPECT_EQ(collectives[0], 0);
        } else {
          std::vector<int64_t> shards;
          for (int64_t n : sizes) {
            if (n > 0) shards.push_back(ShardNumel(n, world));
          }
          const int64_t per_run = static_cast<int64_t>(BucketedAllGather::Plan(shards, world, bucket).size());
          EXPECT_EQ(collectives[0], 2 * per_run);
          if (bucket == 1000) {
            EXPECT_EQ(per_run, 1);
          }
          if (bucket == 1) {
            EXPECT_EQ(per_run, 6);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace zero
