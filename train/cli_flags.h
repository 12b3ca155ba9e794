// A command line's flag table for an options struct: "--name value" and "--name=value", '_' and '-'
// alike, switches without a value, integer and number ranges checked, an unknown flag answered with
// the nearest known one. Errors name the flag, what was expected and what was given, and point at
// `<program> --help`. Owns nothing but the table; pure, thread-compatible.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "engine/config/config.h"  // EditDistance
#include "runtime/status.h"

namespace zero::examples {

template <typename Options>
class FlagSet {
 public:
  using Setter = std::function<Status(const std::string& value, Options* o)>;
  struct Flag {
    std::string name;
    std::string arg;  // empty: a switch without a value
    std::string doc;
    Setter set;
  };

  explicit FlagSet(std::string program) : program_(std::move(program)) {}

  FlagSet& Switch(const std::string& name, bool Options::*field, const std::string& doc) {
    flags_.push_back({name, "", doc, [field](const std::string&, Options* o) {
                        o->*field = true;
                        return OkStatus();
                      }});
    return *this;
  }
  FlagSet& String(const std::string& name, const std::string& arg, std::string Options::*field,
                  const std::string& doc) {
    flags_.push_back({name, arg, doc, [field](const std::string& v, Options* o) {
                        o->*field = v;
                        return OkStatus();
                      }});
    return *this;
  }
  template <typename T>
  FlagSet& Int(const std::string& name, const std::string& arg, T Options::*field, int64_t lo, int64_t hi,
               const std::string& doc) {
    flags_.push_back({name, arg, doc, [prog = program_, name, field, lo, hi](const std::string& v, Options* o) {
                        errno = 0;
                        char* end = nullptr;
                        const long long x = std::strtoll(v.c_str(), &end, 10);
                        if (v.empty() || *end != '\0' || errno != 0 || x < lo || x > hi) {
                          return Error(prog, name,
                                       "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]", v);
                        }
                        o->*field = static_cast<T>(x);
                        return OkStatus();
                      }});
    return *this;
  }
  FlagSet& Double(const std::string& name, const std::string& arg, double Options::*field, double lo, double hi,
                  const std::string& doc) {
    flags_.push_back({name, arg, doc, [prog = program_, name, field, lo, hi](const std::string& v, Options* o) {
                        errno = 0;
                        char* end = nullptr;
                        const double x = std::strtod(v.c_str(), &end);
                        if (v.empty() || *end != '\0' || errno != 0 || !std::isfinite(x) || x < lo || x > hi) {
                          std::ostringstream e;
                          e << "a number in [" << lo << ", " << hi << "]";
                          return Error(prog, name, e.str(), v);
                        }
                        o->*field = x;
                        return OkStatus();
                      }});
    return *this;
  }
  FlagSet& Choice(const std::string& name, std::string Options::*field, const std::vector<std::string>& choices,
                  const std::string& doc) {
    std::string arg;
    for (const std::string& c : choices) arg += (arg.empty() ? "" : "|") + c;
    flags_.push_back({name, arg, doc, [prog = program_, name, field, choices, arg](const std::string& v, Options* o) {
                        if (std::find(choices.begin(), choices.end(), v) == choices.end())
                          return Error(prog, name, arg, v);
                        o->*field = v;
                        return OkStatus();
                      }});
    return *this;
  }
  FlagSet& Custom(const std::string& name, const std::string& arg, Setter set, const std::string& doc) {
    flags_.push_back({name, arg, doc, std::move(set)});
    return *this;
  }

  // Applies args (argv without the program name) to *o in order.
  Status Parse(const std::vector<std::string>& args, Options* o) const {
    for (size_t i = 0; i < args.size(); ++i) {
      const std::string& a = args[i];
      if (a.rfind("--", 0) != 0 || a.size() == 2) {
        return InvalidArgumentError("unexpected argument '" + a + "': flags look like --name value (" + program_ +
                                    " --help)");
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
      std::string best;
      size_t best_d = 3;
      for (const Flag& f : flags_) {
        if (f.name == name) flag = &f;
        const size_t d = EditDistance(name, f.name);
        if (d < best_d) {
          best_d = d;
          best = f.name;
        }
      }
      if (flag == nullptr) {
        return InvalidArgumentError("unknown flag --" + name + (best.empty() ? "" : " (did you mean --" + best + "?)") +
                                    "; " + program_ + " --help lists the flags");
      }
      if (flag->arg.empty()) {
        if (has_value) return InvalidArgumentError("--" + name + " takes no value, got '" + value + "'");
      } else if (!has_value) {
        if (i + 1 >= args.size()) return InvalidArgumentError("--" + name + " needs a value (" + flag->arg + ")");
        value = args[++i];
      }
      ZERO_RETURN_IF_ERROR(flag->set(value, o));
    }
    return OkStatus();
  }

  // One line per flag: "  --name ARG   doc".
  std::string Help() const {
    std::ostringstream s;
    for (const Flag& f : flags_) {
      std::string head = "  --" + f.name + (f.arg.empty() ? "" : " " + f.arg);
      if (head.size() < 28) head.resize(28, ' ');
      s << head << " " << f.doc << "\n";
    }
    return s.str();
  }

 private:
  static Status Error(const std::string& program, const std::string& flag, const std::string& expected,
                      const std::string& got) {
    return InvalidArgumentError("--" + flag + ": expected " + expected + ", got '" + got + "' (" + program +
                                " --help lists the flags)");
  }

  std::string program_;
  std::vector<Flag> flags_;
};

}  // namespace zero::examples
