// The training jobs' data files (zero_llm's and zero_train's --data, zero_llm's --tokenizer): what a
// data path must be, checked once at start (before any rank works), and the whole-file read the
// loaders use. A data path must name a regular file (a symbolic link to one is followed): a named
// pipe would block the reader forever, a character device such as /dev/zero never ends, and a
// directory reads as empty. Stateless; thread-safe.
#pragma once

#include <string>

#include "runtime/status.h"

namespace zero::data {

// OK when `path` names a regular file. Otherwise an error naming `flag`, the path and what it is:
// NOT_FOUND "--data PATH: no such file; expected EXPECTED", INVALID_ARGUMENT "--data PATH: not a
// regular file (it is a named pipe); expected EXPECTED" (EXPECTED: what the flag takes, e.g. "a
// text file or a .bin file of token ids").
Status CheckDataFile(const std::string& flag, const std::string& path, const std::string& expected);

// The whole of a regular file, checked as CheckDataFile checks it, on the opened descriptor (opened
// without blocking, so a named pipe put there since is refused, not waited on). Errors name `flag`
// and the path.
Result<std::string> ReadDataFile(const std::string& flag, const std::string& path, const std::string& expected);

}  // namespace zero::data
