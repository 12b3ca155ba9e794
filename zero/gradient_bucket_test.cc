#include "zero/gradient_bucket.h"

#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <vector>

#include "comm/thread_ranks.h"
#include "runtime/cpu_device.h"
#include "testing/status_matchers.h"
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
    ASSERT_OK(PackBucketItem(&device, nullptr, l, j, grads[j].data(), DType::kF32, send.data(), DType::kF32));
  }
  for (int r = 0; r < world; ++r) {
    for (int j = 0; j < 4; ++j) {
      const int64_t shard = ShardNumel(sizes[j], world);
      for (int64_t k = 0; k < shard; ++k) {
        const int64_t src = r * shard + k;
        const float want = src < sizes[j] ? grads[j][src] : 0.0f;
        EXPECT_EQ(send[r * l.segment() + l.item_offset(j) + k], want) << "rank " << r << " item " << j << " k " << k;
      }
    }
  }
}

TEST(BucketLayoutTest, PackCastsToTheCommDtype) {
  CpuDevice device;
  BucketLayout l(BucketKind::kShards, 2, {{0, 3}});
  std::vector<float> g = {1.0f, 1.00390625f, -2.5f};
  std::vector<uint16_t> send(l.send_numel(), 0xffff);
  ASSERT_OK(PackBucketItem(&device, nullptr, l, 0, g.data(), DType::kF32, send.data(), DType::kBF16));
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
            if (e < sizes[i])
              want = (((1.0f + e + 10.0f * i) + (2.0f + e + 10.0f * i)) + (3.0f + e + 10.0f * i)) / 3.0f;
            if (got[i][k] != want) {
              return InternalError("param " + std::to_string(i) + " elem " + std::to_string(e) + " got " +
                                   std::to_string(got[i][k]) + " want " + std::to_string(want));
            }
          }
        }
        return OkStatus();
      });
      EXPECT_OK(s) << "bucket " << bucket << " overlap " << overlap;
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
    GradientReducer reducer(device, comm, device->default_stream(), o, [&](int param, const void* reduced) -> Status {
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
  EXPECT_OK(s);
}

// contiguous_gradients false (one collective per parameter straight from its padded buffer) and
// reduce_scatter false (all-reduce, keep this rank's segment) give the same values as the packed
// reduce-scatter, bitwise; per parameter with a receive area given allocates no staging.
TEST(GradientReducerTest, PerParameterAndAllReduceModesGiveTheSameValues) {
  const int world = 3;
  const std::vector<int64_t> sizes = {7, 1, 30, 4, 11};
  for (BucketKind kind : {BucketKind::kShards, BucketKind::kFull}) {
    for (DType src_t : {DType::kF32, DType::kBF16}) {
      std::vector<std::vector<std::vector<float>>> results;  // [mode][param] on rank 1
      for (int mode = 0; mode < 5; ++mode) {
        // 0: packed reduce-scatter; 1: packed all-reduce; 2: per parameter with recv; 3: per
        // parameter, recv null; 4: per parameter, all-reduce.
        const bool contiguous = mode <= 1;
        const bool scatter = !(mode == 1 || mode == 4);
        std::vector<std::vector<float>> mine(sizes.size());
        Status s = RunThreadRanks(world, [&](int rank, Communicator* comm, Device* device) -> Status {
          GradientReducerOptions o;
          o.kind = kind;
          o.comm_dtype = DType::kBF16;
          o.bucket_numel = 12;
          o.contiguous = contiguous;
          o.scatter = scatter;
          std::vector<std::vector<float>> got(sizes.size());
          GradientReducer reducer(
              device, comm, device->default_stream(), o, [&](int param, const void* reduced) -> Status {
                const int64_t n = kind == BucketKind::kFull ? sizes[param] : ShardNumel(sizes[param], world);
                got[param].resize(n);
                for (int64_t k = 0; k < n; ++k) got[param][k] = LoadAsFloat(reduced, DType::kBF16, k);
                return OkStatus();
              });
          // Padded buffers (zero padding) plus a receive area, in src_t.
          std::vector<std::vector<uint8_t>> bufs(sizes.size());
          int released = 0;
          for (int i = static_cast<int>(sizes.size()) - 1; i >= 0; --i) {
            const int64_t padded = PaddedNumel(sizes[i], world);
            const int64_t shard = ShardNumel(sizes[i], world);
            bufs[i].assign(static_cast<size_t>(padded + shard) * SizeOf(src_t), 0);
            for (int64_t k = 0; k < sizes[i]; ++k) {
              StoreFromFloat(bufs[i].data(), src_t, k, 0.37f * (rank + 1) + 0.011f * k + 1.3f * i);
            }
            void* recv = mode == 2 && src_t == DType::kBF16 ? ElementPtr(bufs[i].data(), src_t, padded) : nullptr;
            ZERO_RETURN_IF_ERROR(reducer.Add(
                i, bufs[i].data(), src_t, sizes[i],
                [&]() {
                  ++released;
                  return OkStatus();
                },
                recv));
          }
          ZERO_RETURN_IF_ERROR(reducer.Drain());
          if (released != static_cast<int>(sizes.size())) return InternalError("not all released");
          if (!contiguous && reducer.collectives_issued() != static_cast<int64_t>(sizes.size())) {
            return InternalError("expected one collective per parameter, got " +
                                 std::to_string(reducer.collectives_issued()));
          }
          if (mode == 2 && src_t == DType::kBF16 && reducer.staging_bytes() != 0) {
            return InternalError("per-parameter mode with a receive area allocated staging");
          }
          if (contiguous && reducer.collectives_issued() < 2) return InternalError("expected several buckets");
          if (rank == 1) mine = got;
          return OkStatus();
        });
        EXPECT_OK(s) << "mode " << mode;
        results.push_back(mine);
      }
      for (int mode = 1; mode < 5; ++mode) {
        ASSERT_EQ(results[mode].size(), results[0].size());
        for (size_t i = 0; i < results[0].size(); ++i) {
          ASSERT_EQ(results[mode][i].size(), results[0][i].size()) << "mode " << mode << " param " << i;
          for (size_t k = 0; k < results[0][i].size(); ++k) {
            EXPECT_EQ(FloatBits(results[mode][i][k]), FloatBits(results[0][i][k]))
                << "kind " << static_cast<int>(kind) << " " << DTypeName(src_t) << " mode " << mode << " param " << i
                << " elem " << k;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace zero
