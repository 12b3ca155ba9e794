// MeasurePcie (bench/pcie_copy.h): pinned host<->device copies timed with CUDA events. No kernels:
// only cudaMemcpyAsync on two non-blocking streams.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "bench/pcie_copy.h"

namespace zero::bench {
namespace {

#define PCIE_RETURN_IF_ERROR(expr, what)                                                           \
  do {                                                                                             \
    cudaError_t _p_e = (expr);                                                                     \
    if (_p_e != cudaSuccess) {                                                                     \
      return InternalError(std::string(#expr) + " (" + (what) + "): " + cudaGetErrorString(_p_e)); \
    }                                                                                              \
  } while (0)

// Everything a measurement holds, freed on every path out.
struct Resources {
  void* host_src = nullptr;  // pinned, read by H2D
  void* host_dst = nullptr;  // pinned, written by D2H
  void* dev_dst = nullptr;   // written by H2D
  void* dev_src = nullptr;   // read by D2H
  cudaStream_t up = nullptr, down = nullptr;
  cudaEvent_t start = nullptr, up_done = nullptr, down_done = nullptr;
  ~Resources() {
    if (start) cudaEventDestroy(start);
    if (up_done) cudaEventDestroy(up_done);
    if (down_done) cudaEventDestroy(down_done);
    if (up) cudaStreamDestroy(up);
    if (down) cudaStreamDestroy(down);
    if (dev_dst) cudaFree(dev_dst);
    if (dev_src) cudaFree(dev_src);
    if (host_src) cudaFreeHost(host_src);
    if (host_dst) cudaFreeHost(host_dst);
  }
};

double Elapsed(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, a, b);
  return ms / 1e3;
}

}  // namespace

Result<std::vector<PcieTimes>> MeasurePcie(int device, const std::vector<int64_t>& bytes, int warmup, int reps) {
  if (bytes.empty()) return InvalidArgumentError("MeasurePcie: no transfer size");
  const int64_t max_bytes = *std::max_element(bytes.begin(), bytes.end());
  if (max_bytes <= 0) return InvalidArgumentError("MeasurePcie: transfer sizes must be > 0");
  const std::string setup = "device " + std::to_string(device) + ", " + std::to_string(max_bytes) + " bytes per buffer";
  PCIE_RETURN_IF_ERROR(cudaSetDevice(device), setup);
  Resources r;
  PCIE_RETURN_IF_ERROR(cudaHostAlloc(&r.host_src, max_bytes, cudaHostAllocPortable), setup);
  PCIE_RETURN_IF_ERROR(cudaHostAlloc(&r.host_dst, max_bytes, cudaHostAllocPortable), setup);
  PCIE_RETURN_IF_ERROR(cudaMalloc(&r.dev_dst, max_bytes), setup);
  PCIE_RETURN_IF_ERROR(cudaMalloc(&r.dev_src, max_bytes), setup);
  std::memset(r.host_src, 0x5a, max_bytes);
  std::memset(r.host_dst, 0, max_bytes);
  PCIE_RETURN_IF_ERROR(cudaMemset(r.dev_src, 0x3c, max_bytes), setup);
  PCIE_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&r.up, cudaStreamNonBlocking), setup);
  PCIE_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&r.down, cudaStreamNonBlocking), setup);
  PCIE_RETURN_IF_ERROR(cudaEventCreate(&r.start), setup);
  PCIE_RETURN_IF_ERROR(cudaEventCreate(&r.up_done), setup);
  PCIE_RETURN_IF_ERROR(cudaEventCreate(&r.down_done), setup);
  PCIE_RETURN_IF_ERROR(cudaDeviceSynchronize(), setup);

  std::vector<PcieTimes> out;
  for (const int64_t n : bytes) {
    const std::string what = std::to_string(n) + " bytes";
    PcieTimes t;
    t.bytes = n;
    for (int i = 0; i < warmup + reps; ++i) {
      const bool timed = i >= warmup;
      // H2D alone.
      PCIE_RETURN_IF_ERROR(cudaEventRecord(r.start, r.up), what);
      PCIE_RETURN_IF_ERROR(cudaMemcpyAsync(r.dev_dst, r.host_src, n, cudaMemcpyHostToDevice, r.up), what);
      PCIE_RETURN_IF_ERROR(cudaEventRecord(r.up_done, r.up), what);
      PCIE_RETURN_IF_ERROR(cudaEventSynchronize(r.up_done), what);
      if (timed) t.h2d.push_back(Elapsed(r.start, r.up_done));
      // D2H alone.
      PCIE_RETURN_IF_ERROR(cudaEventRecord(r.start, r.down), what);
      PCIE_RETURN_IF_ERROR(cudaMemcpyAsync(r.host_dst, r.dev_src, n, cudaMemcpyDeviceToHost, r.down), what);
      PCIE_RETURN_IF_ERROR(cudaEventRecord(r.down_done, r.down), what);
      PCIE_RETURN_IF_ERROR(cudaEventSynchronize(r.down_done), what);
      if (timed) t.d2h.push_back(Elapsed(r.start, r.down_done));
      // Both at once: one start event, each stream waits for it, then its copy.
      PCIE_RETURN_IF_ERROR(cudaEventRecord(r.start, r.up), what);
      PCIE_RETURN_IF_ERROR(cudaStreamWaitEvent(r.down, r.start, 0), what);
      PCIE_RETURN_IF_ERROR(cudaMemcpyAsync(r.dev_dst, r.host_src, n, cudaMemcpyHostToDevice, r.up), what);
      PCIE_RETURN_IF_ERROR(cudaMemcpyAsync(r.host_dst, r.dev_src, n, cudaMemcpyDeviceToHost, r.down), what);
      PCIE_RETURN_IF_ERROR(cudaEventRecord(r.up_done, r.up), what);
      PCIE_RETURN_IF_ERROR(cudaEventRecord(r.down_done, r.down), what);
      PCIE_RETURN_IF_ERROR(cudaEventSynchronize(r.up_done), what);
      PCIE_RETURN_IF_ERROR(cudaEventSynchronize(r.down_done), what);
      if (timed) {
        const double a = Elapsed(r.start, r.up_done), b = Elapsed(r.start, r.down_done);
        t.both_h2d.push_back(a);
        t.both_d2h.push_back(b);
        t.both.push_back(std::max(a, b));
      }
    }
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace zero::bench
