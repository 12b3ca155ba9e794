#include "engine/checkpoint_format.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <nlohmann/json.hpp>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "engine/checkpoint_io.h"
#include "engine/json_input.h"
#include "runtime/crc32c.h"

namespace zero {

static_assert(std::endian::native == std::endian::little,
              "checkpoint files are little-endian; a big-endian port needs byte swaps here");

namespace {

using nlohmann::json;

// Rank file layout (all integers little-endian):
//   header (48 bytes): "ZEROCKPT", u32 version, u32 rank, u32 world, u32 reserved (0),
//                      u64 param_count, u64 file_bytes, u32 crc32c of the 40 bytes before, u32 0
//   records, one per parameter: u32 name_len, name, u32 module_len, module, u32 ndim, u32 0,
//                      i64 shape[ndim], i64 numel, i64 begin, i64 end,
//                      f32 master[end-begin], f32 exp_avg[end-begin], f32 exp_avg_sq[end-begin]
//   trailer (8 bytes): u32 crc32c of every byte before the trailer, "ZEND"
// metadata.json records each file's size and body CRC (the trailer's value). Not the whole file's
// CRC: a CRC over data followed by its own CRC is the same constant for every file.
constexpr char kRankMagic[8] = {'Z', 'E', 'R', 'O', 'C', 'K', 'P', 'T'};
constexpr char kTrailerMagic[4] = {'Z', 'E', 'N', 'D'};
constexpr uint32_t kRankFileVersion = 1;
constexpr size_t kHeaderBytes = 48;
constexpr size_t kHeaderCrcOffset = 40;
constexpr size_t kTrailerBytes = 8;
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

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

template <typename T>
T Get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

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

std::string RecordHeader(const ParamShard& s) {
  std::string h;
  Put<uint32_t>(&h, static_cast<uint32_t>(s.name.size()));
  h += s.name;
  Put<uint32_t>(&h, static_cast<uint32_t>(s.module.size()));
  h += s.module;
  Put<uint32_t>(&h, static_cast<uint32_t>(s.shape.size()));
  Put<uint32_t>(&h, 0);
  for (int64_t d : s.shape) Put<int64_t>(&h, d);
  Put<int64_t>(&h, s.numel);
  Put<int64_t>(&h, s.begin);
  Put<int64_t>(&h, s.end);
  return h;
}

std::string MakeHeader(int rank, int world, uint64_t param_count, uint64_t file_bytes) {
  std::string h(kRankMagic, sizeof(kRankMagic));
  Put<uint32_t>(&h, kRankFileVersion);
  Put<uint32_t>(&h, static_cast<uint32_t>(rank));
  Put<uint32_t>(&h, static_cast<uint32_t>(world));
  Put<uint32_t>(&h, 0);
  Put<uint64_t>(&h, param_count);
  Put<uint64_t>(&h, file_bytes);
  Put<uint32_t>(&h, Crc32c(h.data(), h.size()));
  Put<uint32_t>(&h, 0);
  return h;
}

struct RankHeader {
  uint32_t version, rank, world;
  uint64_t param_count, file_bytes;
};

// Checks magic, header CRC and version; `path` names the file in errors.
Result<RankHeader> ParseHeader(const std::string& path, const char* p, size_t available) {
  if (available < kHeaderBytes) {
    return DataLossError(path + ": truncated: expected at least " + std::to_string(kHeaderBytes) +
                         " bytes (the header), got " + std::to_string(available));
  }
  if (std::memcmp(p, kRankMagic, sizeof(kRankMagic)) != 0) {
    return DataLossError(path + ": not a zero rank file (bad magic)");
  }
  uint32_t want = Get<uint32_t>(p + kHeaderCrcOffset);
  uint32_t got = Crc32c(p, kHeaderCrcOffset);
  if (want != got) {
    return DataLossError(path + ": header checksum mismatch: expected crc32c " + Crc32cHex(want) +
                         ", got " + Crc32cHex(got) + " (the file is corrupt)");
  }
  RankHeader h;
  h.version = Get<uint32_t>(p + 8);
  h.rank = Get<uint32_t>(p + 12);
  h.world = Get<uint32_t>(p + 16);
  h.param_count = Get<uint64_t>(p + 24);
  h.file_bytes = Get<uint64_t>(p + 32);
  if (h.version != kRankFileVersion) {
    return FailedPreconditionError(path + ": rank file version " + std::to_string(h.version) +
                                   "; this build of zero reads version " +
                                   std::to_string(kRankFileVersion));
  }
  return h;
}

Status CheckHeaderIdentity(const std::string& path, const RankHeader& h, int rank, int world) {
  if (static_cast<int>(h.rank) != rank || static_cast<int>(h.world) != world) {
    return DataLossError(path + ": header says rank " + std::to_string(h.rank) + " of world " +
                         std::to_string(h.world) + ", expected rank " + std::to_string(rank) +
                         " of world " + std::to_string(world) +
                         " (a file left from another save under the same tag?)");
  }
  return OkStatus();
}

// Bounds-checked cursor over a rank file's bytes.
class Cursor {
 public:
  Cursor(const std::string& path, std::string_view data, size_t pos)
      : path_(path), data_(data), pos_(pos) {}
  Status Need(size_t n, const std::string& what) {
    if (n > data_.size() - pos_) {
      return DataLossError(path_ + ": " + what + " runs past the end of the records (offset " +
                           std::to_string(pos_) + ", " + std::to_string(n) + " bytes needed)");
    }
    return OkStatus();
  }
  template <typename T>
  Status Read(T* out, const std::string& what) {
    ZERO_RETURN_IF_ERROR(Need(sizeof(T), what));
    *out = Get<T>(data_.data() + pos_);
    pos_ += sizeof(T);
    return OkStatus();
  }
  Status ReadString(std::string* out, const std::string& what) {
    uint32_t len;
    ZERO_RETURN_IF_ERROR(Read(&len, what));
    ZERO_RETURN_IF_ERROR(Need(len, what));
    out->assign(data_.data() + pos_, len);
    pos_ += len;
    return OkStatus();
  }
  Status ReadFloats(size_t count, std::vector<float>* out, const std::string& what) {
    if (count > (data_.size() - pos_) / sizeof(float)) return Need(count * sizeof(float), what);
    out->resize(count);
    std::memcpy(out->data(), data_.data() + pos_, count * sizeof(float));
    pos_ += count * sizeof(float);
    return OkStatus();
  }
  size_t pos() const { return pos_; }

 private:
  const std::string& path_;
  std::string_view data_;
  size_t pos_;
};

// Parses a whole rank file that already passed the size/CRC checks against metadata.json, and
// checks every record against the param table.
Result<std::vector<ParamShard>> ParseRankFile(const std::string& path, const std::string& data,
                                              int rank, const CheckpointMeta& meta) {
  ZERO_ASSIGN_OR_RETURN(RankHeader h, ParseHeader(path, data.data(), data.size()));
  ZERO_RETURN_IF_ERROR(CheckHeaderIdentity(path, h, rank, meta.dp_world_size));
  if (h.file_bytes != data.size()) {
    return DataLossError(path + ": truncated: expected " + std::to_string(h.file_bytes) +
                         " bytes (from its header), got " + std::to_string(data.size()));
  }
  if (data.size() < kHeaderBytes + kTrailerBytes ||
      std::memcmp(data.data() + data.size() - 4, kTrailerMagic, 4) != 0) {
    return DataLossError(path + ": bad trailer (the file is corrupt)");
  }
  const size_t body = data.size() - kTrailerBytes;
  uint32_t want = Get<uint32_t>(data.data() + body);
  uint32_t got = Crc32c(data.data(), body);
  if (want != got) {
    return DataLossError(path + ": checksum mismatch: expected crc32c " + Crc32cHex(want) +
                         " (its trailer), got " + Crc32cHex(got) + " (the file is corrupt)");
  }
  if (h.param_count != meta.params.size()) {
    return DataLossError(path + ": holds " + std::to_string(h.param_count) +
                         " parameters, metadata.json lists " + std::to_string(meta.params.size()));
  }
  Cursor cur(path, std::string_view(data.data(), body), kHeaderBytes);
  std::vector<ParamShard> shards(meta.params.size());
  for (size_t i = 0; i < shards.size(); ++i) {
    const CheckpointParam& p = meta.params[i];
    ParamShard& s = shards[i];
    const std::string what = "record " + std::to_string(i) + " ('" + p.name + "')";
    ZERO_RETURN_IF_ERROR(cur.ReadString(&s.name, what));
    ZERO_RETURN_IF_ERROR(cur.ReadString(&s.module, what));
    uint32_t ndim, zero;
    ZERO_RETURN_IF_ERROR(cur.Read(&ndim, what));
    ZERO_RETURN_IF_ERROR(cur.Read(&zero, what));
    ZERO_RETURN_IF_ERROR(cur.Need(static_cast<size_t>(ndim) * 8, what));
    s.shape.resize(ndim);
    for (auto& d : s.shape) ZERO_RETURN_IF_ERROR(cur.Read(&d, what));
    ZERO_RETURN_IF_ERROR(cur.Read(&s.numel, what));
    ZERO_RETURN_IF_ERROR(cur.Read(&s.begin, what));
    ZERO_RETURN_IF_ERROR(cur.Read(&s.end, what));
    if (s.name != p.name || s.shape != p.shape || s.numel != p.numel) {
      return DataLossError(path + ": " + what + " is parameter '" + s.name + "' of shape " +
                           ShapeString(s.shape) + ", metadata.json lists '" + p.name +
                           "' of shape " + ShapeString(p.shape));
    }
    if (s.begin < 0 || s.end < s.begin || s.end > p.n_pad) {
      return DataLossError(path + ": " + what + ": range [" + std::to_string(s.begin) + ", " +
                           std::to_string(s.end) + ") is outside the padded parameter [0, " +
                           std::to_string(p.n_pad) + ")");
    }
    const size_t count = static_cast<size_t>(s.end - s.begin);
    ZERO_RETURN_IF_ERROR(cur.ReadFloats(count, &s.master, what));
    ZERO_RETURN_IF_ERROR(cur.ReadFloats(count, &s.exp_avg, what));
    ZERO_RETURN_IF_ERROR(cur.ReadFloats(count, &s.exp_avg_sq, what));
  }
  if (cur.pos() != body) {
    return DataLossError(path + ": " + std::to_string(body - cur.pos()) +
                         " unexpected bytes after the last record");
  }
  return shards;
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

Status GetString(const json& j, const std::string& key, std::string* out,
                 const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return KeyError(where, key, "a string");
  *out = it->get<std::string>();
  return OkStatus();
}

Status GetObject(const json& j, const std::string& key, const json** out,
                 const std::string& where) {
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

Status CheckParamTable(const std::vector<CheckpointParam>& params, int world,
                       const std::string& where) {
  std::unordered_map<std::string, size_t> seen;
  for (size_t i = 0; i < params.size(); ++i) {
    const CheckpointParam& p = params[i];
    if (p.name.empty())
      return InvalidArgumentError(where + ": parameter " + std::to_string(i) +
                                  " has an empty name");
    if (!seen.emplace(p.name, i).second) {
      return InvalidArgumentError(where + ": parameter '" + p.name + "' appears twice");
    }
    int64_t numel = ShapeNumel(p.shape);
    if (numel < 0 || numel != p.numel || p.n_pad != PaddedNumel(p.numel, world)) {
      return InvalidArgumentError(where + ": parameter '" + p.name + "': shape " +
                                  ShapeString(p.shape) + ", numel " + std::to_string(p.numel) +
                                  " and n_pad " + std::to_string(p.n_pad) +
                                  " disagree for dp world size " + std::to_string(world));
    }
  }
  return OkStatus();
}

using Intervals = std::vector<std::pair<int64_t, int64_t>>;

// The slices of one parameter must cover [0, numel) exactly once (padding beyond numel ignored).
Status CheckCoverage(const std::string& tag_dir, const std::string& name, int64_t numel,
                     Intervals iv) {
  for (auto& [b, e] : iv) {
    b = std::min(b, numel);
    e = std::min(e, numel);
  }
  std::sort(iv.begin(), iv.end());
  int64_t pos = 0;
  for (const auto& [b, e] : iv) {
    if (b == e) continue;
    if (b > pos) {
      return DataLossError("checkpoint " + tag_dir + ": parameter '" + name + "': elements [" +
                           std::to_string(pos) + ", " + std::to_string(b) +
                           ") are in no rank file");
    }
    if (b < pos) {
      return DataLossError("checkpoint " + tag_dir + ": parameter '" + name + "': elements [" +
                           std::to_string(b) + ", " + std::to_string(std::min(pos, e)) +
                           ") are in more than one rank file");
    }
    pos = e;
  }
  if (pos < numel) {
    return DataLossError("checkpoint " + tag_dir + ": parameter '" + name + "': elements [" +
                         std::to_string(pos) + ", " + std::to_string(numel) +
                         ") are in no rank file");
  }
  return OkStatus();
}

// Copies the elements of `src` that fall in [dst_begin, dst_end) ∩ [0, numel) into the arrays
// starting at dst_begin.
void CopyOverlap(const ParamShard& src, int64_t numel, int64_t dst_begin, int64_t dst_end,
                 float* master, float* exp_avg, float* exp_avg_sq) {
  int64_t lo = std::max(src.begin, dst_begin);
  int64_t hi = std::min({src.end, dst_end, numel});
  if (hi <= lo) return;
  const size_t n = static_cast<size_t>(hi - lo) * sizeof(float);
  std::memcpy(master + (lo - dst_begin), src.master.data() + (lo - src.begin), n);
  std::memcpy(exp_avg + (lo - dst_begin), src.exp_avg.data() + (lo - src.begin), n);
  std::memcpy(exp_avg_sq + (lo - dst_begin), src.exp_avg_sq.data() + (lo - src.begin), n);
}

Result<std::vector<ParamShard>> ReadRankFileImpl(const std::string& dir, const std::string& tag,
                                                 int rank, const CheckpointMeta& meta) {
  const std::string tag_dir = TagDirectory(dir, tag);
  const std::string path = JoinPath(tag_dir, RankFileName(rank));
  if (rank < 0 || rank >= meta.dp_world_size ||
      static_cast<int>(meta.rank_files.size()) != meta.dp_world_size) {
    return InvalidArgumentError("checkpoint " + tag_dir + " was saved with dp world size " +
                                std::to_string(meta.dp_world_size) + "; it has no rank " +
                                std::to_string(rank));
  }
  if (!PathExists(path)) {
    return NotFoundError("checkpoint " + tag_dir + " was saved with dp world size " +
                         std::to_string(meta.dp_world_size) + ", but its rank file " +
                         RankFileName(rank) + " is missing (" + path + ")");
  }
  const RankFileInfo& info = meta.rank_files[rank];
  const std::string ctx = "rank " + std::to_string(rank) + " file";
  ZERO_ASSIGN_OR_RETURN(std::string data, ReadFile(path));
  if (data.size() != info.bytes) {
    return DataLossError(ctx + ": " + path +
                         (data.size() < info.bytes ? ": truncated" : ": longer than expected") +
                         ": expected " + std::to_string(info.bytes) +
                         " bytes (metadata.json), got " + std::to_string(data.size()));
  }
  if (data.size() < kTrailerBytes)
    return DataLossError(ctx + ": " + path + ": shorter than a trailer");
  const uint32_t crc = Crc32c(data.data(), data.size() - kTrailerBytes);
  if (crc != info.crc32c) {
    return DataLossError(ctx + ": " + path + ": checksum mismatch: expected crc32c " +
                         Crc32cHex(info.crc32c) + " (metadata.json), got " + Crc32cHex(crc) +
                         " (the file is corrupt, or from another save)");
  }
  return ParseRankFile(path, data, rank, meta);
}

}  // namespace

// --- partition arithmetic
// -------------------------------------------------------------------------

ElementRange PartitionRange(int64_t numel, int rank, int world) {
  const int64_t n_pad = PaddedNumel(numel, world);
  return {rank * (n_pad / world), (rank + 1) * (n_pad / world)};
}

CheckpointParam MakeCheckpointParam(std::string name, std::vector<int64_t> shape,
                                    std::string module, int world) {
  CheckpointParam p;
  p.name = std::move(name);
  p.numel = ShapeNumel(shape);
  p.shape = std::move(shape);
  p.module = std::move(module);
  // A bad shape or world size is reported by the writers' validation, not here.
  p.n_pad = (p.numel >= 0 && world >= 1) ? PaddedNumel(p.numel, world) : -1;
  return p;
}

// --- names
// ----------------------------------------------------------------------------------------

Status ValidateTag(const std::string& tag) {
  if (tag.empty()) return InvalidArgumentError("checkpoint tag is empty");
  if (tag.size() > 255) return InvalidArgumentError("checkpoint tag is longer than 255 bytes");
  if (tag == "." || tag == "..")
    return InvalidArgumentError("checkpoint tag '" + tag + "' is not a directory name");
  if (tag.rfind(kStagingPrefix, 0) == 0) {
    return InvalidArgumentError("checkpoint tag '" + tag + "' starts with '" + kStagingPrefix +
                                "', which names the save's staging directories");
  }
  for (unsigned char c : tag) {
    if (c == '/' || std::isspace(c) || std::iscntrl(c)) {
      return InvalidArgumentError("checkpoint tag '" + tag +
                                  "' contains '/', whitespace or a control character");
    }
  }
  return OkStatus();
}

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

std::string RankFileName(int rank) {
  return "zero_rank_" + std::to_string(rank) + "_optim_states.bin";
}

std::string TagDirectory(const std::string& dir, const std::string& tag) {
  return JoinPath(dir, tag);
}

std::string DefaultTag(int64_t global_steps) {
  return "global_step" + std::to_string(global_steps);
}

Status CheckJsonText(const std::string& text, const std::string& what) {
  return ParseJson(text, what).status();
}

// --- writing
// --------------------------------------------------------------------------------------

Result<RankFileInfo> WriteRankFile(const std::string& dir, const std::string& tag, int rank,
                                   int world, const std::vector<ParamShard>& shards) {
  ZERO_RETURN_IF_ERROR(ValidateTag(tag));
  if (world < 1 || rank < 0 || rank >= world) {
    return InvalidArgumentError("WriteRankFile: rank " + std::to_string(rank) +
                                " is not in a dp world of size " + std::to_string(world));
  }
  const std::string where =
      "checkpoint rank " + std::to_string(rank) + " of " + std::to_string(world);
  uint64_t total = kHeaderBytes + kTrailerBytes;
  std::vector<std::string> record_headers;
  record_headers.reserve(shards.size());
  for (const ParamShard& s : shards) {
    const int64_t numel = ShapeNumel(s.shape);
    if (numel < 0 || numel != s.numel) {
      return InvalidArgumentError(where + ": parameter '" + s.name + "': numel " +
                                  std::to_string(s.numel) + " is not the product of shape " +
                                  ShapeString(s.shape));
    }
    if (s.begin < 0 || s.end < s.begin || s.end > PaddedNumel(s.numel, world)) {
      return InvalidArgumentError(where + ": parameter '" + s.name + "': range [" +
                                  std::to_string(s.begin) + ", " + std::to_string(s.end) +
                                  ") is outside the padded parameter [0, " +
                                  std::to_string(PaddedNumel(s.numel, world)) + ")");
    }
    const size_t count = static_cast<size_t>(s.end - s.begin);
    if (s.master.size() != count || s.exp_avg.size() != count || s.exp_avg_sq.size() != count) {
      return InvalidArgumentError(
          where + ": parameter '" + s.name + "': range [" + std::to_string(s.begin) + ", " +
          std::to_string(s.end) + ") needs " + std::to_string(count) +
          " floats per state, got master " + std::to_string(s.master.size()) + ", exp_avg " +
          std::to_string(s.exp_avg.size()) + ", exp_avg_sq " + std::to_string(s.exp_avg_sq.size()));
    }
    record_headers.push_back(RecordHeader(s));
    total += record_headers.back().size() + 3 * count * sizeof(float);
  }

  const std::string tag_dir = TagDirectory(dir, tag);
  ZERO_RETURN_IF_ERROR(CreateDirectories(tag_dir));
  const std::string path = JoinPath(tag_dir, RankFileName(rank));
  ZERO_ASSIGN_OR_RETURN(AtomicFileWriter w, AtomicFileWriter::Open(path));
  ZERO_RETURN_IF_ERROR(w.Append(MakeHeader(rank, world, shards.size(), total)));
  for (size_t i = 0; i < shards.size(); ++i) {
    const ParamShard& s = shards[i];
    ZERO_RETURN_IF_ERROR(w.Append(record_headers[i]));
    ZERO_RETURN_IF_ERROR(w.Append(s.master.data(), s.master.size() * sizeof(float)));
    ZERO_RETURN_IF_ERROR(w.Append(s.exp_avg.data(), s.exp_avg.size() * sizeof(float)));
    ZERO_RETURN_IF_ERROR(w.Append(s.exp_avg_sq.data(), s.exp_avg_sq.size() * sizeof(float)));
    if (i == shards.size() / 2) CrashPoint("writing_rank_file", rank);  // tests: a partial file
  }
  std::string trailer;
  Put<uint32_t>(&trailer, w.crc());
  trailer.append(kTrailerMagic, sizeof(kTrailerMagic));
  const uint32_t body_crc = w.crc();
  ZERO_RETURN_IF_ERROR(w.Append(trailer));
  ZERO_CHECK_MSG(w.size() == total, path);
  RankFileInfo info{RankFileName(rank), w.size(), body_crc};
  ZERO_RETURN_IF_ERROR(w.Commit());
  return info;
}

Status WriteMetadata(const std::string& dir, const std::string& tag, const CheckpointMeta& meta) {
  ZERO_RETURN_IF_ERROR(ValidateTag(tag));
  const std::string path = JoinPath(TagDirectory(dir, tag), kMetadataFileName);
  if (meta.tag != tag) {
    return InvalidArgumentError(path + ": metadata tag '" + meta.tag + "' differs from '" + tag +
                                "'");
  }
  if (meta.dp_world_size < 1 || static_cast<int>(meta.rank_files.size()) != meta.dp_world_size) {
    return InvalidArgumentError(path + ": dp world size " + std::to_string(meta.dp_world_size) +
                                " but " + std::to_string(meta.rank_files.size()) + " rank files");
  }
  ZERO_RETURN_IF_ERROR(CheckParamTable(meta.params, meta.dp_world_size, path));
  ZERO_ASSIGN_OR_RETURN(json config, ParseJson(meta.config_json, path + ": config_json"));
  ZERO_ASSIGN_OR_RETURN(json client,
                        ParseJson(meta.client_state_json, path + ": client_state_json"));

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
  j["scheduler"] = {{"type", meta.scheduler.type},
                    {"last_step", meta.scheduler.last_step},
                    {"last_lr", meta.scheduler.last_lr}};
  j["model_dtype"] = DTypeName(meta.model_dtype);
  j["zero_stage"] = meta.zero_stage;
  j["dp_world_size"] = meta.dp_world_size;
  j["config"] = std::move(config);
  j["client_state"] = std::move(client);
  json params = json::array();
  for (const CheckpointParam& p : meta.params) {
    params.push_back({{"name", p.name},
                      {"shape", p.shape},
                      {"module", p.module},
                      {"numel", p.numel},
                      {"n_pad", p.n_pad}});
  }
  j["params"] = std::move(params);
  json files = json::array();
  for (size_t r = 0; r < meta.rank_files.size(); ++r) {
    const RankFileInfo& f = meta.rank_files[r];
    files.push_back(
        {{"rank", r}, {"file", f.file}, {"bytes", f.bytes}, {"crc32c", Crc32cHex(f.crc32c)}});
  }
  j["rank_files"] = std::move(files);
  return WriteFileAtomic(path, SealMetadataText(j.dump(1)));
}

Status WriteLatest(const std::string& dir, const std::string& tag) {
  ZERO_RETURN_IF_ERROR(ValidateTag(tag));
  return WriteFileAtomic(JoinPath(dir, kLatestFileName), tag);
}

Result<RankFileInfo> ReadRankFileInfo(const std::string& dir, const std::string& tag, int rank,
                                      int world) {
  const std::string path = JoinPath(TagDirectory(dir, tag), RankFileName(rank));
  ZERO_ASSIGN_OR_RETURN(uint64_t size, FileSize(path));  // NOT_FOUND names the file
  ZERO_ASSIGN_OR_RETURN(std::string header,
                        ReadFileRange(path, 0, std::min<uint64_t>(size, kHeaderBytes)));
  ZERO_ASSIGN_OR_RETURN(RankHeader h, ParseHeader(path, header.data(), header.size()));
  ZERO_RETURN_IF_ERROR(CheckHeaderIdentity(path, h, rank, world));
  if (size != h.file_bytes) {
    return DataLossError(path + ": truncated: expected " + std::to_string(h.file_bytes) +
                         " bytes (from its header), got " + std::to_string(size));
  }
  if (size < kHeaderBytes + kTrailerBytes)
    return DataLossError(path + ": bad trailer (the file is corrupt)");
  ZERO_ASSIGN_OR_RETURN(std::string trailer,
                        ReadFileRange(path, size - kTrailerBytes, kTrailerBytes));
  if (std::memcmp(trailer.data() + 4, kTrailerMagic, 4) != 0) {
    return DataLossError(path + ": bad trailer (the file is corrupt)");
  }
  return RankFileInfo{RankFileName(rank), size, Get<uint32_t>(trailer.data())};
}

Status WriteCheckpointMetadata(const std::string& dir, const std::string& tag,
                               CheckpointMeta meta) {
  ZERO_RETURN_IF_ERROR(ValidateTag(tag));
  const std::string tag_dir = TagDirectory(dir, tag);
  const int world = meta.dp_world_size;
  if (world < 1)
    return InvalidArgumentError("checkpoint " + tag_dir + ": dp world size " +
                                std::to_string(world));
  meta.tag = tag;
  std::vector<RankFileInfo> infos;
  std::vector<int> missing;
  for (int r = 0; r < world; ++r) {
    auto info = ReadRankFileInfo(dir, tag, r, world);
    if (!info.ok()) {
      if (info.status().code() != StatusCode::kNotFound) return info.status();
      missing.push_back(r);
      continue;
    }
    infos.push_back(*info);
  }
  if (!missing.empty()) {
    std::string ranks;
    for (size_t i = 0; i < missing.size(); ++i)
      ranks += (i ? ", " : "") + std::to_string(missing[i]);
    return FailedPreconditionError(
        "checkpoint " + tag_dir + " is incomplete: dp world size " + std::to_string(world) +
        " but no rank file for rank(s) " + ranks + " (" + RankFileName(missing[0]) +
        (missing.size() > 1 ? ", ..." : "") +
        "). Save must be called on every rank, and rank 0 finalizes only after all ranks "
        "finished writing; `latest` still names the previous checkpoint");
  }
  if (!meta.rank_files.empty()) {
    if (meta.rank_files.size() != infos.size()) {
      return InvalidArgumentError(
          "checkpoint " + tag_dir + ": " + std::to_string(meta.rank_files.size()) +
          " reported rank files for dp world size " + std::to_string(world));
    }
    for (int r = 0; r < world; ++r) {
      const RankFileInfo& want = meta.rank_files[r];
      if (!(want == infos[r])) {
        return DataLossError("checkpoint " + tag_dir + ": " + infos[r].file + " on disk (" +
                             std::to_string(infos[r].bytes) + " bytes, crc32c " +
                             Crc32cHex(infos[r].crc32c) + ") is not what rank " +
                             std::to_string(r) + " wrote (" + std::to_string(want.bytes) +
                             " bytes, crc32c " + Crc32cHex(want.crc32c) +
                             "): another save wrote the same tag at the same time?");
      }
    }
  }
  meta.rank_files = std::move(infos);
  return WriteMetadata(dir, tag, meta);
}

Status FinalizeCheckpoint(const std::string& dir, const std::string& tag, CheckpointMeta meta) {
  ZERO_RETURN_IF_ERROR(WriteCheckpointMetadata(dir, tag, std::move(meta)));
  return WriteLatest(dir, tag);
}

// --- staging and the swap
// ------------------------------------------------------------------------

namespace {
constexpr const char* kStagingTagFile = "saving_tag";
constexpr const char* kStagingPrevious = "previous";
std::atomic<bool> g_force_rename_fallback{false};

bool IsStagingRoot(const std::string& name) { return name.rfind(kStagingPrefix, 0) == 0; }
}  // namespace

void ForceRenameFallbackForTest(bool force) { g_force_rename_fallback.store(force); }

Result<std::string> CreateStagingRoot(const std::string& dir, const std::string& tag) {
  ZERO_RETURN_IF_ERROR(ValidateTag(tag));
  ZERO_RETURN_IF_ERROR(CreateDirectories(dir));
  std::random_device rd;
  for (int attempt = 0; attempt < 8; ++attempt) {
    char name[64];
    std::snprintf(name, sizeof(name), "%s%d.%08x%08x", kStagingPrefix, static_cast<int>(::getpid()),
                  rd(), rd());
    const std::string root = JoinPath(dir, name);
    if (::mkdir(root.c_str(), 0755) != 0) {
      if (errno == EEXIST) continue;
      return ErrnoError("mkdir", root, errno);
    }
    ZERO_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(root, kStagingTagFile), tag));
    ZERO_RETURN_IF_ERROR(SyncDirectory(dir));
    return root;
  }
  return InternalError("create a staging directory in " + dir + ": no free name after 8 attempts");
}

Status InstallStagedTag(const std::string& staging_root, const std::string& dir,
                        const std::string& tag) {
  ZERO_RETURN_IF_ERROR(ValidateTag(tag));
  const std::string staged = TagDirectory(staging_root, tag);
  const std::string target = TagDirectory(dir, tag);
  const std::string what = "install checkpoint " + staged + " as " + target;
  if (!PathExists(target)) {
    ZERO_RETURN_IF_ERROR(RenamePath(staged, target).WithContext(what));
  } else {
    Status st = g_force_rename_fallback.load()
                    ? UnimplementedError("exchange forced off for a test")
                    : ExchangePaths(staged, target);
    if (st.code() == StatusCode::kUnimplemented) {
      // Two renames: the old copy moves into the staging root first, so it is never destroyed;
      // a crash between them leaves `target` missing and CleanStaleSaves (or a person) moves the
      // old copy back.
      const std::string previous = JoinPath(staging_root, kStagingPrevious);
      ZERO_RETURN_IF_ERROR(RenamePath(target, previous).WithContext(what));
      ZERO_RETURN_IF_ERROR(SyncDirectory(dir));
      ZERO_RETURN_IF_ERROR(SyncDirectory(staging_root));
      CrashPoint("fallback_old_moved_away", 0);
      st = RenamePath(staged, target);
      if (!st.ok()) {
        Status back = RenamePath(previous, target);
        return st.WithContext(what + (back.ok() ? " (the previous copy was put back)"
                                                : " (putting the previous copy back failed: " +
                                                      back.message() + ")"));
      }
    } else if (!st.ok()) {
      return st.WithContext(what);
    }
  }
  ZERO_RETURN_IF_ERROR(SyncDirectory(dir));
  return SyncDirectory(staging_root);
}

Result<std::vector<std::string>> CleanStaleSaves(const std::string& dir) {
  std::vector<std::string> done;
  if (!PathExists(dir)) return done;
  ZERO_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(dir));
  for (const std::string& name : names) {
    if (!IsStagingRoot(name)) continue;
    const std::string root = JoinPath(dir, name);
    const std::string previous = JoinPath(root, kStagingPrevious);
    auto tag = ReadFile(JoinPath(root, kStagingTagFile));
    if (tag.ok() && ValidateTag(*tag).ok() && PathExists(previous) &&
        !PathExists(TagDirectory(dir, *tag))) {
      // A save died between the two renames of the fallback swap: put the old copy back.
      ZERO_RETURN_IF_ERROR(
          RenamePath(previous, TagDirectory(dir, *tag))
              .WithContext("restore the previous copy of tag '" + *tag + "' left by an "
                           "interrupted save"));
      ZERO_RETURN_IF_ERROR(SyncDirectory(dir));
      done.push_back("restored " + TagDirectory(dir, *tag) + " from " + previous);
    }
    ZERO_RETURN_IF_ERROR(RemoveTree(root).WithContext(
        "remove the staging directory " + root + " left by an interrupted save"));
    done.push_back("removed " + root);
  }
  if (!done.empty()) ZERO_RETURN_IF_ERROR(SyncDirectory(dir));
  return done;
}

namespace {
// Where an interrupted fallback swap left the previous copy of `tag`, or "".
std::string FindPreviousCopy(const std::string& dir, const std::string& tag) {
  auto names = ListDirectory(dir);
  if (!names.ok()) return "";
  for (const std::string& name : *names) {
    if (!IsStagingRoot(name)) continue;
    const std::string root = JoinPath(dir, name);
    auto t = ReadFile(JoinPath(root, kStagingTagFile));
    const std::string previous = JoinPath(root, kStagingPrevious);
    if (t.ok() && *t == tag && PathExists(JoinPath(previous, kMetadataFileName))) return previous;
  }
  return "";
}
}  // namespace

// --- reading
// --------------------------------------------------------------------------------------

Result<std::string> ReadLatest(const std::string& dir) {
  if (!PathExists(dir)) return NotFoundError("checkpoint directory " + dir + " does not exist");
  const std::string path = JoinPath(dir, kLatestFileName);
  if (!PathExists(path)) {
    return NotFoundError(path + " is missing: no checkpoint was completed in " + dir +
                         " (pass a tag explicitly to load an incomplete save's files)");
  }
  ZERO_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  size_t b = 0, e = text.size();
  while (b < e && std::isspace(static_cast<unsigned char>(text[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(text[e - 1]))) --e;
  std::string tag = text.substr(b, e - b);
  Status valid = ValidateTag(tag);
  if (!valid.ok()) return DataLossError(path + ": " + valid.message());
  const std::string meta_path = JoinPath(TagDirectory(dir, tag), kMetadataFileName);
  if (!PathExists(meta_path)) {
    const std::string previous = FindPreviousCopy(dir, tag);
    if (!previous.empty()) {
      return NotFoundError(path + " names tag '" + tag + "', but " + meta_path +
                           " does not exist: a save of that tag was interrupted while swapping "
                           "it in; the previous copy is intact at " + previous +
                           " (the next SaveCheckpoint in " + dir + " moves it back)");
    }
    return NotFoundError(path + " names tag '" + tag + "', but " + meta_path +
                         " does not exist (the tag directory was deleted or moved)");
  }
  return tag;
}

Result<std::string> ResolveTag(const std::string& dir, const std::string& tag) {
  if (tag.empty()) return ReadLatest(dir);
  ZERO_RETURN_IF_ERROR(ValidateTag(tag));
  return tag;
}

Result<CheckpointMeta> ReadMetadata(const std::string& dir, const std::string& tag) {
  ZERO_RETURN_IF_ERROR(ValidateTag(tag));
  const std::string tag_dir = TagDirectory(dir, tag);
  const std::string path = JoinPath(tag_dir, kMetadataFileName);
  if (!PathExists(path)) {
    if (PathExists(tag_dir)) {
      return NotFoundError(path + " is missing: the save of tag '" + tag +
                           "' did not complete (rank 0 writes metadata.json last, after every "
                           "rank's file)");
    }
    return NotFoundError("checkpoint tag '" + tag + "' does not exist: " + tag_dir + " is missing");
  }
  ZERO_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  Seal seal;
  const bool sealed = FindSeal(text, &seal);
  if (sealed) {
    const uint32_t crc = Crc32c(text.data(), seal.covered);
    if (crc != seal.crc) {
      return DataLossError(path + ": checksum mismatch: its metadata_crc32c entry says " +
                           Crc32cHex(seal.crc) + ", the " + std::to_string(seal.covered) +
                           " bytes before it have crc32c " + Crc32cHex(crc) +
                           " (the file is corrupt or was edited)");
    }
  }
  // Nesting, numbers beyond double and duplicate keys are refused before anything recursive runs
  // (the saved config and client state are dumped below).
  auto parsed = ParseJsonText<json>(text, path);
  if (!parsed.ok()) {
    std::string what = parsed.status().message();
    if (what.compare(0, path.size() + 2, path + ": ") == 0) what = what.substr(path.size() + 2);
    if (!sealed) {
      return DataLossError(path + ": truncated or corrupt: it does not end with its " +
                           "\"metadata_crc32c\" entry and is not valid JSON (" +
                           std::to_string(text.size()) + " bytes): " + what);
    }
    return DataLossError(path + ": not valid JSON (the file is corrupt): " + what);
  }
  json j = std::move(parsed).value();
  if (!j.is_object()) return DataLossError(path + ": not a JSON object");
  CheckpointMeta m;
  std::string format;
  ZERO_RETURN_IF_ERROR(GetString(j, "format", &format, path));
  if (format != kMetadataFormat) {
    return FailedPreconditionError(path + ": format '" + format + "' is not '" + kMetadataFormat +
                                   "'");
  }
  ZERO_RETURN_IF_ERROR(GetInt(j, "format_version", &m.format_version, path));
  ZERO_RETURN_IF_ERROR(GetString(j, "zero_version", &m.zero_version, path));
  if (m.format_version < kOldestReadableFormatVersion ||
      m.format_version > kCheckpointFormatVersion) {
    return FailedPreconditionError(
        path + ": checkpoint format version " + std::to_string(m.format_version) + " (written by " +
        m.zero_version + "); this build of zero (" + kZeroVersion + ") reads format versions " +
        std::to_string(kOldestReadableFormatVersion) + " to " +
        std::to_string(kCheckpointFormatVersion));
  }
  // Version 1 had no metadata checksum: it loads unverified (its rank files are still verified
  // against it). From version 2 on the checksum is required.
  if (!sealed && m.format_version >= 2) {
    return DataLossError(path + ": format version " + std::to_string(m.format_version) +
                         " ends with a \"metadata_crc32c\" entry, this file has none at its "
                         "end (it was truncated or edited)");
  }
  ZERO_RETURN_IF_ERROR(GetString(j, "tag", &m.tag, path));
  m.tag = tag;  // the directory name wins: a renamed tag directory loads under its new name
  ZERO_RETURN_IF_ERROR(GetInt(j, "global_steps", &m.global_steps, path));
  ZERO_RETURN_IF_ERROR(GetInt(j, "skipped_steps", &m.skipped_steps, path));
  ZERO_RETURN_IF_ERROR(GetInt(j, "micro_steps", &m.micro_steps, path));
  ZERO_RETURN_IF_ERROR(GetInt(j, "adam_step", &m.adam_step, path));
  const json* ls;
  ZERO_RETURN_IF_ERROR(GetObject(j, "loss_scaler", &ls, path));
  const std::string ls_where = path + ": loss_scaler";
  ZERO_RETURN_IF_ERROR(GetBool(*ls, "dynamic", &m.loss_scaler.dynamic, ls_where));
  ZERO_RETURN_IF_ERROR(GetDouble(*ls, "scale", &m.loss_scaler.scale, ls_where));
  ZERO_RETURN_IF_ERROR(GetInt(*ls, "good_steps", &m.loss_scaler.good_steps, ls_where));
  ZERO_RETURN_IF_ERROR(GetInt(*ls, "hysteresis", &m.loss_scaler.hysteresis, ls_where));
  ZERO_RETURN_IF_ERROR(
      GetInt(*ls, "last_overflow_step", &m.loss_scaler.last_overflow_step, ls_where));
  const json* sc;
  ZERO_RETURN_IF_ERROR(GetObject(j, "scheduler", &sc, path));
  const std::string sc_where = path + ": scheduler";
  ZERO_RETURN_IF_ERROR(GetString(*sc, "type", &m.scheduler.type, sc_where));
  ZERO_RETURN_IF_ERROR(GetInt(*sc, "last_step", &m.scheduler.last_step, sc_where));
  ZERO_RETURN_IF_ERROR(GetDouble(*sc, "last_lr", &m.scheduler.last_lr, sc_where));
  std::string dtype;
  ZERO_RETURN_IF_ERROR(GetString(j, "model_dtype", &dtype, path));
  if (!ParseDType(dtype, &m.model_dtype)) {
    return DataLossError(path + ": model_dtype '" + dtype + "' is not fp32, bf16 or fp16");
  }
  ZERO_RETURN_IF_ERROR(GetInt(j, "zero_stage", &m.zero_stage, path));
  ZERO_RETURN_IF_ERROR(GetInt(j, "dp_world_size", &m.dp_world_size, path));
  if (m.dp_world_size < 1) {
    return DataLossError(path + ": dp_world_size " + std::to_string(m.dp_world_size) + " < 1");
  }
  if (!j.contains("config") || !j.contains("client_state")) {
    return KeyError(path, j.contains("config") ? "client_state" : "config", "present");
  }
  m.config_json = j["config"].dump();
  m.client_state_json = j["client_state"].dump();

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
    m.params.push_back(std::move(p));
  }
  Status table = CheckParamTable(m.params, m.dp_world_size, path);
  if (!table.ok()) return DataLossError(table.message());

  auto files = j.find("rank_files");
  if (files == j.end() || !files->is_array()) return KeyError(path, "rank_files", "an array");
  if (static_cast<int>(files->size()) != m.dp_world_size) {
    return DataLossError(path + ": dp_world_size " + std::to_string(m.dp_world_size) + " but " +
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
    if (rank != static_cast<int64_t>(r) || f.file != RankFileName(static_cast<int>(r)) ||
        bytes < 0 || crc.size() != 10 || end != crc.c_str() + crc.size()) {
      return DataLossError(where + ": expected rank " + std::to_string(r) + ", file " +
                           RankFileName(static_cast<int>(r)) +
                           ", bytes >= 0 and crc32c \"0x\" + 8 hex digits");
    }
    f.bytes = static_cast<uint64_t>(bytes);
    f.crc32c = static_cast<uint32_t>(v);
    m.rank_files.push_back(std::move(f));
  }
  return m;
}

Result<std::vector<ParamShard>> ReadRankFile(const std::string& dir, const std::string& tag,
                                             int rank, const CheckpointMeta& meta) {
  return ReadRankFileImpl(dir, tag, rank, meta);
}

// --- repartitioning
// -------------------------------------------------------------------------------

const FullParam* FullState::Find(const std::string& name) const {
  for (const FullParam& p : params) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

Result<FullState> LoadFullState(const std::string& dir, const std::string& tag) {
  FullState full;
  ZERO_ASSIGN_OR_RETURN(full.meta, ReadMetadata(dir, tag));
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
    ZERO_ASSIGN_OR_RETURN(std::vector<ParamShard> shards, ReadRankFileImpl(dir, tag, r, meta));
    for (size_t i = 0; i < shards.size(); ++i) {
      FullParam& f = full.params[i];
      CopyOverlap(shards[i], f.numel, 0, f.numel, f.master.data(), f.exp_avg.data(),
                  f.exp_avg_sq.data());
      seen[i].emplace_back(shards[i].begin, shards[i].end);
    }
  }
  for (size_t i = 0; i < seen.size(); ++i) {
    ZERO_RETURN_IF_ERROR(CheckCoverage(TagDirectory(dir, tag), meta.params[i].name,
                                       meta.params[i].numel, std::move(seen[i])));
  }
  return full;
}

ParamShard SliceFullParam(const std::string& name, const std::vector<int64_t>& shape,
                          const std::string& module, const float* master, const float* exp_avg,
                          const float* exp_avg_sq, int rank, int world) {
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
    out.push_back(SliceFullParam(f.name, f.shape, f.module, f.master.data(), f.exp_avg.data(),
                                 f.exp_avg_sq.data(), new_rank, new_world));
  }
  return out;
}

Status CheckModelMatches(const CheckpointMeta& meta, const std::vector<ParamSignature>& model) {
  std::unordered_map<std::string, const CheckpointParam*> by_name;
  for (const CheckpointParam& p : meta.params) by_name.emplace(p.name, &p);
  std::vector<std::string> problems;
  std::unordered_map<std::string, int> model_names;
  for (const ParamSignature& m : model) {
    if (++model_names[m.name] == 2)
      problems.push_back("the model registers '" + m.name + "' twice");
    auto it = by_name.find(m.name);
    if (it == by_name.end()) {
      problems.push_back("parameter '" + m.name + "' (model shape " + ShapeString(m.shape) +
                         ") is not in the checkpoint");
    } else if (it->second->shape != m.shape) {
      problems.push_back("parameter '" + m.name + "': checkpoint shape " +
                         ShapeString(it->second->shape) + ", model shape " + ShapeString(m.shape));
    }
  }
  for (const CheckpointParam& p : meta.params) {
    if (!model_names.count(p.name)) {
      problems.push_back("checkpoint parameter '" + p.name + "' (shape " + ShapeString(p.shape) +
                         ") is not registered by the model");
    }
  }
  if (problems.empty()) return OkStatus();
  std::string msg = "checkpoint tag '" + meta.tag + "' does not match the model (" +
                    std::to_string(problems.size()) + " difference" +
                    (problems.size() > 1 ? "s" : "") + "): ";
  const size_t shown = std::min<size_t>(problems.size(), 8);
  for (size_t i = 0; i < shown; ++i) msg += (i ? "; " : "") + problems[i];
  if (shown < problems.size()) msg += "; and " + std::to_string(problems.size() - shown) + " more";
  return InvalidArgumentError(msg);
}

Result<std::vector<ParamShard>> LoadShardsForRank(const std::string& dir, const std::string& tag,
                                                  const std::vector<ParamSignature>& model,
                                                  int rank, int world, CheckpointMeta* meta_out) {
  if (world < 1 || rank < 0 || rank >= world) {
    return InvalidArgumentError("LoadShardsForRank: rank " + std::to_string(rank) +
                                " is not in a dp world of size " + std::to_string(world));
  }
  ZERO_ASSIGN_OR_RETURN(CheckpointMeta meta, ReadMetadata(dir, tag));
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
    ZERO_ASSIGN_OR_RETURN(std::vector<ParamShard> old, ReadRankFileImpl(dir, tag, old_rank, meta));
    for (size_t i = 0; i < old.size(); ++i) {
      ParamShard& s = out[to_model[i]];
      CopyOverlap(old[i], s.numel, s.begin, s.end, s.master.data(), s.exp_avg.data(),
                  s.exp_avg_sq.data());
      seen[i].emplace_back(old[i].begin, old[i].end);
    }
  }
  for (size_t i = 0; i < seen.size(); ++i) {
    ZERO_RETURN_IF_ERROR(CheckCoverage(TagDirectory(dir, tag), meta.params[i].name,
                                       meta.params[i].numel, std::move(seen[i])));
  }
  if (meta_out) *meta_out = std::move(meta);
  return out;
}

}  // namespace zero
