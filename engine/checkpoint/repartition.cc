#include "engine/checkpoint/repartition.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <utility>

#include "engine/checkpoint/directory.h"

namespace zero {

namespace {

using Intervals = std::vector<std::pair<int64_t, int64_t>>;

// The slices of one parameter must cover [0, numel) exactly once (padding beyond numel ignored).
Status CheckCoverage(const std::string& tag_dir, const std::string& name, int64_t numel, Intervals iv) {
  for (auto& [b, e] : iv) {
    b = std::min(b, numel);
    e = std::min(e, numel);
  }
  std::sort(iv.begin(), iv.end());
  int64_t pos = 0;
  for (const auto& [b, e] : iv) {
    if (b == e) continue;
    if (b > pos) {
      return DataLossError("checkpoint " + tag_dir + ": parameter '" + name + "': elements [" + std::to_string(pos) +
                           ", " + std::to_string(b) + ") are in no rank file");
    }
    if (b < pos) {
      return DataLossError("checkpoint " + tag_dir + ": parameter '" + name + "': elements [" + std::to_string(b) +
                           ", " + std::to_string(std::min(pos, e)) + ") are in more than one rank file");
    }
    pos = e;
  }
  if (pos < numel) {
    return DataLossError("checkpoint " + tag_dir + ": parameter '" + name + "': elements [" + std::to_string(pos) +
                         ", " + std::to_string(numel) + ") are in no rank file");
  }
  return OkStatus();
}

// Copies the elements of `src` that fall in [dst_begin, dst_end) ∩ [0, numel) into the arrays
// starting at dst_begin.
void CopyOverlap(const ParamShard& src, int64_t numel, int64_t dst_begin, int64_t dst_end, float* master,
                 float* exp_avg, float* exp_avg_sq) {
  int64_t lo = std::max(src.begin, dst_begin);
  int64_t hi = std::min({src.end, dst_end, numel});
  if (hi <= lo) return;
  const size_t n = static_cast<size_t>(hi - lo) * sizeof(float);
  std::memcpy(master + (lo - dst_begin), src.master.data() + (lo - src.begin), n);
  std::memcpy(exp_avg + (lo - dst_begin), src.exp_avg.data() + (lo - src.begin), n);
  std::memcpy(exp_avg_sq + (lo - dst_begin), src.exp_avg_sq.data() + (lo - src.begin), n);
}

}  // namespace

ElementRange PartitionRange(int64_t numel, int rank, int world) {
  const int64_t n_pad = PaddedNumel(numel, world);
  return {rank * (n_pad / world), (rank + 1) * (n_pad / world)};
}

const FullParam* FullState::Find(const std::string& name) const {
  for (const FullParam& p : params) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

Result<FullState> LoadFullState(const std::string& dir, const std::string& tag, FileSystem* fs) {
  FullState full;
  ZERO_ASSIGN_OR_RETURN(full.meta, ReadMetadata(dir, tag, fs));
  const CheckpointMeta& meta = full.meta;
  full.params.resize(meta.params.size());
  for (size_t i = 0; i < meta.params.size(); ++i) {
    const CheckpointParam& p = meta.params[i];
    FullParam& f = full.params[i];
    f.name = p.name;
    f.shape = p.shape;
    f.module = p.module;
    f.numel = p.numel;
    f.master.assign(p.numel, 0.0f);
    f.exp_avg.assign(p.numel, 0.0f);
    f.exp_avg_sq.assign(p.numel, 0.0f);
  }
  std::vector<Intervals> seen(meta.params.size());
  for (int r = 0; r < meta.dp_world_size; ++r) {
    ZERO_ASSIGN_OR_RETURN(std::vector<ParamShard> shards, ReadRankFile(dir, tag, r, meta, fs));
    for (size_t i = 0; i < shards.size(); ++i) {
      FullParam& f = full.params[i];
      CopyOverlap(shards[i], f.numel, 0, f.numel, f.master.data(), f.exp_avg.data(), f.exp_avg_sq.data());
      seen[i].emplace_back(shards[i].begin, shards[i].end);
    }
  }
  for (size_t i = 0; i < seen.size(); ++i) {
    ZERO_RETURN_IF_ERROR(
        CheckCoverage(TagDirectory(dir, tag), meta.params[i].name, meta.params[i].numel, std::move(seen[i])));
  }
  return full;
}

ParamShard SliceFullParam(const std::string& name, const std::vector<int64_t>& shape, const std::string& module,
                          const float* master, const float* exp_avg, const float* exp_avg_sq, int rank, int world) {
  ParamShard s;
  s.name = name;
  s.shape = shape;
  s.module = module;
  s.numel = 1;
  for (int64_t d : shape) s.numel *= d;
  const ElementRange r = PartitionRange(s.numel, rank, world);
  s.begin = r.begin;
  s.end = r.end;
  const size_t count = static_cast<size_t>(r.end - r.begin);
  s.master.assign(count, 0.0f);
  s.exp_avg.assign(count, 0.0f);
  s.exp_avg_sq.assign(count, 0.0f);
  const int64_t hi = std::min(r.end, s.numel);
  for (int64_t e = r.begin; e < hi; ++e) {
    s.master[e - r.begin] = master[e];
    s.exp_avg[e - r.begin] = exp_avg[e];
    s.exp_avg_sq[e - r.begin] = exp_avg_sq[e];
  }
  return s;
}

std::vector<ParamShard> ShardFor(const FullState& full, int new_rank, int new_world) {
  ZERO_CHECK(new_world >= 1 && new_rank >= 0 && new_rank < new_world);
  std::vector<ParamShard> out;
  out.reserve(full.params.size());
  for (const FullParam& f : full.params) {
    out.push_back(SliceFullParam(f.name, f.shape, f.module, f.master.data(), f.exp_avg.data(), f.exp_avg_sq.data(),
                                 new_rank, new_world));
  }
  return out;
}

Status CheckModelMatches(const CheckpointMeta& meta, const std::vector<ParamSignature>& model) {
  std::unordered_map<std::string, const CheckpointParam*> by_name;
  for (const CheckpointParam& p : meta.params) by_name.emplace(p.name, &p);
  std::vector<std::string> problems;
  std::unordered_map<std::string, int> model_names;
  for (const ParamSignature& m : model) {
    if (++model_names[m.name] == 2) problems.push_back("the model registers '" + m.name + "' twice");
    auto it = by_name.find(m.name);
    if (it == by_name.end()) {
      problems.push_back("parameter '" + m.name + "' (model shape " + ShapeString(m.shape) +
                         ") is not in the checkpoint");
    } else if (it->second->shape != m.shape) {
      problems.push_back("parameter '" + m.name + "': checkpoint shape " + ShapeString(it->second->shape) +
                         ", model shape " + ShapeString(m.shape));
    }
  }
  for (const CheckpointParam& p : meta.params) {
    if (!model_names.count(p.name)) {
      problems.push_back("checkpoint parameter '" + p.name + "' (shape " + ShapeString(p.shape) +
                         ") is not registered by the model");
    }
  }
  if (problems.empty()) return OkStatus();
  std::string msg = "checkpoint tag '" + meta.tag + "' does not match the model (" + std::to_string(problems.size()) +
                    " difference" + (problems.size() > 1 ? "s" : "") + "): ";
  const size_t shown = std::min<size_t>(problems.size(), 8);
  for (size_t i = 0; i < shown; ++i) msg += (i ? "; " : "") + problems[i];
  if (shown < problems.size()) msg += "; and " + std::to_string(problems.size() - shown) + " more";
  return InvalidArgumentError(msg);
}

Result<std::vector<ParamShard>> LoadShardsForRank(const std::string& dir, const std::string& tag,
                                                  const std::vector<ParamSignature>& model, int rank, int world,
                                                  CheckpointMeta* meta_out, FileSystem* fs) {
  if (world < 1 || rank < 0 || rank >= world) {
    return InvalidArgumentError("LoadShardsForRank: rank " + std::to_string(rank) + " is not in a dp world of size " +
                                std::to_string(world));
  }
  ZERO_ASSIGN_OR_RETURN(CheckpointMeta meta, ReadMetadata(dir, tag, fs));
  ZERO_RETURN_IF_ERROR(CheckModelMatches(meta, model));
  // meta index -> model index
  std::unordered_map<std::string, size_t> model_index;
  for (size_t k = 0; k < model.size(); ++k) model_index.emplace(model[k].name, k);
  std::vector<size_t> to_model(meta.params.size());
  std::vector<ParamShard> out(model.size());
  for (size_t i = 0; i < meta.params.size(); ++i) {
    const CheckpointParam& p = meta.params[i];
    to_model[i] = model_index.at(p.name);
    ParamShard& s = out[to_model[i]];
    s.name = p.name;
    s.shape = p.shape;
    s.module = p.module;
    s.numel = p.numel;
    ElementRange r = PartitionRange(p.numel, rank, world);
    s.begin = r.begin;
    s.end = r.end;
    s.master.assign(r.end - r.begin, 0.0f);
    s.exp_avg.assign(r.end - r.begin, 0.0f);
    s.exp_avg_sq.assign(r.end - r.begin, 0.0f);
  }
  std::vector<Intervals> seen(meta.params.size());
  for (int old_rank = 0; old_rank < meta.dp_world_size; ++old_rank) {
    ZERO_ASSIGN_OR_RETURN(std::vector<ParamShard> old, ReadRankFile(dir, tag, old_rank, meta, fs));
    for (size_t i = 0; i < old.size(); ++i) {
      ParamShard& s = out[to_model[i]];
      CopyOverlap(old[i], s.numel, s.begin, s.end, s.master.data(), s.exp_avg.data(), s.exp_avg_sq.data());
      seen[i].emplace_back(old[i].begin, old[i].end);
    }
  }
  for (size_t i = 0; i < seen.size(); ++i) {
    ZERO_RETURN_IF_ERROR(
        CheckCoverage(TagDirectory(dir, tag), meta.params[i].name, meta.params[i].numel, std::move(seen[i])));
  }
  if (meta_out) *meta_out = std::move(meta);
  return out;
}

}  // namespace zero
