#include "runtime/cpu/blas.h"

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

std::string blasDescription() {
  std::string config = openblas_get_config();
  const char* core = openblas_get_corename();
  return config + " (core " + (core ? core : "?") + ")";
}

}  // namespace cohort::runtime::cpu
