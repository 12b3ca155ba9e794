// zero_llm's inputs: the model's shape (--preset or --model), the tokenizer, the data it trains and
// evaluates on (the held-out split of whole files, the reverse-text task), the rows of each micro
// step, and the identities of the data and of an HF directory that the ranks compare at start.
// Pure functions of the options and files, apart from reading those files; thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/token_data.h"
#include "models/llama/batch.h"
#include "models/llama/config.h"
#include "runtime/status.h"
#include "train/zero_llm_options.h"

namespace zero::llm {

// printf into a string.
std::string Printf(const char* format, ...) __attribute__((format(printf, 1, 2)));
bool EndsWith(const std::string& s, const std::string& suffix);

// What --data takes, for its messages.
constexpr char kDataExpected[] = "a text file, or token ids (little-endian uint32) in a file named *.bin";

// Everything a rank trains and evaluates on: token ids (or, for the task, prepared rows).
struct Data {
  std::string source;                                     // for the header line
  std::string held_out;                                   // the header's line on the held-out split
  std::vector<int32_t> train, eval;                       // token streams (LM data); eval-only: eval
  std::vector<ReverseTextExample> task_train, task_eval;  // the reverse-text task
  std::string tokenizer_json;                             // the tokenizer used (empty for .bin data)
};

// The model's shape: --model DIR's config.json (a file passed as DIR is refused, naming the
// directory to pass) or the --preset, with --extra-heads.
Result<LlmConfig> ModelConfig(const LlmTrainOptions& o);
// Refuses text data with a --model DIR that has no tokenizer.json, unless a tokenizer is given or
// asked for (--tokenizer, --tokenizer-vocab).
Status CheckTokenizerSource(const LlmTrainOptions& o);
// This rank's training and held-out data (and the tokenizer, trained on the training side).
Result<Data> LoadData(const LlmTrainOptions& o, const LlmConfig& c);
// Micro step `micro_index`'s rows of rank `rank` of `world`: sampled, in file order
// (--sequential-data) or the reverse-text task's.
LlmBatch TrainRows(const Data& d, const LlmTrainOptions& o, int batch, int64_t micro_index, int rank, int world);

// The data's identity (counts and a hash of the token streams and task rows) and an HF
// directory's (a hash of its *.safetensors and *.json files), as the ranks compare them.
std::string DataIdentity(const Data& d);
Result<std::string> ModelDirIdentity(const std::string& dir);

}  // namespace zero::llm
