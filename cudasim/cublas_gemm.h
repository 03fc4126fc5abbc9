// The GEMM that cudasim's cuBLAS (cublas.cc) and cuBLASLt (cublaslt.cc) share: one product's
// operands as captured at the call, the memory checks, and the computation on the CPU (oneDNN's
// sgemm, fp32 accumulation). Internal to cudasim's emulated libraries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "library_types.h"

namespace cudasim {

// A scalar argument: its value at the call (host pointer mode), or the device address it is read
// from when the operation runs (device pointer mode).
struct Scalar {
  float value = 0;
  const float* device = nullptr;
  float get() const { return device ? *device : value; }
  bool knownZero() const { return !device && value == 0.0f; }
  bool knownOne() const { return !device && value == 1.0f; }
};

// The operands of one GEMM, captured at the call. A and B are both fp32 or both bf16 (`bf16`); C is
// fp32 or bf16 (`bf16C`).
struct Gemm {
  bool transA = false, transB = false, tf32 = false, bf16 = false, bf16C = false;
  int m = 0, n = 0, k = 0;
  Scalar alpha, beta;
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  int lda = 0, ldb = 0, ldc = 0;
};

size_t elementBytes(cudaDataType type);
// Bytes from the first to one past the last element of a column-major rows x cols matrix with
// leading dimension ld (0 for an empty one) of `element`-byte elements.
size_t spanBytes(int64_t rows, int64_t cols, int64_t ld, size_t element = sizeof(float));
// Whether [p, p + bytes) lies inside one live device allocation (always, for 0 bytes).
bool onDevice(const void* p, size_t bytes);
// A column-major rows x cols matrix with leading dimension ld, as packed fp32 (ld = rows): bf16
// widened (exact), fp32 rounded to TF32 (`tf32`) or copied.
std::vector<float> packed(const void* p, bool bf16, bool tf32, int64_t rows, int64_t cols, int64_t ld);
// The product into an fp32 C with leading dimension ldc (g.c and g.bf16C unused): beta · C first
// (beta == 0: C not read), then C += alpha · op(A) · op(B) unless alpha or k is 0.
void runFloatGemm(const Gemm& g, float* c, int64_t ldc);
// The product into g.c; a bf16 C is computed in fp32 and rounded once at the end.
void runGemm(const Gemm& g);

}  // namespace cudasim
