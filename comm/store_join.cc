#include "comm/store_join.h"

#include <algorithm>
#include <exception>
#include <vector>

namespace zero {

std::chrono::milliseconds RendezvousDeadline::Remaining() const {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at_ - std::chrono::steady_clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

bool RendezvousDeadline::Passed() const { return std::chrono::steady_clock::now() + kDeadlineSlack >= at_; }

Status StoreErrorStatus(const std::string& who, int waiting_for, const char* what, const RendezvousDeadline& deadline) {
  if (waiting_for >= 0 && deadline.Passed()) {
    return DeadlineExceededError(who + ": rank " + std::to_string(waiting_for) + " did not join within " +
                                 TimeoutText(deadline.timeout()) + " (" + what + ")");
  }
  if (waiting_for >= 0) {
    return UnavailableError(who + ": store error while waiting for rank " + std::to_string(waiting_for) +
                            " to join: " + what);
  }
  return UnavailableError(who + ": store error: " + what);
}

Status JoinThroughStore(gloo::rendezvous::Store& store, int rank, int world_size, const std::string& who,
                        const RendezvousDeadline& deadline) {
  int waiting_for = -1;
  try {
    store.set("join/" + std::to_string(rank), std::vector<char>{1});
    for (int r = 0; r < world_size; ++r) {
      if (r == rank) continue;
      waiting_for = r;
      store.wait({"join/" + std::to_string(r)}, deadline.Remaining());
    }
  } catch (const std::exception& e) {
    return StoreErrorStatus(who, waiting_for, e.what(), deadline);
  }
  return OkStatus();
}

}  // namespace zero
