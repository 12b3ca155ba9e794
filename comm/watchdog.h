// CollectiveWatchdog: a thread that turns an in-flight collective which does not complete within a
// timeout, or a communicator-wide asynchronous error, into one sticky error, and aborts the
// communicator with it.
//
// Used by the backends whose collectives complete asynchronously on a device (NcclCommunicator:
// one completion event per collective, ncclCommGetAsyncError, ncclCommAbort) and by
// FaultyCommunicator. The owner Track()s every collective in issue order; the watchdog polls the
// oldest one that is not yet complete (collectives of one communicator complete in issue order,
// as on one stream), popping those that completed. A collective's clock starts when it becomes
// the oldest incomplete one (it was issued and its predecessor completed), so a long queue does
// not eat into the timeout of the collectives at its end. Owns the thread and the list of
// in-flight collectives, nothing else; the poll and abort callbacks belong to the owner.
//
// Thread safety: every method may be called from any thread. The callbacks run on the watchdog
// thread (abort also on the thread calling Fail) without any watchdog lock held.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "runtime/status.h"

namespace zero {

class CollectiveWatchdog {
 public:
  struct Options {
    // Prefix of every error, naming the backend and the rank: "nccl rank 0 of 2".
    std::string who;
    std::chrono::milliseconds timeout{300000};
    // Optional: run once on the watchdog thread before any poll (cudaSetDevice).
    std::function<void()> thread_init;
    // Optional, non-blocking: the communicator's own error (NCCL's asynchronous error, a backend's
    // sticky error); OK while it is healthy. Polled while collectives are in flight.
    std::function<Status()> check;
    // Required: makes the communicator unusable with `error` and makes whatever it has in flight
    // finish (ncclCommAbort makes stuck kernels exit). Called exactly once, with the first error.
    std::function<void(const Status& error)> abort;
  };
  // Non-blocking completion query of one collective: true once complete, false while pending, an
  // error if it failed. Must stay valid (own what it queries) until the watchdog drops it.
  using Poll = std::function<Result<bool>()>;

  explicit CollectiveWatchdog(Options options);
  // Stop().
  ~CollectiveWatchdog();
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  // Starts watching the collective `name` ("collective #5 AllReduce (7 x fp32, sum)"), issued
  // after every collective tracked before it. Ignored once failed or stopped.
  void Track(std::string name, Poll poll);

  // Records `error` as the sticky error unless there is one already, and if so aborts the
  // communicator with it. Returns the sticky error. REQUIRES: !error.ok().
  Status Fail(Status error);

  // Fail() with "<who>: <name> failed: <error's message>; the communicator was aborted" (code of
  // `error`): the error of one collective that completed with a failure.
  Status FailCollective(const std::string& name, const Status& error);

  // OK while no error was recorded, else the first one. Non-blocking.
  Status status() const;

  // Blocks until an error is recorded (or Stop() is called); returns status().
  Status AwaitFailure();

  // Collectives tracked and not yet seen complete.
  size_t in_flight() const;

  // Joins the thread; later Track calls are ignored. Idempotent.
  void Stop();

 private:
  struct Entry {
    std::string name;
    Poll poll;
  };
  void ThreadMain();

  const Options options_;
  const std::chrono::milliseconds interval_;  // poll period while collectives are in flight

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Entry>> entries_;         // guarded by mu_
  std::chrono::steady_clock::time_point front_since_;  // guarded by mu_; entries_.front()'s start
  Status failed_;                                      // guarded by mu_
  bool stop_ = false;                                  // guarded by mu_
  std::thread thread_;
};

}  // namespace zero
