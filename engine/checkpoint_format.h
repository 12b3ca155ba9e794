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
// Write protocol (collective; engine/checkpoint.h's SaveCheckpoint runs it over a Communicator):
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
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/status.h"
#include "zero/partition.h"

namespace zero {

// Version 2 added metadata.json's checksum; version 1 checkpoints still load (unverified metadata).
inline constexpr int kCheckpointFormatVersion = 2;
inline constexpr int kOldestReadableFormatVersion = 1;
inline constexpr const char* kZeroVersion = "zero 0.1.0";
inline constexpr const char* kLatestFileName = "latest";
inline constexpr const char* kMetadataFileName = "metadata.json";
// <dir>/.zero_save.<pid>.<random>/: one save's staging directory (see "Staging" below). Tags may
// not start with this prefix.
inline constexpr const char* kStagingPrefix = ".zero_save.";

// --- partition arithmetic (zero/partition.h's PaddedNumel is the single definition) ----------
struct ElementRange {
  int64_t begin = 0;
  int64_t end = 0;
};
// Rank `rank`'s elements [rank * n_pad / world, (rank + 1) * n_pad / world) of the padded
// parameter, n_pad = PaddedNumel(numel, world). REQUIRES: numel >= 0, 0 <= rank < world.
ElementRange PartitionRange(int64_t numel, int rank, int world);

// --- what one rank saves -----------------------------------------------------------------------
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

// --- metadata.json -----------------------------------------------------------------------------
struct CheckpointParam {
  std::string name;
  std::vector<int64_t> shape;
  std::string module;
  int64_t numel = 0;
  int64_t n_pad = 0;  // PaddedNumel(numel, dp_world_size)
};
// numel and n_pad computed from the shape and world size (-1 when the shape has a negative dim or
// world < 1; WriteMetadata then refuses it).
CheckpointParam MakeCheckpointParam(std::string name, std::vector<int64_t> shape,
                                    std::string module, int world);

struct RankFileInfo {
  std::string file;     // "zero_rank_<r>_optim_states.bin" (relative to the tag directory)
  uint64_t bytes = 0;   // whole file
  uint32_t crc32c = 0;  // of the file without its 8-byte trailer (the value the trailer holds)
  bool operator==(const RankFileInfo&) const = default;
};

// (Named Checkpoint* so they do not collide with zero/loss_scaler.h's LossScalerState and
// engine/lr_scheduler.h's LrSchedulerState, the live objects' own state types.)
struct CheckpointLossScaler {
  bool dynamic = false;
  double scale = 1.0;
  int64_t good_steps = 0;           // steps since the last overflow (growth counter)
  int64_t hysteresis = 0;           // overflows still tolerated before the scale drops
  int64_t last_overflow_step = -1;  // global step of the last overflow, -1 if none
};

struct CheckpointScheduler {
  std::string type;       // "" (constant), "WarmupLR", ... as in the config
  int64_t last_step = 0;  // steps the scheduler has taken
  double last_lr = 0.0;   // lr of the last applied step (informational)
};

struct CheckpointMeta {
  int format_version = kCheckpointFormatVersion;
  std::string zero_version = kZeroVersion;
  std::string tag;
  int64_t global_steps = 0;
  int64_t skipped_steps = 0;
  int64_t micro_steps = 0;
  int64_t adam_step = 0;
  CheckpointLossScaler loss_scaler;
  CheckpointScheduler scheduler;
  DType model_dtype = DType::kF32;
  int zero_stage = 0;
  int dp_world_size = 1;
  std::string config_json = "{}";        // the resolved config (ConfigToJson); must be JSON
  std::string client_state_json = "{}";  // the user's own state (DeepSpeed's client_state); JSON
  std::vector<CheckpointParam> params;   // in the order of every rank file's records
  std::vector<RankFileInfo> rank_files;  // index = rank; dp_world_size entries
};

// --- names --------------------------------------------------------------------------------------
// Tags name a directory: non-empty, at most 255 bytes, no '/', no whitespace or control
// characters, not "." or "..", not starting with kStagingPrefix.
Status ValidateTag(const std::string& tag);
std::string RankFileName(int rank);  // "zero_rank_<r>_optim_states.bin"
std::string TagDirectory(const std::string& dir, const std::string& tag);
// DeepSpeed's default tag: "global_step<N>".
std::string DefaultTag(int64_t global_steps);
// OK when `text` parses as JSON; else INVALID_ARGUMENT "<what>: not valid JSON: ...".
Status CheckJsonText(const std::string& text, const std::string& what);

// --- writing ------------------------------------------------------------------------------------
// Writes rank `rank`'s file atomically (creating <dir>/<tag>/ if needed). Checks each shard:
// numel == product(shape), 0 <= begin <= end <= PaddedNumel(numel, world), and the three arrays
// hold end - begin floats; errors name the parameter. Returns the file's size and checksum.
Result<RankFileInfo> WriteRankFile(const std::string& dir, const std::string& tag, int rank,
                                   int world, const std::vector<ParamShard>& shards);
// Writes metadata.json atomically. REQUIRES: meta.tag == tag, meta.rank_files has dp_world_size
// entries, every param's numel/n_pad agree with its shape and the world size, the JSON texts parse.
Status WriteMetadata(const std::string& dir, const std::string& tag, const CheckpointMeta& meta);
// Writes <dir>/latest = tag, atomically. Call only after the tag's metadata.json exists.
Status WriteLatest(const std::string& dir, const std::string& tag);
// The metadata.json text for a JSON object `json_text` (with or without a seal already): the
// text with a last entry "metadata_crc32c" holding the CRC32C of every byte before that entry
// (docs/checkpoints.md). For tools and tests that edit metadata.json; WriteMetadata seals.
std::string SealMetadataText(std::string_view json_text);

// Size and checksum of a rank file, from its header and trailer (the contents are not read), and
// checks that its header names `rank` and `world`. Missing: NOT_FOUND naming the file.
Result<RankFileInfo> ReadRankFileInfo(const std::string& dir, const std::string& tag, int rank,
                                      int world);

// Step 3 of the write protocol, on rank 0 after every rank's WriteRankFile succeeded: fills
// meta.tag and meta.rank_files from the files on disk (when the caller already gathered the
// RankFileInfos into meta.rank_files, they must match the disk), then WriteMetadata, then
// WriteLatest. Missing rank files: FAILED_PRECONDITION naming them and the world size, saying save
// must be called on every rank; `latest` is left as it was.
Status FinalizeCheckpoint(const std::string& dir, const std::string& tag, CheckpointMeta meta);
// FinalizeCheckpoint without `latest`: checks the rank files, writes metadata.json.
Status WriteCheckpointMetadata(const std::string& dir, const std::string& tag,
                               CheckpointMeta meta);

// --- staging and the swap (what SaveCheckpoint in checkpoint.h runs) ---------------------------
// A save writes the whole tag into a staging directory and swaps it in only when complete:
//   root = CreateStagingRoot(dir, tag)        <dir>/.zero_save.<pid>.<random>/ (+ saving_tag file)
//   WriteRankFile(root, tag, r, ...)          every rank, into <root>/<tag>/
//   WriteCheckpointMetadata(root, tag, meta)  rank 0: <root>/<tag>/metadata.json
//   InstallStagedTag(root, dir, tag)          rank 0: <root>/<tag> becomes <dir>/<tag>
//   WriteLatest(dir, tag); RemoveTree(root)   rank 0 (the root then holds the old copy, if any)
// Crash points (checkpoint_io.h CrashPoint): "writing_rank_file" (rank r, its file half written),
// "rank_files_written", "metadata_written", "swapped", "latest_written" (rank 0), and
// "fallback_old_moved_away" (inside the rename fallback below).
//
// Makes the staging directory (and `dir`). The tag must be valid.
Result<std::string> CreateStagingRoot(const std::string& dir, const std::string& tag);
// Moves <root>/<tag> to <dir>/<tag>. When <dir>/<tag> exists, the two are exchanged atomically
// (renameat2 RENAME_EXCHANGE), so the tag's name always holds a complete checkpoint and the old
// copy ends in the staging root. Where the filesystem cannot exchange, two renames: the old copy
// to <root>/previous, then the new one in (a crash between them leaves <dir>/<tag> missing, the
// old copy intact; CleanStaleSaves moves it back). fsyncs both directories.
Status InstallStagedTag(const std::string& staging_root, const std::string& dir,
                        const std::string& tag);
// Removes every staging directory in `dir` (left by saves that crashed or failed), first moving
// back a previous copy that an interrupted fallback swap left there when its tag is missing.
// Returns what it did ("removed <path>", "restored <tag dir> from <path>"). Call only when no
// other save into `dir` runs (one job per checkpoint directory).
Result<std::vector<std::string>> CleanStaleSaves(const std::string& dir);
// Tests only: InstallStagedTag uses the two-rename fallback even where exchange works.
void ForceRenameFallbackForTest(bool force);

// --- reading ------------------------------------------------------------------------------------
// The tag in <dir>/latest (whitespace trimmed), checked to name a tag whose metadata.json exists.
Result<std::string> ReadLatest(const std::string& dir);
// `tag` itself when not empty (checked with ValidateTag), else ReadLatest(dir).
Result<std::string> ResolveTag(const std::string& dir, const std::string& tag);
// Parses and checks metadata.json: format and version (another version: FAILED_PRECONDITION
// naming both), every key present with the right type, the param table consistent.
Result<CheckpointMeta> ReadMetadata(const std::string& dir, const std::string& tag);
// Reads and verifies rank `rank`'s file against `meta` (size, CRC32C, header, records matching the
// param table): missing file: NOT_FOUND naming it and the world size the checkpoint was saved with;
// truncated or corrupt: DATA_LOSS naming the file and the sizes or checksums.
Result<std::vector<ParamShard>> ReadRankFile(const std::string& dir, const std::string& tag,
                                             int rank, const CheckpointMeta& meta);

// --- repartitioning -----------------------------------------------------------------------------
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
Result<FullState> LoadFullState(const std::string& dir, const std::string& tag);

// Pure: the shards rank `new_rank` of `new_world` owns (PartitionRange of every parameter, in
// `full` order), padding elements zero. ShardFor(full, 0, 1) gives the full tensors (stage 0).
// Rank `rank`'s PartitionRange slice of full host arrays (numel floats each),
// padding zero, as partitioned stages hold it. REQUIRES: no negative dim, 0 <= rank < world.
ParamShard SliceFullParam(const std::string& name, const std::vector<int64_t>& shape,
                          const std::string& module, const float* master, const float* exp_avg,
                          const float* exp_avg_sq, int rank, int world);

std::vector<ParamShard> ShardFor(const FullState& full, int new_rank, int new_world);

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
                                                  const std::vector<ParamSignature>& model,
                                                  int rank, int world,
                                                  CheckpointMeta* meta_out = nullptr);

}  // namespace zero
