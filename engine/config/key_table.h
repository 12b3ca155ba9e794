// The config's key table, private to //engine/config:config: every key declared once as a Key (JSON path,
// kind, default, check, one-line doc, how it reads and writes its Config field), and the value checks
// every user of the table shares: ReadValue (one JSON value against its key, what parsing and Validate
// both run), the "expected ..." texts, and KeyError, the one form of a key's error. It owns no file
// parsing (config.cc), no rule between keys (config_rules.h), no DeepSpeed spelling (config_compat.h)
// and no page (config_reference.cc). It includes nlohmann/json, so only the config library's .cc
// files include it; tests see the table through config_keys.h.
#pragma once

#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/config/config.h"
#include "runtime/status.h"

namespace zero::config_internal {

// Ordered so that warnings come in file order and ConfigToJson follows the table.
using Json = nlohmann::ordered_json;

// kPresence: a DeepSpeed block zero does not read, only whether it is given: null (or absent) or an
// object, whose keys are not looked at (a feature that is not built, refused by a rule when given).
enum class Kind { kBool, kInt, kNumber, kString, kDType, kBetas, kPresence };

struct Key {
  std::string path;
  Kind kind = Kind::kBool;
  Json default_value;     // null: no default (derived or required) unless `nullable`
  bool nullable = false;  // null is a value: "not set"
  std::optional<double> min, max;
  // kInt: the field's own type limits; a min/max at them is not shown as a bound.
  double type_min = -std::numeric_limits<double>::infinity();
  double type_max = std::numeric_limits<double>::infinity();
  bool min_exclusive = false;
  bool max_exclusive = false;
  std::vector<std::string> choices;  // kString: allowed values (canonical spelling)
  bool case_insensitive = false;
  std::string expected_override;             // replaces the generated "expected ..." text
  std::function<bool(double)> also_ok;       // kNumber: an extra check after the range
  std::vector<std::string> extra_bad;        // JSON texts failing `also_ok`, for the tests
  std::string default_doc;                   // shown instead of default_value in the reference
  bool default_depends = false;              // the default is resolved from other keys after parsing
  std::vector<std::string> not_implemented;  // DeepSpeed values zero refuses, named in the error
  std::string doc;
  std::vector<std::string> only_for;  // scheduler types reading this key; empty: always
  std::function<void(Config&, const Json&)> set;
  std::function<Json(const Config&)> get;

  Key& Range(double lo, double hi) {
    min = lo;
    max = hi;
    return *this;
  }
  Key& AtLeast(double lo) {
    min = lo;
    min_exclusive = false;
    return *this;
  }
  Key& Above(double lo) {
    min = lo;
    min_exclusive = true;
    return *this;
  }
  Key& Below(double hi) {
    max = hi;
    max_exclusive = true;
    return *this;
  }
  Key& AtMost(double hi) {
    max = hi;
    max_exclusive = false;
    return *this;
  }
  Key& Choices(std::vector<std::string> c) {
    choices = std::move(c);
    return *this;
  }
  Key& CaseInsensitive() {
    case_insensitive = true;
    return *this;
  }
  Key& Nullable() {
    nullable = true;
    return *this;
  }
  Key& NoDefault(std::string text) {
    default_value = Json();
    default_doc = std::move(text);
    return *this;
  }
  Key& DefaultDoc(std::string text) {
    default_doc = std::move(text);
    return *this;
  }
  Key& DependsOn(std::string text) {
    default_doc = std::move(text);
    default_depends = true;
    return *this;
  }
  Key& NotImplemented(std::vector<std::string> v) {
    not_implemented = std::move(v);
    return *this;
  }
  Key& OnlyFor(std::vector<std::string> types) {
    only_for = std::move(types);
    return *this;
  }
  Key& Doc(std::string text) {
    doc = std::move(text);
    return *this;
  }
};

inline constexpr const char* kWarmupLR = "WarmupLR";
inline constexpr const char* kWarmupDecayLR = "WarmupDecayLR";
inline constexpr const char* kWarmupCosineLR = "WarmupCosineLR";

// The table in declaration order (built once).
const std::vector<Key>& Keys();
const Key* FindKey(const std::string& path);  // nullptr for an unknown path
bool IsBlock(const std::string& path);        // some key lies under `path`

// Appended to the error of a value "auto" (a Hugging Face Trainer placeholder).
extern const char* const kAutoNote;

std::string Lower(std::string s);
std::string Quote(const std::string& s);
std::string ShowValue(const Json& v);  // compact JSON, cut at 60 characters
std::string FormatNumber(double v);
std::string Join(const std::vector<std::string>& items, const std::string& sep);
std::string Expected(const Key& k);  // "an integer in 0..3", "one of \"cpu\", \"gpu\"", ...
std::string TypeName(const Key& k);  // the reference's Type column
// "<source>: ", or nothing for an empty source (a Config built in code, checked by Engine::Create).
std::string Where(const std::string& source);
// "<source>: <path>: expected <expected>, got <got>" (INVALID_ARGUMENT).
Status KeyError(const std::string& source, const std::string& path, const std::string& expected,
                const std::string& got);
// Checks `v` against the key (its error names `user_path`) and returns its canonical form in *out.
Status ReadValue(const Key& k, const Json& v, const std::string& user_path, const std::string& source, Json* out);
std::string LastComponent(const std::string& path);
std::string ParentOf(const std::string& path);

}  // namespace zero::config_internal
