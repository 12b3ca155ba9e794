#include "runtime/step_timers.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace zero {

StepTimers::StepTimers(std::function<int64_t()> clock) : clock_(std::move(clock)) {
  if (!clock_) clock_ = [] { return int64_t{std::chrono::steady_clock::now().time_since_epoch().count()}; };
}

StepTimers::Timer& StepTimers::Get(const std::string& name) {
  auto [it, inserted] = timers_.try_emplace(name);
  if (inserted) order_.push_back(name);
  return it->second;
}

Status StepTimers::Start(const std::string& name) {
  const int64_t now = clock_();
  std::lock_guard<std::mutex> lock(mu_);
  Timer& t = Get(name);
  if (t.running) return FailedPreconditionError("StepTimers: timer '" + name + "' started while already running");
  t.running = true;
  t.started_ns = now;
  return OkStatus();
}

Status StepTimers::Stop(const std::string& name) {
  const int64_t now = clock_();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = timers_.find(name);
  if (it == timers_.end() || !it->second.running) {
    return FailedPreconditionError("StepTimers: timer '" + name + "' stopped without a Start");
  }
  Timer& t = it->second;
  t.running = false;
  t.total_ms += static_cast<double>(std::max<int64_t>(0, now - t.started_ns)) / 1e6;
  t.used = true;
  return OkStatus();
}

void StepTimers::Add(const std::string& name, double ms) {
  std::lock_guard<std::mutex> lock(mu_);
  Timer& t = Get(name);
  t.total_ms += ms;
  t.used = true;
}

void StepTimers::EndStep() {
  std::lock_guard<std::mutex> lock(mu_);
  ++steps_;
}

int64_t StepTimers::steps() const {
  std::lock_guard<std::mutex> lock(mu_);
  return steps_;
}

bool StepTimers::has(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = timers_.find(name);
  return it != timers_.end() && it->second.used;
}

double StepTimers::TotalMs(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = timers_.find(name);
  return it == timers_.end() ? 0.0 : it->second.total_ms;
}

double StepTimers::MeanMs(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = timers_.find(name);
  const double total = it == timers_.end() ? 0.0 : it->second.total_ms;
  return total / static_cast<double>(std::max<int64_t>(steps_, 1));
}

std::string StepTimers::FormatLocked(const std::vector<std::string>& names) const {
  std::string out = "time (ms)";
  const double steps = static_cast<double>(std::max<int64_t>(steps_, 1));
  for (const std::string& name : names) {
    auto it = timers_.find(name);
    if (it == timers_.end() || !it->second.used) continue;
    char buf[48];
    std::snprintf(buf, sizeof(buf), ": %.2f", it->second.total_ms / steps);
    out += " | " + name + buf;
  }
  return out;
}

std::string StepTimers::Format(const std::vector<std::string>& names) const {
  std::lock_guard<std::mutex> lock(mu_);
  return FormatLocked(names);
}

std::string StepTimers::FormatAll() const {
  std::lock_guard<std::mutex> lock(mu_);
  return FormatLocked(order_);
}

void StepTimers::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [name, t] : timers_) {
    t.total_ms = 0;
    t.used = false;
  }
  steps_ = 0;
}

}  // namespace zero
