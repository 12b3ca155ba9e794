#include "zero/nvme_optimizer_states.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include "nvme/libaio_engine.h"
#include "nvme/swap_file.h"
#include "offload/cpu_adam.h"
#include "offload/thread_pool.h"
#include "zero/host_state_kernels.h"

namespace zero {
namespace {

class NvmeOptimizerStates final : public OptimizerStates {
 public:
  NvmeOptimizerStates(Device* device, Stream* stream, int64_t numel, const NvmeOptimizerStatesOptions& o)
      : device_(device),
        stream_(stream),
        numel_(numel),
        group_(std::max<int64_t>(1, std::min(o.group_numel, std::max<int64_t>(numel, 1)))),
        // No longer than the states (as group_): a call covers at most numel elements, so the
        // chunks are the same and the two transfer chunks pin no unused bytes.
        chunk_(std::max<int64_t>(1, std::min(o.chunk_numel, numel))),
        mdt_(o.model_dtype) {}

  ~NvmeOptimizerStates() override {
    for (Buffer& b : bufs_) b.dirty = false;  // the file goes: no write-back
    FinishAll().IgnoreError();
    swap_.reset();  // removes the file
    std::error_code ec;
    std::filesystem::remove(dir_, ec);  // the rank's folder, if now empty
    const std::filesystem::path parent = std::filesystem::path(dir_).parent_path();
    if (parent.filename() == "zero_swap") std::filesystem::remove(parent, ec);  // the engine's, if empty
  }

  Status Init(const NvmeOptimizerStatesOptions& o) {
    if (o.buffer_count < 2) {
      return InvalidArgumentError(
          "zero_optimization.offload_optimizer.buffer_count: NVMe optimizer states need >= 2 "
          "group buffers (one updated while the next is read), got " +
          std::to_string(o.buffer_count));
    }
    dir_ = o.dir;
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec) {
      return FailedPreconditionError("zero_optimization.offload_optimizer.nvme_path: cannot create " + dir_ + ": " +
                                     ec.message());
    }
    ZERO_ASSIGN_OR_RETURN(pool_, ThreadPool::Create(o.cpu_threads));
    if (o.aio_engine_factory) {
      ZERO_ASSIGN_OR_RETURN(aio_, o.aio_engine_factory(o.aio));
    } else {
      ZERO_ASSIGN_OR_RETURN(aio_, LibaioEngine::Create(o.aio));
    }
    groups_ = numel_ == 0 ? 0 : (numel_ + group_ - 1) / group_;
    std::vector<SwapRegionSpec> regions;
    for (int64_t g = 0; g < groups_; ++g) {
      regions.push_back({"optimizer states of group " + std::to_string(g), static_cast<uint64_t>(GroupLen(g)) * 12});
    }
    const std::string path = dir_ + "/optimizer_states.swp";
    SwapFileOptions swap_options;
    swap_options.file_system = o.file_system;
    ZERO_ASSIGN_OR_RETURN(swap_, SwapFile::Create(aio_.get(), path, regions, swap_options));
    const size_t region = (static_cast<size_t>(group_) * 12 + kAioAlignment - 1) / kAioAlignment * kAioAlignment;
    const size_t copy = HostSlab::AlignedSize(static_cast<size_t>(numel_) * SizeOf(mdt_));
    const size_t chunk = (static_cast<size_t>(chunk_) * 4 + kAioAlignment - 1) / kAioAlignment * kAioAlignment;
    const int nbuf = static_cast<int>(std::min<int64_t>(o.buffer_count, std::max<int64_t>(groups_, 2)));
    const size_t slab_bytes = nbuf * region + 2 * chunk + copy + kAioAlignment;
    auto slab = HostSlab::Create(device_, slab_bytes, o.slab);
    if (!slab.ok()) {
      return slab.status().WithContext("NVMe optimizer states: " + std::to_string(nbuf) + " group buffers of " +
                                       FormatGiB(region) + " (zero_optimization.sub_group_size " +
                                       std::to_string(group_) + " x 12 bytes; lower sub_group_size or buffer_count)");
    }
    slab_ = std::move(slab).value();
    for (int b = 0; b < nbuf; ++b) {
      ZERO_ASSIGN_OR_RETURN(HostSpan s, slab_.Take(region, "group buffer"));
      bufs_.push_back(Buffer{static_cast<float*>(s.data), -1, false, {}, false, false});
    }
    ZERO_ASSIGN_OR_RETURN(HostSpan g, slab_.Take(chunk, "gradient chunk"));
    grad_ = g.as<float>();
    ZERO_ASSIGN_OR_RETURN(HostSpan w, slab_.Take(chunk, "16-bit gradient chunk"));
    raw_ = w.data;
    ZERO_ASSIGN_OR_RETURN(HostSpan mc, slab_.Take(copy, "host model copy"));
    model_copy_ = mc.data;
    std::memset(model_copy_, 0, static_cast<size_t>(numel_) * SizeOf(mdt_));
    // Every group starts as zeros without a write: a group never written is "fresh" and is loaded
    // by zero-filling a buffer instead of reading (a region is readable only once written). So
    // creation costs no pass over the file, and Initialize's first write of the masters is the
    // only one.
    fresh_.assign(static_cast<size_t>(groups_), 1);
    return OkStatus();
  }

  int64_t numel() const override { return numel_; }

  Status Update(int64_t offset, int64_t n, const float* grads, const AdamWParams& h, void* model_out, DType model_t,
                Stream* stream) override {
    ZERO_RETURN_IF_ERROR(Check(offset, n, "Update"));
    for (int64_t at = 0; at < n; at += chunk_) {
      const int64_t len = std::min(chunk_, n - at);
      ZERO_RETURN_IF_ERROR(
          device_->Copy(grad_, grads + at, static_cast<size_t>(len) * 4, CopyKind::kDeviceToHost, stream));
      ZERO_RETURN_IF_ERROR(device_->SynchronizeStream(stream));
      ZERO_RETURN_IF_ERROR(UpdateRange(offset + at, len, grad_, h));
    }
    if (model_out != nullptr) return CastMaster(offset, n, model_out, model_t, stream);
    return OkStatus();
  }

  Status UpdateFromGradient(int64_t offset, int64_t n, const void* grad, DType grad_t, const AdamWParams& h,
                            Stream* stream) override {
    ZERO_RETURN_IF_ERROR(Check(offset, n, "UpdateFromGradient"));
    // Last piece first, and no piece across a group boundary: the update in backward visits the
    // parameters last registered first, so walking each one strictly downward keeps the accesses
    // moving one way and the read-ahead right (ForGroups; a piece that straddled two groups would
    // walk up inside itself, writing a group back early and reading the wrong neighbour ahead).
    // AdamW is elementwise: the order changes no bit.
    for (int64_t end = n; end > 0;) {
      const int64_t group_start = (offset + end - 1) / group_ * group_ - offset;
      const int64_t at = std::max<int64_t>({end - chunk_, group_start, 0});
      const int64_t len = end - at;
      end = at;
      if (grad != nullptr) {
        ZERO_RETURN_IF_ERROR(device_->Copy(raw_, ElementPtr(grad, grad_t, at),
                                           static_cast<size_t>(len) * SizeOf(grad_t), CopyKind::kDeviceToHost, stream));
        ZERO_RETURN_IF_ERROR(device_->SynchronizeStream(stream));
      }
      WidenToF32(pool_.get(), grad != nullptr ? raw_ : nullptr, grad_t, grad_, len);
      ZERO_RETURN_IF_ERROR(UpdateRange(offset + at, len, grad_, h));
    }
    return OkStatus();
  }

  Status CastMaster(int64_t offset, int64_t n, void* model_out, DType model_t, Stream* stream) override {
    ZERO_RETURN_IF_ERROR(Check(offset, n, "CastMaster"));
    if (n == 0) return OkStatus();
    if (model_t == mdt_) {
      ZERO_RETURN_IF_ERROR(device_->Copy(model_out, ElementPtr(model_copy_, mdt_, offset),
                                         static_cast<size_t>(n) * SizeOf(mdt_), CopyKind::kHostToDevice, stream));
      return device_->SynchronizeStream(stream);  // the model copy may change after this returns
    }
    for (int64_t at = 0; at < n; at += chunk_) {
      const int64_t len = std::min(chunk_, n - at);
      ZERO_RETURN_IF_ERROR(Read(OptState::kMaster, offset + at, len, grad_));
      RoundToDType(pool_.get(), grad_, raw_, model_t, len);
      ZERO_RETURN_IF_ERROR(device_->Copy(ElementPtr(model_out, model_t, at), raw_,
                                         static_cast<size_t>(len) * SizeOf(model_t), CopyKind::kHostToDevice, stream));
      ZERO_RETURN_IF_ERROR(device_->SynchronizeStream(stream));
    }
    return OkStatus();
  }

  Status CopyToDevice(OptState which, int64_t offset, int64_t n, float* dst, Stream* stream) override {
    ZERO_RETURN_IF_ERROR(Check(offset, n, "CopyToDevice"));
    for (int64_t at = 0; at < n; at += chunk_) {
      const int64_t len = std::min(chunk_, n - at);
      ZERO_RETURN_IF_ERROR(Read(which, offset + at, len, grad_));
      ZERO_RETURN_IF_ERROR(
          device_->Copy(dst + at, grad_, static_cast<size_t>(len) * 4, CopyKind::kHostToDevice, stream));
      ZERO_RETURN_IF_ERROR(device_->SynchronizeStream(stream));
    }
    return OkStatus();
  }
  Status CopyFromDevice(OptState which, int64_t offset, int64_t n, const float* src, Stream* stream) override {
    ZERO_RETURN_IF_ERROR(Check(offset, n, "CopyFromDevice"));
    for (int64_t at = 0; at < n; at += chunk_) {
      const int64_t len = std::min(chunk_, n - at);
      ZERO_RETURN_IF_ERROR(
          device_->Copy(grad_, src + at, static_cast<size_t>(len) * 4, CopyKind::kDeviceToHost, stream));
      ZERO_RETURN_IF_ERROR(device_->SynchronizeStream(stream));
      ZERO_RETURN_IF_ERROR(Write(which, offset + at, len, grad_));
    }
    return OkStatus();
  }

  Status Read(OptState which, int64_t offset, int64_t n, float* host) override {
    ZERO_RETURN_IF_ERROR(Check(offset, n, "Read"));
    return ForGroups(offset, n, /*dirty=*/false, [&](float* g, int64_t glen, int64_t from, int64_t len, int64_t done) {
      std::memcpy(host + done, g + static_cast<int64_t>(which) * glen + from, static_cast<size_t>(len) * 4);
      return OkStatus();
    });
  }
  Status Write(OptState which, int64_t offset, int64_t n, const float* host) override {
    ZERO_RETURN_IF_ERROR(Check(offset, n, "Write"));
    ZERO_RETURN_IF_ERROR(
        ForGroups(offset, n, /*dirty=*/true, [&](float* g, int64_t glen, int64_t from, int64_t len, int64_t done) {
          std::memcpy(g + static_cast<int64_t>(which) * glen + from, host + done, static_cast<size_t>(len) * 4);
          return OkStatus();
        }));
    if (which == OptState::kMaster) {
      RoundToDType(pool_.get(), host, ElementPtr(model_copy_, mdt_, offset), mdt_, n);
    }
    return OkStatus();
  }

  OptimizerStateBytes bytes() const override {
    OptimizerStateBytes b;
    b.host = slab_.bytes();
    b.nvme = swap_ != nullptr ? swap_->file_size() : 0;
    return b;
  }

 private:
  struct Buffer {
    float* data;    // [master | exp_avg | exp_avg_sq] of group `group`
    int64_t group;  // -1: empty
    bool writing;   // a write of it is in flight (io)
    SwapFile::Io io;
    bool reading;  // a read into it is in flight (io)
    bool dirty;    // changed since it was read or last written: written back when evicted
  };

  int64_t GroupLen(int64_t g) const { return std::min(group_, numel_ - g * group_); }

  // The buffer holding group g (read if needed; the next group of the range is prefetched into
  // another buffer by ForGroups). Waits for that buffer's pending I/O first.
  Result<Buffer*> Load(int64_t g) {
    for (Buffer& b : bufs_) {
      if (b.group == g) {
        if (b.reading) {
          b.reading = false;
          ZERO_RETURN_IF_ERROR(SwapError(FinishIo(b.io)));
        }
        return &b;
      }
    }
    ZERO_ASSIGN_OR_RETURN(Buffer * b, Victim(g));
    if (fresh_[g]) {
      std::memset(b->data, 0, static_cast<size_t>(GroupLen(g)) * 12);
    } else {
      ZERO_RETURN_IF_ERROR(SwapError(ReadIo(static_cast<size_t>(g), b->data)));
    }
    b->group = g;
    return b;
  }

  // A buffer to put a group in (never the one holding `avoid`): an empty one, else an idle clean
  // one, else the least recently chosen, after its I/O and write-back.
  Result<Buffer*> Victim(int64_t avoid) {
    Buffer* pick = nullptr;
    for (Buffer& b : bufs_) {
      if (b.group == -1 && !b.writing && !b.reading) return &b;
    }
    // A buffer with no I/O in flight and nothing to write costs no wait; else round robin.
    for (size_t k = 0; k < bufs_.size(); ++k) {
      Buffer& b = bufs_[(next_victim_ + k) % bufs_.size()];
      if (b.group != avoid && !b.writing && !b.reading && !b.dirty) {
        next_victim_ = (next_victim_ + k + 1) % bufs_.size();
        b.group = -1;
        return &b;
      }
    }
    for (size_t k = 0; k < bufs_.size(); ++k) {
      Buffer& b = bufs_[(next_victim_ + k) % bufs_.size()];
      if (b.group != avoid) {
        pick = &b;
        next_victim_ = (next_victim_ + k + 1) % bufs_.size();
        break;
      }
    }
    ZERO_CHECK(pick != nullptr);
    ZERO_RETURN_IF_ERROR(Settle(*pick));
    pick->group = -1;
    return pick;
  }

  // Ends the buffer's I/O in flight and writes it back if it changed: then it may be reused.
  Status Settle(Buffer& b) {
    if (b.writing) {
      b.writing = false;
      ZERO_RETURN_IF_ERROR(SwapError(FinishIo(b.io)));
    }
    if (b.reading) {
      b.reading = false;
      ZERO_RETURN_IF_ERROR(SwapError(FinishIo(b.io)));
    }
    if (b.dirty && b.group >= 0) {
      ZERO_RETURN_IF_ERROR(SwapError(WriteIo(static_cast<size_t>(b.group), b.data)));
      b.dirty = false;
      fresh_[b.group] = 0;
    }
    return OkStatus();
  }

  Status FinishAll() {
    Status first;
    for (Buffer& b : bufs_) {
      Status s = Settle(b);
      if (!s.ok() && first.ok()) first = s;
    }
    return first;
  }

  // Runs fn(group data, group len, from, len, done) over the pieces of [offset, offset + n) group
  // by group. Across calls the states follow the direction the accesses move in (the engine walks
  // the partition upward at the boundary, and downward in backward, where each parameter's update
  // comes as its own call): when an access enters a group other than the last one, the last group
  // is written back at once if it changed (that write in flight while this group is worked on) and
  // the next group in the direction of travel is read ahead into another buffer, so a pass over
  // the partition in either direction keeps one read and one write in flight behind the CPU AdamW
  // and writes each group once. dirty: fn changes the group. The buffers are the states' current
  // values; the file catches up on those write-backs and on eviction.
  template <typename Fn>
  Status ForGroups(int64_t offset, int64_t n, bool dirty, Fn fn) {
    int64_t done = 0;
    while (done < n) {
      const int64_t pos = offset + done;
      const int64_t g = pos / group_;
      const int64_t from = pos - g * group_;
      const int64_t glen = GroupLen(g);
      const int64_t len = std::min(glen - from, n - done);
      if (g != last_group_) {
        if (last_group_ >= 0) {
          direction_ = g > last_group_ ? 1 : -1;
          ZERO_RETURN_IF_ERROR(WriteBack(last_group_));
        }
        last_group_ = g;
      }
      ZERO_ASSIGN_OR_RETURN(Buffer * b, Load(g));
      if (b->writing) {  // updated again before its write finished
        b->writing = false;
        ZERO_RETURN_IF_ERROR(SwapError(FinishIo(b->io)));
      }
      ZERO_RETURN_IF_ERROR(ReadAhead(g + direction_, g));
      ZERO_RETURN_IF_ERROR(fn(b->data, glen, from, len, done));
      if (dirty) b->dirty = true;
      done += len;
    }
    return OkStatus();
  }

  // Starts the write of group g's buffer if it changed (no wait).
  Status WriteBack(int64_t g) {
    for (Buffer& b : bufs_) {
      if (b.group != g || !b.dirty) continue;
      if (b.writing) {
        b.writing = false;
        ZERO_RETURN_IF_ERROR(SwapError(FinishIo(b.io)));
      }
      Result<SwapFile::Io> io = swap_->StartWrite(static_cast<size_t>(g), b.data);
      if (!io.ok()) return SwapError(io.status());
      b.io = *io;
      b.writing = true;
      b.dirty = false;
      fresh_[g] = 0;
    }
    return OkStatus();
  }

  // Starts reading group `g` (if it exists and is not resident) into a buffer other than `keep`'s.
  Status ReadAhead(int64_t g, int64_t keep) {
    if (g < 0 || g >= groups_ || bufs_.size() < 2 || fresh_[g]) return OkStatus();
    for (Buffer& o : bufs_) {
      if (o.group == g) return OkStatus();
    }
    ZERO_ASSIGN_OR_RETURN(Buffer * nb, Victim(keep));
    Result<SwapFile::Io> io = swap_->StartRead(static_cast<size_t>(g), nb->data);
    if (!io.ok()) return SwapError(io.status());
    nb->io = *io;
    nb->reading = true;
    nb->group = g;
    return OkStatus();
  }

  Status UpdateRange(int64_t offset, int64_t n, const float* g_host, const AdamWParams& h) {
    return ForGroups(offset, n, /*dirty=*/true, [&](float* g, int64_t glen, int64_t from, int64_t len, int64_t done) {
      return CpuAdamW(g + from, g_host + done, g + glen + from, g + 2 * glen + from, static_cast<size_t>(len), h,
                      ElementPtr(model_copy_, mdt_, offset + done), mdt_, pool_.get());
    });
  }

  Status Check(int64_t offset, int64_t n, const char* call) const {
    if (!failed_.ok()) {
      return FailedPreconditionError(std::string("NVMe optimizer states: ") + call +
                                     " refused: unusable after an earlier swap file error: " + failed_.message());
    }
    return CheckStateRange("NVMe optimizer states", call, offset, n, numel_);
  }

  // Every swap file error goes through here. It says what to do, and it ends the states' use: a
  // buffer may hold a group whose read failed and a region whose write failed is unreadable, so
  // every later call is refused (Check) rather than computing on what is left. The file's content
  // is not trusted again; the last checkpoint is the way back.
  // The swap file's blocking calls, each a host span on the trace's I/O track (the aio waits).
  Status FinishIo(const SwapFile::Io& io) {
    TraceHostScope trace(observer_, TraceTrack::kIo, io.read ? "aio read wait" : "aio write wait");
    return swap_->Finish(io);
  }
  Status ReadIo(size_t region, void* buffer) {
    TraceHostScope trace(observer_, TraceTrack::kIo, "aio read");
    return swap_->Read(region, buffer);
  }
  Status WriteIo(size_t region, const void* buffer) {
    TraceHostScope trace(observer_, TraceTrack::kIo, "aio write");
    return swap_->Write(region, buffer);
  }

  Status SwapError(Status s) {
    if (s.ok()) return s;
    s = WithSwapFaultAdvice(s,
                            "the swap file was truncated, corrupted or changed behind the engine's back: its optimizer "
                            "state is lost",
                            "zero_optimization.offload_optimizer.nvme_path", "Faults during training");
    if (failed_.ok()) failed_ = s;
    return s;
  }

  Device* device_;
  Stream* stream_;
  int64_t numel_;
  int64_t group_;
  int64_t chunk_;
  DType mdt_;
  int64_t groups_ = 0;
  std::string dir_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<AioEngine> aio_;
  std::unique_ptr<SwapFile> swap_;
  HostSlab slab_;
  std::vector<Buffer> bufs_;
  size_t next_victim_ = 0;
  int64_t last_group_ = -1;     // the group the last access was in (ForGroups)
  std::vector<uint8_t> fresh_;  // by group: never written, so all zeros (loaded without a read)
  int direction_ = 1;           // +1 / -1: the way the accesses last moved
  Status failed_;               // the first swap file error (SwapError); every later call is refused
  float* grad_ = nullptr;
  void* raw_ = nullptr;
  void* model_copy_ = nullptr;
};

}  // namespace

Result<std::unique_ptr<OptimizerStates>> CreateNvmeOptimizerStates(Device* device, int64_t numel, Stream* stream,
                                                                   const NvmeOptimizerStatesOptions& options) {
  auto s = std::make_unique<NvmeOptimizerStates>(device, stream, numel, options);
  ZERO_RETURN_IF_ERROR(s->Init(options).WithContext("NVMe optimizer states in " + options.dir));
  return std::unique_ptr<OptimizerStates>(std::move(s));
}

}  // namespace zero
