// DeferredStep: the scheduler of the overlapped optimizer step (offload_optimizer.overlap_step with
// the chunked states, docs/offload.md "Overlap with the next forward"). It owns the step's pieces
// (chunk-sized runs of AdamW updates, or casts of the masters after an update in backward), the
// event that orders them after the step, and which parameters the compute stream has waited for;
// it does not own the states, the device, the stream or the model copy the pieces write, and knows
// nothing of the config, the engine's errors or its failure reporting.
//
// One step: Begin records the step event on the compute stream (the gradients are final, every
// read of the old model copy is enqueued before it) and captures the hyperparameters; Defer adds
// runs in state order, cut at chunk_numel; End queues the first chunk_buffers pieces
// (ChunkedOptimizerStates::UpdateAfter / CastMasterAfter, ordered after the event only) and
// returns. Reach(params) queues the pieces covering those parameters plus chunk_buffers more not
// yet queued, and makes the compute stream wait for those parameters' chunk events. Flush queues
// everything left and makes the compute stream wait for all of it (no host wait); WaitForHost then
// waits on the host. A piece is queued at most once.
//
// Errors: the device's and the states' statuses, unchanged; after a failed call the step stays in
// flight (the caller treats the engine as broken). Thread safety: none (one engine thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/status.h"
#include "zero/chunked_optimizer_states.h"

namespace zero {

class DeferredStep {
 public:
  // State elements [begin, end) of one parameter (end == begin: none).
  struct Range {
    int64_t begin = 0;
    int64_t end = 0;
  };
  // `states` (the chunked states, not owned) run the pieces; `compute` is the stream the step is
  // ordered after and that waits for it; `param_ranges[i]`: parameter i's state elements, in state
  // order, disjoint; the pieces write the model copy in `model_t`.
  DeferredStep(Device* device, Stream* compute, ChunkedOptimizerStates* states, std::vector<Range> param_ranges,
               DType model_t);
  DeferredStep(const DeferredStep&) = delete;
  DeferredStep& operator=(const DeferredStep&) = delete;

  // Starts a step with hyperparameters `h` (creates the step event on first use). REQUIRES: no
  // step in flight (Flush first).
  Status Begin(const AdamWParams& h);
  // Adds state elements [off, off + n) to the step, cut at chunk_numel: their AdamW from the fp32
  // device gradients `grads` (of element off), or with `grads` null a cast of the masters; the new
  // weights go to `model_out` (of element off, in model_t), which must stay valid until Flush.
  void Defer(int64_t off, int64_t n, const float* grads, void* model_out);
  // Queues the first chunk_buffers pieces; the step is in flight when it has any piece.
  Status End();

  // The forward reached a module with parameters `params`: see above. REQUIRES: in_flight().
  Status Reach(const std::vector<int>& params);
  // Queues every piece left and makes the compute stream wait for all of them; then no step is in
  // flight. OK at once when none is.
  Status Flush();
  // The host waits for the last step: the states' updates and the compute stream. On success no
  // step is unfinished. REQUIRES: !in_flight() (Flush first).
  Status WaitForHost();

  // Pieces of the last step the compute stream has not waited for.
  bool in_flight() const { return in_flight_; }
  // A step the host has not waited for (WaitForHost).
  bool unfinished() const { return unfinished_; }
  // Since the step: the compute stream waited for parameter i's chunks (or the step writes none
  // of it). REQUIRES: in_flight().
  bool waited(int i) const { return param_waited_[i] != 0; }

 private:
  struct Piece {
    int64_t begin = 0;  // state elements [begin, begin + n)
    int64_t n = 0;
    void* model_out = nullptr;     // where the new weights (or the cast masters) go
    const float* grads = nullptr;  // fp32 gradients of `begin`; null: a cast of the masters
    bool queued = false;
  };
  Status Queue(size_t k);
  void PiecesOf(int index, size_t* first, size_t* last) const;  // [first, last) overlapping its range

  Device* const device_;
  Stream* const compute_;
  ChunkedOptimizerStates* const states_;
  const std::vector<Range> ranges_;
  const DType model_t_;
  bool in_flight_ = false;
  bool unfinished_ = false;
  AdamWParams h_;              // the in-flight step's hyperparameters (lr, t, loss scale, clip)
  std::vector<Piece> pieces_;  // in state order, disjoint
  size_t pieces_queued_ = 0;   // every piece before it is queued
  std::unique_ptr<Event> mark_;
  std::vector<uint8_t> param_waited_;
};

}  // namespace zero
