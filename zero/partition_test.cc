#include "zero/partition.h"

#include <gtest/gtest.h>

namespace zero {
namespace {

TEST(PartitionTest, PaddingAndShards) {
  EXPECT_EQ(PaddedNumel(0, 4), 0);
  EXPECT_EQ(ShardNumel(0, 4), 0);
  EXPECT_EQ(PaddedNumel(1, 1), 1);
  EXPECT_EQ(PaddedNumel(7, 2), 8);
  EXPECT_EQ(PaddedNumel(8, 2), 8);
  EXPECT_EQ(PaddedNumel(3, 8), 8);
  EXPECT_EQ(ShardNumel(3, 8), 1);
  EXPECT_EQ(ShardNumel(10, 3), 4);
  EXPECT_EQ(ShardBegin(10, 3, 2), 8);
  EXPECT_EQ(ShardValidNumel(10, 3, 0), 4);
  EXPECT_EQ(ShardValidNumel(10, 3, 2), 2);
  // n < N: tail ranks hold only padding.
  EXPECT_EQ(ShardValidNumel(3, 8, 2), 1);
  EXPECT_EQ(ShardValidNumel(3, 8, 3), 0);
  EXPECT_EQ(ShardValidNumel(3, 8, 7), 0);
  EXPECT_EQ(ShardValidNumel(0, 2, 1), 0);
}

TEST(PartitionTest, ShardsTileTheParameterForOddSizesAndWorlds) {
  for (int world = 1; world <= 8; ++world) {
    for (int64_t n : {0, 1, 2, 3, 5, 7, 8, 9, 13, 31, 64, 97, 1000, 1001}) {
      const int64_t padded = PaddedNumel(n, world);
      EXPECT_GE(padded, n);
      EXPECT_LT(padded - n, world);
      EXPECT_EQ(padded % world, 0);
      int64_t covered = 0;
      int64_t valid_total = 0;
      for (int r = 0; r < world; ++r) {
        const ShardSpec s = MakeShardSpec(n, world, r);
        EXPECT_EQ(s.begin, covered) << "n=" << n << " N=" << world << " r=" << r;
        EXPECT_EQ(s.shard, padded / world);
        EXPECT_GE(s.valid, 0);
        EXPECT_LE(s.valid, s.shard);
        // Valid elements are a prefix of the shard and contiguous across ranks.
        if (s.valid < s.shard) {
          for (int q = r + 1; q < world; ++q) EXPECT_EQ(ShardValidNumel(n, world, q), 0);
        }
        covered += s.shard;
        valid_total += s.valid;
      }
      EXPECT_EQ(covered, padded);
      EXPECT_EQ(valid_total, n);
    }
  }
}

TEST(PartitionTest, FlatLayoutAlignsEachPiece) {
  FlatLayout l = MakeFlatLayout({3, 0, 5, 128, 1}, 4);
  ASSERT_EQ(l.offset.size(), 5u);
  EXPECT_EQ(l.offset[0], 0);
  EXPECT_EQ(l.offset[1], 4);
  EXPECT_EQ(l.offset[2], 4);
  EXPECT_EQ(l.offset[3], 12);
  EXPECT_EQ(l.offset[4], 140);
  EXPECT_EQ(l.total, 144);
  FlatLayout packed = MakeFlatLayout({3, 5}, 1);
  EXPECT_EQ(packed.offset[1], 3);
  EXPECT_EQ(packed.total, 8);
  EXPECT_EQ(MakeFlatLayout({}, 64).total, 0);
}

}  // namespace
}  // namespace zero
