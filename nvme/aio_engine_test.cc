// Real O_DIRECT I/O through LibaioEngine on files in a scratch directory, and every fault the
// FaultyAioEngine injects, checked for the right code and context (file, offset, length, errno).
#include "nvme/aio_engine.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "nvme/aligned_buffer.h"
#include "nvme/faulty_aio_engine.h"
#include "nvme/libaio_engine.h"
#include "nvme/nvme_test_util.h"
#include "runtime/atomic_file.h"
#include "runtime/file_system.h"
#include "testing/same_bits.h"
#include "testing/scratch_dir.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

AlignedBuffer Zeros(size_t size) {
  auto b = AlignedBuffer::Allocate(size);
  ZERO_CHECK(b.ok());
  return std::move(b).value();
}

// The file's bytes read back with plain pread, independent of the engine.
std::string FileBytes(const std::string& path, uint64_t offset, size_t size) {
  auto r = DefaultFileSystem()->ReadFileRange(path, offset, size);
  ZERO_CHECK_MSG(r.ok(), r.status().ToString());
  return *r;
}

// The first n bytes, byte for byte; a failure names the first differing byte.
::testing::AssertionResult Same(const AlignedBuffer& a, const AlignedBuffer& b, size_t n) {
  return ::zero::testing::SameBits(static_cast<const uint8_t*>(a.data()), static_cast<const uint8_t*>(b.data()), n);
}

AioOptions Opts(int64_t block, int64_t depth, int64_t threads = 1, bool single = false, bool overlap = true) {
  AioOptions o;
  o.block_size = block;
  o.queue_depth = depth;
  o.intra_op_parallelism = threads;
  o.single_submit = single;
  o.overlap_events = overlap;
  return o;
}

class AioEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = ScratchDir::CreateWithDirectIo(::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_OK(d);
    dir_.emplace(std::move(d).value());
  }
  std::string File(const std::string& n) { return dir_->File(n); }
  std::optional<ScratchDir> dir_;
};

TEST(AioOptionsTest, ValidationNamesTheKey) {
  EXPECT_OK(ValidateAioOptions(AioOptions()));
  AioOptions o;
  o.block_size = 1000;
  Status st = ValidateAioOptions(o);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("aio.block_size"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("1000"), std::string::npos);
  o = AioOptions();
  o.queue_depth = 0;
  EXPECT_NE(ValidateAioOptions(o).message().find("aio.queue_depth"), std::string::npos);
  o = AioOptions();
  o.intra_op_parallelism = 0;
  EXPECT_NE(ValidateAioOptions(o).message().find("aio.intra_op_parallelism"), std::string::npos);
  EXPECT_FALSE(LibaioEngine::Create(o).ok());
}

TEST(AioOptionsTest, DefaultsMirrorDeepSpeedAioBlock) {
  AioOptions o;
  EXPECT_EQ(o.block_size, 1048576);
  EXPECT_EQ(o.queue_depth, 8);
  EXPECT_EQ(o.intra_op_parallelism, 1);
  EXPECT_FALSE(o.single_submit);
  EXPECT_TRUE(o.overlap_events);
  EXPECT_FALSE(o.allow_buffered_fallback);
}

TEST(AlignedBufferTest, AlignsAndPads) {
  auto b = AlignedBuffer::Allocate(5000);
  ASSERT_OK(b);
  EXPECT_EQ(b->size(), 8192u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % 4096, 0u);
  EXPECT_EQ(b->bytes()[8191], 0);
  auto big = AlignedBuffer::Allocate(3 << 20, 1 << 20);
  ASSERT_OK(big);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big->data()) % (1 << 20), 0u);
  EXPECT_EQ(AlignedBuffer::Allocate(10, 3000).status().code(), StatusCode::kInvalidArgument);
}

struct RoundTripCase {
  const char* name;
  AioOptions options;
  size_t bytes;
};

class RoundTripTest : public AioEngineTest, public ::testing::WithParamInterface<RoundTripCase> {};

TEST_P(RoundTripTest, ByteExact) {
  const RoundTripCase& c = GetParam();
  ASSERT_OK_AND_ASSIGN(auto aio, LibaioEngine::Create(c.options));
  ASSERT_OK_AND_ASSIGN(auto file, aio->Open(File("data"), AioOpenMode::kCreate));
  EXPECT_TRUE(file->direct());
  AlignedBuffer out = Pattern(c.bytes, 11);
  AlignedBuffer in = Zeros(c.bytes);
  const uint64_t offset = 8192;
  ASSERT_OK(aio->Write(*file, offset, out.data(), out.size()));
  ASSERT_OK(aio->Read(*file, offset, in.data(), in.size()));
  EXPECT_TRUE(Same(out, in, out.size()));
  EXPECT_EQ(FileBytes(File("data"), offset, out.size()),
            std::string(reinterpret_cast<const char*>(out.data()), out.size()));
  const uint64_t block = static_cast<uint64_t>(c.options.block_size);
  EXPECT_EQ(aio->stats().pieces, 2 * ((out.size() + block - 1) / block));
}

INSTANTIATE_TEST_SUITE_P(Sizes, RoundTripTest,
                         ::testing::Values(RoundTripCase{"OnePage", Opts(4096, 2), 4096},
                                           RoundTripCase{"TinyBlocks", Opts(4096, 2), 12 * 4096},
                                           RoundTripCase{"NotAMultipleOfTheBlock", Opts(16384, 2), 5 * 4096},
                                           RoundTripCase{"SingleSubmit", Opts(8192, 4, 1, true), 11 * 4096},
                                           RoundTripCase{"NoOverlap", Opts(8192, 4, 1, false, false), 13 * 4096},
                                           RoundTripCase{"ThreadsMoreThanPieces", Opts(8192, 2, 8), 3 * 4096},
                                           RoundTripCase{"Big64MiBFourThreads", Opts(1 << 20, 8, 4), 64 << 20},
                                           RoundTripCase{"Big64MiBOddSize", Opts(1 << 20, 4, 3, false, false),
                                                         (64 << 20) - 12288}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST_F(AioEngineTest, SingleSubmitMakesOneCallPerPieceAndBatchingFewer) {
  AlignedBuffer out = Pattern(64 * 4096, 3);
  for (bool single : {true, false}) {
    ASSERT_OK_AND_ASSIGN(auto aio, LibaioEngine::Create(Opts(4096, 8, 1, single, false)));
    ASSERT_OK_AND_ASSIGN(auto file, aio->Open(File("f"), AioOpenMode::kCreate));
    ASSERT_OK(aio->Write(*file, 0, out.data(), out.size()));
    const AioStats s = aio->stats();
    EXPECT_EQ(s.pieces, 64u);
    if (single) {
      EXPECT_EQ(s.io_submit_calls, 64u);
    } else {
      EXPECT_LE(s.io_submit_calls, 64u / 8 + s.retries) << "batches of queue_depth 8";
    }
  }
}

// Writes past the end of the file are preallocated first (extending direct writes are synchronous
// on ext4); writes inside the file are not; the bytes and the file size are what was written.
TEST_F(AioEngineTest, WritesPastTheEndArePreallocatedFirst) {
  ASSERT_OK_AND_ASSIGN(auto aio, LibaioEngine::Create(Opts(16384, 4)));
  ASSERT_OK_AND_ASSIGN(auto file, aio->Open(File("f"), AioOpenMode::kCreate));
  AlignedBuffer a = Pattern(10 * 4096, 5);
  AlignedBuffer b = Pattern(6 * 4096, 6);
  ASSERT_OK(aio->Write(*file, 0, a.data(), a.size()));
  EXPECT_EQ(aio->stats().extend_preallocations, 1u);
  ASSERT_OK(aio->Write(*file, 4096, b.data(), b.size()));  // inside the file
  EXPECT_EQ(aio->stats().extend_preallocations, 1u);
  ASSERT_OK(aio->Write(*file, 8 * 4096, b.data(), b.size()));  // straddles the end
  EXPECT_EQ(aio->stats().extend_preallocations, 2u);
  struct stat st;
  ASSERT_EQ(::stat(File("f").c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), 14u * 4096) << "offset + length of the last write";
  const std::string bs(reinterpret_cast<const char*>(b.data()), b.size());
  const std::string as(reinterpret_cast<const char*>(a.data()), a.size());
  EXPECT_EQ(FileBytes(File("f"), 0, 4096), as.substr(0, 4096));
  EXPECT_EQ(FileBytes(File("f"), 4096, b.size()), bs);
  EXPECT_EQ(FileBytes(File("f"), 7 * 4096, 4096), as.substr(7 * 4096, 4096));
  EXPECT_EQ(FileBytes(File("f"), 8 * 4096, b.size()), bs);
}

TEST_F(AioEngineTest, ManyRequestsInFlightWaitedInAnyOrder) {
  ASSERT_OK_AND_ASSIGN(auto aio, LibaioEngine::Create(Opts(16384, 4, 3)));
  ASSERT_OK_AND_ASSIGN(auto file, aio->Open(File("f"), AioOpenMode::kCreate));
  constexpr int kRequests = 48;
  constexpr size_t kBytes = 40960;
  std::vector<AlignedBuffer> out, in;
  std::vector<AioTicket> tickets;
  for (int i = 0; i < kRequests; ++i) {
    out.push_back(Pattern(kBytes, 100 + i));
    ASSERT_OK_AND_ASSIGN(AioTicket t, aio->SubmitWrite(*file, i * kBytes, out.back().data(), kBytes));
    tickets.push_back(t);
  }
  for (int i = kRequests - 1; i >= 0; --i) ASSERT_OK(aio->Wait(tickets[i]));
  tickets.clear();
  for (int i = 0; i < kRequests; ++i) {
    in.push_back(Zeros(kBytes));
    ASSERT_OK_AND_ASSIGN(AioTicket t, aio->SubmitRead(*file, i * kBytes, in.back().data(), kBytes));
    tickets.push_back(t);
  }
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_OK(aio->Wait(tickets[i]));
    EXPECT_TRUE(Same(out[i], in[i], kBytes)) << "request " << i;
  }
  EXPECT_EQ(aio->Wait(tickets[0]).code(), StatusCode::kNotFound) << "waited twice";
  EXPECT_EQ(aio->Wait(123456).code(), StatusCode::kNotFound);
}

TEST_F(AioEngineTest, ZeroLengthCompletesAtOnce) {
  ASSERT_OK_AND_ASSIGN(auto aio, LibaioEngine::Create(AioOptions()));
  ASSERT_OK_AND_ASSIGN(auto file, aio->Open(File("f"), AioOpenMode::kCreate));
  AlignedBuffer b = Zeros(4096);
  ASSERT_OK(aio->Write(*file, 0, b.data(), 0));
}

TEST_F(AioEngineTest, AlignmentErrorsNameTheValue) {
  ASSERT_OK_AND_ASSIGN(auto aio, LibaioEngine::Create(AioOptions()));
  ASSERT_OK_AND_ASSIGN(auto file, aio->Open(File("f"), AioOpenMode::kCreate));
  AlignedBuffer b = Zeros(3 * 4096);
  Status st = aio->Write(*file, 100, b.data(), 4096);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("offset 100 is not a multiple of 4096"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(File("f")), std::string::npos);
  st = aio->Write(*file, 0, b.data(), 5000);
  EXPECT_NE(st.message().find("length 5000 is not a multiple of 4096"), std::string::npos) << st.message();
  st = aio->Read(*file, 0, b.bytes() + 512, 4096);
  EXPECT_NE(st.message().find("buffer address"), std::string::npos) << st.message();
  EXPECT_EQ(aio->stats().pieces, 0u) << "nothing submitted";
}

// --- faults -------------------------------------------------------------------------------------

TEST_F(AioEngineTest, InjectedEnospcOnNthWriteNamesFileOffsetLength) {
  ASSERT_OK_AND_ASSIGN(auto aio, FaultyAioEngine::Create(Opts(8192, 1)));
  ASSERT_OK_AND_ASSIGN(auto file, aio->Open(File("f"), AioOpenMode::kCreate));
  AlignedBuffer b = Pattern(8 * 8192, 1);
  aio->FailNthWrite(3, ENOSPC);
  Status st = aio->Write(*file, 4096, b.data(), b.size());
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.ToString();
  EXPECT_NE(st.message().find("pwrite " + File("f") + " offset " + std::to_string(4096 + 2 * 8192) + " length 8192"),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("No space left on device (errno 28)"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("write " + File("f") + " offset 4096 length 65536"), std::string::npos)
      << "the request: " << st.message();
  EXPECT_EQ(aio->writes_reaped(), 3) << "no piece submitted after the error (queue depth 1)";
  // The engine stays usable.
  ASSERT_OK(aio->Write(*file, 0, b.data(), b.size()));
}

TEST_F(AioEngineTest, InjectedEioOnWriteAndRead) {
  ASSERT_OK_AND_ASSIGN(auto aio, FaultyAioEngine::Create(Opts(4096, 2, 2)));
  ASSERT_OK_AND_ASSIGN(auto file, aio->Open(File("f"), AioOpenMode::kCreate));
  AlignedBuffer b = Pattern(16 * 4096, 1);
  aio->FailNthWrite(5, EIO);
  Status st = aio->Write(*file, 0, b.data(), b.size());
  EXPECT_EQ(st.code(), StatusCode::kInternal) << st.ToString();
  EXPECT_NE(st.message().find("pwrite " + File("f") + " offset "), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("length 4096: Input/output error (errno 5)"), std::string::npos) << st.message();
  ASSERT_OK(aio->Write(*file, 0, b.data(), b.size()));
  aio->FailNthRead(2, EIO);
  AlignedBuffer in = Zeros(b.size());
  st = aio->Read(*file, 0, in.data(), in.size());
  EXPECT_EQ(st.code(), StatusCode::kInternal) << st.ToString();
  EXPECT_NE(st.message().find("pread " + File("f") + " offset "), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("Input/output error"), std::string::npos) << st.message();
}

TEST_F(AioEngineTest, InjectedEnospcOnRead) {
  ASSERT_OK_AND_ASSIGN(auto aio, FaultyAioEngine::Create(Opts(4096, 1)));
  ASSERT_OK_AND_ASSIGN(auto file, aio->Open(File("f"), AioOpenMode::kCreate));
  AlignedBuffer b = Pattern(4 * 4096, 1);
  ASSERT_OK(aio->Write(*file, 0, b.data(), b.size()));
  aio->FailNthRead(4, ENOSPC);
  Status st = aio->Read(*file, 0, b.data(), b.size());
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("pread " + File("f") + " offset 12288 length 4096"), std::string::npos) << st.message();
}

struct ShortCase {
  const char* name;
  bool write;
  size_t reported;  // bytes the kernel "moved" of a 16 KiB piece
};

class ShortTransferTest : public AioEngineTest, public ::testing::WithParamInterface<ShortCase> {};

TEST_P(ShortTransferTest, RestIsResubmittedAndDataExact) {
  const ShortCase& c = GetParam();
  ASSERT_OK_AND_ASSIGN(auto aio, FaultyAioEngine::Create(Opts(16384, 2)));
  ASSERT_OK_AND_ASSIGN(auto file, aio->Open(File("f"), AioOpenMode::kCreate));
  AlignedBuffer out = Pattern(4 * 16384, 5);
  AlignedBuffer in = Zeros(out.size());
  if (c.write) {
    aio->ShortenNthWrite(2, c.reported);
  } else {
    ASSERT_OK(aio->Write(*file, 0, out.data(), out.size()));
    aio->ShortenNthRead(2, c.reported);
  }
  if (c.write) {
    ASSERT_OK(aio->Write(*file, 0, out.data(), out.size()));
  }
  ASSERT_OK(aio->Read(*file, 0, in.data(), in.size()));
  EXPECT_TRUE(Same(out, in, out.size()));
  EXPECT_EQ(FileBytes(File("f"), 0, out.size()), std::string(reinterpret_cast<const char*>(out.data()), out.size()));
  EXPECT_EQ(aio->stats().short_resubmits, 1u);
}

INSTANTIATE_TEST_SUITE_P(Faults, ShortTransferTest,
                         ::testing::Values(ShortCase{"ReadAligned", false, 8192},
                                           ShortCase{"ReadUnaligned", false, 5000},
                                           ShortCase{"WriteAligned", true, 4096},
                                           ShortCase{"WriteUnaligned", true, 12000}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST_F(AioEngineTest, EintrAndEagainCompletionsAreRetried) {
  ASSERT_OK_AND_ASSIGN(auto aio, FaultyAioEngine::Create(Opts(4096, 4)));
  ASSERT_OK_AND_ASSIGN(auto file, aio->Open(File("f"), AioOpenMode::kCreate));
  AlignedBuffer out = Pattern(8 * 4096, 9);
  AlignedBuffer in = Zeros(out.size());
  aio->FailNthWrite(2, EAGAIN);
  aio->FailNthWrite(3, EINTR);
  aio->FailNthRead(1, EAGAIN);
  ASSERT_OK(aio->Write(*file, 0, out.data(), out.size()));
  ASSERT_OK(aio->Read(*file, 0, in.data(), in.size()));
  EXPECT_TRUE(Same(out, in, out.size()));
  EXPECT_EQ(aio->stats().retries, 3u);
  EXPECT_EQ(aio->writes_reaped(), 10) << "8 pieces + 2 retried";
}

TEST_F(AioEngineTest, ShortReadThatNeverCompletesIsDataLossNotALoop) {
  ASSERT_OK_AND_ASSIGN(auto aio, FaultyAioEngine::Create(Opts(16384, 1)));
  ASSERT_OK_AND_ASSIGN(auto file, aio->Open(File("f"), AioOpenMode::kCreate));
  AlignedBuffer b = Pattern(16384, 1);
  ASSERT_OK(aio->Write(*file, 0, b.data(), b.size()));
  aio->ShortenNthRead(1, 0);  // a read that returns 0 bytes: end of file
  Status st = aio->Read(*file, 0, b.data(), b.size());
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.ToString();
  EXPECT_NE(st.message().find("end of file at byte 0"), std::string::npos) << st.message();
}

TEST_F(AioEngineTest, ReadPastTheEndOfARealFileIsDataLoss) {
  // One piece: its short reads (6000 bytes, then the unaligned rest) end at end of file.
  ASSERT_OK_AND_ASSIGN(auto aio, LibaioEngine::Create(Opts(16384, 2)));
  // An unaligned size, written without O_DIRECT.
  ASSERT_OK(WriteFileAtomic(*DefaultFileSystem(), File("short"), std::string(6000, 'x')));
  ASSERT_OK_AND_ASSIGN(auto file, aio->Open(File("short"), AioOpenMode::kRead));
  AlignedBuffer b = Zeros(16384);
  Status st = aio->Read(*file, 0, b.data(), b.size());
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.ToString();
  EXPECT_NE(st.message().find("end of file at byte 6000"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(File("short")), std::string::npos);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(b.data()), 6000), std::string(6000, 'x'));
}

TEST_F(AioEngineTest, WaitTimesOutWhileHeldThenCompletes) {
  ASSERT_OK_AND_ASSIGN(auto aio, FaultyAioEngine::Create(Opts(4096, 2)));
  ASSERT_OK_AND_ASSIGN(auto file, aio->Open(File("f"), AioOpenMode::kCreate));
  AlignedBuffer b = Pattern(8192, 2);
  aio->HoldIo();
  ASSERT_OK_AND_ASSIGN(AioTicket t, aio->SubmitWrite(*file, 0, b.data(), b.size()));
  Status st = aio->Wait(t, std::chrono::milliseconds(1));
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(st.message().find("write " + File("f") + " offset 0 length 8192"), std::string::npos) << st.message();
  aio->ReleaseIo();
  ASSERT_OK(aio->Wait(t));
}

TEST_F(AioEngineTest, DelayedSubmissionsStillExact) {
  ASSERT_OK_AND_ASSIGN(auto aio, FaultyAioEngine::Create(Opts(4096, 2, 2)));
  aio->SetSubmitDelay(std::chrono::microseconds(200));
  ASSERT_OK_AND_ASSIGN(auto file, aio->Open(File("f"), AioOpenMode::kCreate));
  AlignedBuffer out = Pattern(32 * 4096, 4);
  AlignedBuffer in = Zeros(out.size());
  ASSERT_OK(aio->Write(*file, 0, out.data(), out.size()));
  ASSERT_OK(aio->Read(*file, 0, in.data(), in.size()));
  EXPECT_TRUE(Same(out, in, out.size()));
}

// --- paths ----------------------------------------------------------------------------------------

TEST_F(AioEngineTest, MissingAndUnusablePaths) {
  ASSERT_OK_AND_ASSIGN(auto aio, FaultyAioEngine::Create(AioOptions()));
  auto r = aio->Open(File("absent"), AioOpenMode::kRead);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find(File("absent")), std::string::npos);
  r = aio->Open(File("no/such/dir/f"), AioOpenMode::kCreate);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound) << r.status().ToString();
  ASSERT_OK(WriteFileAtomic(*DefaultFileSystem(), File("plain"), "x"));
  r = aio->Open(File("plain") + "/f", AioOpenMode::kCreate);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("Not a directory"), std::string::npos) << r.status().ToString();
  aio->FailNextOpen(EACCES);
  r = aio->Open(File("f"), AioOpenMode::kCreate);
  EXPECT_NE(r.status().message().find("Permission denied"), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find(File("f")), std::string::npos);
}

// A named pipe or a directory at a swap file's path (issue 23): refused naming it; opening the pipe
// for reading used to block forever. The open runs in a fork()ed child that is killed if it hangs.
TEST_F(AioEngineTest, NonRegularFilesAreRefusedWithoutBlocking) {
  ASSERT_EQ(::mkfifo(File("pipe").c_str(), 0600), 0);
  ASSERT_EQ(::mkdir(File("dir").c_str(), 0755), 0);
  for (const AioOpenMode mode : {AioOpenMode::kRead, AioOpenMode::kReadWrite, AioOpenMode::kCreate}) {
    for (const std::string name : {"pipe", "dir"}) {
      int fds[2];
      ASSERT_EQ(::pipe(fds), 0);
      const pid_t child = ::fork();
      if (child == 0) {
        ::close(fds[0]);
        AioOptions o;
        o.allow_buffered_fallback = true;
        auto aio = LibaioEngine::Create(o);
        std::string msg = aio.ok() ? (*aio)->Open(File(name), mode).status().ToString() : "no aio engine";
        if (::write(fds[1], msg.data(), msg.size()) < 0) ::_exit(2);
        ::_exit(0);
      }
      ::close(fds[1]);
      int status = 0;
      bool hung = true;
      for (int i = 0; i < 500; ++i) {
        if (::waitpid(child, &status, WNOHANG) == child) {
          hung = false;
          break;
        }
        ::usleep(10000);
      }
      if (hung) {
        ::kill(child, SIGKILL);
        ::waitpid(child, &status, 0);
      }
      std::string msg(4096, '\0');
      const ssize_t n = ::read(fds[0], msg.data(), msg.size());
      msg.resize(n > 0 ? static_cast<size_t>(n) : 0);
      ::close(fds[0]);
      EXPECT_FALSE(hung) << name << " mode " << static_cast<int>(mode);
      if (name == "pipe") {
        EXPECT_NE(msg.find("FAILED_PRECONDITION: "), std::string::npos) << msg;
        EXPECT_NE(msg.find(File(name) + ": not a regular file (it is a named pipe)"), std::string::npos) << msg;
      } else {
        EXPECT_FALSE(msg.empty() || msg == "OK") << msg;  // EISDIR from open, or refused
      }
    }
  }
}

TEST_F(AioEngineTest, ReadOnlyFilesystemIsFailedPrecondition) {
  auto m = ScopedMount::Create(File("ro"), "tmpfs", "size=1m", /*read_only=*/true);
  if (!m.ok()) GTEST_SKIP() << m.status().message();
  ASSERT_OK_AND_ASSIGN(auto aio, LibaioEngine::Create(AioOptions()));
  auto r = aio->Open(File("ro/f"), AioOpenMode::kCreate);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status().ToString();
  EXPECT_NE(r.status().message().find("Read-only file system"), std::string::npos);
}

TEST_F(AioEngineTest, DiskFullOnARealSmallFilesystem) {
  auto m = ScopedMount::Create(File("small"), "tmpfs", "size=256k");
  if (!m.ok()) GTEST_SKIP() << m.status().message() << " (injected ENOSPC is tested above)";
  AioOptions o = Opts(65536, 4);
  o.allow_buffered_fallback = true;  // kernels before 6.6 have no O_DIRECT on tmpfs
  ASSERT_OK_AND_ASSIGN(auto aio, LibaioEngine::Create(o));
  ASSERT_OK_AND_ASSIGN(auto file, aio->Open(File("small/f"), AioOpenMode::kCreate));
  AlignedBuffer b = Pattern(1 << 20, 1);
  Status st = aio->Write(*file, 0, b.data(), b.size());
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.ToString();
  EXPECT_NE(st.message().find("No space left on device"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(File("small/f")), std::string::npos);
}

// A directory on a filesystem without O_DIRECT: /dev/shm on kernels before 6.6, else a ramfs
// mounted here. Empty when there is none.
std::string NoDirectIoDir(const std::string& scratch, std::optional<ScopedMount>* mount) {
  if (!ProbeDirectIo("/dev/shm").ok() && ProbeDirectIo("/dev/shm").code() == StatusCode::kFailedPrecondition) {
    return "/dev/shm";
  }
  auto m = ScopedMount::Create(scratch + "/ramfs", "ramfs", "");
  if (!m.ok()) return "";
  mount->emplace(std::move(m).value());
  return (*mount)->dir();
}

TEST_F(AioEngineTest, NoDirectIoIsAClearErrorOrTheDocumentedFallback) {
  std::optional<ScopedMount> mount;
  const std::string dir = NoDirectIoDir(dir_->path(), &mount);
  if (dir.empty()) {
    GTEST_SKIP() << "/dev/shm supports O_DIRECT on this kernel and mounting a ramfs is not permitted";
  }
  const std::string path = dir + "/zero_aio_test." + std::to_string(::getpid());
  {
    ASSERT_OK_AND_ASSIGN(auto aio, LibaioEngine::Create(Opts(4096, 2)));
    auto r = aio->Open(path, AioOpenMode::kCreate);
    EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status().ToString();
    EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("does not support direct I/O"), std::string::npos);
    EXPECT_NE(r.status().message().find("(" + FilesystemType(dir) + ")"), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("allow_buffered_fallback"), std::string::npos);
    EXPECT_FALSE(PathExists(*DefaultFileSystem(), path)) << "no file left behind";
    EXPECT_EQ(ProbeDirectIo(dir).code(), StatusCode::kFailedPrecondition);
  }
  AioOptions o = Opts(4096, 2);
  o.allow_buffered_fallback = true;
  ASSERT_OK_AND_ASSIGN(auto aio, LibaioEngine::Create(o));
  ASSERT_OK_AND_ASSIGN(auto file, aio->Open(path, AioOpenMode::kCreate));
  EXPECT_FALSE(file->direct());
  AlignedBuffer out = Pattern(5 * 4096, 8);
  AlignedBuffer in = Zeros(out.size());
  ASSERT_OK(aio->Write(*file, 0, out.data(), out.size()));
  ASSERT_OK(aio->Read(*file, 0, in.data(), in.size()));
  EXPECT_TRUE(Same(out, in, out.size()));
  EXPECT_EQ(aio->Write(*file, 1, out.data(), 4096).code(), StatusCode::kInvalidArgument)
      << "the alignment rules hold under the fallback too";
  file.reset();
  ::unlink(path.c_str());
}

}  // namespace
}  // namespace zero
