#include "engine/checkpoint/checkpoint.h"

#include <algorithm>
#include <cstring>

#include "engine/checkpoint/io.h"
#include "runtime/crc32c.h"

namespace zero {
namespace {

// A Status as fixed-size bytes for BroadcastHost.
struct WireStatus {
  int32_t code = 0;
  uint32_t length = 0;
  char message[4088] = {};
};
static_assert(sizeof(WireStatus) == 4096);

WireStatus Encode(const Status& st, const std::string& payload_if_ok = "") {
  WireStatus w;
  w.code = static_cast<int32_t>(st.code());
  const std::string& text = st.ok() ? payload_if_ok : st.message();
  w.length = static_cast<uint32_t>(std::min(text.size(), sizeof(w.message)));
  std::memcpy(w.message, text.data(), w.length);
  return w;
}

std::string Payload(const WireStatus& w) {
  return std::string(w.message, std::min<size_t>(w.length, sizeof(w.message)));
}

Status Decode(const WireStatus& w) {
  if (w.code == 0) return OkStatus();
  return Status(static_cast<StatusCode>(w.code), Payload(w));
}

std::string RankList(const std::vector<double>& flags) {
  std::string s;
  for (size_t r = 0; r < flags.size(); ++r) {
    if (flags[r] != 0) s += (s.empty() ? "" : ", ") + std::to_string(r);
  }
  return s;
}

// What every rank must agree on before writing: tag, world size, parameter table.
uint32_t SaveSignature(const std::string& tag, int world, const CheckpointMeta& meta) {
  uint32_t h = Crc32c(tag.data(), tag.size());
  h = Crc32c(&world, sizeof(world), h);
  for (const CheckpointParam& p : meta.params) {
    h = Crc32c(p.name.data(), p.name.size() + 1, h);  // with the terminating NUL as separator
    h = Crc32c(p.shape.data(), p.shape.size() * sizeof(int64_t), h);
    h = Crc32c(&p.n_pad, sizeof(p.n_pad), h);
  }
  return h;
}

Status LocalSaveChecks(const std::string& tag, int world, const CheckpointMeta& meta,
                       const std::vector<ParamShard>& shards) {
  ZERO_RETURN_IF_ERROR(ValidateTag(tag));
  if (meta.dp_world_size != world) {
    return InvalidArgumentError("meta.dp_world_size " + std::to_string(meta.dp_world_size) +
                                " differs from the communicator's world size " + std::to_string(world));
  }
  if (meta.params.size() != shards.size()) {
    return InvalidArgumentError("meta.params lists " + std::to_string(meta.params.size()) + " parameters, " +
                                std::to_string(shards.size()) + " shards given");
  }
  for (size_t i = 0; i < shards.size(); ++i) {
    if (meta.params[i].name != shards[i].name) {
      return InvalidArgumentError("meta.params[" + std::to_string(i) + "] is '" + meta.params[i].name + "' but shard " +
                                  std::to_string(i) + " is '" + shards[i].name + "'");
    }
  }
  // Checked before anything is written (rank 0's metadata.json would otherwise fail last).
  ZERO_RETURN_IF_ERROR(CheckJsonText(meta.config_json, "config_json"));
  ZERO_RETURN_IF_ERROR(CheckJsonText(meta.client_state_json, "client_state_json"));
  return OkStatus();
}

// Rank 0's part of the save once every rank file is in <root>/<tag>/.
Status FinishSave(FileSystem& fs, const std::string& root, const std::string& dir, const std::string& tag,
                  CheckpointMeta meta) {
  fs.CrashPoint("rank_files_written", 0);
  Status st = WriteCheckpointMetadata(root, tag, std::move(meta), &fs);
  if (!st.ok()) {
    RemoveTree(fs, root).IgnoreError();
    return st.WithContext("`latest` is unchanged");
  }
  fs.CrashPoint("metadata_written", 0);
  // On failure the staging root may hold the previous copy (fallback swap): kept for
  // CleanStaleSaves.
  ZERO_RETURN_IF_ERROR(InstallStagedTag(root, dir, tag, &fs).WithContext("`latest` is unchanged"));
  fs.CrashPoint("swapped", 0);
  st = WriteLatest(dir, tag, &fs);
  if (!st.ok()) {
    RemoveTree(fs, root).IgnoreError();
    return st.WithContext(TagDirectory(dir, tag) + " is complete, but `latest` was not updated");
  }
  fs.CrashPoint("latest_written", 0);
  // The save is complete; a staging root that cannot be removed now is removed by the next save.
  RemoveTree(fs, root).IgnoreError();
  return OkStatus();
}

}  // namespace

Status SaveCheckpoint(Communicator* comm, const std::string& dir, const std::string& tag, CheckpointMeta meta,
                      const std::vector<ParamShard>& shards, FileSystem* fs_or_null) {
  FileSystem& fs = *FileSystemOrDefault(fs_or_null);
  const int rank = comm->rank();
  const int world = comm->world_size();
  const std::string what = "save checkpoint '" + tag + "' in " + dir + " (rank " + std::to_string(rank) + " of " +
                           std::to_string(world) + ")";

  // (1) Agreement; also the point where a rank that never calls save is noticed (timeout).
  const Status local = LocalSaveChecks(tag, world, meta, shards);
  const double sig = static_cast<double>(SaveSignature(tag, world, meta));
  std::vector<double> agree(2 + world, 0.0);
  agree[0] = sig;
  agree[1] = -sig;
  agree[2 + rank] = local.ok() ? 0.0 : 1.0;
  Status st = comm->AllReduceHost(agree.data(), agree.size(), ReduceOp::kMax);
  if (!st.ok()) {
    return st.WithContext(what +
                          ": not every rank joined the save. Save must be called on every "
                          "rank at the same point (calling it on rank 0 only is a common "
                          "mistake); nothing was written and `latest` is unchanged");
  }
  if (!local.ok()) return local.WithContext(what);
  std::vector<double> refused(agree.begin() + 2, agree.end());
  if (!RankList(refused).empty()) {
    return FailedPreconditionError(what + ": rank(s) " + RankList(refused) +
                                   " refused the save (see their errors); nothing was written");
  }
  if (agree[0] != -agree[1]) {
    return InvalidArgumentError(what +
                                ": ranks passed different tags or parameter tables; "
                                "nothing was written");
  }

  // (2) Rank 0 removes what earlier interrupted saves left and makes this save's staging
  // directory; everyone learns its name.
  WireStatus staging;
  DirectoryLock dir_lock;  // rank 0, until the save is done: no other job saves into `dir` meanwhile
  if (rank == 0) {
    auto lock = DirectoryLock::Acquire(dir, &fs);
    if (lock.ok()) dir_lock = std::move(lock).value();
    Status cleaned = lock.ok() ? CleanStaleSaves(dir, &fs).status() : lock.status();
    auto root = cleaned.ok() ? CreateStagingRoot(dir, tag, &fs) : Result<std::string>(cleaned);
    if (root.ok() && root->size() > sizeof(staging.message)) {
      RemoveTree(fs, *root).IgnoreError();
      root = InvalidArgumentError("checkpoint directory path is too long (" + std::to_string(root->size()) + " bytes)");
    }
    staging = root.ok() ? Encode(OkStatus(), *root) : Encode(root.status());
  }
  st = comm->BroadcastHost(&staging, sizeof(staging), 0);
  if (!st.ok()) return st.WithContext(what + ": receiving rank 0's staging directory");
  ZERO_RETURN_IF_ERROR(Decode(staging).WithContext(what + (rank == 0 ? "" : ": rank 0") +
                                                   ": nothing was written; `latest` is unchanged"));
  const std::string root = Payload(staging);

  // (3) Every rank's file, into the staging directory; (4) agreement that all succeeded (the
  // barrier before rank 0 finalizes).
  auto info = WriteRankFile(root, tag, rank, world, shards, &fs);
  std::vector<double> failed(world, 0.0);
  failed[rank] = info.ok() ? 0.0 : 1.0;
  st = comm->AllReduceHost(failed.data(), failed.size(), ReduceOp::kMax);
  if (!st.ok()) return st.WithContext(what + ": waiting for the other ranks' files");
  if (!info.ok() || !RankList(failed).empty()) {
    if (rank == 0) RemoveTree(fs, root).IgnoreError();  // every rank is past its write
    if (!info.ok()) return info.status().WithContext(what + ": `latest` is unchanged");
    // Not DATA_LOSS: this rank lost nothing, and the failed save changed no checkpoint.
    return UnavailableError(what + ": writing failed on rank(s) " + RankList(failed) +
                            " (see their errors); nothing was lost: the previous checkpoints and `latest` "
                            "are unchanged");
  }

  // (5) Rank 0: metadata.json, the swap into place, then latest; (6) its result to everyone.
  WireStatus result;
  if (rank == 0) result = Encode(FinishSave(fs, root, dir, tag, std::move(meta)));
  st = comm->BroadcastHost(&result, sizeof(result), 0);
  if (!st.ok()) return st.WithContext(what + ": receiving rank 0's result");
  Status final_status = Decode(result);
  if (!final_status.ok() && rank != 0) return final_status.WithContext(what + ": rank 0");
  return final_status.WithContext(what);
}

Result<LoadedCheckpoint> LoadCheckpoint(Communicator* comm, const std::string& dir, const std::string& tag,
                                        const std::vector<ParamSignature>& model, bool partitioned, FileSystem* fs) {
  const int rank = comm->rank();
  const int world = comm->world_size();
  const std::string what = "load checkpoint " + (tag.empty() ? "(latest)" : "'" + tag + "'") + " from " + dir +
                           " (rank " + std::to_string(rank) + " of " + std::to_string(world) + ")";
  // Rank 0 resolves the tag once for everyone.
  WireStatus resolved;
  if (rank == 0) {
    auto t = ResolveTag(dir, tag, fs);
    resolved = t.ok() ? Encode(OkStatus(), *t) : Encode(t.status());
  }
  Status st = comm->BroadcastHost(&resolved, sizeof(resolved), 0);
  if (!st.ok()) {
    return st.WithContext(what +
                          ": not every rank joined the load (load must be called on every "
                          "rank)");
  }
  ZERO_RETURN_IF_ERROR(Decode(resolved).WithContext(what));
  const std::string chosen = Payload(resolved);

  Result<LoadedCheckpoint> out = InternalError("unset");
  if (!tag.empty() && tag != chosen) {
    out = InvalidArgumentError("this rank asked for tag '" + tag + "', rank 0 for '" + chosen + "'");
  } else {
    LoadedCheckpoint loaded;
    auto shards =
        LoadShardsForRank(dir, chosen, model, partitioned ? rank : 0, partitioned ? world : 1, &loaded.meta, fs);
    if (shards.ok()) {
      loaded.shards = std::move(shards).value();
      out = std::move(loaded);
    } else {
      out = shards.status();
    }
  }
  std::vector<double> failed(world, 0.0);
  failed[rank] = out.ok() ? 0.0 : 1.0;
  st = comm->AllReduceHost(failed.data(), failed.size(), ReduceOp::kMax);
  if (!st.ok()) return st.WithContext(what + ": waiting for the other ranks");
  if (!out.ok()) return out.status().WithContext(what);
  if (!RankList(failed).empty()) {
    return FailedPreconditionError(what + ": loading failed on rank(s) " + RankList(failed) + " (see their errors)");
  }
  return out;
}

}  // namespace zero
