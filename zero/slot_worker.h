// SlotWorker: a ring of staging slots that one worker thread drains in order - the pattern of the
// host optimizer states' update in backward and of the host gradient partition's adds: the
// producer (the engine's thread) takes the next free slot, fills it (typically with a
// device->host copy and an event), and queues a task naming it; the worker runs the tasks one
// after the other and frees each slot when its task is done.
//
// Owns the worker thread (started by the constructor, joined by the destructor after the tasks
// already queued have run), the queue and the first error. Does not own the slots themselves:
// the caller keeps them, indexed 0..slots-1. After a task fails, no further slot is handed out and
// WaitIdle/Acquire return that error (with `what` as context).
//
// Thread safety: Acquire and Push from one producer thread at a time (Acquire then Push, in
// pairs); WaitIdle from any thread.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "runtime/status.h"

namespace zero {

template <typename Task>
class SlotWorker {
 public:
  // `slots` >= 1; `run` is called on the worker thread for each task, in queue order.
  SlotWorker(size_t slots, std::function<Status(const Task&)> run, std::string what)
      : slots_(slots), run_(std::move(run)), what_(std::move(what)), thread_([this] { Loop(); }) {}
  ~SlotWorker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  SlotWorker(const SlotWorker&) = delete;
  SlotWorker& operator=(const SlotWorker&) = delete;

  // Waits for a free slot (slots are freed in order) and returns its index, or the first error.
  Result<size_t> Acquire() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return queued_ < slots_ || !error_.ok(); });
    if (!error_.ok()) return error_;
    const size_t s = next_slot_;
    next_slot_ = (next_slot_ + 1) % slots_;
    return s;
  }
  // Queues `task` for the slot the last Acquire returned.
  void Push(Task task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(std::move(task));
      ++queued_;
    }
    cv_.notify_all();
  }
  // Blocks until every queued task has run; the first error, if any.
  Status WaitIdle() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return tasks_.empty() && !busy_; });
    return error_;
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stop_
      Task t = tasks_.front();
      busy_ = true;
      lock.unlock();
      Status s = run_(t);
      lock.lock();
      tasks_.pop_front();
      --queued_;
      busy_ = false;
      if (!s.ok() && error_.ok()) error_ = s.WithContext(what_);
      cv_.notify_all();
    }
  }

  const size_t slots_;
  const std::function<Status(const Task&)> run_;
  const std::string what_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;  // GUARDED_BY(mu_)
  size_t queued_ = 0;       // GUARDED_BY(mu_): tasks holding a slot
  size_t next_slot_ = 0;    // GUARDED_BY(mu_)
  bool busy_ = false;       // GUARDED_BY(mu_)
  bool stop_ = false;       // GUARDED_BY(mu_)
  Status error_;            // GUARDED_BY(mu_)
  std::thread thread_;      // last: started once everything above is constructed
};

}  // namespace zero
