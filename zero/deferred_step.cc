#include "zero/deferred_step.h"

#include <algorithm>
#include <optional>
#include <utility>

namespace zero {

DeferredStep::DeferredStep(Device* device, Stream* compute, ChunkedOptimizerStates* states,
                           std::vector<Range> param_ranges, DType model_t)
    : device_(device), compute_(compute), states_(states), ranges_(std::move(param_ranges)), model_t_(model_t) {}

Status DeferredStep::Begin(const AdamWParams& h) {
  if (mark_ == nullptr) {
    auto e = device_->CreateEvent();
    if (!e.ok()) return e.status().WithContext("overlap_step: creating the step event");
    mark_ = std::move(e).value();
  }
  // Everything the step reads (the gradients, the norm's inputs) is written on the compute stream
  // before this point, and everything that read the old model copy is enqueued before it.
  ZERO_RETURN_IF_ERROR(device_->RecordEvent(mark_.get(), compute_));
  h_ = h;
  pieces_.clear();
  pieces_queued_ = 0;
  return OkStatus();
}

void DeferredStep::Defer(int64_t off, int64_t n, const float* grads, void* model_out) {
  const int64_t chunk = states_->chunk_numel();
  for (int64_t at = 0; at < n; at += chunk) {
    Piece p;
    p.begin = off + at;
    p.n = std::min(chunk, n - at);
    p.model_out = ElementPtr(model_out, model_t_, at);
    p.grads = grads != nullptr ? grads + at : nullptr;
    pieces_.push_back(p);
  }
}

Status DeferredStep::End() {
  // The first chunk_buffers pieces go now (the forward usually starts with the first parameters);
  // the rest when the forward reaches them.
  const size_t first = std::min(pieces_.size(), static_cast<size_t>(states_->chunk_buffers()));
  for (size_t k = 0; k < first; ++k) ZERO_RETURN_IF_ERROR(Queue(k));
  pieces_queued_ = first;
  param_waited_.assign(ranges_.size(), 0);
  for (int i = 0; i < static_cast<int>(ranges_.size()); ++i) {
    size_t f = 0, l = 0;
    PiecesOf(i, &f, &l);
    if (f == l) param_waited_[i] = 1;  // nothing of the step writes it
  }
  in_flight_ = !pieces_.empty();
  unfinished_ = unfinished_ || in_flight_;
  return OkStatus();
}

Status DeferredStep::Queue(size_t k) {
  Piece& p = pieces_[k];
  if (p.queued) return OkStatus();
  p.queued = true;
  if (p.grads == nullptr) return states_->CastMasterAfter(p.begin, p.n, p.model_out, model_t_, mark_.get());
  return states_->UpdateAfter(p.begin, p.n, p.grads, h_, p.model_out, model_t_, mark_.get());
}

void DeferredStep::PiecesOf(int index, size_t* first, size_t* last) const {
  const int64_t b = ranges_[index].begin;
  const int64_t e = ranges_[index].end;
  auto lo = std::partition_point(pieces_.begin(), pieces_.end(), [b](const Piece& q) { return q.begin + q.n <= b; });
  auto hi = std::partition_point(lo, pieces_.end(), [e](const Piece& q) { return q.begin < e; });
  *first = static_cast<size_t>(lo - pieces_.begin());
  *last = e > b ? static_cast<size_t>(hi - pieces_.begin()) : *first;
}

Status DeferredStep::Reach(const std::vector<int>& params) {
  size_t end = 0;
  bool any = false;
  for (int i : params) {
    size_t f = 0, l = 0;
    PiecesOf(i, &f, &l);
    for (size_t k = f; k < l; ++k) ZERO_RETURN_IF_ERROR(Queue(k));
    if (l > f) {
      end = std::max(end, l);
      any = true;
    }
  }
  // Look-ahead: the next chunk_buffers pieces not yet queued after these parameters' (bounded, so
  // the launch queue never holds the whole step).
  size_t ahead = static_cast<size_t>(states_->chunk_buffers());
  for (size_t k = any ? end : pieces_queued_; k < pieces_.size() && ahead > 0; ++k) {
    if (pieces_[k].queued) continue;
    ZERO_RETURN_IF_ERROR(Queue(k));
    --ahead;
  }
  while (pieces_queued_ < pieces_.size() && pieces_[pieces_queued_].queued) ++pieces_queued_;
  // The compute stream waits for the chunks holding these parameters only (before the stage-3
  // gather reads the shards, before param() is used at stages 0-2).
  for (int i : params) {
    size_t f = 0, l = 0;
    PiecesOf(i, &f, &l);
    for (size_t k = f; k < l; ++k) {
      std::optional<ChunkEvents> c = states_->Chunk(pieces_[k].begin);
      if (c.has_value()) ZERO_RETURN_IF_ERROR(device_->StreamWaitEvent(compute_, c->updated));
    }
    param_waited_[i] = 1;
  }
  return OkStatus();
}

Status DeferredStep::Flush() {
  if (!in_flight_) return OkStatus();
  for (size_t k = pieces_queued_; k < pieces_.size(); ++k) ZERO_RETURN_IF_ERROR(Queue(k));
  // The gradients and states may be written again once the compute stream passes this.
  ZERO_RETURN_IF_ERROR(states_->WaitForUpdates(compute_));
  in_flight_ = false;
  pieces_.clear();
  pieces_queued_ = 0;
  return OkStatus();
}

Status DeferredStep::WaitForHost() {
  Status s = states_->WaitForUpdates(compute_);
  if (s.ok()) s = device_->SynchronizeStream(compute_);
  if (s.ok()) unfinished_ = false;
  return s;
}

}  // namespace zero
