#include "engine/checkpoint/safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/checkpoint/io.h"

namespace zero {
namespace {

using nlohmann::ordered_json;

// The reference implementation refuses headers above 100 MB.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || (d != 0 && n > INT64_MAX / d)) return -1;
    n *= d;
  }
  return n;
}

}  // namespace

size_t SafetensorsDtypeSize(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL") return 1;
  return 0;
}

Result<uint64_t> WriteSafetensors(const std::string& path, const std::vector<SafetensorsTensorRef>& tensors,
                                  const std::map<std::string, std::string>& metadata) {
  ordered_json header = ordered_json::object();
  if (!metadata.empty()) {
    ordered_json m = ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const SafetensorsTensorRef& t : tensors) {
    const std::string where = path + ": tensor '" + t.name + "'";
    if (t.name.empty() || t.name == "__metadata__") {
      return InvalidArgumentError(where + ": not a valid tensor name");
    }
    if (!names.insert(t.name).second) return InvalidArgumentError(where + ": name used twice");
    const size_t esize = SafetensorsDtypeSize(t.dtype);
    if (esize == 0) return InvalidArgumentError(where + ": unknown dtype '" + t.dtype + "'");
    const int64_t numel = Numel(t.shape);
    if (numel < 0 || static_cast<uint64_t>(numel) * esize != t.nbytes) {
      return InvalidArgumentError(where + ": " + std::to_string(t.nbytes) +
                                  " bytes do not hold its shape's elements of " + t.dtype);
    }
    if (t.nbytes > 0 && t.data == nullptr) return InvalidArgumentError(where + ": no data");
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.nbytes}}};
    offset += t.nbytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t header_len = text.size();

  ZERO_ASSIGN_OR_RETURN(AtomicFileWriter w, AtomicFileWriter::Open(path));
  ZERO_RETURN_IF_ERROR(w.Append(&header_len, sizeof(header_len)));  // little-endian host
  ZERO_RETURN_IF_ERROR(w.Append(text));
  for (const SafetensorsTensorRef& t : tensors) {
    if (t.nbytes > 0) ZERO_RETURN_IF_ERROR(w.Append(t.data, t.nbytes));
  }
  const uint64_t total = w.size();
  ZERO_RETURN_IF_ERROR(w.Commit());
  return total;
}

std::vector<float> SafetensorsTensor::AsFloats() const {
  ZERO_CHECK_MSG(dtype == "F32", name);
  std::vector<float> out(data.size() / sizeof(float));
  std::memcpy(out.data(), data.data(), out.size() * sizeof(float));
  return out;
}

const SafetensorsTensor* SafetensorsFile::Find(const std::string& name) const {
  for (const SafetensorsTensor& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

namespace {

// A tensor's byte range in the data section and its index in SafetensorsFile::tensors as read.
struct Slot {
  uint64_t begin, end;
  size_t index;
};

// The JSON header that follows the 8-byte length; *data_start is where the tensor data begins.
Result<ordered_json> ReadHeader(const std::string& path, const std::string& bytes, uint64_t* data_start) {
  if (bytes.size() < 8) {
    return DataLossError(path + ": truncated: expected at least 8 bytes, got " + std::to_string(bytes.size()));
  }
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  if (n > kMaxHeaderBytes || n > bytes.size() - 8) {
    return DataLossError(path + ": header length " + std::to_string(n) + " exceeds the file (" +
                         std::to_string(bytes.size()) + " bytes) or the 100 MB limit");
  }
  ordered_json header;
  try {
    header = ordered_json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  } catch (const ordered_json::exception& e) {
    return DataLossError(path + ": header is not valid JSON: " + e.what());
  }
  if (!header.is_object()) return DataLossError(path + ": header is not a JSON object");
  *data_start = 8 + n;
  return header;
}

// The header's __metadata__ entry: an object of strings.
Status ReadMetadataEntry(const std::string& path, const ordered_json& value, SafetensorsFile* file) {
  if (!value.is_object()) return DataLossError(path + ": __metadata__ is not an object");
  for (const auto& [mk, mv] : value.items()) {
    if (!mv.is_string()) return DataLossError(path + ": __metadata__['" + mk + "'] is not a string");
    file->metadata[mk] = mv.get<std::string>();
  }
  return OkStatus();
}

// The header's entry for tensor `key`: its dtype, shape and data, whose offsets must fit its shape
// and the data section. Appends the tensor to file->tensors and its slot to *slots.
Status ReadTensorEntry(const std::string& path, const std::string& key, const ordered_json& value,
                       const std::string& bytes, uint64_t data_start, SafetensorsFile* file, std::vector<Slot>* slots) {
  const uint64_t data_size = bytes.size() - data_start;
  const std::string where = path + ": tensor '" + key + "'";
  if (!value.is_object() || !value.contains("dtype") || !value["dtype"].is_string() || !value.contains("shape") ||
      !value["shape"].is_array() || !value.contains("data_offsets") || !value["data_offsets"].is_array() ||
      value["data_offsets"].size() != 2) {
    return DataLossError(where + ": needs dtype (string), shape (array), data_offsets ([begin, end])");
  }
  SafetensorsTensor t;
  t.name = key;
  t.dtype = value["dtype"].get<std::string>();
  const size_t esize = SafetensorsDtypeSize(t.dtype);
  if (esize == 0) return DataLossError(where + ": unknown dtype '" + t.dtype + "'");
  for (const auto& d : value["shape"]) {
    if (!d.is_number_unsigned()) return DataLossError(where + ": shape holds a non-integer or negative dim");
    t.shape.push_back(d.get<int64_t>());
  }
  const auto& off = value["data_offsets"];
  if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
    return DataLossError(where + ": data_offsets are not non-negative integers");
  }
  const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
  const int64_t numel = Numel(t.shape);
  if (e < b || e > data_size || numel < 0 || static_cast<uint64_t>(numel) * esize != e - b) {
    return DataLossError(where + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(e) +
                         ") do not fit its shape and dtype within the " + std::to_string(data_size) + " data bytes");
  }
  t.data.assign(bytes.data() + data_start + b, e - b);
  slots->push_back({b, e, file->tensors.size()});
  file->tensors.push_back(std::move(t));
  return OkStatus();
}

// Checks that the slots cover the `data_size` data bytes contiguously and puts file->tensors in the
// order of their data.
Status OrderTensorsByOffset(const std::string& path, uint64_t data_size, std::vector<Slot> slots,
                            SafetensorsFile* file) {
  std::sort(slots.begin(), slots.end(),
            [](const Slot& x, const Slot& y) { return x.begin != y.begin ? x.begin < y.begin : x.end < y.end; });
  uint64_t pos = 0;
  for (const Slot& s : slots) {
    if (s.begin != pos) {
      return DataLossError(path + ": tensor '" + file->tensors[s.index].name + "' starts at data byte " +
                           std::to_string(s.begin) + ", expected " + std::to_string(pos) +
                           " (offsets must be contiguous)");
    }
    pos = s.end;
  }
  if (pos != data_size) {
    return DataLossError(path + ": tensors cover " + std::to_string(pos) + " data bytes, the file has " +
                         std::to_string(data_size));
  }
  std::vector<SafetensorsTensor> ordered;
  ordered.reserve(slots.size());
  for (const Slot& s : slots) ordered.push_back(std::move(file->tensors[s.index]));
  file->tensors = std::move(ordered);
  return OkStatus();
}

}  // namespace

Result<SafetensorsFile> ReadSafetensors(const std::string& path) {
  ZERO_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  uint64_t data_start = 0;
  ZERO_ASSIGN_OR_RETURN(ordered_json header, ReadHeader(path, bytes, &data_start));
  SafetensorsFile file;
  std::vector<Slot> slots;
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      ZERO_RETURN_IF_ERROR(ReadMetadataEntry(path, value, &file));
    } else {
      ZERO_RETURN_IF_ERROR(ReadTensorEntry(path, key, value, bytes, data_start, &file, &slots));
    }
  }
  ZERO_RETURN_IF_ERROR(OrderTensorsByOffset(path, bytes.size() - data_start, std::move(slots), &file));
  return file;
}

}  // namespace zero
