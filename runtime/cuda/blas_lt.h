// LtMatmul: the cuBLASLt side of Blas::gemmFused (runtime/cuda/kernels.h). It owns a cuBLASLt handle
// and workspace, builds the descriptors for each call (the bias and aux pointers are attributes of
// the operation), and keeps cuBLASLt's heuristic answer per shape, type, epilogue and operand
// alignment: the first call of a shape asks (a few microseconds of host time), later ones look it
// up. Internal to //runtime. Thread safety: one thread at a time, as its Blas.
#pragma once

#include <cublasLt.h>

#include <cstddef>
#include <map>
#include <memory>
#include <tuple>

#include "runtime/cuda/kernels.h"

namespace cohort::runtime::cuda {

struct CublasLtLibrary;  // cublaslt_library.h

// Like throwCudaError, for a cuBLAS or cuBLASLt status: "<library> error <name> (<description>) from
// <call> at <file>:<line>", as OutOfMemory for CUBLAS_STATUS_ALLOC_FAILED, else as Error.
[[noreturn]] void throwBlasError(const char* library, const char* name, const char* description,
                                 cublasStatus_t status, const char* call, const char* file, int line);

struct FusedGemm {
  GemmOptions options;
  GemmEpilogue epilogue = GemmEpilogue::kBias;
  DType type = DType::kF32;
  bool tf32 = false;
};

class LtMatmul {
 public:
  // Loads cuBLASLt (IoError when it cannot) and makes a handle on the stream's device, which must
  // be current.
  explicit LtMatmul(const Stream& stream);
  ~LtMatmul();
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;

  // Blas::gemmFused's contract, its arguments checked there.
  bool run(const FusedGemm& gemm, const void* a, const void* b, void* c, const EpilogueOperands& operands);

 private:
  struct Choice {
    bool supported = false;
    cublasLtMatmulAlgo_t algo{};
    size_t workspaceBytes = 0;
  };
  // m, n, k, transA, transB, epilogue, type, tf32, and the alignments of A, B, C, bias and aux.
  using Key = std::tuple<int, int, int, bool, bool, int, int, bool, int, int, int, int, int>;

  const Stream& stream_;
  std::unique_ptr<const CublasLtLibrary> lt_;
  cublasLtHandle_t handle_ = nullptr;
  std::map<Key, Choice> choices_;
  void* workspace_ = nullptr;
  size_t workspaceBytes_ = 0;

  void reserveWorkspace(size_t bytes);
};

}  // namespace cohort::runtime::cuda
