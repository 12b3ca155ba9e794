// ThreadPool: a fixed set of worker threads that run the tasks of one parallel loop at a time.
//
// Owns its worker threads (started in Create, joined in the destructor) and nothing else: the
// loop body and the memory it touches belong to the caller. Used by the CPU AdamW (cpu_adam.h) to
// spread contiguous tiles of the optimizer state over cores; the engine owns one pool, sized by
// its `cpu_threads` setting, and hands it to every call. A loop's results must not depend on which
// thread runs which task (the pool gives no such guarantee); the CPU AdamW's do not.
//
// Thread safety: ParallelFor may be called from any thread; concurrent calls run one after the
// other (the pool serves one loop at a time). The body must not call ParallelFor on the same pool
// (it would deadlock) and must not throw.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/status.h"

namespace zero {

class ThreadPool {
 public:
  // A pool whose loops run on `num_threads` threads: the calling thread plus num_threads - 1
  // workers started here. num_threads == 0 means std::thread::hardware_concurrency() (at least 1).
  // Errors: InvalidArgument for num_threads < 0; ResourceExhausted (naming the count) if a worker
  // thread cannot be started (the ones already started are joined).
  static Result<std::unique_ptr<ThreadPool>> Create(int num_threads);

  ~ThreadPool();  // joins the workers; REQUIRES: no ParallelFor in progress
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Threads that take part in a loop, the caller included.
  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs body(task) exactly once for every task in [0, num_tasks) on the pool's threads and the
  // calling thread, and returns when all have finished. num_tasks <= 1 runs on the caller alone.
  void ParallelFor(size_t num_tasks, const std::function<void(size_t)>& body);

 private:
  ThreadPool() = default;
  void WorkerLoop();
  // Takes tasks of the current loop until none is left.
  void RunTasks();

  std::mutex loop_mu_;  // held by the caller for a whole ParallelFor: one loop at a time
  std::mutex mu_;
  std::condition_variable work_cv_;                    // workers wait here for a new generation or stop_
  std::condition_variable done_cv_;                    // the caller waits here for busy_ == 0
  uint64_t generation_ = 0;                            // GUARDED_BY(mu_), bumped once per loop
  int busy_ = 0;                                       // GUARDED_BY(mu_): workers still inside the current loop
  bool stop_ = false;                                  // GUARDED_BY(mu_)
  const std::function<void(size_t)>* body_ = nullptr;  // the current loop's body
  size_t num_tasks_ = 0;
  std::atomic<size_t> next_task_{0};
  std::vector<std::thread> workers_;
};

}  // namespace zero
