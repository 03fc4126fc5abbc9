// The emulated cuBLASLt's algorithms (cudasim/cublaslt_algorithms.h).
#include "cudasim/cublaslt_algorithms.h"

#include <cmath>

namespace cudasim::lt {
namespace {

constexpr Algo kAlgos[kAlgoCount] = {
    {.id = 0, .tileM = 64, .tileN = 64, .splitK = 1, .tensorOp = false},
    {.id = 1, .tileM = 128, .tileN = 128, .splitK = 1, .tensorOp = true},
    {.id = 2, .tileM = 128, .tileN = 64, .splitK = 1, .tensorOp = true},
    {.id = 3, .tileM = 64, .tileN = 64, .splitK = 1, .tensorOp = true},
    {.id = 4, .tileM = 64, .tileN = 64, .splitK = 4, .tensorOp = true},
    {.id = 5, .tileM = 128, .tileN = 128, .splitK = 2, .tensorOp = true},
};
constexpr int kOrder[kAlgoCount] = {1, 2, 5, 3, 4, 0};

constexpr double kMultiprocessors = 132;
constexpr double kOverheadMs = 0.004;
constexpr double kTensorMacsPerMs = 4.0e9;  // per multiprocessor
constexpr double kSimtMacsPerMs = kTensorMacsPerMs / 8;
constexpr double kBytesPerMs = 3.0e9;  // split-K partial sums, written and read back

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

const Algo* algoById(int id) { return id >= 0 && id < kAlgoCount ? &kAlgos[id] : nullptr; }

uint32_t alignmentNeeded(const Algo& algo, size_t elementBytes) {
  return algo.tensorOp ? 16 : static_cast<uint32_t>(elementBytes);
}

size_t workspaceBytes(const Algo& algo, const ProductSizes& s) {
  if (algo.splitK == 1) return 0;
  return static_cast<size_t>(s.m) * static_cast<size_t>(s.n) * static_cast<size_t>(algo.splitK) * sizeof(float);
}

float modelledMs(const Algo& algo, const ProductSizes& s) {
  const int64_t tiles = ceilDiv(s.m, algo.tileM) * ceilDiv(s.n, algo.tileN) * algo.splitK;
  const double waves = std::ceil(static_cast<double>(tiles) / kMultiprocessors);
  const double tileMacs = static_cast<double>(algo.tileM) * algo.tileN * static_cast<double>(ceilDiv(s.k, algo.splitK));
  const double rate = algo.tensorOp ? kTensorMacsPerMs : kSimtMacsPerMs;
  const double reduction = 2.0 * static_cast<double>(workspaceBytes(algo, s)) / kBytesPerMs;
  return static_cast<float>(kOverheadMs + waves * tileMacs / rate + reduction);
}

const int* heuristicOrder() { return kOrder; }

}  // namespace cudasim::lt
