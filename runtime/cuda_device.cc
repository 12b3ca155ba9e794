#include "runtime/cuda_device.h"

#include <cctype>
#include <cstdio>
#include <utility>

#include "runtime/cuda_kernels.h"
#include "runtime/cuda_status.h"

namespace zero {
namespace {

std::string FormatBytes(size_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%zu bytes (%.2f GiB)", bytes,
                static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

bool ValidDType(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

// Destructors cannot return a Status; a failure there is reported and otherwise ignored.
void WarnIfError(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "zero: %s failed: %s (%s)\n", what, cudaGetErrorString(err), cudaGetErrorName(err));
  }
}

cudaMemcpyKind ToCuda(CopyKind kind) {
  switch (kind) {
    case CopyKind::kHostToDevice:
      return cudaMemcpyHostToDevice;
    case CopyKind::kDeviceToHost:
      return cudaMemcpyDeviceToHost;
    case CopyKind::kDeviceToDevice:
      return cudaMemcpyDeviceToDevice;
    case CopyKind::kHostToHost:
      return cudaMemcpyHostToHost;
  }
  return cudaMemcpyDefault;
}

}  // namespace

CudaStream::~CudaStream() {
  WarnIfError(cudaSetDevice(ordinal_), "cudaSetDevice");
  WarnIfError(cudaStreamDestroy(stream_), "cudaStreamDestroy");
  WarnIfError(cudaFree(scratch_), "cudaFree (stream scratch)");
}

CudaEvent::~CudaEvent() {
  WarnIfError(cudaSetDevice(ordinal_), "cudaSetDevice");
  WarnIfError(cudaEventDestroy(event_), "cudaEventDestroy");
}

Result<std::unique_ptr<CudaDevice>> CudaDevice::Create(int ordinal) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return UnavailableError(std::string("cuda: no usable GPU: cudaGetDeviceCount failed: ") + cudaGetErrorString(err) +
                            " (" + cudaGetErrorName(err) + ")");
  }
  if (count == 0) return UnavailableError("cuda: no usable GPU: cudaGetDeviceCount found none");
  if (ordinal < 0 || ordinal >= count) {
    return InvalidArgumentError("cuda:" + std::to_string(ordinal) + ": no such GPU (" + std::to_string(count) +
                                " visible, ordinals 0.." + std::to_string(count - 1) + ")");
  }
  ZERO_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
  cudaDeviceProp prop;
  ZERO_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, ordinal));
  int sm_count = 0;
  ZERO_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, ordinal));
  std::string name = "cuda:" + std::to_string(ordinal) + " (" + prop.name + ")";
  std::unique_ptr<CudaDevice> device(new CudaDevice(ordinal, std::move(name), sm_count));
  ZERO_ASSIGN_OR_RETURN(device->default_stream_, device->NewStream());
  return device;
}

CudaDevice::CudaDevice(int ordinal, std::string name, int sm_count)
    : ordinal_(ordinal), name_(std::move(name)), sm_count_(sm_count > 0 ? sm_count : 1) {}

CudaDevice::~CudaDevice() = default;

Status CudaDevice::Bind() const {
  ZERO_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
  return OkStatus();
}

Result<std::unique_ptr<CudaStream>> CudaDevice::NewStream() {
  ZERO_RETURN_IF_ERROR(Bind());
  cudaStream_t stream = nullptr;
  ZERO_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void* scratch = nullptr;
  cudaError_t err = cudaMalloc(&scratch, cuda_kernels::kSumOfSquaresBlocks * sizeof(double));
  if (err != cudaSuccess) {
    cudaGetLastError();
    WarnIfError(cudaStreamDestroy(stream), "cudaStreamDestroy");
    return CudaStatus(err, "cudaMalloc(stream scratch)", __FILE__, __LINE__);
  }
  return std::unique_ptr<CudaStream>(new CudaStream(ordinal_, stream, static_cast<double*>(scratch)));
}

Result<CudaStream*> CudaDevice::Resolve(Stream* stream) {
  CudaStream* s = stream == nullptr ? default_stream_.get() : dynamic_cast<CudaStream*>(stream);
  if (s == nullptr) return InvalidArgumentError(name_ + ": stream does not belong to a CudaDevice");
  if (s->ordinal() != ordinal_) {
    return InvalidArgumentError(name_ + ": stream belongs to cuda:" + std::to_string(s->ordinal()));
  }
  ZERO_RETURN_IF_ERROR(Bind());
  return s;
}

cudaStream_t CudaDevice::native_stream(Stream* stream) {
  CudaStream* s = stream == nullptr ? default_stream_.get() : dynamic_cast<CudaStream*>(stream);
  ZERO_CHECK_MSG(s != nullptr, "native_stream: not a CudaStream");
  return s->get();
}

// --- memory ----------------------------------------------------------------------------------

Result<DeviceBuffer> CudaDevice::Allocate(size_t bytes) {
  if (bytes == 0) return DeviceBuffer();
  ZERO_RETURN_IF_ERROR(Bind());
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, bytes);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    std::string gpu = "unknown";
    if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
      gpu = FormatBytes(free_bytes) + " free of " + FormatBytes(total_bytes);
    } else {
      cudaGetLastError();
    }
    return ResourceExhaustedError(name_ + ": out of device memory allocating " + FormatBytes(bytes) +
                                  "; in use through this device " + FormatBytes(memory_stats().in_use) +
                                  "; GPU: " + gpu);
  }
  if (err != cudaSuccess) return CudaStatus(err, "cudaMalloc", __FILE__, __LINE__);
  NoteAlloc(bytes);
  return DeviceBuffer(this, p, bytes);
}

Result<PinnedBuffer> CudaDevice::AllocatePinned(size_t bytes) {
  if (bytes == 0) return PinnedBuffer();
  ZERO_RETURN_IF_ERROR(Bind());
  void* p = nullptr;
  cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return ResourceExhaustedError(name_ + ": out of pinned host memory allocating " + FormatBytes(bytes));
  }
  if (err != cudaSuccess) return CudaStatus(err, "cudaHostAlloc", __FILE__, __LINE__);
  return PinnedBuffer(this, p, bytes);
}

Status CudaDevice::RegisterHostMemory(void* ptr, size_t bytes) {
  if (bytes == 0) return OkStatus();
  ZERO_RETURN_IF_ERROR(Bind());
  cudaError_t err = cudaHostRegister(ptr, bytes, cudaHostRegisterPortable);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return CudaStatus(err, "cudaHostRegister", __FILE__, __LINE__)
        .WithContext(name_ + ": page-locking " + FormatBytes(bytes) + " of host memory");
  }
  return OkStatus();
}

Status CudaDevice::UnregisterHostMemory(void* ptr) {
  if (ptr == nullptr) return OkStatus();
  ZERO_RETURN_IF_ERROR(Bind());
  cudaError_t err = cudaHostUnregister(ptr);
  if (err != cudaSuccess) cudaGetLastError();
  return CudaStatus(err, "cudaHostUnregister", __FILE__, __LINE__);
}

std::string CudaDevice::pci_bus_id() const {
  char buf[32] = {0};
  if (cudaDeviceGetPCIBusId(buf, sizeof(buf), ordinal_) != cudaSuccess) {
    cudaGetLastError();
    return std::string();
  }
  std::string id(buf);
  for (char& c : id) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return id;
}

void CudaDevice::FreeDevice(void* ptr, size_t bytes) {
  WarnIfError(cudaSetDevice(ordinal_), "cudaSetDevice");
  WarnIfError(cudaFree(ptr), "cudaFree");
  NoteFree(bytes);
}

void CudaDevice::FreePinned(void* ptr, size_t bytes) { WarnIfError(cudaFreeHost(ptr), "cudaFreeHost"); }

// --- streams and events ----------------------------------------------------------------------

Result<std::unique_ptr<Stream>> CudaDevice::CreateStream() {
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<CudaStream> s, NewStream());
  return std::unique_ptr<Stream>(std::move(s));
}

Result<std::unique_ptr<Event>> CudaDevice::CreateEvent() {
  ZERO_RETURN_IF_ERROR(Bind());
  cudaEvent_t e = nullptr;
  ZERO_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return std::unique_ptr<Event>(new CudaEvent(ordinal_, e));
}

namespace {
Result<CudaEvent*> ResolveEvent(Event* event, const std::string& device) {
  auto* e = dynamic_cast<CudaEvent*>(event);
  if (e == nullptr) return InvalidArgumentError(device + ": null event or not a CudaEvent");
  return e;
}
}  // namespace

Status CudaDevice::RecordEvent(Event* event, Stream* stream) {
  ZERO_ASSIGN_OR_RETURN(CudaEvent * e, ResolveEvent(event, name_));
  ZERO_ASSIGN_OR_RETURN(CudaStream * s, Resolve(stream));
  ZERO_CUDA_RETURN_IF_ERROR(cudaEventRecord(e->get(), s->get()));
  return OkStatus();
}

Status CudaDevice::StreamWaitEvent(Stream* stream, Event* event) {
  ZERO_ASSIGN_OR_RETURN(CudaEvent * e, ResolveEvent(event, name_));
  ZERO_ASSIGN_OR_RETURN(CudaStream * s, Resolve(stream));
  ZERO_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(s->get(), e->get(), 0));
  return OkStatus();
}

Status CudaDevice::SynchronizeEvent(Event* event) {
  ZERO_ASSIGN_OR_RETURN(CudaEvent * e, ResolveEvent(event, name_));
  ZERO_RETURN_IF_ERROR(Bind());
  ZERO_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(e->get()));
  return OkStatus();
}

Result<std::unique_ptr<Event>> CudaDevice::CreateTimingEvent() {
  ZERO_RETURN_IF_ERROR(Bind());
  cudaEvent_t e = nullptr;
  ZERO_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDefault));
  return std::unique_ptr<Event>(new CudaEvent(ordinal_, e, /*timing=*/true));
}

Result<std::optional<double>> CudaDevice::ElapsedMilliseconds(Event* start, Event* end) {
  ZERO_ASSIGN_OR_RETURN(CudaEvent * s, ResolveEvent(start, name_));
  ZERO_ASSIGN_OR_RETURN(CudaEvent * e, ResolveEvent(end, name_));
  if (!s->timing() || !e->timing()) {
    return InvalidArgumentError(name_ + ": ElapsedMilliseconds: the " + std::string(s->timing() ? "end" : "start") +
                                " event is not a timing event (create it with CreateTimingEvent)");
  }
  ZERO_RETURN_IF_ERROR(Bind());
  // cudaEventQuery, not cudaEventSynchronize: a span still running is left for a later call.
  for (CudaEvent* ev : {s, e}) {
    const cudaError_t q = cudaEventQuery(ev->get());
    if (q == cudaErrorNotReady) {
      cudaGetLastError();  // not an error; keep it out of the next call's check
      return std::optional<double>();
    }
    ZERO_CUDA_RETURN_IF_ERROR(q);
  }
  float ms = 0;
  const cudaError_t err = cudaEventElapsedTime(&ms, s->get(), e->get());
  if (err == cudaErrorInvalidResourceHandle) {
    cudaGetLastError();
    return FailedPreconditionError(name_ + ": ElapsedMilliseconds: an event was never recorded");
  }
  ZERO_CUDA_RETURN_IF_ERROR(err);
  return std::optional<double>(static_cast<double>(ms));
}

Status CudaDevice::SynchronizeStream(Stream* stream) {
  ZERO_ASSIGN_OR_RETURN(CudaStream * s, Resolve(stream));
  ZERO_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s->get()));
  return OkStatus();
}

Status CudaDevice::Synchronize() {
  ZERO_RETURN_IF_ERROR(Bind());
  ZERO_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return OkStatus();
}

// --- copies ----------------------------------------------------------------------------------

Status CudaDevice::Copy(void* dst, const void* src, size_t bytes, CopyKind kind, Stream* stream) {
  ZERO_ASSIGN_OR_RETURN(CudaStream * s, Resolve(stream));
  if (bytes == 0) return OkStatus();
  ZERO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, ToCuda(kind), s->get()));
  return OkStatus();
}

// --- kernels ---------------------------------------------------------------------------------

Status CudaDevice::Fill(void* dst, DType t, size_t n, float value, Stream* stream) {
  ZERO_ASSIGN_OR_RETURN(CudaStream * s, Resolve(stream));
  if (!ValidDType(t)) return InvalidArgumentError(name_ + ": Fill: bad dtype");
  const cuda_kernels::Launch launch{s->get(), max_blocks()};
  ZERO_CUDA_RETURN_IF_ERROR(cuda_kernels::Fill(dst, t, n, value, launch));
  return OkStatus();
}

Status CudaDevice::Cast(const void* src, DType src_t, void* dst, DType dst_t, size_t n, Stream* stream) {
  ZERO_ASSIGN_OR_RETURN(CudaStream * s, Resolve(stream));
  if (!ValidDType(src_t) || !ValidDType(dst_t)) {
    return InvalidArgumentError(name_ + ": Cast: bad dtype");
  }
  if (n == 0 || (src == dst && src_t == dst_t)) return OkStatus();
  if (src_t == dst_t) {
    // A bit copy, as on the CPU backend: NaN payloads pass through unchanged.
    ZERO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, n * SizeOf(src_t), cudaMemcpyDeviceToDevice, s->get()));
    return OkStatus();
  }
  const cuda_kernels::Launch launch{s->get(), max_blocks()};
  ZERO_CUDA_RETURN_IF_ERROR(cuda_kernels::Cast(src, src_t, dst, dst_t, n, launch));
  return OkStatus();
}

Status CudaDevice::Accumulate(float* acc, const void* src, DType src_t, size_t n, float scale, Stream* stream) {
  ZERO_ASSIGN_OR_RETURN(CudaStream * s, Resolve(stream));
  if (!ValidDType(src_t)) return InvalidArgumentError(name_ + ": Accumulate: bad dtype");
  const cuda_kernels::Launch launch{s->get(), max_blocks()};
  ZERO_CUDA_RETURN_IF_ERROR(cuda_kernels::Accumulate(acc, src, src_t, n, scale, launch));
  return OkStatus();
}

Status CudaDevice::AccumulateFirst(float* acc, const void* src, DType src_t, size_t n, float scale, Stream* stream) {
  ZERO_ASSIGN_OR_RETURN(CudaStream * s, Resolve(stream));
  if (!ValidDType(src_t)) return InvalidArgumentError(name_ + ": AccumulateFirst: bad dtype");
  const cuda_kernels::Launch launch{s->get(), max_blocks()};
  ZERO_CUDA_RETURN_IF_ERROR(cuda_kernels::AccumulateFirst(acc, src, src_t, n, scale, launch));
  return OkStatus();
}

Status CudaDevice::Scale(void* x, DType t, size_t n, float scale, Stream* stream) {
  ZERO_ASSIGN_OR_RETURN(CudaStream * s, Resolve(stream));
  if (!ValidDType(t)) return InvalidArgumentError(name_ + ": Scale: bad dtype");
  const cuda_kernels::Launch launch{s->get(), max_blocks()};
  ZERO_CUDA_RETURN_IF_ERROR(cuda_kernels::Scale(x, t, n, scale, launch));
  return OkStatus();
}

Status CudaDevice::SumOfSquares(const void* x, DType t, size_t n, double* out, Stream* stream) {
  ZERO_ASSIGN_OR_RETURN(CudaStream * s, Resolve(stream));
  if (!ValidDType(t)) return InvalidArgumentError(name_ + ": SumOfSquares: bad dtype");
  ZERO_CUDA_RETURN_IF_ERROR(cuda_kernels::SumOfSquares(x, t, n, out, s->scratch_, s->get()));
  return OkStatus();
}

Status CudaDevice::FiniteCheck(const void* x, DType t, size_t n, int32_t* flag, Stream* stream) {
  ZERO_ASSIGN_OR_RETURN(CudaStream * s, Resolve(stream));
  if (!ValidDType(t)) return InvalidArgumentError(name_ + ": FiniteCheck: bad dtype");
  const cuda_kernels::Launch launch{s->get(), max_blocks()};
  ZERO_CUDA_RETURN_IF_ERROR(cuda_kernels::FiniteCheck(x, t, n, flag, launch));
  return OkStatus();
}

Status CudaDevice::AdamW(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, size_t n,
                         const AdamWParams& h, Stream* stream) {
  ZERO_ASSIGN_OR_RETURN(CudaStream * s, Resolve(stream));
  const cuda_kernels::Launch launch{s->get(), max_blocks()};
  ZERO_CUDA_RETURN_IF_ERROR(cuda_kernels::AdamW(param, grad, exp_avg, exp_avg_sq, n, h, launch));
  return OkStatus();
}

Status CudaDevice::AdamWCast(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, size_t n,
                             const AdamWParams& h, void* model_out, DType model_t, Stream* stream) {
  if (model_out == nullptr) return AdamW(param, grad, exp_avg, exp_avg_sq, n, h, stream);
  ZERO_ASSIGN_OR_RETURN(CudaStream * s, Resolve(stream));
  if (!ValidDType(model_t)) return InvalidArgumentError(name_ + ": AdamWCast: bad dtype");
  const cuda_kernels::Launch launch{s->get(), max_blocks()};
  ZERO_CUDA_RETURN_IF_ERROR(
      cuda_kernels::AdamWCast(param, grad, exp_avg, exp_avg_sq, n, h, model_out, model_t, launch));
  return OkStatus();
}

Status CudaDevice::AdamWFromGradient(float* param, const void* grad, DType grad_t, float* exp_avg, float* exp_avg_sq,
                                     size_t n, const AdamWParams& h, Stream* stream) {
  ZERO_ASSIGN_OR_RETURN(CudaStream * s, Resolve(stream));
  if (!ValidDType(grad_t)) return InvalidArgumentError(name_ + ": AdamWFromGradient: bad dtype");
  const cuda_kernels::Launch launch{s->get(), max_blocks()};
  ZERO_CUDA_RETURN_IF_ERROR(cuda_kernels::AdamWFromGradient(param, grad, grad_t, exp_avg, exp_avg_sq, n, h, launch));
  return OkStatus();
}

}  // namespace zero
