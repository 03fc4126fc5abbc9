// LtMatmul: the cuBLASLt side of Blas (runtime/cuda/kernels.h): every product Blas runs through
// cuBLASLt, plain or with an epilogue. It owns a cuBLASLt handle and a workspace (from the Blas's
// allocator, kept for its life: 32 MiB on sm_90 and later, as NVIDIA recommends for Hopper and
// llm.c gives it, 4 MiB before), builds the descriptors for each call (the bias and aux pointers are
// attributes of the operation), and keeps one algorithm per product: shape, transposes, types,
// epilogue, beta's use and operand alignments. The first call of a product chooses it
// (gemm_tuner.h: the fastest of the heuristic's candidates, timed on the stream, or the heuristic's
// first); later ones look it up. Internal to //runtime. Thread safety: one thread at a time, as its
// Blas.
#pragma once

#include <cublasLt.h>

#include <cstddef>
#include <map>
#include <span>
#include <memory>
#include <tuple>
#include <vector>

#include "runtime/allocator.h"
#include "runtime/cuda/kernels.h"

namespace cohort::runtime::cuda {

struct CublasLtLibrary;  // cublaslt_library.h
class GemmTimer;         // gemm_tuner.h
struct GemmCandidate;    // gemm_tuner.h

// Like throwCudaError, for a cuBLAS or cuBLASLt status: "<library> error <name> (<description>) from
// <call> at <file>:<line>", as OutOfMemory for CUBLAS_STATUS_ALLOC_FAILED, else as Error.
[[noreturn]] void throwBlasError(const char* library, const char* name, const char* description,
                                 cublasStatus_t status, const char* call, const char* file, int line);

struct FusedGemm {
  GemmOptions options;  // alpha and beta as given (beta != 0: C is read)
  GemmEpilogue epilogue = GemmEpilogue::kNone;
  GemmTypes types;
  bool tf32 = false;
};

class LtMatmul {
 public:
  // Loads cuBLASLt (IoError when it cannot) and makes a handle on the stream's device, which must
  // be current. `options` as Blas's.
  LtMatmul(const Stream& stream, const BlasOptions& options);
  ~LtMatmul();
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;

  // Blas::gemmFused's contract, its arguments checked there: false (nothing done) when cuBLASLt has
  // no algorithm for the product.
  bool run(const FusedGemm& gemm, const void* a, const void* b, void* c, const EpilogueOperands& operands);
  std::vector<GemmChoice> choices() const;
  int64_t tunings() const { return tunings_; }

 private:
  struct Choice {
    bool supported = false;
    cublasLtMatmulAlgo_t algo{};
    size_t workspaceBytes = 0;
    GemmChoice summary;
  };
  struct Descriptors;
  // m, n, k, transA, transB, epilogue, ab type, c type, tf32, beta != 0, and the alignments of A,
  // B, C, bias and aux.
  using Key = std::tuple<int, int, int, bool, bool, int, int, int, bool, bool, int, int, int, int, int>;

  Choice choose(Descriptors& d, const FusedGemm& g, const void* a, const void* b, void* c,
                const EpilogueOperands& x, bool* keep);
  size_t tune(Descriptors& d, const FusedGemm& g, const void* a, const void* b,
              std::span<const cublasLtMatmulHeuristicResult_t> candidates, const EpilogueOperands& x);
  bool launch(Descriptors& d, const FusedGemm& g, const void* a, const void* b, void* c,
              const cublasLtMatmulAlgo_t& algo);
  void ensureWorkspace();

  const Stream& stream_;
  std::unique_ptr<Allocator> ownAllocator_;  // when the options give none
  Allocator& allocator_;
  bool tune_;
  std::shared_ptr<GemmTimer> timer_;
  std::unique_ptr<const CublasLtLibrary> lt_;
  cublasLtHandle_t handle_ = nullptr;
  std::map<Key, Choice> choices_;
  int64_t tunings_ = 0;
  void* workspace_ = nullptr;
  size_t workspaceBytes_ = 0;
};

}  // namespace cohort::runtime::cuda
