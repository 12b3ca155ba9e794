// HostReduce: the rank-order reduction of host doubles behind Communicator::AllReduceHost, written
// once for the Gloo, NCCL and same-device communicators so that all of them give the same bits on
// every rank. Element i starts as rank 0's value; ranks 1, 2, ..., N-1 follow in order, each added
// (kSum, kAvg) or taken when larger or NaN (kMax, so a NaN wins and a tie keeps the lower rank's
// value); kAvg divides the sum by N once at the end. How the values travel is the caller's; this
// owns nothing.
#pragma once

#include <cstddef>

#include "comm/communicator.h"

namespace zero {

// acc[i] combined with the next rank's src[i], for i < n; `first` (rank 0) copies src into acc.
// Call it once per rank, in rank order.
void AccumulateHostValues(double* acc, const double* src, size_t n, ReduceOp op, bool first);

// out[i] = acc[i], divided by world_size for kAvg. `out` may be `acc`.
void FinishHostValues(const double* acc, double* out, size_t n, ReduceOp op, int world_size);

}  // namespace zero
