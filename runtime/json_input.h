// JSON input with limits: the one way the engine turns untrusted JSON text (a config file, a
// checkpoint's metadata.json, the config and client state saved in it) into nlohmann values.
//
// nlohmann's own parse() is not safe on hostile input: it builds ordered objects in time quadratic
// in their number of keys (200k keys took 37 s), throws out_of_range for a number beyond double's
// range (1e400), takes the last of duplicate keys silently, and accepts any nesting, after which
// dump(), copies and error messages recurse once per level (100k levels overflow the stack).
// ParseJsonText checks the nesting with an iterative scan before anything recursive runs, then
// builds the value through the SAX interface in time linear in the text. Every error is a Status
// naming `source`, the line and column, and the key path where one applies:
//   "<source>: malformed JSON at line 3, column 7: <what nlohmann says>"
//   "<source>: JSON nested deeper than 100 levels at line 1, column 101 (...)"
//   "<source>: number 1e400 at line 2, column 9 (key 'optimizer.params.lr') is outside the range of a double ..."
//   "<source>: duplicate key 'zero_optimization.stage': JSON gives a key one value ..."
// Included only by .cc files that already use nlohmann/json (the config library, checkpoint_format.cc).
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "runtime/status.h"

namespace zero {

// Arrays and objects nested deeper than this are refused. Configs nest 4 levels, checkpoint metadata
// 2 plus the saved config and client state; 100 leaves room for any client state while keeping every
// recursive walk of the value (dump, copy, compare) far from the stack's end.
inline constexpr int kMaxJsonDepth = 100;

// Parses `text` as one JSON value of type `J` (nlohmann::json or nlohmann::ordered_json; an ordered
// object keeps the file's key order). Errors are InvalidArgument; the caller may re-code them (a
// checkpoint's metadata.json reports DATA_LOSS).
template <typename J>
Result<J> ParseJsonText(std::string_view text, const std::string& source, int max_depth = kMaxJsonDepth);

// The nesting check alone: InvalidArgument naming the line and column where `text` opens its
// (max_depth + 1)-th level of arrays/objects. Linear, iterative; strings are skipped.
Status CheckJsonNesting(std::string_view text, const std::string& source, int max_depth = kMaxJsonDepth);

// "line L, column C" of the 0-based byte `index` of `text` (columns count bytes from 1).
std::string JsonPosition(std::string_view text, size_t index);

extern template Result<nlohmann::json> ParseJsonText<nlohmann::json>(std::string_view, const std::string&, int);
extern template Result<nlohmann::ordered_json> ParseJsonText<nlohmann::ordered_json>(std::string_view,
                                                                                     const std::string&, int);

}  // namespace zero
