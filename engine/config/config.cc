// ParseConfig and LoadConfigFile (config.h): the JSON walk over the key table (config_key_table.h)
// with DeepSpeed's other spellings mapped (config_compat.h) and "did you mean" suggestions for unknown
// keys, the defaults that depend on other keys, DeepSpeed's batch arithmetic, then Validate's checks
// (config_rules.h) and one error listing every problem; ConfigToJson, its inverse. The rules themselves
// and the reference page live in their own files.
#include "engine/config/config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/config/compat.h"
#include "engine/config/key_table.h"
#include "engine/config/keys.h"
#include "engine/config/rules.h"
#include "runtime/json_input.h"

namespace zero {

const char* OffloadDeviceName(OffloadDevice d) {
  switch (d) {
    case OffloadDevice::kNone:
      return "none";
    case OffloadDevice::kCpu:
      return "cpu";
    case OffloadDevice::kNvme:
      return "nvme";
  }
  return "?";
}

DType Config::model_dtype() const {
  if (fp16.enabled) return DType::kF16;
  if (bf16_enabled) return DType::kBF16;
  return DType::kF32;
}

namespace {

using config_internal::Alias;
using config_internal::Aliases;
using config_internal::AnyBad;
using config_internal::CheckConfig;
using config_internal::Deprecated;
using config_internal::DeprecatedKeys;
using config_internal::Expected;
using config_internal::FindAlias;
using config_internal::FindKey;
using config_internal::FormatNumber;
using config_internal::Ignored;
using config_internal::IgnoredKeys;
using config_internal::IsBad;
using config_internal::IsBlock;
using config_internal::IsValidatedBlock;
using config_internal::Join;
using config_internal::Json;
using config_internal::kAutoNote;
using config_internal::Key;
using config_internal::KeyError;
using config_internal::Keys;
using config_internal::kWarmupCosineLR;
using config_internal::kWarmupDecayLR;
using config_internal::kWarmupLR;
using config_internal::LastComponent;
using config_internal::Lower;
using config_internal::ParentOf;
using config_internal::Quote;
using config_internal::ReadValue;
using config_internal::ShowValue;

// Every name zero knows directly under each block ("" = top level), in table order. Built once:
// an unknown key's suggestion must not rebuild it (a file of 200k unknown keys asks 200k times).
const std::map<std::string, std::vector<std::string>>& NamesByBlock() {
  static const auto* names = [] {
    auto* out = new std::map<std::string, std::vector<std::string>>();
    std::vector<std::string> all;
    for (const Key& k : Keys()) all.push_back(k.path);
    for (const Alias& a : Aliases()) all.push_back(a.path);
    for (const Deprecated& d : DeprecatedKeys()) all.push_back(d.path);
    for (const Ignored& i : IgnoredKeys()) all.push_back(i.path);
    for (const std::string& p : all) {
      for (size_t start = 0;;) {
        const size_t dot = p.find('.', start);
        const std::string parent = start == 0 ? "" : p.substr(0, start - 1);
        const std::string name = p.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
        std::vector<std::string>& v = (*out)[parent];
        if (std::find(v.begin(), v.end(), name) == v.end()) v.push_back(name);
        if (dot == std::string::npos) break;
        start = dot + 1;
      }
    }
    return out;
  }();
  return *names;
}

const std::vector<std::string>& NamesUnder(const std::string& parent) {
  static const std::vector<std::string> kNone;
  const auto it = NamesByBlock().find(parent);
  return it == NamesByBlock().end() ? kNone : it->second;
}

// The known name under `parent` closest to `name` (case-insensitive edit distance), and that
// distance; names further than `limit` are skipped (distance >= length difference, so they are
// not even compared) and give {"", npos}.
std::pair<std::string, size_t> Nearest(const std::string& parent, const std::string& name, size_t limit) {
  std::string best;
  size_t best_d = std::string::npos;
  const std::string lower = Lower(name);
  for (const std::string& n : NamesUnder(parent)) {
    const size_t gap = n.size() > name.size() ? n.size() - name.size() : name.size() - n.size();
    if (gap > limit) continue;
    const size_t d = EditDistance(lower, Lower(n));
    if (d <= limit && d < best_d) {
      best_d = d;
      best = n;
    }
  }
  return {best, best_d};
}

// A block directly under `parent` (not a scalar key) one edit (case aside) from `name`, or "".
// Cheap for the many unknown keys of a hostile file: IsBlock runs only for names one edit away.
std::string NearestBlock(const std::string& parent, const std::string& name) {
  const std::string lower = Lower(name);
  for (const std::string& n : NamesUnder(parent)) {
    const size_t gap = n.size() > name.size() ? n.size() - name.size() : name.size() - n.size();
    if (gap > 1 || EditDistance(lower, Lower(n)) > 1) continue;
    if (IsBlock(parent + "." + n)) return n;
  }
  return "";
}

std::string Suggestion(const std::string& parent, const std::string& name) {
  const size_t limit = std::max<size_t>(1, std::min<size_t>(3, name.size() / 3));
  const auto [best, best_d] = Nearest(parent, name, limit);
  if (!best.empty()) return " (did you mean '" + best + "'?)";
  // The right name in the wrong block: suggest the full path.
  for (const Key& k : Keys()) {
    if (LastComponent(k.path) == name && ParentOf(k.path) != parent) {
      return " (did you mean '" + k.path + "'?)";
    }
  }
  return "";
}

// ---------------------------------------------------------------------------------------------
// Parsing.

// Parsing goes on past a problem so that one error lists them all: a key whose value is refused is
// left at its default and recorded in `bad`, and every later check that reads a bad key (the batch
// arithmetic, the scheduler's parameters, the rules between keys) is skipped rather than reporting a
// consequence of the first problem.
struct ParseState {
  const ParseOptions& options;
  Config config;
  std::map<std::string, std::string> given;  // canonical path -> path as written
  std::map<std::string, bool> deprecated;    // deprecated boolean keys as given
  std::vector<std::string> errors;           // every problem, in file order, then the cross-key checks
  std::set<std::string> bad;                 // canonical paths of keys and blocks with a problem
  int64_t unknown_keys = 0;                  // all of them; only the first kUnknownKeysListed are listed
  bool unlisted_unknown_error = false;       // one past kUnknownKeysListed was an error, not a warning
};

// A file of many unknown keys (a wrong file, a generated one) lists this many and counts the rest,
// so that its message stays readable and its size does not grow with the file.
constexpr int64_t kUnknownKeysListed = 100;

// Records the problem `s` (an error Status) about the key or block `path` ("" for none).
void Problem(ParseState* st, const std::string& path, const Status& s) {
  st->errors.push_back(std::string(s.message()));
  if (!path.empty()) st->bad.insert(path);
}

void Walk(const Json& obj, const std::string& canonical_prefix, const std::string& user_prefix, ParseState* st);

// The key `k` given as `value`: refused if given twice (two spellings) or badly, else set.
void ReadKey(const Key& k, const Json& value, const std::string& path, const std::string& user_path, ParseState* st) {
  const std::string& source = st->options.source;
  auto prior = st->given.find(path);
  if (prior != st->given.end()) {
    Problem(st, path, KeyError(source, user_path, "one spelling of the key", "it also as '" + prior->second + "'"));
    return;
  }
  st->given[path] = user_path;
  Json canonical;
  const Status read = ReadValue(k, value, user_path, source, &canonical);
  if (!read.ok()) {
    Problem(st, path, read);
    return;
  }
  k.set(st->config, canonical);
}

// The block `path` given as `value`: walked if it is an object given once.
void ReadBlock(const Json& value, const std::string& path, const std::string& user_path, ParseState* st) {
  const std::string& source = st->options.source;
  if (value.is_string() && value.get<std::string>() == "auto") {
    Problem(st, path, KeyError(source, user_path, "an object", ShowValue(value) + kAutoNote));
    return;
  }
  if (!value.is_object()) {
    Problem(st, path, KeyError(source, user_path, "an object", ShowValue(value)));
    return;
  }
  if (st->given.count(path)) {
    Problem(st, path, KeyError(source, user_path, "one spelling of the block", "it also as '" + st->given[path] + "'"));
    return;
  }
  st->given[path] = user_path;
  Walk(value, path, user_path, st);
}

// Whether `path` is a deprecated key (recorded, or a problem if not a boolean) or an ignored one
// (a warning).
bool ReadDeprecatedOrIgnored(const Json& value, const std::string& path, const std::string& user_path, ParseState* st) {
  const std::string& source = st->options.source;
  bool handled = false;
  for (const Deprecated& d : DeprecatedKeys()) {
    if (path != d.path) continue;
    handled = true;
    if (!value.is_boolean()) {
      Problem(st, path, KeyError(source, user_path, "true or false", ShowValue(value)));
      continue;
    }
    st->deprecated[path] = value.get<bool>();
  }
  for (const Ignored& i : IgnoredKeys()) {
    if (path != i.path) continue;
    st->config.warnings.push_back(source + ": '" + user_path + "' is ignored: " + i.why);
    handled = true;
  }
  return handled;
}

// An unknown key `name` under `canonical_prefix`: an error when it is one edit from a known
// top-level key or block, or when it lies directly in a block DeepSpeed validates (as the options
// say), else a warning (an error with `strict`); with a suggestion, past kUnknownKeysListed only
// counted.
void ReportUnknownKey(const std::string& canonical_prefix, const std::string& name, const std::string& user_path,
                      ParseState* st) {
  const std::string& source = st->options.source;
  if (canonical_prefix.empty() && st->options.top_level_typos_are_errors) {
    const std::string near = Nearest("", name, 1).first;
    if (!near.empty()) {
      Problem(st, "",
              InvalidArgumentError(source + ": unknown key '" + user_path + "' (did you mean '" + near +
                                   "'?): a top-level key one edit from a known one is an error, since "
                                   "everything under it would be ignored"));
      return;
    }
  }
  if (!canonical_prefix.empty() && st->options.nested_block_typos_are_errors) {
    const std::string near = NearestBlock(canonical_prefix, name);
    if (!near.empty()) {
      Problem(st, "",
              InvalidArgumentError(source + ": unknown key '" + user_path + "' (did you mean '" + near +
                                   "'?): a key one edit from a known block is an error, since everything "
                                   "under it would be ignored"));
      return;
    }
  }
  const bool validated = st->options.unknown_keys_in_validated_blocks_are_errors && IsValidatedBlock(canonical_prefix);
  const bool error = validated || st->options.strict;
  if (++st->unknown_keys > kUnknownKeysListed) {
    st->unlisted_unknown_error |= error;
    return;
  }
  std::string message = source + ": unknown key '" + user_path + "'" + Suggestion(canonical_prefix, name);
  if (validated) {
    const std::string user_block = user_path.substr(0, user_path.size() - name.size() - 1);
    message += ": an unknown key in '" + user_block + "' is an error (DeepSpeed 0.19.8 refuses it too)";
  }
  (error ? st->errors : st->config.warnings).push_back(message);
}

void Walk(const Json& obj, const std::string& canonical_prefix, const std::string& user_prefix, ParseState* st) {
  const std::string& source = st->options.source;
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    const std::string& name = it.key();
    const Json& value = it.value();
    const std::string user_path = user_prefix.empty() ? name : user_prefix + "." + name;
    std::string path = canonical_prefix.empty() ? name : canonical_prefix + "." + name;
    if (const Alias* a = FindAlias(path)) {
      st->config.warnings.push_back(source + ": '" + user_path + "' is " + a->note);
      path = a->canonical;
    }
    if (path == "optimizer.params.max_grad_norm") {
      Problem(st, "",
              KeyError(source, user_path,
                       "no value (zero clips by the top-level \"gradient_clipping\"; move the value there)",
                       ShowValue(value)));
      continue;
    }
    if (const Key* k = FindKey(path)) {
      ReadKey(*k, value, path, user_path, st);
    } else if (IsBlock(path)) {
      ReadBlock(value, path, user_path, st);
    } else if (!ReadDeprecatedOrIgnored(value, path, user_path, st)) {
      ReportUnknownKey(canonical_prefix, name, user_path, st);
    }
  }
}

bool Given(const ParseState& st, const std::string& path) { return st.given.count(path) > 0; }

bool AnyGivenUnder(const ParseState& st, const std::string& block) {
  const std::string prefix = block + ".";
  for (const auto& [path, user] : st.given) {
    if (path.compare(0, prefix.size(), prefix) == 0) return true;
  }
  return false;
}

void ApplyDeprecatedOffload(ParseState* st) {
  const std::string& source = st->options.source;
  Config& c = st->config;
  struct Mapping {
    const char* old_key;
    const char* block;
    OffloadDevice* device;
    bool* pin_memory;
  };
  const Mapping mappings[] = {
      {"zero_optimization.cpu_offload", "zero_optimization.offload_optimizer", &c.zero.offload_optimizer.device,
       &c.zero.offload_optimizer.pin_memory},
      {"zero_optimization.cpu_offload_param", "zero_optimization.offload_param", &c.zero.offload_param.device,
       &c.zero.offload_param.pin_memory},
  };
  const auto pin = st->deprecated.find("zero_optimization.cpu_offload_use_pin_memory");
  for (const Mapping& m : mappings) {
    const auto it = st->deprecated.find(m.old_key);
    if (it == st->deprecated.end()) continue;
    if (AnyGivenUnder(*st, m.block)) {
      Problem(st, m.old_key,
              KeyError(source, m.old_key,
                       std::string("no value when '") + m.block + "' is given (it is the deprecated spelling of " +
                           m.block + ".device)",
                       it->second ? "true" : "false"));
      continue;
    }
    c.warnings.push_back(source + ": '" + m.old_key + "' is deprecated; use '" + m.block + "'" +
                         (it->second ? std::string(" (mapped to ") + m.block + ".device = \"cpu\")" : ""));
    if (!it->second) continue;
    *m.device = OffloadDevice::kCpu;
    st->given[std::string(m.block) + ".device"] = m.old_key;
    if (pin != st->deprecated.end()) {
      *m.pin_memory = pin->second;
      st->given[std::string(m.block) + ".pin_memory"] = pin->first;
    }
  }
  if (pin != st->deprecated.end()) {
    c.warnings.push_back(source + ": '" + pin->first +
                         "' is deprecated; use pin_memory in zero_optimization.offload_optimizer / offload_param");
  }
}

// Defaults that depend on other keys, and the scheduler's per-type parameters.
void ResolveDependentDefaults(ParseState* st) {
  const std::string& source = st->options.source;
  Config& c = st->config;
  c.zero.overlap_comm_set = Given(*st, "zero_optimization.overlap_comm");
  if (!c.zero.overlap_comm_set) c.zero.overlap_comm = c.zero.stage == 3;

  // The scheduler's parameters depend on its type: nothing to check against when the type is bad.
  if (IsBad(st->bad, "scheduler.type")) return;
  const std::string& type = c.scheduler.type;
  for (const Key& k : Keys()) {
    if (k.only_for.empty() || !Given(*st, k.path) || IsBad(st->bad, k.path)) continue;
    if (std::find(k.only_for.begin(), k.only_for.end(), type) == k.only_for.end()) {
      Problem(st, k.path,
              KeyError(source, st->given[k.path],
                       "no value with scheduler.type " + Quote(type) + " (it is a parameter of " +
                           Join(k.only_for, ", ") + ")",
                       ShowValue(k.get(c))));
    }
  }
  if ((type == kWarmupDecayLR || type == kWarmupCosineLR) && !Given(*st, "scheduler.params.total_num_steps")) {
    Problem(
        st, "scheduler.params.total_num_steps",
        KeyError(source, "scheduler.params.total_num_steps", "an integer >= 1 (" + type + " requires it)", "nothing"));
  }
  if (type == kWarmupDecayLR && !Given(*st, "scheduler.params.warmup_max_lr")) {
    // DeepSpeed's WarmupDecayLR constructor defaults warmup_max_lr to 0.001 (WarmupLR's to the lr).
    c.scheduler.warmup_max_lr = 0.001;
    if (c.optimizer.lr != 0.001) {
      c.warnings.push_back(source +
                           ": 'scheduler.params.warmup_max_lr' not given: WarmupDecayLR peaks at 0.001 (as "
                           "DeepSpeed does), not at optimizer.params.lr " +
                           FormatNumber(c.optimizer.lr));
    }
  }
  if ((type == kWarmupLR || type == kWarmupDecayLR) && c.scheduler.warmup_max_lr == -1.0) {
    c.scheduler.warmup_max_lr = c.optimizer.lr;
  }
}

std::string Product(int64_t a, int64_t b, int64_t w) {
  return std::to_string(a) + " x " + std::to_string(b) + " x " + std::to_string(w);
}

// a x b x c, or nullopt when it does not fit int64 (each key is bounded, their product is not).
std::optional<int64_t> CheckedProduct(int64_t a, int64_t b, int64_t c) {
  int64_t ab = 0, abc = 0;
  if (__builtin_mul_overflow(a, b, &ab) || __builtin_mul_overflow(ab, c, &abc)) return std::nullopt;
  return abc;
}

std::string ProductText(int64_t a, int64_t b, int64_t c) {
  const std::optional<int64_t> p = CheckedProduct(a, b, c);
  return Product(a, b, c) + " = " + (p ? std::to_string(*p) : std::string("more than 9223372036854775807"));
}

// A batch value derived from the other two must be within its own key's bounds, like a given one.
Status CheckDerived(const std::string& source, const std::string& path, std::optional<int64_t> value,
                    const std::string& how) {
  const Key* k = FindKey(path);
  if (value && *value >= *k->min && *value <= *k->max) return OkStatus();
  return KeyError(source, path, Expected(*k) + " (it is derived: " + how + ")",
                  value ? std::to_string(*value) : "more than 9223372036854775807");
}

// DeepSpeed's batch arithmetic: any two of the three derive the third, then the identity must hold.
// Every product is checked for overflow and every derived value against its key's bounds.
Status ResolveBatchSizes(ParseState* st) {
  const std::string& source = st->options.source;
  Config& c = st->config;
  const int64_t world = st->options.world_size;
  const bool has_train = Given(*st, "train_batch_size");
  const bool has_micro = Given(*st, "train_micro_batch_size_per_gpu");
  const bool has_gas = Given(*st, "gradient_accumulation_steps");
  int64_t& train = c.train_batch_size;
  int64_t& micro = c.train_micro_batch_size_per_gpu;
  int64_t& gas = c.gradient_accumulation_steps;
  const std::string w = std::to_string(world);
  // Each of micro, gas and world is below 2^31, so a product of two of them fits int64.

  if (has_train && has_micro && has_gas) {
    const std::optional<int64_t> product = CheckedProduct(micro, gas, world);
    if (!product || train != *product) {
      return KeyError(source, "train_batch_size",
                      "train_micro_batch_size_per_gpu x gradient_accumulation_steps x world_size = " +
                          ProductText(micro, gas, world),
                      std::to_string(train));
    }
    return OkStatus();
  }
  if (has_train && has_micro) {
    if (train % (micro * world) != 0) {
      return KeyError(source, "train_batch_size",
                      "a multiple of train_micro_batch_size_per_gpu x world_size = " + std::to_string(micro) + " x " +
                          w + " = " + std::to_string(micro * world) +
                          " (gradient_accumulation_steps is derived from it)",
                      std::to_string(train));
    }
    gas = train / (micro * world);
    return CheckDerived(source, "gradient_accumulation_steps", gas,
                        "train_batch_size / (train_micro_batch_size_per_gpu x world_size) = " + std::to_string(train) +
                            " / (" + std::to_string(micro) + " x " + w + ")");
  }
  if (has_train && has_gas) {
    if (train % (gas * world) != 0) {
      return KeyError(source, "train_batch_size",
                      "a multiple of gradient_accumulation_steps x world_size = " + std::to_string(gas) + " x " + w +
                          " = " + std::to_string(gas * world) + " (train_micro_batch_size_per_gpu is derived from it)",
                      std::to_string(train));
    }
    micro = train / (gas * world);
    return CheckDerived(source, "train_micro_batch_size_per_gpu", micro,
                        "train_batch_size / (gradient_accumulation_steps x world_size) = " + std::to_string(train) +
                            " / (" + std::to_string(gas) + " x " + w + ")");
  }
  if (has_micro && has_gas) {
    const std::optional<int64_t> product = CheckedProduct(micro, gas, world);
    if (product) train = *product;
    return CheckDerived(
        source, "train_batch_size", product,
        "train_micro_batch_size_per_gpu x gradient_accumulation_steps x world_size = " + Product(micro, gas, world));
  }
  if (has_train) {
    if (train % world != 0) {
      return KeyError(source, "train_batch_size",
                      "a multiple of world_size " + w +
                          " (train_micro_batch_size_per_gpu = train_batch_size / world_size when "
                          "gradient_accumulation_steps is not given)",
                      std::to_string(train));
    }
    micro = train / world;
    gas = 1;
    return CheckDerived(source, "train_micro_batch_size_per_gpu", micro,
                        "train_batch_size / world_size = " + std::to_string(train) + " / " + w);
  }
  if (has_micro) {
    gas = 1;
    const std::optional<int64_t> product = CheckedProduct(micro, 1, world);
    if (product) train = *product;
    return CheckDerived(source, "train_batch_size", product,
                        "train_micro_batch_size_per_gpu x world_size = " + std::to_string(micro) + " x " + w);
  }
  return KeyError(source, "train_batch_size",
                  "train_batch_size or train_micro_batch_size_per_gpu to be given (any two of train_batch_size, "
                  "train_micro_batch_size_per_gpu, gradient_accumulation_steps derive the third)",
                  has_gas ? "only gradient_accumulation_steps" : "none of them");
}

const std::vector<std::string> kBatchKeys = {"train_batch_size", "train_micro_batch_size_per_gpu",
                                             "gradient_accumulation_steps"};

void ResolveBatch(ParseState* st) {
  // A refused batch key is reported already; the arithmetic on the others would only repeat it. Either
  // way all three are marked, so that Validate does not report the ones left unresolved (0).
  if (AnyBad(st->bad, kBatchKeys)) {
    st->bad.insert(kBatchKeys.begin(), kBatchKeys.end());
    return;
  }
  const Status s = ResolveBatchSizes(st);
  if (!s.ok()) {
    Problem(st, "train_batch_size", s);
    st->bad.insert(kBatchKeys.begin(), kBatchKeys.end());
  }
}

// One problem: its message alone. Several: a count, then one problem per line. Unknown keys that were
// only warnings follow as notes, since a misspelt key is often why a value is missing.
std::string ProblemsMessage(const ParseState& st) {
  const std::string& source = st.options.source;
  std::string out;
  if (st.errors.size() == 1) {
    out = st.errors[0];
  } else {
    out = source + ": " + std::to_string(st.errors.size()) + " problems in the config:";
    for (const std::string& e : st.errors) out += "\n  " + e;
  }
  const std::string unknown = source + ": unknown key";  // "unknown key '...'" and "unknown keys: N more"
  for (const std::string& w : st.config.warnings) {
    if (w.compare(0, unknown.size(), unknown) == 0) out += "\n  note: " + w;
  }
  return out;
}

}  // namespace

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

Result<Config> ParseConfig(const std::string& json_text, const ParseOptions& options) {
  const std::string& source = options.source;
  if (options.world_size < 1) {
    return InvalidArgumentError(source + ": world_size: expected an integer >= 1, got " +
                                std::to_string(options.world_size));
  }
  // Depth, number range, duplicate keys and linear time are ParseJsonText's (runtime/json_input.h).
  ZERO_ASSIGN_OR_RETURN(Json root, ParseJsonText<Json>(json_text, source));
  if (!root.is_object()) {
    return InvalidArgumentError(source + ": expected a JSON object at the top level, got " + ShowValue(root));
  }

  ParseState st{options, Config(), {}, {}, {}, {}};
  for (const Key& k : Keys()) {
    if (!k.default_value.is_null() || k.nullable) k.set(st.config, k.default_value);
  }
  try {
    Walk(root, "", "", &st);
    if (st.unknown_keys > kUnknownKeysListed) {
      const std::string more = source + ": unknown keys: " + std::to_string(st.unknown_keys - kUnknownKeysListed) +
                               " more not listed (" + std::to_string(st.unknown_keys) + " in all; the first " +
                               std::to_string(kUnknownKeysListed) + " are)";
      (options.strict || st.unlisted_unknown_error ? st.errors : st.config.warnings).push_back(more);
    }
    ApplyDeprecatedOffload(&st);
    ResolveDependentDefaults(&st);
    ResolveBatch(&st);
  } catch (const Json::exception& e) {
    // Values are type-checked before use, so this is a bug in the table.
    return InternalError(source + ": config table: " + e.what());
  }
  std::vector<Status> problems;
  CheckConfig(st.config, ValidateOptions{options.world_size, source, /*refuse_unbuilt=*/false}, &st.bad, &problems);
  for (const Status& s : problems) st.errors.push_back(s.message());
  if (!st.errors.empty()) return InvalidArgumentError(ProblemsMessage(st));
  return std::move(st.config);
}

Result<Config> LoadConfigFile(const std::string& path, const ParseOptions& options) {
  // O_NONBLOCK and fstat: a named pipe would block open() forever, and a directory used to be read
  // as empty text ("malformed JSON").
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return ErrnoError("open config", path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError("stat config", path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                       : S_ISFIFO(st.st_mode) ? "a named pipe"
                                              : "not a regular file";
    return InvalidArgumentError("config " + path + ": not a regular file (it is " + std::string(kind) +
                                "); give the path of the JSON config file");
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  std::string text;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return ErrnoError("read config", path, err);
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  ParseOptions opts = options;
  if (opts.source == ParseOptions().source) opts.source = path;
  return ParseConfig(text, opts);
}

std::string ConfigToJson(const Config& config) {
  Json out = Json::object();
  for (const Key& k : Keys()) {
    if (!k.only_for.empty() &&
        std::find(k.only_for.begin(), k.only_for.end(), config.scheduler.type) == k.only_for.end()) {
      continue;
    }
    std::string pointer = "/" + k.path;
    std::replace(pointer.begin(), pointer.end(), '.', '/');
    out[Json::json_pointer(pointer)] = k.get(config);
  }
  return out.dump(2) + "\n";
}

std::string ConfigValueAt(const std::string& config_json, const std::string& path) {
  Json root = Json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return "";
  std::string pointer = "/" + path;
  std::replace(pointer.begin(), pointer.end(), '.', '/');
  const Json::json_pointer ptr(pointer);
  if (!root.contains(ptr)) return "";
  return root.at(ptr).dump();
}

}  // namespace zero
