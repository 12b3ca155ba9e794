#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "runtime/status.h"
#include "testing/deferred_device.h"
#include "testing/free_port.h"
#include "testing/same_bits.h"
#include "testing/scratch_dir.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

using ::zero::testing::SameBits;

Status Fails() { return DataLossError("checksum mismatch in shard 3"); }
Result<int> FailsWithResult() { return NotFoundError("no such tag: step_7"); }
Result<int> Seven() { return 7; }

void AssertOkOnError() { ASSERT_OK(Fails()) << "while saving"; }
void AssertOkAndAssignOnError() {
  ASSERT_OK_AND_ASSIGN(int v, FailsWithResult());
  (void)v;
}

TEST(StatusMatchersTest, PassOnOk) {
  ASSERT_OK(OkStatus());
  EXPECT_OK(OkStatus());
  ASSERT_OK(Seven());
  EXPECT_OK(Seven()) << "not printed";
  ASSERT_OK_AND_ASSIGN(int v, Seven());
  EXPECT_EQ(v, 7);
  ASSERT_OK_AND_ASSIGN(v, Seven());  // assigns an existing variable
  EXPECT_EQ(v, 7);
}

TEST(StatusMatchersTest, FailuresPrintTheExpressionAndTheStatus) {
  EXPECT_FATAL_FAILURE(AssertOkOnError(), "Fails() is not OK: DATA_LOSS: checksum mismatch in shard 3\nwhile saving");
  EXPECT_NONFATAL_FAILURE(EXPECT_OK(FailsWithResult()), "FailsWithResult() is not OK: NOT_FOUND: no such tag: step_7");
  EXPECT_FATAL_FAILURE(AssertOkAndAssignOnError(), "FailsWithResult() is not OK: NOT_FOUND");
}

TEST(StatusMatchersTest, EvaluatesOnceAndBindsNoDanglingElse) {
  int calls = 0;
  auto counted = [&calls] {
    ++calls;
    return OkStatus();
  };
  if (calls == 0)
    EXPECT_OK(counted());
  else
    ADD_FAILURE() << "the else bound to the macro's if";
  EXPECT_EQ(calls, 1);
}

TEST(SameBitsTest, NamesTheFirstDifferenceAndBothValues) {
  const std::vector<float> a = {1.0f, 0.1f, 2.0f};
  std::vector<float> b = a;
  EXPECT_TRUE(SameBits(a, b));
  b[1] = std::nextafter(0.1f, 1.0f);
  b[2] = 3.0f;
  ::testing::AssertionResult r = SameBits(a, b);
  EXPECT_FALSE(r);
  EXPECT_EQ(std::string(r.message()), "element 1 of 3: 0.100000001 (0x3dcccccd) vs 0.100000009 (0x3dccccce)");
  EXPECT_EQ(std::string(SameBits(a, std::vector<float>(2)).message()), "sizes differ: 3 vs 2");
}

TEST(SameBitsTest, ComparesBitsNotValues) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(SameBits(std::vector<float>{nan}, std::vector<float>{nan}));
  EXPECT_FALSE(SameBits(std::vector<float>{0.0f}, std::vector<float>{-0.0f}));
  EXPECT_FALSE(SameBits(std::vector<double>{1.0}, std::vector<double>{1.0 + 1e-16 * 2}));
  const std::vector<uint16_t> h = {0x3c00, 0x4000};
  EXPECT_EQ(std::string(SameBits(h.data(), std::vector<uint16_t>{0x3c00, 0x4001}.data(), 2).message()),
            "element 1 of 2: 16384 (0x4000) vs 16385 (0x4001)");
}

TEST(SameBitsTest, PiecesNameThePiece) {
  const std::vector<std::vector<float>> a = {{1.0f}, {2.0f, 3.0f}};
  std::vector<std::vector<float>> b = a;
  EXPECT_TRUE(SameBits(a, b));
  b[1][1] = 4.0f;
  EXPECT_EQ(std::string(SameBits(a, b).message()), "piece 1: element 1 of 2: 3 (0x40400000) vs 4 (0x40800000)");
}

TEST(ScratchDirTest, FreshUniqueAndRemovedByTheOwner) {
  std::string first;
  {
    ASSERT_OK_AND_ASSIGN(ScratchDir a, ScratchDir::Create("scratch_test"));
    ASSERT_OK_AND_ASSIGN(ScratchDir b, ScratchDir::Create("scratch_test"));
    EXPECT_NE(a.path(), b.path());
    EXPECT_TRUE(std::filesystem::is_directory(a.path()));
    EXPECT_TRUE(std::filesystem::is_empty(a.path()));
    const char* tmp = std::getenv("TEST_TMPDIR");
    EXPECT_EQ(a.path().rfind(std::string(tmp != nullptr ? tmp : "/tmp") + "/scratch_test.", 0), 0u) << a.path();
    std::ofstream(a.File("x")) << "data";
    std::filesystem::create_directories(a.File("sub/dir"));
    first = a.path();
    ScratchDir moved = std::move(a);
    EXPECT_EQ(moved.path(), first);
  }
  EXPECT_FALSE(std::filesystem::exists(first));
}

TEST(ScratchDirTest, KeepLeavesItOnDisk) {
  std::string path;
  {
    ASSERT_OK_AND_ASSIGN(ScratchDir d, ScratchDir::Create("scratch_keep"));
    d.Keep();
    path = d.path();
  }
  EXPECT_TRUE(std::filesystem::is_directory(path));
  std::filesystem::remove_all(path);
}

TEST(ScratchDirTest, DirectIoDirectoryAcceptsODirect) {
  Result<ScratchDir> d = ScratchDir::CreateWithDirectIo("scratch_direct");
  if (!d.ok()) GTEST_SKIP() << d.status().ToString();
  EXPECT_TRUE(std::filesystem::is_directory(d->path()));
}

TEST(FreeLoopbackPortTest, GivesAPortThatCanBeBound) {
  const int port = zero::testing::FreeLoopbackPort();
  ASSERT_GT(port, 0);
  ASSERT_LT(port, 65536);
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << "port " << port;
  close(fd);
}

TEST(DeferredDeviceTest, RunsQueuedWorkOnlyWhenSynchronized) {
  testing::DeferredDevice device(/*seed=*/1);
  ASSERT_OK_AND_ASSIGN(DeviceBuffer buf, device.Allocate(4 * sizeof(float)));
  ASSERT_OK(device.Fill(buf.data(), DType::kF32, 4, 2.5f, nullptr));
  EXPECT_FALSE(device.idle());
  ASSERT_OK(device.Synchronize());
  EXPECT_TRUE(device.idle());
  std::vector<float> host(4);
  ASSERT_OK(device.Copy(host.data(), buf.data(), 4 * sizeof(float), CopyKind::kDeviceToHost, nullptr));
  ASSERT_OK(device.Synchronize());
  EXPECT_TRUE(SameBits(host, std::vector<float>(4, 2.5f)));
}

}  // namespace
}  // namespace zero
