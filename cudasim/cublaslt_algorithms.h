// The emulated cuBLASLt's algorithms (private to cudasim/cublaslt.cc, and read by tests): which
// algorithms run a given product, the workspace and operand alignment each needs, the order the
// heuristic offers them in, and a made-up time for each, so that a caller's tuning (Cohort's
// GemmTuner, runtime/cuda/gemm_tuner.h) has several candidates to choose among and a known fastest.
//
// Six algorithms, after the real library's kinds (ids are the emulation's own):
//   0  SIMT          64 x 64 tiles on the CUDA cores: any alignment of the element type
//   1  tensor op     128 x 128 tiles
//   2  tensor op     128 x 64 tiles
//   3  tensor op     64 x 64 tiles
//   4  tensor op     64 x 64 tiles, split-K 4: partial sums in the workspace (m · n · 4 floats)
//   5  tensor op     128 x 128 tiles, split-K 2 (m · n · 2 floats of workspace)
// The tensor-op ones need 16-byte alignment of every matrix pointer and leading dimension, as the
// real tensor-core kernels do; the caller promises alignments in its preference
// (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES, 256 when unset) and cublasLtMatmul refuses
// (CUBLAS_STATUS_NOT_SUPPORTED) an algorithm whose alignment or workspace the call does not meet.
// Every algorithm computes the same numbers (cublas_gemm.h's product): the emulation does not model
// the different summation orders of real algorithms.
// Times: a made-up device with 132 multiprocessors, deterministic: overhead + waves of tiles ·
// per-tile work / rate (tensor op 8x SIMT) + split-K's partial-sum traffic. Large products favour
// 128 x 128 tiles, small ones with a long k favour split-K. The heuristic's order (1, 2, 5, 3, 4, 0)
// is not the order of the times, so tuning can beat its first choice. Only the order means anything.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cudasim::lt {

// One product as the algorithms see it: D (m x n) = op(A) (m x k) · op(B) (k x n), in elements of
// `elementBytes` (of A and B).
struct ProductSizes {
  int64_t m = 0, n = 0, k = 0;
  size_t elementBytes = 4;
};

struct Algo {
  int id;
  int tileM, tileN;
  int splitK;
  bool tensorOp;
};

inline constexpr int kAlgoCount = 6;

// Algorithm `id` (0 .. kAlgoCount - 1), else nullptr.
const Algo* algoById(int id);
// The alignment in bytes `algo` needs of every matrix pointer and leading dimension.
uint32_t alignmentNeeded(const Algo& algo, size_t elementBytes);
// The workspace `algo` needs for `sizes`, in bytes.
size_t workspaceBytes(const Algo& algo, const ProductSizes& sizes);
// The made-up time of `algo` for `sizes`, in milliseconds (see the header comment).
float modelledMs(const Algo& algo, const ProductSizes& sizes);
// The ids in the heuristic's order.
const int* heuristicOrder();

}  // namespace cudasim::lt
