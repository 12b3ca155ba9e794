// Store join: the first step of the Gloo and NCCL communicators' rendezvous, written once for both.
// Every rank sets "join/<rank>" in the store (under the caller's prefix), then waits for each other
// rank's key, so a rank that never arrives is named ("rank 2 did not join within 2000 ms") rather
// than reported as a missing store key. Also the one mapping from an exception thrown by a store
// operation during a rendezvous to a Status, and the rendezvous's deadline (timeouts are written
// with communicator.h's TimeoutText). Owns nothing: the store and its prefix
// are the caller's; what follows the join (gloo's mesh, NCCL's unique id) stays with the caller.
#pragma once

#include <chrono>
#include <string>

#include <gloo/rendezvous/store.h>

#include "comm/communicator.h"
#include "runtime/status.h"

namespace zero {

// A wait that gave up this close to its deadline counts as timed out (waits round to ms).
inline constexpr std::chrono::milliseconds kDeadlineSlack{20};

// The deadline of one rendezvous: `timeout` after construction.
class RendezvousDeadline {
 public:
  explicit RendezvousDeadline(std::chrono::milliseconds timeout)
      : timeout_(timeout), at_(std::chrono::steady_clock::now() + timeout) {}

  std::chrono::milliseconds timeout() const { return timeout_; }
  std::chrono::steady_clock::time_point at() const { return at_; }
  // What is left of it, at least 1 ms (store waits and gloo contexts want a positive timeout).
  std::chrono::milliseconds Remaining() const;
  // True once it has passed, or is within kDeadlineSlack of passing.
  bool Passed() const;

 private:
  std::chrono::milliseconds timeout_;
  std::chrono::steady_clock::time_point at_;
};

// The Status for an exception (its what() is `what`) thrown by a store operation of the rendezvous
// `who` ("gloo rendezvous of rank 0 of 3"). `waiting_for` is the rank whose key the failed wait
// was for: kDeadlineExceeded "<who>: rank R did not join within <timeout> (<what>)" once the
// deadline has passed, else kUnavailable "<who>: store error while waiting for rank R to join:
// <what>". waiting_for < 0 (the failure was not a wait for another rank): kUnavailable
// "<who>: store error: <what>".
Status StoreErrorStatus(const std::string& who, int waiting_for, const char* what, const RendezvousDeadline& deadline);

// The join of rank `rank` of `world_size` through `store`: sets "join/<rank>", then waits for every
// other rank's "join/<r>" in turn until the deadline. Blocks until all have joined; errors as
// StoreErrorStatus. Every rank must use a store holding the same data under the same prefix.
Status JoinThroughStore(gloo::rendezvous::Store& store, int rank, int world_size, const std::string& who,
                        const RendezvousDeadline& deadline);

}  // namespace zero
