#include "engine/checkpoint/io.h"

#include <dirent.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "engine/checkpoint/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/crc32c.h"
#include "runtime/faulty_file_system.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

using ::testing::HasSubstr;
using zero::testing::InChild;
using zero::testing::ScratchDir;

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (!d) return names;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

void WritePlain(const std::string& path, const std::string& data) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << data;
}

TEST(CheckpointIoTest, NonRegularFilesAreRefusedWithoutBlocking) {
  // A named pipe in place of a checkpoint file used to block open() forever.
  const std::string dir = ScratchDir("nonregular");
  const std::string fifo = dir + "/pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string refused = fifo +
                              ": not a regular file (it is a named pipe); checkpoint files are read only "
                              "from regular files";
  EXPECT_EQ(InChild([&] { return ReadFile(fifo).status().message(); }, 5), refused);
  EXPECT_EQ(InChild([&] { return ReadFileRange(fifo, 0, 48).status().message(); }, 5), refused);
  EXPECT_EQ(InChild([&] { return ReadFileVerified(fifo, 0, 0).status().message(); }, 5), refused);
  EXPECT_EQ(InChild([&] { return FileSize(fifo).status().message(); }, 5), refused);
  EXPECT_EQ(InChild([&] { return ReadFile(fifo).status().ToString(); }, 5), "FAILED_PRECONDITION: " + refused);
  // A directory: no longer "read: Is a directory".
  EXPECT_EQ(ReadFile(dir).status().message(),
            dir + ": not a regular file (it is a directory); checkpoint files are read only from regular files");
  EXPECT_EQ(FileSize(dir).status().code(), StatusCode::kFailedPrecondition);
  // Regular files still read.
  WritePlain(dir + "/f", "abc");
  EXPECT_EQ(*ReadFile(dir + "/f"), "abc");
  EXPECT_EQ(*ReadFileRange(dir + "/f", 1, 2), "bc");
  EXPECT_EQ(*FileSize(dir + "/f"), 3u);
}

TEST(DirectoryLockTest, SharedInAProcessRefusedToAnotherNamingIt) {
  const std::string dir = ScratchDir("lock") + "/ckpt";  // created by Acquire
  {
    auto a = DirectoryLock::Acquire(dir);
    auto b = DirectoryLock::Acquire(dir);  // thread ranks, a job's lock and its save's: one lock
    ASSERT_OK(a);
    ASSERT_OK(b);
  }
  testing::ChildHoldingLock other;
  ASSERT_NO_FATAL_FAILURE(other.Start(dir));
  auto refused = DirectoryLock::Acquire(dir);
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("checkpoint directory " + dir + " is in use by another job (pid " +
                                                    std::to_string(other.pid) + " on host "));
  EXPECT_THAT(refused.status().message(), HasSubstr(" holds " + dir + "/.zero_lock)"));
  ASSERT_NO_FATAL_FAILURE(other.Release());
  EXPECT_OK(DirectoryLock::Acquire(dir));
}

TEST(DirectoryLockTest, WritableDirectoryCheck) {
  const std::string dir = ScratchDir("writable");
  EXPECT_OK(CheckWritableDirectory(dir + "/new/sub"));
  EXPECT_TRUE(PathExists(dir + "/new/sub"));
  WritePlain(dir + "/file", "x");
  const Status st = CheckWritableDirectory(dir + "/file/sub");
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr(dir + "/file")) << st.ToString();
}

TEST(DirectoryLockTest, GoesThroughTheFileSystem) {
  const std::string dir = ScratchDir("lock_fs") + "/ckpt";
  FaultyFileSystem faulty;
  faulty.FailNthCall("LockFile", 1, EWOULDBLOCK);  // as another job holding it
  auto refused = DirectoryLock::Acquire(dir, &faulty);
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("checkpoint directory " + dir + " is in use by another job (another process holds " + dir +
                        "/.zero_lock): two jobs saving"));
  faulty.FailNthCall("LockFile", 2, EIO);
  auto failed = DirectoryLock::Acquire(dir, &faulty);
  EXPECT_THAT(failed.status().message(), HasSubstr("flock " + dir + "/.zero_lock: "));
  {
    auto lock = DirectoryLock::Acquire(dir, &faulty);
    ASSERT_OK(lock);
    EXPECT_THAT(*ReadFile(dir + "/.zero_lock"), HasSubstr("pid " + std::to_string(::getpid()) + " on host "));
    EXPECT_EQ(faulty.call_count("UnlockFile"), 0);
  }
  EXPECT_EQ(faulty.call_count("UnlockFile"), 1);  // the last holder released it through the FileSystem
  EXPECT_EQ(faulty.call_count("LockFile"), 3);
}

TEST(DirectoryLockTest, WritableDirectoryCheckGoesThroughTheFileSystem) {
  const std::string dir = ScratchDir("writable_fs");
  FaultyFileSystem faulty;
  faulty.FailNthCall("CreateFile", 1, EROFS);
  const Status st = CheckWritableDirectory(dir, &faulty);
  EXPECT_THAT(st.message(), HasSubstr("create a file in the checkpoint directory " + dir + ": ")) << st.ToString();
  faulty.FailNthCall("RemoveFile", 1, EIO);
  const Status removed = CheckWritableDirectory(dir, &faulty);
  EXPECT_THAT(removed.message(), HasSubstr("remove " + dir + "/.zero_write_check.")) << removed.ToString();
  EXPECT_OK(faulty.inner()->RemoveFile(dir + "/.zero_write_check." + std::to_string(::getpid())));
  EXPECT_OK(CheckWritableDirectory(dir, &faulty));
  EXPECT_EQ(ListDir(dir), std::vector<std::string>{});
}

TEST(AtomicFileTest, WriteReadOverwriteLeavesNoTemporaries) {
  const std::string dir = ScratchDir("atomic");
  const std::string path = dir + "/f.bin";
  ASSERT_OK(WriteFileAtomic(path, "first"));
  EXPECT_EQ(*ReadFile(path), "first");
  ASSERT_OK(WriteFileAtomic(path, "second, longer"));
  EXPECT_EQ(*ReadFile(path), "second, longer");
  EXPECT_EQ(ListDir(dir), std::vector<std::string>{"f.bin"});
  EXPECT_EQ(*FileSize(path), 14u);
}

TEST(AtomicFileTest, StreamedChunksSmallAndLargeKeepSizeAndCrc) {
  const std::string dir = ScratchDir("atomic");
  const std::string path = dir + "/big.bin";
  std::string expected;
  auto w = AtomicFileWriter::Open(path);
  ASSERT_OK(w);
  std::mt19937 gen(3);
  for (size_t chunk : {size_t{5}, size_t{3} << 20, size_t{100}, size_t{1} << 20, size_t{1}}) {
    std::string c(chunk, '\0');
    for (char& ch : c) ch = static_cast<char>(gen());
    ASSERT_OK(w->Append(c));
    expected += c;
  }
  EXPECT_FALSE(PathExists(path));  // nothing under the final name before Commit
  EXPECT_TRUE(PathExists(w->temp_path()));
  EXPECT_THAT(w->temp_path(), HasSubstr("/big.bin.tmp." + std::to_string(getpid()) + "."));
  ASSERT_OK(w->Commit());
  EXPECT_EQ(w->size(), expected.size());
  EXPECT_EQ(w->crc(), Crc32c(expected.data(), expected.size()));
  auto got = ReadFileVerified(path, expected.size(), w->crc());
  ASSERT_OK(got);
  EXPECT_TRUE(*got == expected);
  EXPECT_EQ(ListDir(dir), std::vector<std::string>{"big.bin"});
}

TEST(AtomicFileTest, CrashBeforeCommitKeepsPreviousContents) {
  const std::string dir = ScratchDir("atomic");
  const std::string path = dir + "/state";
  ASSERT_OK(WriteFileAtomic(path, "old complete contents"));
  {
    auto w = AtomicFileWriter::Open(path);
    ASSERT_OK(w);
    ASSERT_OK(w->Append("new half-writ"));
    w->AbandonForTest();  // the process "dies" here
  }
  EXPECT_EQ(*ReadFile(path), "old complete contents");
  EXPECT_EQ(ListDir(dir).size(), 2u);  // the debris .tmp file stays until someone removes it
  {
    auto w = AtomicFileWriter::Open(path);
    ASSERT_OK(w);
    ASSERT_OK(w->Append("dropped"));
  }  // destroyed without Commit: the temporary is removed
  EXPECT_EQ(*ReadFile(path), "old complete contents");
  EXPECT_EQ(ListDir(dir).size(), 2u);
}

TEST(AtomicFileTest, VerifiedReadNamesFileAndProblem) {
  const std::string dir = ScratchDir("verify");
  const std::string path = dir + "/x.bin";
  const std::string data = "0123456789abcdef";
  ASSERT_OK(WriteFileAtomic(path, data));
  const uint32_t crc = Crc32c(data.data(), data.size());
  ASSERT_OK(ReadFileVerified(path, data.size(), crc));

  auto missing = ReadFileVerified(dir + "/nope.bin", 3, 0);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr(dir + "/nope.bin"));

  WritePlain(path, data.substr(0, 10));
  auto truncated = ReadFileVerified(path, data.size(), crc);
  EXPECT_EQ(truncated.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(truncated.status().message(), HasSubstr(path + ": truncated: expected 16 bytes, got 10"));

  std::string flipped = data;
  flipped[5] ^= 0x01;
  WritePlain(path, flipped);
  auto corrupt = ReadFileVerified(path, data.size(), crc);
  EXPECT_EQ(corrupt.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(corrupt.status().message(), HasSubstr(path + ": checksum mismatch: expected crc32c " + Crc32cHex(crc) +
                                                    ", got " + Crc32cHex(Crc32c(flipped.data(), flipped.size()))));

  WritePlain(path, data + "x");
  EXPECT_THAT(ReadFileVerified(path, data.size(), crc).status().message(), HasSubstr("longer than expected"));

  auto range = ReadFileRange(path, 10, 20);
  EXPECT_EQ(range.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(range.status().message(), HasSubstr("truncated: expected 30 bytes, got 17"));
  EXPECT_EQ(*ReadFileRange(path, 2, 3), "234");
}

TEST(DirectoryTest, CreateNestedIdempotentAndRefusesFiles) {
  const std::string dir = ScratchDir("dirs");
  ASSERT_OK(CreateDirectories(dir + "/a/b/c/"));
  ASSERT_OK(CreateDirectories(dir + "/a/b/c"));
  EXPECT_TRUE(PathExists(dir + "/a/b/c"));
  ASSERT_OK(WriteFileAtomic(dir + "/file", "x"));
  Status st = CreateDirectories(dir + "/file");
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("not a directory"));
  EXPECT_EQ(JoinPath("a/", "b"), "a/b");
  EXPECT_EQ(JoinPath("a", "b"), "a/b");
}

TEST(AtomicFileTest, OpenInMissingDirectoryNamesIt) {
  auto w = AtomicFileWriter::Open("/nonexistent-zero-dir/f");
  EXPECT_FALSE(w.ok());
  EXPECT_THAT(w.status().message(), HasSubstr("/nonexistent-zero-dir/f.tmp."));
}

}  // namespace
}  // namespace zero
