#include "tools/launcher.h"

#include <gtest/gtest.h>

#include <chrono>

namespace zero {
namespace {

TEST(LauncherTest, AllRanksSucceed) {
  LaunchOptions o;
  o.nproc = 3;
  // Each rank checks that its variables are set and consistent.
  Status st = LaunchLocal({"/bin/sh", "-c",
                           "test \"$WORLD_SIZE\" = 3 && test \"$RANK\" = \"$LOCAL_RANK\" && "
                           "test -n \"$MASTER_PORT\" && test \"$MASTER_ADDR\" = 127.0.0.1"},
                          o);
  EXPECT_TRUE(st.ok()) << st.ToString();
}

TEST(LauncherTest, FailingRankStopsTheOthersAndIsNamed) {
  LaunchOptions o;
  o.nproc = 3;
  o.grace_seconds = 1;
  auto t0 = std::chrono::steady_clock::now();
  // Rank 1 fails at once; the others would sleep for a minute.
  Status st = LaunchLocal({"/bin/sh", "-c", "if [ \"$RANK\" = 1 ]; then exit 7; fi; sleep 60"}, o);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("rank 1 of 3"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("exit status 7"), std::string::npos) << st.message();
  EXPECT_LT(secs, 30.0);
}

TEST(LauncherTest, MissingProgramIsReported) {
  LaunchOptions o;
  o.nproc = 2;
  Status st = LaunchLocal({"/nonexistent/program"}, o);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("exit status 127"), std::string::npos) << st.message();
}

TEST(LauncherTest, BadNproc) {
  LaunchOptions o;
  o.nproc = 0;
  EXPECT_FALSE(LaunchLocal({"/bin/true"}, o).ok());
}

}  // namespace
}  // namespace zero
