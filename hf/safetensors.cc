#include "hf/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "runtime/json_input.h"
#include "runtime/scoped_fd.h"

namespace zero::llm {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian data; this reader copies it as is");

using nlohmann::ordered_json;

// The reference implementation refuses headers above 100 MB.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// A valid header nests three deep ({ -> { -> [); far deeper is hostile, refused before parsing.
constexpr int kMaxHeaderDepth = 64;
// Elements converted per pread when the stored dtype is 16-bit.
constexpr int64_t kConvertChunk = 1 << 16;

const char* FileTypeName(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// Opens `path` for reading without blocking (a FIFO would otherwise wait for a writer) and refuses
// anything but a regular file. Sets *size.
Result<int> OpenRegular(const std::string& path, uint64_t* size) {
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoError("open", path, errno);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoError("stat", path, errno);
  if (!S_ISREG(st.st_mode)) {
    return InvalidArgumentError(path + ": is " + FileTypeName(st.st_mode) + ", expected a regular file");
  }
  *size = static_cast<uint64_t>(st.st_size);
  return fd.release();
}

// pread of exactly `size` bytes at `offset`; *got receives how many arrived (fewer at EOF).
Status PreadLoop(int fd, const std::string& path, uint64_t offset, size_t size, void* out, size_t* got) {
  *got = 0;
  char* p = static_cast<char*>(out);
  while (*got < size) {
    ssize_t n = ::pread(fd, p + *got, size - *got, static_cast<off_t>(offset + *got));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("read", path, errno);
    }
    if (n == 0) break;
    *got += static_cast<size_t>(n);
  }
  return OkStatus();
}

bool ParseSafetensorsDType(const std::string& s, DType* out) {
  if (s == "F32")
    *out = DType::kF32;
  else if (s == "BF16")
    *out = DType::kBF16;
  else if (s == "F16")
    *out = DType::kF16;
  else
    return false;
  return true;
}

// Element count of a shape; -1 when a dim is negative or the product overflows int64.
int64_t ShapeNumel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || (d != 0 && n > INT64_MAX / d)) return -1;
    n *= d;
  }
  return n;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string Range(uint64_t b, uint64_t e) { return "[" + std::to_string(b) + ", " + std::to_string(e) + ")"; }

// The JSON encoding of `s`, or an error when it is not valid UTF-8 (what for the message).
Result<std::string> CheckUtf8(const std::string& s, const std::string& what) {
  try {
    return ordered_json(s).dump();
  } catch (const ordered_json::exception&) {
    return InvalidArgumentError(what + " is not valid UTF-8");
  }
}

}  // namespace

const char* SafetensorsDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
  }
  return "?";
}

int64_t TensorInfo::numel() const { return ShapeNumel(shape); }

// --- reading ---------------------------------------------------------------------------------------

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)),
      fd_(std::exchange(o.fd_, -1)),
      data_start_(o.data_start_),
      tensors_(std::move(o.tensors_)),
      index_(std::move(o.index_)),
      metadata_(std::move(o.metadata_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    fd_ = std::exchange(o.fd_, -1);
    data_start_ = o.data_start_;
    tensors_ = std::move(o.tensors_);
    index_ = std::move(o.index_);
    metadata_ = std::move(o.metadata_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

Result<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  SafetensorsFile file;
  file.path_ = path;
  uint64_t file_size = 0;
  ZERO_ASSIGN_OR_RETURN(file.fd_, OpenRegular(path, &file_size));

  if (file_size < 8) {
    return DataLossError(path + ": truncated: " + std::to_string(file_size) +
                         " bytes, a safetensors file starts with an 8-byte header length");
  }
  uint64_t n = 0;
  size_t got = 0;
  ZERO_RETURN_IF_ERROR(PreadLoop(file.fd_, path, 0, 8, &n, &got));
  if (got < 8) return DataLossError(path + ": truncated while reading the header length");
  if (n > kMaxHeaderBytes) {
    return DataLossError(path + ": header length " + std::to_string(n) +
                         " exceeds the format's 100 MB limit (not a safetensors file?)");
  }
  if (n > file_size - 8) {
    return DataLossError(path + ": truncated: header length " + std::to_string(n) + " runs past the end of the file (" +
                         std::to_string(file_size) + " bytes)");
  }
  std::string text(n, '\0');
  ZERO_RETURN_IF_ERROR(PreadLoop(file.fd_, path, 8, n, text.data(), &got));
  if (got < n) return DataLossError(path + ": truncated while reading the header");
  file.data_start_ = 8 + n;
  const uint64_t data_size = file_size - file.data_start_;

  // The reference implementation refuses a header that does not open with '{'.
  if (text.empty() || text[0] != '{') {
    return DataLossError(path + ": header is not a JSON object (it must start with '{')");
  }
  // The hardened parser: nesting checked before anything recursive runs, numbers beyond double and
  // repeated keys (the format maps each name to one tensor) refused, time linear in the text.
  Result<ordered_json> parsed = ParseJsonText<ordered_json>(text, path + ": header", kMaxHeaderDepth);
  if (!parsed.ok()) return DataLossError(parsed.status().message());
  const ordered_json header = std::move(parsed).value();
  if (!header.is_object()) return DataLossError(path + ": header is not a JSON object");

  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) return DataLossError(path + ": __metadata__ is not an object");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) {
          return DataLossError(path + ": __metadata__ key '" + mk + "' is not a string");
        }
        file.metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    const std::string where = path + ": tensor '" + key + "'";
    if (!value.is_object()) return DataLossError(where + ": entry is not an object");
    for (const char* field : {"dtype", "shape", "data_offsets"}) {
      if (!value.contains(field)) return DataLossError(where + ": no '" + field + "'");
    }
    const ordered_json& dtype = value["dtype"];
    const ordered_json& shape = value["shape"];
    const ordered_json& offsets = value["data_offsets"];
    if (!dtype.is_string()) return DataLossError(where + ": dtype is not a string");
    TensorInfo t;
    t.name = key;
    const std::string dtype_name = dtype.get<std::string>();
    if (!ParseSafetensorsDType(dtype_name, &t.dtype)) {
      return DataLossError(where + ": dtype " + dtype_name + " not supported, expected F32, BF16 or F16");
    }
    if (!shape.is_array()) return DataLossError(where + ": shape is not an array");
    for (size_t i = 0; i < shape.size(); ++i) {
      const ordered_json& d = shape[i];
      if (!d.is_number_integer()) {
        return DataLossError(where + ": shape[" + std::to_string(i) + "] is not an integer");
      }
      if (!d.is_number_unsigned()) {
        return DataLossError(where + ": shape[" + std::to_string(i) + "] is negative (" + d.dump() + ")");
      }
      const uint64_t v = d.get<uint64_t>();
      if (v > static_cast<uint64_t>(INT64_MAX)) {
        return DataLossError(where + ": shape[" + std::to_string(i) + "] = " + d.dump() + " is too large");
      }
      t.shape.push_back(static_cast<int64_t>(v));
    }
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      return DataLossError(where + ": data_offsets is not [begin, end] of non-negative integers");
    }
    t.data_begin = offsets[0].get<uint64_t>();
    t.data_end = offsets[1].get<uint64_t>();
    const int64_t numel = t.numel();
    const uint64_t esize = SizeOf(t.dtype);
    if (numel < 0 || static_cast<uint64_t>(numel) > UINT64_MAX / esize) {
      return DataLossError(where + ": shape " + ShapeString(t.shape) + " has more elements than a file can hold");
    }
    if (t.data_end < t.data_begin) {
      return DataLossError(where + ": data_offsets " + Range(t.data_begin, t.data_end) + " end before they begin");
    }
    const uint64_t nbytes = static_cast<uint64_t>(numel) * esize;
    if (t.data_end - t.data_begin != nbytes) {
      return DataLossError(where + ": data_offsets " + Range(t.data_begin, t.data_end) + " hold " +
                           std::to_string(t.data_end - t.data_begin) + " bytes, its shape " + ShapeString(t.shape) +
                           " of " + dtype_name + " needs " + std::to_string(nbytes));
    }
    if (t.data_end > data_size) {
      return DataLossError(where + ": data_offsets " + Range(t.data_begin, t.data_end) +
                           " run past the end of the file (the data holds " + std::to_string(data_size) +
                           " bytes; truncated?)");
    }
    file.tensors_.push_back(std::move(t));
  }

  std::stable_sort(file.tensors_.begin(), file.tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.data_begin != b.data_begin ? a.data_begin < b.data_begin : a.data_end < b.data_end;
  });
  // The ranges must tile the buffer exactly, as the reference implementation requires.
  uint64_t pos = 0;
  for (size_t i = 0; i < file.tensors_.size(); ++i) {
    const TensorInfo& t = file.tensors_[i];
    if (t.data_begin < pos) {
      return DataLossError(path + ": tensor '" + t.name + "' " + Range(t.data_begin, t.data_end) +
                           " overlaps tensor '" + file.tensors_[i - 1].name + "' " +
                           Range(file.tensors_[i - 1].data_begin, file.tensors_[i - 1].data_end));
    }
    if (t.data_begin > pos) {
      return DataLossError(path + ": data bytes " + Range(pos, t.data_begin) +
                           " belong to no tensor (a gap before tensor '" + t.name +
                           "'); the format requires the buffer to be fully covered");
    }
    pos = t.data_end;
  }
  if (pos != data_size) {
    return DataLossError(path + ": data bytes " + Range(pos, data_size) +
                         " after the last tensor belong to no tensor; the format requires the "
                         "buffer to be fully covered");
  }
  for (size_t i = 0; i < file.tensors_.size(); ++i) file.index_[file.tensors_[i].name] = i;
  return file;
}

const TensorInfo* SafetensorsFile::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Status SafetensorsFile::CheckOwned(const TensorInfo& info) const {
  const TensorInfo* own = Find(info.name);
  if (own == nullptr || own->dtype != info.dtype || own->data_begin != info.data_begin ||
      own->data_end != info.data_end) {
    return InvalidArgumentError(path_ + ": tensor '" + info.name + "' is not a tensor of this file");
  }
  return OkStatus();
}

Status SafetensorsFile::PreadExact(const TensorInfo& info, uint64_t offset, size_t size, void* out) const {
  size_t got = 0;
  Status st = PreadLoop(fd_, path_, offset, size, out, &got);
  const std::string where = "tensor '" + info.name + "', file bytes " + Range(offset, offset + size);
  if (!st.ok()) return Status(st.code(), st.message() + " (" + where + ")");
  if (got < size) {
    return DataLossError(path_ + ": " + where + ": got only " + std::to_string(got) +
                         " bytes (the file shrank after it was opened?)");
  }
  return OkStatus();
}

Status SafetensorsFile::ReadAsFloat(const TensorInfo& info, int64_t begin_element, int64_t count, float* out) const {
  ZERO_RETURN_IF_ERROR(CheckOwned(info));
  const int64_t numel = info.numel();
  if (begin_element < 0 || count < 0 || begin_element > numel || count > numel - begin_element) {
    return InvalidArgumentError(path_ + ": tensor '" + info.name + "': " + std::to_string(count) +
                                " elements from element " + std::to_string(begin_element) + " are outside its " +
                                std::to_string(numel) + " elements");
  }
  if (count == 0) return OkStatus();
  if (out == nullptr) return InvalidArgumentError("ReadAsFloat: null output for " + info.name);
  const uint64_t esize = SizeOf(info.dtype);
  const uint64_t base = data_start_ + info.data_begin + static_cast<uint64_t>(begin_element) * esize;
  if (info.dtype == DType::kF32) {
    return PreadExact(info, base, static_cast<size_t>(count) * 4, out);
  }
  std::vector<uint16_t> buf(static_cast<size_t>(std::min(count, kConvertChunk)));
  for (int64_t done = 0; done < count;) {
    const int64_t n = std::min(count - done, kConvertChunk);
    ZERO_RETURN_IF_ERROR(
        PreadExact(info, base + static_cast<uint64_t>(done) * 2, static_cast<size_t>(n) * 2, buf.data()));
    for (int64_t i = 0; i < n; ++i) out[done + i] = LoadAsFloat(buf.data(), info.dtype, i);
    done += n;
  }
  return OkStatus();
}

Result<std::vector<float>> SafetensorsFile::ReadFloats(const TensorInfo& info) const {
  ZERO_RETURN_IF_ERROR(CheckOwned(info));
  std::vector<float> out(static_cast<size_t>(info.numel()));
  ZERO_RETURN_IF_ERROR(ReadAsFloat(info, 0, info.numel(), out.data()));
  return out;
}

Status SafetensorsFile::ReadRaw(const TensorInfo& info, void* out) const {
  ZERO_RETURN_IF_ERROR(CheckOwned(info));
  const uint64_t size = info.data_end - info.data_begin;
  if (size == 0) return OkStatus();
  if (out == nullptr) return InvalidArgumentError("ReadRaw: null output for " + info.name);
  return PreadExact(info, data_start_ + info.data_begin, size, out);
}

// --- writing ---------------------------------------------------------------------------------------

SafetensorsWriter::SafetensorsWriter(AtomicFileWriter writer, std::vector<TensorToWrite> layout,
                                     std::vector<uint64_t> ends, uint64_t header_bytes)
    : writer_(std::move(writer)),
      layout_(std::move(layout)),
      ends_(std::move(ends)),
      header_bytes_(header_bytes),
      data_bytes_(ends_.empty() ? 0 : ends_.back()) {}

Result<SafetensorsWriter> SafetensorsWriter::Open(const std::string& path, const std::vector<TensorToWrite>& layout,
                                                  const std::map<std::string, std::string>& metadata) {
  // Built as text so that every name is checked (and named) on its own.
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      ZERO_ASSIGN_OR_RETURN(std::string key, CheckUtf8(k, path + ": metadata key"));
      ZERO_ASSIGN_OR_RETURN(std::string value, CheckUtf8(v, path + ": metadata value of '" + k + "'"));
      header += (first ? "" : ",") + key + ":" + value;
      first = false;
    }
    header += "}";
  }
  std::set<std::string> names;
  std::vector<uint64_t> ends;
  uint64_t offset = 0;
  for (const TensorToWrite& t : layout) {
    const std::string where = path + ": tensor '" + t.name + "'";
    if (t.name.empty() || t.name == "__metadata__") {
      return InvalidArgumentError(where + ": not a valid tensor name");
    }
    ZERO_ASSIGN_OR_RETURN(std::string name, CheckUtf8(t.name, where + ": name"));
    if (!names.insert(t.name).second) return InvalidArgumentError(where + ": name used twice");
    if (t.dtype != DType::kF32 && t.dtype != DType::kBF16 && t.dtype != DType::kF16) {
      return InvalidArgumentError(where + ": unknown dtype");
    }
    const int64_t numel = ShapeNumel(t.shape);
    if (numel < 0) {
      return InvalidArgumentError(where + ": shape " + ShapeString(t.shape) +
                                  " has a negative dim or too many elements");
    }
    const uint64_t nbytes = static_cast<uint64_t>(numel) * SizeOf(t.dtype);
    ordered_json entry = {
        {"dtype", SafetensorsDTypeName(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + nbytes}}};
    header += (header.size() > 1 ? "," : "") + name + ":" + entry.dump();
    offset += nbytes;
    ends.push_back(offset);
  }
  header += "}";
  // Spaces (legal JSON whitespace) so the byte buffer starts 8-byte aligned.
  header.append((8 - header.size() % 8) % 8, ' ');
  const uint64_t header_len = header.size();

  ZERO_ASSIGN_OR_RETURN(AtomicFileWriter w, AtomicFileWriter::Open(path));
  ZERO_RETURN_IF_ERROR(w.Append(&header_len, sizeof(header_len)));  // little-endian host
  ZERO_RETURN_IF_ERROR(w.Append(header));
  return SafetensorsWriter(std::move(w), layout, std::move(ends), sizeof(header_len) + header_len);
}

Status SafetensorsWriter::Append(const void* data, size_t size) {
  if (size > data_bytes_ - written_) {
    return InvalidArgumentError(writer_.path() + ": " + std::to_string(size) +
                                " bytes appended past the last tensor's end (" +
                                std::to_string(data_bytes_ - written_) + " bytes left)");
  }
  if (size == 0) return OkStatus();
  ZERO_RETURN_IF_ERROR(writer_.Append(data, size));
  written_ += size;
  return OkStatus();
}

Status SafetensorsWriter::Commit() {
  if (written_ != data_bytes_) {
    size_t i = 0;
    while (ends_[i] <= written_) ++i;
    const uint64_t begin = i == 0 ? 0 : ends_[i - 1];
    return InvalidArgumentError(writer_.path() + ": tensor '" + layout_[i].name + "' got " +
                                std::to_string(written_ > begin ? written_ - begin : 0) + " of its " +
                                std::to_string(ends_[i] - begin) + " bytes; nothing written");
  }
  return writer_.Commit();
}

Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  ZERO_ASSIGN_OR_RETURN(SafetensorsWriter w, SafetensorsWriter::Open(path, tensors, metadata));
  for (const TensorToWrite& t : tensors) {
    const uint64_t nbytes = static_cast<uint64_t>(ShapeNumel(t.shape)) * SizeOf(t.dtype);
    if (nbytes == 0) continue;
    if (t.data == nullptr) {
      return InvalidArgumentError(path + ": tensor '" + t.name + "': no data");
    }
    ZERO_RETURN_IF_ERROR(w.Append(t.data, nbytes));
  }
  return w.Commit();
}

Result<std::string> ReadRegularFile(const std::string& path, uint64_t max_bytes) {
  uint64_t size = 0;
  ZERO_ASSIGN_OR_RETURN(int raw_fd, OpenRegular(path, &size));
  ScopedFd fd(raw_fd);
  if (size > max_bytes) {
    return InvalidArgumentError(path + ": " + std::to_string(size) + " bytes, more than the " +
                                std::to_string(max_bytes) + " expected of this file");
  }
  std::string out(size, '\0');
  size_t got = 0;
  ZERO_RETURN_IF_ERROR(PreadLoop(fd.get(), path, 0, size, out.data(), &got));
  out.resize(got);
  return out;
}

}  // namespace zero::llm
