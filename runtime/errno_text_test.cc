#include "runtime/errno_text.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <string>

#include "runtime/status.h"

namespace zero {
namespace {

TEST(ErrnoTextTest, TextAndNumberAsErrnoErrorWritesThem) {
  EXPECT_EQ(ErrnoText(ENOENT), "No such file or directory");
  EXPECT_EQ(ErrnoTextAndNumber(ENOENT), "No such file or directory (errno 2)");
  EXPECT_EQ(ErrnoError("open", "/x/y", ENOENT).message(), "open /x/y: " + ErrnoTextAndNumber(ENOENT));
  EXPECT_EQ(ErrnoText(12345), "Unknown error 12345");
}

}  // namespace
}  // namespace zero
