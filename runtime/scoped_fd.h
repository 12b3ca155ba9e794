// ScopedFd: owns one POSIX file descriptor and closes it on destruction (move-only), for code that
// calls open/pread/fstat directly (the safetensors reader, the data-file checks). -1 means none.
// Not thread-safe; the descriptor itself may be used from any thread.
#pragma once

#include <unistd.h>

#include <utility>

namespace zero {

class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() { Reset(); }
  ScopedFd(ScopedFd&& other) noexcept : fd_(other.release()) {}
  ScopedFd& operator=(ScopedFd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = other.release();
    }
    return *this;
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives up ownership: the caller closes the returned descriptor.
  int release() { return std::exchange(fd_, -1); }
  // Closes the descriptor (if any); close's error is not reported (nothing was written through it
  // that a failed close could lose: writers use AtomicFileWriter, which checks fsync and close).
  void Reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

}  // namespace zero
