#include "zero/gradient_bucket.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <vector>

#include "comm/thread_ranks.h"
#include "runtime/cpu_device.h"
#include "testing/status_matchers.h"
#include "zero/grad_partition.h"
#include "zero/grad_reducer.h"
#include "zero/grad_window.h"
#include "zero/partition.h"

namespace zero {
namespace {

// What a GradientReducer delivers, observed: a device partition with one piece per parameter (its
// full gradient for kFull, this rank's shard for kShards), every contribution a window's first
// (GradPartition::Add overwrites: 0.0f + reduced, exact); Got(i) reads piece i back.
class Received final : public PartitionWindow {
 public:
  Received(Device* device, BucketKind kind, int world, const std::vector<int64_t>& sizes) {
    std::vector<GradPiece> pieces;
    int64_t total = 0;
    for (int64_t n : sizes) {
      const int64_t numel = kind == BucketKind::kFull ? n : ShardNumel(n, world);
      pieces.push_back({total, numel});
      total += numel;
    }
    auto p = CreateDeviceGradPartition(device, device->default_stream(), std::max<int64_t>(total, 1), pieces);
    ZERO_CHECK(p.ok());
    partition_ = std::move(p).value();
  }
  GradPartition* partition() { return partition_.get(); }
  std::vector<float> Got(int i) {
    std::vector<float> out(static_cast<size_t>(partition_->piece(i).n));
    ZERO_CHECK(partition_->Read(i, out.data()).ok());
    return out;
  }
  bool FirstToPartition(int i) override { return true; }
  bool AtBoundary() const override { return false; }

 private:
  std::unique_ptr<GradPartition> partition_;
};

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
        Received received(device, o.kind, world, sizes);
        GradientReducer reducer(device, comm, device->default_stream(), o, received.partition(), &received);
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
          const std::vector<float> got = received.Got(static_cast<int>(i));
          const ShardSpec sp = MakeShardSpec(sizes[i], world, rank);
          for (int64_t k = 0; k < sp.shard; ++k) {
            const int64_t e = sp.begin + k;
            float want = 0.0f;
            if (e < sizes[i])
              want = (((1.0f + e + 10.0f * i) + (2.0f + e + 10.0f * i)) + (3.0f + e + 10.0f * i)) / 3.0f;
            if (got[k] != want) {
              return InternalError("param " + std::to_string(i) + " elem " + std::to_string(e) + " got " +
                                   std::to_string(got[k]) + " want " + std::to_string(want));
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
    Received received(device, o.kind, world, sizes);
    GradientReducer reducer(device, comm, device->default_stream(), o, received.partition(), &received);
    std::vector<std::vector<float>> grads(sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i) {
      grads[i].assign(sizes[i], 1.5f * (rank + 1) + i);
      ZERO_RETURN_IF_ERROR(reducer.Add(i, grads[i].data(), DType::kF32, sizes[i], nullptr));
    }
    ZERO_RETURN_IF_ERROR(reducer.Drain());
    if (reducer.buckets_launched() != 2) return InternalError("expected 2 buckets");
    for (size_t i = 0; i < sizes.size(); ++i) {
      for (float v : received.Got(static_cast<int>(i))) {
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
          Received received(device, kind, world, sizes);
          GradientReducer reducer(device, comm, device->default_stream(), o, received.partition(), &received);
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
          if (rank == 1) {
            for (size_t i = 0; i < sizes.size(); ++i) mine[i] = received.Got(static_cast<int>(i));
          }
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

// The reducer adds each reduced shard into the partition itself with the window's flags (kAdd:
// the first contribution of a window overwrites, later ones add) or stores it (kStore: stages
// 0/1's reduced window sums), asking the window when the reduction is processed.
TEST(GradientReducerTest, DeliversIntoThePartitionWithTheWindowsFlags) {
  const int world = 2;
  const std::vector<int64_t> sizes = {6, 3};
  for (ReducedDelivery delivery : {ReducedDelivery::kAdd, ReducedDelivery::kStore}) {
    Status s = RunThreadRanks(world, [&](int rank, Communicator* comm, Device* device) -> Status {
      GradientReducerOptions o;
      o.kind = BucketKind::kShards;
      o.delivery = delivery;
      o.bucket_numel = 4;
      Received shape(device, o.kind, world, sizes);  // only for the partition
      GradWindow window;
      window.Init(static_cast<int>(sizes.size()), /*managed=*/true, /*gas=*/2);
      GradientReducer reducer(device, comm, device->default_stream(), o, shape.partition(), &window);
      std::vector<std::vector<float>> grads(sizes.size());
      for (int micro = 0; micro < 2; ++micro) {
        for (int i = static_cast<int>(sizes.size()) - 1; i >= 0; --i) {
          grads[i].assign(sizes[i], 0.0f);
          for (int64_t k = 0; k < sizes[i]; ++k) grads[i][k] = 1.0f + k + 10.0f * i + 100.0f * micro + rank;
          ZERO_RETURN_IF_ERROR(reducer.Add(i, grads[i].data(), DType::kF32, sizes[i], nullptr));
        }
        ZERO_RETURN_IF_ERROR(reducer.Drain());
        window.EndBackward();
      }
      for (size_t i = 0; i < sizes.size(); ++i) {
        if (delivery == ReducedDelivery::kAdd && !window.part_written()[i]) return InternalError("piece not marked");
        const std::vector<float> got = shape.Got(static_cast<int>(i));
        const ShardSpec sp = MakeShardSpec(sizes[i], world, rank);
        for (int64_t k = 0; k < sp.shard; ++k) {
          const int64_t e = sp.begin + k;
          if (e >= sizes[i]) continue;
          // The mean over ranks of each micro step: (x + (x + 1)) / 2 = x + 0.5.
          const float first = 1.0f + e + 10.0f * i + 0.5f;
          const float second = first + 100.0f;
          const float want = delivery == ReducedDelivery::kAdd ? first + second : second;
          if (got[k] != want) {
            return InternalError("param " + std::to_string(i) + " elem " + std::to_string(e) + " got " +
                                 std::to_string(got[k]) + " want " + std::to_string(want));
          }
        }
      }
      return OkStatus();
    });
    EXPECT_OK(s) << (delivery == ReducedDelivery::kAdd ? "kAdd" : "kStore");
  }
}

}  // namespace
}  // namespace zero
