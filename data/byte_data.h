// ByteDataset: a text file as a stream of bytes, and the deterministic sampler that turns
// (seed, step, rank, world_size) into each rank's batch of training windows.
//
// A window is context+1 consecutive bytes (the model's inputs and the byte to predict), the row
// layout ByteLmCpu/ByteLmCuda read. Sampling is with replacement: global sample g of the run starts
// at hash(seed, g) mod (size - context), and rank r of W ranks with `batch` rows per rank takes, at
// step s, the samples g = (s W + r) batch + i for i in [0, batch). So the W ranks together see the
// same global batch as one rank with W * batch rows, and micro step m of optimizer step t with
// gradient accumulation G is sampler step t G + m: runs that split one global batch differently see
// the same data, which the equivalence tests rely on. Owns the bytes; immutable after creation, so
// safe to share between threads.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/status.h"

namespace zero::examples {

// Ships with every Debian and Ubuntu install (package base-files): ~35 KB of English.
inline constexpr char kDefaultCorpusPath[] = "/usr/share/common-licenses/GPL-3";

struct BatchSpec {
  uint64_t seed = 0;
  int64_t step = 0;  // sampler step: optimizer step * gradient_accumulation_steps + micro step
  int rank = 0;
  int world_size = 1;
  int batch = 1;    // rows per rank
  int context = 8;  // each row has context+1 bytes
};

class ByteDataset {
 public:
  // The bytes of a regular file (data/data_file.h: a named pipe, a device such as /dev/zero or a
  // directory is refused at once, naming what it is).
  static Result<ByteDataset> FromFile(const std::string& path);
  static Result<ByteDataset> FromText(std::string text, std::string name = "<text>");

  const std::string& name() const { return name_; }
  const std::string& bytes() const { return bytes_; }
  size_t size() const { return bytes_.size(); }

  // Writes spec.batch rows of spec.context+1 bytes into out. Fails (writing nothing) on a bad spec
  // or a text no longer than the context.
  Status FillBatch(const BatchSpec& spec, uint8_t* out) const;
  Result<std::vector<uint8_t>> Batch(const BatchSpec& spec) const;

  // Windows start at first, first + 1, ... (wrapping around): for evaluating on a held-out split.
  Result<std::vector<uint8_t>> SequentialBatch(int64_t first, int batch, int context) const;

  // The first (1 - holdout_fraction) of the bytes and the rest (cut at a byte, no overlap).
  std::pair<ByteDataset, ByteDataset> Split(double holdout_fraction) const;

 private:
  ByteDataset(std::string bytes, std::string name) : bytes_(std::move(bytes)), name_(std::move(name)) {}
  Status CheckContext(int context) const;

  std::string bytes_;
  std::string name_;
};

}  // namespace zero::examples
