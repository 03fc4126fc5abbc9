// Test-only kernels built with the cuda_library macro (see cuda_library_test.cc).
// Thread safety: stateless; work is ordered by `stream`.
#pragma once

#include <cstddef>

#include "runtime/stream.h"

namespace cohort::testing {

// data[i] += 1 for i < n, on `stream` (a CUDA stream; device memory).
void addOne(int* data, size_t n, const runtime::Stream& stream);

// 0: the host compilation pass; a host function always returns 0. Here to prove the file is
// compiled by nvcc (it defines __CUDACC__) and linked.
int compiledArch();

}  // namespace cohort::testing
