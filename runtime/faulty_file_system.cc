#include "runtime/faulty_file_system.h"

#include <unistd.h>

#include <cerrno>

#include <utility>

namespace zero {
namespace {

void SetErr(int* err, int value) {
  if (err != nullptr) *err = value;
}

}  // namespace

class FaultyFileSystem::File final : public WritableFile {
 public:
  File(FaultyFileSystem* fs, std::unique_ptr<WritableFile> inner) : fs_(fs), inner_(std::move(inner)) {}

  const std::string& path() const override { return inner_->path(); }

  Status Append(const void* data, size_t size) override {
    if (const int e = fs_->Enter("Append")) return ErrnoError("write", path(), e);
    return inner_->Append(data, size);
  }
  Status Allocate(uint64_t size, int* err) override {
    if (const int e = fs_->Enter("Allocate")) {
      SetErr(err, e);
      return ErrnoError("allocate", path(), e);
    }
    return inner_->Allocate(size, err);
  }
  Status Sync() override {
    if (const int e = fs_->Enter("Sync")) return ErrnoError("fsync", path(), e);
    return inner_->Sync();
  }
  Result<FileInfo> Stat() override {
    if (const int e = fs_->Enter("FileStat")) return ErrnoError("fstat", path(), e);
    return inner_->Stat();
  }
  Status Close() override {
    if (const int e = fs_->Enter("Close")) {
      inner_->Close().IgnoreError();  // close(2) releases the descriptor even when it fails
      return ErrnoError("close", path(), e);
    }
    return inner_->Close();
  }

 private:
  FaultyFileSystem* const fs_;
  std::unique_ptr<WritableFile> inner_;
};

FaultyFileSystem::FaultyFileSystem(FileSystem* inner) : inner_(FileSystemOrDefault(inner)) {}

void FaultyFileSystem::FailNthCall(const std::string& op, int64_t nth, int err, bool persistent) {
  std::lock_guard<std::mutex> lock(mu_);
  rules_[op] = Rule{nth, err, persistent};
}

void FaultyFileSystem::SetExchangeSupported(bool supported) {
  std::lock_guard<std::mutex> lock(mu_);
  exchange_supported_ = supported;
}

void FaultyFileSystem::ExitAtCrashPoint(const std::string& point, int rank, int exit_code) {
  std::lock_guard<std::mutex> lock(mu_);
  exit_point_ = point;
  exit_rank_ = rank;
  exit_code_ = exit_code;
}

void FaultyFileSystem::ClearFaults() {
  std::lock_guard<std::mutex> lock(mu_);
  rules_.clear();
  exchange_supported_ = true;
  exit_point_.clear();
}

int64_t FaultyFileSystem::call_count(const std::string& op) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = counts_.find(op);
  return it == counts_.end() ? 0 : it->second;
}

std::vector<std::string> FaultyFileSystem::crash_points_reached() const {
  std::lock_guard<std::mutex> lock(mu_);
  return points_reached_;
}

int FaultyFileSystem::Enter(const char* op) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t n = ++counts_[op];
  auto it = rules_.find(op);
  if (it == rules_.end()) return 0;
  const Rule& r = it->second;
  if (n == r.nth || (r.persistent && n > r.nth)) return r.err;
  return 0;
}

Result<std::unique_ptr<WritableFile>> FaultyFileSystem::CreateFile(const std::string& path, int mode, int* err) {
  if (const int e = Enter("CreateFile")) {
    SetErr(err, e);
    return ErrnoError("create", path, e);
  }
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, inner_->CreateFile(path, mode, err));
  return std::unique_ptr<WritableFile>(new File(this, std::move(file)));
}

Result<std::string> FaultyFileSystem::ReadFile(const std::string& path) {
  if (const int e = Enter("ReadFile")) return ErrnoError("read", path, e);
  return inner_->ReadFile(path);
}

Result<std::string> FaultyFileSystem::ReadFileRange(const std::string& path, uint64_t offset, size_t size) {
  if (const int e = Enter("ReadFileRange")) return ErrnoError("read", path, e);
  return inner_->ReadFileRange(path, offset, size);
}

Result<FileInfo> FaultyFileSystem::Stat(const std::string& path) {
  if (const int e = Enter("Stat")) return ErrnoError("stat", path, e);
  return inner_->Stat(path);
}

Result<FileInfo> FaultyFileSystem::LinkStat(const std::string& path) {
  if (const int e = Enter("LinkStat")) return ErrnoError("stat", path, e);
  return inner_->LinkStat(path);
}

Status FaultyFileSystem::RemoveFile(const std::string& path) {
  if (const int e = Enter("RemoveFile")) return ErrnoError("unlink", path, e);
  return inner_->RemoveFile(path);
}

Status FaultyFileSystem::CreateDirectory(const std::string& path, int* err) {
  if (const int e = Enter("CreateDirectory")) {
    SetErr(err, e);
    return ErrnoError("mkdir", path, e);
  }
  return inner_->CreateDirectory(path, err);
}

Status FaultyFileSystem::RemoveDirectory(const std::string& path) {
  if (const int e = Enter("RemoveDirectory")) return ErrnoError("rmdir", path, e);
  return inner_->RemoveDirectory(path);
}

Result<std::vector<std::string>> FaultyFileSystem::ListDirectory(const std::string& dir) {
  if (const int e = Enter("ListDirectory")) return ErrnoError("open directory", dir, e);
  return inner_->ListDirectory(dir);
}

Status FaultyFileSystem::SyncDirectory(const std::string& dir) {
  if (const int e = Enter("SyncDirectory")) return ErrnoError("fsync directory", dir, e);
  return inner_->SyncDirectory(dir);
}

Status FaultyFileSystem::Rename(const std::string& from, const std::string& to) {
  if (const int e = Enter("Rename")) return ErrnoError("rename " + from + " to", to, e);
  return inner_->Rename(from, to);
}

Status FaultyFileSystem::Exchange(const std::string& a, const std::string& b) {
  if (const int e = Enter("Exchange")) return ErrnoError("exchange " + a + " and", b, e);
  bool supported;
  {
    std::lock_guard<std::mutex> lock(mu_);
    supported = exchange_supported_;
  }
  if (!supported) {
    return UnimplementedError("exchange " + a + " and " + b +
                              ": turned off by a FaultyFileSystem (as where renameat2(RENAME_EXCHANGE) is "
                              "not supported)");
  }
  return inner_->Exchange(a, b);
}

Result<std::unique_ptr<FileLock>> FaultyFileSystem::LockFile(const std::string& path, LockFileFailure* failure) {
  if (const int e = Enter("LockFile")) {
    // An injected errno reads as flock's: EWOULDBLOCK as another holder, anything else as a failure.
    if (e == EWOULDBLOCK) {
      if (failure != nullptr) *failure = LockFileFailure{LockFileFailure::Step::kHeld, e};
      return FailedPreconditionError("lock " + path + ": held by another process");
    }
    if (failure != nullptr) *failure = LockFileFailure{LockFileFailure::Step::kOther, e};
    return ErrnoError("flock", path, e);
  }
  return inner_->LockFile(path, failure);
}

Status FaultyFileSystem::UnlockFile(std::unique_ptr<FileLock> lock) {
  if (const int e = Enter("UnlockFile")) {
    const std::string path = lock != nullptr ? lock->path() : std::string();
    inner_->UnlockFile(std::move(lock)).IgnoreError();  // close(2) releases the lock even when it fails
    return ErrnoError("close", path, e);
  }
  return inner_->UnlockFile(std::move(lock));
}

void FaultyFileSystem::CrashPoint(const char* point, int rank) {
  int code = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    points_reached_.push_back(std::string(point) + "@" + std::to_string(rank));
    if (!exit_point_.empty() && exit_point_ == point && exit_rank_ == rank) code = exit_code_;
  }
  if (code >= 0) ::_exit(code);  // no destructors, no flushing: as a kill would leave it
  inner_->CrashPoint(point, rank);
}

}  // namespace zero
