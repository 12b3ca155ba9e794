#include "comm/gloo_communicator.h"

#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <sstream>
#include <utility>

#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/device.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include "comm/host_reduce.h"
#include "comm/store_join.h"

namespace zero {
namespace {

using Clock = std::chrono::steady_clock;

// Below these sizes one exchange of whole buffers beats two phases of chunks on latency.
constexpr size_t kDirectAllReduceBytes = 64 * 1024;
constexpr size_t kDirectBroadcastBytes = 256 * 1024;
// Staging memory above this is returned to the system after the collective.
constexpr size_t kKeepStagingBytes = size_t{64} << 20;
// Slots of this communicator's transfers: a tag byte, then a sequence number shared by all ranks.
constexpr uint64_t kSlotBase = uint64_t{0x5a} << 56;

// Thrown on the comm thread when Abort() interrupted a wait.
struct AbortedError {};

std::string DescribeCount(size_t count, DType t) { return std::to_string(count) + " x " + DTypeName(t); }

// acc[i] (op)= element i of src, in fp32. `first` initializes acc (rank 0's contribution).
void AccumulateFloat(float* acc, const void* src, DType t, size_t n, ReduceOp op, bool first) {
  auto apply = [&](auto load) {
    if (first) {
      for (size_t i = 0; i < n; ++i) acc[i] = load(i);
    } else if (op == ReduceOp::kMax) {
      for (size_t i = 0; i < n; ++i) {
        float v = load(i);
        if (v > acc[i] || v != v) acc[i] = v;
      }
    } else {
      for (size_t i = 0; i < n; ++i) acc[i] += load(i);
    }
  };
  switch (t) {
    case DType::kF32: {
      const float* p = static_cast<const float*>(src);
      apply([p](size_t i) { return p[i]; });
      break;
    }
    case DType::kBF16: {
      const uint16_t* p = static_cast<const uint16_t*>(src);
      apply([p](size_t i) { return Bf16ToFloat(p[i]); });
      break;
    }
    case DType::kF16: {
      const uint16_t* p = static_cast<const uint16_t*>(src);
      apply([p](size_t i) { return HalfToFloat(p[i]); });
      break;
    }
  }
}

// out[i] = round_to_t(acc[i] (/ n for kAvg)).
void FinishFloat(const float* acc, void* out, DType t, size_t n, ReduceOp op, int world_size) {
  const float divisor = static_cast<float>(world_size);
  const bool avg = op == ReduceOp::kAvg;
  switch (t) {
    case DType::kF32: {
      float* o = static_cast<float*>(out);
      for (size_t i = 0; i < n; ++i) o[i] = avg ? acc[i] / divisor : acc[i];
      break;
    }
    case DType::kBF16: {
      uint16_t* o = static_cast<uint16_t*>(out);
      for (size_t i = 0; i < n; ++i) o[i] = FloatToBf16(avg ? acc[i] / divisor : acc[i]);
      break;
    }
    case DType::kF16: {
      uint16_t* o = static_cast<uint16_t*>(out);
      for (size_t i = 0; i < n; ++i) o[i] = FloatToHalf(avg ? acc[i] / divisor : acc[i]);
      break;
    }
  }
}

bool Overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  auto pa = reinterpret_cast<uintptr_t>(a);
  auto pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

// N near-equal chunks of `count`: chunk p is [begin[p], begin[p] + len[p]); trailing ones may be
// shorter or empty.
void SplitChunks(size_t count, int n, std::vector<size_t>* begin, std::vector<size_t>* len) {
  size_t chunk = (count + n - 1) / n;
  begin->resize(n);
  len->resize(n);
  for (int p = 0; p < n; ++p) {
    size_t b = std::min(count, chunk * p);
    (*begin)[p] = b;
    (*len)[p] = std::min(chunk, count - b);
  }
}

class CompletedWork final : public Work {
 public:
  explicit CompletedWork(Status s) : status_(std::move(s)) {}
  Status Wait() override { return status_; }
  bool IsCompleted() override { return true; }
  Status StreamWait(Stream*) override { return status_; }

 private:
  Status status_;
};

}  // namespace

struct GlooCommunicator::WorkState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;

  void Complete(Status s) {
    std::lock_guard<std::mutex> lock(mu);
    status = std::move(s);
    done = true;
    cv.notify_all();
  }
};

class GlooCommunicator::WorkHandle final : public Work {
 public:
  explicit WorkHandle(std::shared_ptr<WorkState> state) : state_(std::move(state)) {}
  Status Wait() override {
    std::unique_lock<std::mutex> lock(state_->mu);
    state_->cv.wait(lock, [this] { return state_->done; });
    return state_->status;
  }
  bool IsCompleted() override {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->done;
  }
  Status StreamWait(Stream*) override { return Wait(); }

 private:
  std::shared_ptr<WorkState> state_;
};

// One phase of point-to-point transfers on one slot: everything is posted first, then waited.
// Buffers are registered with the communicator so Abort() can interrupt the waits.
class GlooCommunicator::Exchange {
 public:
  Exchange(GlooCommunicator* comm, uint64_t slot) : comm_(comm), slot_(slot) {}
  ~Exchange() {
    std::lock_guard<std::mutex> lock(comm_->mu_);
    auto& active = comm_->active_;
    for (auto* list : {&sends_, &recvs_}) {
      for (auto& x : *list) {
        active.erase(std::remove(active.begin(), active.end(), x.buf.get()), active.end());
      }
    }
  }

  void Send(int peer, const void* ptr, size_t bytes) {
    if (bytes == 0) return;
    // Listed before it is posted: a post that throws (a broken pair) leaves it to ~Exchange, which
    // unregisters it from active_ (a later Abort would touch it otherwise).
    sends_.push_back({peer, Make(const_cast<void*>(ptr), bytes), false});
    comm_->waiting_peer_ = peer;
    comm_->waiting_what_ = "posting a send to";
    sends_.back().buf->send(peer, slot_);
    comm_->waiting_peer_ = -1;
  }

  void Recv(int peer, void* ptr, size_t bytes) {
    if (bytes == 0) return;
    recvs_.push_back({peer, Make(ptr, bytes), false});  // listed first, as in Send
    comm_->waiting_peer_ = peer;
    comm_->waiting_what_ = "posting a receive from";
    recvs_.back().buf->recv(peer, slot_);
    comm_->waiting_peer_ = -1;
  }

  // Waits for the receive posted from `peer` (no-op if none was posted).
  void WaitRecv(int peer) {
    for (auto& x : recvs_) {
      if (x.peer != peer || x.done) continue;
      comm_->waiting_peer_ = peer;
      comm_->waiting_what_ = "receiving from";
      if (!x.buf->waitRecv(nullptr, Remaining())) throw AbortedError{};
      x.done = true;
    }
    comm_->waiting_peer_ = -1;
  }

  void WaitAll() {
    for (auto& x : recvs_) WaitRecv(x.peer);
    for (auto& x : sends_) {
      if (x.done) continue;
      comm_->waiting_peer_ = x.peer;
      comm_->waiting_what_ = "sending to";
      if (!x.buf->waitSend(nullptr, Remaining())) throw AbortedError{};
      x.done = true;
    }
    comm_->waiting_peer_ = -1;
  }

 private:
  struct Transfer {
    int peer;
    std::unique_ptr<gloo::transport::UnboundBuffer> buf;
    bool done;
  };

  std::unique_ptr<gloo::transport::UnboundBuffer> Make(void* ptr, size_t bytes) {
    auto buf = comm_->context_->createUnboundBuffer(ptr, bytes);
    std::lock_guard<std::mutex> lock(comm_->mu_);
    if (!comm_->failed_.ok()) throw AbortedError{};
    comm_->active_.push_back(buf.get());
    return buf;
  }

  std::chrono::milliseconds Remaining() const {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(comm_->deadline_ - Clock::now());
    return std::max(left, std::chrono::milliseconds(1));
  }

  GlooCommunicator* comm_;
  uint64_t slot_;
  std::vector<Transfer> sends_;
  std::vector<Transfer> recvs_;
};

// gloo's TCP event loop waits in epoll_wait for up to 10 ms, and every socket its pairs
// unregister from a thread other than the loop's (connecting to a lower-addressed peer, closing a
// connection) waits for the loop's next tick. With nothing else happening that makes setup and
// teardown cost ~10 ms per connection. While started, the kicker writes an eventfd registered
// with the loop every 100 us, so those waits end almost at once.
class GlooCommunicator::LoopKicker final : public gloo::transport::tcp::Handler {
 public:
  explicit LoopKicker(gloo::transport::tcp::Device* device) : device_(device) {
    fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd_ >= 0) device_->registerDescriptor(fd_, EPOLLIN, this);
  }
  // REQUIRES: the device's loop has stopped (the device is destroyed) or Unregister() was called.
  ~LoopKicker() override {
    Stop();
    if (fd_ >= 0) close(fd_);
  }
  void handleEvents(int) override {
    uint64_t v;
    ssize_t ignored = read(fd_, &v, sizeof(v));
    (void)ignored;
  }
  void Start() {
    if (fd_ < 0 || thread_.joinable()) return;
    running_ = true;
    thread_ = std::thread([this] {
      while (running_) {
        uint64_t one = 1;
        ssize_t ignored = write(fd_, &one, sizeof(one));
        (void)ignored;
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    });
  }
  void Stop() {
    running_ = false;
    if (thread_.joinable()) thread_.join();
  }

 private:
  gloo::transport::tcp::Device* device_;
  int fd_ = -1;
  std::atomic<bool> running_{false};
  std::thread thread_;
};

// ---------------------------------------------------------------------------------------------

GlooCommunicator::GlooCommunicator(int rank, int world_size, Device* device, const GlooOptions& options)
    : rank_(rank), world_size_(world_size), device_(device), options_(options) {}

Result<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(int rank, int world_size,
                                                                   std::shared_ptr<gloo::rendezvous::Store> store,
                                                                   Device* device, const GlooOptions& options) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return InvalidArgumentError("gloo: rank " + std::to_string(rank) + " out of range for world size " +
                                std::to_string(world_size));
  }
  if (device == nullptr || device->kind() != DeviceKind::kCpu) {
    return InvalidArgumentError("gloo: buffers must live in host memory (a cpu Device); got " +
                                (device == nullptr ? std::string("no device") : device->name()) +
                                "; use the nccl backend for CUDA buffers");
  }
  if (store == nullptr && world_size > 1) return InvalidArgumentError("gloo: no rendezvous store");
  if (options.comm.timeout.count() <= 0) {
    return InvalidArgumentError("gloo: timeout must be positive, got " + TimeoutText(options.comm.timeout));
  }
  auto comm = std::unique_ptr<GlooCommunicator>(new GlooCommunicator(rank, world_size, device, options));
  ZERO_RETURN_IF_ERROR(comm->Rendezvous(std::move(store)));
  comm->thread_ = std::thread([c = comm.get()] { c->ThreadMain(); });
  return comm;
}

Status GlooCommunicator::Rendezvous(std::shared_ptr<gloo::rendezvous::Store> store) {
  store_ = std::move(store);
  if (world_size_ == 1) return OkStatus();
  const std::string who = "gloo rendezvous of rank " + std::to_string(rank_) + " of " + std::to_string(world_size_);
  const RendezvousDeadline deadline(options_.comm.timeout);
  gloo::rendezvous::PrefixStore pstore(options_.prefix.empty() ? "zero" : options_.prefix, *store_);

  // 1. Join: every rank announces itself and waits for the others (comm/store_join.h).
  ZERO_RETURN_IF_ERROR(JoinThroughStore(pstore, rank_, world_size_, who, deadline));

  // 2. Connect a full mesh of TCP pairs.
  try {
    gloo::transport::tcp::attr attr;
    if (!options_.iface.empty()) {
      attr.iface = options_.iface;
    } else if (!options_.hostname.empty()) {
      attr.hostname = options_.hostname;
    }
    // gloo writes to its sockets with writev(2), which raises SIGPIPE when a peer is gone; the
    // loop thread the device starts inherits this thread's mask, so block it around creation.
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    try {
      gloo_device_ = gloo::transport::tcp::CreateDevice(attr);
    } catch (...) {
      pthread_sigmask(SIG_SETMASK, &old, nullptr);
      throw;
    }
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    kicker_ = std::make_unique<LoopKicker>(static_cast<gloo::transport::tcp::Device*>(gloo_device_.get()));
    kicker_->Start();
  } catch (const std::exception& e) {
    return UnavailableError(
        who + ": cannot create a gloo tcp device on " +
        (options_.iface.empty() ? "host '" + options_.hostname + "'" : "interface '" + options_.iface + "'") + ": " +
        e.what());
  }
  try {
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank_, world_size_);
    ctx->setTimeout(deadline.Remaining());
    ctx->connectFullMesh(pstore, gloo_device_);
    ctx->setTimeout(deadline.timeout());
    context_ = std::move(ctx);
    kicker_->Stop();
  } catch (const std::exception& e) {
    return Status(deadline.Passed() ? StatusCode::kDeadlineExceeded : StatusCode::kUnavailable,
                  who + ": connecting to the other ranks failed: " + e.what());
  }

  return OkStatus();
}

GlooCommunicator::~GlooCommunicator() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (kicker_ != nullptr) kicker_->Start();
  context_.reset();
  gloo_device_.reset();  // joins the loop thread; the kicker's fd stays registered until then
  kicker_.reset();
}

void GlooCommunicator::Abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_.ok()) {
    failed_ = UnavailableError("gloo communicator of rank " + std::to_string(rank_) + " aborted: " + reason);
  }
  for (auto* buf : active_) {
    buf->abortWaitRecv();
    buf->abortWaitSend();
  }
  cv_.notify_all();
}

Status GlooCommunicator::CheckHealth() {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_;
}

uint64_t GlooCommunicator::NextSlot() { return kSlotBase | (next_seq_++ << 8); }

Result<std::unique_ptr<Work>> GlooCommunicator::Enqueue(std::string name, std::function<void()> run, Stream* after) {
  if (after != nullptr) ZERO_RETURN_IF_ERROR(device_->SynchronizeStream(after));
  auto state = std::make_shared<WorkState>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_.ok()) {
      return Status(failed_.code(), "gloo " + name + " on rank " + std::to_string(rank_) +
                                        " not started: the communicator failed earlier: " + failed_.message());
    }
    name = "collective #" + std::to_string(++issued_) + " " + name;
    queue_.push_back(Op{std::move(name), std::move(run), state});
  }
  cv_.notify_all();
  return std::unique_ptr<Work>(new WorkHandle(std::move(state)));
}

void GlooCommunicator::ThreadMain() {
  // Writes to a closed socket must fail with EPIPE, not kill the process (see Rendezvous).
  sigset_t block;
  sigemptyset(&block);
  sigaddset(&block, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &block, nullptr);
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty() || (!failed_.ok() && context_ != nullptr); });
    if (!failed_.ok() && context_ != nullptr) {
      // Close this rank's connections: peers blocked on us fail now instead of at their timeout.
      lock.unlock();
      if (kicker_ != nullptr) kicker_->Start();
      context_.reset();
      if (kicker_ != nullptr) kicker_->Stop();
      lock.lock();
      continue;
    }
    if (queue_.empty()) {
      if (stop_) return;
      continue;
    }
    Op op = std::move(queue_.front());
    queue_.pop_front();
    Status earlier = failed_;
    lock.unlock();
    Status status;
    if (earlier.ok()) {
      status = RunOp(op);
    } else {
      status = Status(earlier.code(), "gloo " + op.name + " on rank " + std::to_string(rank_) +
                                          " not run: the communicator failed earlier: " + earlier.message());
    }
    if (staging_.capacity() > kKeepStagingBytes) std::vector<char>().swap(staging_);
    if (acc_.capacity() * sizeof(float) > kKeepStagingBytes) std::vector<float>().swap(acc_);
    lock.lock();
    if (!status.ok() && failed_.ok()) failed_ = status;
    lock.unlock();
    op.state->Complete(std::move(status));
    lock.lock();
  }
}

std::string GlooCommunicator::LostPeers() {
  // A pair whose connection broke rethrows its error when an operation is posted on it. Posting
  // a receive on a healthy one only sends it a notification, harmless as this context is about
  // to be closed anyway.
  if (context_ == nullptr) return {};
  std::string lost;
  char byte = 0;
  const uint64_t probe_slot = kSlotBase | 0xff;
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> probes;
  for (int p = 0; p < world_size_; ++p) {
    if (p == rank_) continue;
    try {
      auto buf = context_->createUnboundBuffer(&byte, 1);
      buf->recv(p, probe_slot);
      probes.push_back(std::move(buf));
    } catch (const std::exception&) {
      lost += (lost.empty() ? "rank " : ", rank ") + std::to_string(p);
    }
  }
  return lost;
}

Status GlooCommunicator::RunOp(Op& op) {
  deadline_ = Clock::now() + options_.comm.timeout;
  waiting_peer_ = -1;
  try {
    op.run();
    return OkStatus();
  } catch (const AbortedError&) {
    std::lock_guard<std::mutex> lock(mu_);
    return Status(failed_.code(),
                  "gloo " + op.name + " on rank " + std::to_string(rank_) + " interrupted: " + failed_.message());
  } catch (const gloo::IoException& e) {
    bool timed_out = Clock::now() + kDeadlineSlack >= deadline_;
    return Translate(op.name, e.what(), timed_out, timed_out ? std::string() : LostPeers());
  } catch (const gloo::EnforceNotMet& e) {
    return Translate(op.name, e.what(), false, {});
  } catch (const std::exception& e) {
    bool timed_out = Clock::now() + kDeadlineSlack >= deadline_;
    return Translate(op.name, e.what(), timed_out, timed_out ? std::string() : LostPeers());
  } catch (...) {
    return Translate(op.name, "unknown exception", false, {});
  }
}

Status GlooCommunicator::Translate(const std::string& op_name, const char* what, bool timed_out,
                                   const std::string& lost) const {
  std::string msg =
      "gloo " + op_name + " on rank " + std::to_string(rank_) + " of " + std::to_string(world_size_) + ": ";
  std::string text = what;
  const std::string& peer = lost;
  if (timed_out) {
    msg += "timed out after " + TimeoutText(options_.comm.timeout);
    if (waiting_peer_ >= 0) msg += std::string(" ") + waiting_what_ + " rank " + std::to_string(waiting_peer_);
  } else if (!peer.empty()) {
    msg += "connection lost to " + peer;
    if (waiting_peer_ >= 0) msg += std::string(" while ") + waiting_what_ + " rank " + std::to_string(waiting_peer_);
  } else if (waiting_peer_ >= 0) {
    msg += std::string("failed while ") + waiting_what_ + " rank " + std::to_string(waiting_peer_);
  } else {
    msg += "failed";
  }
  msg += " (" + text + ")";
  return Status(timed_out ? StatusCode::kDeadlineExceeded : StatusCode::kUnavailable, msg);
}

// ---------------------------------------------------------------------------------------------
// Collective bodies, on the comm thread.

void GlooCommunicator::DoReduceChunks(const char* data, const std::vector<size_t>& begin,
                                      const std::vector<size_t>& len, DType t, ReduceOp op, void* out, uint64_t slot) {
  const int n_ranks = world_size_;
  const size_t es = SizeOf(t);
  const size_t n = len[rank_];
  const size_t share_bytes = n * es;
  if (staging_.size() < (n_ranks - 1) * share_bytes) staging_.resize((n_ranks - 1) * share_bytes);
  auto staged = [&](int s) { return staging_.data() + (s < rank_ ? s : s - 1) * share_bytes; };

  Exchange ex(this, slot);
  for (int s = 0; s < n_ranks; ++s) {
    if (s != rank_) ex.Recv(s, staged(s), share_bytes);
  }
  for (int i = 1; i < n_ranks; ++i) {  // staggered so every rank does not hit rank 0 first
    int p = (rank_ + i) % n_ranks;
    ex.Send(p, data + begin[p] * es, len[p] * es);
  }
  if (acc_.size() < n) acc_.resize(n);
  for (int s = 0; s < n_ranks; ++s) {
    const void* src = s == rank_ ? data + begin[rank_] * es : staged(s);
    if (s != rank_) ex.WaitRecv(s);
    AccumulateFloat(acc_.data(), src, t, n, op, s == 0);
  }
  // Our share is read; the output may alias it (AllReduce), never the shares we send.
  FinishFloat(acc_.data(), out, t, n, op, n_ranks);
  ex.WaitAll();
}

void GlooCommunicator::DoGatherChunks(char* buf, const std::vector<size_t>& begin, const std::vector<size_t>& len,
                                      size_t elem, int skip_recv_rank, uint64_t slot) {
  Exchange ex(this, slot);
  if (rank_ != skip_recv_rank) {
    for (int s = 0; s < world_size_; ++s) {
      if (s != rank_) ex.Recv(s, buf + begin[s] * elem, len[s] * elem);
    }
  }
  for (int i = 1; i < world_size_; ++i) {
    int p = (rank_ + i) % world_size_;
    if (p != skip_recv_rank) ex.Send(p, buf + begin[rank_] * elem, len[rank_] * elem);
  }
  ex.WaitAll();
}

void GlooCommunicator::DoAllReduceDirect(void* buf, size_t count, DType t, ReduceOp op) {
  const size_t bytes = count * SizeOf(t);
  if (staging_.size() < (world_size_ - 1) * bytes) staging_.resize((world_size_ - 1) * bytes);
  auto staged = [&](int s) { return staging_.data() + (s < rank_ ? s : s - 1) * bytes; };
  Exchange ex(this, NextSlot());
  for (int s = 0; s < world_size_; ++s) {
    if (s != rank_) ex.Recv(s, staged(s), bytes);
  }
  for (int i = 1; i < world_size_; ++i) ex.Send((rank_ + i) % world_size_, buf, bytes);
  if (acc_.size() < count) acc_.resize(count);
  for (int s = 0; s < world_size_; ++s) {
    if (s != rank_) ex.WaitRecv(s);
    AccumulateFloat(acc_.data(), s == rank_ ? buf : staged(s), t, count, op, s == 0);
  }
  ex.WaitAll();  // `buf` is still being sent until then
  FinishFloat(acc_.data(), buf, t, count, op, world_size_);
}

void GlooCommunicator::DoAllReduce(void* buf, size_t count, DType t, ReduceOp op) {
  if (world_size_ == 1) {
    // One contribution: the fp32 value converts back exactly; kAvg divides by 1.
    return;
  }
  if (count * SizeOf(t) <= kDirectAllReduceBytes) return DoAllReduceDirect(buf, count, t, op);
  std::vector<size_t> begin, len;
  SplitChunks(count, world_size_, &begin, &len);
  char* data = static_cast<char*>(buf);
  const size_t es = SizeOf(t);
  DoReduceChunks(data, begin, len, t, op, data + begin[rank_] * es, NextSlot());
  DoGatherChunks(data, begin, len, es, -1, NextSlot());
}

void GlooCommunicator::DoBroadcast(void* buf, size_t bytes, size_t elem, int root) {
  if (world_size_ == 1 || bytes == 0) return;
  char* data = static_cast<char*>(buf);
  if (bytes <= kDirectBroadcastBytes || world_size_ == 2) {
    Exchange ex(this, NextSlot());
    if (rank_ == root) {
      for (int i = 1; i < world_size_; ++i) ex.Send((rank_ + i) % world_size_, data, bytes);
    } else {
      ex.Recv(root, data, bytes);
    }
    ex.WaitAll();
    return;
  }
  // Scatter the chunks from the root, then all-gather them among the others.
  std::vector<size_t> begin, len;
  SplitChunks(bytes / elem, world_size_, &begin, &len);
  {
    Exchange ex(this, NextSlot());
    if (rank_ == root) {
      for (int i = 1; i < world_size_; ++i) {
        int p = (rank_ + i) % world_size_;
        ex.Send(p, data + begin[p] * elem, len[p] * elem);
      }
    } else {
      ex.Recv(root, data + begin[rank_] * elem, len[rank_] * elem);
    }
    ex.WaitAll();
  }
  DoGatherChunks(data, begin, len, elem, root, NextSlot());
}

void GlooCommunicator::DoBarrier() {
  if (world_size_ == 1) return;
  char token = 1;
  std::vector<char> in(world_size_);
  Exchange ex(this, NextSlot());
  for (int s = 0; s < world_size_; ++s) {
    if (s != rank_) ex.Recv(s, &in[s], 1);
  }
  for (int i = 1; i < world_size_; ++i) ex.Send((rank_ + i) % world_size_, &token, 1);
  ex.WaitAll();
}

void GlooCommunicator::DoAllReduceHost(double* values, size_t n, ReduceOp op) {
  if (world_size_ == 1 || n == 0) return;
  const size_t bytes = n * sizeof(double);
  if (staging_.size() < (world_size_ - 1) * bytes) staging_.resize((world_size_ - 1) * bytes);
  auto staged = [&](int s) { return reinterpret_cast<double*>(staging_.data() + (s < rank_ ? s : s - 1) * bytes); };
  Exchange ex(this, NextSlot());
  for (int s = 0; s < world_size_; ++s) {
    if (s != rank_) ex.Recv(s, staged(s), bytes);
  }
  for (int i = 1; i < world_size_; ++i) ex.Send((rank_ + i) % world_size_, values, bytes);
  acc_double_.assign(n, 0.0);
  for (int s = 0; s < world_size_; ++s) {
    if (s != rank_) ex.WaitRecv(s);
    AccumulateHostValues(acc_double_.data(), s == rank_ ? values : staged(s), n, op, s == 0);
  }
  ex.WaitAll();
  FinishHostValues(acc_double_.data(), values, n, op, world_size_);
}

// ---------------------------------------------------------------------------------------------
// Public API: validate on the caller's thread, then queue.

Result<std::unique_ptr<Work>> GlooCommunicator::AllReduce(void* buf, size_t count, DType t, ReduceOp op,
                                                          Stream* after) {
  if (!IsKnownDType(t)) return InvalidArgumentError("gloo AllReduce: unknown dtype");
  if (buf == nullptr && count > 0) return InvalidArgumentError("gloo AllReduce: null buffer");
  std::string name = "AllReduce (" + DescribeCount(count, t) + ", " + ReduceOpName(op) + ")";
  if (count == 0) return std::unique_ptr<Work>(new CompletedWork(OkStatus()));
  return Enqueue(
      std::move(name), [=, this] { DoAllReduce(buf, count, t, op); }, after);
}

Result<std::unique_ptr<Work>> GlooCommunicator::ReduceScatter(const void* send, void* recv, size_t recv_count, DType t,
                                                              ReduceOp op, Stream* after) {
  if (!IsKnownDType(t)) return InvalidArgumentError("gloo ReduceScatter: unknown dtype");
  const size_t es = SizeOf(t);
  if (recv_count > 0 && (send == nullptr || recv == nullptr)) {
    return InvalidArgumentError("gloo ReduceScatter: null buffer");
  }
  if (recv_count > 0 && Overlaps(send, world_size_ * recv_count * es, recv, recv_count * es)) {
    return InvalidArgumentError("gloo ReduceScatter: send and recv overlap (not supported)");
  }
  if (recv_count == 0) return std::unique_ptr<Work>(new CompletedWork(OkStatus()));
  std::string name = "ReduceScatter (" + DescribeCount(recv_count, t) + " per rank, " + ReduceOpName(op) + ")";
  return Enqueue(
      std::move(name),
      [=, this] {
        std::vector<size_t> begin(world_size_), len(world_size_, recv_count);
        for (int p = 0; p < world_size_; ++p) begin[p] = p * recv_count;
        DoReduceChunks(static_cast<const char*>(send), begin, len, t, op, recv, NextSlot());
      },
      after);
}

Result<std::unique_ptr<Work>> GlooCommunicator::AllGather(const void* send, void* recv, size_t send_count, DType t,
                                                          Stream* after) {
  if (!IsKnownDType(t)) return InvalidArgumentError("gloo AllGather: unknown dtype");
  const size_t bytes = send_count * SizeOf(t);
  if (send_count > 0 && (send == nullptr || recv == nullptr)) {
    return InvalidArgumentError("gloo AllGather: null buffer");
  }
  char* mine = static_cast<char*>(recv) + rank_ * bytes;
  if (send_count > 0 && send != mine && Overlaps(send, bytes, recv, world_size_ * bytes)) {
    return InvalidArgumentError("gloo AllGather: send overlaps recv without being recv + rank * send_count");
  }
  if (send_count == 0) return std::unique_ptr<Work>(new CompletedWork(OkStatus()));
  std::string name = "AllGather (" + DescribeCount(send_count, t) + " per rank)";
  return Enqueue(
      std::move(name),
      [=, this] {
        if (send != mine) std::memcpy(mine, send, bytes);
        if (world_size_ == 1) return;
        std::vector<size_t> begin(world_size_), len(world_size_, send_count);
        for (int p = 0; p < world_size_; ++p) begin[p] = p * send_count;
        DoGatherChunks(static_cast<char*>(recv), begin, len, SizeOf(t), -1, NextSlot());
      },
      after);
}

Result<std::unique_ptr<Work>> GlooCommunicator::Broadcast(void* buf, size_t count, DType t, int root, Stream* after) {
  if (!IsKnownDType(t)) return InvalidArgumentError("gloo Broadcast: unknown dtype");
  if (root < 0 || root >= world_size_) {
    return InvalidArgumentError("gloo Broadcast: root " + std::to_string(root) + " out of range for world size " +
                                std::to_string(world_size_));
  }
  if (buf == nullptr && count > 0) return InvalidArgumentError("gloo Broadcast: null buffer");
  if (count == 0) return std::unique_ptr<Work>(new CompletedWork(OkStatus()));
  std::string name = "Broadcast (" + DescribeCount(count, t) + " from rank " + std::to_string(root) + ")";
  const size_t es = SizeOf(t);
  return Enqueue(
      std::move(name), [=, this] { DoBroadcast(buf, count * es, es, root); }, after);
}

Status GlooCommunicator::Barrier() {
  ZERO_ASSIGN_OR_RETURN(auto work, Enqueue(
                                       "Barrier", [this] { DoBarrier(); }, nullptr));
  return work->Wait();
}

Status GlooCommunicator::AllReduceHost(double* values, size_t n, ReduceOp op) {
  if (values == nullptr && n > 0) return InvalidArgumentError("gloo AllReduceHost: null values");
  std::string name = "AllReduceHost (" + std::to_string(n) + " doubles, " + ReduceOpName(op) + ")";
  ZERO_ASSIGN_OR_RETURN(auto work, Enqueue(
                                       std::move(name), [=, this] { DoAllReduceHost(values, n, op); }, nullptr));
  return work->Wait();
}

Status GlooCommunicator::BroadcastHost(void* data, size_t bytes, int root) {
  if (root < 0 || root >= world_size_) {
    return InvalidArgumentError("gloo BroadcastHost: root " + std::to_string(root) + " out of range for world size " +
                                std::to_string(world_size_));
  }
  if (data == nullptr && bytes > 0) return InvalidArgumentError("gloo BroadcastHost: null data");
  std::string name = "BroadcastHost (" + std::to_string(bytes) + " bytes from rank " + std::to_string(root) + ")";
  ZERO_ASSIGN_OR_RETURN(auto work, Enqueue(
                                       std::move(name), [=, this] { DoBroadcast(data, bytes, 1, root); }, nullptr));
  return work->Wait();
}

}  // namespace zero
