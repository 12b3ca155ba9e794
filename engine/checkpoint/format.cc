#include "engine/checkpoint/format.h"

#include <string>
#include <utility>
#include <vector>

#include "runtime/crc32c.h"

namespace zero {

Status WriteCheckpointMetadata(const std::string& dir, const std::string& tag, CheckpointMeta meta, FileSystem* fs) {
  ZERO_RETURN_IF_ERROR(ValidateTag(tag));
  const std::string tag_dir = TagDirectory(dir, tag);
  const int world = meta.dp_world_size;
  if (world < 1) return InvalidArgumentError("checkpoint " + tag_dir + ": dp world size " + std::to_string(world));
  meta.tag = tag;
  std::vector<RankFileInfo> infos;
  std::vector<int> missing;
  for (int r = 0; r < world; ++r) {
    auto info = ReadRankFileInfo(dir, tag, r, world, fs);
    if (!info.ok()) {
      if (info.status().code() != StatusCode::kNotFound) return info.status();
      missing.push_back(r);
      continue;
    }
    infos.push_back(*info);
  }
  if (!missing.empty()) {
    std::string ranks;
    for (size_t i = 0; i < missing.size(); ++i) ranks += (i ? ", " : "") + std::to_string(missing[i]);
    return FailedPreconditionError("checkpoint " + tag_dir + " is incomplete: dp world size " + std::to_string(world) +
                                   " but no rank file for rank(s) " + ranks + " (" + RankFileName(missing[0]) +
                                   (missing.size() > 1 ? ", ..." : "") +
                                   "). Save must be called on every rank, and rank 0 finalizes only after all ranks "
                                   "finished writing; `latest` still names the previous checkpoint");
  }
  if (!meta.rank_files.empty()) {
    if (meta.rank_files.size() != infos.size()) {
      return InvalidArgumentError("checkpoint " + tag_dir + ": " + std::to_string(meta.rank_files.size()) +
                                  " reported rank files for dp world size " + std::to_string(world));
    }
    for (int r = 0; r < world; ++r) {
      const RankFileInfo& want = meta.rank_files[r];
      if (!(want == infos[r])) {
        return DataLossError("checkpoint " + tag_dir + ": " + infos[r].file + " on disk (" +
                             std::to_string(infos[r].bytes) + " bytes, crc32c " + Crc32cHex(infos[r].crc32c) +
                             ") is not what rank " + std::to_string(r) + " wrote (" + std::to_string(want.bytes) +
                             " bytes, crc32c " + Crc32cHex(want.crc32c) +
                             "): another save wrote the same tag at the same time?");
      }
    }
  }
  meta.rank_files = std::move(infos);
  return WriteMetadata(dir, tag, meta, fs);
}

Status FinalizeCheckpoint(const std::string& dir, const std::string& tag, CheckpointMeta meta, FileSystem* fs) {
  ZERO_RETURN_IF_ERROR(WriteCheckpointMetadata(dir, tag, std::move(meta), fs));
  return WriteLatest(dir, tag, fs);
}

}  // namespace zero
