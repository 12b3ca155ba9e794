// Status and Result<T>: how every fallible call in zero reports failure.
//
// A Status is OK or carries a code and a message; the message names what the user must fix (the
// config key path, file, rank, and what was expected, plus errno/CUDA/NCCL text converted at the
// edge). Result<T> holds a T or a non-OK Status. Both are [[nodiscard]]. ZERO_RETURN_IF_ERROR and
// ZERO_ASSIGN_OR_RETURN propagate errors; ZERO_CHECK aborts only on a broken internal invariant
// (a bug in zero, never bad user input). This header owns no resources and is safe to use from
// any thread.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace zero {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // bad config value, bad API argument
  kNotFound,            // missing file, unknown name
  kFailedPrecondition,  // call out of order (step before backward, ...)
  kOutOfRange,
  kDataLoss,           // checksum mismatch, truncated file
  kUnavailable,        // peer rank gone, timeout
  kDeadlineExceeded,   // timed out waiting for a peer
  kResourceExhausted,  // out of memory (device, pinned, disk)
  kInternal,           // backend error (CUDA, NCCL, Gloo, libaio)
  kUnimplemented,
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: <config>: zero_optimization.stage: expected an integer in 0..3, got 7"
  std::string ToString() const;
  // Returns a copy with `prefix + ": "` put before the message (adds context while propagating).
  Status WithContext(const std::string& prefix) const;
  void IgnoreError() const {}

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status OkStatus() { return Status(); }
inline Status InvalidArgumentError(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status NotFoundError(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status FailedPreconditionError(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
inline Status OutOfRangeError(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status DataLossError(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status UnavailableError(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status DeadlineExceededError(std::string m) { return {StatusCode::kDeadlineExceeded, std::move(m)}; }
inline Status ResourceExhaustedError(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status InternalError(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status UnimplementedError(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }

// errno text for system-call failures: ErrnoError("open", path, errno) ->
// "open /x/y: No such file or directory (errno 2)".
Status ErrnoError(const std::string& what, const std::string& path, int err);

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  // Initialized in place (no assignment, which nvcc's front end flags as a discarded [[nodiscard]]).
  Result(Status status)  // NOLINT
      : status_(status.ok() ? InternalError("Result constructed from an OK status without a value")
                            : std::move(status)) {}

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

[[noreturn]] void CheckFailed(const char* file, int line, const char* cond, const std::string& msg);

}  // namespace zero

#define ZERO_STATUS_CONCAT_INNER(a, b) a##b
#define ZERO_STATUS_CONCAT(a, b) ZERO_STATUS_CONCAT_INNER(a, b)

#define ZERO_RETURN_IF_ERROR(expr)       \
  do {                                   \
    ::zero::Status _zero_st = (expr);    \
    if (!_zero_st.ok()) return _zero_st; \
  } while (0)

#define ZERO_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()

#define ZERO_ASSIGN_OR_RETURN(lhs, expr) ZERO_ASSIGN_OR_RETURN_IMPL(ZERO_STATUS_CONCAT(_zero_res_, __LINE__), lhs, expr)

// Internal invariant; aborts with file:line. Never used for user input.
#define ZERO_CHECK(cond)                                                        \
  do {                                                                          \
    if (!(cond)) ::zero::CheckFailed(__FILE__, __LINE__, #cond, std::string()); \
  } while (0)
#define ZERO_CHECK_MSG(cond, msg)                                       \
  do {                                                                  \
    if (!(cond)) ::zero::CheckFailed(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)
