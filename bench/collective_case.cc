#include "bench/collective_case.h"

#include <cmath>

#include "runtime/error.h"

namespace cohort::bench {
namespace {

using collectives::ReduceOp;
using runtime::DType;

// Element i of rank r's contribution: small integers, so sums, maxima and minima are exact.
float inputValue(int rank, size_t i) { return static_cast<float>((rank + 1) * static_cast<int>(i % 13 + 1)); }

// The exact reduction over n ranks of element i: Σ(r+1) = n(n+1)/2, max n, min 1, times (i mod 13 + 1).
double reduced(ReduceOp op, int n, size_t i) {
  const double base = static_cast<double>(i % 13 + 1);
  switch (op) {
    case ReduceOp::kSum:
      return base * n * (n + 1) / 2;
    case ReduceOp::kAvg:
      return base * (n + 1) / 2;
    case ReduceOp::kMax:
      return base * n;
    case ReduceOp::kMin:
      return base;
  }
  return 0;
}

float get(const void* data, DType dtype, size_t i) {
  if (dtype == DType::kF32) return static_cast<const float*>(data)[i];
  return runtime::toFloat(runtime::Bf16{static_cast<const uint16_t*>(data)[i]});
}
void put(void* data, DType dtype, size_t i, float value) {
  if (dtype == DType::kF32) {
    static_cast<float*>(data)[i] = value;
  } else {
    static_cast<uint16_t*>(data)[i] = runtime::toBf16(value).bits;
  }
}

const void* at(const void* base, size_t offset) { return static_cast<const char*>(base) + offset; }
void* at(void* base, size_t offset) { return static_cast<char*>(base) + offset; }

// An average is exact when n is a power of two; otherwise sum·(1/n) may round to a neighbour.
bool matches(float got, float want, ReduceOp op, DType dtype) {
  if (got == want) return true;
  if (op != ReduceOp::kAvg) return false;
  if (dtype == DType::kBF16) return std::fabs(got - want) <= std::fabs(want) / 128;  // one bf16 ulp
  return got == std::nextafter(want, 0.0f) || got == std::nextafter(want, 2 * want);
}

}  // namespace

CollectiveKind parseCollective(const std::string& name) {
  if (name == "allreduce") return CollectiveKind::kAllReduce;
  if (name == "reducescatter") return CollectiveKind::kReduceScatter;
  if (name == "allgather") return CollectiveKind::kAllGather;
  COHORT_THROW(InvalidArgument) << "bench allreduce: unknown collective '" << name
                                << "': expected allreduce, reducescatter or allgather";
}

const char* collectiveName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return "allreduce";
    case CollectiveKind::kReduceScatter:
      return "reducescatter";
    case CollectiveKind::kAllGather:
      return "allgather";
  }
  return "?";
}

DType parseDType(const std::string& name) {
  if (name == "fp32") return DType::kF32;
  if (name == "bf16") return DType::kBF16;
  COHORT_THROW(InvalidArgument) << "bench allreduce: unknown element type '" << name << "': expected fp32 or bf16";
}

const char* dtypeShortName(DType dtype) { return dtype == DType::kF32 ? "fp32" : "bf16"; }

CaseLayout layoutOf(const CollectiveCase& c, size_t bytes, int rank, int n) {
  const size_t es = runtime::sizeOf(c.dtype), ranks = static_cast<size_t>(n);
  CaseLayout l;
  if (c.kind == CollectiveKind::kAllReduce) {
    l.count = bytes / es;
    l.wholeBytes = l.inputBytes = l.outputBytes = l.count * es;
    return l;
  }
  l.count = bytes / es / ranks;
  l.wholeBytes = l.count * es * ranks;
  const size_t chunk = l.count * es, mine = static_cast<size_t>(rank) * chunk;
  const bool scatter = c.kind == CollectiveKind::kReduceScatter;
  l.inputBytes = scatter ? l.wholeBytes : chunk;
  l.outputBytes = scatter ? chunk : l.wholeBytes;
  // NCCL's in-place layout: this rank's chunk of the full buffer.
  if (c.inPlace) (scatter ? l.outputOffset : l.inputOffset) = mine;
  return l;
}

double busFactor(CollectiveKind kind, int n) {
  const double share = static_cast<double>(n - 1) / n;
  return kind == CollectiveKind::kAllReduce ? 2 * share : share;
}

void fillInput(const CollectiveCase& c, const CaseLayout& layout, int rank, void* input) {
  void* mine = at(input, layout.inputOffset);
  const size_t elements = layout.inputBytes / runtime::sizeOf(c.dtype);
  for (size_t i = 0; i < elements; ++i) put(mine, c.dtype, i, inputValue(rank, i));
}

collectives::WorkPtr issue(collectives::Communicator& comm, const CollectiveCase& c, const CaseLayout& layout,
                           void* input, void* output) {
  void* in = at(input, layout.inputOffset);
  void* out = at(output, layout.outputOffset);
  switch (c.kind) {
    case CollectiveKind::kAllReduce:
      return comm.allReduce(in, out, layout.count, {.op = c.op, .dtype = c.dtype});
    case CollectiveKind::kReduceScatter:
      return comm.reduceScatter(in, out, layout.count, {.op = c.op, .dtype = c.dtype});
    case CollectiveKind::kAllGather:
      return comm.allGather(in, out, layout.count, {.dtype = c.dtype});
  }
  return nullptr;
}

size_t countWrong(const CollectiveCase& c, const CaseLayout& layout, int rank, int n, const void* input,
                  const void* output) {
  const size_t es = runtime::sizeOf(c.dtype);
  const void* out = at(output, layout.outputOffset);
  const size_t first = c.kind == CollectiveKind::kReduceScatter ? static_cast<size_t>(rank) * layout.count : 0;
  size_t wrong = 0;
  for (size_t i = 0; i < layout.outputBytes / es; ++i) {
    const float want = c.kind == CollectiveKind::kAllGather
                           ? inputValue(static_cast<int>(i / layout.count), i % layout.count)
                           : static_cast<float>(reduced(c.op, n, first + i));
    if (!matches(get(out, c.dtype, i), want, c.op, c.dtype)) ++wrong;
  }
  if (c.inPlace) return wrong;
  const void* in = at(input, layout.inputOffset);
  for (size_t i = 0; i < layout.inputBytes / es; ++i) {
    if (get(in, c.dtype, i) != inputValue(rank, i)) ++wrong;
  }
  return wrong;
}

}  // namespace cohort::bench
