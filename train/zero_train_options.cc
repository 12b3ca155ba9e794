#include "train/zero_train_options.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <sstream>

#include "data/byte_data.h"

namespace zero::examples {
namespace {

Status FlagError(const std::string& flag, const std::string& expected, const std::string& got) {
  return InvalidArgumentError("--" + flag + ": expected " + expected + ", got '" + got +
                              "' (zero_train --help lists the flags)");
}

Status ParseInt(const std::string& flag, const std::string& v, int64_t lo, int64_t hi, int64_t* out) {
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0 || x < lo || x > hi) {
    return FlagError(flag, "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]", v);
  }
  *out = x;
  return OkStatus();
}

Status ParseDouble(const std::string& flag, const std::string& v, double lo, double hi, double* out) {
  errno = 0;
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || errno != 0 || !std::isfinite(x) || x < lo || x > hi) {
    std::ostringstream e;
    e << "a number in [" << lo << ", " << hi << "]";
    return FlagError(flag, e.str(), v);
  }
  *out = x;
  return OkStatus();
}

struct Flag {
  std::string name;
  std::string arg;  // empty: a switch without a value
  std::string doc;
  std::function<Status(const std::string& value, TrainOptions* o)> set;
};

template <typename T>
std::function<Status(const std::string&, TrainOptions*)> IntFlag(const std::string& name, int64_t lo, int64_t hi,
                                                                 T TrainOptions::*field) {
  return [=](const std::string& v, TrainOptions* o) {
    int64_t x = 0;
    ZERO_RETURN_IF_ERROR(ParseInt(name, v, lo, hi, &x));
    o->*field = static_cast<T>(x);
    return OkStatus();
  };
}

std::function<Status(const std::string&, TrainOptions*)> ModelFlag(const std::string& name, int64_t lo, int64_t hi,
                                                                   int ByteLmConfig::*field) {
  return [=](const std::string& v, TrainOptions* o) {
    int64_t x = 0;
    ZERO_RETURN_IF_ERROR(ParseInt(name, v, lo, hi, &x));
    o->model.*field = static_cast<int>(x);
    return OkStatus();
  };
}

std::function<Status(const std::string&, TrainOptions*)> StringFlag(std::string TrainOptions::*field) {
  return [=](const std::string& v, TrainOptions* o) {
    o->*field = v;
    return OkStatus();
  };
}

const std::vector<Flag>& Flags() {
  static const std::vector<Flag>* flags = new std::vector<Flag>{
      {"data", "FILE", "training text (default " + std::string(kDefaultCorpusPath) + ")",
       [](const std::string& v, TrainOptions* o) {
         if (v.empty()) return FlagError("data", "a file name", v);
         o->data = v;
         return OkStatus();
       }},
      {"holdout", "F", "fraction of the text held out for the final evaluation (default 0.05; 0: none)",
       [](const std::string& v, TrainOptions* o) { return ParseDouble("holdout", v, 0.0, 0.5, &o->holdout); }},
      {"config", "FILE",
       "engine config JSON (DeepSpeed keys; docs/config.md); default: the built-in stage-3 config "
       "(--print-config shows it)",
       [](const std::string& v, TrainOptions* o) {
         if (v.empty()) return FlagError("config", "a file name", v);
         o->config_path = v;
         return OkStatus();
       }},
      {"device", "cpu|cuda", "where the model and the engine run (default cpu; cuda: one GPU per rank, NCCL)",
       [](const std::string& v, TrainOptions* o) {
         if (v != "cpu" && v != "cuda") return FlagError("device", "cpu or cuda", v);
         o->device = v;
         return OkStatus();
       }},
      {"nproc", "N",
       "ranks to start on this machine when not run under a launcher (default 2 on cpu, every visible GPU "
       "with --device cuda)",
       IntFlag("nproc", 1, 1024, &TrainOptions::nproc)},
      {"steps", "N", "optimizer steps (default " + std::to_string(kDefaultSteps) + ")",
       IntFlag("steps", 1, 100000000, &TrainOptions::steps)},
      {"seed", "N", "seed of the initialization, the data sampler and the text sample (default 1)",
       [](const std::string& v, TrainOptions* o) {
         int64_t x = 0;
         ZERO_RETURN_IF_ERROR(ParseInt("seed", v, 0, INT64_MAX, &x));
         o->seed = static_cast<uint64_t>(x);
         return OkStatus();
       }},
      {"context", "K", "model: input bytes per prediction (default 8)",
       ModelFlag("context", 1, 4096, &ByteLmConfig::context)},
      {"embed", "D", "model: byte embedding width (default 32)", ModelFlag("embed", 1, 65536, &ByteLmConfig::embed_dim)},
      {"hidden", "H", "model: residual width (default 128)", ModelFlag("hidden", 1, 65536, &ByteLmConfig::hidden)},
      {"ffn", "F", "model: MLP inner width (default 512)", ModelFlag("ffn", 1, 262144, &ByteLmConfig::ffn)},
      {"layers", "L", "model: residual MLP blocks (default 2)", ModelFlag("layers", 0, 1024, &ByteLmConfig::layers)},
      {"timeout", "SEC",
       "communication timeout per collective and for the rendezvous (default ZERO_COMM_TIMEOUT_MS, else 120)",
       [](const std::string& v, TrainOptions* o) { return ParseDouble("timeout", v, 0.1, 86400, &o->timeout_s); }},
      {"log-json", "FILE", "one JSON object per optimizer step (rank 0)", StringFlag(&TrainOptions::log_json)},
      {"trace", "FILE",
       "Chrome trace (chrome://tracing, Perfetto) of steps 2-4 of the run: rank 0 writes FILE, rank r "
       "FILE.rank<r> (docs/timeline.md)",
       StringFlag(&TrainOptions::trace)},
      {"plot", "FILE", std::string("loss curve as SVG (default ") + kDefaultPlot + "; 'none': no plot)",
       [](const std::string& v, TrainOptions* o) {
         o->plot = (v == "none") ? "" : v;
         return OkStatus();
       }},
      {"no-progress", "", "no progress bar (it is drawn only when stdout is a terminal anyway)",
       [](const std::string&, TrainOptions* o) {
         o->progress = false;
         return OkStatus();
       }},
      {"sample", "N", "bytes of text to generate after training (default 200; 0: none)",
       IntFlag("sample", 0, 1000000, &TrainOptions::sample)},
      {"temperature", "T", "sampling temperature (default 0.8; 0: always the most likely byte)",
       [](const std::string& v, TrainOptions* o) {
         double t = 0;
         ZERO_RETURN_IF_ERROR(ParseDouble("temperature", v, 0.0, 100.0, &t));
         o->temperature = static_cast<float>(t);
         return OkStatus();
       }},
      {"prompt", "TEXT", std::string("text the sample continues (default \"") + kDefaultPrompt + "\")",
       StringFlag(&TrainOptions::prompt)},
      {"save", "DIR", "save checkpoints here (after the last step, and every --save-every steps)", StringFlag(&TrainOptions::save_dir)},
      {"save-every", "N", "checkpoint every N steps with --save (default 0: only at the end)",
       IntFlag("save-every", 0, 100000000, &TrainOptions::save_every)},
      {"resume", "DIR", "resume from the latest checkpoint in DIR (any --nproc; the run continues to --steps)", StringFlag(&TrainOptions::resume_dir)},
      {"print-config", "", "print the resolved engine config as JSON and exit",
       [](const std::string&, TrainOptions* o) {
         o->print_config = true;
         return OkStatus();
       }},
      {"help", "", "this text",
       [](const std::string&, TrainOptions* o) {
         o->help = true;
         return OkStatus();
       }},
  };
  return *flags;
}

}  // namespace

Result<TrainOptions> ParseTrainOptions(const std::vector<std::string>& args) {
  TrainOptions o;
  o.data = kDefaultCorpusPath;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h") {
      o.help = true;
      continue;
    }
    if (a.rfind("--", 0) != 0 || a.size() == 2) {
      return InvalidArgumentError("unexpected argument '" + a + "': flags look like --name value (zero_train --help)");
    }
    std::string name = a.substr(2), value;
    bool has_value = false;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    std::replace(name.begin(), name.end(), '_', '-');
    const Flag* flag = nullptr;
    for (const Flag& f : Flags()) {
      if (f.name == name) flag = &f;
    }
    if (flag == nullptr) {
      std::string best;
      size_t best_d = 3;
      for (const Flag& f : Flags()) {
        const size_t d = EditDistance(name, f.name);
        if (d < best_d) {
          best_d = d;
          best = f.name;
        }
      }
      return InvalidArgumentError("unknown flag --" + name + (best.empty() ? "" : " (did you mean --" + best + "?)") +
                                  "; zero_train --help lists the flags");
    }
    if (flag->arg.empty()) {
      if (has_value) return InvalidArgumentError("--" + name + " takes no value, got '" + value + "'");
    } else if (!has_value) {
      if (i + 1 >= args.size()) return InvalidArgumentError("--" + name + " needs a value (" + flag->arg + ")");
      value = args[++i];
    }
    ZERO_RETURN_IF_ERROR(flag->set(value, &o));
  }
  ZERO_RETURN_IF_ERROR(o.model.Validate().WithContext("model flags (--context/--embed/--hidden/--ffn/--layers)"));
  if (o.save_every > 0 && o.save_dir.empty()) {
    return InvalidArgumentError("--save-every " + std::to_string(o.save_every) + " needs --save DIR");
  }
  return o;
}

Result<TrainOptions> ParseTrainOptions(int argc, const char* const* argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  return ParseTrainOptions(args);
}

std::string UsageText() {
  std::ostringstream s;
  s << "zero_train: trains a byte-level language model with the zero engine (ZeRO stages 0-3).\n\n"
       "usage: zero_train [flags]\n"
       "  Without RANK in the environment it starts --nproc ranks of itself on this machine; under a\n"
       "  launcher (tools/launch, torchrun, mpirun, srun: RANK/WORLD_SIZE, OMPI_COMM_WORLD_*, SLURM_*)\n"
       "  it is one rank. docs/zero_train.md has the details.\n\nflags:\n";
  for (const Flag& f : Flags()) {
    std::string head = "  --" + f.name + (f.arg.empty() ? "" : " " + f.arg);
    if (head.size() < 24)
      head.resize(24, ' ');
    else
      head += "\n" + std::string(24, ' ');
    s << head << f.doc << "\n";
  }
  return s.str();
}

std::string BuiltinConfigJson(int steps) {
  const int warmup = std::clamp(steps / 20, 1, 100);
  std::ostringstream s;
  s << R"({
  "train_micro_batch_size_per_gpu": 32,
  "gradient_accumulation_steps": 2,
  "gradient_clipping": 1.0,
  "steps_per_print": 10,
  "optimizer": {
    "type": "AdamW",
    "params": {"lr": 3e-3, "betas": [0.9, 0.99], "eps": 1e-8, "weight_decay": 0.0}
  },
  "scheduler": {
    "type": "WarmupCosineLR",
    "params": {"total_num_steps": )"
    << steps << R"(, "warmup_num_steps": )" << warmup << R"(, "warmup_type": "linear", "cos_min_ratio": 0.1}
  },
  "zero_optimization": {
    "stage": 3,
    "reduce_bucket_size": 200000,
    "stage3_prefetch_bucket_size": 200000,
    "stage3_param_persistence_threshold": 1024
  }
}
)";
  return s.str();
}

Result<Config> ResolveConfig(const TrainOptions& options, int world_size) {
  ParseOptions po;
  po.world_size = world_size;
  if (options.config_path.empty()) {
    po.source = "built-in config";
    return ParseConfig(BuiltinConfigJson(options.steps), po);
  }
  return LoadConfigFile(options.config_path, po);
}

std::vector<std::pair<std::string, std::string>> AgreedFlags(const TrainOptions& o) {
  auto given = [](const std::string& path) { return std::string(path.empty() ? "not given" : "given"); };
  std::ostringstream holdout;
  holdout.precision(17);
  holdout << o.holdout;
  // The data's default path counts as given: what matters is the text, compared separately.
  return {
      {"--data", given(o.data)},
      {"--holdout", holdout.str()},
      {"--config", given(o.config_path)},
      {"--device", o.device},
      {"--steps", std::to_string(o.steps)},
      {"--seed", std::to_string(o.seed)},
      {"--context", std::to_string(o.model.context)},
      {"--embed", std::to_string(o.model.embed_dim)},
      {"--hidden", std::to_string(o.model.hidden)},
      {"--ffn", std::to_string(o.model.ffn)},
      {"--layers", std::to_string(o.model.layers)},
      {"--sample", std::to_string(o.sample)},
      {"--save", given(o.save_dir)},
      {"--save-every", std::to_string(o.save_every)},
      {"--resume", given(o.resume_dir)},
  };
}

const std::vector<std::string>& PerRankFlags() {
  // --nproc is ignored under a launcher, --timeout is each rank's own wait; the outputs, the
  // progress bar and the sample's temperature and prompt are rank 0's.
  static const auto* flags = new std::vector<std::string>{
      "nproc", "timeout", "log-json", "trace", "plot", "no-progress", "temperature", "prompt", "print-config", "help"};
  return *flags;
}

std::vector<std::string> ConfigNotes(const TrainOptions& options, const Config& config) {
  std::vector<std::string> notes;
  const SchedulerConfig& s = config.scheduler;
  if ((s.type == "WarmupDecayLR" || s.type == "WarmupCosineLR") && s.total_num_steps != options.steps) {
    notes.push_back("scheduler.params.total_num_steps is " + std::to_string(s.total_num_steps) + " but --steps is " +
                    std::to_string(options.steps) + ": the " + s.type + " schedule " +
                    (s.total_num_steps > options.steps ? "will not finish" : "ends before the run does"));
  }
  if (config.fp16.enabled && options.device == "cpu") {
    notes.push_back("fp16 on the CPU: the math is fp32 either way; bf16 or fp32 need no loss scaling");
  }
  return notes;
}

}  // namespace zero::examples
