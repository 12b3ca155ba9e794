#include "nvme/swap_file.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "nvme/aligned_buffer.h"
#include "runtime/crc32c.h"

namespace zero {
namespace {

std::string DirOf(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : path.substr(0, slash + 1);
}

// Zeros over [0, size) of `file`, in chunks of up to 64 MiB, two in flight.
Status Prewrite(AioEngine* aio, AioFile& file, uint64_t size) {
  constexpr uint64_t kChunk = 64 << 20;
  ZERO_ASSIGN_OR_RETURN(AlignedBuffer zeros, AlignedBuffer::Allocate(std::min(size, kChunk)));
  AioTicket pending = 0;
  for (uint64_t off = 0; off < size; off += kChunk) {
    const size_t len = static_cast<size_t>(std::min(kChunk, size - off));
    Result<AioTicket> t = aio->SubmitWrite(file, off, zeros.data(), len);
    if (!t.ok()) {
      if (pending != 0) (void)aio->Wait(pending);
      return t.status();
    }
    if (pending != 0) {
      Status st = aio->Wait(pending);
      if (!st.ok()) {
        (void)aio->Wait(*t);
        return st;
      }
    }
    pending = *t;
  }
  return aio->Wait(pending);
}

}  // namespace

SwapFile::SwapFile(AioEngine* aio, FileSystem* fs, std::string path, std::unique_ptr<AioFile> file,
                   std::unique_ptr<WritableFile> created, std::vector<RegionState> regions, uint64_t file_size)
    : aio_(aio),
      fs_(fs),
      path_(std::move(path)),
      file_(std::move(file)),
      created_(std::move(created)),
      regions_(std::move(regions)),
      file_size_(file_size) {}

SwapFile::~SwapFile() {
  file_.reset();
  created_->Close().IgnoreError();
  fs_->RemoveFile(path_).IgnoreError();
}

bool SwapFile::direct() const { return file_->direct(); }

Result<std::unique_ptr<SwapFile>> SwapFile::Create(AioEngine* aio, const std::string& path,
                                                   const std::vector<SwapRegionSpec>& specs,
                                                   const SwapFileOptions& options) {
  FileSystem& fs = *FileSystemOrDefault(options.file_system);
  std::vector<RegionState> regions;
  uint64_t size = 0;
  for (const SwapRegionSpec& s : specs) {
    RegionState r;
    r.layout.name = s.name;
    r.layout.offset = size;
    r.layout.bytes = s.bytes;
    r.layout.padded_bytes = AlignUp(s.bytes, kAioAlignment);
    size += r.layout.padded_bytes;
    regions.push_back(std::move(r));
  }
  int err = 0;
  Result<std::unique_ptr<WritableFile>> created = fs.CreateFile(path, 0600, &err);
  if (!created.ok()) {
    if (err == EEXIST) {
      return FailedPreconditionError("create swap file " + path +
                                     ": it exists already (a stale swap file of an earlier run? "
                                     "remove it if no run is using it)");
    }
    if (err == 0) return created.status();  // not a system call's failure
    Status st = ErrnoError("create swap file", path, err);
    if (err == EACCES || err == EROFS || err == EPERM) {
      return FailedPreconditionError(st.message() + " (the directory is not writable)");
    }
    return st;
  }
  // Until the SwapFile owns it, every failure removes the file.
  auto remove = [&fs, &path, &created]() {
    created->reset();
    fs.RemoveFile(path).IgnoreError();
  };
  if (size > 0) {
    Status allocated = (*created)->Allocate(size, &err);
    if (!allocated.ok()) {
      remove();
      if (err == 0) return allocated;
      Status st = ErrnoError("create swap file", path, err);
      const std::string what = "create swap file " + path + ": cannot preallocate " + std::to_string(size) +
                               " bytes (" + std::to_string(size >> 20) + " MiB) on " + FilesystemType(DirOf(path));
      if (err == ENOSPC || err == EDQUOT) {
        return ResourceExhaustedError(what + ": " + std::strerror(err) +
                                      "; free disk space or point the swap path at a larger disk");
      }
      return Status(st.code(), what + ": " + std::strerror(err));
    }
  }
  auto file = aio->Open(path, AioOpenMode::kReadWrite);
  if (!file.ok()) {
    remove();
    return file.status();
  }
  if (options.prewrite && size > 0) {
    Status st = Prewrite(aio, **file, size);
    if (!st.ok()) {
      file->reset();
      remove();
      return st.WithContext("create swap file " + path + ": prewrite (zero-fill) of " + std::to_string(size) +
                            " bytes");
    }
  }
  return std::unique_ptr<SwapFile>(
      new SwapFile(aio, &fs, path, std::move(file).value(), std::move(created).value(), std::move(regions), size));
}

std::string SwapFile::Describe(size_t i) const {
  const SwapRegion& r = regions_[i].layout;
  return "swap file " + path_ + " region " + std::to_string(i) + " '" + r.name + "' (offset " +
         std::to_string(r.offset) + ", " + std::to_string(r.bytes) + " bytes)";
}

Status SwapFile::CheckRegion(size_t i) const {
  if (i >= regions_.size()) {
    return OutOfRangeError("swap file " + path_ + ": region " + std::to_string(i) + " does not exist (" +
                           std::to_string(regions_.size()) + " regions)");
  }
  if (regions_[i].busy) {
    return FailedPreconditionError(Describe(i) + ": a read or write is already in flight");
  }
  return OkStatus();
}

Status SwapFile::CheckExtent(size_t i) const {
  Result<FileInfo> info = created_->Stat();
  if (!info.ok()) return info.status().WithContext(Describe(i));
  const SwapRegion& r = regions_[i].layout;
  const uint64_t size = info->size;
  if (size < r.offset + r.padded_bytes) {
    return DataLossError(Describe(i) + ": the file ends at byte " + std::to_string(size) +
                         " (end of file inside or before the region; it was created with " +
                         std::to_string(file_size_) + " bytes): it was truncated after it was created");
  }
  return OkStatus();
}

Result<SwapFile::Io> SwapFile::StartWrite(size_t i, const void* buffer) {
  ZERO_RETURN_IF_ERROR(CheckRegion(i));
  // A write into a truncated file would re-extend it silently; a truncation is reported instead.
  ZERO_RETURN_IF_ERROR(CheckExtent(i));
  RegionState& r = regions_[i];
  Io io;
  io.region = i;
  io.buffer = buffer;
  io.crc = Crc32c(buffer, r.layout.bytes);
  auto t = aio_->SubmitWrite(*file_, r.layout.offset, buffer, r.layout.padded_bytes);
  if (!t.ok()) return t.status().WithContext(Describe(i));
  io.ticket = *t;
  r.written = false;  // unreadable until this write succeeds
  r.busy = true;
  return io;
}

Result<SwapFile::Io> SwapFile::StartRead(size_t i, void* buffer) {
  ZERO_RETURN_IF_ERROR(CheckRegion(i));
  RegionState& r = regions_[i];
  if (!r.written) {
    return FailedPreconditionError(Describe(i) + ": read before any successful write (or after a failed one)");
  }
  ZERO_RETURN_IF_ERROR(CheckExtent(i));
  Io io;
  io.region = i;
  io.read = true;
  io.buffer = buffer;
  auto t = aio_->SubmitRead(*file_, r.layout.offset, buffer, r.layout.padded_bytes);
  if (!t.ok()) return t.status().WithContext(Describe(i));
  io.ticket = *t;
  r.busy = true;
  return io;
}

Status SwapFile::Finish(const Io& io) {
  if (io.region >= regions_.size() || !regions_[io.region].busy) {
    return FailedPreconditionError("swap file " + path_ + ": Finish of region " + std::to_string(io.region) +
                                   " with nothing in flight");
  }
  RegionState& r = regions_[io.region];
  Status st = aio_->Wait(io.ticket);
  if (st.code() == StatusCode::kDeadlineExceeded) return st;  // cannot happen without a timeout
  r.busy = false;
  if (!st.ok()) return st.WithContext(Describe(io.region));
  if (!io.read) {
    r.crc = io.crc;
    r.written = true;
    return OkStatus();
  }
  const uint32_t got = Crc32c(io.buffer, r.layout.bytes);
  if (got != r.crc) {
    return DataLossError(Describe(io.region) + ": checksum mismatch: expected crc32c " + Crc32cHex(r.crc) + ", got " +
                         Crc32cHex(got) + " (the file was changed or corrupted after it was written)");
  }
  return OkStatus();
}

Status SwapFile::Write(size_t i, const void* buffer) {
  ZERO_ASSIGN_OR_RETURN(Io io, StartWrite(i, buffer));
  return Finish(io);
}

Status SwapFile::Read(size_t i, void* buffer) {
  ZERO_ASSIGN_OR_RETURN(Io io, StartRead(i, buffer));
  return Finish(io);
}

Status WithSwapFaultAdvice(const Status& s, const std::string& data_loss, const std::string& nvme_path_key,
                           const std::string& doc_section) {
  std::string advice;
  switch (s.code()) {
    case StatusCode::kDataLoss:
      advice = data_loss;
      break;
    case StatusCode::kResourceExhausted:
      advice = "the disk under " + nvme_path_key + " is full: free space there or move nvme_path to a larger disk";
      break;
    default:
      advice =
          "the disk under " + nvme_path_key + " failed an I/O (see dmesg): check it or move nvme_path to another disk";
      break;
  }
  return Status(s.code(), s.message() + "; " + advice +
                              ". This engine cannot continue: create a new one and LoadCheckpoint the last checkpoint "
                              "(docs/nvme.md, \"" +
                              doc_section + "\")");
}

}  // namespace zero
