// The POSIX FileSystem, the helpers and the atomic write built on it, and FaultyFileSystem, on real
// files in a scratch directory.
#include "runtime/file_system.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/atomic_file.h"
#include "runtime/crc32c.h"
#include "runtime/faulty_file_system.h"
#include "testing/scratch_dir.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

using ::testing::ElementsAre;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::StartsWith;

class FileSystemTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(ScratchDir dir, ScratchDir::Create("file_system"));
    dir_.emplace(std::move(dir));
  }
  std::string File(const std::string& name) const { return dir_->File(name); }
  const std::string& Dir() const { return dir_->path(); }
  void Write(const std::string& name, const std::string& contents) {
    ASSERT_OK_AND_ASSIGN(auto f, fs_.CreateFile(File(name), 0644, nullptr));
    ASSERT_OK(f->Append(contents.data(), contents.size()));
    ASSERT_OK(f->Close());
  }

  FileSystem& fs_ = *DefaultFileSystem();
  std::optional<ScratchDir> dir_;
};

TEST_F(FileSystemTest, CreateIsExclusiveAndReportsTheErrno) {
  int err = -1;
  ASSERT_OK_AND_ASSIGN(auto f, fs_.CreateFile(File("a"), 0600, &err));
  EXPECT_EQ(err, 0);
  EXPECT_EQ(f->path(), File("a"));
  ASSERT_OK(f->Append("hello", 5));
  ASSERT_OK(f->Append(" world", 6));
  ASSERT_OK(f->Sync());
  ASSERT_OK_AND_ASSIGN(FileInfo info, f->Stat());
  EXPECT_EQ(info.type, FileType::kRegular);
  EXPECT_EQ(info.size, 11u);
  ASSERT_OK(f->Close());
  EXPECT_EQ(f->Close().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(*fs_.ReadFile(File("a")), "hello world");

  auto again = fs_.CreateFile(File("a"), 0600, &err);
  EXPECT_EQ(err, EEXIST);
  EXPECT_THAT(again.status().message(), HasSubstr("create " + File("a") + ": File exists"));
  auto missing = fs_.CreateFile(File("no/such/dir/f"), 0600, &err);
  EXPECT_EQ(err, ENOENT);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST_F(FileSystemTest, AllocateReservesTheSize) {
  ASSERT_OK_AND_ASSIGN(auto f, fs_.CreateFile(File("big"), 0600, nullptr));
  int err = -1;
  ASSERT_OK(f->Allocate(1 << 20, &err));
  EXPECT_EQ(err, 0);
  EXPECT_EQ(f->Stat()->size, 1u << 20);
  EXPECT_EQ(*FileSize(fs_, File("big")), 1u << 20);
}

TEST_F(FileSystemTest, ReadsNameTheFileAndTheProblem) {
  Write("f", "0123456789");
  EXPECT_EQ(*fs_.ReadFileRange(File("f"), 2, 3), "234");
  auto past = fs_.ReadFileRange(File("f"), 8, 4);
  EXPECT_EQ(past.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(past.status().message(), File("f") + ": truncated: expected 12 bytes, got 10");
  auto missing = fs_.ReadFile(File("missing"));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("open " + File("missing")));
  EXPECT_EQ(FileSize(fs_, File("missing")).status().code(), StatusCode::kNotFound);
}

TEST_F(FileSystemTest, NonRegularFilesAreRefusedWithoutBlocking) {
  const std::string pipe = File("pipe");
  ASSERT_EQ(::mkfifo(pipe.c_str(), 0600), 0);
  for (const auto& st : {fs_.ReadFile(pipe).status(), fs_.ReadFileRange(pipe, 0, 4).status(),
                         FileSize(fs_, pipe).status(), fs_.ReadFile(Dir()).status()}) {
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
    EXPECT_THAT(st.message(), HasSubstr(": not a regular file (it is a "));
  }
  EXPECT_THAT(fs_.ReadFile(pipe).status().message(), HasSubstr("(it is a named pipe)"));
  EXPECT_THAT(FileSize(fs_, Dir()).status().message(), HasSubstr("(it is a directory)"));
  EXPECT_EQ(fs_.Stat(pipe)->type, FileType::kNamedPipe);
}

TEST_F(FileSystemTest, DirectoriesListRenameExchangeAndRemove) {
  int err = -1;
  ASSERT_OK(fs_.CreateDirectory(File("d"), &err));
  EXPECT_EQ(err, 0);
  EXPECT_FALSE(fs_.CreateDirectory(File("d"), &err).ok());
  EXPECT_EQ(err, EEXIST);
  Write("d/b", "B");
  Write("d/a", "A");
  EXPECT_THAT(*fs_.ListDirectory(File("d")), ElementsAre("a", "b"));
  ASSERT_OK(fs_.SyncDirectory(File("d")));
  EXPECT_EQ(fs_.ListDirectory(File("none")).status().code(), StatusCode::kNotFound);

  ASSERT_OK(fs_.Rename(File("d/a"), File("d/c")));
  EXPECT_THAT(*fs_.ListDirectory(File("d")), ElementsAre("b", "c"));
  EXPECT_THAT(fs_.Rename(File("d/a"), File("d/x")).message(),
              HasSubstr("rename " + File("d/a") + " to " + File("d/x")));

  Status ex = fs_.Exchange(File("d/b"), File("d/c"));
  if (ex.code() != StatusCode::kUnimplemented) {
    ASSERT_OK(ex);
    EXPECT_EQ(*fs_.ReadFile(File("d/b")), "A");
    EXPECT_EQ(*fs_.ReadFile(File("d/c")), "B");
    EXPECT_THAT(fs_.Exchange(File("d/b"), File("d/missing")).message(), HasSubstr(File("d/missing")));
  }

  EXPECT_FALSE(fs_.RemoveDirectory(File("d")).ok());  // not empty
  ASSERT_OK(fs_.RemoveFile(File("d/b")));
  EXPECT_EQ(fs_.RemoveFile(File("d/b")).code(), StatusCode::kNotFound);
  ASSERT_OK(fs_.RemoveFile(File("d/c")));
  ASSERT_OK(fs_.RemoveDirectory(File("d")));
  EXPECT_FALSE(PathExists(fs_, File("d")));
}

TEST_F(FileSystemTest, CreateDirectoriesAndRemoveTree) {
  const std::string deep = File("x/y/z");
  ASSERT_OK(CreateDirectories(fs_, deep));
  ASSERT_OK(CreateDirectories(fs_, deep));  // idempotent
  EXPECT_EQ(fs_.Stat(deep)->type, FileType::kDirectory);
  Write("x/y/file", "f");
  Status st = CreateDirectories(fs_, File("x/y/file/sub"));
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr(File("x/y/file") + ": exists and is not a directory"));
  EXPECT_EQ(CreateDirectories(fs_, "").code(), StatusCode::kInvalidArgument);

  // A symbolic link inside the tree is removed, not followed.
  Write("outside", "keep");
  ASSERT_EQ(::symlink(File("outside").c_str(), File("x/link").c_str()), 0);
  EXPECT_EQ(fs_.LinkStat(File("x/link"))->type, FileType::kSymlink);
  EXPECT_EQ(fs_.Stat(File("x/link"))->type, FileType::kRegular);
  ASSERT_OK(RemoveTree(fs_, File("x")));
  EXPECT_FALSE(PathExists(fs_, File("x")));
  EXPECT_EQ(*fs_.ReadFile(File("outside")), "keep");
  ASSERT_OK(RemoveTree(fs_, File("x")));  // missing: OK
}

TEST(PathTest, JoinAndDirName) {
  EXPECT_EQ(JoinPath("a/b", "c"), "a/b/c");
  EXPECT_EQ(JoinPath("a/b/", "c"), "a/b/c");
  EXPECT_EQ(JoinPath("", "c"), "c");
  EXPECT_EQ(DirName("a/b/c"), "a/b");
  EXPECT_EQ(DirName("c"), ".");
  EXPECT_EQ(DirName("/c"), "/");
}

// --- the atomic write and the verified read -------------------------------------------------------

TEST_F(FileSystemTest, AtomicWriteReplacesWholeAndLeavesNoTemporaries) {
  ASSERT_OK(WriteFileAtomic(fs_, File("state"), "old"));
  ASSERT_OK(WriteFileAtomic(fs_, File("state"), "new contents"));
  EXPECT_EQ(*fs_.ReadFile(File("state")), "new contents");
  EXPECT_THAT(*fs_.ListDirectory(Dir()), ElementsAre("state"));
  {
    ASSERT_OK_AND_ASSIGN(AtomicFileWriter w, AtomicFileWriter::Open(fs_, File("state")));
    ASSERT_OK(w.Append("dropped"));
  }  // not committed: the temporary goes
  {
    ASSERT_OK_AND_ASSIGN(AtomicFileWriter w, AtomicFileWriter::Open(fs_, File("state")));
    ASSERT_OK(w.Append("half"));
    w.AbandonForTest();  // a crash: the temporary stays, the file is unchanged
  }
  EXPECT_EQ(*fs_.ReadFile(File("state")), "new contents");
  EXPECT_EQ(fs_.ListDirectory(Dir())->size(), 2u);
}

TEST_F(FileSystemTest, VerifiedReadNamesFileAndProblem) {
  ASSERT_OK(WriteFileAtomic(fs_, File("v"), "abcdef"));
  const uint32_t crc = Crc32c("abcdef", 6);
  EXPECT_EQ(*ReadFileVerified(fs_, File("v"), 6, crc), "abcdef");
  auto short_read = ReadFileVerified(fs_, File("v"), 7, crc);
  EXPECT_EQ(short_read.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(short_read.status().message(), File("v") + ": truncated: expected 7 bytes, got 6");
  EXPECT_EQ(ReadFileVerified(fs_, File("v"), 5, crc).status().message(),
            File("v") + ": longer than expected: expected 5 bytes, got 6");
  auto bad = ReadFileVerified(fs_, File("v"), 6, crc ^ 1);
  EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(bad.status().message(), HasSubstr("checksum mismatch: expected crc32c " + Crc32cHex(crc ^ 1)));
}

// --- FaultyFileSystem ---------------------------------------------------------------------------

TEST_F(FileSystemTest, FaultyFailsTheNthCallWithTheErrnoAndDoesNothing) {
  FaultyFileSystem faulty;
  EXPECT_EQ(faulty.inner(), DefaultFileSystem());
  ASSERT_OK(WriteFileAtomic(faulty, File("state"), "old"));
  faulty.FailNthCall("Rename", faulty.call_count("Rename") + 1, EIO);
  Status st = WriteFileAtomic(faulty, File("state"), "new");
  EXPECT_THAT(st.message(), StartsWith("rename " + File("state") + ".tmp."));
  EXPECT_THAT(st.message(), EndsWith(" to " + File("state") + ": Input/output error (errno 5)"));
  EXPECT_EQ(*faulty.ReadFile(File("state")), "old");
  EXPECT_THAT(*faulty.ListDirectory(Dir()), ElementsAre("state"));  // the temporary was removed
  ASSERT_OK(WriteFileAtomic(faulty, File("state"), "new"));         // fired once

  faulty.FailNthCall("Append", faulty.call_count("Append") + 1, ENOSPC, /*persistent=*/true);
  st = WriteFileAtomic(faulty, File("state"), "newer");
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_FALSE(WriteFileAtomic(faulty, File("state"), "newest").ok());
  faulty.ClearFaults();
  ASSERT_OK(WriteFileAtomic(faulty, File("state"), "newest"));
  EXPECT_EQ(*faulty.ReadFile(File("state")), "newest");

  int err = 0;
  faulty.FailNthCall("CreateFile", faulty.call_count("CreateFile") + 1, EROFS);
  EXPECT_FALSE(faulty.CreateFile(File("ro"), 0600, &err).ok());
  EXPECT_EQ(err, EROFS);
  EXPECT_FALSE(PathExists(faulty, File("ro")));
  ASSERT_OK_AND_ASSIGN(auto f, faulty.CreateFile(File("full"), 0600, &err));
  faulty.FailNthCall("Allocate", 1, ENOSPC);
  EXPECT_EQ(f->Allocate(4096, &err).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(err, ENOSPC);
  ASSERT_OK(f->Allocate(4096, &err));
  EXPECT_EQ(faulty.call_count("Allocate"), 2);
}

TEST_F(FileSystemTest, FaultyTurnsExchangeOff) {
  FaultyFileSystem faulty;
  Write("a", "A");
  Write("b", "B");
  faulty.SetExchangeSupported(false);
  Status st = faulty.Exchange(File("a"), File("b"));
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(st.message(), HasSubstr("exchange " + File("a") + " and " + File("b")));
  EXPECT_EQ(*faulty.ReadFile(File("a")), "A");
  faulty.ClearFaults();
  st = faulty.Exchange(File("a"), File("b"));
  if (st.code() != StatusCode::kUnimplemented) {
    ASSERT_OK(st);
    EXPECT_EQ(*faulty.ReadFile(File("a")), "B");
  }
}

TEST_F(FileSystemTest, LockFileIsExclusivePerOpenAndNamesTheProblem) {
  const std::string path = File("lock");
  LockFileFailure failure;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<FileLock> lock, fs_.LockFile(path, &failure));
  EXPECT_EQ(failure.step, LockFileFailure::Step::kNone);
  EXPECT_EQ(lock->path(), path);
  ASSERT_OK(lock->Rewrite("a longer first holder\n"));
  ASSERT_OK(lock->Rewrite("pid 1\n"));
  EXPECT_EQ(*fs_.ReadFile(path), "pid 1\n");
  // flock belongs to the open file description: a second open is refused, in this process too.
  auto second = fs_.LockFile(path, &failure);
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(second.status().message(), "lock " + path + ": held by another process");
  EXPECT_EQ(failure.step, LockFileFailure::Step::kHeld);
  EXPECT_EQ(failure.err, EWOULDBLOCK);
  ASSERT_OK(fs_.UnlockFile(std::move(lock)));
  EXPECT_EQ(*fs_.ReadFile(path), "pid 1\n");  // the file stays
  ASSERT_OK_AND_ASSIGN(lock, fs_.LockFile(path, nullptr));
  lock.reset();  // the destructor releases it too
  ASSERT_OK(fs_.LockFile(path, nullptr));

  auto missing = fs_.LockFile(File("no/such/dir/lock"), &failure);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), StartsWith("open " + File("no/such/dir/lock") + ": "));
  EXPECT_EQ(failure.step, LockFileFailure::Step::kOpen);
  EXPECT_EQ(failure.err, ENOENT);
  ASSERT_OK(fs_.CreateDirectory(File("d"), nullptr));
  auto dir = fs_.LockFile(File("d"), &failure);
  EXPECT_FALSE(dir.ok());
  EXPECT_NE(failure.step, LockFileFailure::Step::kNone);
  ASSERT_EQ(::mkfifo(File("pipe").c_str(), 0644), 0);
  auto pipe = fs_.LockFile(File("pipe"), &failure);  // without a reader: must not block
  EXPECT_EQ(pipe.status().message(), File("pipe") + ": not a regular file (it is a named pipe)");
  EXPECT_EQ(failure.step, LockFileFailure::Step::kOther);
}

TEST_F(FileSystemTest, FaultyFailsLockAndUnlock) {
  FaultyFileSystem faulty;
  const std::string path = File("lock");
  LockFileFailure failure;
  faulty.FailNthCall("LockFile", 1, EWOULDBLOCK);
  faulty.FailNthCall("UnlockFile", 1, EIO);
  auto held = faulty.LockFile(path, &failure);
  EXPECT_EQ(held.status().message(), "lock " + path + ": held by another process");
  EXPECT_EQ(failure.step, LockFileFailure::Step::kHeld);
  EXPECT_FALSE(PathExists(fs_, path));  // nothing done on the wrapped one
  faulty.FailNthCall("LockFile", 2, EIO);
  auto failed = faulty.LockFile(path, &failure);
  EXPECT_THAT(failed.status().message(), StartsWith("flock " + path + ": "));
  EXPECT_EQ(failure.step, LockFileFailure::Step::kOther);
  EXPECT_EQ(failure.err, EIO);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<FileLock> lock, faulty.LockFile(path, &failure));
  const Status unlocked = faulty.UnlockFile(std::move(lock));
  EXPECT_THAT(unlocked.message(), StartsWith("close " + path + ": "));
  EXPECT_OK(fs_.LockFile(path, nullptr));  // released all the same
  EXPECT_EQ(faulty.call_count("LockFile"), 3);
  EXPECT_EQ(faulty.call_count("UnlockFile"), 1);
}

TEST_F(FileSystemTest, FaultyEndsTheProcessAtTheArmedCrashPointOnly) {
  FaultyFileSystem faulty;
  DefaultFileSystem()->CrashPoint("anything", 0);  // the POSIX one: nothing happens
  faulty.ExitAtCrashPoint("middle", 1, 42);
  faulty.CrashPoint("middle", 0);  // another rank: goes on
  faulty.CrashPoint("start", 1);
  EXPECT_THAT(faulty.crash_points_reached(), ElementsAre("middle@0", "start@1"));
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (!WriteFileAtomic(faulty, File("before"), "x").ok()) ::_exit(1);
    faulty.CrashPoint("middle", 1);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 42);
  EXPECT_EQ(*fs_.ReadFile(File("before")), "x");
}

}  // namespace
}  // namespace zero
