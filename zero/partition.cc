#include "zero/partition.h"

#include <algorithm>

#include "runtime/status.h"

namespace zero {

int64_t PaddedNumel(int64_t numel, int world_size) {
  ZERO_CHECK(numel >= 0 && world_size >= 1);
  return (numel + world_size - 1) / world_size * world_size;
}

int64_t ShardNumel(int64_t numel, int world_size) { return PaddedNumel(numel, world_size) / world_size; }

int64_t ShardBegin(int64_t numel, int world_size, int rank) {
  ZERO_CHECK(rank >= 0 && rank < world_size);
  return static_cast<int64_t>(rank) * ShardNumel(numel, world_size);
}

int64_t ShardValidNumel(int64_t numel, int world_size, int rank) {
  const int64_t shard = ShardNumel(numel, world_size);
  const int64_t left = numel - ShardBegin(numel, world_size, rank);
  return std::clamp<int64_t>(left, 0, shard);
}

ShardSpec MakeShardSpec(int64_t numel, int world_size, int rank) {
  ShardSpec s;
  s.numel = numel;
  s.world_size = world_size;
  s.rank = rank;
  s.padded = PaddedNumel(numel, world_size);
  s.shard = s.padded / world_size;
  s.begin = ShardBegin(numel, world_size, rank);
  s.valid = ShardValidNumel(numel, world_size, rank);
  return s;
}

FlatLayout MakeFlatLayout(const std::vector<int64_t>& sizes, int64_t alignment) {
  ZERO_CHECK(alignment >= 1);
  FlatLayout l;
  l.offset.reserve(sizes.size());
  l.size = sizes;
  int64_t at = 0;
  for (int64_t s : sizes) {
    ZERO_CHECK(s >= 0);
    at = AlignUp(at, alignment);
    l.offset.push_back(at);
    at += s;
  }
  l.total = AlignUp(at, alignment);
  return l;
}

}  // namespace zero
