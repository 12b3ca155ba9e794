// Checkpoint metadata: <dir>/<tag>/metadata.json, the checkpoint's description. It owns the
// CheckpointMeta struct (counters, loss scaler, scheduler, model dtype, ZeRO stage, dp world size,
// the resolved config and client state, the parameter table, each rank file's size and CRC32C),
// its JSON text, the seal that ends that text (metadata_crc32c, format version 2), and the format
// version rules: version 1 (no seal) still loads, unverified. It does not read or write rank files
// (checkpoint_rank_file.h; the RankFileInfo entries are only recorded and parsed here), nor decide
// where a tag lives (checkpoint_directory.h). nlohmann/json stays in the .cc. Thread-safe (no
// shared state); files are written atomically with checkpoint_io.h.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/file_system.h"
#include "runtime/status.h"

namespace zero {

// Version 2 added metadata.json's checksum; version 1 checkpoints still load (unverified metadata).
inline constexpr int kCheckpointFormatVersion = 2;
inline constexpr int kOldestReadableFormatVersion = 1;
inline constexpr const char* kZeroVersion = "zero 0.1.0";

// --- shapes -------------------------------------------------------------------------------------
// Product of the dims; -1 when a dim is negative or the product overflows.
int64_t ShapeNumel(const std::vector<int64_t>& shape);
// "[3, 4]": a shape as the checkpoint's errors print it.
std::string ShapeString(const std::vector<int64_t>& shape);

// --- metadata.json ------------------------------------------------------------------------------
struct CheckpointParam {
  std::string name;
  std::vector<int64_t> shape;
  std::string module;
  int64_t numel = 0;
  int64_t n_pad = 0;  // PaddedNumel(numel, dp_world_size)
};
// numel and n_pad computed from the shape and world size (-1 when the shape has a negative dim or
// world < 1; WriteMetadata then refuses it).
CheckpointParam MakeCheckpointParam(std::string name, std::vector<int64_t> shape, std::string module, int world);

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

// OK when `text` parses as JSON; else INVALID_ARGUMENT "<what>: not valid JSON: ...".
Status CheckJsonText(const std::string& text, const std::string& what);

// --- writing ------------------------------------------------------------------------------------
// Writes metadata.json atomically. REQUIRES: meta.tag == tag, meta.rank_files has dp_world_size
// entries, every param's numel/n_pad agree with its shape and the world size, the JSON texts parse.
// `fs`: where (null: the POSIX file system), as for every file function of the checkpoint code.
Status WriteMetadata(const std::string& dir, const std::string& tag, const CheckpointMeta& meta,
                     FileSystem* fs = nullptr);
// The metadata.json text for a JSON object `json_text` (with or without a seal already): the
// text with a last entry "metadata_crc32c" holding the CRC32C of every byte before that entry
// (docs/checkpoints.md). For tools and tests that edit metadata.json; WriteMetadata seals.
std::string SealMetadataText(std::string_view json_text);

// --- reading ------------------------------------------------------------------------------------
// Parses and checks metadata.json: format and version (another version: FAILED_PRECONDITION
// naming both), every key present with the right type, the param table consistent. Returns the
// tag directory's name as meta.tag (a renamed tag directory loads under its new name).
Result<CheckpointMeta> ReadMetadata(const std::string& dir, const std::string& tag, FileSystem* fs = nullptr);

}  // namespace zero
