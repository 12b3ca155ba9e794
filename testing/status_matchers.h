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

// A predicate-formatter for gtest's {ASSERT,EXPECT}_PRED_FORMAT1: "<expr> is not OK: <status>".
template <typename T>
::testing::AssertionResult IsOk(const char* expr_text, const T& status_or_result) {
  const Status& st = StatusOf(status_or_result);
  if (st.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << expr_text << " is not OK: " << st.ToString();
}

}  // namespace zero::testing::internal

// Built on gtest's own macros: the same evaluation, streaming and dangling-else protection as
// ASSERT_TRUE.
#define ASSERT_OK(expr) ASSERT_PRED_FORMAT1(::zero::testing::internal::IsOk, expr)
#define EXPECT_OK(expr) EXPECT_PRED_FORMAT1(::zero::testing::internal::IsOk, expr)

#define ZERO_TESTING_ASSIGN_OK_IMPL(tmp, lhs, expr)                            \
  auto tmp = (expr);                                                           \
  if (!tmp.ok()) FAIL() << #expr << " is not OK: " << tmp.status().ToString(); \
  lhs = std::move(tmp).value()

#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  ZERO_TESTING_ASSIGN_OK_IMPL(ZERO_STATUS_CONCAT(zero_testing_result_, __LINE__), lhs, expr)
