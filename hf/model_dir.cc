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

Status RemoveFile(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoError("remove", path, errno);
  return OkStatus();
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

Status ExportHf(const std::string& dir, const std::string& config_json,
                const std::vector<examples::ModelParamSpec>& specs, DType dtype,
                const std::function<Status(int index, float* out)>& values, int64_t max_shard_bytes) {
  if (max_shard_bytes <= 0) {
    return InvalidArgumentError("export to " + dir + ": max_shard_bytes must be positive, got " +
                                std::to_string(max_shard_bytes));
  }
  ZERO_ASSIGN_OR_RETURN(json config, ParseJsonText<json>(config_json, "export to " + dir + ": config.json"));
  if (!config.is_object()) return InvalidArgumentError("export to " + dir + ": config.json is not a JSON object");
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
  const int n = static_cast<int>(shards.size());

  ZERO_RETURN_IF_ERROR(CreateDirectories(dir));

  std::vector<float> buf;
  std::vector<uint16_t> half(kConvertChunk);
  json weight_map = json::object();
  std::set<std::string> written;
  uint64_t total_size = 0;
  for (int k = 0; k < n; ++k) {
    const std::string file = n == 1 ? std::string(kHfWeightsFile) : HfShardName(k + 1, n);
    std::vector<TensorToWrite> layout;
    for (int i : shards[k]) layout.push_back({specs[i].name, dtype, specs[i].shape, nullptr});
    ZERO_ASSIGN_OR_RETURN(SafetensorsWriter w,
                          SafetensorsWriter::Open(JoinPath(dir, file), layout, {{"format", "pt"}}));
    for (int i : shards[k]) {
      const int64_t numel = bytes[i] / static_cast<int64_t>(SizeOf(dtype));
      buf.assign(static_cast<size_t>(numel), 0.0f);
      Status st = values(i, buf.data());
      if (!st.ok()) {
        return st.WithContext("export to " + dir + ": values of '" + specs[i].name + "'");
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
    ZERO_RETURN_IF_ERROR(w.Commit());
    written.insert(file);
  }
  buf.clear();
  buf.shrink_to_fit();
  if (n > 1) {
    json index = {{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
    ZERO_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(dir, kHfIndexFile), index.dump(2) + "\n"));
    written.insert(kHfIndexFile);
  }
  ZERO_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(dir, kHfConfigFile), config_json));

  // Weight files of an earlier save that this one replaced.
  ZERO_ASSIGN_OR_RETURN(std::vector<std::string> entries, ListDirectory(dir));
  bool removed = false;
  for (const std::string& e : entries) {
    const bool weights_file = e == kHfWeightsFile || e == kHfIndexFile || IsShardName(e);
    if (weights_file && written.count(e) == 0) {
      ZERO_RETURN_IF_ERROR(RemoveFile(JoinPath(dir, e)));
      removed = true;
    }
  }
  if (removed) ZERO_RETURN_IF_ERROR(SyncDirectory(dir));
  return OkStatus();
}

}  // namespace zero::llm
