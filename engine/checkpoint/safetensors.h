// safetensors files (Hugging Face's format): the writer zero_to_fp32 uses, and a verifying reader.
//
// Layout: u64 little-endian N, then N bytes of JSON header {"__metadata__": {string: string},
// name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...} padded with spaces so
// the data starts 8-byte aligned, then the tensors' raw little-endian bytes, back to back, offsets
// relative to the start of the data. Files are written atomically (checkpoint_io.h). The reader
// checks what the reference implementation checks (header size, JSON, known dtypes, offsets
// contiguous from 0 to the end of the file, sizes = numel * dtype size) and names the file and
// tensor in errors. Owns nothing beyond the calls; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/status.h"

namespace zero {

// Bytes per element of a safetensors dtype ("F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8",
// "U8", "BOOL"); 0 when unknown.
size_t SafetensorsDtypeSize(const std::string& dtype);

// A tensor to write; `data` (nbytes = numel * dtype size) must stay valid during the call.
struct SafetensorsTensorRef {
  std::string name;
  std::string dtype = "F32";
  std::vector<int64_t> shape;  // {} for a scalar (one element)
  const void* data = nullptr;
  size_t nbytes = 0;
};

// Writes the tensors in the given order, with `metadata` as __metadata__. Names must be unique,
// non-empty and not "__metadata__". Returns the file size in bytes.
Result<uint64_t> WriteSafetensors(const std::string& path, const std::vector<SafetensorsTensorRef>& tensors,
                                  const std::map<std::string, std::string>& metadata);

struct SafetensorsTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string data;  // raw bytes
  // The data as floats. REQUIRES: dtype == "F32".
  std::vector<float> AsFloats() const;
};

struct SafetensorsFile {
  std::map<std::string, std::string> metadata;
  std::vector<SafetensorsTensor> tensors;  // in data order
  const SafetensorsTensor* Find(const std::string& name) const;
};

// Reads and validates a whole file (DATA_LOSS naming the file and the tensor on any violation).
Result<SafetensorsFile> ReadSafetensors(const std::string& path);

}  // namespace zero
