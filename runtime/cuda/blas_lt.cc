// LtMatmul (runtime/cuda/blas_lt.h): Blas::gemmFused through cuBLASLt.
#include "runtime/cuda/blas_lt.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <utility>

#include "runtime/cuda/cublaslt_library.h"
#include "runtime/cuda/caching_allocator.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/gemm_tuner.h"
#include "runtime/error.h"
#include "runtime/gpu_scratch.h"

namespace cohort::runtime::cuda {
namespace {

[[noreturn]] void throwLtError(const CublasLtLibrary& lt, cublasStatus_t status, const char* call, const char* file,
                               int line) {
  throwBlasError("cuBLASLt", lt.getStatusName(status), lt.getStatusString(status), status, call, file, line);
}

#define COHORT_CUBLASLT_CHECK(lt, expr)                                                                   \
  do {                                                                                                    \
    cublasStatus_t cohort_lt_status_ = (expr);                                                            \
    if (__builtin_expect(cohort_lt_status_ != CUBLAS_STATUS_SUCCESS, 0)) {                                \
      throwLtError((lt), cohort_lt_status_, #expr, __FILE__, __LINE__);                                   \
    }                                                                                                     \
  } while (0)

// The largest power of two up to 256 that divides the address (cuBLASLt's own bound).
int alignmentOf(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  return address == 0 ? 256 : static_cast<int>(std::min<uintptr_t>(256, address & (~address + 1)));
}

// Blas's A is cuBLASLt's B (the swap below), so a bias gradient over op(A)'s rows is BGRADB.
cublasLtEpilogue_t ltEpilogue(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::kNone:
      return CUBLASLT_EPILOGUE_DEFAULT;
    case GemmEpilogue::kBiasGrad:
      return CUBLASLT_EPILOGUE_BGRADB;
    case GemmEpilogue::kBias:
      return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::kBiasGelu:
      return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case GemmEpilogue::kGeluGrad:
      return CUBLASLT_EPILOGUE_DGELU;
  }
  COHORT_CHECK(false) << "unknown epilogue";
  return CUBLASLT_EPILOGUE_DEFAULT;
}

cudaDataType dataType(DType t) { return t == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F; }

bool writesAux(GemmEpilogue e) { return e == GemmEpilogue::kBiasGelu; }
bool usesBias(GemmEpilogue e) {
  return e == GemmEpilogue::kBias || e == GemmEpilogue::kBiasGelu || e == GemmEpilogue::kBiasGrad;
}

// Device bytes from an allocator for the scope (the timing runs' outputs).
class Scratch {
 public:
  Scratch(Allocator& allocator, size_t bytes) : allocator_(allocator), bytes_(bytes) {
    p_ = allocator.allocate(bytes);
  }
  ~Scratch() { allocator_.deallocate(p_, bytes_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* get() const { return p_; }

 private:
  Allocator& allocator_;
  size_t bytes_;
  void* p_ = nullptr;
};

}  // namespace

// One call's descriptors, destroyed with it. Row-major C[m, n] is column-major Cᵀ[n, m], computed as
// op(B)ᵀ · op(A)ᵀ (Blas::gemm's swap): cuBLASLt's A is B's memory, its B is A's, its D has n rows, so
// the bias (one per row of D) is one per column of C, a bias gradient over op(A)'s rows is one per
// column of D (BGRADB), and the aux matrix has C's layout.
struct LtMatmul::Descriptors {
  const CublasLtLibrary& lt;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;

  Descriptors(const CublasLtLibrary& library, const FusedGemm& g, const EpilogueOperands& x) : lt(library) {
    const GemmOptions& o = g.options;
    const cudaDataType ab = dataType(g.types.ab), cd = dataType(g.types.c);
    const cublasComputeType_t compute =
        g.types.ab == DType::kF32 && g.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    COHORT_CUBLASLT_CHECK(lt, lt.matmulDescCreate(&op, compute, CUDA_R_32F));
    const int32_t transA = o.transB ? CUBLAS_OP_T : CUBLAS_OP_N, transB = o.transA ? CUBLAS_OP_T : CUBLAS_OP_N;
    const uint32_t epilogue = ltEpilogue(g.epilogue);
    set(CUBLASLT_MATMUL_DESC_TRANSA, &transA, sizeof transA);
    set(CUBLASLT_MATMUL_DESC_TRANSB, &transB, sizeof transB);
    set(CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue);
    if (usesBias(g.epilogue)) {
      const int32_t biasType = cd;
      setBias(x.bias);
      set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &biasType, sizeof biasType);
    }
    if (g.epilogue == GemmEpilogue::kBiasGelu || g.epilogue == GemmEpilogue::kGeluGrad) {
      const int64_t auxLd = o.n;
      setAux(x.aux);
      set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &auxLd, sizeof auxLd);
    }
    COHORT_CUBLASLT_CHECK(lt, lt.matrixLayoutCreate(&a, ab, o.transB ? o.k : o.n, o.transB ? o.n : o.k,
                                                    o.transB ? o.k : o.n));
    COHORT_CUBLASLT_CHECK(lt, lt.matrixLayoutCreate(&b, ab, o.transA ? o.m : o.k, o.transA ? o.k : o.m,
                                                    o.transA ? o.m : o.k));
    COHORT_CUBLASLT_CHECK(lt, lt.matrixLayoutCreate(&d, cd, o.n, o.m, o.n));
  }

  ~Descriptors() {
    if (preference) lt.matmulPreferenceDestroy(preference);
    for (cublasLtMatrixLayout_t l : {a, b, d}) {
      if (l) lt.matrixLayoutDestroy(l);
    }
    if (op) lt.matmulDescDestroy(op);
  }

  void set(cublasLtMatmulDescAttributes_t attribute, const void* value, size_t bytes) {
    COHORT_CUBLASLT_CHECK(lt, lt.matmulDescSetAttribute(op, attribute, value, bytes));
  }
  void setBias(const void* bias) { set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias); }
  void setAux(const void* aux) { set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux); }

  // Up to `count` of the heuristic's algorithms for operands of these alignments (A and B as
  // cuBLASLt names them) within `workspace` bytes, in its order; none: an empty answer.
  std::vector<cublasLtMatmulHeuristicResult_t> ask(cublasLtHandle_t handle, uint32_t alignA, uint32_t alignB,
                                                   uint32_t alignD, size_t workspace, int count) {
    COHORT_CUBLASLT_CHECK(lt, lt.matmulPreferenceCreate(&preference));
    const uint64_t workspaceLimit = workspace;
    COHORT_CUBLASLT_CHECK(lt, lt.matmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                              &workspaceLimit, sizeof workspaceLimit));
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignA},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignB},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignD},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignD}};
    for (const auto& [attribute, bytes] : alignments) {
      COHORT_CUBLASLT_CHECK(lt, lt.matmulPreferenceSetAttribute(preference, attribute, &bytes, sizeof bytes));
    }
    std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(count));
    int found = 0;
    const cublasStatus_t status =
        lt.matmulAlgoGetHeuristic(handle, op, a, b, d, d, preference, count, results.data(), &found);
    if (status != CUBLAS_STATUS_SUCCESS && status != CUBLAS_STATUS_NOT_SUPPORTED) {
      throwLtError(lt, status, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
    }
    results.resize(status == CUBLAS_STATUS_SUCCESS ? static_cast<size_t>(std::max(found, 0)) : 0);
    return results;
  }
};

void throwBlasError(const char* library, const char* name, const char* description, cublasStatus_t status,
                    const char* call, const char* file, int line) {
  cudaGetLastError();  // a failed launch inside the library must not be reported again by the next check
  std::ostringstream os;
  os << library << " error " << name << " (" << description << ") from " << call << " at " << file << ":" << line;
  if (status == CUBLAS_STATUS_ALLOC_FAILED) throw OutOfMemory(os.str());
  throw Error(os.str());
}

LtMatmul::LtMatmul(const Stream& stream, const BlasOptions& options)
    : stream_(stream),
      ownAllocator_(options.allocator ? nullptr : std::make_unique<CudaCachingAllocator>(stream.device())),
      allocator_(options.allocator ? *options.allocator : *ownAllocator_),
      tune_(options.tuneGemms),
      timer_(options.timer ? options.timer : std::make_shared<EventGemmTimer>(stream)),
      lt_(std::make_unique<const CublasLtLibrary>()) {
  COHORT_CUBLASLT_CHECK(*lt_, lt_->create(&handle_));
}

LtMatmul::~LtMatmul() {
  // Called by ~Blas with the device current; a destructor must not throw, so failures are ignored.
  if (workspace_) allocator_.deallocate(workspace_, workspaceBytes_);
  lt_->destroy(handle_);
}

// Once, at the first product: never grown, so no product waits for a free, and a captured one
// never allocates.
void LtMatmul::ensureWorkspace() {
  if (workspace_) return;
  cudaDeviceProp prop{};
  COHORT_CUDA_CHECK(cudaGetDeviceProperties(&prop, stream_.device().index));
  const size_t bytes = cublasLtWorkspaceBytes(prop.major);  // runtime/gpu_scratch.h: the memory floor counts it
  workspace_ = allocator_.allocate(bytes);
  workspaceBytes_ = bytes;
}

bool LtMatmul::launch(Descriptors& d, const FusedGemm& g, const void* a, const void* b, void* c,
                      const cublasLtMatmulAlgo_t& algo) {
  const float alpha = g.options.alpha, beta = g.options.beta;
  const cublasStatus_t status =
      lt_->matmul(handle_, d.op, &alpha, b, d.a, a, d.b, &beta, c, d.d, c, d.d, &algo, workspace_, workspaceBytes_,
                  static_cast<cudaStream_t>(stream_.native()));
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return false;
  if (status != CUBLAS_STATUS_SUCCESS) throwLtError(*lt_, status, "cublasLtMatmul", __FILE__, __LINE__);
  return true;
}

// Times every candidate on scratch outputs (C, and the aux or bias gradient an epilogue writes:
// the caller's may hold accumulated values) and returns the index of the fastest that ran, else 0.
size_t LtMatmul::tune(Descriptors& d, const FusedGemm& g, const void* a, const void* b,
                      std::span<const cublasLtMatmulHeuristicResult_t> candidates, const EpilogueOperands& x) {
  const GemmOptions& o = g.options;
  const size_t cBytes = static_cast<size_t>(o.m) * static_cast<size_t>(o.n) * sizeOf(g.types.c);
  Scratch out(allocator_, cBytes);
  Scratch aux(allocator_, writesAux(g.epilogue) ? cBytes : 0);
  Scratch bias(allocator_, g.epilogue == GemmEpilogue::kBiasGrad ? static_cast<size_t>(o.m) * sizeOf(g.types.c) : 0);
  if (writesAux(g.epilogue)) d.setAux(aux.get());
  if (g.epilogue == GemmEpilogue::kBiasGrad) d.setBias(bias.get());
  std::vector<GemmAlgoTiming> timings;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const GemmCandidate candidate{.algo = &candidates[i].algo, .workspaceBytes = candidates[i].workspaceSize,
                                  .index = static_cast<int>(i), .m = o.m, .n = o.n, .k = o.k,
                                  .elementBytes = sizeOf(g.types.ab)};
    const float ms = timer_->time(candidate, [&] { return launch(d, g, a, b, out.get(), candidates[i].algo); });
    timings.push_back({.index = static_cast<int>(i), .ms = ms});
  }
  if (writesAux(g.epilogue)) d.setAux(x.aux);
  if (g.epilogue == GemmEpilogue::kBiasGrad) d.setBias(x.bias);
  ++tunings_;
  const GemmAlgoTiming* best = chooseGemmAlgorithm(timings);
  return best ? static_cast<size_t>(best->index) : 0;  // none ran: the heuristic's first, as untuned
}

// The algorithm for a product not seen before: the fastest of the heuristic's candidates where
// tuning is on and the stream is not being captured, else its first. *keep: whether the choice is
// final (a choice made during capture is not: the next uncaptured call tunes).
LtMatmul::Choice LtMatmul::choose(Descriptors& d, const FusedGemm& g, const void* a, const void* b, void* c,
                                  const EpilogueOperands& x, bool* keep) {
  const bool capturing = streamIsCapturing(stream_);
  const bool tuning = tune_ && !capturing;
  *keep = tuning || !tune_;
  const auto candidates =
      d.ask(handle_, alignmentOf(b), alignmentOf(a), alignmentOf(c), workspaceBytes_, tuning ? kGemmCandidates : 1);
  Choice choice;
  const GemmOptions& o = g.options;
  choice.summary = {.m = o.m, .n = o.n, .k = o.k, .epilogue = g.epilogue, .candidates = static_cast<int>(candidates.size())};
  if (candidates.empty()) return choice;
  const size_t pick = tuning && candidates.size() > 1 ? tune(d, g, a, b, candidates, x) : 0;
  choice.supported = true;
  choice.algo = candidates[pick].algo;
  choice.workspaceBytes = candidates[pick].workspaceSize;
  int32_t id = -1;
  size_t written = 0;
  COHORT_CUBLASLT_CHECK(*lt_, lt_->matmulAlgoConfigGetAttribute(&choice.algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id,
                                                                &written));
  choice.summary.algorithm = id;
  choice.summary.tuned = tuning && candidates.size() > 1;
  choice.summary.workspaceBytes = choice.workspaceBytes;
  return choice;
}

bool LtMatmul::run(const FusedGemm& g, const void* a, const void* b, void* c, const EpilogueOperands& x) {
  const GemmOptions& o = g.options;
  ensureWorkspace();
  Descriptors descriptors(*lt_, g, x);
  const Key key{o.m, o.n, o.k, o.transA, o.transB, static_cast<int>(g.epilogue), static_cast<int>(g.types.ab),
                static_cast<int>(g.types.c), g.tf32, o.beta != 0.0f, alignmentOf(a), alignmentOf(b), alignmentOf(c),
                alignmentOf(x.bias), alignmentOf(x.aux)};
  auto it = choices_.find(key);
  Choice provisional;
  const Choice* choice = it != choices_.end() ? &it->second : nullptr;
  if (!choice) {
    bool keep = false;
    provisional = choose(descriptors, g, a, b, c, x, &keep);
    choice = keep ? &choices_.emplace(key, provisional).first->second : &provisional;
  }
  if (!choice->supported) return false;
  // The heuristic offered it for these alignments and this workspace: a refusal now is a bug.
  COHORT_CHECK(launch(descriptors, g, a, b, c, choice->algo))
      << "cuBLASLt refused the algorithm its heuristic chose for " << o.m << " x " << o.n << " x " << o.k;
  return true;
}

std::vector<GemmChoice> LtMatmul::choices() const {
  std::vector<GemmChoice> out;
  for (const auto& [key, choice] : choices_) out.push_back(choice.summary);
  return out;
}

}  // namespace cohort::runtime::cuda
