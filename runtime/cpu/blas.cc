#include "runtime/cpu/blas.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include COHORT_CBLAS_HEADER

#include "runtime/error.h"

namespace cohort::runtime::cpu {
namespace {

// OpenBLAS is opened with dlopen on first use rather than linked: its DYNAMIC_ARCH build picks its
// kernels once, when it is loaded, from OPENBLAS_CORETYPE or its own CPU detection. Debian's 0.3.21
// detects Sapphire Rapids (and other AVX-512 CPUs it does not know) as Haswell and runs AVX2
// kernels at about two thirds of the AVX-512 ones' speed; loading it ourselves lets us choose first.
// A user's OPENBLAS_CORETYPE always wins.
constexpr const char* kLibraries[] = {
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "libopenblas.so.0",
};

using SgemmFn = decltype(&cblas_sgemm);
using SetThreadsFn = decltype(&openblas_set_num_threads);
using GetThreadsFn = decltype(&openblas_get_num_threads);
using GetStringFn = char* (*)();

struct OpenBlas {
  SgemmFn sgemm = nullptr;
  SetThreadsFn setThreads = nullptr;
  GetThreadsFn getThreads = nullptr;
  GetStringFn config = nullptr;
  GetStringFn coreName = nullptr;
  std::string chosenCore;  // what we set OPENBLAS_CORETYPE to, or empty
};

bool cpuHasUsableAvx512() {
  // libgcc's checks include the OS having enabled the AVX-512 register state (XCR0).
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
}

template <class Fn>
Fn symbol(void* handle, const char* name) {
  void* p = dlsym(handle, name);
  if (!p) COHORT_THROW(Error) << "OpenBLAS lacks the symbol " << name;
  return reinterpret_cast<Fn>(p);
}

OpenBlas load() {
  OpenBlas b;
  const char* userCore = std::getenv("OPENBLAS_CORETYPE");
  if ((!userCore || !*userCore) && cpuHasUsableAvx512()) {
    b.chosenCore = "SkylakeX";
    setenv("OPENBLAS_CORETYPE", b.chosenCore.c_str(), 0);
  }
  void* handle = nullptr;
  std::string errors;
  for (const char* lib : kLibraries) {
    if ((handle = dlopen(lib, RTLD_NOW | RTLD_LOCAL))) break;
    errors += std::string(" ") + dlerror() + ";";
  }
  if (!handle) {
    COHORT_THROW(Error) << "cannot load OpenBLAS (install libopenblas0-pthread, e.g. with scripts/setup):" << errors;
  }
  b.sgemm = symbol<SgemmFn>(handle, "cblas_sgemm");
  b.setThreads = symbol<SetThreadsFn>(handle, "openblas_set_num_threads");
  b.getThreads = symbol<GetThreadsFn>(handle, "openblas_get_num_threads");
  b.config = symbol<GetStringFn>(handle, "openblas_get_config");
  b.coreName = symbol<GetStringFn>(handle, "openblas_get_corename");
  return b;  // the handle stays open for the life of the process
}

const OpenBlas& openBlas() {
  static const OpenBlas blas = load();  // immutable once loaded; C++ makes the first call thread-safe
  return blas;
}

}  // namespace

void gemm(const GemmOptions& o, const float* a, const float* b, float* c) {
  if (o.m == 0 || o.n == 0) return;
  int lda = o.transA ? o.m : o.k;
  int ldb = o.transB ? o.k : o.n;
  openBlas().sgemm(CblasRowMajor, o.transA ? CblasTrans : CblasNoTrans, o.transB ? CblasTrans : CblasNoTrans, o.m,
                   o.n, o.k, o.alpha, a, lda, b, ldb, o.beta, c, o.n);
}

void setBlasThreads(int threads) {
  if (threads < 1) COHORT_THROW(InvalidArgument) << "--threads must be at least 1, got " << threads;
  openBlas().setThreads(threads);
}

int blasThreads() { return openBlas().getThreads(); }

std::string blasDescription() {
  const OpenBlas& b = openBlas();
  std::string core = b.coreName ? b.coreName() : "?";
  std::string why = b.chosenCore.empty() ? "" : ", chosen by cohort for AVX-512";
  return std::string(b.config()) + " (kernels " + core + why + ")";
}

}  // namespace cohort::runtime::cpu
