// cudasim's cuBLAS (cudasim/cublas.cc): SGEMM (one, or a strided batch) and SSCAL give the reference
// BLAS's results under the real argument conventions (column-major, leading dimensions, transposes,
// alpha/beta, strides, pointer and math modes), in stream order; bad arguments are the real statuses,
// and batches the real library would run out of memory or into each other are refused; and the
// mistake issue 17 names, a transposed cuBLAS argument, gives a wrong result rather than a silently
// right one.
// Most data are small integers and halves, so every product and partial sum is exact in any order:
// the emulation (oneDNN's sgemm, fp32, its own summation order) and the double-accumulating
// reference here give equal bits. The inexact-data tests compare within a relative 1e-5 instead,
// on positive data, so that no cancellation turns float rounding into a large relative error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cublas_v2.h"

namespace {

// A device copy of a host vector of floats.
class DeviceFloats {
 public:
  explicit DeviceFloats(const std::vector<float>& host) : n_(host.size()) {
    EXPECT_EQ(cudaMalloc(&p_, n_ * sizeof(float)), cudaSuccess);
    upload(host);
  }
  ~DeviceFloats() { cudaFree(p_); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;

  float* get() const { return p_; }
  void upload(const std::vector<float>& host) const {
    ASSERT_EQ(host.size(), n_);
    ASSERT_EQ(cudaMemcpy(p_, host.data(), n_ * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  }
  // Waits for the default stream's work (the handle's stream when none was set), then copies.
  std::vector<float> download() const {
    std::vector<float> host(n_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(host.data(), p_, n_ * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

 private:
  size_t n_;
  float* p_ = nullptr;
};

// n values cycling through -3 .. 3 from `seed`: exact in any sum of a few products.
std::vector<float> smallIntegers(size_t n, int seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(static_cast<int>((i * 5 + seed * 3) % 7) - 3);
  return v;
}

// The reference: C = alpha · op(A) · op(B) + beta · C, column-major, as the reference BLAS defines it.
struct GemmCase {
  bool transA = false, transB = false;
  int m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  float alpha = 1, beta = 0;
};

// n values in [0.5, 1.5), none exactly representable in few bits: sums of them round.
std::vector<float> fractions(size_t n, int seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 0.5f + static_cast<float>(std::fmod(i * 0.6180339887 + seed * 0.137, 1.0));
  return v;
}

// x rounded to TF32's 10 explicit mantissa bits, to nearest with ties to even (the default rounding
// mode of nearbyint), written apart from the emulation's bit manipulation.
float tf32(float x) {
  if (x == 0.0f || !std::isfinite(x)) return x;
  int exponent = 0;
  const double mantissa = std::frexp(static_cast<double>(x), &exponent);  // in [0.5, 1): 11 bits kept
  return static_cast<float>(std::ldexp(std::nearbyint(std::ldexp(mantissa, 11)), exponent - 11));
}

std::vector<float> tf32(std::vector<float> v) {
  for (float& x : v) x = tf32(x);
  return v;
}

// Every element within a relative `rel` of the reference's (exactly 0 where the reference is 0).
void expectWithin(const std::vector<float>& got, const std::vector<float>& want, double rel, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_LE(std::abs(static_cast<double>(got[i]) - want[i]), rel * std::abs(want[i])) << what << " element " << i;
  }
}

std::vector<float> referenceGemm(const GemmCase& g, const std::vector<float>& a, const std::vector<float>& b,
                                 std::vector<float> c) {
  for (int j = 0; j < g.n; ++j) {
    for (int i = 0; i < g.m; ++i) {
      double sum = 0;
      for (int p = 0; p < g.k; ++p) {
        const double aip = g.transA ? a[p + i * g.lda] : a[i + p * g.lda];
        const double bpj = g.transB ? b[j + p * g.ldb] : b[p + j * g.ldb];
        sum += aip * bpj;
      }
      c[i + j * g.ldc] = static_cast<float>(g.alpha * sum + g.beta * c[i + j * g.ldc]);
    }
  }
  return c;
}

class Handle {
 public:
  Handle() { EXPECT_EQ(cublasCreate(&h_), CUBLAS_STATUS_SUCCESS); }
  ~Handle() { cublasDestroy(h_); }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  cublasHandle_t get() const { return h_; }

 private:
  cublasHandle_t h_ = nullptr;
};

cublasOperation_t op(bool transpose) { return transpose ? CUBLAS_OP_T : CUBLAS_OP_N; }

// Runs `g` through cublasSgemm on buffers sized for its leading dimensions, returning C.
cublasStatus_t deviceGemm(const Handle& h, const GemmCase& g, const std::vector<float>& a, const std::vector<float>& b,
                          const std::vector<float>& c, std::vector<float>* out) {
  DeviceFloats da(a), db(b), dc(c);
  const cublasStatus_t s = cublasSgemm(h.get(), op(g.transA), op(g.transB), g.m, g.n, g.k, &g.alpha, da.get(), g.lda,
                                       db.get(), g.ldb, &g.beta, dc.get(), g.ldc);
  *out = dc.download();
  return s;
}

// Operands for the case. op(A) is m x k, so A is stored lda x k (N) or lda x m (T); the buffers hold
// lda x max(m, k) (likewise B), so that reading them with the other transpose stays inside them.
struct Operands {
  std::vector<float> a, b, c;
};
Operands operandsFor(const GemmCase& g) {
  return {smallIntegers(static_cast<size_t>(g.lda) * std::max(g.m, g.k), 1),
          smallIntegers(static_cast<size_t>(g.ldb) * std::max(g.k, g.n), 2),
          smallIntegers(static_cast<size_t>(g.ldc) * g.n, 3)};
}

TEST(CudasimCublas, SgemmMatchesTheReferenceForEveryTransposeWithPaddedLeadingDimensions) {
  Handle h;
  for (bool transA : {false, true}) {
    for (bool transB : {false, true}) {
      GemmCase g{.transA = transA, .transB = transB, .m = 3, .n = 4, .k = 5, .alpha = 1.5f, .beta = -0.5f};
      g.lda = (transA ? g.k : g.m) + 2;
      g.ldb = (transB ? g.n : g.k) + 1;
      g.ldc = g.m + 3;
      const Operands o = operandsFor(g);
      std::vector<float> got;
      ASSERT_EQ(deviceGemm(h, g, o.a, o.b, o.c, &got), CUBLAS_STATUS_SUCCESS);
      // Exact, the padding rows of C included: they must be left as they were.
      EXPECT_EQ(got, referenceGemm(g, o.a, o.b, o.c)) << "transA " << transA << " transB " << transB;
    }
  }
}

TEST(CudasimCublas, BetaZeroOverwritesNaNAndAlphaZeroScalesC) {
  Handle h;
  GemmCase g{.m = 2, .n = 3, .k = 4, .lda = 2, .ldb = 4, .ldc = 2, .alpha = 1.0f, .beta = 0.0f};
  const Operands o = operandsFor(g);
  std::vector<float> got;
  ASSERT_EQ(deviceGemm(h, g, o.a, o.b, std::vector<float>(6, NAN), &got), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(got, referenceGemm(g, o.a, o.b, std::vector<float>(6, 0.0f)));
  g.alpha = 0.0f;
  g.beta = 2.0f;
  ASSERT_EQ(deviceGemm(h, g, std::vector<float>(8, NAN), std::vector<float>(12, NAN), o.c, &got),
            CUBLAS_STATUS_SUCCESS);  // alpha == 0: A and B are not read
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], 2.0f * o.c[i]);
}

TEST(CudasimCublas, Sscal64ScalesEveryIncxthElement) {
  Handle h;
  const std::vector<float> x = smallIntegers(9, 4);
  DeviceFloats dx(x);
  const float alpha = -2.0f;
  ASSERT_EQ(cublasSscal_64(h.get(), 5, &alpha, dx.get(), 2), CUBLAS_STATUS_SUCCESS);
  std::vector<float> got = dx.download();
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(got[i], i % 2 == 0 ? -2.0f * x[i] : x[i]) << i;
  // n <= 0 or incx <= 0: nothing, successfully.
  ASSERT_EQ(cublasSscal_64(h.get(), 0, &alpha, dx.get(), 1), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasSscal_64(h.get(), 3, &alpha, dx.get(), 0), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(dx.download(), got);
  // Past the end: 5 elements 2 apart need 9 floats.
  EXPECT_EQ(cublasSscal_64(h.get(), 5, &alpha, dx.get() + 1, 2), CUBLAS_STATUS_INVALID_VALUE);
}

// In device pointer mode alpha and beta are read when the operation runs, not at the call.
TEST(CudasimCublas, DevicePointerModeReadsTheScalarsWhenTheOperationRuns) {
  Handle h;
  ASSERT_EQ(cublasSetPointerMode(h.get(), CUBLAS_POINTER_MODE_DEVICE), CUBLAS_STATUS_SUCCESS);
  GemmCase g{.m = 2, .n = 2, .k = 3, .lda = 2, .ldb = 3, .ldc = 2, .alpha = 3.0f, .beta = 0.5f};
  const Operands o = operandsFor(g);
  DeviceFloats da(o.a), db(o.b), dc(o.c), scalars({3.0f, 0.5f});
  const float hostAlpha = 100.0f;
  EXPECT_EQ(cublasSgemm(h.get(), CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &hostAlpha, da.get(), 2, db.get(), 3, &hostAlpha,
                        dc.get(), 2),
            CUBLAS_STATUS_INVALID_VALUE);  // a host pointer in device mode
  ASSERT_EQ(cublasSgemm(h.get(), CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, scalars.get(), da.get(), 2, db.get(), 3,
                        scalars.get() + 1, dc.get(), 2),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(dc.download(), referenceGemm(g, o.a, o.b, o.c));
}

// TF32 tensor-op math rounds the inputs to 10 mantissa bits: 1 + 2⁻¹² becomes 1.
TEST(CudasimCublas, Tf32MathRoundsTheInputsAndDefaultMathDoesNot) {
  Handle h;
  const float fine = 1.0f + 1.0f / 4096;
  GemmCase g{.m = 1, .n = 1, .k = 1, .lda = 1, .ldb = 1, .ldc = 1, .alpha = 1.0f, .beta = 0.0f};
  std::vector<float> got;
  ASSERT_EQ(deviceGemm(h, g, {fine}, {1.0f}, {0.0f}, &got), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(got[0], fine);
  ASSERT_EQ(cublasSetMathMode(h.get(), CUBLAS_TF32_TENSOR_OP_MATH), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(deviceGemm(h, g, {fine}, {1.0f}, {0.0f}, &got), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(got[0], 1.0f);
}

// An SGEMM on the stream of the copy that fills A sees A filled; on another stream, without an event
// wait, it sometimes reads A before the copy (NaN, as cudaMalloc leaves it), and with the wait never.
TEST(CudasimCublas, SgemmRunsInStreamOrderAfterTheCopyItReads) {
  Handle h;
  const GemmCase g{.m = 4, .n = 4, .k = 64, .lda = 4, .ldb = 64, .ldc = 4, .alpha = 1.0f, .beta = 0.0f};
  const Operands o = operandsFor(g);
  const std::vector<float> want = referenceGemm(g, o.a, o.b, std::vector<float>(16, 0.0f));
  float* pinnedA = nullptr;
  ASSERT_EQ(cudaHostAlloc(&pinnedA, o.a.size() * sizeof(float), cudaHostAllocDefault), cudaSuccess);
  std::copy(o.a.begin(), o.a.end(), pinnedA);
  cudaStream_t copies, compute;
  cudaEvent_t copied;
  ASSERT_EQ(cudaStreamCreateWithFlags(&copies, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming), cudaSuccess);
  DeviceFloats da(std::vector<float>(o.a.size(), NAN)), db(o.b), dc(std::vector<float>(16, 0.0f));
  enum Order { kSameStream, kNoWait, kEventWait };
  int wrong[3] = {0, 0, 0};
  for (int run = 0; run < 20; ++run) {
    for (Order order : {kSameStream, kNoWait, kEventWait}) {
      ASSERT_EQ(cudaMemset(da.get(), 0xFF, o.a.size() * sizeof(float)), cudaSuccess);  // NaN: "not copied yet"
      cudaStream_t gemmStream = order == kSameStream ? copies : compute;
      ASSERT_EQ(cudaMemcpyAsync(da.get(), pinnedA, o.a.size() * sizeof(float), cudaMemcpyHostToDevice, copies),
                cudaSuccess);
      ASSERT_EQ(cudaEventRecord(copied, copies), cudaSuccess);
      if (order == kEventWait) {
        ASSERT_EQ(cudaStreamWaitEvent(compute, copied, 0), cudaSuccess);
      }
      ASSERT_EQ(cublasSetStream(h.get(), gemmStream), CUBLAS_STATUS_SUCCESS);
      ASSERT_EQ(cublasSgemm(h.get(), CUBLAS_OP_N, CUBLAS_OP_N, g.m, g.n, g.k, &g.alpha, da.get(), g.lda, db.get(),
                            g.ldb, &g.beta, dc.get(), g.ldc),
                CUBLAS_STATUS_SUCCESS);
      ASSERT_EQ(cudaStreamSynchronize(gemmStream), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(copies), cudaSuccess);
      wrong[order] += dc.download() != want;
    }
  }
  EXPECT_EQ(wrong[kSameStream], 0);
  EXPECT_GT(wrong[kNoWait], 0) << "the missing wait went unnoticed in every run";
  EXPECT_EQ(wrong[kEventWait], 0);
  cudaEventDestroy(copied);
  cudaStreamDestroy(copies);
  cudaStreamDestroy(compute);
  cudaFreeHost(pinnedA);
}

TEST(CudasimCublas, BadArgumentsAreTheRealStatuses) {
  Handle h;
  DeviceFloats a(std::vector<float>(16, 1.0f)), b(std::vector<float>(16, 1.0f)), c(std::vector<float>(16, 0.0f));
  const float one = 1.0f;
  auto sgemm = [&](cublasHandle_t handle, cublasOperation_t ta, int m, int n, int k, const float* pa, int lda,
                   const float* alpha) {
    return cublasSgemm(handle, ta, CUBLAS_OP_N, m, n, k, alpha, pa, lda, b.get(), 4, &one, c.get(), 4);
  };
  EXPECT_EQ(sgemm(h.get(), CUBLAS_OP_N, 4, 4, 4, a.get(), 4, &one), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(sgemm(nullptr, CUBLAS_OP_N, 4, 4, 4, a.get(), 4, &one), CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(sgemm(h.get(), static_cast<cublasOperation_t>(7), 4, 4, 4, a.get(), 4, &one), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(sgemm(h.get(), CUBLAS_OP_N, -1, 4, 4, a.get(), 4, &one), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(sgemm(h.get(), CUBLAS_OP_N, 4, 4, 4, a.get(), 3, &one), CUBLAS_STATUS_INVALID_VALUE);  // lda < m
  EXPECT_EQ(sgemm(h.get(), CUBLAS_OP_T, 2, 4, 4, a.get(), 3, &one), CUBLAS_STATUS_INVALID_VALUE);  // lda < k
  EXPECT_EQ(sgemm(h.get(), CUBLAS_OP_N, 4, 4, 4, a.get(), 4, nullptr), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(sgemm(h.get(), CUBLAS_OP_N, 4, 4, 4, a.get() + 1, 4, &one), CUBLAS_STATUS_INVALID_VALUE);  // past A
  std::vector<float> host(16, 1.0f);
  EXPECT_EQ(sgemm(h.get(), CUBLAS_OP_N, 4, 4, 4, host.data(), 4, &one), CUBLAS_STATUS_INVALID_VALUE);  // not device
  EXPECT_EQ(sgemm(h.get(), CUBLAS_OP_N, 0, 4, 4, nullptr, 4, &one), CUBLAS_STATUS_SUCCESS);  // empty: nothing read
  EXPECT_EQ(cublasSetMathMode(h.get(), static_cast<cublasMath_t>(9)), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasSetPointerMode(h.get(), static_cast<cublasPointerMode_t>(2)), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasCreate(nullptr), CUBLAS_STATUS_INVALID_VALUE);

  cublasHandle_t gone = nullptr;
  ASSERT_EQ(cublasCreate(&gone), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasDestroy(gone), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(sgemm(gone, CUBLAS_OP_N, 4, 4, 4, a.get(), 4, &one), CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(cublasSetStream(gone, nullptr), CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(cublasDestroy(gone), CUBLAS_STATUS_NOT_INITIALIZED);

  // A stream destroyed under the handle fails at the launch, as the real library's kernel would.
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  ASSERT_EQ(cublasSetStream(h.get(), s), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(sgemm(h.get(), CUBLAS_OP_N, 4, 4, 4, a.get(), 4, &one), CUBLAS_STATUS_EXECUTION_FAILED);
  cudaGetLastError();
  ASSERT_EQ(cublasSetStream(h.get(), nullptr), CUBLAS_STATUS_SUCCESS);

  // The handle's device must be current, as for the real library.
  int devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  if (devices > 1) {
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    EXPECT_EQ(sgemm(h.get(), CUBLAS_OP_N, 4, 4, 4, a.get(), 4, &one), CUBLAS_STATUS_EXECUTION_FAILED);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  }
}

TEST(CudasimCublas, StatusNamesAndStringsAreTheRealOnes) {
  EXPECT_STREQ(cublasGetStatusName(CUBLAS_STATUS_SUCCESS), "CUBLAS_STATUS_SUCCESS");
  EXPECT_STREQ(cublasGetStatusName(CUBLAS_STATUS_INVALID_VALUE), "CUBLAS_STATUS_INVALID_VALUE");
  EXPECT_STREQ(cublasGetStatusString(CUBLAS_STATUS_INVALID_VALUE),
               "an unsupported value or parameter was passed to the function");
  EXPECT_STREQ(cublasGetStatusString(CUBLAS_STATUS_ALLOC_FAILED), "the resource allocation failed");
  EXPECT_STREQ(cublasGetStatusName(static_cast<cublasStatus_t>(99)), "unrecognized status");
}

// The fault issue 17 asks to see caught: a caller that means C = Aᵀ · B (A stored k x m) but passes
// CUBLAS_OP_N reads A as m x k; with a leading dimension large enough for both readings the call is
// valid, and the result is wrong. So is one that passes B's leading dimension for A's.
TEST(CudasimCublas, ATransposedArgumentGivesAWrongResult) {
  Handle h;
  GemmCase meant{.transA = true, .m = 3, .n = 2, .k = 5, .lda = 6, .ldb = 5, .ldc = 3, .alpha = 1.0f, .beta = 0.0f};
  const Operands o = operandsFor(meant);
  const std::vector<float> right = referenceGemm(meant, o.a, o.b, o.c);
  std::vector<float> got;
  ASSERT_EQ(deviceGemm(h, meant, o.a, o.b, o.c, &got), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(got, right);

  GemmCase notTransposed = meant;
  notTransposed.transA = false;
  ASSERT_EQ(deviceGemm(h, notTransposed, o.a, o.b, o.c, &got), CUBLAS_STATUS_SUCCESS);
  EXPECT_NE(got, right) << "CUBLAS_OP_N for CUBLAS_OP_T went unnoticed";

  GemmCase swappedLd = meant;
  swappedLd.lda = meant.ldb;
  ASSERT_EQ(deviceGemm(h, swappedLd, o.a, o.b, o.c, &got), CUBLAS_STATUS_SUCCESS);
  EXPECT_NE(got, right) << "ldb passed as lda went unnoticed";

  // Where the wrong reading does not fit, it is refused: with A's buffer sized exactly for the meant
  // reading, OP_N runs past its end (a real GPU would read a neighbour); with lda = m < k, OP_T
  // breaks lda >= k.
  DeviceFloats exactA(std::vector<float>(o.a.begin(), o.a.begin() + (meant.m - 1) * meant.lda + meant.k));
  DeviceFloats db(o.b), dc(o.c);
  EXPECT_EQ(cublasSgemm(h.get(), CUBLAS_OP_N, CUBLAS_OP_N, meant.m, meant.n, meant.k, &meant.alpha, exactA.get(),
                        meant.lda, db.get(), meant.ldb, &meant.beta, dc.get(), meant.ldc),
            CUBLAS_STATUS_INVALID_VALUE);
  GemmCase meantN{.m = 3, .n = 2, .k = 5, .lda = 3, .ldb = 5, .ldc = 3, .alpha = 1.0f, .beta = 0.0f};
  const Operands on = operandsFor(meantN);
  meantN.transA = true;
  EXPECT_EQ(deviceGemm(h, meantN, on.a, on.b, on.c, &got), CUBLAS_STATUS_INVALID_VALUE);
}

// Sizes oneDNN blocks and splits (k past its blocking, m and n not multiples of a vector), values
// that round: within float rounding of the double reference, for every transpose, with padded
// leading dimensions whose padding stays untouched.
TEST(CudasimCublas, SgemmOfInexactValuesIsWithinFloatRoundingOfTheReference) {
  Handle h;
  for (bool transA : {false, true}) {
    for (bool transB : {false, true}) {
      GemmCase g{.transA = transA, .transB = transB, .m = 37, .n = 29, .k = 203, .alpha = 0.7f, .beta = 0.3f};
      g.lda = (transA ? g.k : g.m) + 3;
      g.ldb = (transB ? g.n : g.k) + 1;
      g.ldc = g.m + 2;
      const std::vector<float> a = fractions(static_cast<size_t>(g.lda) * std::max(g.m, g.k), 1);
      const std::vector<float> b = fractions(static_cast<size_t>(g.ldb) * std::max(g.k, g.n), 2);
      const std::vector<float> c = fractions(static_cast<size_t>(g.ldc) * g.n, 3);
      std::vector<float> got;
      ASSERT_EQ(deviceGemm(h, g, a, b, c, &got), CUBLAS_STATUS_SUCCESS);
      expectWithin(got, referenceGemm(g, a, b, c), 1e-5,
                   "transA " + std::to_string(transA) + " transB " + std::to_string(transB));
    }
  }
}

// On a large C full of NaN, beta == 0 still leaves no NaN; with the scalars in device memory, an
// alpha that is 0 only when the operation runs still leaves A and B (NaN here) unread.
TEST(CudasimCublas, BetaZeroAndARunTimeAlphaZeroKeepNaNOut) {
  Handle h;
  GemmCase g{.m = 40, .n = 33, .k = 70, .lda = 40, .ldb = 70, .ldc = 40, .alpha = 1.0f, .beta = 0.0f};
  const Operands o = operandsFor(g);
  std::vector<float> got;
  ASSERT_EQ(deviceGemm(h, g, o.a, o.b, std::vector<float>(o.c.size(), NAN), &got), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(got, referenceGemm(g, o.a, o.b, std::vector<float>(o.c.size(), 0.0f)));

  ASSERT_EQ(cublasSetPointerMode(h.get(), CUBLAS_POINTER_MODE_DEVICE), CUBLAS_STATUS_SUCCESS);
  DeviceFloats da(std::vector<float>(o.a.size(), NAN)), db(std::vector<float>(o.b.size(), NAN)), dc(o.c);
  DeviceFloats scalars({0.0f, -2.0f});
  ASSERT_EQ(cublasSgemm(h.get(), CUBLAS_OP_N, CUBLAS_OP_N, g.m, g.n, g.k, scalars.get(), da.get(), g.lda, db.get(),
                        g.ldb, scalars.get() + 1, dc.get(), g.ldc),
            CUBLAS_STATUS_SUCCESS);
  got = dc.download();
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], -2.0f * o.c[i]) << i;
}

// TF32 math on a real product: the emulation equals the reference on TF32-rounded inputs to float
// rounding, and differs from the unrounded one by far more.
TEST(CudasimCublas, Tf32MathMatchesTheReferenceOnRoundedInputs) {
  Handle h;
  ASSERT_EQ(cublasSetMathMode(h.get(), CUBLAS_TF32_TENSOR_OP_MATH), CUBLAS_STATUS_SUCCESS);
  for (bool transA : {false, true}) {
    GemmCase g{.transA = transA, .transB = !transA, .m = 19, .n = 23, .k = 64, .alpha = 1.0f, .beta = 0.5f};
    g.lda = (transA ? g.k : g.m) + 1;
    g.ldb = (g.transB ? g.n : g.k) + 2;
    g.ldc = g.m;
    const std::vector<float> a = fractions(static_cast<size_t>(g.lda) * std::max(g.m, g.k), 4);
    const std::vector<float> b = fractions(static_cast<size_t>(g.ldb) * std::max(g.k, g.n), 5);
    const std::vector<float> c = fractions(static_cast<size_t>(g.ldc) * g.n, 6);
    std::vector<float> got;
    ASSERT_EQ(deviceGemm(h, g, a, b, c, &got), CUBLAS_STATUS_SUCCESS);
    expectWithin(got, referenceGemm(g, tf32(a), tf32(b), c), 1e-5, "transA " + std::to_string(transA));
    const std::vector<float> full = referenceGemm(g, a, b, c);
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(got[i]) - full[i]) / full[i]);
    }
    EXPECT_GT(worst, 1e-5) << "the inputs were not rounded, or the comparison above could not tell";
  }
}

// A strided batch of `count` products shaped as g: matrix i of each operand starts i · stride floats
// after its matrix 0.
struct BatchCase {
  GemmCase g;
  long long strideA = 0, strideB = 0, strideC = 0;
  int count = 0;
};

// The reference for a batch: each matrix's product in batch order, on what the earlier ones left in C.
std::vector<float> referenceBatch(const BatchCase& bc, const std::vector<float>& a, const std::vector<float>& b,
                                  std::vector<float> c) {
  for (int i = 0; i < bc.count; ++i) {
    const std::vector<float> ci = referenceGemm(bc.g, std::vector<float>(a.begin() + i * bc.strideA, a.end()),
                                                std::vector<float>(b.begin() + i * bc.strideB, b.end()),
                                                std::vector<float>(c.begin() + i * bc.strideC, c.end()));
    std::copy(ci.begin(), ci.end(), c.begin() + i * bc.strideC);
  }
  return c;
}

// Operands for the batch: operandsFor's sizes after the last matrix's start.
Operands operandsFor(const BatchCase& bc) {
  const GemmCase& g = bc.g;
  const auto last = [&](long long stride) { return static_cast<size_t>(stride * (bc.count - 1)); };
  return {smallIntegers(last(bc.strideA) + static_cast<size_t>(g.lda) * std::max(g.m, g.k), 1),
          smallIntegers(last(bc.strideB) + static_cast<size_t>(g.ldb) * std::max(g.k, g.n), 2),
          smallIntegers(last(bc.strideC) + static_cast<size_t>(g.ldc) * g.n, 3)};
}

cublasStatus_t stridedBatched(const Handle& h, const BatchCase& bc, const float* a, const float* b, float* c) {
  const GemmCase& g = bc.g;
  return cublasSgemmStridedBatched(h.get(), op(g.transA), op(g.transB), g.m, g.n, g.k, &g.alpha, a, g.lda, bc.strideA,
                                   b, g.ldb, bc.strideB, &g.beta, c, g.ldc, bc.strideC, bc.count);
}

// Runs the batch through cublasSgemmStridedBatched on buffers holding the operands, returning C.
cublasStatus_t deviceBatch(const Handle& h, const BatchCase& bc, const Operands& o, std::vector<float>* out) {
  DeviceFloats da(o.a), db(o.b), dc(o.c);
  const cublasStatus_t s = stridedBatched(h, bc, da.get(), db.get(), dc.get());
  *out = dc.download();
  return s;
}

// Three batches with gaps between their matrices, padded leading dimensions, beta != 0: exact, the
// gaps and padding of C included (they must be left as they were).
TEST(CudasimCublas, SgemmStridedBatchedMatchesTheReferenceForEveryTranspose) {
  Handle h;
  for (bool transA : {false, true}) {
    for (bool transB : {false, true}) {
      BatchCase bc{.g = {.transA = transA, .transB = transB, .m = 3, .n = 4, .k = 5, .alpha = 1.5f, .beta = -0.5f},
                   .count = 3};
      GemmCase& g = bc.g;
      g.lda = (transA ? g.k : g.m) + 2;
      g.ldb = (transB ? g.n : g.k) + 1;
      g.ldc = g.m + 3;
      bc.strideA = g.lda * (transA ? g.m : g.k) + 1;
      bc.strideB = g.ldb * (transB ? g.k : g.n) + 2;
      bc.strideC = g.ldc * g.n + 3;
      const Operands o = operandsFor(bc);
      std::vector<float> got;
      ASSERT_EQ(deviceBatch(h, bc, o, &got), CUBLAS_STATUS_SUCCESS);
      EXPECT_EQ(got, referenceBatch(bc, o.a, o.b, o.c)) << "transA " << transA << " transB " << transB;
    }
  }
}

// A stride of 0 gives every batch the same matrix, in a buffer that holds just one. The buffers are
// sized exactly: A's matrices are 4 x 3 (12 floats), B's 4 x 2 (8), C's 3 x 2 (6).
TEST(CudasimCublas, SgemmStridedBatchedBroadcastsAnOperandOfStrideZero) {
  Handle h;
  for (bool broadcastA : {true, false}) {
    BatchCase bc{.g = {.transA = true, .m = 3, .n = 2, .k = 4, .lda = 4, .ldb = 4, .ldc = 3, .alpha = 2.0f},
                 .strideA = broadcastA ? 0 : 12,
                 .strideB = broadcastA ? 8 : 0,
                 .strideC = 6,
                 .count = 3};
    const Operands o{smallIntegers(broadcastA ? 12 : 36, 1), smallIntegers(broadcastA ? 24 : 8, 2),
                     smallIntegers(18, 3)};
    std::vector<float> got;
    ASSERT_EQ(deviceBatch(h, bc, o, &got), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(got, referenceBatch(bc, o.a, o.b, o.c)) << "broadcastA " << broadcastA;
  }
}

// With beta = 1, a second batched call adds its products to the first's.
TEST(CudasimCublas, SgemmStridedBatchedWithBetaOneAccumulates) {
  Handle h;
  const BatchCase bc{.g = {.m = 2, .n = 3, .k = 4, .lda = 2, .ldb = 4, .ldc = 2, .alpha = 1.0f, .beta = 1.0f},
                     .strideA = 8,
                     .strideB = 12,
                     .strideC = 6,
                     .count = 3};
  const Operands o = operandsFor(bc);
  DeviceFloats da(o.a), db(o.b), dc(o.c);
  ASSERT_EQ(stridedBatched(h, bc, da.get(), db.get(), dc.get()), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(stridedBatched(h, bc, da.get(), db.get(), dc.get()), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(dc.download(), referenceBatch(bc, o.a, o.b, referenceBatch(bc, o.a, o.b, o.c)));
}

// No batches, or empty matrices: success, nothing read or written.
TEST(CudasimCublas, SgemmStridedBatchedOfNothingSucceedsAndDoesNothing) {
  Handle h;
  BatchCase bc{.g = {.m = 2, .n = 2, .k = 2, .lda = 2, .ldb = 2, .ldc = 2, .alpha = 1.0f}, .strideC = 4, .count = 0};
  EXPECT_EQ(stridedBatched(h, bc, nullptr, nullptr, nullptr), CUBLAS_STATUS_SUCCESS);
  bc.count = 2;
  const Operands o = operandsFor(bc);
  DeviceFloats da(o.a), db(o.b), dc(o.c);
  bc.count = 0;
  EXPECT_EQ(stridedBatched(h, bc, da.get(), db.get(), dc.get()), CUBLAS_STATUS_SUCCESS);
  bc.count = 2;
  bc.g.m = 0;
  EXPECT_EQ(stridedBatched(h, bc, nullptr, nullptr, nullptr), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(dc.download(), o.c);
}

// Each refused call is refused at the call: C is as it was, though most of them would have written
// into it had they run.
TEST(CudasimCublas, SgemmStridedBatchedBadArgumentsAreRefusedAndEnqueueNothing) {
  Handle h;
  const BatchCase good{.g = {.m = 2, .n = 2, .k = 3, .lda = 2, .ldb = 3, .ldc = 2, .alpha = 1.0f},
                       .strideA = 6,
                       .strideB = 6,
                       .strideC = 4,
                       .count = 3};
  const Operands o = operandsFor(good);
  DeviceFloats da(o.a), db(o.b), dc(o.c);
  auto status = [&](BatchCase bc) { return stridedBatched(h, bc, da.get(), db.get(), dc.get()); };
  BatchCase bc = good;
  bc.count = -1;
  EXPECT_EQ(status(bc), CUBLAS_STATUS_INVALID_VALUE);
  bc = good;
  bc.count = 4;  // the last batch of each operand past its allocation
  EXPECT_EQ(status(bc), CUBLAS_STATUS_INVALID_VALUE);
  bc = good;
  bc.strideA = 7;  // A's alone
  EXPECT_EQ(status(bc), CUBLAS_STATUS_INVALID_VALUE);
  bc = good;
  bc.strideB = -6;  // cuBLAS would read before B; cudasim refuses any negative stride
  EXPECT_EQ(status(bc), CUBLAS_STATUS_INVALID_VALUE);
  bc = good;
  bc.g.ldc = 1;  // the single SGEMM's checks hold for the batch
  EXPECT_EQ(status(bc), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(dc.download(), o.c);
  EXPECT_EQ(status(good), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(dc.download(), referenceBatch(good, o.a, o.b, o.c));
}

// C matrices that share an element (undefined in cuBLAS) are refused; C matrices interleaved without
// sharing one are computed. C's 2 x 3 matrices lie in a 6 x 4 buffer with ldc = 6, so every C stride
// here keeps them inside it: what refuses a call is the overlap.
TEST(CudasimCublas, SgemmStridedBatchedRefusesOverlappingCAndComputesInterleavedC) {
  Handle h;
  BatchCase bc{.g = {.m = 2, .n = 3, .k = 4, .lda = 2, .ldb = 4, .ldc = 6, .alpha = 1.0f, .beta = 0.5f},
               .strideA = 8,
               .strideB = 12,
               .count = 3};
  Operands o = operandsFor(bc);
  o.c = smallIntegers(24, 3);
  DeviceFloats da(o.a), db(o.b), dc(o.c);
  // Between 2 batches: 0, one C for both; 1, rows shared; 5, batch 1's row 1 of column 0 is batch 0's
  // row 0 of column 1.
  bc.count = 2;
  for (long long strideC : {0, 1, 5}) {
    bc.strideC = strideC;
    EXPECT_EQ(stridedBatched(h, bc, da.get(), db.get(), dc.get()), CUBLAS_STATUS_INVALID_VALUE) << strideC;
  }
  EXPECT_EQ(dc.download(), o.c);
  // 2: batch i in rows 2i and 2i + 1; 4: batches 0 and 1 in rows 0-1 and 4-5 of columns 0-2, batch 2
  // in rows 2-3 of columns 1-3.
  bc.count = 3;
  for (long long strideC : {2, 4}) {
    bc.strideC = strideC;
    std::vector<float> got;
    ASSERT_EQ(deviceBatch(h, bc, o, &got), CUBLAS_STATUS_SUCCESS) << strideC;
    EXPECT_EQ(got, referenceBatch(bc, o.a, o.b, o.c)) << strideC;
  }
  std::vector<float> got;
  bc.strideC = 0;
  bc.count = 1;  // one batch overlaps nothing
  ASSERT_EQ(deviceBatch(h, bc, o, &got), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(got, referenceBatch(bc, o.a, o.b, o.c));
}

// The batch honours the handle's modes as one SGEMM does: scalars from device memory, inputs rounded
// to TF32 (1 + 2⁻¹² becomes 1).
TEST(CudasimCublas, SgemmStridedBatchedHonoursDeviceScalarsAndTf32Math) {
  Handle h;
  ASSERT_EQ(cublasSetPointerMode(h.get(), CUBLAS_POINTER_MODE_DEVICE), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasSetMathMode(h.get(), CUBLAS_TF32_TENSOR_OP_MATH), CUBLAS_STATUS_SUCCESS);
  const float fine = 1.0f + 1.0f / 4096;
  DeviceFloats da({fine, 2 * fine}), db({1.0f, 1.0f}), dc({NAN, NAN}), scalars({3.0f, 0.0f});
  ASSERT_EQ(cublasSgemmStridedBatched(h.get(), CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, scalars.get(), da.get(), 1, 1,
                                      db.get(), 1, 1, scalars.get() + 1, dc.get(), 1, 1, 2),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(dc.download(), (std::vector<float>{3.0f, 6.0f}));
}

}  // namespace
