#include "runtime/cpu/blas.h"

#include <dnnl.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <dnnl.hpp>
#include <exception>
#include <map>
#include <tuple>

#include "runtime/error.h"

namespace cohort::runtime::cpu {

namespace {
std::atomic<int> gThreads{1};   // setBlasThreads(); each calling thread applies it to its OpenMP ICV
constexpr int kMaxChunks = 64;  // parallelRange's chunks at most

// oneDNN splits work over omp_get_max_threads() of the calling thread, a per-thread setting:
// brings this thread's to the process's count (once per change, not per call) and returns it.
int applyThreads() {
  thread_local int ompThreads = 0;
  const int want = gThreads.load(std::memory_order_relaxed);
  if (ompThreads != want) {
    omp_set_num_threads(want);
    ompThreads = want;
  }
  return want;
}

// One batched matmul as oneDNN makes it for a shape, its scalars and the thread count it was made
// for (a matmul splits its work when it is made).
using MatmulKey = std::tuple<int, int, int, bool, bool, int, int64_t, int64_t, int64_t, uint32_t, uint32_t, int>;

struct Matmul {
  dnnl::memory::desc a, b, c;
  dnnl::matmul primitive;
};

struct MatmulCache {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<MatmulKey, Matmul> made;
};

// A [count, rows, cols] operand whose rows are `rowStride` apart and columns `colStride`; a batch
// stride of 0 is oneDNN's broadcast (a batch dimension of 1).
dnnl::memory::desc operand(int count, int rows, int cols, int64_t batchStride, int64_t rowStride, int64_t colStride) {
  const bool broadcast = batchStride == 0 && count > 1;
  return dnnl::memory::desc({broadcast ? 1 : count, rows, cols}, dnnl::memory::data_type::f32,
                            dnnl::memory::dims{broadcast ? int64_t{rows} * cols : batchStride, rowStride, colStride});
}

MatmulCache& matmulCache() {
  thread_local MatmulCache cache;
  return cache;
}

const Matmul& matmulFor(const GemmOptions& o, const GemmBatch& batch, int threads) {
  MatmulCache& cache = matmulCache();
  const MatmulKey key{o.m,           o.n,           o.k,
                      o.transA,      o.transB,      batch.count,
                      batch.strideA, batch.strideB, batch.strideC,
                      std::bit_cast<uint32_t>(o.alpha), std::bit_cast<uint32_t>(o.beta), threads};
  auto found = cache.made.find(key);
  if (found != cache.made.end()) return found->second;
  if (cache.made.size() >= 256) cache.made.clear();  // a bound for programs that vary shapes without end
  // op(A) is m x k: A stored m x k (rows k apart) or, transposed, k x m (op(A)'s columns m apart).
  Matmul m{.a = operand(batch.count, o.m, o.k, batch.strideA, o.transA ? 1 : o.k, o.transA ? o.m : 1),
           .b = operand(batch.count, o.k, o.n, batch.strideB, o.transB ? 1 : o.n, o.transB ? o.k : 1),
           .c = operand(batch.count, o.m, o.n, batch.strideC, o.n, 1),
           .primitive = {}};
  dnnl::primitive_attr attr;
  if (o.alpha != 1.0f) attr.set_output_scales(0, {o.alpha});
  if (o.beta != 0.0f) {
    dnnl::post_ops sum;
    sum.append_sum(o.beta);
    attr.set_post_ops(sum);
  }
  m.primitive = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(m.a, m.b, m.c), attr, cache.engine));
  return cache.made.emplace(key, std::move(m)).first->second;
}

}  // namespace

void gemmBatched(const GemmOptions& o, const GemmBatch& batch, const float* a, const float* b, float* c) {
  checkGemmBatch(o, batch);
  if (o.m == 0 || o.n == 0 || batch.count == 0) return;
  if (o.k == 0 || o.alpha == 0.0f) {  // C = beta · C; beta == 0 overwrites (NaN in C does not survive)
    for (int i = 0; i < batch.count; ++i) {
      float* ci = c + i * batch.strideC;
      for (int64_t j = 0; j < int64_t{o.m} * o.n; ++j) ci[j] = o.beta == 0.0f ? 0.0f : o.beta * ci[j];
    }
    return;
  }
  const Matmul& m = matmulFor(o, batch, applyThreads());
  MatmulCache& cache = matmulCache();
  dnnl::memory am(m.a, cache.engine, const_cast<float*>(a)), bm(m.b, cache.engine, const_cast<float*>(b)),
      cm(m.c, cache.engine, c);
  m.primitive.execute(cache.stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
  cache.stream.wait();
}

void gemm(const GemmOptions& o, const float* a, const float* b, float* c) {
  if (o.m == 0 || o.n == 0) return;
  applyThreads();
  const int lda = o.transA ? o.m : o.k;
  const int ldb = o.transB ? o.k : o.n;
  const dnnl_status_t status = dnnl_sgemm(o.transA ? 'T' : 'N', o.transB ? 'T' : 'N', o.m, o.n, o.k, o.alpha, a, lda,
                                          b, ldb, o.beta, c, o.n);
  COHORT_CHECK(status == dnnl_success) << "dnnl_sgemm(" << o.m << "x" << o.n << "x" << o.k << ") failed with status "
                                       << static_cast<int>(status);
}

int parallelChunks(int64_t n, int64_t grain) {
  const int threads = gThreads.load(std::memory_order_relaxed);
  if (threads <= 1 || n <= 0 || omp_in_parallel()) return 1;
  const int64_t most = grain > 0 ? n / grain : n;
  return static_cast<int>(std::clamp<int64_t>(most, 1, std::min(threads, kMaxChunks)));
}

void parallelRangeCall(int64_t n, int64_t grain, RangeCall call, void* body) {
  if (n <= 0) return;
  const int chunks = parallelChunks(n, grain);
  if (chunks == 1) return call(body, 0, n, 0);
  std::exception_ptr errors[kMaxChunks];
  const int team = chunks;
#pragma omp parallel num_threads(team)
  {
    const int w = omp_get_thread_num(), got = omp_get_num_threads();
    // A smaller team than asked for (the runtime's limits) takes the chunks in turn.
    for (int c = w; c < team; c += got) {
      try {
        call(body, n * c / team, n * (c + 1) / team, c);
      } catch (...) {
        errors[c] = std::current_exception();
      }
    }
  }
  for (int c = 0; c < team; ++c) {
    if (errors[c]) std::rethrow_exception(errors[c]);
  }
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
