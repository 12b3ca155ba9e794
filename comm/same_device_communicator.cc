#include "comm/same_device_communicator.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>

#include "comm/host_reduce.h"
#include "comm/rank_threads.h"
#include "runtime/cpu_device.h"

#if defined(ZERO_HAS_CUDA)
#include <cuda_runtime.h>

#include "comm/same_device_kernels.h"
#include "runtime/cuda_device.h"
#endif

namespace zero {
namespace {

using Clock = std::chrono::steady_clock;

std::string DescribeCount(size_t count, DType t) { return std::to_string(count) + " x " + DTypeName(t); }

bool Overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  auto pa = reinterpret_cast<uintptr_t>(a);
  auto pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

RankReduceOp ToRankReduce(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return RankReduceOp::kSum;
    case ReduceOp::kAvg:
      return RankReduceOp::kAvg;
    case ReduceOp::kMax:
      return RankReduceOp::kMax;
  }
  return RankReduceOp::kSum;
}

bool ValidOp(ReduceOp op) { return op == ReduceOp::kSum || op == ReduceOp::kAvg || op == ReduceOp::kMax; }

// The device backends the built-in kernels serve.
enum class Backend { kCpu, kCuda, kCustom };

Result<Backend> BackendOf(Device* device, bool custom) {
  if (custom) return Backend::kCustom;
  if (device->AsCpu() != nullptr) return Backend::kCpu;
#if defined(ZERO_HAS_CUDA)
  if (device->AsCuda() != nullptr) return Backend::kCuda;
#endif
#if defined(ZERO_HAS_CUDA)
  const std::string no_cuda;
#else
  const std::string no_cuda = " (this build has no CUDA)";
#endif
  return InvalidArgumentError("same_device: the device '" + device->name() +
                              "' is neither a CpuDevice nor a CudaDevice" + no_cuda +
                              " (the reductions run on those backends; SameDeviceOptions::kernels serves others)");
}

// Chunk p of `count` split into n near-equal chunks (trailing ones may be shorter or empty): the
// split GlooCommunicator's AllReduce uses.
void Chunk(size_t count, int n, int p, size_t* begin, size_t* len) {
  const size_t chunk = (count + n - 1) / n;
  *begin = std::min(count, chunk * p);
  *len = std::min(chunk, count - *begin);
}

class CompletedWork final : public Work {
 public:
  Status Wait() override { return OkStatus(); }
  bool IsCompleted() override { return true; }
  Status StreamWait(Stream*) override { return OkStatus(); }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// The group: rendezvous slots.

// What one rank issued: the op with every argument that must agree across ranks
// ("AllReduce (7 x fp32, sum)"); two ranks' calls match when these are equal.
struct SameDeviceGroup::Call {
  std::string what;
  int phases = 0;  // device or host phases after the arrival
};

struct SameDeviceGroup::Posting {
  bool present = false;
  Call call;
  const void* in = nullptr;
  void* out = nullptr;
  int phase = -1;  // the last phase this rank published (0: arrived)
  // events[p]: recorded on the rank's comm stream at the end of phase p (null: host collective).
  // Sized at arrival, so other ranks may read an element while this rank writes a later one.
  std::vector<std::shared_ptr<Event>> events;
};

struct SameDeviceGroup::Slot {
  uint64_t seq = 0;
  std::vector<Posting> post;
  int left = 0;
};

SameDeviceGroup::SameDeviceGroup(int world_size, SameDeviceOptions options)
    : world_size_(world_size),
      options_(std::move(options)),
      joined_(world_size, false),
      departed_(world_size, false),
      last_issued_(world_size) {}

SameDeviceGroup::~SameDeviceGroup() = default;

Result<std::shared_ptr<SameDeviceGroup>> SameDeviceGroup::Create(int world_size, SameDeviceOptions options) {
  if (world_size < 1 || world_size > kMaxRankReduceSources) {
    return InvalidArgumentError("same_device: world size " + std::to_string(world_size) + " out of range (1.." +
                                std::to_string(kMaxRankReduceSources) + ")");
  }
  if (options.comm.timeout.count() <= 0) {
    return InvalidArgumentError("same_device: timeout must be positive, got " + TimeoutText(options.comm.timeout));
  }
  if (static_cast<bool>(options.kernels.reduce) != static_cast<bool>(options.kernels.query)) {
    return InvalidArgumentError("same_device: SameDeviceOptions::kernels needs both reduce and query, or neither");
  }
  return std::shared_ptr<SameDeviceGroup>(new SameDeviceGroup(world_size, std::move(options)));
}

Status SameDeviceGroup::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_;
}

void SameDeviceGroup::Fail(const Status& error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.ok()) failed_ = error;
  }
  cv_.notify_all();
}

void SameDeviceGroup::Depart(int rank) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    departed_[rank] = true;
  }
  cv_.notify_all();
}

std::string SameDeviceGroup::DescribeRankLocked(int rank) const {
  std::string s = "rank " + std::to_string(rank);
  if (!joined_[rank]) return s + " (it has not joined the group)";
  if (last_issued_[rank].empty()) return s + " (it has issued no collective)";
  return s + " (its last collective: " + last_issued_[rank] + ")";
}

Status SameDeviceGroup::AwaitLocked(std::unique_lock<std::mutex>& lock, int rank, Slot* slot, int phase,
                                    Clock::time_point deadline) {
  const std::string& what = slot->post[rank].call.what;
  const std::string name = "collective #" + std::to_string(slot->seq) + " " + what;
  while (true) {
    bool all = true;
    for (int q = 0; q < world_size_; ++q) all = all && slot->post[q].phase >= phase;
    if (all) return OkStatus();
    if (!failed_.ok()) return Status(failed_.code(), "the group failed: " + failed_.message());
    for (int q = 0; q < world_size_; ++q) {
      if (slot->post[q].phase < phase && departed_[q]) {
        return UnavailableError("rank " + std::to_string(q) + "'s communicator was destroyed before it " +
                                (phase == 0 ? "issued" : "finished its part of") + " this collective");
      }
    }
    if (cv_.wait_until(lock, deadline) != std::cv_status::timeout) continue;
    all = true;
    for (int q = 0; q < world_size_; ++q) all = all && slot->post[q].phase >= phase;
    if (all || !failed_.ok()) continue;
    std::string missing;
    for (int q = 0; q < world_size_; ++q) {
      if (slot->post[q].phase >= phase) continue;
      if (!missing.empty()) missing += ", ";
      missing += phase == 0 ? DescribeRankLocked(q) : "rank " + std::to_string(q) + " (it has not finished its part)";
    }
    const std::string waited = "timed out after " + TimeoutText(options_.comm.timeout) + " waiting for " + missing;
    failed_ = DeadlineExceededError("rank " + std::to_string(rank) + " " + waited + " in " + name);
    cv_.notify_all();
    return DeadlineExceededError(waited);
  }
}

Result<std::shared_ptr<SameDeviceGroup::Slot>> SameDeviceGroup::Arrive(int rank, uint64_t seq, const Call& call,
                                                                       const void* in, void* out,
                                                                       std::shared_ptr<Event> arrived,
                                                                       Clock::time_point deadline, Gathered* gathered,
                                                                       bool* not_started) {
  std::unique_lock<std::mutex> lock(mu_);
  last_issued_[rank] = "#" + std::to_string(seq) + " " + call.what;
  *not_started = !failed_.ok();
  if (!failed_.ok()) {
    return Status(failed_.code(), "not started: the group failed earlier: " + failed_.message());
  }
  std::shared_ptr<Slot>& slot = slots_[seq];
  if (slot == nullptr) {
    slot = std::make_shared<Slot>();
    slot->seq = seq;
    slot->post.resize(world_size_);
  }
  // Another rank that issued something else as this collective: both are named, lower rank first.
  for (int q = 0; q < world_size_; ++q) {
    const Posting& other = slot->post[q];
    if (q == rank || !other.present || other.call.what == call.what) continue;
    const int lo = std::min(q, rank), hi = std::max(q, rank);
    const std::string& lo_what = lo == rank ? call.what : other.call.what;
    const std::string& hi_what = hi == rank ? call.what : other.call.what;
    failed_ = InvalidArgumentError(
        "collective #" + std::to_string(seq) + " differs between ranks: rank " + std::to_string(lo) + " issued " +
        lo_what + ", rank " + std::to_string(hi) + " issued " + hi_what +
        " (every rank must issue the same collectives, with the same counts, dtypes, reductions and roots, in "
        "the same order)");
    cv_.notify_all();
    return failed_;
  }
  Posting& mine = slot->post[rank];
  mine.present = true;
  mine.call = call;
  mine.in = in;
  mine.out = out;
  mine.events.assign(call.phases + 1, nullptr);
  mine.events[0] = std::move(arrived);
  mine.phase = 0;
  std::shared_ptr<Slot> held = slot;
  cv_.notify_all();
  ZERO_RETURN_IF_ERROR(AwaitLocked(lock, rank, held.get(), 0, deadline));
  gathered->in.resize(world_size_);
  gathered->out.resize(world_size_);
  gathered->events.resize(world_size_);
  for (int q = 0; q < world_size_; ++q) {
    gathered->in[q] = held->post[q].in;
    gathered->out[q] = held->post[q].out;
    gathered->events[q] = held->post[q].events[0];
  }
  return held;
}

Status SameDeviceGroup::Publish(int rank, Slot* slot, int phase, std::shared_ptr<Event> event,
                                Clock::time_point deadline, std::vector<std::shared_ptr<Event>>* events) {
  std::unique_lock<std::mutex> lock(mu_);
  Posting& mine = slot->post[rank];
  mine.events[phase] = std::move(event);
  mine.phase = phase;
  cv_.notify_all();
  ZERO_RETURN_IF_ERROR(AwaitLocked(lock, rank, slot, phase, deadline));
  events->resize(world_size_);
  for (int q = 0; q < world_size_; ++q) (*events)[q] = slot->post[q].events[phase];
  return OkStatus();
}

void SameDeviceGroup::Leave(int rank, const std::shared_ptr<Slot>& slot) {
  std::lock_guard<std::mutex> lock(mu_);
  if (++slot->left == world_size_) slots_.erase(slot->seq);
}

Result<std::unique_ptr<SameDeviceCommunicator>> SameDeviceGroup::Join(int rank, Device* device) {
  if (rank < 0 || rank >= world_size_) {
    return InvalidArgumentError("same_device: rank " + std::to_string(rank) + " out of range for world size " +
                                std::to_string(world_size_));
  }
  if (device == nullptr) return InvalidArgumentError("same_device: rank " + std::to_string(rank) + ": no device");
  ZERO_RETURN_IF_ERROR(BackendOf(device, static_cast<bool>(options_.kernels.reduce)).status());
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (joined_[rank]) {
      return InvalidArgumentError("same_device: rank " + std::to_string(rank) + " joined the group twice");
    }
    const int kind = static_cast<int>(device->kind());
    if (kind_ >= 0 && (kind != kind_ || device->ordinal() != ordinal_)) {
      return InvalidArgumentError("same_device: rank " + std::to_string(rank) + "'s device '" + device->name() +
                                  "' is not the device of the ranks that joined before (" +
                                  DeviceKindName(static_cast<DeviceKind>(kind_)) + ":" + std::to_string(ordinal_) +
                                  "): every rank of the group must be on one device");
    }
    kind_ = kind;
    ordinal_ = device->ordinal();
    joined_[rank] = true;
  }
  auto fail_join = [&](const Status& s) {
    std::lock_guard<std::mutex> lock(mu_);
    joined_[rank] = false;
    return s.WithContext("same_device: rank " + std::to_string(rank) + ": creating the comm stream");
  };
  Result<std::unique_ptr<Stream>> stream = device->CreateStream();
  if (!stream.ok()) return fail_join(stream.status());
  Result<std::unique_ptr<Event>> after = device->CreateEvent();
  if (!after.ok()) return fail_join(after.status());
  return std::unique_ptr<SameDeviceCommunicator>(new SameDeviceCommunicator(
      shared_from_this(), rank, device, options_.kernels, std::move(*stream), std::move(*after)));
}

// ---------------------------------------------------------------------------------------------
// The communicator.

struct SameDeviceCommunicator::Shared {
  std::mutex mu;
  Status failed;  // guarded by mu; sticky
  Status Get() {
    std::lock_guard<std::mutex> lock(mu);
    return failed;
  }
};

class SameDeviceCommunicator::SameDeviceWork final : public Work {
 public:
  SameDeviceWork(std::shared_ptr<Shared> shared, Device* device, SameDeviceKernels kernels, std::shared_ptr<Event> done,
                 std::string name)
      : shared_(std::move(shared)),
        device_(device),
        kernels_(std::move(kernels)),
        done_event_(std::move(done)),
        name_(std::move(name)) {}

  Status Wait() override {
    if (finished_) return status_;
    Status sticky = shared_->Get();
    if (!sticky.ok()) return Finish(sticky);
    Status s = device_->SynchronizeEvent(done_event_.get());
    if (!s.ok()) return Finish(s.WithContext(name_ + ": waiting for its completion"));
    return Finish(shared_->Get());
  }

  bool IsCompleted() override {
    if (finished_) return true;
    if (!shared_->Get().ok()) return true;
    Result<bool> done = Query();
    return !done.ok() || *done;
  }

  Status StreamWait(Stream* stream) override {
    Status sticky = shared_->Get();
    if (!sticky.ok()) return sticky;
    if (finished_) return status_;
    Status s = device_->StreamWaitEvent(stream, done_event_.get());
    return s.ok() ? s : s.WithContext(name_ + ": making a stream wait for it");
  }

 private:
  Result<bool> Query() {
    if (kernels_.query) return kernels_.query(device_, done_event_.get());
#if defined(ZERO_HAS_CUDA)
    if (auto* e = dynamic_cast<CudaEvent*>(done_event_.get())) {
      cudaSetDevice(e->ordinal());
      const cudaError_t q = cudaEventQuery(e->get());
      if (q == cudaSuccess) return true;
      if (q == cudaErrorNotReady) return false;
      cudaGetLastError();
      return InternalError(name_ + ": cudaEventQuery: " + cudaGetErrorString(q));
    }
#endif
    return true;  // CpuDevice: recorded events are complete
  }

  Status Finish(Status s) {
    finished_ = true;
    status_ = std::move(s);
    return status_;
  }

  std::shared_ptr<Shared> shared_;
  Device* device_;
  SameDeviceKernels kernels_;
  std::shared_ptr<Event> done_event_;
  std::string name_;
  bool finished_ = false;
  Status status_;
};

SameDeviceCommunicator::SameDeviceCommunicator(std::shared_ptr<SameDeviceGroup> group, int rank, Device* device,
                                               SameDeviceKernels kernels, std::unique_ptr<Stream> stream,
                                               std::unique_ptr<Event> after_event)
    : group_(std::move(group)),
      rank_(rank),
      world_size_(group_->world_size()),
      device_(device),
      kernels_(std::move(kernels)),
      stream_(std::move(stream)),
      after_event_(std::move(after_event)),
      shared_(std::make_shared<Shared>()) {}

SameDeviceCommunicator::~SameDeviceCommunicator() {
  // The peers may still be reading this rank's buffers only until their completion, which the
  // comm stream's last completion waited for; synchronizing it covers the work queued here.
  device_->SynchronizeStream(stream_.get()).IgnoreError();
  group_->Depart(rank_);
}

std::string SameDeviceCommunicator::Who(const std::string& name) const {
  return "same_device " + name + " on rank " + std::to_string(rank_) + " of " + std::to_string(world_size_);
}

Status SameDeviceCommunicator::Stick(const Status& error) {
  std::lock_guard<std::mutex> lock(shared_->mu);
  if (shared_->failed.ok()) shared_->failed = error;
  return error;
}

Status SameDeviceCommunicator::CheckHealth() {
  Status sticky = shared_->Get();
  if (!sticky.ok()) return sticky;
  Status group = group_->status();
  if (group.ok()) return group;
  return Stick(Status(group.code(), "same_device rank " + std::to_string(rank_) + " of " + std::to_string(world_size_) +
                                        ": the group failed: " + group.message()));
}

void SameDeviceCommunicator::Abort(const std::string& reason) {
  Stick(UnavailableError("same_device rank " + std::to_string(rank_) + " of " + std::to_string(world_size_) +
                         " aborted: " + reason))
      .IgnoreError();
  group_->Fail(UnavailableError("rank " + std::to_string(rank_) + " aborted: " + reason));
}

Status SameDeviceCommunicator::Reduce(const RankReduceArgs& args) {
  if (kernels_.reduce) return kernels_.reduce(device_, stream_.get(), args);
#if defined(ZERO_HAS_CUDA)
  if (CudaDevice* cuda = device_->AsCuda()) {
    cudaError_t e = cudaSetDevice(cuda->ordinal());
    if (e == cudaSuccess) {
      e = same_device_kernels::RankReduce(args, cuda->native_stream(stream_.get()), cuda->multiprocessor_count() * 8);
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      return InternalError(std::string("launching the reduction kernel: ") + cudaGetErrorName(e) + ": " +
                           cudaGetErrorString(e));
    }
    return OkStatus();
  }
#endif
  // CpuDevice: everything enqueued on its streams is already done; run it here.
  RankReduceHost(args);
  return OkStatus();
}

Status SameDeviceCommunicator::Copy(void* dst, const void* src, size_t bytes) {
  return device_->Copy(dst, src, bytes, CopyKind::kDeviceToDevice, stream_.get());
}

Result<std::unique_ptr<Work>> SameDeviceCommunicator::Run(const Group::Call& call, const void* in, void* out,
                                                          Stream* after, const std::vector<PhaseFn>& phases,
                                                          bool host) {
  std::lock_guard<std::mutex> call_lock(call_mu_);
  const uint64_t seq = ++issued_;
  const std::string name = "collective #" + std::to_string(seq) + " " + call.what;
  {
    Status sticky = shared_->Get();
    if (!sticky.ok()) {
      return Status(sticky.code(), Who(name) + " not started: the communicator failed earlier: " + sticky.message());
    }
  }
  // Any error from here on leaves the peers waiting for this rank: fail the group so they stop.
  auto fail = [&](const Status& s, const char* doing) -> Status {
    Status mine(s.code(), Who(name) + ": " + (doing[0] ? std::string(doing) + ": " : std::string()) + s.message());
    group_->Fail(Status(s.code(), "rank " + std::to_string(rank_) + " failed in " + name + ": " +
                                      (doing[0] ? std::string(doing) + ": " : std::string()) + s.message()));
    return Stick(mine);
  };
  const auto deadline = Clock::now() + group_->options_.comm.timeout;
  std::shared_ptr<Event> arrived;
  if (!host) {
    if (after != nullptr) {
      Status s = device_->RecordEvent(after_event_.get(), after);
      if (s.ok()) s = device_->StreamWaitEvent(stream_.get(), after_event_.get());
      if (!s.ok()) return fail(s, "ordering the comm stream after the caller's stream");
    }
    Result<std::unique_ptr<Event>> e = device_->CreateEvent();
    if (!e.ok()) return fail(e.status(), "creating an event");
    arrived = std::move(*e);
    Status s = device_->RecordEvent(arrived.get(), stream_.get());
    if (!s.ok()) return fail(s, "recording an event");
  }
  Group::Call posted = call;
  posted.phases = static_cast<int>(phases.size());
  Group::Gathered gathered;
  bool not_started = false;
  Result<std::shared_ptr<Group::Slot>> slot =
      group_->Arrive(rank_, seq, posted, in, out, std::move(arrived), deadline, &gathered, &not_started);
  if (!slot.ok()) {
    // Not started: the group's earlier failure, named as this rank's.
    if (not_started) {
      return Stick(Status(slot.status().code(), Who(name) + " " + slot.status().message()));
    }
    return fail(slot.status(), "");
  }
  struct Leaver {
    Group* group;
    int rank;
    std::shared_ptr<Group::Slot> slot;
    ~Leaver() { group->Leave(rank, slot); }
  } leaver{group_.get(), rank_, *slot};

  std::vector<std::shared_ptr<Event>> events = std::move(gathered.events);
  // Makes the comm stream wait for every other rank's events of the phase just published.
  auto wait_peers = [&]() -> Status {
    if (host) return OkStatus();
    for (int q = 0; q < world_size_; ++q) {
      if (q == rank_) continue;
      ZERO_RETURN_IF_ERROR(device_->StreamWaitEvent(stream_.get(), events[q].get()));
    }
    return OkStatus();
  };
  for (size_t p = 0; p < phases.size(); ++p) {
    Status s = wait_peers();
    if (!s.ok()) return fail(s, "waiting for the other ranks' events");
    s = phases[p](gathered.in, gathered.out);
    if (!s.ok()) return fail(s, "enqueueing this rank's part");
    std::shared_ptr<Event> mark;
    if (!host) {
      Result<std::unique_ptr<Event>> e = device_->CreateEvent();
      if (!e.ok()) return fail(e.status(), "creating an event");
      mark = std::move(*e);
      s = device_->RecordEvent(mark.get(), stream_.get());
      if (!s.ok()) return fail(s, "recording an event");
    }
    s = group_->Publish(rank_, slot->get(), static_cast<int>(p) + 1, std::move(mark), deadline, &events);
    if (!s.ok()) return fail(s, "");
  }
  if (host) return std::unique_ptr<Work>(new CompletedWork());
  // Complete only once every rank has finished its last part (and so reading this rank's buffers).
  Status s = wait_peers();
  if (!s.ok()) return fail(s, "waiting for the other ranks' events");
  Result<std::unique_ptr<Event>> done = device_->CreateEvent();
  if (!done.ok()) return fail(done.status(), "creating an event");
  std::shared_ptr<Event> done_event = std::move(*done);
  s = device_->RecordEvent(done_event.get(), stream_.get());
  if (!s.ok()) return fail(s, "recording an event");
  return std::unique_ptr<Work>(new SameDeviceWork(shared_, device_, kernels_, std::move(done_event), Who(name)));
}

// ---------------------------------------------------------------------------------------------
// The collectives: validate on the calling rank, then run the phases.

Result<std::unique_ptr<Work>> SameDeviceCommunicator::AllReduce(void* buf, size_t count, DType t, ReduceOp op,
                                                                Stream* after) {
  if (!IsKnownDType(t)) return InvalidArgumentError("same_device AllReduce: unknown dtype");
  if (!ValidOp(op)) return InvalidArgumentError("same_device AllReduce: unknown reduction");
  if (buf == nullptr && count > 0) return InvalidArgumentError("same_device AllReduce: null buffer");
  if (count == 0) return std::unique_ptr<Work>(new CompletedWork());
  Group::Call call{"AllReduce (" + DescribeCount(count, t) + ", " + ReduceOpName(op) + ")"};
  const size_t es = SizeOf(t);
  // 1. Chunk r of every rank's buffer, reduced into chunk r of this one (nobody else reads it).
  PhaseFn reduce = [=, this](const std::vector<const void*>& in, const std::vector<void*>&) -> Status {
    size_t begin, len;
    Chunk(count, world_size_, rank_, &begin, &len);
    if (len == 0) return OkStatus();
    RankReduceArgs a;
    a.n_srcs = world_size_;
    for (int q = 0; q < world_size_; ++q) a.srcs[q] = static_cast<const char*>(in[q]) + begin * es;
    a.out = static_cast<char*>(buf) + begin * es;
    a.count = len;
    a.dtype = t;
    a.op = ToRankReduce(op);
    return Reduce(a);
  };
  // 2. Every other rank's reduced chunk into this buffer.
  PhaseFn gather = [=, this](const std::vector<const void*>& in, const std::vector<void*>&) -> Status {
    for (int i = 1; i < world_size_; ++i) {
      const int q = (rank_ + i) % world_size_;
      size_t begin, len;
      Chunk(count, world_size_, q, &begin, &len);
      if (len == 0) continue;
      ZERO_RETURN_IF_ERROR(
          Copy(static_cast<char*>(buf) + begin * es, static_cast<const char*>(in[q]) + begin * es, len * es));
    }
    return OkStatus();
  };
  // One rank: the sum is the value itself (Gloo leaves the buffer untouched too).
  if (world_size_ == 1) return Run(call, buf, buf, after, {}, false);
  return Run(call, buf, buf, after, {reduce, gather}, false);
}

Result<std::unique_ptr<Work>> SameDeviceCommunicator::ReduceScatter(const void* send, void* recv, size_t recv_count,
                                                                    DType t, ReduceOp op, Stream* after) {
  if (!IsKnownDType(t)) return InvalidArgumentError("same_device ReduceScatter: unknown dtype");
  if (!ValidOp(op)) return InvalidArgumentError("same_device ReduceScatter: unknown reduction");
  const size_t es = SizeOf(t);
  if (recv_count > 0 && (send == nullptr || recv == nullptr)) {
    return InvalidArgumentError("same_device ReduceScatter: null buffer");
  }
  if (recv_count > 0 && Overlaps(send, world_size_ * recv_count * es, recv, recv_count * es)) {
    return InvalidArgumentError("same_device ReduceScatter: send and recv overlap (not supported)");
  }
  if (recv_count == 0) return std::unique_ptr<Work>(new CompletedWork());
  Group::Call call{"ReduceScatter (" + DescribeCount(recv_count, t) + " per rank, " + ReduceOpName(op) + ")"};
  PhaseFn reduce = [=, this](const std::vector<const void*>& in, const std::vector<void*>&) -> Status {
    RankReduceArgs a;
    a.n_srcs = world_size_;
    for (int q = 0; q < world_size_; ++q) a.srcs[q] = static_cast<const char*>(in[q]) + rank_ * recv_count * es;
    a.out = recv;
    a.count = recv_count;
    a.dtype = t;
    a.op = ToRankReduce(op);
    return Reduce(a);
  };
  return Run(call, send, recv, after, {reduce}, false);
}

Result<std::unique_ptr<Work>> SameDeviceCommunicator::AllGather(const void* send, void* recv, size_t send_count,
                                                                DType t, Stream* after) {
  if (!IsKnownDType(t)) return InvalidArgumentError("same_device AllGather: unknown dtype");
  const size_t bytes = send_count * SizeOf(t);
  if (send_count > 0 && (send == nullptr || recv == nullptr)) {
    return InvalidArgumentError("same_device AllGather: null buffer");
  }
  char* mine = static_cast<char*>(recv) + rank_ * bytes;
  if (send_count > 0 && send != mine && Overlaps(send, bytes, recv, world_size_ * bytes)) {
    return InvalidArgumentError("same_device AllGather: send overlaps recv without being recv + rank * send_count");
  }
  if (send_count == 0) return std::unique_ptr<Work>(new CompletedWork());
  Group::Call call{"AllGather (" + DescribeCount(send_count, t) + " per rank)"};
  PhaseFn gather = [=, this](const std::vector<const void*>& in, const std::vector<void*>&) -> Status {
    for (int i = 0; i < world_size_; ++i) {
      const int q = (rank_ + i) % world_size_;
      char* dst = static_cast<char*>(recv) + q * bytes;
      if (dst == in[q]) continue;  // this rank's share, in place
      ZERO_RETURN_IF_ERROR(Copy(dst, in[q], bytes));
    }
    return OkStatus();
  };
  return Run(call, send, recv, after, {gather}, false);
}

Result<std::unique_ptr<Work>> SameDeviceCommunicator::Broadcast(void* buf, size_t count, DType t, int root,
                                                                Stream* after) {
  if (!IsKnownDType(t)) return InvalidArgumentError("same_device Broadcast: unknown dtype");
  if (root < 0 || root >= world_size_) {
    return InvalidArgumentError("same_device Broadcast: root " + std::to_string(root) +
                                " out of range for world size " + std::to_string(world_size_));
  }
  if (buf == nullptr && count > 0) return InvalidArgumentError("same_device Broadcast: null buffer");
  if (count == 0) return std::unique_ptr<Work>(new CompletedWork());
  Group::Call call{"Broadcast (" + DescribeCount(count, t) + " from rank " + std::to_string(root) + ")"};
  const size_t bytes = count * SizeOf(t);
  PhaseFn copy = [=, this](const std::vector<const void*>& in, const std::vector<void*>&) -> Status {
    if (rank_ == root) return OkStatus();
    return Copy(buf, in[root], bytes);
  };
  return Run(call, buf, buf, after, {copy}, false);
}

Status SameDeviceCommunicator::Barrier() {
  ZERO_ASSIGN_OR_RETURN(auto work, Run(Group::Call{"Barrier"}, nullptr, nullptr, nullptr, {}, true));
  return work->Wait();
}

Status SameDeviceCommunicator::AllReduceHost(double* values, size_t n, ReduceOp op) {
  if (!ValidOp(op)) return InvalidArgumentError("same_device AllReduceHost: unknown reduction");
  if (values == nullptr && n > 0) return InvalidArgumentError("same_device AllReduceHost: null values");
  Group::Call call{"AllReduceHost (" + std::to_string(n) + " doubles, " + ReduceOpName(op) + ")"};
  std::vector<double> acc(n);
  // 1. Every rank's values summed in rank order (as GlooCommunicator does); 2. written back once
  // every rank has read them.
  PhaseFn sum = [&](const std::vector<const void*>& in, const std::vector<void*>&) -> Status {
    for (int q = 0; q < world_size_; ++q) {
      AccumulateHostValues(acc.data(), static_cast<const double*>(in[q]), n, op, q == 0);
    }
    return OkStatus();
  };
  PhaseFn none = [](const std::vector<const void*>&, const std::vector<void*>&) { return OkStatus(); };
  ZERO_ASSIGN_OR_RETURN(auto work, Run(call, values, values, nullptr, {sum, none}, true));
  FinishHostValues(acc.data(), values, n, op, world_size_);
  return work->Wait();
}

Status SameDeviceCommunicator::BroadcastHost(void* data, size_t bytes, int root) {
  if (root < 0 || root >= world_size_) {
    return InvalidArgumentError("same_device BroadcastHost: root " + std::to_string(root) +
                                " out of range for world size " + std::to_string(world_size_));
  }
  if (data == nullptr && bytes > 0) return InvalidArgumentError("same_device BroadcastHost: null data");
  Group::Call call{"BroadcastHost (" + std::to_string(bytes) + " bytes from rank " + std::to_string(root) + ")"};
  PhaseFn copy = [&](const std::vector<const void*>& in, const std::vector<void*>&) -> Status {
    if (rank_ != root && bytes > 0) std::memcpy(data, in[root], bytes);
    return OkStatus();
  };
  ZERO_ASSIGN_OR_RETURN(auto work, Run(call, data, data, nullptr, {copy}, true));
  return work->Wait();
}

// ---------------------------------------------------------------------------------------------

Status RunSameDeviceRanks(int world_size,
                          const std::function<Status(int rank, Communicator* comm, Device* device)>& body,
                          SameDeviceOptions options,
                          const std::function<Result<std::unique_ptr<Device>>(int rank)>& make_device) {
  ZERO_ASSIGN_OR_RETURN(std::shared_ptr<SameDeviceGroup> group,
                        SameDeviceGroup::Create(world_size, std::move(options)));
  std::vector<std::unique_ptr<Device>> devices(world_size);
  std::vector<std::unique_ptr<SameDeviceCommunicator>> comms(world_size);
  FirstRankError errors;
  auto run_rank = [&](int rank) {
    if (make_device) {
      Result<std::unique_ptr<Device>> d = make_device(rank);
      if (!d.ok()) {
        errors.Record(rank, d.status());
        group->Fail(UnavailableError("rank " + std::to_string(rank) + " has no device: " + d.status().ToString()));
        return;
      }
      devices[rank] = std::move(*d);
    } else {
      devices[rank] = MakeRankCpuDevice(world_size);
    }
    Result<std::unique_ptr<SameDeviceCommunicator>> comm = group->Join(rank, devices[rank].get());
    if (!comm.ok()) {
      errors.Record(rank, comm.status());
      group->Fail(UnavailableError("rank " + std::to_string(rank) + " could not join: " + comm.status().ToString()));
      return;
    }
    comms[rank] = std::move(*comm);
    RunRankBody(rank, comms[rank].get(), devices[rank].get(), body, &errors);
  };
  RunOnRankThreads(world_size, run_rank);
  comms.clear();
  devices.clear();
  return errors.status();
}

}  // namespace zero
