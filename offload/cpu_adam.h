// CpuAdamW: the AdamW update of host-resident fp32 master weights and moments (optimizer offload),
// with SIMD paths (AVX-512: 16 lanes, AVX2: 8 lanes) chosen at run time, a scalar fallback, and the
// tiles of one call spread over a caller-owned ThreadPool. Optionally writes the updated weight,
// rounded to the model dtype, into a separate buffer (the pinned host->device transfer buffer) in
// the same pass.
//
// Arithmetic: every path produces, element by element, the bits of Device::AdamWCast on the CPU
// backend (AdamWReference in runtime/device.h, NaN results stored as the canonical NaN 0x7fffffff,
// the 16-bit copy rounded to nearest even by dtype.h's FloatToBf16/FloatToHalf of the stored
// weight). The SIMD paths perform the same IEEE operations in the same order (separate multiplies
// and adds, never FMA; correctly rounded sqrt and division), so SIMD, scalar and the reference
// agree bitwise, whatever the thread count or tile size. Assumes the default floating-point
// environment (round to nearest, no FTZ/DAZ), as the reference does.
//
// Owns nothing: the arrays and the pool belong to the caller.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "offload/thread_pool.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/status.h"

namespace zero {

enum class CpuAdamPath {
  kAuto,    // the best path this CPU has: kAvx512, else kAvx2, else kScalar
  kScalar,  // plain C++ (the compiler may vectorize it for the baseline ISA): always available
  kAvx2,    // 8 lanes; needs AVX2 and F16C
  kAvx512,  // 16 lanes; needs AVX-512F
};

// "auto", "scalar", "avx2", "avx512".
const char* CpuAdamPathName(CpuAdamPath path);
// Accepts the names above. False if unknown (*out untouched).
bool ParseCpuAdamPath(std::string_view name, CpuAdamPath* out);
// Whether this CPU (and OS) supports the path; kAuto and kScalar always.
bool CpuAdamPathAvailable(CpuAdamPath path);
// The path kAuto runs: never kAuto.
CpuAdamPath BestCpuAdamPath();
// Tests only: report the paths above `ceiling` (scalar < avx2 < avx512) as unavailable, as on a
// CPU without them; kAuto lifts the ceiling. Not for concurrent use with CpuAdamW.
void SetCpuAdamPathCeilingForTesting(CpuAdamPath ceiling);

// Elements per tile: one task of the thread pool, a contiguous range. 64K elements touch 1.75 MiB
// (28 B per element), small enough to balance 16+ threads on 1M elements, large enough that the
// per-task cost is noise.
inline constexpr size_t kCpuAdamTileElements = size_t{1} << 16;

struct CpuAdamWOptions {
  // Forces a path (tests, benchmarks); a path the CPU lacks is an error, never run.
  CpuAdamPath path = CpuAdamPath::kAuto;
  // Rounded up to a multiple of 64 (whole cache lines of every array). Results do not depend on it.
  size_t tile_elements = kCpuAdamTileElements;
  // SIMD paths: write model_out with non-temporal stores (it is read by a DMA to the GPU, not by
  // this CPU, so its lines need not be read for ownership nor kept in cache). Used only when
  // model_out is 64-byte aligned (pinned buffers are). Results do not depend on it. Off until the
  // GPU machine's cpu_adam_bench (out=bf16 vs bf16nt) shows it pays.
  bool stream_model_out = false;
};

// The AdamW update of n elements, in place on param/exp_avg/exp_avg_sq, reading grad; if
// model_out is not null, model_out[i] = the new param[i] as model_t (kF32: its bits; kBF16, kF16:
// rounded to nearest even). Bitwise equal to CpuDevice::AdamWCast (AdamW when model_out is null).
// pool: the threads to use (null: the calling thread alone); the call returns when all tiles are
// done. REQUIRES: the arrays do not overlap (model_out included); none is modified by anyone
// else during the call.
// Errors (nothing is written): FailedPrecondition if options.path is unavailable on this CPU
// (naming the path and the best one available); InvalidArgument for a null array with n > 0 or a
// bad model_t.
Status CpuAdamW(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, size_t n, const AdamWParams& h,
                void* model_out, DType model_t, ThreadPool* pool, const CpuAdamWOptions& options = {});

// As CpuAdamW, from bf16 gradients: each is widened in the kernel as 0.0f + g, so the result is
// bitwise WidenToF32 (zero/host_state_kernels.h: CpuDevice::AccumulateFirst) into fp32 followed by
// CpuAdamW, without the fp32 copy of the gradients (2 B per element read instead of 4 + 6).
Status CpuAdamWBf16Grad(float* param, const uint16_t* grad, float* exp_avg, float* exp_avg_sq, size_t n,
                        const AdamWParams& h, void* model_out, DType model_t, ThreadPool* pool,
                        const CpuAdamWOptions& options = {});

}  // namespace zero
