// Checkpoint format: the on-disk layout of a ZeRO training checkpoint, its writers and verified
// readers, and the repartitioning that loads a checkpoint at any data-parallel world size.
//
// Layout (DeepSpeed-like; docs/checkpoints.md has the byte layout):
//   <dir>/latest                                   the tag of the newest complete checkpoint
//   <dir>/<tag>/metadata.json                      counters, loss scaler, scheduler, config, the
//                                                  parameter table and every rank file's size+CRC
//   <dir>/<tag>/zero_rank_<r>_optim_states.bin     rank r's slice [begin, end) of every parameter's
//                                                  padded fp32 master weights, exp_avg, exp_avg_sq
// The format does not depend on the ZeRO stage: at stage 0 (nothing partitioned) each rank writes
// the slice PartitionRange(numel, rank, world) of its full state, exactly as stages 1-3 write
// their partition, so every stage saves the same bytes and loads at any stage and world size.
//
// Write protocol (collective; engine/checkpoint/checkpoint.h's SaveCheckpoint runs it over a Communicator):
//   1. rank 0:        CleanStaleSaves(dir), root = CreateStagingRoot(dir, tag), broadcast root
//   2. every rank r:  WriteRankFile(root, tag, r, world, shards)            (atomic, fsynced)
//   3. all ranks:     agree that step 2 succeeded everywhere: an all-reduce(max) of per-rank
//                     failure flags, with a timeout, which is also the barrier. A failure
//                     anywhere fails the save on every rank; <dir>/<tag> and `latest` are untouched.
//   4. rank 0 only:   WriteCheckpointMetadata(root, tag, meta): checks that all `world` rank files
//                     exist with this world size in their headers (reading their 48-byte headers
//                     and trailers), records their sizes and checksums in metadata.json (atomic,
//                     sealed with its own CRC32C); InstallStagedTag(root, dir, tag) (an atomic
//                     exchange when the tag exists); WriteLatest(dir, tag); RemoveTree(root).
//   5. all ranks:     broadcast rank 0's result (so all return the same Status).
// <dir>/<tag> always holds a complete checkpoint (the old or the new one) and `latest` names one,
// whatever point a crash hits (docs/checkpoints.md, "Atomicity"). The checkpoint directory must be
// shared by all ranks (one filesystem) for step 4 and for loading at another world size.
//
// Load: LoadShardsForRank(dir, tag, model, rank, world) reads every old rank's file (one at a
// time), verifies it against metadata.json, and returns this rank's new partition of each model
// parameter, whatever world size the checkpoint was saved with (no "universal" conversion step).
// LoadFullState returns the full unpadded tensors (zero_to_fp32, tests); ShardFor slices it.
//
// Every reader verifies sizes and CRC32C checksums and reports the file, the rank and what is
// wrong. All functions are thread-safe (they share no state); files are read and written with
// checkpoint_io.h. This file must not depend on the Engine's internals: it sees only ParamShards.
//
// The public entry: including it gives the whole format. One header per concern:
//   checkpoint_directory.h    tag names, file names, `latest`, staging and the swap
//   checkpoint_metadata.h     metadata.json: CheckpointMeta, its JSON, its seal, format versions
//   checkpoint_rank_file.h    zero_rank_<r>_optim_states.bin: ParamShard, the binary layout
//   checkpoint_repartition.h  PartitionRange, full tensors, loading at another world size
// This header adds only step 4's join of the rank files and the metadata (WriteCheckpointMetadata,
// FinalizeCheckpoint), the one place that reads the former to write the latter.
#pragma once

#include <string>

#include "engine/checkpoint/directory.h"
#include "engine/checkpoint/metadata.h"
#include "engine/checkpoint/rank_file.h"
#include "engine/checkpoint/repartition.h"
#include "runtime/file_system.h"
#include "runtime/status.h"

namespace zero {

// Step 4 of the write protocol, on rank 0 after every rank's WriteRankFile succeeded: fills
// meta.tag and meta.rank_files from the files on disk (ReadRankFileInfo; when the caller already
// gathered the RankFileInfos into meta.rank_files, they must match the disk), then WriteMetadata,
// then WriteLatest. Missing rank files: FAILED_PRECONDITION naming them and the world size, saying
// save must be called on every rank; `latest` is left as it was. `fs`: null: the POSIX file system.
Status FinalizeCheckpoint(const std::string& dir, const std::string& tag, CheckpointMeta meta,
                          FileSystem* fs = nullptr);
// FinalizeCheckpoint without `latest`: checks the rank files, writes metadata.json.
Status WriteCheckpointMetadata(const std::string& dir, const std::string& tag, CheckpointMeta meta,
                               FileSystem* fs = nullptr);

}  // namespace zero
