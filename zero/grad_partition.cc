#include "zero/grad_partition.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "zero/host_state_kernels.h"
#include "zero/slot_worker.h"

namespace zero {
namespace {

class DeviceGradPartition final : public GradPartition {
 public:
  DeviceGradPartition(Device* device, Stream* stream, float* data, DeviceBuffer owned, std::vector<GradPiece> pieces)
      : GradPartition(std::move(pieces)), device_(device), stream_(stream), data_(data), owned_(std::move(owned)) {}

  Status Add(int i, const void* src, DType src_t, bool first, bool last) override {
    const GradPiece& p = pieces_[i];
    if (p.n == 0) return OkStatus();
    float* dst = data_ + p.offset;
    if (first) return device_->AccumulateFirst(dst, src, src_t, static_cast<size_t>(p.n), 1.0f, stream_);
    return device_->Accumulate(dst, src, src_t, static_cast<size_t>(p.n), 1.0f, stream_);
  }
  Status Store(int i, const float* src) override {
    const GradPiece& p = pieces_[i];
    float* dst = data_ + p.offset;
    if (src == dst || p.n == 0) return OkStatus();  // reduce-scattered straight into the piece
    return device_->Copy(dst, src, static_cast<size_t>(p.n) * 4, CopyKind::kDeviceToDevice, stream_);
  }
  Status Zero(int i) override {
    const GradPiece& p = pieces_[i];
    if (p.n == 0) return OkStatus();
    return device_->Fill(data_ + p.offset, DType::kF32, static_cast<size_t>(p.n), 0.0f, stream_);
  }
  float* device_piece(int i) override { return data_ + pieces_[i].offset; }
  const float* device_at(int64_t offset) const override { return data_ + offset; }
  Status SumsOfSquares(const std::vector<int>& which, double* slots) override {
    for (int i : which) {
      const GradPiece& p = pieces_[i];
      if (p.n == 0) continue;
      ZERO_RETURN_IF_ERROR(
          device_->SumOfSquares(data_ + p.offset, DType::kF32, static_cast<size_t>(p.n), slots + i, stream_));
    }
    return OkStatus();
  }
  Status Update(OptimizerStates* states, int64_t offset, int64_t n, const AdamWParams& h, void* model_out,
                DType model_t) override {
    return states->Update(offset, n, data_ + offset, h, model_out, model_t, stream_);
  }
  Status Read(int i, float* out) override {
    const GradPiece& p = pieces_[i];
    if (p.n == 0) return OkStatus();
    ZERO_RETURN_IF_ERROR(
        device_->Copy(out, data_ + p.offset, static_cast<size_t>(p.n) * 4, CopyKind::kDeviceToHost, stream_));
    return device_->SynchronizeStream(stream_);
  }
  GradPartitionBytes bytes() const override { return GradPartitionBytes{owned_.bytes(), 0}; }

 private:
  Device* device_;
  Stream* stream_;
  float* data_;
  DeviceBuffer owned_;  // empty for a view
};

int64_t LargestPiece(const std::vector<GradPiece>& pieces) {
  int64_t n = 0;
  for (const GradPiece& p : pieces) n = std::max(n, p.n);
  return n;
}

class HostGradPartition final : public GradPartition {
 public:
  HostGradPartition(Device* device, Stream* stream, int64_t numel, std::vector<GradPiece> pieces,
                    const HostGradPartitionOptions& o)
      : GradPartition(std::move(pieces)),
        device_(device),
        stream_(stream),
        numel_(numel),
        chunk_(std::max<int64_t>(1, std::min(o.chunk_numel, LargestPiece(pieces_)))),
        pool_(o.pool),
        slots_(static_cast<size_t>(std::max(1, o.staging_slots))) {}

  ~HostGradPartition() override {
    worker_.reset();  // runs what is queued, then joins
    device_->SynchronizeStream(stream_).IgnoreError();
    if (copy_ != nullptr) device_->SynchronizeStream(copy_.get()).IgnoreError();
  }

  Status Init(const HostGradPartitionOptions& o) {
    if (pool_ == nullptr) return InvalidArgumentError("host gradient partition: no thread pool given");
    const size_t part = HostSlab::AlignedSize(static_cast<size_t>(numel_) * 4);
    // Without device staging (the GPU sum's host side) nothing is staged: no host slots either.
    const size_t slot = o.device_staging ? HostSlab::AlignedSize(static_cast<size_t>(chunk_) * 4) : 0;
    const size_t partials = HostSlab::AlignedSize(std::max<size_t>(1, pieces_.size()) * sizeof(double));
    ZERO_ASSIGN_OR_RETURN(slab_, HostSlab::Create(device_, part + slots_.size() * slot + partials, o.slab));
    ZERO_ASSIGN_OR_RETURN(HostSpan ps, slab_.Take(static_cast<size_t>(numel_) * 4, "fp32 gradient partition"));
    part_ = ps.as<float>();
    std::memset(part_, 0, static_cast<size_t>(numel_) * 4);
    if (o.device_staging) {
      auto st = device_->CreateStream();
      if (!st.ok()) return st.status().WithContext("host gradient partition: creating its device->host stream");
      copy_ = std::move(st).value();
      auto b = device_->Allocate(slots_.size() * static_cast<size_t>(chunk_) * 4);
      if (!b.ok()) return b.status().WithContext("host gradient partition: allocating the device staging slots");
      device_slots_ = std::move(b).value();
    }
    for (size_t k = 0; k < slots_.size(); ++k) {
      Slot& sl = slots_[k];
      if (!o.device_staging) continue;  // no Add: the slots stay empty
      ZERO_ASSIGN_OR_RETURN(HostSpan g, slab_.Take(static_cast<size_t>(chunk_) * 4, "gradient staging slot"));
      sl.data = g.data;
      sl.dev = static_cast<char*>(device_slots_.data()) + k * static_cast<size_t>(chunk_) * 4;
      ZERO_ASSIGN_OR_RETURN(sl.landed, NewEvent());
      ZERO_ASSIGN_OR_RETURN(sl.staged, NewEvent());
    }
    ZERO_ASSIGN_OR_RETURN(HostSpan pp,
                          slab_.Take(std::max<size_t>(1, pieces_.size()) * sizeof(double), "norm partials"));
    partials_ = pp.as<double>();
    ZERO_ASSIGN_OR_RETURN(stored_, NewEvent());
    ZERO_ASSIGN_OR_RETURN(partials_copied_, NewEvent());
    ZERO_RETURN_IF_ERROR(device_->RecordEvent(stored_.get(), stream_));
    ZERO_RETURN_IF_ERROR(device_->RecordEvent(partials_copied_.get(), stream_));
    worker_ = std::make_unique<SlotWorker<Task>>(
        slots_.size(), [this](const Task& t) { return RunTask(t); }, "host gradient partition: adding a reduced chunk");
    return OkStatus();
  }

  Status Add(int i, const void* src, DType src_t, bool first, bool last) override {
    const GradPiece& p = pieces_[i];
    if (p.n > 0 && copy_ == nullptr) {
      return FailedPreconditionError("host gradient partition: Add without device staging slots");
    }
    for (int64_t at = 0; at < p.n; at += chunk_) {
      const int64_t len = std::min(chunk_, p.n - at);
      const size_t bytes = static_cast<size_t>(len) * SizeOf(src_t);
      // A free slot (the worker frees them in order, after its device->host copy landed: so the
      // device slot is free too), the chunk into its device slot on the caller's stream, then to
      // the host slot on the copy stream once that device copy is done.
      ZERO_ASSIGN_OR_RETURN(const size_t s, worker_->Acquire());
      Slot& sl = slots_[s];
      ZERO_RETURN_IF_ERROR(
          device_->Copy(sl.dev, ElementPtr(src, src_t, at), bytes, CopyKind::kDeviceToDevice, stream_));
      ZERO_RETURN_IF_ERROR(device_->RecordEvent(sl.staged.get(), stream_));
      ZERO_RETURN_IF_ERROR(device_->StreamWaitEvent(copy_.get(), sl.staged.get()));
      {
        TraceDeviceScope trace(observer_, TraceTrack::kDeviceToHost, "gradients to the host partition", copy_.get());
        ZERO_RETURN_IF_ERROR(device_->Copy(sl.data, sl.dev, bytes, CopyKind::kDeviceToHost, copy_.get()));
      }
      ZERO_RETURN_IF_ERROR(device_->RecordEvent(sl.landed.get(), copy_.get()));
      worker_->Push(Task{s, p.offset + at, len, src_t, first});
    }
    return OkStatus();
  }
  Status Store(int i, const float* src) override {
    const GradPiece& p = pieces_[i];
    if (p.n == 0) return OkStatus();
    // Straight into the piece: nothing else writes it in this window.
    TraceDeviceScope trace(observer_, TraceTrack::kDeviceToHost, "gradients to the host partition", stream_);
    ZERO_RETURN_IF_ERROR(
        device_->Copy(part_ + p.offset, src, static_cast<size_t>(p.n) * 4, CopyKind::kDeviceToHost, stream_));
    return device_->RecordEvent(stored_.get(), stream_);
  }
  Status Zero(int i) override {
    const GradPiece& p = pieces_[i];
    // An unwritten piece: no add or copy in flight touches it.
    if (p.n > 0) std::memset(part_ + p.offset, 0, static_cast<size_t>(p.n) * 4);
    return OkStatus();
  }
  Status SumsOfSquares(const std::vector<int>& which, double* slots) override {
    ZERO_RETURN_IF_ERROR(WaitIdle());
    if (pieces_.empty()) return OkStatus();
    ZERO_RETURN_IF_ERROR(device_->SynchronizeEvent(partials_copied_.get()));  // partials_ is free
    std::fill(partials_, partials_ + pieces_.size(), 0.0);
    // Each piece in CpuDevice's fixed order, its blocks spread over the pool: the same bits
    // whatever the threads.
    std::vector<F32Span> spans;
    spans.reserve(which.size());
    for (int i : which) spans.push_back({part_ + pieces_[i].offset, pieces_[i].n});
    std::vector<double> sums(which.size());
    SumsOfSquaresF32(pool_, spans, sums.data());
    for (size_t k = 0; k < which.size(); ++k) partials_[which[k]] = sums[k];
    ZERO_RETURN_IF_ERROR(
        device_->Copy(slots, partials_, pieces_.size() * sizeof(double), CopyKind::kHostToDevice, stream_));
    return device_->RecordEvent(partials_copied_.get(), stream_);
  }
  Status Update(OptimizerStates* states, int64_t offset, int64_t n, const AdamWParams& h, void* model_out,
                DType model_t) override {
    ZERO_RETURN_IF_ERROR(WaitIdle());
    if (offset < 0 || n < 0 || offset + n > numel_) {
      return OutOfRangeError("host gradient partition: Update [" + std::to_string(offset) + ", " +
                             std::to_string(offset + n) + ") outside [0, " + std::to_string(numel_) + ")");
    }
    return states->UpdateFromHost(offset, n, part_ + offset, h, model_out, model_t, stream_);
  }
  Status Read(int i, float* out) override {
    ZERO_RETURN_IF_ERROR(WaitIdle());
    const GradPiece& p = pieces_[i];
    if (p.n > 0) std::memcpy(out, part_ + p.offset, static_cast<size_t>(p.n) * 4);
    return OkStatus();
  }
  GradPartitionBytes bytes() const override {
    GradPartitionBytes b;
    b.device_staging = device_slots_.bytes();
    b.host = slab_.bytes();
    return b;
  }

 private:
  struct Slot {
    void* data = nullptr;           // host: the chunk as it came (src_t)
    void* dev = nullptr;            // device: the same chunk, staged on the caller's stream
    std::unique_ptr<Event> staged;  // caller's stream: the device slot holds the chunk
    std::unique_ptr<Event> landed;  // copy stream: the host slot holds it
  };
  struct Task {
    size_t slot;
    int64_t offset, n;
    DType src_t;
    bool first;
  };

  Result<std::unique_ptr<Event>> NewEvent() {
    auto e = device_->CreateEvent();
    if (!e.ok()) return e.status().WithContext("host gradient partition: creating an event");
    return std::move(e).value();
  }

  // On the worker: the chunk has landed in its slot; add it into the partition.
  Status RunTask(const Task& t) {
    ZERO_RETURN_IF_ERROR(device_->SynchronizeEvent(slots_[t.slot].landed.get()));
    AccumulateIntoF32(pool_, slots_[t.slot].data, t.src_t, part_ + t.offset, t.n, t.first);
    return OkStatus();
  }

  // Every add queued so far is in the partition, and every Store has landed.
  Status WaitIdle() {
    ZERO_RETURN_IF_ERROR(worker_->WaitIdle());
    return device_->SynchronizeEvent(stored_.get());
  }

  Device* device_;
  Stream* stream_;
  int64_t numel_;
  int64_t chunk_;
  ThreadPool* pool_;
  HostSlab slab_;
  float* part_ = nullptr;
  double* partials_ = nullptr;
  std::vector<Slot> slots_;
  std::unique_ptr<Stream> copy_;  // the adds' device->host copies (null without device staging)
  DeviceBuffer device_slots_;     // staging_slots x chunk_ x 4 bytes
  std::unique_ptr<Event> stored_, partials_copied_;

  std::unique_ptr<SlotWorker<Task>> worker_;  // the host adds, slot by slot
};

class GpuAccumulatedGradPartition final : public GradPartition {
 public:
  GpuAccumulatedGradPartition(std::vector<GradPiece> pieces, std::unique_ptr<GradPartition> sum,
                              std::unique_ptr<GradPartition> host)
      : GradPartition(std::move(pieces)), sum_(std::move(sum)), host_(std::move(host)), pending_(pieces_.size(), 0) {}

  Status Add(int i, const void* src, DType src_t, bool first, bool last) override {
    ZERO_RETURN_IF_ERROR(sum_->Add(i, src, src_t, first, false));
    pending_[i] = 1;
    return last ? Flush(i) : OkStatus();
  }
  Status Store(int i, const float* src) override {
    pending_[i] = 0;
    return host_->Store(i, src);
  }
  void set_observer(StreamObserver* o) override {
    GradPartition::set_observer(o);
    sum_->set_observer(o);
    host_->set_observer(o);
  }
  Status Zero(int i) override { return host_->Zero(i); }
  Status Finish() override {
    for (int i = 0; i < num_pieces(); ++i) {
      if (pending_[i]) ZERO_RETURN_IF_ERROR(Flush(i));
    }
    return OkStatus();
  }
  void NewWindow() override { std::fill(pending_.begin(), pending_.end(), 0); }
  Status SumsOfSquares(const std::vector<int>& which, double* slots) override {
    ZERO_RETURN_IF_ERROR(Finish());
    return host_->SumsOfSquares(which, slots);
  }
  Status Update(OptimizerStates* states, int64_t offset, int64_t n, const AdamWParams& h, void* model_out,
                DType model_t) override {
    ZERO_RETURN_IF_ERROR(Finish());
    return host_->Update(states, offset, n, h, model_out, model_t);
  }
  Status Read(int i, float* out) override { return host_->Read(i, out); }  // what the host holds
  GradPartitionBytes bytes() const override {
    GradPartitionBytes b = host_->bytes();
    b.device += sum_->bytes().device;
    return b;
  }

 private:
  // The piece's window sum, complete, to the host: one device->host copy of its fp32 values.
  Status Flush(int i) {
    pending_[i] = 0;
    return host_->Store(i, sum_->device_piece(i));
  }

  std::unique_ptr<GradPartition> sum_;
  std::unique_ptr<GradPartition> host_;
  std::vector<uint8_t> pending_;  // added to the device sum since the last flush
};

}  // namespace

Result<std::unique_ptr<GradPartition>> CreateDeviceGradPartition(Device* device, Stream* stream, int64_t numel,
                                                                 std::vector<GradPiece> pieces) {
  auto b = device->Allocate(static_cast<size_t>(numel) * 4);
  if (!b.ok()) return b.status().WithContext("allocating the fp32 gradient partition");
  DeviceBuffer buf = std::move(b).value();
  ZERO_RETURN_IF_ERROR(device->Fill(buf.data(), DType::kF32, static_cast<size_t>(numel), 0.0f, stream));
  float* data = buf.as<float>();
  return std::unique_ptr<GradPartition>(
      new DeviceGradPartition(device, stream, data, std::move(buf), std::move(pieces)));
}

std::unique_ptr<GradPartition> CreateDeviceGradPartitionView(Device* device, Stream* stream, float* data,
                                                             std::vector<GradPiece> pieces) {
  return std::unique_ptr<GradPartition>(
      new DeviceGradPartition(device, stream, data, DeviceBuffer(), std::move(pieces)));
}

Result<std::unique_ptr<GradPartition>> CreateHostGradPartition(Device* device, Stream* stream, int64_t numel,
                                                               std::vector<GradPiece> pieces,
                                                               const HostGradPartitionOptions& options) {
  auto p = std::make_unique<HostGradPartition>(device, stream, numel, std::move(pieces), options);
  ZERO_RETURN_IF_ERROR(p->Init(options));
  return std::unique_ptr<GradPartition>(std::move(p));
}

Result<std::unique_ptr<GradPartition>> CreateGpuAccumulatedGradPartition(Device* device, Stream* stream, int64_t numel,
                                                                         std::vector<GradPiece> pieces,
                                                                         const HostGradPartitionOptions& options) {
  auto sum = CreateDeviceGradPartition(device, stream, numel, pieces);
  if (!sum.ok()) return sum.status().WithContext("offload_grad_accumulation \"gpu\"");
  HostGradPartitionOptions host_options = options;
  host_options.device_staging = false;  // the sums reach the host through Store only
  auto host = CreateHostGradPartition(device, stream, numel, pieces, host_options);
  if (!host.ok()) return host.status();
  return std::unique_ptr<GradPartition>(
      new GpuAccumulatedGradPartition(std::move(pieces), std::move(sum).value(), std::move(host).value()));
}

}  // namespace zero
