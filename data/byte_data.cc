#include "data/byte_data.h"

#include <cstring>

#include "data/data_file.h"
#include "runtime/hash.h"

namespace zero::examples {

Result<ByteDataset> ByteDataset::FromFile(const std::string& path) {
  ZERO_ASSIGN_OR_RETURN(std::string bytes, data::ReadDataFile("", path, "a text file (the bytes the model trains on)"));
  return ByteDataset(std::move(bytes), path);
}

Result<ByteDataset> ByteDataset::FromText(std::string text, std::string name) {
  return ByteDataset(std::move(text), std::move(name));
}

Status ByteDataset::CheckContext(int context) const {
  if (context < 1) return InvalidArgumentError("context must be >= 1, got " + std::to_string(context));
  if (bytes_.size() <= static_cast<size_t>(context)) {
    return InvalidArgumentError(name_ + ": " + std::to_string(bytes_.size()) + " bytes, need more than the context (" +
                                std::to_string(context) + ")");
  }
  return OkStatus();
}

Status ByteDataset::FillBatch(const BatchSpec& spec, uint8_t* out) const {
  ZERO_RETURN_IF_ERROR(CheckContext(spec.context));
  if (spec.world_size < 1 || spec.rank < 0 || spec.rank >= spec.world_size) {
    return InvalidArgumentError("rank " + std::to_string(spec.rank) + " of world_size " +
                                std::to_string(spec.world_size));
  }
  if (spec.batch < 1 || spec.step < 0) return InvalidArgumentError("batch must be >= 1 and step >= 0");
  const uint64_t windows = bytes_.size() - spec.context;
  const uint64_t first = (static_cast<uint64_t>(spec.step) * spec.world_size + spec.rank) * spec.batch;
  const uint64_t key = SplitMix64(spec.seed ^ 0x5a45524f44415441ull);  // "ZERODATA"
  for (int i = 0; i < spec.batch; ++i) {
    const uint64_t start = SplitMix64(key ^ SplitMix64(first + i)) % windows;
    std::memcpy(out + static_cast<size_t>(i) * (spec.context + 1), bytes_.data() + start, spec.context + 1);
  }
  return OkStatus();
}

Result<std::vector<uint8_t>> ByteDataset::Batch(const BatchSpec& spec) const {
  std::vector<uint8_t> out(static_cast<size_t>(spec.batch > 0 ? spec.batch : 0) *
                           (spec.context > 0 ? spec.context + 1 : 0));
  ZERO_RETURN_IF_ERROR(FillBatch(spec, out.data()));
  return out;
}

Result<std::vector<uint8_t>> ByteDataset::SequentialBatch(int64_t first, int batch, int context) const {
  ZERO_RETURN_IF_ERROR(CheckContext(context));
  if (batch < 1 || first < 0) return InvalidArgumentError("batch must be >= 1 and first >= 0");
  const uint64_t windows = bytes_.size() - context;
  std::vector<uint8_t> out(static_cast<size_t>(batch) * (context + 1));
  for (int i = 0; i < batch; ++i) {
    const uint64_t start = (static_cast<uint64_t>(first) + i) % windows;
    std::memcpy(out.data() + static_cast<size_t>(i) * (context + 1), bytes_.data() + start, context + 1);
  }
  return out;
}

std::pair<ByteDataset, ByteDataset> ByteDataset::Split(double holdout_fraction) const {
  if (holdout_fraction < 0.0) holdout_fraction = 0.0;
  if (holdout_fraction > 1.0) holdout_fraction = 1.0;
  const size_t cut = bytes_.size() - static_cast<size_t>(holdout_fraction * bytes_.size());
  return {ByteDataset(bytes_.substr(0, cut), name_ + "[train]"), ByteDataset(bytes_.substr(cut), name_ + "[holdout]")};
}

}  // namespace zero::examples
