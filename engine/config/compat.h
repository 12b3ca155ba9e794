// The config's DeepSpeed compatibility, private to //engine/config:config: the other spellings of keys and
// blocks (aliases, mapped onto the canonical key with a warning), the deprecated booleans that map
// onto the offload blocks, the DeepSpeed keys read and ignored with a warning, the blocks DeepSpeed
// validates strictly, and the list of where
// zero's defaults differ from DeepSpeed 0.19.8's (DeepSpeedDifferences, config_keys.h). Tables only:
// config.cc's parser applies them and config_reference.cc lists them; the keys themselves are in
// config_key_table.h.
#pragma once

#include <span>
#include <string>

namespace zero::config_internal {

struct Alias {
  const char* path;
  const char* canonical;
  const char* note;
};
// Other spellings of keys and blocks. Each maps to its canonical path with a warning.
std::span<const Alias> Aliases();
const Alias* FindAlias(const std::string& path);  // nullptr when `path` is no alias

struct Deprecated {
  const char* path;
  const char* doc;
};
// Deprecated booleans that map onto the offload blocks (applied by config.cc's ApplyDeprecatedOffload).
std::span<const Deprecated> DeprecatedKeys();

struct Ignored {
  const char* path;
  const char* why;
};
// DeepSpeed keys and blocks zero knows and does not act on: a warning, never an error.
std::span<const Ignored> IgnoredKeys();

// The blocks DeepSpeed 0.19.8 reads into pydantic models that forbid extra keys (canonical paths):
// an unknown key directly inside one is an error unless ParseOptions says otherwise.
std::span<const char* const> ValidatedBlocks();
bool IsValidatedBlock(const std::string& path);

}  // namespace zero::config_internal
