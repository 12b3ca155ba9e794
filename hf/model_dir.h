// Hugging Face model directories: reading the weights of a transformers checkpoint and writing
// one that transformers' from_pretrained loads.
//
// A directory holds either model.safetensors, or model.safetensors.index.json ({"metadata":
// {"total_size": bytes}, "weight_map": {tensor: shard file}}) and the shards it names
// (model-00001-of-00003.safetensors, ...), plus config.json. HfWeights opens every file's header
// (safetensors.h) and reads tensors, or element ranges of them, on demand, so a ZeRO stage 3 rank
// reads only its partition. ExportHf writes such a directory from values computed one tensor at a
// time. Tensors are named as in transformers (LLM_CONTRACT.md); this file knows nothing of the
// model beyond the ModelParamSpec list it is given. An export is written to a staging directory and
// takes the target's place whole (ExportHf).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "hf/safetensors.h"
#include "models/model_api.h"
#include "runtime/dtype.h"
#include "runtime/file_system.h"
#include "runtime/status.h"

namespace zero::llm {

inline constexpr char kHfWeightsFile[] = "model.safetensors";
inline constexpr char kHfIndexFile[] = "model.safetensors.index.json";
inline constexpr char kHfConfigFile[] = "config.json";

// The weights of one checkpoint directory, open for reading. Move-only (owns one file descriptor
// per safetensors file). Reads do not modify it: several threads may read at once.
class HfWeights {
 public:
  // Opens `dir`/model.safetensors, or `dir`/model.safetensors.index.json and every shard it names,
  // validating every header (SafetensorsFile::Open). Refuses, naming the file: no weights file, both
  // a single file and an index (ambiguous), an index that is not JSON (read by runtime/json_input.h:
  // nesting beyond 100 levels, a number beyond double and a duplicate key are DATA_LOSS naming the
  // line and column) or has no weight_map object,
  // a shard name that is empty or holds '/', '\\' or "..", a missing shard, a weight_map entry
  // whose tensor is not in its shard, a tensor present in two files, a tensor a shard holds that
  // the weight_map maps elsewhere or does not list.
  static Result<HfWeights> Open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  // Every tensor name, sorted.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  // nullptr when absent.
  const TensorInfo* Find(const std::string& name) const;
  // The file (a name inside dir()) holding `name`. REQUIRES: contains(name).
  const std::string& file_of(const std::string& name) const;
  // The stored dtype of `name`. REQUIRES: contains(name).
  DType dtype_of(const std::string& name) const;

  // OK when the checkpoint holds exactly the model's parameters: every spec's name with exactly
  // spec.shape, and no other tensor except the ignorable ones. A tensor is ignorable when its name
  // equals an entry of `ignorable` or ends with "." + entry (so "rotary_emb.inv_freq" covers
  // "model.layers.3.self_attn.rotary_emb.inv_freq"; a tied model passes "lm_head.weight").
  // Otherwise INVALID_ARGUMENT listing EVERY missing tensor, wrong shape (expected and got) and
  // unexpected tensor in one message, each with its file.
  Status Check(const std::vector<examples::ModelParamSpec>& specs, const std::set<std::string>& ignorable) const;

  // For a tied pair of tensors, such as a model with tie_word_embeddings true: the model holds
  // `original` ("model.embed_tokens.weight") and computes with it in place of `copy`
  // ("lm_head.weight"), so a checkpoint's own `copy` would be dropped. OK when the checkpoint holds
  // no `copy`, or a `copy` of original's shape whose values (read as float) equal original's bit for
  // bit (some exporters write a tied weight twice). Otherwise INVALID_ARGUMENT naming both tensors,
  // their files, the first differing element and `why` (the config key that ties them, e.g.
  // "config.json: tie_word_embeddings is true"). NOT_FOUND when `copy` is present and `original`
  // is not. Reads both tensors in 4 MiB chunks when `copy` is present; use with Check(), whose
  // `ignorable` then lists `copy`.
  Status CheckTiedCopy(const std::string& copy, const std::string& original, const std::string& why) const;

  // Reads elements [begin, begin + count) (flat, row-major) of tensor `name` as float into
  // out[0, count); reads only those bytes. NOT_FOUND for an unknown name; otherwise as
  // SafetensorsFile::ReadAsFloat.
  Status ReadSlice(const std::string& name, int64_t begin, int64_t count, float* out) const;

 private:
  HfWeights() = default;

  std::string dir_;
  std::vector<std::string> file_names_;  // inside dir_
  std::vector<SafetensorsFile> files_;
  std::map<std::string, int> where_;  // tensor -> index into files_
};

// The name of shard `k` (1-based) of `n`, as transformers writes it: "model-00002-of-00005.safetensors".
std::string HfShardName(int k, int n);

// A file an export writes beside the weights and config (tokenizer.json, tokenizer_config.json).
struct ExportFile {
  std::string name;  // a plain file name inside the export
  std::string contents;
};

// Writes a checkpoint directory transformers loads: `dir`/config.json (config_json as given; it
// must be a JSON object that runtime/json_input.h accepts, checked before anything is written), the
// `extra_files`, and the weights: model.safetensors when the tensors' bytes total at most
// max_shard_bytes, else shards model-0000k-of-0000n.safetensors (of at most max_shard_bytes each,
// filled in spec order; a tensor larger than that gets a shard of its own) plus
// model.safetensors.index.json with total_size (tensor bytes) and weight_map. Every tensor is stored
// in `dtype` (round to nearest even from float), in spec order, with metadata {"format": "pt"}.
// values(i, out) fills out[0, specs[i].numel()) with parameter i's values; it is called once per
// tensor, in spec order, and only one tensor's values are held at a time (plus a small conversion
// buffer), so exporting never holds the model twice.
//
// The directory is written whole or not at all: everything goes into a staging directory beside it
// (`<parent>/.<name>.export-tmp.<pid>`), each file fsynced and its size checked against what was
// meant, and the staging directory then takes `dir`'s place: renamed to it when `dir` is missing,
// exchanged with it atomically (renameat2 RENAME_EXCHANGE; where the filesystem cannot, two renames)
// when `dir` is an earlier export, whose files are then removed. So nothing of an earlier export
// (a stale tokenizer.json, old shards) survives beside the new one, and a failure at any point
// (a full disk, an error from `values`) leaves `dir` as it was and no partial export visible.
// `dir` is replaced only when it is empty or holds nothing but files an export writes (config.json,
// the weights files, the index, tokenizer.json, tokenizer_config.json): anything else there is
// refused with FAILED_PRECONDITION naming the entry, so an export never deletes what it did not
// write. `dir` existing as something other than a directory is FAILED_PRECONDITION; the parent is
// created if missing. File operations other than the safetensors writes go through `fs` (null: the
// POSIX one), so fault tests can fail them. An error from `values` is returned with the tensor's name.
Status ExportHf(const std::string& dir, const std::string& config_json,
                const std::vector<examples::ModelParamSpec>& specs, DType dtype,
                const std::function<Status(int index, float* out)>& values, int64_t max_shard_bytes = 5'000'000'000,
                const std::vector<ExportFile>& extra_files = {}, FileSystem* fs = nullptr);

// The names ExportHf may write into a directory (what lets it replace an earlier export).
bool IsExportFileName(const std::string& name);

// The check ExportHf makes before writing, for a job to make at its start (so that --export-hf DIR
// fails before training, not after it): `dir` is missing, or a directory ExportHf would replace
// (empty, or holding only export files); its parent exists or can be created, and takes a file (the
// staging directory goes there). FAILED_PRECONDITION naming `dir` and what is wrong. Through `fs`
// (null: the POSIX one); may create the parent.
Status CheckExportTarget(const std::string& dir, FileSystem* fs = nullptr);

}  // namespace zero::llm
