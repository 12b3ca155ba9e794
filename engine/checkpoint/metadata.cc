#include "engine/checkpoint/metadata.h"

#include <cctype>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "engine/checkpoint/directory.h"
#include "runtime/atomic_file.h"
#include "runtime/crc32c.h"
#include "runtime/file_system.h"
#include "runtime/json_input.h"
#include "zero/partition.h"

namespace zero {

namespace {

using nlohmann::json;

constexpr const char* kMetadataFormat = "zero-checkpoint";

// metadata.json's checksum (format version 2): the file is JSON whose last entry is
// "metadata_crc32c", the CRC32C of every byte before the `,` that starts that entry. Byte-exact:
// the seal is the file's last 37 bytes, `,\n "metadata_crc32c": "0x1a2b3c4d"\n}\n`.
constexpr std::string_view kSealPrefix = ",\n \"metadata_crc32c\": \"";
constexpr std::string_view kSealEnd = "\"\n}\n";
constexpr size_t kSealBytes = kSealPrefix.size() + 10 + kSealEnd.size();
static_assert(kSealBytes == 37);

struct Seal {
  size_t covered = 0;  // bytes before the seal (the ones the CRC covers)
  uint32_t crc = 0;    // the value the file states
};

// The seal at the end of `text`, if it has one (well-formed: 0x + 8 hex digits).
bool FindSeal(std::string_view text, Seal* seal) {
  if (text.size() < kSealBytes) return false;
  const size_t at = text.size() - kSealBytes;
  if (text.substr(at, kSealPrefix.size()) != kSealPrefix) return false;
  if (text.substr(text.size() - kSealEnd.size()) != kSealEnd) return false;
  std::string_view hex = text.substr(at + kSealPrefix.size(), 10);
  if (hex.substr(0, 2) != "0x") return false;
  uint32_t v = 0;
  for (char c : hex.substr(2)) {
    int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
    if (d < 0) return false;
    v = (v << 4) | static_cast<uint32_t>(d);
  }
  seal->covered = at;
  seal->crc = v;
  return true;
}

// --- JSON helpers -------------------------------------------------------------------------------

Status KeyError(const std::string& where, const std::string& key, const char* expected) {
  return DataLossError(where + ": key '" + key + "' is missing or not " + expected);
}

Status GetInt(const json& j, const std::string& key, int64_t* out, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) return KeyError(where, key, "an integer");
  *out = it->get<int64_t>();
  return OkStatus();
}

Status GetInt(const json& j, const std::string& key, int* out, const std::string& where) {
  int64_t v;
  ZERO_RETURN_IF_ERROR(GetInt(j, key, &v, where));
  *out = static_cast<int>(v);
  return OkStatus();
}

Status GetDouble(const json& j, const std::string& key, double* out, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return KeyError(where, key, "a number");
  *out = it->get<double>();
  return OkStatus();
}

Status GetBool(const json& j, const std::string& key, bool* out, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_boolean()) return KeyError(where, key, "a boolean");
  *out = it->get<bool>();
  return OkStatus();
}

Status GetString(const json& j, const std::string& key, std::string* out, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return KeyError(where, key, "a string");
  *out = it->get<std::string>();
  return OkStatus();
}

Status GetObject(const json& j, const std::string& key, const json** out, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_object()) return KeyError(where, key, "an object");
  *out = &*it;
  return OkStatus();
}

// The config and client state embedded in metadata.json: one level less than kMaxJsonDepth, so that
// the metadata holding them is within it when read back.
Result<json> ParseJson(const std::string& text, const std::string& what) {
  auto parsed = ParseJsonText<json>(text, what + " (embedded in metadata.json)", kMaxJsonDepth - 1);
  if (!parsed.ok()) return InvalidArgumentError(what + ": not valid JSON: " + parsed.status().message());
  return parsed;
}

Status CheckParamTable(const std::vector<CheckpointParam>& params, int world, const std::string& where) {
  std::unordered_map<std::string, size_t> seen;
  for (size_t i = 0; i < params.size(); ++i) {
    const CheckpointParam& p = params[i];
    if (p.name.empty()) return InvalidArgumentError(where + ": parameter " + std::to_string(i) + " has an empty name");
    if (!seen.emplace(p.name, i).second) {
      return InvalidArgumentError(where + ": parameter '" + p.name + "' appears twice");
    }
    int64_t numel = ShapeNumel(p.shape);
    if (numel < 0 || numel != p.numel || p.n_pad != PaddedNumel(p.numel, world)) {
      return InvalidArgumentError(where + ": parameter '" + p.name + "': shape " + ShapeString(p.shape) + ", numel " +
                                  std::to_string(p.numel) + " and n_pad " + std::to_string(p.n_pad) +
                                  " disagree for dp world size " + std::to_string(world));
    }
  }
  return OkStatus();
}

}  // namespace

// --- shapes and the parameter table --------------------------------------------------------------

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// Product of the dims; -1 when a dim is negative or the product overflows.
int64_t ShapeNumel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d != 0 && n > INT64_MAX / d) return -1;
    n *= d;
  }
  return n;
}

CheckpointParam MakeCheckpointParam(std::string name, std::vector<int64_t> shape, std::string module, int world) {
  CheckpointParam p;
  p.name = std::move(name);
  p.numel = ShapeNumel(shape);
  p.shape = std::move(shape);
  p.module = std::move(module);
  // A bad shape or world size is reported by the writers' validation, not here.
  p.n_pad = (p.numel >= 0 && world >= 1) ? PaddedNumel(p.numel, world) : -1;
  return p;
}

Status CheckJsonText(const std::string& text, const std::string& what) { return ParseJson(text, what).status(); }

// --- writing -------------------------------------------------------------------------------------

std::string SealMetadataText(std::string_view json_text) {
  Seal old;
  std::string body;
  if (FindSeal(json_text, &old)) {
    body = std::string(json_text.substr(0, old.covered));  // already without its closing brace
  } else {
    body = std::string(json_text);
    while (!body.empty() && std::isspace(static_cast<unsigned char>(body.back()))) body.pop_back();
    ZERO_CHECK_MSG(!body.empty() && body.back() == '}', "SealMetadataText: not a JSON object");
    body.pop_back();
    while (!body.empty() && std::isspace(static_cast<unsigned char>(body.back()))) body.pop_back();
  }
  const uint32_t crc = Crc32c(body.data(), body.size());
  body.append(kSealPrefix);
  body += Crc32cHex(crc);
  body.append(kSealEnd);
  return body;
}

Status WriteMetadata(const std::string& dir, const std::string& tag, const CheckpointMeta& meta, FileSystem* fs) {
  ZERO_RETURN_IF_ERROR(ValidateTag(tag));
  const std::string path = JoinPath(TagDirectory(dir, tag), kMetadataFileName);
  if (meta.tag != tag) {
    return InvalidArgumentError(path + ": metadata tag '" + meta.tag + "' differs from '" + tag + "'");
  }
  if (meta.dp_world_size < 1 || static_cast<int>(meta.rank_files.size()) != meta.dp_world_size) {
    return InvalidArgumentError(path + ": dp world size " + std::to_string(meta.dp_world_size) + " but " +
                                std::to_string(meta.rank_files.size()) + " rank files");
  }
  ZERO_RETURN_IF_ERROR(CheckParamTable(meta.params, meta.dp_world_size, path));
  ZERO_ASSIGN_OR_RETURN(json config, ParseJson(meta.config_json, path + ": config_json"));
  ZERO_ASSIGN_OR_RETURN(json client, ParseJson(meta.client_state_json, path + ": client_state_json"));

  json j = json::object();
  j["format"] = kMetadataFormat;
  j["format_version"] = kCheckpointFormatVersion;
  j["zero_version"] = meta.zero_version;
  j["tag"] = meta.tag;
  j["global_steps"] = meta.global_steps;
  j["skipped_steps"] = meta.skipped_steps;
  j["micro_steps"] = meta.micro_steps;
  j["adam_step"] = meta.adam_step;
  j["loss_scaler"] = {{"dynamic", meta.loss_scaler.dynamic},
                      {"scale", meta.loss_scaler.scale},
                      {"good_steps", meta.loss_scaler.good_steps},
                      {"hysteresis", meta.loss_scaler.hysteresis},
                      {"last_overflow_step", meta.loss_scaler.last_overflow_step}};
  j["scheduler"] = {
      {"type", meta.scheduler.type}, {"last_step", meta.scheduler.last_step}, {"last_lr", meta.scheduler.last_lr}};
  j["model_dtype"] = DTypeName(meta.model_dtype);
  j["zero_stage"] = meta.zero_stage;
  j["dp_world_size"] = meta.dp_world_size;
  j["config"] = std::move(config);
  j["client_state"] = std::move(client);
  json params = json::array();
  for (const CheckpointParam& p : meta.params) {
    params.push_back(
        {{"name", p.name}, {"shape", p.shape}, {"module", p.module}, {"numel", p.numel}, {"n_pad", p.n_pad}});
  }
  j["params"] = std::move(params);
  json files = json::array();
  for (size_t r = 0; r < meta.rank_files.size(); ++r) {
    const RankFileInfo& f = meta.rank_files[r];
    files.push_back({{"rank", r}, {"file", f.file}, {"bytes", f.bytes}, {"crc32c", Crc32cHex(f.crc32c)}});
  }
  j["rank_files"] = std::move(files);
  return WriteFileAtomic(*FileSystemOrDefault(fs), path, SealMetadataText(j.dump(1)));
}

// --- reading -------------------------------------------------------------------------------------

namespace {

// metadata.json's text; NotFound says whether the tag or only its metadata is missing.
Result<std::string> ReadMetadataText(FileSystem& fs, const std::string& tag, const std::string& tag_dir,
                                     const std::string& path) {
  if (!PathExists(fs, path)) {
    if (PathExists(fs, tag_dir)) {
      return NotFoundError(path + " is missing: the save of tag '" + tag +
                           "' did not complete (rank 0 writes metadata.json last, after every "
                           "rank's file)");
    }
    return NotFoundError("checkpoint tag '" + tag + "' does not exist: " + tag_dir + " is missing");
  }
  return fs.ReadFile(path);
}

// Checks the seal when `text` has one (*sealed says whether it has) and parses the JSON object.
Result<json> ParseMetadataText(const std::string& text, const std::string& path, bool* sealed) {
  Seal seal;
  *sealed = FindSeal(text, &seal);
  if (*sealed) {
    const uint32_t crc = Crc32c(text.data(), seal.covered);
    if (crc != seal.crc) {
      return DataLossError(path + ": checksum mismatch: its metadata_crc32c entry says " + Crc32cHex(seal.crc) +
                           ", the " + std::to_string(seal.covered) + " bytes before it have crc32c " + Crc32cHex(crc) +
                           " (the file is corrupt or was edited)");
    }
  }
  // Nesting, numbers beyond double and duplicate keys are refused before anything recursive runs
  // (ReadRunShape dumps the saved config and client state).
  auto parsed = ParseJsonText<json>(text, path);
  if (!parsed.ok()) {
    std::string what = parsed.status().message();
    if (what.compare(0, path.size() + 2, path + ": ") == 0) what = what.substr(path.size() + 2);
    if (!*sealed) {
      return DataLossError(path + ": truncated or corrupt: it does not end with its " +
                           "\"metadata_crc32c\" entry and is not valid JSON (" + std::to_string(text.size()) +
                           " bytes): " + what);
    }
    return DataLossError(path + ": not valid JSON (the file is corrupt): " + what);
  }
  json j = std::move(parsed).value();
  if (!j.is_object()) return DataLossError(path + ": not a JSON object");
  return j;
}

// format, format_version and zero_version: a version this build reads, sealed from version 2 on.
Status ReadFormat(const json& j, const std::string& path, bool sealed, CheckpointMeta* m) {
  std::string format;
  ZERO_RETURN_IF_ERROR(GetString(j, "format", &format, path));
  if (format != kMetadataFormat) {
    return FailedPreconditionError(path + ": format '" + format + "' is not '" + kMetadataFormat + "'");
  }
  ZERO_RETURN_IF_ERROR(GetInt(j, "format_version", &m->format_version, path));
  ZERO_RETURN_IF_ERROR(GetString(j, "zero_version", &m->zero_version, path));
  if (m->format_version < kOldestReadableFormatVersion || m->format_version > kCheckpointFormatVersion) {
    return FailedPreconditionError(path + ": checkpoint format version " + std::to_string(m->format_version) +
                                   " (written by " + m->zero_version + "); this build of zero (" + kZeroVersion +
                                   ") reads format versions " + std::to_string(kOldestReadableFormatVersion) + " to " +
                                   std::to_string(kCheckpointFormatVersion));
  }
  // Version 1 had no metadata checksum: it loads unverified (its rank files are still verified
  // against it). From version 2 on the checksum is required.
  if (!sealed && m->format_version >= 2) {
    return DataLossError(path + ": format version " + std::to_string(m->format_version) +
                         " ends with a \"metadata_crc32c\" entry, this file has none at its "
                         "end (it was truncated or edited)");
  }
  return OkStatus();
}

// The step counters, the loss scaler and the scheduler.
Status ReadTrainingState(const json& j, const std::string& path, CheckpointMeta* m) {
  ZERO_RETURN_IF_ERROR(GetInt(j, "global_steps", &m->global_steps, path));
  ZERO_RETURN_IF_ERROR(GetInt(j, "skipped_steps", &m->skipped_steps, path));
  ZERO_RETURN_IF_ERROR(GetInt(j, "micro_steps", &m->micro_steps, path));
  ZERO_RETURN_IF_ERROR(GetInt(j, "adam_step", &m->adam_step, path));
  const json* ls;
  ZERO_RETURN_IF_ERROR(GetObject(j, "loss_scaler", &ls, path));
  const std::string ls_where = path + ": loss_scaler";
  ZERO_RETURN_IF_ERROR(GetBool(*ls, "dynamic", &m->loss_scaler.dynamic, ls_where));
  ZERO_RETURN_IF_ERROR(GetDouble(*ls, "scale", &m->loss_scaler.scale, ls_where));
  ZERO_RETURN_IF_ERROR(GetInt(*ls, "good_steps", &m->loss_scaler.good_steps, ls_where));
  ZERO_RETURN_IF_ERROR(GetInt(*ls, "hysteresis", &m->loss_scaler.hysteresis, ls_where));
  ZERO_RETURN_IF_ERROR(GetInt(*ls, "last_overflow_step", &m->loss_scaler.last_overflow_step, ls_where));
  const json* sc;
  ZERO_RETURN_IF_ERROR(GetObject(j, "scheduler", &sc, path));
  const std::string sc_where = path + ": scheduler";
  ZERO_RETURN_IF_ERROR(GetString(*sc, "type", &m->scheduler.type, sc_where));
  ZERO_RETURN_IF_ERROR(GetInt(*sc, "last_step", &m->scheduler.last_step, sc_where));
  ZERO_RETURN_IF_ERROR(GetDouble(*sc, "last_lr", &m->scheduler.last_lr, sc_where));
  return OkStatus();
}

// model_dtype, zero_stage, dp_world_size and the saved config and client state.
Status ReadRunShape(const json& j, const std::string& path, CheckpointMeta* m) {
  std::string dtype;
  ZERO_RETURN_IF_ERROR(GetString(j, "model_dtype", &dtype, path));
  if (!ParseDType(dtype, &m->model_dtype)) {
    return DataLossError(path + ": model_dtype '" + dtype + "' is not fp32, bf16 or fp16");
  }
  ZERO_RETURN_IF_ERROR(GetInt(j, "zero_stage", &m->zero_stage, path));
  ZERO_RETURN_IF_ERROR(GetInt(j, "dp_world_size", &m->dp_world_size, path));
  if (m->dp_world_size < 1) {
    return DataLossError(path + ": dp_world_size " + std::to_string(m->dp_world_size) + " < 1");
  }
  if (!j.contains("config") || !j.contains("client_state")) {
    return KeyError(path, j.contains("config") ? "client_state" : "config", "present");
  }
  m->config_json = j["config"].dump();
  m->client_state_json = j["client_state"].dump();
  return OkStatus();
}

// The parameter table, checked against m->dp_world_size.
Status ReadParams(const json& j, const std::string& path, CheckpointMeta* m) {
  auto params = j.find("params");
  if (params == j.end() || !params->is_array()) return KeyError(path, "params", "an array");
  for (size_t i = 0; i < params->size(); ++i) {
    const json& pj = (*params)[i];
    const std::string where = path + ": params[" + std::to_string(i) + "]";
    if (!pj.is_object()) return DataLossError(where + ": not an object");
    CheckpointParam p;
    ZERO_RETURN_IF_ERROR(GetString(pj, "name", &p.name, where));
    ZERO_RETURN_IF_ERROR(GetString(pj, "module", &p.module, where));
    ZERO_RETURN_IF_ERROR(GetInt(pj, "numel", &p.numel, where));
    ZERO_RETURN_IF_ERROR(GetInt(pj, "n_pad", &p.n_pad, where));
    auto shape = pj.find("shape");
    if (shape == pj.end() || !shape->is_array()) return KeyError(where, "shape", "an array");
    for (const json& d : *shape) {
      if (!d.is_number_integer()) return KeyError(where, "shape", "an array of integers");
      p.shape.push_back(d.get<int64_t>());
    }
    m->params.push_back(std::move(p));
  }
  Status table = CheckParamTable(m->params, m->dp_world_size, path);
  if (!table.ok()) return DataLossError(table.message());
  return OkStatus();
}

// One entry per rank, each naming that rank's file, its size and its CRC32C.
Status ReadRankFiles(const json& j, const std::string& path, CheckpointMeta* m) {
  auto files = j.find("rank_files");
  if (files == j.end() || !files->is_array()) return KeyError(path, "rank_files", "an array");
  if (static_cast<int>(files->size()) != m->dp_world_size) {
    return DataLossError(path + ": dp_world_size " + std::to_string(m->dp_world_size) + " but " +
                         std::to_string(files->size()) + " rank_files entries");
  }
  for (size_t r = 0; r < files->size(); ++r) {
    const json& fj = (*files)[r];
    const std::string where = path + ": rank_files[" + std::to_string(r) + "]";
    if (!fj.is_object()) return DataLossError(where + ": not an object");
    RankFileInfo f;
    int64_t rank, bytes;
    std::string crc;
    ZERO_RETURN_IF_ERROR(GetInt(fj, "rank", &rank, where));
    ZERO_RETURN_IF_ERROR(GetString(fj, "file", &f.file, where));
    ZERO_RETURN_IF_ERROR(GetInt(fj, "bytes", &bytes, where));
    ZERO_RETURN_IF_ERROR(GetString(fj, "crc32c", &crc, where));
    char* end = nullptr;
    unsigned long v = std::strtoul(crc.c_str(), &end, 16);
    if (rank != static_cast<int64_t>(r) || f.file != RankFileName(static_cast<int>(r)) || bytes < 0 ||
        crc.size() != 10 || end != crc.c_str() + crc.size()) {
      return DataLossError(where + ": expected rank " + std::to_string(r) + ", file " +
                           RankFileName(static_cast<int>(r)) + ", bytes >= 0 and crc32c \"0x\" + 8 hex digits");
    }
    f.bytes = static_cast<uint64_t>(bytes);
    f.crc32c = static_cast<uint32_t>(v);
    m->rank_files.push_back(std::move(f));
  }
  return OkStatus();
}

}  // namespace

Result<CheckpointMeta> ReadMetadata(const std::string& dir, const std::string& tag, FileSystem* fs_or_null) {
  FileSystem& fs = *FileSystemOrDefault(fs_or_null);
  ZERO_RETURN_IF_ERROR(ValidateTag(tag));
  const std::string tag_dir = TagDirectory(dir, tag);
  const std::string path = JoinPath(tag_dir, kMetadataFileName);
  ZERO_ASSIGN_OR_RETURN(std::string text, ReadMetadataText(fs, tag, tag_dir, path));
  bool sealed = false;
  ZERO_ASSIGN_OR_RETURN(json j, ParseMetadataText(text, path, &sealed));
  CheckpointMeta m;
  ZERO_RETURN_IF_ERROR(ReadFormat(j, path, sealed, &m));
  ZERO_RETURN_IF_ERROR(GetString(j, "tag", &m.tag, path));
  m.tag = tag;  // the directory name wins: a renamed tag directory loads under its new name
  ZERO_RETURN_IF_ERROR(ReadTrainingState(j, path, &m));
  ZERO_RETURN_IF_ERROR(ReadRunShape(j, path, &m));
  ZERO_RETURN_IF_ERROR(ReadParams(j, path, &m));
  ZERO_RETURN_IF_ERROR(ReadRankFiles(j, path, &m));
  return m;
}

}  // namespace zero
