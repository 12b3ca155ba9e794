// Checkpoint rank file: <dir>/<tag>/zero_rank_<r>_optim_states.bin, one rank's slice of every
// parameter's fp32 master weights, exp_avg and exp_avg_sq. It owns the binary layout (a 48-byte
// header with its own CRC32C, one record per parameter, an 8-byte trailer holding the CRC32C of
// everything before it; docs/checkpoints.md has the bytes), the checks on what a rank writes, and
// the verified reader. A reader checks a file against the metadata.json that lists it (size,
// checksum, records matching the param table); it does not read or write metadata.json itself
// (checkpoint_metadata.h) nor reassemble slices across ranks (checkpoint_repartition.h).
// Thread-safe (no shared state); files through checkpoint_io.h (atomic, fsynced).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/checkpoint/metadata.h"
#include "runtime/file_system.h"
#include "runtime/status.h"

namespace zero {

// One parameter's slice [begin, end) of its padded fp32 state, as one rank holds it. Elements at
// indices >= numel are padding (saved as given, dropped on load; zero by convention).
struct ParamShard {
  std::string name;
  std::vector<int64_t> shape;  // numel = product (1 for a scalar, shape {})
  std::string module;
  int64_t numel = 0;
  int64_t begin = 0;
  int64_t end = 0;
  std::vector<float> master, exp_avg, exp_avg_sq;  // end - begin each
};

// Writes rank `rank`'s file atomically (creating <dir>/<tag>/ if needed). Checks each shard:
// numel == product(shape), 0 <= begin <= end <= PaddedNumel(numel, world), and the three arrays
// hold end - begin floats; errors name the parameter. Returns the file's size and checksum.
// `fs` (here and below): where (null: the POSIX file system); it hears "writing_rank_file".
Result<RankFileInfo> WriteRankFile(const std::string& dir, const std::string& tag, int rank, int world,
                                   const std::vector<ParamShard>& shards, FileSystem* fs = nullptr);

// Size and checksum of a rank file, from its header and trailer (the contents are not read), and
// checks that its header names `rank` and `world`. Missing: NOT_FOUND naming the file.
Result<RankFileInfo> ReadRankFileInfo(const std::string& dir, const std::string& tag, int rank, int world,
                                      FileSystem* fs = nullptr);

// Reads and verifies rank `rank`'s file against `meta` (size, CRC32C, header, records matching the
// param table): missing file: NOT_FOUND naming it and the world size the checkpoint was saved with;
// truncated or corrupt: DATA_LOSS naming the file and the sizes or checksums.
Result<std::vector<ParamShard>> ReadRankFile(const std::string& dir, const std::string& tag, int rank,
                                             const CheckpointMeta& meta, FileSystem* fs = nullptr);

}  // namespace zero
