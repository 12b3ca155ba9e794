// gtest assertions on Status and Result<T> (runtime/status.h) that print the status on failure:
//
//   ASSERT_OK(engine->Step());                      // fatal; "engine->Step() is not OK: INTERNAL: ..."
//   EXPECT_OK(file.status()) << "rank " << r;       // non-fatal; more context may be streamed
//   ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(...));  // declares or assigns `lhs`
//
// ASSERT_OK and EXPECT_OK take a Status or a Result<T> and evaluate it once. ASSERT_OK_AND_ASSIGN
// expands to several statements (not usable as the body of an unbraced if) and, like every ASSERT_*,
// only in a function returning void. Test-only.
#pragma once

#include <gtest/gtest.h>

#include <utility>

#include "runtime/status.h"

namespace zero::testing::internal {

inline const Status& StatusOf(const Status& s) { return s; }
template <typename T>
const Status& StatusOf(const Result<T>& r) {
  return r.status();
}

}  // namespace zero::testing::internal

// switch (0) case 0: default: keeps a dangling `else` after the macro from binding to our `if`
// (gtest's own GTEST_AMBIGUOUS_ELSE_BLOCKER_).
#define ZERO_TESTING_EXPECT_OK_IMPL(expr, fail)                                                  \
  switch (0)                                                                                     \
  case 0:                                                                                        \
  default:                                                                                       \
    if (const ::zero::Status zero_testing_status = ::zero::testing::internal::StatusOf(expr);  \
        zero_testing_status.ok()) {                                                              \
    } else                                                                                       \
      fail() << #expr << " is not OK: " << zero_testing_status.ToString()

#define ASSERT_OK(expr) ZERO_TESTING_EXPECT_OK_IMPL(expr, FAIL)
#define EXPECT_OK(expr) ZERO_TESTING_EXPECT_OK_IMPL(expr, ADD_FAILURE)

#define ZERO_TESTING_ASSIGN_OK_IMPL(tmp, lhs, expr)                                    \
  auto tmp = (expr);                                                                   \
  if (!tmp.ok()) FAIL() << #expr << " is not OK: " << tmp.status().ToString();       \
  lhs = std::move(tmp).value()

#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  ZERO_TESTING_ASSIGN_OK_IMPL(ZERO_STATUS_CONCAT(zero_testing_result_, __LINE__), lhs, expr)
