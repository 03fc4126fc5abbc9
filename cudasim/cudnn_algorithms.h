// The emulated cuDNN's convolution algorithms (private to cudasim/cudnn.cc): which algorithms run a
// given convolution, the workspace each asks for, the time cudnnFind*AlgorithmEx reports for it, and
// how each rounds its operands.
//
// Three families, after the real library's:
//   GEMM      IMPLICIT_GEMM, IMPLICIT_PRECOMP_GEMM and GEMM (forward), ALGO_0 and ALGO_1 (backward
//             data), ALGO_0, ALGO_1 and ALGO_3 (backward filter): every convolution; exact fp32
//             products accumulated in fp32, so results are the im2col + GEMM of cudnn.cc.
//   Winograd  WINOGRAD (3x3 kernels) and WINOGRAD_NONFUSED (3x3 and 5x5): stride 1, dilation 1, NCHW.
//   FFT       FFT (padded input at most 256 a side) and FFT_TILING: stride 1, dilation 1, NCHW.
// The real Winograd and FFT algorithms compute in a transformed domain whose fp32 rounding shows in
// the results (on an H200, WINOGRAD_NONFUSED's weight gradient of a 50 -> 100 channel 3x3 layer was
// 4.4e-4 relative from the CPU's). The emulation models that by rounding their operands to
// kWinogradBits / kFftBits mantissa bits before the same products. On that layer (tests/nn/gpu:
// gpu_layers_test) Winograd's errors are 2.1e-4 (output), 1.3e-4 (input gradient) and 2.3e-3 (weight
// gradient): all above the 1e-4 that plain fp32 accumulation keeps within, so a caller that lets
// them through where it promised fp32 accumulation is caught in every direction (the weight
// gradient's about 5x an H200's).
// Times: a made-up device, deterministic: overhead + work / rate per algorithm, where work is the
// multiply-adds (Winograd: fewer by its tile's gain; FFT: transforms and pointwise products) plus the
// workspace traffic. Small convolutions favour the GEMM family (least overhead); a 3x3 layer with
// tens of channels favours WINOGRAD_NONFUSED, and a large kernel on a large image FFT. Only the order
// of the times means anything.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "cudnn.h"

namespace cudasim::dnn {

// One convolution's sizes: x [n, c, h, w], w [k, c, r, s], y [n, k, outH, outW].
struct ConvSizes {
  int64_t n = 0, c = 0, h = 0, w = 0, k = 0, r = 0, s = 0, outH = 0, outW = 0;
  int64_t padH = 0, padW = 0, strideH = 1, strideW = 1, dilationH = 1, dilationW = 1;
  bool nchw = true;  // x, w and y in NCHW / KCRS (else NHWC / KRSC)
};

enum class Direction { kForward, kBackwardData, kBackwardFilter };
enum class Family { kGemm, kWinograd, kFft };

// Mantissa bits (of fp32's 23) the Winograd and FFT algorithms keep of their operands.
inline constexpr int kWinogradBits = 14;
inline constexpr int kFftBits = 15;

struct Algo {
  int id;
  Family family;
  cudnnDeterminism_t determinism;
};

// The direction's algorithm ids are 0 .. algoCount() - 1.
int algoCount(Direction d);
// Algorithm `id` (in range) when the emulation runs it for `sizes`, else nullptr.
const Algo* runnable(Direction d, int id, const ConvSizes& sizes);
// The workspace `algo` needs for `sizes`, in bytes.
size_t workspaceBytes(Direction d, const Algo& algo, const ConvSizes& sizes);
// What cudnnFind*AlgorithmEx reports for `algo`, in milliseconds (see the header comment).
float modelledMs(Direction d, const Algo& algo, const ConvSizes& sizes);
// The mantissa bits `algo` keeps of its operands (23: all of fp32).
int keptBits(const Algo& algo);
// The direction's ids in the heuristics' order (the GEMM family first); `ids` holds algoCount().
void heuristicOrder(Direction d, int* ids);

// v rounded to `bits` explicit mantissa bits (nearest, ties to even); Inf and NaN unchanged.
float roundMantissa(float v, int bits);

// One entry of a heuristics' or Find's answer.
template <class Perf>
Perf perfOf(int id, cudnnStatus_t status, float time, size_t memory, cudnnDeterminism_t determinism,
            cudnnMathType_t math) {
  Perf p{};
  p.algo = static_cast<decltype(p.algo)>(id);
  p.status = status;
  p.time = time;
  p.memory = memory;
  p.determinism = determinism;
  p.mathType = math;
  return p;
}

// The _v7 heuristics' answer: the algorithms that run this geometry in the heuristic order (the GEMM
// family first), then the others as unsupported, up to `requested`.
template <class Perf>
cudnnStatus_t heuristics(Direction d, const ConvSizes& z, cudnnMathType_t math, int requested, int* returned,
                         Perf* results) {
  if (requested < 1 || !returned || !results) return CUDNN_STATUS_BAD_PARAM;
  std::vector<int> order(static_cast<size_t>(algoCount(d)));
  heuristicOrder(d, order.data());
  std::vector<Perf> answer;
  for (int id : order) {
    if (const Algo* a = runnable(d, id, z)) {
      answer.push_back(perfOf<Perf>(id, CUDNN_STATUS_SUCCESS, -1.0f, workspaceBytes(d, *a, z), a->determinism, math));
    }
  }
  for (int id : order) {
    if (!runnable(d, id, z)) {
      answer.push_back(perfOf<Perf>(id, CUDNN_STATUS_NOT_SUPPORTED, -1.0f, 0, CUDNN_DETERMINISTIC, math));
    }
  }
  *returned = std::min(requested, static_cast<int>(answer.size()));
  std::copy_n(answer.begin(), *returned, results);
  return CUDNN_STATUS_SUCCESS;
}

// cudnnFind*AlgorithmEx's answer: every algorithm with the time the model gives it, fastest first
// (ties in id order), then those that cannot run (time -1): unsupported for the geometry (memory 0),
// or needing more than the `workspace` bytes given (memory: what it needs), up to `requested`.
template <class Perf>
void measured(Direction d, const ConvSizes& z, cudnnMathType_t math, size_t workspace, int requested, int* returned,
              Perf* results) {
  std::vector<Perf> ran, failed;
  for (int id = 0; id < algoCount(d); ++id) {
    const Algo* a = runnable(d, id, z);
    const size_t memory = a ? workspaceBytes(d, *a, z) : 0;
    if (a && memory <= workspace) {
      ran.push_back(perfOf<Perf>(id, CUDNN_STATUS_SUCCESS, modelledMs(d, *a, z), memory, a->determinism, math));
    } else {
      failed.push_back(
          perfOf<Perf>(id, CUDNN_STATUS_NOT_SUPPORTED, -1.0f, memory, a ? a->determinism : CUDNN_DETERMINISTIC, math));
    }
  }
  std::stable_sort(ran.begin(), ran.end(), [](const Perf& a, const Perf& b) { return a.time < b.time; });
  ran.insert(ran.end(), failed.begin(), failed.end());
  *returned = std::min(requested, static_cast<int>(ran.size()));
  std::copy_n(ran.begin(), *returned, results);
}

}  // namespace cudasim::dnn
