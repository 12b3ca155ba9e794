// Checkpoint repartitioning: loading a checkpoint saved at one dp world size (and any ZeRO stage)
// into another. It owns the partition a rank saves and loads (PartitionRange), the reassembly of
// the full tensors from every old rank's slices (LoadFullState: each element covered exactly once),
// the model check (CheckModelMatches) and the load the Engine calls (LoadShardsForRank), which
// holds one old rank file at a time in host memory. There is no "universal" conversion step: any
// checkpoint loads at any world size. It reads files only through ReadMetadata and ReadRankFile
// (so everything it returns was verified) and writes none. Thread-safe (no shared state). It must
// not depend on the Engine's internals: it sees only ParamShards and ParamSignatures.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/checkpoint/metadata.h"
#include "engine/checkpoint/rank_file.h"
#include "runtime/file_system.h"
#include "runtime/status.h"
#include "zero/partition.h"

namespace zero {

// --- partition arithmetic (zero/partition.h's PaddedNumel is the single definition) ----------
struct ElementRange {
  int64_t begin = 0;
  int64_t end = 0;
};
// Rank `rank`'s elements [rank * n_pad / world, (rank + 1) * n_pad / world) of the padded
// parameter, n_pad = PaddedNumel(numel, world). REQUIRES: numel >= 0, 0 <= rank < world.
ElementRange PartitionRange(int64_t numel, int rank, int world);

// --- full tensors -------------------------------------------------------------------------------
struct FullParam {
  std::string name;
  std::vector<int64_t> shape;
  std::string module;
  int64_t numel = 0;
  std::vector<float> master, exp_avg, exp_avg_sq;  // numel each, padding dropped
};
struct FullState {
  CheckpointMeta meta;
  std::vector<FullParam> params;  // metadata order
  const FullParam* Find(const std::string& name) const;
};

// Reads every rank file of the checkpoint and reassembles the full tensors. The slices of each
// parameter must cover [0, numel) exactly once (errors name the parameter and the gap or overlap).
// `fs` (here and below): where (null: the POSIX file system).
Result<FullState> LoadFullState(const std::string& dir, const std::string& tag, FileSystem* fs = nullptr);

// Rank `rank`'s PartitionRange slice of full host arrays (numel floats each),
// padding zero, as partitioned stages hold it. REQUIRES: no negative dim, 0 <= rank < world.
ParamShard SliceFullParam(const std::string& name, const std::vector<int64_t>& shape, const std::string& module,
                          const float* master, const float* exp_avg, const float* exp_avg_sq, int rank, int world);

// Pure: the shards rank `new_rank` of `new_world` owns (PartitionRange of every parameter, in
// `full` order), padding elements zero. ShardFor(full, 0, 1) gives the full tensors (stage 0).
std::vector<ParamShard> ShardFor(const FullState& full, int new_rank, int new_world);

// --- loading into a model -----------------------------------------------------------------------
// A parameter as the model being loaded registers it.
struct ParamSignature {
  std::string name;
  std::vector<int64_t> shape;
};
// The checkpoint's parameters and the model's must be the same set of names with the same shapes
// (order may differ). Errors (INVALID_ARGUMENT) list each difference: "parameter 'fc.weight':
// checkpoint shape [3, 4], model shape [4, 3]", names missing on either side.
Status CheckModelMatches(const CheckpointMeta& meta, const std::vector<ParamSignature>& model);

// What the Engine's load calls: checks the model against the metadata, then reads the old rank
// files one at a time (host memory: one old rank file plus the result) and returns rank `rank` of
// `world`'s shard of every model parameter, in `model` order, with range PartitionRange(numel,
// rank, world) and zero padding. Stage 0 passes rank 0, world 1 to get full tensors. `meta_out`
// (optional) receives the metadata (counters, loss scaler, scheduler, config).
Result<std::vector<ParamShard>> LoadShardsForRank(const std::string& dir, const std::string& tag,
                                                  const std::vector<ParamSignature>& model, int rank, int world,
                                                  CheckpointMeta* meta_out = nullptr, FileSystem* fs = nullptr);

}  // namespace zero
