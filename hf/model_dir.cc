#include "hf/model_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <utility>

#include "engine/checkpoint/io.h"
#include "runtime/atomic_file.h"
#include "runtime/file_system.h"
#include "runtime/json_input.h"

namespace zero::llm {
namespace {

using nlohmann::json;

// Indexes of real models are a few hundred KB; far more is not an index.
constexpr uint64_t kMaxIndexBytes = 100'000'000;
// Elements converted per append when the stored dtype is 16-bit.
constexpr int64_t kConvertChunk = 1 << 16;

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// A shard name must stay inside the directory.
bool SafeFileName(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos && name.find('\\') == std::string::npos &&
         name.find("..") == std::string::npos && name.find('\0') == std::string::npos;
}

bool Ignorable(const std::string& name, const std::set<std::string>& ignorable) {
  for (const std::string& entry : ignorable) {
    if (name == entry) return true;
    if (name.size() > entry.size() && name.compare(name.size() - entry.size(), entry.size(), entry) == 0 &&
        name[name.size() - entry.size() - 1] == '.') {
      return true;
    }
  }
  return false;
}

// "model-00001-of-00003.safetensors": HfShardName's pattern, any five-digit k and n.
bool IsShardName(const std::string& name) {
  const std::string pattern = "model-#####-of-#####.safetensors";
  if (name.size() != pattern.size()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    if (pattern[i] == '#' ? (name[i] < '0' || name[i] > '9') : name[i] != pattern[i]) return false;
  }
  return true;
}

}  // namespace

// --- reading ---------------------------------------------------------------------------------------

Result<HfWeights> HfWeights::Open(const std::string& dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return ErrnoError("open checkpoint directory", dir, errno);
  if (!S_ISDIR(st.st_mode)) {
    return InvalidArgumentError(dir + ": not a directory (expected a Hugging Face model directory)");
  }
  const std::string single = JoinPath(dir, kHfWeightsFile);
  const std::string index_path = JoinPath(dir, kHfIndexFile);
  const bool has_single = PathExists(single), has_index = PathExists(index_path);
  if (has_single && has_index) {
    return FailedPreconditionError(dir + ": holds both " + kHfWeightsFile + " and " + kHfIndexFile +
                                   "; which one is current is ambiguous, remove the stale one");
  }
  if (!has_single && !has_index) {
    return NotFoundError(dir + ": no " + std::string(kHfWeightsFile) + " and no " + kHfIndexFile +
                         " (not a Hugging Face safetensors checkpoint)");
  }

  HfWeights w;
  w.dir_ = dir;
  if (has_single) {
    ZERO_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::Open(single));
    for (const TensorInfo& t : f.tensors()) w.where_[t.name] = 0;
    w.file_names_.push_back(kHfWeightsFile);
    w.files_.push_back(std::move(f));
    return w;
  }

  ZERO_ASSIGN_OR_RETURN(std::string text, ReadRegularFile(index_path, kMaxIndexBytes));
  // Nesting, numbers beyond double, duplicate keys (a tensor mapped twice): runtime/json_input.h.
  Result<json> parsed = ParseJsonText<json>(text, index_path);
  if (!parsed.ok()) return DataLossError(parsed.status().message());
  const json index = std::move(parsed).value();
  if (!index.is_object() || !index.contains("weight_map") || !index.at("weight_map").is_object()) {
    return DataLossError(index_path + ": expected an object with a \"weight_map\" object");
  }
  std::map<std::string, std::string> weight_map;  // tensor -> shard
  std::map<std::string, int> shard_index;
  for (const auto& [tensor, file] : index.at("weight_map").items()) {
    if (!file.is_string()) {
      return DataLossError(index_path + ": weight_map['" + tensor + "'] is not a file name");
    }
    const std::string name = file.get<std::string>();
    if (!SafeFileName(name)) {
      return DataLossError(index_path + ": weight_map['" + tensor + "'] = '" + name +
                           "' is not a file name inside the directory");
    }
    weight_map[tensor] = name;
    shard_index.emplace(name, 0);
  }
  for (auto& [name, i] : shard_index) {
    const std::string path = JoinPath(dir, name);
    Result<SafetensorsFile> f = SafetensorsFile::Open(path);
    if (!f.ok()) {
      return f.status().WithContext(index_path + " names shard " + name);
    }
    i = static_cast<int>(w.files_.size());
    w.file_names_.push_back(name);
    w.files_.push_back(std::move(f).value());
  }
  for (size_t i = 0; i < w.files_.size(); ++i) {
    for (const TensorInfo& t : w.files_[i].tensors()) {
      auto [it, inserted] = w.where_.emplace(t.name, static_cast<int>(i));
      if (!inserted) {
        return DataLossError(dir + ": tensor '" + t.name + "' is in both " + w.file_names_[it->second] + " and " +
                             w.file_names_[i]);
      }
      auto listed = weight_map.find(t.name);
      if (listed == weight_map.end()) {
        return DataLossError(dir + ": tensor '" + t.name + "' is in " + w.file_names_[i] + " but " + kHfIndexFile +
                             "'s weight_map does not list it");
      }
      if (listed->second != w.file_names_[i]) {
        return DataLossError(dir + ": tensor '" + t.name + "' is in " + w.file_names_[i] + " and also mapped to " +
                             listed->second + " by " + kHfIndexFile);
      }
    }
  }
  for (const auto& [tensor, file] : weight_map) {
    if (w.where_.count(tensor) == 0) {
      return DataLossError(index_path + ": weight_map maps tensor '" + tensor + "' to " + file +
                           ", which does not hold it");
    }
  }
  return w;
}

std::vector<std::string> HfWeights::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [name, file] : where_) out.push_back(name);
  return out;
}

const TensorInfo* HfWeights::Find(const std::string& name) const {
  auto it = where_.find(name);
  return it == where_.end() ? nullptr : files_[it->second].Find(name);
}

const std::string& HfWeights::file_of(const std::string& name) const {
  auto it = where_.find(name);
  ZERO_CHECK_MSG(it != where_.end(), name);
  return file_names_[it->second];
}

DType HfWeights::dtype_of(const std::string& name) const {
  const TensorInfo* t = Find(name);
  ZERO_CHECK_MSG(t != nullptr, name);
  return t->dtype;
}

Status HfWeights::Check(const std::vector<examples::ModelParamSpec>& specs,
                        const std::set<std::string>& ignorable) const {
  std::vector<std::string> missing, wrong, extra;
  std::set<std::string> wanted;
  for (const examples::ModelParamSpec& spec : specs) {
    wanted.insert(spec.name);
    const TensorInfo* t = Find(spec.name);
    if (t == nullptr) {
      missing.push_back("missing " + spec.name + " " + ShapeString(spec.shape));
    } else if (t->shape != spec.shape) {
      wrong.push_back("wrong shape " + spec.name + " in " + file_of(spec.name) + ": expected " +
                      ShapeString(spec.shape) + ", got " + ShapeString(t->shape));
    }
  }
  for (const auto& [name, file] : where_) {
    if (wanted.count(name) == 0 && !Ignorable(name, ignorable)) {
      extra.push_back("unexpected " + name + " in " + file_names_[file]);
    }
  }
  if (missing.empty() && wrong.empty() && extra.empty()) return OkStatus();
  std::string msg = dir_ + ": the checkpoint does not match the model (" + std::to_string(missing.size()) +
                    " missing, " + std::to_string(wrong.size()) + " with the wrong shape, " +
                    std::to_string(extra.size()) + " unexpected):";
  for (const auto* list : {&missing, &wrong, &extra}) {
    for (const std::string& line : *list) msg += "\n  " + line;
  }
  return InvalidArgumentError(msg);
}

Status HfWeights::CheckTiedCopy(const std::string& copy, const std::string& original, const std::string& why) const {
  const TensorInfo* c = Find(copy);
  if (c == nullptr) return OkStatus();
  const TensorInfo* o = Find(original);
  if (o == nullptr) {
    return NotFoundError(dir_ + ": no tensor '" + original + "', to which " + copy + " is tied (" + why + ")");
  }
  const std::string head = dir_ + ": " + copy + " in " + file_of(copy);
  const std::string fix = " (" + why + "): the model would compute with " + original + " in its place and drop " +
                          copy + "; set the tie to false to train both, or remove " + copy + " from the checkpoint";
  if (c->shape != o->shape) {
    return InvalidArgumentError(head + " has shape " + ShapeString(c->shape) + ", not " + original + "'s " +
                                ShapeString(o->shape) + fix);
  }
  int64_t numel = 1;
  for (int64_t d : o->shape) numel *= d;
  constexpr int64_t kChunk = 1 << 20;
  std::vector<float> a(static_cast<size_t>(std::min(numel, kChunk))), b(a.size());
  for (int64_t begin = 0; begin < numel; begin += kChunk) {
    const int64_t n = std::min(numel - begin, kChunk);
    ZERO_RETURN_IF_ERROR(ReadSlice(copy, begin, n, a.data()));
    ZERO_RETURN_IF_ERROR(ReadSlice(original, begin, n, b.data()));
    if (std::memcmp(a.data(), b.data(), static_cast<size_t>(n) * sizeof(float)) == 0) continue;
    for (int64_t i = 0; i < n; ++i) {
      if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
        return InvalidArgumentError(head + " differs from " + original + " in " + file_of(original) +
                                    " (first at element " + std::to_string(begin + i) + ": " + std::to_string(a[i]) +
                                    " vs " + std::to_string(b[i]) + ")" + fix);
      }
    }
  }
  return OkStatus();
}

Status HfWeights::ReadSlice(const std::string& name, int64_t begin, int64_t count, float* out) const {
  auto it = where_.find(name);
  if (it == where_.end()) return NotFoundError(dir_ + ": no tensor '" + name + "' in the checkpoint");
  const SafetensorsFile& f = files_[it->second];
  return f.ReadAsFloat(*f.Find(name), begin, count, out);
}

// --- writing ---------------------------------------------------------------------------------------

std::string HfShardName(int k, int n) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model-%05d-of-%05d.safetensors", k, n);
  return buf;
}

bool IsExportFileName(const std::string& name) {
  return name == kHfWeightsFile || name == kHfIndexFile || name == kHfConfigFile || IsShardName(name) ||
         name == "tokenizer.json" || name == "tokenizer_config.json";
}

namespace {

// Whether `dir` exists (as a directory an export may replace); an error for anything else there.
Result<bool> ExportTargetExists(FileSystem& fs, const std::string& dir) {
  Result<FileInfo> info = fs.LinkStat(dir);
  if (!info.ok()) {
    if (info.status().code() == StatusCode::kNotFound) return false;
    if (info.status().message().find("(errno " + std::to_string(ENOTDIR) + ")") != std::string::npos) {
      return FailedPreconditionError("export to " + dir +
                                     ": a part of the path is a file, not a directory; pass a directory's path");
    }
    return info.status().WithContext("export to " + dir);
  }
  if (info->type != FileType::kDirectory) {
    return FailedPreconditionError(
        "export to " + dir + ": the path exists and is not a directory (it is " +
        (info->type == FileType::kRegular ? std::string("a file") : std::string(FileTypeText(info->type))) +
        "); pass a directory's path (created when missing)");
  }
  ZERO_ASSIGN_OR_RETURN(std::vector<std::string> entries, fs.ListDirectory(dir));
  for (const std::string& e : entries) {
    if (!IsExportFileName(e)) {
      return FailedPreconditionError("export to " + dir + ": the directory holds '" + e +
                                     "', which an export does not write; refusing to replace it (pass a new or "
                                     "empty directory, or an earlier export)");
    }
  }
  return true;
}

// An atomic write into the staging directory whose size is read back and compared.
Status WriteChecked(FileSystem& fs, const std::string& path, std::string_view contents) {
  ZERO_RETURN_IF_ERROR(WriteFileAtomic(fs, path, contents));
  ZERO_ASSIGN_OR_RETURN(uint64_t size, FileSize(fs, path));
  if (size != contents.size()) {
    return DataLossError(path + ": wrote " + std::to_string(contents.size()) + " bytes but the file holds " +
                         std::to_string(size));
  }
  return OkStatus();
}

// Every file of the export written into `stage` (which exists and is empty), each one's size
// checked against what was written, and `stage` synced.
Status WriteExport(FileSystem& fs, const std::string& dir, const std::string& stage, const std::string& config_json,
                   const std::vector<examples::ModelParamSpec>& specs, DType dtype,
                   const std::function<Status(int index, float* out)>& values,
                   const std::vector<std::vector<int>>& shards, const std::vector<int64_t>& bytes,
                   const std::vector<ExportFile>& extra_files) {
  const int n = static_cast<int>(shards.size());
  std::vector<float> buf;
  std::vector<uint16_t> half(kConvertChunk);
  json weight_map = json::object();
  uint64_t total_size = 0;
  for (int k = 0; k < n; ++k) {
    const std::string file = n == 1 ? std::string(kHfWeightsFile) : HfShardName(k + 1, n);
    std::vector<TensorToWrite> layout;
    for (int i : shards[k]) layout.push_back({specs[i].name, dtype, specs[i].shape, nullptr});
    ZERO_ASSIGN_OR_RETURN(SafetensorsWriter w,
                          SafetensorsWriter::Open(JoinPath(stage, file), layout, {{"format", "pt"}}));
    for (int i : shards[k]) {
      const int64_t numel = bytes[i] / static_cast<int64_t>(SizeOf(dtype));
      buf.assign(static_cast<size_t>(numel), 0.0f);
      Status st = values(i, buf.data());
      if (!st.ok()) {
        return st.WithContext("values of '" + specs[i].name + "'");
      }
      if (dtype == DType::kF32) {
        ZERO_RETURN_IF_ERROR(w.Append(buf.data(), static_cast<size_t>(bytes[i])));
      } else {
        for (int64_t done = 0; done < numel; done += kConvertChunk) {
          const int64_t m = std::min(numel - done, kConvertChunk);
          for (int64_t j = 0; j < m; ++j) StoreFromFloat(half.data(), dtype, j, buf[done + j]);
          ZERO_RETURN_IF_ERROR(w.Append(half.data(), static_cast<size_t>(m) * 2));
        }
      }
      weight_map[specs[i].name] = file;
    }
    total_size += w.data_bytes();
    const uint64_t file_bytes = w.file_bytes();
    ZERO_RETURN_IF_ERROR(w.Commit());
    ZERO_ASSIGN_OR_RETURN(uint64_t size, FileSize(fs, JoinPath(stage, file)));
    if (size != file_bytes) {
      return DataLossError(JoinPath(stage, file) + ": wrote " + std::to_string(file_bytes) +
                           " bytes but the file holds " + std::to_string(size));
    }
  }
  buf.clear();
  buf.shrink_to_fit();
  if (n > 1) {
    json index = {{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
    ZERO_RETURN_IF_ERROR(WriteChecked(fs, JoinPath(stage, kHfIndexFile), index.dump(2) + "\n"));
  }
  ZERO_RETURN_IF_ERROR(WriteChecked(fs, JoinPath(stage, kHfConfigFile), config_json));
  for (const ExportFile& f : extra_files) {
    ZERO_RETURN_IF_ERROR(WriteChecked(fs, JoinPath(stage, f.name), f.contents));
  }
  return fs.SyncDirectory(stage);
}

}  // namespace

Status CheckExportTarget(const std::string& dir_in, FileSystem* fs_or_null) {
  FileSystem& fs = *FileSystemOrDefault(fs_or_null);
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  ZERO_RETURN_IF_ERROR(ExportTargetExists(fs, dir).status());
  Status st = CheckWritableDirectory(DirName(dir), &fs);
  if (!st.ok()) return st.WithContext("export to " + dir + ": its parent directory (where the export is staged)");
  return OkStatus();
}

Status ExportHf(const std::string& dir_in, const std::string& config_json,
                const std::vector<examples::ModelParamSpec>& specs, DType dtype,
                const std::function<Status(int index, float* out)>& values, int64_t max_shard_bytes,
                const std::vector<ExportFile>& extra_files, FileSystem* fs_or_null) {
  FileSystem& fs = *FileSystemOrDefault(fs_or_null);
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const std::string parent = DirName(dir);
  const std::string base = dir.substr(dir.find_last_of('/') == std::string::npos ? 0 : dir.find_last_of('/') + 1);
  if (base.empty() || base == "." || base == ".." || dir == "/") {
    return InvalidArgumentError("export to " + dir_in + ": name the directory by a path that ends in its name");
  }
  if (max_shard_bytes <= 0) {
    return InvalidArgumentError("export to " + dir + ": max_shard_bytes must be positive, got " +
                                std::to_string(max_shard_bytes));
  }
  ZERO_ASSIGN_OR_RETURN(json config, ParseJsonText<json>(config_json, "export to " + dir + ": config.json"));
  if (!config.is_object()) return InvalidArgumentError("export to " + dir + ": config.json is not a JSON object");
  std::set<std::string> extra_names;
  for (const ExportFile& f : extra_files) {
    if (!SafeFileName(f.name) || !IsExportFileName(f.name) || f.name == kHfConfigFile || f.name == kHfIndexFile ||
        f.name == kHfWeightsFile || IsShardName(f.name) || !extra_names.insert(f.name).second) {
      return InvalidArgumentError("export to " + dir + ": extra file '" + f.name +
                                  "' is not tokenizer.json or tokenizer_config.json, or is given twice");
    }
  }
  // Sizes first (checked here, so a bad shape never reaches the writer half way through).
  std::vector<int64_t> bytes(specs.size());
  std::set<std::string> names;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!names.insert(specs[i].name).second) {
      return InvalidArgumentError("export to " + dir + ": parameter '" + specs[i].name + "' used twice in the list");
    }
    int64_t n = 1;
    for (int64_t d : specs[i].shape) {
      if (d < 0 || (d != 0 && n > INT64_MAX / 4 / d)) {
        return InvalidArgumentError("export to " + dir + ": parameter '" + specs[i].name + "' has shape " +
                                    ShapeString(specs[i].shape) + " (a negative dim or too many elements)");
      }
      n *= d;
    }
    bytes[i] = n * static_cast<int64_t>(SizeOf(dtype));
  }
  // Greedy in spec order: a new shard starts when the next tensor would overflow this one.
  std::vector<std::vector<int>> shards;
  int64_t current = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (shards.empty() || (!shards.back().empty() && current + bytes[i] > max_shard_bytes)) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().push_back(static_cast<int>(i));
    current += bytes[i];
  }
  if (shards.empty()) shards.emplace_back();  // a model without parameters: one empty file

  // What is at `dir` now: nothing, or a directory this export may replace.
  ZERO_ASSIGN_OR_RETURN(const bool exists, ExportTargetExists(fs, dir));
  Status made = CreateDirectories(fs, parent);
  if (!made.ok()) return made.WithContext("export to " + dir + ": its parent directory");

  const std::string stage = JoinPath(parent, "." + base + ".export-tmp." + std::to_string(::getpid()));
  ZERO_RETURN_IF_ERROR(RemoveTree(fs, stage));  // debris of an earlier process with this pid
  ZERO_RETURN_IF_ERROR(fs.CreateDirectory(stage, nullptr).WithContext("export to " + dir + ": staging directory"));
  Status st = WriteExport(fs, dir, stage, config_json, specs, dtype, values, shards, bytes, extra_files);
  if (st.ok()) {
    if (!exists) {
      st = fs.Rename(stage, dir);
    } else {
      st = fs.Exchange(stage, dir);
      if (st.code() == StatusCode::kUnimplemented) {
        // No atomic exchange here: the old export moves aside first, so `dir` is missing (never
        // half-written) for the moment between the two renames.
        const std::string old = JoinPath(parent, "." + base + ".export-old." + std::to_string(::getpid()));
        st = RemoveTree(fs, old);
        if (st.ok()) st = fs.Rename(dir, old);
        if (st.ok()) {
          st = fs.Rename(stage, dir);
          if (!st.ok()) (void)fs.Rename(old, dir);  // put the old export back
        }
        if (st.ok()) st = RemoveTree(fs, old);
      } else if (st.ok()) {
        st = RemoveTree(fs, stage);  // now the earlier export
      }
    }
    if (st.ok()) st = fs.SyncDirectory(parent);
    if (st.ok()) return OkStatus();
  }
  (void)RemoveTree(fs, stage);
  return st.WithContext("export to " + dir + " (nothing was replaced)");
}

}  // namespace zero::llm
