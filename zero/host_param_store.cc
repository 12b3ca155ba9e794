#include "zero/host_param_store.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

namespace zero {

Result<std::unique_ptr<HostParamStore>> HostParamStore::Create(Device* device, Stream* stream, DType dtype,
                                                               int64_t numel, const HostParamStoreOptions& options) {
  if (numel < 0) return InvalidArgumentError("HostParamStore: negative size " + std::to_string(numel));
  std::unique_ptr<HostParamStore> s(new HostParamStore(device, stream, dtype, numel));
  const size_t bytes = static_cast<size_t>(numel) * SizeOf(dtype);
  ZERO_ASSIGN_OR_RETURN(s->slab_, HostSlab::Create(device, HostSlab::AlignedSize(bytes), options.slab));
  if (bytes > 0) std::memset(s->slab_.data(), 0, bytes);  // +0 in every dtype
  s->scratch_numel_ = std::min<int64_t>(numel, std::max<int64_t>(1, options.scratch_numel));
  if (s->scratch_numel_ > 0) {
    auto b = device->Allocate(static_cast<size_t>(s->scratch_numel_) * SizeOf(dtype));
    if (!b.ok()) return b.status().WithContext("allocating the device scratch of the offloaded parameters");
    s->scratch_ = std::move(b).value();
  }
  return s;
}

Status HostParamStore::Check(int64_t offset, int64_t n, const char* call) const {
  if (offset < 0 || n < 0 || offset + n > numel_) {
    return OutOfRangeError(std::string("offloaded parameters (host): ") + call + " of [" + std::to_string(offset) +
                           ", " + std::to_string(offset + n) + ") outside [0, " + std::to_string(numel_) + ")");
  }
  return OkStatus();
}

Status HostParamStore::Write(int64_t offset, int64_t n, const Producer& produce) {
  ZERO_RETURN_IF_ERROR(Check(offset, n, "Write"));
  const size_t esize = SizeOf(dtype_);
  for (int64_t at = 0; at < n; at += scratch_numel_) {
    const int64_t len = std::min(scratch_numel_, n - at);
    // In stream order: the previous chunk's device->host copy has read the scratch.
    ZERO_RETURN_IF_ERROR(produce(scratch_.data(), at, len));
    ZERO_RETURN_IF_ERROR(device_->Copy(this->at(offset + at), scratch_.data(), static_cast<size_t>(len) * esize,
                                       CopyKind::kDeviceToHost, stream_));
  }
  return OkStatus();
}

Status HostParamStore::WriteFromMasters(OptimizerStates* states, int64_t offset, int64_t n) {
  ZERO_RETURN_IF_ERROR(Check(offset, n, "WriteFromMasters"));
  if (states->casts_to_host()) {
    // Earlier device->host writes of these elements land first.
    ZERO_RETURN_IF_ERROR(device_->SynchronizeStream(stream_));
    return states->CastMasterToHost(offset, n, at(offset), dtype_);
  }
  return Write(offset, n, [&](void* dst, int64_t at, int64_t len) {
    return states->CastMaster(offset + at, len, dst, dtype_, stream_);
  });
}

Status HostParamStore::CopyToDevice(int64_t offset, int64_t n, void* dst) {
  ZERO_RETURN_IF_ERROR(Check(offset, n, "CopyToDevice"));
  return device_->Copy(dst, at(offset), static_cast<size_t>(n) * SizeOf(dtype_), CopyKind::kHostToDevice, stream_);
}

}  // namespace zero
