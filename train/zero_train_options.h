// zero_train's command line: the flags, their defaults and checks, the built-in engine config, and
// the resolution of the Config a run uses (the built-in one, or --config FILE) for a world size.
//
// Owns only parsing and validation of user input, so every mistake is reported before any rank
// starts, naming the flag (or the config key path) and what was expected. It touches no device,
// communicator or file other than reading --config. Pure functions; thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/config/config.h"
#include "models/byte/byte_lm.h"
#include "runtime/status.h"

namespace zero::examples {

inline constexpr int kDefaultSteps = 600;
inline constexpr int kDefaultNproc = 2;
inline constexpr char kDefaultPrompt[] = "The GNU General Public License";
inline constexpr char kDefaultPlot[] = "zero_train_loss.svg";

struct TrainOptions {
  // Data and model.
  std::string data;  // default: kDefaultCorpusPath (data.h)
  double holdout = 0.05;
  ByteLmConfig model;

  // Run.
  std::string config_path;     // empty: the built-in config (BuiltinConfigJson)
  std::string device = "cpu";  // "cpu" | "cuda"
  int nproc = 0;               // 0: not given (cpu: kDefaultNproc; cuda: every visible GPU)
  int steps = kDefaultSteps;
  uint64_t seed = 1;
  double timeout_s = 0;  // 0: ZERO_COMM_TIMEOUT_MS or 120 s

  // Output.
  std::string log_json;             // empty: none
  std::string trace;                // empty: none; Chrome trace of steps 2-4 (docs/timeline.md)
  std::string plot = kDefaultPlot;  // empty: none ("--plot none")
  bool progress = true;             // the terminal progress bar (only drawn on a TTY)
  int sample = 200;                 // bytes sampled at the end (0: none)
  float temperature = 0.8f;
  std::string prompt = kDefaultPrompt;
  bool print_config = false;  // print the resolved config and exit
  bool help = false;

  // Checkpoints (Engine::SaveCheckpoint / LoadCheckpoint).
  std::string save_dir;
  int save_every = 0;  // 0: only at the end (when --save is given)
  std::string resume_dir;
};

// Parses argv[1..argc). Accepts "--name value" and "--name=value". Errors name the flag and the
// value, and point at --help.
Result<TrainOptions> ParseTrainOptions(int argc, const char* const* argv);
Result<TrainOptions> ParseTrainOptions(const std::vector<std::string>& args);

// The --help text.
std::string UsageText();

// The built-in engine config for `steps` optimizer steps: ZeRO stage 3, fp32, AdamW lr 3e-3 with
// WarmupCosineLR over the run, clipping 1.0, micro batch 32 per rank, 2 accumulation steps.
std::string BuiltinConfigJson(int steps);

// The config of the run for `world_size` ranks: --config FILE (parsed with that world size, so the
// batch keys resolve against it) or the built-in one. Errors carry the file and the key path.
Result<Config> ResolveConfig(const TrainOptions& options, int world_size);

// What every rank of a run must be started with alike (the Trainer compares them,
// train/trainer.h): ("--flag", value) for every flag but PerRankFlags(); --data, --config, --save and
// --resume as "given" or "not given", since what the path holds is compared instead (the text, the
// resolved config) and may live at different paths on different machines.
std::vector<std::pair<std::string, std::string>> AgreedFlags(const TrainOptions& options);
// The flags that may differ between ranks (without "--"): per machine, or rank 0's only.
const std::vector<std::string>& PerRankFlags();

// Notes for the user about a valid but probably unintended combination (e.g. the scheduler's
// total_num_steps differing from --steps), one line each; empty when there is nothing to say.
std::vector<std::string> ConfigNotes(const TrainOptions& options, const Config& config);

}  // namespace zero::examples
