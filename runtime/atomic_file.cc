#include "runtime/atomic_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <random>
#include <utility>

#include "runtime/crc32c.h"

namespace zero {
namespace {

// Appends stay in a user-space buffer up to this size; bigger ones are written directly.
constexpr size_t kBufferSize = 1 << 20;

uint64_t RandomSuffix() {
  static thread_local std::mt19937_64 gen([] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(::getpid());
  }());
  return gen();
}

}  // namespace

AtomicFileWriter::AtomicFileWriter(FileSystem* fs, std::string path, std::unique_ptr<WritableFile> file)
    : fs_(fs), path_(std::move(path)), temp_path_(file->path()), file_(std::move(file)) {}

Result<AtomicFileWriter> AtomicFileWriter::Open(FileSystem& fs, const std::string& path) {
  for (int attempt = 0; attempt < 8; ++attempt) {
    char suffix[64];
    std::snprintf(suffix, sizeof(suffix), ".tmp.%d.%016llx", static_cast<int>(::getpid()),
                  static_cast<unsigned long long>(RandomSuffix()));
    int err = 0;
    Result<std::unique_ptr<WritableFile>> file = fs.CreateFile(path + suffix, 0644, &err);
    if (file.ok()) return AtomicFileWriter(&fs, path, std::move(file).value());
    if (err != EEXIST) return file.status();
  }
  return InternalError("create " + path + ".tmp.*: no free temporary name after 8 attempts");
}

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& o) noexcept
    : fs_(o.fs_),
      path_(std::move(o.path_)),
      temp_path_(std::move(o.temp_path_)),
      file_(std::move(o.file_)),
      buffer_(std::move(o.buffer_)),
      crc_(o.crc_),
      size_(o.size_),
      committed_(o.committed_) {
  o.committed_ = true;  // the moved-from writer owns nothing to discard
}

AtomicFileWriter& AtomicFileWriter::operator=(AtomicFileWriter&& o) noexcept {
  if (this != &o) {
    Discard();
    fs_ = o.fs_;
    path_ = std::move(o.path_);
    temp_path_ = std::move(o.temp_path_);
    file_ = std::move(o.file_);
    buffer_ = std::move(o.buffer_);
    crc_ = o.crc_;
    size_ = o.size_;
    committed_ = o.committed_;
    o.committed_ = true;
  }
  return *this;
}

AtomicFileWriter::~AtomicFileWriter() { Discard(); }

void AtomicFileWriter::Discard() {
  file_.reset();  // closes
  if (!committed_ && !temp_path_.empty()) fs_->RemoveFile(temp_path_).IgnoreError();
  committed_ = true;
}

void AtomicFileWriter::AbandonForTest() {
  if (file_ != nullptr) {
    Flush().IgnoreError();
    file_.reset();
  }
  committed_ = true;  // keep the temporary file, as a crash would
}

Status AtomicFileWriter::Flush() {
  if (buffer_.empty()) return OkStatus();
  Status st = file_->Append(buffer_.data(), buffer_.size());
  buffer_.clear();
  return st;
}

Status AtomicFileWriter::Append(const void* data, size_t size) {
  if (file_ == nullptr) return FailedPreconditionError("append to " + path_ + ": writer is closed");
  crc_ = Crc32c(data, size, crc_);
  size_ += size;
  const char* p = static_cast<const char*>(data);
  if (buffer_.size() + size <= kBufferSize) {
    buffer_.append(p, size);
    return OkStatus();
  }
  Status st = Flush();
  if (st.ok()) st = file_->Append(p, size);
  if (!st.ok()) Discard();
  return st;
}

Status AtomicFileWriter::Commit() {
  if (file_ == nullptr || committed_) return FailedPreconditionError("commit " + path_ + ": writer is closed");
  Status st = Flush();
  if (st.ok()) st = file_->Sync();
  if (st.ok()) {
    st = file_->Close();
    file_.reset();
  }
  if (st.ok()) st = fs_->Rename(temp_path_, path_);
  if (!st.ok()) {
    Discard();
    return st;
  }
  committed_ = true;
  return fs_->SyncDirectory(DirName(path_));
}

Status WriteFileAtomic(FileSystem& fs, const std::string& path, std::string_view contents) {
  ZERO_ASSIGN_OR_RETURN(AtomicFileWriter w, AtomicFileWriter::Open(fs, path));
  ZERO_RETURN_IF_ERROR(w.Append(contents));
  return w.Commit();
}

Result<std::string> ReadFileVerified(FileSystem& fs, const std::string& path, uint64_t expected_size,
                                     uint32_t expected_crc) {
  ZERO_ASSIGN_OR_RETURN(std::string data, fs.ReadFile(path));
  if (data.size() < expected_size) {
    return DataLossError(path + ": truncated: expected " + std::to_string(expected_size) + " bytes, got " +
                         std::to_string(data.size()));
  }
  if (data.size() > expected_size) {
    return DataLossError(path + ": longer than expected: expected " + std::to_string(expected_size) + " bytes, got " +
                         std::to_string(data.size()));
  }
  const uint32_t crc = Crc32c(data.data(), data.size());
  if (crc != expected_crc) {
    return DataLossError(path + ": checksum mismatch: expected crc32c " + Crc32cHex(expected_crc) + ", got " +
                         Crc32cHex(crc) + " (the file is corrupt)");
  }
  return data;
}

}  // namespace zero
