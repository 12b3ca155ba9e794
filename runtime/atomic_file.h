// Crash-safe whole-file writes, and reads verified against a size and a CRC32C (crc32c.h), on a
// FileSystem (file_system.h).
//
// A file is never visible half-written under its final name: AtomicFileWriter writes to
// `<path>.tmp.<pid>.<random>` in the same directory, fsyncs it, renames it over `<path>` and fsyncs
// the directory, so after Commit() returns the new contents survive a power loss, and a crash at
// any earlier point leaves whatever was at `<path>` before untouched (plus a `.tmp.` file that is
// debris, safe to delete). Every error names the file and what was wrong (missing, truncated with
// the expected and actual sizes, checksum mismatch with both values, errno text).
//
// This file owns only the temporary file it creates; what the files hold is the caller's. The
// functions are thread-safe; an AtomicFileWriter is used by one thread. The FileSystem must
// outlive every writer made on it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "runtime/file_system.h"
#include "runtime/status.h"

namespace zero {

// Writes one file atomically (see the header comment). Move-only; owns the temporary file.
// Destroying a writer that was not committed closes and removes its temporary file.
class AtomicFileWriter {
 public:
  // Creates the temporary file next to `path`. The directory must exist.
  static Result<AtomicFileWriter> Open(FileSystem& fs, const std::string& path);
  // The same on DefaultFileSystem().
  static Result<AtomicFileWriter> Open(const std::string& path) { return Open(*DefaultFileSystem(), path); }

  AtomicFileWriter(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();

  // Appends bytes (small appends are buffered; large ones go straight to the file). Updates crc().
  // After an error the temporary file is removed and the writer is closed.
  Status Append(const void* data, size_t size);
  Status Append(std::string_view data) { return Append(data.data(), data.size()); }
  // Flushes, fsyncs the file, renames it over the final path, fsyncs the directory. After an error
  // the temporary file is removed and the final path is unchanged. REQUIRES: not committed yet.
  Status Commit();

  // CRC32C and count of every byte appended so far.
  uint32_t crc() const { return crc_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }

  // Tests only: closes the file and leaves the temporary file in place without renaming it, as a
  // crash between writing and Commit() would.
  void AbandonForTest();

 private:
  AtomicFileWriter(FileSystem* fs, std::string path, std::unique_ptr<WritableFile> file);
  Status Flush();
  void Discard();

  FileSystem* fs_ = nullptr;
  std::string path_;
  std::string temp_path_;
  std::unique_ptr<WritableFile> file_;  // null once closed
  std::string buffer_;
  uint32_t crc_ = 0;
  uint64_t size_ = 0;
  bool committed_ = false;
};

// Writes `contents` to `path` atomically.
Status WriteFileAtomic(FileSystem& fs, const std::string& path, std::string_view contents);

// Reads a whole file (FileSystem::ReadFile) and checks its size and CRC32C: DATA_LOSS "<path>:
// truncated: expected N bytes, got M" (or "longer than expected"), "<path>: checksum mismatch:
// expected crc32c 0x..., got 0x... (the file is corrupt)".
Result<std::string> ReadFileVerified(FileSystem& fs, const std::string& path, uint64_t expected_size,
                                     uint32_t expected_crc);

}  // namespace zero
