// The rules a Config must satisfy, private to //engine/config:config (the public entry is Validate, in
// config.h): the rules between keys and what is read but not built, each written once with the
// sentence docs/config.md shows for it, and CheckConfig, which runs them after every key's own check
// (config_key_table.h). ParseConfig runs CheckConfig on what it read and resolved, passing the keys it
// already refused so that no problem is reported twice; Validate runs it on a Config as it is. The
// batch arithmetic is not here: ParseConfig derives the sizes for its world size (config.cc), and the
// engine reads only gradient_accumulation_steps.
#pragma once

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "engine/config/config.h"
#include "runtime/status.h"

namespace zero::config_internal {

// Cross-key rules: each documented once and checked after all keys are read, unless one of the keys
// it reads had a problem of its own. An `unbuilt` rule refuses what a DeepSpeed file may ask for but
// the engine does not build (UNIMPLEMENTED): Engine::Create checks it, ParseConfig does not.
struct Rule {
  const char* doc;
  std::vector<std::string> reads;  // canonical paths the check reads
  std::function<Status(const Config&, const std::string& source, int world_size)> check;
  bool unbuilt = false;
};
// In the order they are checked and listed in docs/config.md.
const std::vector<Rule>& Rules();

// Whether `path`, or a block above it, is in `bad`.
bool IsBad(const std::set<std::string>& bad, const std::string& path);
bool AnyBad(const std::set<std::string>& bad, const std::vector<std::string>& paths);

// Appends every problem of `c` to *problems: each key's own check (keys of another scheduler type
// skipped), then the rules (the unbuilt ones only with options.refuse_unbuilt). A key or rule that
// reads a path in *bad, or under a bad block, is skipped; a key failing its check is added to *bad.
void CheckConfig(const Config& c, const ValidateOptions& options, std::set<std::string>* bad,
                 std::vector<Status>* problems);

}  // namespace zero::config_internal
