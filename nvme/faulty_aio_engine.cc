#include "nvme/faulty_aio_engine.h"

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

namespace zero {

class FaultyAioEngine::Hook final : public AioIoHook {
 public:
  struct Rule {
    bool write;
    int n;
    int err;       // != 0: complete with -err
    size_t bytes;  // err == 0: report this many bytes
  };

  void Add(Rule r) {
    std::lock_guard<std::mutex> l(mu_);
    rules_.push_back(r);
  }

  void BeforeSubmit(bool write, const std::string& path, uint64_t offset, size_t length) override {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return !held_; });
    auto delay = delay_;
    l.unlock();
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
  }

  void AfterComplete(bool write, const std::string& path, uint64_t offset, size_t length, int64_t* result) override {
    std::lock_guard<std::mutex> l(mu_);
    const int n = write ? ++writes_ : ++reads_;
    for (auto it = rules_.begin(); it != rules_.end(); ++it) {
      if (it->write != write || it->n != n) continue;
      if (it->err != 0) {
        *result = -it->err;
      } else if (*result >= 0 && static_cast<uint64_t>(*result) > it->bytes) {
        *result = static_cast<int64_t>(it->bytes);
      }
      rules_.erase(it);
      return;
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Rule> rules_;
  int reads_ = 0;
  int writes_ = 0;
  bool held_ = false;
  std::chrono::microseconds delay_{0};
  int open_err_ = 0;
};

FaultyAioEngine::FaultyAioEngine(std::shared_ptr<Hook> hook, std::unique_ptr<LibaioEngine> base)
    : hook_(std::move(hook)), base_(std::move(base)) {}

FaultyAioEngine::~FaultyAioEngine() {
  ReleaseIo();  // a held worker would keep the base engine's destructor waiting
  base_.reset();
}

Result<std::unique_ptr<FaultyAioEngine>> FaultyAioEngine::Create(const AioOptions& options) {
  auto hook = std::make_shared<Hook>();
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<LibaioEngine> base, LibaioEngine::Create(options, hook));
  return std::unique_ptr<FaultyAioEngine>(new FaultyAioEngine(hook, std::move(base)));
}

void FaultyAioEngine::FailNthRead(int n, int err) { hook_->Add({false, n, err, 0}); }
void FaultyAioEngine::FailNthWrite(int n, int err) { hook_->Add({true, n, err, 0}); }
void FaultyAioEngine::ShortenNthRead(int n, size_t bytes) { hook_->Add({false, n, 0, bytes}); }
void FaultyAioEngine::ShortenNthWrite(int n, size_t bytes) { hook_->Add({true, n, 0, bytes}); }

void FaultyAioEngine::SetSubmitDelay(std::chrono::microseconds delay) {
  std::lock_guard<std::mutex> l(hook_->mu_);
  hook_->delay_ = delay;
}

void FaultyAioEngine::HoldIo() {
  std::lock_guard<std::mutex> l(hook_->mu_);
  hook_->held_ = true;
}

void FaultyAioEngine::ReleaseIo() {
  {
    std::lock_guard<std::mutex> l(hook_->mu_);
    hook_->held_ = false;
  }
  hook_->cv_.notify_all();
}

void FaultyAioEngine::FailNextOpen(int err) {
  std::lock_guard<std::mutex> l(hook_->mu_);
  hook_->open_err_ = err;
}

int FaultyAioEngine::reads_reaped() const {
  std::lock_guard<std::mutex> l(hook_->mu_);
  return hook_->reads_;
}

int FaultyAioEngine::writes_reaped() const {
  std::lock_guard<std::mutex> l(hook_->mu_);
  return hook_->writes_;
}

Result<std::unique_ptr<AioFile>> FaultyAioEngine::Open(const std::string& path, AioOpenMode mode) {
  int err;
  {
    std::lock_guard<std::mutex> l(hook_->mu_);
    err = std::exchange(hook_->open_err_, 0);
  }
  if (err != 0) {
    return ErrnoError("open (injected)", path, err);
  }
  return base_->Open(path, mode);
}

Result<AioTicket> FaultyAioEngine::SubmitRead(AioFile& file, uint64_t offset, void* buffer, size_t length) {
  return base_->SubmitRead(file, offset, buffer, length);
}

Result<AioTicket> FaultyAioEngine::SubmitWrite(AioFile& file, uint64_t offset, const void* buffer, size_t length) {
  return base_->SubmitWrite(file, offset, buffer, length);
}

Status FaultyAioEngine::Wait(AioTicket ticket, std::chrono::milliseconds timeout) {
  return base_->Wait(ticket, timeout);
}

}  // namespace zero
