#include "comm/communicator.h"

namespace zero {

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
  }
  return "unknown";
}

void Communicator::ReportFault(const Status& /*error*/) {}

}  // namespace zero
