// Partition math: how one parameter is sharded over the data-parallel ranks, and how per-parameter
// pieces are laid out in the engine's flat buffers. Pure functions and plain values; no memory, no
// Device, no communication.
//
// Every parameter is sharded on its own: numel n is padded to n_pad = ceil(n/N)*N (n = 0 gives 0)
// and rank r owns elements [r*shard, (r+1)*shard) of the padded parameter, shard = n_pad/N. The
// valid elements of rank r's shard are the first ShardValidNumel(n, N, r) of it; the rest is
// padding (always zero in the engine's buffers). Tail ranks may hold only padding (n < N).
#pragma once

#include <cstdint>
#include <vector>

namespace zero {

// ceil(n/N)*N; 0 for n == 0. REQUIRES: n >= 0, world_size >= 1.
int64_t PaddedNumel(int64_t numel, int world_size);
// PaddedNumel(n, N) / N.
int64_t ShardNumel(int64_t numel, int world_size);
// First element (in the padded parameter) of rank's shard: rank * ShardNumel(n, N).
int64_t ShardBegin(int64_t numel, int world_size, int rank);
// How many elements of rank's shard are real (not padding): clamp(n - rank*shard, 0, shard).
int64_t ShardValidNumel(int64_t numel, int world_size, int rank);

// The sharding of one parameter, all of the above in one value.
struct ShardSpec {
  int64_t numel = 0;
  int world_size = 1;
  int rank = 0;
  int64_t padded = 0;  // n_pad
  int64_t shard = 0;   // n_pad / N
  int64_t begin = 0;   // rank * shard
  int64_t valid = 0;   // real elements in this rank's shard
};
ShardSpec MakeShardSpec(int64_t numel, int world_size, int rank);

// Offsets of consecutive pieces of the given sizes in one flat buffer, each piece starting at a
// multiple of `alignment` elements (the gaps are part of the buffer and kept zero by the engine).
struct FlatLayout {
  std::vector<int64_t> offset;  // offset[i] of piece i, in elements
  std::vector<int64_t> size;    // size[i], in elements
  int64_t total = 0;            // elements in the whole buffer (end of the last piece, aligned)
};
// REQUIRES: alignment >= 1, sizes >= 0.
FlatLayout MakeFlatLayout(const std::vector<int64_t>& sizes, int64_t alignment);

// Rounds n up to a multiple of alignment.
inline int64_t AlignUp(int64_t n, int64_t alignment) { return (n + alignment - 1) / alignment * alignment; }

}  // namespace zero
