// SwapFile on real files: round trips of regions of any size, RAII removal, preallocation,
// corruption and truncation detected by checksum/length, disk full at creation, bad paths.
#include "nvme/swap_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>

#include "nvme/aligned_buffer.h"
#include "nvme/faulty_aio_engine.h"
#include "nvme/libaio_engine.h"
#include "nvme/nvme_test_util.h"
#include "runtime/faulty_file_system.h"
#include "testing/scratch_dir.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

bool Exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

uint64_t Blocks(const std::string& p) {
  struct stat st;
  ZERO_CHECK(::stat(p.c_str(), &st) == 0);
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

class SwapFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = ScratchDir::CreateWithDirectIo(::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_OK(d);
    dir_.emplace(std::move(d).value());
    AioOptions o;
    o.block_size = 65536;
    o.queue_depth = 4;
    o.intra_op_parallelism = 2;
    auto e = FaultyAioEngine::Create(o);
    ASSERT_OK(e);
    aio_ = std::move(e).value();
  }
  std::string File(const std::string& n) { return dir_->File(n); }
  std::optional<ScratchDir> dir_;
  std::unique_ptr<FaultyAioEngine> aio_;
};

const std::vector<SwapRegionSpec> kRegions = {
    {"layer0.exp_avg", 1000}, {"layer0.exp_avg_sq", 300000}, {"layer1.master", 4096}, {"tiny", 1}};

TEST_F(SwapFileTest, LayoutPreallocatesAndRemovesTheFile) {
  const std::string path = File("rank0.swp");
  {
    ASSERT_OK_AND_ASSIGN(auto swap, SwapFile::Create(aio_.get(), path, kRegions));
    EXPECT_TRUE(swap->direct());
    ASSERT_EQ(swap->region_count(), 4u);
    EXPECT_EQ(swap->region(0).offset, 0u);
    EXPECT_EQ(swap->region(0).padded_bytes, 4096u);
    EXPECT_EQ(swap->region(1).offset, 4096u);
    EXPECT_EQ(swap->region(1).padded_bytes, 303104u);
    EXPECT_EQ(swap->region(2).offset, 4096u + 303104u);
    EXPECT_EQ(swap->region(3).offset, 4096u + 303104u + 4096u);
    EXPECT_EQ(swap->file_size(), 4096u + 303104u + 4096u + 4096u);
    EXPECT_GE(Blocks(path), swap->file_size()) << "blocks allocated up front";
    EXPECT_TRUE(Exists(path));
  }
  EXPECT_FALSE(Exists(path)) << "removed by its owner";
}

TEST_F(SwapFileTest, RoundTripOfEveryRegionAsyncAndSync) {
  ASSERT_OK_AND_ASSIGN(auto swap, SwapFile::Create(aio_.get(), File("s"), kRegions));
  std::vector<AlignedBuffer> out, in;
  std::vector<SwapFile::Io> ios;
  for (size_t i = 0; i < kRegions.size(); ++i) {
    out.push_back(Pattern(kRegions[i].bytes, 10 + i));
    ASSERT_OK_AND_ASSIGN(SwapFile::Io io, swap->StartWrite(i, out.back().data()));
    ios.push_back(io);
  }
  for (const auto& io : ios) ASSERT_OK(swap->Finish(io));
  for (size_t i = 0; i < kRegions.size(); ++i) {
    in.push_back(std::move(AlignedBuffer::Allocate(kRegions[i].bytes).value()));
    ASSERT_OK(swap->Read(i, in.back().data()));
    EXPECT_EQ(std::memcmp(in[i].data(), out[i].data(), kRegions[i].bytes), 0) << "region " << i;
  }
  // Overwrite one region; the others keep their contents.
  AlignedBuffer again = Pattern(kRegions[1].bytes, 99);
  ASSERT_OK(swap->Write(1, again.data()));
  ASSERT_OK(swap->Read(1, in[1].data()));
  EXPECT_EQ(std::memcmp(in[1].data(), again.data(), kRegions[1].bytes), 0);
  ASSERT_OK(swap->Read(0, in[0].data()));
  EXPECT_EQ(std::memcmp(in[0].data(), out[0].data(), kRegions[0].bytes), 0);
}

TEST_F(SwapFileTest, MisuseIsRefused) {
  ASSERT_OK_AND_ASSIGN(auto swap, SwapFile::Create(aio_.get(), File("s"), kRegions));
  AlignedBuffer b = Pattern(300000, 1);
  Status st = swap->Read(0, b.data());
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("region 0 'layer0.exp_avg'"), std::string::npos) << st.message();
  EXPECT_EQ(swap->Write(9, b.data()).code(), StatusCode::kOutOfRange);
  ASSERT_OK_AND_ASSIGN(SwapFile::Io io, swap->StartWrite(1, b.data()));
  EXPECT_EQ(swap->StartRead(1, b.data()).status().code(), StatusCode::kFailedPrecondition)
      << "one I/O per region at a time";
  ASSERT_OK(swap->Finish(io));
  EXPECT_EQ(swap->Finish(io).code(), StatusCode::kFailedPrecondition) << "finished twice";
  EXPECT_EQ(swap->Write(2, b.bytes() + 8).code(), StatusCode::kInvalidArgument) << "unaligned";
}

TEST_F(SwapFileTest, CorruptedRegionIsDataLossNamingFileRegionOffset) {
  const std::string path = File("s");
  ASSERT_OK_AND_ASSIGN(auto swap, SwapFile::Create(aio_.get(), path, kRegions));
  AlignedBuffer b = Pattern(kRegions[1].bytes, 3);
  ASSERT_OK(swap->Write(1, b.data()));
  // Flip one byte inside region 1 behind the engine's back.
  int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char c;
  ASSERT_EQ(::pread(fd, &c, 1, 4096 + 12345), 1);
  c ^= 0x20;
  ASSERT_EQ(::pwrite(fd, &c, 1, 4096 + 12345), 1);
  ::close(fd);
  Status st = swap->Read(1, b.data());
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.ToString();
  for (const char* part :
       {"region 1 'layer0.exp_avg_sq'", "offset 4096", "300000 bytes", "checksum mismatch: expected crc32c 0x"}) {
    EXPECT_NE(st.message().find(part), std::string::npos) << part << " in " << st.message();
  }
  EXPECT_NE(st.message().find(path), std::string::npos);
  // A byte in the padding is not part of the tensor: still readable.
  ASSERT_OK(swap->Write(0, b.data()));
  fd = ::open(path.c_str(), O_RDWR);
  ASSERT_EQ(::pwrite(fd, "z", 1, 2000), 1);
  ::close(fd);
  ASSERT_OK(swap->Read(0, b.data()));
}

TEST_F(SwapFileTest, TruncatedFileIsDataLossNamingTheRegion) {
  const std::string path = File("s");
  ASSERT_OK_AND_ASSIGN(auto swap, SwapFile::Create(aio_.get(), path, kRegions));
  std::vector<AlignedBuffer> bufs;
  for (size_t i = 0; i < kRegions.size(); ++i) {
    bufs.push_back(Pattern(kRegions[i].bytes, i));
    ASSERT_OK(swap->Write(i, bufs.back().data()));
  }
  ASSERT_EQ(::truncate(path.c_str(), 100000), 0);
  ASSERT_OK(swap->Read(0, bufs[0].data()));  // region 0 is intact
  Status st = swap->Read(1, bufs[1].data());
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.ToString();
  EXPECT_NE(st.message().find("region 1 'layer0.exp_avg_sq' (offset 4096"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("end of file"), std::string::npos) << st.message();
  st = swap->Read(3, bufs[3].data());
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.ToString();
  EXPECT_NE(st.message().find("region 3 'tiny'"), std::string::npos) << st.message();
}

TEST_F(SwapFileTest, InjectedWriteErrorLeavesTheRegionUnreadable) {
  ASSERT_OK_AND_ASSIGN(auto swap, SwapFile::Create(aio_.get(), File("s"), kRegions));
  AlignedBuffer b = Pattern(kRegions[1].bytes, 3);
  aio_->FailNthWrite(aio_->writes_reaped() + 1, EIO);
  Status st = swap->Write(1, b.data());
  EXPECT_EQ(st.code(), StatusCode::kInternal) << st.ToString();
  EXPECT_NE(st.message().find("region 1 'layer0.exp_avg_sq'"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("Input/output error"), std::string::npos);
  EXPECT_EQ(swap->Read(1, b.data()).code(), StatusCode::kFailedPrecondition);
  ASSERT_OK(swap->Write(1, b.data()));
  aio_->FailNthRead(aio_->reads_reaped() + 2, EIO);
  st = swap->Read(1, b.data());
  EXPECT_EQ(st.code(), StatusCode::kInternal) << st.ToString();
  EXPECT_NE(st.message().find("pread"), std::string::npos) << st.message();
  ASSERT_OK(swap->Read(1, b.data()));  // a failed read does not invalidate the region
}

TEST_F(SwapFileTest, PrewriteZeroFillsTheFileOnceAndItsErrorRemovesIt) {
  const std::string path = File("s");
  const int writes_before = aio_->writes_reaped();
  {
    ASSERT_OK_AND_ASSIGN(auto swap, SwapFile::Create(aio_.get(), path, kRegions, {true}));
    // 65536-byte pieces over the whole file.
    EXPECT_EQ(static_cast<uint64_t>(aio_->writes_reaped() - writes_before), (swap->file_size() + 65535) / 65536);
    std::ifstream f(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_EQ(bytes, std::string(swap->file_size(), '\0'));
    AlignedBuffer b = Pattern(kRegions[1].bytes, 4);
    EXPECT_EQ(swap->Read(1, b.data()).code(), StatusCode::kFailedPrecondition)
        << "zero-filled is not written: a region is readable only after its own write";
    ASSERT_OK(swap->Write(1, b.data()));
    AlignedBuffer in = Pattern(kRegions[1].bytes, 5);
    ASSERT_OK(swap->Read(1, in.data()));
    EXPECT_EQ(std::memcmp(b.data(), in.data(), kRegions[1].bytes), 0);
  }
  aio_->FailNthWrite(aio_->writes_reaped() + 2, ENOSPC);
  auto r = SwapFile::Create(aio_.get(), path, kRegions, {true});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
  EXPECT_NE(r.status().message().find("prewrite (zero-fill)"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().message();
  EXPECT_FALSE(Exists(path)) << "a failed prewrite leaves no file behind";
}

TEST_F(SwapFileTest, ExistingMissingAndUnwritablePaths) {
  const std::string path = File("s");
  ASSERT_OK_AND_ASSIGN(auto swap, SwapFile::Create(aio_.get(), path, kRegions));
  auto r = SwapFile::Create(aio_.get(), path, kRegions);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("exists already"), std::string::npos) << r.status().message();
  EXPECT_TRUE(Exists(path)) << "the existing file is not touched";
  r = SwapFile::Create(aio_.get(), File("missing/dir/s"), kRegions);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound) << r.status().ToString();
  EXPECT_NE(r.status().message().find(File("missing/dir/s")), std::string::npos);
  aio_->FailNextOpen(EIO);
  r = SwapFile::Create(aio_.get(), File("s2"), kRegions);
  EXPECT_FALSE(r.ok());
  EXPECT_FALSE(Exists(File("s2"))) << "nothing left behind after a failed create";
  auto m = ScopedMount::Create(File("ro"), "tmpfs", "size=1m", /*read_only=*/true);
  if (!m.ok()) GTEST_SKIP() << m.status().message();
  r = SwapFile::Create(aio_.get(), File("ro/s"), kRegions);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status().ToString();
  EXPECT_NE(r.status().message().find("not writable"), std::string::npos) << r.status().message();
}

TEST_F(SwapFileTest, DiskFullAtCreationOnARealSmallFilesystem) {
  auto m = ScopedMount::Create(File("small"), "tmpfs", "size=1m");
  if (!m.ok()) GTEST_SKIP() << m.status().message() << " (disk full is tested with injected ENOSPC)";
  auto r = SwapFile::Create(aio_.get(), File("small/s"), {{"big", 8 << 20}});
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
  for (const char* part : {"cannot preallocate 8388608 bytes (8 MiB)", "No space left on device", "larger disk"}) {
    EXPECT_NE(r.status().message().find(part), std::string::npos) << part << " in " << r.status().message();
  }
  EXPECT_FALSE(Exists(File("small/s")));
  // What fits is created (buffered fallback where the kernel has no O_DIRECT on tmpfs).
  AioOptions o;
  o.allow_buffered_fallback = true;
  ASSERT_OK_AND_ASSIGN(auto aio, LibaioEngine::Create(o));
  ASSERT_OK_AND_ASSIGN(auto swap, SwapFile::Create(aio.get(), File("small/s"), {{"fits", 65536}}));
  AlignedBuffer b = Pattern(65536, 1);
  ASSERT_OK(swap->Write(0, b.data()));
  ASSERT_OK(swap->Read(0, b.data()));
}

// The plain file operations go through SwapFileOptions::file_system: a disk full at preallocation, a
// read-only directory and a failed size check, injected where no small or read-only mount is at hand.
TEST_F(SwapFileTest, FileSystemFaultsAtCreationAndInTheSizeCheck) {
  FaultyFileSystem fs;
  SwapFileOptions options;
  options.file_system = &fs;
  fs.FailNthCall("Allocate", 1, ENOSPC);
  auto r = SwapFile::Create(aio_.get(), File("s"), kRegions, options);
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
  for (const char* part :
       {"create swap file", "cannot preallocate 315392 bytes (0 MiB)", "No space left on device", "larger disk"}) {
    EXPECT_NE(r.status().message().find(part), std::string::npos) << part << " in " << r.status().message();
  }
  EXPECT_FALSE(Exists(File("s"))) << "a failed preallocation leaves no file behind";

  fs.FailNthCall("CreateFile", 2, EROFS);
  r = SwapFile::Create(aio_.get(), File("s"), kRegions, options);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status().ToString();
  EXPECT_NE(r.status().message().find("create swap file " + File("s") + ": Read-only file system"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("not writable"), std::string::npos) << r.status().message();

  ASSERT_OK_AND_ASSIGN(auto swap, SwapFile::Create(aio_.get(), File("s"), kRegions, options));
  AlignedBuffer b = Pattern(swap->region(0).padded_bytes, 7);
  ASSERT_OK(swap->Write(0, b.data()));
  fs.FailNthCall("FileStat", fs.call_count("FileStat") + 1, EIO);
  Status st = swap->Read(0, b.data());
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("region 0 'layer0.exp_avg'"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("Input/output error"), std::string::npos) << st.message();
  ASSERT_OK(swap->Read(0, b.data()));
  const int64_t removes = fs.call_count("RemoveFile");
  swap.reset();
  EXPECT_EQ(fs.call_count("RemoveFile"), removes + 1);
  EXPECT_FALSE(Exists(File("s")));
}

}  // namespace
}  // namespace zero
