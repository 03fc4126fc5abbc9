#include "runtime/cpu/blas.h"

#include <cstdlib>

#include COHORT_CBLAS_HEADER

#include "runtime/error.h"

namespace cohort::runtime::cpu {

void gemm(const GemmOptions& o, const float* a, const float* b, float* c) {
  if (o.m == 0 || o.n == 0) return;
  int lda = o.transA ? o.m : o.k;
  int ldb = o.transB ? o.k : o.n;
  cblas_sgemm(CblasRowMajor, o.transA ? CblasTrans : CblasNoTrans, o.transB ? CblasTrans : CblasNoTrans,
              o.m, o.n, o.k, o.alpha, a, lda, b, ldb, o.beta, c, o.n);
}

void setBlasThreads(int threads) {
  if (threads < 1) COHORT_THROW(InvalidArgument) << "--threads must be at least 1, got " << threads;
  openblas_set_num_threads(threads);
}

int blasThreads() { return openblas_get_num_threads(); }

BlasThreadsScope::BlasThreadsScope(int threads) : previous_(blasThreads()) {
  if (threads != previous_) setBlasThreads(threads);
}

BlasThreadsScope::~BlasThreadsScope() {
  if (blasThreads() != previous_) openblas_set_num_threads(previous_);
}

std::string blasDescription() {
  // OpenBLAS (DYNAMIC_ARCH) picks its kernels when it is loaded, from OPENBLAS_CORETYPE if set,
  // else from its own CPU detection; say which, since it decides the GEMM rate.
  const char* core = openblas_get_corename();
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  std::string how = forced && *forced ? ", forced by OPENBLAS_CORETYPE" : ", detected";
  return std::string(openblas_get_config()) + " (kernels " + (core ? core : "?") + how + ")";
}

}  // namespace cohort::runtime::cpu
