#include "engine/checkpoint/consolidate.h"

#include <chrono>
#include <cstdio>
#include <map>
#include <vector>

#include "engine/checkpoint/format.h"
#include "hf/safetensors.h"

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

  std::vector<llm::TensorToWrite> tensors;
  tensors.reserve(full.params.size());
  for (const FullParam& p : full.params) {
    // The writer sizes each tensor by its shape, whose numel the metadata's validation matched.
    if (static_cast<int64_t>(p.master.size()) != p.numel) {
      return InternalError(checkpoint_dir + ": tag " + resolved + ": parameter '" + p.name + "' has " +
                           std::to_string(p.master.size()) + " master elements, expected its numel " +
                           std::to_string(p.numel));
    }
    tensors.push_back({p.name, DType::kF32, p.shape, p.master.data()});
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
  // The streaming writer rather than WriteSafetensors, for the file's size.
  ZERO_ASSIGN_OR_RETURN(llm::SafetensorsWriter writer, llm::SafetensorsWriter::Open(output_path, tensors, metadata));
  for (const FullParam& p : full.params) {
    ZERO_RETURN_IF_ERROR(writer.Append(p.master.data(), p.master.size() * sizeof(float)));
  }
  ZERO_RETURN_IF_ERROR(writer.Commit());
  summary.bytes = writer.file_bytes();
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

}  // namespace zero
