#include "comm/host_reduce.h"

namespace zero {

void AccumulateHostValues(double* acc, const double* src, size_t n, ReduceOp op, bool first) {
  for (size_t i = 0; i < n; ++i) {
    if (first) {
      acc[i] = src[i];
    } else if (op == ReduceOp::kMax) {
      if (src[i] > acc[i] || src[i] != src[i]) acc[i] = src[i];
    } else {
      acc[i] += src[i];
    }
  }
}

void FinishHostValues(const double* acc, double* out, size_t n, ReduceOp op, int world_size) {
  for (size_t i = 0; i < n; ++i) out[i] = op == ReduceOp::kAvg ? acc[i] / world_size : acc[i];
}

}  // namespace zero
