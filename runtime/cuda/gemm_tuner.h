// Choosing cuBLASLt's algorithm for a product by measuring (docs/gpu.md, "GEMM algorithms"): the
// pieces Blas (kernels.h) uses and tests reach. For each distinct product (sizes, transposes, types,
// epilogue, operand alignments) Blas asks cuBLASLt's heuristic for up to kGemmCandidates algorithms,
// times each on its stream with a GemmTimer, and keeps the fastest that ran (chooseGemmAlgorithm),
// as cuDNN's Find does for convolutions (dnn.h). Without tuning (BlasOptions::tuneGemms false:
// `--gemm-tuning off`, or COHORT_GEMM_TUNING=off without the flag; GpuOptions::tuneGemms), while the stream is being captured into a CUDA graph (measuring would
// record the timing runs into the graph), or when no candidate ran, it takes the heuristic's first.
//
// GemmTimer runs on the product's stream; EventGemmTimer synchronises with its last event (once per
// product shape, never in the steady loop). Thread safety: one thread at a time per timer.
//
//   EventGemmTimer timer(stream);
//   float ms = timer.time(candidate, [&] { return enqueueOneProduct(candidate.algo); });
#pragma once

#include <cublasLt.h>

#include <cstddef>
#include <functional>
#include <span>

#include "runtime/stream.h"

namespace cohort::runtime::cuda {

// How many of the heuristic's algorithms a product's tuning times (llm.c and PyTorch ask for 1;
// the heuristic's later ones are seldom faster beyond these).
inline constexpr int kGemmCandidates = 8;

// One algorithm the heuristic offered for a product of m x n x k (row-major C[m, n], gemm_options.h).
struct GemmCandidate {
  const cublasLtMatmulAlgo_t* algo = nullptr;
  size_t workspaceBytes = 0;
  int index = 0;  // its place in the heuristic's answer
  int m = 0, n = 0, k = 0;
  size_t elementBytes = 4;  // of A and B
};

// One candidate as timed: `ms` negative when it did not run.
struct GemmAlgoTiming {
  int index = 0;
  float ms = -1;
};

// The fastest that ran (the first of equal times, fastest.h); nullptr when none ran.
const GemmAlgoTiming* chooseGemmAlgorithm(std::span<const GemmAlgoTiming> timings);

class GemmTimer {
 public:
  virtual ~GemmTimer() = default;
  // Times `launch`, which enqueues the candidate's product on the stream and returns false when the
  // library refused it: milliseconds per product, or -1 when refused.
  virtual float time(const GemmCandidate& candidate, const std::function<bool()>& launch) = 0;
};

// CUDA events around each run on `stream`: one warm-up run, then kRepetitions timed runs, their
// median (one slow run, a clock change or another process's kernel, does not decide).
class EventGemmTimer final : public GemmTimer {
 public:
  static constexpr int kRepetitions = 3;
  explicit EventGemmTimer(const Stream& stream) : stream_(stream) {}
  float time(const GemmCandidate& candidate, const std::function<bool()>& launch) override;

 private:
  const Stream& stream_;
};

// COHORT_GEMM_TUNING: "off" or "0" turns tuning off, "on" or "1" on; unset or empty: `fallback`.
// InvalidArgument for another value.
bool gemmTuningFromEnvironment(bool fallback);

// Whether `stream` is being captured into a CUDA graph (cudaStreamIsCapturing): no tuning then.
bool streamIsCapturing(const Stream& stream);

}  // namespace cohort::runtime::cuda
