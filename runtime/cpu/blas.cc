#include "runtime/cpu/blas.h"

#include <dnnl.h>
#include <omp.h>

#include <atomic>

#include "runtime/error.h"

namespace cohort::runtime::cpu {

namespace {
std::atomic<int> gThreads{1};  // setBlasThreads(); each calling thread applies it to its OpenMP ICV
}  // namespace

void gemm(const GemmOptions& o, const float* a, const float* b, float* c) {
  if (o.m == 0 || o.n == 0) return;
  // oneDNN's sgemm splits work over omp_get_max_threads() of the calling thread, a per-thread
  // setting: bring this thread's to the process's count (once per change, not per call).
  thread_local int ompThreads = 0;
  const int want = gThreads.load(std::memory_order_relaxed);
  if (ompThreads != want) {
    omp_set_num_threads(want);
    ompThreads = want;
  }
  const int lda = o.transA ? o.m : o.k;
  const int ldb = o.transB ? o.k : o.n;
  const dnnl_status_t status = dnnl_sgemm(o.transA ? 'T' : 'N', o.transB ? 'T' : 'N', o.m, o.n, o.k, o.alpha, a, lda,
                                          b, ldb, o.beta, c, o.n);
  COHORT_CHECK(status == dnnl_success) << "dnnl_sgemm(" << o.m << "x" << o.n << "x" << o.k << ") failed with status "
                                       << static_cast<int>(status);
}

void setBlasThreads(int threads) {
  if (threads < 1) COHORT_THROW(InvalidArgument) << "--threads must be at least 1, got " << threads;
  gThreads.store(threads, std::memory_order_relaxed);
}

int blasThreads() { return gThreads.load(std::memory_order_relaxed); }

BlasThreadsScope::BlasThreadsScope(int threads) : previous_(blasThreads()) {
  if (threads != previous_) setBlasThreads(threads);
}

BlasThreadsScope::~BlasThreadsScope() {
  if (blasThreads() != previous_) gThreads.store(previous_, std::memory_order_relaxed);
}

namespace {
const char* isaName(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_sse41: return "SSE4.1";
    case dnnl_cpu_isa_avx: return "AVX";
    case dnnl_cpu_isa_avx2: return "AVX2";
    case dnnl_cpu_isa_avx512_core: return "AVX-512";
    case dnnl_cpu_isa_avx512_core_vnni: return "AVX-512 VNNI";
    case dnnl_cpu_isa_avx512_core_bf16: return "AVX-512 BF16";
    case dnnl_cpu_isa_avx512_core_amx: return "AVX-512 AMX";
    default: return "other";
  }
}
}  // namespace

std::string blasDescription() {
  // oneDNN picks its kernels from the CPU at run time (capped only by DNNL_MAX_CPU_ISA).
  const dnnl_version_t* v = dnnl_version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) +
         " sgemm (" + isaName(dnnl_get_effective_cpu_isa()) + ", OpenMP)";
}

}  // namespace cohort::runtime::cpu
