#include "runtime/status.h"

#include <cstring>

namespace zero {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case StatusCode::kNotFound:
      return "NOT_FOUND";
    case StatusCode::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case StatusCode::kOutOfRange:
      return "OUT_OF_RANGE";
    case StatusCode::kDataLoss:
      return "DATA_LOSS";
    case StatusCode::kUnavailable:
      return "UNAVAILABLE";
    case StatusCode::kDeadlineExceeded:
      return "DEADLINE_EXCEEDED";
    case StatusCode::kResourceExhausted:
      return "RESOURCE_EXHAUSTED";
    case StatusCode::kInternal:
      return "INTERNAL";
    case StatusCode::kUnimplemented:
      return "UNIMPLEMENTED";
  }
  return "UNKNOWN";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(code_)) + ": " + message_;
}

Status Status::WithContext(const std::string& prefix) const {
  if (ok()) return *this;
  return Status(code_, prefix + ": " + message_);
}

Status ErrnoError(const std::string& what, const std::string& path, int err) {
  char buf[256];
  const char* text = strerror_r(err, buf, sizeof(buf));
  std::string msg = what + " " + path + ": " + text + " (errno " + std::to_string(err) + ")";
  StatusCode code = StatusCode::kInternal;
  if (err == ENOENT) code = StatusCode::kNotFound;
  if (err == ENOSPC || err == ENOMEM) code = StatusCode::kResourceExhausted;
  if (err == EINVAL) code = StatusCode::kInvalidArgument;
  return Status(code, msg);
}

void CheckFailed(const char* file, int line, const char* cond, const std::string& msg) {
  std::fprintf(stderr, "zero: internal invariant broken at %s:%d: %s %s\n", file, line, cond, msg.c_str());
  std::abort();
}

}  // namespace zero
