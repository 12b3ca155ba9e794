// Checkpoint save/load as collectives: the write protocol of checkpoint_format.h run over a
// Communicator, so the Engine's SaveCheckpoint/LoadCheckpoint are one call each.
//
// The Engine hands over this rank's state as ParamShards (host fp32 copies of its partition of
// every parameter's master weights and AdamW moments; at stage 0, SliceFullParam cuts its full
// copies into the same partition ranges) plus a CheckpointMeta (counters, loss scaler, scheduler,
// dtype, stage, config, parameter table); it gets back its new partition on load, at whatever world
// size the checkpoint was saved. These functions use only the Communicator's host collectives
// (AllReduceHost, BroadcastHost), so they work on every backend; the Communicator's timeout bounds
// every wait. They own nothing and keep no state; all ranks must call them in the same order, like
// any collective.
//
// Save on rank 0 only (a frequent mistake with DeepSpeed, where it hangs): rank 0's first
// collective times out after CommOptions::timeout and SaveCheckpoint returns DEADLINE_EXCEEDED
// saying that save must be called on every rank; nothing has been written and `latest` is
// unchanged.
#pragma once

#include <string>
#include <vector>

#include "comm/communicator.h"
#include "engine/checkpoint/format.h"
#include "runtime/file_system.h"
#include "runtime/status.h"

namespace zero {

// Collective. Saves <dir>/<tag>: (1) all ranks agree on the tag, world size and parameter table
// (an all-reduce, which also detects ranks that did not call save); (2) rank 0 removes staging
// directories that interrupted saves left in <dir> (CleanStaleSaves) and creates this save's,
// <dir>/.zero_save.<pid>.<random>/, and broadcasts its name (first it locks <dir>, DirectoryLock in
// checkpoint_io.h, for the rest of the save: another job holding it fails the save on every rank
// with FAILED_PRECONDITION naming the holder, before anything is written or removed); (3) every rank writes its file
// into <staging>/<tag>/; (4) all ranks agree that every write succeeded; (5) rank 0 writes metadata.json there, swaps
// <staging>/<tag> into <dir>/<tag> atomically (an existing tag is exchanged, never deleted first), writes `latest`,
// removes the staging directory (holding the old copy); (6) rank 0's result is broadcast, so every rank returns the
// same Status. A crash or error at any step leaves <dir>/<tag> and `latest` as they were, or both at the complete new
// copy (once the swap is done); never a half-written checkpoint (docs/checkpoints.md, "Atomicity"). meta.params must
// list the parameters in the order of `shards` (MakeCheckpointParam), meta.dp_world_size must be comm->world_size();
// meta.tag and meta.rank_files are filled here. Every file operation goes through `fs` (null: the
// POSIX file system), which also hears the save's crash points (checkpoint_directory.h).
Status SaveCheckpoint(Communicator* comm, const std::string& dir, const std::string& tag, CheckpointMeta meta,
                      const std::vector<ParamShard>& shards, FileSystem* fs = nullptr);

struct LoadedCheckpoint {
  CheckpointMeta meta;             // as saved (dp_world_size is the saving world's)
  std::vector<ParamShard> shards;  // in `model` order
};

// Collective. Loads <dir>/<tag> (`tag` empty: the tag in <dir>/latest, resolved once by rank 0 and
// broadcast, so all ranks load the same one even if `latest` moves meanwhile). `partitioned`: each
// shard is this rank's PartitionRange of the parameter (stages 1-3); false: full tensors (stage 0).
// Fails on every rank if it fails on any; the message names the failing ranks (a rank's own error
// in full). Files are read through `fs` (null: the POSIX file system).
Result<LoadedCheckpoint> LoadCheckpoint(Communicator* comm, const std::string& dir, const std::string& tag,
                                        const std::vector<ParamSignature>& model, bool partitioned,
                                        FileSystem* fs = nullptr);

}  // namespace zero
