// ConfigKeyInfo: a read-only view of the key table (config_key_table.cc), for tests and tools.
//
// The table itself (bindings to Config fields, parsing, checks) stays private to //engine/config:config so
// that nlohmann/json is compiled in its .cc files only; this header exposes what a test needs to cover every key
// without naming it: the path, the declared default, and JSON values of the wrong type or outside
// the key's check. Adding a key to the table adds it here, so table-driven tests cover it at once.
#pragma once

#include <string>
#include <vector>

namespace zero {

struct ConfigKeyInfo {
  std::string path;                            // canonical JSON path, e.g. "zero_optimization.offload_param.device"
  std::string expected;                        // what the check accepts, as error messages say it ("an integer >= 1")
  bool has_default = true;                     // false for keys that are derived (batch) or required (total_num_steps)
  std::string default_json;                    // the declared default as JSON text; "null" means unset
  bool default_depends_on_other_keys = false;  // e.g. overlap_comm (stage), weight_decay (type)
  std::vector<std::string> only_for;           // scheduler types the key belongs to; empty: always read
  std::vector<std::string> wrong_type_values;  // JSON texts the key rejects for their type
  std::vector<std::string> out_of_range_values;  // JSON texts of the right type that fail the check
};

// The key table in declaration order (aliases and deprecated spellings are not keys).
const std::vector<ConfigKeyInfo>& ConfigKeyTable();

// A default (or a key) of zero's that is not DeepSpeed 0.19.8's, with the reason; listed in
// docs/config.md under "Differences from DeepSpeed 0.19.8".
struct ConfigDifference {
  std::string key;     // a canonical path (a default), or markdown naming keys read differently
  std::string theirs;  // DeepSpeed 0.19.8's default or behaviour
  std::string ours;    // zero's
  std::string why;
};
const std::vector<ConfigDifference>& DeepSpeedDifferences();

// The value the key holds in `config_json` (a ConfigToJson text) as compact JSON, or "" when absent.
std::string ConfigValueAt(const std::string& config_json, const std::string& path);

}  // namespace zero
