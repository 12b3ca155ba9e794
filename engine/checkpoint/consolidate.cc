#include "engine/checkpoint/consolidate.h"

#include <chrono>
#include <cstdio>
#include <map>
#include <vector>

#include "engine/checkpoint/format.h"
#include "engine/checkpoint/safetensors.h"

namespace zero {

std::string ConsolidationSummary::ToString() const {
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "%lld tensors, %lld params, %llu bytes in %.3f s (tag %s, global step %lld, "
                "ZeRO stage %d, saved at dp world size %d)",
                static_cast<long long>(tensors), static_cast<long long>(params), static_cast<unsigned long long>(bytes),
                seconds, tag.c_str(), static_cast<long long>(global_steps), zero_stage, dp_world_size);
  return buf;
}

Result<ConsolidationSummary> ConsolidateToFp32(const std::string& checkpoint_dir, const std::string& tag,
                                               const std::string& output_path) {
  const auto start = std::chrono::steady_clock::now();
  ZERO_ASSIGN_OR_RETURN(std::string resolved, ResolveTag(checkpoint_dir, tag));
  ZERO_ASSIGN_OR_RETURN(FullState full, LoadFullState(checkpoint_dir, resolved));
  const CheckpointMeta& meta = full.meta;

  ConsolidationSummary summary;
  summary.tag = resolved;
  summary.zero_stage = meta.zero_stage;
  summary.dp_world_size = meta.dp_world_size;
  summary.global_steps = meta.global_steps;

  std::vector<SafetensorsTensorRef> tensors;
  tensors.reserve(full.params.size());
  for (const FullParam& p : full.params) {
    tensors.push_back({p.name, "F32", p.shape, p.master.data(), p.master.size() * sizeof(float)});
    summary.params += p.numel;
  }
  summary.tensors = static_cast<int64_t>(tensors.size());
  std::map<std::string, std::string> metadata = {
      {"format", "pt"},
      {"zero_version", meta.zero_version},
      {"tag", resolved},
      {"global_steps", std::to_string(meta.global_steps)},
      {"skipped_steps", std::to_string(meta.skipped_steps)},
      {"zero_stage", std::to_string(meta.zero_stage)},
      {"dp_world_size", std::to_string(meta.dp_world_size)},
      {"model_dtype", DTypeName(meta.model_dtype)},
  };
  ZERO_ASSIGN_OR_RETURN(summary.bytes, WriteSafetensors(output_path, tensors, metadata));
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

}  // namespace zero
