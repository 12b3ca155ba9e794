// The key table's value checks and texts (key_table.h): ReadValue, the "expected ..." texts,
// KeyError and the shared formatting, and ConfigKeyTable (keys.h), the table's view for tests and
// tools. The keys themselves are in key_table.cc.
#include "engine/config/key_table.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>

#include "engine/config/keys.h"

namespace zero {
namespace config_internal {
namespace {

std::string ChoicesText(const std::vector<std::string>& choices) {
  std::vector<std::string> q;
  for (const std::string& c : choices) q.push_back(Quote(c));
  return Join(q, ", ");
}

bool IsIntType(const Key& k) { return k.kind == Kind::kInt; }

std::string RangeText(const Key& k) {
  const bool is_int = IsIntType(k);
  const bool has_min = k.min && *k.min > k.type_min;
  const bool has_max = k.max && *k.max < k.type_max;
  // Integer bounds in full (2^53 - 1, not 9.007e+15).
  auto show = [&](double v) { return is_int ? std::to_string(static_cast<int64_t>(v)) : FormatNumber(v); };
  if (has_min && has_max) {
    if (is_int) return " in " + show(*k.min) + ".." + show(*k.max);
    return std::string(" in ") + (k.min_exclusive ? "(" : "[") + show(*k.min) + ", " + show(*k.max) +
           (k.max_exclusive ? ")" : "]");
  }
  if (has_min) return (k.min_exclusive ? " > " : " >= ") + show(*k.min);
  if (has_max) return (k.max_exclusive ? " < " : " <= ") + show(*k.max);
  return "";
}

bool InRange(const Key& k, double v) {
  if (k.min && (k.min_exclusive ? v <= *k.min : v < *k.min)) return false;
  if (k.max && (k.max_exclusive ? v >= *k.max : v > *k.max)) return false;
  if (k.also_ok && !k.also_ok(v)) return false;
  return true;
}

}  // namespace

const char* const kAutoNote =
    " (\"auto\" is a Hugging Face Trainer placeholder: the Trainer replaces it with a number before "
    "DeepSpeed reads the config; replace it with the value you want)";

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string Quote(const std::string& s) { return "\"" + s + "\""; }

std::string ShowValue(const Json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

std::string FormatNumber(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.0f", v);
    return buf;
  }
  return Json(v).dump();
}

std::string Join(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += items[i];
  }
  return out;
}

std::string Expected(const Key& k) {
  if (!k.expected_override.empty()) return k.expected_override;
  switch (k.kind) {
    case Kind::kBool:
      return "true or false";
    case Kind::kInt:
      return "an integer" + RangeText(k);
    case Kind::kNumber:
      return "a number" + RangeText(k);
    case Kind::kString:
      if (k.choices.empty()) return "a string";
      return "one of " + ChoicesText(k.choices) + (k.case_insensitive ? " (any case)" : "");
    case Kind::kDType:
      return "one of \"fp32\", \"fp16\", \"bf16\", or null";
    case Kind::kBetas:
      return "[beta1, beta2] with each in [0, 1)";
    case Kind::kPresence:
      return "null or an object";
  }
  return "?";
}

std::string TypeName(const Key& k) {
  switch (k.kind) {
    case Kind::kBool:
      return "boolean";
    case Kind::kInt:
      return "integer";
    case Kind::kNumber:
      return "number";
    case Kind::kString:
      return "string";
    case Kind::kDType:
      return "dtype or null";
    case Kind::kBetas:
      return "[number, number]";
    case Kind::kPresence:
      return "object or null";
  }
  return "?";
}

std::string Where(const std::string& source) { return source.empty() ? "" : source + ": "; }

Status KeyError(const std::string& source, const std::string& path, const std::string& expected,
                const std::string& got) {
  return InvalidArgumentError(Where(source) + path + ": expected " + expected + ", got " + got);
}

Status ReadValue(const Key& k, const Json& v, const std::string& user_path, const std::string& source, Json* out) {
  auto fail = [&](std::string extra = "") { return KeyError(source, user_path, Expected(k), ShowValue(v) + extra); };
  if (v.is_string() && v.get<std::string>() == "auto") return fail(kAutoNote);
  if (v.is_null() && k.nullable) {
    *out = Json();
    return OkStatus();
  }
  switch (k.kind) {
    case Kind::kBool:
      if (!v.is_boolean()) return fail();
      *out = v;
      return OkStatus();
    case Kind::kInt: {
      int64_t i = 0;
      if (v.is_number_unsigned()) {
        if (v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return fail();
        i = static_cast<int64_t>(v.get<uint64_t>());
      } else if (v.is_number_integer()) {
        i = v.get<int64_t>();
      } else if (v.is_number_float()) {
        // 5e8 and 1000.0 are integers written as floats: accepted when integral.
        const double d = v.get<double>();
        if (!std::isfinite(d) || d != std::floor(d) || d < -9.2e18 || d > 9.2e18) return fail();
        i = static_cast<int64_t>(d);
      } else {
        return fail();
      }
      if (!InRange(k, static_cast<double>(i))) return fail();
      *out = i;
      return OkStatus();
    }
    case Kind::kNumber: {
      if (!v.is_number()) return fail();
      const double d = v.get<double>();
      if (!std::isfinite(d) || !InRange(k, d)) return fail();
      *out = d;
      return OkStatus();
    }
    case Kind::kString: {
      if (!v.is_string()) return fail();
      const std::string s = v.get<std::string>();
      if (k.choices.empty()) {
        *out = s;
        return OkStatus();
      }
      for (const std::string& c : k.choices) {
        if (s == c || (k.case_insensitive && Lower(s) == Lower(c))) {
          *out = c;
          return OkStatus();
        }
      }
      for (const std::string& n : k.not_implemented) {
        if (Lower(s) == Lower(n)) return fail(" (a DeepSpeed choice zero does not implement)");
      }
      return fail();
    }
    case Kind::kDType: {
      DType t;
      if (!v.is_string() || !ParseDType(v.get<std::string>(), &t)) return fail();
      *out = DTypeName(t);
      return OkStatus();
    }
    case Kind::kBetas: {
      if (!v.is_array() || v.size() != 2) return fail();
      for (const Json& b : v) {
        if (!b.is_number() || !(b.get<double>() >= 0.0 && b.get<double>() < 1.0)) return fail();
      }
      *out = Json::array({v[0].get<double>(), v[1].get<double>()});
      return OkStatus();
    }
    case Kind::kPresence:
      // Null is handled above (nullable); the block's keys are not read.
      if (!v.is_object()) return fail();
      *out = Json::object();
      return OkStatus();
  }
  return fail();
}

std::string LastComponent(const std::string& path) {
  const size_t dot = path.rfind('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}

std::string ParentOf(const std::string& path) {
  const size_t dot = path.rfind('.');
  return dot == std::string::npos ? "" : path.substr(0, dot);
}

}  // namespace config_internal

namespace {
using config_internal::Expected;
using config_internal::FormatNumber;
using config_internal::Key;
using config_internal::Keys;
using config_internal::Kind;
}  // namespace

const std::vector<ConfigKeyInfo>& ConfigKeyTable() {
  static const std::vector<ConfigKeyInfo>* table = [] {
    auto* out = new std::vector<ConfigKeyInfo>();
    for (const Key& k : Keys()) {
      ConfigKeyInfo info;
      info.path = k.path;
      info.expected = Expected(k);
      info.has_default = !k.default_value.is_null() || k.nullable;
      info.default_json = k.default_value.dump();
      info.default_depends_on_other_keys = k.default_depends;
      info.only_for = k.only_for;
      switch (k.kind) {
        case Kind::kBool:
          info.wrong_type_values = {"1", "\"true\"", "null", "[]"};
          break;
        case Kind::kInt:
          info.wrong_type_values = {"\"8\"", "true", "1.5", "null", "{}"};
          break;
        case Kind::kNumber:
          info.wrong_type_values = {"\"0.5\"", "false", "null", "[1]"};
          break;
        case Kind::kString:
          info.wrong_type_values = {"3", "true", "null", "[\"cpu\"]"};
          break;
        case Kind::kDType:
          info.wrong_type_values = {"16", "true", "{}"};
          break;
        case Kind::kBetas:
          info.wrong_type_values = {"0.9", "\"0.9,0.999\"", "null", "{}"};
          break;
        case Kind::kPresence:
          info.wrong_type_values = {"true", "1", "\"on\"", "[]"};
          break;
      }
      info.wrong_type_values.push_back("\"auto\"");
      if (k.kind == Kind::kInt) {
        // Integers as integer texts: max + 1 of a bound near 2^53 is not a distinct double.
        if (k.min && *k.min > k.type_min) {
          info.out_of_range_values.push_back(std::to_string(static_cast<int64_t>(*k.min) - 1));
        }
        if (k.max && *k.max < k.type_max) {
          info.out_of_range_values.push_back(std::to_string(static_cast<int64_t>(*k.max) + 1));
        }
      } else if (k.kind == Kind::kNumber) {
        if (k.min) {
          const double below = k.min_exclusive ? *k.min : *k.min > 0 && *k.min < 1e-6 ? *k.min / 2 : *k.min - 0.5;
          info.out_of_range_values.push_back(FormatNumber(below));
        }
        if (k.max) {
          const double above = k.max_exclusive ? *k.max : *k.max > 1e6 ? *k.max * 2 : *k.max + 0.5;
          info.out_of_range_values.push_back(FormatNumber(above));
        }
      } else if (k.kind == Kind::kString && !k.choices.empty()) {
        info.out_of_range_values = {"\"bogus\"", "\"\""};
        if (std::find(k.choices.begin(), k.choices.end(), "") != k.choices.end()) {
          info.out_of_range_values = {"\"bogus\""};
        }
      } else if (k.kind == Kind::kDType) {
        info.out_of_range_values = {"\"int8\"", "\"\""};
      } else if (k.kind == Kind::kBetas) {
        info.out_of_range_values = {"[0.9]", "[0.9,1.0]", "[-0.1,0.9]", "[0.9,0.99,0.999]"};
      }
      for (const std::string& s : k.extra_bad) info.out_of_range_values.push_back(s);
      out->push_back(std::move(info));
    }
    return out;
  }();
  return *table;
}

}  // namespace zero
