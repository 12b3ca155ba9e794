#include "zero/gradient_bucket.h"

#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <vector>

#include "comm/thread_ranks.h"
#include "runtime/cpu_device.h"
#include "zero/grad_reducer.h"
#include "zero/partition.h"

namespace zero {
namespace {

TEST(BucketLayoutTest, ShardLayoutOffsets) {
  // Three parameters of 5, 2 and 8 elements over 3 ranks: shards 2, 1, 3; segment 6.
  BucketLayout l(BucketKind::kShards, 3, {{0, 5}, {1, 2}, {2, 8}});
  EXPECT_EQ(l.segment(), 6);
  EXPECT_EQ(l.send_numel(), 18);
  EXPECT_EQ(l.recv_numel(), 6);
  EXPECT_EQ(l.item_offset(0), 0);
  EXPECT_EQ(l.item_offset(1), 2);
  EXPECT_EQ(l.item_offset(2), 3);
  EXPECT_EQ(l.item_extent(2), 3);
  EXPECT_EQ(l.send_offset(0, 0), 0);
  EXPECT_EQ(l.send_offset(1, 1), 8);
  EXPECT_EQ(l.send_offset(2, 2), 15);

  BucketLayout full(BucketKind::kFull, 3, {{4, 5}, {7, 2}});
  EXPECT_EQ(full.segment(), 7);
  EXPECT_EQ(full.send_numel(), 7);
  EXPECT_EQ(full.send_offset(1, 2), 5);
}

TEST(BucketLayoutTest, PackPutsEachShardInItsRankSegmentWithZeroPadding) {
  CpuDevice device;
  const int world = 3;
  std::vector<int64_t> sizes = {5, 2, 8, 1};
  std::vector<BucketItem> items;
  for (int i = 0; i < 4; ++i) items.push_back({i, sizes[i]});
  BucketLayout l(BucketKind::kShards, world, items);
  std::vector<float> send(l.send_numel(), -1.0f);
  std::vector<std::vector<float>> grads;
  for (int i = 0; i < 4; ++i) {
    std::vector<float> g(sizes[i]);
    for (int64_t k = 0; k < sizes[i]; ++k) g[k] = 100.0f * (i + 1) + k;
    grads.push_back(g);
  }
  for (int j = 0; j < 4; ++j) {
    ASSERT_TRUE(PackBucketItem(&device, nullptr, l, j, grads[j].data(), DType::kF32, send.data(),
                               DType::kF32)
                    .ok());
  }
  for (int r = 0; r < world; ++r) {
    for (int j = 0; j < 4; ++j) {
      const int64_t shard = ShardNumel(sizes[j], world);
      for (int64_t k = 0; k < shard; ++k) {
        const int64_t src = r * shard + k;
        const float want = src < sizes[j] ? grads[j][src] : 0.0f;
        EXPECT_EQ(send[r * l.segment() + l.item_offset(j) + k], want)
            << "rank " << r << " item " << j << " k " << k;
      }
    }
  }
}

TEST(BucketLayoutTest, PackCastsToTheCommDtype) {
  CpuDevice device;
  BucketLayout l(BucketKind::kShards, 2, {{0, 3}});
  std::vector<float> g = {1.0f, 1.00390625f, -2.5f};
  std::vector<uint16_t> send(l.send_numel(), 0xffff);
  ASSERT_TRUE(PackBucketItem(&device, nullptr, l, 0, g.data(), DType::kF32, send.data(), DType::kBF16).ok());
  EXPECT_EQ(Bf16ToFloat(send[0]), 1.0f);
  EXPECT_EQ(Bf16ToFloat(send[1]), 1.0f);  // rounded to nearest even
  EXPECT_EQ(Bf16ToFloat(send[2]), -2.5f);
  EXPECT_EQ(send[3], 0);
}

// Every rank's shard of every parameter receives the mean over ranks, through several buckets
// in flight, whatever the bucket size.
TEST(GradientReducerTest, ReduceScatterGivesEachRankTheMeanOfItsShards) {
  const int world = 3;
  const std::vector<int64_t> sizes = {7, 1, 30, 4, 0, 11};
  for (int64_t bucket : {1, 8, 40, 1000}) {
    for (bool overlap : {true, false}) {
      Status s = RunThreadRanks(world, [&](int rank, Communicator* comm, Device* device) -> Status {
        GradientReducerOptions o;
        o.kind = BucketKind::kShards;
        o.bucket_numel = bucket;
        o.overlap = overlap;
        std::vector<std::vector<float>> got(sizes.size());
        GradientReducer reducer(device, comm, device->default_stream(), o,
                                [&](int param, const void* reduced) -> Status {
                                  const float* r = static_cast<const float*>(reduced);
                                  got[param].assign(r, r + ShardNumel(sizes[param], world));
                                  return OkStatus();
                                });
        std::vector<std::vector<float>> grads(sizes.size());
        int released = 0;
        // Reported in reverse, as backward does.
        for (int i = static_cast<int>(sizes.size()) - 1; i >= 0; --i) {
          grads[i].resize(sizes[i]);
          for (int64_t k = 0; k < sizes[i]; ++k) grads[i][k] = (rank + 1) * 1.0f + k + 10.0f * i;
          ZERO_RETURN_IF_ERROR(reducer.Add(i, grads[i].data(), DType::kF32, sizes[i], [&]() {
            ++released;
            return OkStatus();
          }));
        }
        ZERO_RETURN_IF_ERROR(reducer.Drain());
        if (released != static_cast<int>(sizes.size())) return InternalError("not all released");
        for (size_t i = 0; i < sizes.size(); ++i) {
          const ShardSpec sp = MakeShardSpec(sizes[i], world, rank);
          for (int64_t k = 0; k < sp.shard; ++k) {
            const int64_t e = sp.begin + k;
            float want = 0.0f;
            if (e < sizes[i]) want = (((1.0f + e + 10.0f * i) + (2.0f + e + 10.0f * i)) + (3.0f + e + 10.0f * i)) / 3.0f;
            if (got[i][k] != want) {
              return InternalError("param " + std::to_string(i) + " elem " + std::to_string(e) +
                                   " got " + std::to_string(got[i][k]) + " want " + std::to_string(want));
            }
          }
        }
        return OkStatus();
      });
      EXPECT_TRUE(s.ok()) << "bucket " << bucket << " overlap " << overlap << ": " << s.ToString();
    }
  }
}

TEST(GradientReducerTest, AllReduceFullAndSumOp) {
  const int world = 2;
  const std::vector<int64_t> sizes = {5, 3, 9};
  Status s = RunThreadRanks(world, [&](int rank, Communicator* comm, Device* device) -> Status {
    GradientReducerOptions o;
    o.kind = BucketKind::kFull;
    o.op = ReduceOp::kSum;
    o.bucket_numel = 6;
    std::vector<std::vector<float>> got(sizes.size());
    GradientReducer reducer(device, comm, device->default_stream(), o,
                            [&](int param, const void* reduced) -> Status {
                              const float* r = static_cast<const float*>(reduced);
                              got[param].assign(r, r + sizes[param]);
                              return OkStatus();
                            });
    std::vector<std::vector<float>> grads(sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i) {
      grads[i].assign(sizes[i], 1.5f * (rank + 1) + i);
      ZERO_RETURN_IF_ERROR(reducer.Add(i, grads[i].data(), DType::kF32, sizes[i], nullptr));
    }
    ZERO_RETURN_IF_ERROR(reducer.Drain());
    if (reducer.buckets_launched() != 2) return InternalError("expected 2 buckets");
    for (size_t i = 0; i < sizes.size(); ++i) {
      for (float v : got[i]) {
        if (v != (1.5f + i) + (3.0f + i)) return InternalError("wrong sum");
      }
    }
    return OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s.ToString();
}

}  // namespace
}  // namespace zero
