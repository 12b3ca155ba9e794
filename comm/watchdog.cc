#include "comm/watchdog.h"

#include <algorithm>
#include <utility>

namespace zero {

using Clock = std::chrono::steady_clock;

CollectiveWatchdog::CollectiveWatchdog(Options options)
    : options_(std::move(options)),
      interval_(std::clamp(options_.timeout / 20, std::chrono::milliseconds(1), std::chrono::milliseconds(100))) {
  thread_ = std::thread([this] { ThreadMain(); });
}

CollectiveWatchdog::~CollectiveWatchdog() { Stop(); }

void CollectiveWatchdog::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void CollectiveWatchdog::Track(std::string name, Poll poll) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ || !failed_.ok()) return;
    if (entries_.empty()) front_since_ = Clock::now();
    entries_.push_back(std::make_shared<Entry>(Entry{std::move(name), std::move(poll)}));
  }
  cv_.notify_all();
}

Status CollectiveWatchdog::Fail(Status error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_.ok()) return failed_;
    failed_ = std::move(error);
    entries_.clear();
  }
  cv_.notify_all();
  Status s = status();
  options_.abort(s);
  return s;
}

Status CollectiveWatchdog::FailCollective(const std::string& name, const Status& error) {
  return Fail(Status(error.code(),
                     options_.who + ": " + name + " failed: " + error.message() + "; the communicator was aborted"));
}

Status CollectiveWatchdog::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_;
}

Status CollectiveWatchdog::AwaitFailure() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return stop_ || !failed_.ok(); });
  return failed_;
}

size_t CollectiveWatchdog::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

void CollectiveWatchdog::ThreadMain() {
  if (options_.thread_init) options_.thread_init();
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_ && failed_.ok()) {
    if (entries_.empty()) {
      cv_.wait(lock, [this] { return stop_ || !failed_.ok() || !entries_.empty(); });
      continue;
    }
    std::shared_ptr<Entry> front = entries_.front();
    lock.unlock();
    Status comm = options_.check ? options_.check() : OkStatus();
    Result<bool> done = comm.ok() ? front->poll() : Result<bool>(false);
    if (!comm.ok()) {
      Fail(std::move(comm)).IgnoreError();
      lock.lock();
      continue;
    }
    if (!done.ok()) {
      FailCollective(front->name, done.status()).IgnoreError();
      lock.lock();
      continue;
    }
    lock.lock();
    if (entries_.empty() || entries_.front() != front) continue;  // failed meanwhile
    if (*done) {
      entries_.pop_front();
      front_since_ = Clock::now();
      continue;
    }
    if (Clock::now() - front_since_ >= options_.timeout) {
      lock.unlock();
      Fail(DeadlineExceededError(options_.who + ": " + front->name + " did not complete within " +
                                 std::to_string(options_.timeout.count()) +
                                 " ms (a peer rank may have died, stopped taking part, or issued collectives in a "
                                 "different order); the communicator was aborted"))
          .IgnoreError();
      lock.lock();
      continue;
    }
    cv_.wait_for(lock, interval_, [this] { return stop_ || !failed_.ok(); });
  }
}

}  // namespace zero
