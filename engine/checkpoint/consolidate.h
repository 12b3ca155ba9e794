// Consolidation: one checkpoint (any ZeRO stage, any saved dp world size) -> one safetensors file
// of full, named fp32 tensors (the master weights, shapes restored, padding dropped). What
// tools/zero_to_fp32 runs; usable from code (e.g. an export step after training).
//
// Reads the checkpoint with format.h's verified readers (every rank file's size and checksum
// checked) and writes the output with hf/safetensors.h's writer, atomically: an error leaves no
// partial output file.
// Host memory: the full fp32 state (master weights and both AdamW moments) of the model.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/status.h"

namespace zero {

struct ConsolidationSummary {
  std::string tag;
  int zero_stage = 0;
  int dp_world_size = 0;
  int64_t global_steps = 0;
  int64_t tensors = 0;
  int64_t params = 0;  // elements over all tensors
  uint64_t bytes = 0;  // output file size
  double seconds = 0.0;
  // "12 tensors, 1234567 params, 4938340 bytes in 0.12 s (tag global_step100, stage 2, ...)"
  std::string ToString() const;
};

// `tag` empty: the tag named by <checkpoint_dir>/latest. __metadata__ of the output holds format
// "pt", zero_version, tag, global_steps, skipped_steps, zero_stage, dp_world_size, model_dtype.
Result<ConsolidationSummary> ConsolidateToFp32(const std::string& checkpoint_dir, const std::string& tag,
                                               const std::string& output_path);

}  // namespace zero
