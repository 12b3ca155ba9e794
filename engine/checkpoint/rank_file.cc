#include "engine/checkpoint/rank_file.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <string_view>

#include "engine/checkpoint/directory.h"
#include "runtime/atomic_file.h"
#include "runtime/crc32c.h"
#include "runtime/file_system.h"
#include "zero/partition.h"

namespace zero {

static_assert(std::endian::native == std::endian::little,
              "checkpoint files are little-endian; a big-endian port needs byte swaps here");

namespace {

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
    return DataLossError(path + ": header checksum mismatch: expected crc32c " + Crc32cHex(want) + ", got " +
                         Crc32cHex(got) + " (the file is corrupt)");
  }
  RankHeader h;
  h.version = Get<uint32_t>(p + 8);
  h.rank = Get<uint32_t>(p + 12);
  h.world = Get<uint32_t>(p + 16);
  h.param_count = Get<uint64_t>(p + 24);
  h.file_bytes = Get<uint64_t>(p + 32);
  if (h.version != kRankFileVersion) {
    return FailedPreconditionError(path + ": rank file version " + std::to_string(h.version) +
                                   "; this build of zero reads version " + std::to_string(kRankFileVersion));
  }
  return h;
}

Status CheckHeaderIdentity(const std::string& path, const RankHeader& h, int rank, int world) {
  if (static_cast<int>(h.rank) != rank || static_cast<int>(h.world) != world) {
    return DataLossError(path + ": header says rank " + std::to_string(h.rank) + " of world " +
                         std::to_string(h.world) + ", expected rank " + std::to_string(rank) + " of world " +
                         std::to_string(world) + " (a file left from another save under the same tag?)");
  }
  return OkStatus();
}

// Bounds-checked cursor over a rank file's bytes.
class Cursor {
 public:
  Cursor(const std::string& path, std::string_view data, size_t pos) : path_(path), data_(data), pos_(pos) {}
  Status Need(size_t n, const std::string& what) {
    if (n > data_.size() - pos_) {
      return DataLossError(path_ + ": " + what + " runs past the end of the records (offset " + std::to_string(pos_) +
                           ", " + std::to_string(n) + " bytes needed)");
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
Result<std::vector<ParamShard>> ParseRankFile(const std::string& path, const std::string& data, int rank,
                                              const CheckpointMeta& meta) {
  ZERO_ASSIGN_OR_RETURN(RankHeader h, ParseHeader(path, data.data(), data.size()));
  ZERO_RETURN_IF_ERROR(CheckHeaderIdentity(path, h, rank, meta.dp_world_size));
  if (h.file_bytes != data.size()) {
    return DataLossError(path + ": truncated: expected " + std::to_string(h.file_bytes) +
                         " bytes (from its header), got " + std::to_string(data.size()));
  }
  if (data.size() < kHeaderBytes + kTrailerBytes || std::memcmp(data.data() + data.size() - 4, kTrailerMagic, 4) != 0) {
    return DataLossError(path + ": bad trailer (the file is corrupt)");
  }
  const size_t body = data.size() - kTrailerBytes;
  uint32_t want = Get<uint32_t>(data.data() + body);
  uint32_t got = Crc32c(data.data(), body);
  if (want != got) {
    return DataLossError(path + ": checksum mismatch: expected crc32c " + Crc32cHex(want) + " (its trailer), got " +
                         Crc32cHex(got) + " (the file is corrupt)");
  }
  if (h.param_count != meta.params.size()) {
    return DataLossError(path + ": holds " + std::to_string(h.param_count) + " parameters, metadata.json lists " +
                         std::to_string(meta.params.size()));
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
      return DataLossError(path + ": " + what + " is parameter '" + s.name + "' of shape " + ShapeString(s.shape) +
                           ", metadata.json lists '" + p.name + "' of shape " + ShapeString(p.shape));
    }
    if (s.begin < 0 || s.end < s.begin || s.end > p.n_pad) {
      return DataLossError(path + ": " + what + ": range [" + std::to_string(s.begin) + ", " + std::to_string(s.end) +
                           ") is outside the padded parameter [0, " + std::to_string(p.n_pad) + ")");
    }
    const size_t count = static_cast<size_t>(s.end - s.begin);
    ZERO_RETURN_IF_ERROR(cur.ReadFloats(count, &s.master, what));
    ZERO_RETURN_IF_ERROR(cur.ReadFloats(count, &s.exp_avg, what));
    ZERO_RETURN_IF_ERROR(cur.ReadFloats(count, &s.exp_avg_sq, what));
  }
  if (cur.pos() != body) {
    return DataLossError(path + ": " + std::to_string(body - cur.pos()) + " unexpected bytes after the last record");
  }
  return shards;
}

}  // namespace

// --- writing -------------------------------------------------------------------------------------

Result<RankFileInfo> WriteRankFile(const std::string& dir, const std::string& tag, int rank, int world,
                                   const std::vector<ParamShard>& shards, FileSystem* fs_or_null) {
  FileSystem& fs = *FileSystemOrDefault(fs_or_null);
  ZERO_RETURN_IF_ERROR(ValidateTag(tag));
  if (world < 1 || rank < 0 || rank >= world) {
    return InvalidArgumentError("WriteRankFile: rank " + std::to_string(rank) + " is not in a dp world of size " +
                                std::to_string(world));
  }
  const std::string where = "checkpoint rank " + std::to_string(rank) + " of " + std::to_string(world);
  uint64_t total = kHeaderBytes + kTrailerBytes;
  std::vector<std::string> record_headers;
  record_headers.reserve(shards.size());
  for (const ParamShard& s : shards) {
    const int64_t numel = ShapeNumel(s.shape);
    if (numel < 0 || numel != s.numel) {
      return InvalidArgumentError(where + ": parameter '" + s.name + "': numel " + std::to_string(s.numel) +
                                  " is not the product of shape " + ShapeString(s.shape));
    }
    if (s.begin < 0 || s.end < s.begin || s.end > PaddedNumel(s.numel, world)) {
      return InvalidArgumentError(where + ": parameter '" + s.name + "': range [" + std::to_string(s.begin) + ", " +
                                  std::to_string(s.end) + ") is outside the padded parameter [0, " +
                                  std::to_string(PaddedNumel(s.numel, world)) + ")");
    }
    const size_t count = static_cast<size_t>(s.end - s.begin);
    if (s.master.size() != count || s.exp_avg.size() != count || s.exp_avg_sq.size() != count) {
      return InvalidArgumentError(
          where + ": parameter '" + s.name + "': range [" + std::to_string(s.begin) + ", " + std::to_string(s.end) +
          ") needs " + std::to_string(count) + " floats per state, got master " + std::to_string(s.master.size()) +
          ", exp_avg " + std::to_string(s.exp_avg.size()) + ", exp_avg_sq " + std::to_string(s.exp_avg_sq.size()));
    }
    record_headers.push_back(RecordHeader(s));
    total += record_headers.back().size() + 3 * count * sizeof(float);
  }

  const std::string tag_dir = TagDirectory(dir, tag);
  ZERO_RETURN_IF_ERROR(CreateDirectories(fs, tag_dir));
  const std::string path = JoinPath(tag_dir, RankFileName(rank));
  ZERO_ASSIGN_OR_RETURN(AtomicFileWriter w, AtomicFileWriter::Open(fs, path));
  ZERO_RETURN_IF_ERROR(w.Append(MakeHeader(rank, world, shards.size(), total)));
  for (size_t i = 0; i < shards.size(); ++i) {
    const ParamShard& s = shards[i];
    ZERO_RETURN_IF_ERROR(w.Append(record_headers[i]));
    ZERO_RETURN_IF_ERROR(w.Append(s.master.data(), s.master.size() * sizeof(float)));
    ZERO_RETURN_IF_ERROR(w.Append(s.exp_avg.data(), s.exp_avg.size() * sizeof(float)));
    ZERO_RETURN_IF_ERROR(w.Append(s.exp_avg_sq.data(), s.exp_avg_sq.size() * sizeof(float)));
    if (i == shards.size() / 2) fs.CrashPoint("writing_rank_file", rank);  // tests: a partial file
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

// --- reading -------------------------------------------------------------------------------------

Result<RankFileInfo> ReadRankFileInfo(const std::string& dir, const std::string& tag, int rank, int world,
                                      FileSystem* fs_or_null) {
  FileSystem& fs = *FileSystemOrDefault(fs_or_null);
  const std::string path = JoinPath(TagDirectory(dir, tag), RankFileName(rank));
  ZERO_ASSIGN_OR_RETURN(uint64_t size, FileSize(fs, path));  // NOT_FOUND names the file
  ZERO_ASSIGN_OR_RETURN(std::string header, fs.ReadFileRange(path, 0, std::min<uint64_t>(size, kHeaderBytes)));
  ZERO_ASSIGN_OR_RETURN(RankHeader h, ParseHeader(path, header.data(), header.size()));
  ZERO_RETURN_IF_ERROR(CheckHeaderIdentity(path, h, rank, world));
  if (size != h.file_bytes) {
    return DataLossError(path + ": truncated: expected " + std::to_string(h.file_bytes) +
                         " bytes (from its header), got " + std::to_string(size));
  }
  if (size < kHeaderBytes + kTrailerBytes) return DataLossError(path + ": bad trailer (the file is corrupt)");
  ZERO_ASSIGN_OR_RETURN(std::string trailer, fs.ReadFileRange(path, size - kTrailerBytes, kTrailerBytes));
  if (std::memcmp(trailer.data() + 4, kTrailerMagic, 4) != 0) {
    return DataLossError(path + ": bad trailer (the file is corrupt)");
  }
  return RankFileInfo{RankFileName(rank), size, Get<uint32_t>(trailer.data())};
}

Result<std::vector<ParamShard>> ReadRankFile(const std::string& dir, const std::string& tag, int rank,
                                             const CheckpointMeta& meta, FileSystem* fs_or_null) {
  FileSystem& fs = *FileSystemOrDefault(fs_or_null);
  const std::string tag_dir = TagDirectory(dir, tag);
  const std::string path = JoinPath(tag_dir, RankFileName(rank));
  if (rank < 0 || rank >= meta.dp_world_size || static_cast<int>(meta.rank_files.size()) != meta.dp_world_size) {
    return InvalidArgumentError("checkpoint " + tag_dir + " was saved with dp world size " +
                                std::to_string(meta.dp_world_size) + "; it has no rank " + std::to_string(rank));
  }
  if (!PathExists(fs, path)) {
    return NotFoundError("checkpoint " + tag_dir + " was saved with dp world size " +
                         std::to_string(meta.dp_world_size) + ", but its rank file " + RankFileName(rank) +
                         " is missing (" + path + ")");
  }
  const RankFileInfo& info = meta.rank_files[rank];
  const std::string ctx = "rank " + std::to_string(rank) + " file";
  ZERO_ASSIGN_OR_RETURN(std::string data, fs.ReadFile(path));
  if (data.size() != info.bytes) {
    return DataLossError(ctx + ": " + path + (data.size() < info.bytes ? ": truncated" : ": longer than expected") +
                         ": expected " + std::to_string(info.bytes) + " bytes (metadata.json), got " +
                         std::to_string(data.size()));
  }
  if (data.size() < kTrailerBytes) return DataLossError(ctx + ": " + path + ": shorter than a trailer");
  const uint32_t crc = Crc32c(data.data(), data.size() - kTrailerBytes);
  if (crc != info.crc32c) {
    return DataLossError(ctx + ": " + path + ": checksum mismatch: expected crc32c " + Crc32cHex(info.crc32c) +
                         " (metadata.json), got " + Crc32cHex(crc) + " (the file is corrupt, or from another save)");
  }
  return ParseRankFile(path, data, rank, meta);
}

}  // namespace zero
