// One batch of token ids for the transformer: `batch` rows of `seq` input ids and the target id of
// each position (the next token; kIgnoreIndex where no loss is taken). It owns only its two id
// arrays; it knows nothing of the model beyond the two limits Validate checks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/status.h"

namespace zero::llm {

// A target that does not count in the loss (PyTorch cross_entropy's default ignore_index).
inline constexpr int32_t kIgnoreIndex = -100;

struct LlmBatch {
  int batch = 0;
  int seq = 0;
  std::vector<int32_t> inputs;   // [batch, seq] row-major, each in [0, vocab)
  std::vector<int32_t> targets;  // [batch, seq] row-major, each in [0, vocab) or kIgnoreIndex
  // The output head the logits come from: 0 the model's own, k >= 1 extra head k-1
  // (LlmConfig::extra_heads; the model checks the range).
  int head = 0;

  // OK when batch, seq >= 1, seq <= max_positions (RoPE positions 0..seq-1 must be ones the model
  // was configured for), both arrays hold batch * seq ids and every id is in range. Errors name the
  // row and position of the first bad id.
  Status Validate(int64_t vocab_size, int64_t max_positions) const {
    if (batch < 1 || seq < 1) {
      return InvalidArgumentError("llm batch: expected batch >= 1 and seq >= 1, got batch " + std::to_string(batch) +
                                  ", seq " + std::to_string(seq));
    }
    if (seq > max_positions) {
      return InvalidArgumentError("llm batch: seq " + std::to_string(seq) + " exceeds max_position_embeddings " +
                                  std::to_string(max_positions));
    }
    const size_t n = static_cast<size_t>(batch) * seq;
    if (inputs.size() != n || targets.size() != n) {
      return InvalidArgumentError("llm batch: expected " + std::to_string(n) + " inputs and targets (batch " +
                                  std::to_string(batch) + " x seq " + std::to_string(seq) + "), got " +
                                  std::to_string(inputs.size()) + " inputs and " + std::to_string(targets.size()) +
                                  " targets");
    }
    for (size_t i = 0; i < n; ++i) {
      const char* what = nullptr;
      int32_t id = inputs[i];
      if (id < 0 || id >= vocab_size) {
        what = "input";
      } else if (id = targets[i]; id != kIgnoreIndex && (id < 0 || id >= vocab_size)) {
        what = "target";
      }
      if (what != nullptr) {
        return InvalidArgumentError("llm batch: " + std::string(what) + " id " + std::to_string(id) + " at row " +
                                    std::to_string(i / seq) + ", position " + std::to_string(i % seq) +
                                    ": expected 0.." + std::to_string(vocab_size - 1) +
                                    (what[0] == 't' ? " or -100 (ignored)" : ""));
      }
    }
    return OkStatus();
  }
};

}  // namespace zero::llm
