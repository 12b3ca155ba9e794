#include "offload/thread_pool.h"

#include <string>
#include <system_error>

namespace zero {

Result<std::unique_ptr<ThreadPool>> ThreadPool::Create(int num_threads) {
  if (num_threads < 0) {
    return InvalidArgumentError("ThreadPool: num_threads is " + std::to_string(num_threads) +
                                ", expected >= 0 (0: hardware threads)");
  }
  if (num_threads == 0) {
    num_threads = static_cast<int>(std::thread::hardware_concurrency());
    if (num_threads < 1) num_threads = 1;
  }
  std::unique_ptr<ThreadPool> pool(new ThreadPool());
  pool->workers_.reserve(num_threads - 1);
  for (int i = 1; i < num_threads; ++i) {
    try {
      pool->workers_.emplace_back([p = pool.get()] { p->WorkerLoop(); });
    } catch (const std::system_error& e) {
      // The destructor joins the workers already started.
      return ResourceExhaustedError("ThreadPool: could not start worker thread " + std::to_string(i) + " of " +
                                    std::to_string(num_threads - 1) + ": " + e.what() + " (use fewer threads)");
    }
  }
  return pool;
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::RunTasks() {
  const size_t n = num_tasks_;
  for (size_t t = next_task_.fetch_add(1, std::memory_order_relaxed); t < n;
       t = next_task_.fetch_add(1, std::memory_order_relaxed)) {
    (*body_)(t);
  }
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    RunTasks();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--busy_ == 0) done_cv_.notify_one();
    }
  }
}

void ThreadPool::ParallelFor(size_t num_tasks, const std::function<void(size_t)>& body) {
  if (num_tasks == 0) return;
  if (num_tasks == 1 || workers_.empty()) {
    for (size_t t = 0; t < num_tasks; ++t) body(t);
    return;
  }
  std::lock_guard<std::mutex> loop_lock(loop_mu_);
  {
    // The mutex publishes body_, num_tasks_ and next_task_ to the workers woken below.
    std::lock_guard<std::mutex> lock(mu_);
    body_ = &body;
    num_tasks_ = num_tasks;
    next_task_.store(0, std::memory_order_relaxed);
    busy_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  work_cv_.notify_all();
  RunTasks();
  // Every worker leaves RunTasks before the body (a reference to the caller's) goes away.
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return busy_ == 0; });
  body_ = nullptr;
}

}  // namespace zero
