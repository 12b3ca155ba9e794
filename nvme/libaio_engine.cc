#include "nvme/libaio_engine.h"

#include <fcntl.h>
#include <libaio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "runtime/errno_text.h"

namespace zero {
namespace {

// Resubmissions of one piece after EINTR/EAGAIN, and io_submit EAGAIN retries, before giving up.
constexpr int kMaxRetries = 64;
// Short transfers in a row that moved no whole aligned block (end of file) before giving up.
constexpr int kMaxNoProgress = 2;

StatusCode CodeForErrno(int err) {
  switch (err) {
    case ENOENT:
      return StatusCode::kNotFound;
    case ENOSPC:
    case EDQUOT:
    case ENOMEM:
      return StatusCode::kResourceExhausted;
    case EACCES:
    case EPERM:
    case EROFS:
      return StatusCode::kFailedPrecondition;
    case EINVAL:
      return StatusCode::kInvalidArgument;
    default:
      return StatusCode::kInternal;
  }
}

class PosixAioFile final : public AioFile {
 public:
  PosixAioFile(std::string path, int fd, bool direct, std::string fs)
      : AioFile(std::move(path), direct, std::move(fs)), fd_(fd) {}
  ~PosixAioFile() override { ::close(fd_); }
  int fd() const { return fd_; }

 private:
  int fd_;
};

// One SubmitRead/SubmitWrite.
struct Request {
  bool write;
  int fd;
  bool direct;
  const std::string* path;  // the AioFile's, which outlives the request
  uint64_t offset;
  char* buffer;
  size_t length;
  int parts_left = 0;  // guarded by LibaioEngine::Impl::mu_
  bool done = false;   // guarded by LibaioEngine::Impl::mu_
  std::atomic<bool> failed{false};
  std::mutex status_mu;
  Status status;  // the first error

  void Fail(Status s) {
    std::lock_guard<std::mutex> l(status_mu);
    if (status.ok()) status = std::move(s);
    failed = true;
  }
  std::string Describe() const {
    return std::string(write ? "write " : "read ") + *path + " offset " + std::to_string(offset) + " length " +
           std::to_string(length);
  }
};

// A contiguous range [next, end) of a request (offsets relative to its start) for one worker.
struct Part {
  std::shared_ptr<Request> request;
  uint64_t next;
  uint64_t end;
  int active = 0;  // pieces of this part in flight or waiting for resubmission
};

struct Piece {
  struct iocb cb;
  Part* part = nullptr;
  uint64_t rel = 0;  // start within the request
  size_t length = 0;
  size_t done = 0;  // bytes already transferred
  int retries = 0;
  int no_progress = 0;
};

}  // namespace

class LibaioEngine::Impl {
 public:
  class Worker;

  Impl(const AioOptions& options, std::shared_ptr<AioIoHook> hook) : options_(options), hook_(std::move(hook)) {}
  ~Impl();

  Status Start();
  Result<AioTicket> Submit(bool write, AioFile& file, uint64_t offset, char* buffer, size_t length);
  Status Wait(AioTicket ticket, std::chrono::milliseconds timeout);
  // When [offset, offset + length) ends past the end of `file`, fallocates the part past the end
  // (counted in extend_preallocations_). EOPNOTSUPP is not an error (the write goes ahead
  // unpreallocated); ENOSPC and other errno are, naming the file and range.
  Status PreallocateIfExtending(const PosixAioFile& file, uint64_t offset, size_t length);
  void PartDone(const std::shared_ptr<Request>& r) {
    std::lock_guard<std::mutex> l(mu_);
    if (--r->parts_left == 0) {
      r->done = true;
      done_cv_.notify_all();
    }
  }

  const AioOptions options_;
  const std::shared_ptr<AioIoHook> hook_;
  std::atomic<uint64_t> pieces_{0}, io_submit_calls_{0}, short_resubmits_{0}, retries_{0}, extend_preallocations_{0};

 private:
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable done_cv_;
  std::unordered_map<AioTicket, std::shared_ptr<Request>> requests_;  // guarded by mu_
  AioTicket next_ticket_ = 1;                                         // guarded by mu_
  size_t next_worker_ = 0;                                            // guarded by mu_
};

class LibaioEngine::Impl::Worker {
 public:
  Worker(Impl* aio, io_context_t ctx)
      : aio_(aio), ctx_(ctx), depth_(static_cast<size_t>(aio->options_.queue_depth)), slots_(depth_), events_(depth_) {
    for (Piece& p : slots_) free_.push_back(&p);
  }
  ~Worker() { io_destroy(ctx_); }

  void Enqueue(std::unique_ptr<Part> part) {
    {
      std::lock_guard<std::mutex> l(mu_);
      queue_.push_back(std::move(part));
    }
    cv_.notify_one();
  }
  void Stop() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_one();
  }

  void Run() {
    const bool overlap = aio_->options_.overlap_events;
    for (;;) {
      {
        std::unique_lock<std::mutex> l(mu_);
        if (active_.empty() && ready_.empty() && inflight_ == 0) {
          cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
          if (queue_.empty()) return;  // stopped with nothing left
        }
        while (!queue_.empty()) {
          active_.push_back(std::move(queue_.front()));
          queue_.pop_front();
        }
      }
      // overlap_events: keep the queue full; otherwise one batch at a time, reaped completely.
      if (overlap || inflight_ == 0) FillAndSubmit();
      if (inflight_ > 0) Reap(overlap ? 1 : inflight_);
      FinishParts();
    }
  }

 private:
  // Next piece to (re)submit, or null when there is none or no free slot.
  Piece* NextPiece() {
    while (!ready_.empty()) {
      Piece* p = ready_.front();
      ready_.pop_front();
      if (!p->part->request->failed) return p;
      Release(p);
    }
    if (free_.empty()) return nullptr;
    const uint64_t block = static_cast<uint64_t>(aio_->options_.block_size);
    for (auto& part : active_) {
      if (part->request->failed) part->next = part->end;
      if (part->next >= part->end) continue;
      Piece* p = free_.back();
      free_.pop_back();
      p->part = part.get();
      p->rel = part->next;
      p->length = static_cast<size_t>(std::min(block, part->end - part->next));
      p->done = 0;
      p->retries = 0;
      p->no_progress = 0;
      part->next += p->length;
      part->active++;
      aio_->pieces_++;
      return p;
    }
    return nullptr;
  }

  void FillAndSubmit() {
    std::vector<Piece*> batch;
    while (inflight_ + batch.size() < depth_) {
      Piece* p = NextPiece();
      if (p == nullptr) break;
      const Request& r = *p->part->request;
      const uint64_t off = r.offset + p->rel + p->done;
      char* buf = r.buffer + p->rel + p->done;
      const size_t len = p->length - p->done;
      if (aio_->hook_) aio_->hook_->BeforeSubmit(r.write, *r.path, off, len);
      if (r.write) {
        io_prep_pwrite(&p->cb, r.fd, buf, len, static_cast<long long>(off));
      } else {
        io_prep_pread(&p->cb, r.fd, buf, len, static_cast<long long>(off));
      }
      p->cb.data = p;
      batch.push_back(p);
      if (aio_->options_.single_submit) {
        SubmitBatch(batch);
        batch.clear();
      }
    }
    if (!batch.empty()) SubmitBatch(batch);
  }

  void SubmitBatch(std::vector<Piece*>& batch) {
    std::vector<struct iocb*> cbs;
    for (Piece* p : batch) cbs.push_back(&p->cb);
    size_t i = 0;
    int eagain = 0;
    while (i < cbs.size()) {
      int rc = io_submit(ctx_, static_cast<long>(cbs.size() - i), cbs.data() + i);
      if (rc > 0) {
        i += static_cast<size_t>(rc);
        inflight_ += static_cast<size_t>(rc);
        aio_->io_submit_calls_++;
        continue;
      }
      if (rc == -EINTR || (rc == -EAGAIN && eagain < kMaxRetries)) {
        aio_->retries_++;
        if (rc == -EAGAIN) {
          ++eagain;
          if (inflight_ > 0) {
            Reap(1);
          } else {
            std::this_thread::sleep_for(std::chrono::milliseconds(std::min(eagain, 20)));
          }
        }
        continue;
      }
      const int err = rc < 0 ? -rc : EIO;
      for (; i < cbs.size(); ++i) {
        Piece* p = static_cast<Piece*>(cbs[i]->data);
        Fail(p, -err, "io_submit");
      }
    }
  }

  void Reap(size_t min_nr) {
    const auto ms = aio_->options_.reap_timeout.count();
    struct timespec ts;
    ts.tv_sec = ms / 1000;
    ts.tv_nsec = (ms % 1000) * 1000000L;
    int n = io_getevents(ctx_, static_cast<long>(min_nr), static_cast<long>(depth_), events_.data(), &ts);
    if (n == -EINTR) {
      aio_->retries_++;
      return;
    }
    ZERO_CHECK_MSG(n >= 0, "io_getevents: " + ErrnoTextAndNumber(-n));
    for (int k = 0; k < n; ++k) {
      Piece* p = static_cast<Piece*>(events_[k].data);
      --inflight_;
      auto result = static_cast<int64_t>(static_cast<long>(events_[k].res));
      const Request& r = *p->part->request;
      if (aio_->hook_) {
        aio_->hook_->AfterComplete(r.write, *r.path, r.offset + p->rel + p->done, p->length - p->done, &result);
      }
      HandleResult(p, result);
    }
  }

  void HandleResult(Piece* p, int64_t result) {
    Request& r = *p->part->request;
    const size_t want = p->length - p->done;
    if (result < 0) {
      const int err = static_cast<int>(-result);
      if ((err == EINTR || err == EAGAIN) && p->retries < kMaxRetries) {
        ++p->retries;
        aio_->retries_++;
        ready_.push_front(p);
        return;
      }
      Fail(p, result, r.write ? "pwrite" : "pread");
      return;
    }
    if (static_cast<uint64_t>(result) >= want) {
      Release(p);
      return;
    }
    // Short transfer: resubmit the rest. Under O_DIRECT the rest must start aligned, so progress
    // is rounded down (the bytes past it are transferred again, which is harmless).
    size_t advance = static_cast<size_t>(result);
    if (r.direct) advance -= advance % kAioAlignment;
    if (advance == 0) {
      if (result == 0 || ++p->no_progress >= kMaxNoProgress) {
        const uint64_t at = r.offset + p->rel + p->done;
        const uint64_t eof = at + static_cast<uint64_t>(result);
        std::string where =
            *r.path + " offset " + std::to_string(at) + " length " + std::to_string(want) + " [" + r.Describe() + "]";
        Fail(p, r.write ? InternalError("pwrite " + where + ": the write made no progress (" + std::to_string(result) +
                                        " bytes accepted)")
                        : DataLossError("pread " + where + ": end of file at byte " + std::to_string(eof) +
                                        " (the file is shorter than expected)"));
        return;
      }
    } else {
      p->no_progress = 0;
    }
    p->done += advance;
    aio_->short_resubmits_++;
    ready_.push_front(p);
  }

  void Fail(Piece* p, int64_t result, const char* what) {
    const Request& r = *p->part->request;
    const int err = static_cast<int>(-result);
    const uint64_t at = r.offset + p->rel + p->done;
    Fail(p, Status(CodeForErrno(err), std::string(what) + " " + *r.path + " offset " + std::to_string(at) + " length " +
                                          std::to_string(p->length - p->done) + ": " + ErrnoTextAndNumber(err) + " [" +
                                          r.Describe() + "]"));
  }
  void Fail(Piece* p, Status s) {
    p->part->request->Fail(std::move(s));
    Release(p);
  }

  void Release(Piece* p) {
    p->part->active--;
    p->part = nullptr;
    free_.push_back(p);
  }

  void FinishParts() {
    for (auto it = active_.begin(); it != active_.end();) {
      Part& part = **it;
      if (part.request->failed) part.next = part.end;
      if (part.next >= part.end && part.active == 0) {
        aio_->PartDone(part.request);
        it = active_.erase(it);
      } else {
        ++it;
      }
    }
  }

  Impl* const aio_;
  const io_context_t ctx_;
  const size_t depth_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Part>> queue_;  // guarded by mu_
  bool stop_ = false;                        // guarded by mu_

  // The worker thread's own state.
  std::vector<Piece> slots_;
  std::vector<Piece*> free_;
  std::deque<Piece*> ready_;  // to resubmit (retries, the rest of short transfers)
  std::list<std::unique_ptr<Part>> active_;
  std::vector<struct io_event> events_;
  size_t inflight_ = 0;
};

Status LibaioEngine::Impl::Start() {
  for (int64_t i = 0; i < options_.intra_op_parallelism; ++i) {
    io_context_t ctx = nullptr;
    int rc = io_setup(static_cast<int>(options_.queue_depth), &ctx);
    if (rc < 0) {
      std::string msg = "aio: io_setup(queue_depth " + std::to_string(options_.queue_depth) + ") for worker " +
                        std::to_string(i) + ": " + ErrnoTextAndNumber(-rc);
      if (rc == -EAGAIN) {
        msg +=
            "; the system-wide limit /proc/sys/fs/aio-max-nr is too small for queue_depth x "
            "intra_op_parallelism x processes";
      }
      return Status(CodeForErrno(-rc), msg);
    }
    workers_.push_back(std::make_unique<Worker>(this, ctx));
  }
  for (auto& w : workers_) threads_.emplace_back([w = w.get()] { w->Run(); });
  return OkStatus();
}

LibaioEngine::Impl::~Impl() {
  for (auto& w : workers_) w->Stop();
  for (auto& t : threads_) t.join();
}

Result<AioTicket> LibaioEngine::Impl::Submit(bool write, AioFile& file, uint64_t offset, char* buffer, size_t length) {
  ZERO_RETURN_IF_ERROR(CheckAioAlignment(file, offset, buffer, length));
  auto* pf = dynamic_cast<PosixAioFile*>(&file);
  if (pf == nullptr) {
    return InvalidArgumentError("aio " + file.path() + ": the file was not opened by this engine");
  }
  // A direct write past the end of the file would extend it, and ext4 (like xfs) completes
  // extending direct writes synchronously inside io_submit: no queue depth at all (bench/aio_bench
  // --states=extend measures 0.1-0.3 of the raw loop). Preallocating the range first turns it into
  // a write into unwritten extents within the file size, which stays asynchronous.
  Status prealloc = OkStatus();
  if (write && pf->direct() && length > 0) prealloc = PreallocateIfExtending(*pf, offset, length);
  auto r = std::make_shared<Request>();
  r->write = write;
  r->fd = pf->fd();
  r->direct = pf->direct();
  r->path = &file.path();
  r->offset = offset;
  r->buffer = buffer;
  r->length = length;
  if (!prealloc.ok()) {
    // Reported by Wait, like every I/O error; nothing was submitted.
    r->Fail(std::move(prealloc));
    std::lock_guard<std::mutex> l(mu_);
    const AioTicket ticket = next_ticket_++;
    r->done = true;
    requests_[ticket] = r;
    return ticket;
  }
  const uint64_t block = static_cast<uint64_t>(options_.block_size);
  const uint64_t pieces = (length + block - 1) / block;
  const uint64_t parts = std::min<uint64_t>(pieces, workers_.size());
  AioTicket ticket;
  size_t first_worker;
  {
    std::lock_guard<std::mutex> l(mu_);
    ticket = next_ticket_++;
    first_worker = next_worker_++;
    r->parts_left = static_cast<int>(parts);
    r->done = parts == 0;
    requests_[ticket] = r;
  }
  for (uint64_t i = 0; i < parts; ++i) {
    auto part = std::make_unique<Part>();
    part->request = r;
    part->next = pieces * i / parts * block;
    part->end = std::min<uint64_t>(length, pieces * (i + 1) / parts * block);
    workers_[(first_worker + i) % workers_.size()]->Enqueue(std::move(part));
  }
  return ticket;
}

Status LibaioEngine::Impl::PreallocateIfExtending(const PosixAioFile& file, uint64_t offset, size_t length) {
  struct stat st;
  if (::fstat(file.fd(), &st) != 0) {
    const int err = errno;
    return Status(CodeForErrno(err), "aio write " + file.path() + ": fstat: " + ErrnoTextAndNumber(err));
  }
  const uint64_t end = offset + length;
  if (end <= static_cast<uint64_t>(st.st_size)) return OkStatus();
  // Only the part past the end: blocks inside the file are left as they are (mode 0 never
  // touches written data).
  const uint64_t from =
      std::max<uint64_t>(offset, static_cast<uint64_t>(st.st_size) & ~static_cast<uint64_t>(kAioAlignment - 1));
  if (::fallocate(file.fd(), 0, static_cast<off_t>(from), static_cast<off_t>(end - from)) != 0) {
    const int err = errno;
    // A filesystem without fallocate: write anyway (slower there, still correct).
    if (err == EOPNOTSUPP || err == ENOSYS) return OkStatus();
    return Status(CodeForErrno(err), "preallocate " + file.path() + " offset " + std::to_string(from) + " length " +
                                         std::to_string(end - from) + " (a write past the end of the file): " +
                                         ErrnoTextAndNumber(err) + " [write " + file.path() + " offset " +
                                         std::to_string(offset) + " length " + std::to_string(length) + "]");
  }
  extend_preallocations_++;
  return OkStatus();
}

Status LibaioEngine::Impl::Wait(AioTicket ticket, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> l(mu_);
  auto it = requests_.find(ticket);
  if (it == requests_.end()) {
    return NotFoundError("aio wait: ticket " + std::to_string(ticket) +
                         " is unknown (never submitted, or already waited for)");
  }
  std::shared_ptr<Request> r = it->second;
  auto pred = [&] { return r->done; };
  if (timeout == kForever) {
    done_cv_.wait(l, pred);
  } else if (!done_cv_.wait_for(l, timeout, pred)) {
    return DeadlineExceededError("aio " + r->Describe() + ": not complete after " + std::to_string(timeout.count()) +
                                 " ms (still in flight: wait again before reusing the buffer)");
  }
  requests_.erase(ticket);
  l.unlock();
  std::lock_guard<std::mutex> sl(r->status_mu);
  return r->status;
}

// --- LibaioEngine ------------------------------------------------------------------------------

LibaioEngine::LibaioEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LibaioEngine::~LibaioEngine() = default;

Result<std::unique_ptr<LibaioEngine>> LibaioEngine::Create(const AioOptions& options, std::shared_ptr<AioIoHook> hook) {
  ZERO_RETURN_IF_ERROR(ValidateAioOptions(options));
  auto impl = std::make_unique<Impl>(options, std::move(hook));
  ZERO_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<LibaioEngine>(new LibaioEngine(std::move(impl)));
}

Result<std::unique_ptr<AioFile>> LibaioEngine::Open(const std::string& path, AioOpenMode mode) {
  // O_NONBLOCK: a named pipe at `path` would block open() forever; it is refused below by fstat and
  // the flag is cleared on the regular file.
  int flags = O_CLOEXEC | O_NONBLOCK | (mode == AioOpenMode::kRead ? O_RDONLY : O_RDWR);
  if (mode == AioOpenMode::kCreate) flags |= O_CREAT | O_TRUNC;
  struct stat st;
  const bool existed = ::stat(path.c_str(), &st) == 0;
  const char* what = mode == AioOpenMode::kRead        ? "open (read)"
                     : mode == AioOpenMode::kReadWrite ? "open (read/write)"
                                                       : "create";
  int fd = ::open(path.c_str(), flags | O_DIRECT, 0644);
  bool direct = true;
  if (fd < 0 && errno == EINVAL) {
    if (!existed) ::unlink(path.c_str());  // some kernels create the file before refusing
    size_t slash = path.find_last_of('/');
    const std::string fs =
        FilesystemType(existed ? path : (slash == std::string::npos ? "." : path.substr(0, slash + 1)));
    if (!impl_->options_.allow_buffered_fallback) {
      return FailedPreconditionError(
          std::string(what) + " " + path + " with O_DIRECT: the filesystem (" + fs +
          ") does not support direct I/O (EINVAL); put the swap path on a disk filesystem such "
          "as ext4 or xfs, or enable the buffered fallback (allow_buffered_fallback: page cache, "
          "synchronous submits)");
    }
    fd = ::open(path.c_str(), flags, 0644);
    direct = false;
  }
  if (fd < 0) {
    const int err = errno;
    return Status(CodeForErrno(err), std::string(what) + " " + path + ": " + ErrnoTextAndNumber(err));
  }
  struct stat fst {};
  if (::fstat(fd, &fst) != 0 || !S_ISREG(fst.st_mode)) {
    const bool fifo = S_ISFIFO(fst.st_mode), dir = S_ISDIR(fst.st_mode);
    ::close(fd);
    return FailedPreconditionError(std::string(what) + " " + path + ": not a regular file (it is " +
                                   (fifo  ? "a named pipe"
                                    : dir ? "a directory"
                                          : "not a regular file") +
                                   "); swap files are regular files");
  }
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl >= 0) ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  return std::unique_ptr<AioFile>(new PosixAioFile(path, fd, direct, FilesystemType(path)));
}

Result<AioTicket> LibaioEngine::SubmitRead(AioFile& file, uint64_t offset, void* buffer, size_t length) {
  return impl_->Submit(false, file, offset, static_cast<char*>(buffer), length);
}

Result<AioTicket> LibaioEngine::SubmitWrite(AioFile& file, uint64_t offset, const void* buffer, size_t length) {
  // The buffer is only read from (the iocb takes a non-const pointer).
  return impl_->Submit(true, file, offset, const_cast<char*>(static_cast<const char*>(buffer)), length);
}

Status LibaioEngine::Wait(AioTicket ticket, std::chrono::milliseconds timeout) { return impl_->Wait(ticket, timeout); }

AioStats LibaioEngine::stats() const {
  AioStats s;
  s.pieces = impl_->pieces_;
  s.io_submit_calls = impl_->io_submit_calls_;
  s.short_resubmits = impl_->short_resubmits_;
  s.retries = impl_->retries_;
  s.extend_preallocations = impl_->extend_preallocations_;
  return s;
}

const AioOptions& LibaioEngine::options() const { return impl_->options_; }

}  // namespace zero
