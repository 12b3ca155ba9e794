// safetensors files (Hugging Face's format), the project's one reader and writer of them: a
// validating reader that reads tensors (or element ranges of them) on demand, and a writer that
// streams tensors into a file written atomically. The model directories (hf/model_dir.h) and the
// engine's consolidation to fp32 (engine/checkpoint/consolidate.h, tools/zero_to_fp32) both use it;
// it depends on runtime/ only, so the engine layer may (hf/BUILD).
//
// Layout (the format, byte for byte): a u64 little-endian header length N, N bytes of UTF-8 JSON
// {"__metadata__": {string: string}, "<name>": {"dtype": "BF16", "shape": [...], "data_offsets":
// [begin, end]}, ...}, then the byte buffer, which the tensors' [begin, end) ranges (relative to the
// buffer's start) cover exactly, without overlap or gap. The writer puts __metadata__ first (keys
// sorted), pads the header with spaces so the buffer starts 8-byte aligned and lays tensors out in
// the order given. Only F32, BF16 and F16 tensors are accepted (the dtypes the engine computes in).
// Open reads only the header (through runtime/json_input.h: nesting, number range and duplicate
// keys checked) and keeps the file descriptor, so a ZeRO stage 3 rank reads just its partition of
// each tensor. Files are written with runtime/atomic_file.h's protocol (temporary file, fsync,
// rename, fsync of the directory). Every error names the file and, where it applies, the tensor and
// byte offsets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/atomic_file.h"
#include "runtime/dtype.h"
#include "runtime/status.h"

namespace zero::llm {

// "F32", "BF16", "F16": the safetensors spelling of a dtype.
const char* SafetensorsDTypeName(DType dtype);

// One tensor of an open file. data_begin/data_end are byte offsets relative to the start of the
// byte buffer (as in the header's data_offsets).
struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // {} for a scalar (one element)
  uint64_t data_begin = 0;
  uint64_t data_end = 0;

  int64_t numel() const;
};

// An open, validated safetensors file. Move-only; owns its file descriptor (closed by the
// destructor). Reads use pread and do not modify the object, so several threads may read from one
// file at once.
class SafetensorsFile {
 public:
  // Reads and validates the header; reads no tensor data. Refuses (DATA_LOSS, or INVALID_ARGUMENT
  // for a file that is not a regular file, NOT_FOUND when missing), naming the file and the tensor:
  // a file shorter than 8 or 8 + N bytes, N above 100 MB, a header that is not a JSON object (or
  // nests deeper than 64 levels, repeats a key or holds a number beyond double's range), an entry
  // without dtype/shape/data_offsets or with wrong types, a dtype other than F32/BF16/F16, negative
  // dims or an overflowing element count, end - begin != numel * dtype size, ranges past the end of
  // the file, overlapping ranges, gaps (bytes of the buffer no tensor covers). A FIFO or device is
  // refused without blocking.
  static Result<SafetensorsFile> Open(const std::string& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  // In order of data_begin.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // nullptr when the file has no tensor of that name.
  const TensorInfo* Find(const std::string& name) const;
  // Offset of the byte buffer in the file (8 + N).
  uint64_t data_start() const { return data_start_; }

  // Reads elements [begin_element, begin_element + count) of `info` (flat, row-major) and converts
  // them to float into out[0, count). Only those bytes are read. `info` must be one of tensors()
  // (INVALID_ARGUMENT otherwise, and for a range outside the tensor). A short read (the file shrank
  // after Open) is DATA_LOSS; an I/O error carries the errno text; both name the file, tensor and
  // byte offsets. On error out's contents are unspecified.
  Status ReadAsFloat(const TensorInfo& info, int64_t begin_element, int64_t count, float* out) const;
  // Reads the tensor's raw little-endian bytes (data_end - data_begin of them) into `out`.
  Status ReadRaw(const TensorInfo& info, void* out) const;
  // The whole tensor (numel elements) converted to float; errors as ReadAsFloat's.
  Result<std::vector<float>> ReadFloats(const TensorInfo& info) const;

 private:
  SafetensorsFile() = default;
  Status CheckOwned(const TensorInfo& info) const;
  Status PreadExact(const TensorInfo& info, uint64_t offset, size_t size, void* out) const;

  std::string path_;
  int fd_ = -1;
  uint64_t data_start_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

// A tensor to write: `data` holds numel * SizeOf(dtype) bytes (may be null when numel is 0) and
// must stay valid during the call.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

// Writes a safetensors file atomically (a crash leaves either the old file or the new one under
// `path`, never half a file): tensors in the given order with contiguous offsets, `metadata` as
// __metadata__ (omitted when empty), the header padded with spaces to a multiple of 8 bytes. Names
// must be unique, non-empty, valid UTF-8 and not "__metadata__" (INVALID_ARGUMENT naming the tensor).
Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

// The same file written tensor by tensor, for data that is produced one tensor at a time (the
// export converts each tensor just before writing it). Open takes every tensor's name, dtype and
// shape (TensorToWrite::data is ignored) and writes the header; Append is then called with each
// tensor's bytes in order (a tensor's bytes may come in several calls); Commit checks that every
// byte arrived and publishes the file. Dropping the writer before Commit leaves `path` untouched.
// Move-only; one thread at a time.
class SafetensorsWriter {
 public:
  static Result<SafetensorsWriter> Open(const std::string& path, const std::vector<TensorToWrite>& layout,
                                        const std::map<std::string, std::string>& metadata = {});

  // Appends the next `size` bytes of the buffer (INVALID_ARGUMENT past the last tensor's end).
  Status Append(const void* data, size_t size);
  // REQUIRES: every tensor's bytes appended (INVALID_ARGUMENT naming the first incomplete tensor
  // otherwise, and nothing is published).
  Status Commit();

  // Bytes of tensor data the file holds (the sum of the tensors' sizes).
  uint64_t data_bytes() const { return data_bytes_; }
  // The size the committed file has: 8 + the padded header + data_bytes().
  uint64_t file_bytes() const { return header_bytes_ + data_bytes_; }

 private:
  SafetensorsWriter(AtomicFileWriter writer, std::vector<TensorToWrite> layout, std::vector<uint64_t> ends,
                    uint64_t header_bytes);

  AtomicFileWriter writer_;
  std::vector<TensorToWrite> layout_;
  std::vector<uint64_t> ends_;  // each tensor's data_end
  uint64_t header_bytes_ = 0;   // 8 + N
  uint64_t data_bytes_ = 0;
  uint64_t written_ = 0;
};

// Reads a whole small file that must be a regular file (JSON sidecars such as an index or a
// config): opened without blocking, so a FIFO is refused rather than waited on; refused above
// `max_bytes`. NOT_FOUND when missing.
Result<std::string> ReadRegularFile(const std::string& path, uint64_t max_bytes);

}  // namespace zero::llm
