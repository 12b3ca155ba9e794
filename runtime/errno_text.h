// ErrnoText: the text of a system call's errno for error messages, the one place that calls
// strerror_r (the GNU form, thread-safe, unlike strerror). ErrnoError (status.h) builds a whole
// Status from it; these are for messages that say more than "what path: text". Pure functions,
// safe from any thread; the code a message's Status carries is the caller's choice.
#pragma once

#include <string>

namespace zero {

// "Connection refused".
std::string ErrnoText(int err);

// "Connection refused (errno 111)", the form ErrnoError writes.
std::string ErrnoTextAndNumber(int err);

}  // namespace zero
