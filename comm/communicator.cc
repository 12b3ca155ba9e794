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

std::string TimeoutText(std::chrono::milliseconds t) { return std::to_string(t.count()) + " ms"; }

void Communicator::ReportFault(const Status& /*error*/) {}

}  // namespace zero
