#include <sstream>

#include "collectives/communicator.h"

namespace cohort::collectives {

const char* toString(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "?";
}

const char* toString(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce: return "allreduce";
    case CollectiveKind::kReduceScatter: return "reducescatter";
    case CollectiveKind::kAllGather: return "allgather";
    case CollectiveKind::kBroadcast: return "broadcast";
    case CollectiveKind::kBarrier: return "barrier";
  }
  return "?";
}

bool Fingerprint::operator==(const Fingerprint& o) const {
  return sequence == o.sequence && kind == o.kind && op == o.op && dtype == o.dtype && root == o.root &&
         count == o.count;
}

std::string Fingerprint::str() const {
  std::ostringstream os;
  os << "#" << sequence << " " << toString(kind) << "(";
  if (kind == CollectiveKind::kAllReduce || kind == CollectiveKind::kReduceScatter) os << toString(op) << ", ";
  if (kind == CollectiveKind::kBroadcast) os << "root " << root << ", ";
  // The element type as the messages have always named fp32 (tests and logs match on it).
  os << (dtype == runtime::DType::kBF16 ? "bfloat16, " : "float32, ") << count << " elements)";
  return os.str();
}

}  // namespace cohort::collectives
