#include "tools/launcher.h"

#include <gtest/gtest.h>

#include <stdlib.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>

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

// Every rank of one job gets the same fresh 64-hex-digit secret; the next job gets another.
TEST(LauncherTest, RanksShareAFreshJobSecret) {
  unsetenv("ZERO_JOB_SECRET");
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = tmp != nullptr ? tmp : "/tmp";
  LaunchOptions o;
  o.nproc = 3;
  for (int job = 0; job < 2; ++job) {
    const std::string out = dir + "/secret_job" + std::to_string(job) + "_";
    Status st = LaunchLocal({"/bin/sh", "-c",
                             "printf %s \"$ZERO_JOB_SECRET\" > " + out + "$RANK && "
                             "printf %s \"$ZERO_JOB_SECRET\" | grep -qxE '[0-9a-f]{64}'"},
                            o);
    ASSERT_TRUE(st.ok()) << "job " << job << ": " << st.ToString();
  }
  auto read = [&](int job, int rank) {
    std::ifstream in(dir + "/secret_job" + std::to_string(job) + "_" + std::to_string(rank));
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  const std::string s0 = read(0, 0);
  EXPECT_EQ(s0.size(), 64u) << s0;
  EXPECT_EQ(read(0, 1), s0);
  EXPECT_EQ(read(0, 2), s0);
  EXPECT_EQ(read(1, 1), read(1, 0));
  EXPECT_NE(read(1, 0), s0) << "two jobs got the same secret";
  // A secret set around the launcher (a multi-host job sharing one) is passed on unchanged.
  setenv("ZERO_JOB_SECRET", "shared-secret-of-a-multi-host-job", 1);
  Status st = LaunchLocal({"/bin/sh", "-c", "test \"$ZERO_JOB_SECRET\" = shared-secret-of-a-multi-host-job"}, o);
  unsetenv("ZERO_JOB_SECRET");
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
